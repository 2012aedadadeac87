//! Neighbours: static entries from the configuration, entries learnt by ARP
//! (RFC 826) or IPv6 neighbour discovery (RFC 4861) with expiry, and the
//! bounded queue of packets waiting for a next hop to resolve. Both
//! families share the table, the bounds and the queue; what turns a frame
//! into a `Sighting` is the caller's.
//!
//! Learning is what an ARP flood attacks, so it follows the kernel's
//! defaults rather than RFC 826's letter: a sender is learnt only if it is
//! on-link (inside the network of the interface it arrived on, or of a
//! direct route out of it); an existing entry is refreshed by any ARP from
//! its sender, but a new one is created only for a request addressed to us
//! or a reply to a request we sent (Linux with `arp_accept = 0`; with
//! several workers, to a request any of them may have sent); and each
//! interface holds at most [`NeighborLimits::max_learnt`] learnt entries.
//! A full table first forgets expired entries (at most once per
//! [`SWEEP_INTERVAL`], so a flood cannot make every frame walk it); a reply
//! to our own request then displaces the entry closest to expiry, since a
//! packet is waiting for it, while anything else is refused and counted.
//!
//! Builds and sends nothing: whether a request should go out is in what it
//! returns (`Queued`, `Neighbors::expire`'s retry list), and the
//! caller writes it (`icmp`, `icmp6`). Reads no clock: every time is the
//! caller's `now`.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use std::net::IpAddr;
use std::time::Duration;

use smoltcp::wire::{ArpOperation, EthernetAddress};
use spd_sad::IpPrefix;

use crate::buffer::PacketBuf;
use crate::icmp::Arp;
use crate::route::Port;

/// How long a learnt entry stays usable.
pub const REACHABLE_TIME: Duration = Duration::from_secs(300);
/// How long a packet may wait for its next hop to resolve.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);
/// ARP requests for one address are repeated at most this often.
pub const REQUEST_INTERVAL: Duration = Duration::from_secs(1);
/// Packets waiting for resolution, over all next hops.
pub const PENDING_MAX: usize = 256;
/// Packets waiting for one next hop.
pub const PENDING_PER_HOP: usize = 16;
/// Learnt entries per interface unless configured: Linux's `gc_thresh3`.
pub const DEFAULT_MAX_LEARNT: usize = 1024;
/// A full table looks for expired entries at most this often.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Bounds of the neighbour table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborLimits {
    /// Learnt (not static) entries per interface.
    pub max_learnt: usize,
    /// Other workers of the same gateway send ARP requests of their own
    /// and see the replies, which may answer one of theirs: a reply
    /// addressed to us then creates an entry even without a request of
    /// this table's (still on-link only and within the bound, and never
    /// displacing another entry). A lone gateway takes only replies to its
    /// own requests.
    pub replies_for_other_workers: bool,
}

impl Default for NeighborLimits {
    fn default() -> Self {
        NeighborLimits {
            max_learnt: DEFAULT_MAX_LEARNT,
            replies_for_other_workers: false,
        }
    }
}

/// What an ARP or NDP packet did to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Learnt {
    /// The sender's entry was refreshed (or is static).
    Updated,
    /// A new entry was made.
    Created,
    /// Nothing to learn: a request for someone else from a sender we do
    /// not know, a probe from 0.0.0.0 (RFC 5227), or a sender claiming one
    /// of our own addresses.
    Ignored,
    /// A reply from a sender we do not know that answers no request of ours.
    Unsolicited,
    /// The sender is not on-link for the interface.
    OffLink,
    /// The interface's table is full.
    TableFull,
}

/// What a neighbour's ARP or NDP packet says of it, for [`Neighbors::learn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sighting {
    /// The address it claims.
    pub(crate) sender: IpAddr,
    /// Its link-layer address, what the entry will map `sender` to.
    pub(crate) mac: EthernetAddress,
    /// An answer (ARP reply, NDP advertisement) rather than a question.
    pub(crate) is_reply: bool,
    /// Sent to us: asking for our address, or answering at our unicast
    /// address (ARP), or solicited (NDP's S flag).
    pub(crate) for_us: bool,
}

/// A packet parked until its next hop answers ARP or neighbour
/// solicitation.
pub(crate) struct Waiting {
    /// The address being resolved: the route's `via`, or the destination.
    pub(crate) next_hop: IpAddr,
    /// The side the packet leaves on once resolved.
    pub(crate) port: Port,
    /// The routed packet, not yet framed.
    pub(crate) buf: PacketBuf,
    /// When it was parked (the caller's clock); it waits at most
    /// [`RESOLVE_TIMEOUT`] from then.
    pub(crate) since: Duration,
}

