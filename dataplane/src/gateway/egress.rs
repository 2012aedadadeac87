//! Egress: what leaves by the gateway's two ports. The route and MTU
//! (read from the [`Addressing`] the front lends), IPv4 fragmentation
//! (RFC 791; IPv6 is never fragmented in transit, RFC 8200 §5: too big is
//! reported back for an error), Ethernet framing, next hops resolved by
//! ARP (RFC 826) or neighbour solicitation (RFC 4861) and the packets
//! parked meanwhile, answers to ARP, what NDP messages taught (handed on
//! by the front), and the next hop each SA's outer packets take.
//!
//! Owns the neighbour table and its queue and the cached hops; counts
//! what it transmits or drops through the [`Sink`] it is handed. Must not
//! classify, look at policies or SAs (it keys hops by SA id only), or
//! write ICMP errors: a packet too big for its link is handed back as
//! [`Routed::TooBig`].

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use smoltcp::wire::{ArpOperation, EthernetAddress, EthernetFrame, EthernetProtocol};
use spd_sad::SaId;

use super::addressing::Addressing;
use super::output::Sink;
use super::setup::{GatewaySetup, LinkLayer, LINK_LOCAL};
use crate::buffer::{PacketBuf, PacketPool};
use crate::fate::{self, Fate};
use crate::icmp;
use crate::icmp6;
use crate::neighbor::{Learnt, Neighbors, Queued, Sighting, Waiting};
use crate::route::{NextHop, Port};
use crate::stats::DropReason;
use crate::wire::{ipv4, ipv6};

/// Where an SA's outer packets go, resolved once and reused while nothing
/// it came from has changed, so that the route and neighbour lookups are
/// not per packet: Linux keeps the route in the xfrm bundle, VPP stacks a
/// tunnel on its adjacency. Routes and interfaces do not change during a
/// gateway's life; the neighbour table's version and the entry's expiry
/// say when to look again.
#[derive(Debug, Clone, Copy)]
struct CachedHop {
    sa: SaId,
    dst: Ipv4Addr,
    port: Port,
    mac: EthernetAddress,
    mtu: u16,
    neighbors: u64,
    until: Duration,
}

/// What became of a routed packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Routed {
    /// Framed for its next hop (or bare, on a raw-IP port): transmit it on
    /// this port.
    Send(Port),
    /// Parked for its next hop, or split into fragments already sent: the
    /// buffer is empty.
    Taken,
    /// It does not fit the next link's MTU and may not be fragmented (DF
    /// set, or IPv6): an ICMP error quoting this MTU is due.
    TooBig(u16),
}

/// The neighbours and what waits for them, and the SAs' cached hops.
pub(super) struct Egress {
    neighbors: Neighbors,
    /// Resolve next hops (off for captures: the zero MAC instead).
    resolve_neighbors: bool,
    /// Scratch for packets released or expired from the neighbour queue.
    waiting: Vec<Waiting>,
    /// Each SA's outer next hop, by SA slot.
    hops: Vec<Option<CachedHop>>,
}

impl Egress {
    pub(super) fn new(setup: &GatewaySetup) -> Egress {
        let mut neighbors = Neighbors::new(setup.neighbor_limits);
        for (addr, mac) in &setup.neighbors {
            neighbors.insert_static(*addr, *mac);
        }
        for iface in [&setup.inside, &setup.outside] {
            neighbors.add_on_link(iface.port, iface.network, Some(iface.address.into()));
            if let Some((address6, network6)) = iface.address6 {
                neighbors.add_on_link(iface.port, network6, Some(address6.into()));
                // Neighbours solicit and answer from link-local addresses
                // too (RFC 4861 §7.2.2).
                neighbors.add_on_link(iface.port, LINK_LOCAL, None);
            }
        }
        for route in setup.routes6.iter().filter(|r| r.via.is_none()) {
            neighbors.add_on_link(route.port, route.destination, None);
        }
        for route in setup.routes.iter().filter(|r| r.via.is_none()) {
            neighbors.add_on_link(route.port, route.destination, None);
        }
        Egress {
            neighbors,
            resolve_neighbors: setup.resolve_neighbors,
            waiting: Vec::with_capacity(64),
            hops: Vec::new(),
        }
    }

