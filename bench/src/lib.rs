//! The measurement lab.
//!
//! Owns traffic generation, the sweep runner, measurement (ns and estimated
//! cycles per packet), tables and CSV/JSON output. Drives the same gateway
//! core as `espgw run` and `espgw pcap`, configured from generated TOML;
//! must not reach into the dataplane's internals or time anything but whole
//! batches through public entry points.

#![warn(missing_docs, unreachable_pub)]

pub mod html;
pub mod io;
pub mod measure;
pub mod offload;
pub mod plot;
pub mod report;
pub mod scale;
pub mod scenario;
pub mod studies;
pub mod summary;
#[cfg(test)]
pub(crate) mod synthetic;
pub mod table;
pub mod tenants;

use std::path::PathBuf;
use std::time::Duration;

use accel::{Algorithm, BufferPolicy, DeviceProfile, EngineKind, Style};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};

use crate::measure::{Samples, Timing, FRAME_OVERHEAD, MIN_FRAME};
use dataplane::Gateway;

use crate::scenario::{CompletionMode, Knobs, Scenario};

/// Frame sizes of the default sweep (`--sizes`), in bytes on the wire with
/// FCS: from the smallest Ethernet frame to the largest untagged one.
pub const DEFAULT_SIZES: [usize; 7] = [64, 128, 256, 512, 1024, 1420, 1518];
/// Transforms of the default sweep (`--algorithms`): the two AEADs
/// (AES-GCM, ChaCha20-Poly1305), AES-CBC and 3DES-CBC with HMAC-SHA-1.
pub const DEFAULT_ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Aes128Gcm16,
    Algorithm::ChaCha20Poly1305,
    Algorithm::Aes128Sha1,
    Algorithm::TripleDesSha1,
];

/// `espgw bench` options.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Instead of the sweep: compare ways of reading frames from an
    /// interface (recvmmsg, pnet, io_uring) on a veth pair (root).
    #[arg(long)]
    pub io: bool,
    /// Instead of the in-memory sweep: the end-to-end benchmark (root,
    /// iperf3): the demo's four namespaces with kernel forwarding, then with
    /// two espgw gateways; TCP x1/x4, UDP 64/1400 B at <= 1 % loss, gateway
    /// cycles per packet. `--json` writes the figures.
    #[arg(long)]
    pub veth: bool,
    /// `--veth`: prefix of the four namespaces' names (PREFIX-hostA,
    /// PREFIX-gwA, ...), so that a run may go beside the demo's `espgw-*`.
    #[arg(long, default_value = "ebench")]
    pub veth_prefix: String,
    /// `--veth`: seconds of one iperf3 TCP run.
    #[arg(long, default_value_t = 3)]
    pub tcp_seconds: u32,
    /// `--veth`: seconds of one iperf3 UDP probe of the loss bisection.
    #[arg(long, default_value_t = 1)]
    pub udp_seconds: u32,
    /// `--veth`: TCP runs per figure; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub tcp_runs: usize,
    /// `--veth`: bisection steps per UDP size after the unlimited probe.
    #[arg(long, default_value_t = 5)]
    pub udp_probes: usize,
    /// Scenario kinds to run: any of ipv4-fwd, esp-null, ipv6 (ipv6-fwd
    /// and esp-null-ipv6, from 66-byte frames), esp, raw, extra (the
    /// buffer and completion comparisons), boundary, burst, qat, speedup,
    /// tenants (one tenant over shm and socket). Default: all.
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Pin the measuring (dataplane) thread to this CPU.
    #[arg(long, value_name = "CPU")]
    pub pin: Option<usize>,
    /// Ethernet frame sizes in bytes, FCS included (64..=1518).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_SIZES)]
    pub sizes: Vec<usize>,
    /// Transforms measured besides the ipv4-fwd and esp-null baselines.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_ALGORITHMS)]
    pub algorithms: Vec<Algorithm>,
    /// Length of one timed repetition, in milliseconds.
    #[arg(long, default_value_t = 60)]
    pub slice_ms: u64,
    /// Timed repetitions per cell (after a warm-up); the median is reported.
    #[arg(long, default_value_t = 7)]
    pub repetitions: usize,
    /// Also write every cell as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write every cell as CSV here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Also draw charts (SVG and PNG) into this directory, creating it.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Write the report into this directory, creating it: index.html (one
    /// self-contained page: the conditions, the studies side by side, the
    /// charts, the full tables), bench.json and bench.csv.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Print the full tables and derived lines instead of the summary.
    #[arg(long)]
    pub tables: bool,
    /// Sweep only this engine (soft, sec, afalg or shared). Default: soft inline and
    /// the sec engine model.
    #[arg(long)]
    pub engine: Option<EngineKind>,
    /// Sweep only this submission style (sync, dual-pass or async).
    /// Default: soft in its inline single pass (async), sec in all three.
    #[arg(long)]
    pub style: Option<Style>,
    /// Buffer policy of the ESP scenarios: registered or per-request.
    #[arg(long, default_value_t = BufferPolicy::Registered)]
    pub buffers: BufferPolicy,
    /// Device profile of the sec engine model: none (infinitely fast: the
    /// boundary's host cost alone), sec2-266mhz or qat-class.
    #[arg(long, alias = "profile", default_value = "sec2-266mhz")]
    pub rate: String,
    /// Completion signalling of the sec engine: interrupt, polling or coalesced.
    #[arg(long, default_value = "interrupt")]
    pub completion: String,
    /// Packets per timed repetition of a sec cell (fixed, so that the
    /// modelled figures are the same in every run).
    #[arg(long, default_value_t = 512)]
    pub packets: usize,
    /// Run the sec cells on the threaded engine (channel threads that
    /// busy-poll on other cores, host speed, wall clock) instead of the
    /// model. Needs a spare core per channel; its figures depend on the
    /// scheduler. Not part of the default sweep.
    #[arg(long)]
    pub sec_threads: bool,
    /// Instead of the sweep: one engine shared by this many tenants at a
    /// time (e.g. 1,2,4) through `espgw engine serve`'s server, beside the
    /// same engine in-process. `--engine` picks soft or sec (default both),
    /// the first of `--algorithms` is used.
    #[arg(long, value_delimiter = ',')]
    pub tenants: Vec<usize>,
    /// `--engine shared`: the socket of the `espgw engine serve` to sweep
    /// through (default /run/espgw/engine.sock).
    #[arg(long, value_name = "PATH")]
    pub engine_socket: Option<PathBuf>,
    /// With `--tenants`: instead of the sweep, one good tenant's round trips
    /// alone and beside a hostile tenant (flooding its control socket,
    /// resizing its shared region, holding idle connections), in
    /// alternating slices of `--slice-ms`, `--repetitions` pairs.
    #[arg(long)]
    pub hostile: bool,
    /// `--tenants`: transports to measure, shm and/or socket.
    #[arg(long, value_delimiter = ',', default_values_t = accel::shared::Transport::ALL)]
    pub transport: Vec<accel::shared::Transport>,
    /// `--tenants`: request sizes in bytes (ESP packets, and the study's
    /// 4 KB and 8 KB requests).
    #[arg(long, value_delimiter = ',', default_values_t = tenants::DEFAULT_REQUEST_SIZES)]
    pub request_sizes: Vec<usize>,
    /// Instead of the sweep: the scaling run with traffic spread over this
    /// many tunnels per row (e.g. 1,100,10000): encapsulation and SPD
    /// lookup time per packet, memory, and SA install / rekey / delete
    /// rates while traffic flows. Frame size: the smallest of `--sizes`;
    /// transform: the first of `--algorithms`.
    #[arg(long, value_delimiter = ',')]
    pub tunnels: Vec<usize>,
    /// With `--tunnels` (or alone, for one tunnel): pad the SPD to this
    /// many policies per row (e.g. 10,1000,100000), consulted before the
    /// tunnels' own.
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<usize>,
    /// With `--tunnels`: SAs installed, tunnels rekeyed and SAs deleted
    /// per row while traffic flows.
    #[arg(long, default_value_t = 10_000)]
    pub churn: usize,
}

