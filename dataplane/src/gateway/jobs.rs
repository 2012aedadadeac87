//! The engine job machine: packets between *prepare* and *finish*.
//!
//! Prepared packets become jobs in a bounded backlog, which is handed to
//! the engine one burst at a time (one doorbell), and completions are
//! collected in bursts. Nothing here waits: a full engine leaves jobs in
//! the backlog for the next poll, a full backlog drops the packet as
//! `engine_busy`, and time comes only from the `now` the driver passes in.
//! The sync style keeps its meaning (one packet's descriptors at a time,
//! the caller waits) by handing the engine one job at a time.
//!
//! Inbound verdicts must not depend on the engine or on what is in flight:
//! jobs of one SA finish in the order they were prepared (engines return
//! one session's jobs in order, and the backlog is FIFO), the replay window
//! is re-checked at finish before the ICV status is looked at, and a packet
//! whose ESN high half could still change with the fate of the packets in
//! flight is held until they are done (RFC 4303 Appendix A), so every
//! packet is judged against the window as one-at-a-time processing would
//! leave it.
//!
//! An authentic packet whose sequence number lies beyond its SA's durable
//! ceiling (static keys, see `spd_sad::SecurityAssociation::resume_above`)
//! waits, decrypted and not yet accepted, until the driver has raised the
//! ceiling, and is then finished again; it counts as in flight meanwhile.
//!
//! Owns the backlog, the in-flight table and the held and waiting
//! packets; must not classify or route (it hands results to `emit`).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use accel::{Algorithm, DescriptorKind, Direction, Job, NextCompletion, SessionHandle, Status, Style};
use spd_sad::SaId;

use super::classify::decrement_ttl;
use super::classify6::decrement_hop_limit;
use super::{Gateway, Next, Verdict};
use crate::buffer::PacketBuf;
use crate::esp::{self, Decapsulated, Inbound, OutboundContext, Pending};
use crate::reassembly::{Reassembled, ReassemblyError};
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::{flow_key_any, ipv4};
use crate::Output;
use crate::{icmp, icmp6};

/// How long a job may stay with the engine before the gateway gives up on
/// it (a stalled channel, a lost completion), and how long a packet may be
/// held for its ESN inference.
pub const JOB_TIMEOUT: Duration = Duration::from_millis(250);

/// Jobs that may wait for room in the engine; beyond this a new packet is
/// dropped at once as `engine_busy`.
pub const BACKLOG_LIMIT: usize = 1024;

/// Inbound packets that may be held for their ESN inference at once;
/// beyond this they are dropped as `engine_busy`.
pub const HOLD_LIMIT: usize = 256;

/// Authentic inbound packets that may wait at once for their SA's durable
/// ceiling to be raised (a burst from a peer that resumed above it, for
/// the time one write takes); beyond this they are dropped as
/// `seq_not_reserved`.
pub const AWAIT_LIMIT: usize = 1024;

/// Where a packet is in its trip through the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// One single-pass descriptor.
    Single,
    /// Dual-pass or sync, first descriptor (cipher out, MAC in).
    First,
    /// Second descriptor (MAC out, cipher in).
    Second,
}

