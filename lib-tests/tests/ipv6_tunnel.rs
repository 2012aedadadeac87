//! IPv6 networks over an IPv4 ESP tunnel ("6-in-4", RFC 4301 §5.1.2
//! tunnel mode with next header 41): two in-memory gateways, A between
//! 2001:db8:1::/64 and 10.0.0.1, B between 2001:db8:2::/64 and 10.0.0.2.
//! What a router must do on the way is checked too: the hop limit (RFC
//! 8200 §3, time exceeded, RFC 4443 §3.3), packet too big with the
//! tunnel's MTU (RFC 8200 §5, RFC 4213 §3.2), link-local scope (RFC 4291
//! §2.5.6), the inbound selectors (RFC 4301 §5.2) and next hops resolved by
//! neighbour discovery (RFC 4861) rather than ARP.

mod common;

use std::net::Ipv6Addr;
use std::time::Duration;

use accel::{Algorithm, Style};
use common::*;
use dataplane::{DropReason, Gateway, LinkLayer, PacketPool, Port, Verdict};
use ike_stub::builder::{ConfigBuilder, PolicyBuilder};
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv6Packet, IpProtocol, Ipv4Packet, Ipv6Packet,
    NdiscNeighborFlags, NdiscRepr, RawHardwareAddress,
};
use spd_sad::{Ipv6Prefix, PolicyDirection};

const HOST_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10);
const HOST_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x10);
const GW_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
const HOST_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0xaa, 0x10]);
const GW_A_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0x01, 0x01]);
/// The tunnel's ends when its outer headers are IPv6.
const OUTER_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 1);
const OUTER_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 2);

/// One end; `resolve` turns neighbour discovery on (live mode).
fn gateway(alg: Algorithm, a: bool, outside_mtu: u16, resolve: bool) -> Gateway {
    end(alg, a, outside_mtu, resolve, Outer::V4, true)
}

/// The tunnel's outer family.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outer {
    V4,
    V6,
}

/// One end with the tunnel's outer headers of `outer` and its networks
/// IPv6 (`inner6`) or the shared test site's IPv4 ones.
fn end(alg: Algorithm, a: bool, outside_mtu: u16, resolve: bool, outer: Outer, inner6: bool) -> Gateway {
    end_with(alg, a, outside_mtu, resolve, outer, inner6, |_| {})
}

/// [`end`], its configuration changed by `edit` last.
fn end_with(
    alg: Algorithm,
    a: bool,
    outside_mtu: u16,
    resolve: bool,
    outer: Outer,
    inner6: bool,
    edit: impl FnOnce(&mut ConfigBuilder),
) -> Gateway {
    let mut built = tunnel_builder(alg, "tunnel", false, a);
    interface(&mut built, "outside").mtu = Some(outside_mtu);
    if outer == Outer::V6 {
        let (own, far) = if a { (OUTER_A, OUTER_B) } else { (OUTER_B, OUTER_A) };
        interface(&mut built, "outside").address6 = Some(format!("{own}/64"));
        built.tunnels[0].local = own.into();
        built.tunnels[0].remote = far.into();
    }
    if !inner6 {
        edit(&mut built);
        let config = common::parsed(&built);
        let mut setup = config.setup(LinkLayer::Ethernet, Style::Async);
        setup.resolve_neighbors = resolve;
        return common::soft_gateway(&config, setup);
    }
    let (own, far) = if a { (1, 2) } else { (2, 1) };
    let inside = interface(&mut built, "inside");
    inside.address6 = Some(format!("2001:db8:{own}::1/64"));
    if a {
        inside.mac = Some(GW_A_MAC);
    }
    let net = |n: u16| Ipv6Prefix::new(Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, 0), 64).unwrap();
    built.tunnels[0].local_subnet = Some(net(own).into());
    built.tunnels[0].remote_subnet = Some(net(far).into());
    edit(&mut built);
    let config = common::parsed(&built);
    let mut setup = config.setup(LinkLayer::Ethernet, Style::Async);
    setup.resolve_neighbors = resolve;
    common::soft_gateway(&config, setup)
}

