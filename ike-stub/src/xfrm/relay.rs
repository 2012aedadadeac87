//! The IKE relay's classification: which UDP datagrams arriving on the
//! outside interface belong to the IKE daemon of the keying namespace.
//!
//! Owns the decisions alone, as pure functions: which datagrams from the
//! outside go to the daemon ([`classify`]), and which of the daemon's
//! packets may leave by the outside interface ([`from_daemon`]). Moving
//! them between the outside interface and the keying namespace is the
//! relay's driver (`src/ike_relay.rs`). Must not touch ESP: ESP in UDP on
//! the NAT-T port is the gateway's, never the daemon's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dataplane::nat::{Payload, NON_ESP_MARKER};

/// The length of an IKE header (RFC 7296 §3.1): nothing shorter is IKE.
pub const IKE_HEADER_LEN: usize = 28;

/// The daemon's ports: IKE (500) and NAT traversal (4500), as charon's
/// `port` and `port_nat_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayPorts {
    /// The IKE port: plain IKE, no marker (500).
    pub ike: u16,
    /// The NAT traversal port: IKE behind the non-ESP marker, keepalives
    /// and the gateway's ESP in UDP (4500).
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

/// The relay's outside addresses: the gateway's IPv4 one, and its IPv6
/// one when the outside interface has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outside {
    /// The outside interface's IPv4 address.
    pub v4: Ipv4Addr,
    /// Its IPv6 address (`address6`), if it has one.
    pub v6: Option<Ipv6Addr>,
}

impl Outside {
    /// Whether `addr` is one of them.
    pub fn is(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => a == self.v4,
            IpAddr::V6(a) => self.v6 == Some(a),
        }
    }
}

/// A datagram of the daemon's that may leave: its ports (ours, the
/// peer's), the peer's address and the UDP payload, as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outgoing<'a> {
    /// Our port (the daemon's) and the peer's.
    pub ports: (u16, u16),
    /// The peer's address.
    pub to: IpAddr,
    /// The UDP payload, marker included on the NAT-T port.
    pub payload: &'a [u8],
}

/// Why a packet of the daemon's side was not sent out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Held {
    /// Not an IPv4 or IPv6 packet this relay can read (a broken header, or
    /// IPv6 with extension headers, which IKE never needs).
    NotIp,
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

/// An IPv4 or IPv6 packet's UDP datagram: (source, port), (destination,
/// port) and payload. `Err(NotUdp)` for another protocol, `Fragment` for
/// an IPv4 fragment, `NotIp` for anything unreadable, and for IPv6 with
/// extension headers (a fragment header among them).
pub fn udp_endpoints(packet: &[u8]) -> Result<UdpEndpoints<'_>, Held> {
    use smoltcp::wire::{IpProtocol, Ipv4Packet, Ipv6Packet, UdpPacket};
    let (src, dst, udp) = match packet.first().map(|b| b >> 4) {
        Some(4) => {
            let ip = Ipv4Packet::new_checked(packet).map_err(|_| Held::NotIp)?;
            if ip.more_frags() || ip.frag_offset() != 0 {
                return Err(Held::Fragment);
            }
            if ip.next_header() != IpProtocol::Udp {
                return Err(Held::NotUdp);
            }
            (IpAddr::V4(ip.src_addr()), IpAddr::V4(ip.dst_addr()), ip.payload())
        }
        Some(6) => {
            let ip = Ipv6Packet::new_checked(packet).map_err(|_| Held::NotIp)?;
            match ip.next_header() {
                IpProtocol::Udp => {}
                IpProtocol::HopByHop
                | IpProtocol::Ipv6Route
                | IpProtocol::Ipv6Frag
                | IpProtocol::Ipv6Opts => return Err(Held::NotIp),
                _ => return Err(Held::NotUdp),
            }
            let (src, dst) = (ip.src_addr(), ip.dst_addr());
            let payload = &packet[40..40 + usize::from(ip.payload_len())];
            (IpAddr::V6(src), IpAddr::V6(dst), payload)
        }
        _ => return Err(Held::NotIp),
    };
    let udp = UdpPacket::new_checked(udp).map_err(|_| Held::NotUdp)?;
    Ok(UdpEndpoints {
        from: (src, udp.src_port()),
        to: (dst, udp.dst_port()),
        payload: udp.payload(),
    })
}

