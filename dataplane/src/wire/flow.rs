//! The selector fields of an IPv4 packet.

use smoltcp::wire::Ipv4Packet;
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
