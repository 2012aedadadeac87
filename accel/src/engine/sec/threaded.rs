//! The threaded `sec` engine (`SecConfig::threads`): real parallelism.
//!
//! One worker thread per channel takes descriptors from its channel's ring,
//! runs them with the soft engine's primitive, and puts them on its done
//! ring. Workers busy-poll their rings (only after a long idle stretch do
//! they yield the core, and never sleep or park), so a worker needs a core
//! of its own: on a machine without a spare core per channel the figures
//! measure the scheduler, not the engine, which is why this engine is an
//! option and never in the default sweep. It runs at host speed: the
//! device profile's rates, the completion mode and the modelled host
//! costs do not apply (no interrupts are raised: the host polls the done
//! rings).
//!
//! Sessions: the engine issues handles; each session's expanded keys move
//! to the worker of the session's channel through the same ring as its
//! jobs, and so does its release, so a job always meets the keys (or their
//! absence) in submission order and nothing per job locks or counts
//! references.
//!
//! This file owns the workers and their rings; the model (`model.rs`)
//! must not depend on it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_queue::{ArrayQueue, SegQueue};

use super::{bus_bytes, units_for, EuKind, FaultPlan, SecConfig};
use crate::descriptor::{DescriptorError, Status};
use crate::engine::{BusBytes, Engine, EngineCounters, EngineKind, NextCompletion, RegisterError};
use crate::job::{BufferPolicy, Job};
use crate::session::{Session, SessionHandle, SessionSpec, SessionTable};

/// Room on a ring for session messages besides a full FIFO of jobs.
const CONTROL_SLACK: usize = 16;

/// Idle polls before a worker yields its core once.
const SPINS_BEFORE_YIELD: u32 = 1 << 16;

enum Msg {
    Job { job: Job, number: u64 },
    Register(SessionHandle, Box<Session>),
    Release(SessionHandle),
}

struct Ring {
    submit: ArrayQueue<Msg>,
    done: ArrayQueue<Job>,
    executed: AtomicU64,
    errors: AtomicU64,
}

struct Shared {
    stop: AtomicBool,
    faults: FaultPlan,
    /// Jobs whose completion was lost, with their channel.
    lost: SegQueue<(usize, Job)>,
    bus: [AtomicU64; 4],
    /// Host time spent in each execution-unit kind's crypto, ns.
    unit_ns: [AtomicU64; 5],
}

/// The threaded engine; see the module documentation.
pub struct ThreadedSecEngine {
    config: SecConfig,
    shared: Arc<Shared>,
    rings: Vec<Arc<Ring>>,
    workers: Vec<JoinHandle<()>>,
    /// Issues handles; the keys live with the channel's worker.
    handles: SessionTable<()>,
    in_flight: Vec<usize>,
    numbered: u64,
    counters: EngineCounters,
}

impl std::fmt::Debug for ThreadedSecEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadedSecEngine")
            .field("channels", &self.rings.len())
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// Why the threaded engine could not start.
#[derive(Debug, thiserror::Error)]
#[error("could not start sec channel worker {channel}: {source}")]
pub struct SpawnError {
    /// The channel whose worker thread did not start.
    pub channel: usize,
    /// Why the thread could not be spawned.
    #[source]
    pub source: std::io::Error,
}

impl ThreadedSecEngine {
    /// Starts one busy-polling worker thread per channel of `config`.
    pub fn new(config: SecConfig) -> Result<ThreadedSecEngine, SpawnError> {
        let channels = config.channels.max(1);
        let depth = config.fifo_depth.max(1);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            faults: config.faults.clone(),
            lost: SegQueue::new(),
            bus: Default::default(),
            unit_ns: Default::default(),
        });
        let rings: Vec<Arc<Ring>> = (0..channels)
            .map(|_| {
                Arc::new(Ring {
                    submit: ArrayQueue::new(depth + CONTROL_SLACK),
                    done: ArrayQueue::new(depth),
                    executed: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                })
            })
            .collect();
        let mut engine = ThreadedSecEngine {
            in_flight: vec![0; channels],
            shared,
            rings,
            workers: Vec::with_capacity(channels),
            handles: SessionTable::default(),
            numbered: 0,
            counters: EngineCounters {
                per_channel: vec![0; channels],
                ..EngineCounters::default()
            },
            config,
        };
        for channel in 0..channels {
            let ring = Arc::clone(&engine.rings[channel]);
            let shared = Arc::clone(&engine.shared);
            let worker = thread::Builder::new()
                .name(format!("sec-ch{channel}"))
                .spawn(move || worker_loop(channel, &shared, &ring))
                .map_err(|source| SpawnError { channel, source })?;
            // On an error, `engine`'s drop stops the workers already started.
            engine.workers.push(worker);
        }
        Ok(engine)
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &SecConfig {
        &self.config
    }

    fn channel_of(&self, handle: SessionHandle) -> usize {
        handle.index as usize % self.rings.len()
    }

    /// Queues a session message on `ch`'s ring, waiting for room if the
    /// ring is full of jobs (off the fast path; the worker drains it).
    /// Fails only if the worker is gone.
    fn send_control(&self, ch: usize, mut msg: Msg) -> Result<(), ()> {
        loop {
            match self.rings[ch].submit.push(msg) {
                Ok(()) => return Ok(()),
                Err(back) => {
                    if self.workers.get(ch).is_none_or(|w| w.is_finished()) {
                        return Err(());
                    }
                    msg = back;
                    std::hint::spin_loop();
                }
            }
        }
    }

    fn done_ready(&self) -> bool {
        self.rings.iter().any(|r| !r.done.is_empty())
    }
}

