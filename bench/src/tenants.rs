//! `espgw bench --tenants 1,2,4 --transport shm,socket`: one engine shared
//! by several tenants through `espgw engine serve`'s server, beside the
//! same engine in-process, in one run (the third study of
//! `docs/STUDIES.md`).
//!
//! Every tenant is a thread with its own [`SharedEngine`] (its own ring
//! pair, doorbells, session and data slots) that keeps a window of
//! requests in flight for a timed slice; the server runs on a thread of
//! its own, as it would in its own process (the shared memory, doorbells
//! and sockets are the same). Reported per cell: aggregate and per-tenant
//! throughput, the tenants' own CPU per request (hardware cycles where the
//! counter exists, else CPU time × clock), and the server thread's
//! utilisation (its busy passes over the wall time). The in-process rows
//! drive the same engine kind directly from one thread: asynchronous
//! (the same window) and, for `sec`, one synchronous caller (one request
//! at a time, waiting for each). Requests are engine-level jobs of the
//! given sizes (ESP packet sizes, and 4 and 8 KB requests as the study
//! measured), not frames through a gateway.
//!
//! `--hostile` measures something else: one good tenant's round trips
//! (one request at a time, waited for) alone and beside a hostile tenant
//! that floods its control socket, resizes its shared region and keeps
//! idle connections open, in alternating slices of one run ([`hostile`]).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use accel::shared::{spawn, ServerConfig, SharedEngine, SharedSpec, Transport};
use accel::{
    build_engine, Algorithm, Descriptor, DescriptorKind, Direction, Engine, EngineKind, EngineSpec, Job,
    NextCompletion, PacketBuf, SessionHandle, SessionSpec, Status,
};
use anyhow::{bail, Context};

use crate::report::Machine;
use crate::studies;

/// Requests each tenant (and the in-process caller) keeps in flight.
pub const WINDOW: usize = 64;
/// Request sizes measured unless `--request-sizes` says otherwise.
pub const DEFAULT_REQUEST_SIZES: [usize; 4] = [64, 1420, 4096, 8192];

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Tenant counts, each at least 1: a shared row per count, its tenants
    /// at work together.
    pub tenants: Vec<usize>,
    /// Transports the shared rows reach the server by.
    pub transports: Vec<Transport>,
    /// Request sizes in bytes, a row group each (`hostile`: the first).
    pub sizes: Vec<usize>,
    /// Engines measured, behind the server and in-process: soft and/or sec.
    pub engines: Vec<EngineKind>,
    /// The transform of every request.
    pub algorithm: Algorithm,
    /// Wall-clock length of one timed slice.
    pub slice: Duration,
    /// Timed slices per row after a warm-up slice (`hostile`: pairs of
    /// slices); rows report their median.
    pub repetitions: usize,
    /// The sec model's device profile.
    pub profile: String,
    /// Where [`run`] also writes the rows (or the hostile report) as JSON.
    pub json: Option<PathBuf>,
    /// Instead of the sweep: the good tenant's round trips alone and beside
    /// a hostile tenant ([`hostile`]).
    pub hostile: bool,
}

/// How a row's requests reached the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// One thread, the engine in-process, a window in flight.
    InProcessAsync,
    /// One thread, the engine in-process, one request at a time.
    InProcessSync,
    /// Tenant threads through the server over shared-memory rings.
    Shm,
    /// Tenant threads through the server over its socket.
    Socket,
}

impl Mode {
    /// The mode as the tables print it (`in-process async`, `shm`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Mode::InProcessAsync => "in-process async",
            Mode::InProcessSync => "in-process sync",
            Mode::Shm => "shm",
            Mode::Socket => "socket",
        }
    }
}

/// One measured cell.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// The engine doing the crypto, behind the server or in-process.
    pub engine: EngineKind,
    /// How the requests reached it.
    pub mode: Mode,
    /// Tenants at work together (1 for the in-process rows).
    pub tenants: usize,
    /// Request size in bytes; Mb/s counts these bytes.
    pub size: usize,
    /// Median over repetitions of all tenants' Mb/s together.
    pub aggregate_mbps: f64,
    /// Median Mb/s of each tenant.
    pub per_tenant_mbps: Vec<f64>,
    /// Median over repetitions of the tenants' CPU cycles per request,
    /// waits excluded: thread CPU time x the nominal clock.
    pub tenant_cycles_per_request: Option<f64>,
    /// The server thread's busy time over the slice (shared rows).
    pub server_utilisation: Option<f64>,
    /// Median over repetitions of the server thread's CPU cycles per
    /// request (its polling between bursts included): with the tenant's
    /// own, where a shared row's time goes (shared rows).
    pub server_cycles_per_request: Option<f64>,
}