/// An Ethernet frame from a host to gateway A holding an IPv6/UDP packet.
fn udp6_frame(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, traffic_class: u8, payload_len: usize) -> Vec<u8> {
    let mut frame = vec![0u8; 14 + 40 + 8 + payload_len];
    {
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        eth.set_dst_addr(GW_A_MAC);
        eth.set_src_addr(HOST_MAC);
        eth.set_ethertype(EthernetProtocol::Ipv6);
    }
    let packet = &mut frame[14..];
    {
        let mut ip = Ipv6Packet::new_unchecked(&mut *packet);
        ip.set_version(6);
        ip.set_traffic_class(traffic_class);
        ip.set_flow_label(0x12345);
        ip.set_payload_len((8 + payload_len) as u16);
        ip.set_next_header(IpProtocol::Udp);
        ip.set_hop_limit(hop_limit);
        ip.set_src_addr(src);
        ip.set_dst_addr(dst);
    }
    let udp = &mut packet[40..];
    udp[0..2].copy_from_slice(&4000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&5000u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    for (i, b) in udp[8..].iter_mut().enumerate() {
        *b = i as u8;
    }
    frame
}

/// HOST_A resolves gateway A first, as a real host does (RFC 4861 §7.2.2):
/// A answers and, from the solicitation's link-layer option, learns
/// HOST_A (§7.2.3), so that what A sends back needs no resolution.
fn introduce_host(a: &mut Gateway, pool: &mut PacketPool) {
    let group = dataplane::icmp6::solicited_node(GW_A);
    let ns = NdiscRepr::NeighborSolicit {
        target_addr: GW_A,
        lladdr: Some(RawHardwareAddress::from_bytes(HOST_MAC.as_bytes())),
    };
    let packet = icmpv6_packet(HOST_A, group, 255, &smoltcp::wire::Icmpv6Repr::Ndisc(ns));
    let mut frame = vec![0u8; 14];
    {
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        eth.set_dst_addr(dataplane::icmp6::multicast_mac(group));
        eth.set_src_addr(HOST_MAC);
        eth.set_ethertype(EthernetProtocol::Ipv6);
    }
    frame.extend_from_slice(&packet);
    let (verdict, _) = send(a, pool, Port::Inside, &frame);
    assert_eq!(verdict, Verdict::Forward(Port::Inside), "the advertisement");
}

/// What A sends B for a 100-byte UDP datagram from HOST_A to HOST_B.
fn esp_for_host_b(a: &mut Gateway, pool: &mut PacketPool) -> Vec<u8> {
    let (verdict, esp) = send(a, pool, Port::Inside, &udp6_frame(HOST_A, HOST_B, 64, 0, 100));
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    esp
}

fn send(gw: &mut Gateway, pool: &mut PacketPool, from: Port, frame: &[u8]) -> (Verdict, Vec<u8>) {
    run(gw, pool, Duration::ZERO, from, frame)
}

/// The ICMPv6 message in a frame A sent back to the host, checksum checked.
fn icmp6_reply(frame: &[u8]) -> (Ipv6Addr, Ipv6Addr, Vec<u8>) {
    let eth = EthernetFrame::new_checked(frame).unwrap();
    assert_eq!(eth.ethertype(), EthernetProtocol::Ipv6);
    assert_eq!(eth.dst_addr(), HOST_MAC);
    let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(ip.next_header(), IpProtocol::Icmpv6);
    let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
    assert!(icmp.verify_checksum(&ip.src_addr(), &ip.dst_addr()), "checksum");
    (ip.src_addr(), ip.dst_addr(), ip.payload().to_vec())
}

#[test]
fn ipv6_crosses_an_ipv4_tunnel_for_every_proposal() {
    for alg in [
        Algorithm::Aes128Gcm16,
        Algorithm::Aes128Sha1,
        Algorithm::ChaCha20Poly1305,
    ] {
        let mut a = gateway(alg, true, 1500, false);
        let mut b = gateway(alg, false, 1500, false);
        let mut pool = PacketPool::new(8);
        let sent = udp6_frame(HOST_A, HOST_B, 64, 0xb8, 300);
        let (verdict, esp) = send(&mut a, &mut pool, Port::Inside, &sent);
        assert_eq!(verdict, Verdict::Forward(Port::Outside), "{alg}");
        let eth = EthernetFrame::new_checked(&esp[..]).unwrap();
        assert_eq!(
            eth.ethertype(),
            EthernetProtocol::Ipv4,
            "{alg}: an IPv4 outer header"
        );
        let outer = Ipv4Packet::new_checked(eth.payload()).unwrap();
        assert_eq!(outer.next_header(), IpProtocol::IpSecEsp);
        assert_eq!(
            (outer.src_addr().octets(), outer.dst_addr().octets()),
            ([10, 0, 0, 1], [10, 0, 0, 2])
        );
        // RFC 4301 §5.1.2.1: DSCP and ECN from the inner traffic class;
        // RFC 4213 §3.2.1: DF clear for IPv6 inside.
        assert_eq!(outer.dscp() << 2 | outer.ecn(), 0xb8, "{alg}");
        assert!(!outer.dont_frag(), "{alg}");
        assert!(outer.verify_checksum());
        // No inner bytes in the clear.
        assert!(
            !esp.windows(16).any(|w| w == HOST_B.octets()),
            "{alg}: the inner address leaked"
        );

        let (verdict, inner) = send(&mut b, &mut pool, Port::Outside, &esp);
        assert_eq!(verdict, Verdict::Forward(Port::Inside), "{alg}");
        let eth = EthernetFrame::new_checked(&inner[..]).unwrap();
        assert_eq!(eth.ethertype(), EthernetProtocol::Ipv6);
        let mut expected = sent[14..].to_vec();
        expected[7] -= 2; // one hop at each gateway
        assert_eq!(
            eth.payload(),
            &expected[..],
            "{alg}: the packet, hop limit down by two"
        );
        assert_eq!(b.stats().decapsulated, 1);
        assert_eq!(a.stats().encapsulated, 1, "{alg}");

        // The way back, B to A.
        let mut back = udp6_frame(HOST_B, HOST_A, 64, 0, 40);
        back[..6].copy_from_slice(&[0x02, 0, 0xc0, 0xa8, 2, 1]);
        let (verdict, esp) = send(&mut b, &mut pool, Port::Inside, &back);
        assert_eq!(verdict, Verdict::Forward(Port::Outside), "{alg}");
        let (verdict, inner) = send(&mut a, &mut pool, Port::Outside, &esp);
        assert_eq!(verdict, Verdict::Forward(Port::Inside), "{alg}");
        assert_eq!(
            EthernetFrame::new_checked(&inner[..]).unwrap().payload()[8..40],
            back[22..54]
        );
    }
}

#[test]
fn a_router_s_checks_come_first() {
    let mut a = gateway(Algorithm::Aes128Gcm16, true, 1500, false);
    let mut pool = PacketPool::new(8);
    introduce_host(&mut a, &mut pool);
    // Hop limit 1: time exceeded back to the host, from our address.
    let (verdict, reply) = send(
        &mut a,
        &mut pool,
        Port::Inside,
        &udp6_frame(HOST_A, HOST_B, 1, 0, 20),
    );
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let (src, dst, icmp) = icmp6_reply(&reply);
    assert_eq!((src, dst, icmp[0], icmp[1]), (GW_A, HOST_A, 3, 0));
    assert_eq!(a.stats().drops.get(DropReason::TtlExpired), 1);
    // Link-local addresses never leave their link.
    let link_local = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x10);
    let (verdict, _) = send(
        &mut a,
        &mut pool,
        Port::Inside,
        &udp6_frame(link_local, HOST_B, 64, 0, 20),
    );
    assert_eq!(verdict, Verdict::Drop(DropReason::NoRoute));
    // No policy for this destination: discarded (RFC 4301 §4.4.1).
    let elsewhere = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1);
    let (verdict, _) = send(
        &mut a,
        &mut pool,
        Port::Inside,
        &udp6_frame(HOST_A, elsewhere, 64, 0, 20),
    );
    assert_eq!(verdict, Verdict::Drop(DropReason::NoPolicy));
    // Plaintext IPv6 from the outside that policy says must be protected.
    let mut plain = udp6_frame(HOST_B, HOST_A, 64, 0, 20);
    plain[..6].copy_from_slice(&[0x02, 0, 10, 0, 0, 1]);
    let (verdict, _) = send(&mut a, &mut pool, Port::Outside, &plain);
    assert_eq!(
        verdict,
        Verdict::Drop(DropReason::Unsupported),
        "the outside has no address6"
    );
}

