//! L2/L3 forwarding: routes, the MTU and IPv4 fragmentation (RFC 791),
//! Ethernet framing, ARP (RFC 826), the packets parked while a next hop
//! resolves, the rate-limited ICMP errors (RFC 1812 §4.3.2.8) and the next
//! hop each SA's outer packets take. Must not classify, touch SAs (it only
//! keys by their ids) or the engine.

use std::net::Ipv4Addr;
use std::time::Duration;

use smoltcp::wire::{ArpOperation, EthernetAddress, EthernetFrame, EthernetProtocol};

use spd_sad::SaId;

use super::{Gateway, LinkLayer, Next, Verdict};
use crate::buffer::PacketBuf;
use crate::fate::{self, Fate};
use crate::icmp;
use crate::neighbor::{Learnt, Neighbors, Queued};
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::ipv4;
use crate::Output;

/// Where an SA's outer packets go, resolved once and reused while nothing
/// it came from has changed, so that the route and neighbour lookups are
/// not per packet: Linux keeps the route in the xfrm bundle, VPP stacks a
/// tunnel on its adjacency. Routes and interfaces do not change during a
/// gateway's life; the neighbour table's version and the entry's expiry
/// say when to look again.
#[derive(Debug, Clone, Copy)]
pub(super) struct CachedHop {
    sa: SaId,
    dst: Ipv4Addr,
    port: Port,
    mac: EthernetAddress,
    mtu: u16,
    neighbors: u64,
    until: Duration,
}

impl Gateway {
    /// Sends an encapsulated packet of `sa` by the SA's cached next hop
    /// when it still holds and the packet fits its MTU; otherwise by the
    /// normal route (fragmentation, ARP and errors included), remembering
    /// the hop for the next packet.
    pub(super) fn emit_protected(&mut self, sa: SaId, mut buf: PacketBuf, out: &mut Vec<Output>) {
        let dst = match ipv4::view(buf.data()) {
            Ok(ip) => ip.dst_addr(),
            Err(reason) => return self.emit(buf, Err(reason), out),
        };
        match self.hops.get(sa.slot()).copied().flatten() {
            Some(hop)
                if hop.sa == sa
                    && hop.dst == dst
                    && hop.neighbors == self.neighbors.version()
                    && self.last_now < hop.until
                    && buf.len() <= usize::from(hop.mtu) =>
            {
                if self.frame(&mut buf, hop.mac, hop.port).is_ok() {
                    self.stats.tx_packets += 1;
                    out.push((buf, Verdict::Forward(hop.port)));
                    return;
                }
            }
            _ => self.remember_hop(sa, dst),
        }
        self.emit(buf, Ok(Next::Route), out);
    }

