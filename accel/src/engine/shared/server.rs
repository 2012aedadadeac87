//! The server behind `espgw engine serve`: one engine, many tenants, one
//! back-end thread.
//!
//! The thread accepts tenants on the control socket, serves their rings
//! (or sockets) round robin, at most `burst` requests from each per pass
//! and never more than the tenant's in-flight quota, and hands every pass
//! to the engine as one burst: the pipelining of the study's back end.
//! It owns every key: a session registered by a tenant lives in the
//! server's table with its owner, and a descriptor is executed only if
//! its session belongs to the tenant that sent it, names a live handle,
//! and lies inside that tenant's own data area; anything else is refused,
//! counted and completed with an error, never executed; a refusal is
//! posted in the tenant's order, after the jobs it submitted before it
//! (which may still be in the engine). Request bytes are
//! copied out of the tenant's region before anything checks or computes
//! over them, so a tenant that rewrites its region meanwhile harms only
//! itself. A tenant whose socket closes (it died) or that leaves its
//! completions unread past `hung_after` is reclaimed: its sessions are
//! released (the engine wipes the keys), its region unmapped, its queued
//! jobs dropped and its in-flight ones discarded as they complete; the
//! others notice nothing but the engine time those jobs took.
//!
//! Hostile tenants. Admission is by the peer's credentials as the kernel
//! recorded them ([`Access`]). The shared region is created sealed, so no
//! tenant can resize it under the server. The control sockets are the slow
//! path and are kept to it: they are looked at on ticks (every
//! [`TICK_INTERVAL`] and after each sleep) through one epoll set, one
//! message per tenant per turn, within a budget of the server's time
//! ([`CONTROL_SHARE`] of it while tenants have work, all of it once they
//! have had none for `IDLE_AFTER`); a tenant that sends messages outside the protocol, or a
//! request before reading the answer to its last ([`MAX_STRIKES`] of
//! either), is evicted; a connection that has not attached within
//! `attach_within` is closed, and at most `max_unattached` wait at once
//! (the oldest makes room), so idle connections lock out neither tenants
//! nor `stats`, which never needs a tenant's place. Sessions are bounded by
//! what they cost the server in file descriptors ([`FdBudget`]), per tenant
//! and in all. Keys pass through a buffer kept out of core dumps and swap,
//! and the stack the key schedules were built on is wiped after each
//! registration.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zeroize::Zeroize;

use super::rings::Rings;
use super::sys::{self, Epoll, EventFd, Mapping, Received, SecretBuf};
use super::wire::{
    self, layout, op, BurstIter, CompletionEntry, Reply, Request, RequestEntry, StatsReply, Transport,
    COMPLETION_LEN, MAX_MESSAGE, REQUEST_LEN,
};
use crate::buffer::PacketBuf;
use crate::descriptor::{DescriptorError, Status};
use crate::engine::{
    build_engine, Engine, EngineError, EngineKind, EngineSpec, NextCompletion, RegisterError,
};
use crate::job::Job;
use crate::session::{SessionHandle, SessionSpec, SessionTable};

/// Refusal codes of a Refused reply.
pub mod refusal {
    /// The message did not parse, or came out of order.
    pub const PROTOCOL: u8 = 1;
    /// No room: tenants, sessions or sizes beyond the server's limits.
    pub const FULL: u8 = 2;
    /// The keys do not suit the algorithm.
    pub const KEYS: u8 = 3;
    /// The session is not this tenant's.
    pub const NOT_YOURS: u8 = 4;
    /// The server let the tenant go (hung, a ring no honest tenant
    /// writes, or messages outside the protocol); the connection closes
    /// after this message.
    pub const EVICTED: u8 = 5;
    /// The session would cost more of the server's file descriptors than
    /// the tenant, or all tenants together, may hold ([`super::BudgetError`]).
    pub const BUDGET: u8 = 6;
}

/// Who may become a tenant: besides root, the user named here (by default
/// the server's own effective user) and, if set, the members of a group.
/// Checked against `SO_PEERCRED` / `SO_PEERGROUPS`, the credentials the
/// kernel recorded when the peer connected, never anything it says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    /// The user admitted besides root (`None`: the server's effective user).
    pub user: Option<u32>,
    /// A group whose members (primary or supplementary) are admitted too.
    pub group: Option<u32>,
    /// The socket file's group: it is created with mode 0660 and this
    /// group (else 0600), so that the admitted users can connect at all.
    pub socket_group: Option<u32>,
}

/// File descriptors the engine's sessions may hold in the server: per
/// tenant and for all tenants together. `None` takes the default
/// [`Server::bind`] derives from the process's descriptor limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FdLimits {
    /// Descriptors one tenant's sessions may hold.
    pub per_tenant: Option<usize>,
    /// Descriptors all tenants' sessions together may hold.
    pub total: Option<usize>,
}

/// The budget in force, and the check a registration passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// Descriptors one tenant's sessions may hold.
    pub per_tenant: usize,
    /// Descriptors all tenants' sessions together may hold.
    pub total: usize,
}

/// Why a session was refused for what it costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "the session needs {cost} file descriptors in the engine server; this tenant's sessions hold \
         {held} of the {limit} one tenant may (release some, or raise --fds-per-tenant)"
    )]
    /// Over the tenant's share ([`FdBudget::per_tenant`]).
    Tenant {
        /// Descriptors the session would hold.
        cost: usize,
        /// Descriptors the tenant's sessions hold already.
        held: usize,
        /// The tenant's share.
        limit: usize,
    },
    #[error(
        "the session needs {cost} file descriptors in the engine server; all tenants' sessions hold \
         {held} of the {limit} the server has for them (its descriptor limit)"
    )]
    /// Over what the server has for all tenants ([`FdBudget::total`]).
    Total {
        /// Descriptors the session would hold.
        cost: usize,
        /// Descriptors all tenants' sessions hold already.
        held: usize,
        /// The total for all tenants.
        limit: usize,
    },
}

impl FdBudget {
    /// Whether a session costing `cost` may be added to a tenant holding
    /// `tenant` and a server holding `total`.
    pub fn admit(&self, cost: usize, tenant: usize, total: usize) -> Result<(), BudgetError> {
        if cost == 0 {
            return Ok(());
        }
        if tenant + cost > self.per_tenant {
            return Err(BudgetError::Tenant {
                cost,
                held: tenant,
                limit: self.per_tenant,
            });
        }
        if total + cost > self.total {
            return Err(BudgetError::Total {
                cost,
                held: total,
                limit: self.total,
            });
        }
        Ok(())
    }
}

/// What a session costs the server in file descriptors: the kernel
/// engine's sockets (nothing for the engines that keep keys in memory,
/// whose sessions are bounded by count, [`MAX_SESSIONS`]).
pub fn session_fds(kind: EngineKind, spec: &SessionSpec) -> usize {
    match kind {
        EngineKind::Afalg => crate::engine::afalg::session_fds(spec.algorithm),
        _ => 0,
    }
}

/// How a server is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The control socket's path: tenants connect here.
    pub socket: PathBuf,
    /// The engine behind the server: soft, sec (or afalg); never shared.
    pub engine: EngineSpec,
    /// Tenants attached at once at most; one more is refused.
    pub max_tenants: usize,
    /// Requests one tenant may have in flight (also bounded by its ring).
    pub quota: usize,
    /// The largest data slot a tenant may ask for, in bytes.
    pub max_slot: u32,
    /// Requests taken from one tenant per round-robin pass.
    pub burst: usize,
    /// A tenant that leaves completions undelivered this long is reclaimed.
    pub hung_after: Duration,
    /// How long the thread polls an idle set of rings before it sleeps on
    /// the doorbells.
    pub spin: Duration,
    /// A connection that has not attached this long is closed.
    pub attach_within: Duration,
    /// Connections waiting to attach (or asking for `stats`) at once; a
    /// new one closes the oldest. They do not count against `max_tenants`.
    pub max_unattached: usize,
    /// Who may connect.
    pub access: Access,
    /// What sessions may cost in file descriptors.
    pub fds: FdLimits,
}

impl ServerConfig {
    /// The defaults, serving `engine` on `socket`.
    pub fn new(socket: PathBuf, engine: EngineSpec) -> ServerConfig {
        ServerConfig {
            socket,
            engine,
            max_tenants: 64,
            quota: 256,
            max_slot: 16 * 1024 + 512,
            burst: 32,
            hung_after: Duration::from_secs(2),
            spin: Duration::from_micros(50),
            attach_within: Duration::from_secs(1),
            max_unattached: 16,
            access: Access::default(),
            fds: FdLimits::default(),
        }
    }
}