/// The server thread over one repetition: its busy share of the slice and
/// its CPU time.
#[derive(Debug, Clone, Copy, Default)]
struct ServerSample {
    busy: f64,
    cpu_ns: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    requests: u64,
    /// The thread's CPU time, waits excluded.
    cpu_ns: u64,
    /// The slice's real length.
    elapsed: Duration,
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn session_spec(alg: Algorithm) -> anyhow::Result<SessionSpec> {
    let enc: Vec<u8> = (0..alg.enc_key_len()).map(|i| (i * 7 + 1) as u8).collect();
    let auth: Vec<u8> = (0..alg.auth_key_len()).map(|i| (0x40 + i) as u8).collect();
    Ok(SessionSpec::new(alg, false, &enc, &auth)?)
}

/// `WINDOW` jobs of about `size` bytes of request (SPI, sequence, IV,
/// payload padded to the cipher block, ICV).
fn jobs(session: SessionHandle, alg: Algorithm, size: usize) -> Vec<Job> {
    let (iv, icv, align) = (alg.iv_len(), alg.icv_len(), alg.pad_align());
    let payload = (size.saturating_sub(8 + iv + icv) / align).max(1) * align;
    let len = 8 + iv + payload + icv;
    let desc = Descriptor::esp(Direction::Encrypt, alg, payload, None);
    (0..WINDOW)
        .map(|i| {
            let mut buf = PacketBuf::with_len(len);
            for (j, b) in buf.data_mut().iter_mut().enumerate() {
                *b = (i * 31 + j * 7) as u8;
            }
            Job::new(session, desc, buf, 0, i as u64)
        })
        .collect()
}

/// What one slice of [`drive`] did.
struct Driven {
    /// Requests completed within the slice.
    done: u64,
    /// The thread's CPU time spent waiting (not the tenant's work).
    waiting_ns: u64,
    /// How long the slice took: at least its time, longer while fewer than
    /// a window's requests had completed.
    elapsed: Duration,
}

/// Keeps up to `window` of `idle` in flight until `until` and until a
/// window's worth of requests have completed (a slice in which the host
/// never ran the server would otherwise read as a rate of zero; rates are
/// over the slice's real length); returns the requests completed. Waits as a driver does: on the engine for a real
/// device or a server, spinning to a modelled completion time otherwise.
/// With `dual`, each request is two descriptors (cipher, then MAC; the
/// second submitted when the first completes) and counts once. Also
/// returns the thread's CPU time spent waiting (in `Engine::wait` or
/// spinning to a modelled completion), which is not the tenant's work.
fn drive(
    engine: &mut dyn Engine,
    idle: &mut Vec<Job>,
    window: usize,
    dual: bool,
    until: Instant,
    start: Instant,
) -> Driven {
    let began = Instant::now();
    let mut elapsed = None;
    let mut queue: VecDeque<Job> = VecDeque::with_capacity(WINDOW);
    let mut out: Vec<Job> = Vec::with_capacity(WINDOW);
    let mut done = 0u64;
    let mut waiting_ns = 0u64;
    let total = idle.len() + engine.in_flight();
    let mut finishing = false;
    loop {
        // Past the slice's time with nothing back is a host that has not
        // run the server yet, not a rate of zero; the cap below still ends
        // a slice whose engine never answers.
        let now = Instant::now();
        if !finishing && now >= until && (done >= window as u64 || now > until + Duration::from_secs(5)) {
            finishing = true;
            elapsed = Some(began.elapsed());
        }
        if !finishing {
            while engine.in_flight() + queue.len() < window {
                let Some(mut job) = idle.pop() else { break };
                job.desc.status = Status::Pending;
                if dual {
                    job.desc.kind = DescriptorKind::CipherOnly;
                }
                queue.push_back(job);
            }
        }
        let now = start.elapsed();
        let took = if queue.is_empty() {
            0
        } else {
            engine.submit_burst(now, &mut queue)
        };
        let n = engine.poll_burst(now, &mut out);
        for mut job in out.drain(..) {
            if dual && job.desc.kind == DescriptorKind::CipherOnly && !finishing {
                job.desc.kind = DescriptorKind::MacOnly;
                job.desc.status = Status::Pending;
                queue.push_back(job);
                continue;
            }
            if !finishing {
                done += 1;
            }
            idle.push(job);
        }
        if finishing {
            idle.extend(queue.drain(..));
            if idle.len() >= total || Instant::now() > until + Duration::from_secs(10) {
                return Driven {
                    done,
                    waiting_ns,
                    elapsed: elapsed.unwrap_or_else(|| began.elapsed()),
                };
            }
        }
        // Nothing back, and nothing more the engine would take: wait (a
        // full ring or socket is a wait, not a spin on the submit).
        if n == 0 && (queue.is_empty() || took == 0) {
            let next = engine.next_completion();
            if matches!(next, NextCompletion::External | NextCompletion::At(_)) {
                let before = thread_cpu_ns();
                match next {
                    NextCompletion::At(t) => {
                        while start.elapsed() < t {
                            std::hint::spin_loop();
                        }
                    }
                    _ => engine.wait(Duration::from_micros(200)),
                }
                waiting_ns += thread_cpu_ns() - before;
            }
        }
    }
}

/// One thread's repetitions: a warm-up slice, then `repetitions` timed.
fn slices(
    engine: &mut dyn Engine,
    idle: &mut Vec<Job>,
    window: usize,
    dual: bool,
    options: &Options,
    barrier: Option<&Barrier>,
) -> Vec<Sample> {
    let start = Instant::now();
    let mut samples = Vec::with_capacity(options.repetitions);
    for rep in 0..=options.repetitions {
        if let Some(b) = barrier {
            b.wait();
        }
        let cpu = thread_cpu_ns();
        let driven = drive(engine, idle, window, dual, Instant::now() + options.slice, start);
        let cpu_ns = (thread_cpu_ns() - cpu).saturating_sub(driven.waiting_ns);
        if let Some(b) = barrier {
            b.wait();
        }
        if rep > 0 {
            samples.push(Sample {
                requests: driven.done,
                cpu_ns,
                elapsed: driven.elapsed,
            });
        }
    }
    samples
}

fn engine_spec(kind: EngineKind, profile: &str) -> anyhow::Result<EngineSpec> {
    let mut spec = EngineSpec {
        kind,
        ..EngineSpec::default()
    };
    if kind == EngineKind::Sec {
        spec.sec = accel::SecConfig::with_profile(accel::DeviceProfile::by_name(profile)?);
    }
    Ok(spec)
}

fn row(
    engine: EngineKind,
    mode: Mode,
    size: usize,
    per_tenant: &[Vec<Sample>],
    server: &[ServerSample],
    machine: &Machine,
) -> Row {
    let reps = per_tenant.first().map_or(0, Vec::len);
    let mbps = |s: &Sample| s.requests as f64 * size as f64 * 8.0 / s.elapsed.as_secs_f64().max(1e-9) / 1e6;
    let mut aggregate: Vec<f64> = (0..reps)
        .map(|r| per_tenant.iter().map(|t| mbps(&t[r])).sum())
        .collect();
    let per_tenant_mbps = per_tenant
        .iter()
        .map(|t| median(&mut t.iter().map(mbps).collect::<Vec<_>>()))
        .collect();
    let mut cycles: Vec<f64> = (0..reps)
        .filter_map(|r| {
            let requests: u64 = per_tenant.iter().map(|t| t[r].requests).sum();
            let work = machine.cycles(per_tenant.iter().map(|t| t[r].cpu_ns as f64).sum::<f64>())?;
            (requests > 0).then(|| work / requests as f64)
        })
        .collect();
    Row {
        engine,
        mode,
        tenants: per_tenant.len(),
        size,
        aggregate_mbps: median(&mut aggregate),
        per_tenant_mbps,
        tenant_cycles_per_request: (!cycles.is_empty()).then(|| median(&mut cycles)),
        server_utilisation: (!server.is_empty())
            .then(|| median(&mut server.iter().map(|s| s.busy).collect::<Vec<_>>())),
        server_cycles_per_request: {
            let mut per: Vec<f64> = server
                .iter()
                .enumerate()
                .filter_map(|(r, &ServerSample { cpu_ns: ns, .. })| {
                    let requests: u64 = per_tenant
                        .iter()
                        .map(|t| t.get(r).map_or(0, |s| s.requests))
                        .sum();
                    let cycles = machine.cycles(ns as f64)?;
                    (requests > 0).then(|| cycles / requests as f64)
                })
                .collect();
            (!per.is_empty()).then(|| median(&mut per))
        },
    }
}

fn in_process(
    kind: EngineKind,
    sync: bool,
    size: usize,
    options: &Options,
    machine: &Machine,
) -> anyhow::Result<Row> {
    let mut engine = build_engine(&engine_spec(kind, &options.profile)?)?;
    let handle = engine.register(&session_spec(options.algorithm)?)?;
    let mut idle = jobs(handle, options.algorithm, size);
    let window = if sync { 1 } else { WINDOW };
    // The sync style as the gateway has it: cipher, then MAC, each waited
    // for (an AEAD is one request).
    let dual = sync && !options.algorithm.is_aead();
    let samples = slices(engine.as_mut(), &mut idle, window, dual, options, None);
    let mode = if sync {
        Mode::InProcessSync
    } else {
        Mode::InProcessAsync
    };
    Ok(row(kind, mode, size, &[samples], &[], machine))
}

fn shared(
    kind: EngineKind,
    server: &accel::shared::ServerHandle,
    transport: Transport,
    tenants: usize,
    size: usize,
    options: &Options,
    machine: &Machine,
) -> anyhow::Result<Row> {
    let barrier = Arc::new(Barrier::new(tenants + 1));
    let spec = SharedSpec {
        socket: server.socket.clone(),
        transport,
        entries: WINDOW as u32,
        slot_size: (DEFAULT_REQUEST_SIZES[3].max(size) + 256) as u32,
        ..SharedSpec::default()
    };
    let mut busy = Vec::with_capacity(options.repetitions);
    let per_tenant = std::thread::scope(|scope| -> anyhow::Result<Vec<Vec<Sample>>> {
        let threads: Vec<_> = (0..tenants)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                let spec = spec.clone();
                scope.spawn(move || -> anyhow::Result<Vec<Sample>> {
                    let attached = SharedEngine::attach(&spec).map_err(anyhow::Error::from);
                    let mut engine = match attached {
                        Ok(e) => e,
                        Err(e) => {
                            // Keep the others' barrier count right, then fail.
                            for _ in 0..2 * (options.repetitions + 1) {
                                barrier.wait();
                            }
                            return Err(e);
                        }
                    };
                    let handle = engine.register(&session_spec(options.algorithm)?)?;
                    let mut idle = jobs(handle, options.algorithm, size);
                    Ok(slices(
                        &mut engine,
                        &mut idle,
                        WINDOW,
                        false,
                        options,
                        Some(&barrier),
                    ))
                })
            })
            .collect();
        for rep in 0..=options.repetitions {
            barrier.wait();
            let (began, busy0, cpu0) = (Instant::now(), server.busy_ns(), server.cpu_ns());
            barrier.wait();
            // The server publishes its busy time every few passes and
            // whenever it sleeps: give it a moment to catch up.
            std::thread::sleep(Duration::from_millis(2));
            let wall = began.elapsed().as_nanos().max(1) as f64;
            if rep > 0 {
                busy.push(ServerSample {
                    busy: ((server.busy_ns() - busy0) as f64 / wall).min(1.0),
                    cpu_ns: server.cpu_ns().saturating_sub(cpu0),
                });
            }
        }
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a tenant thread panicked"))?
            })
            .collect()
    })?;
    let mode = match transport {
        Transport::Shm => Mode::Shm,
        Transport::Socket => Mode::Socket,
    };
    Ok(row(kind, mode, size, &per_tenant, &busy, machine))
}