/// What the gateway keeps of a packet with the engine: the job carries the
/// descriptor and the buffer, this the rest of its `Pending`.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
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
pub(super) struct Slab {
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

/// An authentic inbound packet waiting for its SA's durable ceiling to
/// reach its sequence number.
pub(super) struct Awaiting {
    buf: PacketBuf,
    pending: Pending,
    since: Duration,
}

/// An inbound packet waiting for its SA's packets in flight.
pub(super) struct Held {
    buf: PacketBuf,
    sa: SaId,
    since: Duration,
}

/// The engine side of the gateway: the engine, its backlog and what is in
/// flight.
pub(super) struct Jobs {
    pub(super) in_flight: Slab,
    /// Prepared jobs the engine has not taken yet, in order.
    backlog: VecDeque<Job>,
    /// The one job a sync-style submission hands over.
    single: VecDeque<Job>,
    /// Completed jobs, reused between polls.
    completions: Vec<Job>,
    held: VecDeque<Held>,
    /// Bounded by [`AWAIT_LIMIT`].
    awaiting: VecDeque<Awaiting>,
    /// Outbound packets run inline (an engine that computes on this CPU,
    /// single pass): they skip the backlog and the in-flight table, and
    /// `pump` runs them as one burst.
    inline_outbound: bool,
    inline: Vec<Job>,
}

impl Jobs {
    pub(super) fn new(inline_outbound: bool) -> Self {
        Jobs {
            inline_outbound,
            inline: Vec::with_capacity(256),
            in_flight: Slab::default(),
            backlog: VecDeque::with_capacity(256),
            single: VecDeque::with_capacity(1),
            completions: Vec::with_capacity(256),
            held: VecDeque::new(),
            awaiting: VecDeque::new(),
        }
    }

    /// Packets between prepare and finish, or held for their inference.
    pub(super) fn live(&self) -> usize {
        self.in_flight.live + self.held.len() + self.inline.len() + self.awaiting.len()
    }
}

impl Gateway {
    pub(super) fn start_encapsulation(
        &mut self,
        now: Duration,
        sa_id: SaId,
        mut buf: PacketBuf,
        out: &mut Vec<Output>,
    ) {
        let ip_id = self.next_ip_id.take();
        let Some(sa) = self.sad.get_mut(sa_id) else {
            return self.emit(buf, Err(DropReason::SaExpired), out);
        };
        // RFC 4301 §8.1 / RFC 1191: with DF set, a packet that will not fit
        // the outside MTU once protected is refused with the MTU it must meet.
        let mtu = usize::from(self.interfaces[Port::Outside.index()].mtu);
        let (size, fits) = esp::protected_size(
            buf.data(),
            sa.crypto().algorithm,
            sa.params().mode,
            sa.crypto().outer.header_len(),
            mtu,
        );
        let is_ipv6 = crate::wire::is_ipv6(buf.data());
        // An IPv6 outer packet is never fragmented (this gateway does not
        // fragment at the source either): what does not fit is refused
        // with the size that does, whatever the inner DF says.
        let outer_ipv6 = sa.crypto().outer.is_ipv6();
        if is_ipv6 && size > mtu && (fits >= icmp6::MIN_MTU || outer_ipv6) {
            // RFC 4213 §3.2 / RFC 8200 §5: the tunnel is a link of MTU
            // `fits` for IPv6, which routers never fragment: too big is a
            // packet-too-big error. Below the IPv6 minimum an IPv4 outer
            // packet is fragmented instead; an IPv6 one cannot be.
            if fits < icmp6::MIN_MTU {
                return self.emit(buf, Err(DropReason::FragNeeded), out);
            }
            let error = (icmp6::kind::PACKET_TOO_BIG, 0, u32::try_from(fits).unwrap_or(0));
            let result = self.icmp6_error(&mut buf, error, DropReason::FragNeeded);
            return self.emit(buf, result, out);
        }
        let dont_fragment = match ipv4::view(buf.data()) {
            Ok(ip) => ip.dont_frag() || outer_ipv6,
            Err(_) if is_ipv6 => false,
            Err(reason) => return self.emit(buf, Err(reason), out),
        };
        if size > mtu && dont_fragment {
            let from = self.interfaces[Port::Inside.index()].address;
            let next_hop_mtu = u32::try_from(fits).unwrap_or(0);
            let error = (
                icmp::kind::DEST_UNREACHABLE,
                icmp::kind::FRAG_NEEDED,
                next_hop_mtu,
            );
            let result = self.icmp_error(&mut buf, error, from, DropReason::FragNeeded);
            return self.emit(buf, result, out);
        }
        let ctx = OutboundContext {
            rng: &mut self.rng,
            ip_id,
            now,
        };
        match esp::encapsulate_prepare(sa_id, sa, &mut buf, ctx) {
            Ok(pending) => {
                let crypto = (sa.crypto().handle, sa.crypto().algorithm);
                // Lifetimes count what is handed to the engine, as Linux's
                // xfrm_output does before the transform, so that finishing
                // an outbound packet needs no SA.
                self.sad.account(sa_id, pending.protected_len, now);
                if self.jobs.inline_outbound {
                    self.jobs.inline.push(Job::new(
                        crypto.0,
                        pending.desc,
                        buf,
                        pending.esp_offset,
                        u64::from(sa_id.0),
                    ));
                } else {
                    self.launch(now, pending, Direction::Encrypt, crypto, buf, out);
                }
            }
            Err(reason) => {
                if reason == DropReason::SeqOverflow {
                    esp::note_exhausted(&mut self.sad, sa_id);
                }
                self.emit(buf, Err(reason), out);
            }
        }
    }

