//! One XFRM policy (`xfrm_userpolicy_info`, its templates) to an espgw
//! policy.
//!
//! Owns the mapping of directions, selectors, priorities, actions and
//! templates, and what is refused: a refused `protect` or `block` policy
//! still becomes a *discard* over its selector (widened where espgw
//! cannot express a part of it), so that its traffic is dropped rather
//! than sent in the clear or handed to another policy; a refused bypass
//! is not installed, so that its traffic meets the policies below it
//! (which may protect it, never let more of it out in the clear). Must
//! not resolve templates to SAs
//! ([`super::mirror`] does).

use std::net::IpAddr;

use netlink_packet_xfrm::{
    Selector as XfrmSelector, UserPolicyInfo, UserTemplate, XfrmAttrs, XFRM_MODE_TRANSPORT, XFRM_MODE_TUNNEL,
    XFRM_POLICY_ALLOW, XFRM_POLICY_BLOCK, XFRM_POLICY_FWD, XFRM_POLICY_IN, XFRM_POLICY_OUT,
    XFRM_POLICY_TYPE_MAIN,
};
use spd_sad::{
    IpPrefix, Ipv4Prefix, Ipv6Prefix, Mode, PolicyDirection, PortRange, ProtocolSelector, Selector,
};

use super::sa::{address, AF_INET, AF_INET6, IPPROTO_AH, IPPROTO_COMP, IPPROTO_ESP};
use super::{Refusal, Refused};

const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;

/// Where an XFRM policy is found: its direction and the index the kernel
/// gave it (kept by `XFRM_MSG_UPDPOLICY`, in every notification).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    /// `XFRM_POLICY_IN`, `XFRM_POLICY_OUT` or `XFRM_POLICY_FWD`.
    pub dir: u8,
    /// The kernel's index of the policy.
    pub index: u32,
}

impl PolicyKey {
    /// The name of the espgw policy mirroring it.
    pub fn name(self) -> String {
        let dir = match self.dir {
            XFRM_POLICY_IN => "in",
            XFRM_POLICY_OUT => "out",
            XFRM_POLICY_FWD => "fwd",
            _ => "dir?",
        };
        format!("xfrm-{dir}-{}", self.index)
    }
}

/// The one ESP template espgw follows: which SA protects the policy's
/// traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Template {
    /// 0: any SA of the addresses and mode.
    pub reqid: u32,
    /// The one SA to use (charon names the current outbound SA's SPI in
    /// its outbound template, and moves it on a rekey); `None`: the newest
    /// SA that satisfies the rest.
    pub spi: Option<u32>,
    /// The SA's mode.
    pub mode: Mode,
    /// The SA's outer destination (tunnel mode); `None` where the template
    /// leaves it to the packet (transport mode, or zero).
    pub daddr: Option<IpAddr>,
    /// The SA's outer source, likewise.
    pub saddr: Option<IpAddr>,
}

/// What a translated policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Protect with the SA the template names (`allow` with an ESP
    /// template).
    Protect(Template),
    /// Let the traffic pass in the clear (`allow` without a template).
    Bypass,
    /// Drop the traffic (`block`, or a refused `protect`).
    Discard,
}

/// An XFRM policy translated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslatedPolicy {
    /// Which kernel policy it is.
    pub key: PolicyKey,
    /// espgw's direction ([`direction`]).
    pub direction: PolicyDirection,
    /// The kernel's priority; lower is consulted first.
    pub priority: u32,
    /// What it selects.
    pub selector: Selector,
    /// What it does; [`Verdict::Discard`] when refused.
    pub verdict: Verdict,
    /// Set when the policy could not be followed exactly: it discards
    /// (over `selector`, widened where needed) and this says why.
    pub refused: Option<Refused>,
    /// The policy and its templates as the kernel reported them: an
    /// ACQUIRE names them back (see `feedback::acquire`).
    pub kernel: UserPolicyInfo,
    /// The templates as the kernel reported them.
    pub templates: Vec<UserTemplate>,
}

/// espgw's direction for an XFRM one: `fwd` (forwarded traffic, what a
/// gateway protects) and `in` (traffic to the keying host) both govern
/// what arrives from the outside.
pub fn direction(dir: u8) -> Option<PolicyDirection> {
    match dir {
        XFRM_POLICY_OUT => Some(PolicyDirection::Out),
        XFRM_POLICY_IN | XFRM_POLICY_FWD => Some(PolicyDirection::In),
        _ => None,
    }
}

