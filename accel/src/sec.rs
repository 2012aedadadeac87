//! The SEC-like look-aside engine model.
//!
//! Modelled on the Freescale SEC 2.x: several channels, each a job ring with
//! a fetch FIFO, sharing execution units (AES, DES, MD/SHA and a null unit).
//! Each channel is a thread: it fetches descriptors, claims the execution
//! units a descriptor needs (one walk over the data for single-pass, one
//! unit per descriptor otherwise), runs the primitives, and writes the
//! status back into the completion ring, then signals completion by an
//! interrupt-style wake-up, not at all (the caller polls the done word), or
//! coalesced (after N completions, or when the caller's wait times out after
//! T). An optional rate model makes it take as long as a slower part would
//! (per-descriptor setup time, bytes/s per execution unit, bus bytes/s).
//!
//! Counters: descriptors per channel, execution-unit busy time, fetch-FIFO
//! high-water mark, ring-full events, and bytes moved across the modelled
//! bus (descriptor, keys and context, data in, data out).
//!
//! The submitting side (`submit`, `poll`, `wait`) runs on the dataplane
//! thread and takes no lock; the rings are lock-free (`crossbeam`). The
//! channel threads lock the execution units they claim, as hardware
//! arbitrates them.

// A full engine hands the job back by value: boxing it would allocate per
// packet on the fast path.
#![allow(clippy::result_large_err)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use crate::algorithm::{Algorithm, CipherKind, IntegrityKind};
use crate::descriptor::{Descriptor, DescriptorError, DescriptorKind, Direction, Status};
use crate::engine::{BusBytes, Engine, EngineCounters, EngineKind};
use crate::job::{BufferPolicy, Job};

/// Size of a SEC descriptor on the bus: a header dword and seven pointer
/// dwords (length, extent, pointer) of 8 bytes each.
pub const DESCRIPTOR_BYTES: u64 = 64;

/// How the engine tells the dataplane that work is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Completion {
    /// Wake the waiting dataplane thread on every completion.
    #[default]
    Interrupt,
    /// Never signal: the dataplane polls the done rings (burning its CPU).
    Polling,
    /// Signal after `count` completions; a waiter also wakes after `timeout`.
    Coalesced { count: usize, timeout: Duration },
}

impl Completion {
    pub fn name(&self) -> &'static str {
        match self {
            Completion::Interrupt => "interrupt",
            Completion::Polling => "polling",
            Completion::Coalesced { .. } => "coalesced",
        }
    }
}

/// How fast the modelled part is. `None` rates mean "as fast as this CPU".
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RateModel {
    /// Fixed cost per descriptor: fetch, decode, execution-unit reset.
    pub setup: Duration,
    /// Bus bandwidth shared by all channels, bytes/s.
    pub bus_bytes_per_sec: f64,
    pub aes_bytes_per_sec: f64,
    pub des_bytes_per_sec: f64,
    pub sha1_bytes_per_sec: f64,
    pub sha256_bytes_per_sec: f64,
}

impl RateModel {
    /// An approximation of a SEC 2.x at 266 MHz (MPC8548-class): about
    /// 1 Gbit/s AES, 440 Mbit/s 3DES, 1 Gbit/s SHA-1, 0.9 Gbit/s SHA-256,
    /// a 64-bit bus at roughly 1 GB/s effective, and about 1 µs of
    /// descriptor setup. Figures are rounded from public application notes
    /// for the part class; adjust them to emulate another device.
    pub fn sec2_266mhz() -> RateModel {
        RateModel {
            setup: Duration::from_nanos(1000),
            bus_bytes_per_sec: 1.0e9,
            aes_bytes_per_sec: 125.0e6,
            des_bytes_per_sec: 55.0e6,
            sha1_bytes_per_sec: 125.0e6,
            sha256_bytes_per_sec: 110.0e6,
        }
    }

    /// Modelled time for one descriptor: setup, the slowest unit it uses
    /// (single-pass units work in parallel on one walk), and its bus bytes.
    fn duration(&self, units: &[(Unit, u64)], bus_bytes: u64) -> Duration {
        let unit_secs = units
            .iter()
            .map(|(unit, bytes)| {
                let rate = match unit {
                    Unit::Aes => self.aes_bytes_per_sec,
                    Unit::Des => self.des_bytes_per_sec,
                    Unit::Sha1 => self.sha1_bytes_per_sec,
                    Unit::Sha256 => self.sha256_bytes_per_sec,
                    Unit::Null => f64::INFINITY,
                };
                *bytes as f64 / rate
            })
            .fold(0.0, f64::max);
        let bus_secs = bus_bytes as f64 / self.bus_bytes_per_sec;
        self.setup + Duration::from_secs_f64(unit_secs + bus_secs)
    }
}

