//! Engines: where jobs are executed, behind one submission/completion
//! interface so the dataplane does not know which one it talks to.

// A full engine hands the job back by value: boxing it would allocate per
// packet on the fast path.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::job::{BufferPolicy, Job};

/// The engines espgw can put behind the boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// Inline software in the caller's thread.
    #[default]
    Soft,
    /// The SEC-like look-aside engine model: its own channel threads.
    Sec,
    /// The Linux kernel crypto API through AF_ALG sockets.
    Afalg,
}

impl EngineKind {
    pub const ALL: [EngineKind; 3] = [EngineKind::Soft, EngineKind::Sec, EngineKind::Afalg];

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Soft => "soft",
            EngineKind::Sec => "sec",
            EngineKind::Afalg => "afalg",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An engine name that is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine `{0}`; expected soft, sec or afalg")]
pub struct UnknownEngine(pub String);

impl FromStr for EngineKind {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownEngine(s.to_owned()))
    }
}

/// Bytes an engine moved across its (modelled) bus, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
    pub fn total(&self) -> u64 {
        self.descriptors + self.context + self.data_in + self.data_out
    }

    pub fn add(&mut self, other: &BusBytes) {
        self.descriptors += other.descriptors;
        self.context += other.context;
        self.data_in += other.data_in;
        self.data_out += other.data_out;
    }
}

/// What an engine has done so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct EngineCounters {
    pub submitted: u64,
    pub completed: u64,
    /// Submissions refused because the ring was full.
    pub ring_full: u64,
    /// Descriptors that completed with an error status.
    pub errors: u64,
    /// Descriptors executed per channel.
    pub per_channel: Vec<u64>,
    /// Busy time per execution unit, nanoseconds, by name.
    pub eu_busy_ns: Vec<(String, u64)>,
    /// Deepest the fetch FIFO got, over all channels.
    pub fifo_high_water: usize,
    pub bus: BusBytes,
    /// Bounce buffers allocated (per-request buffer policy).
    pub bounce_buffers: u64,
    /// Completion signals raised (interrupt-style wake-ups).
    pub interrupts: u64,
}

/// Executes jobs.
///
/// `submit` may complete the job at once (inline engines) or queue it; a
/// full engine hands the job back so the caller can wait or drop it under a
/// named reason. `poll` moves finished jobs out. `wait` blocks until a
/// completion may be ready (an interrupt-style wake-up) or the timeout.
pub trait Engine: Send {
    fn kind(&self) -> EngineKind;

    fn submit(&mut self, job: Job) -> Result<(), Job>;

    /// Appends finished jobs to `out`; returns how many.
    fn poll(&mut self, out: &mut Vec<Job>) -> usize;

    fn wait(&mut self, timeout: Duration);

    /// Jobs submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;

    fn counters(&self) -> EngineCounters;

    /// After a timeout: gives back jobs whose completions the engine lost
    /// (a channel reset, in hardware terms), so no buffer is leaked.
    fn reclaim(&mut self, _out: &mut Vec<Job>) -> usize {
        0
    }
}

/// Inline software: each job runs in the caller's thread during `submit`.
#[derive(Debug, Default)]
pub struct SoftEngine {
    buffers: BufferPolicy,
    done: VecDeque<Job>,
    counters: EngineCounters,
}

impl SoftEngine {
    pub fn new(buffers: BufferPolicy) -> Self {
        SoftEngine {
            buffers,
            done: VecDeque::with_capacity(256),
            counters: EngineCounters {
                per_channel: vec![0],
                ..EngineCounters::default()
            },
        }
    }
}

impl Engine for SoftEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Soft
    }

    fn submit(&mut self, mut job: Job) -> Result<(), Job> {
        match self.buffers {
            BufferPolicy::Registered => job.run_inline(),
            BufferPolicy::PerRequest => {
                // Allocate a bounce buffer, copy in, process, copy out, free.
                let mut bounce = job.region_bytes().to_vec();
                let session = std::sync::Arc::clone(&job.session);
                crate::soft::process(&session, &mut job.desc, &mut bounce);
                job.region_bytes().copy_from_slice(&bounce);
                self.counters.bounce_buffers += 1;
            }
        }
        self.counters.submitted += 1;
        if let Some(c) = self.counters.per_channel.first_mut() {
            *c += 1;
        }
        if matches!(job.desc.status, crate::Status::Error(_)) {
            self.counters.errors += 1;
        }
        self.done.push_back(job);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Job>) -> usize {
        let n = self.done.len();
        self.counters.completed += n as u64;
        out.extend(self.done.drain(..));
        n
    }

    fn wait(&mut self, _timeout: Duration) {}

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn counters(&self) -> EngineCounters {
        self.counters.clone()
    }
}

/// Everything needed to build an engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineSpec {
    pub kind: EngineKind,
    pub buffers: BufferPolicy,
    /// Settings of the `sec` engine model (its buffer policy is `buffers`).
    pub sec: crate::sec::SecConfig,
    /// How the `afalg` engine talks to the kernel.
    #[cfg(target_os = "linux")]
    pub afalg_io: crate::afalg::AfalgIo,
}

/// Why an engine could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The kernel crypto API is not reachable from here.
    #[error("the afalg engine is unavailable: {0}")]
    AfalgUnavailable(String),
}

/// Builds the engine `spec` describes.
pub fn build_engine(spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
    Ok(match spec.kind {
        EngineKind::Soft => Box::new(SoftEngine::new(spec.buffers)),
        EngineKind::Sec => Box::new(crate::sec::SecEngine::new(crate::sec::SecConfig {
            buffers: spec.buffers,
            ..spec.sec.clone()
        })),
        #[cfg(target_os = "linux")]
        EngineKind::Afalg => Box::new(
            crate::afalg::AfalgEngine::new(spec.buffers, spec.afalg_io)
                .map_err(|e| EngineError::AfalgUnavailable(e.to_string()))?,
        ),
        #[cfg(not(target_os = "linux"))]
        EngineKind::Afalg => {
            return Err(EngineError::AfalgUnavailable(
                "AF_ALG exists only on Linux".into(),
            ));
        }
    })
}