/// A prefix of `family` from XFRM's address and length, host bits
/// cleared (the kernel compares under the mask).
fn prefix(family: u16, addr: &netlink_packet_xfrm::Address, len: u8) -> Option<IpPrefix> {
    match address(family, addr)? {
        IpAddr::V4(a) if len <= 32 => {
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len))
            };
            Ipv4Prefix::new((u32::from(a) & mask).into(), len).map(IpPrefix::V4)
        }
        IpAddr::V6(a) if len <= 128 => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            };
            Ipv6Prefix::new((a.to_bits() & mask).into(), len).map(IpPrefix::V6)
        }
        _ => None,
    }
}

/// A port and mask as a range: a mask of leading ones is the range of
/// ports sharing those bits; any other mask is no range.
fn ports(port: u16, mask: u16) -> Option<PortRange> {
    if mask.leading_ones() + mask.trailing_zeros() != 16 && mask != 0 {
        return None;
    }
    Some(PortRange {
        first: port & mask,
        last: port | !mask,
    })
}

/// espgw's selector for an XFRM one, and why it had to be widened (then
/// it is only good for a discard).
pub fn selector(sel: &XfrmSelector) -> Result<(Selector, Option<String>), Refused> {
    let family = sel.family;
    let (src, dst) = match family {
        AF_INET | AF_INET6 => (
            prefix(family, &sel.saddr, sel.prefixlen_s),
            prefix(family, &sel.daddr, sel.prefixlen_d),
        ),
        // No family: the kernel matches any packet with it (both lengths
        // zero), as `ip xfrm policy` writes a selector without addresses.
        0 if sel.prefixlen_s == 0 && sel.prefixlen_d == 0 => (Some(IpPrefix::Any), Some(IpPrefix::Any)),
        _ => (None, None),
    };
    let (Some(src), Some(dst)) = (src, dst) else {
        return Err(Refused::new(
            Refusal::Selector,
            format!(
                "addresses of family {family} with prefix lengths {}/{}",
                sel.prefixlen_s, sel.prefixlen_d
            ),
        ));
    };
    let mut widened = Vec::new();
    if sel.ifindex != 0 {
        widened.push(format!("interface {}", sel.ifindex));
    }
    let icmp = matches!(sel.proto, IPPROTO_ICMP | IPPROTO_ICMPV6);
    let (src_ports, dst_ports) = if icmp && (sel.sport_mask != 0 || sel.dport_mask != 0) {
        widened.push(format!("ICMP type {} code {}", sel.sport, sel.dport));
        (PortRange::ANY, PortRange::ANY)
    } else {
        let s = ports(sel.sport, sel.sport_mask);
        let d = ports(sel.dport, sel.dport_mask);
        if s.is_none() {
            widened.push(format!("source port {} mask 0x{:04x}", sel.sport, sel.sport_mask));
        }
        if d.is_none() {
            widened.push(format!(
                "destination port {} mask 0x{:04x}",
                sel.dport, sel.dport_mask
            ));
        }
        (s.unwrap_or(PortRange::ANY), d.unwrap_or(PortRange::ANY))
    };
    let selector = Selector {
        src,
        dst,
        protocol: match sel.proto {
            0 => ProtocolSelector::Any,
            n => ProtocolSelector::Number(n),
        },
        src_ports,
        dst_ports,
    };
    Ok((selector, (!widened.is_empty()).then(|| widened.join(", "))))
}