/// What happened to a packet offered to the queue.
pub(crate) enum Queued {
    /// Parked; `request` says whether an ARP request should go out now.
    Parked { request: bool },
    /// The queue (or this next hop's share of it) is full: the packet is returned.
    Full(PacketBuf),
}

/// Entries learnt on one interface.
#[derive(Default)]
struct Table {
    entries: HashMap<IpAddr, (EthernetAddress, Duration)>,
    /// Networks whose hosts may be learnt here.
    on_link: Vec<IpPrefix>,
    /// Our own addresses on the interface, never learnt.
    own: Vec<IpAddr>,
    last_sweep: Option<Duration>,
}

/// The neighbour table of both ports: static entries, learnt entries
/// with their expiry, and the queue of packets waiting for resolution.
/// Times are the caller's `now`; the table never reads a clock.
#[derive(Default)]
pub struct Neighbors {
    static_entries: HashMap<IpAddr, EthernetAddress>,
    tables: [Table; 2],
    limits: NeighborLimits,
    pending: VecDeque<Waiting>,
    last_request: HashMap<IpAddr, Duration>,
    /// Bumped by every change to an entry, so that what was derived from
    /// the table (a tunnel's cached next hop) knows when to look again.
    version: u64,
}

impl Neighbors {
    /// An empty table with the given bounds.
    pub(crate) fn new(limits: NeighborLimits) -> Self {
        Neighbors {
            limits,
            ..Neighbors::default()
        }
    }

    /// Hosts of `network` may be learnt on `port`; `own` is our address
    /// there.
    pub(crate) fn add_on_link(&mut self, port: Port, network: impl Into<IpPrefix>, own: Option<IpAddr>) {
        let network = network.into();
        let table = &mut self.tables[port.index()];
        if !table.on_link.contains(&network) {
            table.on_link.push(network);
        }
        if let Some(own) = own.filter(|o| !table.own.contains(o)) {
            table.own.push(own);
        }
    }

    /// A configured entry: on either port, never expires, never displaced,
    /// and not counted against [`NeighborLimits::max_learnt`]; it wins
    /// over what ARP or NDP later say of `address`.
    pub(crate) fn insert_static(&mut self, address: impl Into<IpAddr>, mac: EthernetAddress) {
        self.version += 1;
        self.static_entries.insert(address.into(), mac);
    }

    /// The MAC of `address` on `port` at time `now`, if known and not
    /// expired.
    pub fn lookup(&self, port: Port, address: impl Into<IpAddr>, now: Duration) -> Option<EthernetAddress> {
        self.entry(port, address, now).map(|(mac, _)| mac)
    }

    /// The MAC of `address` on `port` at time `now` and until when it
    /// holds (while [`version`](Self::version) stays the same).
    pub fn entry(
        &self,
        port: Port,
        address: impl Into<IpAddr>,
        now: Duration,
    ) -> Option<(EthernetAddress, Duration)> {
        let address = address.into();
        if let Some(mac) = self.static_entries.get(&address) {
            return Some((*mac, Duration::MAX));
        }
        self.tables[port.index()]
            .entries
            .get(&address)
            .filter(|(_, expires)| *expires > now)
            .copied()
    }

    /// Changes with every change to an entry.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Learnt entries on `port`, expired ones not yet forgotten included.
    pub fn learnt(&self, port: Port) -> usize {
        self.tables[port.index()].entries.len()
    }

    /// Whether an ARP request for `address` went out and has not been
    /// answered yet.
    pub fn requested(&self, address: impl Into<IpAddr>) -> bool {
        self.last_request.contains_key(&address.into())
    }

    /// Applies the learning rules (see the module's doc) to an ARP packet
    /// that arrived on `port`; `for_us` says whether it targets our
    /// address there.
    pub(crate) fn learn_from(&mut self, port: Port, arp: &Arp, for_us: bool, now: Duration) -> Learnt {
        self.learn(
            port,
            Sighting {
                sender: IpAddr::V4(arp.sender_ip),
                mac: arp.sender_mac,
                is_reply: arp.operation == ArpOperation::Reply,
                for_us,
            },
            now,
        )
    }