/// What a cell measured. Its name (in the results' JSON and CSV) is the
/// variant in kebab case, for serde and strum alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Path {
    /// Site A alone: inside → ESP out (or forward, for ipv4-fwd).
    Encap,
    /// Site B alone: ESP in → inside.
    Decap,
    /// A then B, joined in memory.
    RoundTrip,
    /// The raw primitive: encrypt (and MAC).
    Encrypt,
    /// The raw primitive: verify and decrypt.
    Decrypt,
}

impl Path {
    /// The path's name in the results' JSON and CSV: `encap`, `decap`,
    /// `round-trip`, `encrypt` or `decrypt`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Gateways a packet crosses on this path.
    pub fn gateways(self) -> usize {
        match self {
            Path::Encap | Path::Decap => 1,
            Path::RoundTrip => 2,
            Path::Encrypt | Path::Decrypt => 0,
        }
    }
}

/// Per-packet figures from the engine's counters over a cell.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Metrics {
    /// Bytes the `sec` engine moved across its modelled bus per packet
    /// (descriptors, keys/context, data in, data out), from counter deltas
    /// over the whole cell. `None` where there is no bus (soft, afalg, raw).
    pub bus_bytes_per_packet: Option<f64>,
    /// Bytes moved through memory per packet: each frame in from and out to
    /// the (modelled) NIC, plus the engine's bus bytes. `ipv4-fwd` moves
    /// 2 × frame bytes per gateway by this definition. `None` for raw rows.
    pub moved_bytes_per_packet: Option<f64>,
    /// Busy time of the engine's busiest execution unit over the cell's
    /// wall-clock time (round trip: both engines' busiest units summed).
    pub engine_utilisation: Option<f64>,
}

/// One measured cell.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cell {
    /// What ran: the traffic and, for ESP, the transform, engine, style and
    /// knobs; serialised as its name (`aes128gcm16/sec/async`).
    pub scenario: Scenario,
    /// Which gateways (or which primitive direction) the time covers.
    pub path: Path,
    /// Ethernet frame size in bytes on the wire, FCS included (64..=1518).
    pub frame_size: usize,
    /// Time per packet in each timed repetition, and the packets counted.
    pub samples: Samples,
    /// Per-packet figures from the engine's counters.
    pub metrics: Metrics,
    /// `sec` model cells: host measured, device modelled (`samples` then
    /// holds the system's time per packet per repetition).
    pub offload: Option<offload::Offload>,
}

impl Cell {
    /// Median time per packet over the repetitions, in ns: the cell's
    /// headline figure (`ns_per_packet` in the JSON and CSV).
    pub fn ns(&self) -> f64 {
        self.samples.median()
    }

    /// Packets per second one core handles at [`Cell::ns`] per packet.
    pub fn packets_per_second(&self) -> f64 {
        1e9 / self.ns()
    }

    /// [`Cell::packets_per_second`] in Gbit/s (10^9 bits per second) of
    /// whole `frame_size`-byte frames, FCS included.
    pub fn gbit_per_second(&self) -> f64 {
        self.packets_per_second() * self.frame_size as f64 * 8.0 / 1e9
    }

    /// What `ipv4-fwd` moves on the same path: 2 × frame bytes per gateway.
    pub fn ipv4_fwd_bytes(&self) -> Option<f64> {
        let gateways = self.path.gateways();
        (gateways > 0).then(|| (2 * gateways * self.frame_size) as f64)
    }

    /// Moved bytes per packet over `ipv4-fwd`'s, as a fraction (0.25 = +25%).
    pub fn moved_over_ipv4_fwd(&self) -> Option<f64> {
        Some(self.metrics.moved_bytes_per_packet? / self.ipv4_fwd_bytes()? - 1.0)
    }
}

/// Results of a sweep, plus what is needed to read them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sweep {
    /// Every measured cell in the order run: the main scenarios at each
    /// size, then the comparison cells, then the study cells.
    pub cells: Vec<Cell>,
    /// Engines and styles of the ESP scenarios, buffers, completion, rate.
    pub engine: String,
    /// Buffer policy and completion of the main ESP scenarios; cells with
    /// other knobs are the registration and completion comparison.
    pub knobs: Knobs,
    /// Rate model of the sec engine (`none` or `sec2-266mhz`).
    pub rate: String,
    /// The CPU the cells ran on, and its clock for estimated cycles.
    pub machine: report::Machine,
    /// Length of one timed repetition in ms (`--slice-ms`).
    pub slice_ms: u64,
    /// Timed repetitions per cell after the warm-up (`--repetitions`).
    pub repetitions: usize,
    /// Packets per repetition of a sec model cell.
    pub packets: usize,
    /// The sec cells ran on the threaded engine (`--sec-threads`).
    pub threads: bool,
    /// The microcontroller study: engine vs software per primitive.
    pub speedups: Vec<Speedup>,
    /// The shared-engine study: one tenant over shm and socket beside
    /// the engine in-process (empty when not run).
    pub tenants: Vec<tenants::Row>,
    /// Where and when: host, clock source, load before and after.
    pub conditions: report::Conditions,
}

