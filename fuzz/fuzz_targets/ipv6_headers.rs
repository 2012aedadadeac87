//! The IPv6 wire views and the ICMPv6/NDP builders (`wire::ipv6`,
//! `icmp6`) on arbitrary bytes: nothing panics, the extension-header walk
//! returns indices within the datagram, RFC 8200's option and routing
//! rules (`ipv6::obey`) point inside it, and every packet a builder
//! produces parses back with a valid ICMPv6 checksum. The checksum is
//! checked here by hand: under `cfg(fuzzing)` smoltcp's `verify_checksum`
//! (and `parse_ndp`) accept any.
//!
//! Input: one byte of flags, then the packet (after a 14-byte Ethernet
//! header when bit 0 is set). Bit 1: the error asked about is a packet too
//! big; bits 2..=3 pick the error type.
#![no_main]

use std::net::Ipv6Addr;

use dataplane::icmp6::{self, kind, NdpKind};
use dataplane::wire::ipv6;
use dataplane::{EthernetAddress, PacketPool};
use libfuzzer_sys::fuzz_target;

const OUR_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 1]);
const ROUTER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xfe);

/// Whether the ICMPv6 message after the fixed header of `packet` (a whole
/// datagram, no extension headers) has a valid checksum (RFC 8200 §8.1).
fn icmpv6_checksum_ok(packet: &[u8]) -> bool {
    let icmp = &packet[ipv6::HEADER_LEN..];
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let hi = u64::from(pair[0]) << 8;
            sum += hi | pair.get(1).map_or(0, |&b| u64::from(b));
        }
    };
    add(&packet[8..40]);
    add(&(icmp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(icmp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

/// `packet` is a whole ICMPv6 datagram of exactly its length, with the
/// hop limit, source and destination given, and a valid checksum;
/// returns the ICMPv6 type.
fn check_icmpv6(packet: &[u8], hop_limit: u8, src: Option<Ipv6Addr>, dst: Option<Ipv6Addr>) -> u8 {
    let ip = ipv6::view(packet).expect("a produced packet parses");
    assert_eq!(ip.total_len(), packet.len());
    assert_eq!(packet[6], 58);
    assert_eq!(ip.hop_limit(), hop_limit);
    if let Some(src) = src {
        assert_eq!(ip.src_addr(), src);
    }
    if let Some(dst) = dst {
        assert_eq!(ip.dst_addr(), dst);
    }
    assert!(packet.len() >= ipv6::HEADER_LEN + 8);
    assert!(icmpv6_checksum_ok(packet), "checksum");
    packet[ipv6::HEADER_LEN]
}

fuzz_target!(|input: &[u8]| {
    let Some((&flags, rest)) = input.split_first() else {
        return;
    };
    let link = flags & 1 != 0;
    let packet = if link {
        match rest.get(14..) {
            Some(p) => p,
            None => return,
        }
    } else {
        rest
    };

    let view = ipv6::view(packet);
    if let Ok(upper) = ipv6::upper_layer(packet) {
        let total = view.as_ref().expect("the walk views first").total_len();
        assert!(upper.offset <= total);
        assert!(upper.next_header_at < upper.offset);
        assert_eq!(packet[upper.next_header_at], upper.protocol);
        assert!(upper.esp_insert_at <= upper.offset);
        assert!(upper.esp_next_header_at < upper.esp_insert_at);
        if upper.ports.is_some() {
            assert!(upper.offset + 4 <= total);
            assert!(upper.fragment.is_none_or(|f| f.offset == 0));
        }
    }
    // RFC 8200's rules: a refusal's pointer names a byte of the datagram,
    // and what a router refuses (hop-by-hop options, read first by both)
    // the destination refuses alike.
    let as_router = ipv6::obey(packet, ipv6::Role::Router);
    let as_destination = ipv6::obey(packet, ipv6::Role::Destination);
    for refusal in [as_router, as_destination].into_iter().filter_map(Result::err) {
        if let Some((code, pointer)) = refusal.problem {
            let total = view.as_ref().expect("a refusal with a pointer viewed it").total_len();
            assert!(usize::try_from(pointer).is_ok_and(|p| p < total));
            assert!(code == 0 || code == 2);
        }
    }
    if as_router.is_err() {
        assert_eq!(as_router, as_destination);
    }
    let ndp = icmp6::parse_ndp(packet);
    let packet_too_big = flags & 2 != 0;
    let _ = icmp6::may_answer_with_error(packet, packet_too_big);

    let mut pool = PacketPool::new(1);
    let Some(mut buf) = pool.alloc() else {
        return;
    };

    // Echo reply.
    if buf.fill(packet) && icmp6::echo_reply_in_place(&mut buf) {
        let src = view.as_ref().map(|ip| ip.dst_addr()).ok();
        let dst = view.as_ref().map(|ip| ip.src_addr()).ok();
        assert_eq!(check_icmpv6(buf.data(), 64, src, dst), kind::ECHO_REPLY);
    }

    // An error about the packet.
    let (icmp_type, code, word) = match (flags >> 2) & 3 {
        0 => (kind::PACKET_TOO_BIG, 0, 1280),
        1 => (kind::TIME_EXCEEDED, 0, 0),
        2 => (kind::PARAM_PROBLEM, 0, 6),
        _ => (kind::DEST_UNREACHABLE, 3, 0),
    };
    if buf.fill(packet) && icmp6::error_in_place(&mut buf, icmp_type, code, word, ROUTER) {
        let dst = view.as_ref().map(|ip| ip.src_addr()).ok();
        assert!(buf.len() <= icmp6::MIN_MTU);
        assert_eq!(check_icmpv6(buf.data(), 64, Some(ROUTER), dst), icmp_type);
    }

    // Our advertisement for a solicitation, bare and in a frame.
    if let Some(ndp) = ndp.filter(|n| n.kind == NdpKind::Solicit) {
        let frame = if link { rest } else { packet };
        if buf.fill(frame) && icmp6::neighbor_advert_in_place(&mut buf, &ndp, OUR_MAC, link) {
            let l2 = if link { 14 } else { 0 };
            let na = &buf.data()[l2..];
            assert_eq!(
                check_icmpv6(na, 255, Some(ndp.target), None),
                kind::NEIGHBOR_ADVERT
            );
            let parsed = icmp6::parse_ndp(na).expect("our advertisement parses");
            assert_eq!(parsed.target, ndp.target);
            assert_eq!(parsed.link_addr, Some(OUR_MAC));
            assert!(matches!(parsed.kind, NdpKind::Advert { override_: true, .. }));
            if link {
                assert_eq!(&buf.data()[6..12], OUR_MAC.as_bytes());
                assert_eq!(&buf.data()[12..14], &[0x86, 0xdd]);
            }
        }
    }

    // Our solicitation, from and for addresses in the input.
    if let (Some(ours), Some(target)) = (rest.get(..16), rest.get(16..32)) {
        let ours = Ipv6Addr::from(<[u8; 16]>::try_from(ours).expect("16 bytes"));
        let target = Ipv6Addr::from(<[u8; 16]>::try_from(target).expect("16 bytes"));
        if icmp6::neighbor_solicit(&mut buf, (OUR_MAC, ours), target) {
            let ns = &buf.data()[14..];
            let group = icmp6::solicited_node(target);
            assert_eq!(
                check_icmpv6(ns, 255, Some(ours), Some(group)),
                kind::NEIGHBOR_SOLICIT
            );
            assert_eq!(&buf.data()[..6], icmp6::multicast_mac(group).as_bytes());
            if !ours.is_unspecified() && !ours.is_multicast() {
                let parsed = icmp6::parse_ndp(ns).expect("our solicitation parses");
                assert_eq!((parsed.target, parsed.link_addr), (target, Some(OUR_MAC)));
            }
        }
    }
    pool.free(buf);
});
