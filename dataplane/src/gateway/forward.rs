//! L2/L3 forwarding: routes of both families, the MTU and IPv4
//! fragmentation (RFC 791; IPv6 is never fragmented in transit, RFC 8200
//! §5: too big is a packet-too-big error), Ethernet framing, next hops
//! resolved by ARP (RFC 826) or neighbour solicitation (RFC 4861), the
//! packets parked meanwhile, the rate-limited ICMP and ICMPv6 errors (RFC
//! 1812 §4.3.2.8, RFC 4443 §2.4 (f); they leave through `origin`'s SPD
//! lookup) and the next hop each SA's outer
//! packets take. Must not classify, touch SAs (it only
//! keys by their ids) or the engine.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use smoltcp::wire::{ArpOperation, EthernetAddress, EthernetFrame, EthernetProtocol};

use spd_sad::SaId;

use super::{Gateway, LinkLayer, Next, Verdict};
use crate::buffer::PacketBuf;
use crate::fate::{self, Fate};
use crate::icmp;
use crate::icmp6;
use crate::neighbor::{Learnt, Neighbors, Queued};
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::{ipv4, ipv6};
use crate::Output;

/// IP protocol number of ICMPv6.
const ICMPV6: u8 = 58;

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
        // IPv6 outer headers take the normal route each time (no cached
        // hop: the cache is keyed by IPv4 next hops).
        if crate::wire::is_ipv6(buf.data()) {
            return self.emit(buf, Ok(Next::Route), out);
        }
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

    /// Routes a packet: next hop, MTU, link-layer header. `Ok(None)`
    /// when the buffer was parked waiting for its next hop to resolve (it
    /// comes back later).
    pub(super) fn route(
        &mut self,
        buf: &mut PacketBuf,
        out: &mut Vec<Output>,
    ) -> Result<Option<Port>, DropReason> {
        if crate::wire::is_ipv6(buf.data()) {
            return self.route6(buf, out);
        }
        let ip = ipv4::view(buf.data())?;
        let (dst, dont_frag) = (ip.dst_addr(), ip.dont_frag());
        let hop = self.routes.lookup(dst).ok_or(DropReason::NoRoute)?;
        let mtu = usize::from(self.interfaces[hop.port.index()].mtu);
        if buf.len() > mtu {
            if dont_frag {
                // RFC 1812 §5.2.7.1 / RFC 1191: fragmentation needed, with
                // the next hop's MTU, through the outbound SPD (a packet
                // that came through a tunnel hears back through it).
                let from = self.address_toward(ipv4::view(buf.data())?.src_addr());
                let error = (icmp::kind::DEST_UNREACHABLE, icmp::kind::FRAG_NEEDED, mtu as u32);
                self.icmp_error(buf, error, from, DropReason::FragNeeded)?;
                let error = std::mem::replace(buf, PacketBuf::empty());
                self.originate(error, out);
                return Ok(None);
            }
            return self.fragment(buf, mtu, hop, out).map(|()| None);
        }
        if self.link_of(hop.port) == LinkLayer::RawIp {
            return Ok(Some(hop.port));
        }
        self.send_to_neighbor(buf, hop.port, hop.address.into(), out)
    }

    /// Routes an IPv6 packet (RFC 8200 §5: never fragmented here; too big
    /// for the next link is a packet-too-big error back to its source).
    fn route6(&mut self, buf: &mut PacketBuf, out: &mut Vec<Output>) -> Result<Option<Port>, DropReason> {
        let dst = ipv6::view(buf.data())?.dst_addr();
        let hop = self.routes.lookup6(dst).ok_or(DropReason::NoRoute)?;
        let mtu = usize::from(self.interfaces[hop.port.index()].mtu);
        if buf.len() > mtu {
            let error = (icmp6::kind::PACKET_TOO_BIG, 0, mtu as u32);
            self.icmp6_error(buf, error, DropReason::FragNeeded)?;
            // The error (at most the IPv6 minimum MTU, which every IPv6
            // interface carries) goes back through the outbound SPD.
            let error = std::mem::replace(buf, PacketBuf::empty());
            self.originate(error, out);
            return Ok(None);
        }
        if self.link_of(hop.port) == LinkLayer::RawIp {
            return Ok(Some(hop.port));
        }
        self.send_to_neighbor(buf, hop.port, hop.address.into(), out)
    }

    /// Frames a routed packet for `next_hop` on `port` (an Ethernet port),
    /// or parks it while the next hop resolves.
    fn send_to_neighbor(
        &mut self,
        buf: &mut PacketBuf,
        port: Port,
        next_hop: IpAddr,
        out: &mut Vec<Output>,
    ) -> Result<Option<Port>, DropReason> {
        let mac = match self.neighbors.lookup(port, next_hop, self.last_now) {
            Some(mac) => mac,
            // Offline there is no ARP: an unknown neighbour gets the zero MAC.
            None if !self.resolve_neighbors => EthernetAddress([0; 6]),
            None => {
                let parked = std::mem::replace(buf, PacketBuf::empty());
                match self.neighbors.park(next_hop, port, parked, self.last_now) {
                    Queued::Parked { request } => {
                        if request {
                            self.send_neighbor_request(next_hop, port, out);
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
        self.frame(buf, mac, port)?;
        Ok(Some(port))
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
                                self.send_neighbor_request(hop.address.into(), hop.port, out);
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
    pub(super) fn send_neighbor_request(&mut self, target: IpAddr, port: Port, out: &mut Vec<Output>) {
        let target = match target {
            IpAddr::V4(v4) => return self.send_arp_request(v4, port, out),
            IpAddr::V6(v6) => v6,
        };
        let iface = &self.interfaces[port.index()];
        let Some((our, _)) = iface.address6 else { return };
        let mac = iface.mac;
        let Some(mut buf) = self.pool.alloc() else {
            return;
        };
        if icmp6::neighbor_solicit(&mut buf, (mac, our), target) {
            self.stats.generated += 1;
            self.stats.tx_packets += 1;
            out.push((buf, Verdict::Forward(port)));
        } else {
            self.pool.free(buf);
        }
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
    /// waited for them. A request for our address from an off-link sender
    /// is answered but not learnt: a Linux peer asks from whichever of its
    /// addresses the packet it is sending has (`arp_announce = 0`), and
    /// would otherwise never reach us. Any other ARP from off-link senders
    /// is dropped unanswered.
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
                if self.is_waited_for(arp.sender_ip.into()) {
                    self.release(arp.sender_ip.into(), arp.sender_mac, out);
                }
            }
            Learnt::OffLink if !(for_us && arp.operation == ArpOperation::Request) => {
                self.stats.drops.count(DropReason::ArpOffLink);
                out.push((buf, Verdict::Drop(DropReason::ArpOffLink)));
                return;
            }
            Learnt::OffLink => {}
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
    /// sent (it takes the outbound SPD: `Next::Local`), `Err` that the
    /// packet is simply dropped.
    pub(super) fn icmp_error(
        &mut self,
        buf: &mut PacketBuf,
        (icmp_type, code, rest): (u8, u8, u32),
        from: Ipv4Addr,
        reason: DropReason,
    ) -> Result<Next, DropReason> {
        let to = icmp::may_answer_with_error(buf.data())
            .then(|| ipv4::view(buf.data()).map(|ip| ip.src_addr()).ok())
            .flatten();
        self.error_reply(buf, to.map(IpAddr::V4), reason, |buf| {
            icmp::error_in_place(buf, icmp_type, code, rest, from)
        })
    }

    /// [`icmp_error`](Self::icmp_error) for an IPv6 packet: an ICMPv6 error
    /// (RFC 4443) from our IPv6 address on the interface toward its source.
    pub(super) fn icmp6_error(
        &mut self,
        buf: &mut PacketBuf,
        (icmp_type, code, rest): (u8, u8, u32),
        reason: DropReason,
    ) -> Result<Next, DropReason> {
        // RFC 4443 §2.4 (e.3): packet too big, and a parameter problem
        // about an option whose bits ask for one even then (the caller
        // asks for code 2 to a group only then), may answer a packet to a
        // multicast group.
        let to_group_too = icmp_type == icmp6::kind::PACKET_TOO_BIG
            || (icmp_type == icmp6::kind::PARAM_PROBLEM && code == 2);
        let to = icmp6::may_answer_with_error(buf.data(), to_group_too)
            .then(|| ipv6::view(buf.data()).map(|ip| ip.src_addr()).ok())
            .flatten();
        let from = to.and_then(|to| self.address6_toward(to));
        let (Some(to), Some(from)) = (to, from) else {
            return Err(reason);
        };
        self.error_reply(buf, Some(IpAddr::V6(to)), reason, |buf| {
            icmp6::error_in_place(buf, icmp_type, code, rest, from)
        })
    }

    /// The source of an ICMP error to `to`: our inside address when an
    /// outbound `protect` policy covers it to `to` (the error then goes
    /// through that tunnel, as a strongSwan host's does with the inside
    /// `src` it gives its tunnel routes), else our address on the
    /// interface that `to` is routed out of (the inside one without a
    /// route).
    pub(super) fn address_toward(&mut self, to: Ipv4Addr) -> Ipv4Addr {
        let inside = self.interfaces[Port::Inside.index()].address;
        let port = self.routes.lookup(to).map_or(Port::Inside, |hop| hop.port);
        if port == Port::Inside || self.tunnels_from(inside.into(), to.into(), spd_sad::proto::ICMP) {
            return inside;
        }
        self.interfaces[port.index()].address
    }

    /// [`address_toward`](Self::address_toward) for IPv6: our IPv6 address
    /// on the interface that `to` is routed out of, the inside one for a
    /// destination behind a tunnel (no IPv6 route, or a `protect` policy
    /// from it to `to`).
    pub(super) fn address6_toward(&mut self, to: Ipv6Addr) -> Option<Ipv6Addr> {
        let inside = self.interfaces[Port::Inside.index()].address6.map(|(a, _)| a);
        let port = self.routes.lookup6(to).map_or(Port::Inside, |hop| hop.port);
        if let Some(inside) = inside {
            if port == Port::Inside || self.tunnels_from(inside.into(), to.into(), ICMPV6) {
                return Some(inside);
            }
        }
        self.interfaces[port.index()].address6.map(|(a, _)| a)
    }

    /// Whether an outbound `protect` policy covers ICMP (`protocol`) from
    /// `src` to `dst`.
    fn tunnels_from(&mut self, src: IpAddr, dst: IpAddr, protocol: u8) -> bool {
        let flow = spd_sad::FlowKey {
            src,
            dst,
            protocol,
            ports: None,
        };
        matches!(
            self.spd
                .lookup_cached(spd_sad::PolicyDirection::Out, &flow)
                .action,
            spd_sad::Action::Protect(_)
        )
    }

    /// What both families' errors share: the token buckets, the rewrite
    /// (`write`, `false` when the packet cannot be quoted) and the counts.
    fn error_reply(
        &mut self,
        buf: &mut PacketBuf,
        to: Option<IpAddr>,
        reason: DropReason,
        write: impl FnOnce(&mut PacketBuf) -> bool,
    ) -> Result<Next, DropReason> {
        let Some(to) = to else {
            return Err(reason);
        };
        // Never to ourselves: an error about our own packet (too large for
        // a link) just drops it.
        if self.is_local(to) {
            return Err(reason);
        }
        if !self.icmp_limiter.allow(to, self.last_now) {
            self.stats.icmp_rate_limited += 1;
            return Err(reason);
        }
        if !write(buf) {
            return Err(reason);
        }
        self.stats.drops.count(reason);
        self.stats.generated += 1;
        fate::mark_replaced(buf, Fate::Dropped(reason));
        Ok(Next::Local)
    }

    pub(super) fn is_waited_for(&self, address: IpAddr) -> bool {
        self.neighbors.pending() > 0 && self.neighbors.is_pending(address)
    }

    pub(super) fn release(&mut self, address: IpAddr, mac: EthernetAddress, out: &mut Vec<Output>) {
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