impl Engine for ThreadedSecEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sec
    }

    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, RegisterError> {
        super::check_supported(spec.algorithm)?;
        let session = Box::new(Session::from_spec(spec)?);
        let handle = self.handles.insert(());
        let ch = self.channel_of(handle);
        if self.send_control(ch, Msg::Register(handle, session)).is_err() {
            self.handles.remove(handle);
            return Err(RegisterError::Refused {
                engine: EngineKind::Sec,
                reason: format!("channel worker {ch} has stopped"),
            });
        }
        Ok(handle)
    }

    fn release(&mut self, handle: SessionHandle) {
        if self.handles.remove(handle).is_some() {
            let ch = self.channel_of(handle);
            // A stopped worker has dropped (and so wiped) every key it held.
            let _ = self.send_control(ch, Msg::Release(handle));
        }
    }

    fn submit_burst(&mut self, _now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        let depth = self.config.fifo_depth.max(1);
        let mut taken = 0;
        while let Some(front) = jobs.front() {
            let ch = self.channel_of(front.session);
            if self.in_flight[ch] >= depth {
                self.counters.ring_full += 1;
                break;
            }
            let Some(mut job) = jobs.pop_front() else { break };
            if self.config.buffers == BufferPolicy::PerRequest && self.handles.get(job.session).is_some() {
                job.bounce_in();
                self.counters.bounce_buffers += 1;
            }
            self.numbered += 1;
            let msg = Msg::Job {
                job,
                number: self.numbered,
            };
            match self.rings[ch].submit.push(msg) {
                Ok(()) => {
                    self.in_flight[ch] += 1;
                    taken += 1;
                    let depth_now = self.in_flight[ch];
                    self.counters.fifo_high_water = self.counters.fifo_high_water.max(depth_now);
                }
                Err(Msg::Job { mut job, .. }) => {
                    // Session messages fill the slack: the job waits.
                    self.numbered -= 1;
                    if job.is_bounced() {
                        job.discard_bounce();
                        self.counters.bounce_buffers -= 1;
                    }
                    jobs.push_front(job);
                    self.counters.ring_full += 1;
                    break;
                }
                Err(_) => break,
            }
        }
        if taken > 0 {
            self.counters.submitted += taken as u64;
            self.counters.doorbells += 1;
        }
        taken
    }

    fn poll_burst(&mut self, _now: Duration, out: &mut Vec<Job>) -> usize {
        let mut n = 0;
        for (ch, ring) in self.rings.iter().enumerate() {
            while let Some(mut job) = ring.done.pop() {
                job.bounce_out();
                self.in_flight[ch] -= 1;
                out.push(job);
                n += 1;
            }
        }
        self.counters.completed += n as u64;
        n
    }

    fn next_completion(&self) -> NextCompletion {
        if self.done_ready() {
            NextCompletion::Ready
        } else if self.in_flight.iter().any(|&n| n > 0) {
            NextCompletion::External
        } else {
            NextCompletion::Idle
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight.iter().sum()
    }

    fn counters(&self) -> EngineCounters {
        let mut counters = self.counters.clone();
        counters.per_channel = self
            .rings
            .iter()
            .map(|r| r.executed.load(Ordering::Relaxed))
            .collect();
        counters.errors = self.rings.iter().map(|r| r.errors.load(Ordering::Relaxed)).sum();
        let bus = &self.shared.bus;
        counters.bus = BusBytes {
            descriptors: bus[0].load(Ordering::Relaxed),
            context: bus[1].load(Ordering::Relaxed),
            data_in: bus[2].load(Ordering::Relaxed),
            data_out: bus[3].load(Ordering::Relaxed),
        };
        counters.eu_busy_ns = EuKind::ALL
            .iter()
            .map(|k| {
                let ns = self.shared.unit_ns[k.index()].load(Ordering::Relaxed);
                (k.name().to_owned(), ns)
            })
            .collect();
        counters
    }

    fn reclaim(&mut self, _now: Duration, out: &mut Vec<Job>) -> usize {
        let mut n = 0;
        while let Some((ch, mut job)) = self.shared.lost.pop() {
            job.discard_bounce();
            job.desc.status = Status::Error(DescriptorError::Fault);
            self.in_flight[ch] -= 1;
            out.push(job);
            n += 1;
        }
        self.counters.completed += n as u64;
        n
    }

    /// Busy-polls the done rings until one has a job, at most `timeout`.
    fn wait(&mut self, timeout: Duration) {
        let start = Instant::now();
        while !self.done_ready() && start.elapsed() < timeout {
            std::hint::spin_loop();
        }
    }
}

