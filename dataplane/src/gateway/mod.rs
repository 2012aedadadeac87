//! The sans-IO gateway core: classify, protect or verify, route.
//!
//! A driver hands in a batch of received frames with the port they arrived
//! on and the current time. Frames that need no crypto get their verdict at
//! once; the others are prepared (headers, sequence number, padding,
//! descriptor) and queued for the engine as jobs, in the submission style
//! the gateway was built with, and the queue goes to the engine as one
//! burst. Completed jobs are finished (replay window, ICV status, trailer,
//! policy) and routed. Every frame comes back to the driver exactly once
//! with its verdict, from `handle_batch`, `poll` or `handle_timeout`.
//!
//! The core reads no clock, never sleeps or waits, and does no I/O of its
//! own: time is the `now` the driver passes in, and [`Gateway::poll_timeout`]
//! says when it wants to be called again. Waiting for an engine is the
//! driver's business (`drivers::drive`).
//!
//! Files: `classify` (what a frame is; `classify6` for IPv6 frames:
//! neighbour discovery, echo, transit), `jobs` (the engine job machine),
//! `forward` (routes, fragments, ARP, framing), `encap` (RFC 3948 UDP
//! encapsulation: keepalives, IKE on 4500, peers that move), `origin` (the
//! gateway's own packets through the outbound SPD); this one holds the
//! state and the entry points.

mod classify;
mod classify6;
mod encap;
mod forward;
mod ipid;
mod jobs;
mod origin;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use accel::{Engine, NextCompletion, RegisterError, SessionSpec, Style};
use rand::rngs::StdRng;
use smoltcp::wire::EthernetAddress;
use spd_sad::{
    Mode, PolicyDirection, SaEvent, SaId, SaParams, Sad, SadError, SecurityAssociation, Spd, UdpEncap,
};

use crate::buffer::{PacketBuf, PacketPool};
pub use crate::esp::SaCrypto;
use crate::icmp;
use crate::nat;
use crate::neighbor::{NeighborLimits, Neighbors, Waiting};
use crate::reassembly::{GivenUp, Reassembler, Sources};
use crate::route::{Interface, Port, Route, Route6, RoutingTable};
use crate::stats::{DropReason, Stats};
use classify::Classified;
pub use jobs::{AWAIT_LIMIT, BACKLOG_LIMIT, HOLD_LIMIT, JOB_TIMEOUT};

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

/// fe80::/10 (RFC 4291 §2.5.6).
const LINK_LOCAL: spd_sad::Ipv6Prefix =
    match spd_sad::Ipv6Prefix::new(std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10) {
        Some(p) => p,
        None => panic!("fe80::/10 is a prefix"),
    };

/// The UDP port of the control plane's exchange: IKE's (RFC 7296 §2).
pub const CONTROL_PORT: u16 = 500;

/// Everything the gateway is built from, apart from SAs and policies.
#[derive(Debug, Clone)]
pub struct GatewaySetup {
    pub inside: Interface,
    pub outside: Interface,
    pub routes: Vec<Route>,
    /// IPv6 routes besides the connected networks of `address6`.
    pub routes6: Vec<Route6>,
    /// Static neighbours of either family.
    pub neighbors: Vec<(IpAddr, EthernetAddress)>,
    pub link: LinkLayer,
    /// TTL of the outer header of tunnel-mode packets.
    pub outer_ttl: u8,
    /// How often to send NAT keepalives (RFC 3948 §2.3) to each
    /// UDP-encapsulated peer; `None`: never. Only the gateway that answers
    /// ARP (worker 0) sends them.
    pub nat_keepalive: Option<Duration>,
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
    /// Bounds of the neighbour table (ARP floods).
    pub neighbor_limits: NeighborLimits,
    /// Token buckets for the ICMP errors the gateway sends.
    pub icmp_limits: icmp::IcmpLimits,
}

/// A frame handed back to the driver.
pub type Output = (PacketBuf, Verdict);

