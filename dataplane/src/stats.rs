//! Gateway counters. Drop reasons index a fixed array, so counting a drop
//! is one increment and never allocates.

use std::fmt;

use serde::{Deserialize, Serialize};
use spd_sad::ReplayError;
use strum::{EnumCount, EnumString, IntoStaticStr, VariantArray};

/// Why a packet was not forwarded. Every dropped packet is counted under
/// exactly one of these.
///
/// The list of reasons and their names are derived (strum): a new variant
/// is one line here, and every table, counter array and name follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, VariantArray, EnumCount, IntoStaticStr, EnumString)]
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
    /// reassembly slots (see `crate::reassembly`).
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
    /// on: neither answered nor learnt (see `crate::neighbor`).
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

    pub(crate) fn index(self) -> usize {
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

/// Drop counters, one per reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropCounters([u64; DropReason::COUNT]);

// Not derived: the standard library's `Default` stops at 32-element arrays.
impl Default for DropCounters {
    fn default() -> Self {
        DropCounters([0; DropReason::COUNT])
    }
}

impl DropCounters {
    pub fn count(&mut self, reason: DropReason) {
        self.0[reason.index()] += 1;
    }

    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[reason.index()]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub fn add(&mut self, other: &DropCounters) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            *mine += theirs;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(|&r| (r, self.get(r)))
    }
}

impl Serialize for DropCounters {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(DropReason::COUNT))?;
        for (reason, n) in self.iter() {
            map.serialize_entry(reason.name(), &n)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for DropCounters {
    /// The map [`Serialize`] writes. A name no reason has is an error (a
    /// document from another build, or a renamed reason), never skipped;
    /// a reason the map leaves out counts 0.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Counters;
        impl<'de> serde::de::Visitor<'de> for Counters {
            type Value = DropCounters;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from drop reason names to counts")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<DropCounters, A::Error> {
                let mut counters = DropCounters::default();
                while let Some((name, n)) = map.next_entry::<std::borrow::Cow<'de, str>, u64>()? {
                    let reason = DropReason::from_name(&name).ok_or_else(|| {
                        let names: Vec<&str> = DropReason::ALL.iter().map(|r| r.name()).collect();
                        serde::de::Error::custom(format!(
                            "unknown drop reason `{name}`; known: {}",
                            names.join(", ")
                        ))
                    })?;
                    counters.0[reason.index()] = n;
                }
                Ok(counters)
            }
        }
        deserializer.deserialize_map(Counters)
    }
}

/// Gateway-wide counters: what the daemon writes (`--stats`, `espgw
/// stats`) and what its readers parse back, so a renamed field fails to
/// parse instead of reading 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub encapsulated: u64,
    pub decapsulated: u64,
    pub bypassed: u64,
    /// Packets addressed to the gateway itself and consumed by it.
    pub local_delivered: u64,
    /// ESP dummy packets (next header 59, RFC 4303 §2.6), silently consumed.
    pub dummy_packets: u64,
    /// Frames the gateway originated: ARP requests and replies, ICMP echo
    /// replies and errors, extra fragments.
    pub generated: u64,
    /// Inbound fragments copied into a datagram being reassembled.
    pub fragments_absorbed: u64,
    /// Datagrams handed to the control plane (also in `local_delivered`).
    pub control_received: u64,
    /// Datagrams the control plane sent (also in `generated`).
    pub control_sent: u64,
    /// Inbound ESP packets held until the packets ahead of them on their
    /// SA finished, because their ESN high half depended on those (not a
    /// verdict: each is counted again when it is decided).
    pub esn_held: u64,
    /// Authenticated inbound ESP held until the state directory had made
    /// its sequence number durable (a peer that resumed above this end's
    /// ceiling after a restart); not a verdict either.
    pub seq_awaited: u64,
    /// ICMP errors (time exceeded, fragmentation needed) not sent because
    /// the gateway's or the source's token bucket was empty (RFC 1812
    /// §4.3.2.8). Not a verdict: the packet that caused each is counted
    /// under its own drop reason.
    pub icmp_rate_limited: u64,
    /// ARP senders not learnt because their interface's neighbour table
    /// was full (the frame itself was still answered or consumed).
    pub neighbor_table_full: u64,
    /// ARP replies from a sender with no entry that answered no request of
    /// ours: consumed, not learnt (as Linux does with `arp_accept = 0`).
    pub arp_unsolicited: u64,
    /// NAT keepalives (RFC 3948 §2.3) received, consumed (also in
    /// `local_delivered`), and sent (also in `generated`).
    pub nat_keepalives_received: u64,
    pub nat_keepalives_sent: u64,
    /// Times an authenticated UDP-encapsulated packet showed its peer at a
    /// new address or port, which the tunnel's SAs then sent to.
    pub nat_peer_moved: u64,
    pub drops: DropCounters,
}

