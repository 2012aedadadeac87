//! The gateway's own IPv4 packets take the outbound SPD (RFC 4301 §4.4.1,
//! §5.1): an echo reply or an ICMP error that a `protect` policy covers
//! leaves as ESP under that policy's SA (decrypted here by the peer
//! gateway), never in the clear; a `discard` policy drops it and counts it;
//! an echo request that arrives through an SA is answered through it.
//! IPv6's counterparts are in `tests/ipv6_tunnel.rs`.

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use accel::Algorithm;
use common::*;
use dataplane::{DropReason, Gateway, PacketPool, Port, Verdict};
use ike_stub::builder::{ConfigBuilder, PolicyBuilder};
use smoltcp::wire::{IpProtocol, Ipv4Packet};
use spd_sad::{Ipv4Prefix, PolicyDirection};

/// Gateway A's inside address, inside the tunnel's local subnet.
const GW_A: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 1);
const ALG: Algorithm = Algorithm::Aes128Gcm16;
/// The SPI A sends with (B's inbound SA).
const SPI_A_TO_B: u32 = 0x1001;

/// An ICMP echo request from `src` to `dst` (DF set, as ping sets it).
fn echo_request(src: Ipv4Addr, dst: Ipv4Addr, seq: u16) -> Vec<u8> {
    let mut p = udp_packet(src, dst, 24, seq as u8);
    p[9] = 1;
    p[20..28].copy_from_slice(&[8, 0, 0, 0, 0x12, 0x34, (seq >> 8) as u8, seq as u8]);
    let sum = !smoltcp::wire::checksum::data(&p[20..]);
    p[22..24].copy_from_slice(&sum.to_be_bytes());
    Ipv4Packet::new_unchecked(&mut p[..]).fill_checksum();
    p
}

fn host(prefix: Ipv4Addr) -> Ipv4Prefix {
    Ipv4Prefix::host(prefix)
}

fn net(third: u8) -> Ipv4Prefix {
    Ipv4Prefix::new(Ipv4Addr::new(192, 168, third, 0), 24).unwrap()
}

/// One end of the shared test tunnel, changed by `edit`.
fn end(mode: &str, a: bool, edit: impl FnOnce(&mut ConfigBuilder)) -> Gateway {
    gateway_from(&tunnel_config_edited(ALG, mode, false, a, edit))
}

fn send(gw: &mut Gateway, pool: &mut PacketPool, from: Port, packet: &[u8]) -> (Verdict, Vec<u8>) {
    run(gw, pool, Duration::ZERO, from, packet)
}

/// Asserts that `packet` is ESP (raw, IPv4) under `spi` and returns it.
fn assert_esp(packet: &[u8], spi: u32) {
    let ip = Ipv4Packet::new_checked(packet).expect("IPv4");
    assert_eq!(
        ip.next_header(),
        IpProtocol::IpSecEsp,
        "ESP, not the clear packet"
    );
    assert_eq!(&ip.payload()[..4], &spi.to_be_bytes(), "under the SA's SPI");
}

/// Asserts that `packet` is an echo reply from `src` to `dst` answering
/// [`echo_request`]'s `seq`, with a right ICMP checksum.
fn assert_echo_reply(packet: &[u8], src: Ipv4Addr, dst: Ipv4Addr, seq: u16) {
    let ip = Ipv4Packet::new_checked(packet).expect("IPv4");
    assert!(ip.verify_checksum());
    assert_eq!((ip.src_addr(), ip.dst_addr()), (src, dst));
    let icmp = ip.payload();
    assert_eq!((icmp[0], icmp[1]), (0, 0), "echo reply");
    assert_eq!(&icmp[4..8], &[0x12, 0x34, (seq >> 8) as u8, seq as u8]);
    assert_eq!(smoltcp::wire::checksum::data(icmp), 0xffff, "ICMP checksum");
}

