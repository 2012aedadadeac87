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
//! Owns those decisions; must not write the packets (`icmp`, `icmp6`) or
//! route them (`forward`).

use std::net::IpAddr;

use spd_sad::{proto, Action, PolicyDirection, SaId};

use super::{Gateway, Next};
use crate::buffer::PacketBuf;
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
        let port = leaves_by.or_else(|| match flow.dst {
            IpAddr::V4(dst) => self.routes.lookup(dst).map(|hop| hop.port),
            IpAddr::V6(dst) => self.routes.lookup6(dst).map(|hop| hop.port),
        });
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
