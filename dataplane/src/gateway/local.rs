//! Local traffic: what the gateway itself receives and sends apart from
//! forwarding. Reassembly of fragmented ESP (and, with UDP encapsulation,
//! of any UDP) addressed to it, from the remote ends of its SAs only; the
//! ICMP and ICMPv6 errors' token buckets (RFC 1812 §4.3.2.8, RFC 4443
//! §2.4 (f)); and NAT keepalives (RFC 3948 §2.3), which, like ARP, IPv6
//! neighbour discovery and the control plane's datagrams, no policy
//! applies to (as Linux exempts an IKE daemon's sockets from the xfrm
//! policy). What the outbound SPD says of the gateway's other packets, and
//! echo requests answered after decapsulation, are `own_packets`'.
//!
//! Owns the reassembler, the sources it admits, the error rate limiter and
//! the keepalive timer. Must not route or frame (that is `egress`), nor
//! touch the engine; reads the SAD it is lent, never changes an SA.

use std::net::IpAddr;
use std::time::Duration;

use spd_sad::{SaDirection, Sad};

use super::ipid::IpIds;
use super::output::Sink;
use crate::buffer::{PacketBuf, PacketPool};
use crate::esp::SaCrypto;
use crate::icmp;
use crate::nat::{self, PeerAddr};
use crate::reassembly::{GivenUp, Reassembled, Reassembler, ReassemblyError, Sources};
use crate::stats::{DropReason, Stats};
use crate::wire::{ipv4, ipv6};

/// The gateway's own traffic.
pub(super) struct Local {
    icmp_limiter: icmp::RateLimiter,
    reassembler: Reassembler,
    /// Whose fragments are reassembled: the remote ends of our SAs.
    fragment_sources: Sources,
    /// Scratch for buffers the reassembler gives up.
    spent: Vec<GivenUp>,
    /// How often keepalives go out, when this gateway sends them.
    keepalive_every: Option<Duration>,
    next_keepalive: Duration,
}

impl Local {
    /// `keepalive_every`: the NAT keepalive interval, `None` when this
    /// gateway sends none (none configured, or not the worker that does).
    pub(super) fn new(icmp_limits: icmp::IcmpLimits, keepalive_every: Option<Duration>) -> Local {
        Local {
            icmp_limiter: icmp::RateLimiter::new(icmp_limits),
            reassembler: Reassembler::default(),
            fragment_sources: Sources::default(),
            spent: Vec::with_capacity(8),
            keepalive_every,
            next_keepalive: Duration::ZERO,
        }
    }

    /// Whether an ICMP error to `to` may go now (both token buckets have a
    /// token); counted as `icmp_rate_limited` when not.
    #[inline]
    pub(super) fn allow_error(&mut self, to: IpAddr, now: Duration, stats: &mut Stats) -> bool {
        if self.icmp_limiter.allow(to, now) {
            return true;
        }
        stats.icmp_rate_limited += 1;
        false
    }

    /// Collects a fragment; the completed datagram comes back. Only the
    /// remote ends of our SAs may start one (`stamp` says when the SAs or
    /// their peers changed): nobody else's fragments take a slot.
    pub(super) fn reassemble(
        &mut self,
        now: Duration,
        buf: PacketBuf,
        pool: &mut PacketPool,
        (sad, stamp): (&Sad<SaCrypto>, (u64, usize, u64)),
        sink: &mut Sink<'_>,
    ) -> Option<PacketBuf> {
        let src = if crate::wire::is_ipv6(buf.data()) {
            ipv6::view(buf.data()).map(|ip| IpAddr::from(ip.src_addr()))
        } else {
            ipv4::view(buf.data()).map(|ip| IpAddr::from(ip.src_addr()))
        };
        match src {
            Ok(src) if self.takes_fragments_from(src, sad, stamp) => {}
            Ok(_) => {
                sink.drop(buf, DropReason::FragmentNotFromPeer);
                return None;
            }
            Err(reason) => {
                sink.drop(buf, reason);
                return None;
            }
        }
        let result = self.reassembler.insert(buf, now, pool, &mut self.spent);
        self.give_up_spent(sink);
        match result {
            Reassembled::Held(fragment) => {
                sink.stats().fragments_absorbed += 1;
                sink.consumed(fragment);
                None
            }
            Reassembled::Complete { datagram, spent } => {
                sink.stats().fragments_absorbed += 1;
                sink.consumed(spent);
                // The datagram's buffer came from the pool: a new frame.
                sink.stats().generated += 1;
                Some(datagram)
            }
            Reassembled::Dropped(fragment, _) => {
                sink.drop(fragment, DropReason::ReassemblyFailed);
                None
            }
        }
    }

