//! The gateway's own L2/L3 duties: ARP (answering, resolving, queueing,
//! expiry), ICMP echo, time exceeded, fragmentation needed, and
//! fragmentation after encapsulation.

mod common;

use std::time::Duration;

use accel::{Algorithm, Style};
use common::*;
use dataplane::gateway::Output;
use dataplane::{DropReason, Gateway, LinkLayer, PacketPool, Port, Verdict};
use smoltcp::wire::{ArpOperation, ArpPacket, EthernetAddress, EthernetProtocol, Ipv4Packet};

const GW_INSIDE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x01];
const HOST_A_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x10];
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x00, 0x02];

/// Site A on Ethernet with ARP resolution on and no static neighbours.
fn site_a(alg: Algorithm, outside_mtu: u16) -> Gateway {
    let mut built = tunnel_builder(alg, "tunnel", false, true);
    interface(&mut built, "inside").mac = Some(EthernetAddress([0x02, 0, 0, 0, 1, 1]));
    let outside = interface(&mut built, "outside");
    outside.mac = Some(EthernetAddress([0x02, 0, 0, 0, 0, 1]));
    outside.mtu = Some(outside_mtu);
    let config = common::parsed(&built);
    let mut setup = config.setup(LinkLayer::Ethernet, Style::Async);
    setup.resolve_neighbors = true;
    common::soft_gateway(&config, setup)
}

fn send(
    gw: &mut Gateway,
    pool: &mut PacketPool,
    now: Duration,
    from: Port,
    frame: &[u8],
) -> Vec<(Verdict, Vec<u8>)> {
    let mut buf = pool.alloc().expect("buffer");
    assert!(buf.fill(frame));
    let outputs = drivers::drive::handle_frame(gw, now, from, buf, pool);
    collect(outputs, pool)
}

/// hostA asks for the gateway's inside address (the gateway learns hostA).
fn host_asks_for_gateway(gw: &mut Gateway, pool: &mut PacketPool) -> Vec<(Verdict, Vec<u8>)> {
    let request = arp(
        ArpOperation::Request,
        (HOST_A_MAC, [192, 168, 1, 10]),
        ([0; 6], [192, 168, 1, 1]),
    );
    let frame = ether([0xff; 6], HOST_A_MAC, EthernetProtocol::Arp, &request);
    send(gw, pool, Duration::ZERO, Port::Inside, &frame)
}

/// The peer gateway asks for 10.0.0.1 (the gateway learns it: an
/// unsolicited reply would not do, see `arp_learning_follows_the_kernel`).
fn peer_announces_itself(gw: &mut Gateway, pool: &mut PacketPool) {
    let request = arp(
        ArpOperation::Request,
        (PEER_MAC, [10, 0, 0, 2]),
        ([0; 6], [10, 0, 0, 1]),
    );
    let frame = ether([0xff; 6], PEER_MAC, EthernetProtocol::Arp, &request);
    send(gw, pool, Duration::ZERO, Port::Outside, &frame);
}

fn collect(outputs: Vec<Output>, pool: &mut PacketPool) -> Vec<(Verdict, Vec<u8>)> {
    outputs
        .into_iter()
        .map(|(buf, verdict)| {
            let bytes = buf.data().to_vec();
            pool.free(buf);
            (verdict, bytes)
        })
        .collect()
}

