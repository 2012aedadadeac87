//! ESP inbound: ESP addressed to us (through reassembly when the peer
//! fragmented it) prepared for the engine, and, once the engine is done,
//! finished and checked: replay window, ICV status, trailer, the SA's
//! selectors (RFC 4301 §5.2 step 4), the inner IPv6 headers, local
//! delivery and the inner TTL.
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
//! Owns the held and the waiting packets. Must not submit to the engine,
//! route or write ICMP errors: the front does, with what this stage hands
//! back.

use std::collections::VecDeque;
use std::time::Duration;

use accel::{Algorithm, SessionHandle};
use spd_sad::{SaId, Sad};

use super::addressing::Addressing;
use super::output::{IcmpError, Next};
use super::own_packets;
use super::transit;
use crate::buffer::PacketBuf;
use crate::esp::SaCrypto;
use crate::esp::{self, Decapsulated, Inbound, Pending};
use crate::nat::{self, PeerAddr};
use crate::route::Port;
use crate::stats::{DropReason, Stats};
use crate::wire::{flow_key_any, ipv4};
use crate::{icmp, icmp6};

/// Inbound packets that may be held for their ESN inference at once;
/// beyond this they are dropped as `engine_busy`.
pub const HOLD_LIMIT: usize = 256;

/// Authentic inbound packets that may wait at once for their SA's durable
/// ceiling to be raised (a burst from a peer that resumed above it, for
/// the time one write takes); beyond this they are dropped as
/// `seq_not_reserved`.
pub const AWAIT_LIMIT: usize = 1024;

/// How long a packet may be held or wait (the job machine's timeout).
const WAIT_LIMIT: Duration = super::JOB_TIMEOUT;

/// An authentic inbound packet waiting for its SA's durable ceiling to
/// reach its sequence number.
pub(super) struct Awaiting {
    pub(super) buf: PacketBuf,
    pub(super) pending: Pending,
    since: Duration,
}

/// An inbound packet waiting for its SA's packets in flight.
pub(super) struct Held {
    pub(super) buf: PacketBuf,
    sa: SaId,
    since: Duration,
}

/// What preparing an inbound packet came to.
pub(super) enum Prepared {
    /// For the engine.
    Ready(Pending, (SessionHandle, Algorithm)),
    /// Its ESN inference depends on its SA's packets in flight.
    Hold(SaId),
    Drop(DropReason),
}

/// What finishing reads and counts of the gateway's other state.
pub(super) struct Lent<'a> {
    pub(super) sad: &'a mut Sad<SaCrypto>,
    pub(super) addressing: &'a Addressing,
    pub(super) stats: &'a mut Stats,
}

/// A pass over the waiting packets: SAs with a packet still waiting ahead
/// (with more than these, the rest waits for the next pass).
#[derive(Default)]
pub(super) struct ReleasePass {
    next: usize,
    blocked: [Option<SaId>; 8],
}

/// The inbound ESP stage.
#[derive(Default)]
pub(super) struct EspIn {
    held: VecDeque<Held>,
    /// Bounded by [`AWAIT_LIMIT`].
    awaiting: VecDeque<Awaiting>,
}

impl EspIn {
    /// Packets held for their inference or waiting for their ceiling.
    #[inline]
    pub(super) fn live(&self) -> usize {
        self.held.len() + self.awaiting.len()
    }

    /// When a held or waiting packet times out.
    #[inline]
    pub(super) fn deadline(&self) -> Option<Duration> {
        let held = self.held.front().map(|h| h.since + WAIT_LIMIT);
        let awaiting = self.awaiting.front().map(|w| w.since + WAIT_LIMIT);
        held.into_iter().chain(awaiting).min()
    }

