//! Every engine, submission style and buffer policy gives the same bytes,
//! and faults inside the engine cost only the packets they hit.

mod common;

use std::time::Duration;

use accel::{Algorithm, BufferPolicy, DeviceProfile, EngineKind, EngineSpec, FaultPlan, SecConfig, Style};
use common::*;
use dataplane::gateway::Output;
use dataplane::{DropReason, Gateway, PacketPool, Port, Verdict};

/// Runs `frames` into `gw` on `from` in batches of 32 (so asynchronous
/// engines have many in flight), waits for all, and returns the outputs in
/// the order the gateway gave them, checking that every buffer came back.
fn through(gw: &mut Gateway, from: Port, frames: &[Vec<u8>]) -> Vec<(Verdict, Vec<u8>)> {
    let mut pool = PacketPool::new(64);
    let mut results = Vec::new();
    let mut out: Vec<Output> = Vec::new();
    let mut collect = |out: &mut Vec<Output>, pool: &mut PacketPool| {
        for (buf, verdict) in out.drain(..) {
            results.push((verdict, buf.data().to_vec()));
            pool.free(buf);
        }
    };
    for chunk in frames.chunks(32) {
        let mut bufs: Vec<_> = chunk
            .iter()
            .map(|f| {
                let mut buf = pool.alloc().expect("pool sized for two batches");
                assert!(buf.fill(f));
                buf
            })
            .collect();
        gw.handle_batch(Duration::ZERO, from, &mut bufs, &mut out, &mut pool);
        collect(&mut out, &mut pool);
        if pool.available() < 32 {
            drivers::drive::flush(gw, Duration::ZERO, &mut out, &mut pool);
            collect(&mut out, &mut pool);
        }
    }
    drivers::drive::flush(gw, Duration::ZERO, &mut out, &mut pool);
    collect(&mut out, &mut pool);
    assert_eq!(pool.in_use(), 0, "every buffer comes back to the pool");
    assert_eq!(gw.in_flight(), 0);
    results
}

fn combos() -> Vec<(EngineKind, Style, BufferPolicy)> {
    let mut list = Vec::new();
    for kind in [EngineKind::Soft, EngineKind::Sec] {
        for style in Style::ALL {
            for buffers in BufferPolicy::ALL {
                list.push((kind, style, buffers));
            }
        }
    }
    list
}

#[test]
fn every_engine_style_and_buffer_policy_gives_identical_bytes() {
    for alg in Algorithm::ALL {
        let frames: Vec<Vec<u8>> = (0..=1472)
            .step_by(if alg == Algorithm::TripleDesSha1 { 5 } else { 1 })
            .map(|n| udp_packet(HOST_A, HOST_B, n, n as u8))
            .collect();
        let mut reference: Option<Vec<(Verdict, Vec<u8>)>> = None;
        for (kind, style, buffers) in combos().into_iter().filter(|(k, ..)| engine_runs(*k, alg)) {
            let what = format!("{alg} {kind} {style} {buffers}");
            let mut pair = Pair::on(alg, "tunnel", false, &engine_spec(kind, buffers), style);
            pair.a.set_iv_seed(7);
            let esp = through(&mut pair.a, Port::Inside, &frames);
            assert_eq!(esp.len(), frames.len(), "{what}");
            assert!(
                esp.iter().all(|(v, _)| *v == Verdict::Forward(Port::Outside)),
                "{what}"
            );
            match &reference {
                None => reference = Some(esp.clone()),
                Some(r) => assert!(r == &esp, "{what}: ESP bytes differ from soft/sync/registered"),
            }
            let wire: Vec<Vec<u8>> = esp.into_iter().map(|(_, bytes)| bytes).collect();
            let back = through(&mut pair.b, Port::Outside, &wire);
            for ((verdict, inner), sent) in back.iter().zip(&frames) {
                assert_eq!(*verdict, Verdict::Forward(Port::Inside), "{what}");
                assert_eq!(inner, &after_hops(sent, 2), "{what}");
            }
            let counters = pair.a.engine_counters();
            assert_eq!(counters.submitted, counters.completed, "{what}");
            let per_packet = if style != Style::Async && !alg.is_aead() {
                2
            } else {
                1
            };
            assert_eq!(
                counters.submitted,
                (frames.len() * per_packet) as u64,
                "{what}: descriptors per packet"
            );
            if buffers == BufferPolicy::PerRequest {
                assert_eq!(
                    counters.bounce_buffers, counters.submitted,
                    "{what}: a bounce buffer per request"
                );
            } else {
                assert_eq!(counters.bounce_buffers, 0, "{what}");
            }
        }
    }
}

fn sec_pair(alg: Algorithm, style: Style, sec: SecConfig) -> Pair {
    let spec = EngineSpec {
        kind: EngineKind::Sec,
        buffers: sec.buffers,
        sec,
        ..EngineSpec::default()
    };
    Pair::on(alg, "tunnel", false, &spec, style)
}