#[test]
fn too_big_for_the_tunnel_is_a_packet_too_big_with_its_mtu() {
    let mut a = gateway(Algorithm::Aes128Gcm16, true, 1500, false);
    let mut pool = PacketPool::new(8);
    introduce_host(&mut a, &mut pool);
    // 1500 bytes of IPv6 fit the inside link but not the tunnel.
    let big = udp6_frame(HOST_A, HOST_B, 64, 0, 1500 - 48);
    let (verdict, reply) = send(&mut a, &mut pool, Port::Inside, &big);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let (src, dst, icmp) = icmp6_reply(&reply);
    assert_eq!((src, dst, icmp[0], icmp[1]), (GW_A, HOST_A, 2, 0));
    let mtu = u32::from_be_bytes([icmp[4], icmp[5], icmp[6], icmp[7]]);
    // 20 outer + 8 ESP + 8 IV + 16 ICV leave 1448 bytes, a multiple of
    // GCM's 4-byte alignment, for the packet and its 2-byte trailer.
    assert_eq!(mtu, 1446, "the tunnel's MTU for IPv6");
    assert_eq!(a.stats().drops.get(DropReason::FragNeeded), 1);
    // The largest packet the error allows goes through whole.
    let (verdict, esp) = send(
        &mut a,
        &mut pool,
        Port::Inside,
        &udp6_frame(HOST_A, HOST_B, 64, 0, mtu as usize - 48),
    );
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    assert_eq!(esp.len(), 14 + 1500);
    // Below the IPv6 minimum MTU the outer packet is fragmented instead
    // (RFC 4213 §3.2): a 1280-byte packet through a 1300-byte link.
    let mut narrow = gateway(Algorithm::Aes128Gcm16, true, 1300, false);
    let mut buf = pool.alloc().unwrap();
    assert!(buf.fill(&udp6_frame(HOST_A, HOST_B, 64, 0, 1280 - 48)));
    let outputs = drivers::drive::handle_frame(&mut narrow, Duration::ZERO, Port::Inside, buf, &mut pool);
    assert_eq!(outputs.len(), 2, "two fragments");
    for (buf, verdict) in outputs {
        assert_eq!(verdict, Verdict::Forward(Port::Outside));
        let eth = EthernetFrame::new_checked(buf.data()).unwrap();
        assert!(Ipv4Packet::new_checked(eth.payload()).unwrap().verify_checksum());
        pool.free(buf);
    }
}

#[test]
fn next_hops_resolve_by_neighbour_discovery() {
    let mut a = gateway(Algorithm::Aes128Gcm16, true, 1500, false);
    let mut b = gateway(Algorithm::Aes128Gcm16, false, 1500, true);
    let mut pool = PacketPool::new(8);
    let esp = esp_for_host_b(&mut a, &mut pool);
    // B does not know HOST_B: the packet waits, a solicitation goes out.
    let mut buf = pool.alloc().unwrap();
    assert!(buf.fill(&esp));
    let mut outputs = drivers::drive::handle_frame(&mut b, Duration::ZERO, Port::Outside, buf, &mut pool);
    assert_eq!(outputs.len(), 1, "only the solicitation: the packet is parked");
    let (ns, verdict) = outputs.remove(0);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let eth = EthernetFrame::new_checked(ns.data()).unwrap();
    let group = dataplane::icmp6::solicited_node(HOST_B);
    assert_eq!(eth.dst_addr(), dataplane::icmp6::multicast_mac(group));
    let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!((ip.dst_addr(), ip.hop_limit()), (group, 255));
    let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
    match NdiscRepr::parse(&icmp).unwrap() {
        NdiscRepr::NeighborSolicit { target_addr, .. } => assert_eq!(target_addr, HOST_B),
        other => panic!("not a solicitation: {other:?}"),
    }
    let b_gw = ip.src_addr();
    let b_mac = eth.src_addr();
    pool.free(ns);
    // HOST_B answers; the parked packet leaves for its MAC.
    let na = NdiscRepr::NeighborAdvert {
        flags: NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
        target_addr: HOST_B,
        lladdr: Some(RawHardwareAddress::from_bytes(HOST_MAC.as_bytes())),
    };
    let packet = icmpv6_packet(HOST_B, b_gw, 255, &smoltcp::wire::Icmpv6Repr::Ndisc(na));
    let mut frame = vec![0u8; 14];
    {
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        eth.set_dst_addr(b_mac);
        eth.set_src_addr(HOST_MAC);
        eth.set_ethertype(EthernetProtocol::Ipv6);
    }
    frame.extend_from_slice(&packet);
    let mut buf = pool.alloc().unwrap();
    assert!(buf.fill(&frame));
    let outputs =
        drivers::drive::handle_frame(&mut b, Duration::from_millis(5), Port::Inside, buf, &mut pool);
    let forwarded: Vec<_> = outputs
        .into_iter()
        .filter_map(|(buf, verdict)| {
            let data = buf.data().to_vec();
            pool.free(buf);
            (verdict == Verdict::Forward(Port::Inside)).then_some(data)
        })
        .collect();
    assert_eq!(forwarded.len(), 1, "the packet that waited");
    let eth = EthernetFrame::new_checked(&forwarded[0][..]).unwrap();
    assert_eq!(
        (eth.dst_addr(), eth.ethertype()),
        (HOST_MAC, EthernetProtocol::Ipv6)
    );
    assert_eq!(Ipv6Packet::new_checked(eth.payload()).unwrap().dst_addr(), HOST_B);
    // The next packet goes straight out.
    let esp = esp_for_host_b(&mut a, &mut pool);
    let (verdict, out) = send(&mut b, &mut pool, Port::Outside, &esp);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    assert_eq!(EthernetFrame::new_checked(&out[..]).unwrap().dst_addr(), HOST_MAC);
}

#[test]
fn a_neighbour_that_never_answers_times_out() {
    let mut a = gateway(Algorithm::Aes128Gcm16, true, 1500, false);
    let mut b = gateway(Algorithm::Aes128Gcm16, false, 1500, true);
    let mut pool = PacketPool::new(8);
    let esp = esp_for_host_b(&mut a, &mut pool);
    let mut buf = pool.alloc().unwrap();
    assert!(buf.fill(&esp));
    for (buf, _) in drivers::drive::handle_frame(&mut b, Duration::ZERO, Port::Outside, buf, &mut pool) {
        pool.free(buf);
    }
    let mut out = Vec::new();
    // A second solicitation after a second, then the packet is given up.
    b.handle_timeout(Duration::from_millis(1100), &mut out, &mut pool);
    assert_eq!(out.len(), 1, "the solicitation repeated");
    assert_eq!(out[0].1, Verdict::Forward(Port::Inside));
    for (buf, _) in out.drain(..) {
        pool.free(buf);
    }
    b.handle_timeout(Duration::from_secs(4), &mut out, &mut pool);
    assert!(out
        .iter()
        .any(|(_, v)| *v == Verdict::Drop(DropReason::NeighborUnreachable)));
    for (buf, _) in out {
        pool.free(buf);
    }
}

