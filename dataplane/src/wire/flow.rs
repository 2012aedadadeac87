//! The selector fields of an IPv4 or IPv6 packet.

use smoltcp::wire::Ipv4Packet;

use crate::stats::DropReason;
use crate::wire::ipv6;
use spd_sad::{proto, FlowKey};

/// Flow key of a checked IPv4 packet. Ports are read from TCP, UDP and SCTP
/// first fragments that carry them; other packets have none (OPAQUE).
pub fn flow_key<T: AsRef<[u8]>>(ip: &Ipv4Packet<T>) -> FlowKey {
    // The protocol byte itself: `next_header()` would turn it into
    // smoltcp's enum and back, a large match per packet.
    let protocol = ip.as_ref().get(9).copied().unwrap_or(0);
    let header_len = usize::from(ip.header_len());
    let total = usize::from(ip.total_len());
    let payload = ip.as_ref().get(header_len..total).unwrap_or(&[]);
    let ports = match protocol {
        proto::TCP | proto::UDP | proto::SCTP if ip.frag_offset() == 0 && payload.len() >= 4 => Some((
            u16::from_be_bytes([payload[0], payload[1]]),
            u16::from_be_bytes([payload[2], payload[3]]),
        )),
        _ => None,
    };
    FlowKey {
        src: ip.src_addr().into(),
        dst: ip.dst_addr().into(),
        protocol,
        ports,
    }
}

/// Flow key of an IPv6 datagram: the protocol after its extension headers,
/// and ports as for IPv4 (first fragments that carry them; OPAQUE
/// otherwise, RFC 4301 §4.4.1.1).
pub fn flow_key6(packet: &[u8]) -> Result<FlowKey, DropReason> {
    let ip = ipv6::view(packet)?;
    let upper = ipv6::upper_layer(packet)?;
    Ok(FlowKey {
        src: ip.src_addr().into(),
        dst: ip.dst_addr().into(),
        protocol: upper.protocol,
        ports: upper.ports,
    })
}

/// The flow key of an IP packet of either family.
pub fn flow_key_any(packet: &[u8]) -> Result<FlowKey, DropReason> {
    if super::is_ipv6(packet) {
        flow_key6(packet)
    } else {
        crate::wire::ipv4::view(packet).map(|ip| flow_key(&ip))
    }
}
