//! The IKE relay's classification: which UDP datagrams arriving on the
//! outside interface belong to the IKE daemon of the keying namespace.
//!
//! Owns the decision alone, as a pure function of the destination port
//! and the payload; moving datagrams between the outside interface and
//! the keying namespace is the relay's driver, which is not built yet
//! (see `docs/keying-with-strongswan.md`). Must not touch ESP: ESP in UDP
//! on the NAT-T port is the gateway's, never the daemon's.

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
}