    /// Collects ESP fragments; a completed datagram goes on to decapsulation.
    /// Only the remote ends of our SAs may start one: nobody else's
    /// fragments take a slot in the table.
    pub(super) fn reassemble(&mut self, now: Duration, buf: PacketBuf, out: &mut Vec<Output>) {
        let src = if crate::wire::is_ipv6(buf.data()) {
            crate::wire::ipv6::view(buf.data()).map(|ip| IpAddr::from(ip.src_addr()))
        } else {
            ipv4::view(buf.data()).map(|ip| IpAddr::from(ip.src_addr()))
        };
        match src {
            Ok(src) if self.takes_fragments_from(src) => {}
            Ok(_) => return self.emit(buf, Err(DropReason::FragmentNotFromPeer), out),
            Err(reason) => return self.emit(buf, Err(reason), out),
        }
        let result = self.reassembler.insert(buf, now, &mut self.pool, &mut self.spent);
        self.give_up_spent(out);
        match result {
            Reassembled::Held(fragment) => {
                self.stats.fragments_absorbed += 1;
                out.push((fragment, Verdict::Consumed));
            }
            Reassembled::Complete { datagram, spent } => {
                self.stats.fragments_absorbed += 1;
                out.push((spent, Verdict::Consumed));
                // The datagram's buffer came from the pool: a new frame.
                self.stats.generated += 1;
                self.reassembled(now, datagram, out);
            }
            Reassembled::Dropped(fragment, _) => self.emit(fragment, Err(DropReason::ReassemblyFailed), out),
        }
    }

    /// Hands back datagram buffers the reassembler gave up on.
    pub(super) fn give_up_spent(&mut self, out: &mut Vec<Output>) {
        while let Some((buf, why)) = self.spent.pop() {
            let reason = match why {
                ReassemblyError::TimedOut => DropReason::ReassemblyTimeout,
                ReassemblyError::Evicted => DropReason::ReassemblyEvicted,
                ReassemblyError::SourceLimit => DropReason::ReassemblySourceLimit,
                ReassemblyError::Overlap
                | ReassemblyError::TooLarge
                | ReassemblyError::Full
                | ReassemblyError::NoBuffer
                | ReassemblyError::Malformed => DropReason::ReassemblyFailed,
            };
            self.stats.generated += 1;
            self.stats.drops.count(reason);
            out.push((buf, Verdict::Drop(reason)));
        }
    }