/// Why a server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The control socket could not be bound or listened on.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket's path.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// Something other than a socket is at the path; it is left alone.
    #[error("{path} exists and is not a socket; remove it or choose another path")]
    NotASocket {
        /// The socket's path.
        path: PathBuf,
    },
    /// A live server answers on the path; it is left alone.
    #[error("another server answers on {path}; stop it or choose another path")]
    InUse {
        /// The socket's path.
        path: PathBuf,
    },
    /// The engine behind the server would be a shared engine.
    #[error("the shared engine cannot serve itself: choose soft, sec or afalg behind the server")]
    Nested,
    /// The engine behind the server could not be built.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Waiting for work failed (or the server thread panicked).
    #[error("the server's poll failed: {0}")]
    Poll(io::Error),
    /// A descriptor the server needs (epoll set, eventfd, ...) could not be made.
    #[error("cannot set up the server's {what}: {source}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// What the system said.
        source: io::Error,
    },
}

/// Who owns a server-side session.
#[derive(Debug, Clone, Copy)]
struct Owned {
    tenant: u16,
    generation: u16,
    engine: SessionHandle,
    /// Released by its tenant, not yet with the engine: requests from this
    /// ring position on (socket: every later one) are refused as stale.
    closing: Option<u32>,
    /// File descriptors it holds in the engine ([`session_fds`]).
    fds: usize,
}

struct ShmSide {
    rings: Rings,
    to_server: EventFd,
    to_tenant: EventFd,
    /// Our copies of the indices we own (never read back from the region).
    req_tail: u32,
    comp_head: u32,
    /// The tenant's completion tail as last read: re-read only when the
    /// ring looks full, so that the line it lives on is not pulled across
    /// per completion.
    comp_tail_seen: u32,
    /// Completions written since the last publish.
    dirty: bool,
    /// The tenant's completion tail at the last tick, and when it last
    /// moved: completions left unread past `hung_after` mean a hung tenant.
    seen_tail: u32,
    tail_moved: Instant,
}

struct SocketSide {
    /// Completions message under construction.
    out: Vec<u8>,
    out_count: u16,
    /// Complete messages the socket would not take yet.
    pending: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    /// Completions in `out` and `pending`.
    undelivered: usize,
    /// Control replies in `pending` (not yet taken by the socket).
    replies: usize,
}

impl SocketSide {
    /// Queues the completions message under construction, its count
    /// written, and starts the next in a spare buffer.
    fn seal_burst(&mut self) {
        wire::set_count(&mut self.out, self.out_count);
        let next = self
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(MAX_MESSAGE));
        let full = std::mem::replace(&mut self.out, next);
        self.pending.push_back(full);
        self.out_count = 0;
        wire::start_burst(&mut self.out, op::COMPLETIONS);
    }
}

enum Side {
    /// Connected, no Attach yet.
    Unattached,
    Shm(Box<ShmSide>),
    Socket(Box<SocketSide>),
}

struct Tenant {
    generation: u16,
    sock: OwnedFd,
    side: Side,
    quota: usize,
    max_data: u32,
    /// Jobs in the engine or its queue.
    in_flight: usize,
    /// Completions the completion ring had no room for, in order.
    held: VecDeque<Held>,
    /// The epoch given to jobs accepted now: it moves on at each refusal
    /// that has to wait, so that the jobs accepted before a refusal are
    /// told from those accepted after it.
    epoch: u16,
    /// Jobs in flight per epoch, oldest epoch first (epochs with none left
    /// are dropped from the front).
    epochs: VecDeque<(u16, u32)>,
    /// Refusals waiting for the jobs accepted before them (every epoch up
    /// to and including the one noted) to complete, in order.
    refusals: VecDeque<(u16, CompletionEntry)>,
    sessions: Vec<SessionHandle>,
    /// Releases not yet done: the tenant's earlier requests still have to
    /// reach the engine (shm: the ring read up to the mark).
    releases: Vec<(u32, SessionHandle)>,
    /// Since when completions have waited undelivered.
    stalled_since: Option<Instant>,
    /// Messages outside the protocol, and requests sent before the answer
    /// to the last was read; [`MAX_STRIKES`] of them and it is evicted.
    strikes: usize,
    /// When it connected (the attach deadline runs from here).
    connected: Instant,
    /// In the control queue, waiting for its turn.
    queued: bool,
    /// Socket transport: its control messages went past the control
    /// budget; not read again until the budget is back.
    paused: bool,
    /// File descriptors its sessions hold in the engine.
    fds: usize,
}

impl Tenant {
    fn id(&self, index: usize) -> u32 {
        (u32::from(self.generation) << 16) | index as u32
    }

    fn room(&self) -> usize {
        let undelivered = match &self.side {
            Side::Socket(s) => s.undelivered,
            _ => 0,
        };
        self.quota
            .saturating_sub(self.in_flight + self.held.len() + self.refusals.len() + undelivered)
    }

    /// Counts a job accepted now (in the current epoch).
    fn accepted(&mut self) -> u16 {
        self.in_flight += 1;
        match self.epochs.back_mut() {
            Some((epoch, n)) if *epoch == self.epoch => *n += 1,
            _ => self.epochs.push_back((self.epoch, 1)),
        }
        self.epoch
    }

    /// Counts a job of `epoch` done; true if refusals may now be due.
    fn finished(&mut self, epoch: u16) -> bool {
        self.in_flight = self.in_flight.saturating_sub(1);
        // Nearly always the front: there are more epochs only while
        // refusals wait.
        if let Some(at) = self.epochs.iter().position(|(e, _)| *e == epoch) {
            self.epochs[at].1 = self.epochs[at].1.saturating_sub(1);
        }
        while self.epochs.front().is_some_and(|(_, n)| *n == 0) {
            self.epochs.pop_front();
        }
        !self.refusals.is_empty()
    }

    /// The front refusal, if every job accepted before it has completed.
    fn due_refusal(&mut self) -> Option<CompletionEntry> {
        let (after, _) = *self.refusals.front()?;
        // Wrapping order: epochs in flight span less than half the u16
        // range (a quota of jobs and refusals, at most 4,096 each, plus
        // one socket message), so the signed distance is exact.
        let waiting = self
            .epochs
            .front()
            .is_some_and(|(e, _)| (after.wrapping_sub(*e) as i16) >= 0);
        if waiting {
            return None;
        }
        self.refusals.pop_front().map(|(_, entry)| entry)
    }
}

/// A completion waiting for room in its tenant's completion ring.
enum Held {
    Job(Job),
    Refused(CompletionEntry),
}

/// A job's `user` in the server: the tenant's index, the epoch it was
/// accepted in, and the tenant's own cookie.
fn job_user(tenant: usize, epoch: u16, cookie: u32) -> u64 {
    ((tenant as u64) << 48) | (u64::from(epoch) << 32) | u64::from(cookie)
}

fn tenant_of(user: u64) -> usize {
    (user >> 48) as usize
}

fn epoch_of(user: u64) -> u16 {
    (user >> 32) as u16
}

/// Counters shared with whoever started the server.
#[derive(Debug, Default)]
pub struct Published {
    stats: Mutex<StatsReply>,
    busy_ns: std::sync::atomic::AtomicU64,
    cpu_ns: std::sync::atomic::AtomicU64,
    control_ns: std::sync::atomic::AtomicU64,
}

impl Published {
    /// The counters as of the server's last publish.
    pub fn stats(&self) -> StatsReply {
        match self.stats.lock() {
            Ok(s) => *s,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// Nanoseconds the back-end thread spent in passes that moved work.
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns.load(Ordering::Relaxed)
    }

    /// Nanoseconds the back-end thread spent on the control path (new
    /// connections and control messages) within its budget.
    pub fn control_ns(&self) -> u64 {
        self.control_ns.load(Ordering::Relaxed)
    }

    /// The back-end thread's CPU time so far, its polling included, in ns
    /// (as of its last publish: every few passes and before each sleep).
    pub fn cpu_ns(&self) -> u64 {
        self.cpu_ns.load(Ordering::Relaxed)
    }
}

/// The calling thread's CPU time, in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The budget by default: the process's descriptor limit less what the
/// server needs besides sessions (its own, three per tenant, the
/// connections waiting to attach, the engine's shared pool), and a quarter
/// of that for one tenant.
fn default_budget(config: &ServerConfig, kind: EngineKind) -> FdBudget {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    };
    let engine = match kind {
        EngineKind::Afalg => crate::engine::afalg::ENGINE_FDS,
        _ => 0,
    };
    let reserve = 64 + 3 * config.max_tenants + config.max_unattached + engine;
    let total = config.fds.total.unwrap_or(soft.saturating_sub(reserve));
    FdBudget {
        per_tenant: config.fds.per_tenant.unwrap_or(total / 4).min(total),
        total,
    }
}

