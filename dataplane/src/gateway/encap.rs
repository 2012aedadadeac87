//! RFC 3948 UDP encapsulation's moving peers: the UDP-encapsulated peers
//! this gateway's SAs send to, shared with the other workers, and
//! following a peer whose NAT mapping moved (learnt from its
//! authenticated packets, RFC 3948 §3.4 / RFC 7296 §2.23). What a datagram
//! to an encapsulation port is belongs to ingress; the wire rules and the
//! shared peer cells are `crate::nat`'s.
//!
//! Owns the peer cells and the epoch this gateway's SAs last followed;
//! rewrites only the outer headers of the SAs it is lent. Must not touch
//! the engine, the SPD or packets.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use spd_sad::{SaDirection, SaId, Sad, UdpEncap};

use crate::esp::OuterHeader;
use crate::esp::SaCrypto;
use crate::nat::{self, PeerAddr};
use crate::stats::Stats;

/// The UDP-encapsulated peers and how far this gateway has followed them.
pub(super) struct NatPeers {
    /// Shared with the forks: a move one worker learns, all follow.
    peers: nat::Peers,
    /// The peers' epoch this gateway's SAs last followed.
    seen: u64,
    /// TTL of rebuilt outer headers.
    outer_ttl: u8,
}

impl NatPeers {
    pub(super) fn new(outer_ttl: u8) -> NatPeers {
        NatPeers {
            peers: nat::Peers::default(),
            seen: 0,
            outer_ttl,
        }
    }

    /// A copy for another worker, sharing the peer cells.
    pub(super) fn fork(&self) -> NatPeers {
        NatPeers {
            peers: self.peers.clone(),
            ..*self
        }
    }

    /// Bumped on every move: what reassembly's sources follow.
    #[inline]
    pub(super) fn epoch(&self) -> u64 {
        self.peers.epoch()
    }

    /// The shared cell of the peer configured as `remote` (with `encap`)
    /// of our `local`.
    pub(super) fn cell(&mut self, local: Ipv4Addr, remote: Ipv4Addr, encap: UdpEncap) -> Arc<nat::Peer> {
        self.peers.cell(local, remote, encap)
    }

    /// Where that peer is now.
    pub(super) fn current(&self, local: Ipv4Addr, remote: Ipv4Addr, encap: UdpEncap) -> Option<PeerAddr> {
        self.peers.current(local, remote, encap)
    }

    /// After an inbound packet of `sa` verified: when it is the newest of
    /// its SA and came from elsewhere than the peer was, the peer moved
    /// (its NAT mapped it anew) and the tunnel follows it.
    pub(super) fn learn(
        &mut self,
        sad: &mut Sad<SaCrypto>,
        sa: SaId,
        seq: u64,
        from: PeerAddr,
        stats: &mut Stats,
    ) {
        let Some(sa) = sad.get_mut(sa) else { return };
        if sa.crypto().seen_peer == Some(from) || sa.highest_accepted() != seq {
            return;
        }
        let Some(peer) = sa.crypto().peer.clone() else {
            return;
        };
        sa.crypto_mut().seen_peer = Some(from);
        if peer.current() != from {
            self.peers.moved(&peer, from);
            stats.nat_peer_moved += 1;
        }
        // This worker's own SAs follow at once, so that the answer to this
        // very packet goes to where it came from; the others look at their
        // next batch.
        self.follow(sad);
    }

    /// Rebuilds the outer headers of the SAs whose peer moved, when any
    /// did since the last look: one load of a shared counter that is
    /// written only on a move, once a batch.
    #[inline]
    pub(super) fn follow(&mut self, sad: &mut Sad<SaCrypto>) {
        let epoch = self.peers.epoch();
        if epoch == self.seen {
            return;
        }
        self.seen = epoch;
        let ttl = self.outer_ttl;
        for (_, sa) in sad.iter_mut() {
            let Some(now_at) = sa.crypto().peer.as_ref().map(|p| p.current()) else {
                continue;
            };
            if sa.crypto().seen_peer == Some(now_at) {
                continue;
            }
            let (local, encap, outbound) = {
                let p = sa.params();
                (p.local, p.encap, p.direction == SaDirection::Outbound)
            };
            // Installed SAs with UDP encapsulation have IPv4 ends.
            let IpAddr::V4(local) = local else {
                continue;
            };
            let crypto = sa.crypto_mut();
            crypto.seen_peer = Some(now_at);
            if outbound {
                let encap = encap.map(|e| UdpEncap {
                    remote_port: now_at.port,
                    ..e
                });
                crypto.outer = OuterHeader::with_encap(local, now_at.address, ttl, encap);
            }
        }
    }
}
