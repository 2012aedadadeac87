//! Floods an attacker can send without any key: ARP requests from a
//! different sender each (the neighbour table must stay at its bound and the
//! gateway keep forwarding), and packets that die here (the ICMP errors they
//! cause must not exceed the token buckets, RFC 1812 §4.3.2.8).

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use accel::{Algorithm, Style};
use common::*;
use dataplane::{DropReason, Gateway, LinkLayer, PacketPool, Port, Verdict};
use ike_stub::builder::LimitsSection;
use smoltcp::wire::{ArpOperation, ArpPacket, EthernetAddress, EthernetProtocol, Ipv4Cidr, Ipv4Packet};

const GW_INSIDE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x01];
const GW_OUTSIDE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x00, 0x01];
const HOST_A_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x10];
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x00, 0x02];

/// Site A or B on Ethernet with ARP resolution on, its outside network a
/// /8 (room for 100,000 distinct on-link senders), and `limits` as its
/// `[limits]` section.
fn site(a: bool, limits: LimitsSection, link: LinkLayer) -> Gateway {
    let mut built = tunnel_builder(Algorithm::Aes128Gcm16, "tunnel", false, a);
    interface(&mut built, "inside").mac = Some(EthernetAddress([0x02, 0, 0, 0, 1, 1]));
    let outside = interface(&mut built, "outside");
    outside.mac = Some(EthernetAddress([0x02, 0, 0, 0, 0, 1]));
    outside.address = Ipv4Cidr::new(outside.address.address(), 8);
    built.limits = limits;
    let config = common::parsed(&built);
    let mut setup = config.setup(link, Style::Async);
    setup.resolve_neighbors = link == LinkLayer::Ethernet;
    common::soft_gateway(&config, setup)
}

/// An ARP request from `sender` for `target`, in an Ethernet broadcast.
fn arp_request(sender: ([u8; 6], Ipv4Addr), target: Ipv4Addr) -> Vec<u8> {
    let request = arp(
        ArpOperation::Request,
        (sender.0, sender.1.octets()),
        ([0; 6], target.octets()),
    );
    ether([0xff; 6], sender.0, EthernetProtocol::Arp, &request)
}

/// Hands `frames` to `gw` in batches of 64 and returns every output's
/// verdict and bytes.
fn feed(
    gw: &mut Gateway,
    pool: &mut PacketPool,
    now: Duration,
    from: Port,
    frames: &[Vec<u8>],
) -> Vec<(Verdict, Vec<u8>)> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for chunk in frames.chunks(64) {
        let mut bufs: Vec<_> = chunk
            .iter()
            .map(|f| {
                let mut buf = pool.alloc().expect("a buffer");
                assert!(buf.fill(f));
                buf
            })
            .collect();
        gw.handle_batch(now, from, &mut bufs, &mut out, pool);
        drivers::drive::flush(gw, now, &mut out, pool);
        for (buf, verdict) in out.drain(..) {
            seen.push((verdict, buf.data().to_vec()));
            pool.free(buf);
        }
    }
    seen
}

fn forwarded(outputs: &[(Verdict, Vec<u8>)], port: Port) -> Vec<&Vec<u8>> {
    outputs
        .iter()
        .filter(|(v, _)| *v == Verdict::Forward(port))
        .map(|(_, b)| b)
        .collect()
}