impl Drop for ThreadedSecEngine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// A worker's sessions, by handle index, with the generation registered.
struct Keys {
    slots: Vec<Option<(u32, Session)>>,
}

impl Keys {
    fn get(&self, handle: SessionHandle) -> Option<&Session> {
        match self.slots.get(handle.index as usize) {
            Some(Some((generation, session))) if *generation == handle.generation => Some(session),
            _ => None,
        }
    }
}

fn worker_loop(channel: usize, shared: &Shared, ring: &Ring) {
    let mut keys = Keys { slots: Vec::new() };
    let mut idle = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let Some(msg) = ring.submit.pop() else {
            idle = idle.saturating_add(1);
            if idle >= SPINS_BEFORE_YIELD {
                // Long idle: let another runnable thread have the core once.
                idle = 0;
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        };
        idle = 0;
        match msg {
            Msg::Register(handle, session) => {
                let index = handle.index as usize;
                if keys.slots.len() <= index {
                    keys.slots.resize_with(index + 1, || None);
                }
                keys.slots[index] = Some((handle.generation, *session));
            }
            Msg::Release(handle) => {
                if let Some(slot) = keys.slots.get_mut(handle.index as usize) {
                    if slot.as_ref().is_some_and(|(g, _)| *g == handle.generation) {
                        // Dropping the session wipes its keys.
                        *slot = None;
                    }
                }
            }
            Msg::Job { mut job, number } => {
                if let Some(pause) = shared.faults.stall_before(number) {
                    // The stalled channel holds its core, as hardware would.
                    let start = Instant::now();
                    while start.elapsed() < pause {
                        std::hint::spin_loop();
                    }
                }
                execute(shared, &keys, &mut job, number);
                ring.executed.fetch_add(1, Ordering::Relaxed);
                if matches!(job.desc.status, Status::Error(_)) {
                    ring.errors.fetch_add(1, Ordering::Relaxed);
                }
                if shared.faults.loses_completion(number) {
                    shared.lost.push((channel, job));
                } else if let Err(job) = ring.done.push(job) {
                    // Cannot happen: the engine never has more in flight on a
                    // channel than the done ring holds. Keep the job anyway.
                    shared.lost.push((channel, job));
                }
            }
        }
    }
}

fn execute(shared: &Shared, keys: &Keys, job: &mut Job, number: u64) {
    let Some(session) = keys.get(job.session) else {
        job.desc.status = Status::Error(DescriptorError::BadSession);
        return;
    };
    let alg = session.algorithm();
    let bus = bus_bytes(alg, &job.desc);
    for (counter, value) in shared
        .bus
        .iter()
        .zip([bus.descriptors, bus.context, bus.data_in, bus.data_out])
    {
        counter.fetch_add(value, Ordering::Relaxed);
    }
    if shared.faults.fails(number) {
        job.desc.status = Status::Error(DescriptorError::Fault);
        return;
    }
    let start = Instant::now();
    let mut desc = job.desc;
    crate::primitive::process(session, &mut desc, job.work_bytes());
    job.desc = desc;
    let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    for (kind, _) in units_for(alg, &job.desc).into_iter().flatten() {
        shared.unit_ns[kind.index()].fetch_add(ns, Ordering::Relaxed);
    }
}
