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
//! driver's business (the `drivers` crate's `drive`).
//!
//! The front and its stages. [`Gateway`] is the front: the only type with
//! the entry points, and the one that moves a packet from stage to stage;
//! each stage owns its state behind its type's API, and hands the packet
//! back to the front when it is done with it:
//!
//! - `ingress`: what a received frame is (IPv4, IPv6 in `ingress::v6`, UDP
//!   to the encapsulation ports), against the SPD and the SAD it is lent;
//! - `outbound`: ESP out, the MTU rules and *prepare*;
//! - `jobs`: the engine job machine, from launch to completion;
//! - `inbound`: ESP in, *prepare*, the packets held or waiting, *finish*;
//! - `egress`: next hops and neighbours (ARP, and what ingress saw of
//!   NDP, handed on by the front), fragmentation and framing;
//! - `local`: the gateway's own traffic (reassembly, ICMP error limits,
//!   keepalives);
//! - `encap`: the UDP-encapsulated peers and their moves.
//!
//! The front owns what several stages read: the SPD and the SAD, and the
//! `addressing` (interfaces and routes, fixed for the gateway's life), each
//! lent to the stages that read it; the outer IPv4 IDs (`ipid`); the
//! counters (stages count through the `Sink` or what they are lent); and
//! the driver's pool while a call lasts. A stage calls no other stage:
//! whatever one finds for another (an NDP sighting for egress, a job for
//! the engine) comes back to the front, which hands it on. What the stages
//! share are leaves that call no stage: `setup` and `output` (vocabulary),
//! `addressing`, `ipid`, `transit` (the per-hop rules) and `own_packets`
//! (the outbound SPD's word on the gateway's own packets). The module
//! lists are `dataplane/tests/structure.rs`'s, which checks all this.

mod addressing;
mod egress;
mod encap;
mod inbound;
mod ingress;
mod ipid;
mod jobs;
mod local;
mod outbound;
mod output;
mod own_packets;
mod setup;
mod transit;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use accel::{Direction, Engine, NextCompletion, RegisterError, SessionSpec, Style};
use spd_sad::{Mode, SaEvent, SaId, SaParams, Sad, SadError, SecurityAssociation, Spd, UdpEncap};

use crate::buffer::{PacketBuf, PacketPool};
use crate::esp::Pending;
pub use crate::esp::SaCrypto;
use crate::icmp;
use crate::icmp6;
use crate::nat;
use crate::neighbor::Neighbors;
use crate::route::{Interface, Port, RoutingTable};
use crate::stats::{DropReason, Stats};
use crate::wire::ipv4;
pub use inbound::{AWAIT_LIMIT, HOLD_LIMIT};
use ingress::Classified;
pub use jobs::BACKLOG_LIMIT;

/// How long a job may stay with the engine before the gateway gives up on
/// it (a stalled channel, a lost completion), and how long a packet may be
/// held for its ESN inference.
pub const JOB_TIMEOUT: Duration = Duration::from_millis(250);

/// How often [`Gateway::handle_timeout`] adds up SA usage, re-evaluates
/// lifetimes and looks for jobs the engine has held too long: the
/// granularity of time-based lifetimes and of [`JOB_TIMEOUT`].
pub const HOUSEKEEPING: Duration = Duration::from_millis(100);
use output::{IcmpError, Next, Sink};
pub use output::{Output, Verdict};
pub use setup::{GatewaySetup, LinkLayer, CONTROL_PORT};

/// Why an SA could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallSaError {
    /// The SAD refused it (a duplicate name or SPI, bad parameters).
    #[error(transparent)]
    Sad(#[from] SadError),
    /// The engine refused its keys.
    #[error(transparent)]
    Engine(#[from] RegisterError),
    #[error(
        "SA `{0}`: UDP encapsulation needs tunnel mode (transport mode behind a NAT needs the peers' \
         original addresses to fix inner checksums, RFC 3948 §3.1.2)"
    )]
    /// Transport mode with UDP encapsulation (the SA's name).
    TransportOverUdp(String),
    #[error(
        "SA `{name}`: outer addresses {local} -> {remote} are IPv6, which this gateway carries \
         without UDP encapsulation only so far (no NAT-T over IPv6); leave out `encap`, or give \
         IPv4 ends"
    )]
    /// IPv6 ends with UDP encapsulation, which this gateway does not do.
    Ipv6Outer {
        /// The SA's name.
        name: String,
        /// Our end.
        local: std::net::IpAddr,
        /// The peer's end.
        remote: std::net::IpAddr,
    },
    #[error("SA `{name}`: its ends {local} and {remote} are of different address families")]
    /// One end IPv4, the other IPv6.
    MixedFamilies {
        /// The SA's name.
        name: String,
        /// Our end.
        local: std::net::IpAddr,
        /// The peer's end.
        remote: std::net::IpAddr,
    },
}

/// Why the gateway could not send a control datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatagramError {
    /// No route to the address, or (IPv6) no `address6` on the way.
    #[error("no route to {0}")]
    NoRoute(IpAddr),
    /// The driver's pool is empty.
    #[error("no free packet buffer")]
    NoBuffer,
    #[error("a {0}-byte datagram does not fit a packet buffer")]
    /// The payload (this many bytes) does not fit a packet buffer.
    TooLarge(usize),
}