    #[inline]
    pub(super) fn neighbors(&self) -> &Neighbors {
        &self.neighbors
    }

    /// Sends an encapsulated packet of `sa` by the SA's cached next hop
    /// when it still holds and the packet fits its MTU (`None`: sent).
    /// Otherwise the packet comes back for the normal route, and the hop
    /// is remembered for the next one.
    #[inline]
    pub(super) fn send_protected(
        &mut self,
        addressing: &Addressing,
        sa: SaId,
        mut buf: PacketBuf,
        now: Duration,
        sink: &mut Sink<'_>,
    ) -> Option<PacketBuf> {
        // IPv6 outer headers take the normal route each time (no cached
        // hop: the cache is keyed by IPv4 next hops).
        if crate::wire::is_ipv6(buf.data()) {
            return Some(buf);
        }
        let Ok(dst) = ipv4::view(buf.data()).map(|ip| ip.dst_addr()) else {
            return Some(buf);
        };
        match self.hops.get(sa.slot()).copied().flatten() {
            Some(hop)
                if hop.sa == sa
                    && hop.dst == dst
                    && hop.neighbors == self.neighbors.version()
                    && now < hop.until
                    && buf.len() <= usize::from(hop.mtu) =>
            {
                if Self::frame(addressing, &mut buf, hop.mac, hop.port).is_ok() {
                    sink.send(buf, hop.port);
                    return None;
                }
            }
            _ => self.remember_hop(addressing, sa, dst, now),
        }
        Some(buf)
    }

    fn remember_hop(&mut self, addressing: &Addressing, sa: SaId, dst: Ipv4Addr, now: Duration) {
        let Some(hop) = addressing.hop(dst) else {
            return;
        };
        if addressing.link_of(hop.port) != LinkLayer::Ethernet {
            return;
        }
        let Some((mac, until)) = self.neighbors.entry(hop.port, hop.address, now) else {
            return;
        };
        let slot = sa.slot();
        if self.hops.len() <= slot {
            // Once per new SA slot, not per packet.
            self.hops.resize(slot + 1, None);
        }
        self.hops[slot] = Some(CachedHop {
            sa,
            dst,
            port: hop.port,
            mac,
            mtu: addressing.interface(hop.port).mtu,
            neighbors: self.neighbors.version(),
            until,
        });
    }

    /// Routes a packet: next hop, MTU, link-layer header.
    #[inline]
    pub(super) fn route(
        &mut self,
        addressing: &Addressing,
        buf: &mut PacketBuf,
        now: Duration,
        pool: &mut PacketPool,
        sink: &mut Sink<'_>,
    ) -> Result<Routed, DropReason> {
        if crate::wire::is_ipv6(buf.data()) {
            return self.route6(addressing, buf, now, pool, sink);
        }
        let ip = ipv4::view(buf.data())?;
        let (dst, dont_frag) = (ip.dst_addr(), ip.dont_frag());
        let hop = addressing.hop(dst).ok_or(DropReason::NoRoute)?;
        let mtu = addressing.interface(hop.port).mtu;
        if buf.len() > usize::from(mtu) {
            if dont_frag {
                // RFC 1812 §5.2.7.1 / RFC 1191: fragmentation needed.
                return Ok(Routed::TooBig(mtu));
            }
            return self
                .fragment(addressing, buf, hop, now, pool, sink)
                .map(|()| Routed::Taken);
        }
        self.send_to_neighbor(addressing, buf, (hop.port, hop.address.into()), now, pool, sink)
    }

    /// Routes an IPv6 packet (RFC 8200 §5: never fragmented here).
    #[inline]
    fn route6(
        &mut self,
        addressing: &Addressing,
        buf: &mut PacketBuf,
        now: Duration,
        pool: &mut PacketPool,
        sink: &mut Sink<'_>,
    ) -> Result<Routed, DropReason> {
        let dst = ipv6::view(buf.data())?.dst_addr();
        let hop = addressing.hop6(dst).ok_or(DropReason::NoRoute)?;
        let mtu = addressing.interface(hop.port).mtu;
        if buf.len() > usize::from(mtu) {
            return Ok(Routed::TooBig(mtu));
        }
        self.send_to_neighbor(addressing, buf, (hop.port, hop.address.into()), now, pool, sink)
    }