/// The server; see the module documentation.
pub struct Server {
    config: ServerConfig,
    listener: OwnedFd,
    /// The listener and every control socket but the socket transport's
    /// (read on the data path every pass).
    epoll: Epoll,
    events: Vec<libc::epoll_event>,
    listener_ready: bool,
    /// Out of the epoll set until then: the connections waiting to attach
    /// fill their pool and none is old enough to make room.
    listener_parked: Option<Instant>,
    /// Tenants whose control socket has input, in turn order.
    control: VecDeque<usize>,
    /// Alternates the control turns between new connections and tenants.
    accept_next: bool,
    /// Nanoseconds of the server's time the control path may still use.
    credit_ns: i64,
    credited_at: Instant,
    /// When a pass last moved tenants' work.
    last_work: Instant,
    last_tick: Instant,
    budget: FdBudget,
    /// File descriptors all sessions hold in the engine.
    fds_held: usize,
    engine: Box<dyn Engine>,
    tenants: Vec<Option<Tenant>>,
    generations: Vec<u16>,
    sessions: SessionTable<Owned>,
    pool: Vec<PacketBuf>,
    pool_total: usize,
    queue: VecDeque<Job>,
    done: Vec<Job>,
    rr: usize,
    stats: StatsReply,
    rx: SecretBuf,
    reply: Vec<u8>,
    fds: Vec<OwnedFd>,
    pollfds: Vec<libc::pollfd>,
    start: Instant,
    published: Arc<Published>,
    busy_ns: u64,
    control_ns: u64,
}

/// The slow path (control sockets, deadlines, hung tenants, counters)
/// runs this often while the server is busy, and after every sleep.
pub const TICK_INTERVAL: Duration = Duration::from_micros(200);
/// The share of the server's time the control path may take while tenants
/// have work (1/20: 5 %); idle time (`IDLE_AFTER`) is all its to use.
pub const CONTROL_SHARE: u32 = 50;
/// The most control work saved up, in nanoseconds: the longest the data
/// path can wait behind the control path at once.
const CONTROL_BURST_NS: i64 = 200_000;
/// The server counts as idle (its time the control path's) once no
/// tenant's work has moved for this long: a tenant between two of its
/// requests is not idleness to spend.
const IDLE_AFTER: Duration = Duration::from_millis(1);
/// Messages outside the protocol (or sent before the answer to the last
/// was read) after which a tenant is evicted.
pub const MAX_STRIKES: usize = 8;
/// Sessions one tenant may hold (an SA pair per tunnel, rekeys overlapping).
pub const MAX_SESSIONS: usize = 4096;
/// Bytes of stack wiped below the control handler after each message:
/// deeper than the key schedules' construction reaches.
const SCRUB_BYTES: usize = 128 * 1024;
/// How long a connection waiting to attach is safe from being closed to
/// make room for a newer one (an honest tenant attaches within
/// microseconds of connecting), so that a crowd of idle connections
/// cycles at most `max_unattached` per this period.
const MIN_WAIT: Duration = Duration::from_millis(50);
/// The epoll entry of the listener (tenants' entries carry their slot and
/// generation).
const LISTENER: u64 = u64::MAX;

fn epoll_data(i: usize, generation: u16) -> u64 {
    ((i as u64) << 16) | u64::from(generation)
}

/// Overwrites `SCRUB_BYTES` of the stack below the caller's frame, where
/// the callees it just returned from (key expansion in the crypto crates
/// included) may have left copies of what they worked on. Zeroize's
/// volatile writes keep the compiler from dropping it.
#[inline(never)]
fn scrub_stack() {
    let mut below = [0u8; SCRUB_BYTES];
    below.zeroize();
    std::hint::black_box(&below);
}

impl Server {
    /// Builds the engine and listens on the socket (mode 0600, or 0660
    /// with [`Access::socket_group`]). A stale socket file left by a dead
    /// server is replaced; a live one is not.
    pub fn bind(config: ServerConfig) -> Result<Server, ServeError> {
        if config.engine.kind == EngineKind::Shared {
            return Err(ServeError::Nested);
        }
        // The socket is bound before the engine is built, as before: a
        // second server on a live socket is refused without touching the
        // hardware.
        let listener = Self::listen(&config)?;
        let engine = build_engine(&config.engine)?;
        Self::with_listener(config, listener, engine)
    }

    /// As [`bind`](Self::bind), with an engine built by the caller (tests
    /// of what the server does with an engine's costs).
    #[doc(hidden)]
    pub fn bind_with_engine(config: ServerConfig, engine: Box<dyn Engine>) -> Result<Server, ServeError> {
        let listener = Self::listen(&config)?;
        Self::with_listener(config, listener, engine)
    }

