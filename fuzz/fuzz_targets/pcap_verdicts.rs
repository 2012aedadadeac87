//! Per-frame verdicts (`espgw pcap --verdicts`): any bytes are read as a
//! pcap file and run through a gateway with the verdict lines on. The
//! capture header's snaplen picks the set-up: bit 0 site B from the outside
//! (else site A from the inside), bit 1 the `sec` engine model, whose
//! completions come later (else `soft`).
//!
//! Checks, for every capture that reads through: one JSON line per frame,
//! in frame order, each with a known verdict and a reason exactly when
//! dropped; per drop reason, the lines (with their `more_drops`) equal the
//! counters; the frames they say were transmitted are the frames sent; and
//! the driver's own invariants (every buffer back, counters balanced).
#![no_main]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use accel::{EngineKind, EngineSpec, Style};
use dataplane::{DropReason, Port};
use drivers::pcap::{self, PcapDriverError};
use ike_stub::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((reader, link)) = pcap::open(data) else {
        return;
    };
    let snaplen = reader.header().snaplen;
    let (config, port) = if snaplen & 1 == 1 {
        ("site-b.toml", Port::Outside)
    } else {
        ("site-a.toml", Port::Inside)
    };
    let kind = if snaplen & 2 == 2 {
        EngineKind::Sec
    } else {
        EngineKind::Soft
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(config);
    let config = Config::load(&path).expect("shipped config is valid");
    let engine = accel::build_engine(&EngineSpec {
        kind,
        ..EngineSpec::default()
    })
    .expect("the engine builds");
    let mut gateway = dataplane::Gateway::with_commands(
        config.setup(link, Style::Async),
        engine,
        &config.commands(),
        Duration::ZERO,
    )
    .expect("config installs");
    let mut lines = Vec::new();
    let run = match pcap::run_with_verdicts(&mut gateway, port, reader, Vec::new(), &mut lines) {
        Ok(run) => run,
        Err(e @ (PcapDriverError::BuffersLost(_) | PcapDriverError::PoolExhausted)) => panic!("{e}"),
        Err(_) => return,
    };
    let stats = gateway.stats();
    assert!(stats.balanced(), "{stats:?}");
    let text = std::str::from_utf8(&lines).expect("verdict lines are UTF-8");
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    let mut transmitted = 0;
    let mut count = 0u64;
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).expect("each line is JSON");
        assert_eq!(v["frame"], i as u64, "lines in frame order, one each: {line}");
        assert_eq!(v["port"], port.name());
        let verdict = v["verdict"].as_str().expect("a verdict");
        let reason = v.get("reason").and_then(|r| r.as_str());
        match verdict {
            "dropped" => {
                let reason = reason.expect("a dropped frame has a reason");
                assert!(DropReason::from_name(reason).is_some(), "{line}");
                *reasons.entry(reason.to_owned()).or_default() += 1;
            }
            "forwarded" => {
                assert!(reason.is_none(), "{line}");
                assert!(v["transmitted"].as_u64() >= Some(1), "forwarded, so sent: {line}");
            }
            "consumed" => assert!(reason.is_none(), "{line}"),
            other => panic!("unknown verdict {other}: {line}"),
        }
        for r in v["more_drops"].as_array().into_iter().flatten() {
            *reasons
                .entry(r.as_str().expect("a reason").to_owned())
                .or_default() += 1;
        }
        transmitted += v["transmitted"].as_u64().expect("a count");
        count += 1;
    }
    assert_eq!(count, run.frames_in, "one line per frame");
    let counted: BTreeMap<String, u64> = stats
        .drops
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(r, n)| (r.name().to_owned(), n))
        .collect();
    assert_eq!(reasons, counted, "lines and counters disagree");
    assert_eq!(transmitted, stats.tx_packets, "lines and frames sent disagree");
    assert_eq!(transmitted, run.frames_out);
});
