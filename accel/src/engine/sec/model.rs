//! The SEC 2.x discrete-event model, in modelled time.
//!
//! Each descriptor gets its whole modelled timeline when it is submitted,
//! from the device profile and the submit's `now`:
//! 1. its channel takes it when the channel has finished the one before
//!    (a channel works on one descriptor at a time, in FIFO order), after a
//!    stall if the fault plan injects one;
//! 2. the descriptor and its context (keys, IV, HMAC state) are fetched
//!    over the shared bus;
//! 3. per-descriptor setup (decode, unit reset, key load) occupies the
//!    channel;
//! 4. the walk: the execution units it needs are assigned (a single-pass
//!    descriptor holds the cipher unit and the MDEU together and costs the
//!    slower one's time; a cipher-only or MAC-only descriptor holds one, so
//!    dual-pass reads the data twice), while its data in and out stream
//!    over the bus; the walk lasts as long as the slower of the units and
//!    the bus transfer;
//! 5. the profile's pipelined latency is added; that is its completion
//!    time.
//!
//! The bus and every execution-unit instance are resources with busy
//! intervals: a request takes the earliest gap at or after the time it is
//! ready, so an idle unit is never kept waiting by a booking further in
//! the future. Grants are made in submission order, as a first-come
//! arbiter would under load.
//!
//! `next_completion` says `At(t)` for the next signal, `Ready` while
//! signalled jobs wait, `Idle` with nothing in flight, and `External` when
//! only lost completions (fault injection) remain: nothing will come until
//! the caller's timeout calls `reclaim`.
//!
//! A job becomes visible to `poll_burst` when its completion is signalled:
//! at its completion time when polling, when its interrupt fires
//! otherwise (per completion, or coalesced by count and timeout). Time
//! moves only through the `now` arguments (never backwards: an earlier
//! `now` counts as the latest one seen), so the same calls give the same
//! timeline on any machine.
//!
//! The crypto runs for real, at submit, with the soft engine's primitive,
//! so the bytes are soft's. The host wall time of the device's side (that
//! crypto and the model's own bookkeeping of its timeline) is measured by
//! one helper, [`measure_emulation`], the only clock read here, and is
//! reported as `emulation_ns`, so that a caller can take it out of the
//! host time it measures; it never feeds the timeline. The per-request
//! policy's bounce-buffer copies are not in it: a real driver makes them on
//! the host, so they stay in the host time a caller measures. The host costs a real
//! driver pays and this machine cannot show (doorbell, interrupts,
//! completion cache misses) are charged from the profile's `HostCosts`.
//!
//! This file owns the model's state. It must not block, wait, spawn or
//! read a clock for its timeline; `tests/sec_model.rs` reads this file and
//! checks that it does not.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{bus_bytes, units_for, Completion, EuKind, SecConfig, DESCRIPTOR_BYTES};
use crate::descriptor::{DescriptorError, Status};
use crate::engine::{BusBytes, Engine, EngineCounters, EngineKind, NextCompletion, RegisterError};
use crate::job::{BufferPolicy, Job};
use crate::session::{Session, SessionHandle, SessionSpec, SessionTable};

/// Modelled time in nanoseconds, on the clock of the `now` arguments.
type Ns = u64;