    fn listen(config: &ServerConfig) -> Result<OwnedFd, ServeError> {
        let path = config.socket.clone();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(ServeError::NotASocket { path });
            }
            if sys::connect(&path).is_ok() {
                return Err(ServeError::InUse { path });
            }
            let _ = std::fs::remove_file(&path);
        }
        sys::listen(&path, config.access.socket_group).map_err(|source| ServeError::Listen { path, source })
    }

    fn with_listener(
        config: ServerConfig,
        listener: OwnedFd,
        engine: Box<dyn Engine>,
    ) -> Result<Server, ServeError> {
        let setup = |what| move |source| ServeError::Setup { what, source };
        let epoll = Epoll::new().map_err(setup("epoll set"))?;
        epoll
            .add(listener.as_raw_fd(), LISTENER)
            .map_err(setup("epoll set"))?;
        let rx = SecretBuf::new(MAX_MESSAGE).map_err(setup("receive buffer"))?;
        let budget = default_budget(&config, engine.kind());
        let now = Instant::now();
        Ok(Server {
            listener,
            epoll,
            events: Vec::with_capacity(64),
            listener_ready: false,
            listener_parked: None,
            control: VecDeque::with_capacity(config.max_tenants + config.max_unattached + 1),
            accept_next: true,
            credit_ns: CONTROL_BURST_NS,
            credited_at: now,
            last_work: now,
            last_tick: now,
            budget,
            fds_held: 0,
            engine,
            tenants: Vec::new(),
            generations: Vec::new(),
            sessions: SessionTable::default(),
            pool: Vec::new(),
            pool_total: 0,
            queue: VecDeque::with_capacity(config.quota * 4),
            done: Vec::with_capacity(config.quota * 4),
            rr: 0,
            stats: StatsReply::default(),
            rx,
            reply: Vec::with_capacity(256),
            fds: Vec::new(),
            pollfds: Vec::new(),
            start: now,
            published: Arc::new(Published::default()),
            busy_ns: 0,
            control_ns: 0,
            config,
        })
    }

    /// The file-descriptor budget in force.
    pub fn budget(&self) -> FdBudget {
        self.budget
    }

    /// The counters the server publishes as it runs, to read from another thread.
    pub fn published(&self) -> Arc<Published> {
        Arc::clone(&self.published)
    }

    /// The counters as the server keeps them (its own thread's view).
    pub fn stats(&self) -> StatsReply {
        self.stats
    }

    /// Serves until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), ServeError> {
        // Sleeps end when asked, not up to 50 us later (the default slack):
        // a modelled engine's completion time is a deadline.
        // SAFETY: prctl with an integer argument; only this thread changes.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000, 0, 0, 0) };
        let mut idle_since: Option<Instant> = None;
        while !stop.load(Ordering::Relaxed) {
            let began = Instant::now();
            let now = began.duration_since(self.start);
            let worked = self.pass(now);
            if worked {
                self.busy_ns += began.elapsed().as_nanos() as u64;
                self.last_work = began;
                idle_since = None;
            }
            if began.duration_since(self.last_tick) >= TICK_INTERVAL {
                self.tick();
            }
            if worked {
                continue;
            }
            let since = *idle_since.get_or_insert(began);
            let timeout = match self.engine.next_completion() {
                NextCompletion::Ready => continue,
                NextCompletion::At(t) => t.saturating_sub(self.start.elapsed()),
                NextCompletion::External => Duration::from_micros(200),
                NextCompletion::Idle => Duration::from_millis(100),
            };
            // A modelled completion due within a few spins' time is
            // waited for here: a sleep would wake too late for it.
            if since.elapsed() < self.config.spin || timeout < 4 * self.config.spin {
                // Polling: the study's back end spins on its rings while
                // work is likely; yielding keeps a shared core usable.
                std::thread::yield_now();
                continue;
            }
            self.sleep(timeout)?;
            self.tick();
            idle_since = None;
        }
        self.publish();
        Ok(())
    }

    /// One round-robin pass: intake from every tenant, one burst into the
    /// engine, completions back out. Whether anything moved.
    fn pass(&mut self, now: Duration) -> bool {
        let mut worked = false;
        let n = self.tenants.len();
        if n > 0 {
            self.rr = (self.rr + 1) % n;
            for k in 0..n {
                let i = (self.rr + k) % n;
                worked |= self.intake(i);
            }
        }
        if !self.queue.is_empty() {
            self.engine.submit_burst(now, &mut self.queue);
        }
        if self.queue.is_empty() {
            for i in 0..n {
                if self.tenants[i].as_ref().is_some_and(|t| !t.releases.is_empty()) {
                    self.due_releases(i);
                }
            }
        }
        self.done.clear();
        if self.engine.poll_burst(now, &mut self.done) > 0 {
            worked = true;
            let mut done = std::mem::take(&mut self.done);
            for job in done.drain(..) {
                self.complete(job);
            }
            self.done = done;
        }
        for i in 0..n {
            worked |= self.flush(i);
        }
        worked
    }

    fn intake(&mut self, i: usize) -> bool {
        match self.tenants[i].as_ref().map(|t| &t.side) {
            Some(Side::Shm(_)) => self.intake_shm(i),
            Some(Side::Socket(_)) => self.intake_socket(i),
            _ => false,
        }
    }

    fn intake_shm(&mut self, i: usize) -> bool {
        let burst = self.config.burst;
        let (avail, room, entries) = match self.tenants[i].as_ref() {
            Some(
                t @ Tenant {
                    side: Side::Shm(shm), ..
                },
            ) => (
                shm.rings.load(layout::REQ_HEAD).wrapping_sub(shm.req_tail),
                t.room(),
                shm.rings.entries(),
            ),
            _ => return false,
        };
        if avail == 0 {
            return false;
        }
        if avail > entries {
            // A head no honest tenant can publish: the ring is not to be
            // trusted any further.
            self.stats.malformed += 1;
            self.evict(i, "the request ring's head is past its capacity");
            return true;
        }
        let take = (avail as usize).min(burst).min(room);
        if take < avail as usize && take == room {
            self.stats.quota_full += 1;
        }
        let mut raw = [0u8; REQUEST_LEN];
        for _ in 0..take {
            let pos = match self.tenants[i].as_mut().map(|t| &mut t.side) {
                Some(Side::Shm(shm)) => {
                    let pos = shm.req_tail;
                    shm.rings.read_request(pos, &mut raw);
                    shm.req_tail = pos.wrapping_add(1);
                    pos
                }
                _ => break,
            };
            let user = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            self.accept_request(i, user, pos, RequestEntry::decode(&raw), None);
        }
        if let Some(Side::Shm(shm)) = self.tenants[i].as_ref().map(|t| &t.side) {
            shm.rings.store(layout::REQ_TAIL, shm.req_tail);
        }
        take > 0
    }

    fn intake_socket(&mut self, i: usize) -> bool {
        let mut worked = false;
        // A few messages per pass, so one chatty tenant cannot hold the
        // thread.
        for _ in 0..4 {
            let Some(t) = self.tenants[i].as_ref() else {
                return worked;
            };
            if t.paused {
                return worked;
            }
            if t.room() == 0 {
                self.stats.quota_full += 1;
                return worked;
            }
            let fd = t.sock.as_raw_fd();
            match sys::recv(fd, &mut self.rx, &mut self.fds, true) {
                Ok(Received::Message(n)) => {
                    worked = true;
                    self.fds.clear();
                    if self.rx[0] == op::SUBMIT {
                        self.message(i, n);
                        continue;
                    }
                    // A control message on the data path: the control
                    // path's budget pays for it, and it is this tenant's
                    // last message this pass.
                    let began = Instant::now();
                    self.message(i, n);
                    self.charge(began);
                    if self.credit_ns <= 0 {
                        if let Some(t) = self.tenants[i].as_mut() {
                            t.paused = true;
                        }
                    }
                    return worked;
                }
                Ok(Received::Empty) => return worked,
                Ok(Received::Closed) | Err(_) => {
                    self.reclaim(i);
                    return true;
                }
            }
        }
        worked
    }

    /// Checks one request and queues it for the engine, or refuses it.
    /// `data` is the socket transport's inline data.
    fn accept_request(
        &mut self,
        i: usize,
        user: u32,
        pos: u32,
        entry: Result<RequestEntry, wire::WireError>,
        data: Option<&[u8]>,
    ) {
        let entry = match entry {
            Ok(e) => e,
            Err(_) => {
                self.stats.malformed += 1;
                self.refuse(i, user, DescriptorError::BadRegions);
                return;
            }
        };
        let Some(t) = self.tenants[i].as_ref() else { return };
        let generation = t.generation;
        let in_area = match (&t.side, data) {
            (Side::Shm(shm), None) => {
                shm.rings.data_fits(entry.data_offset, entry.data_len) && entry.data_len <= t.max_data
            }
            (Side::Socket(_), Some(d)) => d.len() == entry.data_len as usize && entry.data_len <= t.max_data,
            _ => false,
        };
        if !in_area || !entry.regions_fit() {
            self.stats.bad_region += 1;
            self.refuse(i, entry.user, DescriptorError::BadRegions);
            return;
        }
        let engine_handle = match self.sessions.get(entry.session).copied() {
            None => {
                self.stats.stale_session += 1;
                self.refuse(i, entry.user, DescriptorError::BadSession);
                return;
            }
            Some(owned) if owned.tenant as usize != i || owned.generation != generation => {
                self.stats.foreign_session += 1;
                self.refuse(i, entry.user, DescriptorError::BadSession);
                return;
            }
            // Released: a request written after the release (its ring
            // position at or past the mark; on a socket, any later one).
            Some(Owned {
                closing: Some(mark), ..
            }) if data.is_some() || (pos.wrapping_sub(mark) as i32) >= 0 => {
                self.stats.stale_session += 1;
                self.refuse(i, entry.user, DescriptorError::BadSession);
                return;
            }
            Some(owned) => owned.engine,
        };
        let Some(mut buf) = self.pool.pop() else {
            // Unreachable while quotas hold (the pool has a quota's worth
            // per tenant); refused rather than waited for.
            self.stats.quota_full += 1;
            self.refuse(i, entry.user, DescriptorError::Fault);
            return;
        };
        buf.set_window(entry.data_len as usize);
        let Some(t) = self.tenants[i].as_mut() else {
            self.pool.push(buf);
            return;
        };
        match (&t.side, data) {
            (Side::Shm(shm), None) => shm.rings.read_data(entry.data_offset, buf.data_mut()),
            (_, Some(d)) => buf.data_mut().copy_from_slice(d),
            _ => {}
        }
        buf.set_tag(entry.data_offset);
        buf.set_note(generation);
        let mut desc = entry.desc;
        desc.status = Status::Pending;
        let epoch = t.accepted();
        let user = job_user(i, epoch, entry.user);
        self.queue.push_back(Job::new(engine_handle, desc, buf, 0, user));
    }

    /// Completes a refused request with an error status; nothing runs.
    /// The refusal keeps its place in the tenant's order: while jobs the
    /// tenant submitted before it are still in the engine, it waits for
    /// them (the [`Engine`] contract: a session's jobs come back in the
    /// order they were submitted, and a tenant's refused job names one).
    fn refuse(&mut self, i: usize, user: u32, error: DescriptorError) {
        let entry = CompletionEntry {
            user,
            status: Status::Error(error),
            data_len: 0,
        };
        let Some(t) = self.tenants[i].as_mut() else { return };
        if !t.epochs.is_empty() || !t.refusals.is_empty() {
            t.refusals.push_back((t.epoch, entry));
            // Jobs accepted from now on are behind this refusal.
            t.epoch = t.epoch.wrapping_add(1);
            return;
        }
        post_refusal(t, entry);
    }

    /// Routes one finished job back to its tenant, or discards it if the
    /// tenant is gone.
    fn complete(&mut self, mut job: Job) {
        let i = tenant_of(job.user);
        let generation = job.buf.note();
        let live = matches!(self.tenants.get(i), Some(Some(t)) if t.generation == generation);
        if !live {
            self.stats.discarded += 1;
            self.pool.push(job.buf);
            return;
        }
        self.stats.executed += 1;
        let Some(Some(t)) = self.tenants.get_mut(i) else {
            return;
        };
        let refusals_due = t.finished(epoch_of(job.user));
        match &mut t.side {
            Side::Shm(shm) => {
                if !t.held.is_empty() || !deliver_shm(shm, &job) {
                    t.held.push_back(Held::Job(job));
                    t.stalled_since.get_or_insert_with(Instant::now);
                    job_kept(t, refusals_due);
                    return;
                }
            }
            Side::Socket(s) => {
                let entry = completion_of(&job);
                let data = if entry.data_len > 0 { job.buf.data() } else { &[] };
                push_completion(s, &entry, data);
            }
            Side::Unattached => {}
        }
        job_kept(t, refusals_due);
        job.desc.status = Status::Pending;
        self.pool.push(job.buf);
    }

    /// Publishes completions and rings sleeping tenants; retries held
    /// ones and unsent messages. Whether anything moved.
    fn flush(&mut self, i: usize) -> bool {
        let Some(t) = self.tenants[i].as_mut() else {
            return false;
        };
        let mut moved = false;
        let mut dead = false;
        match &mut t.side {
            Side::Shm(shm) => {
                while let Some(held) = t.held.front() {
                    let delivered = match held {
                        Held::Job(job) => deliver_shm(shm, job),
                        Held::Refused(entry) => deliver_entry(shm, entry),
                    };
                    if !delivered {
                        break;
                    }
                    moved = true;
                    if let Some(Held::Job(job)) = t.held.pop_front() {
                        self.pool.push(job.buf);
                    }
                }
                if shm.dirty {
                    shm.dirty = false;
                    if shm
                        .rings
                        .store_then_flag(layout::COMP_HEAD, shm.comp_head, layout::TENANT_SLEEPING)
                    {
                        shm.to_tenant.ring();
                    }
                }
                if t.held.is_empty() {
                    t.stalled_since = None;
                }
            }
            Side::Socket(s) => {
                if s.out_count > 0 {
                    s.seal_burst();
                }
                while let Some(msg) = s.pending.front() {
                    match sys::send(t.sock.as_raw_fd(), msg, &[], true) {
                        Ok(true) => {
                            moved = true;
                            if msg[0] == op::COMPLETIONS {
                                s.undelivered -= count_of(msg);
                            } else {
                                s.replies -= 1;
                            }
                            if let Some(mut msg) = s.pending.pop_front() {
                                if msg.capacity() >= MAX_MESSAGE {
                                    msg.clear();
                                    s.spare.push(msg);
                                }
                            }
                        }
                        Ok(false) => break,
                        Err(_) => {
                            dead = true;
                            break;
                        }
                    }
                }
                if s.pending.is_empty() {
                    t.stalled_since = None;
                } else {
                    t.stalled_since.get_or_insert_with(Instant::now);
                }
            }
            Side::Unattached => {}
        }
        if dead {
            self.reclaim(i);
        }
        moved
    }

    /// The slow path, every [`TICK_INTERVAL`] and after each sleep: the
    /// control path's credit, new connections and control messages within
    /// it, lost jobs, attach deadlines, hung tenants, published counters.
    fn tick(&mut self) {
        let now = Instant::now();
        self.last_tick = now;
        self.credit(now);
        // Jobs whose completions the engine lost (a modelled channel
        // reset) come back with an error, so no tenant waits for them.
        let mut lost = std::mem::take(&mut self.done);
        lost.clear();
        if self.engine.reclaim(self.start.elapsed(), &mut lost) > 0 {
            for job in lost.drain(..) {
                self.complete(job);
            }
        }
        self.done = lost;
        if self.listener_parked.is_some_and(|until| now >= until)
            && self.epoll.add(self.listener.as_raw_fd(), LISTENER).is_ok()
        {
            self.listener_parked = None;
        }
        self.take_ready();
        self.serve_control();
        let hung_after = self.config.hung_after;
        for i in 0..self.tenants.len() {
            let Some(t) = self.tenants[i].as_mut() else {
                continue;
            };
            if matches!(t.side, Side::Unattached) {
                if now.saturating_duration_since(t.connected) > self.config.attach_within {
                    self.stats.idle_closed += 1;
                    self.reclaim(i);
                }
                continue;
            }
            let unread = match &mut t.side {
                Side::Shm(shm) => {
                    let tail = shm.rings.load(layout::COMP_TAIL);
                    if tail != shm.seen_tail || tail == shm.comp_head {
                        shm.seen_tail = tail;
                        shm.tail_moved = now;
                    }
                    now.saturating_duration_since(shm.tail_moved) > hung_after
                }
                _ => false,
            };
            let hung = unread
                || t.stalled_since
                    .is_some_and(|s| now.saturating_duration_since(s) > hung_after);
            if hung {
                self.evict(i, "completions left unread past the server's hung limit");
            }
        }
        self.publish();
    }

    /// Adds to the control path's credit the time since the last credit:
    /// all of it once no tenant has had work for `IDLE_AFTER`, else
    /// `1/CONTROL_SHARE` of it.
    fn credit(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.credited_at)
            .as_nanos()
            .min(i64::MAX as u128) as i64;
        self.credited_at = now;
        let gain = if now.saturating_duration_since(self.last_work) < IDLE_AFTER {
            elapsed / i64::from(CONTROL_SHARE)
        } else {
            elapsed
        };
        self.credit_ns = self.credit_ns.saturating_add(gain).min(CONTROL_BURST_NS);
        if self.credit_ns > 0 {
            for t in self.tenants.iter_mut().flatten() {
                t.paused = false;
            }
        }
    }

    /// Charges the control path for work that began at `began`.
    fn charge(&mut self, began: Instant) {
        let spent = began.elapsed().as_nanos().min(i64::MAX as u128) as i64;
        self.credit_ns = self.credit_ns.saturating_sub(spent);
        self.control_ns += spent as u64;
    }

    /// Queues the control sockets with input (and notes a waiting
    /// connection), from one look at the epoll set.
    fn take_ready(&mut self) {
        self.epoll.ready(&mut self.events);
        for k in 0..self.events.len() {
            let data = self.events[k].u64;
            if data == LISTENER {
                self.listener_ready = true;
                continue;
            }
            let (i, generation) = ((data >> 16) as usize, data as u16);
            if let Some(Some(t)) = self.tenants.get_mut(i) {
                if t.generation == generation && !t.queued && !matches!(t.side, Side::Socket(_)) {
                    t.queued = true;
                    self.control.push_back(i);
                }
            }
        }
    }

    /// Serves control turns while the credit lasts: new connections and
    /// tenants' messages alternately, one message per tenant per turn.
    fn serve_control(&mut self) {
        while self.credit_ns > 0 {
            let began = Instant::now();
            if self.listener_ready && (self.accept_next || self.control.is_empty()) {
                self.accept_next = false;
                if let Some(until) = self.no_room_until(began) {
                    // New connections wait in the kernel's backlog (their
                    // connect blocks once it is full: no churn to pay for).
                    self.epoll.remove(self.listener.as_raw_fd());
                    self.listener_parked = Some(until);
                    self.listener_ready = false;
                    continue;
                }
                match sys::accept(&self.listener) {
                    Ok(Some(sock)) => self.connected(sock),
                    // Nothing waiting, or no descriptor to take it with:
                    // the epoll set says when to try again.
                    _ => self.listener_ready = false,
                }
            } else if let Some(i) = self.control.pop_front() {
                self.accept_next = true;
                if let Some(t) = self.tenants[i].as_mut() {
                    t.queued = false;
                }
                self.control_message(i);
            } else {
                break;
            }
            self.charge(began);
        }
    }

    /// When the pool of connections waiting to attach is full and none of
    /// them has waited [`MIN_WAIT`] (the oldest is closed to make room
    /// only then), when that will be.
    fn no_room_until(&self, now: Instant) -> Option<Instant> {
        let mut waiting = 0;
        let mut oldest: Option<Instant> = None;
        for t in self.tenants.iter().flatten() {
            if matches!(t.side, Side::Unattached) {
                waiting += 1;
                oldest = Some(oldest.map_or(t.connected, |o| o.min(t.connected)));
            }
        }
        let due = oldest? + MIN_WAIT.min(self.config.attach_within);
        (waiting >= self.config.max_unattached.max(1) && due > now).then_some(due)
    }

    /// Reads and handles one control message of tenant `i` (not the
    /// socket transport's, whose socket is its data path).
    fn control_message(&mut self, i: usize) {
        let Some(t) = self.tenants[i].as_ref() else { return };
        if matches!(t.side, Side::Socket(_)) {
            return;
        }
        match sys::recv(t.sock.as_raw_fd(), &mut self.rx, &mut self.fds, true) {
            Ok(Received::Message(n)) => {
                self.fds.clear();
                // Lock-step: an honest tenant reads each answer before it
                // asks again, and a Unix socket charges a message to its
                // sender until it is read. A request on top of an unread
                // answer is struck and dropped unanswered, so a tenant
                // has at most one answer outstanding.
                let unread = self.tenants[i]
                    .as_ref()
                    .map_or(0, |t| sys::unread_by_peer(&t.sock).unwrap_or(0));
                if unread > 0 {
                    self.rx[..n].zeroize();
                    self.strike(i, None);
                    return;
                }
                self.message(i, n);
            }
            Ok(Received::Empty) => {}
            Ok(Received::Closed) | Err(_) => self.reclaim(i),
        }
    }

    /// Counts a message outside the protocol against tenant `i`, refusing
    /// it with `reason` (if it gets an answer); the last strike evicts.
    fn strike(&mut self, i: usize, reason: Option<&str>) {
        let Some(t) = self.tenants[i].as_mut() else { return };
        t.strikes += 1;
        if t.strikes >= MAX_STRIKES {
            self.evict(
                i,
                "messages outside the protocol (or requests sent before the last answer was read)",
            );
            return;
        }
        if let Some(reason) = reason {
            self.refuse_message(i, refusal::PROTOCOL, reason);
        }
    }

    fn publish(&self) {
        let mut stats = self.stats;
        stats.tenants = self.live_tenants() as u64;
        match self.published.stats.lock() {
            Ok(mut s) => *s = stats,
            Err(poisoned) => *poisoned.into_inner() = stats,
        }
        self.published.busy_ns.store(self.busy_ns, Ordering::Relaxed);
        self.published
            .control_ns
            .store(self.control_ns, Ordering::Relaxed);
        // Off the fast path: publishing is the slow path's (every
        // `TICK_EVERY` passes and before a sleep), on the server's thread.
        self.published.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
    }

    /// Whether the peer on `sock` may be a tenant ([`Access`]), by the
    /// credentials the kernel recorded when it connected.
    fn admitted(&self, sock: &OwnedFd) -> bool {
        let Ok(cred) = sys::peer_cred(sock) else {
            return false;
        };
        // SAFETY: geteuid cannot fail.
        let user = self
            .config
            .access
            .user
            .unwrap_or_else(|| unsafe { libc::geteuid() });
        if cred.uid == 0 || cred.uid == user {
            return true;
        }
        match self.config.access.group {
            Some(g) => cred.gid == g || sys::peer_in_group(sock, g).unwrap_or(false),
            None => false,
        }
    }

    fn connected(&mut self, sock: OwnedFd) {
        if !self.admitted(&sock) {
            // Closed unanswered: a peer the socket's mode should have
            // kept out, or one whose credentials cannot be read.
            self.stats.refused_peers += 1;
            return;
        }
        // Connections waiting to attach are bounded apart from tenants;
        // the oldest makes room for a new one, so a crowd of idle ones
        // delays a new connection by at most a few turns.
        let mut waiting = 0;
        let mut oldest: Option<(Instant, usize)> = None;
        for (i, t) in self.tenants.iter().enumerate() {
            if let Some(t) = t.as_ref().filter(|t| matches!(t.side, Side::Unattached)) {
                waiting += 1;
                if oldest.is_none_or(|(at, _)| t.connected < at) {
                    oldest = Some((t.connected, i));
                }
            }
        }
        if waiting >= self.config.max_unattached.max(1) {
            if let Some((_, i)) = oldest {
                self.stats.idle_closed += 1;
                self.reclaim(i);
            }
        }
        let i = match self.tenants.iter().position(|t| t.is_none()) {
            Some(i) => i,
            None => {
                self.tenants.push(None);
                self.generations.push(0);
                self.tenants.len() - 1
            }
        };
        self.generations[i] = self.generations[i].wrapping_add(1).max(1);
        let generation = self.generations[i];
        if self
            .epoll
            .add(sock.as_raw_fd(), epoll_data(i, generation))
            .is_err()
        {
            // Not watched, it could never be served: closed at once.
            return;
        }
        self.tenants[i] = Some(Tenant {
            generation,
            sock,
            side: Side::Unattached,
            quota: 0,
            max_data: 0,
            in_flight: 0,
            held: VecDeque::new(),
            epoch: 0,
            epochs: VecDeque::new(),
            refusals: VecDeque::new(),
            sessions: Vec::new(),
            releases: Vec::new(),
            stalled_since: None,
            strikes: 0,
            connected: Instant::now(),
            queued: false,
            paused: false,
            fds: 0,
        });
    }

    /// Handles the message of `n` bytes in `self.rx` from tenant `i`, then
    /// wipes it (it may have held keys), and the stack below this frame
    /// after a registration (where the keys were expanded).
    fn message(&mut self, i: usize, n: usize) {
        let rx = std::mem::replace(&mut self.rx, SecretBuf::empty());
        let mut keyed = false;
        match Request::parse(&rx[..n]) {
            Ok(request) => {
                keyed = matches!(request, Request::Register { .. });
                self.request(i, request);
            }
            Err(e) => {
                self.stats.malformed += 1;
                self.strike(i, Some(&e.to_string()));
            }
        }
        let mut rx = rx;
        rx[..n].zeroize();
        self.rx = rx;
        if keyed {
            scrub_stack();
        }
    }

    fn refuse_message(&mut self, i: usize, code: u8, reason: &str) {
        Reply::Refused { code, reason }.emit(&mut self.reply);
        self.send_reply(i);
    }

    fn answer(&mut self, i: usize, reply: Reply<'_>) {
        reply.emit(&mut self.reply);
        self.send_reply(i);
    }

    /// Sends the reply in `self.reply` to tenant `i`. The socket
    /// transport's go behind any completions the socket would not take
    /// yet (its hung check covers a tenant that never reads them).
    fn send_reply(&mut self, i: usize) {
        let Some(t) = self.tenants[i].as_mut() else { return };
        let fd = t.sock.as_raw_fd();
        let failed = match &mut t.side {
            Side::Socket(s) => {
                if s.pending.is_empty() && matches!(sys::send(fd, &self.reply, &[], true), Ok(true)) {
                    false
                } else {
                    // Off the fast path: a control reply, rare.
                    s.pending.push_back(self.reply.clone());
                    s.replies += 1;
                    t.stalled_since.get_or_insert_with(Instant::now);
                    false
                }
            }
            // Lock-step (see `control_message`): the tenant has read every
            // earlier answer, so its socket has room for this one.
            _ => sys::send(fd, &self.reply, &[], true).is_err(),
        };
        if failed {
            self.reclaim(i);
        }
    }

    fn request(&mut self, i: usize, request: Request<'_>) {
        let attached = matches!(
            self.tenants[i].as_ref().map(|t| &t.side),
            Some(Side::Shm(_) | Side::Socket(_))
        );
        // Lock-step on the socket transport: a request while the answer
        // to the last is still queued here (the tenant is not reading).
        let answer_queued = matches!(
            self.tenants[i].as_ref().map(|t| &t.side),
            Some(Side::Socket(s)) if s.replies > 0
        );
        if answer_queued && !matches!(request, Request::Submit { .. } | Request::Detach) {
            self.strike(i, None);
            return;
        }
        match request {
            Request::Attach {
                transport,
                entries,
                slot_size,
                ..
            } => {
                if attached {
                    self.strike(i, Some("already attached"));
                    return;
                }
                self.attach(i, transport, entries, slot_size);
            }
            // An operator's query (`espgw engine stats`) needs no attach.
            Request::Stats => {
                let mut stats = self.stats;
                stats.tenants = self.live_tenants() as u64;
                self.answer(i, Reply::Stats(stats));
            }
            _ if !attached => self.strike(i, Some("attach first")),
            Request::Register {
                algorithm,
                esn,
                enc_key,
                auth_key,
            } => {
                if self.tenants[i]
                    .as_ref()
                    .is_some_and(|t| t.sessions.len() >= MAX_SESSIONS)
                {
                    let reason = format!("a tenant holds at most {MAX_SESSIONS} sessions");
                    self.refuse_message(i, refusal::FULL, &reason);
                    return;
                }
                let spec = match SessionSpec::new(algorithm, esn, enc_key, auth_key) {
                    Ok(spec) => spec,
                    Err(e) => {
                        self.refuse_message(i, refusal::KEYS, &e.to_string());
                        return;
                    }
                };
                // What the session would cost, checked before the engine
                // opens anything for it.
                let cost = session_fds(self.engine.kind(), &spec);
                let held = self.tenants[i].as_ref().map_or(0, |t| t.fds);
                if let Err(e) = self.budget.admit(cost, held, self.fds_held) {
                    self.stats.over_budget += 1;
                    self.refuse_message(i, refusal::BUDGET, &e.to_string());
                    return;
                }
                match self.engine.register(&spec) {
                    Ok(engine) => {
                        let Some(t) = self.tenants[i].as_mut() else { return };
                        let handle = self.sessions.insert(Owned {
                            tenant: i as u16,
                            generation: t.generation,
                            engine,
                            closing: None,
                            fds: cost,
                        });
                        t.sessions.push(handle);
                        t.fds += cost;
                        self.fds_held += cost;
                        self.answer(i, Reply::Registered(handle));
                    }
                    Err(e) => {
                        let code = match e {
                            RegisterError::Keys(_) => refusal::KEYS,
                            _ => refusal::FULL,
                        };
                        self.refuse_message(i, code, &e.to_string());
                    }
                }
            }
            Request::Release { handle, mark } => {
                let Some(t) = self.tenants[i].as_mut() else { return };
                match self.sessions.get(handle).copied() {
                    Some(o) if o.tenant as usize != i || o.generation != t.generation => {
                        self.stats.foreign_session += 1;
                        self.refuse_message(i, refusal::NOT_YOURS, "the session is another tenant's");
                    }
                    // Released twice.
                    Some(Owned { closing: Some(_), .. }) => {
                        self.stats.stale_session += 1;
                        self.refuse_message(i, refusal::NOT_YOURS, "the session is already released");
                    }
                    Some(_) => {
                        // Jobs the tenant submitted before releasing still
                        // run: the release waits until they are with the
                        // engine (shm: the ring read up to the tenant's
                        // mark; socket: earlier messages are read first).
                        let mark = match &t.side {
                            Side::Shm(_) => mark,
                            _ => 0,
                        };
                        t.releases.push((mark, handle));
                        if let Some(o) = self.sessions.get_mut(handle) {
                            o.closing = Some(mark);
                        }
                        self.answer(i, Reply::Released);
                    }
                    None => {
                        self.stats.stale_session += 1;
                        self.refuse_message(i, refusal::NOT_YOURS, "no such session (released?)");
                    }
                }
            }
            Request::Submit { count, body } => {
                let is_socket = matches!(self.tenants[i].as_ref().map(|t| &t.side), Some(Side::Socket(_)));
                if !is_socket {
                    self.stats.malformed += 1;
                    self.strike(i, Some("this tenant submits through its rings"));
                    return;
                }
                for item in BurstIter::requests(count, body) {
                    match item {
                        Ok((entry, data)) => {
                            let room = self.tenants[i].as_ref().map_or(0, Tenant::room);
                            if room == 0 {
                                self.stats.quota_full += 1;
                                self.refuse(i, entry.user, DescriptorError::Fault);
                                continue;
                            }
                            self.accept_request(i, entry.user, 0, Ok(entry), Some(data));
                        }
                        Err(_) => {
                            // The rest of the message cannot be trusted.
                            self.stats.malformed += 1;
                            break;
                        }
                    }
                }
            }
            Request::Detach => self.reclaim(i),
        }
    }

    /// Releases tenant `i`'s session `handle` with the engine (which wipes
    /// its keys).
    fn release_now(&mut self, i: usize, handle: SessionHandle) {
        let mut fds = 0;
        if let Some(o) = self.sessions.remove(handle) {
            self.engine.release(o.engine);
            self.stats.sessions_wiped += 1;
            self.fds_held -= o.fds;
            fds = o.fds;
        }
        if let Some(t) = self.tenants[i].as_mut() {
            t.sessions.retain(|h| *h != handle);
            t.fds -= fds;
        }
    }

    /// Deferred releases that are due: called when the engine has taken
    /// every queued job, so none of the session's can be left behind.
    fn due_releases(&mut self, i: usize) {
        loop {
            let due = match self.tenants[i].as_mut() {
                Some(t) => match (t.releases.first().copied(), &t.side) {
                    // Wrapping distance: the tail is at or past the mark.
                    (Some((at, handle)), Side::Shm(shm)) if (shm.req_tail.wrapping_sub(at) as i32) >= 0 => {
                        t.releases.remove(0);
                        handle
                    }
                    (Some((_, handle)), Side::Socket(_)) => {
                        t.releases.remove(0);
                        handle
                    }
                    _ => return,
                },
                None => return,
            };
            self.release_now(i, due);
        }
    }

    /// Tells tenant `i` it is attached, with its ring's size and the
    /// shared region's descriptors `fds` (no region and no descriptors
    /// over a socket). `false` if there is no such tenant, or it could not
    /// be told (then it is reclaimed).
    fn send_attached(
        &mut self,
        i: usize,
        transport: Transport,
        (entries, slot_size): (u32, u32),
        region_len: u64,
        fds: &[RawFd],
    ) -> bool {
        let Some(t) = self.tenants[i].as_ref() else {
            return false;
        };
        Reply::Attached {
            transport,
            tenant: t.id(i),
            entries,
            slot_size,
            region_len,
        }
        .emit(&mut self.reply);
        if sys::send(t.sock.as_raw_fd(), &self.reply, fds, true).is_err() {
            self.reclaim(i);
            return false;
        }
        true
    }

    fn attach(&mut self, i: usize, transport: Transport, entries: u32, slot_size: u32) {
        if self.live_tenants() >= self.config.max_tenants {
            self.refuse_message(i, refusal::FULL, "the server serves its maximum of tenants");
            self.reclaim(i);
            return;
        }
        if !entries.is_power_of_two() || !(1..=4096).contains(&entries) {
            self.refuse_message(i, refusal::FULL, "entries must be a power of two from 1 to 4096");
            return;
        }
        if slot_size < 64 || slot_size > self.config.max_slot {
            let reason = format!("slot_size must be from 64 to {} bytes", self.config.max_slot);
            self.refuse_message(i, refusal::FULL, &reason);
            return;
        }
        // The ring is no larger than the quota, so an honest tenant (one
        // request per ring entry) never meets a refusal for it.
        let cap = (self.config.quota.max(1) as u32 + 1).next_power_of_two() / 2;
        let entries = entries.min(cap);
        let quota = entries as usize;
        let (.., region_len) = layout::offsets(entries as usize, slot_size as usize);
        let side = match transport {
            Transport::Shm => {
                let made = (|| -> io::Result<_> {
                    let (memfd, map) = Mapping::create("espgw-tenant", region_len)?;
                    let rings = Rings::new(map, entries, slot_size)
                        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
                    Ok((memfd, rings, EventFd::new()?, EventFd::new()?))
                })();
                let (memfd, rings, to_server, to_tenant) = match made {
                    Ok(m) => m,
                    Err(e) => {
                        self.refuse_message(i, refusal::FULL, &format!("cannot make the shared region: {e}"));
                        return;
                    }
                };
                let fds = [memfd.as_raw_fd(), to_server.raw(), to_tenant.raw()];
                if !self.send_attached(i, transport, (entries, slot_size), region_len as u64, &fds) {
                    return;
                }
                // The memfd goes out of scope here: the mapping keeps the
                // memory, the tenant has its own descriptor.
                Side::Shm(Box::new(ShmSide {
                    rings,
                    to_server,
                    to_tenant,
                    req_tail: 0,
                    comp_head: 0,
                    comp_tail_seen: 0,
                    dirty: false,
                    seen_tail: 0,
                    tail_moved: Instant::now(),
                }))
            }
            Transport::Socket => {
                if !self.send_attached(i, transport, (entries, slot_size), 0, &[]) {
                    return;
                }
                let Some(t) = self.tenants[i].as_ref() else { return };
                // Its socket is its data path from now on, read every pass.
                self.epoll.remove(t.sock.as_raw_fd());
                let mut out = Vec::with_capacity(MAX_MESSAGE);
                wire::start_burst(&mut out, op::COMPLETIONS);
                Side::Socket(Box::new(SocketSide {
                    out,
                    out_count: 0,
                    pending: VecDeque::new(),
                    spare: Vec::new(),
                    undelivered: 0,
                    replies: 0,
                }))
            }
        };
        // A quota's worth of buffers per tenant, made now rather than per
        // request; they stay when the tenant leaves (its in-flight jobs
        // bring theirs back later).
        let want = self.config.max_slot as usize;
        while self.pool_total < quota * (self.live_tenants() + 1) {
            self.pool.push(PacketBuf::with_len(want));
            self.pool_total += 1;
        }
        let Some(t) = self.tenants[i].as_mut() else { return };
        t.side = side;
        t.quota = quota;
        t.max_data = slot_size;
        // Room for the most a tenant can have outstanding, so that the
        // steady state (and even a refusing one) allocates nothing.
        t.held.reserve(quota);
        t.epochs.reserve(quota + 1);
        t.refusals.reserve(quota);
        // The listener and two descriptors per tenant to sleep on: sized
        // now, so the first sleep with this tenant does not grow the list
        // (the no-allocation test once caught it doing so mid-run).
        let fds = 1 + 2 * self.tenants.len();
        self.pollfds.reserve(fds.saturating_sub(self.pollfds.len()));
        self.stats.attached += 1;
    }

    fn live_tenants(&self) -> usize {
        self.tenants
            .iter()
            .filter(|t| t.as_ref().is_some_and(|t| !matches!(t.side, Side::Unattached)))
            .count()
    }

    /// Tells tenant `i` why it is being let go (if its socket takes the
    /// message at once), then reclaims it; counted.
    fn evict(&mut self, i: usize, reason: &str) {
        let Some(t) = self.tenants[i].as_ref() else { return };
        Reply::Refused {
            code: refusal::EVICTED,
            reason,
        }
        .emit(&mut self.reply);
        let _ = sys::send(t.sock.as_raw_fd(), &self.reply, &[], true);
        self.stats.evicted += 1;
        self.reclaim(i);
    }

    /// Takes everything of tenant `i` back: sessions (keys wiped), queued
    /// jobs, held completions, its region and descriptors. Jobs already in
    /// the engine are discarded as they complete (the generation check).
    fn reclaim(&mut self, i: usize) {
        let Some(t) = self.tenants[i].take() else { return };
        if !matches!(t.side, Side::Unattached) {
            self.stats.reclaimed += 1;
        }
        for handle in &t.sessions {
            if let Some(o) = self.sessions.remove(*handle) {
                self.engine.release(o.engine);
                self.stats.sessions_wiped += 1;
                self.fds_held -= o.fds;
            }
        }
        let generation = t.generation;
        let pool = &mut self.pool;
        let stats = &mut self.stats;
        self.queue.retain_mut(|job| {
            if tenant_of(job.user) == i && job.buf.note() == generation {
                stats.discarded += 1;
                pool.push(std::mem::replace(&mut job.buf, PacketBuf::empty()));
                false
            } else {
                true
            }
        });
        for held in t.held {
            if let Held::Job(job) = held {
                self.stats.discarded += 1;
                self.pool.push(job.buf);
            }
        }
        // Dropping `t` unmaps the region and closes the socket and doorbells.
    }

    /// Sleeps on every doorbell, the socket transport's sockets and (while
    /// the control path has credit) the epoll set of control sockets,
    /// after telling the shm tenants to ring.
    fn sleep(&mut self, timeout: Duration) -> Result<(), ServeError> {
        self.publish();
        // The time up to now is credited as it was.
        self.credit(Instant::now());
        let mut pending = false;
        for t in self.tenants.iter().flatten() {
            if let Side::Shm(shm) = &t.side {
                let head = shm
                    .rings
                    .flag_then_load(layout::SERVER_SLEEPING, 1, layout::REQ_HEAD);
                pending |= head != shm.req_tail;
            }
        }
        if !pending {
            let mut timeout = timeout;
            if let Some(until) = self.listener_parked {
                timeout = timeout.min(until.saturating_duration_since(Instant::now()));
            }
            self.pollfds.clear();
            if self.credit_ns > 0 {
                self.pollfds.push(sys::pollfd(self.epoll.raw()));
            } else {
                // Control input waits for its credit, which comes back
                // at the rate of idle time.
                timeout = timeout.min(Duration::from_nanos(self.credit_ns.unsigned_abs()).max(TICK_INTERVAL));
            }
            for t in self.tenants.iter().flatten() {
                match &t.side {
                    Side::Shm(shm) => self.pollfds.push(sys::pollfd(shm.to_server.raw())),
                    Side::Socket(_) if !t.paused => self.pollfds.push(sys::pollfd(t.sock.as_raw_fd())),
                    _ => {}
                }
            }
            sys::poll(&mut self.pollfds, timeout).map_err(ServeError::Poll)?;
        }
        for t in self.tenants.iter().flatten() {
            if let Side::Shm(shm) = &t.side {
                shm.rings.store(layout::SERVER_SLEEPING, 0);
                shm.to_server.drain();
            }
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for i in 0..self.tenants.len() {
            self.reclaim(i);
        }
        let _ = std::fs::remove_file(&self.config.socket);
    }
}

