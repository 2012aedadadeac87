//! NAT traversal (RFC 3948): what a UDP datagram to an encapsulation port
//! carries (ESP, IKE behind the non-ESP marker, or a keepalive), and where
//! each UDP-encapsulated peer is now.
//!
//! A peer behind a NAT may reappear at another address or port when its
//! mapping changes. The gateway follows it only on the word of an
//! authenticated packet that is the newest of its SA (RFC 7296 §2.23's
//! rule for IKE, applied to ESP), so that neither a forger nor a replayed
//! packet can redirect a tunnel. The learnt address lives in one [`Peer`]
//! per tunnel end, shared by every worker's copies of the tunnel's SAs;
//! the worker that saw the move follows at once, the others at their next
//! batch, never per packet.
//!
//! Owns the RFC 3948 wire rules and the peer cells; must not touch SAs'
//! keys, the engine or the SPD.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use spd_sad::UdpEncap;

/// Length of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// RFC 3948 §2.2: four zero bytes where an SPI would be mark IKE.
pub const NON_ESP_MARKER: [u8; 4] = [0; 4];
/// RFC 3948 §2.3: a keepalive is one byte, 0xFF.
pub const KEEPALIVE: u8 = 0xff;

/// What a UDP payload on an encapsulation port is (RFC 3948 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// A NAT keepalive: ignored by the receiver.
    Keepalive,
    /// IKE, behind the non-ESP marker: for the control plane.
    Ike,
    /// ESP: an SPI (never zero) and a sequence number at least.
    Esp,
    /// Too short to be any of those.
    Malformed,
}

impl Payload {
    /// What the UDP payload `payload` (after the UDP header) is.
    pub fn of(payload: &[u8]) -> Payload {
        match payload {
            [KEEPALIVE] => Payload::Keepalive,
            [0, 0, 0, 0, ..] => Payload::Ike,
            p if p.len() >= 8 => Payload::Esp,
            _ => Payload::Malformed,
        }
    }
}

/// RFC 768 and RFC 1122 §4.1.3.4 for a UDP datagram over IPv4: `udp` is
/// its header and payload (as long as its length field says), `ip_header`
/// the IPv4 header that carries it. A checksum of zero means the sender
/// computed none, which RFC 3948 §2.1 lets an ESP-in-UDP sender over IPv4
/// do (Linux's xfrm does): it passes. Any other must be right. (Over
/// IPv6, where RFC 6935 and 6936 allow a zero checksum only for tunnels
/// set up for it, espgw carries no ESP in UDP.) The sum is the
/// word-at-a-time RFC 1071 one the drivers use too (`wire::checksum`).
/// Fuzzing builds accept every checksum, as smoltcp does, so that the
/// fuzzer gets past it.
pub fn udp_checksum_ok(ip_header: &[u8], udp: &[u8]) -> bool {
    use crate::wire::checksum::{fold, ones_sum, pseudo_header_sum};
    if cfg!(fuzzing) {
        return true;
    }
    match udp.get(6..8) {
        Some([0, 0]) => true,
        Some(_) if ip_header.len() >= 20 => {
            fold(ones_sum(udp, pseudo_header_sum(ip_header, 17, udp.len()))) == 0
        }
        _ => false,
    }
}

/// The destination port of a UDP header at the start of `udp`.
pub fn destination_port(udp: &[u8]) -> Option<u16> {
    let port = udp.get(2..4)?;
    (udp.len() >= UDP_HEADER_LEN).then(|| u16::from_be_bytes([port[0], port[1]]))
}

/// The source port of a UDP header at the start of `udp`.
pub fn source_port(udp: &[u8]) -> Option<u16> {
    let port = udp.get(0..2)?;
    (udp.len() >= UDP_HEADER_LEN).then(|| u16::from_be_bytes([port[0], port[1]]))
}

/// A peer's outer address and UDP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    /// The outer IPv4 address packets reach it at.
    pub address: Ipv4Addr,
    /// Its UDP port (host byte order).
    pub port: u16,
}

impl PeerAddr {
    fn pack(self) -> u64 {
        // Bit 48 marks a value, so that no address packs to the empty cell.
        1 << 48 | u64::from(u32::from(self.address)) << 16 | u64::from(self.port)
    }

    fn unpack(v: u64) -> Option<PeerAddr> {
        (v >> 48 == 1).then(|| PeerAddr {
            address: Ipv4Addr::from((v >> 16) as u32),
            port: v as u16,
        })
    }
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.address, self.port)
    }
}

/// Where one tunnel end's peer is now: written when an authenticated
/// packet shows it moved, read by the workers when [`Peers::epoch`] says
/// something did.
#[derive(Debug)]
pub struct Peer {
    current: AtomicU64,
    /// The peer as configured, which keys the cell.
    pub configured: PeerAddr,
}

impl Peer {
    /// Where the peer is now: the last address an authenticated packet
    /// showed, or the configured one if none moved it.
    pub fn current(&self) -> PeerAddr {
        PeerAddr::unpack(self.current.load(Ordering::Acquire)).unwrap_or(self.configured)
    }
}

/// Which tunnel end a cell belongs to: our address and port, and the peer
/// as configured. The rekeyed SAs of a tunnel find the same cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PeerKey {
    local: Ipv4Addr,
    local_port: u16,
    configured: PeerAddr,
}

/// Every UDP-encapsulated peer of a gateway. The cells themselves are
/// shared: an SA installed on one worker reaches the others as copies
/// (`Gateway::adopt_sa`) that hold the same cell, and a fork copies the
/// map. The map is only read or grown where SAs are installed.
#[derive(Debug, Clone, Default)]
pub struct Peers {
    cells: HashMap<PeerKey, Arc<Peer>>,
    /// Bumped on every move, shared by every worker: one whose last look
    /// saw another value re-reads its SAs' cells.
    epoch: Arc<AtomicU64>,
}

