//! The engine job machine: the engine, and packets between *prepare* and
//! *finish* while it has them.
//!
//! Prepared packets become jobs in a bounded backlog, which is handed to
//! the engine one burst at a time (one doorbell), and completions are
//! collected in bursts. Nothing here waits: a full engine leaves jobs in
//! the backlog for the next step, a full backlog hands the packet back
//! (the caller drops it as `engine_busy`), and time comes only from the
//! `now` the caller passes in. The sync style keeps its meaning (one
//! packet's descriptors at a time, the caller waits) by handing the engine
//! one job at a time; dual-pass and sync packets go round twice (cipher
//! then MAC outbound, MAC then cipher inbound) without leaving the machine.
//!
//! Jobs of one session come back in the order they were launched (engines
//! return one session's jobs in order, and the backlog is FIFO): the ESP
//! stages rely on it for the replay window.
//!
//! Owns the engine, the backlog, the in-flight table and the inline burst;
//! hands every job back exactly once, settled, beside a [`Done`] saying
//! what the machine knew of it. Must not look into packets, SAs or
//! policies: what a finished job means is the caller's.

use std::collections::VecDeque;
use std::time::Duration;

use accel::{
    Algorithm, DescriptorKind, Direction, Engine, EngineCounters, EngineKind, Job, NextCompletion,
    RegisterError, SessionHandle, SessionSpec, Status, Style,
};
use spd_sad::SaId;

use super::JOB_TIMEOUT;
use crate::buffer::PacketBuf;
use crate::esp::Pending;

/// Jobs that may wait for room in the engine; beyond this a new packet is
/// dropped at once as `engine_busy`.
pub const BACKLOG_LIMIT: usize = 1024;

/// The `user` of the empty job a first pass leaves where it was settled
/// when it goes back in line (no slot of the in-flight table is this).
const REQUEUED: u64 = u64::MAX;

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

/// What the machine keeps of a packet with the engine: the job carries the
/// descriptor and the buffer, this the rest of its `Pending`.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    sa: SaId,
    seq: u64,
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

    fn entries(&self) -> impl Iterator<Item = &InFlight> {
        self.slots.iter().flatten()
    }
}

/// How a job's trip through the engine ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The engine finished it, with this status in the descriptor.
    Completed,
    /// Given up on after [`JOB_TIMEOUT`]: it is dropped as `engine_timeout`.
    Abandoned,
    /// A completion the machine never launched (cannot happen; the buffer
    /// is still handed back, never lost).
    Unknown,
}

/// What the machine knew of a job it hands back (the job itself carries
/// the descriptor, with the engine's status, and the buffer).
#[derive(Debug, Clone, Copy)]
pub(super) struct Done {
    pub(super) outcome: Outcome,
    pub(super) direction: Direction,
    pub(super) sa: SaId,
    /// The full sequence number, inbound.
    pub(super) seq: u64,
}

/// The engine side of the gateway: the engine, its backlog and what is in
/// flight.
pub(super) struct JobMachine {
    engine: Box<dyn Engine>,
    style: Style,
    in_flight: Slab,
    /// Prepared jobs the engine has not taken yet, in order.
    backlog: VecDeque<Job>,
    /// The one job a sync-style submission hands over.
    single: VecDeque<Job>,
    /// Outbound packets run inline (an engine that computes on this CPU,
    /// single pass): they skip the backlog and the in-flight table, and
    /// `run_inline` runs them as one burst.
    inline_outbound: bool,
    inline: Vec<Job>,
}

impl JobMachine {
    pub(super) fn new(engine: Box<dyn Engine>, style: Style) -> Self {
        JobMachine {
            inline_outbound: style == Style::Async && engine.runs_inline(),
            engine,
            style,
            inline: Vec::with_capacity(256),
            in_flight: Slab::default(),
            backlog: VecDeque::with_capacity(256),
            single: VecDeque::with_capacity(1),
        }
    }

    #[inline]
    pub(super) fn style(&self) -> Style {
        self.style
    }

    #[inline]
    pub(super) fn engine_kind(&self) -> EngineKind {
        self.engine.kind()
    }

    pub(super) fn engine_counters(&self) -> EngineCounters {
        self.engine.counters()
    }

    /// The engine, for drivers that wait on it; the core never does.
    pub(super) fn engine_mut(&mut self) -> &mut dyn Engine {
        self.engine.as_mut()
    }

    #[inline]
    pub(super) fn next_completion(&self) -> NextCompletion {
        self.engine.next_completion()
    }

    /// Registers an SA's keys; the engine keeps its own form of them.
    pub(super) fn register(&mut self, keys: &SessionSpec) -> Result<SessionHandle, RegisterError> {
        self.engine.register(keys)
    }

