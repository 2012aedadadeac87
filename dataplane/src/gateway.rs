//! The sans-IO gateway core: classify, protect or verify, route.
//!
//! A driver hands in a batch of received frames with the port they arrived
//! on and the current time. Frames that need no crypto get their verdict at
//! once; the others are prepared (headers, sequence number, padding,
//! descriptor) and handed to the engine as jobs, in the submission style the
//! gateway was built with. Completed jobs are finished (ICV status, replay
//! window, trailer, policy) and routed. Every frame comes back to the driver
//! exactly once with its verdict, in `handle_batch`, `poll` or `flush`.
//! The core reads no clock and does no I/O of its own; it does call the
//! engine, which may block in `wait`.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use accel::{Descriptor, DescriptorKind, Direction, Engine, Job, Session, Status, Style};
use rand::rngs::StdRng;
use smoltcp::wire::{EthernetAddress, EthernetFrame, EthernetProtocol, Ipv4Packet};
use spd_sad::{proto, Action, PolicyDirection, SaEvent, SaId, SaParams, Sad, SadError, Spd};

use crate::buffer::{PacketBuf, PacketPool};
use crate::esp::{self, Decapsulated, OutboundContext, Pending};
use crate::icmp;
use crate::neighbor::{Neighbors, Queued, Waiting};
use crate::reassembly::{Reassembled, Reassembler};
use crate::route::{Interface, Port, Route, RoutingTable};
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
    /// A datagram for the control plane (UDP to [`GatewaySetup::control_port`]
    /// on one of our addresses): the buffer holds the IPv4 packet. The
    /// driver hands it over, then frees it; drivers without a control
    /// plane just free it.
    Control,
    Drop(DropReason),
}

/// The UDP port of the control plane's exchange: IKE's (RFC 7296 §2).
pub const CONTROL_PORT: u16 = 500;

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
    /// How packets' crypto is handed to the engine.
    pub style: Style,
    /// Resolve next hops by ARP. Off for offline work (captures), where a
    /// next hop without a static entry gets the zero MAC.
    pub resolve_neighbors: bool,
    /// Answer ARP requests for our addresses. With several workers, every
    /// worker learns from ARP but only one answers.
    pub answer_arp: bool,
    /// The inside port's framing when it differs from `link` (a TUN device
    /// carries bare IPv4 while the outside is Ethernet).
    pub inside_link: Option<LinkLayer>,
    /// UDP port on which datagrams to our outside address go to the
    /// control plane (as [`Verdict::Control`]), ahead of the SPD: key
    /// exchange traffic is always let through (RFC 4301 §5.1, IKE bypass).
    /// `None`: such datagrams are ordinary local traffic.
    pub control_port: Option<u16>,
    /// Drop unicast frames for other MAC addresses (`other_host`). On for
    /// live interfaces, whose sockets are promiscuous because the gateway's
    /// MAC need not be the device's; off for captures, which hold what the
    /// user wants processed.
    pub only_own_mac: bool,
}

/// A frame handed back to the driver.
pub type Output = (PacketBuf, Verdict);

/// Why the gateway could not send a control datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatagramError {
    #[error("no route to {0}")]
    NoRoute(Ipv4Addr),
    #[error("no free packet buffer")]
    NoBuffer,
    #[error("a {0}-byte datagram does not fit a packet buffer")]
    TooLarge(usize),
}

/// How long a job may stay with the engine before the gateway gives up on
/// it (a stalled channel, a lost completion).
pub const JOB_TIMEOUT: Duration = Duration::from_millis(250);

/// How often a full engine is waited on (1 ms each) before the packet is
/// dropped as `engine_busy`.
const SUBMIT_RETRIES: usize = 1000;

/// Where a packet is in its trip through the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// One single-pass descriptor.
    Single,
    /// Dual-pass or sync, first descriptor (cipher out, MAC in).
    First,
    /// Second descriptor (MAC out, cipher in).
    Second,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    pending: Pending,
    direction: Direction,
    phase: Phase,
    submitted_at: Duration,
    /// Given up on (timed out); the completion, if it ever comes, is dropped.
    abandoned: bool,
}

/// Jobs in flight, indexed by the job's `user` cookie. Slots are reused, so
/// steady state allocates nothing.
#[derive(Default)]
struct Slab {
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    live: usize,
}

impl Slab {
    fn insert(&mut self, entry: InFlight) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(entry);
                i
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        }
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut InFlight> {
        self.slots.get_mut(i)?.as_mut()
    }

    fn remove(&mut self, i: usize) -> Option<InFlight> {
        let entry = self.slots.get_mut(i)?.take()?;
        self.free.push(i);
        self.live -= 1;
        Some(entry)
    }
}