fn frames(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| udp_packet(HOST_A, HOST_B, 100 + i, i as u8))
        .collect()
}

#[test]
fn a_failed_descriptor_drops_only_its_packet() {
    for style in Style::ALL {
        let mut pair = sec_pair(
            Algorithm::Aes128Sha1,
            style,
            SecConfig {
                faults: FaultPlan {
                    fail: vec![3],
                    ..FaultPlan::default()
                },
                ..SecConfig::default()
            },
        );
        let out = through(&mut pair.a, Port::Inside, &frames(10));
        let failed: Vec<_> = out
            .iter()
            .filter(|(v, _)| *v == Verdict::Drop(DropReason::EngineError))
            .collect();
        assert_eq!(failed.len(), 1, "{style}");
        assert_eq!(
            out.iter()
                .filter(|(v, _)| *v == Verdict::Forward(Port::Outside))
                .count(),
            9,
            "{style}"
        );
        assert_eq!(pair.a.stats().drops.get(DropReason::EngineError), 1);
        assert!(pair.a.stats().balanced());
        assert_eq!(pair.a.engine_counters().errors, 1);
    }
}

#[test]
fn a_lost_completion_times_out_and_its_buffer_comes_back() {
    let mut pair = sec_pair(
        Algorithm::Aes128Gcm16,
        Style::Async,
        SecConfig {
            faults: FaultPlan {
                drop_completion: vec![4],
                ..FaultPlan::default()
            },
            ..SecConfig::default()
        },
    );
    let out = through(&mut pair.a, Port::Inside, &frames(8));
    assert_eq!(out.len(), 8);
    assert_eq!(pair.a.stats().drops.get(DropReason::EngineTimeout), 1);
    assert_eq!(
        out.iter()
            .filter(|(v, _)| *v == Verdict::Forward(Port::Outside))
            .count(),
        7
    );
    // The gateway keeps serving.
    let later = through(&mut pair.a, Port::Inside, &frames(4));
    assert!(later.iter().all(|(v, _)| *v == Verdict::Forward(Port::Outside)));
}

#[test]
fn a_stalled_channel_times_out_its_work_and_recovers() {
    let mut pair = sec_pair(
        Algorithm::Aes128Gcm16,
        Style::Async,
        SecConfig {
            faults: FaultPlan {
                stall: Some((2, Duration::from_millis(1500))),
                ..FaultPlan::default()
            },
            ..SecConfig::default()
        },
    );
    let out = through(&mut pair.a, Port::Inside, &frames(6));
    assert_eq!(out.len(), 6, "every packet gets a verdict");
    let timed_out = pair.a.stats().drops.get(DropReason::EngineTimeout);
    assert!(timed_out >= 1, "the stalled descriptor timed out");
    assert_eq!(
        out.iter()
            .filter(|(v, _)| *v == Verdict::Forward(Port::Outside))
            .count() as u64
            + timed_out,
        6
    );
    assert!(pair.a.stats().balanced());
    let later = through(&mut pair.a, Port::Inside, &frames(4));
    assert!(
        later.iter().all(|(v, _)| *v == Verdict::Forward(Port::Outside)),
        "serves again after the stall"
    );
}

#[test]
fn a_full_ring_makes_the_packet_wait_not_vanish() {
    let mut pair = sec_pair(
        Algorithm::Aes128Sha1,
        Style::Async,
        SecConfig {
            channels: 1,
            fifo_depth: 2,
            profile: DeviceProfile::sec2_266mhz(),
            ..SecConfig::default()
        },
    );
    let out = through(&mut pair.a, Port::Inside, &frames(40));
    assert!(out.iter().all(|(v, _)| *v == Verdict::Forward(Port::Outside)));
    let counters = pair.a.engine_counters();
    assert!(counters.ring_full > 0, "the 2-deep FIFO filled up");
    assert!(counters.fifo_high_water <= 2);
}

#[test]
fn bus_bytes_are_counted_per_descriptor() {
    let payload = 100;
    for (style, descriptors) in [(Style::Async, 1u64), (Style::DualPass, 2)] {
        let mut pair = sec_pair(Algorithm::Aes128Sha1, style, SecConfig::default());
        let n = 10u64;
        let frames: Vec<_> = (0..n)
            .map(|i| udp_packet(HOST_A, HOST_B, payload, i as u8))
            .collect();
        through(&mut pair.a, Port::Inside, &frames);
        let bus = pair.a.engine_counters().bus;
        // Inner packet 128 bytes + 2 trailer → 144 with padding to 16.
        let cipher = 144u64;
        assert_eq!(bus.descriptors, n * descriptors * 64, "{style}");
        match style {
            // One walk: header, IV and ciphertext in; ciphertext and ICV out.
            Style::Async => {
                assert_eq!(bus.data_in, n * (8 + 16 + cipher));
                assert_eq!(bus.data_out, n * (cipher + 12));
            }
            // Dual-pass reads the data twice: cipher pass, then MAC pass.
            _ => {
                assert_eq!(bus.data_in, n * (cipher + 8 + 16 + cipher));
                assert_eq!(bus.data_out, n * (cipher + 12));
            }
        }
    }
}

