//! A fixed, complete sweep made of formulas, for tests of what is built
//! from a sweep (the summary, the studies, the charts, the page): every
//! kind of cell the default run has, with figures chosen so that some
//! published shapes hold and some do not. Test-only; measures nothing.

use accel::{Algorithm, BufferPolicy, EngineKind, Style};

use crate::measure::Samples;
use crate::offload::{Modelled, Offload};
use crate::report::{Conditions, Machine};
use crate::scenario::{CompletionMode, Knobs, Scenario};
use crate::tenants::{Mode, Row};
use crate::{Cell, Metrics, Path, Speedup, Sweep};

pub(crate) const SIZES: [usize; 7] = [64, 128, 256, 512, 1024, 1420, 1518];

fn samples(ns: f64) -> Samples {
    Samples {
        ns_per_packet: vec![ns * 0.98, ns, ns * 1.03],
        packets: 3,
        processed: 4,
        cycles_per_packet: Vec::new(),
        wall_ns: (ns * 4.0) as u64,
    }
}

fn cell(scenario: Scenario, path: Path, frame_size: usize, ns: f64) -> Cell {
    Cell {
        scenario,
        path,
        frame_size,
        samples: samples(ns),
        metrics: Metrics {
            bus_bytes_per_packet: None,
            moved_bytes_per_packet: (path != Path::Encrypt && path != Path::Decrypt)
                .then_some(2.0 * frame_size as f64 + 60.0),
            engine_utilisation: None,
        },
        offload: None,
    }
}

/// encap, decap and round trip of an inline scenario.
fn inline(cells: &mut Vec<Cell>, scenario: Scenario, size: usize, encap: f64) {
    cells.push(cell(scenario, Path::Encap, size, encap));
    cells.push(cell(scenario, Path::Decap, size, encap * 0.9));
    cells.push(cell(scenario, Path::RoundTrip, size, encap * 2.1));
}

/// A sec model cell (encap and decap) from the host's measured work and
/// the modelled figures.
fn sec(
    cells: &mut Vec<Cell>,
    scenario: Scenario,
    size: usize,
    host: f64,
    m: Modelled,
    spins: bool,
    serial: bool,
) {
    let o = Offload {
        modelled: m,
        host_measured_ns: vec![host * 0.97, host, host * 1.02],
        spins,
        serial,
    };
    for path in [Path::Encap, Path::Decap] {
        let mut c = cell(scenario, path, size, 0.0);
        c.samples.ns_per_packet = o.periods();
        c.metrics.bus_bytes_per_packet = Some(m.bus_bytes);
        c.metrics.moved_bytes_per_packet = Some(2.0 * size as f64 + m.bus_bytes);
        c.metrics.engine_utilisation = Some(m.eu_utilisation);
        c.offload = Some(o.clone());
        cells.push(c);
    }
}

fn modelled(timeline: f64, host: f64, descriptors: f64, interrupts: f64, bus: f64) -> Modelled {
    Modelled {
        timeline_ns: timeline,
        host_ns: host,
        interrupt_ns: interrupts * 3000.0,
        latency_ns: timeline * 0.8,
        engine_ns: timeline * 0.7,
        bus_bytes: bus,
        doorbells: 1.0 / 32.0,
        interrupts,
        descriptors,
        eu_utilisation: 0.7,
        bus_utilisation: 0.2,
        ..Modelled::default()
    }
}

const SEC_ALGORITHMS: [Algorithm; 3] = [
    Algorithm::Aes128Gcm16,
    Algorithm::Aes128Sha1,
    Algorithm::TripleDesSha1,
];

/// (sync setup ns, async setup ns, device ns per byte) of each sec
/// algorithm: GCM's sync is one descriptor and wins up to 256 B;
/// aes128-sha1's sync pays two setups and loses at once; 3des-sha1 parts
/// between 64 and 128 B, as the study found.
fn device(a: Algorithm) -> (f64, f64, f64) {
    match a {
        Algorithm::Aes128Gcm16 => (1000.0, 900.0, 6.0),
        Algorithm::Aes128Sha1 => (3200.0, 1500.0, 8.0),
        _ => (1700.0, 1500.0, 20.0),
    }
}

/// The soft engine's outbound ns at `size`.
fn soft_ns(a: Algorithm, size: usize) -> f64 {
    let s = size as f64;
    match a {
        Algorithm::Aes128Gcm16 => 200.0 + 0.5 * s,
        Algorithm::ChaCha20Poly1305 => 220.0 + 1.2 * s,
        Algorithm::Aes128Sha1 => 250.0 + 3.0 * s,
        _ => 400.0 + 30.0 * s,
    }
}