#[test]
fn an_arp_flood_leaves_the_table_at_its_bound_and_the_gateway_forwarding() {
    const BOUND: usize = 256;
    const FLOOD: u32 = 100_000;
    let limits = LimitsSection {
        neighbors_per_interface: Some(BOUND as u32),
        ..LimitsSection::default()
    };
    let mut gw = site(true, limits, LinkLayer::Ethernet);
    let mut pool = PacketPool::new(256);
    let t0 = Duration::from_secs(1);
    // The peer and host A are known before the flood.
    let peer = arp_request((PEER_MAC, Ipv4Addr::new(10, 0, 0, 2)), Ipv4Addr::new(10, 0, 0, 1));
    let host = arp_request((HOST_A_MAC, HOST_A), Ipv4Addr::new(192, 168, 1, 1));
    feed(&mut gw, &mut pool, t0, Port::Outside, &[peer]);
    feed(&mut gw, &mut pool, t0, Port::Inside, &[host]);
    assert_eq!(gw.neighbors().learnt(Port::Outside), 1);

    // 100,000 requests for our outside address, each from its own on-link
    // sender (10.1.0.0 up), over ten seconds.
    let mut answered = 0;
    for block in 0..FLOOD / 1000 {
        let frames: Vec<Vec<u8>> = (0..1000)
            .map(|i| {
                let n = 0x0a01_0000 + block * 1000 + i;
                let mac = [
                    0x02,
                    0xee,
                    (n >> 24) as u8,
                    (n >> 16) as u8,
                    (n >> 8) as u8,
                    n as u8,
                ];
                arp_request((mac, Ipv4Addr::from(n)), Ipv4Addr::new(10, 0, 0, 1))
            })
            .collect();
        let now = t0 + Duration::from_millis(u64::from(block) * 100);
        let outputs = feed(&mut gw, &mut pool, now, Port::Outside, &frames);
        assert_eq!(outputs.len(), 1000, "one output per request");
        answered += forwarded(&outputs, Port::Outside).len();
        assert!(gw.neighbors().learnt(Port::Outside) <= BOUND);
    }
    let stats = *gw.stats();
    assert_eq!(
        gw.neighbors().learnt(Port::Outside),
        BOUND,
        "the table is at its bound"
    );
    assert_eq!(
        gw.neighbors().learnt(Port::Inside),
        1,
        "the other interface's table is its own"
    );
    assert_eq!(stats.neighbor_table_full, u64::from(FLOOD) - (BOUND as u64 - 1));
    assert_eq!(answered, FLOOD as usize, "every request for us is still answered");
    assert!(stats.balanced(), "{stats:?}");

    // Still forwarding both ways, to the neighbours learnt before the flood.
    let now = t0 + Duration::from_secs(11);
    let packet = udp_packet(HOST_A, HOST_B, 200, 1);
    let outputs = feed(
        &mut gw,
        &mut pool,
        now,
        Port::Inside,
        &[ether(GW_INSIDE_MAC, HOST_A_MAC, EthernetProtocol::Ipv4, &packet)],
    );
    let esp = forwarded(&outputs, Port::Outside);
    assert_eq!(esp.len(), 1, "{outputs:?}");
    assert_eq!(&esp[0][..6], &PEER_MAC);
    assert_eq!(esp[0][14 + 9], 50, "ESP");

    let mut b = site(false, LimitsSection::default(), LinkLayer::RawIp);
    let reply = udp_packet(HOST_B, HOST_A, 300, 2);
    let (verdict, esp_back) = run(&mut b, &mut pool, now, Port::Inside, &reply);
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    let outputs = feed(
        &mut gw,
        &mut pool,
        now,
        Port::Outside,
        &[ether(GW_OUTSIDE_MAC, PEER_MAC, EthernetProtocol::Ipv4, &esp_back)],
    );
    let delivered = forwarded(&outputs, Port::Inside);
    assert_eq!(delivered.len(), 1, "{outputs:?}");
    assert_eq!(&delivered[0][..6], &HOST_A_MAC);
    assert_eq!(&delivered[0][14..], &after_hops(&reply, 2)[..]);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn arp_from_off_link_or_unasked_is_not_learnt_and_is_counted() {
    let mut gw = site(true, LimitsSection::default(), LinkLayer::Ethernet);
    let mut pool = PacketPool::new(64);
    let now = Duration::from_secs(1);
    let off_link: Vec<Vec<u8>> = (0..100u8)
        .map(|i| {
            arp_request(
                ([2, 0xdd, 0, 0, 0, i], Ipv4Addr::new(172, 16, 0, i)),
                Ipv4Addr::new(10, 0, 0, 1),
            )
        })
        .collect();
    // Requests for our address from off-link senders are answered (a
    // Linux peer asks from any of its addresses), never learnt.
    let outputs = feed(&mut gw, &mut pool, now, Port::Outside, &off_link);
    assert!(outputs.iter().all(|(v, _)| *v == Verdict::Forward(Port::Outside)));
    // Anything else from them is dropped: a request for another address,
    // a reply.
    let off_link_other: Vec<Vec<u8>> = (0..100u8)
        .map(|i| {
            let mut f = arp_request(
                ([2, 0xdd, 0, 0, 0, i], Ipv4Addr::new(172, 16, 0, i)),
                Ipv4Addr::new(10, 0, 0, 7),
            );
            if i % 2 == 1 {
                ArpPacket::new_unchecked(&mut f[14..]).set_operation(ArpOperation::Reply);
            }
            f
        })
        .collect();
    let outputs = feed(&mut gw, &mut pool, now, Port::Outside, &off_link_other);
    assert!(outputs
        .iter()
        .all(|(v, _)| *v == Verdict::Drop(DropReason::ArpOffLink)));
    // Inside, the outside's network is off-link too.
    let crossed = arp_request(
        ([2, 0xdd, 0, 0, 1, 1], Ipv4Addr::new(10, 0, 0, 9)),
        Ipv4Addr::new(192, 168, 1, 7),
    );
    let outputs = feed(&mut gw, &mut pool, now, Port::Inside, &[crossed]);
    assert_eq!(outputs[0].0, Verdict::Drop(DropReason::ArpOffLink));
    // An unsolicited reply from an on-link sender is consumed, not learnt.
    let mut reply = arp_request((PEER_MAC, Ipv4Addr::new(10, 0, 0, 2)), Ipv4Addr::new(10, 0, 0, 1));
    ArpPacket::new_unchecked(&mut reply[14..]).set_operation(ArpOperation::Reply);
    let outputs = feed(&mut gw, &mut pool, now, Port::Outside, &[reply]);
    assert_eq!(outputs[0].0, Verdict::Consumed);
    let stats = gw.stats();
    assert_eq!(stats.drops.get(DropReason::ArpOffLink), 101);
    assert_eq!(stats.arp_unsolicited, 1);
    assert_eq!(gw.neighbors().learnt(Port::Outside), 0);
    assert_eq!(gw.neighbors().learnt(Port::Inside), 0);
    assert!(stats.balanced());
}

/// `count` UDP packets from `sources` (round robin) to host B with TTL 1:
/// each would be protected, but dies here with time exceeded.
fn ttl_one(count: usize, sources: &[Ipv4Addr]) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let mut p = udp_packet(sources[i % sources.len()], HOST_B, 20, i as u8);
            let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
            ip.set_hop_limit(1);
            ip.fill_checksum();
            p
        })
        .collect()
}

