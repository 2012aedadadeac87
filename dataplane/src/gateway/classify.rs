//! Classification: what a received frame is and where it must go, from
//! its link-layer header, its IPv4 header, the SPD and the SAD. Owns the
//! checks that run before any crypto (IPv4 validity, TTL, local delivery,
//! ESP for us, control traffic, the RFC 4301 §5.2 plaintext rule); must not
//! touch the engine or transmit anything.

use std::net::Ipv4Addr;

use smoltcp::wire::{EthernetFrame, EthernetProtocol, Ipv4Packet};
use spd_sad::{proto, Action, PolicyDirection, SaId};

use super::{Gateway, LinkLayer, Next};
use crate::buffer::PacketBuf;
use crate::icmp;
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::{flow_key, EspPacket};

/// What classification decided for one frame.
pub(super) enum Classified {
    Done(Result<Next, DropReason>),
    Arp(icmp::Arp),
    /// A fragment of ESP addressed to us: reassemble first.
    Fragment,
    Encapsulate(SaId),
    Decapsulate,
}

impl Gateway {
    pub(super) fn is_control(&self, flow: &spd_sad::FlowKey, is_fragment: bool) -> bool {
        let Some(port) = self.setup.control_port else {
            return false;
        };
        flow.protocol == proto::UDP
            && !is_fragment
            && flow.ports.is_some_and(|(_, dst)| dst == port)
            && self.is_local(flow.dst)
    }

    /// Whether `addr` is one of the gateway's own addresses.
    pub(super) fn is_local(&self, addr: Ipv4Addr) -> bool {
        self.interfaces.iter().any(|i| i.address == addr)
    }

    pub(super) fn classify(&mut self, from: Port, buf: &mut PacketBuf) -> Classified {
        match self.classify_inner(from, buf) {
            Ok(c) => c,
            // RFC 1812 §5.3.1: tell the source its packet died here.
            Err(DropReason::TtlExpired) => {
                let from_addr = self.interfaces[from.index()].address;
                let error = (icmp::kind::TIME_EXCEEDED, 0, 0);
                Classified::Done(self.icmp_error(buf, error, from_addr, DropReason::TtlExpired))
            }
            Err(reason) => Classified::Done(Err(reason)),
        }
    }

    /// An ICMP echo request to one of our addresses becomes its reply.
    pub(super) fn answer_echo(&mut self, buf: &mut PacketBuf, flow: &spd_sad::FlowKey) -> Option<Classified> {
        if flow.protocol != proto::ICMP {
            return None;
        }
        let header_len = usize::from(buf.data()[0] & 0x0f) * 4;
        if buf.data().get(header_len) != Some(&icmp::kind::ECHO_REQUEST) || !icmp::echo_reply_in_place(buf) {
            return None;
        }
        self.stats.local_delivered += 1;
        self.stats.generated += 1;
        crate::fate::mark_replaced(buf, crate::fate::Fate::Consumed);
        Some(Classified::Done(Ok(Next::Route)))
    }

    pub(super) fn classify_inner(
        &mut self,
        from: Port,
        buf: &mut PacketBuf,
    ) -> Result<Classified, DropReason> {
        if let Some(arp) = self.strip_link_header(from, buf)? {
            return Ok(Classified::Arp(arp));
        }
        check_ipv4(buf)?;
        let ip = Ipv4Packet::new_unchecked(buf.data());
        let flow = flow_key(&ip);
        let is_fragment = ip.more_frags() || ip.frag_offset() != 0;
        match from {
            Port::Inside => {
                if self.is_local(flow.dst) {
                    if let Some(reply) = self.answer_echo(buf, &flow) {
                        return Ok(reply);
                    }
                    self.stats.local_delivered += 1;
                    return Ok(Classified::Done(Ok(Next::Consume)));
                }
                match self.spd.lookup(PolicyDirection::Out, &flow).action {
                    Action::Protect(sa) => {
                        decrement_ttl(buf)?;
                        Ok(Classified::Encapsulate(sa))
                    }
                    Action::Bypass => {
                        decrement_ttl(buf)?;
                        self.stats.bypassed += 1;
                        Ok(Classified::Done(Ok(Next::Route)))
                    }
                    Action::Discard => Err(self.no_policy_or_discard(PolicyDirection::Out, &flow)),
                }
            }
            Port::Outside => {
                if flow.protocol == proto::ESP && is_fragment && self.is_local(flow.dst) {
                    return Ok(Classified::Fragment);
                }
                if flow.protocol == proto::ESP && self.is_esp_for_us(buf, flow.dst) {
                    return Ok(Classified::Decapsulate);
                }
                if self.is_control(&flow, is_fragment) {
                    self.stats.local_delivered += 1;
                    self.stats.control_received += 1;
                    return Ok(Classified::Done(Ok(Next::Control)));
                }
                // RFC 4301 §5.2: plaintext must be allowed by a bypass policy.
                match self.spd.lookup(PolicyDirection::In, &flow).action {
                    Action::Protect(_) => return Err(DropReason::PolicyMismatch),
                    Action::Discard => return Err(self.no_policy_or_discard(PolicyDirection::In, &flow)),
                    Action::Bypass => {}
                }
                if self.is_local(flow.dst) {
                    if let Some(reply) = self.answer_echo(buf, &flow) {
                        return Ok(reply);
                    }
                    self.stats.local_delivered += 1;
                    return Ok(Classified::Done(Ok(Next::Consume)));
                }
                decrement_ttl(buf)?;
                self.stats.bypassed += 1;
                Ok(Classified::Done(Ok(Next::Route)))
            }
        }
    }