impl Peers {
    /// The cell of the tunnel end `local` → `remote` over `encap`, made on
    /// first use.
    pub fn cell(&mut self, local: Ipv4Addr, remote: Ipv4Addr, encap: UdpEncap) -> Arc<Peer> {
        let configured = PeerAddr {
            address: remote,
            port: encap.remote_port,
        };
        let key = PeerKey {
            local,
            local_port: encap.local_port,
            configured,
        };
        self.cells
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Peer {
                    current: AtomicU64::new(0),
                    configured,
                })
            })
            .clone()
    }

    /// Where the peer of the tunnel end `local` → `remote` over `encap` is
    /// now, if the gateway has SAs for it.
    pub fn current(&self, local: Ipv4Addr, remote: Ipv4Addr, encap: UdpEncap) -> Option<PeerAddr> {
        let key = PeerKey {
            local,
            local_port: encap.local_port,
            configured: PeerAddr {
                address: remote,
                port: encap.remote_port,
            },
        };
        self.cells.get(&key).map(|cell| cell.current())
    }

    /// Records that `peer` is now at `to`.
    pub fn moved(&self, peer: &Peer, to: PeerAddr) {
        peer.current.store(to.pack(), Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// How many moves every worker's peers have made so far: a worker
    /// that saw another value last re-reads its SAs' cells.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_told_apart_as_rfc_3948_says() {
        assert_eq!(Payload::of(&[0xff]), Payload::Keepalive);
        assert_eq!(Payload::of(&[0, 0, 0, 0, 0x21, 0x20]), Payload::Ike);
        assert_eq!(Payload::of(&[0, 0, 1, 0, 0, 0, 0, 1]), Payload::Esp);
        // A keepalive is exactly one byte; other short payloads are nothing.
        assert_eq!(Payload::of(&[0xff, 0xff]), Payload::Malformed);
        assert_eq!(Payload::of(&[]), Payload::Malformed);
        assert_eq!(Payload::of(&[0, 0, 0]), Payload::Malformed);
        assert_eq!(Payload::of(&[1, 2, 3, 4, 5, 6, 7]), Payload::Malformed);
    }

    #[test]
    fn udp_checksums_are_right_or_zero() {
        use smoltcp::wire::{IpAddress, Ipv4Packet, UdpPacket};
        let mut p = [0u8; 20 + 8 + 13];
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
            ip.set_version(4);
            ip.set_header_len(20);
            ip.set_src_addr(Ipv4Addr::new(10, 0, 0, 1));
            ip.set_dst_addr(Ipv4Addr::new(10, 0, 0, 2));
        }
        p[20..24].copy_from_slice(&[0x11, 0x94, 0x11, 0x94]);
        p[24..26].copy_from_slice(&21u16.to_be_bytes());
        for (i, b) in p[28..].iter_mut().enumerate() {
            *b = 0xa0 + i as u8;
        }
        let (ip, udp) = p.split_at(20);
        assert!(udp_checksum_ok(ip, udp), "zero: none computed");
        let (src, dst) = (IpAddress::v4(10, 0, 0, 1), IpAddress::v4(10, 0, 0, 2));
        UdpPacket::new_unchecked(&mut p[20..]).fill_checksum(&src, &dst);
        let (ip, udp) = p.split_at(20);
        assert!(udp_checksum_ok(ip, udp), "right, odd length");
        // Every single-bit error but in the length field (which smoltcp
        // trusts to slice by, and the gateway checks first).
        for bit in (0..udp.len() * 8).filter(|b| !(32..48).contains(b)) {
            let mut bad = udp.to_vec();
            bad[bit / 8] ^= 1 << (bit % 8);
            let smoltcp = UdpPacket::new_unchecked(&bad[..]).verify_checksum(&src, &dst);
            assert_eq!(udp_checksum_ok(ip, &bad), smoltcp, "bit {bit}");
        }
        // The addresses are covered (the pseudo-header).
        let mut other = ip.to_vec();
        other[15] = 9;
        assert!(!udp_checksum_ok(&other, udp));
    }

    #[test]
    fn a_cell_is_shared_by_its_tunnel_end_and_follows_moves() {
        let mut peers = Peers::default();
        let local = Ipv4Addr::new(10, 0, 0, 1);
        let remote = Ipv4Addr::new(10, 0, 0, 2);
        let a = peers.cell(local, remote, UdpEncap::NAT_T);
        let b = peers.cell(local, remote, UdpEncap::NAT_T);
        let other = peers.cell(
            local,
            remote,
            UdpEncap {
                local_port: 4501,
                remote_port: 4500,
            },
        );
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &other));
        assert_eq!(a.current(), a.configured);
        let before = peers.epoch();
        let to = PeerAddr {
            address: Ipv4Addr::new(198, 51, 100, 7),
            port: 61_000,
        };
        peers.moved(&a, to);
        assert_eq!(b.current(), to);
        assert_eq!(other.current(), other.configured);
        assert_ne!(peers.epoch(), before);
        // Every address and port survives the packing, 0.0.0.0:0 included.
        for p in [
            PeerAddr {
                address: Ipv4Addr::UNSPECIFIED,
                port: 0,
            },
            PeerAddr {
                address: Ipv4Addr::BROADCAST,
                port: u16::MAX,
            },
        ] {
            assert_eq!(PeerAddr::unpack(p.pack()), Some(p));
        }
    }
}