/// An Ethernet frame from a host of 192.168.1.0/24 to gateway A.
fn udp4_frame(payload_len: usize, dont_fragment: bool) -> Vec<u8> {
    let mut packet = udp_packet(
        "192.168.1.10".parse().unwrap(),
        "192.168.2.10".parse().unwrap(),
        payload_len,
        3,
    );
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut packet[..]);
        ip.set_dscp(0x2e);
        ip.set_dont_frag(dont_fragment);
        ip.fill_checksum();
    }
    let mut frame = vec![0u8; 14];
    {
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        eth.set_dst_addr(EthernetAddress([0x02, 0, 192, 168, 1, 1]));
        eth.set_src_addr(HOST_MAC);
        eth.set_ethertype(EthernetProtocol::Ipv4);
    }
    frame.extend_from_slice(&packet);
    frame
}

/// The outer IPv6 header of a frame A sent to B: addresses, next header
/// ESP, traffic class copied from the inner packet (RFC 4301 §5.1.2.1).
fn check_outer6(frame: &[u8], traffic_class: u8) {
    let eth = EthernetFrame::new_checked(frame).unwrap();
    assert_eq!(eth.ethertype(), EthernetProtocol::Ipv6, "an IPv6 outer header");
    let outer = Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(
        (outer.src_addr(), outer.dst_addr(), outer.next_header()),
        (OUTER_A, OUTER_B, IpProtocol::IpSecEsp)
    );
    assert_eq!(outer.traffic_class(), traffic_class);
    assert_eq!(outer.hop_limit(), 64);
    assert_eq!(outer.total_len(), eth.payload().len());
}

#[test]
fn ipv4_and_ipv6_cross_a_tunnel_with_ipv6_ends() {
    for alg in [
        Algorithm::Aes128Gcm16,
        Algorithm::Aes128Sha1,
        Algorithm::ChaCha20Poly1305,
    ] {
        // 4-in-6.
        let mut a = end(alg, true, 1500, false, Outer::V6, false);
        let mut b = end(alg, false, 1500, false, Outer::V6, false);
        let mut pool = PacketPool::new(8);
        let sent = udp4_frame(500, true);
        let (verdict, esp) = send(&mut a, &mut pool, Port::Inside, &sent);
        assert_eq!(verdict, Verdict::Forward(Port::Outside), "{alg}");
        check_outer6(&esp, 0x2e << 2);
        let (verdict, inner) = send(&mut b, &mut pool, Port::Outside, &esp);
        assert_eq!(verdict, Verdict::Forward(Port::Inside), "{alg}: 4-in-6");
        let eth = EthernetFrame::new_checked(&inner[..]).unwrap();
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.hop_limit(), 62, "one hop at each gateway");
        assert_eq!(&eth.payload()[20..], &sent[14 + 20..]);
        // And back.
        let mut back = udp_packet(
            "192.168.2.10".parse().unwrap(),
            "192.168.1.10".parse().unwrap(),
            64,
            9,
        );
        let mut frame = vec![0u8; 14];
        frame[..6].copy_from_slice(&[0x02, 0, 192, 168, 2, 1]);
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        frame.append(&mut back);
        let (verdict, esp) = send(&mut b, &mut pool, Port::Inside, &frame);
        assert_eq!(verdict, Verdict::Forward(Port::Outside), "{alg}");
        assert_eq!(
            send(&mut a, &mut pool, Port::Outside, &esp).0,
            Verdict::Forward(Port::Inside)
        );
        assert_eq!(a.stats().decapsulated, 1);

        // 6-in-6.
        let mut a = end(alg, true, 1500, false, Outer::V6, true);
        let mut b = end(alg, false, 1500, false, Outer::V6, true);
        let sent = udp6_frame(HOST_A, HOST_B, 64, 0x48, 200);
        let (verdict, esp) = send(&mut a, &mut pool, Port::Inside, &sent);
        assert_eq!(verdict, Verdict::Forward(Port::Outside), "{alg}");
        check_outer6(&esp, 0x48);
        let (verdict, inner) = send(&mut b, &mut pool, Port::Outside, &esp);
        assert_eq!(verdict, Verdict::Forward(Port::Inside), "{alg}: 6-in-6");
        let mut expected = sent[14..].to_vec();
        expected[7] -= 2;
        assert_eq!(
            EthernetFrame::new_checked(&inner[..]).unwrap().payload(),
            &expected[..]
        );
        // A tampered packet is refused, as over IPv4.
        let (_, mut esp) = send(&mut a, &mut pool, Port::Inside, &sent);
        let last = esp.len() - 1;
        esp[last] ^= 1;
        assert_eq!(
            send(&mut b, &mut pool, Port::Outside, &esp).0,
            Verdict::Drop(DropReason::AuthFailed)
        );
    }
}

#[test]
fn an_ipv6_outer_packet_is_never_fragmented() {
    let mut a = end(Algorithm::Aes128Gcm16, true, 1500, false, Outer::V6, false);
    let mut pool = PacketPool::new(8);
    // Room for 1500 - 40 - 8 - 8 - 16 = 1428 bytes with the trailer:
    // 1426 of inner packet.
    let (verdict, esp) = send(&mut a, &mut pool, Port::Inside, &udp4_frame(1426 - 28, false));
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    assert_eq!(esp.len(), 14 + 1500);
    // One byte more: even with DF clear, fragmentation needed with the
    // size that fits (the outer IPv6 packet cannot be fragmented on the way).
    let (verdict, reply) = send(&mut a, &mut pool, Port::Inside, &udp4_frame(1427 - 28, false));
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let icmp = &reply[14 + 20..];
    assert_eq!((icmp[0], icmp[1]), (3, 4), "fragmentation needed");
    assert_eq!(u16::from_be_bytes([icmp[6], icmp[7]]), 1426);
    assert_eq!(a.stats().drops.get(DropReason::FragNeeded), 1);
}

/// One end of an IPv6 transport-mode SA pair between 2001:db8:1::/64 and
/// 2001:db8:2::/64 (the hosts' packets keep their addresses), its ends
/// OUTER_A and OUTER_B, the peer's network routed through the peer.
fn transport_end(a: bool) -> Gateway {
    transport_end_with(a, |_| {})
}

/// [`transport_end`], its configuration changed by `edit` last.
fn transport_end_with(a: bool, edit: impl FnOnce(&mut ConfigBuilder)) -> Gateway {
    let mut built = tunnel_builder(Algorithm::Aes128Gcm16, "transport", false, a);
    let (own, far, own_outer, far_outer) = if a {
        (1, 2, OUTER_A, OUTER_B)
    } else {
        (2, 1, OUTER_B, OUTER_A)
    };
    interface(&mut built, "inside").address6 = Some(format!("2001:db8:{own}::1/64"));
    interface(&mut built, "outside").address6 = Some(format!("{own_outer}/64"));
    interface(&mut built, "outside").mtu = Some(1500);
    let net = |n: u16| Ipv6Prefix::new(Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, 0), 64).unwrap();
    built.tunnels[0].local = own_outer.into();
    built.tunnels[0].remote = far_outer.into();
    built.tunnels[0].local_subnet = Some(net(own).into());
    built.tunnels[0].remote_subnet = Some(net(far).into());
    let mut built = built.route_via(net(far), far_outer);
    edit(&mut built);
    let config = common::parsed(&built);
    let setup = config.setup(LinkLayer::Ethernet, Style::Async);
    common::soft_gateway(&config, setup)
}

