//! The rules for packets the gateway itself writes or answers, as
//! functions of what the caller lends them: the outbound SPD's word on
//! its own packets, the source of an ICMP error that goes back through a
//! tunnel, the echo answered after decapsulation, DF cleared before
//! protection.
//!
//! The gateway's own packets (echo replies, ICMP errors) that would leave
//! by the outside, or have no route (a network behind a tunnel), are
//! outbound traffic like any other (RFC 4301 §4.4.1, §5.1): each is looked
//! up in the outbound SPD and protected by the SA a `protect` policy names,
//! sent in the clear by a `bypass` policy, or dropped by a `discard` one
//! (`policy_discard`) or for want of any (`no_policy`, the SPD's default).
//! One for the inside network, the protected side, crosses no IPsec
//! boundary and goes, as traffic forwarded from the outside to the inside
//! never meets the outbound SPD.
//!
//! A leaf: no state of its own, and it calls no stage, so ingress, ESP in
//! and the front all use it without a stage calling a stage.

use std::net::IpAddr;

use spd_sad::{proto, Action, PolicyDirection, SaId, Spd};

use super::addressing::Addressing;
use crate::buffer::PacketBuf;
use crate::fate::{self, Fate};
use crate::icmp;
use crate::icmp6;
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::{flow_key_any, ipv4, ipv6};

/// IP protocol number of ICMPv6.
pub(super) const ICMPV6: u8 = 58;

/// The outbound SPD's word on a packet the gateway wrote: `Some(sa)` to
/// protect it, `None` to send it in the clear, or why it is dropped.
/// `leaves_by` is the port it would leave by in the clear, when the caller
/// knows (a reply sent back where its request came from); otherwise the
/// route to its destination says. A packet for the inside network crosses
/// no IPsec boundary (RFC 4301 §5.1 is about protected-to-unprotected
/// traffic), as the gateway's forwarding from the outside to the inside
/// never consults the outbound SPD: it goes, whatever a policy whose
/// selectors also cover it says (a tunnel to 0.0.0.0/0 must not swallow
/// the replies to the hosts).
#[inline]
pub(super) fn local_policy(
    spd: &mut Spd,
    addressing: &Addressing,
    packet: &[u8],
    leaves_by: Option<Port>,
) -> Result<Option<SaId>, DropReason> {
    let flow = flow_key_any(packet)?;
    let port = leaves_by.or_else(|| addressing.port_toward(flow.dst));
    if port == Some(Port::Inside) {
        return Ok(None);
    }
    let decision = spd.lookup_cached(PolicyDirection::Out, &flow);
    match decision.action {
        Action::Protect(sa) => Ok(Some(sa)),
        Action::Bypass => Ok(None),
        Action::Discard if decision.policy.is_some() => Err(DropReason::PolicyDiscard),
        Action::Discard => Err(DropReason::NoPolicy),
    }
}

/// Whether an outbound `protect` policy covers ICMP (`protocol`) from
/// `src` to `dst`: an error to `dst` then comes from `src`, through the
/// tunnel.
pub(super) fn tunnels_from(spd: &mut Spd, src: IpAddr, dst: IpAddr, protocol: u8) -> bool {
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

/// A packet that arrived through an SA for one of our addresses: an echo
/// request becomes its reply, in place (`true`); anything else is left as
/// it is.
pub(super) fn answer_echo_after_decapsulation(buf: &mut PacketBuf, protocol: u8) -> bool {
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
            && icmpv6_checksum_ok(&buf.data()[at..], src, dst)
            && icmp6::echo_reply_in_place(buf)
    } else {
        protocol == proto::ICMP
            && ipv4::header_len(buf.data())
                .is_ok_and(|at| buf.data().get(at) == Some(&icmp::kind::ECHO_REQUEST))
            && icmp::echo_reply_in_place(buf)
    };
    if answered {
        fate::mark_replaced(buf, Fate::Consumed);
    }
    answered
}

/// Whether an ICMPv6 message's checksum is right (always, when fuzzing).
pub(super) fn icmpv6_checksum_ok(icmp: &[u8], src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr) -> bool {
    smoltcp::wire::Icmpv6Packet::new_checked(icmp)
        .is_ok_and(|p| cfg!(fuzzing) || p.verify_checksum(&src, &dst))
}

/// Clears DF on an IPv4 packet (its header checksum redone); IPv6 has none.
/// Our own packet, protected: one too large for the tunnel is fragmented
/// after encapsulation, never answered with an error to ourselves.
#[inline]
pub(super) fn clear_dont_fragment(buf: &mut PacketBuf) {
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
