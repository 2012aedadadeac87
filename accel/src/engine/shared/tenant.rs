//! The tenant's side: an [`Engine`] whose jobs run in the server.
//!
//! `submit_burst` copies each job's region into a free data slot, writes a
//! request entry naming the slot and the server's session handle, publishes
//! the ring head once per burst and rings the server's doorbell only when
//! the server said it might sleep; `poll_burst` reads completions, copies
//! results back into the jobs' own buffers and hands the jobs back. Neither
//! blocks; [`Engine::wait`] sleeps on the tenant's doorbell. The socket
//! transport does the same with one message per burst. Registration is a
//! blocking round trip on the control socket, off the fast path: the keys
//! cross once and stay in the server.
//!
//! A server that stops serving while still connected (stopped, or its
//! thread stuck) is timed out on the caller's clock, the `now` given to
//! `submit_burst`, `poll_burst` and `reclaim`, and nothing on that path
//! reads a clock (it is the sans-IO core's fast path). The caller's clock
//! may jump (an offline capture's timestamps across a gap) while the
//! server has had no real time to answer, so a job past its deadline on
//! that clock is only suspect; the timeout is confirmed by real time the
//! driver has let pass in [`Engine::wait`], the driver's blocking call,
//! which reads the wall clock and records what it saw. A job older than
//! [`SharedSpec::deadline`] on the caller's clock, and still unanswered
//! once the driver has waited a quarter of the deadline since it was
//! first found overdue, comes back with `Timeout`. A caller whose clock
//! stands still (tests, `Duration::ZERO`) sees no timeout at all, nor does
//! a driver that never waits (it is never idle, or it replays a capture
//! without waiting between frames): its jobs are given up by the gateway's
//! own timeout, and by this engine at its next wait. After a timeout the
//! engine is unavailable, refusing new jobs at once with `Unavailable` so
//! that a gateway drops and counts them instead of stalling, until the
//! server answers again. The slot of a timed-out job is not reused until
//! the server's late completion for it arrives: the server may still
//! write into it.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use zeroize::{Zeroize, Zeroizing};

use super::rings::Rings;
use super::sys::{self, EventFd, Mapping, Received};
use super::wire::{
    self, layout, op, BurstIter, CompletionEntry, Reply, RequestEntry, StatsReply, Transport, COMPLETION_LEN,
    MAX_MESSAGE, REQUEST_LEN,
};
use super::SharedSpec;
use crate::descriptor::{DescriptorError, Status};
use crate::engine::{Engine, EngineCounters, EngineKind, NextCompletion, RegisterError};
use crate::job::Job;
use crate::session::{SessionHandle, SessionSpec};

/// How long a control round trip (attach, register, release) may take.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a tenant could not attach.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The control socket could not be connected to (or set up).
    #[error("cannot reach the engine server at {path}: {source} (is `espgw engine serve --socket {path}` running?)")]
    Connect {
        /// The socket's path.
        path: String,
        /// What the system said.
        source: io::Error,
    },
    /// The server answered with a refusal, whose reason this is.
    #[error("the engine server refused to attach: {0}")]
    Refused(String),
    /// The server's answer was not the protocol's, or the exchange failed.
    #[error("the engine server's answer was not understood: {0}")]
    Protocol(String),
    /// The region (or its doorbells) could not be mapped or taken.
    #[error("cannot map the shared region: {0}")]
    Map(io::Error),
    /// The server's region could be resized under this tenant (a third
    /// party holding the descriptor could shrink it, and the next access
    /// would fault): refused before it is mapped.
    #[error(
        "the engine server's shared region is not sealed against resizing (seals {seals:#x}, \
         need {:#x}); refusing to map it",
        super::sys::REGION_SEALS
    )]
    Unsealed {
        /// The seals the region carries (`F_GET_SEALS`).
        seals: i32,
    },
}

struct ShmTenant {
    rings: Rings,
    to_server: EventFd,
    to_tenant: EventFd,
    req_head: u32,
    comp_tail: u32,
}

/// The tenant's data slots and the jobs in them, one per ring entry; a
/// slot's index is its request's cookie.
struct Slots {
    jobs: Vec<Option<Job>>,
    /// When each slot's job was submitted (the caller's `now`), and its
    /// place in submission order.
    since: Vec<Duration>,
    /// Whether a job is overdue on the caller's clock, and since when the
    /// driver has seen real time pass while one is.
    suspect: Suspicion,
    /// The latest wall-clock instant the driver reported (the end of its
    /// last [`Engine::wait`]); `None` before its first wait.
    observed: Option<Instant>,
    seq: Vec<u64>,
    next_seq: u64,
    /// Slots whose jobs were given back on timeout, their completions
    /// still due from the server.
    late: Vec<bool>,
    late_count: usize,
    free: Vec<u32>,
    deadline: Duration,
    /// No job in a slot expires before this (`Duration::MAX`: none can).
    next_expiry: Duration,
    /// Scratch for the slots expiring in one look, sized once.
    expiring: Vec<u32>,
}