/// Runs every cell: per engine and size, in-process first, then each
/// transport at each tenant count.
pub fn measure(options: &Options, mut progress: impl FnMut(&Row)) -> anyhow::Result<Vec<Row>> {
    if options.tenants.is_empty() || options.tenants.contains(&0) {
        bail!("--tenants takes counts of at least 1, e.g. --tenants 1,2,4");
    }
    let machine = Machine::detect();
    let mut rows = Vec::new();
    for &kind in &options.engines {
        if matches!(kind, EngineKind::Shared) {
            bail!("--engine shared: the tenants benchmark starts its own server; name the engine behind it (soft or sec)");
        }
        let socket = std::env::temp_dir().join(format!("espgw-bench-{}-{kind}.sock", std::process::id()));
        let mut config = ServerConfig::new(socket, engine_spec(kind, &options.profile)?);
        config.quota = WINDOW;
        let server = spawn(config).with_context(|| format!("starting the {kind} server"))?;
        for &size in &options.sizes {
            let mut modes = vec![false];
            if kind == EngineKind::Sec {
                modes.push(true);
            }
            for sync in modes {
                let r = in_process(kind, sync, size, options, &machine)?;
                progress(&r);
                rows.push(r);
            }
            for &transport in &options.transports {
                for &n in &options.tenants {
                    let r = shared(kind, &server, transport, n, size, options, &machine)?;
                    progress(&r);
                    rows.push(r);
                }
            }
        }
        let stats = server.stats();
        server.stop()?;
        if stats.refused() > 0 {
            bail!(
                "the server refused {} requests of honest tenants: {stats:?}",
                stats.refused()
            );
        }
    }
    Ok(rows)
}

