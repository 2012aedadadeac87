//! What a received IPv6 frame is and where it goes, for interfaces with an
//! `address6`: neighbour discovery for our addresses (RFC 4861 §7.2.3-5:
//! solicitations answered, advertisements and solicitations learnt from),
//! echo (RFC 4443 §4.1-2), and transit traffic against the SPD (inner
//! IPv6 of an IPv4 tunnel, or bypassed), with the hop limit (RFC 8200 §3)
//! and the link-local scope (RFC 4291 §2.5.6) checked first, and ESP over
//! IPv6 to our outside address (tunnels with IPv6 ends) sent on to
//! decapsulation, through reassembly when the peer fragmented it. The
//! IKE to our outside address (the control port, and behind the non-ESP
//! marker on an encapsulation port) goes to the control plane as a bare
//! IPv6 packet. The
//! extension headers are obeyed as RFC 8200 §4 has a node do it
//! (`wire::ipv6::obey`): as the destination for packets to us and ESP we
//! terminate, as a router (hop-by-hop options only) for transit. Must
//! not touch the engine or transmit anything. IPv6 on
//! an interface without `address6` is counted `unsupported`.

use std::net::Ipv6Addr;

use smoltcp::wire::{EthernetAddress, EthernetFrame, EthernetProtocol, IpProtocol};
use spd_sad::{proto, Action, PolicyDirection};

use super::super::output::{IcmpError, Next};
use super::super::setup::LinkLayer;
use super::super::transit::{decrement_hop_limit, refuse_extension_headers};
use super::{Classified, Ingress, Lent};
use crate::buffer::PacketBuf;
use crate::icmp6::{self, kind, NdpKind};
use crate::neighbor::Sighting;
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::ipv6;

/// ff02::1, the all-nodes group (RFC 4291 §2.7.1).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

impl Ingress {
    /// An IPv6 frame (behind its Ethernet header on an Ethernet port).
    pub(super) fn classify_ipv6(
        &mut self,
        lent: &mut Lent<'_>,
        from: Port,
        buf: &mut PacketBuf,
    ) -> Result<Classified, DropReason> {
        let link = lent.addressing.link_of(from) == LinkLayer::Ethernet;
        let l2 = if link {
            EthernetFrame::<&[u8]>::header_len()
        } else {
            0
        };
        let Some((our, _)) = lent.addressing.interface(from).address6 else {
            return Err(DropReason::Unsupported);
        };
        let (dst, total) = {
            let ip = ipv6::view(buf.data().get(l2..).ok_or(DropReason::Malformed)?)?;
            (ip.dst_addr(), ip.total_len())
        };
        // Link padding after the datagram is no part of it.
        buf.truncate(l2 + total);
        if dst == our || dst == icmp6::solicited_node(our) || dst == ALL_NODES {
            return self.ipv6_for_us(lent, from, buf, l2, our);
        }
        if dst.is_multicast() {
            // Other groups (MLD, routers') are not ours to join or forward.
            return Err(DropReason::Unsupported);
        }
        if lent.addressing.is_local(dst.into()) {
            if let Some(result) = refuse_extension_headers(buf, l2, ipv6::Role::Destination) {
                return Ok(Classified::Done(result));
            }
            lent.stats.local_delivered += 1;
            return Ok(Classified::Done(Ok(Next::Consume)));
        }
        buf.trim_front(l2);
        self.ipv6_transit(lent, from, buf)
    }