    /// Whether `src` is the remote end of one of our SAs (or, for a
    /// transport-mode inbound SA, a source its selectors admit): the set
    /// is rebuilt only after SAs came or went or a peer moved.
    fn takes_fragments_from(&mut self, src: IpAddr, sad: &Sad<SaCrypto>, stamp: (u64, usize, u64)) -> bool {
        if !self.fragment_sources.is_current(stamp) {
            let addresses = sad.iter().flat_map(|(_, sa)| {
                let moved = sa.crypto().peer.as_ref().map(|p| IpAddr::V4(p.current().address));
                let seen = sa.crypto().seen_peer.map(|p| IpAddr::V4(p.address));
                [Some(sa.params().remote), moved, seen].into_iter().flatten()
            });
            let prefixes = sad
                .iter()
                .filter(|(_, sa)| {
                    let p = sa.params();
                    p.mode == spd_sad::Mode::Transport && p.direction == SaDirection::Inbound
                })
                .flat_map(|(_, sa)| sa.params().selectors.iter().map(|s| s.src));
            self.fragment_sources.rebuild(stamp, addresses, prefixes);
        }
        self.fragment_sources.admits(src)
    }

    /// Hands back datagram buffers the reassembler gave up on.
    fn give_up_spent(&mut self, sink: &mut Sink<'_>) {
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
            sink.stats().generated += 1;
            sink.drop(buf, reason);
        }
    }

    /// Gives up on datagrams whose fragments stopped coming.
    #[inline]
    pub(super) fn handle_timeout(&mut self, now: Duration, sink: &mut Sink<'_>) {
        if self.reassembler.in_progress() > 0 {
            self.reassembler.expire(now, &mut self.spent);
            self.give_up_spent(sink);
        }
    }

    /// Stops: every datagram in progress is dropped.
    pub(super) fn shutdown(&mut self, sink: &mut Sink<'_>) {
        self.reassembler.drain(&mut self.spent);
        self.give_up_spent(sink);
    }

    /// The next reassembly timeout, or keepalive when `encapsulating` (some
    /// SA receives on an encapsulation port).
    #[inline]
    pub(super) fn deadline(&self, encapsulating: bool) -> Option<Duration> {
        let keepalive = (self.keepalive_every.is_some() && encapsulating).then_some(self.next_keepalive);
        self.reassembler
            .next_deadline()
            .into_iter()
            .chain(keepalive)
            .min()
    }

    /// RFC 3948 §2.3: one 0xFF byte to each UDP-encapsulated peer, every
    /// interval, so that the NAT in between keeps the mapping. The
    /// datagrams, bare IPv4, go to `sent`, to be routed (no policy applies
    /// to them). Called only while some SA receives on an encapsulation
    /// port.
    pub(super) fn keepalives(
        &mut self,
        now: Duration,
        sad: &Sad<SaCrypto>,
        ip_ids: &mut IpIds,
        pool: &mut PacketPool,
        stats: &mut Stats,
        sent: &mut Vec<PacketBuf>,
    ) {
        let Some(interval) = self.keepalive_every else {
            return;
        };
        if now < self.next_keepalive {
            return;
        }
        self.next_keepalive = now + interval;
        let mut ends: Vec<(std::net::Ipv4Addr, u16, PeerAddr)> = Vec::new();
        for (_, sa) in sad.iter() {
            let p = sa.params();
            let (Some(encap), SaDirection::Outbound) = (p.encap, p.direction) else {
                continue;
            };
            let Some(peer) = sa.crypto().seen_peer else {
                continue;
            };
            let IpAddr::V4(local) = p.local else {
                continue;
            };
            let end = (local, encap.local_port, peer);
            if !ends.contains(&end) {
                ends.push(end);
            }
        }
        for (local, local_port, peer) in ends {
            let Some(mut buf) = pool.alloc() else {
                // The next interval tries again; the mapping usually lasts longer.
                return;
            };
            if !icmp::udp_datagram(
                &mut buf,
                (local, local_port),
                (peer.address, peer.port),
                ip_ids.take(),
                &[nat::KEEPALIVE],
            ) {
                pool.free(buf);
                continue;
            }
            stats.generated += 1;
            stats.nat_keepalives_sent += 1;
            sent.push(buf);
        }
    }
}
