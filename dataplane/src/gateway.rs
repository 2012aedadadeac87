//! The sans-IO gateway core: classify, protect or verify, route.
//!
//! A driver hands in a batch of received frames with the port they arrived
//! on and the current time; the gateway rewrites each buffer in place and
//! returns one verdict per frame. It reads no clock, does no I/O and does
//! not allocate per packet.

use std::net::Ipv4Addr;
use std::time::Duration;

use accel::{Engine, Session};
use rand::rngs::StdRng;
use smoltcp::wire::{EthernetAddress, EthernetFrame, EthernetProtocol, Ipv4Packet};
use spd_sad::{proto, Action, PolicyDirection, SaEvent, SaId, SaParams, Sad, SadError, Spd};

use crate::buffer::PacketBuf;
use crate::esp::{self, Decapsulated, OutboundContext};
use crate::route::{Interface, Neighbors, Port, Route, RoutingTable};
use crate::stats::{DropReason, Stats};
use crate::wire::{flow_key, EspPacket};

/// What the frames of a driver look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    Ethernet,
    /// Bare IPv4 packets (TUN devices, raw-IP captures).
    RawIp,
}

/// The fate of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Transmit the (rewritten) buffer on this port.
    Forward(Port),
    /// Consumed by the gateway (addressed to it, or an ESP dummy packet).
    Consumed,
    Drop(DropReason),
}

/// Everything the gateway is built from, apart from SAs and policies.
#[derive(Debug, Clone)]
pub struct GatewaySetup {
    pub inside: Interface,
    pub outside: Interface,
    pub routes: Vec<Route>,
    pub neighbors: Vec<(Ipv4Addr, EthernetAddress)>,
    pub link: LinkLayer,
    /// TTL of the outer header of tunnel-mode packets.
    pub outer_ttl: u8,
}

/// The gateway core.
pub struct Gateway {
    interfaces: [Interface; 2],
    routes: RoutingTable,
    neighbors: Neighbors,
    link: LinkLayer,
    outer_ttl: u8,
    spd: Spd,
    sad: Sad<Session>,
    engine: Box<dyn Engine>,
    rng: StdRng,
    next_ip_id: u16,
    stats: Stats,
}

impl Gateway {
    pub fn new(setup: GatewaySetup, engine: Box<dyn Engine>) -> Self {
        let mut routes = RoutingTable::new();
        for iface in [&setup.inside, &setup.outside] {
            routes.add(Route {
                destination: iface.network,
                via: None,
                port: iface.port,
            });
        }
        for route in &setup.routes {
            routes.add(*route);
        }
        let mut neighbors = Neighbors::default();
        for (addr, mac) in &setup.neighbors {
            neighbors.insert(*addr, *mac);
        }
        Gateway {
            interfaces: [setup.inside, setup.outside],
            routes,
            neighbors,
            link: setup.link,
            outer_ttl: setup.outer_ttl,
            spd: Spd::new(),
            sad: Sad::new(),
            engine,
            rng: rand::make_rng(),
            next_ip_id: 1,
            stats: Stats::default(),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn spd(&self) -> &Spd {
        &self.spd
    }

    pub fn spd_mut(&mut self) -> &mut Spd {
        &mut self.spd
    }

    pub fn sad(&self) -> &Sad<Session> {
        &self.sad
    }

    pub fn sad_mut(&mut self) -> &mut Sad<Session> {
        &mut self.sad
    }

    pub fn interface(&self, port: Port) -> &Interface {
        &self.interfaces[port.index()]
    }

    pub fn routes(&self) -> &RoutingTable {
        &self.routes
    }

    pub fn link(&self) -> LinkLayer {
        self.link
    }

    pub fn engine_kind(&self) -> accel::EngineKind {
        self.engine.kind()
    }

    /// Installs an SA with its registered session.
    pub fn install_sa(
        &mut self,
        params: SaParams,
        session: Session,
        now: Duration,
    ) -> Result<SaId, SadError> {
        self.sad.insert(params, session, now)
    }

    /// Re-evaluates time-based lifetimes.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.sad.handle_timeout(now);
    }

    /// Next SA lifetime event for the control plane.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<SaEvent> {
        self.sad.poll_event()
    }

    /// Processes a batch of frames received on `from`. `verdicts` gets one
    /// entry per buffer, in order.
    pub fn handle_batch(
        &mut self,
        now: Duration,
        from: Port,
        bufs: &mut [PacketBuf],
        verdicts: &mut [Verdict],
    ) {
        for (buf, verdict) in bufs.iter_mut().zip(verdicts.iter_mut()) {
            *verdict = self.handle_frame(now, from, buf);
        }
    }