    /// Releases a session: the engine wipes its keys.
    pub(super) fn release(&mut self, handle: SessionHandle) {
        self.engine.release(handle);
    }

    /// Packets launched and not yet handed back.
    #[inline]
    pub(super) fn live(&self) -> usize {
        self.in_flight.live + self.inline.len()
    }

    /// Queues a prepared packet for the engine (the next [`step`](Self::step)
    /// hands it over). An outbound packet for an engine that runs inline
    /// joins the inline burst instead. The buffer comes back when the
    /// backlog is full.
    #[inline]
    pub(super) fn launch(
        &mut self,
        now: Duration,
        pending: Pending,
        direction: Direction,
        (session, algorithm): (SessionHandle, Algorithm),
        buf: PacketBuf,
    ) -> Result<(), PacketBuf> {
        if direction == Direction::Encrypt && self.inline_outbound {
            self.inline.push(Job::new(
                session,
                pending.desc,
                buf,
                pending.esp_offset,
                u64::from(pending.sa.0),
            ));
            return Ok(());
        }
        if self.backlog.len() >= BACKLOG_LIMIT {
            return Err(buf);
        }
        let phase = self.first_phase(algorithm);
        let slot = self.in_flight.insert(InFlight {
            sa: pending.sa,
            seq: pending.seq,
            direction,
            phase,
            submitted_at: now,
            abandoned: false,
        });
        self.backlog.push_back(Job::new(
            session,
            pending.desc,
            buf,
            pending.esp_offset,
            slot as u64,
        ));
        // Prepare builds single-pass descriptors. The kind is rewritten in
        // place, after the job is queued, and only when it changes: a
        // descriptor rebuilt byte by byte just before the job is copied
        // into the ring would stall that copy on store forwarding.
        if phase != Phase::Single {
            if let Some(job) = self.backlog.back_mut() {
                job.desc.kind = kind_for(direction, phase);
            }
        }
        Ok(())
    }

    /// Runs the inline outbound burst and hands its jobs back in order
    /// (outbound, with the SA's id as their `user`; the in-flight table
    /// never held them, so there is nothing to settle).
    #[inline]
    pub(super) fn run_inline(&mut self, done: &mut Vec<Job>) {
        if self.inline.is_empty() {
            return;
        }
        // `inline_outbound` is only set for an engine that runs inline; one
        // that would not leaves its jobs pending, and they fail when
        // finished rather than being lost.
        self.engine.run_inline(&mut self.inline);
        // The burst changes hands whole (the caller's empty vector takes
        // its place) rather than being copied job by job.
        if done.is_empty() {
            std::mem::swap(done, &mut self.inline);
        } else {
            done.append(&mut self.inline);
        }
    }

    /// Hands queued jobs to the engine and collects what it has completed
    /// by `now`, without waiting: each finished job is appended to `done`
    /// and what the machine knew of it to `known`, at the same index; a
    /// first pass of two goes back in line for its second instead. Returns
    /// how many jobs were submitted and how many completions came back.
    #[inline]
    pub(super) fn step(
        &mut self,
        now: Duration,
        done: &mut Vec<Job>,
        known: &mut Vec<Done>,
    ) -> (usize, usize) {
        let submitted = self.submit_queued(now);
        let start = done.len();
        let completed = self.engine.poll_burst(now, done);
        self.settle_from(start, done, known);
        (submitted, completed)
    }

    /// Settles `done[start..]` where they lie: the jobs are not moved
    /// unless a first pass goes back in line (then the place it leaves is
    /// closed up).
    #[inline]
    fn settle_from(&mut self, start: usize, done: &mut Vec<Job>, known: &mut Vec<Done>) {
        let mut requeued = false;
        for job in &mut done[start..] {
            match self.settle(job) {
                Some(info) => known.push(info),
                None => requeued = true,
            }
        }
        if requeued {
            done.retain(|job| job.user != REQUEUED);
        }
    }

    fn submit_queued(&mut self, now: Duration) -> usize {
        if self.backlog.is_empty() {
            return 0;
        }
        if self.style != Style::Sync {
            let taken = self.engine.submit_burst(now, &mut self.backlog);
            if self.backlog.is_empty() {
                // Back to the start of the ring, so that every burst reuses
                // the same (cached) slots instead of walking the ring.
                self.backlog.clear();
            }
            return taken;
        }
        // Low-level synchronous: one descriptor at a time, the next only
        // once the engine has handed the previous one back.
        if self.engine.in_flight() > 0 {
            return 0;
        }
        let Some(job) = self.backlog.pop_front() else {
            return 0;
        };
        self.single.push_back(job);
        let taken = self.engine.submit_burst(now, &mut self.single);
        if let Some(job) = self.single.pop_front() {
            self.backlog.push_front(job);
        }
        taken
    }