    /// A bare IPv6 packet passing through: the policy decides (RFC 4301
    /// §5.1 outbound, §5.2 plaintext inbound), after the scope and hop
    /// limit checks every router makes.
    fn ipv6_transit(
        &mut self,
        lent: &mut Lent<'_>,
        from: Port,
        buf: &mut PacketBuf,
    ) -> Result<Classified, DropReason> {
        let flow = crate::wire::flow_key6(buf.data())?;
        let (std::net::IpAddr::V6(src), std::net::IpAddr::V6(dst)) = (flow.src, flow.dst) else {
            return Err(DropReason::Malformed);
        };
        // RFC 4291 §2.5.6: link-local addresses never leave their link.
        if is_link_local(src) || is_link_local(dst) || src.is_multicast() || src.is_unspecified() {
            return Err(DropReason::NoRoute);
        }
        // Transport-mode ESP keeps the hosts' addresses: ESP for one of
        // our inbound SAs is ours whatever its destination (as for IPv4,
        // `is_esp_for_us`).
        if from == Port::Outside && flow.protocol == proto::ESP {
            match self.is_ipv6_esp_for_us(lent, buf) {
                // We terminate its ESP: its headers are ours to process
                // as the destination.
                Some(true) => {
                    return Ok(match refuse_extension_headers(buf, 0, ipv6::Role::Destination) {
                        Some(result) => Classified::Done(result),
                        None => Classified::Decapsulate,
                    })
                }
                // Transport-mode ESP a peer fragmented: reassembled when
                // an IPv6 transport SA could take it.
                None if self.receives_ipv6_transport(lent) => {
                    if let Some(result) = refuse_extension_headers(buf, 0, ipv6::Role::Router) {
                        return Ok(Classified::Done(result));
                    }
                    return Ok(Classified::Fragment);
                }
                None => return Err(DropReason::Unsupported),
                Some(false) => {}
            }
        }
        // A router processes the hop-by-hop options (RFC 8200 §4.3); the
        // rest are for the destination.
        if let Some(result) = refuse_extension_headers(buf, 0, ipv6::Role::Router) {
            return Ok(Classified::Done(result));
        }
        let direction = match from {
            Port::Inside => PolicyDirection::Out,
            Port::Outside => PolicyDirection::In,
        };
        let decision = lent.spd.lookup_cached(direction, &flow);
        let next = match (decision.action, from) {
            (Action::Protect(sa), Port::Inside) => Classified::Encapsulate(sa),
            (Action::Protect(_), Port::Outside) => return Err(DropReason::PolicyMismatch),
            (Action::Bypass, _) => Classified::Done(Ok(Next::Route)),
            (Action::Discard, from) => {
                if from == Port::Inside {
                    self.note_outbound_discard(&decision, &flow);
                }
                return Err(match decision.policy {
                    Some(_) => DropReason::PolicyDiscard,
                    None => DropReason::NoPolicy,
                });
            }
        };
        if let Err(reason) = decrement_hop_limit(buf) {
            // RFC 4443 §3.3: hop limit exceeded in transit.
            let error = (kind::TIME_EXCEEDED, 0, 0);
            return Ok(Classified::Done(Ok(Next::Error(IcmpError::v6(error, reason)))));
        }
        if matches!(next, Classified::Done(_)) {
            lent.stats.bypassed += 1;
        }
        Ok(next)
    }

    /// Whether an inbound transport-mode SA has IPv6 ends (asked for
    /// fragments only).
    fn receives_ipv6_transport(&self, lent: &Lent<'_>) -> bool {
        lent.sad.iter().any(|(_, sa)| {
            let p = sa.params();
            p.direction == spd_sad::SaDirection::Inbound
                && p.mode == spd_sad::Mode::Transport
                && p.local.is_ipv6()
        })
    }

    /// Whether an IPv6 ESP packet carries the SPI of one of our inbound
    /// SAs for its destination; `None` for a fragment, whose SPI only the
    /// first fragment has.
    fn is_ipv6_esp_for_us(&self, lent: &Lent<'_>, buf: &PacketBuf) -> Option<bool> {
        let data = buf.data();
        let (Ok(upper), Ok(ip)) = (ipv6::upper_layer(data), ipv6::view(data)) else {
            return Some(false);
        };
        if upper.fragment.is_some() {
            return None;
        }
        Some(
            match crate::wire::EspPacket::new_checked(data.get(upper.offset..).unwrap_or_default()) {
                Ok(esp) => lent.sad.lookup_inbound(esp.spi(), ip.dst_addr().into()).is_some(),
                Err(_) => false,
            },
        )
    }

    /// IPv6 to our address, our solicited-node group or all nodes:
    /// counted as delivered here once it is known not to be dropped (nor
    /// ESP, which decapsulation accounts for).
    fn ipv6_for_us(
        &mut self,
        lent: &mut Lent<'_>,
        from: Port,
        buf: &mut PacketBuf,
        l2: usize,
        our: Ipv6Addr,
    ) -> Result<Classified, DropReason> {
        // Ours to process as the destination, ESP's outer headers too.
        if let Some(result) = refuse_extension_headers(buf, l2, ipv6::Role::Destination) {
            return Ok(Classified::Done(result));
        }
        let classified = self.ipv6_for_us_unaccounted(lent, from, buf, l2, our)?;
        if matches!(classified, Classified::Done(Ok(_))) {
            lent.stats.local_delivered += 1;
        }
        Ok(classified)
    }