/// Why an SA could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallSaError {
    #[error(transparent)]
    Sad(#[from] SadError),
    #[error(transparent)]
    Engine(#[from] RegisterError),
    #[error(
        "SA `{0}`: UDP encapsulation needs tunnel mode (transport mode behind a NAT needs the peers' \
         original addresses to fix inner checksums, RFC 3948 §3.1.2)"
    )]
    TransportOverUdp(String),
    #[error(
        "SA `{name}`: outer addresses {local} -> {remote} are IPv6, which this gateway carries \
         without UDP encapsulation only so far (no NAT-T over IPv6); leave out `encap`, or give \
         IPv4 ends"
    )]
    Ipv6Outer {
        name: String,
        local: std::net::IpAddr,
        remote: std::net::IpAddr,
    },
    #[error("SA `{name}`: its ends {local} and {remote} are of different address families")]
    MixedFamilies {
        name: String,
        local: std::net::IpAddr,
        remote: std::net::IpAddr,
    },
}

/// Why the gateway could not send a control datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatagramError {
    /// No route to the address, or (IPv6) no `address6` on the way.
    #[error("no route to {0}")]
    NoRoute(IpAddr),
    #[error("no free packet buffer")]
    NoBuffer,
    #[error("a {0}-byte datagram does not fit a packet buffer")]
    TooLarge(usize),
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
    /// Packets an NDP advertisement released during classification, for
    /// the batch's output.
    released: Vec<Output>,
    reassembler: Reassembler,
    /// Whose fragments are reassembled: the remote ends of our SAs.
    fragment_sources: Sources,
    /// Bumped whenever an SA is installed, adopted or removed (with the
    /// SAD's size and the peers' epoch, what `fragment_sources` follows).
    sa_changes: u64,
    icmp_limiter: icmp::RateLimiter,
    /// Scratch for buffers the reassembler gives up.
    spent: Vec<GivenUp>,
    link: LinkLayer,
    outer_ttl: u8,
    style: Style,
    spd: Spd,
    sad: Sad<SaCrypto>,
    engine: Box<dyn Engine>,
    jobs: jobs::Jobs,
    /// Each SA's outer next hop, by SA slot (see `forward::CachedHop`).
    hops: Vec<Option<forward::CachedHop>>,
    rng: StdRng,
    next_ip_id: ipid::IpIds,
    stats: Stats,
    last_now: Duration,
    /// UDP-encapsulated peers, shared with the forks, and the epoch this
    /// gateway's SAs last followed.
    peers: nat::Peers,
    peers_seen: u64,
    /// Scratch for `handle_batch`'s two passes (kept, so not allocated
    /// per batch).
    classified: Vec<(PacketBuf, Classified)>,
    /// Our ports that UDP-encapsulated SAs receive on (usually just 4500).
    nat_ports: Vec<u16>,
    next_keepalive: Duration,
    /// The last outbound packets a policy discarded (see
    /// [`take_outbound_discards`](Self::take_outbound_discards)).
    discards: DiscardLog,
}

/// The flows of the last few outbound packets a policy discarded, with the
/// policy's number: what an on-demand keying source needs to ask its
/// daemon for an SA (the kernel's ACQUIRE). Fixed size, written on the
/// discard path only (a flow repeating the last one is not written again),
/// read between batches; older entries are overwritten, which only delays
/// a request while packets keep coming.
#[derive(Debug, Clone, Copy, Default)]
struct DiscardLog {
    entries: [Option<(u64, spd_sad::FlowKey)>; DISCARD_LOG],
    next: usize,
}

const DISCARD_LOG: usize = 8;

impl DiscardLog {
    fn note(&mut self, policy: u64, flow: spd_sad::FlowKey) {
        let last = self.entries[(self.next + DISCARD_LOG - 1) % DISCARD_LOG];
        if last == Some((policy, flow)) {
            return;
        }
        self.entries[self.next] = Some((policy, flow));
        self.next = (self.next + 1) % DISCARD_LOG;
    }
}