/// Injected faults, by global descriptor number (1-based, in fetch order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// These descriptors complete with an error status.
    pub fail: Vec<u64>,
    /// These descriptors never complete (the completion is lost).
    pub drop_completion: Vec<u64>,
    /// Before fetching this descriptor, its channel stalls for the duration.
    pub stall: Option<(u64, Duration)>,
    /// Every this-many-th descriptor fails too (soak tests).
    pub fail_every: Option<u64>,
    /// Every this-many-th descriptor's completion is lost too.
    pub drop_completion_every: Option<u64>,
}

impl FaultPlan {
    fn fails(&self, number: u64) -> bool {
        self.fail.contains(&number) || self.fail_every.is_some_and(|n| n > 0 && number.is_multiple_of(n))
    }

    fn loses_completion(&self, number: u64) -> bool {
        self.drop_completion.contains(&number)
            || self
                .drop_completion_every
                .is_some_and(|n| n > 0 && number.is_multiple_of(n))
    }
}

/// Configuration of the engine model.
#[derive(Debug, Clone, PartialEq)]
pub struct SecConfig {
    pub channels: usize,
    /// Descriptors a channel's fetch FIFO holds (SEC 2.x: 24).
    pub fifo_depth: usize,
    pub completion: Completion,
    pub rate: Option<RateModel>,
    pub buffers: BufferPolicy,
    pub faults: FaultPlan,
}

impl Default for SecConfig {
    fn default() -> Self {
        SecConfig {
            channels: 4,
            fifo_depth: 24,
            completion: Completion::Interrupt,
            rate: None,
            buffers: BufferPolicy::Registered,
            faults: FaultPlan::default(),
        }
    }
}

/// Execution units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Aes,
    Des,
    Sha1,
    Sha256,
    Null,
}

impl Unit {
    const ALL: [Unit; 5] = [Unit::Aes, Unit::Des, Unit::Sha1, Unit::Sha256, Unit::Null];

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            Unit::Aes => "aesu",
            Unit::Des => "deu",
            Unit::Sha1 => "mdeu-sha1",
            Unit::Sha256 => "mdeu-sha256",
            Unit::Null => "null",
        }
    }
}

fn cipher_unit(alg: Algorithm) -> Unit {
    match alg.cipher() {
        CipherKind::AesGcm | CipherKind::AesCbc => Unit::Aes,
        CipherKind::TripleDesCbc => Unit::Des,
        CipherKind::Null => Unit::Null,
    }
}

fn mac_unit(alg: Algorithm) -> Option<Unit> {
    match alg.integrity() {
        IntegrityKind::HmacSha1_96 => Some(Unit::Sha1),
        IntegrityKind::HmacSha256_128 => Some(Unit::Sha256),
        IntegrityKind::Aead | IntegrityKind::None => None,
    }
}

/// Execution units a descriptor claims, with the bytes each one walks.
fn units_for(alg: Algorithm, desc: &Descriptor) -> ([(Unit, u64); 2], usize) {
    let cipher_bytes = u64::from(desc.cipher.len);
    let mac_bytes = (desc.authenticated().len()) as u64;
    let none = (Unit::Null, 0);
    match (desc.kind, mac_unit(alg)) {
        (DescriptorKind::SinglePass, Some(mac)) => ([(cipher_unit(alg), cipher_bytes), (mac, mac_bytes)], 2),
        (DescriptorKind::SinglePass, None) | (DescriptorKind::CipherOnly, _) => {
            ([(cipher_unit(alg), cipher_bytes), none], 1)
        }
        (DescriptorKind::MacOnly, Some(mac)) => ([(mac, mac_bytes), none], 1),
        (DescriptorKind::MacOnly, None) => ([none, none], 1),
    }
}