/// How far a timeout has got towards confirmation: overdue on the
/// caller's clock, then waited out on the driver's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suspicion {
    /// No job is overdue on the caller's clock.
    Clear,
    /// One is, and the driver has not waited since.
    Raised,
    /// One has been overdue since at least this instant, the start of the
    /// driver's first wait after it was found overdue.
    Since(Instant),
}

/// What a completion from the server names.
enum Answered {
    /// A job waiting in its slot.
    Job(Job),
    /// A slot whose job already timed out: the slot is free again.
    Late,
    /// Nothing of ours (a duplicate or a cookie never given).
    Unknown,
}

impl Slots {
    fn new(entries: u32, deadline: Duration) -> Slots {
        let n = entries as usize;
        Slots {
            jobs: (0..n).map(|_| None).collect(),
            since: vec![Duration::ZERO; n],
            suspect: Suspicion::Clear,
            observed: None,
            seq: vec![0; n],
            next_seq: 0,
            late: vec![false; n],
            late_count: 0,
            free: (0..entries).rev().collect(),
            deadline,
            next_expiry: Duration::MAX,
            expiring: Vec::with_capacity(n),
        }
    }

    /// Puts `job` in `slot`, already taken from `free`.
    fn occupy(&mut self, slot: u32, job: Job, now: Duration) {
        let i = slot as usize;
        self.jobs[i] = Some(job);
        self.since[i] = now;
        self.seq[i] = self.next_seq;
        self.next_seq += 1;
        self.next_expiry = self.next_expiry.min(now.saturating_add(self.deadline));
    }

    /// The server completed the request with cookie `slot`.
    fn answered(&mut self, slot: u32) -> Answered {
        let i = slot as usize;
        if let Some(job) = self.jobs.get_mut(i).and_then(Option::take) {
            self.free.push(slot);
            return Answered::Job(job);
        }
        if self.late.get(i).copied().unwrap_or(false) {
            self.late[i] = false;
            self.late_count -= 1;
            self.free.push(slot);
            return Answered::Late;
        }
        Answered::Unknown
    }

    /// As [`answered`](Self::answered), for the job alone: any answer for
    /// a slot of ours, late or not, shows the server serving again.
    fn answered_job(&mut self, slot: u32, unavailable: &mut bool) -> Option<Job> {
        match self.answered(slot) {
            Answered::Job(job) => {
                *unavailable = false;
                Some(job)
            }
            Answered::Late => {
                *unavailable = false;
                None
            }
            Answered::Unknown => None,
        }
    }

    /// Gives back, in submission order and with `Timeout`, every job held
    /// `deadline` or longer by `now`, once the driver's waits confirm it
    /// (see [`confirmed`](Self::confirmed)); their slots stay late. Reads
    /// no clock: `now` and what the driver reported are its only time.
    fn expire(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        if now < self.next_expiry {
            return 0;
        }
        let mut next = Duration::MAX;
        self.expiring.clear();
        for (i, job) in self.jobs.iter().enumerate() {
            if job.is_none() {
                continue;
            }
            let due = self.since[i].saturating_add(self.deadline);
            if now >= due {
                self.expiring.push(i as u32);
            } else {
                next = next.min(due);
            }
        }
        if self.expiring.is_empty() {
            self.suspect = Suspicion::Clear;
            self.next_expiry = next;
            return 0;
        }
        if !self.confirmed() {
            if self.suspect == Suspicion::Clear {
                self.suspect = Suspicion::Raised;
            }
            // `next_expiry` stays passed: look again at every poll, only
            // while a job is overdue, so that answers clear the suspicion.
            self.expiring.clear();
            return 0;
        }
        self.suspect = Suspicion::Clear;
        self.next_expiry = next;
        let seq = &self.seq;
        self.expiring.sort_unstable_by_key(|&i| seq[i as usize]);
        for &i in &self.expiring {
            if let Some(mut job) = self.jobs[i as usize].take() {
                job.desc.status = Status::Error(DescriptorError::Timeout);
                self.late[i as usize] = true;
                self.late_count += 1;
                out.push(job);
            }
        }
        self.expiring.len()
    }

    /// Whether the driver has waited, since a job was first found overdue,
    /// for the grace: a quarter of the deadline of real time.
    fn confirmed(&self) -> bool {
        match (self.suspect, self.observed) {
            (Suspicion::Since(from), Some(seen)) => seen.saturating_duration_since(from) >= self.deadline / 4,
            _ => false,
        }
    }

    /// The driver reports the wall clock (from [`Engine::wait`]): the first
    /// report after a job was found overdue starts the grace.
    fn observe(&mut self, wall: Instant) {
        if self.suspect == Suspicion::Raised {
            self.suspect = Suspicion::Since(wall);
        }
        self.observed = Some(wall);
    }

