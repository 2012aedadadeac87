//! Arbitrary frames arriving on the outside port: Ethernet, IPv4 and ESP
//! parsing, SA lookup, replay check, decapsulation and trailer checks. The
//! first byte picks the configuration and link layer.
#![no_main]

use dataplane::{LinkLayer, PacketPool, Port};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, frame)) = data.split_first() else {
        return;
    };
    let config = match selector % 3 {
        0 => "site-b.toml",
        1 => "algorithms/aes128-sha1-b.toml",
        _ => "algorithms/null-b.toml",
    };
    let link = if selector & 0x80 != 0 {
        LinkLayer::RawIp
    } else {
        LinkLayer::Ethernet
    };
    let mut gateway = common::gateway(config, link);
    let mut pool = PacketPool::new(1);
    let Some(mut buf) = pool.alloc() else { return };
    if buf.fill(frame) {
        let outputs = gateway.handle_frame(std::time::Duration::ZERO, Port::Outside, buf, &mut pool);
        assert_eq!(outputs.len(), 1, "every frame comes back once");
    }
    assert!(gateway.stats().balanced());
});