/// A host behind B pings A's inside address through the tunnel (tunnel
/// mode), or B's outside end pings A's in transport mode: A answers, and
/// the reply goes back through the SA, never in the clear.
#[test]
fn an_echo_request_through_an_sa_is_answered_through_it() {
    for mode in ["tunnel", "transport"] {
        let (a, b) = if mode == "tunnel" {
            (end(mode, true, |_| {}), end(mode, false, |_| {}))
        } else {
            // Transport mode between the gateways' own outside addresses
            // (no subnets: the ends themselves).
            let ends = |c: &mut ConfigBuilder| {
                c.tunnels[0].local_subnet = None;
                c.tunnels[0].remote_subnet = None;
            };
            (end(mode, true, ends), end(mode, false, ends))
        };
        let (mut a, mut b) = (a, b);
        let mut pool = PacketPool::new(8);
        let (from, to) = match mode {
            "tunnel" => (HOST_B, GW_A),
            _ => (Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 1)),
        };
        let (verdict, esp) = send(&mut b, &mut pool, Port::Inside, &echo_request(from, to, 1));
        assert_eq!(
            verdict,
            Verdict::Forward(Port::Outside),
            "{mode}: B protects the ping"
        );
        let (verdict, reply) = send(&mut a, &mut pool, Port::Outside, &esp);
        assert_eq!(
            verdict,
            Verdict::Forward(Port::Outside),
            "{mode}: A answers, back through the SA"
        );
        assert_esp(&reply, SPI_A_TO_B);
        let stats = a.stats();
        assert_eq!(
            (
                stats.decapsulated,
                stats.local_delivered,
                stats.generated,
                stats.encapsulated
            ),
            (1, 1, 1, 1),
            "{mode}"
        );
        assert!(stats.balanced(), "{mode}: {stats:?}");
        // B decrypts it: the reply, whole.
        let (verdict, inner) = send(&mut b, &mut pool, Port::Outside, &reply);
        if mode == "tunnel" {
            assert_eq!(verdict, Verdict::Forward(Port::Inside));
            assert_echo_reply(&inner, to, from, 1);
        } else {
            // For B's own address: decrypted, verified and consumed.
            assert_eq!(verdict, Verdict::Consumed);
            assert_eq!((b.stats().decapsulated, b.stats().drops.total()), (1, 0));
        }
    }
}

/// A clear ping that an inbound bypass lets in, to an address that an
/// outbound `protect` policy covers: the reply is protected. Under a
/// `discard` policy it is dropped and counted instead.
#[test]
fn an_echo_reply_that_a_protect_policy_covers_never_leaves_in_the_clear() {
    let let_pings_in = |c: &mut ConfigBuilder| {
        c.policies.push(PolicyBuilder {
            priority: Some(1),
            protocol: Some("icmp".into()),
            ..PolicyBuilder::bypass("ping-in", PolicyDirection::In, net(2), host(GW_A))
        });
    };
    let mut a = end("tunnel", true, let_pings_in);
    let mut b = end("tunnel", false, |_| {});
    let mut pool = PacketPool::new(8);
    let (verdict, reply) = send(&mut a, &mut pool, Port::Outside, &echo_request(HOST_B, GW_A, 2));
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    assert_esp(&reply, SPI_A_TO_B);
    let (verdict, inner) = send(&mut b, &mut pool, Port::Outside, &reply);
    assert_eq!(verdict, Verdict::Forward(Port::Inside), "B decrypts it");
    assert_echo_reply(&inner, GW_A, HOST_B, 2);

    // The same with a discard policy ahead of the tunnel's.
    let mut a = end("tunnel", true, |c| {
        let_pings_in(c);
        c.policies.push(PolicyBuilder {
            priority: Some(1),
            action: "discard".into(),
            ..PolicyBuilder::bypass("quiet", PolicyDirection::Out, host(GW_A), net(2))
        });
    });
    let (verdict, _) = send(&mut a, &mut pool, Port::Outside, &echo_request(HOST_B, GW_A, 3));
    assert_eq!(verdict, Verdict::Drop(DropReason::PolicyDiscard));
    let stats = a.stats();
    assert_eq!(stats.drops.get(DropReason::PolicyDiscard), 1);
    assert_eq!((stats.tx_packets, stats.encapsulated), (0, 0));
    assert!(stats.balanced(), "{stats:?}");

    // No policy at all for a reply that would leave by the outside: the
    // SPD's default, discard; to the inside, where no boundary is
    // crossed, a ping is answered as ever, even when a policy that would
    // discard it covers it too (a catch-all).
    let mut a = end("tunnel", true, |c| {
        c.policies.push(PolicyBuilder {
            priority: Some(1),
            ..PolicyBuilder::bypass("any-in", PolicyDirection::In, net(3), host(GW_A))
        });
        c.policies.push(PolicyBuilder {
            priority: Some(1),
            action: "discard".into(),
            ..PolicyBuilder::bypass("catch-all", PolicyDirection::Out, host(GW_A), net(1))
        });
    });
    let stranger = Ipv4Addr::new(192, 168, 3, 30);
    let (verdict, _) = send(&mut a, &mut pool, Port::Outside, &echo_request(stranger, GW_A, 4));
    assert_eq!(verdict, Verdict::Drop(DropReason::NoPolicy));
    let (verdict, reply) = send(&mut a, &mut pool, Port::Inside, &echo_request(HOST_A, GW_A, 5));
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    assert_echo_reply(&reply, GW_A, HOST_A, 5);
    assert!(a.stats().balanced());
}