/// One primitive at one size: this host's software time against each
/// modelled part's.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Speedup {
    /// The primitive's name (`3DES-CBC`, `AES-128-GCM`, `HMAC-SHA-1`, ...),
    /// one of [`offload::PRIMITIVES`].
    pub primitive: &'static str,
    /// Bytes one operation processes.
    pub payload: usize,
    /// Measured: median ns per operation.
    pub software_ns: f64,
    /// Modelled, per profile: (profile, idle-engine latency ns, ns per
    /// operation in a burst of 32).
    pub engine_ns: Vec<(&'static str, f64, f64)>,
}

impl Sweep {
    /// The cell of `scenario` on `path` at `frame_size` bytes, if measured.
    pub fn get(&self, scenario: Scenario, path: Path, frame_size: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.scenario == scenario && c.path == path && c.frame_size == frame_size)
    }

    /// Scenarios in sweep order.
    pub fn scenarios(&self) -> Vec<Scenario> {
        let mut list: Vec<Scenario> = Vec::new();
        for c in &self.cells {
            if !list.contains(&c.scenario) {
                list.push(c.scenario);
            }
        }
        list
    }

    /// Frame sizes measured, ascending.
    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.cells.iter().map(|c| c.frame_size).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// Whether `scenario`'s cells come from the sec engine model.
    pub fn is_modelled(&self, scenario: &Scenario) -> bool {
        self.cells
            .iter()
            .any(|c| c.scenario == *scenario && c.offload.is_some())
    }

    /// Whether `scenario` is one of the registration/completion comparison
    /// cells rather than a row of the main sweep.
    pub fn is_extra(&self, scenario: &Scenario) -> bool {
        matches!(scenario, Scenario::Esp { knobs, .. } if *knobs != self.knobs)
    }
}

/// Engines and styles the ESP scenarios run on: `--engine` and `--style`
/// narrow the default of soft inline plus sec in all three styles.
pub fn engine_styles(engine: Option<EngineKind>, style: Option<Style>) -> Vec<(EngineKind, Style)> {
    let kinds = engine.map_or_else(|| vec![EngineKind::Soft, EngineKind::Sec], |k| vec![k]);
    kinds
        .into_iter()
        .flat_map(|kind| match style {
            Some(style) => vec![(kind, style)],
            // Soft runs inline: its natural form is one single pass.
            None if kind == EngineKind::Soft => vec![(kind, Style::Async)],
            None => Style::ALL.iter().map(|&s| (kind, s)).collect(),
        })
        .collect()
}

/// The main scenarios: the two baselines, then per algorithm every engine
/// and style, then the raw ceiling. `esp-null` runs on the first engine.
pub fn scenarios(algorithms: &[Algorithm], engines: &[(EngineKind, Style)], knobs: Knobs) -> Vec<Scenario> {
    let esp = |algorithm, (engine, style): (EngineKind, Style)| Scenario::Esp {
        algorithm,
        engine,
        style,
        knobs,
    };
    let mut list = vec![Scenario::Ipv4Forward];
    if let Some(&first) = engines.first() {
        list.push(esp(Algorithm::Null, first));
    }
    // The same two baselines for IPv6.
    list.extend([Scenario::Ipv6Forward, Scenario::EspNull6]);
    let mut seen = Vec::new();
    for &algorithm in algorithms.iter().filter(|a| **a != Algorithm::Null) {
        if seen.contains(&algorithm) {
            continue;
        }
        seen.push(algorithm);
        // An engine without the algorithm (the SEC has no ChaCha20 unit)
        // has no cell for it.
        for &pair in engines.iter().filter(|(engine, _)| engine.supports(algorithm)) {
            list.push(esp(algorithm, pair));
        }
        list.push(Scenario::RawCrypto { algorithm });
    }
    list
}

/// The registration and completion comparison: for one algorithm
/// (aes128-sha1 if swept) on sec/async, the other buffer policy and the
/// other two completion modes, at two sizes (64 and 1420 if swept, else
/// the smallest and largest). Empty when sec/async is not swept.
pub fn extra_scenarios(
    algorithms: &[Algorithm],
    engines: &[(EngineKind, Style)],
    knobs: Knobs,
    sizes: &[usize],
) -> (Vec<Scenario>, Vec<usize>) {
    let Some(algorithm) = algorithms
        .iter()
        .copied()
        .find(|a| *a == Algorithm::Aes128Sha1)
        .or_else(|| {
            algorithms
                .iter()
                .copied()
                .find(|a| *a != Algorithm::Null && EngineKind::Sec.supports(*a))
        })
    else {
        return (Vec::new(), Vec::new());
    };
    if !engines.contains(&(EngineKind::Sec, Style::Async)) {
        return (Vec::new(), Vec::new());
    }
    let esp = |knobs| Scenario::Esp {
        algorithm,
        engine: EngineKind::Sec,
        style: Style::Async,
        knobs,
    };
    let mut list = Vec::new();
    for buffers in BufferPolicy::ALL.into_iter().filter(|b| *b != knobs.buffers) {
        list.push(esp(Knobs { buffers, ..knobs }));
    }
    for completion in CompletionMode::ALL.into_iter().filter(|c| *c != knobs.completion) {
        list.push(esp(Knobs { completion, ..knobs }));
    }
    let mut chosen: Vec<usize> = [64, 1420].into_iter().filter(|s| sizes.contains(s)).collect();
    if chosen.is_empty() {
        chosen.extend(sizes.iter().min());
        chosen.extend(sizes.iter().max());
    }
    chosen.sort_unstable();
    chosen.dedup();
    (list, chosen)
}