/// The gateway core.
pub struct Gateway {
    /// What it was built from, for forks.
    setup: GatewaySetup,
    interfaces: [Interface; 2],
    routes: RoutingTable,
    neighbors: Neighbors,
    resolve_neighbors: bool,
    /// The driver's pool, lent for the duration of a call, for frames the
    /// gateway originates (ARP requests, fragments).
    pool: PacketPool,
    /// Scratch for packets released or expired from the neighbour queue.
    waiting: Vec<Waiting>,
    reassembler: Reassembler,
    /// Scratch for buffers the reassembler gives up.
    spent: Vec<PacketBuf>,
    link: LinkLayer,
    outer_ttl: u8,
    style: Style,
    spd: Spd,
    sad: Sad<Arc<Session>>,
    engine: Box<dyn Engine>,
    rng: StdRng,
    next_ip_id: u16,
    stats: Stats,
    in_flight: Slab,
    /// Completed jobs, reused between polls.
    completions: Vec<Job>,
    /// Second-pass jobs the engine could not take yet.
    deferred: Vec<Job>,
    last_now: Duration,
}

/// Where a packet goes once the gateway is done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Look up the route and transmit.
    Route,
    /// Addressed to the gateway: consumed.
    Consume,
    /// For the control plane.
    Control,
}