/// A packet from behind the peer that is too large for the inside link
/// (DF set): the fragmentation-needed error (RFC 1191) goes back to its
/// source through the tunnel, from A's inside address, which the tunnel
/// covers; before, it was dropped without one.
#[test]
fn frag_needed_about_a_packet_that_came_through_the_tunnel_goes_back_through_it() {
    let mut a = end("tunnel", true, |c| interface(c, "inside").mtu = Some(1300));
    let mut b = end("tunnel", false, |_| {});
    let mut pool = PacketPool::new(8);
    let big = udp_packet(HOST_B, HOST_A, 1400 - 28, 5);
    let (verdict, esp) = send(&mut b, &mut pool, Port::Inside, &big);
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    let (verdict, error) = send(&mut a, &mut pool, Port::Outside, &esp);
    assert_eq!(verdict, Verdict::Forward(Port::Outside), "the error, protected");
    assert_esp(&error, SPI_A_TO_B);
    assert_eq!(a.stats().drops.get(DropReason::FragNeeded), 1);
    assert!(a.stats().balanced(), "{:?}", a.stats());
    let (verdict, inner) = send(&mut b, &mut pool, Port::Outside, &error);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let ip = Ipv4Packet::new_checked(&inner[..]).unwrap();
    assert_eq!((ip.src_addr(), ip.dst_addr()), (GW_A, HOST_B));
    let icmp = ip.payload();
    assert_eq!((icmp[0], icmp[1]), (3, 4), "fragmentation needed");
    assert_eq!(u16::from_be_bytes([icmp[6], icmp[7]]), 1300, "the inside MTU");
    assert_eq!(smoltcp::wire::checksum::data(icmp), 0xffff);
    // The packet's header, as it was when it died (TTL already down one).
    assert_eq!(&icmp[8 + 12..8 + 20], &big[12..20], "the quoted addresses");
}

/// A TTL-expired packet that came in the clear through a bypass policy:
/// the time exceeded leaves from the address it arrived on, as before,
/// and takes the outbound SPD: a `discard` policy stops it.
#[test]
fn time_exceeded_takes_the_outbound_spd_too() {
    let policies = |c: &mut ConfigBuilder, out: &str| {
        let stranger = Ipv4Prefix::new(Ipv4Addr::new(172, 16, 0, 0), 16).unwrap();
        c.policies.push(PolicyBuilder::bypass(
            "through",
            PolicyDirection::In,
            stranger,
            net(1),
        ));
        c.policies.push(PolicyBuilder {
            action: out.into(),
            ..PolicyBuilder::bypass(
                "errors",
                PolicyDirection::Out,
                host(Ipv4Addr::new(10, 0, 0, 1)),
                stranger,
            )
        });
        c.routes.push(ike_stub::builder::RouteBuilder {
            destination: stranger.into(),
            via: Some(Ipv4Addr::new(10, 0, 0, 2).into()),
            interface: None,
        });
    };
    let mut pool = PacketPool::new(8);
    let mut ttl_one = udp_packet(Ipv4Addr::new(172, 16, 0, 9), HOST_A, 20, 1);
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut ttl_one[..]);
        ip.set_hop_limit(1);
        ip.fill_checksum();
    }
    let mut a = end("tunnel", true, |c| policies(c, "bypass"));
    let (verdict, error) = send(&mut a, &mut pool, Port::Outside, &ttl_one);
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    assert_eq!(
        (error[9], error[20]),
        (1, 11),
        "a time exceeded, in the clear as bypassed"
    );
    let mut a = end("tunnel", true, |c| policies(c, "discard"));
    let (verdict, _) = send(&mut a, &mut pool, Port::Outside, &ttl_one);
    assert_eq!(verdict, Verdict::Drop(DropReason::PolicyDiscard));
    let stats = a.stats();
    assert_eq!(
        (
            stats.drops.get(DropReason::TtlExpired),
            stats.drops.get(DropReason::PolicyDiscard)
        ),
        (1, 1),
        "the packet, and the error about it"
    );
    assert!(stats.balanced(), "{stats:?}");
}