/// Time-exceeded errors among `outputs`.
fn time_exceeded(outputs: &[(Verdict, Vec<u8>)]) -> usize {
    outputs
        .iter()
        .filter(|(v, b)| *v == Verdict::Forward(Port::Inside) && b[9] == 1 && b[20] == 11)
        .count()
}

#[test]
fn a_ttl_flood_gets_no_more_icmp_than_the_gateway_bucket_allows() {
    // 100 per second, 10 at once, no per-source limit.
    let limits = LimitsSection {
        icmp_errors_per_second: Some(100),
        icmp_burst: Some(10),
        icmp_per_source_ms: Some(0),
        ..LimitsSection::default()
    };
    let mut gw = site(true, limits, LinkLayer::RawIp);
    let mut pool = PacketPool::new(256);
    let sources: Vec<Ipv4Addr> = (10..200).map(|d| Ipv4Addr::new(192, 168, 1, d)).collect();
    // (time in ms, packets): tokens are 10 at the start, one per 10 ms
    // after that, never more than 10.
    let schedule = [
        (0, 1000),
        (0, 1000),
        (55, 1000),
        (60, 1000),
        (1060, 1000),
        (1061, 1000),
        (1070, 1),
    ];
    let expected = [10, 0, 5, 1, 10, 0, 1];
    let mut total = 0;
    for ((at, n), want) in schedule.into_iter().zip(expected) {
        let outputs = feed(
            &mut gw,
            &mut pool,
            Duration::from_millis(at),
            Port::Inside,
            &ttl_one(n, &sources),
        );
        assert_eq!(outputs.len(), n, "one output per packet");
        assert_eq!(time_exceeded(&outputs), want, "at {at} ms");
        total += n;
    }
    let sent: usize = expected.iter().sum();
    let stats = gw.stats();
    assert_eq!(
        stats.drops.get(DropReason::TtlExpired),
        total as u64,
        "each packet counted once"
    );
    assert_eq!(stats.generated, sent as u64);
    assert_eq!(stats.icmp_rate_limited, (total - sent) as u64);
    assert!(stats.balanced(), "{stats:?}");

    assert_eq!(pool.in_use(), 0);
}