/// RFC 4303 §3.1.1 over IPv6: ESP goes after the hop-by-hop options (which
/// every router on the way reads) and before what it protects, the
/// hosts' addresses stay, and the peer puts the packet back together.
#[test]
fn transport_mode_over_ipv6_keeps_the_headers_routers_read() {
    let mut a = transport_end(true);
    let mut b = transport_end(false);
    let mut pool = PacketPool::new(8);
    // With a hop-by-hop header (PadN, 6 bytes) in front of UDP.
    let plain = udp6_frame(HOST_A, HOST_B, 64, 0x20, 100);
    let mut sent = plain[..14 + 40].to_vec();
    sent.extend_from_slice(&[17, 0, 1, 4, 0, 0, 0, 0]);
    sent.extend_from_slice(&plain[14 + 40..]);
    sent[14 + 6] = 0; // next header: hop-by-hop
    let payload_len = u16::from_be_bytes([sent[18], sent[19]]) + 8;
    sent[18..20].copy_from_slice(&payload_len.to_be_bytes());
    let (verdict, esp) = send(&mut a, &mut pool, Port::Inside, &sent);
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    let eth = EthernetFrame::new_checked(&esp[..]).unwrap();
    let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(
        (ip.src_addr(), ip.dst_addr()),
        (HOST_A, HOST_B),
        "the hosts' addresses"
    );
    assert_eq!(u8::from(ip.next_header()), 0, "hop-by-hop still first");
    let packet = eth.payload();
    assert_eq!(&packet[40..48], &[50, 0, 1, 4, 0, 0, 0, 0], "then ESP");
    assert_eq!(usize::from(ip.payload_len()) + 40, packet.len());
    assert!(
        !packet.windows(8).any(|w| w == &sent[14 + 48..14 + 56]),
        "the UDP header is no longer in the clear"
    );
    let (verdict, out) = send(&mut b, &mut pool, Port::Outside, &esp);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let mut expected = sent[14..].to_vec();
    expected[7] -= 2;
    assert_eq!(
        EthernetFrame::new_checked(&out[..]).unwrap().payload(),
        &expected[..]
    );
    assert_eq!(b.stats().decapsulated, 1);
}

/// A packet whose hop limit runs out at the far gateway, just after
/// decryption, gets its time exceeded (RFC 4443 §3.3, RFC 1812 §5.3.1)
/// back through the tunnel, as traceroute through a tunnel expects.
#[test]
fn time_exceeded_after_decryption_goes_back_through_the_tunnel() {
    for inner6 in [true, false] {
        let mut a = end(Algorithm::Aes128Gcm16, true, 1500, false, Outer::V4, inner6);
        let mut b = end(Algorithm::Aes128Gcm16, false, 1500, false, Outer::V4, inner6);
        let mut pool = PacketPool::new(8);
        let sent = if inner6 {
            udp6_frame(HOST_A, HOST_B, 2, 0, 40)
        } else {
            let mut f = udp4_frame(40, true);
            let mut ip = Ipv4Packet::new_unchecked(&mut f[14..]);
            ip.set_hop_limit(2);
            ip.fill_checksum();
            f
        };
        let (verdict, esp) = send(&mut a, &mut pool, Port::Inside, &sent);
        assert_eq!(verdict, Verdict::Forward(Port::Outside));
        // B: hop limit 1 after decryption; the error goes out as ESP.
        let (verdict, error_esp) = send(&mut b, &mut pool, Port::Outside, &esp);
        assert_eq!(verdict, Verdict::Forward(Port::Outside), "inner6 {inner6}");
        assert_eq!(b.stats().drops.get(DropReason::TtlExpired), 1);
        assert_eq!((b.stats().generated, b.stats().encapsulated), (1, 1));
        // A: decrypts it and hands the error to the host.
        let (verdict, error) = send(&mut a, &mut pool, Port::Outside, &error_esp);
        assert_eq!(verdict, Verdict::Forward(Port::Inside), "inner6 {inner6}");
        let eth = EthernetFrame::new_checked(&error[..]).unwrap();
        if inner6 {
            let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
            let gw_b = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
            assert_eq!((ip.src_addr(), ip.dst_addr()), (gw_b, HOST_A));
            let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
            assert!(icmp.verify_checksum(&ip.src_addr(), &ip.dst_addr()));
            assert_eq!(
                (ip.payload()[0], ip.payload()[1]),
                (3, 0),
                "time exceeded in transit"
            );
        } else {
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            assert_eq!(ip.src_addr().octets(), [192, 168, 2, 1]);
            assert_eq!(ip.dst_addr().octets(), [192, 168, 1, 10]);
            assert_eq!(
                (ip.payload()[0], ip.payload()[1]),
                (11, 0),
                "time exceeded in transit"
            );
        }
    }
}

/// Splits an Ethernet frame holding an unfragmented IPv6 packet into two
/// IPv6 fragments (RFC 8200 §4.5) at `at` bytes of its payload, as a
/// source fragments its own packet.
fn fragment6(frame: &[u8], at: usize, ident: u32) -> [Vec<u8>; 2] {
    let (eth, packet) = frame.split_at(14);
    let (header, payload) = packet.split_at(40);
    let piece = |offset: usize, data: &[u8], more: bool| {
        let mut out = eth.to_vec();
        let mut h = header.to_vec();
        h[6] = 44;
        h[4..6].copy_from_slice(&((8 + data.len()) as u16).to_be_bytes());
        out.extend_from_slice(&h);
        let field = ((offset / 8) as u16) << 3 | u16::from(more);
        out.extend_from_slice(&[header[6], 0]);
        out.extend_from_slice(&field.to_be_bytes());
        out.extend_from_slice(&ident.to_be_bytes());
        out.extend_from_slice(data);
        out
    };
    [piece(0, &payload[..at], true), piece(at, &payload[at..], false)]
}