#[test]
fn answers_arp_for_its_own_address_only() {
    let mut gw = site_a(Algorithm::Aes128Gcm16, 1500);
    let mut pool = PacketPool::new(8);
    let out = host_asks_for_gateway(&mut gw, &mut pool);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, Verdict::Forward(Port::Inside));
    let reply = &out[0].1;
    assert_eq!(&reply[..6], &HOST_A_MAC);
    let a = ArpPacket::new_checked(&reply[14..]).unwrap();
    assert_eq!(a.operation(), ArpOperation::Reply);
    assert_eq!(a.source_hardware_addr(), &GW_INSIDE_MAC);
    assert_eq!(a.source_protocol_addr(), &[192, 168, 1, 1]);
    // A request for someone else is consumed without a reply.
    let other = arp(
        ArpOperation::Request,
        (HOST_A_MAC, [192, 168, 1, 10]),
        ([0; 6], [192, 168, 1, 77]),
    );
    let out = send(
        &mut gw,
        &mut pool,
        Duration::ZERO,
        Port::Inside,
        &ether([0xff; 6], HOST_A_MAC, EthernetProtocol::Arp, &other),
    );
    assert_eq!(out[0].0, Verdict::Consumed);
    assert!(gw.stats().balanced());
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn resolves_next_hops_and_queues_until_the_reply() {
    let mut gw = site_a(Algorithm::Aes128Gcm16, 1500);
    let mut pool = PacketPool::new(32);
    let packet = udp_packet(HOST_A, HOST_B, 100, 1);
    let frame = ether(GW_INSIDE_MAC, HOST_A_MAC, EthernetProtocol::Ipv4, &packet);
    // Three packets to an unresolved next hop: one ARP request, all parked.
    let mut requests = 0;
    for i in 0..3 {
        let out = send(
            &mut gw,
            &mut pool,
            Duration::from_millis(i * 10),
            Port::Inside,
            &frame,
        );
        for (verdict, bytes) in &out {
            assert_eq!(*verdict, Verdict::Forward(Port::Outside));
            assert_eq!(&bytes[12..14], &[0x08, 0x06], "only ARP goes out while resolving");
            let a = ArpPacket::new_checked(&bytes[14..]).unwrap();
            assert_eq!(a.operation(), ArpOperation::Request);
            assert_eq!(a.target_protocol_addr(), &[10, 0, 0, 2]);
            requests += 1;
        }
    }
    assert_eq!(requests, 1, "requests for one next hop are rate limited");
    // The peer answers: the three ESP packets leave, addressed to it.
    let reply = arp(
        ArpOperation::Reply,
        (PEER_MAC, [10, 0, 0, 2]),
        ([0x02, 0, 0, 0, 0, 1], [10, 0, 0, 1]),
    );
    let out = send(
        &mut gw,
        &mut pool,
        Duration::from_millis(50),
        Port::Outside,
        &ether([0x02, 0, 0, 0, 0, 1], PEER_MAC, EthernetProtocol::Arp, &reply),
    );
    let esp: Vec<_> = out
        .iter()
        .filter(|(v, _)| *v == Verdict::Forward(Port::Outside))
        .collect();
    assert_eq!(esp.len(), 3);
    for (_, bytes) in esp {
        assert_eq!(&bytes[..6], &PEER_MAC);
        assert_eq!(bytes[14 + 9], 50);
    }
    // Now resolved: the next packet goes straight out.
    let out = send(
        &mut gw,
        &mut pool,
        Duration::from_millis(60),
        Port::Inside,
        &frame,
    );
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0].1[..6], &PEER_MAC);
    assert!(gw.stats().balanced());
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn a_tunnels_next_hop_follows_the_neighbour_table() {
    // ESP packets reuse their SA's resolved next hop; a new MAC for the
    // peer, or its entry expiring, must be seen by the very next packet.
    let mut gw = site_a(Algorithm::Aes128Gcm16, 1500);
    let mut pool = PacketPool::new(32);
    let frame = ether(
        GW_INSIDE_MAC,
        HOST_A_MAC,
        EthernetProtocol::Ipv4,
        &udp_packet(HOST_A, HOST_B, 100, 1),
    );
    let peer_says = |gw: &mut Gateway, pool: &mut PacketPool, now: Duration, mac: [u8; 6], op| {
        let message = arp(op, (mac, [10, 0, 0, 2]), ([0x02, 0, 0, 0, 0, 1], [10, 0, 0, 1]));
        let f = ether([0x02, 0, 0, 0, 0, 1], mac, EthernetProtocol::Arp, &message);
        send(gw, pool, now, Port::Outside, &f)
    };
    let esp_macs = |out: &[(Verdict, Vec<u8>)]| -> Vec<[u8; 6]> {
        out.iter()
            .filter(|(v, b)| *v == Verdict::Forward(Port::Outside) && b[12..14] == [0x08, 0x00])
            .map(|(_, b)| b[..6].try_into().unwrap())
            .collect()
    };
    let at = Duration::from_millis;
    send(&mut gw, &mut pool, at(0), Port::Inside, &frame);
    let out = peer_says(&mut gw, &mut pool, at(10), PEER_MAC, ArpOperation::Reply);
    assert_eq!(esp_macs(&out), vec![PEER_MAC]);
    for t in [20, 30] {
        let out = send(&mut gw, &mut pool, at(t), Port::Inside, &frame);
        assert_eq!(esp_macs(&out), vec![PEER_MAC]);
    }
    // The peer moves to another MAC (its ARP request updates our entry).
    let moved = [0x02, 0, 0, 0, 0x00, 0x22];
    peer_says(&mut gw, &mut pool, at(40), moved, ArpOperation::Request);
    let out = send(&mut gw, &mut pool, at(50), Port::Inside, &frame);
    assert_eq!(esp_macs(&out), vec![moved]);
    // Past the entry's lifetime the packet waits for ARP instead of using
    // the remembered MAC.
    let later = at(50) + dataplane::neighbor::REACHABLE_TIME + at(1);
    let out = send(&mut gw, &mut pool, later, Port::Inside, &frame);
    assert!(esp_macs(&out).is_empty(), "an expired neighbour is not used");
    assert!(
        out.iter().any(|(_, b)| b[12..14] == [0x08, 0x06]),
        "an ARP request goes out instead"
    );
    let mut rest = Vec::new();
    gw.shutdown(later, &mut rest, &mut pool);
    for (buf, _) in rest {
        pool.free(buf);
    }
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn unanswered_arp_drops_the_queue_after_a_timeout() {
    let mut gw = site_a(Algorithm::Aes128Gcm16, 1500);
    let mut pool = PacketPool::new(32);
    let frame = ether(
        GW_INSIDE_MAC,
        HOST_A_MAC,
        EthernetProtocol::Ipv4,
        &udp_packet(HOST_A, HOST_B, 10, 1),
    );
    send(&mut gw, &mut pool, Duration::ZERO, Port::Inside, &frame);
    let mut out = Vec::new();
    gw.handle_timeout(Duration::from_millis(1500), &mut out, &mut pool);
    let retried = collect(std::mem::take(&mut out), &mut pool);
    assert_eq!(retried.len(), 1, "the request is repeated after a second");
    gw.handle_timeout(Duration::from_secs(4), &mut out, &mut pool);
    let expired = collect(out, &mut pool);
    assert!(expired
        .iter()
        .any(|(v, _)| *v == Verdict::Drop(DropReason::NeighborUnreachable)));
    assert_eq!(gw.stats().drops.get(DropReason::NeighborUnreachable), 1);
    assert!(gw.stats().balanced());
    assert_eq!(pool.in_use(), 0, "parked buffers come back");
}

#[test]
fn answers_ping_to_its_own_address() {
    let mut gw = site_a(Algorithm::Aes128Gcm16, 1500);
    let mut pool = PacketPool::new(8);
    // Learn the host first so the reply can be framed.
    host_asks_for_gateway(&mut gw, &mut pool);
    let mut ping = udp_packet(HOST_A, "192.168.1.1".parse().unwrap(), 12, 0);
    ping[9] = 1;
    ping[20..28].copy_from_slice(&[8, 0, 0, 0, 0x12, 0x34, 0, 1]);
    let sum = !smoltcp::wire::checksum::data(&ping[20..]);
    ping[22..24].copy_from_slice(&sum.to_be_bytes());
    Ipv4Packet::new_unchecked(&mut ping[..]).fill_checksum();
    let out = send(
        &mut gw,
        &mut pool,
        Duration::ZERO,
        Port::Inside,
        &ether(GW_INSIDE_MAC, HOST_A_MAC, EthernetProtocol::Ipv4, &ping),
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, Verdict::Forward(Port::Inside));
    let reply = &out[0].1[14..];
    assert_eq!(reply[20], 0, "echo reply");
    assert_eq!(Ipv4Packet::new_checked(reply).unwrap().dst_addr(), HOST_A);
    assert_eq!(
        smoltcp::wire::checksum::data(&reply[20..]),
        0xffff,
        "valid ICMP checksum"
    );
}

#[test]
fn df_packets_too_big_for_the_tunnel_get_frag_needed_and_others_are_fragmented() {
    let mtu = 1400;
    let mut gw = site_a(Algorithm::Aes128Sha1, mtu);
    let mut pool = PacketPool::new(16);
    peer_announces_itself(&mut gw, &mut pool);
    host_asks_for_gateway(&mut gw, &mut pool);

    // 1372-byte packet with DF: its ESP form (20 + 8 + 16 + 1376 + 12 = 1432) exceeds 1400.
    let big = udp_packet(HOST_A, HOST_B, 1344, 0);
    let out = send(
        &mut gw,
        &mut pool,
        Duration::ZERO,
        Port::Inside,
        &ether(GW_INSIDE_MAC, HOST_A_MAC, EthernetProtocol::Ipv4, &big),
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, Verdict::Forward(Port::Inside));
    let icmp = &out[0].1[14..];
    assert_eq!((icmp[20], icmp[21]), (3, 4), "fragmentation needed");
    let next_hop_mtu = u16::from_be_bytes([icmp[26], icmp[27]]);
    // The advertised size must fit once protected; one block more must not.
    let (fits, _) = dataplane::esp::protected_size(
        &udp_packet(HOST_A, HOST_B, usize::from(next_hop_mtu) - 28, 0),
        Algorithm::Aes128Sha1,
        spd_sad::Mode::Tunnel,
        20,
        usize::from(mtu),
    );
    assert!(fits <= usize::from(mtu), "{next_hop_mtu} → {fits}");
    let (over, _) = dataplane::esp::protected_size(
        &udp_packet(HOST_A, HOST_B, usize::from(next_hop_mtu) - 28 + 16, 0),
        Algorithm::Aes128Sha1,
        spd_sad::Mode::Tunnel,
        20,
        usize::from(mtu),
    );
    assert!(over > usize::from(mtu));
    assert_eq!(gw.stats().drops.get(DropReason::FragNeeded), 1);

    // The same packet without DF is encapsulated, then fragmented.
    let mut no_df = big.clone();
    no_df[6] = 0;
    Ipv4Packet::new_unchecked(&mut no_df[..]).fill_checksum();
    let out = send(
        &mut gw,
        &mut pool,
        Duration::ZERO,
        Port::Inside,
        &ether(GW_INSIDE_MAC, HOST_A_MAC, EthernetProtocol::Ipv4, &no_df),
    );
    assert_eq!(out.len(), 2, "two fragments");
    let mut reassembled = Vec::new();
    for (i, (verdict, frame)) in out.iter().enumerate() {
        assert_eq!(*verdict, Verdict::Forward(Port::Outside));
        assert!(frame.len() - 14 <= usize::from(mtu));
        let ip = Ipv4Packet::new_checked(&frame[14..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.more_frags(), i == 0);
        assert_eq!(usize::from(ip.frag_offset()), reassembled.len());
        reassembled.extend_from_slice(&frame[14 + 20..]);
    }
    assert_eq!(
        reassembled.len(),
        8 + 16 + 1376 + 12,
        "the whole ESP packet, in order"
    );
    assert_eq!(
        gw.stats().generated,
        2 + 2,
        "ARP replies to the peer and the host + ICMP + one extra fragment"
    );
    assert!(gw.stats().balanced());
    assert_eq!(pool.in_use(), 0);
}

/// Fragments of one ESP packet, made by site A with a small outside MTU,
/// as raw IPv4 packets.
fn esp_fragments() -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut a = site_a(Algorithm::Aes128Sha1, 1400);
    let mut pool = PacketPool::new(16);
    peer_announces_itself(&mut a, &mut pool);
    let mut packet = udp_packet(HOST_A, HOST_B, 1344, 9);
    packet[6] = 0; // DF clear
    Ipv4Packet::new_unchecked(&mut packet[..]).fill_checksum();
    let out = send(
        &mut a,
        &mut pool,
        Duration::ZERO,
        Port::Inside,
        &ether(GW_INSIDE_MAC, HOST_A_MAC, EthernetProtocol::Ipv4, &packet),
    );
    assert_eq!(out.len(), 2);
    (packet, out.into_iter().map(|(_, f)| f[14..].to_vec()).collect())
}

fn site_b() -> Gateway {
    gateway_from(&tunnel_config(Algorithm::Aes128Sha1, "tunnel", false, false))
}

fn feed(
    gw: &mut Gateway,
    pool: &mut PacketPool,
    now: Duration,
    frames: &[Vec<u8>],
) -> Vec<(Verdict, Vec<u8>)> {
    frames
        .iter()
        .flat_map(|f| send(gw, pool, now, Port::Outside, f))
        .collect()
}

#[test]
fn fragmented_esp_is_reassembled_in_any_order() {
    let (packet, fragments) = esp_fragments();
    for order in [[0, 1], [1, 0]] {
        let mut b = site_b();
        let mut pool = PacketPool::new(8);
        let frames: Vec<Vec<u8>> = order.iter().map(|&i| fragments[i].clone()).collect();
        let out = feed(&mut b, &mut pool, Duration::ZERO, &frames);
        let delivered: Vec<_> = out
            .iter()
            .filter(|(v, _)| *v == Verdict::Forward(Port::Inside))
            .collect();
        assert_eq!(delivered.len(), 1, "{order:?}");
        assert_eq!(delivered[0].1, after_hops(&packet, 2));
        assert_eq!(b.stats().fragments_absorbed, 2);
        assert!(b.stats().balanced());
        assert_eq!(pool.in_use(), 0);
    }
}

#[test]
fn overlapping_fragments_drop_the_datagram() {
    let (_, fragments) = esp_fragments();
    let mut b = site_b();
    let mut pool = PacketPool::new(8);
    // The first fragment twice: the copy overlaps.
    let out = feed(
        &mut b,
        &mut pool,
        Duration::ZERO,
        &[fragments[0].clone(), fragments[0].clone(), fragments[1].clone()],
    );
    assert!(
        out.iter().all(|(v, _)| *v != Verdict::Forward(Port::Inside)),
        "nothing delivered"
    );
    assert!(b.stats().drops.get(DropReason::ReassemblyFailed) >= 1);
    // The last fragment started a datagram of its own; stopping frees it.
    let mut out = Vec::new();
    b.shutdown(Duration::ZERO, &mut out, &mut pool);
    collect(out, &mut pool);
    assert!(b.stats().balanced());
    assert_eq!(pool.in_use(), 0);
    // Forged: a piece that lands inside the first fragment's range.
    let mut inner = fragments[1].clone();
    Ipv4Packet::new_unchecked(&mut inner[..]).set_frag_offset(8);
    Ipv4Packet::new_unchecked(&mut inner[..]).fill_checksum();
    let mut b = site_b();
    feed(&mut b, &mut pool, Duration::ZERO, &[fragments[0].clone(), inner]);
    assert_eq!(
        b.stats().drops.get(DropReason::ReassemblyFailed),
        2,
        "the fragment and its datagram"
    );
    let mut out = Vec::new();
    b.shutdown(Duration::ZERO, &mut out, &mut pool);
    collect(out, &mut pool);
    assert!(b.stats().balanced());
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn incomplete_datagrams_time_out_and_free_their_buffers() {
    let (_, fragments) = esp_fragments();
    let mut b = site_b();
    let mut pool = PacketPool::new(8);
    feed(&mut b, &mut pool, Duration::ZERO, &fragments[..1]);
    assert_eq!(pool.in_use(), 1, "the datagram being built holds one buffer");
    let mut out = Vec::new();
    b.handle_timeout(Duration::from_secs(5), &mut out, &mut pool);
    assert!(out.is_empty(), "still waiting");
    b.handle_timeout(Duration::from_secs(16), &mut out, &mut pool);
    let dropped = collect(out, &mut pool);
    assert_eq!(dropped.len(), 1);
    assert_eq!(dropped[0].0, Verdict::Drop(DropReason::ReassemblyTimeout));
    assert!(b.stats().balanced());
    assert_eq!(pool.in_use(), 0);
}

/// `fragment` (a raw IPv4 first fragment) as if `src` had sent it with IP
/// ID `ident`.
fn spoofed(fragment: &[u8], src: std::net::Ipv4Addr, ident: u16) -> Vec<u8> {
    let mut f = fragment.to_vec();
    let mut ip = Ipv4Packet::new_unchecked(&mut f[..]);
    ip.set_src_addr(src);
    ip.set_ident(ident);
    ip.fill_checksum();
    f
}

/// Site B with a second tunnel, to 10.0.0.3: another peer.
fn site_b_with_two_peers() -> Gateway {
    use ike_stub::builder::{pattern_key, TunnelBuilder};
    use spd_sad::Ipv4Prefix;
    let mut built = tunnel_builder(Algorithm::Aes128Sha1, "tunnel", false, false);
    let net = |third| Ipv4Prefix::new(std::net::Ipv4Addr::new(192, 168, third, 0), 24).unwrap();
    built.tunnels.push(
        TunnelBuilder::new(
            "u",
            (
                std::net::Ipv4Addr::new(10, 0, 0, 2),
                std::net::Ipv4Addr::new(10, 0, 0, 3),
            ),
            Algorithm::Aes128Sha1,
            (0x2001, 0x2002),
        )
        .subnets(net(2), net(3))
        .keys_with(|dir, len, auth| pattern_key(len, 3, u8::from(dir == "out") + 2 * u8::from(auth))),
    );
    gateway_from(&built.to_toml())
}

fn delivered(out: &[(Verdict, Vec<u8>)]) -> usize {
    out.iter()
        .filter(|(v, _)| *v == Verdict::Forward(Port::Inside))
        .count()
}

/// Spoofed first fragments from a source that is no peer's take no slot
/// (they used to fill the table, and every fragmented ESP packet was
/// refused until they timed out 15 s later): the peer's fragmented ESP
/// still goes through.
#[test]
fn fragments_from_a_non_peer_are_refused_and_block_nobody() {
    let (packet, fragments) = esp_fragments();
    let mut b = site_b();
    let mut pool = PacketPool::new(16);
    let attacker = std::net::Ipv4Addr::new(203, 0, 113, 66);
    let flood: Vec<Vec<u8>> = (0..200).map(|i| spoofed(&fragments[0], attacker, i)).collect();
    let out = feed(&mut b, &mut pool, Duration::ZERO, &flood);
    assert!(out
        .iter()
        .all(|(v, _)| dropped(*v).map(DropReason::name) == Some("fragment_not_from_peer")));
    assert_eq!(pool.in_use(), 0, "no datagram started");
    let out = feed(&mut b, &mut pool, Duration::from_millis(10), &fragments);
    assert_eq!(delivered(&out), 1, "the peer's packet, reassembled");
    assert_eq!(out.last().map(|(_, p)| p.clone()), Some(after_hops(&packet, 2)));
    let count = |name| b.stats().drops.get(DropReason::from_name(name).expect(name));
    assert_eq!(count("fragment_not_from_peer"), 200);
    assert!(b.stats().balanced(), "{:?}", b.stats());
}

/// A peer (here the other tunnel's, 10.0.0.3, with its address spoofed or
/// not) that floods first fragments only ever pushes out its own oldest:
/// it holds at most its share of the table, so another peer's datagram,
/// in progress before the flood or started after it, completes.
#[test]
fn a_peer_flooding_fragments_takes_only_its_share() {
    let (packet, fragments) = esp_fragments();
    let flooder = std::net::Ipv4Addr::new(10, 0, 0, 3);
    let flood: Vec<Vec<u8>> = (0..200).map(|i| spoofed(&fragments[0], flooder, i)).collect();
    let share = dataplane::reassembly::MAX_PER_SOURCE;
    for before in [false, true] {
        let mut b = site_b_with_two_peers();
        let mut pool = PacketPool::new(96);
        let mut out = Vec::new();
        if before {
            out.extend(feed(&mut b, &mut pool, Duration::ZERO, &fragments[..1]));
        }
        out.extend(feed(&mut b, &mut pool, Duration::from_millis(1), &flood));
        assert_eq!(
            pool.in_use(),
            share + usize::from(before),
            "the flooder holds its share"
        );
        let rest = if before { &fragments[1..] } else { &fragments[..] };
        out.extend(feed(&mut b, &mut pool, Duration::from_millis(2), rest));
        assert_eq!(delivered(&out), 1, "before the flood: {before}");
        assert_eq!(out.last().map(|(_, p)| p.clone()), Some(after_hops(&packet, 2)));
        let count = |name| b.stats().drops.get(DropReason::from_name(name).expect(name));
        assert_eq!(count("reassembly_source_limit"), (200 - share) as u64);
        let mut rest = Vec::new();
        b.shutdown(Duration::from_millis(3), &mut rest, &mut pool);
        collect(rest, &mut pool);
        assert!(b.stats().balanced(), "{:?}", b.stats());
        assert_eq!(pool.in_use(), 0);
    }
}
