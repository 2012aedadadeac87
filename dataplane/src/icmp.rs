//! Messages the gateway itself sends: ARP replies and requests (RFC 826),
//! ICMP echo replies, time-exceeded and fragmentation-needed errors
//! (RFC 792, RFC 1191, RFC 1812 §4.3.2), and the control plane's UDP
//! datagrams. Replies and errors are written into the buffer of the packet
//! that caused them.

use std::net::Ipv4Addr;

use smoltcp::wire::{
    ArpHardware, ArpOperation, ArpPacket, EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress,
    IpProtocol, Ipv4Packet, UdpPacket,
};

use crate::buffer::PacketBuf;

/// ICMP types espgw sends or must not answer.
pub mod kind {
    pub const ECHO_REPLY: u8 = 0;
    pub const DEST_UNREACHABLE: u8 = 3;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
    /// Code of destination-unreachable: fragmentation needed and DF set.
    pub const FRAG_NEEDED: u8 = 4;
}

/// Bytes of an ARP packet for Ethernet/IPv4.
const ARP_LEN: usize = 28;

/// A checked ARP request or reply for IPv4 over Ethernet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    pub operation: ArpOperation,
    pub sender_mac: EthernetAddress,
    pub sender_ip: Ipv4Addr,
    pub target_ip: Ipv4Addr,
}

/// Parses the ARP packet after the Ethernet header.
pub fn parse_arp(payload: &[u8]) -> Option<Arp> {
    let p = ArpPacket::new_checked(payload).ok()?;
    if p.hardware_type() != ArpHardware::Ethernet
        || p.protocol_type() != EthernetProtocol::Ipv4
        || p.hardware_len() != 6
        || p.protocol_len() != 4
    {
        return None;
    }
    let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    Some(Arp {
        operation: p.operation(),
        sender_mac: EthernetAddress::from_bytes(p.source_hardware_addr()),
        sender_ip: ip(p.source_protocol_addr()),
        target_ip: ip(p.target_protocol_addr()),
    })
}

fn write_arp(
    out: &mut [u8],
    operation: ArpOperation,
    sender: (EthernetAddress, Ipv4Addr),
    target: (EthernetAddress, Ipv4Addr),
) {
    let mut p = ArpPacket::new_unchecked(out);
    p.set_hardware_type(ArpHardware::Ethernet);
    p.set_protocol_type(EthernetProtocol::Ipv4);
    p.set_hardware_len(6);
    p.set_protocol_len(4);
    p.set_operation(operation);
    p.set_source_hardware_addr(sender.0.as_bytes());
    p.set_source_protocol_addr(&sender.1.octets());
    p.set_target_hardware_addr(target.0.as_bytes());
    p.set_target_protocol_addr(&target.1.octets());
}

fn write_ethernet(out: &mut [u8], dst: EthernetAddress, src: EthernetAddress, ethertype: EthernetProtocol) {
    let mut f = EthernetFrame::new_unchecked(out);
    f.set_dst_addr(dst);
    f.set_src_addr(src);
    f.set_ethertype(ethertype);
}

/// Rewrites the request in `buf` (a whole Ethernet frame) into our reply.
pub fn arp_reply_in_place(buf: &mut PacketBuf, request: &Arp, our_mac: EthernetAddress) -> bool {
    if !buf.truncate(14 + ARP_LEN) {
        return false;
    }
    let data = buf.data_mut();
    write_ethernet(
        &mut data[..14],
        request.sender_mac,
        our_mac,
        EthernetProtocol::Arp,
    );
    write_arp(
        &mut data[14..],
        ArpOperation::Reply,
        (our_mac, request.target_ip),
        (request.sender_mac, request.sender_ip),
    );
    true
}

/// Fills `buf` with a broadcast request for `target`.
pub fn arp_request(buf: &mut PacketBuf, our: (EthernetAddress, Ipv4Addr), target: Ipv4Addr) -> bool {
    buf.reset();
    let Some(frame) = buf.append(14 + ARP_LEN) else {
        return false;
    };
    write_ethernet(
        &mut frame[..14],
        EthernetAddress::BROADCAST,
        our.0,
        EthernetProtocol::Arp,
    );
    write_arp(
        &mut frame[14..],
        ArpOperation::Request,
        our,
        (EthernetAddress([0; 6]), target),
    );
    true
}