    /// The server is gone: every job comes back with `Fault` and every
    /// slot is free (no late completion can come now).
    fn reclaim_all(&mut self, out: &mut Vec<Job>) -> usize {
        let mut n = 0;
        for (slot, entry) in self.jobs.iter_mut().enumerate() {
            if let Some(mut job) = entry.take() {
                job.desc.status = Status::Error(DescriptorError::Fault);
                self.free.push(slot as u32);
                out.push(job);
                n += 1;
            }
        }
        for (slot, late) in self.late.iter_mut().enumerate() {
            if std::mem::take(late) {
                self.free.push(slot as u32);
            }
        }
        self.late_count = 0;
        self.next_expiry = Duration::MAX;
        self.suspect = Suspicion::Clear;
        n
    }

    /// Jobs in slots (late slots hold none).
    fn in_use(&self) -> usize {
        self.jobs.len() - self.free.len() - self.late_count
    }
}

/// An engine served by `espgw engine serve`; see the module documentation.
pub struct SharedEngine {
    sock: OwnedFd,
    transport: Transport,
    tenant: u32,
    shm: Option<ShmTenant>,
    entries: u32,
    slot_size: u32,
    slots: Slots,
    /// Jobs finished without the server (refused here, or the server gone).
    done: Vec<Job>,
    tx: Vec<u8>,
    rx: Vec<u8>,
    fds: Vec<OwnedFd>,
    counters: EngineCounters,
    server_gone: bool,
    /// Jobs timed out and the server has not answered since.
    unavailable: bool,
}

// SAFETY: the mapping and descriptors are owned by this value alone; the
// engine moves between threads as a whole, never shared.
unsafe impl Send for SharedEngine {}

