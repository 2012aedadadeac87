//! Measuring the `sec` engine model: host costs measured, device costs
//! modelled, both reported.
//!
//! A `sec` cell pushes a fixed number of packets through one gateway in a
//! streaming loop (new bursts while fewer than [`WINDOW`] packets are in
//! flight, otherwise wait for the next completion) and keeps two accounts:
//!
//! * **The modelled timeline** (`now`). It advances by the host costs the
//!   model charges (doorbell MMIO, interrupts, completion cache misses) and
//!   jumps to the engine's next completion when the host has nothing else
//!   to do (interrupt and coalesced: idle; polling: the jump is a spin and
//!   is charged). The host's own measured work is *not* in it, so
//!   everything the model reports over the cell (timeline elapsed, engine
//!   and bus time, latency, utilisation, bus bytes, doorbells, interrupts)
//!   depends only on the inputs and is bit-identical from run to run.
//! * **The host's own work**, measured: the wall time of every gateway call
//!   (prepare, descriptor build, submit, completion handling, finish) minus
//!   the time the model spent running the real crypto on the device's
//!   behalf (`emulation_ns`). This is the analogue of DPDK crypto-perf's
//!   pmd-cyclecount offload cost. It is noisy; the median over repetitions
//!   is reported.
//!
//! The system's time per packet combines them: the sync style waits for
//! every descriptor, so it pays measured host work plus the timeline
//! (modelled host costs and device latency) in series; the pipelined styles
//! (dual-pass, async) overlap them, so they pay the larger of the host's
//! total and the timeline (which is bounded below by the busiest execution
//! unit and the bus). With polling the host never idles: its time is the
//! whole period.

use std::time::{Duration, Instant};

use accel::{Completion, EngineCounters, NextCompletion, Style};
use anyhow::{bail, ensure};
use dataplane::gateway::Output;
use dataplane::{Gateway, PacketBuf, PacketPool, Port, Verdict};

/// Packets in flight (queued or with the engine) before the loop stops
/// feeding new bursts and waits.
pub const WINDOW: usize = 64;

/// What the model reports over a cell, per packet. Every field depends
/// only on the inputs (profile, algorithm, size, style, burst, packet
/// count): bit-identical across runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Modelled {
    /// Modelled timeline elapsed per packet: modelled host costs plus the
    /// waits for the engine (the system's time if the host's own work
    /// were free).
    pub timeline_ns: f64,
    /// Modelled host costs per packet (doorbells, interrupts, completion
    /// misses), and with polling the spin until completions.
    pub host_ns: f64,
    /// The part of `host_ns` spent on doorbell MMIO writes (one per burst).
    pub doorbell_ns: f64,
    /// The part of `host_ns` spent entering, handling and leaving
    /// interrupts.
    pub interrupt_ns: f64,
    /// The part of `host_ns` spent on cache misses reading completions
    /// (status words, ring entries).
    pub completion_ns: f64,
    /// Spin per packet (polling only): waits charged to the host.
    pub spin_ns: f64,
    /// Device latency per packet: submission to completion, summed over
    /// the packet's descriptors, queueing included.
    pub latency_ns: f64,
    /// Busy time of the busiest execution unit per packet.
    pub engine_ns: f64,
    /// Busy time of the shared bus per packet.
    pub bus_ns: f64,
    /// Bytes moved across the bus per packet: descriptors, keys and
    /// context, data in and results out.
    pub bus_bytes: f64,
    /// Doorbells rung per packet (one per burst that handed the engine a
    /// job).
    pub doorbells: f64,
    /// Interrupts raised per packet (0 with polling).
    pub interrupts: f64,
    /// Descriptors submitted to the engine per packet.
    pub descriptors: f64,
    /// Busiest execution unit's busy time over the timeline, as a fraction
    /// (1.0 = never idle).
    pub eu_utilisation: f64,
    /// The bus's busy time over the timeline, as a fraction.
    pub bus_utilisation: f64,
}

