//! The IKE relay's decisions (`ike_stub::xfrm::relay`): what a peer sends
//! to a daemon port, and what the keying namespace hands back.
//!
//! Nothing panics; what may leave (IPv4 or IPv6) comes from an outside
//! address and a daemon port, its payload lies within the packet; a
//! datagram from the outside is never taken for the daemon's unless it is
//! on a daemon port.
#![no_main]

use std::net::{Ipv4Addr, Ipv6Addr};

use ike_stub::xfrm::relay::{classify, from_daemon, udp_endpoints, Outside, Relay, RelayPorts};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ports = RelayPorts::default();
    let outside = Outside {
        v4: Ipv4Addr::new(192, 0, 2, 1),
        v6: Some(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    };
    if let Ok(out) = from_daemon(ports, outside, data) {
        assert!(out.ports.0 == ports.ike || out.ports.0 == ports.nat_t);
        assert!(out.payload.len() <= data.len());
        let at = out.payload.as_ptr() as usize - data.as_ptr() as usize;
        assert!(at + out.payload.len() <= data.len());
        let read = udp_endpoints(data).expect("what may leave is UDP");
        assert!(outside.is(read.from.0));
        assert_eq!(read.to.0, out.to);
    }
    if let [hi, lo, payload @ ..] = data {
        let port = u16::from_be_bytes([*hi, *lo]);
        let verdict = classify(ports, port, payload);
        if port != ports.ike && port != ports.nat_t {
            assert_eq!(verdict, Relay::NotIke);
        }
        if matches!(verdict, Relay::Ike | Relay::IkeNatT) {
            assert!(payload.len() >= ike_stub::xfrm::relay::IKE_HEADER_LEN);
        }
    }
});