/// The boundary-cost, burst and fast-part lines: (scenario, sizes).
/// - `none` profile, sec/async with polling (the DPDK way: no interrupts),
///   per algorithm at the smallest and largest size: the boundary's host
///   cost alone;
/// - the burst-size sweep on the same cell for one algorithm at the
///   smallest size: 1, 4, 16, 64, 256 frames per call;
/// - `qat-class` with polling, sec/async per algorithm at every size: when
///   offload starts to pay on a fast host.
pub fn study_scenarios(
    algorithms: &[Algorithm],
    engines: &[(EngineKind, Style)],
    knobs: Knobs,
    sizes: &[usize],
) -> Vec<(&'static str, Scenario, Vec<usize>)> {
    let mut list = Vec::new();
    if !engines.contains(&(EngineKind::Sec, Style::Async)) {
        return list;
    }
    let (Some(&small), Some(&large)) = (sizes.iter().min(), sizes.iter().max()) else {
        return list;
    };
    let mut ends = vec![small, large];
    ends.dedup();
    // Only what the sec model runs (it has no ChaCha20 unit).
    let algs: Vec<Algorithm> = algorithms
        .iter()
        .copied()
        .filter(|a| *a != Algorithm::Null && EngineKind::Sec.supports(*a))
        .collect();
    let esp = |algorithm, knobs| Scenario::Esp {
        algorithm,
        engine: EngineKind::Sec,
        style: Style::Async,
        knobs,
    };
    let none = Knobs {
        profile: "none",
        completion: CompletionMode::Polling,
        ..knobs
    };
    for &a in &algs {
        list.push(("boundary", esp(a, none), ends.clone()));
    }
    if let Some(a) = algs
        .iter()
        .copied()
        .find(|a| *a == Algorithm::Aes128Sha1)
        .or(algs.first().copied())
    {
        for burst in [1, 4, 16, 64, 256] {
            list.push(("burst", esp(a, Knobs { burst, ..none }), vec![small]));
        }
    }
    let qat = Knobs {
        profile: "qat-class",
        completion: CompletionMode::Polling,
        ..knobs
    };
    if knobs.profile != "qat-class" {
        for &a in &algs {
            list.push(("qat", esp(a, qat), sizes.to_vec()));
        }
    }
    list
}

/// Runs the sweep described by `args`.
pub fn sweep(args: &BenchArgs, progress: &ProgressBar) -> anyhow::Result<Sweep> {
    for &size in &args.sizes {
        if !(MIN_FRAME..=1518).contains(&size) {
            bail!("frame size {size} is outside 64..=1518");
        }
    }
    if args.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    let timing = Timing {
        slice: Duration::from_millis(args.slice_ms.max(1)),
        repetitions: args.repetitions,
    };
    let knobs = Knobs {
        buffers: args.buffers,
        completion: CompletionMode::parse(&args.completion)?,
        profile: Knobs::profile_name(&args.rate)?,
        burst: measure::BATCH,
    };
    if args.packets == 0 {
        bail!("--packets must be at least 1");
    }
    let engines = engine_styles(args.engine, args.style);
    const KINDS: [&str; 11] = [
        "ipv4-fwd", "esp-null", "ipv6", "esp", "raw", "extra", "boundary", "burst", "qat", "speedup",
        "tenants",
    ];
    if let Some(bad) = args.scenarios.iter().find(|k| !KINDS.contains(&k.as_str())) {
        bail!(
            "--scenarios: unknown kind `{bad}`; expected any of {}",
            KINDS.join(", ")
        );
    }
    let wanted = |kind: &str| args.scenarios.is_empty() || args.scenarios.iter().any(|k| k == kind);
    let kind_of = |s: &Scenario| match s {
        Scenario::Ipv4Forward => "ipv4-fwd",
        Scenario::Ipv6Forward | Scenario::EspNull6 => "ipv6",
        Scenario::Esp {
            algorithm: Algorithm::Null,
            ..
        } => "esp-null",
        Scenario::Esp { .. } => "esp",
        Scenario::RawCrypto { .. } => "raw",
    };
    if let Some(cpu) = args.pin {
        pin_to(cpu)?;
    }
    let main: Vec<Scenario> = scenarios(&args.algorithms, &engines, knobs)
        .into_iter()
        .filter(|s| wanted(kind_of(s)))
        .collect();
    let (mut extras, extra_sizes) = extra_scenarios(&args.algorithms, &engines, knobs, &args.sizes);
    if !wanted("extra") {
        extras.clear();
    }
    let mut plan: Vec<(Scenario, usize)> = Vec::new();
    for scenario in &main {
        // IPv6 rows start where an IPv6/UDP packet fits a frame.
        let fits = |size: &&usize| !scenario.is_ipv6() || **size >= measure::MIN_FRAME6;
        plan.extend(args.sizes.iter().filter(fits).map(|&size| (*scenario, size)));
    }
    for scenario in &extras {
        plan.extend(extra_sizes.iter().map(|&size| (*scenario, size)));
    }
    if !args.sec_threads {
        for (kind, scenario, sizes) in study_scenarios(&args.algorithms, &engines, knobs, &args.sizes) {
            if wanted(kind) {
                plan.extend(sizes.into_iter().map(|size| (scenario, size)));
            }
        }
    }
    let speedup_sizes = [64, 1024];
    let speedup = wanted("speedup") && engines.iter().any(|(k, _)| *k == EngineKind::Sec);
    // The shared-engine study: soft and sec behind `espgw engine serve`'s
    // server, one tenant per transport, at the study's request sizes.
    let tenant_engines: Vec<EngineKind> = [EngineKind::Soft, EngineKind::Sec]
        .into_iter()
        .filter(|k| engines.iter().any(|(e, _)| e == k))
        .collect();
    let tenant_study =
        (wanted("tenants") && !args.sec_threads && !tenant_engines.is_empty()).then(|| tenants::Options {
            tenants: vec![1],
            transports: accel::shared::Transport::ALL.to_vec(),
            sizes: studies::TENANT_SIZES.to_vec(),
            engines: tenant_engines,
            algorithm: args
                .algorithms
                .iter()
                .copied()
                .find(|a| *a != Algorithm::Null && EngineKind::Sec.supports(*a))
                .unwrap_or(Algorithm::Aes128Gcm16),
            slice: timing.slice,
            repetitions: timing.repetitions,
            profile: knobs.profile.to_owned(),
            json: None,
            hostile: false,
        });
    let conditions = report::Conditions::start();
    let started = std::time::Instant::now();
    progress.set_length(plan.len() as u64 + u64::from(speedup) + tenant_study.as_ref().map_or(0, |_| 1));
    let run = Run {
        timing,
        packets: args.packets,
        threads: args.sec_threads,
        // Leaked once per sweep so that `Run` stays `Copy`.
        engine_socket: args
            .engine_socket
            .as_ref()
            .map(|p| &*Box::leak(p.clone().into_boxed_path())),
    };
    let mut cells = Vec::new();
    for (scenario, size) in plan {
        progress.set_message(format!("{scenario} {size} B"));
        cells.extend(
            measure_cell(scenario, size, run).with_context(|| format!("{scenario} at {size} bytes"))?,
        );
        progress.inc(1);
    }
    let mut speedups = Vec::new();
    if speedup {
        progress.set_message("speed-up per primitive");
        for p in offload::PRIMITIVES {
            for payload in speedup_sizes {
                let runs = (200_000 / payload).clamp(50, 2000);
                let software = offload::software_ns(p, payload, runs, timing.repetitions)?;
                let mut engine_ns = Vec::new();
                for profile in DeviceProfile::all() {
                    if profile.name == "none" {
                        continue;
                    }
                    let (latency, steady) = offload::engine_ns(profile, p, payload)?;
                    engine_ns.push((profile.name, latency, steady));
                }
                speedups.push(Speedup {
                    primitive: p.name,
                    payload,
                    software_ns: offload::median(&software),
                    engine_ns,
                });
            }
        }
        progress.inc(1);
    }
    let mut tenant_rows = Vec::new();
    if let Some(options) = &tenant_study {
        progress.set_message("shared engine: one tenant over shm and socket");
        tenant_rows = tenants::measure(options, |_| {}).context("the shared-engine rows")?;
        progress.inc(1);
    }
    let mut conditions = conditions;
    conditions.finish(started.elapsed());
    let labels: Vec<String> = engines
        .iter()
        .map(|&(engine, style)| match (engine, style) {
            (EngineKind::Soft, Style::Async) => "soft inline".to_owned(),
            _ => format!("{engine}/{style}"),
        })
        .collect();
    Ok(Sweep {
        cells,
        engine: format!(
            "{}; buffers {}, completion {}, rate {}",
            labels.join(", "),
            knobs.buffers,
            knobs.completion,
            args.rate
        ),
        knobs,
        rate: args.rate.clone(),
        machine: report::Machine::detect(),
        slice_ms: args.slice_ms,
        repetitions: args.repetitions,
        packets: args.packets,
        threads: args.sec_threads,
        speedups,
        tenants: tenant_rows,
        conditions,
    })
}