/// One `sec` cell's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Offload {
    /// The model's figures per packet, bit-identical from run to run.
    pub modelled: Modelled,
    /// The host's own work per packet, measured, one per repetition.
    pub host_measured_ns: Vec<f64>,
    /// The completion mode waits by spinning (polling).
    pub spins: bool,
    /// The style waits for every descriptor (sync): host and engine in series.
    pub serial: bool,
}

impl Offload {
    /// System time per packet for a measured host cost `host`.
    pub fn period_for(&self, host: f64) -> f64 {
        let m = &self.modelled;
        if self.serial {
            host + m.timeline_ns
        } else {
            (host + m.host_ns - m.spin_ns).max(m.timeline_ns)
        }
    }

    /// System time per packet, one per repetition.
    pub fn periods(&self) -> Vec<f64> {
        self.host_measured_ns
            .iter()
            .map(|&h| self.period_for(h))
            .collect()
    }

    /// The host's own work per packet in ns, measured: the median of
    /// [`Offload::host_measured_ns`].
    pub fn host_measured(&self) -> f64 {
        median(&self.host_measured_ns)
    }

    /// The host's time per packet, measured plus modelled; with polling the
    /// whole period (it spins whenever it does not work).
    pub fn host_total(&self) -> f64 {
        let h = self.host_measured();
        if self.spins {
            self.period_for(h)
        } else {
            h + self.modelled.host_ns
        }
    }
}

/// Median of `v` (the mean of the middle two for an even count); NaN when
/// `v` is empty.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Counter snapshot for deltas.
#[derive(Debug, Clone, Copy, Default)]
struct Snap {
    modelled_host: u64,
    doorbell: u64,
    interrupt: u64,
    completion: u64,
    emulation: u64,
    latency: u64,
    bus_busy: u64,
    bus_bytes: u64,
    doorbells: u64,
    interrupts: u64,
    submitted: u64,
}

impl Snap {
    fn of(c: &EngineCounters) -> (Snap, Vec<u64>) {
        (
            Snap {
                modelled_host: c.modelled_host_ns,
                doorbell: c.modelled_host.doorbell_ns,
                interrupt: c.modelled_host.interrupt_ns,
                completion: c.modelled_host.completion_ns,
                emulation: c.emulation_ns,
                latency: c.device_latency_ns,
                bus_busy: c.bus_busy_ns,
                bus_bytes: c.bus.total(),
                doorbells: c.doorbells,
                interrupts: c.interrupts,
                submitted: c.submitted,
            },
            c.eu_busy_ns.iter().map(|(_, ns)| *ns).collect(),
        )
    }
}

/// What a cell pushes through its gateway.
pub struct Traffic<'a> {
    /// The frames of one packet (one, or an ESP packet's fragments).
    pub frames: &'a [Vec<u8>],
    /// The port the frames enter the gateway on.
    pub from: Port,
    /// The port every packet must be forwarded to; any other verdict fails
    /// the run.
    pub to: Port,
    /// Frames forwarded per packet (encap of a fragmented packet: 2).
    pub outputs_per_packet: usize,
    /// The IP packet every output must carry (decapsulation), if checked.
    pub expect: Option<&'a [u8]>,
}

/// The streaming driver of one gateway on the modelled clock.
pub struct Driver {
    /// The modelled clock: advanced by the model's host charges and moved
    /// to the engine's next completion when the host waits.
    pub now: Duration,
    pool: PacketPool,
    bufs: Vec<PacketBuf>,
    out: Vec<Output>,
    spins: bool,
    /// Measured host work, ns, since the last `take`.
    host_ns: u64,
    spin_ns: u64,
    /// Packets per handle_batch call.
    pub burst: usize,
}

impl Driver {
    /// A driver at modelled time zero feeding bursts of `burst` packets (at
    /// least 1), with a pool for a burst beside a full [`WINDOW`] in flight;
    /// with `completion` polling, its waits are charged as spins.
    pub fn new(completion: Completion, burst: usize) -> Driver {
        let burst = burst.max(1);
        Driver {
            now: Duration::ZERO,
            pool: PacketPool::new((burst + WINDOW) * 2 + 16),
            bufs: Vec::with_capacity(burst * 2),
            out: Vec::with_capacity((burst + WINDOW) * 2),
            spins: completion == Completion::Polling,
            host_ns: 0,
            spin_ns: 0,
            burst,
        }
    }

