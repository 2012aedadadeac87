//! RFC 3948 UDP encapsulation in the gateway: what a datagram to one of our
//! encapsulation ports is, keepalives out, and following a peer whose NAT
//! mapping moved. The wire rules and the shared peer cells are
//! `crate::nat`'s; must not touch the engine or the SPD.

use std::time::Duration;

use spd_sad::{FlowKey, SaDirection, SaId};

use super::classify::Classified;
use super::{Gateway, Next};
use crate::buffer::PacketBuf;
use crate::esp::OuterHeader;
use crate::icmp;
use crate::nat::{self, PeerAddr};
use crate::stats::DropReason;
use crate::wire::ipv4;
use crate::Output;

impl Gateway {
    /// Whether UDP to our address may be ESP in UDP: some SA receives on
    /// an encapsulation port.
    pub(super) fn receives_encapsulated(&self) -> bool {
        !self.nat_ports.is_empty()
    }

    /// A whole UDP datagram to one of our addresses: ESP in UDP, IKE behind
    /// the non-ESP marker, or a keepalive when it is for an encapsulation
    /// port; `None` when it is not.
    /// `checksum_verified`: the driver noted that the kernel verified the
    /// UDP checksum; otherwise a non-zero one is verified here (RFC 1122
    /// §4.1.3.4; zero is none, which RFC 3948 §2.1 allows over IPv4).
    pub(super) fn classify_encapsulated(
        &mut self,
        buf: &PacketBuf,
        flow: &FlowKey,
        checksum_verified: bool,
    ) -> Option<Result<Classified, DropReason>> {
        let (_, port) = flow.ports?;
        if !self.nat_ports.contains(&port) {
            return None;
        }
        let data = buf.data();
        let header_len = match ipv4::header_len(data) {
            Ok(len) => len,
            Err(reason) => return Some(Err(reason)),
        };
        let udp = data.get(header_len..).unwrap_or_default();
        // The UDP length must say what the IPv4 length says (the buffer
        // ends where the datagram does): ESP's length is taken from it.
        let payload = match udp.get(4..6) {
            Some(&[hi, lo]) if usize::from(u16::from_be_bytes([hi, lo])) == udp.len() => {
                udp.get(nat::UDP_HEADER_LEN..)
            }
            _ => None,
        };
        let Some(payload) = payload else {
            return Some(Err(DropReason::Malformed));
        };
        if !checksum_verified && !nat::udp_checksum_ok(&data[..header_len], udp) {
            return Some(Err(DropReason::UdpChecksum));
        }
        Some(match nat::Payload::of(payload) {
            nat::Payload::Esp => Ok(Classified::Decapsulate),
            // RFC 3948 §2.3: the receiver ignores keepalives.
            nat::Payload::Keepalive => {
                self.stats.local_delivered += 1;
                self.stats.nat_keepalives_received += 1;
                Ok(Classified::Done(Ok(Next::Consume)))
            }
            nat::Payload::Ike if self.setup.control_port.is_none() => {
                self.stats.local_delivered += 1;
                Ok(Classified::Done(Ok(Next::Consume)))
            }
            nat::Payload::Ike => Ok(Classified::Done(self.deliver_to_control())),
            nat::Payload::Malformed => Err(DropReason::Malformed),
        })
    }

    /// A datagram the reassembler completed: ESP goes on to decapsulation;
    /// UDP is classified again now that its header and payload are whole.
    pub(super) fn reassembled(&mut self, now: Duration, datagram: PacketBuf, out: &mut Vec<Output>) {
        // IPv6: only ESP is reassembled (no UDP encapsulation over IPv6),
        // whose headers are ours to process now that they are whole.
        if crate::wire::is_ipv6(datagram.data()) {
            let mut datagram = datagram;
            let role = crate::wire::ipv6::Role::Destination;
            if let Some(result) = self.refuse_extension_headers(&mut datagram, 0, role) {
                return self.emit(datagram, result, out);
            }
            return self.start_decapsulation(now, datagram, out);
        }
        let flow = match ipv4::view(datagram.data()) {
            Ok(ip) => crate::wire::flow_key(&ip),
            Err(reason) => return self.emit(datagram, Err(reason), out),
        };
        if flow.protocol != spd_sad::proto::UDP {
            return self.start_decapsulation(now, datagram, out);
        }
        match self.classify_encapsulated(&datagram, &flow, false) {
            Some(Ok(Classified::Decapsulate)) => self.start_decapsulation(now, datagram, out),
            Some(Ok(Classified::Done(result))) => self.emit(datagram, result, out),
            Some(Ok(_)) => self.emit(datagram, Err(DropReason::Malformed), out),
            Some(Err(reason)) => self.emit(datagram, Err(reason), out),
            None if self.is_control(&flow, false) => {
                let result = self.deliver_to_control();
                self.emit(datagram, result, out);
            }
            None => {
                self.stats.local_delivered += 1;
                self.emit(datagram, Ok(Next::Consume), out);
            }
        }
    }

