//! Why a packet was dropped: the one list of drop reasons, shared by the
//! gateway's counters (`dataplane::Stats`) and each SA's
//! ([`SaCounters`](crate::SaCounters)), with the names under which stats,
//! metrics and verdict lines publish them.
//!
//! Owns the reasons and their names only; counting them is the owners' of
//! the counters. Must not depend on anything of the packet path.

use std::fmt;

use serde::{Deserialize, Serialize};
use strum::{EnumCount, EnumString, IntoStaticStr, VariantArray};

use crate::replay::ReplayError;

/// Why a packet was not forwarded. Every dropped packet is counted under
/// exactly one of these.
///
/// The list of reasons and their names are derived (strum): a new variant
/// is one line here, and every table, counter array and name follows.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    VariantArray,
    EnumCount,
    IntoStaticStr,
    EnumString,
)]
#[strum(serialize_all = "snake_case")]
pub enum DropReason {
    /// No SPD entry matched (the default is discard, RFC 4301 §4.4.1).
    NoPolicy,
    /// A `discard` policy matched.
    PolicyDiscard,
    /// Inbound: the inner packet is not allowed through the SA it arrived
    /// on, or plaintext arrived that policy says must be protected.
    PolicyMismatch,
    /// Inbound ESP with an SPI (and destination) no SA has.
    UnknownSpi,
    /// The ICV did not verify.
    AuthFailed,
    /// Anti-replay (RFC 4303 §3.4.3): this sequence number was already
    /// received.
    ReplayDuplicate,
    /// Anti-replay: left of the window, too old to tell.
    ReplayTooOld,
    /// Sequence number 0, which no sender sends (RFC 4303 §3.3.3), or one
    /// that would lie before the start of the sequence space once the ESN
    /// high half is inferred.
    SeqZero,
    /// Failed a length, alignment, header, padding or next-header check.
    Malformed,
    /// The SA's hard lifetime is over.
    SaExpired,
    /// The SA has used up its sequence numbers (RFC 4303 §3.3.3).
    SeqOverflow,
    /// A sequence number beyond what the state directory has made durable
    /// for an SA with static keys (a reservation still being written, or
    /// one that failed): not sent, or, inbound, not accepted, so that no
    /// number is sent or accepted twice across a restart.
    SeqNotReserved,
    /// No route to the destination.
    NoRoute,
    /// TTL (IPv6: hop limit) would reach zero.
    TtlExpired,
    /// What this gateway does not carry: IPv6 on an interface without
    /// `address6`, ESP over IPv6, multicast groups it is not in, unknown
    /// EtherTypes.
    Unsupported,
    /// The crypto engine reported an error for the packet.
    EngineError,
    /// No buffer room to encapsulate (frame too large).
    NoBufferSpace,
    /// The engine stayed full; the packet could not be submitted.
    EngineBusy,
    /// The engine held the packet too long (stalled channel, lost
    /// completion), or gave it back because its server stopped answering.
    EngineTimeout,
    /// The next hop did not answer ARP or neighbour solicitation in time.
    NeighborUnreachable,
    /// Too many packets already wait for ARP.
    NeighborQueueFull,
    /// DF set (or IPv6) and the packet does not fit the next link's MTU,
    /// once protected for a tunnel (an ICMP fragmentation-needed or an
    /// ICMPv6 packet-too-big went back).
    FragNeeded,
    /// Inbound fragments that could not be reassembled (overlap, too large,
    /// too many in progress).
    ReassemblyFailed,
    /// Fragments of a datagram that never completed.
    ReassemblyTimeout,
    /// An inbound fragment to be reassembled here from a source that is
    /// the remote end of none of our SAs: only peers' fragments take
    /// reassembly slots (see `dataplane::reassembly`).
    FragmentNotFromPeer,
    /// A datagram being reassembled that gave way, its fragments dropped,
    /// when the table was full and a newer one came.
    ReassemblyEvicted,
    /// A datagram being reassembled that gave way to a newer one from the
    /// same source, which had as many in progress as one source may have.
    ReassemblySourceLimit,
    /// A unicast frame for another host's MAC address, seen because the
    /// driver's socket is promiscuous (live mode on a shared link).
    OtherHost,
    /// ARP from a sender outside the networks of the interface it arrived
    /// on: neither answered nor learnt (see `dataplane::neighbor`).
    ArpOffLink,
    /// ESP that came raw to a UDP-encapsulated SA, or inside UDP (RFC
    /// 3948) to a raw one or on another port than the SA's.
    EncapMismatch,
    /// Inbound ESP that reached a worker other than its SA's owner, which
    /// holds the SA's one replay window (the outside steering sends each
    /// SPI to its owner; see `drivers::steer`).
    NotOwner,
    /// Congestion experienced marked on the outer header of a tunnelled
    /// packet whose inner header is not ECN-capable: RFC 6040 §4.2 has the
    /// decapsulator drop it, the congestion signal it cannot pass on.
    EcnNotEct,
    /// IPv6: an option in a hop-by-hop or destination options header that
    /// this node does not recognise, whose type's two high bits say
    /// discard (RFC 8200 §4.2: 01, 10 and 11; with 10, and 11 to a
    /// unicast destination, an ICMPv6 parameter problem went back).
    Ipv6UnknownOption,
    /// IPv6: a routing header of a type this node does not implement with
    /// segments left (RFC 8200 §4.4; an ICMPv6 parameter problem went back).
    Ipv6UnknownRouting,
    /// UDP (ESP in UDP, RFC 3948) whose checksum is not zero and not right
    /// (RFC 768, RFC 1122 §4.1.3.4).
    UdpChecksum,
}