impl std::fmt::Debug for SharedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEngine")
            .field("tenant", &self.tenant)
            .field("transport", &self.transport)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl SharedEngine {
    /// Connects to the server at `spec.socket` and attaches.
    pub fn attach(spec: &SharedSpec) -> Result<SharedEngine, AttachError> {
        let path = spec.socket.display().to_string();
        let sock = sys::connect(&spec.socket).map_err(|source| AttachError::Connect {
            path: path.clone(),
            source,
        })?;
        // Control round trips are off the fast path but must not hang a
        // gateway on a hung server.
        sys::set_timeouts(&sock, CONTROL_TIMEOUT).map_err(|source| AttachError::Connect {
            path: path.clone(),
            source,
        })?;
        let entries = spec.entries.next_power_of_two();
        let mut tx = Vec::with_capacity(MAX_MESSAGE);
        wire::attach(&mut tx, spec.transport, entries, spec.slot_size);
        let protocol = |e: io::Error| AttachError::Protocol(e.to_string());
        sys::send(sock.as_raw_fd(), &tx, &[], false).map_err(protocol)?;
        let mut rx = vec![0u8; MAX_MESSAGE];
        let mut fds = Vec::new();
        let n = match sys::recv(sock.as_raw_fd(), &mut rx, &mut fds, false).map_err(protocol)? {
            Received::Message(n) => n,
            _ => return Err(AttachError::Protocol("the server closed the connection".into())),
        };
        let (tenant, entries, slot_size, region_len) = match Reply::parse(&rx[..n]) {
            Ok(Reply::Attached {
                transport,
                tenant,
                entries,
                slot_size,
                region_len,
            }) if transport == spec.transport => (tenant, entries, slot_size, region_len),
            Ok(Reply::Refused { reason, .. }) => return Err(AttachError::Refused(reason.to_owned())),
            Ok(other) => return Err(AttachError::Protocol(format!("unexpected reply {other:?}"))),
            Err(e) => return Err(AttachError::Protocol(e.to_string())),
        };
        let shm = match spec.transport {
            Transport::Shm => {
                if fds.len() != 3 {
                    return Err(AttachError::Protocol(format!(
                        "expected 3 descriptors, got {}",
                        fds.len()
                    )));
                }
                let mut it = fds.drain(..);
                let (Some(memfd), Some(to_server), Some(to_tenant)) = (it.next(), it.next(), it.next())
                else {
                    return Err(AttachError::Protocol("descriptors missing".into()));
                };
                drop(it);
                // The server created the region: it is mapped only if it
                // can neither shrink nor grow while mapped.
                let seals = sys::seals(&memfd).map_err(AttachError::Map)?;
                if seals & sys::REGION_SEALS != sys::REGION_SEALS {
                    return Err(AttachError::Unsealed { seals });
                }
                let map = Mapping::map(&memfd, region_len as usize).map_err(AttachError::Map)?;
                let rings = Rings::new(map, entries, slot_size)
                    .ok_or_else(|| AttachError::Protocol("the region does not fit its rings".into()))?;
                Some(ShmTenant {
                    rings,
                    to_server: EventFd::from_fd(to_server).map_err(AttachError::Map)?,
                    to_tenant: EventFd::from_fd(to_tenant).map_err(AttachError::Map)?,
                    req_head: 0,
                    comp_tail: 0,
                })
            }
            Transport::Socket => None,
        };
        Ok(SharedEngine {
            sock,
            transport: spec.transport,
            tenant,
            shm,
            entries,
            slot_size,
            slots: Slots::new(entries, spec.deadline),
            done: Vec::with_capacity(entries as usize),
            tx,
            rx,
            fds,
            counters: EngineCounters {
                per_channel: vec![0],
                ..EngineCounters::default()
            },
            server_gone: false,
            unavailable: false,
        })
    }

    /// The ID the server gave this tenant.
    pub fn tenant_id(&self) -> u32 {
        self.tenant
    }

    /// How this tenant's descriptors and data travel.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Whether the server has gone away (its socket closed).
    pub fn server_gone(&self) -> bool {
        self.server_gone
    }

    /// Whether the engine refuses jobs at once: its server is gone, or it
    /// timed jobs out and the server has not answered since.
    pub fn unavailable(&self) -> bool {
        self.unavailable || self.server_gone
    }

    /// Asks the server for its counters (a blocking round trip).
    pub fn server_stats(&mut self) -> io::Result<StatsReply> {
        self.tx.clear();
        self.tx.push(op::STATS);
        match self.call()? {
            Reply::Stats(s) => Ok(s),
            other => Err(io::Error::other(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sends `self.tx` and waits for the reply, handling completions that
    /// arrive meanwhile (socket transport).
    fn call(&mut self) -> io::Result<Reply<'_>> {
        sys::send(self.sock.as_raw_fd(), &self.tx, &[], false)?;
        loop {
            let n = match sys::recv(self.sock.as_raw_fd(), &mut self.rx, &mut self.fds, false)? {
                Received::Message(n) => n,
                Received::Empty => continue,
                Received::Closed => {
                    self.server_gone = true;
                    return Err(io::Error::from(io::ErrorKind::ConnectionAborted));
                }
            };
            self.fds.clear();
            if self.rx[0] == op::COMPLETIONS {
                self.completions(n);
                continue;
            }
            return Reply::parse(&self.rx[..n]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
        }
    }

    /// Test hook for the server's checks: writes `entry` to the request
    /// ring as it stands, bypassing every check this side makes (shm only).
    /// The returned cookie comes back with the refusal.
    #[doc(hidden)]
    pub fn submit_raw(&mut self, mut entry: RequestEntry, job: Job) -> Option<u32> {
        let shm = self.shm.as_mut()?;
        let slot = self.slots.free.pop()?;
        entry.user = slot;
        let mut raw = [0u8; REQUEST_LEN];
        entry.encode(&mut raw);
        shm.rings.write_request(shm.req_head, &raw);
        shm.req_head = shm.req_head.wrapping_add(1);
        if shm
            .rings
            .store_then_flag(layout::REQ_HEAD, shm.req_head, layout::SERVER_SLEEPING)
        {
            shm.to_server.ring();
        }
        self.slots.occupy(slot, job, Duration::ZERO);
        self.counters.submitted += 1;
        Some(slot)
    }

    /// Completes a job here, never sent (counted as submitted by the caller).
    fn refuse_here(&mut self, mut job: Job, error: DescriptorError) {
        job.desc.status = Status::Error(error);
        self.counters.errors += 1;
        self.done.push(job);
    }

    /// Unavailable: takes jobs (as many as `done` has room for) and
    /// completes them at once with `Unavailable`.
    fn refuse_unavailable(&mut self, jobs: &mut VecDeque<Job>) -> usize {
        let room = (self.entries as usize).saturating_sub(self.done.len());
        let n = jobs.len().min(room);
        for _ in 0..n {
            if let Some(job) = jobs.pop_front() {
                self.refuse_here(job, DescriptorError::Unavailable);
            }
        }
        self.counters.refused_unavailable += n as u64;
        n
    }

    fn submit_shm(&mut self, now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        let Some(shm) = self.shm.as_mut() else { return 0 };
        let tail = shm.rings.load(layout::REQ_TAIL);
        let mut taken = 0;
        let mut raw = [0u8; REQUEST_LEN];
        while !jobs.is_empty() {
            if shm.req_head.wrapping_sub(tail) >= self.entries {
                break;
            }
            let Some(&slot) = self.slots.free.last() else {
                break;
            };
            let Some(mut job) = jobs.pop_front() else { break };
            taken += 1;
            let len = job.region_bytes().len();
            if len > self.slot_size as usize || job.is_bounced() {
                job.desc.status = Status::Error(DescriptorError::BadRegions);
                self.counters.errors += 1;
                self.done.push(job);
                continue;
            }
            self.slots.free.pop();
            let offset = slot * self.slot_size;
            shm.rings.write_data(offset, job.region_bytes());
            RequestEntry {
                user: slot,
                session: job.session,
                desc: job.desc,
                data_offset: offset,
                data_len: len as u32,
            }
            .encode(&mut raw);
            shm.rings.write_request(shm.req_head, &raw);
            shm.req_head = shm.req_head.wrapping_add(1);
            self.slots.occupy(slot, job, now);
        }
        if taken > 0 {
            self.counters.doorbells += 1;
            if shm
                .rings
                .store_then_flag(layout::REQ_HEAD, shm.req_head, layout::SERVER_SLEEPING)
            {
                shm.to_server.ring();
            }
        }
        taken
    }

    fn submit_socket(&mut self, now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        wire::start_burst(&mut self.tx, op::SUBMIT);
        let mut count: u16 = 0;
        let mut refused = 0;
        // Peek at the jobs and take them only once the message is sent,
        // so that a full socket leaves them queued in order.
        let mut n = 0;
        for job in jobs.iter_mut() {
            if count as usize >= self.slots.free.len() {
                break;
            }
            let len = job.region_bytes().len();
            if len > self.slot_size as usize || job.is_bounced() {
                if count == 0 {
                    refused += 1;
                    n += 1;
                    continue;
                }
                break;
            }
            if self.tx.len() + REQUEST_LEN + len > MAX_MESSAGE {
                break;
            }
            let slot = self.slots.free[self.slots.free.len() - 1 - count as usize];
            let at = self.tx.len();
            self.tx.resize(at + REQUEST_LEN, 0);
            RequestEntry {
                user: slot,
                session: job.session,
                desc: job.desc,
                data_offset: 0,
                data_len: len as u32,
            }
            .encode(&mut self.tx[at..]);
            self.tx.extend_from_slice(job.region_bytes());
            count += 1;
            n += 1;
        }
        // Oversized jobs at the front are refused here, never sent.
        for _ in 0..refused {
            if let Some(job) = jobs.pop_front() {
                self.refuse_here(job, DescriptorError::BadRegions);
            }
        }
        if count == 0 {
            return refused;
        }
        wire::set_count(&mut self.tx, count);
        match sys::send(self.sock.as_raw_fd(), &self.tx, &[], true) {
            Ok(true) => {}
            Ok(false) => return refused,
            Err(_) => {
                self.server_gone = true;
                return refused;
            }
        }
        self.counters.doorbells += 1;
        for _ in refused..n {
            let (Some(slot), Some(job)) = (self.slots.free.pop(), jobs.pop_front()) else {
                break;
            };
            self.slots.occupy(slot, job, now);
        }
        n
    }

    /// Takes the completions of a Completions message of `n` bytes in `rx`.
    fn completions(&mut self, n: usize) {
        let Ok(Reply::Completions { count, body }) = Reply::parse(&self.rx[..n]) else {
            return;
        };
        for item in BurstIter::completions(count, body) {
            let Ok((entry, data)) = item else { break };
            let Some(mut job) = self.slots.answered_job(entry.user, &mut self.unavailable) else {
                continue;
            };
            finish(&mut job, entry, |dst| {
                let len = dst.len().min(data.len());
                dst[..len].copy_from_slice(&data[..len]);
            });
            if matches!(job.desc.status, Status::Error(_)) {
                self.counters.errors += 1;
            }
            self.done.push(job);
        }
    }

    fn poll_shm(&mut self, out: &mut Vec<Job>) -> usize {
        let Some(shm) = self.shm.as_mut() else { return 0 };
        let head = shm.rings.load(layout::COMP_HEAD);
        let mut n = 0;
        let mut raw = [0u8; COMPLETION_LEN];
        while shm.comp_tail != head {
            shm.rings.read_completion(shm.comp_tail, &mut raw);
            shm.comp_tail = shm.comp_tail.wrapping_add(1);
            let Ok(entry) = CompletionEntry::decode(&raw) else {
                continue;
            };
            let Some(mut job) = self.slots.answered_job(entry.user, &mut self.unavailable) else {
                continue;
            };
            let offset = entry.user * self.slot_size;
            let rings = &shm.rings;
            finish(&mut job, entry, |dst| rings.read_data(offset, dst));
            if matches!(job.desc.status, Status::Error(_)) {
                self.counters.errors += 1;
            }
            out.push(job);
            n += 1;
        }
        shm.rings.store(layout::COMP_TAIL, shm.comp_tail);
        n
    }

    /// Moves every completion that has arrived into `out`, in the order
    /// the server posted them (socket: through `done`, with any jobs
    /// refused here before them).
    fn collect(&mut self, out: &mut Vec<Job>) -> usize {
        let mut n = 0;
        if self.transport == Transport::Socket {
            // Every message waiting, without blocking.
            loop {
                match sys::recv(self.sock.as_raw_fd(), &mut self.rx, &mut self.fds, true) {
                    Ok(Received::Message(len)) => {
                        self.fds.clear();
                        match self.rx[0] {
                            op::COMPLETIONS => self.completions(len),
                            // Unasked, a refusal is the server letting us go.
                            op::REFUSED => self.server_gone = true,
                            _ => {}
                        }
                    }
                    Ok(Received::Empty) => break,
                    Ok(Received::Closed) | Err(_) => {
                        self.server_gone = true;
                        break;
                    }
                }
            }
            n += self.done.len();
            out.append(&mut self.done);
        } else {
            n += self.poll_shm(out);
        }
        n
    }

    /// Jobs past their deadline back with `Timeout`; the engine is then
    /// unavailable until the server answers.
    fn expire(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        let n = self.slots.expire(now, out);
        if n > 0 {
            self.unavailable = true;
            self.counters.timed_out += n as u64;
            self.counters.errors += n as u64;
        }
        n
    }

    fn completions_waiting(&self) -> bool {
        match &self.shm {
            Some(shm) => shm.rings.load(layout::COMP_HEAD) != shm.comp_tail,
            None => false,
        }
    }
}

/// Sets a job's status from its completion and copies the result back
/// (only for statuses that carry data, and at most the job's own length).
fn finish(job: &mut Job, entry: CompletionEntry, copy: impl FnOnce(&mut [u8])) {
    job.desc.status = match entry.status {
        Status::Pending => Status::Error(DescriptorError::Fault),
        s => s,
    };
    if entry.data_len > 0 && matches!(job.desc.status, Status::Done | Status::AuthFailed) {
        let dst = job.region_bytes();
        let len = dst.len().min(entry.data_len as usize);
        copy(&mut dst[..len]);
    }
}

impl Engine for SharedEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Shared
    }

    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, RegisterError> {
        let mut msg = Zeroizing::new(Vec::with_capacity(8 + spec.enc_key.len() + spec.auth_key.len()));
        wire::register(&mut msg, spec.algorithm, spec.esn, &spec.enc_key, &spec.auth_key);
        let saved = std::mem::replace(&mut self.tx, std::mem::take(&mut *msg));
        let reply = self.call().map_err(|e| e.to_string());
        let reply = match reply {
            Ok(Reply::Registered(handle)) => Ok(handle),
            Ok(Reply::Refused { code, reason }) if code == super::server::refusal::FULL => {
                Err(RegisterError::Refused {
                    engine: EngineKind::Shared,
                    reason: reason.to_owned(),
                })
            }
            Ok(Reply::Refused { reason, .. }) => Err(RegisterError::Refused {
                engine: EngineKind::Shared,
                reason: reason.to_owned(),
            }),
            Ok(other) => Err(RegisterError::Refused {
                engine: EngineKind::Shared,
                reason: format!("unexpected reply {other:?}"),
            }),
            Err(e) => Err(RegisterError::Refused {
                engine: EngineKind::Shared,
                reason: format!("the engine server is unreachable: {e}"),
            }),
        };
        // The message held the keys: wipe it before the buffer is reused.
        let mut sent = std::mem::replace(&mut self.tx, saved);
        sent.zeroize();
        reply
    }

    /// A round trip, off the fast path like `register`: once it returns, a
    /// job naming the handle is refused, while jobs of the session already
    /// submitted still run (the server wipes the keys once they are with
    /// the engine). A refusal (not ours, already released) or a dead server
    /// leaves nothing to undo here.
    fn release(&mut self, handle: SessionHandle) {
        self.tx.clear();
        let mark = self.shm.as_ref().map_or(0, |shm| shm.req_head);
        wire::release(&mut self.tx, handle, mark);
        let _ = self.call();
    }

    fn submit_burst(&mut self, now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        let n = if self.unavailable() {
            self.refuse_unavailable(jobs)
        } else {
            match self.transport {
                Transport::Shm => self.submit_shm(now, jobs),
                Transport::Socket => self.submit_socket(now, jobs),
            }
        };
        self.counters.submitted += n as u64;
        self.counters.per_channel[0] += n as u64;
        n
    }

    fn poll_burst(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        let mut n = self.collect(out);
        n += self.expire(now, out);
        n += self.done.len();
        out.append(&mut self.done);
        self.counters.completed += n as u64;
        n
    }

    fn next_completion(&self) -> NextCompletion {
        if !self.done.is_empty() || self.completions_waiting() {
            NextCompletion::Ready
        } else if self.in_flight() > 0 {
            NextCompletion::External
        } else {
            NextCompletion::Idle
        }
    }

    fn in_flight(&self) -> usize {
        self.slots.in_use() + self.done.len()
    }

    fn counters(&self) -> EngineCounters {
        let mut c = self.counters.clone();
        c.unavailable = self.unavailable();
        c
    }

    /// The server is gone: every job it held comes back as a fault.
    /// Otherwise the completions that have arrived come back, then the
    /// jobs past their deadline with `Timeout`.
    fn reclaim(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        if !self.server_gone {
            // What has arrived first (in order), so that only jobs the
            // server has not answered time out.
            let n = self.collect(out) + self.expire(now, out);
            self.counters.completed += n as u64;
            return n;
        }
        let n = self.slots.reclaim_all(out);
        self.counters.errors += n as u64;
        n
    }

    /// Also the only place this engine reads the wall clock: what it sees
    /// at the start and the end confirms timeouts (see the module
    /// documentation).
    fn observe_clock(&mut self, wall: Instant) {
        self.slots.observe(wall);
    }

    fn wait(&mut self, timeout: Duration) {
        let started = Instant::now();
        self.slots.observe(started);
        if !self.done.is_empty() || self.in_flight() == 0 {
            return;
        }
        self.block(started, timeout);
        self.slots.observe(Instant::now());
    }
}

impl SharedEngine {
    /// The blocking part of [`Engine::wait`], from `started` (its clock
    /// reading) for at most `timeout`.
    fn block(&mut self, started: Instant, timeout: Duration) {
        // A short spin first: the server usually answers within
        // microseconds, sooner than a sleep and a wake-up would.
        let spin_until = started + Duration::from_micros(20).min(timeout);
        while Instant::now() < spin_until {
            // The clock costs more than a look at the ring: look often.
            for _ in 0..32 {
                if self.completions_waiting() {
                    return;
                }
                std::hint::spin_loop();
            }
            // A spin that keeps its core from the server (more tenants
            // and a server than cores: VMs sharing a host) stalls the
            // very answer it waits for; yielding hands the core over when
            // someone else is runnable, and costs one system call when
            // not (docs/results.md, "The shared engine", has the figures).
            std::thread::yield_now();
        }
        let mut fds = [sys::pollfd(self.sock.as_raw_fd()), sys::pollfd(-1)];
        if let Some(shm) = &self.shm {
            if shm
                .rings
                .flag_then_load(layout::TENANT_SLEEPING, 1, layout::COMP_HEAD)
                != shm.comp_tail
            {
                shm.rings.store(layout::TENANT_SLEEPING, 0);
                return;
            }
            fds[1] = sys::pollfd(shm.to_tenant.raw());
        }
        let _ = sys::poll(&mut fds, timeout.saturating_sub(Duration::from_micros(20)));
        if self.transport == Transport::Shm && fds[0].revents & (libc::POLLHUP | libc::POLLIN) != 0 {
            // The control socket carries nothing unasked on shm: readable
            // means closed.
            let mut probe = [0u8; 1];
            let mut fds = Vec::new();
            if matches!(
                sys::recv(self.sock.as_raw_fd(), &mut probe, &mut fds, true),
                Ok(Received::Closed) | Err(_)
            ) {
                self.server_gone = true;
            }
        }
        if let Some(shm) = &self.shm {
            shm.rings.store(layout::TENANT_SLEEPING, 0);
            shm.to_tenant.drain();
        }
    }
}

impl Drop for SharedEngine {
    fn drop(&mut self) {
        // Closing the socket is the detach; the server reclaims the rest.
        let _ = sys::send(self.sock.as_raw_fd(), &[op::DETACH], &[], true);
    }
}

/// Asks the server at `path` for its counters without attaching (an
/// operator's query: `espgw engine stats`).
pub fn query_stats(path: &Path) -> Result<StatsReply, AttachError> {
    let connect = |source| AttachError::Connect {
        path: path.display().to_string(),
        source,
    };
    let sock = sys::connect(path).map_err(connect)?;
    sys::set_timeouts(&sock, CONTROL_TIMEOUT).map_err(connect)?;
    let protocol = |e: io::Error| AttachError::Protocol(e.to_string());
    sys::send(sock.as_raw_fd(), &[op::STATS], &[], false).map_err(protocol)?;
    let mut rx = vec![0u8; 256];
    let mut fds = Vec::new();
    match sys::recv(sock.as_raw_fd(), &mut rx, &mut fds, false).map_err(protocol)? {
        Received::Message(n) => match Reply::parse(&rx[..n]) {
            Ok(Reply::Stats(s)) => Ok(s),
            Ok(Reply::Refused { reason, .. }) => Err(AttachError::Refused(reason.to_owned())),
            Ok(other) => Err(AttachError::Protocol(format!("unexpected reply {other:?}"))),
            Err(e) => Err(AttachError::Protocol(e.to_string())),
        },
        _ => Err(AttachError::Protocol("the server closed the connection".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::PacketBuf;
    use crate::descriptor::{Descriptor, Direction};
    use crate::Algorithm;

    const DEADLINE: Duration = Duration::from_millis(400);
    const GRACE: Duration = Duration::from_millis(100);

    fn job(user: u64) -> Job {
        let alg = Algorithm::Aes128Gcm16;
        let desc = Descriptor::esp(Direction::Encrypt, alg, 16, None);
        let buf = PacketBuf::with_len(desc.icv.end());
        Job::new(
            SessionHandle {
                index: 0,
                generation: 0,
            },
            desc,
            buf,
            0,
            user,
        )
    }

    /// Four jobs in slots, submitted at 0, 10, 20 and 30 ms on the caller's
    /// clock.
    fn slots() -> Slots {
        let mut slots = Slots::new(8, DEADLINE);
        for user in 0..4 {
            let slot = slots.free.pop().expect("a free slot");
            slots.occupy(slot, job(user), Duration::from_millis(10 * user));
        }
        slots
    }

    fn users(jobs: &[Job]) -> Vec<u64> {
        jobs.iter().map(|j| j.user).collect()
    }

    /// The poll path reads no clock: however far the caller's clock jumps
    /// and however much real time passes, nothing times out until the
    /// driver has reported, through its waits, a grace of real time since
    /// a job was found overdue. (Were the wall clock read here, the sleep
    /// would confirm the timeout.)
    #[test]
    fn overdue_jobs_wait_for_the_drivers_clock_not_the_wall() {
        let mut slots = slots();
        let mut out = Vec::new();
        assert_eq!(slots.expire(Duration::from_secs(3600), &mut out), 0);
        std::thread::sleep(GRACE * 2);
        assert_eq!(slots.expire(Duration::from_secs(7200), &mut out), 0);
        assert!(out.is_empty());
        assert_eq!(slots.in_use(), 4);
    }

    /// Once the driver's reports span the grace, jobs time out exactly as
    /// the caller's clock says: those whose deadline `now` has reached, in
    /// submission order, and not one nanosecond before.
    #[test]
    fn confirmed_jobs_time_out_exactly_on_the_callers_clock() {
        let mut slots = slots();
        let mut out = Vec::new();
        let t0 = Instant::now();
        // Overdue: the first two (submitted at 0 and 10 ms).
        let now = DEADLINE + Duration::from_millis(10);
        assert_eq!(slots.expire(now, &mut out), 0, "suspect only");
        slots.observe(t0);
        slots.observe(t0 + GRACE - Duration::from_nanos(1));
        assert_eq!(slots.expire(now, &mut out), 0, "the grace is not over");
        slots.observe(t0 + GRACE);
        // Confirmed, but the caller's clock went no further: a nanosecond
        // short of the third job's deadline.
        let now = DEADLINE + Duration::from_millis(20) - Duration::from_nanos(1);
        assert_eq!(slots.expire(now, &mut out), 2);
        assert_eq!(users(&out), [0, 1]);
        assert!(out
            .iter()
            .all(|j| j.desc.status == Status::Error(DescriptorError::Timeout)));
        // The next ones need their own confirmation.
        out.clear();
        let now = DEADLINE + Duration::from_millis(30);
        assert_eq!(slots.expire(now, &mut out), 0);
        slots.observe(t0 + GRACE * 2);
        slots.observe(t0 + GRACE * 3);
        assert_eq!(slots.expire(now, &mut out), 2);
        assert_eq!(users(&out), [2, 3]);
        assert_eq!(slots.in_use(), 0);
    }

    /// The driver waiting does not stand in for the caller's clock: jobs
    /// not yet overdue on it never time out, however long the waits.
    #[test]
    fn waits_alone_time_nothing_out() {
        let mut slots = slots();
        let mut out = Vec::new();
        let t0 = Instant::now();
        for k in 0..10 {
            slots.observe(t0 + DEADLINE * k);
            assert_eq!(slots.expire(DEADLINE - Duration::from_nanos(1), &mut out), 0);
        }
        assert_eq!(slots.in_use(), 4);
    }

    /// An answer that arrives during the grace clears the suspicion: a job
    /// found overdue later gets its own grace, not what is left of an
    /// earlier one's.
    #[test]
    fn an_answer_in_the_grace_clears_the_suspicion() {
        let mut slots = Slots::new(8, DEADLINE);
        let first = slots.free.pop().expect("free");
        slots.occupy(first, job(0), Duration::ZERO);
        let second = slots.free.pop().expect("free");
        slots.occupy(second, job(1), DEADLINE);
        let mut out = Vec::new();
        let t0 = Instant::now();
        assert_eq!(slots.expire(DEADLINE, &mut out), 0);
        slots.observe(t0);
        assert!(matches!(slots.answered(first), Answered::Job(_)));
        assert_eq!(slots.expire(DEADLINE, &mut out), 0);
        slots.observe(t0 + GRACE * 10);
        // The second is overdue now: suspect afresh, not confirmed.
        assert_eq!(slots.expire(DEADLINE * 2, &mut out), 0);
        slots.observe(t0 + GRACE * 11);
        slots.observe(t0 + GRACE * 12);
        assert_eq!(slots.expire(DEADLINE * 2, &mut out), 1);
        assert_eq!(users(&out), [1]);
    }
}