/// The gateway core.
pub struct Gateway {
    /// What it was built from, for forks.
    setup: GatewaySetup,
    /// What a received frame is.
    ingress: ingress::Ingress,
    /// The interfaces and routes, fixed for the gateway's life: lent, read
    /// only, to the stages.
    addressing: addressing::Addressing,
    /// The neighbours and the SAs' cached hops: what leaves and how.
    egress: egress::Egress,
    /// Outer IPv4 identifications, from this worker's residue class.
    ip_ids: ipid::IpIds,
    /// The driver's pool, lent for the duration of a call, for frames the
    /// gateway originates (ARP requests, fragments).
    pool: PacketPool,
    /// Reassembly, ICMP error limits, keepalives: the gateway's own
    /// traffic.
    local: local::Local,
    /// Bumped whenever an SA is installed, adopted or removed (with the
    /// SAD's size and the peers' epoch, what reassembly's sources follow).
    sa_changes: u64,
    outer_ttl: u8,
    spd: Spd,
    sad: Sad<SaCrypto>,
    /// The engine and the packets it has.
    jobs: jobs::JobMachine,
    /// ESP in: packets held for their ESN inference or waiting for their
    /// SA's durable ceiling.
    inbound: inbound::EspIn,
    /// ESP out: the IV generator.
    outbound: outbound::EspOut,
    /// Jobs the machine handed back, reused between steps.
    finished: Vec<accel::Job>,
    /// What the machine knew of each of `finished`, at the same index.
    known: Vec<jobs::Done>,
    stats: Stats,
    last_now: Duration,
    /// When the SA lifetimes and the engine's overdue jobs are looked at
    /// next (every [`HOUSEKEEPING`]).
    next_housekeeping: Duration,
    /// UDP-encapsulated peers, shared with the forks, and how far this
    /// gateway's SAs followed them.
    nat: encap::NatPeers,
    /// Scratch for `handle_batch`'s two passes (kept, so not allocated
    /// per batch).
    classified: Vec<(PacketBuf, Classified)>,
    /// Packets an NDP message released during classification, for the
    /// end of the batch's output.
    released: Vec<Output>,
}

impl Gateway {
    /// A gateway built from `setup`, handing its crypto to `engine`, with
    /// no SAs and no policies yet.
    pub fn new(setup: GatewaySetup, engine: Box<dyn Engine>) -> Self {
        Gateway {
            ingress: ingress::Ingress::new(setup.control_port, setup.only_own_mac),
            addressing: addressing::Addressing::new(&setup),
            egress: egress::Egress::new(&setup),
            ip_ids: ipid::IpIds::new(0, 1),
            pool: PacketPool::default(),
            local: local::Local::new(
                setup.icmp_limits,
                setup.nat_keepalive.filter(|_| setup.answer_arp),
            ),
            sa_changes: 0,
            outer_ttl: setup.outer_ttl,
            spd: Spd::new(),
            sad: Sad::new(),
            jobs: jobs::JobMachine::new(engine, setup.style),
            inbound: inbound::EspIn::default(),
            outbound: outbound::EspOut::new(),
            finished: Vec::with_capacity(256),
            known: Vec::with_capacity(256),
            stats: Stats::default(),
            last_now: Duration::ZERO,
            next_housekeeping: Duration::ZERO,
            nat: encap::NatPeers::new(setup.outer_ttl),
            classified: Vec::with_capacity(128),
            released: Vec::new(),
            setup,
        }
    }

    /// Hands `f` the flows of the outbound packets policies discarded
    /// since the last call (at most the last few), each with the
    /// discarding policy's name, and forgets them.
    pub fn take_outbound_discards(&mut self, f: impl FnMut(&str, &spd_sad::FlowKey)) {
        self.ingress.take_outbound_discards(&self.spd, f);
    }

    /// The gateway's counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The security policy database.
    pub fn spd(&self) -> &Spd {
        &self.spd
    }

    /// The security policy database, to add, remove or repoint policies.
    pub fn spd_mut(&mut self) -> &mut Spd {
        &mut self.spd
    }

    /// The security association database.
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

    /// Whether the SA named `name` is installed and has carried packets
    /// (what the control plane asks before it retires a replaced SA).
    pub fn sa_carried_packets(&self, name: &str) -> bool {
        self.sad
            .find(name)
            .and_then(|id| self.sad.get(id))
            .is_some_and(|sa| sa.counters().packets > 0)
    }

    /// Adds this worker's unflushed SA usage to the state the workers
    /// share. For a driver whose workers have stopped: what the shared
    /// state says then is final (see [`Sad::flush_all_usage`]).
    pub fn flush_sa_usage(&mut self) {
        self.sad.flush_all_usage();
    }

    /// The interface of `port`.
    pub fn interface(&self, port: Port) -> &Interface {
        self.addressing.interface(port)
    }

    /// The routes of both families.
    pub fn routes(&self) -> &RoutingTable {
        self.addressing.routes()
    }

    /// The neighbour table (for reports and tests).
    pub fn neighbors(&self) -> &Neighbors {
        self.egress.neighbors()
    }

    /// The framing of the outside port (and of the inside one unless the
    /// setup gave it its own).
    pub fn link(&self) -> LinkLayer {
        self.addressing.link()
    }

    /// Whether `addr` is one of the gateway's own addresses.
    fn is_local(&self, addr: IpAddr) -> bool {
        self.addressing.is_local(addr)
    }

    /// How packets' crypto is handed to the engine.
    pub fn style(&self) -> Style {
        self.jobs.style()
    }

    /// Which engine this gateway hands its crypto to.
    pub fn engine_kind(&self) -> accel::EngineKind {
        self.jobs.engine_kind()
    }

    /// The engine's own counters.
    pub fn engine_counters(&self) -> accel::EngineCounters {
        self.jobs.engine_counters()
    }

    /// The engine, for drivers: they wait on it ([`Engine::wait`]) when
    /// its completions come from a real device. The core never does.
    pub fn engine_mut(&mut self) -> &mut dyn Engine {
        self.jobs.engine_mut()
    }