impl Stats {
    /// Adds another worker's counters.
    pub fn add(&mut self, other: &Stats) {
        self.rx_packets += other.rx_packets;
        self.tx_packets += other.tx_packets;
        self.encapsulated += other.encapsulated;
        self.decapsulated += other.decapsulated;
        self.bypassed += other.bypassed;
        self.local_delivered += other.local_delivered;
        self.dummy_packets += other.dummy_packets;
        self.generated += other.generated;
        self.fragments_absorbed += other.fragments_absorbed;
        self.control_received += other.control_received;
        self.control_sent += other.control_sent;
        self.esn_held += other.esn_held;
        self.seq_awaited += other.seq_awaited;
        self.icmp_rate_limited += other.icmp_rate_limited;
        self.neighbor_table_full += other.neighbor_table_full;
        self.arp_unsolicited += other.arp_unsolicited;
        self.nat_keepalives_received += other.nat_keepalives_received;
        self.nat_keepalives_sent += other.nat_keepalives_sent;
        self.nat_peer_moved += other.nat_peer_moved;
        self.drops.add(&other.drops);
    }

    /// Every received packet is transmitted, consumed or dropped; every
    /// transmitted frame was received or generated.
    pub fn balanced(&self) -> bool {
        let (came, went) = self.balance();
        came == went
    }

    /// Both sides of [`balanced`](Self::balanced): frames received or
    /// generated, and frames transmitted, consumed or dropped.
    pub fn balance(&self) -> (u64, u64) {
        let came = self.rx_packets + self.generated;
        let went = self.tx_packets
            + self.local_delivered
            + self.dummy_packets
            + self.fragments_absorbed
            + self.drops.total();
        (came, went)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters are indexed by declaration order: `ALL` must follow it,
    /// and names must be unique for the stats JSON and verdict lines.
    #[test]
    fn every_reason_has_its_own_slot_and_name() {
        assert_eq!(DropReason::ALL.len(), DropReason::COUNT);
        for (i, reason) in DropReason::ALL.iter().copied().enumerate() {
            assert_eq!(reason.index(), i, "{reason}");
            assert_eq!(DropReason::from_name(reason.name()), Some(reason));
        }
        let mut counters = DropCounters::default();
        for &reason in DropReason::ALL {
            counters.count(reason);
        }
        assert!(counters.iter().all(|(_, n)| n == 1));
    }

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

    /// What the daemon writes, its readers parse back whole; a stale or
    /// misspelt reason is an error, not a 0.
    #[test]
    fn stats_round_trip_through_json() {
        let mut stats = Stats {
            rx_packets: 7,
            generated: 2,
            tx_packets: 5,
            nat_peer_moved: 1,
            ..Stats::default()
        };
        for (i, &reason) in DropReason::ALL.iter().enumerate() {
            for _ in 0..i % 3 {
                stats.drops.count(reason);
            }
        }
        let json = serde_json::to_value(stats).unwrap();
        assert_eq!(json["drops"]["auth_failed"], 1);
        assert_eq!(serde_json::from_value::<Stats>(json.clone()).unwrap(), stats);

        let mut renamed = json.clone();
        let drops = renamed["drops"].as_object_mut().unwrap();
        let n = drops.remove("auth_failed").unwrap();
        drops.insert("icv_failed".into(), n);
        let err = serde_json::from_value::<Stats>(renamed).unwrap_err().to_string();
        assert!(err.contains("unknown drop reason `icv_failed`"), "{err}");

        let mut missing = json;
        missing.as_object_mut().unwrap().remove("rx_packets");
        let err = serde_json::from_value::<Stats>(missing).unwrap_err().to_string();
        assert!(err.contains("rx_packets"), "{err}");
    }

    #[test]
    fn balance_counts_every_way_out() {
        let mut stats = Stats {
            rx_packets: 10,
            generated: 1,
            tx_packets: 6,
            local_delivered: 2,
            dummy_packets: 1,
            fragments_absorbed: 1,
            ..Stats::default()
        };
        assert_eq!(stats.balance(), (11, 10));
        assert!(!stats.balanced());
        stats.drops.count(DropReason::Malformed);
        assert!(stats.balanced());
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