/// What classification decided for one frame.
enum Classified {
    Done(Result<Next, DropReason>),
    Arp(icmp::Arp),
    /// A fragment of ESP addressed to us: reassemble first.
    Fragment,
    Encapsulate(SaId),
    Decapsulate,
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
            neighbors.insert_static(*addr, *mac);
        }
        Gateway {
            setup: setup.clone(),
            interfaces: [setup.inside, setup.outside],
            routes,
            neighbors,
            resolve_neighbors: setup.resolve_neighbors,
            pool: PacketPool::default(),
            waiting: Vec::with_capacity(64),
            reassembler: Reassembler::default(),
            spent: Vec::with_capacity(8),
            link: setup.link,
            outer_ttl: setup.outer_ttl,
            style: setup.style,
            spd: Spd::new(),
            sad: Sad::new(),
            engine,
            rng: rand::make_rng(),
            next_ip_id: 1,
            stats: Stats::default(),
            in_flight: Slab::default(),
            completions: Vec::with_capacity(256),
            deferred: Vec::with_capacity(64),
            last_now: Duration::ZERO,
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

    pub fn sad(&self) -> &Sad<Arc<Session>> {
        &self.sad
    }

    pub fn sad_mut(&mut self) -> &mut Sad<Arc<Session>> {
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

    /// The framing of one port.
    fn link_of(&self, port: Port) -> LinkLayer {
        match port {
            Port::Inside => self.setup.inside_link.unwrap_or(self.link),
            Port::Outside => self.link,
        }
    }

    pub fn style(&self) -> Style {
        self.style
    }

    pub fn engine_kind(&self) -> accel::EngineKind {
        self.engine.kind()
    }

    pub fn engine_counters(&self) -> accel::EngineCounters {
        self.engine.counters()
    }

    /// A copy for another worker thread, on its own engine: same routes,
    /// policies and SAs; the SAs share their sequence counters and usage
    /// with this gateway's, so sequence numbers stay unique and lifetimes
    /// count every worker's packets. Inbound replay windows are the
    /// receiving worker's own: the driver must send all packets of an
    /// inbound SA to one worker (it hashes on the outer addresses).
    pub fn fork(&self, engine: Box<dyn Engine>) -> Gateway {
        let setup = GatewaySetup {
            answer_arp: false,
            ..self.setup.clone()
        };
        let mut copy = Gateway::new(setup, engine);
        copy.spd = self.spd.clone();
        copy.sad = self.sad.fork();
        copy
    }

    /// Makes CBC IVs a deterministic function of `seed`. Only for tests and
    /// reproducible captures: IVs must otherwise be unpredictable, which is
    /// what the default OS-seeded generator gives.
    pub fn set_iv_seed(&mut self, seed: u64) {
        use rand::SeedableRng;
        self.rng = StdRng::seed_from_u64(seed);
    }

    /// The latest time the gateway was given (for ages and lifetimes in
    /// reports).
    pub fn now(&self) -> Duration {
        self.last_now
    }

    /// Packets handed to the engine and not yet returned to the driver.
    pub fn in_flight(&self) -> usize {
        self.in_flight.live
    }

    /// Installs an SA with its registered session.
    pub fn install_sa(
        &mut self,
        params: SaParams,
        session: Session,
        now: Duration,
    ) -> Result<SaId, SadError> {
        self.sad.insert(params, Arc::new(session), now)
    }

    /// Installs a copy of another worker's SA (see [`Sad::adopt`]).
    pub fn adopt_sa(&mut self, sa: spd_sad::SecurityAssociation<Arc<Session>>) -> Result<SaId, SadError> {
        self.sad.adopt(sa)
    }

    /// Re-evaluates time-based lifetimes, gives up on jobs the engine has
    /// held longer than [`JOB_TIMEOUT`], repeats due ARP requests and drops
    /// packets whose next hop never answered.
    pub fn handle_timeout(&mut self, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
        self.lend(pool, |gw| gw.timeout(now, out));
    }

    /// Runs `f` with the driver's pool lent to the gateway.
    fn lend<R>(&mut self, pool: &mut PacketPool, f: impl FnOnce(&mut Self) -> R) -> R {
        self.pool = std::mem::take(pool);
        let result = f(self);
        *pool = std::mem::take(&mut self.pool);
        result
    }

    fn timeout(&mut self, now: Duration, out: &mut Vec<Output>) {
        self.last_now = self.last_now.max(now);
        self.sad.handle_timeout(now);
        let overdue = self
            .in_flight
            .slots
            .iter()
            .flatten()
            .any(|f| !f.abandoned && now.saturating_sub(f.submitted_at) > JOB_TIMEOUT);
        if overdue {
            for entry in self.in_flight.slots.iter_mut().flatten() {
                if now.saturating_sub(entry.submitted_at) > JOB_TIMEOUT {
                    entry.abandoned = true;
                }
            }
            // Lost completions come back through a channel reset.
            let mut lost = std::mem::take(&mut self.completions);
            self.engine.reclaim(&mut lost);
            for job in lost.drain(..) {
                self.complete(now, job, out);
            }
            self.completions = lost;
        }
        if self.reassembler.in_progress() > 0 {
            let mut spent = std::mem::take(&mut self.spent);
            self.reassembler.expire(now, &mut spent);
            self.spent = spent;
            self.give_up_spent(DropReason::ReassemblyTimeout, out);
        }
        if self.neighbors.pending() > 0 {
            let mut expired = std::mem::take(&mut self.waiting);
            let mut retry = Vec::new();
            self.neighbors.expire(now, &mut expired, &mut retry);
            for w in expired.drain(..) {
                self.stats.drops.count(DropReason::NeighborUnreachable);
                out.push((w.buf, Verdict::Drop(DropReason::NeighborUnreachable)));
            }
            self.waiting = expired;
            for (hop, port) in retry {
                self.send_arp_request(hop, port, out);
            }
        }
    }

    /// Next SA lifetime event for the control plane.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<SaEvent> {
        self.sad.poll_event()
    }

    /// Counts a frame a driver received but could not hand in (too large
    /// for a buffer), so that every received frame is accounted for.
    pub fn count_driver_drop(&mut self, reason: DropReason) {
        self.stats.rx_packets += 1;
        self.stats.drops.count(reason);
    }

    /// Processes the frames in `bufs` (draining it), received on `from`.
    /// Frames whose fate is known are appended to `out` with their verdict;
    /// the rest follow from `poll`, `flush` or `handle_timeout` once the
    /// engine is done (or the next hop resolved). `pool` is the driver's:
    /// frames the gateway originates are taken from it, and every output
    /// goes back to it.
    pub fn handle_batch(
        &mut self,
        now: Duration,
        from: Port,
        bufs: &mut Vec<PacketBuf>,
        out: &mut Vec<Output>,
        pool: &mut PacketPool,
    ) {
        self.lend(pool, |gw| {
            gw.last_now = gw.last_now.max(now);
            for mut buf in bufs.drain(..) {
                gw.stats.rx_packets += 1;
                match gw.classify(now, from, &mut buf) {
                    Classified::Done(result) => gw.emit(buf, result, out),
                    Classified::Arp(arp) => gw.handle_arp(now, from, buf, arp, out),
                    Classified::Fragment => gw.reassemble(now, buf, out),
                    Classified::Encapsulate(sa) => gw.start_encapsulation(now, sa, buf, out),
                    Classified::Decapsulate => gw.start_decapsulation(now, buf, out),
                }
            }
            gw.reap(now, out);
        });
    }

    /// Finishes whatever the engine has completed, without waiting.
    pub fn poll(&mut self, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
        self.lend(pool, |gw| gw.reap(now, out));
    }

    fn reap(&mut self, now: Duration, out: &mut Vec<Output>) {
        self.last_now = self.last_now.max(now);
        self.retry_deferred();
        let mut done = std::mem::take(&mut self.completions);
        self.engine.poll(&mut done);
        for job in done.drain(..) {
            self.complete(now, job, out);
        }
        self.completions = done;
    }

    /// Blocks until the engine may have completions, at most `timeout`.
    pub fn wait(&mut self, timeout: Duration) {
        if self.in_flight.live > 0 {
            self.engine.wait(timeout);
        }
    }

    /// Waits for every job in flight and finishes it (shutdown, end of a
    /// capture). Jobs the engine holds past [`JOB_TIMEOUT`] of waiting are
    /// reclaimed and dropped, so every buffer comes back.
    pub fn flush(&mut self, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
        self.lend(pool, |gw| gw.drain_engine(now, out));
    }

    /// Stops: waits for the engine, then hands back every packet still
    /// parked for ARP, dropped as `neighbor_unreachable`.
    pub fn shutdown(&mut self, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
        self.lend(pool, |gw| {
            gw.drain_engine(now, out);
            let mut spent = std::mem::take(&mut gw.spent);
            gw.reassembler.drain(&mut spent);
            gw.spent = spent;
            gw.give_up_spent(DropReason::ReassemblyTimeout, out);
            let mut parked = std::mem::take(&mut gw.waiting);
            gw.neighbors.drain(&mut parked);
            for w in parked.drain(..) {
                gw.stats.drops.count(DropReason::NeighborUnreachable);
                out.push((w.buf, Verdict::Drop(DropReason::NeighborUnreachable)));
            }
            gw.waiting = parked;
        });
    }

    fn drain_engine(&mut self, now: Duration, out: &mut Vec<Output>) {
        // Flushing blocks on the engine, so it measures its own waiting in
        // wall-clock time: completions can wake it far more often than the
        // step below.
        let start = std::time::Instant::now();
        let mut reclaimed = false;
        while self.in_flight.live > 0 {
            self.reap(now, out);
            if self.in_flight.live == 0 {
                break;
            }
            self.engine.wait(Duration::from_millis(1));
            let waited = start.elapsed();
            if waited > JOB_TIMEOUT && !reclaimed {
                // The engine's clock for timeouts is the wait itself here.
                self.timeout(now + JOB_TIMEOUT + waited, out);
                reclaimed = true;
            } else if waited > JOB_TIMEOUT * 2 {
                self.timeout(now + JOB_TIMEOUT + waited, out);
            }
            if waited > JOB_TIMEOUT * 40 {
                break;
            }
        }
    }

    /// One frame, start to finish, for tools and tests that handle frames
    /// one at a time: waits for the engine if the frame needs crypto.
    /// Returns everything the gateway sent because of it (usually one
    /// frame; an ARP request and fragments add more).
    pub fn handle_frame(
        &mut self,
        now: Duration,
        from: Port,
        buf: PacketBuf,
        pool: &mut PacketPool,
    ) -> Vec<Output> {
        let mut bufs = vec![buf];
        let mut out = Vec::with_capacity(1);
        self.handle_batch(now, from, &mut bufs, &mut out, pool);
        if self.in_flight.live > 0 {
            self.flush(now, &mut out, pool);
        }
        out
    }

    fn emit(&mut self, mut buf: PacketBuf, result: Result<Next, DropReason>, out: &mut Vec<Output>) {
        let verdict = match result {
            Ok(Next::Consume) => Verdict::Consumed,
            Ok(Next::Control) => Verdict::Control,
            Ok(Next::Route) => match self.route(&mut buf, out) {
                Ok(Some(port)) => Verdict::Forward(port),
                // Parked for ARP, or split into fragments already sent.
                Ok(None) => return,
                Err(reason) => Verdict::Drop(reason),
            },
            Err(reason) => Verdict::Drop(reason),
        };
        match verdict {
            Verdict::Forward(_) => self.stats.tx_packets += 1,
            Verdict::Consumed | Verdict::Control => {}
            Verdict::Drop(reason) => self.stats.drops.count(reason),
        }
        out.push((buf, verdict));
    }

    /// Sends a UDP datagram from our address on the way to `to` (the
    /// control plane's messages). It takes the normal route, ARP included,
    /// and no policy applies (IKE bypass). Outputs go to `out`.
    pub fn send_datagram(
        &mut self,
        now: Duration,
        ports: (u16, u16),
        to: Ipv4Addr,
        payload: &[u8],
        out: &mut Vec<Output>,
        pool: &mut PacketPool,
    ) -> Result<(), DatagramError> {
        let Some(hop) = self.routes.lookup(to) else {
            return Err(DatagramError::NoRoute(to));
        };
        let from = self.interfaces[hop.port.index()].address;
        let mut buf = pool.alloc().ok_or(DatagramError::NoBuffer)?;
        if !icmp::udp_datagram(&mut buf, (from, ports.0), (to, ports.1), self.next_ip_id, payload) {
            pool.free(buf);
            return Err(DatagramError::TooLarge(payload.len()));
        }
        self.next_ip_id = self.next_ip_id.wrapping_add(1);
        self.lend(pool, |gw| {
            gw.last_now = gw.last_now.max(now);
            gw.stats.generated += 1;
            gw.stats.control_sent += 1;
            gw.emit(buf, Ok(Next::Route), out);
        });
        Ok(())
    }

    /// UDP to our control port on one of our addresses, unfragmented.
    fn is_control(&self, flow: &spd_sad::FlowKey, is_fragment: bool) -> bool {
        let Some(port) = self.setup.control_port else {
            return false;
        };
        flow.protocol == proto::UDP
            && !is_fragment
            && flow.ports.is_some_and(|(_, dst)| dst == port)
            && self.is_local(flow.dst)
    }

    /// Routes an IPv4 packet: next hop, MTU, link-layer header. `Ok(None)`
    /// when the buffer was parked waiting for ARP (it comes back later).
    fn route(&mut self, buf: &mut PacketBuf, out: &mut Vec<Output>) -> Result<Option<Port>, DropReason> {
        let dst = Ipv4Packet::new_unchecked(buf.data()).dst_addr();
        let hop = self.routes.lookup(dst).ok_or(DropReason::NoRoute)?;
        let mtu = usize::from(self.interfaces[hop.port.index()].mtu);
        if buf.len() > mtu {
            let ip = Ipv4Packet::new_unchecked(buf.data());
            if ip.dont_frag() {
                return Err(DropReason::FragNeeded);
            }
            return self.fragment(buf, mtu, hop, out).map(|()| None);
        }
        if self.link_of(hop.port) == LinkLayer::RawIp {
            return Ok(Some(hop.port));
        }
        let mac = match self.neighbors.lookup(hop.address, self.last_now) {
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
    fn fragment(
        &mut self,
        buf: &mut PacketBuf,
        mtu: usize,
        hop: crate::route::NextHop,
        out: &mut Vec<Output>,
    ) -> Result<(), DropReason> {
        let header_len = usize::from(buf.data()[0] & 0x0f) * 4;
        let chunk = (mtu - header_len) / 8 * 8;
        let payload_len = buf.len() - header_len;
        if chunk == 0 {
            return Err(DropReason::FragNeeded);
        }
        let (base_offset, more_after) = {
            let ip = Ipv4Packet::new_unchecked(buf.data());
            (usize::from(ip.frag_offset()), ip.more_frags())
        };
        let pieces = payload_len.div_ceil(chunk);
        let mut extra = Vec::with_capacity(pieces.saturating_sub(1));
        for i in 1..pieces {
            let Some(mut piece) = self.pool.alloc() else {
                for b in extra {
                    self.pool.free(b);
                }
                return Err(DropReason::NoBufferSpace);
            };
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
            let mut ip = Ipv4Packet::new_unchecked(piece.data_mut());
            ip.set_total_len(total);
            ip.set_frag_offset((base_offset + i * chunk) as u16);
            ip.set_more_frags(i + 1 < pieces || more_after);
            ip.fill_checksum();
            extra.push(piece);
        }
        buf.truncate(header_len + chunk);
        let total = buf.len() as u16;
        let mut ip = Ipv4Packet::new_unchecked(buf.data_mut());
        ip.set_total_len(total);
        ip.set_more_frags(true);
        ip.fill_checksum();
        // Every fragment goes the same way; the first one below, the rest now.
        let link = self.link_of(hop.port);
        let mac = match link {
            LinkLayer::RawIp => None,
            LinkLayer::Ethernet => match self.neighbors.lookup(hop.address, self.last_now) {
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

    fn frame(&self, buf: &mut PacketBuf, dst_mac: EthernetAddress, port: Port) -> Result<(), DropReason> {
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

    fn send_arp_request(&mut self, target: Ipv4Addr, port: Port, out: &mut Vec<Output>) {
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
    /// senders, release packets that waited for them.
    fn handle_arp(
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
        // RFC 826: update an entry we have, or create one when addressed.
        if for_us || self.neighbors.lookup(arp.sender_ip, now).is_some() || self.is_waited_for(arp.sender_ip)
        {
            self.neighbors.learn(arp.sender_ip, arp.sender_mac, now);
            self.release(arp.sender_ip, arp.sender_mac, out);
        }
        self.stats.local_delivered += 1;
        if for_us
            && arp.operation == smoltcp::wire::ArpOperation::Request
            && icmp::arp_reply_in_place(&mut buf, &arp, our_mac)
        {
            self.stats.generated += 1;
            self.stats.tx_packets += 1;
            out.push((buf, Verdict::Forward(from)));
        } else {
            out.push((buf, Verdict::Consumed));
        }
    }

    fn is_waited_for(&self, address: Ipv4Addr) -> bool {
        self.neighbors.pending() > 0 && self.neighbors.is_pending(address)
    }

    fn release(&mut self, address: Ipv4Addr, mac: EthernetAddress, out: &mut Vec<Output>) {
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

    fn is_local(&self, addr: Ipv4Addr) -> bool {
        self.interfaces.iter().any(|i| i.address == addr)
    }

    fn classify(&mut self, _now: Duration, from: Port, buf: &mut PacketBuf) -> Classified {
        match self.classify_inner(from, buf) {
            Ok(c) => c,
            // RFC 1812 §5.3.1: tell the source its packet died here.
            Err(DropReason::TtlExpired) if icmp::may_answer_with_error(buf.data()) => {
                let from_addr = self.interfaces[from.index()].address;
                if icmp::error_in_place(buf, icmp::kind::TIME_EXCEEDED, 0, 0, from_addr) {
                    self.stats.drops.count(DropReason::TtlExpired);
                    self.stats.generated += 1;
                    Classified::Done(Ok(Next::Route))
                } else {
                    Classified::Done(Err(DropReason::TtlExpired))
                }
            }
            Err(reason) => Classified::Done(Err(reason)),
        }
    }

    /// An ICMP echo request to one of our addresses becomes its reply.
    fn answer_echo(&mut self, buf: &mut PacketBuf, flow: &spd_sad::FlowKey) -> Option<Classified> {
        if flow.protocol != proto::ICMP {
            return None;
        }
        let header_len = usize::from(buf.data()[0] & 0x0f) * 4;
        if buf.data().get(header_len) != Some(&icmp::kind::ECHO_REQUEST) || !icmp::echo_reply_in_place(buf) {
            return None;
        }
        self.stats.local_delivered += 1;
        self.stats.generated += 1;
        Some(Classified::Done(Ok(Next::Route)))
    }

    fn classify_inner(&mut self, from: Port, buf: &mut PacketBuf) -> Result<Classified, DropReason> {
        if let Some(arp) = self.strip_link_header(from, buf)? {
            return Ok(Classified::Arp(arp));
        }
        check_ipv4(buf)?;
        let ip = Ipv4Packet::new_unchecked(buf.data());
        let flow = flow_key(&ip);
        let is_fragment = ip.more_frags() || ip.frag_offset() != 0;
        match from {
            Port::Inside => {
                if self.is_local(flow.dst) {
                    if let Some(reply) = self.answer_echo(buf, &flow) {
                        return Ok(reply);
                    }
                    self.stats.local_delivered += 1;
                    return Ok(Classified::Done(Ok(Next::Consume)));
                }
                match self.spd.lookup(PolicyDirection::Out, &flow).action {
                    Action::Protect(sa) => {
                        decrement_ttl(buf)?;
                        Ok(Classified::Encapsulate(sa))
                    }
                    Action::Bypass => {
                        decrement_ttl(buf)?;
                        self.stats.bypassed += 1;
                        Ok(Classified::Done(Ok(Next::Route)))
                    }
                    Action::Discard => Err(self.no_policy_or_discard(PolicyDirection::Out, &flow)),
                }
            }
            Port::Outside => {
                if flow.protocol == proto::ESP && is_fragment && self.is_local(flow.dst) {
                    return Ok(Classified::Fragment);
                }
                if flow.protocol == proto::ESP && self.is_esp_for_us(buf, flow.dst) {
                    return Ok(Classified::Decapsulate);
                }
                if self.is_control(&flow, is_fragment) {
                    self.stats.local_delivered += 1;
                    self.stats.control_received += 1;
                    return Ok(Classified::Done(Ok(Next::Control)));
                }
                // RFC 4301 §5.2: plaintext must be allowed by a bypass policy.
                match self.spd.lookup(PolicyDirection::In, &flow).action {
                    Action::Protect(_) => return Err(DropReason::PolicyMismatch),
                    Action::Discard => return Err(self.no_policy_or_discard(PolicyDirection::In, &flow)),
                    Action::Bypass => {}
                }
                if self.is_local(flow.dst) {
                    if let Some(reply) = self.answer_echo(buf, &flow) {
                        return Ok(reply);
                    }
                    self.stats.local_delivered += 1;
                    return Ok(Classified::Done(Ok(Next::Consume)));
                }
                decrement_ttl(buf)?;
                self.stats.bypassed += 1;
                Ok(Classified::Done(Ok(Next::Route)))
            }
        }
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

    /// Removes the Ethernet header; ARP frames come back parsed instead.
    fn strip_link_header(&self, from: Port, buf: &mut PacketBuf) -> Result<Option<icmp::Arp>, DropReason> {
        if self.link_of(from) == LinkLayer::RawIp {
            return Ok(None);
        }
        let frame = EthernetFrame::new_checked(buf.data()).map_err(|_| DropReason::Malformed)?;
        let dst = frame.dst_addr();
        if self.setup.only_own_mac && dst.is_unicast() && dst != self.interfaces[from.index()].mac {
            return Err(DropReason::OtherHost);
        }
        match frame.ethertype() {
            EthernetProtocol::Ipv4 => {}
            EthernetProtocol::Arp => {
                return icmp::parse_arp(frame.payload())
                    .map(Some)
                    .ok_or(DropReason::Malformed);
            }
            _ => return Err(DropReason::Unsupported),
        }
        buf.trim_front(EthernetFrame::<&[u8]>::header_len());
        Ok(None)
    }

    fn start_encapsulation(&mut self, now: Duration, sa_id: SaId, mut buf: PacketBuf, out: &mut Vec<Output>) {
        let ip_id = self.next_ip_id;
        self.next_ip_id = self.next_ip_id.wrapping_add(1);
        let Some(sa) = self.sad.get_mut(sa_id) else {
            return self.emit(buf, Err(DropReason::SaExpired), out);
        };
        // RFC 4301 §8.1 / RFC 1191: with DF set, a packet that will not fit
        // the outside MTU once protected is refused with the MTU it must meet.
        let mtu = usize::from(self.interfaces[Port::Outside.index()].mtu);
        let (size, fits) = esp::protected_size(buf.data(), sa.crypto().algorithm(), sa.params().mode, mtu);
        let dont_fragment = Ipv4Packet::new_unchecked(buf.data()).dont_frag();
        if size > mtu && dont_fragment {
            let from = self.interfaces[Port::Inside.index()].address;
            let next_hop_mtu = u32::try_from(fits).unwrap_or(0);
            if icmp::may_answer_with_error(buf.data())
                && icmp::error_in_place(
                    &mut buf,
                    icmp::kind::DEST_UNREACHABLE,
                    icmp::kind::FRAG_NEEDED,
                    next_hop_mtu,
                    from,
                )
            {
                self.stats.drops.count(DropReason::FragNeeded);
                self.stats.generated += 1;
                return self.emit(buf, Ok(Next::Route), out);
            }
            return self.emit(buf, Err(DropReason::FragNeeded), out);
        }
        let ctx = OutboundContext {
            rng: &mut self.rng,
            ip_id,
            outer_ttl: self.outer_ttl,
            now,
        };
        match esp::encapsulate_prepare(sa_id, sa, &mut buf, ctx) {
            Ok(pending) => {
                let session = Arc::clone(sa.crypto());
                self.launch(now, pending, Direction::Encrypt, session, buf, out);
            }
            Err(reason) => {
                if reason == DropReason::SeqOverflow {
                    esp::note_exhausted(&mut self.sad, sa_id);
                }
                self.emit(buf, Err(reason), out);
            }
        }
    }

    /// Collects ESP fragments; a completed datagram goes on to decapsulation.
    fn reassemble(&mut self, now: Duration, buf: PacketBuf, out: &mut Vec<Output>) {
        let result = self.reassembler.insert(buf, now, &mut self.pool, &mut self.spent);
        self.give_up_spent(DropReason::ReassemblyFailed, out);
        match result {
            Reassembled::Held(fragment) => {
                self.stats.fragments_absorbed += 1;
                out.push((fragment, Verdict::Consumed));
            }
            Reassembled::Complete { datagram, spent } => {
                self.stats.fragments_absorbed += 1;
                out.push((spent, Verdict::Consumed));
                // The datagram's buffer came from the pool: a new frame.
                self.stats.generated += 1;
                self.start_decapsulation(now, datagram, out);
            }
            Reassembled::Dropped(fragment, _) => self.emit(fragment, Err(DropReason::ReassemblyFailed), out),
        }
    }

    /// Hands back datagram buffers the reassembler gave up on.
    fn give_up_spent(&mut self, reason: DropReason, out: &mut Vec<Output>) {
        while let Some(buf) = self.spent.pop() {
            self.stats.generated += 1;
            self.stats.drops.count(reason);
            out.push((buf, Verdict::Drop(reason)));
        }
    }

    fn start_decapsulation(&mut self, now: Duration, mut buf: PacketBuf, out: &mut Vec<Output>) {
        match esp::decapsulate_prepare(&mut self.sad, &mut buf, now) {
            Ok(pending) => match self.sad.get(pending.sa) {
                Some(sa) => {
                    let session = Arc::clone(sa.crypto());
                    self.launch(now, pending, Direction::Decrypt, session, buf, out);
                }
                None => self.emit(buf, Err(DropReason::UnknownSpi), out),
            },
            Err(reason) => self.emit(buf, Err(reason), out),
        }
    }

    /// The descriptor kinds for a packet in this gateway's style: AEADs are
    /// always single-pass (GCM cannot be split); otherwise sync and
    /// dual-pass run cipher then MAC outbound, MAC then cipher inbound.
    fn first_phase(&self, session: &Session) -> Phase {
        if self.style == Style::Async || session.algorithm().is_aead() {
            Phase::Single
        } else {
            Phase::First
        }
    }

    fn kind_for(direction: Direction, phase: Phase) -> DescriptorKind {
        match (phase, direction) {
            (Phase::Single, _) => DescriptorKind::SinglePass,
            (Phase::First, Direction::Encrypt) | (Phase::Second, Direction::Decrypt) => {
                DescriptorKind::CipherOnly
            }
            (Phase::First, Direction::Decrypt) | (Phase::Second, Direction::Encrypt) => {
                DescriptorKind::MacOnly
            }
        }
    }

    fn launch(
        &mut self,
        now: Duration,
        pending: Pending,
        direction: Direction,
        session: Arc<Session>,
        buf: PacketBuf,
        out: &mut Vec<Output>,
    ) {
        let phase = self.first_phase(&session);
        let mut desc: Descriptor = pending.desc;
        desc.kind = Self::kind_for(direction, phase);
        let slot = self.in_flight.insert(InFlight {
            pending,
            direction,
            phase,
            submitted_at: now,
            abandoned: false,
        });
        let job = Job::new(session, desc, buf, pending.esp_offset, slot as u64);
        self.submit(now, job, out);
        if self.style == Style::Sync {
            self.wait_for(now, slot, out);
        }
    }

    /// Submits with back-pressure: a full engine is drained and waited on;
    /// if it stays full the packet is dropped as `engine_busy`.
    fn submit(&mut self, now: Duration, mut job: Job, out: &mut Vec<Output>) {
        for _ in 0..SUBMIT_RETRIES {
            match self.engine.submit(job) {
                Ok(()) => return,
                Err(back) => job = back,
            }
            self.reap(now, out);
            self.engine.wait(Duration::from_millis(1));
        }
        let slot = job.user as usize;
        self.in_flight.remove(slot);
        self.emit(job.buf, Err(DropReason::EngineBusy), out);
    }

    /// Low-level synchronous style: the caller waits for this packet.
    fn wait_for(&mut self, now: Duration, slot: usize, out: &mut Vec<Output>) {
        let start = std::time::Instant::now();
        while self.in_flight.slots.get(slot).is_some_and(Option::is_some) {
            self.reap(now, out);
            if self.in_flight.slots.get(slot).is_none_or(Option::is_none) {
                return;
            }
            self.engine.wait(Duration::from_micros(100));
            let waited = start.elapsed();
            if waited > JOB_TIMEOUT {
                self.timeout(now + JOB_TIMEOUT + waited, out);
                if waited > JOB_TIMEOUT * 40 {
                    return;
                }
            }
        }
    }

    fn retry_deferred(&mut self) {
        while let Some(job) = self.deferred.pop() {
            if let Err(back) = self.engine.submit(job) {
                self.deferred.push(back);
                return;
            }
        }
    }

    /// A job came back from the engine.
    fn complete(&mut self, now: Duration, mut job: Job, out: &mut Vec<Output>) {
        let slot = job.user as usize;
        let Some(entry) = self.in_flight.get_mut(slot).copied() else {
            // Not ours: cannot happen, but never lose a buffer.
            return self.emit(job.buf, Err(DropReason::EngineError), out);
        };
        if entry.abandoned {
            self.in_flight.remove(slot);
            return self.emit(job.buf, Err(DropReason::EngineTimeout), out);
        }
        if entry.phase == Phase::First && job.desc.status == Status::Done {
            if let Some(e) = self.in_flight.get_mut(slot) {
                e.phase = Phase::Second;
            }
            job.desc.kind = Self::kind_for(entry.direction, Phase::Second);
            job.desc.status = Status::Pending;
            if let Err(back) = self.engine.submit(job) {
                self.deferred.push(back);
            }
            return;
        }
        self.in_flight.remove(slot);
        let mut pending = entry.pending;
        pending.desc.status = job.desc.status;
        let mut buf = job.buf;
        let result = match entry.direction {
            Direction::Encrypt => esp::encapsulate_finish(&mut self.sad, &pending, now).map(|()| {
                self.stats.encapsulated += 1;
                Next::Route
            }),
            Direction::Decrypt => self.finish_decapsulation(now, &mut buf, &pending),
        };
        self.emit(buf, result, out);
    }

    fn finish_decapsulation(
        &mut self,
        now: Duration,
        buf: &mut PacketBuf,
        pending: &Pending,
    ) -> Result<Next, DropReason> {
        match esp::decapsulate_finish(&mut self.sad, buf, pending, now)? {
            Decapsulated::Dummy => {
                self.stats.dummy_packets += 1;
                return Ok(Next::Consume);
            }
            Decapsulated::Packet => {}
        }
        // RFC 4301 §5.2 step 4: the inner packet must match the SA's selectors.
        let inner = Ipv4Packet::new_unchecked(buf.data());
        let flow = flow_key(&inner);
        let sa = self.sad.get_mut(pending.sa).ok_or(DropReason::UnknownSpi)?;
        if !sa.admits(&flow) {
            sa.counters_mut().policy_mismatch += 1;
            return Err(DropReason::PolicyMismatch);
        }
        self.stats.decapsulated += 1;
        if self.is_local(flow.dst) {
            self.stats.local_delivered += 1;
            return Ok(Next::Consume);
        }
        decrement_ttl(buf)?;
        Ok(Next::Route)
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
