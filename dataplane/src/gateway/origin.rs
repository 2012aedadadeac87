//! The gateway's own packets and the SPD: echo replies and ICMP or ICMPv6
//! errors (time exceeded, fragmentation needed / packet too big, parameter
//! problem) that would leave by the outside, or have no route (a network
//! behind a tunnel), are outbound traffic like any other (RFC 4301
//! §4.4.1, §5.1), so each is looked up in the outbound SPD and protected
//! by the SA a `protect` policy names, sent in the clear by a `bypass`
//! policy, or dropped by a `discard` one (`policy_discard`) or for want of
//! any (`no_policy`, the SPD's default). One for the inside network, the
//! protected side, crosses no IPsec boundary and goes, as traffic
//! forwarded from the outside to the inside never meets the outbound SPD.
//!
//! Exempt, as Linux exempts an IKE daemon's sockets and its neighbour
//! discovery from the xfrm policy: ARP and IPv6 neighbour discovery, the
//! control plane's datagrams (`Gateway::send_datagram`: the rekey exchange
//! on UDP 500 or behind the non-ESP marker) and NAT keepalives.
//!
//! Also answers echo requests that arrive through an SA for one of our
//! addresses (the reply then takes the SPD, and so the SA back).
//!
//! The ICMP and ICMPv6 errors themselves are decided here too: whether
//! RFC 1812 §4.3.2.7 and RFC 4443 §2.4 allow one, the token buckets (RFC
//! 1812 §4.3.2.8, RFC 4443 §2.4 (f)) and the address they come from.
//!
//! Owns those decisions; must not write the packets (`icmp`, `icmp6`) or
//! route them (`egress`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use spd_sad::{proto, Action, PolicyDirection, SaId};

use super::{Gateway, Next};
use crate::buffer::PacketBuf;
use crate::fate::{self, Fate};
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::{flow_key_any, ipv4, ipv6};
use crate::{icmp, icmp6, Output};

/// IP protocol number of ICMPv6.
const ICMPV6: u8 = 58;

impl Gateway {
    /// Sends a packet the gateway wrote into `buf` (bare IPv4 or IPv6) as
    /// the outbound SPD says.
    pub(super) fn originate(&mut self, mut buf: PacketBuf, out: &mut Vec<Output>) {
        match self.local_policy(buf.data(), None) {
            Ok(Some(sa)) => {
                // Our own packet: one too large for the tunnel is
                // fragmented after encapsulation, never answered with an
                // error to ourselves.
                clear_dont_fragment(&mut buf);
                let now = self.last_now;
                self.start_encapsulation(now, sa, buf, out);
            }
            Ok(None) => self.emit(buf, Ok(Next::Route), out),
            Err(reason) => self.emit(buf, Err(reason), out),
        }
    }

    /// The outbound SPD's word on a packet the gateway wrote: `Some(sa)`
    /// to protect it, `None` to send it in the clear, or why it is
    /// dropped. `leaves_by` is the port it would leave by in the clear,
    /// when the caller knows (a reply sent back where its request came
    /// from); otherwise the route to its destination says. A packet for
    /// the inside network crosses no IPsec boundary (RFC 4301 §5.1 is
    /// about protected-to-unprotected traffic), as the gateway's forwarding
    /// from the outside to the inside never consults the outbound SPD:
    /// it goes, whatever a policy whose selectors also cover it says
    /// (a tunnel to 0.0.0.0/0 must not swallow the replies to the hosts).
    pub(super) fn local_policy(
        &mut self,
        packet: &[u8],
        leaves_by: Option<Port>,
    ) -> Result<Option<SaId>, DropReason> {
        let flow = flow_key_any(packet)?;
        let port = leaves_by.or_else(|| self.egress.port_toward(flow.dst));
        if port == Some(Port::Inside) {
            return Ok(None);
        }
        let decision = self.spd.lookup_cached(PolicyDirection::Out, &flow);
        match decision.action {
            Action::Protect(sa) => Ok(Some(sa)),
            Action::Bypass => Ok(None),
            Action::Discard if decision.policy.is_some() => Err(DropReason::PolicyDiscard),
            Action::Discard => Err(DropReason::NoPolicy),
        }
    }

    /// A packet that arrived through an SA for one of our addresses: an
    /// echo request becomes its reply, in place (`true`); anything else is
    /// left as it is.
    pub(super) fn answer_echo_after_decapsulation(&mut self, buf: &mut PacketBuf, protocol: u8) -> bool {
        let answered = if crate::wire::is_ipv6(buf.data()) {
            if protocol != ICMPV6 {
                return false;
            }
            let (src, dst, at) = {
                let data = buf.data();
                let (Ok(ip), Ok(upper)) = (ipv6::view(data), ipv6::upper_layer(data)) else {
                    return false;
                };
                (ip.src_addr(), ip.dst_addr(), upper.offset)
            };
            // What the rewrite handles: the ICMPv6 header right after the
            // fixed header, as for echo in the clear.
            at == ipv6::HEADER_LEN
                && buf.data().get(at) == Some(&icmp6::kind::ECHO_REQUEST)
                && super::classify6::icmpv6_checksum_ok(&buf.data()[at..], src, dst)
                && icmp6::echo_reply_in_place(buf)
        } else {
            protocol == proto::ICMP
                && ipv4::header_len(buf.data())
                    .is_ok_and(|at| buf.data().get(at) == Some(&icmp::kind::ECHO_REQUEST))
                && icmp::echo_reply_in_place(buf)
        };
        if answered {
            self.stats.generated += 1;
            crate::fate::mark_replaced(buf, crate::fate::Fate::Consumed);
        }
        answered
    }