    /// Prepares inbound ESP for the engine. `behind_held`: a new packet,
    /// which waits behind its SA's held ones; a released one does not.
    #[inline]
    pub(super) fn prepare(
        &self,
        sad: &mut Sad<SaCrypto>,
        buf: &mut PacketBuf,
        now: Duration,
        behind_held: bool,
    ) -> Prepared {
        // Packets held for an SA come before a new one of it (not before
        // one of them being released).
        let held = &self.held;
        let has_held = |sa: SaId| behind_held && held.iter().any(|h| h.sa == sa);
        match esp::decapsulate_prepare(sad, buf, now, has_held) {
            Ok(Inbound::Ready(pending)) => match sad.get_mut(pending.sa) {
                Some(sa) => {
                    sa.note_inbound_started(pending.seq);
                    Prepared::Ready(pending, (sa.crypto().handle, sa.crypto().algorithm))
                }
                None => Prepared::Drop(DropReason::UnknownSpi),
            },
            Ok(Inbound::Hold(sa)) => Prepared::Hold(sa),
            Err(reason) => Prepared::Drop(reason),
        }
    }

    /// Holds a packet behind its SA's in flight; it comes back when the
    /// line is full.
    pub(super) fn hold(&mut self, sa: SaId, buf: PacketBuf, now: Duration) -> Result<(), PacketBuf> {
        if self.held.len() >= HOLD_LIMIT {
            return Err(buf);
        }
        self.held.push_back(Held { buf, sa, since: now });
        Ok(())
    }

    /// The first packet held for `sa`, with its place in line.
    pub(super) fn unhold(&mut self, sa: SaId) -> Option<(usize, Held)> {
        let i = self.held.iter().position(|h| h.sa == sa)?;
        self.held.remove(i).map(|held| (i, held))
    }

    /// Puts a packet [`unhold`](Self::unhold) took back in its place.
    pub(super) fn rehold(&mut self, i: usize, held: Held, buf: PacketBuf) {
        self.held.insert(i, Held { buf, ..held });
    }

    /// Whether packets wait for a ceiling at all.
    #[inline]
    pub(super) fn any_waiting(&self) -> bool {
        !self.awaiting.is_empty()
    }

    /// Whether a packet of `sa` waits for its ceiling.
    #[inline]
    pub(super) fn waits(&self, sa: SaId) -> bool {
        self.awaiting.iter().any(|w| w.pending.sa == sa)
    }

    /// Puts an authentic packet in line for its SA's ceiling; it comes
    /// back when the line is full.
    pub(super) fn queue_for_ceiling(
        &mut self,
        buf: PacketBuf,
        pending: Pending,
        now: Duration,
    ) -> Result<(), PacketBuf> {
        if self.awaiting.len() >= AWAIT_LIMIT {
            return Err(buf);
        }
        self.awaiting.push_back(Awaiting {
            buf,
            pending,
            since: now,
        });
        Ok(())
    }

    /// The next waiting packet whose SA's ceiling has come up to it (or
    /// whose SA is gone), each SA's in the order they came: once one of an
    /// SA must still wait, so do those behind it.
    pub(super) fn next_released(
        &mut self,
        pass: &mut ReleasePass,
        sad: &mut Sad<SaCrypto>,
    ) -> Option<Awaiting> {
        while let Some(waiting) = self.awaiting.get(pass.next) {
            let (sa, seq) = (waiting.pending.sa, waiting.pending.seq);
            if pass.blocked.contains(&Some(sa)) {
                pass.next += 1;
                continue;
            }
            let ready = sad.get_mut(sa).is_none_or(|s| s.inbound_within_ceiling(seq));
            if !ready {
                let free = pass.blocked.iter_mut().find(|b| b.is_none())?;
                *free = Some(sa);
                pass.next += 1;
                continue;
            }
            return self.awaiting.remove(pass.next);
        }
        None
    }

    /// A held packet that waited past its time.
    pub(super) fn expired_held(&mut self, now: Duration) -> Option<PacketBuf> {
        let over = self.held.front()?.since + WAIT_LIMIT < now;
        over.then(|| self.held.pop_front().map(|h| h.buf)).flatten()
    }

    /// A packet whose ceiling never came (the state directory cannot be
    /// written): refused, never accepted.
    pub(super) fn expired_waiting(&mut self, now: Duration) -> Option<Awaiting> {
        let over = self.awaiting.front()?.since + WAIT_LIMIT < now;
        over.then(|| self.awaiting.pop_front()).flatten()
    }