    /// Whether `src` is the remote end of one of our SAs (or, for a
    /// transport-mode inbound SA, a source its selectors admit): the set
    /// is rebuilt only after SAs came or went or a peer moved.
    fn takes_fragments_from(&mut self, src: IpAddr) -> bool {
        let stamp = (self.sa_changes, self.sad.len(), self.peers.epoch());
        if !self.fragment_sources.is_current(stamp) {
            let sad = &self.sad;
            let addresses = sad.iter().flat_map(|(_, sa)| {
                let moved = sa.crypto().peer.as_ref().map(|p| IpAddr::V4(p.current().address));
                let seen = sa.crypto().seen_peer.map(|p| IpAddr::V4(p.address));
                [Some(sa.params().remote), moved, seen].into_iter().flatten()
            });
            let prefixes = sad
                .iter()
                .filter(|(_, sa)| {
                    let p = sa.params();
                    p.mode == spd_sad::Mode::Transport && p.direction == spd_sad::SaDirection::Inbound
                })
                .flat_map(|(_, sa)| sa.params().selectors.iter().map(|s| s.src));
            self.fragment_sources.rebuild(stamp, addresses, prefixes);
        }
        self.fragment_sources.admits(src)
    }

    /// Inbound ESP addressed to us: prepare it, or hold it while its ESN
    /// inference depends on packets in flight.
    pub(super) fn start_decapsulation(&mut self, now: Duration, buf: PacketBuf, out: &mut Vec<Output>) {
        self.prepare_inbound(now, buf, true, out);
    }

    /// Returns the buffer back when the packet was held again.
    fn prepare_inbound(
        &mut self,
        now: Duration,
        mut buf: PacketBuf,
        behind_held: bool,
        out: &mut Vec<Output>,
    ) -> Option<PacketBuf> {
        // Packets held for an SA come before a new one of it (not before
        // one of them being released).
        let held = &self.jobs.held;
        let has_held = |sa: SaId| behind_held && held.iter().any(|h| h.sa == sa);
        match esp::decapsulate_prepare(&mut self.sad, &mut buf, now, has_held) {
            Ok(Inbound::Ready(pending)) => match self.sad.get_mut(pending.sa) {
                Some(sa) => {
                    sa.note_inbound_started(pending.seq);
                    let crypto = (sa.crypto().handle, sa.crypto().algorithm);
                    self.launch(now, pending, Direction::Decrypt, crypto, buf, out);
                }
                None => self.emit(buf, Err(DropReason::UnknownSpi), out),
            },
            Ok(Inbound::Hold(_)) if !behind_held => return Some(buf),
            Ok(Inbound::Hold(sa)) => self.hold(now, sa, buf, out),
            Err(reason) => self.emit(buf, Err(reason), out),
        }
        None
    }

    fn hold(&mut self, now: Duration, sa_id: SaId, buf: PacketBuf, out: &mut Vec<Output>) {
        if self.jobs.held.len() >= HOLD_LIMIT {
            return self.emit(buf, Err(DropReason::EngineBusy), out);
        }
        self.stats.esn_held += 1;
        self.jobs.held.push_back(Held {
            buf,
            sa: sa_id,
            since: now,
        });
    }

    /// An inbound packet's trip ended: once none of its SA's packets is in
    /// flight, the packets held behind them go on, in arrival order.
    fn inbound_done(&mut self, now: Duration, sa_id: SaId, out: &mut Vec<Output>) {
        let idle = self
            .sad
            .get_mut(sa_id)
            .is_some_and(|sa| sa.note_inbound_finished());
        if !idle {
            return;
        }
        while let Some(i) = self.jobs.held.iter().position(|h| h.sa == sa_id) {
            let Some(held) = self.jobs.held.remove(i) else {
                break;
            };
            if let Some(buf) = self.prepare_inbound(now, held.buf, false, out) {
                // Still undecided behind the packet just released: back to
                // its place, first in line for this SA.
                self.jobs.held.insert(i, Held { buf, ..held });
                break;
            }
        }
    }

    /// The descriptor kinds for a packet in this gateway's style: AEADs are
    /// always single-pass (GCM cannot be split); otherwise sync and
    /// dual-pass run cipher then MAC outbound, MAC then cipher inbound.
    fn first_phase(&self, algorithm: Algorithm) -> Phase {
        if self.style == Style::Async || algorithm.is_aead() {
            Phase::Single
        } else {
            Phase::First
        }
    }

