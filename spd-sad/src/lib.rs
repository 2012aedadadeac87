//! Security Policy and Security Association databases (RFC 4301 §4.4).
//!
//! Owns traffic selectors, the ordered SPD (protect / bypass / discard),
//! the SAD with per-SA sequence numbers, ESN anti-replay windows, lifetimes
//! and counters, and the one list of drop reasons ([`DropReason`]) that
//! both the per-SA counters and the gateway's (`dataplane::Stats`) count
//! under. Does no I/O, reads no clock (time is passed in as a
//! `Duration` since an epoch the caller chooses) and contains no
//! cryptography: an SA carries its crypto context as an opaque `C`.

#![warn(missing_docs, unreachable_pub)]

pub mod drop;
pub mod replay;
pub mod sad;
pub mod selector;
pub mod spd;

pub use drop::DropReason;
pub use replay::{ReplayError, ReplayWindow, MAX_WINDOW};
pub use sad::{
    inbound_owner, owner_worker, Lifetime, Limits, Mode, SaCounters, SaDirection, SaEvent, SaId, SaParams,
    SaShared, SaState, Sad, SadError, SecurityAssociation, SequenceError, SequenceState, UdpEncap,
    SA_DROP_REASONS, SA_STATE_BOUND, SEQUENCE_BLOCK, SEQUENCE_RESERVE, USAGE_BATCH,
};
pub use selector::{
    proto, Family, FlowKey, IpPrefix, Ipv4Prefix, Ipv6Prefix, PortRange, ProtocolSelector, Selector,
    SelectorError,
};
pub use spd::{Action, Decision, FlowCacheStats, Policy, PolicyDirection, Spd, FLOW_CACHE_ENTRIES};