    /// Finishes a packet the engine is done with: the checks, and where it
    /// goes; with where an authentic UDP-encapsulated packet came from (for
    /// the front to follow a peer that moved). A decapsulated packet whose TTL or hop limit runs out here
    /// asks for a time exceeded (RFC 1812 §5.3.1, RFC 4443 §3.3): its
    /// source is behind the peer, so the error takes the outbound policy
    /// like every packet of ours (through the tunnel, as Linux's output
    /// path sends it through the xfrm bundle).
    #[inline]
    pub(super) fn finish(
        &self,
        lent: &mut Lent<'_>,
        buf: &mut PacketBuf,
        pending: &Pending,
        now: Duration,
    ) -> (Result<Next, DropReason>, Option<PeerAddr>) {
        let arrival = arrival(buf, pending.esp_offset);
        let mut authentic = false;
        let result = match finish_decapsulation(lent, buf, pending, now, &mut authentic) {
            Err(DropReason::TtlExpired) => {
                let reason = DropReason::TtlExpired;
                let error = if crate::wire::is_ipv6(buf.data()) {
                    IcmpError::v6((icmp6::kind::TIME_EXCEEDED, 0, 0), reason)
                } else {
                    let from = lent.addressing.interface(Port::Inside).address;
                    IcmpError::v4((icmp::kind::TIME_EXCEEDED, 0, 0), from, reason)
                };
                Ok(Next::Error(error))
            }
            result => result,
        };
        (result, arrival.filter(|_| authentic))
    }
}

fn finish_decapsulation(
    lent: &mut Lent<'_>,
    buf: &mut PacketBuf,
    pending: &Pending,
    now: Duration,
    authentic: &mut bool,
) -> Result<Next, DropReason> {
    let decapsulated = esp::decapsulate_finish(lent.sad, buf, pending, now)?;
    *authentic = true;
    match decapsulated {
        Decapsulated::Dummy => {
            lent.stats.dummy_packets += 1;
            return Ok(Next::Consume);
        }
        Decapsulated::Packet => {}
    }
    // RFC 4301 §5.2 step 4: the inner packet must match the SA's selectors.
    let is_ipv6 = crate::wire::is_ipv6(buf.data());
    let flow = flow_key_any(buf.data())?;
    let sa = lent.sad.get_mut(pending.sa).ok_or(DropReason::UnknownSpi)?;
    if !sa.admits(&flow) {
        sa.counters_mut().count(DropReason::PolicyMismatch);
        return Err(DropReason::PolicyMismatch);
    }
    let for_us = lent.addressing.is_local(flow.dst);
    if is_ipv6 {
        // The inner packet's headers: ours as its destination, its
        // hop-by-hop options only as a router on its way.
        let role = match for_us {
            true => crate::wire::ipv6::Role::Destination,
            false => crate::wire::ipv6::Role::Router,
        };
        if let Some(result) = transit::refuse_extension_headers(buf, 0, role) {
            return result;
        }
    }
    lent.stats.decapsulated += 1;
    if for_us {
        lent.stats.local_delivered += 1;
        // An echo request through the SA is answered, and the reply
        // takes the outbound SPD back through it.
        if own_packets::answer_echo_after_decapsulation(buf, flow.protocol) {
            lent.stats.generated += 1;
            return Ok(Next::Local);
        }
        return Ok(Next::Consume);
    }
    if is_ipv6 {
        transit::decrement_hop_limit(buf)?;
    } else {
        transit::decrement_ttl(buf)?;
    }
    Ok(Next::Route)
}

/// Where a UDP-encapsulated packet came from, read before decapsulation
/// strips the outer headers; `None` for ESP not in UDP.
fn arrival(buf: &PacketBuf, esp_offset: usize) -> Option<PeerAddr> {
    let data = buf.data();
    let ip = ipv4::view(data).ok()?;
    let header_len = usize::from(ip.header_len());
    if esp_offset == header_len {
        return None;
    }
    Some(PeerAddr {
        address: ip.src_addr(),
        port: nat::source_port(data.get(header_len..)?)?,
    })
}