pub(crate) fn sweep() -> Sweep {
    let knobs = Knobs::default();
    let mut cells = Vec::new();
    let null = Scenario::esp(Algorithm::Null, EngineKind::Soft, Style::Async);
    for &size in &SIZES {
        let s = size as f64;
        inline(&mut cells, Scenario::Ipv4Forward, size, 50.0 + 0.01 * s);
        inline(&mut cells, null, size, 95.0 + 0.02 * s);
        if size >= crate::measure::MIN_FRAME6 {
            inline(&mut cells, Scenario::Ipv6Forward, size, 55.0 + 0.01 * s);
            inline(&mut cells, Scenario::EspNull6, size, 120.0 + 0.02 * s);
        }
    }
    for a in [
        Algorithm::Aes128Gcm16,
        Algorithm::ChaCha20Poly1305,
        Algorithm::Aes128Sha1,
        Algorithm::TripleDesSha1,
    ] {
        for &size in &SIZES {
            let s = size as f64;
            inline(
                &mut cells,
                Scenario::esp(a, EngineKind::Soft, Style::Async),
                size,
                soft_ns(a, size),
            );
            // The SEC has no ChaCha20 unit.
            if a != Algorithm::ChaCha20Poly1305 {
                let (sync_setup, async_setup, per_byte) = device(a);
                {
                    let two = if a.is_aead() { 1.0 } else { 2.0 };
                    let bus = 200.0 + s;
                    let sync = modelled(
                        sync_setup + per_byte * s,
                        0.0,
                        two,
                        0.0,
                        bus + 112.0 * (two - 1.0),
                    );
                    sec(
                        &mut cells,
                        Scenario::esp(a, EngineKind::Sec, Style::Sync),
                        size,
                        100.0,
                        sync,
                        true,
                        true,
                    );
                    let single = modelled(async_setup + per_byte * s, 3000.0, 1.0, 1.0, bus);
                    sec(
                        &mut cells,
                        Scenario::esp(a, EngineKind::Sec, Style::Async),
                        size,
                        100.0,
                        single,
                        false,
                        false,
                    );
                    // GCM cannot be split: its dual-pass is async's one
                    // descriptor, ahead at 128 B by the host's noise.
                    let (dual, host) = if a.is_aead() {
                        (single, if size == 128 { 90.0 } else { 100.0 })
                    } else {
                        (
                            modelled(async_setup + 1.5 * per_byte * s, 3000.0, 2.0, 1.0, bus * 1.45),
                            100.0,
                        )
                    };
                    sec(
                        &mut cells,
                        Scenario::esp(a, EngineKind::Sec, Style::DualPass),
                        size,
                        host,
                        dual,
                        false,
                        false,
                    );
                    // A fast part with polling.
                    let qat = Scenario::Esp {
                        algorithm: a,
                        engine: EngineKind::Sec,
                        style: Style::Async,
                        knobs: Knobs {
                            profile: "qat-class",
                            completion: CompletionMode::Polling,
                            ..knobs
                        },
                    };
                    let fast = match a {
                        Algorithm::Aes128Gcm16 => 200.0 + 0.7 * s,
                        Algorithm::Aes128Sha1 => 200.0 + 0.7 * s,
                        _ => 300.0 + 6.0 * s,
                    };
                    sec(
                        &mut cells,
                        qat,
                        size,
                        100.0,
                        modelled(fast, 90.0, 1.0, 0.0, bus),
                        true,
                        false,
                    );
                }
            }
            cells.push(cell(
                Scenario::RawCrypto { algorithm: a },
                Path::Encrypt,
                size,
                soft_ns(a, size) * 0.6,
            ));
            cells.push(cell(
                Scenario::RawCrypto { algorithm: a },
                Path::Decrypt,
                size,
                soft_ns(a, size) * 0.62,
            ));
        }
    }
    // The registration and completion comparison, aes128-sha1 at 64 and 1420 B.
    let sha = Algorithm::Aes128Sha1;
    let (_, async_setup, per_byte) = device(sha);
    for size in [64, 1420] {
        let s = size as f64;
        let timeline = async_setup + per_byte * s;
        let with = |k: Knobs| Scenario::Esp {
            algorithm: sha,
            engine: EngineKind::Sec,
            style: Style::Async,
            knobs: k,
        };
        let per_request = with(Knobs {
            buffers: BufferPolicy::PerRequest,
            ..knobs
        });
        sec(
            &mut cells,
            per_request,
            size,
            130.0,
            modelled(timeline, 3000.0, 1.0, 1.0, 200.0 + s),
            false,
            false,
        );
        let polling = with(Knobs {
            completion: CompletionMode::Polling,
            ..knobs
        });
        let mut m = modelled(timeline, 50.0, 1.0, 0.0, 200.0 + s);
        m.spin_ns = 0.0;
        sec(&mut cells, polling, size, 100.0, m, true, false);
        let coalesced = with(Knobs {
            completion: CompletionMode::Coalesced,
            ..knobs
        });
        sec(
            &mut cells,
            coalesced,
            size,
            100.0,
            modelled(timeline, 400.0, 1.0, 0.12, 200.0 + s),
            false,
            false,
        );
    }
    // The boundary at profile none, and the burst curve.
    let none = Knobs {
        profile: "none",
        completion: CompletionMode::Polling,
        ..knobs
    };
    for a in SEC_ALGORITHMS {
        for (size, host) in [(64, 70.0), (1518, 140.0)] {
            let sc = Scenario::Esp {
                algorithm: a,
                engine: EngineKind::Sec,
                style: Style::Async,
                knobs: none,
            };
            let host = if a == sha && size == 64 { 83.0 } else { host };
            sec(
                &mut cells,
                sc,
                size,
                host,
                modelled(0.0, 186.0, 1.0, 0.0, 268.0),
                true,
                false,
            );
        }
    }
    for (burst, host, modelled_host) in [
        (1, 218.0, 380.0),
        (4, 124.0, 230.0),
        (16, 92.0, 192.0),
        (64, 80.0, 183.0),
        (256, 77.0, 181.0),
    ] {
        let sc = Scenario::Esp {
            algorithm: sha,
            engine: EngineKind::Sec,
            style: Style::Async,
            knobs: Knobs { burst, ..none },
        };
        let mut m = modelled(0.0, modelled_host, 1.0, 0.0, 268.0);
        m.doorbells = 1.0 / burst as f64;
        sec(&mut cells, sc, 64, host, m, true, false);
    }
    let mut speedups = Vec::new();
    for (primitive, small, large) in [
        ("3DES-CBC", 1979.0, 31128.0),
        ("AES-128-CBC", 63.0, 620.0),
        ("AES-128-GCM", 82.0, 158.0),
        ("HMAC-SHA-1", 169.0, 663.0),
        ("HMAC-SHA-256", 160.0, 700.0),
    ] {
        for (payload, software_ns) in [(64, small), (1024, large)] {
            let p = payload as f64;
            speedups.push(Speedup {
                primitive,
                payload,
                software_ns,
                engine_ns: vec![
                    ("sec2-266mhz", 1600.0 + 8.0 * p, 0.75 * (1600.0 + 8.0 * p)),
                    ("qat-class", 3150.0 + 0.6 * p, 240.0 + 0.6 * p),
                ],
            });
        }
    }
    let mut tenants = Vec::new();
    for (engine, size, modes) in [
        (
            EngineKind::Soft,
            1420,
            vec![
                (Mode::InProcessAsync, 5000.0),
                (Mode::Shm, 3000.0),
                (Mode::Socket, 2500.0),
            ],
        ),
        (
            EngineKind::Soft,
            4096,
            vec![
                (Mode::InProcessAsync, 9000.0),
                (Mode::Shm, 6500.0),
                (Mode::Socket, 5000.0),
            ],
        ),
        (
            EngineKind::Soft,
            8192,
            vec![
                (Mode::InProcessAsync, 12000.0),
                (Mode::Shm, 8800.0),
                (Mode::Socket, 8000.0),
            ],
        ),
        (
            EngineKind::Sec,
            1420,
            vec![
                (Mode::InProcessAsync, 900.0),
                (Mode::InProcessSync, 300.0),
                (Mode::Shm, 880.0),
                (Mode::Socket, 860.0),
            ],
        ),
        (
            EngineKind::Sec,
            4096,
            vec![
                (Mode::InProcessAsync, 1200.0),
                (Mode::InProcessSync, 500.0),
                (Mode::Shm, 1190.0),
                (Mode::Socket, 1180.0),
            ],
        ),
        (
            EngineKind::Sec,
            8192,
            vec![
                (Mode::InProcessAsync, 1300.0),
                (Mode::InProcessSync, 600.0),
                (Mode::Shm, 1290.0),
                (Mode::Socket, 1280.0),
            ],
        ),
    ] {
        for (mode, mbps) in modes {
            let shared = matches!(mode, Mode::Shm | Mode::Socket);
            tenants.push(Row {
                engine,
                mode,
                tenants: 1,
                size,
                aggregate_mbps: mbps,
                per_tenant_mbps: vec![mbps],
                tenant_cycles_per_request: Some(1000.0),
                server_utilisation: shared.then_some(0.5),
                server_cycles_per_request: shared.then_some(800.0),
            });
        }
    }
    Sweep {
        cells,
        engine: "soft inline, sec/sync, sec/dual-pass, sec/async; buffers registered, completion interrupt, rate sec2-266mhz"
            .into(),
        knobs,
        rate: "sec2-266mhz".into(),
        machine: Machine {
            cpu: "Synthetic CPU @ 2.00GHz".into(),
            cores: 2,
            mhz: Some(2000.0),
            no_cycle_counter: Some("no PMU in this VM".into()),
        },
        slice_ms: 60,
        repetitions: 3,
        packets: 512,
        threads: false,
        speedups,
        tenants,
        conditions: Conditions {
            hostname: "lab".into(),
            kernel: "6.1.0-test".into(),
            virtualised: true,
            clocksource: "kvm-clock".into(),
            load_before: Some([0.5, 0.6, 0.7]),
            load_after: Some([1.5, 1.0, 0.8]),
            started_unix: 1_764_888_000,
            seconds: 75.0,
        },
    }
}
