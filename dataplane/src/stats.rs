//! Gateway counters. Drop reasons index a fixed array, so counting a drop
//! is one increment and never allocates.

use std::fmt;

use serde::{Deserialize, Serialize};
/// The reasons live with the SAD, whose per-SA counters count them too;
/// re-exported here, where the gateway's counters and the dataplane's
/// users have always found them.
pub use spd_sad::DropReason;

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
    /// Counts one drop for `reason`.
    pub fn count(&mut self, reason: DropReason) {
        self.0[reason.index()] += 1;
    }

    /// Drops counted for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[reason.index()]
    }

    /// Drops counted for every reason together.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Adds another worker's counts, reason by reason.
    pub fn add(&mut self, other: &DropCounters) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            *mine += theirs;
        }
    }

    /// Each reason with its count, zeros included, in [`DropReason::ALL`]'s
    /// order.
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
    /// Frames received on every port, those a driver could not hand in
    /// included ([`Gateway::count_driver_drop`](crate::Gateway::count_driver_drop)).
    pub rx_packets: u64,
    /// Frames handed back to a driver to transmit, generated ones included.
    pub tx_packets: u64,
    /// Outbound packets the engine protected with ESP.
    pub encapsulated: u64,
    /// Inbound ESP packets authenticated and unwrapped.
    pub decapsulated: u64,
    /// Packets a bypass policy let through in the clear.
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
    /// NAT keepalives (RFC 3948 §2.3) received and consumed (also in
    /// `local_delivered`).
    pub nat_keepalives_received: u64,
    /// NAT keepalives sent to UDP-encapsulated peers (also in `generated`).
    pub nat_keepalives_sent: u64,
    /// Times an authenticated UDP-encapsulated packet showed its peer at a
    /// new address or port, which the tunnel's SAs then sent to.
    pub nat_peer_moved: u64,
    /// Frames dropped, by reason.
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
}