fn completion_of(job: &Job) -> CompletionEntry {
    let status = job.desc.status;
    let data_len = match status {
        Status::Done | Status::AuthFailed => job.buf.len() as u32,
        _ => 0,
    };
    CompletionEntry {
        user: job.user as u32,
        status,
        data_len,
    }
}

/// Writes a job's result into its tenant's region; false if the ring is full.
fn deliver_shm(shm: &mut ShmSide, job: &Job) -> bool {
    if !comp_room(shm) {
        return false;
    }
    let entry = completion_of(job);
    if entry.data_len > 0 {
        shm.rings.write_data(job.buf.tag(), job.buf.data());
    }
    deliver_entry(shm, &entry)
}

/// Writes a completion entry into the ring; false if the ring is full.
fn deliver_entry(shm: &mut ShmSide, entry: &CompletionEntry) -> bool {
    if !comp_room(shm) {
        return false;
    }
    let mut raw = [0u8; COMPLETION_LEN];
    entry.encode(&mut raw);
    shm.rings.write_completion(shm.comp_head, &raw);
    shm.comp_head = shm.comp_head.wrapping_add(1);
    shm.dirty = true;
    true
}

/// Posts a refusal whose turn has come: behind any completions still held
/// for room in the ring.
fn post_refusal(t: &mut Tenant, entry: CompletionEntry) {
    match &mut t.side {
        Side::Shm(shm) => {
            if !t.held.is_empty() || !deliver_entry(shm, &entry) {
                t.held.push_back(Held::Refused(entry));
                t.stalled_since.get_or_insert_with(Instant::now);
            }
        }
        Side::Socket(s) => push_completion(s, &entry, &[]),
        Side::Unattached => {}
    }
}