/// Turns the echo request in `buf` (an IPv4 packet) into its reply.
pub fn echo_reply_in_place(buf: &mut PacketBuf) -> bool {
    let data = buf.data_mut();
    let header_len = usize::from(data[0] & 0x0f) * 4;
    let Some(icmp) = data.get_mut(header_len..) else {
        return false;
    };
    if icmp.len() < 8 || icmp[0] != kind::ECHO_REQUEST {
        return false;
    }
    icmp[0] = kind::ECHO_REPLY;
    icmp[2..4].copy_from_slice(&[0, 0]);
    let sum = checksum(icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut ip = Ipv4Packet::new_unchecked(data);
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    ip.set_src_addr(dst);
    ip.set_dst_addr(src);
    ip.set_hop_limit(64);
    ip.fill_checksum();
    true
}

/// Writes an IPv4/UDP datagram carrying `payload` into the empty `buf`;
/// false if it does not fit.
pub fn udp_datagram(
    buf: &mut PacketBuf,
    (from, src_port): (Ipv4Addr, u16),
    (to, dst_port): (Ipv4Addr, u16),
    ident: u16,
    payload: &[u8],
) -> bool {
    const HEADERS: usize = 20 + 8;
    let total = HEADERS + payload.len();
    let Ok(total_len) = u16::try_from(total) else {
        return false;
    };
    let Some(data) = buf.append(total) else {
        return false;
    };
    data[HEADERS..].copy_from_slice(payload);
    {
        let mut udp = UdpPacket::new_unchecked(&mut data[20..]);
        udp.set_src_port(src_port);
        udp.set_dst_port(dst_port);
        udp.set_len(total_len - 20);
        udp.fill_checksum(&IpAddress::Ipv4(from), &IpAddress::Ipv4(to));
    }
    let mut ip = Ipv4Packet::new_unchecked(&mut data[..]);
    ip.set_version(4);
    ip.set_header_len(20);
    ip.set_dscp(0);
    ip.set_ecn(0);
    ip.set_total_len(total_len);
    ip.set_ident(ident);
    ip.clear_flags();
    ip.set_frag_offset(0);
    ip.set_hop_limit(64);
    ip.set_next_header(IpProtocol::Udp);
    ip.set_src_addr(from);
    ip.set_dst_addr(to);
    ip.fill_checksum();
    true
}

/// The Internet checksum (RFC 1071) of `data`.
fn checksum(data: &[u8]) -> u16 {
    !smoltcp::wire::checksum::data(data)
}

/// Whether an ICMP error may be sent about this IPv4 packet (RFC 1812
/// §4.3.2.7): not about ICMP errors, non-first fragments, or packets from
/// unspecified, broadcast or multicast sources.
pub fn may_answer_with_error(packet: &[u8]) -> bool {
    let Ok(ip) = Ipv4Packet::new_checked(packet) else {
        return false;
    };
    let src = ip.src_addr();
    if src.is_unspecified() || src.is_broadcast() || src.is_multicast() || ip.frag_offset() != 0 {
        return false;
    }
    if ip.next_header() == IpProtocol::Icmp {
        let header_len = usize::from(ip.header_len());
        if let Some(&icmp_type) = packet.get(header_len) {
            return icmp_type == kind::ECHO_REQUEST || icmp_type == kind::ECHO_REPLY;
        }
        return false;
    }
    true
}

/// Rewrites the IPv4 packet in `buf` into an ICMP error about it, sent from
/// `from` back to its source: the original header and 8 bytes of its
/// payload follow the ICMP header (RFC 792). `rest` is the second word
/// (the next-hop MTU for fragmentation-needed, RFC 1191).
pub fn error_in_place(buf: &mut PacketBuf, icmp_type: u8, code: u8, rest: u32, from: Ipv4Addr) -> bool {
    let (quoted, to) = {
        let data = buf.data();
        let header_len = usize::from(data[0] & 0x0f) * 4;
        let Ok(ip) = Ipv4Packet::new_checked(data) else {
            return false;
        };
        ((header_len + 8).min(data.len()), ip.src_addr())
    };
    if !buf.truncate(quoted) || buf.prepend(8).is_none() || buf.prepend(20).is_none() {
        return false;
    }
    let total = buf.len();
    let data = buf.data_mut();
    {
        let icmp = &mut data[20..];
        icmp[0] = icmp_type;
        icmp[1] = code;
        icmp[2..4].copy_from_slice(&[0, 0]);
        icmp[4..8].copy_from_slice(&rest.to_be_bytes());
        let sum = checksum(icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    let mut ip = Ipv4Packet::new_unchecked(&mut data[..]);
    ip.set_version(4);
    ip.set_header_len(20);
    ip.set_dscp(0);
    ip.set_ecn(0);
    ip.set_total_len(total as u16);
    ip.set_ident(0);
    ip.clear_flags();
    ip.set_frag_offset(0);
    ip.set_hop_limit(64);
    ip.set_next_header(IpProtocol::Icmp);
    ip.set_src_addr(from);
    ip.set_dst_addr(to);
    ip.fill_checksum();
    true
}
