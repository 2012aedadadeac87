//! The ESP path through the gateway: outbound packets from their policy
//! to the engine (the MTU rules first), inbound ESP from classification
//! (through reassembly) to the engine, and both back from it: finished,
//! checked and handed on to be routed or consumed.
//!
//! Inbound verdicts must not depend on the engine or on what is in flight:
//! jobs of one SA finish in the order they were prepared (see `jobs`), the
//! replay window is re-checked at finish before the ICV status is looked
//! at, and a packet whose ESN high half could still change with the fate
//! of the packets in flight is held until they are done (RFC 4303
//! Appendix A), so every packet is judged against the window as
//! one-at-a-time processing would leave it.
//!
//! An authentic packet whose sequence number lies beyond its SA's durable
//! ceiling (static keys, see `spd_sad::SecurityAssociation::resume_above`)
//! waits, decrypted and not yet accepted, until the driver has raised the
//! ceiling, and is then finished again; it counts as in flight meanwhile.
//!
//! Owns the held and waiting inbound packets; the engine and its jobs are
//! the job machine's.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use accel::Direction;
use spd_sad::SaId;

use super::classify::decrement_ttl;
use super::classify6::decrement_hop_limit;
use super::jobs::{Finished, Outcome, JOB_TIMEOUT};
use super::{Gateway, Next, Verdict};
use crate::buffer::PacketBuf;
use crate::esp::{self, Decapsulated, Inbound, OutboundContext, Pending};
use crate::reassembly::{Reassembled, ReassemblyError};
use crate::route::Port;
use crate::stats::DropReason;
use crate::wire::{flow_key_any, ipv4};
use crate::Output;
use crate::{icmp, icmp6};

/// Inbound packets that may be held for their ESN inference at once;
/// beyond this they are dropped as `engine_busy`.
pub const HOLD_LIMIT: usize = 256;

/// Authentic inbound packets that may wait at once for their SA's durable
/// ceiling to be raised (a burst from a peer that resumed above it, for
/// the time one write takes); beyond this they are dropped as
/// `seq_not_reserved`.
pub const AWAIT_LIMIT: usize = 1024;

/// An authentic inbound packet waiting for its SA's durable ceiling to
/// reach its sequence number.
struct Awaiting {
    buf: PacketBuf,
    pending: Pending,
    since: Duration,
}

/// An inbound packet waiting for its SA's packets in flight.
struct Held {
    buf: PacketBuf,
    sa: SaId,
    since: Duration,
}

/// Inbound packets between classification and the engine, or between the
/// engine and their verdict, that wait for something other than the
/// engine.
#[derive(Default)]
pub(super) struct InboundLine {
    held: VecDeque<Held>,
    /// Bounded by [`AWAIT_LIMIT`].
    awaiting: VecDeque<Awaiting>,
    /// Jobs the machine handed back, reused between steps.
    finished: Vec<Finished>,
}

impl InboundLine {
    /// Packets held for their inference or waiting for their ceiling.
    pub(super) fn live(&self) -> usize {
        self.held.len() + self.awaiting.len()
    }