/// After a job's completion is posted (or held): the refusals that were
/// waiting for it and the jobs before it, in order.
fn job_kept(t: &mut Tenant, refusals_due: bool) {
    if !refusals_due {
        return;
    }
    while let Some(entry) = t.due_refusal() {
        post_refusal(t, entry);
    }
}

/// Whether the completion ring has room for one more entry.
fn comp_room(shm: &mut ShmSide) -> bool {
    let entries = shm.rings.entries();
    if shm.comp_head.wrapping_sub(shm.comp_tail_seen) < entries {
        return true;
    }
    shm.comp_tail_seen = shm.rings.load(layout::COMP_TAIL);
    // A tail ahead of our head is a lie; it buys no room.
    let used = shm.comp_head.wrapping_sub(shm.comp_tail_seen);
    used < entries
}

fn push_completion(s: &mut SocketSide, entry: &CompletionEntry, data: &[u8]) {
    if s.out.len() + COMPLETION_LEN + data.len() > MAX_MESSAGE || s.out_count == u16::MAX {
        s.seal_burst();
    }
    let at = s.out.len();
    s.out.resize(at + COMPLETION_LEN, 0);
    entry.encode(&mut s.out[at..]);
    s.out.extend_from_slice(data);
    s.out_count += 1;
    s.undelivered += 1;
}