/// Bytes a descriptor moves across the bus.
pub fn bus_bytes(alg: Algorithm, desc: &Descriptor) -> BusBytes {
    let mac_state = match alg.integrity() {
        // Precomputed inner and outer hash states.
        IntegrityKind::HmacSha1_96 => 40,
        IntegrityKind::HmacSha256_128 => 64,
        IntegrityKind::Aead | IntegrityKind::None => 0,
    };
    let cipher_key = alg.enc_key_len() as u64;
    let iv = u64::from(desc.iv.len);
    let header = u64::from(desc.auth_only.len);
    let cipher = u64::from(desc.cipher.len);
    let icv = u64::from(desc.icv.len);
    let decrypting = desc.direction == Direction::Decrypt;
    let (context, data_in, data_out) = match desc.kind {
        DescriptorKind::SinglePass => (
            cipher_key + mac_state + iv,
            header + iv + cipher + if decrypting { icv } else { 0 },
            cipher + if decrypting { 0 } else { icv },
        ),
        DescriptorKind::CipherOnly => (cipher_key + iv, cipher, cipher),
        DescriptorKind::MacOnly => (
            mac_state,
            header + iv + cipher + if decrypting { icv } else { 0 },
            if decrypting { 0 } else { icv },
        ),
    };
    BusBytes {
        descriptors: DESCRIPTOR_BYTES,
        context,
        data_in,
        data_out,
    }
}

/// State shared between the dataplane side and the channel threads.
struct Shared {
    stop: AtomicBool,
    /// The dataplane thread waiting for completions, if any.
    waiter: Mutex<Option<Thread>>,
    /// Completions not yet signalled (coalescing).
    unsignalled: AtomicUsize,
    interrupts: AtomicU64,
    units: Vec<Mutex<u64>>,
    fetched: AtomicU64,
    completion: Completion,
    rate: Option<RateModel>,
    faults: FaultPlan,
    bus: [AtomicU64; 4],
    errors: AtomicU64,
    /// Jobs whose completion was lost, until a channel reset reclaims them.
    lost: Mutex<Vec<Job>>,
}

struct Channel {
    submit: ArrayQueue<Job>,
    done: ArrayQueue<Job>,
    executed: AtomicU64,
    high_water: AtomicUsize,
}

/// The engine model; see the module documentation.
pub struct SecEngine {
    config: SecConfig,
    shared: Arc<Shared>,
    channels: Vec<Arc<Channel>>,
    threads: Vec<JoinHandle<()>>,
    /// Jobs submitted and not yet polled, per channel.
    in_flight: Vec<usize>,
    submitted: u64,
    completed: u64,
    ring_full: u64,
    bounce_buffers: u64,
}

impl SecEngine {
    pub fn new(config: SecConfig) -> SecEngine {
        let channels_n = config.channels.max(1);
        let depth = config.fifo_depth.max(1);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            waiter: Mutex::new(None),
            unsignalled: AtomicUsize::new(0),
            interrupts: AtomicU64::new(0),
            units: Unit::ALL.iter().map(|_| Mutex::new(0)).collect(),
            fetched: AtomicU64::new(0),
            completion: config.completion,
            rate: config.rate,
            faults: config.faults.clone(),
            bus: Default::default(),
            errors: AtomicU64::new(0),
            lost: Mutex::new(Vec::new()),
        });
        let channels: Vec<Arc<Channel>> = (0..channels_n)
            .map(|_| {
                Arc::new(Channel {
                    submit: ArrayQueue::new(depth),
                    done: ArrayQueue::new(depth),
                    executed: AtomicU64::new(0),
                    high_water: AtomicUsize::new(0),
                })
            })
            .collect();
        let threads = channels
            .iter()
            .enumerate()
            .map(|(i, channel)| {
                let channel = Arc::clone(channel);
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("sec-ch{i}"))
                    .spawn(move || channel_loop(&shared, &channel))
                    .expect("spawning an engine channel thread")
            })
            .collect();
        SecEngine {
            in_flight: vec![0; channels_n],
            config,
            shared,
            channels,
            threads,
            submitted: 0,
            completed: 0,
            ring_full: 0,
            bounce_buffers: 0,
        }
    }

    pub fn config(&self) -> &SecConfig {
        &self.config
    }

    /// Packets of one SA always use the same channel, so they stay in order.
    fn channel_for(&self, job: &Job) -> usize {
        (job.session.id().0 % self.channels.len() as u64) as usize
    }

    fn done_ready(&self) -> bool {
        self.channels.iter().any(|c| !c.done.is_empty())
    }
}