    /// The learning rules for what a neighbour said of itself: ARP's
    /// sender, or an NDP solicitation's source link-layer address and an
    /// advertisement's target link-layer address (RFC 4861 §7.2.3, §7.2.5).
    pub(crate) fn learn(&mut self, port: Port, seen: Sighting, now: Duration) -> Learnt {
        let sender = seen.sender;
        let requested = self.requested(sender);
        let max = self.limits.max_learnt;
        let table = &mut self.tables[port.index()];
        if sender.is_unspecified() || table.own.contains(&sender) {
            return Learnt::Ignored;
        }
        let broadcast = matches!(sender, IpAddr::V4(v4) if v4.is_broadcast());
        if !table.on_link.iter().any(|n| n.contains(sender)) || broadcast || sender.is_multicast() {
            return Learnt::OffLink;
        }
        if self.static_entries.contains_key(&sender) {
            return Learnt::Updated;
        }
        if let Some(entry) = table.entries.get_mut(&sender) {
            *entry = (seen.mac, now + REACHABLE_TIME);
            self.version += 1;
            return Learnt::Updated;
        }
        let reply_for_us = seen.is_reply && seen.for_us;
        let answers_us = reply_for_us && requested;
        let answers_a_worker = reply_for_us && self.limits.replies_for_other_workers;
        if !(answers_us || answers_a_worker || !seen.is_reply && seen.for_us) {
            return if seen.is_reply {
                Learnt::Unsolicited
            } else {
                Learnt::Ignored
            };
        }
        if table.entries.len() >= max {
            table.sweep(now);
        }
        if table.entries.len() >= max {
            if !answers_us {
                return Learnt::TableFull;
            }
            // A packet waits for this answer: it displaces the entry that
            // would expire first.
            let oldest = table
                .entries
                .iter()
                .min_by_key(|(_, (_, expires))| *expires)
                .map(|(addr, _)| *addr);
            if let Some(addr) = oldest {
                table.entries.remove(&addr);
            }
        }
        table.entries.insert(sender, (seen.mac, now + REACHABLE_TIME));
        // Forgetting expired entries needs no bump (what was derived from
        // them expires with them); any other change does.
        self.version += 1;
        Learnt::Created
    }

    /// Parks a packet for `next_hop`.
    pub(crate) fn park(
        &mut self,
        next_hop: impl Into<IpAddr>,
        port: Port,
        buf: PacketBuf,
        now: Duration,
    ) -> Queued {
        let next_hop = next_hop.into();
        let for_hop = self.pending.iter().filter(|w| w.next_hop == next_hop).count();
        if self.pending.len() >= PENDING_MAX || for_hop >= PENDING_PER_HOP {
            return Queued::Full(buf);
        }
        self.pending.push_back(Waiting {
            next_hop,
            port,
            buf,
            since: now,
        });
        Queued::Parked {
            request: self.should_request(next_hop, now),
        }
    }

    fn should_request(&mut self, next_hop: IpAddr, now: Duration) -> bool {
        match self.last_request.get(&next_hop) {
            Some(last) if now.saturating_sub(*last) < REQUEST_INTERVAL => false,
            _ => {
                self.last_request.insert(next_hop, now);
                true
            }
        }
    }

    /// Takes the packets waiting for `address` (now resolved), oldest first.
    pub(crate) fn release(&mut self, address: IpAddr, out: &mut Vec<Waiting>) {
        let mut kept = VecDeque::with_capacity(self.pending.len());
        for waiting in self.pending.drain(..) {
            if waiting.next_hop == address {
                out.push(waiting);
            } else {
                kept.push_back(waiting);
            }
        }
        self.pending = kept;
        self.last_request.remove(&address);
    }

    /// Takes packets that waited longer than [`RESOLVE_TIMEOUT`], and lists
    /// next hops whose ARP request is due again.
    pub(crate) fn expire(
        &mut self,
        now: Duration,
        expired: &mut Vec<Waiting>,
        retry: &mut Vec<(IpAddr, Port)>,
    ) {
        while self
            .pending
            .front()
            .is_some_and(|w| now.saturating_sub(w.since) >= RESOLVE_TIMEOUT)
        {
            if let Some(w) = self.pending.pop_front() {
                expired.push(w);
            }
        }
        let hops: Vec<(IpAddr, Port)> = self.pending.iter().map(|w| (w.next_hop, w.port)).collect();
        for &(hop, port) in &hops {
            if !retry.iter().any(|(h, _)| *h == hop) && self.should_request(hop, now) {
                retry.push((hop, port));
            }
        }
        // Requests nobody waits for any more are forgotten, so that this
        // map stays as small as the queue (and an old request cannot make
        // a late reply look solicited).
        self.last_request
            .retain(|addr, _| hops.iter().any(|(h, _)| h == addr));
        for table in &mut self.tables {
            table.sweep(now);
        }
    }

