//! The inline software engine: each job runs in the caller's thread while
//! `submit_burst` takes it, and is ready at the next `poll_burst`; or, with
//! `run_inline`, a burst runs in place with no queue at all. Owns the
//! expanded keys of its sessions; must not keep anything per packet.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Engine, EngineCounters, EngineKind, NextCompletion, RegisterError};
use crate::descriptor::{DescriptorError, Direction, Status};
use crate::job::{BufferPolicy, Job};
use crate::session::{Session, SessionHandle, SessionSpec, SessionTable};

/// How many jobs before its turn a job's key schedule is requested: about
/// a memory latency's worth of small-packet crypto.
const PREFETCH_AHEAD: usize = 4;

/// Inline software; see the module documentation.
#[derive(Debug)]
pub struct SoftEngine {
    buffers: BufferPolicy,
    sessions: SessionTable<Session>,
    done: Vec<Job>,
    counters: EngineCounters,
}

impl Default for SoftEngine {
    fn default() -> Self {
        SoftEngine::new(BufferPolicy::Registered)
    }
}

impl SoftEngine {
    /// An engine with no sessions, copying through bounce buffers if `buffers` says so.
    pub fn new(buffers: BufferPolicy) -> Self {
        SoftEngine {
            buffers,
            sessions: SessionTable::default(),
            done: Vec::with_capacity(256),
            counters: EngineCounters {
                per_channel: vec![0],
                ..EngineCounters::default()
            },
        }
    }

    /// Runs `jobs` in order. With many SAs a job's session slot and its
    /// key schedule are each a cache miss, the second behind the first;
    /// so every slot is requested up front, and each job's keys
    /// [`PREFETCH_AHEAD`] jobs before its turn, while earlier jobs compute.
    fn run_all(&mut self, jobs: &mut [Job]) {
        for job in jobs.iter() {
            self.sessions.prefetch(job.session);
        }
        for i in 0..jobs.len() {
            if let Some(next) = jobs.get(i + PREFETCH_AHEAD) {
                if let Some(session) = self.sessions.get(next.session) {
                    session.prefetch_keys(next.desc.direction == Direction::Encrypt);
                }
            }
            self.run(&mut jobs[i]);
        }
    }

    fn run(&mut self, job: &mut Job) {
        match self.sessions.get(job.session) {
            Some(session) => {
                if job.run_with(session, self.buffers) {
                    self.counters.bounce_buffers += 1;
                }
            }
            None => job.desc.status = Status::Error(DescriptorError::BadSession),
        }
        if matches!(job.desc.status, Status::Error(_)) {
            self.counters.errors += 1;
        }
    }
}

impl Engine for SoftEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Soft
    }

    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, RegisterError> {
        let session = Session::from_spec(spec)?;
        Ok(self.sessions.insert(session))
    }

    fn release(&mut self, handle: SessionHandle) {
        // Dropping the session wipes its key schedules (see `session.rs`).
        drop(self.sessions.remove(handle));
    }

    fn submit_burst(&mut self, _now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        let n = jobs.len();
        // Run the whole burst where it lies.
        self.run_all(jobs.make_contiguous());
        if self.done.is_empty() {
            // Take the burst whole rather than job by job: the caller's ring
            // becomes the done list and our empty list its new ring, so no
            // job is copied and no capacity is lost (both conversions are
            // O(1) while the ring starts at its beginning, as the
            // gateway's does after each drained burst).
            let empty = VecDeque::from(std::mem::take(&mut self.done));
            self.done = Vec::from(std::mem::replace(jobs, empty));
        } else {
            self.done.extend(jobs.drain(..));
        }
        self.counters.submitted += n as u64;
        self.counters.per_channel[0] += n as u64;
        n
    }

    fn runs_inline(&self) -> bool {
        true
    }

    fn run_inline(&mut self, jobs: &mut [Job]) -> bool {
        self.run_all(jobs);
        let n = jobs.len() as u64;
        self.counters.submitted += n;
        self.counters.completed += n;
        self.counters.per_channel[0] += n;
        true
    }

    fn poll_burst(&mut self, _now: Duration, out: &mut Vec<Job>) -> usize {
        let n = self.done.len();
        self.counters.completed += n as u64;
        if out.is_empty() {
            std::mem::swap(out, &mut self.done);
        } else {
            out.append(&mut self.done);
        }
        n
    }

    fn next_completion(&self) -> NextCompletion {
        if self.done.is_empty() {
            NextCompletion::Idle
        } else {
            NextCompletion::Ready
        }
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn counters(&self) -> EngineCounters {
        self.counters.clone()
    }
}
