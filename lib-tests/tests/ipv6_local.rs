//! IPv6 addressed to the gateway: neighbour solicitations for an
//! interface's `address6` answered (RFC 4861 §7.2.4), echo requests to it
//! answered (RFC 4443 §4.2), IPv6 on an interface without `address6`
//! counted as `unsupported`, and transit IPv6 left to the SPD.
//! Packets are built and the replies checked with smoltcp's wire types,
//! checksums included.

mod common;

use std::net::Ipv6Addr;
use std::time::Duration;

use accel::{Algorithm, Style};
use common::*;
use dataplane::{DropReason, Gateway, LinkLayer, PacketPool, Port, Verdict};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv6Packet, Icmpv6Repr, Ipv6Packet, Ipv6Repr,
    NdiscNeighborFlags, NdiscRepr, RawHardwareAddress,
};

const GW_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 1, 1]);
const HOST_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 1, 0x10]);
const GW: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
const HOST: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10);

fn gateway() -> Gateway {
    let mut built = tunnel_builder(Algorithm::Aes128Gcm16, "tunnel", false, true);
    let inside = interface(&mut built, "inside");
    inside.mac = Some(GW_MAC);
    inside.address6 = Some("2001:db8:1::1/64".into());
    let config = common::parsed(&built);
    assert_eq!(config.inside.address6.map(|(a, p)| (a, p.len())), Some((GW, 64)));
    let setup = config.setup(LinkLayer::Ethernet, Style::Async);
    common::soft_gateway(&config, setup)
}

/// An Ethernet frame with an IPv6 packet carrying `icmp`.
fn frame(
    dst_mac: EthernetAddress,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop_limit: u8,
    icmp: &Icmpv6Repr,
) -> Vec<u8> {
    ethernet(dst_mac, &icmpv6_packet(src, dst, hop_limit, icmp))
}

/// An Ethernet frame from the host to `dst_mac` carrying the IPv6 `packet`.
fn ethernet(dst_mac: EthernetAddress, packet: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; 14];
    let mut f = EthernetFrame::new_unchecked(&mut bytes[..]);
    f.set_dst_addr(dst_mac);
    f.set_src_addr(HOST_MAC);
    f.set_ethertype(EthernetProtocol::Ipv6);
    bytes.extend_from_slice(packet);
    bytes
}

fn solicit(target: Ipv6Addr) -> Vec<u8> {
    let group = dataplane::icmp6::solicited_node(target);
    let ns = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr: Some(RawHardwareAddress::from_bytes(HOST_MAC.as_bytes())),
    });
    frame(dataplane::icmp6::multicast_mac(group), HOST, group, 255, &ns)
}

fn echo(dst: Ipv6Addr) -> Vec<u8> {
    let data = [0xab; 24];
    let request = Icmpv6Repr::EchoRequest {
        ident: 7,
        seq_no: 3,
        data: &data,
    };
    frame(GW_MAC, HOST, dst, 64, &request)
}

fn send(gw: &mut Gateway, pool: &mut PacketPool, bytes: &[u8]) -> (Verdict, Vec<u8>) {
    let mut buf = pool.alloc().expect("buffer");
    assert!(buf.fill(bytes));
    let mut outputs = drivers::drive::handle_frame(gw, Duration::ZERO, Port::Inside, buf, pool);
    assert_eq!(outputs.len(), 1);
    let (buf, verdict) = outputs.remove(0);
    let bytes = buf.data().to_vec();
    pool.free(buf);
    (verdict, bytes)
}

/// The ICMPv6 message of a reply frame, its checksum checked.
fn icmp_of(reply: &[u8]) -> (Ipv6Repr, Vec<u8>) {
    let f = EthernetFrame::new_checked(reply).unwrap();
    assert_eq!(f.ethertype(), EthernetProtocol::Ipv6);
    let ip = Ipv6Packet::new_checked(f.payload()).unwrap();
    let repr = Ipv6Repr::parse(&ip).unwrap();
    let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
    assert!(icmp.verify_checksum(&repr.src_addr, &repr.dst_addr), "checksum");
    (repr, ip.payload().to_vec())
}

