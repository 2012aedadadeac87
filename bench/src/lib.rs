//! The measurement lab.
//!
//! Owns traffic generation, the sweep runner, measurement (ns and estimated
//! cycles per packet), tables and CSV/JSON output. Drives the same gateway
//! core as `espgw run` and `espgw pcap`, configured from generated TOML;
//! must not reach into the dataplane's internals or time anything but whole
//! batches through public entry points.

pub mod measure;
pub mod plot;
pub mod report;
pub mod scenario;

use std::path::PathBuf;
use std::time::Duration;

use accel::{Algorithm, BufferPolicy, EngineKind, EngineSpec, RateModel, SecConfig, Style};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};

use crate::measure::{Samples, Timing, FRAME_OVERHEAD, MIN_FRAME};
use crate::scenario::Scenario;

pub const DEFAULT_SIZES: [usize; 7] = [64, 128, 256, 512, 1024, 1420, 1518];
pub const DEFAULT_ALGORITHMS: [Algorithm; 3] = [
    Algorithm::Aes128Gcm16,
    Algorithm::Aes128Sha1,
    Algorithm::TripleDesSha1,
];

/// `espgw bench` options.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
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
    #[arg(long, default_value_t = 5)]
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
    /// Engine for the ESP scenarios: soft, sec or afalg.
    #[arg(long, default_value_t = EngineKind::Soft)]
    pub engine: EngineKind,
    /// Submission style: sync, dual-pass or async.
    #[arg(long, default_value_t = Style::Async)]
    pub style: Style,
    /// Buffer policy: registered or per-request.
    #[arg(long, default_value_t = BufferPolicy::Registered)]
    pub buffers: BufferPolicy,
    /// Rate model of the sec engine: `none` (host speed) or `sec2-266mhz`.
    #[arg(long, default_value = "none")]
    pub rate: String,
    /// Completion signalling of the sec engine: interrupt, polling or coalesced.
    #[arg(long, default_value = "interrupt")]
    pub completion: String,
}

/// What a cell measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
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
    pub fn name(self) -> &'static str {
        match self {
            Path::Encap => "encap",
            Path::Decap => "decap",
            Path::RoundTrip => "round-trip",
            Path::Encrypt => "encrypt",
            Path::Decrypt => "decrypt",
        }
    }
}

/// One measured cell.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cell {
    pub scenario: Scenario,
    pub path: Path,
    pub frame_size: usize,
    pub samples: Samples,
}

impl Cell {
    pub fn ns(&self) -> f64 {
        self.samples.median()
    }

    pub fn packets_per_second(&self) -> f64 {
        1e9 / self.ns()
    }

    pub fn gbit_per_second(&self) -> f64 {
        self.packets_per_second() * self.frame_size as f64 * 8.0 / 1e9
    }
}

/// Results of a sweep, plus what is needed to read them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sweep {
    pub cells: Vec<Cell>,
    /// Engine and style of the ESP scenarios.
    pub engine: String,
    pub machine: report::Machine,
    pub slice_ms: u64,
    pub repetitions: usize,
}

impl Sweep {
    pub fn get(&self, scenario: Scenario, path: Path, frame_size: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.scenario == scenario && c.path == path && c.frame_size == frame_size)
    }
}

fn scenarios(algorithms: &[Algorithm]) -> Vec<Scenario> {
    let mut list = vec![
        Scenario::Ipv4Forward,
        Scenario::Esp {
            algorithm: Algorithm::Null,
        },
    ];
    for &algorithm in algorithms.iter().filter(|a| **a != Algorithm::Null) {
        list.push(Scenario::Esp { algorithm });
        list.push(Scenario::RawCrypto { algorithm });
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
    let rate = match args.rate.as_str() {
        "none" => None,
        "sec2-266mhz" => Some(RateModel::sec2_266mhz()),
        other => bail!("--rate `{other}`: expected none or sec2-266mhz"),
    };
    let completion = match args.completion.as_str() {
        "interrupt" => accel::Completion::Interrupt,
        "polling" => accel::Completion::Polling,
        "coalesced" => accel::Completion::Coalesced {
            count: 8,
            timeout: Duration::from_micros(50),
        },
        other => bail!("--completion `{other}`: expected interrupt, polling or coalesced"),
    };
    let engine = scenario::EngineSetup {
        spec: EngineSpec {
            kind: args.engine,
            buffers: args.buffers,
            sec: SecConfig {
                buffers: args.buffers,
                rate,
                completion,
                ..SecConfig::default()
            },
            ..EngineSpec::default()
        },
        style: args.style,
    };
    let scenarios = scenarios(&args.algorithms);
    progress.set_length((scenarios.len() * args.sizes.len()) as u64);
    let mut cells = Vec::new();
    for scenario in &scenarios {
        for &size in &args.sizes {
            progress.set_message(format!("{scenario} {size} B"));
            cells.extend(
                measure_cell(*scenario, size, timing, &engine)
                    .with_context(|| format!("{scenario} at {size} bytes"))?,
            );
            progress.inc(1);
        }
    }
    Ok(Sweep {
        cells,
        engine: engine.label(),
        machine: report::Machine::detect(),
        slice_ms: args.slice_ms,
        repetitions: args.repetitions,
    })
}

fn measure_cell(
    scenario: Scenario,
    frame_size: usize,
    timing: Timing,
    engine: &scenario::EngineSetup,
) -> anyhow::Result<Vec<Cell>> {
    let cell = |path, samples| Cell {
        scenario,
        path,
        frame_size,
        samples,
    };
    let algorithm = match scenario {
        Scenario::RawCrypto { algorithm } => {
            let (encrypt, decrypt) = measure::raw_crypto(algorithm, frame_size - FRAME_OVERHEAD, timing)?;
            return Ok(vec![cell(Path::Encrypt, encrypt), cell(Path::Decrypt, decrypt)]);
        }
        Scenario::Ipv4Forward => None,
        Scenario::Esp { algorithm } => Some(algorithm),
    };
    let frame = measure::plaintext_frame(frame_size, frame_size as u8);
    let expected = measure::expected_ip(&frame, 2);
    // Encapsulation alone, and the ESP frame it makes for decapsulation alone.
    let mut a = scenario::gateway(algorithm, true, 64, engine)?;
    let encap = measure::encapsulate(&mut a, &frame, timing)?;
    let esp_frame = measure::one_esp_frame(&mut a, &frame)?;
    // Decapsulation alone replays one frame, so B's window is off here.
    let mut b = scenario::gateway(algorithm, false, 0, engine)?;
    let decap = measure::decapsulate(&mut b, &esp_frame, &expected, timing)?;
    let mut a = scenario::gateway(algorithm, true, 64, engine)?;
    let mut b = scenario::gateway(algorithm, false, 64, engine)?;
    let round_trip = measure::round_trip(&mut a, &mut b, &frame, &expected, timing)?;
    Ok(vec![
        cell(Path::Encap, encap),
        cell(Path::Decap, decap),
        cell(Path::RoundTrip, round_trip),
    ])
}

/// The `espgw bench` command.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let progress = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} cells  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let sweep = sweep(args, &progress)?;
    progress.finish_and_clear();
    print!("{}", report::table(&sweep));
    print!("{}", report::derived(&sweep));
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
