//! The `xfrm` keying source: a mirror of the Linux XFRM SAD and SPD of a
//! *keying namespace*, where an unmodified IKE daemon (strongSwan,
//! libreswan) or `ip xfrm` installs them, translated into espgw's SAs and
//! policies.
//!
//! Owns the translation only, sans-IO like the control plane: it is fed
//! netlink datagrams as they came off a `NETLINK_XFRM` socket (dump
//! replies and multicast notifications) with the time, and answers with
//! [`SaCommand`](dataplane::command::SaCommand)s for every worker's gateway. It never
//! opens a socket, enters a namespace or touches a packet; the driver that
//! owns the socket is `espgw run`'s (`src/xfrm_source.rs`), and the
//! commands go through the same path as the control plane's, between
//! batches, so the fast path has no per-packet work.
//!
//! - [`decode`]: framing and parsing (the `netlink-packet-core` and
//!   `netlink-packet-xfrm` crates), with the length checks those crates
//!   leave to their caller, so that no datagram can make them panic.
//! - [`sa`] and [`policy`]: one XFRM state or policy to an espgw SA or
//!   policy, or a [`Refusal`] naming what espgw cannot do exactly.
//! - [`mirror`]: what is mirrored, make-before-break on a new SA of the
//!   same reqid, policies held (discarding) until their SA arrives, inbound
//!   SAs held until a policy gives them selectors, resynchronisation from
//!   a fresh dump.
//! - [`feedback`]: what espgw tells the kernel back for the daemon
//!   (counters, volume expiries, on-demand requests), as messages.
//! - [`relay`]: which UDP datagrams from the outside are the IKE daemon's,
//!   and which of the daemon's may leave.

pub mod decode;
pub mod feedback;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
pub mod mirror;
pub mod policy;
pub mod relay;
pub mod sa;

pub use decode::{decode_datagram, DecodeIssue, Decoded};
pub use mirror::{
    DumpKind, MirrorCounters, MirrorSettings, MirroredPolicyStatus, MirroredSaStatus, XfrmMirror,
};

/// Why an XFRM state or policy is not mirrored as it is. Each reason is a
/// counter in `espgw stats` under its snake-case name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum Refusal {
    /// An algorithm or combination espgw has no proposal for.
    Algorithm,
    /// Key lengths that do not match the algorithm.
    KeyLength,
    /// A 3DES key whose three parts are not independent (RFC 2451 §2.3),
    /// which espgw's sessions refuse.
    WeakKey,
    /// An SPI of 0 to 255, which RFC 4303 §2.1 reserves (the kernel takes
    /// one from `ip xfrm state add`; espgw's SAD does not).
    Spi,
    /// AH, IPComp or another protocol than ESP.
    Protocol,
    /// BEET or another mode than tunnel and transport.
    Mode,
    /// A UDP encapsulation espgw cannot do (not ESP-in-UDP, with
    /// transport mode, or with IPv6 outer addresses).
    Encapsulation,
    /// Neither end (or both) is this gateway's outside address, or the
    /// outer family is unknown.
    Addresses,
    /// A replay window larger than espgw's, or ESN without a window.
    ReplayWindow,
    /// A lifetime espgw does not count (seconds since first use).
    Lifetime,
    /// Marks, interface ids, output marks: routing espgw cannot express.
    Mark,
    /// A security context (SELinux labelled IPsec).
    SecurityContext,
    /// A care-of address (Mobile IPv6).
    CareOf,
    /// Traffic flow confidentiality padding.
    TfcPadding,
    /// An outbound SA that existed before this start, without a state
    /// directory to know which sequence numbers an earlier run used.
    PreExisting,
    /// A selector espgw cannot express exactly (an interface, a port
    /// mask that is not a range, ICMP types and codes).
    Selector,
    /// A policy template espgw cannot follow (AH, IPComp, a bundle of
    /// several, BEET).
    Template,
    /// A sub policy (`XFRMA_POLICY_TYPE` sub).
    PolicyType,
}

impl Refusal {
    /// The reason's snake-case name, as its counter and log lines show it.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// A refusal with what exactly was refused, for the log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", reason.name())]
pub struct Refused {
    /// Which kind of thing espgw cannot do.
    pub reason: Refusal,
    /// What exactly, with the values (an algorithm's name, a mode, an
    /// SPI), for the log line.
    pub detail: String,
}

impl Refused {
    pub(crate) fn new(reason: Refusal, detail: impl Into<String>) -> Refused {
        Refused {
            reason,
            detail: detail.into(),
        }
    }
}