    /// A whole UDP datagram to our outside address at `offset` (behind
    /// `l2` bytes of link header): the control plane's, or a keepalive,
    /// if its port says so; `None` when it is neither. What goes to the
    /// control plane goes as the bare IPv6 packet.
    fn ipv6_control(
        &mut self,
        lent: &mut Lent<'_>,
        buf: &mut PacketBuf,
        l2: usize,
        offset: usize,
        ports: Option<(u16, u16)>,
    ) -> Option<Result<Classified, DropReason>> {
        let control = self.control_port?;
        let (_, port) = ports?;
        if port != control && !self.nat_ports.contains(&port) {
            return None;
        }
        let payload = buf
            .data()
            .get(l2 + offset + crate::nat::UDP_HEADER_LEN..)
            .unwrap_or_default();
        if port != control {
            match crate::nat::Payload::of(payload) {
                crate::nat::Payload::Ike => {}
                // RFC 3948 §2.3: the receiver ignores keepalives.
                crate::nat::Payload::Keepalive => {
                    lent.stats.nat_keepalives_received += 1;
                    return Some(Ok(Classified::Done(Ok(Next::Consume))));
                }
                crate::nat::Payload::Esp => return Some(Err(DropReason::Unsupported)),
                crate::nat::Payload::Malformed => return Some(Err(DropReason::Malformed)),
            }
        }
        buf.trim_front(l2);
        lent.stats.control_received += 1;
        Some(Ok(Classified::Done(Ok(Next::Control))))
    }

    fn ipv6_for_us_unaccounted(
        &mut self,
        lent: &mut Lent<'_>,
        from: Port,
        buf: &mut PacketBuf,
        l2: usize,
        our: Ipv6Addr,
    ) -> Result<Classified, DropReason> {
        let link = l2 > 0;
        let our_mac = lent.addressing.interface(from).mac;
        let (dst, src, icmp_type, icmp_at, upper) = {
            let packet = &buf.data()[l2..];
            let ip = ipv6::view(packet)?;
            let upper = ipv6::upper_layer(packet)?;
            let icmp_type = (upper.protocol == u8::from(IpProtocol::Icmpv6))
                .then(|| packet.get(upper.offset).copied())
                .flatten();
            (ip.dst_addr(), ip.src_addr(), icmp_type, upper.offset, upper)
        };
        // ESP over IPv6 to our outside address: a tunnel with IPv6 ends
        // (4-in-6, 6-in-6). A peer may fragment its own ESP (Linux does,
        // for DF-clear IPv4 in 4-in-6): reassembled first.
        if upper.protocol == proto::ESP && dst == our && from == Port::Outside {
            buf.trim_front(l2);
            return Ok(match upper.fragment {
                Some(_) => Classified::Fragment,
                None => Classified::Decapsulate,
            });
        }
        // IKE to our outside address, as for IPv4 (`is_control`, and
        // behind the non-ESP marker on an encapsulation port): for the
        // control plane, exempt from the SPD (RFC 4301 §5.1 lets IKE
        // bypass). There is no ESP in UDP over IPv6 (RFC 3948 is IPv4's).
        if from == Port::Outside && dst == our && upper.protocol == proto::UDP && upper.fragment.is_none() {
            if let Some(classified) = self.ipv6_control(lent, buf, l2, upper.offset, upper.ports) {
                return classified;
            }
        }
        // RFC 4301 §5.2, as for IPv4: plaintext to our address from the
        // outside must be let in by a bypass policy (a clear echo request
        // that a `protect` policy covers is refused, not answered);
        // neighbour discovery aside.
        let neighbour_discovery = matches!(icmp_type, Some(kind::ROUTER_SOLICIT..=kind::REDIRECT));
        if from == Port::Outside && dst == our && !neighbour_discovery {
            let flow = spd_sad::FlowKey {
                src: src.into(),
                dst: dst.into(),
                protocol: upper.protocol,
                ports: upper.ports,
            };
            let decision = lent.spd.lookup_cached(PolicyDirection::In, &flow);
            match decision.action {
                Action::Protect(_) => return Err(DropReason::PolicyMismatch),
                Action::Discard if decision.policy.is_some() => return Err(DropReason::PolicyDiscard),
                Action::Discard => return Err(DropReason::NoPolicy),
                Action::Bypass => {}
            }
        }
        let consumed = Ok(Classified::Done(Ok(Next::Consume)));
        match icmp_type {
            Some(kind::NEIGHBOR_SOLICIT) => {
                let ndp = icmp6::parse_ndp(&buf.data()[l2..]).ok_or(DropReason::Malformed)?;
                // Solicitations for other nodes' addresses reach us through
                // their shared solicited-node group: not ours to answer.
                if ndp.target != our {
                    return consumed;
                }
                // RFC 4861 §7.2.3: the solicitor's link-layer option makes
                // (or refreshes) its entry; a DAD probe has none.
                if let Some(mac) = ndp.link_addr.filter(|_| !ndp.source.is_unspecified()) {
                    self.learn_neighbor6(from, ndp.source, mac, false, true);
                }
                if !lent.addressing.answers_neighbors() {
                    return consumed;
                }
                if !icmp6::neighbor_advert_in_place(buf, &ndp, our_mac, link) {
                    return Err(DropReason::NoBufferSpace);
                }
                Ok(self.reply(lent, from, buf))
            }
            Some(kind::NEIGHBOR_ADVERT) => {
                let ndp = icmp6::parse_ndp(&buf.data()[l2..]).ok_or(DropReason::Malformed)?;
                let NdpKind::Advert { solicited, .. } = ndp.kind else {
                    return consumed;
                };
                // A unicast advertisement may leave the option out (RFC
                // 4861 §7.2.4); the frame's source is then the sender's.
                let frame_source = link.then(|| EthernetFrame::new_unchecked(buf.data()).src_addr());
                if let Some(mac) = ndp.link_addr.or(frame_source) {
                    self.learn_neighbor6(from, ndp.target, mac, true, solicited && dst == our);
                }
                consumed
            }
            // Echo to our own address, the ICMPv6 header right after the
            // fixed header (what the rewrite handles); a group's echo is
            // not answered (RFC 4443 §4.2 lets a node stay silent).
            Some(kind::ECHO_REQUEST) if dst == our && icmp_at == ipv6::HEADER_LEN => {
                if !super::super::own_packets::icmpv6_checksum_ok(&buf.data()[l2 + icmp_at..], src, dst) {
                    return Err(DropReason::Malformed);
                }
                let frame_source = link.then(|| EthernetFrame::new_unchecked(buf.data()).src_addr());
                buf.trim_front(l2);
                if !icmp6::echo_reply_in_place(buf) {
                    return Err(DropReason::Malformed);
                }
                // The reply takes the outbound SPD (`own_packets::local_policy`): protected by
                // the SA a policy names, or back where the request came
                // from in the clear.
                if let Some(sa) = super::super::own_packets::local_policy(
                    lent.spd,
                    lent.addressing,
                    buf.data(),
                    Some(from),
                )? {
                    lent.stats.local_delivered += 1;
                    lent.stats.generated += 1;
                    crate::fate::mark_replaced(buf, crate::fate::Fate::Consumed);
                    return Ok(Classified::Encapsulate(sa));
                }
                if let Some(peer) = frame_source {
                    frame(buf, peer, our_mac)?;
                }
                Ok(self.reply(lent, from, buf))
            }
            _ => consumed,
        }
    }