fn find(rows: &[Row], engine: EngineKind, mode: Mode, tenants: usize, size: usize) -> Option<&Row> {
    rows.iter()
        .find(|r| r.engine == engine && r.mode == mode && r.tenants == tenants && r.size == size)
}

/// The table.
pub fn table(rows: &[Row], options: &Options) -> String {
    let mut s = format!(
        "shared engine: {} requests, window {WINDOW} per tenant, {} ms x {} (median)\n",
        options.algorithm,
        options.slice.as_millis(),
        options.repetitions
    );
    let mut table = crate::table::plain_table(
        &[
            "engine",
            "size",
            "mode",
            "tenants",
            "aggr Mb/s",
            "per tenant Mb/s",
            "cyc/req",
            "server",
            "srv cyc/req",
        ],
        &[1, 3, 4, 5, 6, 7, 8],
    );
    for r in rows {
        let per: Vec<String> = r.per_tenant_mbps.iter().map(|m| format!("{m:.0}")).collect();
        table.add_row([
            r.engine.name().to_string(),
            r.size.to_string(),
            r.mode.name().to_string(),
            r.tenants.to_string(),
            format!("{:.0}", r.aggregate_mbps),
            per.join(" "),
            r.tenant_cycles_per_request
                .map_or("-".into(), |c| format!("{c:.0}")),
            r.server_utilisation
                .map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
            r.server_cycles_per_request
                .map_or("-".into(), |c| format!("{c:.0}")),
        ]);
    }
    s += &crate::table::table_text(&table);
    s += "cyc/req: the tenants' (or the in-process caller's) own CPU per request, waits excluded \
          (thread CPU time x nominal clock); server: the back-end thread's busy share of the slice; \
          srv cyc/req: the back-end thread's CPU per request, its polling between bursts included\n";
    s
}

