//! `espgw`: the command line. Parses flags, loads configuration and wires
//! the crates together; everything else lives in the workspace crates.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use accel::{BufferPolicy, EngineKind, EngineSpec, Style};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use dataplane::{Gateway, Port};
use ike_stub::Config;

mod control;
mod demo;
mod report;

#[derive(Parser)]
#[command(
    name = "espgw",
    version,
    about = "Userspace IPsec ESP gateway with a look-aside crypto offload boundary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file and print a summary.
    CheckConfig {
        /// The gateway configuration (TOML).
        file: PathBuf,
    },
    /// Run the gateway offline over a capture file.
    Pcap(PcapArgs),
    /// Measure the ESP data path in memory across packet sizes and algorithms.
    Bench(bench::BenchArgs),
    /// Forward between the config's inside and outside interfaces (root).
    Run(RunArgs),
    /// Build a four-namespace demo network, run two gateways and show ESP
    /// on the wire (root).
    Demo(demo::DemoArgs),
    /// Counters of a running gateway.
    Stats(QueryArgs),
    /// Security associations of a running gateway.
    Sa {
        #[command(subcommand)]
        command: SaCommand,
    },
}

#[derive(Subcommand)]
enum SaCommand {
    /// Every SA with its SPI, mode, proposal, counters and state.
    List(QueryArgs),
    /// One SA in detail.
    Show {
        /// The SA's name.
        name: String,
        #[command(flatten)]
        query: QueryArgs,
    },
}

/// How to reach a running gateway.
#[derive(clap::Args)]
struct QueryArgs {
    /// The gateway's control socket.
    #[arg(long, conflicts_with = "config")]
    socket: Option<PathBuf>,
    /// Or the gateway's configuration (the socket is /run/espgw/NAME.sock).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the raw JSON instead of a table.
    #[arg(long)]
    json: bool,
}

impl QueryArgs {
    fn socket(&self) -> Result<PathBuf> {
        match (&self.socket, &self.config) {
            (Some(path), _) => Ok(path.clone()),
            (None, Some(config)) => Ok(control::default_path(&Config::load(config)?.name)),
            (None, None) => anyhow::bail!("say which gateway: --socket PATH or --config FILE"),
        }
    }
}

#[derive(clap::Args)]
struct RunArgs {
    /// The gateway configuration (TOML).
    #[arg(long)]
    config: PathBuf,
    /// Write final counters as JSON here when stopping.
    #[arg(long, value_name = "STATS.json")]
    stats: Option<PathBuf>,
    /// Control socket for `espgw stats` and `espgw sa` (default /run/espgw/NAME.sock).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    #[command(flatten)]
    accel: AccelArgs,
}

#[derive(clap::Args)]
struct PcapArgs {
    /// The gateway configuration (TOML).
    #[arg(long)]
    config: PathBuf,
    /// The interface every input frame arrives on.
    #[arg(long, value_enum)]
    from: Side,
    /// Input capture (pcap; Ethernet or raw IPv4).
    #[arg(long = "in", value_name = "IN.pcap")]
    input: PathBuf,
    /// Output capture: every frame the gateway transmits, in order.
    #[arg(long = "out", value_name = "OUT.pcap")]
    output: PathBuf,
    /// Write counters as JSON here.
    #[arg(long, value_name = "STATS.json")]
    stats: Option<PathBuf>,
    #[command(flatten)]
    accel: AccelArgs,
}

/// Engine choices that override the config's `[accel]` section.
#[derive(clap::Args)]
struct AccelArgs {
    /// Crypto engine: soft, sec or afalg.
    #[arg(long)]
    engine: Option<EngineKind>,
    /// Submission style: sync, dual-pass or async.
    #[arg(long)]
    style: Option<Style>,
    /// Buffer policy: registered or per-request.
    #[arg(long)]
    buffers: Option<BufferPolicy>,
    /// How the afalg engine reaches the kernel: sync or io-uring.
    #[arg(long)]
    afalg_io: Option<accel::afalg::AfalgIo>,
}