    fn kind_for(direction: Direction, phase: Phase) -> DescriptorKind {
        match (phase, direction) {
            (Phase::Single, _) => DescriptorKind::SinglePass,
            (Phase::First, Direction::Encrypt) | (Phase::Second, Direction::Decrypt) => {
                DescriptorKind::CipherOnly
            }
            (Phase::First, Direction::Decrypt) | (Phase::Second, Direction::Encrypt) => {
                DescriptorKind::MacOnly
            }
        }
    }

    /// Queues a prepared packet for the engine; `pump` hands it over.
    fn launch(
        &mut self,
        now: Duration,
        pending: Pending,
        direction: Direction,
        (session, algorithm): (SessionHandle, Algorithm),
        buf: PacketBuf,
        out: &mut Vec<Output>,
    ) {
        if self.jobs.backlog.len() >= BACKLOG_LIMIT {
            if direction == Direction::Decrypt {
                self.inbound_done(now, pending.sa, out);
            }
            return self.emit(buf, Err(DropReason::EngineBusy), out);
        }
        let phase = self.first_phase(algorithm);

        let slot = self.jobs.in_flight.insert(InFlight {
            sa: pending.sa,
            seq: pending.seq,
            direction,
            phase,
            submitted_at: now,
            abandoned: false,
        });
        self.jobs.backlog.push_back(Job::new(
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
            if let Some(job) = self.jobs.backlog.back_mut() {
                job.desc.kind = Self::kind_for(direction, phase);
            }
        }
    }

    /// Hands queued jobs to the engine and finishes what it completed, until
    /// neither moves. Never waits.
    pub(super) fn pump(&mut self, now: Duration, out: &mut Vec<Output>) {
        if !self.jobs.awaiting.is_empty() {
            self.release_awaiting(now, out);
        }
        self.run_inline(out);
        loop {
            let submitted = self.submit_queued(now);
            let mut done = std::mem::take(&mut self.jobs.completions);
            let completed = self.engine.poll_burst(now, &mut done);
            for job in done.drain(..) {
                self.complete(now, job, out);
            }
            self.jobs.completions = done;
            if submitted == 0 && completed == 0 {
                break;
            }
        }
    }

    /// Runs the inline outbound burst and finishes it, in order.
    fn run_inline(&mut self, out: &mut Vec<Output>) {
        if self.jobs.inline.is_empty() {
            return;
        }
        let mut jobs = std::mem::take(&mut self.jobs.inline);
        // `inline_outbound` is only set for an engine that runs inline; one
        // that would not leaves its jobs pending, and they fail below
        // rather than being lost.
        self.engine.run_inline(&mut jobs);
        for job in jobs.drain(..) {
            match esp::encapsulate_finish(job.desc.status) {
                Ok(()) => {
                    self.stats.encapsulated += 1;
                    self.emit_protected(SaId(job.user as u32), job.buf, out);
                }
                Err(reason) => self.emit(job.buf, Err(reason), out),
            }
        }
        self.jobs.inline = jobs;
    }

    fn submit_queued(&mut self, now: Duration) -> usize {
        if self.jobs.backlog.is_empty() {
            return 0;
        }
        if self.style != Style::Sync {
            let taken = self.engine.submit_burst(now, &mut self.jobs.backlog);
            if self.jobs.backlog.is_empty() {
                // Back to the start of the ring, so that every burst reuses
                // the same (cached) slots instead of walking the ring.
                self.jobs.backlog.clear();
            }
            return taken;
        }
        // Low-level synchronous: one descriptor at a time, the next only
        // once the engine has handed the previous one back.
        if self.engine.in_flight() > 0 {
            return 0;
        }
        let Some(job) = self.jobs.backlog.pop_front() else {
            return 0;
        };
        self.jobs.single.push_back(job);
        let taken = self.engine.submit_burst(now, &mut self.jobs.single);
        if let Some(job) = self.jobs.single.pop_front() {
            self.jobs.backlog.push_front(job);
        }
        taken
    }

    /// A job came back from the engine.
    fn complete(&mut self, now: Duration, mut job: Job, out: &mut Vec<Output>) {
        let Some(entry) = self.jobs.in_flight.remove(job.user as usize) else {
            // Not ours: cannot happen, but never lose a buffer.
            return self.emit(job.buf, Err(DropReason::EngineError), out);
        };
        if entry.abandoned {
            if entry.direction == Direction::Decrypt {
                self.inbound_done(now, entry.sa, out);
            }
            return self.emit(job.buf, Err(DropReason::EngineTimeout), out);
        }
        if entry.phase == Phase::First && job.desc.status == Status::Done {
            job.user = self.jobs.in_flight.insert(InFlight {
                phase: Phase::Second,
                ..entry
            }) as u64;
            job.desc.kind = Self::kind_for(entry.direction, Phase::Second);
            job.desc.status = Status::Pending;
            // Sync: this packet's second descriptor is next. Dual-pass: it
            // queues behind what is waiting, which keeps each SA's packets
            // in order.
            if self.style == Style::Sync {
                self.jobs.backlog.push_front(job);
            } else {
                self.jobs.backlog.push_back(job);
            }
            return;
        }
        let pending = Pending {
            sa: entry.sa,
            desc: job.desc,
            esp_offset: job.offset,
            seq: entry.seq,
            protected_len: 0,
        };
        let buf = job.buf;
        let result = match entry.direction {
            Direction::Encrypt => match esp::encapsulate_finish(pending.desc.status) {
                Ok(()) => {
                    self.stats.encapsulated += 1;
                    return self.emit_protected(pending.sa, buf, out);
                }
                Err(reason) => Err(reason),
            },
            Direction::Decrypt => return self.finish_inbound(now, buf, pending, true, out),
        };
        self.emit(buf, result, out);
    }

    /// Finishes an inbound packet whose engine pass is over. One beyond
    /// its SA's durable ceiling waits for it to be raised (when `may_wait`
    /// and there is room), still in flight for its SA.
    fn finish_inbound(
        &mut self,
        now: Duration,
        mut buf: PacketBuf,
        pending: Pending,
        may_wait: bool,
        out: &mut Vec<Output>,
    ) {
        // The ceiling may have been raised since the waiting packets were
        // last looked at: they go first, and while any of this SA's still
        // wait this one waits behind them, whatever its number, or it
        // could carry the window so far past them that they would be
        // refused as too old.
        if may_wait && !self.jobs.awaiting.is_empty() {
            self.release_awaiting(now, out);
            if self.jobs.awaiting.iter().any(|w| w.pending.sa == pending.sa) {
                return self.wait_for_ceiling(buf, pending, now, out);
            }
        }
        let result = self.finish_decapsulation(now, &mut buf, &pending);
        if result == Err(DropReason::SeqNotReserved) {
            if may_wait {
                return self.wait_for_ceiling(buf, pending, now, out);
            }
            if let Some(sa) = self.sad.get_mut(pending.sa) {
                sa.counters_mut().count(DropReason::SeqNotReserved);
            }
        }
        self.inbound_done(now, pending.sa, out);
        if result == Err(DropReason::TtlExpired) {
            return self.time_exceeded_after_decapsulation(buf, out);
        }
        self.emit(buf, result, out);
    }

    /// Puts an authentic inbound packet in line for its SA's ceiling
    /// (still in flight for its SA), or drops it if the line is full.
    fn wait_for_ceiling(&mut self, buf: PacketBuf, pending: Pending, now: Duration, out: &mut Vec<Output>) {
        if self.jobs.awaiting.len() < AWAIT_LIMIT {
            self.stats.seq_awaited += 1;
            self.jobs.awaiting.push_back(Awaiting {
                buf,
                pending,
                since: now,
            });
            return;
        }
        if let Some(sa) = self.sad.get_mut(pending.sa) {
            sa.counters_mut().count(DropReason::SeqNotReserved);
        }
        self.inbound_done(now, pending.sa, out);
        self.emit(buf, Err(DropReason::SeqNotReserved), out);
    }

    /// Finishes the waiting packets whose SA's ceiling has come up to them
    /// (or whose SA is gone), each SA's in the order they came: once one
    /// of an SA must still wait, so do those behind it (the ceiling may
    /// rise while the line is looked at).
    fn release_awaiting(&mut self, now: Duration, out: &mut Vec<Output>) {
        // SAs with a packet still waiting ahead; with more than these, the
        // rest waits for the next pass.
        let mut blocked = [None::<SaId>; 8];
        let mut i = 0;
        while let Some(waiting) = self.jobs.awaiting.get(i) {
            let (sa, seq) = (waiting.pending.sa, waiting.pending.seq);
            if blocked.contains(&Some(sa)) {
                i += 1;
                continue;
            }
            let ready = self.sad.get_mut(sa).is_none_or(|s| s.inbound_within_ceiling(seq));
            if !ready {
                match blocked.iter_mut().find(|b| b.is_none()) {
                    Some(free) => *free = Some(sa),
                    None => break,
                }
                i += 1;
                continue;
            }
            let Some(waiting) = self.jobs.awaiting.remove(i) else {
                break;
            };
            self.finish_inbound(now, waiting.buf, waiting.pending, false, out);
        }
    }

    /// A decapsulated packet whose TTL or hop limit ran out here: the
    /// router's time exceeded (RFC 1812 §5.3.1, RFC 4443 §3.3) goes back to
    /// its source, which is behind the peer, so it takes the outbound
    /// policy like every packet of ours (through the tunnel, as Linux's
    /// output path sends it through the xfrm bundle).
    fn time_exceeded_after_decapsulation(&mut self, mut buf: PacketBuf, out: &mut Vec<Output>) {
        let reason = DropReason::TtlExpired;
        let result = if crate::wire::is_ipv6(buf.data()) {
            self.icmp6_error(&mut buf, (icmp6::kind::TIME_EXCEEDED, 0, 0), reason)
        } else {
            let from = self.interfaces[Port::Inside.index()].address;
            self.icmp_error(&mut buf, (icmp::kind::TIME_EXCEEDED, 0, 0), from, reason)
        };
        self.emit(buf, result, out);
    }

    fn finish_decapsulation(
        &mut self,
        now: Duration,
        buf: &mut PacketBuf,
        pending: &Pending,
    ) -> Result<Next, DropReason> {
        let arrival = Self::arrival(buf, pending.esp_offset);
        let decapsulated = esp::decapsulate_finish(&mut self.sad, buf, pending, now)?;
        if let Some(from) = arrival {
            self.learn_peer(pending.sa, pending.seq, from);
        }
        match decapsulated {
            Decapsulated::Dummy => {
                self.stats.dummy_packets += 1;
                return Ok(Next::Consume);
            }
            Decapsulated::Packet => {}
        }
        // RFC 4301 §5.2 step 4: the inner packet must match the SA's selectors.
        let is_ipv6 = crate::wire::is_ipv6(buf.data());
        let flow = flow_key_any(buf.data())?;
        let sa = self.sad.get_mut(pending.sa).ok_or(DropReason::UnknownSpi)?;
        if !sa.admits(&flow) {
            sa.counters_mut().count(DropReason::PolicyMismatch);
            return Err(DropReason::PolicyMismatch);
        }
        if is_ipv6 {
            // The inner packet's headers: ours as its destination, its
            // hop-by-hop options only as a router on its way.
            let role = match self.is_local(flow.dst) {
                true => crate::wire::ipv6::Role::Destination,
                false => crate::wire::ipv6::Role::Router,
            };
            if let Some(result) = self.refuse_extension_headers(buf, 0, role) {
                return result;
            }
        }
        self.stats.decapsulated += 1;
        if self.is_local(flow.dst) {
            self.stats.local_delivered += 1;
            // An echo request through the SA is answered, and the reply
            // takes the outbound SPD back through it.
            if self.answer_echo_after_decapsulation(buf, flow.protocol) {
                return Ok(Next::Local);
            }
            return Ok(Next::Consume);
        }
        if is_ipv6 {
            decrement_hop_limit(buf)?;
        } else {
            decrement_ttl(buf)?;
        }
        Ok(Next::Route)
    }

    /// Gives up on jobs the engine has held past [`JOB_TIMEOUT`] (they come
    /// back through `reclaim`, or later, as `engine_timeout`) and on packets
    /// held that long for their inference.
    pub(super) fn expire_jobs(&mut self, now: Duration, out: &mut Vec<Output>) {
        let overdue = self
            .jobs
            .in_flight
            .entries()
            .any(|f| !f.abandoned && now.saturating_sub(f.submitted_at) > JOB_TIMEOUT);
        if overdue {
            for entry in self.jobs.in_flight.slots.iter_mut().flatten() {
                if now.saturating_sub(entry.submitted_at) > JOB_TIMEOUT {
                    entry.abandoned = true;
                }
            }
            // Lost completions come back through a channel reset.
            let mut lost = std::mem::take(&mut self.jobs.completions);
            self.engine.reclaim(now, &mut lost);
            for job in lost.drain(..) {
                self.complete(now, job, out);
            }
            self.jobs.completions = lost;
            // Abandoned jobs still in the backlog never reached the engine.
            let mut i = 0;
            while i < self.jobs.backlog.len() {
                let abandoned = self.jobs.backlog[i].user as usize;
                if self
                    .jobs
                    .in_flight
                    .get_mut(abandoned)
                    .is_some_and(|e| e.abandoned)
                {
                    if let Some(job) = self.jobs.backlog.remove(i) {
                        self.complete(now, job, out);
                    }
                } else {
                    i += 1;
                }
            }
        }
        while self
            .jobs
            .held
            .front()
            .is_some_and(|h| now.saturating_sub(h.since) > JOB_TIMEOUT)
        {
            let Some(held) = self.jobs.held.pop_front() else {
                break;
            };
            self.emit(held.buf, Err(DropReason::EngineTimeout), out);
        }
        // A ceiling that never came (the state directory cannot be
        // written): refused, never accepted.
        while self
            .jobs
            .awaiting
            .front()
            .is_some_and(|w| now.saturating_sub(w.since) > JOB_TIMEOUT)
        {
            let Some(waiting) = self.jobs.awaiting.pop_front() else {
                break;
            };
            if let Some(sa) = self.sad.get_mut(waiting.pending.sa) {
                sa.counters_mut().count(DropReason::SeqNotReserved);
            }
            self.inbound_done(now, waiting.pending.sa, out);
            self.emit(waiting.buf, Err(DropReason::SeqNotReserved), out);
        }
    }

    /// When the jobs want the gateway called again: the engine's next
    /// completion, or the first job or held packet to time out.
    pub(super) fn jobs_deadline(&self) -> Option<Duration> {
        let engine = match self.engine.next_completion() {
            NextCompletion::Ready => Some(self.last_now),
            NextCompletion::At(t) => Some(t),
            NextCompletion::Idle | NextCompletion::External => None,
        };
        let queued = ((!self.jobs.backlog.is_empty() && self.engine.in_flight() == 0)
            || !self.jobs.inline.is_empty())
        .then_some(self.last_now);
        let timeout = self
            .jobs
            .in_flight
            .entries()
            .filter(|f| !f.abandoned)
            .map(|f| f.submitted_at + JOB_TIMEOUT)
            .min();
        let held = self.jobs.held.front().map(|h| h.since + JOB_TIMEOUT);
        let awaiting = self.jobs.awaiting.front().map(|w| w.since + JOB_TIMEOUT);
        [engine, queued, timeout, held, awaiting]
            .into_iter()
            .flatten()
            .min()
    }
}