    fn remember_hop(&mut self, sa: SaId, dst: Ipv4Addr) {
        let Some(hop) = self.routes.lookup(dst) else {
            return;
        };
        if self.link_of(hop.port) != LinkLayer::Ethernet {
            return;
        }
        let Some((mac, until)) = self.neighbors.entry(hop.port, hop.address, self.last_now) else {
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
            mtu: self.interfaces[hop.port.index()].mtu,
            neighbors: self.neighbors.version(),
            until,
        });
    }

    /// Routes an IPv4 packet: next hop, MTU, link-layer header. `Ok(None)`
    /// when the buffer was parked waiting for ARP (it comes back later).
    pub(super) fn route(
        &mut self,
        buf: &mut PacketBuf,
        out: &mut Vec<Output>,
    ) -> Result<Option<Port>, DropReason> {
        let ip = ipv4::view(buf.data())?;
        let (dst, dont_frag) = (ip.dst_addr(), ip.dont_frag());
        let hop = self.routes.lookup(dst).ok_or(DropReason::NoRoute)?;
        let mtu = usize::from(self.interfaces[hop.port.index()].mtu);
        if buf.len() > mtu {
            if dont_frag {
                return Err(DropReason::FragNeeded);
            }
            return self.fragment(buf, mtu, hop, out).map(|()| None);
        }
        if self.link_of(hop.port) == LinkLayer::RawIp {
            return Ok(Some(hop.port));
        }
        let mac = match self.neighbors.lookup(hop.port, hop.address, self.last_now) {
            Some(mac) => mac,
            // Offline there is no ARP: an unknown neighbour gets the zero MAC.
            None if !self.resolve_neighbors => EthernetAddress([0; 6]),
            None => {
                let parked = std::mem::replace(buf, PacketBuf::empty());
                match self.neighbors.park(hop.address, hop.port, parked, self.last_now) {
                    Queued::Parked { request } => {
                        if request {
                            self.send_arp_request(hop.address, hop.port, out);
                        }
                        return Ok(None);
                    }
                    Queued::Full(back) => {
                        *buf = back;
                        return Err(DropReason::NeighborQueueFull);
                    }
                }
            }
        };
        self.frame(buf, mac, hop.port)?;
        Ok(Some(hop.port))
    }

    /// Splits an IPv4 packet larger than `mtu` into fragments (RFC 791),
    /// each routed to `hop`; the first stays in `buf`, the others come from
    /// the driver's pool.
    pub(super) fn fragment(
        &mut self,
        buf: &mut PacketBuf,
        mtu: usize,
        hop: crate::route::NextHop,
        out: &mut Vec<Output>,
    ) -> Result<(), DropReason> {
        let (header_len, base_offset, more_after) = {
            let ip = ipv4::view(buf.data())?;
            (
                usize::from(ip.header_len()),
                usize::from(ip.frag_offset()),
                ip.more_frags(),
            )
        };
        let chunk = mtu.saturating_sub(header_len) / 8 * 8;
        let payload_len = buf.len() - header_len;
        if chunk == 0 {
            return Err(DropReason::FragNeeded);
        }
        let pieces = payload_len.div_ceil(chunk);
        let mut extra = Vec::with_capacity(pieces.saturating_sub(1));
        for i in 1..pieces {
            let Some(mut piece) = self.pool.alloc() else {
                for b in extra {
                    self.pool.free(b);
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
                self.pool.free(piece);
                return Err(DropReason::NoBufferSpace);
            }
            let total = piece.len() as u16;
            // The header is the datagram's, its total length still the
            // whole datagram's: rewritten here.
            let Ok(mut ip) = ipv4::header_mut(piece.data_mut()) else {
                self.pool.free(piece);
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
        let link = self.link_of(hop.port);
        let mac = match link {
            LinkLayer::RawIp => None,
            LinkLayer::Ethernet => match self.neighbors.lookup(hop.port, hop.address, self.last_now) {
                Some(mac) => Some(mac),
                None if !self.resolve_neighbors => Some(EthernetAddress([0; 6])),
                None => None,
            },
        };
        let first = std::mem::replace(buf, PacketBuf::empty());
        for piece in std::iter::once(first).chain(extra) {
            self.stats.generated += 1;
            let mut piece = piece;
            match (link, mac) {
                (LinkLayer::RawIp, _) => {
                    self.stats.tx_packets += 1;
                    out.push((piece, Verdict::Forward(hop.port)));
                }
                (LinkLayer::Ethernet, Some(mac)) => match self.frame(&mut piece, mac, hop.port) {
                    Ok(()) => {
                        self.stats.tx_packets += 1;
                        out.push((piece, Verdict::Forward(hop.port)));
                    }
                    Err(reason) => {
                        self.stats.drops.count(reason);
                        out.push((piece, Verdict::Drop(reason)));
                    }
                },
                (LinkLayer::Ethernet, None) => {
                    match self.neighbors.park(hop.address, hop.port, piece, self.last_now) {
                        Queued::Parked { request } => {
                            if request {
                                self.send_arp_request(hop.address, hop.port, out);
                            }
                        }
                        Queued::Full(back) => {
                            self.stats.drops.count(DropReason::NeighborQueueFull);
                            out.push((back, Verdict::Drop(DropReason::NeighborQueueFull)));
                        }
                    }
                }
            }
        }
        // The original packet became the first fragment: not generated.
        self.stats.generated -= 1;
        Ok(())
    }

    pub(super) fn frame(
        &self,
        buf: &mut PacketBuf,
        dst_mac: EthernetAddress,
        port: Port,
    ) -> Result<(), DropReason> {
        let src_mac = self.interfaces[port.index()].mac;
        let header = buf
            .prepend(EthernetFrame::<&[u8]>::header_len())
            .ok_or(DropReason::NoBufferSpace)?;
        let mut frame = EthernetFrame::new_unchecked(header);
        frame.set_dst_addr(dst_mac);
        frame.set_src_addr(src_mac);
        frame.set_ethertype(EthernetProtocol::Ipv4);
        Ok(())
    }

    pub(super) fn send_arp_request(&mut self, target: Ipv4Addr, port: Port, out: &mut Vec<Output>) {
        let iface = &self.interfaces[port.index()];
        let (mac, addr) = (iface.mac, iface.address);
        let Some(mut buf) = self.pool.alloc() else {
            // No buffer now; the request is repeated from handle_timeout.
            return;
        };
        if icmp::arp_request(&mut buf, (mac, addr), target) {
            self.stats.generated += 1;
            self.stats.tx_packets += 1;
            out.push((buf, Verdict::Forward(port)));
        } else {
            self.pool.free(buf);
        }
    }

    /// ARP (Ethernet only): answer requests for our addresses, learn
    /// senders as `Neighbors::learn_from` allows, release packets that
    /// waited for them. ARP from off-link senders is dropped unanswered.
    pub(super) fn handle_arp(
        &mut self,
        now: Duration,
        from: Port,
        mut buf: PacketBuf,
        arp: icmp::Arp,
        out: &mut Vec<Output>,
    ) {
        let iface = &self.interfaces[from.index()];
        let (our_mac, our_ip) = (iface.mac, iface.address);
        let for_us = arp.target_ip == our_ip;
        match self.neighbors.learn_from(from, &arp, for_us, now) {
            Learnt::Updated | Learnt::Created => {
                if self.is_waited_for(arp.sender_ip) {
                    self.release(arp.sender_ip, arp.sender_mac, out);
                }
            }
            Learnt::OffLink => {
                self.stats.drops.count(DropReason::ArpOffLink);
                out.push((buf, Verdict::Drop(DropReason::ArpOffLink)));
                return;
            }
            Learnt::TableFull => self.stats.neighbor_table_full += 1,
            Learnt::Unsolicited => self.stats.arp_unsolicited += 1,
            Learnt::Ignored => {}
        }
        self.stats.local_delivered += 1;
        if for_us
            && self.setup.answer_arp
            && arp.operation == ArpOperation::Request
            && icmp::arp_reply_in_place(&mut buf, &arp, our_mac)
        {
            self.stats.generated += 1;
            self.stats.tx_packets += 1;
            fate::mark_replaced(&mut buf, Fate::Consumed);
            out.push((buf, Verdict::Forward(from)));
        } else {
            out.push((buf, Verdict::Consumed));
        }
    }

    /// The neighbour table (for reports and tests).
    pub fn neighbors(&self) -> &Neighbors {
        &self.neighbors
    }

    /// Turns the packet in `buf`, which dies here for `reason`, into an
    /// ICMP error back to its source, from our address `from`, if RFC 1812
    /// §4.3.2.7 allows one and both token buckets have a token (RFC 1812
    /// §4.3.2.8; otherwise counted as `icmp_rate_limited`). The packet is
    /// counted under `reason` either way; `Ok` means the error is to be
    /// routed, `Err` that the packet is simply dropped.
    pub(super) fn icmp_error(
        &mut self,
        buf: &mut PacketBuf,
        (icmp_type, code, rest): (u8, u8, u32),
        from: Ipv4Addr,
        reason: DropReason,
    ) -> Result<Next, DropReason> {
        if !icmp::may_answer_with_error(buf.data()) {
            return Err(reason);
        }
        let Ok(to) = ipv4::view(buf.data()).map(|ip| ip.src_addr()) else {
            return Err(reason);
        };
        if !self.icmp_limiter.allow(to, self.last_now) {
            self.stats.icmp_rate_limited += 1;
            return Err(reason);
        }
        if !icmp::error_in_place(buf, icmp_type, code, rest, from) {
            return Err(reason);
        }
        self.stats.drops.count(reason);
        self.stats.generated += 1;
        fate::mark_replaced(buf, Fate::Dropped(reason));
        Ok(Next::Route)
    }

    pub(super) fn is_waited_for(&self, address: Ipv4Addr) -> bool {
        self.neighbors.pending() > 0 && self.neighbors.is_pending(address)
    }

    pub(super) fn release(&mut self, address: Ipv4Addr, mac: EthernetAddress, out: &mut Vec<Output>) {
        let mut ready = std::mem::take(&mut self.waiting);
        self.neighbors.release(address, &mut ready);
        for mut w in ready.drain(..) {
            match self.frame(&mut w.buf, mac, w.port) {
                Ok(()) => {
                    self.stats.tx_packets += 1;
                    out.push((w.buf, Verdict::Forward(w.port)));
                }
                Err(reason) => {
                    self.stats.drops.count(reason);
                    out.push((w.buf, Verdict::Drop(reason)));
                }
            }
        }
        self.waiting = ready;
    }
}