    /// Notes what an NDP message said of `sender`, for the front to hand
    /// to egress's neighbour table (see [`Ingress::take_sightings`]).
    fn learn_neighbor6(
        &mut self,
        from: Port,
        sender: Ipv6Addr,
        mac: EthernetAddress,
        is_reply: bool,
        for_us: bool,
    ) {
        let seen = Sighting {
            sender: sender.into(),
            mac,
            is_reply,
            for_us,
        };
        self.sightings.push((from, seen));
    }

    /// A reply written in place of the frame, sent back where it came from.
    fn reply(&mut self, lent: &mut Lent<'_>, from: Port, buf: &mut PacketBuf) -> Classified {
        lent.stats.generated += 1;
        crate::fate::mark_replaced(buf, crate::fate::Fate::Consumed);
        Classified::Done(Ok(Next::Reply(from)))
    }
}

/// fe80::/10.
fn is_link_local(addr: Ipv6Addr) -> bool {
    addr.segments()[0] & 0xffc0 == 0xfe80
}

/// Puts an Ethernet header for IPv6 in front of the packet in `buf`.
fn frame(buf: &mut PacketBuf, to: EthernetAddress, from: EthernetAddress) -> Result<(), DropReason> {
    let header = buf
        .prepend(EthernetFrame::<&[u8]>::header_len())
        .ok_or(DropReason::NoBufferSpace)?;
    crate::icmp::write_ethernet(header, to, from, EthernetProtocol::Ipv6);
    Ok(())
}