    /// Frames a routed packet for `next_hop` on `port`, or parks it while
    /// the next hop resolves; on a raw-IP port it goes as it is.
    #[inline]
    fn send_to_neighbor(
        &mut self,
        addressing: &Addressing,
        buf: &mut PacketBuf,
        (port, next_hop): (Port, IpAddr),
        now: Duration,
        pool: &mut PacketPool,
        sink: &mut Sink<'_>,
    ) -> Result<Routed, DropReason> {
        if addressing.link_of(port) == LinkLayer::RawIp {
            return Ok(Routed::Send(port));
        }
        let mac = match self.neighbors.lookup(port, next_hop, now) {
            Some(mac) => mac,
            // Offline there is no ARP: an unknown neighbour gets the zero MAC.
            None if !self.resolve_neighbors => EthernetAddress([0; 6]),
            None => {
                let parked = std::mem::replace(buf, PacketBuf::empty());
                match self.neighbors.park(next_hop, port, parked, now) {
                    Queued::Parked { request } => {
                        if request {
                            self.send_neighbor_request(addressing, next_hop, port, pool, sink);
                        }
                        return Ok(Routed::Taken);
                    }
                    Queued::Full(back) => {
                        *buf = back;
                        return Err(DropReason::NeighborQueueFull);
                    }
                }
            }
        };
        Self::frame(addressing, buf, mac, port)?;
        Ok(Routed::Send(port))
    }

    /// Splits an IPv4 packet larger than its link's MTU into fragments
    /// (RFC 791), each routed to `hop`; the first stays in `buf`, the
    /// others come from the driver's pool.
    fn fragment(
        &mut self,
        addressing: &Addressing,
        buf: &mut PacketBuf,
        hop: NextHop,
        now: Duration,
        pool: &mut PacketPool,
        sink: &mut Sink<'_>,
    ) -> Result<(), DropReason> {
        let (header_len, base_offset, more_after) = {
            let ip = ipv4::view(buf.data())?;
            (
                usize::from(ip.header_len()),
                usize::from(ip.frag_offset()),
                ip.more_frags(),
            )
        };
        let mtu = usize::from(addressing.interface(hop.port).mtu);
        let chunk = mtu.saturating_sub(header_len) / 8 * 8;
        let payload_len = buf.len() - header_len;
        if chunk == 0 {
            return Err(DropReason::FragNeeded);
        }
        let pieces = payload_len.div_ceil(chunk);
        let mut extra = Vec::with_capacity(pieces.saturating_sub(1));
        for i in 1..pieces {
            let Some(mut piece) = pool.alloc() else {
                for b in extra {
                    pool.free(b);
                }
                return Err(DropReason::NoBufferSpace);
            };
            // A fragment is the frame's as much as the first one is.
            piece.set_tag(buf.tag());
            piece.set_note(buf.note());
            let start = header_len + i * chunk;
            let end = (start + chunk).min(buf.len());
            let data = buf.data();
            let ok = piece.append(header_len + end - start).map(|room| {
                room[..header_len].copy_from_slice(&data[..header_len]);
                room[header_len..].copy_from_slice(&data[start..end]);
            });
            if ok.is_none() {
                pool.free(piece);
                return Err(DropReason::NoBufferSpace);
            }
            let total = piece.len() as u16;
            // The header is the datagram's, its total length still the
            // whole datagram's: rewritten here.
            let Ok(mut ip) = ipv4::header_mut(piece.data_mut()) else {
                pool.free(piece);
                return Err(DropReason::Malformed);
            };
            ip.set_total_len(total);
            ip.set_frag_offset((base_offset + i * chunk) as u16);
            ip.set_more_frags(i + 1 < pieces || more_after);
            ip.fill_checksum();
            extra.push(piece);
        }
        buf.truncate(header_len + chunk);
        let total = buf.len() as u16;
        let mut ip = ipv4::header_mut(buf.data_mut())?;
        ip.set_total_len(total);
        ip.set_more_frags(true);
        ip.fill_checksum();
        // Every fragment goes the same way; the first one below, the rest now.
        let link = addressing.link_of(hop.port);
        let mac = match link {
            LinkLayer::RawIp => None,
            LinkLayer::Ethernet => match self.neighbors.lookup(hop.port, hop.address, now) {
                Some(mac) => Some(mac),
                None if !self.resolve_neighbors => Some(EthernetAddress([0; 6])),
                None => None,
            },
        };
        let first = std::mem::replace(buf, PacketBuf::empty());
        for (i, piece) in std::iter::once(first).chain(extra).enumerate() {
            // The original packet became the first fragment: not generated.
            if i > 0 {
                sink.stats().generated += 1;
            }
            let mut piece = piece;
            match (link, mac) {
                (LinkLayer::RawIp, _) => sink.send(piece, hop.port),
                (LinkLayer::Ethernet, Some(mac)) => {
                    match Self::frame(addressing, &mut piece, mac, hop.port) {
                        Ok(()) => sink.send(piece, hop.port),
                        Err(reason) => sink.drop(piece, reason),
                    }
                }
                (LinkLayer::Ethernet, None) => match self.neighbors.park(hop.address, hop.port, piece, now) {
                    Queued::Parked { request } => {
                        if request {
                            self.send_neighbor_request(addressing, hop.address.into(), hop.port, pool, sink);
                        }
                    }
                    Queued::Full(back) => sink.drop(back, DropReason::NeighborQueueFull),
                },
            }
        }
        Ok(())
    }