/// The template espgw follows, or why it cannot.
fn template(templates: &[UserTemplate]) -> Result<Template, Refused> {
    let [t] = templates else {
        let protocols: Vec<String> = templates.iter().map(|t| t.id.proto.to_string()).collect();
        return Err(Refused::new(
            Refusal::Template,
            format!(
                "a bundle of {} templates (protocols {}); espgw applies one ESP SA",
                templates.len(),
                protocols.join(", ")
            ),
        ));
    };
    match t.id.proto {
        IPPROTO_ESP => {}
        IPPROTO_AH => return Err(Refused::new(Refusal::Template, "an AH template")),
        IPPROTO_COMP => return Err(Refused::new(Refusal::Template, "an IPComp template")),
        other => {
            return Err(Refused::new(
                Refusal::Template,
                format!("a template of protocol {other}"),
            ))
        }
    }
    let mode = match t.mode {
        XFRM_MODE_TUNNEL => Mode::Tunnel,
        XFRM_MODE_TRANSPORT => Mode::Transport,
        other => {
            return Err(Refused::new(
                Refusal::Template,
                format!("a template of mode {other}"),
            ))
        }
    };
    let nonzero = |a: Option<IpAddr>| a.filter(|a| !a.is_unspecified());
    Ok(Template {
        reqid: t.reqid,
        spi: (t.id.spi != 0).then_some(t.id.spi),
        mode,
        daddr: nonzero(address(t.family, &t.id.daddr)),
        saddr: nonzero(address(t.family, &t.saddr)),
    })
}

/// Translates a policy from `XFRM_MSG_NEWPOLICY`/`UPDPOLICY` (or the
/// `XFRMA_POLICY` of a `DELPOLICY`). `None` for a direction espgw has no
/// counterpart of (socket policies never reach a dump).
pub fn translate(info: &UserPolicyInfo, attrs: &[XfrmAttrs]) -> Result<Option<TranslatedPolicy>, Refused> {
    let Some(direction) = direction(info.direction) else {
        return Ok(None);
    };
    let key = PolicyKey {
        dir: info.direction,
        index: info.index,
    };
    let (selector, widened) = selector(&info.selector)?;
    let mut refused = widened.map(|w| Refused::new(Refusal::Selector, w));
    let mut templates: &[UserTemplate] = &[];
    for attr in attrs {
        let problem = match attr {
            XfrmAttrs::Template(t) => {
                templates = t;
                None
            }
            XfrmAttrs::PolicyType(t) if t.ptype != XFRM_POLICY_TYPE_MAIN => {
                Some(Refused::new(Refusal::PolicyType, "a sub policy"))
            }
            XfrmAttrs::Mark(m) if m.mask != 0 => Some(Refused::new(
                Refusal::Mark,
                format!("mark 0x{:x}/0x{:x}", m.value, m.mask),
            )),
            XfrmAttrs::IfId(id) if *id != 0 => {
                Some(Refused::new(Refusal::Mark, format!("XFRM interface id {id}")))
            }
            XfrmAttrs::SecurityContext(_) => {
                Some(Refused::new(Refusal::SecurityContext, "a security context"))
            }
            _ => None,
        };
        if refused.is_none() {
            refused = problem;
        }
    }
    let verdict = match (info.action, templates.is_empty()) {
        (XFRM_POLICY_BLOCK, _) => Verdict::Discard,
        (XFRM_POLICY_ALLOW, true) => Verdict::Bypass,
        (XFRM_POLICY_ALLOW, false) => match template(templates) {
            Ok(t) => Verdict::Protect(t),
            Err(e) => {
                refused.get_or_insert(e);
                Verdict::Discard
            }
        },
        (other, _) => {
            refused.get_or_insert(Refused::new(Refusal::Template, format!("policy action {other}")));
            Verdict::Discard
        }
    };
    // A bypass espgw cannot hold exactly is not installed at all: its
    // traffic then meets the policies below it, which protect or discard
    // it at worst (never a leak), whereas a discard in its place would
    // drop what they protect (libreswan's neighbour-discovery bypasses
    // of ICMPv6 types 135 and 136 would discard all ICMPv6, ping and
    // Packet Too Big through every IPv6 tunnel included). A wider bypass
    // would let traffic out in the clear, so it is never one.
    if let (Some(refused), Verdict::Bypass) = (&refused, verdict) {
        return Err(Refused::new(
            refused.reason,
            format!(
                "{} on a bypass policy, which is not installed: its traffic meets the policies below it",
                refused.detail
            ),
        ));
    }
    Ok(Some(TranslatedPolicy {
        key,
        direction,
        priority: info.priority,
        selector,
        // A refused policy discards whatever it was meant to do.
        verdict: if refused.is_some() {
            Verdict::Discard
        } else {
            verdict
        },
        refused,
        kernel: *info,
        templates: templates.to_vec(),
    }))
}