/// A peer may fragment its own ESP over IPv6 (Linux does for a DF-clear
/// IPv4 packet in 4-in-6): the fragments are reassembled, in any order,
/// and decapsulated; overlapping ones are refused.
#[test]
fn esp_over_ipv6_that_the_peer_fragmented_is_reassembled() {
    let mut a = end(Algorithm::Aes128Gcm16, true, 1500, false, Outer::V6, false);
    let mut b = end(Algorithm::Aes128Gcm16, false, 1500, false, Outer::V6, false);
    let mut pool = PacketPool::new(16);
    let sent = udp4_frame(900, false);
    let (_, esp) = send(&mut a, &mut pool, Port::Inside, &sent);
    let [first, second] = fragment6(&esp, 512, 7);
    // The last fragment first.
    let (verdict, _) = send(&mut b, &mut pool, Port::Outside, &second);
    assert_eq!(verdict, Verdict::Consumed, "held");
    let mut buf = pool.alloc().unwrap();
    assert!(buf.fill(&first));
    let outputs = drivers::drive::handle_frame(&mut b, Duration::ZERO, Port::Outside, buf, &mut pool);
    let forwarded: Vec<Vec<u8>> = outputs
        .into_iter()
        .filter_map(|(buf, verdict)| {
            let data = buf.data().to_vec();
            pool.free(buf);
            (verdict == Verdict::Forward(Port::Inside)).then_some(data)
        })
        .collect();
    assert_eq!(forwarded.len(), 1, "the reassembled packet, decapsulated");
    assert_eq!(&forwarded[0][14 + 20..], &sent[14 + 20..]);
    assert_eq!(b.stats().decapsulated, 1);
    assert!(b.stats().balanced());
    // Overlapping fragments of the next packet: refused.
    let (_, esp) = send(&mut a, &mut pool, Port::Inside, &sent);
    let [first, _] = fragment6(&esp, 512, 8);
    let [_, overlapping] = fragment6(&esp, 504, 8);
    assert_eq!(
        send(&mut b, &mut pool, Port::Outside, &first).0,
        Verdict::Consumed
    );
    let mut buf = pool.alloc().unwrap();
    assert!(buf.fill(&overlapping));
    let outputs = drivers::drive::handle_frame(&mut b, Duration::ZERO, Port::Outside, buf, &mut pool);
    // The overlapping fragment, and the datagram it belonged to.
    assert!(!outputs.is_empty());
    for (buf, verdict) in outputs {
        assert_eq!(verdict, Verdict::Drop(DropReason::ReassemblyFailed));
        pool.free(buf);
    }
    assert!(b.stats().balanced());
}

/// `[[neighbor]]` takes IPv6 addresses: a static entry is used without
/// neighbour discovery, as a static ARP entry is.
#[test]
fn a_static_ipv6_neighbour_needs_no_solicitation() {
    let mut a = gateway(Algorithm::Aes128Gcm16, true, 1500, false);
    let mut built = tunnel_builder(Algorithm::Aes128Gcm16, "tunnel", false, false);
    interface(&mut built, "inside").address6 = Some("2001:db8:2::1/64".into());
    let net = |n: u16| Ipv6Prefix::new(Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, 0), 64).unwrap();
    built.tunnels[0].local_subnet = Some(net(2).into());
    built.tunnels[0].remote_subnet = Some(net(1).into());
    let built = built.neighbor(HOST_B, HOST_MAC);
    let config = common::parsed(&built);
    assert_eq!(config.neighbors.last(), Some(&(HOST_B.into(), HOST_MAC)));
    let mut setup = config.setup(LinkLayer::Ethernet, Style::Async);
    setup.resolve_neighbors = true;
    let mut b = common::soft_gateway(&config, setup);
    let mut pool = PacketPool::new(8);
    let esp = esp_for_host_b(&mut a, &mut pool);
    let (verdict, out) = send(&mut b, &mut pool, Port::Outside, &esp);
    assert_eq!(
        verdict,
        Verdict::Forward(Port::Inside),
        "straight out, no solicitation"
    );
    assert_eq!(EthernetFrame::new_checked(&out[..]).unwrap().dst_addr(), HOST_MAC);
}

/// B's inside MAC address (the test site's default for 192.168.2.1).
const GW_B_MAC: EthernetAddress = EthernetAddress([0x02, 0, 192, 168, 2, 1]);
const GW_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
/// The SPI A sends with.
const SPI_A_TO_B: u32 = 0x1001;

/// `packet` (bare IPv6) in an Ethernet frame to `dst`.
fn framed(dst: EthernetAddress, packet: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8; 14];
    {
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        eth.set_dst_addr(dst);
        eth.set_src_addr(HOST_MAC);
        eth.set_ethertype(EthernetProtocol::Ipv6);
    }
    frame.extend_from_slice(packet);
    frame
}

/// An ICMPv6 echo request, bare.
fn echo6(src: Ipv6Addr, dst: Ipv6Addr, seq: u16) -> Vec<u8> {
    let request = smoltcp::wire::Icmpv6Repr::EchoRequest {
        ident: 0x77,
        seq_no: seq,
        data: b"espgw ping",
    };
    icmpv6_packet(src, dst, 64, &request)
}

/// The IPv6 packet in `frame`, and its ICMPv6 message (type, code, the
/// second word, the rest) after a checksum check.
fn icmp6_of(frame: &[u8]) -> (Ipv6Addr, Ipv6Addr, u8, u8, u32, Vec<u8>) {
    let eth = EthernetFrame::new_checked(frame).unwrap();
    let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(ip.next_header(), IpProtocol::Icmpv6, "ICMPv6");
    let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
    assert!(icmp.verify_checksum(&ip.src_addr(), &ip.dst_addr()), "checksum");
    let m = ip.payload();
    let word = u32::from_be_bytes([m[4], m[5], m[6], m[7]]);
    (ip.src_addr(), ip.dst_addr(), m[0], m[1], word, m[8..].to_vec())
}

/// Asserts that `frame` carries ESP under `spi`, over IPv4 or IPv6.
fn assert_esp(frame: &[u8], spi: u32) {
    let eth = EthernetFrame::new_checked(frame).unwrap();
    let (protocol, payload) = match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            (u8::from(ip.next_header()), ip.payload().to_vec())
        }
        _ => {
            let ip = Ipv6Packet::new_checked(eth.payload()).unwrap();
            (u8::from(ip.next_header()), ip.payload().to_vec())
        }
    };
    assert_eq!(protocol, 50, "ESP, not the clear packet");
    assert_eq!(&payload[..4], &spi.to_be_bytes(), "under the SA's SPI");
}