/// How one cell is measured.
#[derive(Debug, Clone, Copy)]
struct Run {
    timing: Timing,
    packets: usize,
    threads: bool,
    /// `--engine shared`: the engine server's socket (None: the default).
    engine_socket: Option<&'static std::path::Path>,
}

/// Engine counters of one gateway, to take deltas over a measurement.
struct Probe {
    bus: u64,
    busiest_ns: Vec<u64>,
}

impl Probe {
    fn take(gateway: &Gateway) -> Probe {
        let counters = gateway.engine_counters();
        Probe {
            bus: counters.bus.total(),
            busiest_ns: counters.eu_busy_ns.iter().map(|(_, ns)| *ns).collect(),
        }
    }

    /// (bus bytes, busiest unit's busy ns) since `self`.
    fn since(&self, gateway: &Gateway) -> (u64, u64) {
        let now = Probe::take(gateway);
        let busiest = now
            .busiest_ns
            .iter()
            .zip(self.busiest_ns.iter().chain(std::iter::repeat(&0)))
            .map(|(after, before)| after.saturating_sub(*before))
            .max()
            .unwrap_or(0);
        (now.bus.saturating_sub(self.bus), busiest)
    }
}

/// Metrics of a path from counter deltas over its measurement: `wire` is
/// the bytes in from and out to the NICs per packet, `deltas` the (bus,
/// busy ns) of each gateway's engine.
fn metrics(engine: EngineKind, samples: &Samples, wire: usize, deltas: &[(u64, u64)]) -> Metrics {
    let packets = samples.processed.max(1) as f64;
    let has_bus = engine == EngineKind::Sec;
    let bus = has_bus.then(|| deltas.iter().map(|d| d.0).sum::<u64>() as f64 / packets);
    Metrics {
        bus_bytes_per_packet: bus,
        moved_bytes_per_packet: Some(wire as f64 + bus.unwrap_or(0.0)),
        engine_utilisation: has_bus
            .then(|| deltas.iter().map(|d| d.1).sum::<u64>() as f64 / samples.wall_ns.max(1) as f64),
    }
}

fn measure_cell(scenario: Scenario, frame_size: usize, run: Run) -> anyhow::Result<Vec<Cell>> {
    let timing = run.timing;
    let cell = |path, samples, metrics| Cell {
        scenario,
        path,
        frame_size,
        samples,
        metrics,
        offload: None,
    };
    let (algorithm, kind) = match scenario {
        Scenario::RawCrypto { algorithm } => {
            let (encrypt, decrypt) = measure::raw_crypto(algorithm, frame_size - FRAME_OVERHEAD, timing)?;
            return Ok(vec![
                cell(Path::Encrypt, encrypt, Metrics::default()),
                cell(Path::Decrypt, decrypt, Metrics::default()),
            ]);
        }
        Scenario::Ipv4Forward | Scenario::Ipv6Forward => (None, EngineKind::Soft),
        Scenario::EspNull6 => (Some(Algorithm::Null), EngineKind::Soft),
        Scenario::Esp {
            algorithm, engine, ..
        } => (Some(algorithm), engine),
    };
    let mut engine = scenario::EngineSetup::for_scenario(&scenario, run.threads);
    if let Some(socket) = run.engine_socket {
        engine.spec.shared.socket = socket.to_path_buf();
    }
    if kind == EngineKind::Sec && !run.threads {
        return measure_offload_cell(scenario, frame_size, &engine, run);
    }
    let ipv6 = scenario.is_ipv6();
    let frame = match ipv6 {
        true => measure::plaintext_frame6(frame_size, frame_size as u8),
        false => measure::plaintext_frame(frame_size, frame_size as u8),
    };
    let expected = measure::expected_ip(&frame, 2);
    let gateway = |a: bool, replay_window: u32| match ipv6 {
        true => scenario::gateway6(algorithm, a, replay_window, &engine),
        false => scenario::gateway(algorithm, a, replay_window, &engine),
    };
    // The ESP frame(s) A makes (two fragments once ESP no longer fits the
    // MTU), for decapsulation alone; then encapsulation alone.
    let mut a = gateway(true, 64)?;
    let esp_frames = measure::esp_frames(&mut a, &frame)?;
    let fragments = esp_frames.len();
    let probe = Probe::take(&a);
    let encap = measure::encapsulate(&mut a, &frame, fragments, timing)?;
    let encap_delta = probe.since(&a);
    // On the wire with their FCS (ipv4-fwd: the forwarded frame, same size).
    let esp_size: usize = esp_frames.iter().map(|f| f.len() + 4).sum();
    // Decapsulation alone replays one packet, so B's window is off here.
    let mut b = gateway(false, 0)?;
    let probe = Probe::take(&b);
    let decap = measure::decapsulate(&mut b, &esp_frames, &expected, timing)?;
    let decap_delta = probe.since(&b);
    // Stop these engines' channel threads before the round trip starts.
    drop((a, b));
    let mut a = gateway(true, 64)?;
    let mut b = gateway(false, 64)?;
    let (probe_a, probe_b) = (Probe::take(&a), Probe::take(&b));
    let round_trip = measure::round_trip(&mut a, &mut b, &frame, fragments, &expected, timing)?;
    let round_deltas = [probe_a.since(&a), probe_b.since(&b)];
    let wire = frame_size + esp_size;
    let encap_metrics = metrics(kind, &encap, wire, &[encap_delta]);
    let decap_metrics = metrics(kind, &decap, wire, &[decap_delta]);
    let round_metrics = metrics(kind, &round_trip, 2 * wire, &round_deltas);
    Ok(vec![
        cell(Path::Encap, encap, encap_metrics),
        cell(Path::Decap, decap, decap_metrics),
        cell(Path::RoundTrip, round_trip, round_metrics),
    ])
}

