//! ESP decapsulation per algorithm. The first byte picks one of the seven
//! proposals, tunnel or transport mode and ESN on or off; the rest is an
//! IPv4 packet arriving on site B's outside port (its total length and
//! header checksum are fixed up, so that mutations reach ESP). The build
//! has the ICV bypass (`accel/src/fuzzing.rs`): the "ciphertext" is taken
//! as plaintext, so the bytes reach the padding, trailer, next-header and
//! inner-packet checks and the inbound policy check.
//!
//! Checks: one verdict per frame, every buffer back, counters balanced,
//! and whatever is forwarded inside is an IPv4 packet the SA's selectors
//! admit (192.168.1.0/24 to 192.168.2.0/24).
#![no_main]

use std::cell::RefCell;
use std::time::Duration;

use accel::Algorithm;
use dataplane::{LinkLayer, PacketPool, Port, Verdict};
use ike_stub::Config;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

/// Number of (algorithm, mode, ESN) combinations.
pub const COMBINATIONS: usize = Algorithm::ALL.len() * 4;

thread_local! {
    static CONFIGS: RefCell<Vec<Option<Config>>> = RefCell::new(vec![None; COMBINATIONS]);
}

fn config(selector: usize) -> Config {
    let selector = selector % COMBINATIONS;
    let alg = Algorithm::ALL[selector % Algorithm::ALL.len()];
    let transport = (selector / Algorithm::ALL.len()) % 2 == 1;
    let esn = selector / (Algorithm::ALL.len() * 2) == 1;
    CONFIGS.with(|c| {
        c.borrow_mut()[selector]
            .get_or_insert_with(|| common::parse(&common::tunnel_builder(alg, transport, esn, false)))
            .clone()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, packet)) = data.split_first() else {
        return;
    };
    let mut gateway = common::build(&config(usize::from(selector)), LinkLayer::RawIp);
    let mut pool = PacketPool::new(8);
    let mut packet = packet.to_vec();
    common::fix_ipv4_header(&mut packet);
    let Some(mut buf) = pool.alloc() else { return };
    if !buf.fill(&packet) {
        pool.free(buf);
        return;
    }
    let outputs = drivers::drive::handle_frame(&mut gateway, Duration::ZERO, Port::Outside, buf, &mut pool);
    assert!(!outputs.is_empty(), "the frame came back");
    if std::env::var_os("FUZZ_DEBUG").is_some() {
        let verdicts: Vec<_> = outputs.iter().map(|(_, v)| v).collect();
        eprintln!("selector {selector}: {verdicts:?}");
    }
    for (buf, verdict) in &outputs {
        if *verdict == Verdict::Forward(Port::Inside) {
            let p = buf.data();
            assert!(p.len() >= 20 && p[0] >> 4 == 4, "forwarded a non-IPv4 packet");
            assert_eq!(gateway.stats().decapsulated, 1);
            assert_eq!(&p[12..15], &[192, 168, 1], "source outside the SA's selectors");
            assert_eq!(
                &p[16..19],
                &[192, 168, 2],
                "destination outside the SA's selectors"
            );
        }
    }
    common::finish(&mut gateway, outputs, &mut pool);
});