/// A host behind B pings A's inside IPv6 address through the tunnel: A
/// answers through it (the reply takes the outbound SPD), where it used to
/// take the request in and say nothing.
#[test]
fn an_ipv6_echo_request_through_the_tunnel_is_answered_through_it() {
    let mut a = end(Algorithm::Aes128Gcm16, true, 1500, false, Outer::V4, true);
    let mut b = end(Algorithm::Aes128Gcm16, false, 1500, false, Outer::V4, true);
    let mut pool = PacketPool::new(8);
    let ping = framed(GW_B_MAC, &echo6(HOST_B, GW_A, 1));
    let (verdict, esp) = send(&mut b, &mut pool, Port::Inside, &ping);
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    let (verdict, reply) = send(&mut a, &mut pool, Port::Outside, &esp);
    assert_eq!(
        verdict,
        Verdict::Forward(Port::Outside),
        "answered through the tunnel"
    );
    assert_esp(&reply, SPI_A_TO_B);
    assert!(a.stats().balanced(), "{:?}", a.stats());
    let (verdict, inner) = send(&mut b, &mut pool, Port::Outside, &reply);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let (src, dst, kind, code, word, data) = icmp6_of(&inner);
    assert_eq!((src, dst, kind, code), (GW_A, HOST_B, 129, 0), "an echo reply");
    assert_eq!(word, 0x77 << 16 | 1);
    assert_eq!(data, b"espgw ping");
}

/// An IPv6 packet from behind the peer too large for the inside link: the
/// packet too big goes back through the tunnel from A's inside address;
/// before, it found no route (IPv6 behind a 6-in-4 tunnel has none).
#[test]
fn packet_too_big_after_decryption_goes_back_through_the_tunnel() {
    let mut a = end_with(Algorithm::Aes128Gcm16, true, 1500, false, Outer::V4, true, |c| {
        interface(c, "inside").mtu = Some(1300);
    });
    let mut b = end(Algorithm::Aes128Gcm16, false, 1500, false, Outer::V4, true);
    let mut pool = PacketPool::new(8);
    let mut big = udp6_frame(HOST_B, HOST_A, 64, 0, 1400 - 48);
    big[..6].copy_from_slice(GW_B_MAC.as_bytes());
    let (verdict, esp) = send(&mut b, &mut pool, Port::Inside, &big);
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    let (verdict, error) = send(&mut a, &mut pool, Port::Outside, &esp);
    assert_eq!(verdict, Verdict::Forward(Port::Outside), "the error, protected");
    assert_esp(&error, SPI_A_TO_B);
    assert_eq!(a.stats().drops.get(DropReason::FragNeeded), 1);
    assert!(a.stats().balanced(), "{:?}", a.stats());
    let (verdict, inner) = send(&mut b, &mut pool, Port::Outside, &error);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let (src, dst, kind, _, mtu, _) = icmp6_of(&inner);
    assert_eq!((src, dst, kind, mtu), (GW_A, HOST_B, 2, 1300), "packet too big");
}

/// A clear IPv6 echo request to an address that a transport-mode SA's
/// policies cover is refused (RFC 4301 §5.2); one through the SA is
/// answered through it.
#[test]
fn ipv6_echo_to_a_protected_address_is_answered_only_through_the_sa() {
    // Transport mode between the gateways' own outside addresses.
    let ends = |c: &mut ConfigBuilder| {
        c.tunnels[0].local_subnet = None;
        c.tunnels[0].remote_subnet = None;
    };
    let mut a = transport_end_with(true, ends);
    let mut b = transport_end_with(false, ends);
    let mut pool = PacketPool::new(8);
    let clear = framed(
        EthernetAddress([0x02, 0, 10, 0, 0, 1]),
        &echo6(OUTER_B, OUTER_A, 1),
    );
    let (verdict, _) = send(&mut a, &mut pool, Port::Outside, &clear);
    assert_eq!(
        verdict,
        Verdict::Drop(DropReason::PolicyMismatch),
        "not answered in the clear"
    );
    let ping = framed(GW_B_MAC, &echo6(OUTER_B, OUTER_A, 2));
    let (verdict, esp) = send(&mut b, &mut pool, Port::Inside, &ping);
    assert_eq!(verdict, Verdict::Forward(Port::Outside));
    assert_esp(&esp, 0x1002);
    let (verdict, reply) = send(&mut a, &mut pool, Port::Outside, &esp);
    assert_eq!(
        verdict,
        Verdict::Forward(Port::Outside),
        "answered through the SA"
    );
    assert_esp(&reply, SPI_A_TO_B);
    let (verdict, _) = send(&mut b, &mut pool, Port::Outside, &reply);
    assert_eq!(verdict, Verdict::Consumed, "B's own: decrypted and taken");
    assert_eq!((b.stats().decapsulated, b.stats().drops.total()), (1, 0));
    assert!(a.stats().balanced() && b.stats().balanced());
}

/// `frame` (Ethernet, IPv6) with an extension header of `kind` whose bytes
/// are `header` (its next-header byte is filled in) in front of what
/// follows the fixed header.
fn with_header(frame: &[u8], kind: u8, header: &[u8]) -> Vec<u8> {
    assert_eq!(header.len() % 8, 0);
    let mut out = frame[..14 + 40].to_vec();
    let mut header = header.to_vec();
    header[0] = out[14 + 6];
    header[1] = (header.len() / 8 - 1) as u8;
    out[14 + 6] = kind;
    let payload = u16::from_be_bytes([out[18], out[19]]) + header.len() as u16;
    out[18..20].copy_from_slice(&payload.to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&frame[14 + 40..]);
    out
}

const HOP_BY_HOP: u8 = 0;
const ROUTING: u8 = 43;
const DEST_OPTIONS: u8 = 60;

/// An options header holding one option of `kind` with two bytes of data,
/// then PadN.
fn option(kind: u8) -> [u8; 8] {
    [0, 0, kind, 2, 0xaa, 0xbb, 1, 0]
}

/// A routing header of `kind` with `segments_left`.
fn routing(kind: u8, segments_left: u8) -> [u8; 24] {
    let mut h = [0u8; 24];
    h[2] = kind;
    h[3] = segments_left;
    h
}