    /// One gateway call, timed: its wall time minus the model's emulation
    /// is host work; the model's host charges advance the modelled clock.
    fn call(&mut self, gateway: &mut Gateway, f: impl FnOnce(&mut Gateway, Duration, &mut Self)) {
        let before = gateway.engine_counters();
        let start = Instant::now();
        f(gateway, self.now, self);
        let wall = start.elapsed().as_nanos() as u64;
        let after = gateway.engine_counters();
        self.host_ns += wall.saturating_sub(after.emulation_ns.saturating_sub(before.emulation_ns));
        self.now += Duration::from_nanos(after.modelled_host_ns.saturating_sub(before.modelled_host_ns));
    }

    /// Pushes `packets` packets through `gateway` and checks what comes out.
    pub fn run(&mut self, gateway: &mut Gateway, traffic: &Traffic, packets: usize) -> anyhow::Result<()> {
        let per = traffic.frames.len().max(1);
        let mut sent = 0usize;
        let mut forwarded = 0usize;
        let want = packets * traffic.outputs_per_packet;
        let mut stuck = 0;
        while forwarded < want {
            let in_flight = gateway.in_flight();
            if sent < packets && in_flight < WINDOW {
                let n = self.burst.min(packets - sent);
                for i in 0..n * per {
                    let Some(mut buf) = self.pool.alloc() else {
                        bail!("the bench's pool ran dry");
                    };
                    buf.fill(&traffic.frames[i % per]);
                    self.bufs.push(buf);
                }
                let mut bufs = std::mem::take(&mut self.bufs);
                self.call(gateway, |gw, now, d| {
                    gw.handle_batch(now, traffic.from, &mut bufs, &mut d.out, &mut d.pool)
                });
                self.bufs = bufs;
                sent += n;
            } else {
                match gateway.next_completion() {
                    NextCompletion::At(t) if t > self.now => {
                        if self.spins {
                            self.spin_ns += (t - self.now).as_nanos() as u64;
                        }
                        self.now = t;
                    }
                    NextCompletion::Idle | NextCompletion::External if self.out.is_empty() => {
                        stuck += 1;
                        ensure!(stuck < 1000, "the gateway holds packets and the engine is idle");
                    }
                    _ => {}
                }
                self.call(gateway, |gw, now, d| gw.poll(now, &mut d.out, &mut d.pool));
            }
            for (buf, verdict) in self.out.drain(..) {
                let ok = match verdict {
                    Verdict::Forward(port) if port == traffic.to => {
                        if let Some(expect) = traffic.expect {
                            ensure!(
                                buf.data().get(14..) == Some(expect),
                                "decapsulated packet differs from what was sent"
                            );
                        }
                        forwarded += 1;
                        true
                    }
                    // Fragments that reassembly keeps.
                    Verdict::Consumed if per > 1 => true,
                    _ => false,
                };
                self.pool.free(buf);
                ensure!(
                    ok,
                    "expected every packet forwarded to {}, got {verdict:?}",
                    traffic.to
                );
            }
        }
        ensure!(forwarded == want, "{forwarded} frames came out, expected {want}");
        Ok(())
    }

    /// Measured host ns and modelled spin ns since the last call; resets.
    fn take(&mut self) -> (u64, u64) {
        let r = (self.host_ns, self.spin_ns);
        self.host_ns = 0;
        self.spin_ns = 0;
        r
    }
}