    /// Where a UDP-encapsulated packet came from, read before
    /// decapsulation strips the outer headers.
    pub(super) fn arrival(buf: &PacketBuf, esp_offset: usize) -> Option<PeerAddr> {
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

    /// After an inbound packet of `sa` verified: when it is the newest of
    /// its SA and came from elsewhere than the peer was, the peer moved
    /// (its NAT mapped it anew) and the tunnel follows it.
    pub(super) fn learn_peer(&mut self, sa: SaId, seq: u64, from: PeerAddr) {
        let Some(sa) = self.sad.get_mut(sa) else { return };
        if sa.crypto().seen_peer == Some(from) || sa.highest_accepted() != seq {
            return;
        }
        let Some(peer) = sa.crypto().peer.clone() else {
            return;
        };
        sa.crypto_mut().seen_peer = Some(from);
        if peer.current() != from {
            self.peers.moved(&peer, from);
            self.stats.nat_peer_moved += 1;
        }
        // This worker's own SAs follow at once, so that the answer to this
        // very packet goes to where it came from; the others look at their
        // next batch.
        self.follow_peers();
    }

    /// Rebuilds the outer headers of this gateway's SAs whose peer moved,
    /// when any did since the last look: one load of a shared counter that
    /// is written only on a move, once a batch.
    pub(super) fn follow_peers(&mut self) {
        let epoch = self.peers.epoch();
        if epoch == self.peers_seen {
            return;
        }
        self.peers_seen = epoch;
        let ttl = self.outer_ttl;
        for (_, sa) in self.sad.iter_mut() {
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
            // Installed SAs have IPv4 ends (see `install_sa`).
            let std::net::IpAddr::V4(local) = local else {
                continue;
            };
            let crypto = sa.crypto_mut();
            crypto.seen_peer = Some(now_at);
            if outbound {
                let encap = encap.map(|e| spd_sad::UdpEncap {
                    remote_port: now_at.port,
                    ..e
                });
                crypto.outer = OuterHeader::with_encap(local, now_at.address, ttl, encap);
            }
        }
    }

    /// When the next keepalives are due, if anything sends them.
    pub(super) fn keepalive_deadline(&self) -> Option<Duration> {
        (self.setup.nat_keepalive.is_some() && self.setup.answer_arp && self.receives_encapsulated())
            .then_some(self.next_keepalive)
    }

    /// RFC 3948 §2.3: one 0xFF byte to each UDP-encapsulated peer, every
    /// interval, so that the NAT in between keeps the mapping.
    pub(super) fn send_keepalives(&mut self, now: Duration, out: &mut Vec<Output>) {
        let Some(interval) = self.setup.nat_keepalive else {
            return;
        };
        if !self.setup.answer_arp || now < self.next_keepalive || !self.receives_encapsulated() {
            return;
        }
        self.next_keepalive = now + interval;
        let mut sent: Vec<(std::net::Ipv4Addr, u16, PeerAddr)> = Vec::new();
        for (_, sa) in self.sad.iter() {
            let p = sa.params();
            let (Some(encap), SaDirection::Outbound) = (p.encap, p.direction) else {
                continue;
            };
            let Some(peer) = sa.crypto().seen_peer else {
                continue;
            };
            let std::net::IpAddr::V4(local) = p.local else {
                continue;
            };
            let end = (local, encap.local_port, peer);
            if !sent.contains(&end) {
                sent.push(end);
            }
        }
        for (local, local_port, peer) in sent {
            let Some(mut buf) = self.pool.alloc() else {
                // The next interval tries again; the mapping usually lasts longer.
                return;
            };
            if !icmp::udp_datagram(
                &mut buf,
                (local, local_port),
                (peer.address, peer.port),
                self.egress.next_ip_id(),
                &[nat::KEEPALIVE],
            ) {
                self.pool.free(buf);
                continue;
            }
            self.stats.generated += 1;
            self.stats.nat_keepalives_sent += 1;
            self.emit(buf, Ok(Next::Route), out);
        }
    }
}