    /// Counts a frame a driver received but could not hand in (too large
    /// for a buffer), so that every received frame is accounted for.
    pub fn count_driver_drop(&mut self, reason: DropReason) {
        self.stats.rx_packets += 1;
        self.stats.drops.count(reason);
    }

    /// Processes one frame.
    pub fn handle_frame(&mut self, now: Duration, from: Port, buf: &mut PacketBuf) -> Verdict {
        self.stats.rx_packets += 1;
        let verdict = match self.process(now, from, buf) {
            Ok(Some(port)) => Verdict::Forward(port),
            Ok(None) => Verdict::Consumed,
            Err(reason) => Verdict::Drop(reason),
        };
        match verdict {
            Verdict::Forward(_) => self.stats.tx_packets += 1,
            Verdict::Consumed => {}
            Verdict::Drop(reason) => self.stats.drops.count(reason),
        }
        verdict
    }

    fn is_local(&self, addr: Ipv4Addr) -> bool {
        self.interfaces.iter().any(|i| i.address == addr)
    }

    fn process(
        &mut self,
        now: Duration,
        from: Port,
        buf: &mut PacketBuf,
    ) -> Result<Option<Port>, DropReason> {
        self.strip_link_header(buf)?;
        check_ipv4(buf)?;
        let ip = Ipv4Packet::new_unchecked(buf.data());
        let flow = flow_key(&ip);
        let is_fragment = ip.more_frags() || ip.frag_offset() != 0;
        match from {
            Port::Inside => {
                if self.is_local(flow.dst) {
                    self.stats.local_delivered += 1;
                    return Ok(None);
                }
                match self.spd.lookup(PolicyDirection::Out, &flow).action {
                    Action::Protect(sa) => {
                        decrement_ttl(buf)?;
                        self.encapsulate(now, sa, buf)?;
                        self.stats.encapsulated += 1;
                    }
                    Action::Bypass => {
                        decrement_ttl(buf)?;
                        self.stats.bypassed += 1;
                    }
                    Action::Discard => return Err(self.no_policy_or_discard(PolicyDirection::Out, &flow)),
                }
            }
            Port::Outside => {
                if flow.protocol == proto::ESP && self.is_esp_for_us(buf, flow.dst) {
                    if is_fragment {
                        // Reassembly before decapsulation is not implemented yet.
                        return Err(DropReason::Malformed);
                    }
                    match self.decapsulate(now, buf)? {
                        Decapsulated::Dummy => {
                            self.stats.dummy_packets += 1;
                            return Ok(None);
                        }
                        Decapsulated::Packet => self.stats.decapsulated += 1,
                    }
                    let inner_dst = Ipv4Packet::new_unchecked(buf.data()).dst_addr();
                    if self.is_local(inner_dst) {
                        self.stats.local_delivered += 1;
                        return Ok(None);
                    }
                    decrement_ttl(buf)?;
                } else {
                    // RFC 4301 §5.2: plaintext must be allowed by a bypass policy.
                    match self.spd.lookup(PolicyDirection::In, &flow).action {
                        Action::Protect(_) => return Err(DropReason::PolicyMismatch),
                        Action::Discard => return Err(self.no_policy_or_discard(PolicyDirection::In, &flow)),
                        Action::Bypass => {}
                    }
                    if self.is_local(flow.dst) {
                        self.stats.local_delivered += 1;
                        return Ok(None);
                    }
                    decrement_ttl(buf)?;
                    self.stats.bypassed += 1;
                }
            }
        }
        self.route_and_frame(buf).map(Some)
    }

    fn no_policy_or_discard(&self, direction: PolicyDirection, flow: &spd_sad::FlowKey) -> DropReason {
        match self.spd.lookup(direction, flow).policy {
            Some(_) => DropReason::PolicyDiscard,
            None => DropReason::NoPolicy,
        }
    }

    /// ESP that this gateway terminates: addressed to it (an unknown SPI is
    /// then its error to count), or carrying the SPI of one of its inbound
    /// SAs. Other ESP is transit traffic for the SPD.
    fn is_esp_for_us(&self, buf: &PacketBuf, dst: Ipv4Addr) -> bool {
        if self.is_local(dst) {
            return true;
        }
        let data = buf.data();
        let header_len = usize::from(data[0] & 0x0f) * 4;
        match EspPacket::new_checked(&data[header_len..]) {
            Ok(esp) => self.sad.lookup_inbound(esp.spi(), dst).is_some(),
            Err(_) => false,
        }
    }

    fn strip_link_header(&self, buf: &mut PacketBuf) -> Result<(), DropReason> {
        if self.link == LinkLayer::RawIp {
            return Ok(());
        }
        let frame = EthernetFrame::new_checked(buf.data()).map_err(|_| DropReason::Malformed)?;
        if frame.ethertype() != EthernetProtocol::Ipv4 {
            return Err(DropReason::Unsupported);
        }
        buf.trim_front(EthernetFrame::<&[u8]>::header_len());
        Ok(())
    }