    /// Puts the Ethernet header from `port`'s MAC to `dst_mac` in front of
    /// the packet in `buf`.
    #[inline]
    fn frame(
        addressing: &Addressing,
        buf: &mut PacketBuf,
        dst_mac: EthernetAddress,
        port: Port,
    ) -> Result<(), DropReason> {
        let src_mac = addressing.interface(port).mac;
        let ethertype = match crate::wire::is_ipv6(buf.data()) {
            true => EthernetProtocol::Ipv6,
            false => EthernetProtocol::Ipv4,
        };
        let header = buf
            .prepend(EthernetFrame::<&[u8]>::header_len())
            .ok_or(DropReason::NoBufferSpace)?;
        icmp::write_ethernet(header, dst_mac, src_mac, ethertype);
        Ok(())
    }

    /// Asks for the link-layer address of `target` on `port`: ARP for
    /// IPv4, a neighbour solicitation from our IPv6 address there for
    /// IPv6 (none without one: the packets waiting for it time out).
    fn send_neighbor_request(
        &mut self,
        addressing: &Addressing,
        target: IpAddr,
        port: Port,
        pool: &mut PacketPool,
        sink: &mut Sink<'_>,
    ) {
        let iface = addressing.interface(port);
        let Some(mut buf) = pool.alloc() else {
            // No buffer now; the request is repeated from handle_timeout.
            return;
        };
        let written = match target {
            IpAddr::V4(target) => icmp::arp_request(&mut buf, (iface.mac, iface.address), target),
            IpAddr::V6(target) => match iface.address6 {
                Some((our, _)) => icmp6::neighbor_solicit(&mut buf, (iface.mac, our), target),
                None => false,
            },
        };
        if written {
            sink.stats().generated += 1;
            sink.send(buf, port);
        } else {
            pool.free(buf);
        }
    }