    /// When the engine's next completion can be collected.
    pub fn next_completion(&self) -> NextCompletion {
        self.jobs.next_completion()
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
        copy.nat = self.nat.fork();
        copy.ingress = self.ingress.fork();
        copy.spd = self.spd.clone();
        copy.sad = self.sad.fork();
        let ids: Vec<SaId> = copy.sad.iter().map(|(id, _)| id).collect();
        for id in ids {
            if let Some(sa) = copy.sad.get_mut(id) {
                let crypto = sa.crypto_mut();
                crypto.handle = copy.jobs.register(&crypto.keys)?;
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
        self.ip_ids = ipid::IpIds::new(worker, workers);
    }

    /// Makes CBC IVs a deterministic function of `seed`. Only for tests and
    /// reproducible captures: IVs must otherwise be unpredictable, which is
    /// what the default OS-seeded generator gives.
    pub fn set_iv_seed(&mut self, seed: u64) {
        self.outbound.set_iv_seed(seed);
    }

    /// The latest time the gateway was given (for ages and lifetimes in
    /// reports).
    pub fn now(&self) -> Duration {
        self.last_now
    }

    /// Packets taken in and not yet returned to the driver: with the
    /// engine, waiting for it, or held for their ESN inference.
    pub fn in_flight(&self) -> usize {
        self.jobs.live() + self.inbound.live()
    }

    /// Our ports that UDP-encapsulated SAs receive on (for the outside
    /// steering program).
    pub fn nat_ports(&self) -> &[u16] {
        self.ingress.nat_ports()
    }

    /// Takes ESP in UDP, keepalives and IKE behind the non-ESP marker on
    /// `port` before any SA receives there: a tunnel keyed by an exchange
    /// over its encapsulation port has none until the exchange is done.
    pub fn open_encapsulation_port(&mut self, port: u16) {
        self.ingress.open_encapsulation_port(port);
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
        self.nat.current(local, remote, encap)
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
            .map(|encap| self.nat.cell(local, configured_remote, encap));
        // A rekeyed SA of a peer that moved starts where the peer is now.
        let seen_peer = peer.as_ref().map(|p| p.current());
        let encap = params.encap.map(|encap| UdpEncap {
            remote_port: seen_peer.map_or(encap.remote_port, |p| p.port),
            ..encap
        });
        let remote = seen_peer.map_or(configured_remote, |p| p.address);
        if let Some(encap) = params.encap {
            self.ingress.open_encapsulation_port(encap.local_port);
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
        let handle = self.jobs.register(&keys)?;
        self.sa_changes += 1;
        let (peer, seen_peer) = match peer {
            Some((peer, seen)) => (Some(peer), seen),
            None => (None, None),
        };
        let crypto = SaCrypto {
            plan: crate::esp::EspPlan::new(params.mode, &outer, keys.algorithm),
            handle,
            algorithm: keys.algorithm,
            outer,
            keys: Arc::new(keys),
            peer,
            seen_peer,
        };
        self.sad.insert(params, crypto, now).map_err(|e| {
            self.jobs.release(handle);
            InstallSaError::from(e)
        })
    }

    /// Installs a copy of another worker's SA (see [`Sad::adopt`]): its
    /// keys are registered with this gateway's engine.
    pub fn adopt_sa(&mut self, mut sa: SecurityAssociation<SaCrypto>) -> Result<SaId, InstallSaError> {
        let handle = self.jobs.register(&sa.crypto().keys)?;
        self.sa_changes += 1;
        sa.crypto_mut().handle = handle;
        self.sad.adopt(sa).map_err(|e| {
            self.jobs.release(handle);
            InstallSaError::from(e)
        })
    }

    /// Removes an SA and releases its session: the engine wipes its keys.
    /// Its packets still in flight finish against the SA's absence (they
    /// are dropped as `unknown_spi` or counted as sent).
    pub fn remove_sa(&mut self, id: SaId) -> Option<SecurityAssociation<SaCrypto>> {
        let sa = self.sad.remove(id)?;
        self.sa_changes += 1;
        self.jobs.release(sa.crypto().handle);
        Some(sa)
    }

    /// Does what is due by `now` (see [`poll_timeout`](Self::poll_timeout)):
    /// every [`HOUSEKEEPING`], adds up SA usage, re-evaluates lifetimes and
    /// gives up on jobs the engine has held longer than [`JOB_TIMEOUT`];
    /// at their deadlines, sends NAT keepalives, repeats ARP requests,
    /// drops packets whose next hop never answered and datagrams whose
    /// fragments stopped coming. Cheap when nothing is due.
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
        self.nat.follow(&mut self.sad);
        self.send_keepalives(now, out);
        let housekeeping = now >= self.next_housekeeping;
        if housekeeping {
            self.next_housekeeping = now + HOUSEKEEPING;
        }
        // A tick that left SAs past its budget goes on at the next call.
        if housekeeping || self.sad.tick_backlog() {
            self.sad.handle_timeout(now);
        }
        self.pump(now, out);
        if housekeeping {
            self.expire_jobs(now, out);
        } else {
            self.expire_held(now, out);
        }
        self.local
            .handle_timeout(now, &mut Sink::new(out, &mut self.stats));
        let mut sink = Sink::new(out, &mut self.stats);
        self.egress
            .handle_timeout(&self.addressing, now, &mut self.pool, &mut sink);
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
            gw.nat.follow(&mut gw.sad);
            {
                let (ingress, lent) = gw.ingress();
                ingress.prefetch_policies(&lent, from, bufs);
            }
            // Two passes: every frame is classified first and the SAs it
            // names start loading into the cache, then each goes on in
            // arrival order. With many tunnels the SA state is then there
            // when its packet's turn comes, rather than a miss per packet.
            let mut classified = std::mem::take(&mut gw.classified);
            for mut buf in bufs.drain(..) {
                gw.stats.rx_packets += 1;
                let (ingress, mut lent) = gw.ingress();
                let class = ingress.classify(&mut lent, from, &mut buf);
                // What an NDP message taught is in the neighbour table before
                // anything of this batch is routed.
                if gw.ingress.has_sightings() {
                    gw.learn_neighbors();
                }
                let class = match class {
                    // Written now, in arrival order, for the rate limits.
                    Classified::Done(Ok(Next::Error(error))) => Classified::Done(gw.refuse(&mut buf, error)),
                    class => class,
                };
                if let Classified::Encapsulate(sa) = class {
                    gw.sad.prefetch(sa);
                }
                classified.push((buf, class));
            }
            for (buf, class) in classified.drain(..) {
                match class {
                    Classified::Done(result) => gw.emit(buf, result, out),
                    Classified::Arp(arp) => gw.egress.handle_arp(
                        &gw.addressing,
                        now,
                        from,
                        buf,
                        arp,
                        &mut Sink::new(out, &mut gw.stats),
                    ),
                    Classified::Fragment => gw.reassemble(now, buf, out),
                    Classified::Encapsulate(sa) => gw.start_encapsulation(now, sa, buf, out),
                    Classified::Decapsulate => gw.start_decapsulation(now, buf, out),
                }
            }
            gw.classified = classified;
            // Packets that waited for a neighbour an NDP message of this
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

    /// When the gateway wants [`handle_timeout`](Self::handle_timeout)
    /// next, as quinn's `poll_timeout`: the engine's next modelled
    /// completion or queued work, a held packet about to time out, a
    /// reassembly, neighbour or keepalive deadline, and the next
    /// [`HOUSEKEEPING`] while there are SAs or jobs. A driver calls
    /// `handle_timeout(now)` once this is `<= now`; every deadline moves
    /// past `now` once it has. `None`: nothing before new input (or, with
    /// a real device, its completion; see
    /// [`next_completion`](Self::next_completion)).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Duration> {
        let housekeeping = if self.sad.tick_backlog() {
            Some(self.last_now)
        } else {
            (!self.sad.is_empty() || self.jobs.live() > 0).then_some(self.next_housekeeping)
        };
        [
            self.jobs.deadline(self.last_now),
            self.inbound.deadline(),
            self.local.deadline(self.ingress.receives_encapsulated()),
            self.egress.deadline(),
            housekeeping,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Stops: every packet still parked for ARP or held in reassembly is
    /// handed back, dropped. Jobs with the engine are the driver's to wait
    /// for first (`drivers::drive::flush`); those left are reclaimed as
    /// `engine_timeout`.
    pub fn shutdown(&mut self, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
        self.lend(pool, |gw| {
            gw.pump(now, out);
            gw.expire_jobs(now + JOB_TIMEOUT * 2, out);
            gw.local.shutdown(&mut Sink::new(out, &mut gw.stats));
            gw.egress.shutdown(&mut Sink::new(out, &mut gw.stats));
        });
    }

    fn emit(&mut self, mut buf: PacketBuf, result: Result<Next, DropReason>, out: &mut Vec<Output>) {
        let result = match result {
            Ok(Next::Error(error)) => self.refuse(&mut buf, error),
            result => result,
        };
        let verdict = match result {
            Ok(Next::Local) => return self.originate(buf, out),
            // `refuse` never asks for another error.
            Ok(Next::Error(error)) => Verdict::Drop(error.reason),
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
        let Some(from) = self.addressing.source_toward(to) else {
            pool.free(buf);
            return Err(DatagramError::NoRoute(to));
        };
        let written = match (from, to) {
            (IpAddr::V4(from), IpAddr::V4(to)) => icmp::udp_datagram(
                &mut buf,
                (from, ports.0),
                (to, ports.1),
                self.ip_ids.take(),
                payload,
            ),
            (IpAddr::V6(from), IpAddr::V6(to)) => {
                crate::icmp6::udp_datagram(&mut buf, (from, ports.0), (to, ports.1), payload)
            }
            _ => false,
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

    /// Routes a packet (`Ok(None)`: parked for its next hop, fragmented and
    /// sent, or too big and answered with an ICMP error).
    fn route(&mut self, buf: &mut PacketBuf, out: &mut Vec<Output>) -> Result<Option<Port>, DropReason> {
        let mut sink = Sink::new(out, &mut self.stats);
        let routed = self
            .egress
            .route(&self.addressing, buf, self.last_now, &mut self.pool, &mut sink)?;
        let mtu = match routed {
            egress::Routed::Send(port) => return Ok(Some(port)),
            egress::Routed::Taken => return Ok(None),
            egress::Routed::TooBig(mtu) => u32::from(mtu),
        };
        // The error (RFC 1812 §5.2.7.1 / RFC 1191 fragmentation needed,
        // RFC 8200 §5 packet too big) goes back to the source through the
        // outbound SPD: a packet that came through a tunnel hears back
        // through it.
        if crate::wire::is_ipv6(buf.data()) {
            self.icmp6_error(buf, (icmp6::kind::PACKET_TOO_BIG, 0, mtu), DropReason::FragNeeded)?;
        } else {
            let from = self.address_toward(ipv4::view(buf.data())?.src_addr());
            let error = (icmp::kind::DEST_UNREACHABLE, icmp::kind::FRAG_NEEDED, mtu);
            self.icmp_error(buf, error, from, DropReason::FragNeeded)?;
        }
        let error = std::mem::replace(buf, PacketBuf::empty());
        self.originate(error, out);
        Ok(None)
    }

    /// Sends an encapsulated packet of `sa`: by its cached hop, or routed.
    fn emit_protected(&mut self, sa: SaId, buf: PacketBuf, out: &mut Vec<Output>) {
        let mut sink = Sink::new(out, &mut self.stats);
        if let Some(buf) = self
            .egress
            .send_protected(&self.addressing, sa, buf, self.last_now, &mut sink)
        {
            self.emit(buf, Ok(Next::Route), out);
        }
    }

    /// Hands what classified NDP messages said of their senders to
    /// egress's neighbour table; packets that waited for them are sent,
    /// into `released`, which the batch's output ends with.
    fn learn_neighbors(&mut self) {
        let mut sink = Sink::new(&mut self.released, &mut self.stats);
        for (port, seen) in self.ingress.take_sightings() {
            self.egress
                .learn6(&self.addressing, port, seen, self.last_now, &mut sink);
        }
    }

    /// The classification stage, with what it is lent.
    fn ingress(&mut self) -> (&mut ingress::Ingress, ingress::Lent<'_>) {
        let lent = ingress::Lent {
            spd: &mut self.spd,
            sad: &self.sad,
            addressing: &self.addressing,
            stats: &mut self.stats,
        };
        (&mut self.ingress, lent)
    }

    /// Writes the ICMP or ICMPv6 error a stage asked for in place of the
    /// packet in `buf`: `Ok(Next::Local)` to send it, or the packet's drop.
    fn refuse(&mut self, buf: &mut PacketBuf, error: IcmpError) -> Result<Next, DropReason> {
        match error.from {
            Some(from) => self.icmp_error(buf, error.message, from, error.reason),
            None => self.icmp6_error(buf, error.message, error.reason),
        }
    }

    /// A datagram the reassembler completed: ESP goes on to decapsulation;
    /// UDP is classified again now that it is whole.
    fn reassembled(&mut self, now: Duration, mut datagram: PacketBuf, out: &mut Vec<Output>) {
        let (ingress, mut lent) = self.ingress();
        match ingress.classify_reassembled(&mut lent, &mut datagram) {
            Classified::Decapsulate => self.start_decapsulation(now, datagram, out),
            Classified::Done(result) => self.emit(datagram, result, out),
            // Nothing else comes of a reassembled datagram.
            _ => self.emit(datagram, Err(DropReason::Malformed), out),
        }
    }

    /// Collects a fragment; a completed datagram goes on to
    /// decapsulation (`reassembled`).
    fn reassemble(&mut self, now: Duration, buf: PacketBuf, out: &mut Vec<Output>) {
        let stamp = (self.sa_changes, self.sad.len(), self.nat.epoch());
        let mut sink = Sink::new(out, &mut self.stats);
        if let Some(datagram) = self
            .local
            .reassemble(now, buf, &mut self.pool, (&self.sad, stamp), &mut sink)
        {
            self.reassembled(now, datagram, out);
        }
    }

    /// NAT keepalives, when due: routed, no policy applies.
    fn send_keepalives(&mut self, now: Duration, out: &mut Vec<Output>) {
        if !self.ingress.receives_encapsulated() {
            return;
        }
        let mut sent = Vec::new();
        self.local.keepalives(
            now,
            &self.sad,
            &mut self.ip_ids,
            &mut self.pool,
            &mut self.stats,
            &mut sent,
        );
        for buf in sent {
            self.emit(buf, Ok(Next::Route), out);
        }
    }

    /// Sends a packet the gateway wrote into `buf` (bare IPv4 or IPv6) as
    /// the outbound SPD says.
    fn originate(&mut self, mut buf: PacketBuf, out: &mut Vec<Output>) {
        match own_packets::local_policy(&mut self.spd, &self.addressing, buf.data(), None) {
            Ok(Some(sa)) => {
                own_packets::clear_dont_fragment(&mut buf);
                let now = self.last_now;
                self.start_encapsulation(now, sa, buf, out);
            }
            Ok(None) => self.emit(buf, Ok(Next::Route), out),
            Err(reason) => self.emit(buf, Err(reason), out),
        }
    }

    /// Turns the packet in `buf`, which dies here for `reason`, into an
    /// ICMP error back to its source, from our address `from`, if RFC 1812
    /// §4.3.2.7 allows one and both token buckets have a token (RFC 1812
    /// §4.3.2.8; otherwise counted as `icmp_rate_limited`). The packet is
    /// counted under `reason` either way; `Ok` means the error is to be
    /// sent (it takes the outbound SPD: `Next::Local`), `Err` that the
    /// packet is simply dropped.
    fn icmp_error(
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
    fn icmp6_error(
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
            .then(|| crate::wire::ipv6::view(buf.data()).map(|ip| ip.src_addr()).ok())
            .flatten();
        let spd = &mut self.spd;
        let from = to.and_then(|to| {
            self.addressing.address6_toward(to, |src, dst| {
                own_packets::tunnels_from(spd, src, dst, own_packets::ICMPV6)
            })
        });
        let (Some(to), Some(from)) = (to, from) else {
            return Err(reason);
        };
        self.error_reply(buf, Some(IpAddr::V6(to)), reason, |buf| {
            icmp6::error_in_place(buf, icmp_type, code, rest, from)
        })
    }

    /// The source of an ICMP error to `to` (see `Addressing::address_toward`).
    fn address_toward(&mut self, to: Ipv4Addr) -> Ipv4Addr {
        let spd = &mut self.spd;
        self.addressing.address_toward(to, |src, dst| {
            own_packets::tunnels_from(spd, src, dst, spd_sad::proto::ICMP)
        })
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
        if self.is_local(to) || !self.local.allow_error(to, self.last_now, &mut self.stats) || !write(buf) {
            return Err(reason);
        }
        self.stats.drops.count(reason);
        self.stats.generated += 1;
        crate::fate::mark_replaced(buf, crate::fate::Fate::Dropped(reason));
        Ok(Next::Local)
    }

    /// A packet for `sa_id`: prepared and launched, or its result emitted.
    fn start_encapsulation(&mut self, now: Duration, sa_id: SaId, mut buf: PacketBuf, out: &mut Vec<Output>) {
        let path = outbound::Path {
            ip_id: self.ip_ids.take(),
            mtu: usize::from(self.addressing.interface(Port::Outside).mtu),
            inside: self.addressing.interface(Port::Inside).address,
        };
        match self.outbound.prepare(&mut self.sad, sa_id, &mut buf, path, now) {
            Ok(prepared) => self.launch(
                now,
                prepared.pending,
                Direction::Encrypt,
                prepared.session,
                buf,
                out,
            ),
            Err(result) => self.emit(buf, result, out),
        }
    }

    /// Inbound ESP addressed to us: prepared and launched, held while its
    /// ESN inference depends on packets in flight, or dropped.
    fn start_decapsulation(&mut self, now: Duration, buf: PacketBuf, out: &mut Vec<Output>) {
        if let Some((sa, buf)) = self.prepare_inbound(now, buf, true, out) {
            match self.inbound.hold(sa, buf, now) {
                Ok(()) => self.stats.esn_held += 1,
                Err(buf) => self.emit(buf, Err(DropReason::EngineBusy), out),
            }
        }
    }

    /// Prepares an inbound packet and launches it; one to be held comes
    /// back, with its SA.
    fn prepare_inbound(
        &mut self,
        now: Duration,
        mut buf: PacketBuf,
        behind_held: bool,
        out: &mut Vec<Output>,
    ) -> Option<(SaId, PacketBuf)> {
        match self.inbound.prepare(&mut self.sad, &mut buf, now, behind_held) {
            inbound::Prepared::Ready(pending, session) => {
                self.launch(now, pending, Direction::Decrypt, session, buf, out)
            }
            inbound::Prepared::Hold(sa) => return Some((sa, buf)),
            inbound::Prepared::Drop(reason) => self.emit(buf, Err(reason), out),
        }
        None
    }

    /// An inbound packet's trip ended: once none of its SA's packets is in
    /// flight, the packets held behind them go on, in arrival order.
    fn inbound_done(&mut self, now: Duration, sa_id: SaId, out: &mut Vec<Output>) {
        let idle = self
            .sad
            .get_mut(sa_id)
            .is_some_and(|sa| sa.note_inbound_finished());
        if !idle {
            return;
        }
        while let Some((i, mut held)) = self.inbound.unhold(sa_id) {
            let buf = std::mem::replace(&mut held.buf, PacketBuf::empty());
            if let Some((_, buf)) = self.prepare_inbound(now, buf, false, out) {
                // Still undecided behind the packet just released: back to
                // its place, first in line for this SA.
                self.inbound.rehold(i, held, buf);
                break;
            }
        }
    }

    /// Queues a prepared packet for the engine; `pump` hands it over.
    fn launch(
        &mut self,
        now: Duration,
        pending: Pending,
        direction: Direction,
        session: (accel::SessionHandle, accel::Algorithm),
        buf: PacketBuf,
        out: &mut Vec<Output>,
    ) {
        let sa = pending.sa;
        if let Err(buf) = self.jobs.launch(now, pending, direction, session, buf) {
            if direction == Direction::Decrypt {
                self.inbound_done(now, sa, out);
            }
            self.emit(buf, Err(DropReason::EngineBusy), out);
        }
    }

    /// Hands queued jobs to the engine and finishes what it completed, until
    /// neither moves. Never waits.
    fn pump(&mut self, now: Duration, out: &mut Vec<Output>) {
        if self.inbound.any_waiting() {
            self.release_awaiting(now, out);
        }
        let mut done = std::mem::take(&mut self.finished);
        self.jobs.run_inline(&mut done);
        for job in done.drain(..) {
            // Inline jobs are outbound, the SA's id in `user`.
            self.finish_outbound(SaId(job.user as u32), job, out);
        }
        let mut known = std::mem::take(&mut self.known);
        loop {
            let (submitted, completed) = self.jobs.step(now, &mut done, &mut known);
            self.complete_all(now, &mut done, &mut known, out);
            if submitted == 0 && completed == 0 {
                break;
            }
        }
        self.finished = done;
        self.known = known;
    }

    /// Finishes, in order, the jobs the machine handed back.
    fn complete_all(
        &mut self,
        now: Duration,
        done: &mut Vec<accel::Job>,
        known: &mut Vec<jobs::Done>,
        out: &mut Vec<Output>,
    ) {
        debug_assert_eq!(done.len(), known.len());
        for (job, info) in done.drain(..).zip(known.drain(..)) {
            self.complete(now, job, info, out);
        }
    }

    /// A job came back from the engine.
    #[inline]
    fn complete(&mut self, now: Duration, job: accel::Job, done: jobs::Done, out: &mut Vec<Output>) {
        match (done.outcome, done.direction) {
            (jobs::Outcome::Unknown, _) => self.emit(job.buf, Err(DropReason::EngineError), out),
            (jobs::Outcome::Abandoned, _) => {
                if done.direction == Direction::Decrypt {
                    self.inbound_done(now, done.sa, out);
                }
                self.emit(job.buf, Err(DropReason::EngineTimeout), out);
            }
            (jobs::Outcome::Completed, Direction::Encrypt) => self.finish_outbound(done.sa, job, out),
            (jobs::Outcome::Completed, Direction::Decrypt) => {
                let pending = Pending {
                    sa: done.sa,
                    desc: job.desc,
                    esp_offset: job.offset,
                    seq: done.seq,
                    protected_len: 0,
                };
                self.finish_inbound(now, job.buf, pending, true, out)
            }
        }
    }

    /// An outbound packet the engine is done with: sent, or dropped.
    #[inline]
    fn finish_outbound(&mut self, sa: SaId, job: accel::Job, out: &mut Vec<Output>) {
        match crate::esp::encapsulate_finish(job.desc.status) {
            Ok(()) => {
                self.stats.encapsulated += 1;
                self.emit_protected(sa, job.buf, out);
            }
            Err(reason) => self.emit(job.buf, Err(reason), out),
        }
    }

    /// Finishes an inbound packet whose engine pass is over. One beyond
    /// its SA's durable ceiling waits for it to be raised (when `may_wait`
    /// and there is room), still in flight for its SA.
    fn finish_inbound(
        &mut self,
        now: Duration,
        mut buf: PacketBuf,
        pending: Pending,
        may_wait: bool,
        out: &mut Vec<Output>,
    ) {
        // The ceiling may have been raised since the waiting packets were
        // last looked at: they go first, and while any of this SA's still
        // wait this one waits behind them, whatever its number, or it
        // could carry the window so far past them that they would be
        // refused as too old.
        if may_wait && self.inbound.any_waiting() {
            self.release_awaiting(now, out);
            if self.inbound.waits(pending.sa) {
                return self.wait_for_ceiling(buf, pending, now, out);
            }
        }
        let mut lent = inbound::Lent {
            sad: &mut self.sad,
            addressing: &self.addressing,
            stats: &mut self.stats,
        };
        let (result, arrival) = self.inbound.finish(&mut lent, &mut buf, &pending, now);
        if let Some(from) = arrival {
            self.nat
                .learn(&mut self.sad, pending.sa, pending.seq, from, &mut self.stats);
        }
        if result == Err(DropReason::SeqNotReserved) {
            if may_wait {
                return self.wait_for_ceiling(buf, pending, now, out);
            }
            if let Some(sa) = self.sad.get_mut(pending.sa) {
                sa.counters_mut().count(DropReason::SeqNotReserved);
            }
        }
        self.inbound_done(now, pending.sa, out);
        self.emit(buf, result, out);
    }

    /// Puts an authentic inbound packet in line for its SA's ceiling
    /// (still in flight for its SA), or drops it if the line is full.
    fn wait_for_ceiling(&mut self, buf: PacketBuf, pending: Pending, now: Duration, out: &mut Vec<Output>) {
        let Err(buf) = self.inbound.queue_for_ceiling(buf, pending, now) else {
            self.stats.seq_awaited += 1;
            return;
        };
        if let Some(sa) = self.sad.get_mut(pending.sa) {
            sa.counters_mut().count(DropReason::SeqNotReserved);
        }
        self.inbound_done(now, pending.sa, out);
        self.emit(buf, Err(DropReason::SeqNotReserved), out);
    }

    /// Finishes the waiting packets whose SA's ceiling has come up to them
    /// (the ceiling may rise while the line is looked at).
    fn release_awaiting(&mut self, now: Duration, out: &mut Vec<Output>) {
        let mut pass = inbound::ReleasePass::default();
        while let Some(waiting) = self.inbound.next_released(&mut pass, &mut self.sad) {
            self.finish_inbound(now, waiting.buf, waiting.pending, false, out);
        }
    }

    /// Gives up on jobs the engine has held past [`JOB_TIMEOUT`] (they come
    /// back through `reclaim`, or later, as `engine_timeout`) and on packets
    /// held or waiting that long.
    fn expire_jobs(&mut self, now: Duration, out: &mut Vec<Output>) {
        let mut done = std::mem::take(&mut self.finished);
        let mut known = std::mem::take(&mut self.known);
        self.jobs.expire(now, &mut done, &mut known);
        self.complete_all(now, &mut done, &mut known, out);
        self.finished = done;
        self.known = known;
        self.expire_held(now, out);
    }

    /// Gives up on inbound packets held or waiting past their limit.
    fn expire_held(&mut self, now: Duration, out: &mut Vec<Output>) {
        while let Some(buf) = self.inbound.expired_held(now) {
            self.emit(buf, Err(DropReason::EngineTimeout), out);
        }
        while let Some(waiting) = self.inbound.expired_waiting(now) {
            if let Some(sa) = self.sad.get_mut(waiting.pending.sa) {
                sa.counters_mut().count(DropReason::SeqNotReserved);
            }
            self.inbound_done(now, waiting.pending.sa, out);
            self.emit(waiting.buf, Err(DropReason::SeqNotReserved), out);
        }
    }

    // Changes to the SAD and SPD as keying sources command them: they
    // build the commands (`crate::command`), the front applies them.

    /// A gateway built from `setup` on `engine`, with `commands` applied
    /// in order at time `now` (a configuration's SAs, ports and policies).
    pub fn with_commands(
        setup: GatewaySetup,
        engine: Box<dyn Engine>,
        commands: &[crate::command::SaCommand],
        now: Duration,
    ) -> Result<Gateway, crate::command::ApplyError> {
        let mut gateway = Gateway::new(setup, engine);
        for command in commands {
            gateway.apply(command, now)?;
        }
        Ok(gateway)
    }

    /// Applies `command` to this gateway at time `now`. A refused command
    /// changes nothing it would have installed; the policies naming a
    /// missing SA discard.
    pub fn apply(
        &mut self,
        command: &crate::command::SaCommand,
        now: Duration,
    ) -> Result<(), crate::command::ApplyError> {
        use crate::command::{ApplyError, InstallError, PolicyAction, SaCommand};
        match command {
            SaCommand::InstallSa(sa) => self.install_setup(sa, now)?,
            SaCommand::RemoveSa(name) => {
                if let Some(id) = self.sad.find(name) {
                    drop(self.remove_sa(id));
                }
            }
            SaCommand::ReplaceSa { old, new } => {
                let state = self.take_sequence_state(old);
                self.install_setup(new, now)?;
                if let Some(state) = state {
                    self.resume_sa(&new.params.name, &state);
                }
            }
            SaCommand::InsertPolicy(policy) => self.insert_policy(policy),
            SaCommand::OpenEncapsulationPort(port) => self.open_encapsulation_port(*port),
            SaCommand::RemovePolicy(name) => {
                self.spd.remove(name);
            }
            SaCommand::Repoint { policy, sa } => {
                let action = self.resolve_action(&PolicyAction::Protect(sa.clone()));
                if !self.spd.set_action(policy, action) {
                    return Err(ApplyError::NoPolicy(policy.clone()));
                }
            }
            SaCommand::SetPolicyAction { policy, action } => {
                let action = self.resolve_action(action);
                if !self.spd.set_action(policy, action) {
                    return Err(ApplyError::NoPolicy(policy.clone()));
                }
            }
            SaCommand::SetSelectors { sa, selectors } => {
                let installed = self
                    .sad
                    .find(sa)
                    .and_then(|id| self.sad.get_mut(id))
                    .ok_or_else(|| ApplyError::NoSa(sa.clone()))?;
                installed
                    .set_selectors(selectors.clone())
                    .map_err(|e| ApplyError::Install(InstallError::Sad(e)))?;
            }
        }
        Ok(())
    }

    /// Applies `command` to the first worker's gateway and returns what
    /// each of the `others` workers must apply for the same effect
    /// ([`apply_worker`](Self::apply_worker)).
    pub fn apply_first(
        &mut self,
        command: crate::command::SaCommand,
        now: Duration,
        others: usize,
    ) -> Result<Vec<crate::command::WorkerCommand>, crate::command::ApplyError> {
        use crate::command::{SaCommand, WorkerCommand};
        self.apply(&command, now)?;
        let installed = |name: &str| self.sad.find(name).and_then(|id| self.sad.get(id));
        let mut copies = Vec::with_capacity(others);
        for _ in 0..others {
            copies.push(match &command {
                SaCommand::InstallSa(sa) => match installed(&sa.params.name) {
                    Some(installed) => WorkerCommand::Adopt(Box::new(installed.fork())),
                    None => WorkerCommand::Apply(command.clone()),
                },
                SaCommand::ReplaceSa { old, new } => match installed(&new.params.name) {
                    Some(installed) => WorkerCommand::AdoptReplacing {
                        sa: Box::new(installed.fork()),
                        old: old.clone(),
                    },
                    None => WorkerCommand::Apply(command.clone()),
                },
                other => WorkerCommand::Apply(other.clone()),
            });
        }
        Ok(copies)
    }

    /// Applies, on a worker after the first, what the first worker's
    /// [`apply_first`](Self::apply_first) handed it.
    pub fn apply_worker(
        &mut self,
        command: crate::command::WorkerCommand,
        now: Duration,
    ) -> Result<(), crate::command::ApplyError> {
        use crate::command::WorkerCommand;
        match command {
            WorkerCommand::Adopt(sa) => {
                let name = sa.name().to_owned();
                self.adopt_sa(*sa).map_err(|e| Self::install_error(&name, e))?;
                Ok(())
            }
            WorkerCommand::AdoptReplacing { mut sa, old } => {
                if let Some(state) = self.take_sequence_state(&old) {
                    sa.resume(&state);
                }
                let name = sa.name().to_owned();
                self.adopt_sa(*sa).map_err(|e| Self::install_error(&name, e))?;
                Ok(())
            }
            WorkerCommand::Apply(command) => self.apply(&command, now),
        }
    }

    /// Installs one SA (its selectors as given) with a new session, and
    /// starts its sequence numbers where it says.
    fn install_setup(
        &mut self,
        sa: &crate::command::SaSetup,
        now: Duration,
    ) -> Result<(), crate::command::InstallError> {
        use crate::command::InstallError;
        let name = &sa.params.name;
        let keys =
            SessionSpec::new(sa.algorithm, sa.params.esn, &sa.enc_key, &sa.auth_key).map_err(|reason| {
                InstallError::Session {
                    sa: name.clone(),
                    reason,
                }
            })?;
        let id = self
            .install_sa(sa.params.clone(), keys, now)
            .map_err(|e| Self::install_error(name, e))?;
        if sa.initial_seq > 0 {
            if let Some(installed) = self.sad.get_mut(id) {
                match sa.params.direction {
                    spd_sad::SaDirection::Outbound => installed.set_last_sequence(sa.initial_seq),
                    spd_sad::SaDirection::Inbound => installed.set_replay_top(sa.initial_seq),
                }
            }
        }
        if let (Some(mark), Some(installed)) = (sa.ledger_mark, self.sad.get_mut(id)) {
            installed.resume_above(mark);
        }
        Ok(())
    }

    /// Why SA `sa` was refused, as a command's error.
    fn install_error(sa: &str, e: InstallSaError) -> crate::command::InstallError {
        use crate::command::InstallError;
        match e {
            InstallSaError::Sad(e) => InstallError::Sad(e),
            InstallSaError::Engine(RegisterError::Keys(reason)) => InstallError::Session {
                sa: sa.to_owned(),
                reason,
            },
            InstallSaError::Engine(reason) => InstallError::Engine {
                sa: sa.to_owned(),
                reason,
            },
            e @ (InstallSaError::TransportOverUdp(_)
            | InstallSaError::Ipv6Outer { .. }
            | InstallSaError::MixedFamilies { .. }) => InstallError::Refused(Box::new(e)),
        }
    }

    /// The SPD action of `action`: a named SA becomes its id.
    fn resolve_action(&self, action: &crate::command::PolicyAction) -> spd_sad::Action {
        use crate::command::PolicyAction;
        match action {
            PolicyAction::Protect(name) => match self.sad.find(name) {
                Some(id) => spd_sad::Action::Protect(id),
                // A keying source names SAs it installed first; a gateway
                // that refused one fails closed.
                None => spd_sad::Action::Discard,
            },
            PolicyAction::Bypass => spd_sad::Action::Bypass,
            PolicyAction::Discard => spd_sad::Action::Discard,
        }
    }

    /// Inserts one policy, its SA looked up by name.
    fn insert_policy(&mut self, policy: &crate::command::PolicySetup) {
        let action = self.resolve_action(&policy.action);
        self.spd.insert(spd_sad::Policy {
            name: policy.name.clone(),
            direction: policy.direction,
            priority: policy.priority,
            selector: policy.selector,
            action,
        });
    }

    /// Removes SA `name`, returning its sequence state.
    fn take_sequence_state(&mut self, name: &str) -> Option<spd_sad::SequenceState> {
        let id = self.sad.find(name)?;
        let state = self.sad.get(id).map(SecurityAssociation::sequence_state);
        drop(self.remove_sa(id));
        state
    }

    /// Continues SA `name` from `state`.
    fn resume_sa(&mut self, name: &str, state: &spd_sad::SequenceState) {
        if let Some(sa) = self.sad.find(name).and_then(|id| self.sad.get_mut(id)) {
            sa.resume(state);
        }
    }
}
