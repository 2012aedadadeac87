//! Arbitrary frames arriving at a gateway whose tunnel is UDP-encapsulated
//! (RFC 3948): UDP on port 4500 as ESP, keepalive or IKE behind the non-ESP
//! marker, UDP fragments reassembled before that is decided, raw ESP to
//! the UDP SA, and peer learning (with the ICV bypass, every well-formed
//! packet authenticates, so moves happen). The first byte picks the
//! proposal (`& 1`: ChaCha20-Poly1305, else AES-GCM) and ESN (`& 2`); the
//! rest is raw IPv4 frames for the outside port separated by `FRAG`.
//!
//! Checks: nothing panics, every buffer comes back, the counters balance,
//! and the peer moves no more often than packets authenticated.
#![no_main]

use std::time::Duration;

use accel::Algorithm;
use dataplane::{LinkLayer, PacketPool, Port};
use ike_stub::builder::Encap;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

const SEPARATOR: &[u8] = b"FRAG";

fuzz_target!(|data: &[u8]| {
    let Some((&selector, mut rest)) = data.split_first() else {
        return;
    };
    let alg = if selector & 1 != 0 {
        Algorithm::ChaCha20Poly1305
    } else {
        Algorithm::Aes128Gcm16
    };
    let mut config = common::tunnel_builder(alg, false, selector & 2 != 0, false);
    config.tunnels[0].encap = Some(Encap::Udp);
    let mut gateway = common::build(&common::parse(&config), LinkLayer::RawIp);
    let mut pool = PacketPool::new(16);
    let mut outputs = Vec::new();
    for i in 0..32u64 {
        let (frame, more) = match rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(at) => (&rest[..at], Some(&rest[at + SEPARATOR.len()..])),
            None => (rest, None),
        };
        if let Some(mut buf) = pool.alloc() {
            if buf.fill(frame) {
                let now = Duration::from_millis(i * 7);
                let replies = drivers::drive::handle_frame(&mut gateway, now, Port::Outside, buf, &mut pool);
                for (buf, _) in replies {
                    pool.free(buf);
                }
                gateway.handle_timeout(now, &mut outputs, &mut pool);
                for (buf, _) in outputs.drain(..) {
                    pool.free(buf);
                }
            } else {
                pool.free(buf);
            }
        }
        match more {
            Some(more) => rest = more,
            None => break,
        }
    }
    // A move needs an authenticated packet: one decapsulated, a dummy, or
    // one whose inner packet its SA's selectors then refused.
    let stats = *gateway.stats();
    let authenticated =
        stats.decapsulated + stats.dummy_packets + stats.drops.get(dataplane::DropReason::PolicyMismatch);
    assert!(stats.nat_peer_moved <= authenticated, "{stats:?}");
    common::finish(&mut gateway, outputs, &mut pool);
});
