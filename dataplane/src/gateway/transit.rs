//! What forwarding does to every IP packet that crosses the gateway,
//! whichever stage forwards it: the IPv4 TTL (RFC 1812 §5.3.1) and the
//! IPv6 hop limit (RFC 8200 §3) taken down by one, and the RFC 8200
//! extension header rules for a router or a destination. Ingress applies
//! them to plaintext it forwards, ESP in to what comes out of a tunnel.
//!
//! A leaf: functions of the packet alone, no state, no stage called.

use super::output::{IcmpError, Next};
use crate::buffer::PacketBuf;
use crate::icmp6::kind;
use crate::stats::DropReason;
use crate::wire::ipv6;

/// RFC 8200 §4.2 and §4.4 on the IPv6 packet `l2` bytes into `buf`,
/// for a node in `role`: `None` to go on; otherwise what becomes of
/// the packet: the ICMPv6 parameter problem the rules ask for, written
/// in its place (bare IPv6, through the outbound SPD and the error
/// rate limits), or its drop.
pub(super) fn refuse_extension_headers(
    buf: &mut PacketBuf,
    l2: usize,
    role: ipv6::Role,
) -> Option<Result<Next, DropReason>> {
    let refusal = match ipv6::obey(buf.data().get(l2..).unwrap_or_default(), role) {
        Ok(()) => return None,
        Err(refusal) => refusal,
    };
    let Some((code, pointer)) = refusal.problem else {
        return Some(Err(refusal.reason));
    };
    buf.trim_front(l2);
    let error = (kind::PARAM_PROBLEM, code, pointer);
    Some(Ok(Next::Error(IcmpError::v6(error, refusal.reason))))
}

/// RFC 8200 §3: a forwarding node decrements the hop limit and discards
/// the packet when it reaches zero. No checksum covers it.
pub(super) fn decrement_hop_limit(buf: &mut PacketBuf) -> Result<(), DropReason> {
    let hop_limit = buf.data_mut().get_mut(7).ok_or(DropReason::Malformed)?;
    if *hop_limit <= 1 {
        return Err(DropReason::TtlExpired);
    }
    *hop_limit -= 1;
    Ok(())
}

/// RFC 1812 §5.3.1: decrement TTL when forwarding; refuse at zero. The
/// checksum is updated incrementally (RFC 1624 eqn. 3, as RFC 1812 §5.3.1
/// allows) instead of being recomputed over the header.
pub(super) fn decrement_ttl(buf: &mut PacketBuf) -> Result<(), DropReason> {
    // Raw bytes of the header classification checked (TTL at 8, protocol
    // at 9, checksum at 10): smoltcp's accessors would turn the protocol
    // into its enum and back, a large match per packet.
    let Some(header) = buf.data_mut().get_mut(..12) else {
        return Err(DropReason::Malformed);
    };
    let (ttl, protocol) = (header[8], header[9]);
    if ttl <= 1 {
        return Err(DropReason::TtlExpired);
    }
    let old_word = u16::from_be_bytes([ttl, protocol]);
    let new_word = u16::from_be_bytes([ttl - 1, protocol]);
    header[8] = ttl - 1;
    let checksum = incremental_checksum(u16::from_be_bytes([header[10], header[11]]), old_word, new_word);
    header[10..12].copy_from_slice(&checksum.to_be_bytes());
    Ok(())
}

fn incremental_checksum(checksum: u16, old_word: u16, new_word: u16) -> u16 {
    let mut sum = u32::from(!checksum) + u32::from(!old_word) + u32::from(new_word);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::Ipv4Packet;

    /// The incremental update gives the checksum a full recomputation gives,
    /// for every TTL and a spread of headers.
    #[test]
    fn incremental_ttl_checksum_matches_a_full_recompute() {
        let mut pool = crate::buffer::PacketPool::new(1);
        let mut buf = pool.alloc().expect("a buffer");
        for ttl in 2..=255u8 {
            for (protocol, ident) in [(17u8, 0u16), (6, 0xffff), (1, 0x1234), (50, 0x8001)] {
                let mut header = [0u8; 20];
                {
                    let mut ip = Ipv4Packet::new_unchecked(&mut header[..]);
                    ip.set_version(4);
                    ip.set_header_len(20);
                    ip.set_total_len(20);
                    ip.set_ident(ident);
                    ip.set_hop_limit(ttl);
                    ip.set_next_header(protocol.into());
                    ip.set_src_addr([10, 0, 0, ttl].into());
                    ip.set_dst_addr([192, 168, ttl, 1].into());
                    ip.fill_checksum();
                }
                assert!(buf.fill(&header));
                decrement_ttl(&mut buf).expect("ttl above 1");
                let ip = Ipv4Packet::new_checked(buf.data()).expect("valid");
                assert_eq!(ip.hop_limit(), ttl - 1);
                assert!(
                    ip.verify_checksum(),
                    "ttl {ttl} protocol {protocol} ident {ident:#x}"
                );
            }
        }
        pool.free(buf);
    }
}