/// Where a packet goes once the gateway is done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Look up the route and transmit.
    Route,
    /// Addressed to the gateway: consumed.
    Consume,
    /// For the control plane.
    Control,
    /// A reply the gateway wrote, framed already: transmit it on this port.
    Reply(Port),
    /// A packet the gateway wrote (an echo reply, an ICMP or ICMPv6
    /// error), bare IP: it takes the outbound SPD (`origin`).
    Local,
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
                routes.add6(Route6 {
                    destination: network6,
                    via: None,
                    port: iface.port,
                });
            }
        }
        for route in &setup.routes6 {
            routes.add6(*route);
            if route.via.is_none() {
                neighbors.add_on_link(route.port, route.destination, None);
            }
        }
        for route in setup.routes.iter().filter(|r| r.via.is_none()) {
            neighbors.add_on_link(route.port, route.destination, None);
        }
        Gateway {
            setup: setup.clone(),
            interfaces: [setup.inside, setup.outside],
            routes,
            neighbors,
            resolve_neighbors: setup.resolve_neighbors,
            pool: PacketPool::default(),
            waiting: Vec::with_capacity(64),
            released: Vec::new(),
            reassembler: Reassembler::default(),
            fragment_sources: Sources::default(),
            sa_changes: 0,
            icmp_limiter: icmp::RateLimiter::new(setup.icmp_limits),
            spent: Vec::with_capacity(8),
            link: setup.link,
            outer_ttl: setup.outer_ttl,
            style: setup.style,
            spd: Spd::new(),
            sad: Sad::new(),
            jobs: jobs::Jobs::new(setup.style == Style::Async && engine.runs_inline()),
            engine,
            hops: Vec::new(),
            rng: rand::make_rng(),
            next_ip_id: ipid::IpIds::new(0, 1),
            stats: Stats::default(),
            last_now: Duration::ZERO,
            peers: nat::Peers::default(),
            peers_seen: 0,
            classified: Vec::with_capacity(128),
            nat_ports: Vec::new(),
            next_keepalive: Duration::ZERO,
            discards: DiscardLog::default(),
        }
    }

    /// Hands `f` the flows of the outbound packets policies discarded
    /// since the last call (at most the last few), each with the
    /// discarding policy's name, and forgets them.
    pub fn take_outbound_discards(&mut self, mut f: impl FnMut(&str, &spd_sad::FlowKey)) {
        let log = std::mem::take(&mut self.discards);
        for (number, flow) in log.entries.iter().flatten() {
            if let Some((_, policy)) = self.spd.numbered(PolicyDirection::Out).find(|(n, _)| n == number) {
                f(&policy.name, flow);
            }
        }
    }

    /// Notes an outbound packet of `flow` that policy `decision` discarded.
    pub(super) fn note_outbound_discard(&mut self, decision: &spd_sad::Decision, flow: &spd_sad::FlowKey) {
        if let Some(number) = decision.policy {
            self.discards.note(number, *flow);
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

    pub fn sad(&self) -> &Sad<SaCrypto> {
        &self.sad
    }

    /// The SAD, for lifetimes, counters and test set-up. SAs are added and
    /// removed through [`install_sa`](Self::install_sa) and
    /// [`remove_sa`](Self::remove_sa), which register and release their
    /// sessions with the engine.
    pub fn sad_mut(&mut self) -> &mut Sad<SaCrypto> {
        &mut self.sad
    }

    /// Adds this worker's unflushed SA usage to the state the workers
    /// share. For a driver whose workers have stopped: what the shared
    /// state says then is final (see [`Sad::flush_all_usage`]).
    pub fn flush_sa_usage(&mut self) {
        self.sad.flush_all_usage();
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

    /// The engine, for drivers: they wait on it ([`Engine::wait`]) when
    /// its completions come from a real device. The core never does.
    pub fn engine_mut(&mut self) -> &mut dyn Engine {
        self.engine.as_mut()
    }

    /// When the engine's next completion can be collected.
    pub fn next_completion(&self) -> NextCompletion {
        self.engine.next_completion()
    }

    /// A copy for another worker thread, on its own engine: same routes,
    /// policies and SAs; the SAs share their sequence counters and usage
    /// with this gateway's, so sequence numbers stay unique and lifetimes
    /// count every worker's packets. Inbound replay windows are the
    /// receiving worker's own: the driver must send all packets of an
    /// inbound SA to one worker (it hashes on the outer addresses), and
    /// each outbound SA's to its owner (see [`place`](Self::place)). Every
    /// SA is registered with `engine`; an engine that refuses one fails the
    /// fork.
    pub fn fork(&self, engine: Box<dyn Engine>) -> Result<Gateway, InstallSaError> {
        let setup = GatewaySetup {
            answer_arp: false,
            ..self.setup.clone()
        };
        let mut copy = Gateway::new(setup, engine);
        copy.peers = self.peers.clone();
        copy.peers_seen = self.peers_seen;
        copy.nat_ports = self.nat_ports.clone();
        copy.spd = self.spd.clone();
        copy.sad = self.sad.fork();
        let ids: Vec<SaId> = copy.sad.iter().map(|(id, _)| id).collect();
        for id in ids {
            if let Some(sa) = copy.sad.get_mut(id) {
                let crypto = sa.crypto_mut();
                crypto.handle = copy.engine.register(&crypto.keys)?;
            }
        }
        Ok(copy)
    }

    /// Makes this gateway worker `worker` of `workers`, whose driver steers
    /// each outbound SA's packets to [`spd_sad::owner_worker`]: that
    /// worker's copy reserves sequence numbers a block at a time, and outer
    /// IPv4 IDs come from this worker's own residue class so that no two
    /// workers' fragments for one tunnel share an ID.
    pub fn place(&mut self, worker: usize, workers: usize) {
        self.sad.place(worker, workers);
        self.next_ip_id = ipid::IpIds::new(worker, workers);
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

    /// Packets taken in and not yet returned to the driver: with the
    /// engine, waiting for it, or held for their ESN inference.
    pub fn in_flight(&self) -> usize {
        self.jobs.live()
    }

    /// Our ports that UDP-encapsulated SAs receive on (for the outside
    /// steering program).
    pub fn nat_ports(&self) -> &[u16] {
        &self.nat_ports
    }

    /// Takes ESP in UDP, keepalives and IKE behind the non-ESP marker on
    /// `port` before any SA receives there: a tunnel keyed by an exchange
    /// over its encapsulation port has none until the exchange is done.
    pub fn open_encapsulation_port(&mut self, port: u16) {
        if !self.nat_ports.contains(&port) {
            self.nat_ports.push(port);
        }
    }

    /// Where the UDP-encapsulated peer configured as `remote` (with
    /// `encap`) of our `local` is now: where its NAT put it, as learnt from
    /// its authenticated packets, or where it was configured.
    pub fn encapsulated_peer(
        &self,
        local: Ipv4Addr,
        remote: Ipv4Addr,
        encap: UdpEncap,
    ) -> Option<nat::PeerAddr> {
        self.peers.current(local, remote, encap)
    }

    /// Installs an SA: its keys are registered with the engine, which
    /// keeps its own form of them.
    pub fn install_sa(
        &mut self,
        params: SaParams,
        keys: SessionSpec,
        now: Duration,
    ) -> Result<SaId, InstallSaError> {
        if params.encap.is_some() && params.mode == Mode::Transport {
            return Err(InstallSaError::TransportOverUdp(params.name));
        }
        let (local, configured_remote) = match (params.local, params.remote) {
            (IpAddr::V4(local), IpAddr::V4(remote)) => (local, remote),
            (IpAddr::V6(local), IpAddr::V6(remote)) => {
                if params.encap.is_some() {
                    return Err(InstallSaError::Ipv6Outer {
                        name: params.name,
                        local: params.local,
                        remote: params.remote,
                    });
                }
                let outer = crate::esp::OuterHeader::ipv6(local, remote, self.outer_ttl);
                return self.register_and_insert(params, keys, outer, None, now);
            }
            _ => {
                return Err(InstallSaError::MixedFamilies {
                    name: params.name,
                    local: params.local,
                    remote: params.remote,
                })
            }
        };
        let peer = params
            .encap
            .map(|encap| self.peers.cell(local, configured_remote, encap));
        // A rekeyed SA of a peer that moved starts where the peer is now.
        let seen_peer = peer.as_ref().map(|p| p.current());
        let encap = params.encap.map(|encap| UdpEncap {
            remote_port: seen_peer.map_or(encap.remote_port, |p| p.port),
            ..encap
        });
        let remote = seen_peer.map_or(configured_remote, |p| p.address);
        if let Some(encap) = params.encap {
            if !self.nat_ports.contains(&encap.local_port) {
                self.nat_ports.push(encap.local_port);
            }
        }
        let outer = crate::esp::OuterHeader::with_encap(local, remote, self.outer_ttl, encap);
        self.register_and_insert(params, keys, outer, peer.map(|p| (p, seen_peer)), now)
    }

    /// Registers an SA's keys with the engine and puts it in the SAD.
    fn register_and_insert(
        &mut self,
        params: SaParams,
        keys: SessionSpec,
        outer: crate::esp::OuterHeader,
        peer: Option<(Arc<nat::Peer>, Option<nat::PeerAddr>)>,
        now: Duration,
    ) -> Result<SaId, InstallSaError> {
        let handle = self.engine.register(&keys)?;
        self.sa_changes += 1;
        let (peer, seen_peer) = match peer {
            Some((peer, seen)) => (Some(peer), seen),
            None => (None, None),
        };
        let crypto = SaCrypto {
            handle,
            algorithm: keys.algorithm,
            outer,
            keys: Arc::new(keys),
            peer,
            seen_peer,
        };
        self.sad.insert(params, crypto, now).map_err(|e| {
            self.engine.release(handle);
            InstallSaError::from(e)
        })
    }

    /// Installs a copy of another worker's SA (see [`Sad::adopt`]): its
    /// keys are registered with this gateway's engine.
    pub fn adopt_sa(&mut self, mut sa: SecurityAssociation<SaCrypto>) -> Result<SaId, InstallSaError> {
        let handle = self.engine.register(&sa.crypto().keys)?;
        self.sa_changes += 1;
        sa.crypto_mut().handle = handle;
        self.sad.adopt(sa).map_err(|e| {
            self.engine.release(handle);
            InstallSaError::from(e)
        })
    }

    /// Removes an SA and releases its session: the engine wipes its keys.
    /// Its packets still in flight finish against the SA's absence (they
    /// are dropped as `unknown_spi` or counted as sent).
    pub fn remove_sa(&mut self, id: SaId) -> Option<SecurityAssociation<SaCrypto>> {
        let sa = self.sad.remove(id)?;
        self.sa_changes += 1;
        self.engine.release(sa.crypto().handle);
        Some(sa)
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
        self.follow_peers();
        self.send_keepalives(now, out);
        self.sad.handle_timeout(now);
        self.pump(now, out);
        self.expire_jobs(now, out);
        if self.reassembler.in_progress() > 0 {
            let mut spent = std::mem::take(&mut self.spent);
            self.reassembler.expire(now, &mut spent);
            self.spent = spent;
            self.give_up_spent(out);
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
                self.send_neighbor_request(hop, port, out);
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
    /// those needing crypto go to the engine as one burst, and follow from
    /// this call, `poll` or `handle_timeout` once the engine is done (or
    /// the next hop resolved). `pool` is the driver's:
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
            gw.follow_peers();
            gw.prefetch_policies(from, bufs);
            // Two passes: every frame is classified first and the SAs it
            // names start loading into the cache, then each goes on in
            // arrival order. With many tunnels the SA state is then there
            // when its packet's turn comes, rather than a miss per packet.
            let mut classified = std::mem::take(&mut gw.classified);
            for mut buf in bufs.drain(..) {
                gw.stats.rx_packets += 1;
                let class = gw.classify(from, &mut buf);
                if let Classified::Encapsulate(sa) = class {
                    gw.sad.prefetch(sa);
                }
                classified.push((buf, class));
            }
            for (buf, class) in classified.drain(..) {
                match class {
                    Classified::Done(result) => gw.emit(buf, result, out),
                    Classified::Arp(arp) => gw.handle_arp(now, from, buf, arp, out),
                    Classified::Fragment => gw.reassemble(now, buf, out),
                    Classified::Encapsulate(sa) => gw.start_encapsulation(now, sa, buf, out),
                    Classified::Decapsulate => gw.start_decapsulation(now, buf, out),
                }
            }
            gw.classified = classified;
            // Packets that waited for a neighbour an advertisement in this
            // batch resolved.
            out.append(&mut gw.released);
            gw.pump(now, out);
        });
    }

    /// Hands queued jobs to the engine and finishes whatever it has
    /// completed by `now`, without waiting.
    pub fn poll(&mut self, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
        self.lend(pool, |gw| {
            gw.last_now = gw.last_now.max(now);
            gw.pump(now, out);
        });
    }

    /// When the gateway wants `poll` or `handle_timeout` next, as quinn's
    /// `poll_timeout`: the engine's next modelled completion, a job or held
    /// packet about to time out, a reassembly or ARP deadline. `None`: not
    /// before new input (or, with a real device, its completion; see
    /// [`next_completion`](Self::next_completion)).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Duration> {
        [self.jobs_deadline(), self.timer_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next of the deadlines only [`handle_timeout`](Self::handle_timeout)
    /// serves (a reassembly's, a neighbour retry's, the NAT keepalives'),
    /// for a driver that ticks `handle_timeout` on a period and wants these
    /// on time; each moves past `now` once `handle_timeout(now)` ran.
    #[must_use]
    pub fn timer_deadline(&self) -> Option<Duration> {
        [
            self.reassembler.next_deadline(),
            self.neighbors.next_deadline(),
            self.keepalive_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Stops: every packet still parked for ARP or held in reassembly is
    /// handed back, dropped. Jobs with the engine are the driver's to wait
    /// for first (`drive::flush`); those left are reclaimed as
    /// `engine_timeout`.
    pub fn shutdown(&mut self, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
        self.lend(pool, |gw| {
            gw.pump(now, out);
            gw.expire_jobs(now + JOB_TIMEOUT * 2, out);
            let mut spent = std::mem::take(&mut gw.spent);
            gw.reassembler.drain(&mut spent);
            gw.spent = spent;
            gw.give_up_spent(out);
            let mut parked = std::mem::take(&mut gw.waiting);
            gw.neighbors.drain(&mut parked);
            for w in parked.drain(..) {
                gw.stats.drops.count(DropReason::NeighborUnreachable);
                out.push((w.buf, Verdict::Drop(DropReason::NeighborUnreachable)));
            }
            gw.waiting = parked;
        });
    }

    fn emit(&mut self, mut buf: PacketBuf, result: Result<Next, DropReason>, out: &mut Vec<Output>) {
        let verdict = match result {
            Ok(Next::Local) => return self.originate(buf, out),
            Ok(Next::Consume) => Verdict::Consumed,
            Ok(Next::Control) => Verdict::Control,
            Ok(Next::Reply(port)) => Verdict::Forward(port),
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

    /// Sends a UDP datagram from our address on the way to `to`, IPv4 or
    /// IPv6 (the control plane's messages, the IKE relay's). It takes the normal route, ARP included,
    /// and no policy applies: the key exchange is exempt from the SPD, as
    /// Linux exempts an IKE daemon's sockets from xfrm policies (RFC 4301
    /// §5.1 lets IKE bypass). Outputs go to `out`.
    pub fn send_datagram(
        &mut self,
        now: Duration,
        ports: (u16, u16),
        to: IpAddr,
        payload: &[u8],
        out: &mut Vec<Output>,
        pool: &mut PacketPool,
    ) -> Result<(), DatagramError> {
        let mut buf = pool.alloc().ok_or(DatagramError::NoBuffer)?;
        let written = match to {
            IpAddr::V4(to) => {
                let Some(hop) = self.routes.lookup(to) else {
                    pool.free(buf);
                    return Err(DatagramError::NoRoute(to.into()));
                };
                let from = self.interfaces[hop.port.index()].address;
                icmp::udp_datagram(
                    &mut buf,
                    (from, ports.0),
                    (to, ports.1),
                    self.next_ip_id.take(),
                    payload,
                )
            }
            IpAddr::V6(to) => {
                let from = self
                    .routes
                    .lookup6(to)
                    .and_then(|hop| self.interfaces[hop.port.index()].address6);
                let Some((from, _)) = from else {
                    pool.free(buf);
                    return Err(DatagramError::NoRoute(to.into()));
                };
                crate::icmp6::udp_datagram(&mut buf, (from, ports.0), (to, ports.1), payload)
            }
        };
        if !written {
            pool.free(buf);
            return Err(DatagramError::TooLarge(payload.len()));
        }
        self.lend(pool, |gw| {
            gw.last_now = gw.last_now.max(now);
            gw.stats.generated += 1;
            gw.stats.control_sent += 1;
            gw.emit(buf, Ok(Next::Route), out);
        });
        Ok(())
    }
}
