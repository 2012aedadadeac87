//! Engines: where jobs are executed, behind one registration, burst
//! submission and completion interface, so the dataplane does not know
//! which one it talks to.
//!
//! One module per engine: `soft` (inline), `sec` (the SEC 2.x model and
//! its threaded variant),
//! `afalg` (the Linux kernel crypto API), `shared` (an engine served to
//! many tenants by `espgw engine serve`); `factory` builds the one a
//! configuration names. This module owns the [`Engine`] contract and the
//! counters every engine reports; it must not know packet headers, SAs or
//! policies.

use std::collections::VecDeque;
use std::time::Duration;

use strum::{Display, EnumString, IntoStaticStr, VariantArray, VariantNames};

use crate::job::Job;
use crate::session::{SessionError, SessionHandle, SessionSpec};

#[cfg(target_os = "linux")]
pub mod afalg;
mod factory;
pub mod sec;
#[cfg(target_os = "linux")]
pub mod shared;
pub mod soft;

pub use factory::{build_engine, EngineError, EngineSpec};
pub use soft::SoftEngine;

/// The engines espgw can put behind the boundary.
///
/// Names (config `[accel] engine`, `--engine`, JSON) are the variants in
/// lower case, derived once for strum and serde alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[derive(VariantArray, VariantNames, IntoStaticStr, EnumString, Display)]
#[strum(serialize_all = "lowercase", parse_err_ty = UnknownEngine, parse_err_fn = UnknownEngine::new)]
pub enum EngineKind {
    /// Inline software in the caller's thread.
    #[default]
    Soft,
    /// The SEC 2.x look-aside engine model, in modelled time.
    Sec,
    /// The Linux kernel crypto API through AF_ALG sockets.
    Afalg,
    /// An engine in another process, served by `espgw engine serve`.
    Shared,
}

crate::name_table!(EngineKind);

impl EngineKind {
    /// Whether this engine can run `alg` at all: the SEC has no ChaCha20
    /// or Poly1305 unit, and refuses such sessions at registration.
    pub fn supports(self, alg: crate::Algorithm) -> bool {
        !(self == EngineKind::Sec && alg.cipher() == crate::CipherKind::ChaCha20Poly1305)
    }
}

crate::unknown_name!(
    /// An engine name that is not known.
    UnknownEngine,
    EngineKind,
    "engine"
);

/// Bytes an engine moved across its (modelled) bus, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BusBytes {
    /// Descriptors fetched.
    pub descriptors: u64,
    /// Keys and context (IV, HMAC state) fetched.
    pub context: u64,
    /// Packet data read.
    pub data_in: u64,
    /// Results written back.
    pub data_out: u64,
}

impl BusBytes {
    /// Every byte moved, of all kinds.
    pub fn total(&self) -> u64 {
        self.descriptors + self.context + self.data_in + self.data_out
    }

    /// Adds `other`'s bytes, kind by kind.
    pub fn add(&mut self, other: &BusBytes) {
        self.descriptors += other.descriptors;
        self.context += other.context;
        self.data_in += other.data_in;
        self.data_out += other.data_out;
    }
}

