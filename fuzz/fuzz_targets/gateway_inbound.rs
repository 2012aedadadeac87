//! Arbitrary frames arriving on either port: Ethernet, ARP, IPv4 and ESP
//! parsing, ICMP, IPv6 to the gateway (neighbour discovery and echo for
//! site-b's inside `address6`), reassembly, SA lookup, replay check, decapsulation (with
//! the ICV bypass, `accel/src/fuzzing.rs`, so trailers are reached) and
//! routing. Site B (configuration 0) also carries IPv6 over its tunnel
//! ([`common::site`]: the 6-in-4 tunnel `a-b-v6`), so ESP with an IPv6
//! packet inside reaches the inbound IPv6 selectors and delivery, and IPv6
//! from its hosts the transit checks and 6-in-4 encapsulation. The first
//! byte picks the configuration (`& 3`), the port
//! (`& 0x40`: inside) and the link layer (`& 0x80`: raw IP, else
//! Ethernet); the rest is one or more frames, separated by the four bytes
//! `FRAG` so that fragment sequences can reach reassembly.
//!
//! Checks: nothing panics, every buffer comes back to the pool and the
//! counters balance.
#![no_main]

use std::time::Duration;

use dataplane::{LinkLayer, PacketPool, Port};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

const SEPARATOR: &[u8] = b"FRAG";

fn split(mut data: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    while let Some(at) = data.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
        frames.push(&data[..at]);
        data = &data[at + SEPARATOR.len()..];
    }
    frames.push(data);
    frames
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let config = match selector & 3 {
        0 => None,
        1 => Some("algorithms/aes128-sha1-b.toml"),
        2 => Some("algorithms/3des-sha1-b.toml"),
        _ => Some("algorithms/null-b.toml"),
    };
    let link = if selector & 0x80 != 0 {
        LinkLayer::RawIp
    } else {
        LinkLayer::Ethernet
    };
    let port = if selector & 0x40 != 0 {
        Port::Inside
    } else {
        Port::Outside
    };
    let mut gateway = match config {
        Some(config) => common::gateway(config, link),
        None => common::site(false, link),
    };
    let mut pool = PacketPool::new(16);
    let mut outputs = Vec::new();
    for (i, frame) in split(rest).into_iter().take(32).enumerate() {
        let Some(mut buf) = pool.alloc() else { break };
        if !buf.fill(frame) {
            pool.free(buf);
            continue;
        }
        let now = Duration::from_millis(i as u64);
        for (buf, _) in drivers::drive::handle_frame(&mut gateway, now, port, buf, &mut pool) {
            pool.free(buf);
        }
        gateway.handle_timeout(now, &mut outputs, &mut pool);
        for (buf, _) in outputs.drain(..) {
            pool.free(buf);
        }
    }
    common::finish(&mut gateway, outputs, &mut pool);
});