/// What [`udp_endpoints`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpEndpoints<'a> {
    /// Source address and port.
    pub from: (IpAddr, u16),
    /// Destination address and port.
    pub to: (IpAddr, u16),
    /// The UDP payload, as long as the UDP length field says.
    pub payload: &'a [u8],
}

/// Whether `packet`, read from the keying namespace's side of the relay,
/// is the daemon's IKE (from an `outside` address, from one of `ports`)
/// and may be sent to its peer.
pub fn from_daemon(ports: RelayPorts, outside: Outside, packet: &[u8]) -> Result<Outgoing<'_>, Held> {
    let udp = udp_endpoints(packet)?;
    if !outside.is(udp.from.0) {
        return Err(Held::NotFromOutside);
    }
    let from_port = udp.from.1;
    if from_port != ports.ike && from_port != ports.nat_t {
        return Err(Held::NotDaemonPort);
    }
    Ok(Outgoing {
        ports: (from_port, udp.to.1),
        to: udp.to.0,
        payload: udp.payload,
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

    fn outside() -> Outside {
        Outside {
            v4: Ipv4Addr::new(192, 0, 2, 1),
            v6: Some("2001:db8::1".parse().unwrap()),
        }
    }

    #[test]
    fn only_the_daemons_ike_from_the_outside_address_leaves() {
        let ports = RelayPorts::default();
        let outside = outside();
        let ike = ike_header();
        let p = daemon_packet([192, 0, 2, 1], 500, 500, &ike, 0);
        assert_eq!(
            from_daemon(ports, outside, &p),
            Ok(Outgoing {
                ports: (500, 500),
                to: Ipv4Addr::new(192, 0, 2, 2).into(),
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
        assert_eq!(
            from_daemon(ports, outside, &[0x60; 40]),
            Err(Held::NotIp),
            "IPv6 whose payload runs past it"
        );
        assert_eq!(from_daemon(ports, outside, &p[..10]), Err(Held::NotIp));
        assert_eq!(from_daemon(ports, outside, &[0x50; 40]), Err(Held::NotIp));
    }

    /// An IPv6/UDP packet from `src` to 2001:db8::2, with `next` as the
    /// fixed header's next header.
    fn daemon_packet6(src: &str, sport: u16, next: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 48 + payload.len()];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[6] = next;
        p[7] = 64;
        p[8..24].copy_from_slice(&src.parse::<Ipv6Addr>().unwrap().octets());
        p[24..40].copy_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        p[40..42].copy_from_slice(&sport.to_be_bytes());
        p[42..44].copy_from_slice(&500u16.to_be_bytes());
        p[44..46].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[48..].copy_from_slice(payload);
        p
    }

    /// Over IPv6 the same: the daemon's IKE from the outside IPv6
    /// address leaves; another source, port, protocol or a packet with
    /// extension headers does not; nothing leaves over IPv6 from a
    /// gateway without an outside IPv6 address.
    #[test]
    fn over_ipv6_only_the_daemons_ike_from_the_outside_address_leaves() {
        let ports = RelayPorts::default();
        let ike = ike_header();
        let p = daemon_packet6("2001:db8::1", 500, 17, &ike);
        assert_eq!(
            from_daemon(ports, outside(), &p),
            Ok(Outgoing {
                ports: (500, 500),
                to: "2001:db8::2".parse::<Ipv6Addr>().unwrap().into(),
                payload: &ike[..]
            })
        );
        let v4_only = Outside {
            v6: None,
            ..outside()
        };
        assert_eq!(from_daemon(ports, v4_only, &p), Err(Held::NotFromOutside));
        let p = daemon_packet6("2001:db8::9", 500, 17, &ike);
        assert_eq!(from_daemon(ports, outside(), &p), Err(Held::NotFromOutside));
        let p = daemon_packet6("2001:db8::1", 53, 17, &ike);
        assert_eq!(from_daemon(ports, outside(), &p), Err(Held::NotDaemonPort));
        let p = daemon_packet6("2001:db8::1", 500, 58, &ike);
        assert_eq!(from_daemon(ports, outside(), &p), Err(Held::NotUdp));
        let p = daemon_packet6("2001:db8::1", 500, 44, &ike);
        assert_eq!(
            from_daemon(ports, outside(), &p),
            Err(Held::NotIp),
            "a fragment header"
        );
        assert_eq!(from_daemon(ports, outside(), &p[..39]), Err(Held::NotIp));
    }
}
