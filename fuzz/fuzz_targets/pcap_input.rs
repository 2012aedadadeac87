//! Capture input: any bytes are read as a pcap file and fed to a gateway
//! (inside or outside port, by the input's length), or rejected with an
//! error. The driver must never lose a buffer or run out of them, and a
//! capture that ran through leaves the counters balanced, one received
//! frame per frame read.
#![no_main]

use dataplane::Port;
use drivers::pcap::{self, PcapDriverError};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok((reader, link)) = pcap::open(data) else {
        return;
    };
    let (config, port) = if data.len() % 2 == 0 {
        ("site-a.toml", Port::Inside)
    } else {
        ("site-b.toml", Port::Outside)
    };
    let mut gateway = common::gateway(config, link);
    let mut out = Vec::new();
    match pcap::run(&mut gateway, port, reader, &mut out) {
        Ok(run) => {
            let stats = gateway.stats();
            assert!(stats.balanced(), "{stats:?}");
            assert_eq!(run.frames_in, stats.rx_packets);
            if run.frames_out > 0 {
                assert!(pcap::open(&out[..]).is_ok(), "our own output does not read back");
            }
        }
        Err(e @ (PcapDriverError::BuffersLost(_) | PcapDriverError::PoolExhausted)) => panic!("{e}"),
        Err(_) => {}
    }
});