impl Engine for SecEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sec
    }

    fn submit(&mut self, mut job: Job) -> Result<(), Job> {
        let ch = self.channel_for(&job);
        if self.in_flight[ch] >= self.config.fifo_depth {
            self.ring_full += 1;
            return Err(job);
        }
        if self.config.buffers == BufferPolicy::PerRequest && job.bounce.is_none() {
            // Allocate and register a bounce buffer for this request and
            // copy the packet into it; the engine never sees the pool.
            job.bounce = Some(job.region_bytes().to_vec());
            self.bounce_buffers += 1;
        }
        let channel = &self.channels[ch];
        match channel.submit.push(job) {
            Ok(()) => {
                self.in_flight[ch] += 1;
                self.submitted += 1;
                channel
                    .high_water
                    .fetch_max(channel.submit.len(), Ordering::Relaxed);
                // The doorbell: wake the channel if it sleeps.
                self.threads[ch].thread().unpark();
                Ok(())
            }
            Err(job) => {
                self.ring_full += 1;
                Err(job)
            }
        }
    }

    fn poll(&mut self, out: &mut Vec<Job>) -> usize {
        let mut n = 0;
        for (ch, channel) in self.channels.iter().enumerate() {
            while let Some(mut job) = channel.done.pop() {
                if let Some(bounce) = job.bounce.take() {
                    // Copy the result out of the bounce buffer and release it.
                    let dst = job.region_bytes();
                    let len = dst.len().min(bounce.len());
                    dst[..len].copy_from_slice(&bounce[..len]);
                }
                self.in_flight[ch] -= 1;
                out.push(job);
                n += 1;
            }
        }
        self.completed += n as u64;
        n
    }

    fn wait(&mut self, timeout: Duration) {
        if self.done_ready() {
            return;
        }
        match self.shared.completion {
            Completion::Polling => {
                // Poll the done words until something completes.
                let deadline = Instant::now() + timeout;
                while !self.done_ready() && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
            }
            Completion::Interrupt | Completion::Coalesced { .. } => {
                let timeout = match self.shared.completion {
                    Completion::Coalesced { timeout: t, .. } => timeout.min(t),
                    _ => timeout,
                };
                if let Ok(mut waiter) = self.shared.waiter.lock() {
                    *waiter = Some(thread::current());
                }
                // Completions may have landed while registering.
                if !self.done_ready() {
                    thread::park_timeout(timeout);
                }
                if let Ok(mut waiter) = self.shared.waiter.lock() {
                    *waiter = None;
                }
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight.iter().sum()
    }

    fn counters(&self) -> EngineCounters {
        let units = self
            .shared
            .units
            .iter()
            .zip(Unit::ALL)
            .map(|(busy, unit)| (unit.name().to_owned(), busy.lock().map_or(0, |b| *b)))
            .collect();
        let bus = &self.shared.bus;
        EngineCounters {
            submitted: self.submitted,
            completed: self.completed,
            ring_full: self.ring_full,
            errors: self.shared.errors.load(Ordering::Relaxed),
            per_channel: self
                .channels
                .iter()
                .map(|c| c.executed.load(Ordering::Relaxed))
                .collect(),
            eu_busy_ns: units,
            fifo_high_water: self
                .channels
                .iter()
                .map(|c| c.high_water.load(Ordering::Relaxed))
                .max()
                .unwrap_or(0),
            bus: BusBytes {
                descriptors: bus[0].load(Ordering::Relaxed),
                context: bus[1].load(Ordering::Relaxed),
                data_in: bus[2].load(Ordering::Relaxed),
                data_out: bus[3].load(Ordering::Relaxed),
            },
            bounce_buffers: self.bounce_buffers,
            interrupts: self.shared.interrupts.load(Ordering::Relaxed),
        }
    }

    fn reclaim(&mut self, out: &mut Vec<Job>) -> usize {
        let lost: Vec<Job> = match self.shared.lost.lock() {
            Ok(mut lost) => lost.drain(..).collect(),
            Err(_) => return 0,
        };
        let n = lost.len();
        for mut job in lost {
            let ch = self.channel_for(&job);
            self.in_flight[ch] -= 1;
            job.bounce = None;
            job.desc.status = Status::Error(DescriptorError::Fault);
            out.push(job);
        }
        self.completed += n as u64;
        n
    }
}

impl Drop for SecEngine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for handle in self.threads.drain(..) {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }
}