#[test]
fn answers_neighbor_solicitations_for_its_address_only() {
    let mut gw = gateway();
    let mut pool = PacketPool::new(8);
    let (verdict, reply) = send(&mut gw, &mut pool, &solicit(GW));
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    assert_eq!(
        EthernetFrame::new_checked(&reply[..]).unwrap().dst_addr(),
        HOST_MAC
    );
    assert_eq!(EthernetFrame::new_checked(&reply[..]).unwrap().src_addr(), GW_MAC);
    let (ip, icmp) = icmp_of(&reply);
    assert_eq!((ip.src_addr, ip.dst_addr, ip.hop_limit), (GW, HOST, 255));
    let packet = Icmpv6Packet::new_checked(&icmp[..]).unwrap();
    match NdiscRepr::parse(&packet).unwrap() {
        NdiscRepr::NeighborAdvert {
            flags,
            target_addr,
            lladdr,
        } => {
            assert_eq!(target_addr, GW);
            assert!(flags.contains(NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE));
            assert!(!flags.contains(NdiscNeighborFlags::ROUTER));
            assert_eq!(
                lladdr.map(|l| l.as_bytes().to_vec()),
                Some(GW_MAC.as_bytes().to_vec())
            );
        }
        other => panic!("not an advertisement: {other:?}"),
    }
    // Another node's address in our solicited-node group: no answer.
    let same_group = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0xaa00, 0, 1);
    assert_eq!(
        send(&mut gw, &mut pool, &solicit(same_group)).0,
        Verdict::Consumed
    );
    // Another group is not ours to listen to.
    let other = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x77);
    assert_eq!(
        send(&mut gw, &mut pool, &solicit(other)).0,
        Verdict::Drop(DropReason::Unsupported)
    );
    // Forwarded (hop limit below 255): refused as RFC 4861 §7.1.1 says.
    let mut forwarded = solicit(GW);
    forwarded[14 + 7] = 254;
    assert_eq!(
        send(&mut gw, &mut pool, &forwarded).0,
        Verdict::Drop(DropReason::Malformed)
    );
}

#[test]
fn answers_echo_to_its_address_and_refuses_a_bad_checksum() {
    let mut gw = gateway();
    let mut pool = PacketPool::new(8);
    let (verdict, reply) = send(&mut gw, &mut pool, &echo(GW));
    assert_eq!(verdict, Verdict::Forward(Port::Inside));
    assert_eq!(
        EthernetFrame::new_checked(&reply[..]).unwrap().dst_addr(),
        HOST_MAC
    );
    let (ip, icmp) = icmp_of(&reply);
    assert_eq!((ip.src_addr, ip.dst_addr), (GW, HOST));
    let packet = Icmpv6Packet::new_checked(&icmp[..]).unwrap();
    let repr = Icmpv6Repr::parse(
        &ip.src_addr,
        &ip.dst_addr,
        &packet,
        &ChecksumCapabilities::default(),
    )
    .unwrap();
    assert_eq!(
        repr,
        Icmpv6Repr::EchoReply {
            ident: 7,
            seq_no: 3,
            data: &[0xab; 24]
        }
    );
    let mut bad = echo(GW);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert_eq!(
        send(&mut gw, &mut pool, &bad).0,
        Verdict::Drop(DropReason::Malformed)
    );
    let stats = gw.stats();
    assert_eq!(stats.generated, 1);
}

#[test]
fn transit_ipv6_needs_a_policy_and_ipv6_needs_an_address6() {
    let mut gw = gateway();
    let mut pool = PacketPool::new(8);
    // The tunnel selects IPv4 only: IPv6 passing through matches no
    // policy (RFC 4301 §4.4.1's default; `tests/ipv6_tunnel.rs` carries it).
    let transit = echo(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 5));
    assert_eq!(
        send(&mut gw, &mut pool, &transit).0,
        Verdict::Drop(DropReason::NoPolicy)
    );
    // The outside interface has no IPv6 address: nothing is answered there.
    let mut buf = pool.alloc().unwrap();
    assert!(buf.fill(&solicit(GW)));
    let out = drivers::drive::handle_frame(&mut gw, Duration::ZERO, Port::Outside, buf, &mut pool);
    assert_eq!(out[0].1, Verdict::Drop(DropReason::Unsupported));
}

