//! Neighbours: static entries from the configuration, entries learnt by ARP
//! (RFC 826) with expiry, and the bounded queue of packets waiting for a
//! next hop to resolve.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use smoltcp::wire::EthernetAddress;

use crate::buffer::PacketBuf;
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

/// A packet parked until its next hop answers ARP.
pub struct Waiting {
    pub next_hop: Ipv4Addr,
    pub port: Port,
    pub buf: PacketBuf,
    pub since: Duration,
}

/// What happened to a packet offered to the queue.
pub enum Queued {
    /// Parked; `request` says whether an ARP request should go out now.
    Parked { request: bool },
    /// The queue (or this next hop's share of it) is full: the packet is returned.
    Full(PacketBuf),
}

#[derive(Default)]
pub struct Neighbors {
    static_entries: HashMap<Ipv4Addr, EthernetAddress>,
    learnt: HashMap<Ipv4Addr, (EthernetAddress, Duration)>,
    pending: VecDeque<Waiting>,
    last_request: HashMap<Ipv4Addr, Duration>,
    /// Bumped by every change to an entry, so that what was derived from
    /// the table (a tunnel's cached next hop) knows when to look again.
    version: u64,
}

impl Neighbors {
    pub fn insert_static(&mut self, address: Ipv4Addr, mac: EthernetAddress) {
        self.version += 1;
        self.static_entries.insert(address, mac);
    }

    /// The MAC of `address` at time `now`, if known and not expired.
    pub fn lookup(&self, address: Ipv4Addr, now: Duration) -> Option<EthernetAddress> {
        self.entry(address, now).map(|(mac, _)| mac)
    }

    /// The MAC of `address` at time `now` and until when it holds (while
    /// [`version`](Self::version) stays the same).
    pub fn entry(&self, address: Ipv4Addr, now: Duration) -> Option<(EthernetAddress, Duration)> {
        if let Some(mac) = self.static_entries.get(&address) {
            return Some((*mac, Duration::MAX));
        }
        self.learnt
            .get(&address)
            .filter(|(_, expires)| *expires > now)
            .copied()
    }

    /// Changes with every change to an entry.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Records `address` at `mac` (static entries win).
    pub fn learn(&mut self, address: Ipv4Addr, mac: EthernetAddress, now: Duration) {
        if !self.static_entries.contains_key(&address) {
            self.version += 1;
            self.learnt.insert(address, (mac, now + REACHABLE_TIME));
        }
    }

    /// Parks a packet for `next_hop`.
    pub fn park(&mut self, next_hop: Ipv4Addr, port: Port, buf: PacketBuf, now: Duration) -> Queued {
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

    fn should_request(&mut self, next_hop: Ipv4Addr, now: Duration) -> bool {
        match self.last_request.get(&next_hop) {
            Some(last) if now.saturating_sub(*last) < REQUEST_INTERVAL => false,
            _ => {
                self.last_request.insert(next_hop, now);
                true
            }
        }
    }

    /// Takes the packets waiting for `address` (now resolved), oldest first.
    pub fn release(&mut self, address: Ipv4Addr, out: &mut Vec<Waiting>) {
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
    pub fn expire(&mut self, now: Duration, expired: &mut Vec<Waiting>, retry: &mut Vec<(Ipv4Addr, Port)>) {
        while self
            .pending
            .front()
            .is_some_and(|w| now.saturating_sub(w.since) >= RESOLVE_TIMEOUT)
        {
            if let Some(w) = self.pending.pop_front() {
                expired.push(w);
            }
        }
        let hops: Vec<(Ipv4Addr, Port)> = self.pending.iter().map(|w| (w.next_hop, w.port)).collect();
        for (hop, port) in hops {
            if !retry.iter().any(|(h, _)| *h == hop) && self.should_request(hop, now) {
                retry.push((hop, port));
            }
        }
        let before = self.learnt.len();
        self.learnt.retain(|_, (_, expires)| *expires > now);
        if self.learnt.len() != before {
            self.version += 1;
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

    pub fn is_pending(&self, address: Ipv4Addr) -> bool {
        self.pending.iter().any(|w| w.next_hop == address)
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes every parked packet (shutdown).
    pub fn drain(&mut self, out: &mut Vec<Waiting>) {
        out.extend(self.pending.drain(..));
    }
}
