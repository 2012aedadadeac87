//! ICMPv6 messages the gateway itself sends, and the neighbour discovery
//! it answers: echo replies and errors (RFC 4443), neighbour solicitations
//! and advertisements (RFC 4861). The IPv6 counterpart of `icmp`, in its
//! manner: replies and errors are written into the buffer of the packet
//! that caused them, a `false` return means "could not" and leaves no
//! promise about the buffer. Checksums carry the IPv6 pseudo-header
//! (RFC 8200 §8.1).
//!
//! Owns no state. Must not decide whether to answer (whether an address is
//! ours, rate limits: `icmp::RateLimiter` is the caller's), keep a
//! neighbour cache (`neighbor`'s), or walk extension headers (`wire::ipv6`
//! does, for [`may_answer_with_error`]).

use std::net::Ipv6Addr;

use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv6Packet, IpAddress, IpProtocol, Ipv6Packet,
    NdiscNeighborFlags, NdiscRepr, RawHardwareAddress,
};

use crate::buffer::PacketBuf;
use crate::icmp::write_ethernet;
use crate::wire::ipv6::{self, HEADER_LEN};

/// ICMPv6 types espgw sends, answers or must not answer (RFC 4443 §2.1,
/// RFC 4861 §4).
pub mod kind {
    /// Destination unreachable (RFC 4443 §3.1).
    pub const DEST_UNREACHABLE: u8 = 1;
    /// Packet too big (RFC 4443 §3.2): its word is the next-hop MTU.
    pub const PACKET_TOO_BIG: u8 = 2;
    /// Time exceeded (RFC 4443 §3.3), code 0: hop limit run out.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Parameter problem (RFC 4443 §3.4): its word points at the
    /// offending byte (see `wire::ipv6::Refusal`).
    pub const PARAM_PROBLEM: u8 = 4;
    /// Echo request (RFC 4443 §4.1): answered when addressed to us.
    pub const ECHO_REQUEST: u8 = 128;
    /// Echo reply (RFC 4443 §4.2).
    pub const ECHO_REPLY: u8 = 129;
    /// Router solicitation: the first of the neighbour discovery types
    /// (133 to 137, RFC 4861 §4).
    pub const ROUTER_SOLICIT: u8 = 133;
    /// Neighbour solicitation (RFC 4861 §4.3).
    pub const NEIGHBOR_SOLICIT: u8 = 135;
    /// Neighbour advertisement (RFC 4861 §4.4).
    pub const NEIGHBOR_ADVERT: u8 = 136;
    /// Never answered with an error (RFC 4443 §2.4 (e.2)).
    pub const REDIRECT: u8 = 137;
}

/// The IPv6 minimum link MTU (RFC 8200 §5): no ICMPv6 error is larger
/// (RFC 4443 §2.4 (c)).
pub const MIN_MTU: usize = 1280;

/// Bytes of an Ethernet header.
const ETHERNET_LEN: usize = 14;
/// An NS or NA with one link-layer address option for Ethernet:
/// type, code, checksum, flags/reserved, target (24), option (8).
const NDP_LEN: usize = 24 + 8;
/// The ICMPv6 header of an error: type, code, checksum, one word.
const ERROR_HEADER_LEN: usize = 8;

/// What a checked neighbour discovery message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NdpKind {
    /// A neighbour solicitation (RFC 4861 §4.3): who has `target`?
    Solicit,
    /// A neighbour advertisement (RFC 4861 §4.4), with its flags.
    Advert {
        /// S: an answer to a solicitation (never set when sent to a
        /// multicast group; `parse_ndp` refuses that).
        solicited: bool,
        /// O: the link-layer address should replace a cached one.
        override_: bool,
    },
}

/// A checked neighbour solicitation or advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ndp {
    /// Solicitation or advertisement.
    pub kind: NdpKind,
    /// The IPv6 source: unspecified for duplicate address detection.
    pub source: Ipv6Addr,
    /// The address asked about (solicitation) or announced
    /// (advertisement); never multicast.
    pub target: Ipv6Addr,
    /// The source link-layer address option of a solicitation, the target
    /// link-layer address option of an advertisement.
    pub link_addr: Option<EthernetAddress>,
}