fn lock_unit(shared: &Shared, unit: Unit) -> Option<MutexGuard<'_, u64>> {
    shared.units.get(unit.index()).and_then(|m| m.lock().ok())
}

fn channel_loop(shared: &Shared, channel: &Channel) {
    while !shared.stop.load(Ordering::Acquire) {
        let Some(mut job) = channel.submit.pop().or_else(|| fetch_soon(channel)) else {
            // Nothing came for a while: sleep until the doorbell rings.
            thread::park_timeout(Duration::from_millis(50));
            continue;
        };
        let number = shared.fetched.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some((at, pause)) = shared.faults.stall {
            if at == number {
                thread::sleep(pause);
            }
        }
        execute(shared, &mut job, number);
        channel.executed.fetch_add(1, Ordering::Relaxed);
        if shared.faults.loses_completion(number) {
            if let Ok(mut lost) = shared.lost.lock() {
                lost.push(job);
            }
            continue;
        }
        // The ring has room: the dataplane never has more in flight on a
        // channel than the FIFO holds.
        if let Err(job) = channel.done.push(job) {
            if let Ok(mut lost) = shared.lost.lock() {
                lost.push(job);
            }
        }
        signal(shared);
    }
}

/// A fetch engine keeps looking at its ring for a moment before it idles;
/// back-to-back descriptors then cost no doorbell wake-up.
fn fetch_soon(channel: &Channel) -> Option<Job> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_micros(20) {
        if let Some(job) = channel.submit.pop() {
            return Some(job);
        }
        std::hint::spin_loop();
    }
    None
}

/// Runs one descriptor: claims its units, computes, honours the rate model.
fn execute(shared: &Shared, job: &mut Job, number: u64) {
    let start = Instant::now();
    let alg = job.session.algorithm();
    let bus = bus_bytes(alg, &job.desc);
    for (counter, value) in shared
        .bus
        .iter()
        .zip([bus.descriptors, bus.context, bus.data_in, bus.data_out])
    {
        counter.fetch_add(value, Ordering::Relaxed);
    }
    let (units, used) = units_for(alg, &job.desc);
    // A descriptor claims at most two units; a fixed claiming order (by
    // index) keeps channels from deadlocking on them.
    let (mut first, mut second) = (units[0].0, units[used.max(1) - 1].0);
    if second.index() < first.index() {
        std::mem::swap(&mut first, &mut second);
    }
    let mut guards = [
        lock_unit(shared, first),
        (second != first).then(|| lock_unit(shared, second)).flatten(),
    ];
    if shared.faults.fails(number) {
        job.desc.status = Status::Error(DescriptorError::Fault);
    } else {
        let session = Arc::clone(&job.session);
        match job.bounce.as_mut() {
            Some(bounce) => crate::soft::process(&session, &mut job.desc, bounce),
            None => {
                let mut desc = job.desc;
                crate::soft::process(&session, &mut desc, job.region_bytes());
                job.desc = desc;
            }
        }
    }
    if matches!(job.desc.status, Status::Error(_)) {
        shared.errors.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(rate) = &shared.rate {
        let target = rate.duration(&units[..used], bus.total());
        // Sleep for long waits, spin out the rest for precision.
        while start.elapsed() < target {
            let left = target.saturating_sub(start.elapsed());
            if left > Duration::from_micros(200) {
                thread::sleep(left - Duration::from_micros(100));
            } else {
                std::hint::spin_loop();
            }
        }
    }
    let busy = start.elapsed().as_nanos() as u64;
    for guard in guards.iter_mut().flatten() {
        **guard += busy;
    }
}

fn signal(shared: &Shared) {
    let wake = match shared.completion {
        Completion::Polling => false,
        Completion::Interrupt => true,
        Completion::Coalesced { count, .. } => {
            let pending = shared.unsignalled.fetch_add(1, Ordering::AcqRel) + 1;
            if pending >= count.max(1) {
                shared.unsignalled.store(0, Ordering::Release);
                true
            } else {
                false
            }
        }
    };
    if wake {
        shared.interrupts.fetch_add(1, Ordering::Relaxed);
        if let Ok(waiter) = shared.waiter.lock() {
            if let Some(thread) = waiter.as_ref() {
                thread.unpark();
            }
        }
    }
}