/// IKE over IPv6 to the outside interface's `address6` goes to the
/// control plane (for the IKE relay) as the bare IPv6 packet, on the IKE
/// port and behind the non-ESP marker on an encapsulation port; a NAT
/// keepalive there is consumed; ESP in UDP over IPv6, which RFC 3948 does
/// not define, is refused; and the control plane's answer leaves as IPv6
/// from that address with its UDP checksum.
#[test]
fn ike_over_ipv6_reaches_the_control_plane_and_its_answers_leave() {
    const OUT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
    const PEER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 2);
    let mut built = tunnel_builder(Algorithm::Aes128Gcm16, "tunnel", false, true);
    let outside = interface(&mut built, "outside");
    outside.mac = Some(GW_MAC);
    outside.address6 = Some("2001:db8:2::1/64".into());
    let config = common::parsed(&built);
    let mut setup = config.setup(LinkLayer::Ethernet, Style::Async);
    // As `espgw run` has it: unknown neighbours are solicited.
    setup.resolve_neighbors = true;
    let mut gw = common::soft_gateway(&config, setup);
    gw.open_encapsulation_port(4500);
    let mut pool = PacketPool::new(8);
    let udp = |dst_port: u16, payload: &[u8]| -> Vec<u8> {
        let mut scratch = PacketPool::new(1);
        let mut buf = scratch.alloc().expect("a buffer");
        assert!(dataplane::icmp6::udp_datagram(
            &mut buf,
            (PEER, 500),
            (OUT, dst_port),
            payload
        ));
        let packet = buf.data().to_vec();
        scratch.free(buf);
        let mut bytes = vec![0u8; 14];
        let mut f = EthernetFrame::new_unchecked(&mut bytes[..]);
        f.set_dst_addr(GW_MAC);
        f.set_src_addr(HOST_MAC);
        f.set_ethertype(EthernetProtocol::Ipv6);
        bytes.extend_from_slice(&packet);
        bytes
    };
    let ike = [[1u8, 2, 3, 4, 5, 6, 7, 8].as_slice(), &[0u8; 20]].concat();
    let mut marked = vec![0u8; 4];
    marked.extend_from_slice(&ike);
    let from_outside = |gw: &mut Gateway, pool: &mut PacketPool, bytes: &[u8]| {
        let mut buf = pool.alloc().expect("buffer");
        assert!(buf.fill(bytes));
        let mut outputs = drivers::drive::handle_frame(gw, Duration::ZERO, Port::Outside, buf, pool);
        assert_eq!(outputs.len(), 1);
        let (buf, verdict) = outputs.remove(0);
        let data = buf.data().to_vec();
        pool.free(buf);
        (verdict, data)
    };
    for (port, payload) in [(500, &ike), (4500, &marked)] {
        let frame = udp(port, payload);
        let (verdict, packet) = from_outside(&mut gw, &mut pool, &frame);
        assert_eq!(verdict, Verdict::Control, "port {port}");
        assert_eq!(packet, frame[14..], "the bare IPv6 packet, port {port}");
    }
    assert_eq!(gw.stats().control_received, 2);
    let (verdict, _) = from_outside(&mut gw, &mut pool, &udp(4500, &[0xff]));
    assert_eq!(verdict, Verdict::Consumed, "a keepalive");
    let esp = [0xc0, 0, 0, 1, 0, 0, 0, 1, 0xaa, 0xbb, 0xcc, 0xdd];
    let (verdict, _) = from_outside(&mut gw, &mut pool, &udp(4500, &esp));
    assert_eq!(
        verdict,
        Verdict::Drop(DropReason::Unsupported),
        "ESP in UDP over IPv6"
    );
    let (verdict, _) = from_outside(&mut gw, &mut pool, &udp(53, &ike));
    assert_eq!(
        verdict,
        Verdict::Drop(DropReason::NoPolicy),
        "another port is plaintext for the SPD"
    );

    // The answer: the peer is on the outside link, resolved by neighbour
    // discovery first (the solicitation goes out, the datagram waits).
    let mut out = Vec::new();
    gw.send_datagram(Duration::ZERO, (500, 500), PEER.into(), &ike, &mut out, &mut pool)
        .expect("a route to the peer");
    let solicitation = out.iter().find(|(_, v)| *v == Verdict::Forward(Port::Outside));
    assert!(solicitation.is_some(), "a neighbour solicitation for the peer");
    for (buf, _) in out.drain(..) {
        pool.free(buf);
    }
    let advert = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
        flags: NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
        target_addr: PEER,
        lladdr: Some(RawHardwareAddress::from_bytes(HOST_MAC.as_bytes())),
    });
    let mut buf = pool.alloc().unwrap();
    assert!(buf.fill(&frame(GW_MAC, PEER, OUT, 255, &advert)));
    let outputs = drivers::drive::handle_frame(&mut gw, Duration::ZERO, Port::Outside, buf, &mut pool);
    let mut sent = None;
    for (buf, verdict) in outputs {
        if verdict == Verdict::Forward(Port::Outside) {
            sent = Some(buf.data().to_vec());
        }
        pool.free(buf);
    }
    let sent = sent.expect("the datagram, once the peer is known");
    let f = EthernetFrame::new_checked(&sent[..]).unwrap();
    assert_eq!(f.dst_addr(), HOST_MAC);
    let ip = Ipv6Packet::new_checked(f.payload()).unwrap();
    assert_eq!((ip.src_addr(), ip.dst_addr()), (OUT, PEER));
    let udp = smoltcp::wire::UdpPacket::new_checked(ip.payload()).unwrap();
    assert!(udp.verify_checksum(&OUT.into(), &PEER.into()), "UDP checksum");
    assert_eq!(
        (udp.src_port(), udp.dst_port(), udp.payload()),
        (500, 500, &ike[..])
    );
}