fn count_of(msg: &[u8]) -> usize {
    u16::from_le_bytes([msg[2], msg[3]]) as usize
}

/// A server running on a thread of this process (tests, the benchmark).
pub struct ServerHandle {
    stop: Arc<AtomicBool>,
    published: Arc<Published>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
    /// The control socket tenants connect to.
    pub socket: PathBuf,
}

impl ServerHandle {
    /// The counters as of the server's last publish.
    pub fn stats(&self) -> StatsReply {
        self.published.stats()
    }

    /// Nanoseconds the server spent in passes that moved work.
    pub fn busy_ns(&self) -> u64 {
        self.published.busy_ns()
    }

    /// Nanoseconds the server spent on its control path so far.
    pub fn control_ns(&self) -> u64 {
        self.published.control_ns()
    }

    /// The server thread's CPU time so far, in ns (as of its last publish).
    pub fn cpu_ns(&self) -> u64 {
        self.published.cpu_ns()
    }

    /// Stops the thread and returns how it ended.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ServeError::Poll(io::Error::other("the server thread panicked"))),
            None => Ok(()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds a server and runs it on a new thread.
pub fn spawn(config: ServerConfig) -> Result<ServerHandle, ServeError> {
    run_on_thread(Server::bind(config)?)
}

/// As [`spawn`], with an engine built by the caller.
#[doc(hidden)]
pub fn spawn_with_engine(config: ServerConfig, engine: Box<dyn Engine>) -> Result<ServerHandle, ServeError> {
    run_on_thread(Server::bind_with_engine(config, engine)?)
}

fn run_on_thread(mut server: Server) -> Result<ServerHandle, ServeError> {
    let socket = server.config.socket.clone();
    let published = server.published();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("espgw-engine".into())
        .spawn(move || server.run(&flag))
        .map_err(ServeError::Poll)?;
    Ok(ServerHandle {
        stop,
        published,
        thread: Some(thread),
        socket,
    })
}