fn to_ns(d: Duration) -> Ns {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs `work` and returns how long it took on this host. The model's only
/// clock read: it measures the emulation (the real crypto standing in for
/// the device), which is reported and never enters the modelled timeline.
fn measure_emulation<T>(work: impl FnOnce() -> T) -> (T, u64) {
    let start = Instant::now();
    let result = work();
    (result, to_ns(start.elapsed()))
}

/// The busy intervals `[start, end)` of one resource, sorted and disjoint.
#[derive(Debug)]
struct Reservations {
    busy: Vec<(Ns, Ns)>,
}

impl Reservations {
    fn with_capacity(n: usize) -> Self {
        Reservations {
            busy: Vec::with_capacity(n),
        }
    }

    /// Forgets intervals that ended by `now`: no request starts before it.
    fn prune(&mut self, now: Ns) {
        let ended = self.busy.partition_point(|&(_, end)| end <= now);
        self.busy.drain(..ended);
    }

    /// The earliest start at or after `from` with the resource free for
    /// `len`.
    fn fit(&self, from: Ns, len: Ns) -> Ns {
        if len == 0 {
            return from;
        }
        let mut at = from;
        let first = self.busy.partition_point(|&(_, end)| end <= at);
        for &(start, end) in &self.busy[first..] {
            if at.saturating_add(len) <= start {
                return at;
            }
            at = at.max(end);
        }
        at
    }

    /// Books `[start, start + len)`, which `fit` found free.
    fn reserve(&mut self, start: Ns, len: Ns) {
        if len == 0 {
            return;
        }
        let end = start.saturating_add(len);
        let at = self.busy.partition_point(|&(s, _)| s < start);
        // Touching neighbours merge, so back-to-back work stays one entry.
        let joins_prev = at > 0 && self.busy[at - 1].1 == start;
        let joins_next = at < self.busy.len() && self.busy[at].0 == end;
        match (joins_prev, joins_next) {
            (true, true) => {
                self.busy[at - 1].1 = self.busy[at].1;
                self.busy.remove(at);
            }
            (true, false) => self.busy[at - 1].1 = end,
            (false, true) => self.busy[at].0 = start,
            (false, false) => self.busy.insert(at, (start, end)),
        }
    }
}

/// A job in the engine, with its modelled completion time.
#[derive(Debug)]
struct InFlight {
    job: Job,
    done: Ns,
    /// Submission number, to order completions of one instant.
    number: u64,
}

#[derive(Debug)]
struct Channel {
    /// Jobs not yet handed back, in submission order; their completion
    /// times never decrease, because the channel works in order.
    queue: VecDeque<InFlight>,
    /// How many jobs at the front of `queue` have been signalled: visible
    /// to `poll_burst`.
    signalled: usize,
    /// When the channel finishes the last descriptor it accepted.
    free_at: Ns,
    executed: u64,
}

impl Channel {
    /// Descriptors that hold a FIFO slot at `now`: every one not yet
    /// complete (the one being worked on included).
    fn occupancy(&self, now: Ns) -> usize {
        self.queue.len() - self.queue.partition_point(|f| f.done <= now)
    }
}

/// The discrete-event model of a SEC 2.x-class engine; see the module
/// documentation.
#[derive(Debug)]
pub struct SecEngine {
    config: SecConfig,
    sessions: SessionTable<Session>,
    channels: Vec<Channel>,
    bus: Reservations,
    /// By `EuKind::index`, one entry per instance.
    units: [Vec<Reservations>; EuKind::ALL.len()],
    /// Jobs whose completion the fault plan loses, with their channel and
    /// the time they would have completed; `reclaim` returns them.
    lost: Vec<(usize, Ns, Job)>,
    /// The latest `now` seen.
    now: Ns,
    /// Descriptors numbered so far (the fault plan's numbering).
    numbered: u64,
    counters: EngineCounters,
    eu_busy: [u64; 5],
}

impl SecEngine {
    /// A model of the part `config` describes, idle at modelled time 0.
    pub fn new(config: SecConfig) -> SecEngine {
        let channels = config.channels.max(1);
        let depth = config.fifo_depth.max(1);
        // Every reservation belongs to a job in flight; booking never
        // allocates once these capacities are reached.
        let slots = channels * depth * 2 + 8;
        let units = EuKind::ALL.map(|kind| {
            let instances = config.profile.unit(kind).instances.max(1) as usize;
            (0..instances)
                .map(|_| Reservations::with_capacity(slots))
                .collect()
        });
        SecEngine {
            sessions: SessionTable::default(),
            channels: (0..channels)
                .map(|_| Channel {
                    queue: VecDeque::with_capacity(depth * 2),
                    signalled: 0,
                    free_at: 0,
                    executed: 0,
                })
                .collect(),
            bus: Reservations::with_capacity(slots * 2),
            units,
            lost: Vec::with_capacity(depth),
            now: 0,
            numbered: 0,
            counters: EngineCounters {
                per_channel: vec![0; channels],
                ..EngineCounters::default()
            },
            eu_busy: [0; 5],
            config,
        }
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &SecConfig {
        &self.config
    }

    /// A session's jobs all go to one channel, so they stay in order.
    fn channel_of(&self, handle: SessionHandle) -> usize {
        handle.index as usize % self.channels.len()
    }

    fn clamp(&mut self, now: Duration) -> Ns {
        self.now = self.now.max(to_ns(now));
        self.now
    }

    fn fifo_occupancy(&self, ch: usize, now: Ns) -> usize {
        let lost = self
            .lost
            .iter()
            .filter(|(c, done, _)| *c == ch && *done > now)
            .count();
        self.channels[ch].occupancy(now) + lost
    }

    /// Runs the job's crypto and books its timeline; `now` is clamped.
    fn accept(&mut self, now: Ns, mut job: Job) {
        self.numbered += 1;
        let number = self.numbered;
        let ch = self.channel_of(job.session);

        // The crypto first: how far the device gets depends on it.
        let algorithm = match self.sessions.get(job.session) {
            None => {
                job.desc.status = Status::Error(DescriptorError::BadSession);
                None
            }
            Some(session) if self.config.faults.fails(number) => {
                job.desc.status = Status::Error(DescriptorError::Fault);
                Some(session.algorithm())
            }
            Some(session) => {
                let mut desc = job.desc;
                crate::primitive::process(session, &mut desc, job.work_bytes());
                job.desc = desc;
                Some(session.algorithm())
            }
        };
        if matches!(job.desc.status, Status::Error(_)) {
            self.counters.errors += 1;
        }
        // A descriptor the device refuses (bad session, bad regions) is
        // fetched and decoded, and goes no further; an injected fault
        // fails after the walk.
        let walks = matches!(
            job.desc.status,
            Status::Done | Status::AuthFailed | Status::Error(DescriptorError::Fault)
        );
        let bus = match algorithm {
            Some(alg) if walks => bus_bytes(alg, &job.desc),
            _ => BusBytes {
                descriptors: DESCRIPTOR_BYTES,
                ..BusBytes::default()
            },
        };
        self.counters.bus.add(&bus);

        let profile = self.config.profile;
        let mut start = now.max(self.channels[ch].free_at);
        if let Some(pause) = self.config.faults.stall_before(number) {
            start = start.saturating_add(to_ns(pause));
        }
        let fetch_len = profile.bus.nanos(bus.descriptors + bus.context);
        let fetch_at = self.bus.fit(start, fetch_len);
        self.bus.reserve(fetch_at, fetch_len);
        self.counters.bus_busy_ns += fetch_len;
        let ready = fetch_at
            .saturating_add(fetch_len)
            .saturating_add(to_ns(profile.setup));

        let walk_end = match algorithm {
            Some(alg) if walks => self.walk(ready, units_for(alg, &job.desc), bus.data_in + bus.data_out),
            _ => ready,
        };
        let done = walk_end.saturating_add(to_ns(profile.latency));

        let channel = &mut self.channels[ch];
        channel.free_at = walk_end;
        channel.executed += 1;
        self.counters.per_channel[ch] += 1;
        self.counters.device_done_ns = self.counters.device_done_ns.max(done);
        self.counters.device_latency_ns += done - now;
        if self.config.faults.loses_completion(number) {
            self.lost.push((ch, done, job));
        } else {
            channel.queue.push_back(InFlight { job, done, number });
        }
        let occupancy = self.fifo_occupancy(ch, now);
        self.counters.fifo_high_water = self.counters.fifo_high_water.max(occupancy);
    }

    /// Books the walk of a descriptor ready at `ready`: its units held
    /// together while `data` bytes stream over the bus. Returns its end.
    fn walk(&mut self, ready: Ns, units: [Option<(EuKind, u64)>; 2], data: u64) -> Ns {
        let profile = self.config.profile;
        let compute = units
            .iter()
            .flatten()
            .map(|&(kind, bytes)| profile.unit(kind).throughput.nanos(bytes))
            .max()
            .unwrap_or(0);
        let transfer = profile.bus.nanos(data);
        let mut at = ready;
        // Find the earliest start at which every unit it needs has an
        // instance free for the whole walk; the walk's length depends on
        // when the bus can take its data, so both are searched together.
        // Each round moves `at` forward past a booking, so this ends.
        loop {
            let bus_at = self.bus.fit(at, transfer);
            let end = at.saturating_add(compute).max(bus_at.saturating_add(transfer));
            let hold = end - at;
            let mut latest = at;
            let mut picks = [None; 2];
            for (pick, &(kind, _)) in picks.iter_mut().zip(units.iter().flatten()) {
                let (start, instance) = self.units[kind.index()]
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.fit(at, hold), i))
                    .min()
                    .unwrap_or((at, 0));
                latest = latest.max(start);
                *pick = Some((kind, instance));
            }
            if latest == at {
                self.bus.reserve(bus_at, transfer);
                self.counters.bus_busy_ns += transfer;
                for (kind, instance) in picks.into_iter().flatten() {
                    self.units[kind.index()][instance].reserve(at, hold);
                    self.eu_busy[kind.index()] += hold;
                }
                return end;
            }
            at = latest;
        }
    }

    /// The earliest unsignalled completion, if any.
    fn first_pending(&self) -> Option<Ns> {
        self.channels
            .iter()
            .filter_map(|c| c.queue.get(c.signalled).map(|f| f.done))
            .min()
    }

    /// Unsignalled completions at or before `t`.
    fn pending_by(&self, t: Ns) -> usize {
        self.channels
            .iter()
            .map(|c| {
                c.queue
                    .partition_point(|f| f.done <= t)
                    .saturating_sub(c.signalled)
            })
            .sum()
    }

    /// When the next signal fires, given what has been submitted so far.
    fn next_signal(&self) -> Option<Ns> {
        let first = self.first_pending()?;
        let Completion::Coalesced { count, timeout } = self.config.completion else {
            return Some(first);
        };
        let count = count.max(1);
        let deadline = first.saturating_add(to_ns(timeout));
        if self.pending_by(deadline) < count {
            return Some(deadline);
        }
        // The count-th completion comes before the timeout: find its time.
        let (mut lo, mut hi) = (first, deadline);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.pending_by(mid) >= count {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    }

    /// Marks every completion due by `t` as signalled; returns how many.
    fn signal_until(&mut self, t: Ns) -> u64 {
        let mut n = 0;
        for c in &mut self.channels {
            let due = c.queue.partition_point(|f| f.done <= t);
            n += due.saturating_sub(c.signalled) as u64;
            c.signalled = c.signalled.max(due);
        }
        n
    }

    /// Fires every signal due by `now`.
    fn advance(&mut self, now: Ns) {
        let host = self.config.profile.host;
        match self.config.completion {
            Completion::Polling => {
                self.signal_until(now);
            }
            Completion::Interrupt => {
                let n = self.signal_until(now);
                self.counters.interrupts += n;
                self.counters.modelled_host.interrupt_ns += n * to_ns(host.interrupt);
            }
            Completion::Coalesced { .. } => {
                while let Some(fire) = self.next_signal().filter(|&t| t <= now) {
                    self.signal_until(fire);
                    self.counters.interrupts += 1;
                    self.counters.modelled_host.interrupt_ns += to_ns(host.interrupt);
                }
            }
        }
    }

    fn update_host_total(&mut self) {
        self.counters.modelled_host_ns = self.counters.modelled_host.total();
    }
}

impl SecEngine {
    /// Takes jobs from the front of `jobs` while their channels have room;
    /// returns how many, and the host time spent on per-request copies.
    fn accept_burst(&mut self, now: Ns, jobs: &mut VecDeque<Job>) -> (usize, u64) {
        self.bus.prune(now);
        for instances in &mut self.units {
            for r in instances.iter_mut() {
                r.prune(now);
            }
        }
        let depth = self.config.fifo_depth.max(1);
        let mut taken = 0;
        let mut host_copies = 0;
        while let Some(front) = jobs.front() {
            let ch = self.channel_of(front.session);
            if self.fifo_occupancy(ch, now) >= depth {
                // Stop at the first job that does not fit, so the caller's
                // queue keeps its order.
                self.counters.ring_full += 1;
                break;
            }
            let Some(mut job) = jobs.pop_front() else { break };
            if self.config.buffers == BufferPolicy::PerRequest && self.sessions.get(job.session).is_some() {
                // The per-request policy's registration: a fresh bounce
                // buffer, copied in now and out when the job is polled, on
                // the host as a driver would.
                host_copies += measure_emulation(|| job.bounce_in()).1;
                self.counters.bounce_buffers += 1;
            }
            self.accept(now, job);
            taken += 1;
        }
        (taken, host_copies)
    }

    /// Moves the signalled jobs to `out`: in completion order across
    /// channels, one channel's (so one session's) in submission order.
    /// Returns how many, and the host time spent on per-request copies.
    fn signalled_burst(&mut self, now: Ns, out: &mut Vec<Job>) -> (usize, u64) {
        self.advance(now);
        let mut n = 0;
        let mut host_copies = 0;
        loop {
            let next = self
                .channels
                .iter()
                .enumerate()
                .filter(|(_, c)| c.signalled > 0)
                .filter_map(|(i, c)| c.queue.front().map(|f| ((f.done, f.number), i)))
                .min();
            let Some((_, ch)) = next else { break };
            let channel = &mut self.channels[ch];
            let Some(mut done) = channel.queue.pop_front() else {
                break;
            };
            channel.signalled -= 1;
            if done.job.is_bounced() {
                // The per-request policy copies the result out of the bounce
                // buffer and frees it here, on the host, as a driver would.
                host_copies += measure_emulation(|| done.job.bounce_out()).1;
            }
            out.push(done.job);
            n += 1;
        }
        (n, host_copies)
    }
}

impl Engine for SecEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sec
    }

    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, RegisterError> {
        super::check_supported(spec.algorithm)?;
        let session = Session::from_spec(spec)?;
        Ok(self.sessions.insert(session))
    }

    fn release(&mut self, handle: SessionHandle) {
        // Dropping the session wipes its key schedules (see `session.rs`).
        // Its jobs in flight already ran their crypto at submit.
        drop(self.sessions.remove(handle));
    }

    fn submit_burst(&mut self, now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        let now = self.clamp(now);
        // The whole burst is the device's side (its crypto, its timeline,
        // its FIFO), emulated on this host and reported apart, one clock
        // pair a burst; only the per-request policy's copies, which a real
        // driver makes on the host, are taken back out of it.
        let ((taken, host_copies), device) = measure_emulation(|| self.accept_burst(now, jobs));
        self.counters.emulation_ns += device.saturating_sub(host_copies);
        if taken > 0 {
            self.counters.submitted += taken as u64;
            self.counters.doorbells += 1;
            self.counters.modelled_host.doorbell_ns += to_ns(self.config.profile.host.doorbell);
            self.update_host_total();
        }
        taken
    }

    fn poll_burst(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        let now = self.clamp(now);
        let ((n, host_copies), device) = measure_emulation(|| self.signalled_burst(now, out));
        self.counters.emulation_ns += device.saturating_sub(host_copies);
        let per_completion = to_ns(self.config.profile.host.per_completion());
        self.counters.completed += n as u64;
        self.counters.modelled_host.completion_ns += n as u64 * per_completion;
        self.update_host_total();
        n
    }

    fn next_completion(&self) -> NextCompletion {
        if self.channels.iter().any(|c| c.signalled > 0) {
            return NextCompletion::Ready;
        }
        match self.next_signal() {
            Some(t) => NextCompletion::At(Duration::from_nanos(t)),
            // Only lost completions remain: nothing will come until the
            // caller's timeout reclaims them.
            None if !self.lost.is_empty() => NextCompletion::External,
            None => NextCompletion::Idle,
        }
    }

    fn in_flight(&self) -> usize {
        self.channels.iter().map(|c| c.queue.len()).sum::<usize>() + self.lost.len()
    }

    fn counters(&self) -> EngineCounters {
        let mut counters = self.counters.clone();
        counters.eu_busy_ns = EuKind::ALL
            .iter()
            .map(|kind| (kind.name().to_owned(), self.eu_busy[kind.index()]))
            .collect();
        counters.modelled_host_ns = counters.modelled_host.total();
        counters
    }

    fn reclaim(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        let now = self.clamp(now);
        let mut n = 0;
        let mut i = 0;
        while i < self.lost.len() {
            if self.lost[i].1 <= now {
                // Order among lost jobs does not matter: each comes back
                // failed, and the dataplane drops it.
                let (_, _, mut job) = self.lost.swap_remove(i);
                job.discard_bounce();
                job.desc.status = Status::Error(DescriptorError::Fault);
                out.push(job);
                n += 1;
            } else {
                i += 1;
            }
        }
        self.counters.completed += n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_backfill_and_merge() {
        let mut r = Reservations::with_capacity(4);
        r.reserve(10, 10);
        assert_eq!(r.fit(0, 5), 0, "a gap before a booking is used");
        assert_eq!(r.fit(0, 11), 20, "too long for the gap");
        assert_eq!(r.fit(12, 1), 20);
        r.reserve(20, 5);
        assert_eq!(r.busy, vec![(10, 25)], "touching bookings merge");
        r.reserve(0, 10);
        assert_eq!(r.busy, vec![(0, 25)]);
        r.reserve(30, 5);
        assert_eq!(r.fit(0, 5), 25);
        assert_eq!(r.fit(0, 6), 35);
        r.prune(25);
        assert_eq!(r.busy, vec![(30, 35)]);
        assert_eq!(r.fit(7, 0), 7, "nothing to book takes no time");
    }
}
