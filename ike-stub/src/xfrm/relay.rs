//! The IKE relay's classification: which UDP datagrams arriving on the
//! outside interface belong to the IKE daemon of the keying namespace.
//!
//! Owns the decisions alone, as pure functions: which datagrams from the
//! outside go to the daemon ([`classify`]), and which of the daemon's
//! packets may leave by the outside interface ([`from_daemon`]). Moving
//! them between the outside interface and the keying namespace is the
//! relay's driver (`src/ike_relay.rs`). Must not touch ESP: ESP in UDP on
//! the NAT-T port is the gateway's, never the daemon's.

use dataplane::nat::{Payload, NON_ESP_MARKER};

/// The length of an IKE header (RFC 7296 §3.1): nothing shorter is IKE.
pub const IKE_HEADER_LEN: usize = 28;

/// The daemon's ports: IKE (500) and NAT traversal (4500), as charon's
/// `port` and `port_nat_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayPorts {
    pub ike: u16,
    pub nat_t: u16,
}

impl Default for RelayPorts {
    fn default() -> Self {
        RelayPorts {
            ike: 500,
            nat_t: 4500,
        }
    }
}

/// What becomes of a UDP datagram from the outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relay {
    /// IKE on the IKE port: to the daemon as it came.
    Ike,
    /// IKE behind the non-ESP marker on the NAT-T port (RFC 3948 §2.2):
    /// to the daemon as it came (its socket takes the marker off).
    IkeNatT,
    /// A NAT keepalive on the NAT-T port (RFC 3948 §2.3): the sender's
    /// NAT mapping is kept; nobody answers it, so it goes nowhere.
    Keepalive,
    /// ESP in UDP on the NAT-T port: the gateway's own, never relayed.
    Esp,
    /// Another port: not the daemon's.
    NotIke,
    /// On a daemon port but too short to be what it would have to be:
    /// dropped, not handed to the daemon.
    Malformed,
}

/// Classifies a UDP `payload` that arrived for `dst_port`.
pub fn classify(ports: RelayPorts, dst_port: u16, payload: &[u8]) -> Relay {
    if dst_port == ports.nat_t {
        return match Payload::of(payload) {
            Payload::Keepalive => Relay::Keepalive,
            Payload::Ike if payload.len() >= NON_ESP_MARKER.len() + IKE_HEADER_LEN => Relay::IkeNatT,
            Payload::Esp => Relay::Esp,
            Payload::Ike | Payload::Malformed => Relay::Malformed,
        };
    }
    if dst_port == ports.ike {
        // No marker on port 500: the header starts with the initiator's
        // SPI, never zero (RFC 7296 §3.1).
        return if payload.len() >= IKE_HEADER_LEN && payload[..8] != [0; 8] {
            Relay::Ike
        } else {
            Relay::Malformed
        };
    }
    Relay::NotIke
}

/// A datagram of the daemon's that may leave: its ports (ours, the
/// peer's), the peer's address and the UDP payload, as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outgoing<'a> {
    pub ports: (u16, u16),
    pub to: std::net::Ipv4Addr,
    pub payload: &'a [u8],
}

/// Why a packet of the daemon's side was not sent out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Held {
    /// Not an IPv4 packet this relay can read (IPv6, or a broken header).
    NotIpv4,
    /// A fragment: the daemon's messages must fit the link (strongSwan's
    /// own IKE fragmentation does that).
    Fragment,
    /// Not UDP (the keying namespace's kernel may send ICMP or more).
    NotUdp,
    /// Not from the outside address: only the daemon's own IKE leaves.
    NotFromOutside,
    /// Not from the daemon's IKE or NAT-T port.
    NotDaemonPort,
}