/// A `sec` model cell: encapsulation and decapsulation alone, each a
/// fixed number of packets on the modelled clock (see `offload`).
fn measure_offload_cell(
    scenario: Scenario,
    frame_size: usize,
    engine: &scenario::EngineSetup,
    run: Run,
) -> anyhow::Result<Vec<Cell>> {
    let Scenario::Esp { algorithm, knobs, .. } = scenario else {
        bail!("not an ESP scenario");
    };
    let completion = engine.spec.sec.completion;
    let frame = measure::plaintext_frame(frame_size, frame_size as u8);
    let expected = measure::expected_ip(&frame, 2);
    let mut a = scenario::gateway(Some(algorithm), true, 64, engine)?;
    let esp_frames = measure::esp_frames(&mut a, &frame)?;
    let fragments = esp_frames.len();
    let esp_size: usize = esp_frames.iter().map(|f| f.len() + 4).sum();
    let wire = frame_size + esp_size;
    let frames = [frame.clone()];
    let traffic = offload::Traffic {
        frames: &frames,
        from: dataplane::Port::Inside,
        to: dataplane::Port::Outside,
        outputs_per_packet: fragments,
        expect: None,
    };
    let reps = run.timing.repetitions;
    let measure = |gateway: &mut dataplane::Gateway, traffic: &offload::Traffic| {
        let started = std::time::Instant::now();
        offload::measure(
            gateway,
            traffic,
            completion,
            engine.style,
            knobs.burst,
            run.packets,
            reps,
        )
        .map(|o| (o, started.elapsed()))
    };
    let (encap, encap_wall) = measure(&mut a, &traffic)?;
    let mut b = scenario::gateway(Some(algorithm), false, 0, engine)?;
    let traffic = offload::Traffic {
        frames: &esp_frames,
        from: dataplane::Port::Outside,
        to: dataplane::Port::Inside,
        outputs_per_packet: 1,
        expect: Some(&expected),
    };
    let (decap, decap_wall) = measure(&mut b, &traffic)?;
    let cell = |path, o: offload::Offload, wall: Duration| {
        let m = o.modelled;
        Cell {
            scenario,
            path,
            frame_size,
            samples: Samples {
                ns_per_packet: o.periods(),
                packets: (run.packets * reps) as u64,
                processed: (run.packets * (reps + 1)) as u64,
                cycles_per_packet: Vec::new(),
                wall_ns: wall.as_nanos() as u64,
            },
            metrics: Metrics {
                bus_bytes_per_packet: Some(m.bus_bytes),
                moved_bytes_per_packet: Some(wire as f64 + m.bus_bytes),
                engine_utilisation: Some(m.eu_utilisation),
            },
            offload: Some(o),
        }
    };
    Ok(vec![
        cell(Path::Encap, encap, encap_wall),
        cell(Path::Decap, decap, decap_wall),
    ])
}