impl DropReason {
    /// Every reason, in declaration order (the order of the counters).
    pub const ALL: &'static [DropReason] = <DropReason as strum::VariantArray>::VARIANTS;
    /// How many reasons there are.
    pub const COUNT: usize = <DropReason as strum::EnumCount>::COUNT;

    /// The name used in stats output (the variant in snake case).
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The reason of the name [`name`](Self::name) gives.
    pub fn from_name(name: &str) -> Option<DropReason> {
        name.parse().ok()
    }

    /// Any of the anti-replay refusals.
    pub fn is_replay(self) -> bool {
        matches!(
            self,
            DropReason::ReplayDuplicate | DropReason::ReplayTooOld | DropReason::SeqZero
        )
    }

    /// Where this reason's counter sits in an array of [`COUNT`](Self::COUNT)
    /// counters: its position in [`ALL`](Self::ALL).
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl From<ReplayError> for DropReason {
    fn from(e: ReplayError) -> DropReason {
        match e {
            ReplayError::Duplicate(_) => DropReason::ReplayDuplicate,
            ReplayError::TooOld(_) => DropReason::ReplayTooOld,
            ReplayError::Invalid => DropReason::SeqZero,
        }
    }
}

impl Serialize for DropReason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl<'de> Deserialize<'de> for DropReason {
    /// The name [`Serialize`] writes; a name no reason has is an error.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        DropReason::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown drop reason `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the stats JSON's keys, which the CLI, the demo, the
    /// soak and scripts read: deriving them must not rename one. A new
    /// reason is added here too.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        let names: Vec<&str> = DropReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(
            names,
            [
                "no_policy",
                "policy_discard",
                "policy_mismatch",
                "unknown_spi",
                "auth_failed",
                "replay_duplicate",
                "replay_too_old",
                "seq_zero",
                "malformed",
                "sa_expired",
                "seq_overflow",
                "seq_not_reserved",
                "no_route",
                "ttl_expired",
                "unsupported",
                "engine_error",
                "no_buffer_space",
                "engine_busy",
                "engine_timeout",
                "neighbor_unreachable",
                "neighbor_queue_full",
                "frag_needed",
                "reassembly_failed",
                "reassembly_timeout",
                "fragment_not_from_peer",
                "reassembly_evicted",
                "reassembly_source_limit",
                "other_host",
                "arp_off_link",
                "encap_mismatch",
                "not_owner",
                "ecn_not_ect",
                "ipv6_unknown_option",
                "ipv6_unknown_routing",
                "udp_checksum",
            ]
        );
    }

    #[test]
    fn replay_errors_keep_their_kind() {
        assert_eq!(
            DropReason::from(ReplayError::Duplicate(5)),
            DropReason::ReplayDuplicate
        );
        assert_eq!(DropReason::from(ReplayError::TooOld(5)), DropReason::ReplayTooOld);
        assert_eq!(DropReason::from(ReplayError::Invalid), DropReason::SeqZero);
        assert!(DropReason::ALL.iter().filter(|r| r.is_replay()).count() == 3);
    }
}