/// Runs a warm-up of `packets`, then `repetitions` × `packets`, and
/// returns the cell's figures (modelled over all timed repetitions).
pub fn measure(
    gateway: &mut Gateway,
    traffic: &Traffic,
    completion: Completion,
    style: Style,
    burst: usize,
    packets: usize,
    repetitions: usize,
) -> anyhow::Result<Offload> {
    let mut driver = Driver::new(completion, burst);
    driver.run(gateway, traffic, packets)?;
    driver.take();
    let start_now = driver.now;
    let (before, busy_before) = Snap::of(&gateway.engine_counters());
    let mut host = Vec::with_capacity(repetitions);
    let mut spin = 0u64;
    for _ in 0..repetitions {
        driver.run(gateway, traffic, packets)?;
        let (h, s) = driver.take();
        host.push(h as f64 / packets as f64);
        spin += s;
    }
    let (after, busy_after) = Snap::of(&gateway.engine_counters());
    let n = (packets * repetitions) as f64;
    let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / n;
    let elapsed = driver.now.saturating_sub(start_now).as_nanos() as f64;
    let busiest = busy_after
        .iter()
        .zip(busy_before.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a.saturating_sub(*b))
        .max()
        .unwrap_or(0) as f64;
    let bus_busy = after.bus_busy.saturating_sub(before.bus_busy) as f64;
    let ratio = |x: f64| if elapsed > 0.0 { x / elapsed } else { 0.0 };
    let modelled = Modelled {
        timeline_ns: elapsed / n,
        host_ns: per(after.modelled_host, before.modelled_host) + spin as f64 / n,
        doorbell_ns: per(after.doorbell, before.doorbell),
        interrupt_ns: per(after.interrupt, before.interrupt),
        completion_ns: per(after.completion, before.completion),
        spin_ns: spin as f64 / n,
        latency_ns: per(after.latency, before.latency),
        engine_ns: busiest / n,
        bus_ns: bus_busy / n,
        bus_bytes: per(after.bus_bytes, before.bus_bytes),
        doorbells: per(after.doorbells, before.doorbells),
        interrupts: per(after.interrupts, before.interrupts),
        descriptors: per(after.submitted, before.submitted),
        eu_utilisation: ratio(busiest),
        bus_utilisation: ratio(bus_busy),
    };
    let _ = after.emulation;
    Ok(Offload {
        modelled,
        host_measured_ns: host,
        spins: completion == Completion::Polling,
        serial: style == Style::Sync,
    })
}

/// One primitive of the microcontroller study, as an ESP transform and the
/// descriptor kind that isolates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Primitive {
    /// The primitive's name in the study's rows and JSON (`AES-128-CBC`,
    /// `HMAC-SHA-1`, ...).
    pub name: &'static str,
    /// The ESP transform whose session (algorithm and keys) it runs under.
    pub algorithm: accel::Algorithm,
    /// The descriptor kind that runs this primitive alone: cipher only, MAC
    /// only, or an AEAD's single pass.
    pub kind: accel::DescriptorKind,
}

/// 3DES, AES-CBC, AES-GCM, SHA-1, SHA-256 (HMAC), each alone.
pub const PRIMITIVES: [Primitive; 5] = {
    use accel::{Algorithm as A, DescriptorKind as K};
    [
        Primitive {
            name: "3DES-CBC",
            algorithm: A::TripleDesSha1,
            kind: K::CipherOnly,
        },
        Primitive {
            name: "AES-128-CBC",
            algorithm: A::Aes128Sha1,
            kind: K::CipherOnly,
        },
        Primitive {
            name: "AES-128-GCM",
            algorithm: A::Aes128Gcm16,
            kind: K::SinglePass,
        },
        Primitive {
            name: "HMAC-SHA-1",
            algorithm: A::Aes128Sha1,
            kind: K::MacOnly,
        },
        Primitive {
            name: "HMAC-SHA-256",
            algorithm: A::Aes256Sha256,
            kind: K::MacOnly,
        },
    ]
};