/// RFC 8200 §4.2 and §4.4 on ESP over IPv6 to the gateway: an option
/// whose bits say discard, or discard and answer, and a routing header of
/// an unknown type with segments left, are obeyed (the ESP inside was
/// decrypted and forwarded before); options to skip and a routing header
/// with none left are not in the way. The parameter problems go out as
/// the outbound SPD says (here a bypass to the peer) and are rate-limited.
#[test]
fn extension_headers_before_esp_are_obeyed() {
    let mut a = end(Algorithm::Aes128Gcm16, true, 1500, false, Outer::V6, false);
    let mut b = end_with(
        Algorithm::Aes128Gcm16,
        false,
        1500,
        false,
        Outer::V6,
        false,
        |c| {
            c.policies.push(PolicyBuilder::bypass(
                "peer-out",
                PolicyDirection::Out,
                Ipv6Prefix::new(OUTER_B, 128).unwrap(),
                Ipv6Prefix::new(OUTER_A, 128).unwrap(),
            ));
        },
    );
    let mut pool = PacketPool::new(8);
    let mut esp = || send(&mut a, &mut pool_a(), Port::Inside, &udp4_frame(100, true)).1;
    // Skipped or ignored: decrypted and forwarded.
    for (kind, header) in [
        (DEST_OPTIONS, option(0x1e).to_vec()),
        (HOP_BY_HOP, option(0x05).to_vec()),
        (ROUTING, routing(253, 0).to_vec()),
    ] {
        let frame = with_header(&esp(), kind, &header);
        let (verdict, _) = send(&mut b, &mut pool, Port::Outside, &frame);
        assert_eq!(verdict, Verdict::Forward(Port::Inside), "header {kind}");
    }
    // Discard, silently.
    let frame = with_header(&esp(), DEST_OPTIONS, &option(0x5e));
    let (verdict, _) = send(&mut b, &mut pool, Port::Outside, &frame);
    assert_eq!(
        dropped(verdict).map(DropReason::name),
        Some("ipv6_unknown_option")
    );
    // Discard and a parameter problem: code 2 at the option (byte 42),
    // code 0 at the routing type (byte 42).
    for (kind, header, code) in [
        (HOP_BY_HOP, option(0x9e).to_vec(), 2),
        (DEST_OPTIONS, option(0xde).to_vec(), 2),
        (ROUTING, routing(253, 1).to_vec(), 0),
        (ROUTING, routing(0, 2).to_vec(), 0),
    ] {
        let frame = with_header(&esp(), kind, &header);
        let (verdict, error) = send(&mut b, &mut pool, Port::Outside, &frame);
        assert_eq!(
            verdict,
            Verdict::Forward(Port::Outside),
            "header {kind}: the error"
        );
        let (src, dst, icmp_type, icmp_code, pointer, quoted) = icmp6_of(&error);
        assert_eq!((src, dst), (OUTER_B, OUTER_A));
        assert_eq!((icmp_type, icmp_code, pointer), (4, code, 42), "header {kind}");
        assert_eq!(&quoted[..], &frame[14..], "the packet quoted");
    }
    let stats = b.stats();
    assert_eq!(stats.decapsulated, 3);
    let count = |name| stats.drops.get(DropReason::from_name(name).expect(name));
    assert_eq!(
        (count("ipv6_unknown_option"), count("ipv6_unknown_routing")),
        (3, 2)
    );
    assert!(stats.balanced(), "{stats:?}");
    // Rate-limited like every error: six at once to one source.
    let frame = with_header(&esp(), HOP_BY_HOP, &option(0x9e));
    let answered = (0..10)
        .filter(|_| send(&mut b, &mut pool, Port::Outside, &frame).0 == Verdict::Forward(Port::Outside))
        .count();
    assert_eq!(answered, 6 - 4, "the burst of six, four spent above");
    assert!(b.stats().icmp_rate_limited >= 8);
    assert!(b.stats().balanced());
}

fn pool_a() -> PacketPool {
    PacketPool::new(4)
}

/// The same rules for transport-mode ESP that B terminates (the hosts'
/// addresses kept), and for an inner packet to B's own address; transit
/// IPv6 is read as a router reads it: hop-by-hop options only.
#[test]
fn extension_headers_are_obeyed_by_the_node_that_processes_them() {
    let mut pool = PacketPool::new(8);
    // Transport mode: B is the ESP's destination, though not the packet's.
    let mut a = transport_end(true);
    let mut b = transport_end(false);
    let (_, esp) = send(
        &mut a,
        &mut pool,
        Port::Inside,
        &udp6_frame(HOST_A, HOST_B, 64, 0, 100),
    );
    let frame = with_header(&esp, DEST_OPTIONS, &option(0x5e));
    let (verdict, _) = send(&mut b, &mut pool, Port::Outside, &frame);
    assert_eq!(
        dropped(verdict).map(DropReason::name),
        Some("ipv6_unknown_option")
    );
    assert_eq!(b.stats().decapsulated, 0);

    // Transit from the inside: destination options are not a router's to
    // read; a hop-by-hop option that says so is refused, with a problem
    // back to the host (to the inside: no policy needed).
    let mut a = end(Algorithm::Aes128Gcm16, true, 1500, false, Outer::V4, true);
    introduce_host(&mut a, &mut pool);
    let plain = udp6_frame(HOST_A, HOST_B, 64, 0, 100);
    let frame = with_header(&plain, DEST_OPTIONS, &option(0x9e));
    assert_eq!(
        send(&mut a, &mut pool, Port::Inside, &frame).0,
        Verdict::Forward(Port::Outside)
    );
    let frame = with_header(&plain, HOP_BY_HOP, &option(0x9e));
    let (verdict, error) = send(&mut a, &mut pool, Port::Inside, &frame);
    assert_eq!(verdict, Verdict::Forward(Port::Inside), "a parameter problem");
    let (src, dst, kind, code, pointer, _) = icmp6_of(&error);
    assert_eq!((src, dst, kind, code, pointer), (GW_A, HOST_A, 4, 2, 42));

    // An inner packet for B's own address with a destination option that
    // asks for a problem: refused, and the problem goes back through the
    // tunnel to its source.
    let mut a = end(Algorithm::Aes128Gcm16, true, 1500, false, Outer::V4, true);
    let mut b = end(Algorithm::Aes128Gcm16, false, 1500, false, Outer::V4, true);
    let mut ping = framed(GW_A_MAC, &echo6(HOST_A, GW_B, 9));
    ping = with_header(&ping, DEST_OPTIONS, &option(0x9e));
    let (verdict, esp) = send(&mut a, &mut pool, Port::Inside, &ping);
    assert_eq!(verdict, Verdict::Forward(Port::Outside), "A does not read them");
    let (verdict, error) = send(&mut b, &mut pool, Port::Outside, &esp);
    assert_eq!(verdict, Verdict::Forward(Port::Outside), "the problem, protected");
    assert_esp(&error, 0x1002);
    assert_eq!(
        b.stats()
            .drops
            .get(DropReason::from_name("ipv6_unknown_option").unwrap()),
        1
    );
    let (verdict, inner) = send(&mut a, &mut pool, Port::Outside, &error);
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    let (src, dst, kind, code, pointer, _) = icmp6_of(&inner);
    assert_eq!((src, dst, kind, code, pointer), (GW_B, HOST_A, 4, 2, 42));
}