    /// When a parked packet next needs attention: its ARP request repeated
    /// or its wait given up.
    pub fn next_deadline(&self) -> Option<Duration> {
        let oldest = self.pending.front()?;
        let retry = self
            .pending
            .iter()
            .filter_map(|w| self.last_request.get(&w.next_hop))
            .map(|last| *last + REQUEST_INTERVAL)
            .min();
        Some(retry.map_or(oldest.since + RESOLVE_TIMEOUT, |r| {
            r.min(oldest.since + RESOLVE_TIMEOUT)
        }))
    }

    /// Whether a packet is parked for the next hop `address`.
    pub fn is_pending(&self, address: impl Into<IpAddr>) -> bool {
        let address = address.into();
        self.pending.iter().any(|w| w.next_hop == address)
    }

    /// Packets parked, over all next hops (at most [`PENDING_MAX`]).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes every parked packet (shutdown).
    pub(crate) fn drain(&mut self, out: &mut Vec<Waiting>) {
        out.extend(self.pending.drain(..));
    }
}

impl Table {
    /// Forgets expired entries, at most once per [`SWEEP_INTERVAL`].
    fn sweep(&mut self, now: Duration) {
        if self
            .last_sweep
            .is_some_and(|last| now.saturating_sub(last) < SWEEP_INTERVAL)
        {
            return;
        }
        self.last_sweep = Some(now);
        self.entries.retain(|_, (_, expires)| *expires > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const OUR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    fn table(max_learnt: usize) -> Neighbors {
        let mut n = Neighbors::new(NeighborLimits {
            max_learnt,
            ..NeighborLimits::default()
        });
        n.add_on_link(
            Port::Outside,
            "10.0.0.0/16".parse::<spd_sad::Ipv4Prefix>().unwrap(),
            Some(OUR.into()),
        );
        n.add_on_link(
            Port::Outside,
            "203.0.113.0/24".parse::<spd_sad::Ipv4Prefix>().unwrap(),
            None,
        );
        n
    }

    fn arp(operation: ArpOperation, sender: Ipv4Addr, target: Ipv4Addr) -> Arp {
        let o = sender.octets();
        Arp {
            operation,
            sender_mac: EthernetAddress([2, 0, o[0], o[1], o[2], o[3]]),
            sender_ip: sender,
            target_ip: target,
        }
    }

    fn ip(c: u8, d: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, c, d)
    }

    #[test]
    fn learning_follows_the_kernel_and_stays_on_link() {
        let mut n = table(16);
        let now = Duration::ZERO;
        let port = Port::Outside;
        let request = |s| arp(ArpOperation::Request, s, OUR);
        let reply = |s| arp(ArpOperation::Reply, s, OUR);
        // Off-link senders, our own address, probes: nothing learnt.
        let off = Ipv4Addr::new(172, 16, 0, 9);
        assert_eq!(n.learn_from(port, &request(off), true, now), Learnt::OffLink);
        assert_eq!(
            n.learn_from(Port::Inside, &request(ip(0, 9)), true, now),
            Learnt::OffLink
        );
        assert_eq!(n.learn_from(port, &request(OUR), true, now), Learnt::Ignored);
        assert_eq!(
            n.learn_from(port, &request(Ipv4Addr::UNSPECIFIED), true, now),
            Learnt::Ignored
        );
        // A reply nobody asked for, a request for another host: not learnt.
        assert_eq!(
            n.learn_from(port, &reply(ip(0, 2)), true, now),
            Learnt::Unsolicited
        );
        let other = arp(ArpOperation::Request, ip(0, 3), ip(0, 4));
        assert_eq!(n.learn_from(port, &other, false, now), Learnt::Ignored);
        assert_eq!(n.learnt(port), 0);
        // A request for us creates; a direct route's network is on-link.
        assert_eq!(n.learn_from(port, &request(ip(0, 2)), true, now), Learnt::Created);
        let routed = Ipv4Addr::new(203, 0, 113, 5);
        assert_eq!(n.learn_from(port, &request(routed), true, now), Learnt::Created);
        // Then anything from the sender refreshes it, and only on its port.
        assert_eq!(n.learn_from(port, &other.clone(), false, now), Learnt::Ignored);
        let from_known = arp(ArpOperation::Request, ip(0, 2), ip(0, 4));
        assert_eq!(n.learn_from(port, &from_known, false, now), Learnt::Updated);
        assert!(n.lookup(port, ip(0, 2), now).is_some());
        assert!(n.lookup(Port::Inside, ip(0, 2), now).is_none());
        // A reply to a request we sent creates.
        assert!(matches!(
            n.park(ip(0, 7), port, PacketBuf::empty(), now),
            Queued::Parked { request: true }
        ));
        assert_eq!(n.learn_from(port, &reply(ip(0, 7)), true, now), Learnt::Created);
        assert_eq!(n.learnt(port), 3);
        // Entries expire.
        assert!(n.lookup(port, ip(0, 2), now + REACHABLE_TIME).is_none());
    }

    #[test]
    fn a_full_table_refuses_strangers_but_not_the_answer_we_wait_for() {
        let mut n = table(4);
        let port = Port::Outside;
        let t0 = Duration::from_secs(1);
        for d in 0..10 {
            let at = t0 + Duration::from_millis(u64::from(d));
            let learnt = n.learn_from(port, &arp(ArpOperation::Request, ip(1, d), OUR), true, at);
            assert_eq!(
                learnt,
                if d < 4 { Learnt::Created } else { Learnt::TableFull },
                "{d}"
            );
        }
        assert_eq!(n.learnt(port), 4);
        // Known senders are still refreshed.
        let t1 = t0 + Duration::from_secs(10);
        let known = arp(ArpOperation::Request, ip(1, 1), OUR);
        assert_eq!(n.learn_from(port, &known, true, t1), Learnt::Updated);
        // The next hop we asked for displaces the entry closest to expiry
        // (10.0.1.0: 10.0.1.1 was just refreshed).
        assert!(matches!(
            n.park(ip(0, 2), port, PacketBuf::empty(), t1),
            Queued::Parked { request: true }
        ));
        let answer = arp(ArpOperation::Reply, ip(0, 2), OUR);
        assert_eq!(n.learn_from(port, &answer, true, t1), Learnt::Created);
        assert_eq!(n.learnt(port), 4);
        assert!(n.lookup(port, ip(1, 0), t1).is_none());
        assert!(n.lookup(port, ip(1, 1), t1).is_some());
        // Once entries expire, a full table forgets them to make room.
        let later = t0 + REACHABLE_TIME + Duration::from_secs(1);
        let fresh = arp(ArpOperation::Request, ip(2, 0), OUR);
        assert_eq!(n.learn_from(port, &fresh, true, later), Learnt::Created);
        assert!(n.learnt(port) < 4);
        let mut out = Vec::new();
        n.drain(&mut out);
    }

    /// With several workers, a reply for us may answer another worker's
    /// request: it is learnt, but it displaces nobody.
    #[test]
    fn workers_learn_replies_to_each_others_requests() {
        let mut n = Neighbors::new(NeighborLimits {
            max_learnt: 2,
            replies_for_other_workers: true,
        });
        n.add_on_link(
            Port::Outside,
            "10.0.0.0/16".parse::<spd_sad::Ipv4Prefix>().unwrap(),
            Some(OUR.into()),
        );
        let port = Port::Outside;
        let now = Duration::ZERO;
        let reply = |s| arp(ArpOperation::Reply, s, OUR);
        assert_eq!(n.learn_from(port, &reply(ip(0, 2)), true, now), Learnt::Created);
        assert_eq!(n.learn_from(port, &reply(ip(0, 3)), true, now), Learnt::Created);
        assert_eq!(n.learn_from(port, &reply(ip(0, 4)), true, now), Learnt::TableFull);
        // Not for us: still unsolicited.
        let elsewhere = arp(ArpOperation::Reply, ip(0, 5), ip(0, 6));
        assert_eq!(n.learn_from(port, &elsewhere, false, now), Learnt::Unsolicited);
        assert_eq!(n.learnt(port), 2);
    }

    #[test]
    fn forgotten_requests_do_not_accumulate() {
        let mut n = table(4);
        let mut expired = Vec::new();
        let mut retry = Vec::new();
        for d in 0..50 {
            let _ = n.park(ip(3, d), Port::Outside, PacketBuf::empty(), Duration::ZERO);
        }
        n.expire(RESOLVE_TIMEOUT, &mut expired, &mut retry);
        assert_eq!(expired.len(), 50);
        assert_eq!(n.pending(), 0);
        assert!(!n.requested(ip(3, 0)), "a request nobody waits for is forgotten");
        // A late reply is then unsolicited.
        let late = arp(ArpOperation::Reply, ip(3, 0), OUR);
        assert_eq!(
            n.learn_from(Port::Outside, &late, true, RESOLVE_TIMEOUT),
            Learnt::Unsolicited
        );
    }
}