/// Writes an IPv6 packet carrying a UDP datagram into the empty `buf`
/// (hop limit 64, the UDP checksum filled, as RFC 8200 §8.1 requires).
/// False when the payload does not fit.
pub fn udp_datagram(
    buf: &mut PacketBuf,
    (from, src_port): (Ipv6Addr, u16),
    (to, dst_port): (Ipv6Addr, u16),
    payload: &[u8],
) -> bool {
    const UDP: usize = 8;
    let Ok(udp_len) = u16::try_from(UDP + payload.len()) else {
        return false;
    };
    let Some(data) = buf.append(HEADER_LEN + usize::from(udp_len)) else {
        return false;
    };
    data[HEADER_LEN + UDP..].copy_from_slice(payload);
    {
        let mut udp = smoltcp::wire::UdpPacket::new_unchecked(&mut data[HEADER_LEN..]);
        udp.set_src_port(src_port);
        udp.set_dst_port(dst_port);
        udp.set_len(udp_len);
        udp.fill_checksum(&IpAddress::Ipv6(from), &IpAddress::Ipv6(to));
    }
    let mut ip = Ipv6Packet::new_unchecked(&mut data[..]);
    ip.set_version(6);
    ip.set_traffic_class(0);
    ip.set_flow_label(0);
    ip.set_payload_len(udp_len);
    ip.set_next_header(IpProtocol::Udp);
    ip.set_hop_limit(64);
    ip.set_src_addr(from);
    ip.set_dst_addr(to);
    true
}

/// The solicited-node multicast address of `addr` (RFC 4291 §2.7.1):
/// ff02::1:ff00:0/104 and its low 24 bits. Any address gives one; whether
/// it should be asked is the caller's question.
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff, o[13], o[14], o[15],
    ])
}