    /// A job came back from the engine (or was given up on): a first pass
    /// of two goes back in line for its second (`None`, and `job` is left
    /// an empty one marked [`REQUEUED`]); anything else is what the
    /// machine knew of it.
    #[inline]
    fn settle(&mut self, job: &mut Job) -> Option<Done> {
        let Some(entry) = self.in_flight.remove(job.user as usize) else {
            return Some(Done {
                outcome: Outcome::Unknown,
                direction: Direction::Encrypt,
                sa: SaId(u32::MAX),
                seq: 0,
            });
        };
        if !entry.abandoned && entry.phase == Phase::First && job.desc.status == Status::Done {
            let placeholder = Job::new(job.session, job.desc, PacketBuf::empty(), 0, REQUEUED);
            let mut job = std::mem::replace(job, placeholder);
            job.user = self.in_flight.insert(InFlight {
                phase: Phase::Second,
                ..entry
            }) as u64;
            job.desc.kind = kind_for(entry.direction, Phase::Second);
            job.desc.status = Status::Pending;
            // Sync: this packet's second descriptor is next. Dual-pass: it
            // queues behind what is waiting, which keeps each SA's packets
            // in order.
            if self.style == Style::Sync {
                self.backlog.push_front(job);
            } else {
                self.backlog.push_back(job);
            }
            return None;
        }
        Some(Done {
            outcome: if entry.abandoned {
                Outcome::Abandoned
            } else {
                Outcome::Completed
            },
            direction: entry.direction,
            sa: entry.sa,
            seq: entry.seq,
        })
    }

    /// Gives up on jobs the engine has held past [`JOB_TIMEOUT`]: they come
    /// back (through the engine's `reclaim`, from the backlog, or later
    /// when their completion turns up) as [`Outcome::Abandoned`].
    pub(super) fn expire(&mut self, now: Duration, done: &mut Vec<Job>, known: &mut Vec<Done>) {
        let overdue = self
            .in_flight
            .entries()
            .any(|f| !f.abandoned && now.saturating_sub(f.submitted_at) > JOB_TIMEOUT);
        if !overdue {
            return;
        }
        for entry in self.in_flight.slots.iter_mut().flatten() {
            if now.saturating_sub(entry.submitted_at) > JOB_TIMEOUT {
                entry.abandoned = true;
            }
        }
        let start = done.len();
        // Lost completions come back through a channel reset.
        self.engine.reclaim(now, done);
        // Abandoned jobs still in the backlog never reached the engine.
        let mut i = 0;
        while i < self.backlog.len() {
            let slot = self.backlog[i].user as usize;
            if self.in_flight.get_mut(slot).is_some_and(|e| e.abandoned) {
                if let Some(job) = self.backlog.remove(i) {
                    done.push(job);
                }
            } else {
                i += 1;
            }
        }
        self.settle_from(start, done, known);
    }

    /// When the machine wants to be stepped again: the engine's next
    /// completion, or queued work. Jobs that time out are looked for at the
    /// front's housekeeping, not here: that would be a walk over every job
    /// in flight at each call.
    #[inline]
    pub(super) fn deadline(&self, now: Duration) -> Option<Duration> {
        let engine = match self.engine.next_completion() {
            NextCompletion::Ready => Some(now),
            NextCompletion::At(t) => Some(t),
            NextCompletion::Idle | NextCompletion::External => None,
        };
        let queued = ((!self.backlog.is_empty() && self.engine.in_flight() == 0) || !self.inline.is_empty())
            .then_some(now);
        engine.into_iter().chain(queued).min()
    }

    /// The descriptor kinds for a packet in this machine's style: AEADs are
    /// always single-pass (GCM cannot be split); otherwise sync and
    /// dual-pass run cipher then MAC outbound, MAC then cipher inbound.
    fn first_phase(&self, algorithm: Algorithm) -> Phase {
        if self.style == Style::Async || algorithm.is_aead() {
            Phase::Single
        } else {
            Phase::First
        }
    }
}

fn kind_for(direction: Direction, phase: Phase) -> DescriptorKind {
    match (phase, direction) {
        (Phase::Single, _) => DescriptorKind::SinglePass,
        (Phase::First, Direction::Encrypt) | (Phase::Second, Direction::Decrypt) => {
            DescriptorKind::CipherOnly
        }
        (Phase::First, Direction::Decrypt) | (Phase::Second, Direction::Encrypt) => DescriptorKind::MacOnly,
    }
}