/// What a solicitation teaches is known to the rest of its batch: an ICMPv6
/// error to the solicitor, written for a later frame of the same batch,
/// goes straight to the MAC the solicitation gave, and no solicitation of
/// our own goes out for it.
#[test]
fn a_solicitation_teaches_the_rest_of_its_batch() {
    let mut gw = gateway();
    let mut pool = PacketPool::new(16);
    // To our address, with a routing header of a type no node knows and a
    // segment left: a parameter problem back (RFC 8200 §4.4).
    let routing = [59u8, 0, 253, 1, 0, 0, 0, 0];
    let mut packet = vec![0u8; 40];
    {
        let mut ip = Ipv6Packet::new_unchecked(&mut packet[..]);
        ip.set_version(6);
        ip.set_payload_len(routing.len() as u16);
        ip.set_next_header(smoltcp::wire::IpProtocol::Ipv6Route);
        ip.set_hop_limit(64);
        ip.set_src_addr(HOST);
        ip.set_dst_addr(GW);
    }
    packet.extend_from_slice(&routing);
    let mut bufs = Vec::new();
    for frame in [solicit(GW), ethernet(GW_MAC, &packet)] {
        let mut buf = pool.alloc().expect("buffer");
        assert!(buf.fill(&frame));
        bufs.push(buf);
    }
    let mut out = Vec::new();
    gw.handle_batch(Duration::ZERO, Port::Inside, &mut bufs, &mut out, &mut pool);
    let mut sent = Vec::new();
    for (buf, verdict) in out {
        if verdict == Verdict::Forward(Port::Inside) {
            sent.push(buf.data().to_vec());
        }
        pool.free(buf);
    }
    let kinds: Vec<(EthernetAddress, u8)> = sent
        .iter()
        .map(|frame| {
            let (_, icmp) = icmp_of(frame);
            (
                EthernetFrame::new_checked(&frame[..]).unwrap().dst_addr(),
                icmp[0],
            )
        })
        .collect();
    // The advertisement (136) and the parameter problem (4), both to the
    // host's MAC; no solicitation (135) of ours.
    assert_eq!(kinds, vec![(HOST_MAC, 136), (HOST_MAC, 4)], "{kinds:?}");
    assert_eq!(gw.stats().generated, 2);
}

/// A host on the link that floods advertisements nobody asked for, in one
/// batch, teaches the table nothing: each is counted `arp_unsolicited`, none
/// is learnt, and the gateway sends nothing back.
#[test]
fn a_batch_of_unsolicited_advertisements_teaches_nothing() {
    let mut gw = gateway();
    let mut pool = PacketPool::new(80);
    let mut bufs = Vec::new();
    for i in 0..64u16 {
        let target = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 1, i);
        let na = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
            flags: NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
            target_addr: target,
            lladdr: Some(RawHardwareAddress::from_bytes(HOST_MAC.as_bytes())),
        });
        let mut buf = pool.alloc().expect("buffer");
        assert!(buf.fill(&frame(GW_MAC, target, GW, 255, &na)));
        bufs.push(buf);
    }
    let mut out = Vec::new();
    gw.handle_batch(Duration::ZERO, Port::Inside, &mut bufs, &mut out, &mut pool);
    assert_eq!(out.len(), 64);
    for (buf, verdict) in out {
        assert_eq!(verdict, Verdict::Consumed);
        pool.free(buf);
    }
    assert_eq!(gw.stats().arp_unsolicited, 64);
    assert_eq!(gw.neighbors().learnt(Port::Inside), 0);
    assert_eq!(gw.stats().generated, 0);
}