/// What an engine has done so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineCounters {
    /// Jobs taken by `submit_burst` or run by `run_inline`.
    pub submitted: u64,
    /// Jobs given back, through `poll_burst`, `reclaim` or `run_inline`.
    pub completed: u64,
    /// Submissions refused because the ring was full.
    pub ring_full: u64,
    /// Descriptors that completed with an error status.
    pub errors: u64,
    /// Jobs given back with `Timeout`: held past the engine's deadline
    /// (the shared engine, behind a server that stopped serving).
    pub timed_out: u64,
    /// Jobs refused with `Unavailable` while the engine was down.
    pub refused_unavailable: u64,
    /// The engine is down: it timed jobs out and has had no answer since,
    /// so it refuses jobs at once rather than let the caller stall.
    pub unavailable: bool,
    /// Descriptors executed per channel.
    pub per_channel: Vec<u64>,
    /// Busy time per execution unit, nanoseconds, by name.
    pub eu_busy_ns: Vec<(String, u64)>,
    /// Deepest the fetch FIFO got, over all channels.
    pub fifo_high_water: usize,
    /// Bytes moved across the (modelled) bus, by kind.
    pub bus: BusBytes,
    /// Bounce buffers allocated (per-request buffer policy).
    pub bounce_buffers: u64,
    /// Completion signals raised (interrupts; modelled by the `sec` model).
    pub interrupts: u64,
    /// Doorbells rung: one per burst that handed the engine any job.
    pub doorbells: u64,
    /// Modelled engines: the modelled time (the `now` clock), in ns, at which
    /// the last descriptor accepted so far completes.
    pub device_done_ns: u64,
    /// Modelled engines: the sum over descriptors of their modelled time
    /// from submission to completion, in ns (queueing included).
    pub device_latency_ns: u64,
    /// Modelled engines: time the shared bus spent transferring, in ns.
    pub bus_busy_ns: u64,
    /// Host costs a model charges that this machine cannot show (doorbell
    /// MMIO writes, interrupts, completion cache misses), in ns: the sum of
    /// `modelled_host`.
    pub modelled_host_ns: u64,
    /// The parts of `modelled_host_ns`, by cause.
    pub modelled_host: HostCharges,
    /// Host wall time a model spent running the real crypto for its jobs,
    /// in ns: measured, never part of any modelled time, so a caller that
    /// measures its own time around the engine can subtract it. Bounce
    /// copies (per-request policy) are not included: they are host work.
    pub emulation_ns: u64,
}

/// The modelled host costs of [`EngineCounters::modelled_host_ns`], by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostCharges {
    /// Doorbell MMIO writes, one per burst.
    pub doorbell_ns: u64,
    /// Interrupt entry, handler and exit, one per interrupt.
    pub interrupt_ns: u64,
    /// Cache misses on status words and ring entries, per completion.
    pub completion_ns: u64,
}

impl HostCharges {
    /// Every modelled host cost, in ns.
    pub fn total(&self) -> u64 {
        self.doorbell_ns + self.interrupt_ns + self.completion_ns
    }
}

/// When the next completion can be collected, as an engine knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextCompletion {
    /// Nothing is in flight.
    Idle,
    /// Completions are waiting: poll now.
    Ready,
    /// A modelled engine completes its next job at this time (the same
    /// clock as the `now` given to it): a driver that runs on modelled time
    /// advances to it; a live driver waits until its clock reaches it.
    At(Duration),
    /// A real device works on its own: the driver waits on the engine
    /// ([`Engine::wait`]) or polls again later.
    External,
}

/// Why an engine could not register a session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The keys do not suit the algorithm.
    #[error(transparent)]
    Keys(#[from] SessionError),
    /// The engine has no room for another session.
    #[error("the engine holds its maximum of {0} sessions")]
    Full(usize),
    /// The engine (or the kernel behind it) refused the session.
    #[error("the {engine} engine could not register the session: {reason}")]
    Refused {
        /// The engine that refused.
        engine: EngineKind,
        /// Its reason, as it gave it.
        reason: String,
    },
}

