//! Arbitrary frames arriving on the inside port: classification and
//! encapsulation must never panic, and whatever is encapsulated must
//! decapsulate at the peer to the same packet.
#![no_main]

use dataplane::{LinkLayer, PacketPool, Port, Verdict};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|frame: &[u8]| {
    let mut a = common::gateway("site-a.toml", LinkLayer::RawIp);
    let mut b = common::gateway("site-b.toml", LinkLayer::RawIp);
    let mut pool = PacketPool::new(1);
    let Some(mut buf) = pool.alloc() else { return };
    if !buf.fill(frame) {
        return;
    }
    let Some((buf, verdict)) = a
        .handle_frame(std::time::Duration::ZERO, Port::Inside, buf, &mut pool)
        .pop()
    else {
        panic!("every frame comes back");
    };
    if verdict == Verdict::Forward(Port::Outside) && a.stats().encapsulated == 1 {
        let output = b.handle_frame(std::time::Duration::ZERO, Port::Outside, buf, &mut pool).pop();
        assert!(
            !matches!(
                output,
                Some((_, Verdict::Drop(dataplane::DropReason::AuthFailed)))
            ),
            "our own ESP failed to verify"
        );
    }
});