/// Ratios against the study's figures and the tenant bars.
pub fn derived(rows: &[Row], algorithm: Algorithm) -> String {
    let mut s = String::from("derived:\n");
    let ratio = |a: Option<&Row>, b: Option<&Row>| match (a, b) {
        (Some(a), Some(b)) if b.aggregate_mbps > 0.0 => Some(a.aggregate_mbps / b.aggregate_mbps),
        _ => None,
    };
    let engines: Vec<EngineKind> = {
        let mut v: Vec<EngineKind> = rows.iter().map(|r| r.engine).collect();
        v.dedup();
        v
    };
    for engine in engines {
        if let Some(x) = ratio(
            find(rows, engine, Mode::Shm, 1, studies::SHM_OF_HOST_BYTES),
            find(rows, engine, Mode::InProcessAsync, 1, studies::SHM_OF_HOST_BYTES),
        ) {
            // The study's card took far longer per request than the
            // transport; soft here computes 1420 B in a few hundred
            // cycles, which no copy-in/copy-out transport can hide.
            let verdict = match (engine, x >= studies::SHM_OF_HOST_BAR) {
                (_, true) => "ok",
                (EngineKind::Soft, false) => {
                    "(transport-bound: the crypto is cheaper than the copies; the bar is sec's)"
                }
                (_, false) => "BELOW BAR",
            };
            s += &format!(
                "  {engine}: one tenant over shm / in-process at {size} B: {x:.2}x (study: {:.0} %+ of host; bar >= {bar:.2}) {verdict}\n",
                studies::SHM_OF_HOST * 100.0,
                size = studies::SHM_OF_HOST_BYTES,
                bar = studies::SHM_OF_HOST_BAR,
            );
        }
        for (size, shm, socket) in studies::SHM_OVER_SOCKET {
            let study = format!("{shm} vs {socket} Mb/s, {:.2}x", shm / socket);
            if let Some(x) = ratio(
                find(rows, engine, Mode::Shm, 1, size),
                find(rows, engine, Mode::Socket, 1, size),
            ) {
                // Behind a modelled device both transports wait for the
                // device; the transport's own cost shows with soft.
                let verdict = match (engine, x >= studies::SHM_OVER_SOCKET_BAR) {
                    (_, true) => "ok",
                    (EngineKind::Sec, false) => "(device-bound: the transport is hidden; the bar is soft's)",
                    (_, false) => "BELOW BAR",
                };
                s += &format!(
                    "  {engine}: shm / socket at {size} B, one tenant: {x:.2}x (study: {study}; bar >= {}) {verdict}\n",
                    studies::SHM_OVER_SOCKET_BAR
                );
            }
        }
        if engine == EngineKind::Sec {
            let sizes: Vec<usize> = {
                let mut v: Vec<usize> = rows.iter().map(|r| r.size).collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            if algorithm.is_aead() {
                s += &format!(
                    "  sec: with {algorithm} the sync caller is one request waited for; \
                     --algorithms aes128-sha1 gives the cipher-then-MAC caller of --style sync\n"
                );
            }
            for size in sizes {
                let Some(sync) = find(rows, engine, Mode::InProcessSync, 1, size) else {
                    continue;
                };
                let best = rows
                    .iter()
                    .filter(|r| r.engine == engine && r.mode == Mode::Shm && r.tenants >= 2 && r.size == size)
                    .max_by(|a, b| a.aggregate_mbps.total_cmp(&b.aggregate_mbps));
                if let Some(best) = best {
                    let x = best.aggregate_mbps / sync.aggregate_mbps.max(f64::MIN_POSITIVE);
                    s += &format!(
                        "  sec: {} tenants over shm together / one in-process sync caller at {size} B: {x:.2}x \
                         (study: the guests' aggregate exceeded a single host caller; bar > 1) {}\n",
                        best.tenants,
                        if x > 1.0 { "ok" } else { "BELOW BAR" }
                    );
                }
            }
        }
    }
    s
}

/// `espgw bench --tenants ...`.
pub fn run(options: &Options) -> anyhow::Result<()> {
    if options.hostile {
        let report = hostile(options)?;
        print!("{}", report.text());
        if let Some(path) = &options.json {
            std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        return Ok(());
    }
    let rows = measure(options, |r| {
        eprintln!(
            "  {} {} B {} x{}: {:.0} Mb/s",
            r.engine,
            r.size,
            r.mode.name(),
            r.tenants,
            r.aggregate_mbps
        )
    })?;
    print!("{}", table(&rows, options));
    print!("{}", derived(&rows, options.algorithm));
    if let Some(path) = &options.json {
        let json = serde_json::json!({
            "algorithm": options.algorithm.keyword(),
            "window": WINDOW,
            "slice_ms": options.slice.as_millis() as u64,
            "repetitions": options.repetitions,
            "machine": Machine::detect(),
            "rows": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Flooding threads, each with connections of its own (the review's
/// attack was four processes on one socket: the same load on the server).
const FLOODERS: usize = 4;
/// Idle connections the hostile tenant keeps open (the review's 64).
const IDLE: usize = 64;
/// How long the hostile load runs before a slice is measured.
const HOSTILE_WARMUP: Duration = Duration::from_millis(50);
/// How long every hostile thread may take to act once (attaching waits on
/// the server's rationed control path, slow on a loaded host).
const HOSTILE_START_WITHIN: Duration = Duration::from_secs(20);

/// What the hostile tenant did during the hostile slices.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct HostileCounts {
    /// Control messages it got into its sockets (garbage, and stats
    /// requests whose answers it never read).
    pub flood_messages: u64,
    /// Connections it made for flooding (again after each eviction).
    pub flood_connections: u64,
    /// Resizes of its shared region it tried.
    pub resizes_tried: u64,
    /// Of `resizes_tried`, those the kernel allowed.
    pub resizes_allowed: u64,
    /// Idle connections it opened (again after each was closed).
    pub idle_connections: u64,
    /// CPU time its threads used, in ns.
    pub cpu_ns: u64,
}

impl HostileCounts {
    fn add(&mut self, o: HostileCounts) {
        self.flood_messages += o.flood_messages;
        self.flood_connections += o.flood_connections;
        self.resizes_tried += o.resizes_tried;
        self.resizes_allowed += o.resizes_allowed;
        self.idle_connections += o.idle_connections;
        self.cpu_ns += o.cpu_ns;
    }
}

/// The hostile tenant's threads, running until stopped.
struct Hostility {
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// One bit per thread, set once it has done its hostile act at least
    /// once: the hostile slices start only when every bit is set, so that
    /// on a loaded host they never measure a tenant still attaching.
    acted: Arc<std::sync::atomic::AtomicU32>,
    threads: Vec<std::thread::JoinHandle<HostileCounts>>,
}

impl Hostility {
    fn start(socket: &std::path::Path) -> Hostility {
        use accel::shared::hostile::RawTenant;
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let acted = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut threads = Vec::new();
        for k in 0..FLOODERS {
            let (stop, socket, acted) = (Arc::clone(&stop), socket.to_path_buf(), Arc::clone(&acted));
            threads.push(std::thread::spawn(move || {
                let mut c = HostileCounts::default();
                // Half send garbage, half valid requests never read.
                let msg: &[u8] = if k % 2 == 0 {
                    &[0x42; 16]
                } else {
                    &[accel::shared::wire::op::STATS]
                };
                while !stop.load(Ordering::Relaxed) {
                    let Ok(t) = RawTenant::attach(&socket, Transport::Shm, 16, 2048) else {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    c.flood_connections += 1;
                    let _ = t.set_timeouts(Duration::from_millis(20));
                    while !stop.load(Ordering::Relaxed) {
                        match t.send_blocking(msg) {
                            Ok(()) => {
                                c.flood_messages += 1;
                                acted.fetch_or(1 << k, Ordering::Relaxed);
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            // Evicted: connect again.
                            Err(_) => break,
                        }
                    }
                }
                c.cpu_ns = thread_cpu_ns();
                c
            }));
        }
        {
            let (stop, socket, acted) = (Arc::clone(&stop), socket.to_path_buf(), Arc::clone(&acted));
            threads.push(std::thread::spawn(move || {
                let mut c = HostileCounts::default();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(t) = RawTenant::attach(&socket, Transport::Shm, 16, 2048) {
                        for len in [0, t.region_len() * 4] {
                            c.resizes_tried += 1;
                            if t.truncate(len).is_ok() {
                                c.resizes_allowed += 1;
                            }
                        }
                        acted.fetch_or(1 << FLOODERS, Ordering::Relaxed);
                        // Make the server look at the region.
                        t.ring();
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                c.cpu_ns = thread_cpu_ns();
                c
            }));
        }
        {
            let (stop, socket, acted) = (Arc::clone(&stop), socket.to_path_buf(), Arc::clone(&acted));
            threads.push(std::thread::spawn(move || {
                let mut c = HostileCounts::default();
                let mut idle: Vec<RawTenant> = Vec::with_capacity(IDLE);
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    // Those the server closed are opened again.
                    idle.retain(|t| t.recv(&mut buf).is_ok());
                    while idle.len() < IDLE && !stop.load(Ordering::Relaxed) {
                        match RawTenant::connect(&socket) {
                            Ok(t) => {
                                c.idle_connections += 1;
                                acted.fetch_or(1 << (FLOODERS + 1), Ordering::Relaxed);
                                idle.push(t);
                            }
                            Err(_) => break,
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                c.cpu_ns = thread_cpu_ns();
                c
            }));
        }
        Hostility { stop, acted, threads }
    }

    /// Waits until every hostile thread has acted at least once.
    fn wait_until_acting(&self, within: Duration) -> anyhow::Result<()> {
        let all = (1u32 << (FLOODERS + 2)) - 1;
        let until = Instant::now() + within;
        loop {
            let acted = self.acted.load(std::sync::atomic::Ordering::Relaxed);
            if acted == all {
                return Ok(());
            }
            if Instant::now() >= until {
                anyhow::bail!(
                    "the hostile tenant's threads did not all get going within {within:?} \
                     (acted: {acted:#b} of {all:#b}); the host is too busy for this comparison"
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(self) -> HostileCounts {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut total = HostileCounts::default();
        for t in self.threads {
            if let Ok(c) = t.join() {
                total.add(c);
            }
        }
        total
    }
}

/// `--tenants --hostile`: the good tenant's round trips per second,
/// alone and beside the hostile tenant, in alternating slices.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostileReport {
    /// Request size of the good tenant's round trips, in bytes.
    pub size: usize,
    /// Length of each slice, in ms.
    pub slice_ms: u64,
    /// Round trips per second of each slice alone, in the order run.
    pub alone: Vec<f64>,
    /// Round trips per second of each slice beside the hostile tenant.
    pub hostile: Vec<f64>,
    /// Median of `alone`, round trips per second.
    pub alone_median: f64,
    /// Median of `hostile`, round trips per second.
    pub hostile_median: f64,
    /// `hostile_median / alone_median`.
    pub ratio: f64,
    /// The median over pairs of slices (each hostile slice over the alone
    /// slice just before it): steadier than the ratio of medians while the
    /// host's load moves between slices.
    pub pair_ratio: f64,
    /// /proc/loadavg's 1-minute figure before the slices (NaN: unreadable).
    pub load_before: f64,
    /// The same figure after them.
    pub load_after: f64,
    /// What the hostile tenant did, summed over the hostile slices.
    pub counts: HostileCounts,
    /// The server's counters when the run ended (evictions, idle
    /// connections closed, malformed messages, ...).
    pub server: accel::shared::StatsReply,
    /// The server thread's CPU time over the slices alone, in ns.
    pub server_cpu_alone_ns: u64,
    /// The server thread's CPU time over the hostile slices, in ns.
    pub server_cpu_hostile_ns: u64,
    /// The server's time on its control path over the hostile slices.
    pub server_control_hostile_ns: u64,
}

impl HostileReport {
    /// The report as the terminal shows it: the slices, what the hostile
    /// tenant did, CPU times, the server's counters, and the ratios
    /// against the 0.90 bar.
    pub fn text(&self) -> String {
        let mut s = format!(
            "shared engine under a hostile tenant: one good tenant's round trips ({} B, one request at a time, soft, shm), \
             {} ms slices alternating alone / beside the hostile tenant\n",
            self.size, self.slice_ms
        );
        let mut table = crate::table::plain_table(&["slices", "round trips/s (each)", "median"], &[2]);
        for (name, v, m) in [
            ("alone", &self.alone, self.alone_median),
            ("hostile", &self.hostile, self.hostile_median),
        ] {
            let each: Vec<String> = v.iter().map(|r| format!("{r:.0}")).collect();
            table.add_row([name.to_string(), each.join(" "), format!("{m:.0}")]);
        }
        s += &crate::table::table_text(&table);
        let c = &self.counts;
        s += &format!(
            "hostile tenant: {} control messages flooded over {} connections, {} of {} resizes allowed, \
             {} idle connections opened\n",
            c.flood_messages, c.flood_connections, c.resizes_allowed, c.resizes_tried, c.idle_connections
        );
        s += &format!(
            "CPU: the server thread {:.0} ms alone, {:.0} ms beside the hostile tenant ({:.1} ms of it on \
             the control path) over the measured slices; the hostile tenant's threads {:.0} ms in all\n",
            self.server_cpu_alone_ns as f64 / 1e6,
            self.server_cpu_hostile_ns as f64 / 1e6,
            self.server_control_hostile_ns as f64 / 1e6,
            c.cpu_ns as f64 / 1e6
        );
        let v = &self.server;
        s += &format!(
            "server: {} evicted, {} idle connections closed, {} malformed, {} executed, {} tenants left\n",
            v.evicted, v.idle_closed, v.malformed, v.executed, v.tenants
        );
        s += &format!(
            "derived: with the hostile tenant / alone: {:.2}x of the medians, {:.2}x the median pair \
             (bar >= 0.90) {}; load average {:.2} before, {:.2} after\n",
            self.ratio,
            self.pair_ratio,
            if self.ratio >= 0.90 { "ok" } else { "BELOW BAR" },
            self.load_before,
            self.load_after
        );
        s
    }
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Runs the hostile comparison: a server, one good tenant over shm doing
/// round trips of the first request size, and `repetitions` pairs of
/// slices (alone, then beside the hostile tenant).
pub fn hostile(options: &Options) -> anyhow::Result<HostileReport> {
    let size = options.sizes.first().copied().unwrap_or(64);
    let socket = std::env::temp_dir().join(format!("espgw-bench-{}-hostile.sock", std::process::id()));
    let mut config = ServerConfig::new(socket.clone(), engine_spec(EngineKind::Soft, &options.profile)?);
    config.quota = WINDOW;
    let server = spawn(config).context("starting the server")?;
    let mut good = SharedEngine::attach(&SharedSpec {
        socket: socket.clone(),
        transport: Transport::Shm,
        entries: WINDOW as u32,
        slot_size: (size + 256) as u32,
        ..SharedSpec::default()
    })?;
    let handle = good.register(&session_spec(options.algorithm)?)?;
    let mut idle = jobs(handle, options.algorithm, size);
    let start = Instant::now();
    let load_before = load_average();
    let mut slice = |good: &mut SharedEngine| {
        let driven = drive(good, &mut idle, 1, false, Instant::now() + options.slice, start);
        driven.done as f64 / driven.elapsed.as_secs_f64().max(1e-9)
    };
    slice(&mut good);
    let (mut alone, mut hostile) = (Vec::new(), Vec::new());
    let mut counts = HostileCounts::default();
    let (mut server_cpu_alone_ns, mut server_cpu_hostile_ns, mut server_control_hostile_ns) = (0, 0, 0);
    for _ in 0..options.repetitions {
        let cpu = server.cpu_ns();
        alone.push(slice(&mut good));
        server_cpu_alone_ns += server.cpu_ns().saturating_sub(cpu);
        let h = Hostility::start(&socket);
        if let Err(e) = h.wait_until_acting(HOSTILE_START_WITHIN) {
            h.stop();
            return Err(e);
        }
        std::thread::sleep(HOSTILE_WARMUP);
        let (cpu, control) = (server.cpu_ns(), server.control_ns());
        hostile.push(slice(&mut good));
        server_cpu_hostile_ns += server.cpu_ns().saturating_sub(cpu);
        server_control_hostile_ns += server.control_ns().saturating_sub(control);
        counts.add(h.stop());
    }
    let load_after = load_average();
    drop(good);
    let stats = server.stats();
    server.stop()?;
    let (alone_median, hostile_median) = (median(&mut alone.clone()), median(&mut hostile.clone()));
    let pair_ratio = median(
        &mut alone
            .iter()
            .zip(&hostile)
            .map(|(a, h)| h / a.max(f64::MIN_POSITIVE))
            .collect::<Vec<_>>(),
    );
    Ok(HostileReport {
        size,
        slice_ms: options.slice.as_millis() as u64,
        alone,
        hostile,
        alone_median,
        hostile_median,
        ratio: hostile_median / alone_median.max(f64::MIN_POSITIVE),
        pair_ratio,
        load_before,
        load_after,
        counts,
        server: stats,
        server_cpu_alone_ns,
        server_cpu_hostile_ns,
        server_control_hostile_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny run: every cell is there, every tenant moved requests, and
    /// the derived lines quote the study.
    #[test]
    fn every_cell_measures_and_the_derived_lines_quote_the_study() {
        let options = Options {
            tenants: vec![1, 2],
            transports: Transport::ALL.to_vec(),
            sizes: vec![1420, 4096],
            engines: vec![EngineKind::Soft, EngineKind::Sec],
            // GCM comes from ring's assembly even in a debug build, where
            // the HMAC crates are too slow for short slices.
            algorithm: Algorithm::Aes128Gcm16,
            slice: Duration::from_millis(20),
            repetitions: 1,
            profile: "sec2-266mhz".into(),
            json: None,
            hostile: false,
        };
        let rows = measure(&options, |_| {}).expect("measures");
        // soft: async + 2 transports x 2 counts; sec adds the sync caller.
        assert_eq!(rows.len(), 2 * (1 + 4) + 2 * (2 + 4));
        for r in &rows {
            assert_eq!(r.per_tenant_mbps.len(), r.tenants, "{r:?}");
            assert!(
                r.per_tenant_mbps.iter().all(|m| *m > 0.0),
                "every tenant is served: {r:?}"
            );
            assert_eq!(
                r.server_utilisation.is_some(),
                matches!(r.mode, Mode::Shm | Mode::Socket)
            );
        }
        let text = derived(&rows, options.algorithm);
        for want in ["95 %+", "2000 vs 1600", "exceeded a single host caller"] {
            assert!(text.contains(want), "{text}");
        }
        assert!(table(&rows, &options).contains("in-process sync"));
        assert!(measure(
            &Options {
                tenants: vec![0],
                ..options
            },
            |_| {}
        )
        .is_err());
    }
}

#[cfg(test)]
mod hostile_tests {
    use super::*;

    /// A tiny hostile run: both kinds of slices measured, the hostile
    /// tenant did all three things, no resize was allowed, and the server
    /// evicted flooders and closed idle connections. (The bar itself is a
    /// benchmark figure, not checked here.)
    #[test]
    fn the_hostile_comparison_measures_both_and_the_hostile_tenant_acts() {
        let options = Options {
            tenants: vec![1],
            transports: vec![Transport::Shm],
            sizes: vec![64],
            engines: vec![EngineKind::Soft],
            algorithm: Algorithm::Aes128Gcm16,
            slice: Duration::from_millis(100),
            repetitions: 1,
            profile: "sec2-266mhz".into(),
            json: None,
            hostile: true,
        };
        let r = hostile(&options).expect("measures");
        assert_eq!((r.alone.len(), r.hostile.len()), (1, 1));
        assert!(r.alone[0] > 0.0 && r.hostile[0] > 0.0, "{r:?}");
        let c = r.counts;
        assert!(
            c.flood_messages > 0 && c.resizes_tried > 0 && c.idle_connections > 0,
            "{c:?}"
        );
        assert_eq!(c.resizes_allowed, 0, "{c:?}");
        assert!(r.server.evicted > 0, "{:?}", r.server);
        assert!(r.text().contains("bar >= 0.90"));
    }
}