#[test]
fn a_ttl_flood_from_one_source_gets_its_own_bucket() {
    // Linux's defaults for one source: 1 per 1000 ms, 6 at once; the
    // gateway's bucket out of the way.
    let limits = LimitsSection {
        icmp_errors_per_second: Some(1_000_000),
        icmp_burst: Some(1_000_000),
        icmp_per_source_ms: Some(1000),
        icmp_per_source_burst: Some(6),
        ..LimitsSection::default()
    };
    let mut gw = site(true, limits, LinkLayer::RawIp);
    let mut pool = PacketPool::new(256);
    let one = [HOST_A];
    let other = [Ipv4Addr::new(192, 168, 1, 11)];
    let schedule: [(u64, &[Ipv4Addr], usize); 5] = [
        (0, &one, 6),
        (0, &other, 6),
        (2500, &one, 2),
        (3000, &one, 1),
        (3000, &other, 3),
    ];
    for (at, sources, want) in schedule {
        let outputs = feed(
            &mut gw,
            &mut pool,
            Duration::from_millis(at),
            Port::Inside,
            &ttl_one(500, sources),
        );
        assert_eq!(time_exceeded(&outputs), want, "{sources:?} at {at} ms");
    }
    assert_eq!(gw.stats().icmp_rate_limited, 5 * 500 - 18);
    assert!(gw.stats().balanced());
}

#[test]
fn frag_needed_draws_on_the_same_buckets() {
    let mut built = tunnel_builder(Algorithm::Aes128Gcm16, "tunnel", false, true);
    interface(&mut built, "outside").mtu = Some(1400);
    built.limits = LimitsSection {
        icmp_errors_per_second: Some(100),
        icmp_burst: Some(2),
        icmp_per_source_ms: Some(0),
        ..LimitsSection::default()
    };
    let text = built.to_toml();
    let mut gw = gateway_from(&text);
    let mut pool = PacketPool::new(64);
    // DF packets that no longer fit once protected.
    let big: Vec<Vec<u8>> = (0..5).map(|i| udp_packet(HOST_A, HOST_B, 1400 - 28, i)).collect();
    let outputs = feed(&mut gw, &mut pool, Duration::ZERO, Port::Inside, &big);
    let errors = outputs
        .iter()
        .filter(|(v, b)| *v == Verdict::Forward(Port::Inside) && b[20] == 3 && b[21] == 4)
        .count();
    assert_eq!(errors, 2, "the burst");
    let stats = gw.stats();
    assert_eq!(stats.drops.get(DropReason::FragNeeded), 5);
    assert_eq!(stats.icmp_rate_limited, 3);
    // Time exceeded now finds the bucket empty too.
    let outputs = feed(
        &mut gw,
        &mut pool,
        Duration::ZERO,
        Port::Inside,
        &ttl_one(3, &[HOST_A]),
    );
    assert_eq!(time_exceeded(&outputs), 0);
    let outputs = feed(
        &mut gw,
        &mut pool,
        Duration::from_millis(10),
        Port::Inside,
        &ttl_one(3, &[HOST_A]),
    );
    assert_eq!(time_exceeded(&outputs), 1, "one token in 10 ms");
    assert!(gw.stats().balanced());
}
