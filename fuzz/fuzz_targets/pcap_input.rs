//! Capture input: any bytes are read as a pcap file and fed to a gateway,
//! or rejected with an error.
#![no_main]

use dataplane::io::pcap;
use dataplane::Port;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok((reader, link)) = pcap::open(data) else {
        return;
    };
    let mut gateway = common::gateway("site-a.toml", link);
    let mut out = Vec::new();
    let _ = pcap::run(&mut gateway, Port::Inside, reader, &mut out);
});