    /// ARP (Ethernet only): answer requests for our addresses, learn
    /// senders as `Neighbors::learn_from` allows, release packets that
    /// waited for them. A request for our address from an off-link sender
    /// is answered but not learnt: a Linux peer asks from whichever of its
    /// addresses the packet it is sending has (`arp_announce = 0`), and
    /// would otherwise never reach us. Any other ARP from off-link senders
    /// is dropped unanswered.
    pub(super) fn handle_arp(
        &mut self,
        addressing: &Addressing,
        now: Duration,
        from: Port,
        mut buf: PacketBuf,
        arp: icmp::Arp,
        sink: &mut Sink<'_>,
    ) {
        let iface = addressing.interface(from);
        let (our_mac, our_ip) = (iface.mac, iface.address);
        let for_us = arp.target_ip == our_ip;
        match self.neighbors.learn_from(from, &arp, for_us, now) {
            Learnt::Updated | Learnt::Created => {
                self.release(addressing, arp.sender_ip.into(), arp.sender_mac, sink)
            }
            Learnt::OffLink if !(for_us && arp.operation == ArpOperation::Request) => {
                return sink.drop(buf, DropReason::ArpOffLink);
            }
            Learnt::OffLink => {}
            Learnt::TableFull => sink.stats().neighbor_table_full += 1,
            Learnt::Unsolicited => sink.stats().arp_unsolicited += 1,
            Learnt::Ignored => {}
        }
        sink.stats().local_delivered += 1;
        if for_us
            && addressing.answers_neighbors()
            && arp.operation == ArpOperation::Request
            && icmp::arp_reply_in_place(&mut buf, &arp, our_mac)
        {
            sink.stats().generated += 1;
            fate::mark_replaced(&mut buf, Fate::Consumed);
            sink.send(buf, from);
        } else {
            sink.consumed(buf);
        }
    }

    /// Applies the neighbour table's rules to what an NDP message said of
    /// `sender` (what ingress saw, handed on by the front), and sends what
    /// waited for it.
    pub(super) fn learn6(
        &mut self,
        addressing: &Addressing,
        from: Port,
        seen: Sighting,
        now: Duration,
        sink: &mut Sink<'_>,
    ) {
        let (sender, mac) = (seen.sender, seen.mac);
        match self.neighbors.learn(from, seen, now) {
            Learnt::Updated | Learnt::Created => self.release(addressing, sender, mac, sink),
            Learnt::TableFull => sink.stats().neighbor_table_full += 1,
            Learnt::Unsolicited => sink.stats().arp_unsolicited += 1,
            Learnt::OffLink | Learnt::Ignored => {}
        }
    }

    /// Sends what waited for `address`, now at `mac`.
    fn release(
        &mut self,
        addressing: &Addressing,
        address: IpAddr,
        mac: EthernetAddress,
        sink: &mut Sink<'_>,
    ) {
        if self.neighbors.pending() == 0 || !self.neighbors.is_pending(address) {
            return;
        }
        let mut ready = std::mem::take(&mut self.waiting);
        self.neighbors.release(address, &mut ready);
        for mut w in ready.drain(..) {
            match Self::frame(addressing, &mut w.buf, mac, w.port) {
                Ok(()) => sink.send(w.buf, w.port),
                Err(reason) => sink.drop(w.buf, reason),
            }
        }
        self.waiting = ready;
    }

    /// When a parked packet times out or a request is due again.
    #[inline]
    pub(super) fn deadline(&self) -> Option<Duration> {
        self.neighbors.next_deadline()
    }

    /// Drops packets whose next hop never answered, and repeats due
    /// requests.
    pub(super) fn handle_timeout(
        &mut self,
        addressing: &Addressing,
        now: Duration,
        pool: &mut PacketPool,
        sink: &mut Sink<'_>,
    ) {
        if self.neighbors.pending() == 0 {
            return;
        }
        let mut expired = std::mem::take(&mut self.waiting);
        let mut retry = Vec::new();
        self.neighbors.expire(now, &mut expired, &mut retry);
        for w in expired.drain(..) {
            sink.drop(w.buf, DropReason::NeighborUnreachable);
        }
        self.waiting = expired;
        for (hop, port) in retry {
            self.send_neighbor_request(addressing, hop, port, pool, sink);
        }
    }

    /// Stops: every parked packet is dropped.
    pub(super) fn shutdown(&mut self, sink: &mut Sink<'_>) {
        let mut parked = std::mem::take(&mut self.waiting);
        self.neighbors.drain(&mut parked);
        for w in parked.drain(..) {
            sink.drop(w.buf, DropReason::NeighborUnreachable);
        }
        self.waiting = parked;
    }
}