impl AccelArgs {
    /// The config's engine and style with these flags applied.
    fn apply(&self, config: &Config) -> (EngineSpec, Style) {
        let mut spec = config.engine.clone();
        if let Some(kind) = self.engine {
            spec.kind = kind;
        }
        if let Some(buffers) = self.buffers {
            spec.buffers = buffers;
            spec.sec.buffers = buffers;
        }
        if let Some(io) = self.afalg_io {
            spec.afalg_io = io;
        }
        (spec, self.style.unwrap_or(config.style))
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Side {
    Inside,
    Outside,
}

impl From<Side> for Port {
    fn from(side: Side) -> Port {
        match side {
            Side::Inside => Port::Inside,
            Side::Outside => Port::Outside,
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Pcap(args) => pcap(&args),
        Command::Bench(args) if args.veth => bench_veth(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Run(args) => run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Stats(query) => show(&query, "stats", report::stats_table),
        Command::Sa { command } => match command {
            SaCommand::List(query) => show(&query, "sa list", report::sa_table),
            SaCommand::Show { name, query } => show(&query, &format!("sa show {name}"), report::sa_table),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("espgw: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(file: &Path) -> Result<()> {
    let config = Config::load(file)?;
    print!("{}", report::config_summary(&config));
    Ok(())
}

fn pcap(args: &PcapArgs) -> Result<()> {
    let config = Config::load(&args.config)?;
    let input = File::open(&args.input).with_context(|| format!("cannot open {}", args.input.display()))?;
    let (reader, link) = dataplane::io::pcap::open(BufReader::new(input))
        .with_context(|| format!("{}", args.input.display()))?;
    let (spec, style) = args.accel.apply(&config);
    let engine = accel::build_engine(&spec)?;
    let mut gateway: Gateway = config
        .build_gateway(link, engine, style, Duration::ZERO)
        .with_context(|| format!("cannot install {}", args.config.display()))?;
    let output =
        File::create(&args.output).with_context(|| format!("cannot create {}", args.output.display()))?;
    let mut output = BufWriter::new(output);
    let run = dataplane::io::pcap::run(&mut gateway, args.from.into(), reader, &mut output)
        .with_context(|| format!("{} -> {}", args.input.display(), args.output.display()))?;
    output
        .flush()
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    if let Some(path) = &args.stats {
        let json = report::stats_json(&gateway);
        std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    eprintln!("{}", report::pcap_summary(&gateway, &run));
    Ok(())
}

fn run(args: &RunArgs) -> Result<()> {
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    use dataplane::io::afpacket::AfPacket;
    use dataplane::io::run::{Device, RunSummary, Sockets};
    use dataplane::io::tun::Tun;

    let config = Config::load(&args.config)?;
    let (spec, style) = args.accel.apply(&config);
    let tun_inside = config.inside.kind == dataplane::InterfaceKind::Tun;
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, 64);
    if tun_inside && workers > 1 {
        tracing::info!("a TUN inside is served by one worker");
    }
    let workers = if tun_inside { 1 } else { workers };
    let open = |device: &str, role: &str, worker: bool, group: u16| -> Result<AfPacket> {
        let socket = if worker {
            AfPacket::open_worker(device, group)
        } else {
            AfPacket::open(device)
        };
        socket.with_context(|| format!("interface `{role}` (device `{device}`)"))
    };
    // One fanout group per interface and process, shared by its workers
    // (a group holds sockets of one device only).
    let group = ((std::process::id() & 0x7fff) as u16) << 1;
    let mut sockets = Vec::with_capacity(workers);
    for _ in 0..workers {
        let many = workers > 1;
        let inside = if tun_inside {
            Device::Tun(
                Tun::open(&config.inside.device)
                    .with_context(|| format!("interface `inside` (TUN `{}`)", config.inside.device))?,
            )
        } else {
            Device::Packet(open(&config.inside.device, "inside", many, group)?)
        };
        let mut s = Sockets::single(
            inside,
            Device::Packet(open(&config.outside.device, "outside", many, group + 1)?),
        );
        if many {
            s.receive.push((
                Port::Inside,
                Device::Packet(AfPacket::open_arp(&config.inside.device)?),
            ));
            s.receive.push((
                Port::Outside,
                Device::Packet(AfPacket::open_arp(&config.outside.device)?),
            ));
        }
        sockets.push(s);
    }
    let mut setup = config.setup(dataplane::LinkLayer::Ethernet, style);
    setup.resolve_neighbors = true;
    let mut first = Gateway::new(setup, accel::build_engine(&spec)?);
    config
        .install(&mut first, Duration::ZERO)
        .with_context(|| format!("cannot install {}", args.config.display()))?;
    let mut gateways = vec![first];
    for _ in 1..workers {
        let fork = gateways[0].fork(accel::build_engine(&spec)?);
        gateways.push(fork);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let control_path = args
        .control
        .clone()
        .unwrap_or_else(|| control::default_path(&config.name));
    let requests = control::listen(&control_path)?;
    // Each worker publishes its counters now and then (not per packet);
    // worker 0 answers the control socket from all of them.
    let published: Arc<Mutex<Vec<(dataplane::Stats, u64)>>> =
        Arc::new(Mutex::new(vec![(dataplane::Stats::default(), 0); workers]));
    tracing::info!(
        name = %config.name,
        inside = %config.inside.device,
        outside = %config.outside.device,
        engine = %spec.kind,
        style = %style,
        workers,
        "forwarding"
    );
    let results: Vec<std::io::Result<RunSummary>> = std::thread::scope(|scope| {
        let handles: Vec<_> = gateways
            .iter_mut()
            .zip(&sockets)
            .enumerate()
            .map(|(index, (gateway, sockets))| {
                let stop = Arc::clone(&stop);
                let published = Arc::clone(&published);
                let requests = requests.clone();
                scope.spawn(move || {
                    let mut ticks = 0u32;
                    let mut tick = |t: &mut dataplane::io::run::Tick<'_>| {
                        let (gw, summary) = (&mut *t.gateway, t.summary);
                        ticks = ticks.wrapping_add(1);
                        if ticks.is_multiple_of(64) {
                            if let Ok(mut p) = published.lock() {
                                p[index] = (*gw.stats(), summary.kernel_drops);
                            }
                        }
                        if index == 0 {
                            while let Ok(request) = requests.try_recv() {
                                if let Ok(mut p) = published.lock() {
                                    p[0] = (*gw.stats(), summary.kernel_drops);
                                }
                                let (total, kernel_drops) = sum(&published);
                                let reply = report::answer(gw, total, kernel_drops, &request.line);
                                let _ = request.reply.send(reply.to_string());
                            }
                        }
                    };
                    dataplane::io::run::run(gateway, sockets, &stop, &mut tick)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a worker panicked")))
            })
            .collect()
    });
    let _ = std::fs::remove_file(&control_path);
    let mut summary = RunSummary::default();
    for result in results {
        summary.add(&result?);
    }
    let mut total = dataplane::Stats::default();
    for gateway in &gateways {
        total.add(gateway.stats());
    }
    tracing::info!(
        frames_in = summary.frames_in,
        frames_out = summary.frames_out,
        "stopped"
    );
    if let Some(path) = &args.stats {
        let json = report::answer(&gateways[0], total, summary.kernel_drops, "stats");
        let mut json = json;
        if let serde_json::Value::Object(map) = &mut json {
            map.insert("send_errors".into(), summary.send_errors.into());
            map.insert("workers".into(), workers.into());
        }
        std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    eprintln!(
        "{} stopped: {} workers, {} frames in, {} out, {} send errors, {} dropped by the kernel before espgw read them",
        config.name, workers, summary.frames_in, summary.frames_out, summary.send_errors, summary.kernel_drops
    );
    Ok(())
}

/// The counters every worker published, added up.
fn sum(published: &std::sync::Mutex<Vec<(dataplane::Stats, u64)>>) -> (dataplane::Stats, u64) {
    let mut total = dataplane::Stats::default();
    let mut kernel_drops = 0;
    if let Ok(p) = published.lock() {
        for (stats, drops) in p.iter() {
            total.add(stats);
            kernel_drops += drops;
        }
    }
    (total, kernel_drops)
}

fn show(query: &QueryArgs, request: &str, table: fn(&serde_json::Value) -> String) -> Result<()> {
    let answer = control::ask(&query.socket()?, request)?;
    if query.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        print!("{}", table(&answer));
    }
    Ok(())
}

fn bench_veth(args: &bench::BenchArgs) -> Result<()> {
    let mut demo = demo::DemoArgs::for_bench(
        args.engine.unwrap_or(EngineKind::Soft),
        args.style.unwrap_or(Style::Async),
        args.buffers,
    );
    if let Some(algorithm) = args.algorithms.first() {
        demo.set_algorithm(*algorithm);
    }
    let report = demo::bench_veth(
        &args.sizes,
        Duration::from_millis(args.slice_ms.max(1) * 10),
        &demo,
    )?;
    print!("{report}");
    Ok(())
}
