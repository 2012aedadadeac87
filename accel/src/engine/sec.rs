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

use std::collections::VecDeque;
use std::time::Duration;

use crate::algorithm::{Algorithm, CipherKind, IntegrityKind};
use crate::descriptor::{Descriptor, DescriptorKind, Direction};
use crate::engine::{BusBytes, Engine, EngineCounters, EngineKind, NextCompletion, RegisterError};
use crate::job::{BufferPolicy, Job};
use crate::session::{SessionHandle, SessionSpec};

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

/// INTERIM while the discrete-event model is written on its own branch:
/// runs jobs inline like `soft`. Not to land.
pub struct SecEngine {
    config: SecConfig,
    inner: crate::engine::SoftEngine,
}

impl SecEngine {
    pub fn new(config: SecConfig) -> SecEngine {
        let _ = (Unit::ALL, Unit::Aes.index(), Unit::Aes.name(), units_for);
        SecEngine {
            inner: crate::engine::SoftEngine::new(config.buffers),
            config,
        }
    }

    pub fn config(&self) -> &SecConfig {
        &self.config
    }
}

impl Engine for SecEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sec
    }
    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, RegisterError> {
        self.inner.register(spec)
    }
    fn release(&mut self, handle: SessionHandle) {
        self.inner.release(handle)
    }
    fn submit_burst(&mut self, now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        self.inner.submit_burst(now, jobs)
    }
    fn poll_burst(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        self.inner.poll_burst(now, out)
    }
    fn next_completion(&self) -> NextCompletion {
        self.inner.next_completion()
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn counters(&self) -> EngineCounters {
        let _ = self.config.rate.map(|r| r.duration(&[], 0));
        self.inner.counters()
    }
}