/// The Ethernet address an IPv6 multicast group is sent to (RFC 2464 §7):
/// 33:33 and the group's low 32 bits.
pub fn multicast_mac(addr: Ipv6Addr) -> EthernetAddress {
    let o = addr.octets();
    EthernetAddress([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

/// Whether `addr` is a solicited-node multicast address (any of them).
fn is_solicited_node(addr: Ipv6Addr) -> bool {
    addr.octets()[..13] == [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff]
}

fn all_nodes() -> Ipv6Addr {
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1)
}

/// Writes the fixed IPv6 header of a datagram with `payload_len` bytes of
/// ICMPv6 after it.
fn write_ipv6(out: &mut [u8], payload_len: u16, hop_limit: u8, src: Ipv6Addr, dst: Ipv6Addr) {
    let mut ip = Ipv6Packet::new_unchecked(out);
    ip.set_version(6);
    ip.set_traffic_class(0);
    ip.set_flow_label(0);
    ip.set_payload_len(payload_len);
    ip.set_next_header(IpProtocol::Icmpv6);
    ip.set_hop_limit(hop_limit);
    ip.set_src_addr(src);
    ip.set_dst_addr(dst);
}

/// Sets the length of `buf` to `len`, growing into the tailroom if needed.
fn resize(buf: &mut PacketBuf, len: usize) -> bool {
    match len.checked_sub(buf.len()) {
        None | Some(0) => buf.truncate(len),
        Some(more) => buf.append(more).is_some(),
    }
}

/// Turns the echo request in `buf` (a bare IPv6 packet, the ICMPv6 header
/// right after the fixed header) into its reply: addresses swapped, hop
/// limit 64, checksum filled. The request's checksum is the caller's to
/// have checked. A request to a multicast group is refused: the reply must
/// come from a unicast address (RFC 4443 §4.2), which this rewrite does
/// not have.
pub fn echo_reply_in_place(buf: &mut PacketBuf) -> bool {
    let (total, src, dst) = {
        let Ok(ip) = ipv6::view(buf.data()) else {
            return false;
        };
        (ip.total_len(), ip.src_addr(), ip.dst_addr())
    };
    if dst.is_multicast() || dst.is_unspecified() || src.is_multicast() || src.is_unspecified() {
        return false;
    }
    if !buf.truncate(total) {
        return false;
    }
    let data = buf.data_mut();
    if data[6] != u8::from(IpProtocol::Icmpv6) {
        return false;
    }
    let icmp = &mut data[HEADER_LEN..];
    if icmp.len() < 8 || icmp[0] != kind::ECHO_REQUEST {
        return false;
    }
    icmp[0] = kind::ECHO_REPLY;
    icmp[1] = 0;
    Icmpv6Packet::new_unchecked(&mut *icmp).fill_checksum(&dst, &src);
    let mut ip = Ipv6Packet::new_unchecked(&mut data[..HEADER_LEN]);
    ip.set_src_addr(dst);
    ip.set_dst_addr(src);
    ip.set_hop_limit(64);
    true
}

/// Parses a neighbour solicitation or advertisement: a bare IPv6 packet
/// whose ICMPv6 message follows the fixed header (neighbour discovery
/// carries no extension headers). Validated as RFC 4861 §7.1.1 and §7.1.2
/// ask: hop limit 255 (it was not forwarded), code 0, at least 24 bytes,
/// a valid checksum, every option of non-zero length (smoltcp's
/// `NdiscRepr` refuses those), a target that is not multicast; a
/// solicitation from the unspecified address (DAD) goes to a
/// solicited-node address and carries no source link-layer option; a
/// solicitation to a multicast group goes to a solicited-node one; an
/// advertisement to a multicast group is not solicited. A multicast
/// source (never a valid one, RFC 4291 §2.7) is refused. A link-layer
/// option whose address is not 6 bytes (not Ethernet) is refused too.
pub fn parse_ndp(ipv6_packet: &[u8]) -> Option<Ndp> {
    let ip = ipv6::view(ipv6_packet).ok()?;
    if ip.hop_limit() != 255 || ipv6_packet[6] != u8::from(IpProtocol::Icmpv6) {
        return None;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    // No packet comes from a group (RFC 4291 §2.7); an answer to one
    // would go to the whole group.
    if src.is_multicast() {
        return None;
    }
    let icmp = Icmpv6Packet::new_checked(ip.payload()).ok()?;
    if icmp.msg_code() != 0 || ip.payload().len() < 24 {
        return None;
    }
    if !(cfg!(fuzzing) || icmp.verify_checksum(&src, &dst)) {
        return None;
    }
    let ethernet = |raw: RawHardwareAddress| -> Option<EthernetAddress> {
        (raw.len() == 6).then(|| EthernetAddress::from_bytes(raw.as_bytes()))
    };
    let ndp = match NdiscRepr::parse(&icmp).ok()? {
        NdiscRepr::NeighborSolicit { target_addr, lladdr } => {
            if dst.is_multicast() && !is_solicited_node(dst) {
                return None;
            }
            if src.is_unspecified() && (lladdr.is_some() || !is_solicited_node(dst)) {
                return None;
            }
            Ndp {
                kind: NdpKind::Solicit,
                source: src,
                target: target_addr,
                link_addr: match lladdr {
                    Some(raw) => Some(ethernet(raw)?),
                    None => None,
                },
            }
        }
        NdiscRepr::NeighborAdvert {
            flags,
            target_addr,
            lladdr,
        } => {
            let solicited = flags.contains(NdiscNeighborFlags::SOLICITED);
            if dst.is_multicast() && solicited {
                return None;
            }
            Ndp {
                kind: NdpKind::Advert {
                    solicited,
                    override_: flags.contains(NdiscNeighborFlags::OVERRIDE),
                },
                source: src,
                target: target_addr,
                link_addr: match lladdr {
                    Some(raw) => Some(ethernet(raw)?),
                    None => None,
                },
            }
        }
        _ => return None,
    };
    if ndp.target.is_multicast() {
        return None;
    }
    Some(ndp)
}

/// Writes an NS or NA with one link-layer address option (`NDP_LEN`
/// bytes) into `icmp` and fills its checksum.
fn write_ndp(icmp: &mut [u8], repr: &NdiscRepr, src: Ipv6Addr, dst: Ipv6Addr) {
    let mut packet = Icmpv6Packet::new_unchecked(&mut *icmp);
    repr.emit(&mut packet);
    packet.fill_checksum(&src, &dst);
}

/// Rewrites the solicitation `solicit` (parsed from `buf`) into our
/// advertisement for its target: solicited and override set, router
/// clear, our MAC as the target link-layer option, hop limit 255, to the
/// solicitor; to all nodes (ff02::1) and not solicited when the
/// solicitation came from the unspecified address (DAD, RFC 4861 §7.2.4).
/// When `link` is true `buf` holds an Ethernet frame and its header is
/// rewritten too, as `icmp::arp_reply_in_place` does: to the solicitor's
/// link-layer option, or the group's MAC for a multicast destination, or
/// else the frame's own source (a unicast solicitation without the option,
/// RFC 4861 §7.2.4); from `our_mac`. Whether the target is ours is the
/// caller's question.
pub fn neighbor_advert_in_place(
    buf: &mut PacketBuf,
    solicit: &Ndp,
    our_mac: EthernetAddress,
    link: bool,
) -> bool {
    if solicit.kind != NdpKind::Solicit {
        return false;
    }
    let l2 = if link { ETHERNET_LEN } else { 0 };
    if buf.len() < l2 {
        return false;
    }
    // Before the frame is overwritten: the solicitor's MAC if nothing
    // better is known.
    let frame_source = link.then(|| EthernetFrame::new_unchecked(buf.data()).src_addr());
    if !resize(buf, l2 + HEADER_LEN + NDP_LEN) {
        return false;
    }
    let dad = solicit.source.is_unspecified();
    let (dst, flags) = if dad {
        (all_nodes(), NdiscNeighborFlags::OVERRIDE)
    } else {
        (
            solicit.source,
            NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
        )
    };
    let src = solicit.target;
    let data = buf.data_mut();
    if let Some(frame_source) = frame_source {
        let mac = if dst.is_multicast() {
            multicast_mac(dst)
        } else {
            solicit.link_addr.unwrap_or(frame_source)
        };
        write_ethernet(&mut data[..ETHERNET_LEN], mac, our_mac, EthernetProtocol::Ipv6);
    }
    let packet = &mut data[l2..];
    write_ipv6(&mut packet[..HEADER_LEN], NDP_LEN as u16, 255, src, dst);
    let repr = NdiscRepr::NeighborAdvert {
        flags,
        target_addr: solicit.target,
        lladdr: Some(RawHardwareAddress::from_bytes(our_mac.as_bytes())),
    };
    write_ndp(&mut packet[HEADER_LEN..], &repr, src, dst);
    true
}

/// Fills `buf` with an Ethernet frame carrying our solicitation for
/// `target`, to its solicited-node group (RFC 4861 §7.2.2), with our
/// source link-layer option, hop limit 255. `false` for a multicast or
/// unspecified target, which no neighbour answers for.
pub fn neighbor_solicit(buf: &mut PacketBuf, our: (EthernetAddress, Ipv6Addr), target: Ipv6Addr) -> bool {
    if target.is_multicast() || target.is_unspecified() {
        return false;
    }
    buf.reset();
    let Some(frame) = buf.append(ETHERNET_LEN + HEADER_LEN + NDP_LEN) else {
        return false;
    };
    let dst = solicited_node(target);
    write_ethernet(
        &mut frame[..ETHERNET_LEN],
        multicast_mac(dst),
        our.0,
        EthernetProtocol::Ipv6,
    );
    let packet = &mut frame[ETHERNET_LEN..];
    write_ipv6(&mut packet[..HEADER_LEN], NDP_LEN as u16, 255, our.1, dst);
    let repr = NdiscRepr::NeighborSolicit {
        target_addr: target,
        lladdr: Some(RawHardwareAddress::from_bytes(our.0.as_bytes())),
    };
    write_ndp(&mut packet[HEADER_LEN..], &repr, our.1, dst);
    true
}

/// Whether an ICMPv6 error may be sent about this bare IPv6 packet (RFC
/// 4443 §2.4 (e)): not about an ICMPv6 error or a redirect, not when the
/// source does not name a single node (unspecified or multicast), and not
/// when the destination is multicast, unless the error is one of the
/// exceptions of (e.3) (`to_group_too`: a packet too big, or a parameter
/// problem about an option whose type's high bits are 10). Also refused, as
/// `icmp::may_answer_with_error` refuses them for IPv4 (RFC 1812
/// §4.3.2.7), though §2.4 (e) does not ask it: non-first fragments, whose
/// source cannot match the error to a flow (the first fragment gets its
/// own), and packets whose extension headers do not parse. Link-layer
/// multicast and broadcast ((e.4), (e.5)) and anycast sources are not
/// visible in the IPv6 packet: the caller's to check.
pub fn may_answer_with_error(packet: &[u8], to_group_too: bool) -> bool {
    let Ok(ip) = ipv6::view(packet) else {
        return false;
    };
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    if src.is_unspecified() || src.is_multicast() || (dst.is_multicast() && !to_group_too) {
        return false;
    }
    let Ok(upper) = ipv6::upper_layer(packet) else {
        return false;
    };
    if upper.fragment.is_some_and(|f| f.offset != 0) {
        return false;
    }
    if upper.protocol == u8::from(IpProtocol::Icmpv6) {
        // Within the payload length: `upper_layer` bounds `offset` by it.
        return match packet.get(upper.offset).filter(|_| upper.offset < ip.total_len()) {
            Some(&icmp_type) => icmp_type >= 128 && icmp_type != kind::REDIRECT,
            None => false,
        };
    }
    true
}

/// Rewrites the IPv6 packet in `buf` into an ICMPv6 error about it, from
/// `from` back to its source: the fixed header, the 8-byte ICMPv6 header
/// and as much of the invoking packet as keeps the error within
/// [`MIN_MTU`] (RFC 4443 §2.4 (c)). `rest` is the header's second word:
/// the MTU for packet too big, the pointer for parameter problem, zero
/// otherwise. Hop limit 64. Bytes after the packet's payload length
/// (link padding) are not quoted.
pub fn error_in_place(buf: &mut PacketBuf, icmp_type: u8, code: u8, rest: u32, from: Ipv6Addr) -> bool {
    let (quoted, to) = {
        let Ok(ip) = ipv6::view(buf.data()) else {
            return false;
        };
        (
            ip.total_len().min(MIN_MTU - HEADER_LEN - ERROR_HEADER_LEN),
            ip.src_addr(),
        )
    };
    if !buf.truncate(quoted) || buf.prepend(HEADER_LEN + ERROR_HEADER_LEN).is_none() {
        return false;
    }
    let payload_len = (ERROR_HEADER_LEN + quoted) as u16;
    let data = buf.data_mut();
    write_ipv6(&mut data[..HEADER_LEN], payload_len, 64, from, to);
    let icmp = &mut data[HEADER_LEN..];
    icmp[0] = icmp_type;
    icmp[1] = code;
    icmp[4..8].copy_from_slice(&rest.to_be_bytes());
    Icmpv6Packet::new_unchecked(&mut *icmp).fill_checksum(&from, &to);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::{Icmpv6Message, Icmpv6Repr, Ipv6Repr};

    const OURS: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    const PEER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
    const OUR_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 1]);
    const PEER_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 2]);

    /// A bare IPv6 packet carrying `icmp`, emitted and checksummed by
    /// smoltcp.
    fn icmp_packet(src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, icmp: &Icmpv6Repr) -> Vec<u8> {
        let ip = Ipv6Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: IpProtocol::Icmpv6,
            payload_len: icmp.buffer_len(),
            hop_limit,
        };
        let mut bytes = vec![0u8; HEADER_LEN + icmp.buffer_len()];
        ip.emit(&mut Ipv6Packet::new_unchecked(&mut bytes[..]));
        icmp.emit(
            &src,
            &dst,
            &mut Icmpv6Packet::new_unchecked(&mut bytes[HEADER_LEN..]),
            &smoltcp::phy::ChecksumCapabilities::default(),
        );
        bytes
    }

    fn solicitation(src: Ipv6Addr, dst: Ipv6Addr, lladdr: Option<EthernetAddress>) -> Vec<u8> {
        let ndisc = NdiscRepr::NeighborSolicit {
            target_addr: OURS,
            lladdr: lladdr.map(|m| RawHardwareAddress::from_bytes(m.as_bytes())),
        };
        icmp_packet(src, dst, 255, &Icmpv6Repr::Ndisc(ndisc))
    }

    fn frame(packet: &[u8], src: EthernetAddress, dst: EthernetAddress) -> PacketBuf {
        let mut bytes = vec![0u8; ETHERNET_LEN];
        write_ethernet(&mut bytes, dst, src, EthernetProtocol::Ipv6);
        bytes.extend_from_slice(packet);
        bare(&bytes)
    }

    fn bare(packet: &[u8]) -> PacketBuf {
        // A pool-sized buffer with headroom, as the gateway's are.
        let mut buf = crate::buffer::PacketPool::new(1).alloc().expect("a buffer");
        assert!(buf.fill(packet));
        buf
    }

    /// Checks the IPv6 and ICMPv6 framing and checksum of `packet`, and
    /// returns the parsed pieces.
    fn checked(packet: &[u8]) -> (Ipv6Repr, Icmpv6Packet<&[u8]>) {
        let ip = Ipv6Packet::new_checked(packet).expect("ipv6");
        assert_eq!(ip.total_len(), packet.len(), "no bytes past the payload");
        let repr = Ipv6Repr::parse(&ip).expect("ipv6 repr");
        let icmp = Icmpv6Packet::new_checked(&packet[HEADER_LEN..]).expect("icmpv6");
        assert!(icmp.verify_checksum(&repr.src_addr, &repr.dst_addr));
        (repr, icmp)
    }

    #[test]
    fn solicited_node_address_and_its_mac() {
        let addr: Ipv6Addr = "2001:db8::1:2:3".parse().unwrap();
        let group = solicited_node(addr);
        assert_eq!(group, "ff02::1:ff02:3".parse::<Ipv6Addr>().unwrap());
        assert_eq!(
            multicast_mac(group),
            EthernetAddress([0x33, 0x33, 0xff, 0x02, 0x00, 0x03])
        );
        assert!(is_solicited_node(group));
        assert!(!is_solicited_node(all_nodes()));
    }

    #[test]
    fn echo_reply_swaps_addresses_and_checksums() {
        let request = Icmpv6Repr::EchoRequest {
            ident: 7,
            seq_no: 9,
            data: b"ping payload",
        };
        let mut buf = bare(&icmp_packet(PEER, OURS, 3, &request));
        assert!(echo_reply_in_place(&mut buf));
        let (ip, icmp) = checked(buf.data());
        assert_eq!((ip.src_addr, ip.dst_addr, ip.hop_limit), (OURS, PEER, 64));
        assert_eq!(icmp.msg_type(), Icmpv6Message::EchoReply);
        assert_eq!((icmp.echo_ident(), icmp.echo_seq_no()), (7, 9));
        assert_eq!(icmp.payload(), b"ping payload");

        // Not a request, or to a group: refused.
        assert!(!echo_reply_in_place(&mut buf));
        let mut buf = bare(&icmp_packet(PEER, all_nodes(), 3, &request));
        assert!(!echo_reply_in_place(&mut buf));
    }

    #[test]
    fn solicitation_round_trips_into_our_advertisement() {
        let group = solicited_node(OURS);
        let ns = solicitation(PEER, group, Some(PEER_MAC));
        let ndp = parse_ndp(&ns).expect("valid NS");
        assert_eq!(
            ndp,
            Ndp {
                kind: NdpKind::Solicit,
                source: PEER,
                target: OURS,
                link_addr: Some(PEER_MAC),
            }
        );
        let mut buf = frame(&ns, PEER_MAC, multicast_mac(group));
        assert!(neighbor_advert_in_place(&mut buf, &ndp, OUR_MAC, true));
        let eth = EthernetFrame::new_checked(buf.data()).unwrap();
        assert_eq!(eth.dst_addr(), PEER_MAC);
        assert_eq!(eth.src_addr(), OUR_MAC);
        assert_eq!(eth.ethertype(), EthernetProtocol::Ipv6);
        let (ip, _) = checked(&buf.data()[ETHERNET_LEN..]);
        assert_eq!((ip.src_addr, ip.dst_addr, ip.hop_limit), (OURS, PEER, 255));
        let na = parse_ndp(&buf.data()[ETHERNET_LEN..]).expect("our NA parses");
        assert_eq!(
            na,
            Ndp {
                kind: NdpKind::Advert {
                    solicited: true,
                    override_: true
                },
                source: OURS,
                target: OURS,
                link_addr: Some(OUR_MAC),
            }
        );
        let icmp = Icmpv6Packet::new_checked(&buf.data()[ETHERNET_LEN + HEADER_LEN..]).unwrap();
        assert!(!icmp.neighbor_flags().contains(NdiscNeighborFlags::ROUTER));
    }

    #[test]
    fn unicast_solicitation_without_option_is_answered_to_the_frame_source() {
        let ns = solicitation(PEER, OURS, None);
        let ndp = parse_ndp(&ns).expect("NUD probe");
        let mut buf = frame(&ns, PEER_MAC, OUR_MAC);
        assert!(neighbor_advert_in_place(&mut buf, &ndp, OUR_MAC, true));
        let eth = EthernetFrame::new_checked(buf.data()).unwrap();
        assert_eq!(eth.dst_addr(), PEER_MAC);
        // Without the link, a bare packet.
        let mut buf = bare(&ns);
        assert!(neighbor_advert_in_place(&mut buf, &ndp, OUR_MAC, false));
        let (ip, _) = checked(buf.data());
        assert_eq!(ip.dst_addr, PEER);
    }

    #[test]
    fn duplicate_address_detection_is_answered_to_all_nodes() {
        let group = solicited_node(OURS);
        let ns = solicitation(Ipv6Addr::UNSPECIFIED, group, None);
        let ndp = parse_ndp(&ns).expect("DAD NS");
        let mut buf = frame(&ns, PEER_MAC, multicast_mac(group));
        assert!(neighbor_advert_in_place(&mut buf, &ndp, OUR_MAC, true));
        let eth = EthernetFrame::new_checked(buf.data()).unwrap();
        assert_eq!(eth.dst_addr(), EthernetAddress([0x33, 0x33, 0, 0, 0, 1]));
        let (ip, _) = checked(&buf.data()[ETHERNET_LEN..]);
        assert_eq!(ip.dst_addr, all_nodes());
        let na = parse_ndp(&buf.data()[ETHERNET_LEN..]).expect("our NA parses");
        assert_eq!(
            na.kind,
            NdpKind::Advert {
                solicited: false,
                override_: true
            }
        );
        // DAD with a source link-layer option, or to a unicast address.
        assert_eq!(
            parse_ndp(&solicitation(Ipv6Addr::UNSPECIFIED, group, Some(PEER_MAC))),
            None
        );
        assert_eq!(parse_ndp(&solicitation(Ipv6Addr::UNSPECIFIED, OURS, None)), None);
    }

    #[test]
    fn invalid_solicitations_are_refused() {
        let group = solicited_node(OURS);
        // From a group.
        assert_eq!(parse_ndp(&solicitation(all_nodes(), group, None)), None);
        // To a group that is not a solicited-node one.
        assert_eq!(parse_ndp(&solicitation(PEER, all_nodes(), Some(PEER_MAC))), None);
        // Forwarded: hop limit below 255.
        let mut ns = solicitation(PEER, group, Some(PEER_MAC));
        ns[7] = 254;
        assert_eq!(parse_ndp(&ns), None);
        ns[7] = 255;
        assert!(parse_ndp(&ns).is_some());
        // A bad checksum.
        ns[HEADER_LEN + 2] ^= 1;
        assert_eq!(parse_ndp(&ns), None);
        ns[HEADER_LEN + 2] ^= 1;
        // A non-zero code (the checksum fixed up).
        ns[HEADER_LEN + 1] = 1;
        Icmpv6Packet::new_unchecked(&mut ns[HEADER_LEN..]).fill_checksum(&PEER, &group);
        assert_eq!(parse_ndp(&ns), None);
        ns[HEADER_LEN + 1] = 0;
        // An option of length zero.
        ns[HEADER_LEN + 25] = 0;
        Icmpv6Packet::new_unchecked(&mut ns[HEADER_LEN..]).fill_checksum(&PEER, &group);
        assert_eq!(parse_ndp(&ns), None);
        // A multicast target.
        let ndisc = NdiscRepr::NeighborSolicit {
            target_addr: all_nodes(),
            lladdr: None,
        };
        let ns = icmp_packet(PEER, group, 255, &Icmpv6Repr::Ndisc(ndisc));
        assert_eq!(parse_ndp(&ns), None);
        // Too short to hold a target.
        let mut short = solicitation(PEER, group, None);
        short.truncate(HEADER_LEN + 20);
        short[5] = 20;
        assert_eq!(parse_ndp(&short), None);
    }

    #[test]
    fn solicitation_we_send_parses_back() {
        let mut buf = bare(&[]);
        assert!(neighbor_solicit(&mut buf, (OUR_MAC, OURS), PEER));
        let eth = EthernetFrame::new_checked(buf.data()).unwrap();
        assert_eq!(eth.dst_addr(), multicast_mac(solicited_node(PEER)));
        assert_eq!(eth.src_addr(), OUR_MAC);
        assert_eq!(eth.ethertype(), EthernetProtocol::Ipv6);
        let (ip, _) = checked(&buf.data()[ETHERNET_LEN..]);
        assert_eq!(
            (ip.src_addr, ip.dst_addr, ip.hop_limit),
            (OURS, solicited_node(PEER), 255)
        );
        let ns = parse_ndp(&buf.data()[ETHERNET_LEN..]).expect("our NS parses");
        assert_eq!(
            ns,
            Ndp {
                kind: NdpKind::Solicit,
                source: OURS,
                target: PEER,
                link_addr: Some(OUR_MAC),
            }
        );
        assert!(!neighbor_solicit(&mut buf, (OUR_MAC, OURS), all_nodes()));
    }

    fn udp_packet(src: Ipv6Addr, dst: Ipv6Addr, payload: usize) -> Vec<u8> {
        let mut p = vec![0u8; HEADER_LEN + 8 + payload];
        write_ipv6(&mut p[..HEADER_LEN], (8 + payload) as u16, 64, src, dst);
        p[6] = 17;
        p[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&[0x12, 0x34, 0, 53]);
        p
    }

    #[test]
    fn errors_quote_the_packet_within_1280_bytes() {
        let router = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
        let big = udp_packet(PEER, OURS, 1400);
        let mut buf = bare(&big);
        assert!(error_in_place(&mut buf, kind::PACKET_TOO_BIG, 0, 1400, router));
        assert_eq!(buf.len(), MIN_MTU);
        let (ip, icmp) = checked(buf.data());
        assert_eq!((ip.src_addr, ip.dst_addr, ip.hop_limit), (router, PEER, 64));
        assert_eq!(icmp.msg_type(), Icmpv6Message::PktTooBig);
        assert_eq!(icmp.pkt_too_big_mtu(), 1400);
        assert_eq!(icmp.payload(), &big[..MIN_MTU - 48]);

        // A small packet is quoted whole, without the link's padding.
        let small = udp_packet(PEER, OURS, 4);
        let mut padded = small.clone();
        padded.extend_from_slice(&[0; 6]);
        let mut buf = bare(&padded);
        assert!(error_in_place(&mut buf, kind::TIME_EXCEEDED, 0, 0, router));
        let (_, icmp) = checked(buf.data());
        assert_eq!(icmp.msg_type(), Icmpv6Message::TimeExceeded);
        assert_eq!(icmp.payload(), &small[..]);

        let mut buf = bare(&small);
        assert!(error_in_place(&mut buf, kind::PARAM_PROBLEM, 0, 6, router));
        let (_, icmp) = checked(buf.data());
        assert_eq!(icmp.param_problem_ptr(), 6);

        let mut buf = bare(&small[..30]);
        assert!(!error_in_place(&mut buf, kind::TIME_EXCEEDED, 0, 0, router));
    }

    #[test]
    fn errors_follow_rfc_4443_section_2_4_e() {
        let udp = udp_packet(PEER, OURS, 4);
        assert!(may_answer_with_error(&udp, false));
        // To a group: only packet too big.
        let to_group = udp_packet(PEER, all_nodes(), 4);
        assert!(!may_answer_with_error(&to_group, false));
        assert!(may_answer_with_error(&to_group, true));
        // From the unspecified address or a group.
        assert!(!may_answer_with_error(
            &udp_packet(Ipv6Addr::UNSPECIFIED, OURS, 4),
            true
        ));
        assert!(!may_answer_with_error(&udp_packet(all_nodes(), OURS, 4), true));
        // About an ICMPv6 error or a redirect: no; about an echo: yes.
        let error = Icmpv6Repr::PktTooBig {
            mtu: 1280,
            header: Ipv6Repr {
                src_addr: OURS,
                dst_addr: PEER,
                next_header: IpProtocol::Udp,
                payload_len: 8,
                hop_limit: 64,
            },
            data: &[0; 8],
        };
        assert!(!may_answer_with_error(&icmp_packet(PEER, OURS, 64, &error), true));
        let mut redirect = icmp_packet(PEER, OURS, 64, &error);
        redirect[HEADER_LEN] = kind::REDIRECT;
        assert!(!may_answer_with_error(&redirect, false));
        let echo = Icmpv6Repr::EchoRequest {
            ident: 1,
            seq_no: 1,
            data: &[],
        };
        assert!(may_answer_with_error(&icmp_packet(PEER, OURS, 64, &echo), false));
        // A non-first fragment, and a chain that does not parse.
        let mut frag = udp_packet(PEER, OURS, 8);
        frag[6] = 44;
        frag[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&[17, 0, 0, 0x08, 0, 0, 0, 1]);
        assert!(!may_answer_with_error(&frag, false));
        frag[HEADER_LEN + 3] = 0x01;
        assert!(may_answer_with_error(&frag, false), "a first fragment");
        frag[6] = 60;
        frag[HEADER_LEN + 1] = 200;
        assert!(!may_answer_with_error(&frag, false));
    }
}