    pub(super) fn no_policy_or_discard(
        &self,
        direction: PolicyDirection,
        flow: &spd_sad::FlowKey,
    ) -> DropReason {
        match self.spd.lookup(direction, flow).policy {
            Some(_) => DropReason::PolicyDiscard,
            None => DropReason::NoPolicy,
        }
    }

    /// ESP that this gateway terminates: addressed to it (an unknown SPI is
    /// then its error to count), or carrying the SPI of one of its inbound
    /// SAs. Other ESP is transit traffic for the SPD.
    pub(super) fn is_esp_for_us(&self, buf: &PacketBuf, dst: Ipv4Addr) -> bool {
        if self.is_local(dst) {
            return true;
        }
        let data = buf.data();
        let header_len = usize::from(data[0] & 0x0f) * 4;
        match EspPacket::new_checked(&data[header_len..]) {
            Ok(esp) => self.sad.lookup_inbound(esp.spi(), dst).is_some(),
            Err(_) => false,
        }
    }

    /// Removes the Ethernet header; ARP frames come back parsed instead.
    pub(super) fn strip_link_header(
        &self,
        from: Port,
        buf: &mut PacketBuf,
    ) -> Result<Option<icmp::Arp>, DropReason> {
        if self.link_of(from) == LinkLayer::RawIp {
            return Ok(None);
        }
        let frame = EthernetFrame::new_checked(buf.data()).map_err(|_| DropReason::Malformed)?;
        let dst = frame.dst_addr();
        if self.setup.only_own_mac && dst.is_unicast() && dst != self.interfaces[from.index()].mac {
            return Err(DropReason::OtherHost);
        }
        match frame.ethertype() {
            EthernetProtocol::Ipv4 => {}
            EthernetProtocol::Arp => {
                return icmp::parse_arp(frame.payload())
                    .map(Some)
                    .ok_or(DropReason::Malformed);
            }
            _ => return Err(DropReason::Unsupported),
        }
        buf.trim_front(EthernetFrame::<&[u8]>::header_len());
        Ok(None)
    }
}

/// Validates an IPv4 header and trims link-layer padding after the packet.
fn check_ipv4(buf: &mut PacketBuf) -> Result<(), DropReason> {
    let total = {
        let ip = Ipv4Packet::new_checked(buf.data()).map_err(|_| {
            if buf.data().first().is_some_and(|b| b >> 4 == 6) {
                DropReason::Unsupported
            } else {
                DropReason::Malformed
            }
        })?;
        if ip.version() != 4 {
            return Err(if ip.version() == 6 {
                DropReason::Unsupported
            } else {
                DropReason::Malformed
            });
        }
        if !ip.verify_checksum() {
            return Err(DropReason::Malformed);
        }
        usize::from(ip.total_len())
    };
    buf.truncate(total);
    Ok(())
}

/// RFC 1812 §5.3.1: decrement TTL when forwarding; refuse at zero. The
/// checksum is updated incrementally (RFC 1624 eqn. 3, as RFC 1812 §5.3.1
/// allows) instead of being recomputed over the header.
pub(super) fn decrement_ttl(buf: &mut PacketBuf) -> Result<(), DropReason> {
    let mut ip = Ipv4Packet::new_unchecked(buf.data_mut());
    let ttl = ip.hop_limit();
    if ttl <= 1 {
        return Err(DropReason::TtlExpired);
    }
    let protocol = u8::from(ip.next_header());
    let old_word = u16::from_be_bytes([ttl, protocol]);
    let new_word = u16::from_be_bytes([ttl - 1, protocol]);
    ip.set_hop_limit(ttl - 1);
    ip.set_checksum(incremental_checksum(ip.checksum(), old_word, new_word));
    Ok(())
}

/// RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), in ones' complement.
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