#[test]
fn completion_modes_all_deliver() {
    use accel::Completion;
    for completion in [
        Completion::Interrupt,
        Completion::Polling,
        Completion::Coalesced {
            count: 8,
            timeout: Duration::from_micros(50),
        },
    ] {
        let mut pair = sec_pair(
            Algorithm::Aes256Gcm16,
            Style::Async,
            SecConfig {
                completion,
                ..SecConfig::default()
            },
        );
        let out = through(&mut pair.a, Port::Inside, &frames(50));
        assert!(
            out.iter().all(|(v, _)| *v == Verdict::Forward(Port::Outside)),
            "{}",
            completion.name()
        );
        let interrupts = pair.a.engine_counters().interrupts;
        match completion {
            Completion::Polling => assert_eq!(interrupts, 0),
            Completion::Interrupt => assert_eq!(interrupts, 50),
            Completion::Coalesced { .. } => assert!(interrupts <= 50 / 8 + 1, "{interrupts}"),
        }
    }
}

#[test]
fn stopping_with_descriptors_in_flight_returns_every_buffer() {
    // A slow modelled part keeps a whole batch in flight.
    let mut pair = sec_pair(
        Algorithm::Aes128Sha1,
        Style::Async,
        SecConfig {
            profile: DeviceProfile::sec2_266mhz(),
            ..SecConfig::default()
        },
    );
    let mut pool = PacketPool::new(64);
    let mut bufs: Vec<_> = frames(48)
        .iter()
        .map(|f| {
            let mut buf = pool.alloc().unwrap();
            buf.fill(f);
            buf
        })
        .collect();
    let mut out: Vec<Output> = Vec::new();
    pair.a
        .handle_batch(Duration::ZERO, Port::Inside, &mut bufs, &mut out, &mut pool);
    assert!(pair.a.in_flight() > 0, "work is still with the engine");
    drivers::drive::shutdown(&mut pair.a, Duration::ZERO, &mut out, &mut pool);
    assert_eq!(pair.a.in_flight(), 0);
    assert_eq!(out.len(), 48, "every packet got its verdict");
    assert!(
        out.iter().all(|(_, v)| *v == Verdict::Forward(Port::Outside)),
        "drained, not dropped"
    );
    for (buf, _) in out {
        pool.free(buf);
    }
    assert_eq!(pool.in_use(), 0);
    assert!(pair.a.stats().balanced());
}

#[test]
fn the_inline_engine_finishes_an_outbound_burst_within_the_call() {
    // Soft in its single pass runs outbound bursts in place (no backlog, no
    // poll), its other styles through the queue, which it empties at once:
    // either way every packet is out when `handle_batch` returns, counted
    // once per descriptor as submitted and completed, with the same bytes
    // (checked above). A device model's jobs stay in flight until its
    // modelled completion.
    for (kind, style, within_call) in [
        (EngineKind::Soft, Style::Async, true),
        (EngineKind::Soft, Style::DualPass, true),
        (EngineKind::Sec, Style::Async, false),
    ] {
        let what = format!("{kind} {style}");
        let mut pair = Pair::on(
            Algorithm::Aes128Sha1,
            "tunnel",
            false,
            &engine_spec(kind, BufferPolicy::Registered),
            style,
        );
        let mut pool = PacketPool::new(64);
        let mut bufs: Vec<_> = frames(32)
            .iter()
            .map(|f| {
                let mut buf = pool.alloc().expect("room");
                assert!(buf.fill(f));
                buf
            })
            .collect();
        let mut out = Vec::new();
        pair.a
            .handle_batch(Duration::ZERO, Port::Inside, &mut bufs, &mut out, &mut pool);
        assert_eq!(out.len() == 32 && pair.a.in_flight() == 0, within_call, "{what}");
        drivers::drive::flush(&mut pair.a, Duration::ZERO, &mut out, &mut pool);
        assert_eq!(out.len(), 32, "{what}");
        assert!(
            out.iter().all(|(_, v)| *v == Verdict::Forward(Port::Outside)),
            "{what}"
        );
        let counters = pair.a.engine_counters();
        let per_packet = if style == Style::Async { 1 } else { 2 };
        assert_eq!(
            (counters.submitted, counters.completed),
            (32 * per_packet, 32 * per_packet),
            "{what}"
        );
        assert_eq!(pair.a.stats().encapsulated, 32, "{what}");
        for (buf, _) in out.drain(..) {
            pool.free(buf);
        }
    }
}
