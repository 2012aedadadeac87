//! What espgw tells the kernel of the keying namespace, for the daemon
//! there to see what espgw does with its SAs. The daemon (strongSwan's
//! charon) listens only to the kernel, so these are requests to the kernel,
//! which updates its own copy of the SA and tells its listeners:
//!
//! - `XFRM_MSG_NEWAE` with `XFRMA_LTIME_VAL`: an SA's bytes, packets and
//!   last use, as `ip -s xfrm state` and the daemon's queries then show;
//! - `XFRM_MSG_EXPIRE`: a byte or packet limit passed in espgw (the kernel
//!   counts nothing, so it never would), soft to rekey, hard to delete;
//! - `XFRM_MSG_ACQUIRE`: a packet met an outbound policy with no SA yet
//!   (the daemon's trap), with the policy and its templates, so the kernel
//!   asks the daemon to negotiate one.
//!
//! Builds the messages as bytes, pure; the driver sends them and the
//! mirror decides when. Must not hold keys: nothing here carries any.

use std::net::IpAddr;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REPLACE, NLM_F_REQUEST};
use netlink_packet_xfrm::{
    constants::{AF_INET, AF_INET6, IPPROTO_ESP},
    monitor::{AcquireMessage, ExpireMessage, NewAsyncEventMessage},
    Address, AsyncEventId, Id, Lifetime, Selector, UserAcquire, UserExpire, UserPolicyInfo, UserSaId,
    UserSaInfo, UserTemplate, XfrmAttrs, XfrmMessage,
};
use spd_sad::FlowKey;

/// The kernel's name for one of its SAs: what NEWAE and EXPIRE look it up
/// by (destination, SPI, protocol, family), and what they report it as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSa {
    /// The SA's destination address (the receiving end's).
    pub daddr: IpAddr,
    /// Its source address (the sending end's).
    pub saddr: IpAddr,
    /// Its SPI.
    pub spi: u32,
    /// The request id it shares with its policies, which the daemon
    /// matches a report against.
    pub reqid: u32,
}

/// An SA's use as the kernel keeps it (`struct xfrm_lifetime_cur`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes the SA protected or verified, as espgw counted them.
    pub bytes: u64,
    /// Packets the SA carried.
    pub packets: u64,
    /// Seconds since the epoch: when the kernel added the SA (its time
    /// lifetimes count from here, so it must be given back unchanged).
    pub add_time: u64,
    /// Seconds since the epoch of the last packet; 0: never used.
    pub use_time: u64,
}