    /// Turns the packet in `buf`, which dies here for `reason`, into an
    /// ICMP error back to its source, from our address `from`, if RFC 1812
    /// §4.3.2.7 allows one and both token buckets have a token (RFC 1812
    /// §4.3.2.8; otherwise counted as `icmp_rate_limited`). The packet is
    /// counted under `reason` either way; `Ok` means the error is to be
    /// sent (it takes the outbound SPD: `Next::Local`), `Err` that the
    /// packet is simply dropped.
    pub(super) fn icmp_error(
        &mut self,
        buf: &mut PacketBuf,
        (icmp_type, code, rest): (u8, u8, u32),
        from: Ipv4Addr,
        reason: DropReason,
    ) -> Result<Next, DropReason> {
        let to = icmp::may_answer_with_error(buf.data())
            .then(|| ipv4::view(buf.data()).map(|ip| ip.src_addr()).ok())
            .flatten();
        self.error_reply(buf, to.map(IpAddr::V4), reason, |buf| {
            icmp::error_in_place(buf, icmp_type, code, rest, from)
        })
    }

    /// [`icmp_error`](Self::icmp_error) for an IPv6 packet: an ICMPv6 error
    /// (RFC 4443) from our IPv6 address on the interface toward its source.
    pub(super) fn icmp6_error(
        &mut self,
        buf: &mut PacketBuf,
        (icmp_type, code, rest): (u8, u8, u32),
        reason: DropReason,
    ) -> Result<Next, DropReason> {
        // RFC 4443 §2.4 (e.3): packet too big, and a parameter problem
        // about an option whose bits ask for one even then (the caller
        // asks for code 2 to a group only then), may answer a packet to a
        // multicast group.
        let to_group_too = icmp_type == icmp6::kind::PACKET_TOO_BIG
            || (icmp_type == icmp6::kind::PARAM_PROBLEM && code == 2);
        let to = icmp6::may_answer_with_error(buf.data(), to_group_too)
            .then(|| ipv6::view(buf.data()).map(|ip| ip.src_addr()).ok())
            .flatten();
        let from = to.and_then(|to| self.address6_toward(to));
        let (Some(to), Some(from)) = (to, from) else {
            return Err(reason);
        };
        self.error_reply(buf, Some(IpAddr::V6(to)), reason, |buf| {
            icmp6::error_in_place(buf, icmp_type, code, rest, from)
        })
    }

    /// The source of an ICMP error to `to` (see `Egress::address_toward`).
    pub(super) fn address_toward(&mut self, to: Ipv4Addr) -> Ipv4Addr {
        let spd = &mut self.spd;
        self.egress
            .address_toward(to, |src, dst| tunnels_from(spd, src, dst, proto::ICMP))
    }

    /// The source of an ICMPv6 error to `to` (see `Egress::address6_toward`).
    pub(super) fn address6_toward(&mut self, to: Ipv6Addr) -> Option<Ipv6Addr> {
        let spd = &mut self.spd;
        self.egress
            .address6_toward(to, |src, dst| tunnels_from(spd, src, dst, ICMPV6))
    }

    /// What both families' errors share: the token buckets, the rewrite
    /// (`write`, `false` when the packet cannot be quoted) and the counts.
    fn error_reply(
        &mut self,
        buf: &mut PacketBuf,
        to: Option<IpAddr>,
        reason: DropReason,
        write: impl FnOnce(&mut PacketBuf) -> bool,
    ) -> Result<Next, DropReason> {
        let Some(to) = to else {
            return Err(reason);
        };
        // Never to ourselves: an error about our own packet (too large for
        // a link) just drops it.
        if self.is_local(to) {
            return Err(reason);
        }
        if !self.icmp_limiter.allow(to, self.last_now) {
            self.stats.icmp_rate_limited += 1;
            return Err(reason);
        }
        if !write(buf) {
            return Err(reason);
        }
        self.stats.drops.count(reason);
        self.stats.generated += 1;
        fate::mark_replaced(buf, Fate::Dropped(reason));
        Ok(Next::Local)
    }
}

/// Clears DF on an IPv4 packet (its header checksum redone); IPv6 has none.
fn clear_dont_fragment(buf: &mut PacketBuf) {
    if crate::wire::is_ipv6(buf.data()) {
        return;
    }
    if let Ok(mut ip) = ipv4::view_mut(buf.data_mut()) {
        if ip.dont_frag() {
            ip.set_dont_frag(false);
            ip.fill_checksum();
        }
    }
}

/// Whether an outbound `protect` policy covers ICMP (`protocol`) from
/// `src` to `dst`.
fn tunnels_from(spd: &mut spd_sad::Spd, src: IpAddr, dst: IpAddr, protocol: u8) -> bool {
    let flow = spd_sad::FlowKey {
        src,
        dst,
        protocol,
        ports: None,
    };
    matches!(
        spd.lookup_cached(PolicyDirection::Out, &flow).action,
        Action::Protect(_)
    )
}