/// The `espgw bench` command.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let other = [
        (!args.tenants.is_empty(), "--tenants"),
        (args.io, "--io"),
        (
            !args.tunnels.is_empty() || !args.policies.is_empty(),
            "--tunnels/--policies",
        ),
    ];
    if let Some((_, mode)) = other.iter().find(|(on, _)| *on) {
        if args.report.is_some() || args.tables {
            bail!("--report and --tables are the sweep's; {mode} prints its own table");
        }
    }
    if !args.tenants.is_empty() {
        return tenants::run(&tenants::Options {
            tenants: args.tenants.clone(),
            transports: args.transport.clone(),
            sizes: args.request_sizes.clone(),
            engines: args
                .engine
                .map_or_else(|| vec![EngineKind::Soft, EngineKind::Sec], |e| vec![e]),
            algorithm: args.algorithms.first().copied().unwrap_or(Algorithm::Aes128Gcm16),
            slice: Duration::from_millis(args.slice_ms.max(1)),
            repetitions: args.repetitions.max(1),
            profile: args.rate.clone(),
            json: args.json.clone(),
            hostile: args.hostile,
        });
    }
    if args.io {
        let sizes: Vec<usize> = if args.sizes == DEFAULT_SIZES {
            vec![64, 1518]
        } else {
            args.sizes.clone()
        };
        let results = io::compare(&sizes, Duration::from_millis(args.slice_ms.max(1) * 10))?;
        print!("{}", io::table(&results));
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&results)? + "\n")
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        return Ok(());
    }
    if !args.tunnels.is_empty() || !args.policies.is_empty() {
        return run_scale(args);
    }
    let progress = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} cells  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let sweep = sweep(args, &progress)?;
    progress.finish_and_clear();
    let index = match &args.report {
        Some(dir) => Some(write_report(&sweep, dir)?),
        None => None,
    };
    if args.tables {
        print!("{}", report::full_tables(&sweep));
        if let Some(index) = &index {
            println!("\nReport: {}", index.display());
        }
    } else {
        print!("{}", summary::summary(&sweep, index.as_deref()));
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report::json(&sweep))? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.csv {
        report::write_csv(&sweep, path).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for path in plot::write_charts(&sweep, dir)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// Writes `dir/index.html` with `bench.json` and `bench.csv` beside it;
/// returns the page's path (absolute where it can be made so).
fn write_report(sweep: &Sweep, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = dir.join("bench.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report::json(sweep))? + "\n")
        .with_context(|| format!("cannot write {}", json.display()))?;
    let csv = dir.join("bench.csv");
    report::write_csv(sweep, &csv).with_context(|| format!("cannot write {}", csv.display()))?;
    let command: Vec<String> = std::env::args().skip(1).collect();
    let page = html::page(sweep, &format!("espgw {}", command.join(" ")))?;
    let index = dir.join("index.html");
    std::fs::write(&index, page).with_context(|| format!("cannot write {}", index.display()))?;
    Ok(std::fs::canonicalize(&index).unwrap_or(index))
}

/// `espgw bench --tunnels / --policies`: see [`scale`].
fn run_scale(args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(cpu) = args.pin {
        pin_to(cpu)?;
    }
    let frame_size = args.sizes.iter().copied().min().unwrap_or(MIN_FRAME);
    if frame_size < MIN_FRAME {
        bail!("--sizes: frames start at {MIN_FRAME} bytes");
    }
    let opts = scale::ScaleOptions {
        tunnels: args.tunnels.clone(),
        policies: args.policies.clone(),
        algorithm: args.algorithms.first().copied().unwrap_or(Algorithm::Aes128Gcm16),
        frame_size,
        slice: Duration::from_millis(args.slice_ms.max(1)),
        repetitions: args.repetitions.max(1),
        churn: args.churn,
    };
    let rows = scale::measure(&opts, |row| {
        eprintln!("measured {} tunnels, {} policies", row.tunnels, row.policies)
    })?;
    print!("{}", scale::table(&rows, &opts));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for path in scale::write_chart(&rows, dir)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// Pins the calling thread to one CPU.
fn pin_to(cpu: usize) -> anyhow::Result<()> {
    // SAFETY: cpu_set_t is plain data, filled and passed by reference.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        bail!("--pin {cpu}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[Scenario]) -> Vec<String> {
        list.iter().map(Scenario::name).collect()
    }

    /// Path names are the results' `path` column: deriving them must not
    /// rename one, and serde must agree with strum.
    #[test]
    fn the_derived_path_names_are_the_published_keys() {
        let paths = [
            Path::Encap,
            Path::Decap,
            Path::RoundTrip,
            Path::Encrypt,
            Path::Decrypt,
        ];
        let names: Vec<&str> = paths.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["encap", "decap", "round-trip", "encrypt", "decrypt"]);
        for path in paths {
            assert_eq!(serde_json::to_value(path).unwrap(), path.name());
        }
    }

    #[test]
    fn default_sweep_has_every_engine_and_style() {
        let engines = engine_styles(None, None);
        let list = scenarios(&DEFAULT_ALGORITHMS, &engines, Knobs::default());
        assert_eq!(
            names(&list),
            [
                "ipv4-fwd",
                "esp-null",
                "ipv6-fwd",
                "esp-null-ipv6",
                "aes128gcm16/soft",
                "aes128gcm16/sec/sync",
                "aes128gcm16/sec/dual-pass",
                "aes128gcm16/sec/async",
                "aes128gcm16/raw",
                // The SEC has no ChaCha20 unit: soft and the ceiling only.
                "chacha20poly1305/soft",
                "chacha20poly1305/raw",
                "aes128-sha1/soft",
                "aes128-sha1/sec/sync",
                "aes128-sha1/sec/dual-pass",
                "aes128-sha1/sec/async",
                "aes128-sha1/raw",
                "3des-sha1/soft",
                "3des-sha1/sec/sync",
                "3des-sha1/sec/dual-pass",
                "3des-sha1/sec/async",
                "3des-sha1/raw",
            ]
        );
        let (extras, sizes) =
            extra_scenarios(&DEFAULT_ALGORITHMS, &engines, Knobs::default(), &DEFAULT_SIZES);
        assert_eq!(
            names(&extras),
            [
                "aes128-sha1/sec/async+per-request",
                "aes128-sha1/sec/async+polling",
                "aes128-sha1/sec/async+coalesced",
            ]
        );
        assert_eq!(sizes, [64, 1420]);
    }

    #[test]
    fn engine_and_style_narrow_the_sweep() {
        assert_eq!(
            engine_styles(Some(EngineKind::Soft), None),
            [(EngineKind::Soft, Style::Async)]
        );
        assert_eq!(
            engine_styles(Some(EngineKind::Sec), None),
            [
                (EngineKind::Sec, Style::Sync),
                (EngineKind::Sec, Style::DualPass),
                (EngineKind::Sec, Style::Async)
            ]
        );
        assert_eq!(
            engine_styles(None, Some(Style::Sync)),
            [(EngineKind::Soft, Style::Sync), (EngineKind::Sec, Style::Sync)]
        );
        let engines = engine_styles(Some(EngineKind::Sec), Some(Style::DualPass));
        let knobs = Knobs {
            buffers: BufferPolicy::PerRequest,
            completion: CompletionMode::Polling,
            ..Knobs::default()
        };
        let list = scenarios(&[Algorithm::Aes128Sha1], &engines, knobs);
        assert_eq!(
            names(&list),
            [
                "ipv4-fwd",
                "esp-null/sec/dual-pass+per-request+polling",
                "ipv6-fwd",
                "esp-null-ipv6",
                "aes128-sha1/sec/dual-pass+per-request+polling",
                "aes128-sha1/raw",
            ]
        );
        // No sec/async in the sweep: no comparison cells.
        let (extras, _) = extra_scenarios(&[Algorithm::Aes128Sha1], &engines, knobs, &[64]);
        assert!(extras.is_empty());
        // Sizes without 64 and 1420: the smallest and the largest.
        let engines = engine_styles(None, None);
        let (extras, sizes) = extra_scenarios(&[Algorithm::Aes128Gcm16], &engines, knobs, &[512, 128, 1024]);
        assert_eq!(
            names(&extras),
            [
                "aes128gcm16/sec/async+polling",
                "aes128gcm16/sec/async+per-request",
                "aes128gcm16/sec/async+per-request+coalesced",
            ]
        );
        assert_eq!(sizes, [128, 1024]);
    }

    fn cell(scenario: Scenario, path: Path, frame_size: usize, ns: f64) -> Cell {
        Cell {
            scenario,
            path,
            frame_size,
            samples: Samples {
                ns_per_packet: vec![ns],
                packets: 1,
                processed: 1,
                cycles_per_packet: Vec::new(),
                wall_ns: ns as u64,
            },
            metrics: Metrics::default(),
            offload: None,
        }
    }

    fn sweep_of(cells: Vec<Cell>) -> Sweep {
        Sweep {
            cells,
            engine: "test".into(),
            knobs: Knobs::default(),
            rate: "none".into(),
            machine: report::Machine {
                cpu: "test CPU".into(),
                cores: 2,
                mhz: None,
                no_cycle_counter: Some("test".into()),
            },
            slice_ms: 1,
            repetitions: 1,
            packets: 1,
            threads: false,
            speedups: Vec::new(),
            tenants: Vec::new(),
            conditions: report::Conditions::default(),
        }
    }

    #[test]
    fn crossover_is_the_first_size_where_async_wins() {
        let alg = Algorithm::Aes128Sha1;
        let sync = Scenario::esp(alg, EngineKind::Sec, Style::Sync);
        let async_ = Scenario::esp(alg, EngineKind::Sec, Style::Async);
        let build = |pairs: &[(usize, f64, f64)]| {
            sweep_of(
                pairs
                    .iter()
                    .flat_map(|&(s, a, b)| {
                        [cell(sync, Path::Encap, s, a), cell(async_, Path::Encap, s, b)].map(|mut c| {
                            c.offload = Some(offload::Offload {
                                modelled: offload::Modelled::default(),
                                host_measured_ns: vec![1.0],
                                spins: false,
                                serial: false,
                            });
                            c
                        })
                    })
                    .collect(),
            )
        };
        let sweep = build(&[(64, 100.0, 150.0), (128, 200.0, 190.0), (256, 300.0, 250.0)]);
        assert_eq!(report::crossover(&sweep, sync, async_), Some((128, true)));
        let text = report::derived(&sweep);
        assert!(
            text.contains("async overtakes sync between 64 and 128 B and stays ahead"),
            "{text}"
        );
        let sweep = build(&[(64, 100.0, 150.0), (128, 200.0, 190.0), (256, 300.0, 350.0)]);
        assert_eq!(report::crossover(&sweep, sync, async_), Some((128, false)));
        let sweep = build(&[(64, 100.0, 150.0), (128, 200.0, 290.0)]);
        assert_eq!(report::crossover(&sweep, sync, async_), None);
        let sweep = build(&[(64, 100.0, 50.0)]);
        assert_eq!(report::crossover(&sweep, sync, async_), Some((64, true)));
    }

    /// Two runs of a small sec sweep: every modelled figure is identical
    /// (the host's measured work may differ; it never enters the model).
    #[test]
    fn modelled_figures_are_identical_across_runs() {
        let run = Run {
            timing: Timing {
                slice: Duration::from_millis(1),
                repetitions: 2,
            },
            packets: 40,
            threads: false,
            engine_socket: None,
        };
        let knobs = Knobs::default();
        let mut scenarios: Vec<Scenario> = Style::ALL
            .iter()
            .map(|&style| Scenario::Esp {
                algorithm: Algorithm::Aes128Sha1,
                engine: EngineKind::Sec,
                style,
                knobs,
            })
            .collect();
        for (_, s, _) in study_scenarios(
            &[Algorithm::Aes128Gcm16],
            &engine_styles(None, None),
            knobs,
            &[64],
        ) {
            scenarios.push(s);
        }
        scenarios.push(Scenario::Esp {
            algorithm: Algorithm::TripleDesSha1,
            engine: EngineKind::Sec,
            style: Style::Async,
            knobs: Knobs {
                completion: CompletionMode::Coalesced,
                ..knobs
            },
        });
        let figures = || -> Vec<(String, offload::Modelled)> {
            let mut all = Vec::new();
            for &scenario in &scenarios {
                for size in [64, 1518] {
                    for c in measure_cell(scenario, size, run).unwrap() {
                        let o = c.offload.expect("a sec model cell");
                        assert_eq!(o.host_measured_ns.len(), 2);
                        all.push((format!("{} {size} {}", c.scenario, c.path.name()), o.modelled));
                    }
                }
            }
            all
        };
        let first = figures();
        let second = figures();
        assert_eq!(first, second);
        // The model did something: bus bytes and, on sec2, engine time.
        assert!(first
            .iter()
            .all(|(_, m)| m.bus_bytes > 0.0 && m.descriptors >= 1.0));
        assert!(first
            .iter()
            .filter(|(name, _)| !name.contains("@none"))
            .all(|(_, m)| m.engine_ns > 0.0 && m.timeline_ns > 0.0));
    }

    #[test]
    fn sync_waits_in_series_and_async_overlaps() {
        let m = offload::Modelled {
            timeline_ns: 1000.0,
            host_ns: 300.0,
            ..offload::Modelled::default()
        };
        let mut o = offload::Offload {
            modelled: m,
            host_measured_ns: vec![500.0, 400.0, 600.0],
            spins: false,
            serial: true,
        };
        assert_eq!(o.host_measured(), 500.0);
        assert_eq!(o.periods(), [1500.0, 1400.0, 1600.0]);
        assert_eq!(o.host_total(), 800.0);
        o.serial = false;
        assert_eq!(o.periods(), [1000.0, 1000.0, 1000.0]);
        o.host_measured_ns = vec![900.0];
        assert_eq!(o.periods(), [1200.0]);
        o.spins = true;
        assert_eq!(o.host_total(), 1200.0);
    }

    #[test]
    fn moved_bytes_are_compared_with_two_frames_per_gateway() {
        let mut c = cell(Scenario::Ipv4Forward, Path::Encap, 100, 1.0);
        c.metrics.moved_bytes_per_packet = Some(250.0);
        assert_eq!(c.ipv4_fwd_bytes(), Some(200.0));
        assert_eq!(c.moved_over_ipv4_fwd(), Some(0.25));
        c.path = Path::RoundTrip;
        assert_eq!(c.ipv4_fwd_bytes(), Some(400.0));
        c.path = Path::Encrypt;
        assert_eq!(c.moved_over_ipv4_fwd(), None);
    }
}