fn family(a: IpAddr) -> u16 {
    match a {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

fn append(message: XfrmMessage, flags: u16, sequence: u32, out: &mut Vec<u8>) {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = sequence;
    let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    m.finalize();
    let at = out.len();
    // Netlink messages in one datagram start at 4-byte boundaries; the
    // serialized length is already a multiple of 4.
    out.resize(at + m.buffer_len(), 0);
    m.serialize(&mut out[at..]);
}

/// Appends to `out` the NEWAE that sets `sa`'s counters to `usage`.
pub fn new_ae(sa: &KernelSa, usage: &Usage, sequence: u32, out: &mut Vec<u8>) {
    let id = AsyncEventId {
        sa_id: UserSaId {
            daddr: Address::from_ip(&sa.daddr),
            spi: sa.spi,
            family: family(sa.daddr),
            proto: IPPROTO_ESP,
        },
        saddr: Address::from_ip(&sa.saddr),
        flags: 0,
        reqid: sa.reqid,
    };
    let lifetime = Lifetime {
        bytes: usage.bytes,
        packets: usage.packets,
        add_time: usage.add_time,
        use_time: usage.use_time,
    };
    let message = XfrmMessage::NewAsyncEvent(NewAsyncEventMessage {
        id,
        nlas: vec![XfrmAttrs::LifetimeBytes(lifetime)],
    });
    // The kernel wants NEWAE marked as a replacement ("thou shalt sayeth
    // replaceth", xfrm_user.c).
    append(message, NLM_F_REQUEST | NLM_F_REPLACE, sequence, out);
}

/// Appends to `out` the EXPIRE for `sa`: soft (the daemon rekeys) or
/// hard (the kernel deletes it and the daemon follows).
pub fn expire(sa: &KernelSa, hard: bool, sequence: u32, out: &mut Vec<u8>) {
    let state = UserSaInfo {
        id: Id {
            daddr: Address::from_ip(&sa.daddr),
            spi: sa.spi,
            proto: IPPROTO_ESP,
        },
        saddr: Address::from_ip(&sa.saddr),
        reqid: sa.reqid,
        family: family(sa.daddr),
        ..UserSaInfo::default()
    };
    let message = XfrmMessage::Expire(ExpireMessage {
        expire: UserExpire {
            state,
            hard: u8::from(hard),
        },
    });
    append(message, NLM_F_REQUEST, sequence, out);
}

/// The selector of exactly one flow, as the kernel's own ACQUIRE carries
/// (`xfrm_init_tempsel`: whole addresses, the ports when there are).
fn flow_selector(flow: &FlowKey) -> Selector {
    let (prefix, fam) = match flow.dst {
        IpAddr::V4(_) => (32, AF_INET),
        IpAddr::V6(_) => (128, AF_INET6),
    };
    let (sport, dport, mask) = match flow.ports {
        Some((s, d)) => (s, d, u16::MAX),
        None => (0, 0, 0),
    };
    Selector {
        daddr: Address::from_ip(&flow.dst),
        saddr: Address::from_ip(&flow.src),
        dport,
        dport_mask: mask,
        sport,
        sport_mask: mask,
        family: fam,
        prefixlen_d: prefix,
        prefixlen_s: prefix,
        proto: flow.protocol,
        ifindex: 0,
        user: 0,
    }
}

/// Appends to `out` the ACQUIRE for a packet of `flow` that met outbound
/// `policy` (as the kernel reported it, index included) whose
/// `templates` have no SA. The kernel builds a larval state per template
/// and asks its key managers, as if the packet had been its own.
pub fn acquire(
    policy: &UserPolicyInfo,
    templates: &[UserTemplate],
    flow: &FlowKey,
    sequence: u32,
    out: &mut Vec<u8>,
) {
    let first = templates.first();
    let acquire = UserAcquire {
        id: first.map(|t| t.id).unwrap_or_default(),
        saddr: first.map(|t| t.saddr).unwrap_or_default(),
        selector: flow_selector(flow),
        policy: *policy,
        // Any algorithm: the daemon's proposal decides.
        aalgos: u32::MAX,
        ealgos: u32::MAX,
        calgos: u32::MAX,
        seq: sequence,
    };
    let message = XfrmMessage::Acquire(AcquireMessage {
        acquire,
        nlas: vec![XfrmAttrs::Template(templates.to_vec())],
    });
    append(message, NLM_F_REQUEST, sequence, out);
}

/// Why the broker refused a datagram of feedback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotFeedback {
    /// Not a run of whole netlink messages.
    #[error("not whole netlink messages (a length that runs past the datagram or is too short)")]
    Malformed,
    /// A message of another type (the type).
    #[error("message type {0}: only XFRM_MSG_NEWAE, XFRM_MSG_EXPIRE and XFRM_MSG_ACQUIRE are feedback")]
    Type(u16),
    /// A message without `NLM_F_REQUEST`, or with `NLM_F_DUMP`.
    #[error("a message that is not a request, or asks for a dump")]
    Flags,
    /// No message at all.
    #[error("an empty datagram")]
    Empty,
}

/// Whether `datagram` holds only what this module builds: whole netlink
/// requests of the three feedback types (counters, expiries, on-demand
/// requests), none a dump. The privileged broker sends nothing else to
/// the kernel for the forwarding process, so that a compromised one
/// cannot add, change or delete SAs or policies. Returns how many
/// messages it holds.
pub fn check_feedback(datagram: &[u8]) -> Result<u64, NotFeedback> {
    use netlink_packet_core::{NetlinkBuffer, NLM_F_DUMP};
    use netlink_packet_xfrm::constants::{XFRM_MSG_ACQUIRE, XFRM_MSG_EXPIRE, XFRM_MSG_NEWAE};
    let (mut at, mut count) = (0, 0);
    while at < datagram.len() {
        let buffer = NetlinkBuffer::new_checked(&datagram[at..]).map_err(|_| NotFeedback::Malformed)?;
        let length = buffer.length() as usize;
        let kind = buffer.message_type();
        if ![XFRM_MSG_NEWAE, XFRM_MSG_EXPIRE, XFRM_MSG_ACQUIRE].contains(&kind) {
            return Err(NotFeedback::Type(kind));
        }
        let flags = buffer.flags();
        if flags & NLM_F_REQUEST == 0 || flags & NLM_F_DUMP == NLM_F_DUMP {
            return Err(NotFeedback::Flags);
        }
        count += 1;
        // Messages are 4-byte aligned; the last may end unpadded.
        at = (at + length.div_ceil(4) * 4).min(datagram.len());
    }
    if count == 0 {
        return Err(NotFeedback::Empty);
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_xfrm::constants::{XFRM_MSG_ACQUIRE, XFRM_MSG_EXPIRE, XFRM_MSG_NEWAE};

    fn sa() -> KernelSa {
        KernelSa {
            daddr: "192.0.2.2".parse().unwrap(),
            saddr: "192.0.2.1".parse().unwrap(),
            spi: 0xc000_0001,
            reqid: 7,
        }
    }

    /// Parses `bytes` back as one netlink message: its type, flags and
    /// payload.
    fn parse(bytes: &[u8]) -> (u16, u16, XfrmMessage) {
        let m = NetlinkMessage::<XfrmMessage>::deserialize(bytes).expect("an XFRM netlink message");
        assert_eq!(
            m.header.length as usize,
            bytes.len(),
            "one message, the whole datagram"
        );
        let NetlinkPayload::InnerMessage(inner) = m.payload else {
            panic!("not an XFRM message: {:?}", m.payload)
        };
        (m.header.message_type, m.header.flags, inner)
    }

    #[test]
    fn new_ae_names_the_sa_and_carries_its_use() {
        let mut out = Vec::new();
        let usage = Usage {
            bytes: 123_456,
            packets: 789,
            add_time: 1_700_000_000,
            use_time: 1_700_000_042,
        };
        new_ae(&sa(), &usage, 9, &mut out);
        let (kind, flags, message) = parse(&out);
        assert_eq!(kind, XFRM_MSG_NEWAE);
        assert_eq!(
            flags & NLM_F_REPLACE,
            NLM_F_REPLACE,
            "the kernel refuses NEWAE without REPLACE"
        );
        let XfrmMessage::NewAsyncEvent(m) = message else {
            panic!("not NEWAE: {message:?}")
        };
        assert_eq!(m.id.sa_id.spi, 0xc000_0001);
        assert_eq!(m.id.sa_id.proto, IPPROTO_ESP);
        assert_eq!(m.id.sa_id.family, AF_INET);
        assert_eq!(
            m.id.sa_id.daddr.to_ipv4(),
            "192.0.2.2".parse::<std::net::Ipv4Addr>().unwrap()
        );
        assert_eq!(m.id.reqid, 7);
        assert_eq!(
            m.nlas,
            vec![XfrmAttrs::LifetimeBytes(Lifetime {
                bytes: 123_456,
                packets: 789,
                add_time: 1_700_000_000,
                use_time: 1_700_000_042
            })]
        );
    }

    #[test]
    fn expire_is_soft_or_hard_for_the_named_sa() {
        for hard in [false, true] {
            let mut out = Vec::new();
            expire(&sa(), hard, 3, &mut out);
            let (kind, _, message) = parse(&out);
            assert_eq!(kind, XFRM_MSG_EXPIRE);
            let XfrmMessage::Expire(m) = message else {
                panic!("not EXPIRE: {message:?}")
            };
            assert_eq!(m.expire.hard, u8::from(hard));
            assert_eq!(m.expire.state.id.spi, 0xc000_0001);
            assert_eq!(m.expire.state.id.proto, IPPROTO_ESP);
            assert_eq!(m.expire.state.family, AF_INET);
        }
    }

    #[test]
    fn acquire_carries_the_policy_its_templates_and_the_packets_flow() {
        let policy = UserPolicyInfo {
            index: 0x1f9,
            priority: 375_423,
            direction: 1,
            ..UserPolicyInfo::default()
        };
        let template = UserTemplate {
            id: Id {
                daddr: Address::from_ip(&"192.0.2.2".parse().unwrap()),
                spi: 0,
                proto: IPPROTO_ESP,
            },
            family: AF_INET,
            saddr: Address::from_ip(&"192.0.2.1".parse().unwrap()),
            reqid: 7,
            mode: 1,
            ..UserTemplate::default()
        };
        let flow = FlowKey {
            src: "10.1.0.5".parse().unwrap(),
            dst: "10.2.0.9".parse().unwrap(),
            protocol: 17,
            ports: Some((40000, 53)),
        };
        let mut out = Vec::new();
        acquire(&policy, &[template], &flow, 11, &mut out);
        let (kind, _, message) = parse(&out);
        assert_eq!(kind, XFRM_MSG_ACQUIRE);
        let XfrmMessage::Acquire(m) = message else {
            panic!("not ACQUIRE: {message:?}")
        };
        assert_eq!(m.acquire.policy.index, 0x1f9);
        assert_eq!(m.acquire.selector.prefixlen_d, 32);
        assert_eq!(m.acquire.selector.dport, 53);
        assert_eq!(m.acquire.selector.sport, 40000);
        assert_eq!(m.acquire.selector.proto, 17);
        assert_eq!(
            m.acquire.selector.saddr.to_ipv4(),
            "10.1.0.5".parse::<std::net::Ipv4Addr>().unwrap()
        );
        assert_eq!(m.nlas, vec![XfrmAttrs::Template(vec![template])]);
    }

    /// The broker's check: what this module builds passes, alone and
    /// packed; anything else the kernel would act on is refused, as are
    /// dumps, replies and broken lengths.
    #[test]
    fn only_feedback_passes_the_brokers_check() {
        use netlink_packet_xfrm::constants::{
            XFRM_MSG_DELSA, XFRM_MSG_FLUSHSA, XFRM_MSG_GETSA, XFRM_MSG_NEWPOLICY, XFRM_MSG_NEWSA,
            XFRM_MSG_UPDSA,
        };
        let mut out = Vec::new();
        new_ae(&sa(), &Usage::default(), 1, &mut out);
        expire(&sa(), true, 2, &mut out);
        assert_eq!(check_feedback(&out), Ok(2));
        let mut one = Vec::new();
        expire(&sa(), false, 3, &mut one);
        assert_eq!(check_feedback(&one), Ok(1));
        let forged = |kind: u16, flags: u16| {
            let mut m = one.clone();
            m[4..6].copy_from_slice(&kind.to_ne_bytes());
            m[6..8].copy_from_slice(&flags.to_ne_bytes());
            m
        };
        for kind in [
            XFRM_MSG_NEWSA,
            XFRM_MSG_UPDSA,
            XFRM_MSG_DELSA,
            XFRM_MSG_FLUSHSA,
            XFRM_MSG_NEWPOLICY,
            XFRM_MSG_GETSA,
        ] {
            assert_eq!(
                check_feedback(&forged(kind, NLM_F_REQUEST)),
                Err(NotFeedback::Type(kind))
            );
            // Hidden behind a good one, too.
            let mut packed = out.clone();
            packed.extend(forged(kind, NLM_F_REQUEST));
            assert_eq!(check_feedback(&packed), Err(NotFeedback::Type(kind)));
        }
        assert_eq!(
            check_feedback(&forged(XFRM_MSG_EXPIRE, NLM_F_REQUEST | 0x300)),
            Err(NotFeedback::Flags),
            "a dump"
        );
        assert_eq!(
            check_feedback(&forged(XFRM_MSG_EXPIRE, 0)),
            Err(NotFeedback::Flags)
        );
        assert_eq!(check_feedback(&one[..10]), Err(NotFeedback::Malformed));
        let mut long = one.clone();
        long[0..4].copy_from_slice(&(one.len() as u32 + 64).to_ne_bytes());
        assert_eq!(check_feedback(&long), Err(NotFeedback::Malformed));
        assert_eq!(check_feedback(&[]), Err(NotFeedback::Empty));
    }
}