fn primitive_setup(
    p: Primitive,
    payload: usize,
) -> anyhow::Result<(accel::Session, accel::Descriptor, Vec<u8>)> {
    use accel::{Descriptor, Direction, Region, Session, Status};
    let alg = p.algorithm;
    let enc_key: Vec<u8> = (0..alg.enc_key_len()).map(|i| i as u8 * 3 + 1).collect();
    let auth_key: Vec<u8> = (0..alg.auth_key_len()).map(|i| i as u8 * 5 + 2).collect();
    let session = Session::new(alg, &enc_key, &auth_key)?;
    let align = alg.pad_align();
    let cipher_len = payload.div_ceil(align) * align;
    let iv_len = alg.iv_len();
    let total = 8 + iv_len + cipher_len + alg.icv_len();
    let desc = Descriptor {
        kind: p.kind,
        direction: Direction::Encrypt,
        auth_only: Region::new(0, 8),
        esn_high: None,
        iv: Region::new(8, iv_len),
        cipher: Region::new(8 + iv_len, cipher_len),
        icv: Region::new(8 + iv_len + cipher_len, alg.icv_len()),
        status: Status::Pending,
    };
    Ok((session, desc, (0..total).map(|i| i as u8).collect()))
}

/// This host's software time for one `payload`-byte operation of `p`
/// (median of `repetitions` timed runs of `runs` operations each).
pub fn software_ns(
    p: Primitive,
    payload: usize,
    runs: usize,
    repetitions: usize,
) -> anyhow::Result<Vec<f64>> {
    let (session, desc, mut buf) = primitive_setup(p, payload)?;
    let mut out = Vec::with_capacity(repetitions);
    for rep in 0..=repetitions {
        let start = Instant::now();
        for _ in 0..runs {
            let mut d = desc;
            accel::primitive::process(&session, &mut d, &mut buf);
            ensure!(d.status == accel::Status::Done, "{}: {:?}", p.name, d.status);
        }
        if rep > 0 {
            out.push(start.elapsed().as_nanos() as f64 / runs as f64);
        }
    }
    Ok(out)
}

/// The modelled part's time for one `payload`-byte operation of `p` on an
/// idle engine (submission to completion), and its time per operation in
/// a burst of 32 of one session (one channel, pipelined).
pub fn engine_ns(profile: accel::DeviceProfile, p: Primitive, payload: usize) -> anyhow::Result<(f64, f64)> {
    use accel::{Engine, Job, SecConfig, SecEngine, SessionSpec};
    use std::collections::VecDeque;
    let (_, desc, bytes) = primitive_setup(p, payload)?;
    let alg = p.algorithm;
    let enc_key: Vec<u8> = (0..alg.enc_key_len()).map(|i| i as u8 * 3 + 1).collect();
    let auth_key: Vec<u8> = (0..alg.auth_key_len()).map(|i| i as u8 * 5 + 2).collect();
    let mut config = SecConfig::with_profile(profile);
    config.completion = Completion::Polling;
    let mut engine = SecEngine::new(config);
    let handle = engine.register(&SessionSpec::new(alg, false, &enc_key, &auth_key)?)?;
    let mut pool = accel::PacketPool::new(64);
    let mut job = |user| -> anyhow::Result<Job> {
        let Some(mut buf) = pool.alloc() else {
            bail!("no buffer");
        };
        buf.fill(&bytes);
        Ok(Job::new(handle, desc, buf, 0, user))
    };
    // One job on an idle engine: its latency.
    let mut queue = VecDeque::from([job(0)?]);
    engine.submit_burst(Duration::ZERO, &mut queue);
    let latency = match engine.next_completion() {
        NextCompletion::At(t) => t.as_nanos() as f64,
        _ => 0.0,
    };
    let mut done = Vec::new();
    engine.poll_burst(Duration::from_secs(1), &mut done);
    // Steady state: a burst of 32, from the counters.
    let before = engine.counters();
    let mut queue: VecDeque<Job> = (1..=32).map(&mut job).collect::<anyhow::Result<_>>()?;
    let now = Duration::from_secs(1);
    engine.submit_burst(now, &mut queue);
    // One session's jobs share one channel: the burst's span per job.
    let span = engine
        .counters()
        .device_done_ns
        .saturating_sub(now.as_nanos() as u64);
    let steady = span as f64 / 32.0;
    let _ = before;
    engine.poll_burst(Duration::from_secs(2), &mut done);
    Ok((latency, steady))
}