    /// When a held or waiting packet times out.
    pub(super) fn deadline(&self) -> Option<Duration> {
        let held = self.held.front().map(|h| h.since + JOB_TIMEOUT);
        let awaiting = self.awaiting.front().map(|w| w.since + JOB_TIMEOUT);
        held.into_iter().chain(awaiting).min()
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
        let ip_id = self.egress.next_ip_id();
        let Some(sa) = self.sad.get_mut(sa_id) else {
            return self.emit(buf, Err(DropReason::SaExpired), out);
        };
        // RFC 4301 §8.1 / RFC 1191: with DF set, a packet that will not fit
        // the outside MTU once protected is refused with the MTU it must meet.
        let mtu = usize::from(self.egress.interface(Port::Outside).mtu);
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
            let from = self.egress.interface(Port::Inside).address;
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
                self.launch(now, pending, Direction::Encrypt, crypto, buf, out);
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
        let held = &self.inbound.held;
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
        if self.inbound.held.len() >= HOLD_LIMIT {
            return self.emit(buf, Err(DropReason::EngineBusy), out);
        }
        self.stats.esn_held += 1;
        self.inbound.held.push_back(Held {
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
        while let Some(i) = self.inbound.held.iter().position(|h| h.sa == sa_id) {
            let Some(held) = self.inbound.held.remove(i) else {
                break;
            };
            if let Some(buf) = self.prepare_inbound(now, held.buf, false, out) {
                // Still undecided behind the packet just released: back to
                // its place, first in line for this SA.
                self.inbound.held.insert(i, Held { buf, ..held });
                break;
            }
        }
    }

    /// Queues a prepared packet for the engine; `pump` hands it over.
    fn launch(
        &mut self,
        now: Duration,
        pending: Pending,
        direction: Direction,
        crypto: (accel::SessionHandle, accel::Algorithm),
        buf: PacketBuf,
        out: &mut Vec<Output>,
    ) {
        let sa = pending.sa;
        if let Err(buf) = self.jobs.launch(now, pending, direction, crypto, buf) {
            if direction == Direction::Decrypt {
                self.inbound_done(now, sa, out);
            }
            self.emit(buf, Err(DropReason::EngineBusy), out);
        }
    }

    /// Hands queued jobs to the engine and finishes what it completed, until
    /// neither moves. Never waits.
    pub(super) fn pump(&mut self, now: Duration, out: &mut Vec<Output>) {
        if !self.inbound.awaiting.is_empty() {
            self.release_awaiting(now, out);
        }
        let mut finished = std::mem::take(&mut self.inbound.finished);
        self.jobs.run_inline(&mut finished);
        self.finish_all(now, &mut finished, out);
        loop {
            let (submitted, completed) = self.jobs.step(now, &mut finished);
            self.finish_all(now, &mut finished, out);
            if submitted == 0 && completed == 0 {
                break;
            }
        }
        self.inbound.finished = finished;
    }

    /// Finishes, in order, the jobs the machine handed back.
    fn finish_all(&mut self, now: Duration, finished: &mut Vec<Finished>, out: &mut Vec<Output>) {
        for job in finished.drain(..) {
            self.complete(now, job, out);
        }
    }

    /// A job came back from the engine.
    fn complete(&mut self, now: Duration, job: Finished, out: &mut Vec<Output>) {
        let Finished {
            outcome,
            direction,
            pending,
            buf,
        } = job;
        match (outcome, direction) {
            (Outcome::Unknown, _) => self.emit(buf, Err(DropReason::EngineError), out),
            (Outcome::Abandoned, _) => {
                if direction == Direction::Decrypt {
                    self.inbound_done(now, pending.sa, out);
                }
                self.emit(buf, Err(DropReason::EngineTimeout), out);
            }
            (Outcome::Completed, Direction::Encrypt) => match esp::encapsulate_finish(pending.desc.status) {
                Ok(()) => {
                    self.stats.encapsulated += 1;
                    self.emit_protected(pending.sa, buf, out);
                }
                Err(reason) => self.emit(buf, Err(reason), out),
            },
            (Outcome::Completed, Direction::Decrypt) => self.finish_inbound(now, buf, pending, true, out),
        }
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
        if may_wait && !self.inbound.awaiting.is_empty() {
            self.release_awaiting(now, out);
            if self.inbound.awaiting.iter().any(|w| w.pending.sa == pending.sa) {
                return self.wait_for_ceiling(buf, pending, now, out);
            }
        }
        let result = self.finish_decapsulation(now, &mut buf, &pending);
        if result == Err(DropReason::SeqNotReserved) {
            if may_wait {
                return self.wait_for_ceiling(buf, pending, now, out);
            }
            if let Some(sa) = self.sad.get_mut(pending.sa) {
                sa.counters_mut().seq_not_reserved += 1;
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
        if self.inbound.awaiting.len() < AWAIT_LIMIT {
            self.stats.seq_awaited += 1;
            self.inbound.awaiting.push_back(Awaiting {
                buf,
                pending,
                since: now,
            });
            return;
        }
        if let Some(sa) = self.sad.get_mut(pending.sa) {
            sa.counters_mut().seq_not_reserved += 1;
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
        while let Some(waiting) = self.inbound.awaiting.get(i) {
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
            let Some(waiting) = self.inbound.awaiting.remove(i) else {
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
            let from = self.egress.interface(Port::Inside).address;
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
            sa.counters_mut().policy_mismatch += 1;
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
        let mut finished = std::mem::take(&mut self.inbound.finished);
        self.jobs.expire(now, &mut finished);
        self.finish_all(now, &mut finished, out);
        self.inbound.finished = finished;
        while self
            .inbound
            .held
            .front()
            .is_some_and(|h| now.saturating_sub(h.since) > JOB_TIMEOUT)
        {
            let Some(held) = self.inbound.held.pop_front() else {
                break;
            };
            self.emit(held.buf, Err(DropReason::EngineTimeout), out);
        }
        // A ceiling that never came (the state directory cannot be
        // written): refused, never accepted.
        while self
            .inbound
            .awaiting
            .front()
            .is_some_and(|w| now.saturating_sub(w.since) > JOB_TIMEOUT)
        {
            let Some(waiting) = self.inbound.awaiting.pop_front() else {
                break;
            };
            if let Some(sa) = self.sad.get_mut(waiting.pending.sa) {
                sa.counters_mut().seq_not_reserved += 1;
            }
            self.inbound_done(now, waiting.pending.sa, out);
            self.emit(waiting.buf, Err(DropReason::SeqNotReserved), out);
        }
    }

    /// When the ESP path wants the gateway called again: the machine's
    /// next step, or the first held or waiting packet to time out.
    pub(super) fn jobs_deadline(&self) -> Option<Duration> {
        self.jobs
            .deadline(self.last_now)
            .into_iter()
            .chain(self.inbound.deadline())
            .min()
    }
}