/// Whether `packet`, read from the keying namespace's side of the relay,
/// is the daemon's IKE (from `outside`, from one of `ports`) and may be
/// sent to its peer.
pub fn from_daemon(
    ports: RelayPorts,
    outside: std::net::Ipv4Addr,
    packet: &[u8],
) -> Result<Outgoing<'_>, Held> {
    use smoltcp::wire::{IpProtocol, Ipv4Packet, UdpPacket};
    let ip = Ipv4Packet::new_checked(packet).map_err(|_| Held::NotIpv4)?;
    if ip.version() != 4 {
        return Err(Held::NotIpv4);
    }
    if ip.more_frags() || ip.frag_offset() != 0 {
        return Err(Held::Fragment);
    }
    if ip.next_header() != IpProtocol::Udp {
        return Err(Held::NotUdp);
    }
    if ip.src_addr() != outside {
        return Err(Held::NotFromOutside);
    }
    let to = ip.dst_addr();
    let udp = UdpPacket::new_checked(ip.payload()).map_err(|_| Held::NotUdp)?;
    let from_port = udp.src_port();
    if from_port != ports.ike && from_port != ports.nat_t {
        return Err(Held::NotDaemonPort);
    }
    Ok(Outgoing {
        ports: (from_port, udp.dst_port()),
        to,
        payload: udp.payload(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ike_header() -> Vec<u8> {
        let mut h = vec![0u8; IKE_HEADER_LEN];
        h[..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        h[17] = 0x20; // version 2.0
        h[18] = 34; // IKE_SA_INIT
        h
    }

    #[test]
    fn ike_on_500_goes_to_the_daemon() {
        let p = RelayPorts::default();
        assert_eq!(classify(p, 500, &ike_header()), Relay::Ike);
        assert_eq!(classify(p, 500, &ike_header()[..27]), Relay::Malformed);
        assert_eq!(
            classify(p, 500, &[0; 28]),
            Relay::Malformed,
            "a zero initiator SPI"
        );
    }

    #[test]
    fn on_4500_the_marker_tells_ike_from_esp_and_keepalives() {
        let p = RelayPorts::default();
        let mut marked = NON_ESP_MARKER.to_vec();
        marked.extend(ike_header());
        assert_eq!(classify(p, 4500, &marked), Relay::IkeNatT);
        assert_eq!(classify(p, 4500, &marked[..31]), Relay::Malformed);
        assert_eq!(classify(p, 4500, &[0xff]), Relay::Keepalive);
        let esp = [0xc0, 0, 0, 1, 0, 0, 0, 1, 0xaa, 0xbb];
        assert_eq!(classify(p, 4500, &esp), Relay::Esp);
        assert_eq!(classify(p, 4500, &esp[..7]), Relay::Malformed);
        assert_eq!(classify(p, 4500, &[]), Relay::Malformed);
    }

    #[test]
    fn other_ports_and_other_daemon_ports() {
        let p = RelayPorts {
            ike: 1500,
            nat_t: 14500,
        };
        assert_eq!(classify(p, 500, &ike_header()), Relay::NotIke);
        assert_eq!(classify(p, 1500, &ike_header()), Relay::Ike);
        assert_eq!(classify(p, 14500, &[0xff]), Relay::Keepalive);
        assert_eq!(classify(RelayPorts::default(), 53, &[0xff]), Relay::NotIke);
    }

    /// An IPv4/UDP packet as the keying namespace's kernel writes it.
    fn daemon_packet(src: [u8; 4], sport: u16, dport: u16, payload: &[u8], frag: u16) -> Vec<u8> {
        let mut p = vec![0u8; 28 + payload.len()];
        p[0] = 0x45;
        let total = p.len() as u16;
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p[6..8].copy_from_slice(&frag.to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&[192, 0, 2, 2]);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[28..].copy_from_slice(payload);
        p
    }

    #[test]
    fn only_the_daemons_ike_from_the_outside_address_leaves() {
        let ports = RelayPorts::default();
        let outside = std::net::Ipv4Addr::new(192, 0, 2, 1);
        let ike = ike_header();
        let p = daemon_packet([192, 0, 2, 1], 500, 500, &ike, 0);
        assert_eq!(
            from_daemon(ports, outside, &p),
            Ok(Outgoing {
                ports: (500, 500),
                to: std::net::Ipv4Addr::new(192, 0, 2, 2),
                payload: &ike[..]
            })
        );
        let p = daemon_packet([192, 0, 2, 1], 4500, 4500, &[0xff], 0);
        assert_eq!(
            from_daemon(ports, outside, &p).map(|o| o.payload),
            Ok(&[0xff][..]),
            "a keepalive"
        );
        let p = daemon_packet([192, 0, 2, 9], 500, 500, &ike, 0);
        assert_eq!(from_daemon(ports, outside, &p), Err(Held::NotFromOutside));
        let p = daemon_packet([192, 0, 2, 1], 53, 500, &ike, 0);
        assert_eq!(from_daemon(ports, outside, &p), Err(Held::NotDaemonPort));
        let p = daemon_packet([192, 0, 2, 1], 500, 500, &ike, 0x2000);
        assert_eq!(from_daemon(ports, outside, &p), Err(Held::Fragment));
        let mut icmp = daemon_packet([192, 0, 2, 1], 500, 500, &ike, 0);
        icmp[9] = 1;
        assert_eq!(from_daemon(ports, outside, &icmp), Err(Held::NotUdp));
        assert_eq!(from_daemon(ports, outside, &[0x60; 40]), Err(Held::NotIpv4));
        assert_eq!(from_daemon(ports, outside, &p[..10]), Err(Held::NotIpv4));
    }
}