    fn encapsulate(&mut self, now: Duration, sa_id: SaId, buf: &mut PacketBuf) -> Result<(), DropReason> {
        let ip_id = self.next_ip_id;
        self.next_ip_id = self.next_ip_id.wrapping_add(1);
        let sa = self.sad.get_mut(sa_id).ok_or(DropReason::SaExpired)?;
        let ctx = OutboundContext {
            rng: &mut self.rng,
            ip_id,
            outer_ttl: self.outer_ttl,
            now,
        };
        let mut pending = match esp::encapsulate_prepare(sa_id, sa, buf, ctx) {
            Ok(p) => p,
            Err(DropReason::SeqOverflow) => {
                esp::note_exhausted(&mut self.sad, sa_id);
                return Err(DropReason::SeqOverflow);
            }
            Err(e) => return Err(e),
        };
        let session = sa.crypto();
        self.engine.process(
            session,
            &mut pending.desc,
            &mut buf.data_mut()[pending.esp_offset..],
        );
        esp::encapsulate_finish(&mut self.sad, &pending, now)
    }

    fn decapsulate(&mut self, now: Duration, buf: &mut PacketBuf) -> Result<Decapsulated, DropReason> {
        let mut pending = esp::decapsulate_prepare(&mut self.sad, buf, now)?;
        let sa = self.sad.get(pending.sa).ok_or(DropReason::UnknownSpi)?;
        self.engine.process(
            sa.crypto(),
            &mut pending.desc,
            &mut buf.data_mut()[pending.esp_offset..],
        );
        let result = esp::decapsulate_finish(&mut self.sad, buf, &pending, now)?;
        if result == Decapsulated::Packet {
            // RFC 4301 §5.2 step 4: the inner packet must match the SA's selectors.
            let inner = Ipv4Packet::new_unchecked(buf.data());
            let flow = flow_key(&inner);
            let sa = self.sad.get_mut(pending.sa).ok_or(DropReason::UnknownSpi)?;
            if !sa.admits(&flow) {
                sa.counters.policy_mismatch += 1;
                return Err(DropReason::PolicyMismatch);
            }
        }
        Ok(result)
    }

    /// Chooses the port and next hop and writes the link-layer header.
    fn route_and_frame(&mut self, buf: &mut PacketBuf) -> Result<Port, DropReason> {
        let dst = Ipv4Packet::new_unchecked(buf.data()).dst_addr();
        let hop = self.routes.lookup(dst).ok_or(DropReason::NoRoute)?;
        if self.link == LinkLayer::Ethernet {
            // Offline there is no ARP: an unknown neighbour gets the zero MAC.
            let dst_mac = self
                .neighbors
                .lookup(hop.address)
                .unwrap_or(EthernetAddress([0; 6]));
            let src_mac = self.interfaces[hop.port.index()].mac;
            let header = buf
                .prepend(EthernetFrame::<&[u8]>::header_len())
                .ok_or(DropReason::NoBufferSpace)?;
            let mut frame = EthernetFrame::new_unchecked(header);
            frame.set_dst_addr(dst_mac);
            frame.set_src_addr(src_mac);
            frame.set_ethertype(EthernetProtocol::Ipv4);
        }
        Ok(hop.port)
    }
}

/// Validates an IPv4 header and trims link-layer padding after the packet.
fn check_ipv4(buf: &mut PacketBuf) -> Result<(), DropReason> {
    let total = {
        let ip = Ipv4Packet::new_checked(buf.data()).map_err(|_| {
            if buf.data().first().is_some_and(|b| b >> 4 == 6) {
                DropReason::Unsupported
            } else {
                DropReason::Malformed
            }
        })?;
        if ip.version() != 4 {
            return Err(if ip.version() == 6 {
                DropReason::Unsupported
            } else {
                DropReason::Malformed
            });
        }
        if !ip.verify_checksum() {
            return Err(DropReason::Malformed);
        }
        usize::from(ip.total_len())
    };
    buf.truncate(total);
    Ok(())
}

/// RFC 1812 §5.3.1: decrement TTL when forwarding; refuse at zero.
fn decrement_ttl(buf: &mut PacketBuf) -> Result<(), DropReason> {
    let mut ip = Ipv4Packet::new_unchecked(buf.data_mut());
    let ttl = ip.hop_limit();
    if ttl <= 1 {
        return Err(DropReason::TtlExpired);
    }
    ip.set_hop_limit(ttl - 1);
    ip.fill_checksum();
    Ok(())
}
