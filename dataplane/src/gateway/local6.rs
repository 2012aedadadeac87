//! IPv6 addressed to the gateway itself: neighbour discovery for its
//! interfaces' IPv6 addresses (RFC 4861 §7.2.3-4: solicitations answered
//! with advertisements) and echo (RFC 4443 §4.1-2). Owns only that: IPv6
//! transit traffic and IPv6 tunnels are not carried yet, and every other
//! IPv6 frame is counted `unsupported`, as before.

use smoltcp::wire::{EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv6Packet, IpProtocol};

use super::classify::Classified;
use super::{Gateway, LinkLayer, Next};
use crate::buffer::PacketBuf;
use crate::icmp6::{self, kind};
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::ipv6;

/// ff02::1, the all-nodes group (RFC 4291 §2.7.1).
const ALL_NODES: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

impl Gateway {
    /// An IPv6 frame (behind its Ethernet header on an Ethernet port).
    pub(super) fn classify_ipv6(
        &mut self,
        from: Port,
        buf: &mut PacketBuf,
    ) -> Result<Classified, DropReason> {
        let link = self.link_of(from) == LinkLayer::Ethernet;
        let l2 = if link {
            EthernetFrame::<&[u8]>::header_len()
        } else {
            0
        };
        let Some((our, _)) = self.interfaces[from.index()].address6 else {
            return Err(DropReason::Unsupported);
        };
        let our_mac = self.interfaces[from.index()].mac;
        let (dst, src, icmp_type, icmp_at) = {
            let packet = buf.data().get(l2..).ok_or(DropReason::Malformed)?;
            let ip = ipv6::view(packet)?;
            let (dst, src) = (ip.dst_addr(), ip.src_addr());
            if dst != our && dst != icmp6::solicited_node(our) && dst != ALL_NODES {
                return Err(DropReason::Unsupported);
            }
            let upper = ipv6::upper_layer(packet)?;
            let icmp_type = (upper.protocol == u8::from(IpProtocol::Icmpv6))
                .then(|| packet.get(upper.offset).copied())
                .flatten();
            (dst, src, icmp_type, upper.offset)
        };
        self.stats.local_delivered += 1;
        let consumed = Ok(Classified::Done(Ok(Next::Consume)));
        match icmp_type {
            Some(kind::NEIGHBOR_SOLICIT) => {
                let ndp = icmp6::parse_ndp(&buf.data()[l2..]).ok_or(DropReason::Malformed)?;
                // Solicitations for other nodes' addresses reach us through
                // their shared solicited-node group: not ours to answer.
                if ndp.target != our || !self.setup.answer_arp {
                    return consumed;
                }
                if !icmp6::neighbor_advert_in_place(buf, &ndp, our_mac, link) {
                    return Err(DropReason::NoBufferSpace);
                }
                Ok(self.reply(from, buf))
            }
            // Echo to our own address, the ICMPv6 header right after the
            // fixed header (what the rewrite handles); a group's echo is
            // not answered (RFC 4443 §4.2 lets a node stay silent).
            Some(kind::ECHO_REQUEST) if dst == our && icmp_at == ipv6::HEADER_LEN => {
                if !icmpv6_checksum_ok(&buf.data()[l2 + icmp_at..], src, dst) {
                    return Err(DropReason::Malformed);
                }
                let frame_source = link.then(|| EthernetFrame::new_unchecked(buf.data()).src_addr());
                buf.trim_front(l2);
                if !icmp6::echo_reply_in_place(buf) {
                    return Err(DropReason::Malformed);
                }
                if let Some(peer) = frame_source {
                    frame(buf, peer, our_mac)?;
                }
                Ok(self.reply(from, buf))
            }
            _ => consumed,
        }
    }

    /// A reply written in place of the frame, sent back where it came from.
    fn reply(&mut self, from: Port, buf: &mut PacketBuf) -> Classified {
        self.stats.generated += 1;
        crate::fate::mark_replaced(buf, crate::fate::Fate::Consumed);
        Classified::Done(Ok(Next::Reply(from)))
    }
}

fn icmpv6_checksum_ok(icmp: &[u8], src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr) -> bool {
    Icmpv6Packet::new_checked(icmp).is_ok_and(|p| cfg!(fuzzing) || p.verify_checksum(&src, &dst))
}

/// Puts an Ethernet header for IPv6 in front of the packet in `buf`.
fn frame(buf: &mut PacketBuf, to: EthernetAddress, from: EthernetAddress) -> Result<(), DropReason> {
    let header = buf
        .prepend(EthernetFrame::<&[u8]>::header_len())
        .ok_or(DropReason::NoBufferSpace)?;
    crate::icmp::write_ethernet(header, to, from, EthernetProtocol::Ipv6);
    Ok(())
}