/// Executes jobs.
///
/// The contract, which every engine keeps and `lib-tests/tests/engines.rs` checks:
/// - A session is [`register`](Engine::register)ed once, at SA install;
///   the engine keeps its own form of the keys and gives a handle.
///   [`release`](Engine::release) wipes them; a job naming a released or
///   unknown handle completes with `Status::Error(BadSession)`, never with
///   another session's keys.
/// - [`submit_burst`](Engine::submit_burst) takes jobs from the front of
///   the caller's queue while the engine has room and rings one doorbell
///   for all of them; jobs it cannot take stay queued, in order. It never
///   blocks.
/// - [`poll_burst`](Engine::poll_burst) hands back the jobs complete by
///   `now`. Jobs of one session come back in the order they were
///   submitted (the dataplane's replay verdicts rely on it).
/// - Every submitted job comes back exactly once, through `poll_burst` or
///   [`reclaim`](Engine::reclaim), with its buffer.
/// - Nothing per job allocates (but the `per-request` buffer policy's
///   bounce buffers, which is that policy's point), locks or clones an
///   `Arc`.
/// - Only [`wait`](Engine::wait) may block, and only drivers call it.
/// - The `now` given is the engine's only time for what it decides: nothing
///   the core calls reads a clock to decide anything (the `sec` model
///   times its emulation for a counter, which decides nothing). Real time
///   an engine needs comes through `wait`.
pub trait Engine: Send {
    /// Which engine this is (fixed for its life).
    fn kind(&self) -> EngineKind;

    /// Registers an SA's keys; called at SA install, off the fast path.
    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, RegisterError>;

    /// Forgets a session and wipes its keys; called at SA delete. Jobs of
    /// the session still in flight complete normally.
    fn release(&mut self, handle: SessionHandle);

    /// Moves jobs from the front of `jobs` into the engine, as many as it
    /// has room for, with one doorbell; returns how many it took.
    fn submit_burst(&mut self, now: Duration, jobs: &mut VecDeque<Job>) -> usize;

    /// Whether [`run_inline`](Engine::run_inline) runs jobs: true for
    /// engines that compute on the calling CPU. Fixed for an engine's life.
    fn runs_inline(&self) -> bool {
        false
    }

    /// Runs a burst where it lies, now, on the calling CPU, and sets each
    /// job's status: no queue, no doorbell, no completion to poll (DPDK's
    /// CPU-crypto mode, `rte_cryptodev_sym_cpu_crypto_process`, for
    /// software crypto whose enqueue/dequeue round trip would cost more
    /// than it hides). Counted as submitted and completed. An engine that
    /// is a device returns false and leaves the jobs untouched; they must
    /// go through `submit_burst`.
    fn run_inline(&mut self, _jobs: &mut [Job]) -> bool {
        false
    }

    /// Appends the jobs complete by `now` to `out`; returns how many.
    fn poll_burst(&mut self, now: Duration, out: &mut Vec<Job>) -> usize;

    /// When to poll next.
    fn next_completion(&self) -> NextCompletion;

    /// Jobs submitted and not yet returned.
    fn in_flight(&self) -> usize;

    /// A copy of what the engine has done so far (not per packet: it allocates).
    fn counters(&self) -> EngineCounters;

    /// After a timeout: gives back jobs whose completions the engine lost
    /// (a channel reset, in hardware terms), with an error status, so no
    /// buffer is leaked.
    fn reclaim(&mut self, _now: Duration, _out: &mut Vec<Job>) -> usize {
        0
    }

    /// Blocks until a completion may be ready, at most `timeout`: the
    /// driver's interrupt wait. Engines without a device to wait for
    /// return at once. The gateway core never calls it, so it is where an
    /// engine may read the wall clock (the shared engine records the real
    /// time that passed, to confirm its timeouts).
    fn wait(&mut self, _timeout: Duration) {}

    /// The driver's wall clock, read once per turn of a live driver that
    /// may not [`wait`](Self::wait) for a while (its traffic never stops):
    /// like a wait's readings, it lets an engine confirm that real time has
    /// passed. The gateway core never calls it.
    fn observe_clock(&mut self, _wall: std::time::Instant) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are config values, `--engine` values and JSON text:
    /// deriving them must not rename one, and serde must agree with strum.
    /// A new engine is added here too.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        crate::assert_published_names::<EngineKind>(&["soft", "sec", "afalg", "shared"]);
        assert_eq!(
            "qat".parse::<EngineKind>().unwrap_err().to_string(),
            "unknown engine `qat`; expected soft, sec, afalg or shared"
        );
    }
}
