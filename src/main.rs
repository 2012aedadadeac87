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
mod daemon;
mod demo;
mod engine_serve;
mod helper;
mod ike_relay;
mod lab;
mod metrics;
mod privileges;
mod report;
mod soak;
mod socket_broker;
mod state_dir;
mod status;
mod veth_bench;
mod xfrm_broker;
mod xfrm_source;

/// mimalloc rather than the system allocator: it takes memory from the
/// kernel in large aligned regions and asks for transparent huge pages on
/// them, so a gateway's per-SA tables (SA state, sessions, key schedules,
/// the flow cache) sit on 2 MiB pages. With thousands of tunnels each
/// packet's state is otherwise a TLB miss as well as a cache miss.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "espgw",
    version,
    about = "Userspace IPsec ESP gateway with a look-aside crypto offload boundary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written (to standard error): `text`, one line per
    /// event with key=value fields, or `json`, one JSON object per line
    /// for a log collector. Colour only on a terminal, and never with
    /// NO_COLOR set.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The log subscriber: `filter` (RUST_LOG's syntax) over `format`, into
/// `writer`; ANSI colours only where `ansi` says (a terminal that has not
/// asked for none), so that a file or the journal gets plain text.
fn log_subscriber<W>(
    format: LogFormat,
    ansi: bool,
    filter: &str,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(builder.json().flatten_event(true).finish()),
    }
}

/// Colour on standard error: only a terminal, and not with NO_COLOR set
/// (<https://no-color.org>).
fn stderr_wants_colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
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
    Bench(Box<bench::BenchArgs>),
    /// Forward between the config's inside and outside interfaces (root).
    Run(RunArgs),
    /// Build a four-namespace demo network, run two gateways and show ESP
    /// on the wire (root).
    Demo(demo::DemoArgs),
    /// Counters of a running gateway.
    Stats(QueryArgs),
    /// Make a running gateway re-read its configuration (as SIGHUP does):
    /// tunnels added start, removed ones stop, unchanged ones keep their
    /// SAs; a broken file is refused and the running configuration stays.
    Reload(QueryArgs),
    /// Security associations of a running gateway.
    Sa {
        #[command(subcommand)]
        command: SaCommand,
    },
    /// A crypto engine shared by many tenants: `espgw engine serve`.
    Engine {
        #[command(subcommand)]
        command: engine_serve::EngineCommand,
    },
    /// Write the manual pages: espgw(8) and one per command (espgw-run(8),
    /// ...), from the same definitions as --help.
    Manpages {
        /// The directory to write them into (created if absent).
        dir: PathBuf,
    },
    /// Print the shell completion script for bash, zsh, fish, elvish or
    /// powershell.
    Completions { shell: clap_complete::Shell },
    /// The `xfrm` keying source (root).
    Xfrm {
        #[command(subcommand)]
        command: XfrmCommand,
    },
}

#[derive(Subcommand)]
enum XfrmCommand {
    /// Mirror a namespace's XFRM SAD and SPD into an offline gateway of a
    /// configuration and print what it holds, what was refused and why,
    /// and the mirror's counters (JSON).
    Show(xfrm_source::ShowArgs),
}

/// Writes `espgw.8` and `espgw-COMMAND.8` for each command into `dir`;
/// returns the files written.
fn write_manpages(dir: &Path) -> Result<Vec<PathBuf>> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut root = Cli::command().name("espgw");
    // Built, so that each command's page has the global options too.
    root.build();
    let mut pages = vec![(String::from("espgw"), root.clone())];
    for sub in root
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let name = format!("espgw-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    let mut written = Vec::new();
    for (name, command) in pages {
        let path = dir.join(format!("{name}.8"));
        let mut page = Vec::new();
        clap_mangen::Man::new(command)
            .section("8")
            .manual("espgw manual")
            .render(&mut page)
            .with_context(|| format!("cannot render {name}(8)"))?;
        std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[derive(Subcommand)]
enum SaCommand {
    /// Every SA with its SPI, mode, proposal, counters and state.
    List(QueryArgs),
    /// One SA, or a tunnel with its current SAs, in detail.
    Show {
        /// The SA's or tunnel's name.
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
            (None, Some(config)) => {
                // Only the gateway's name is read here: a file owned by the
                // user its gateway runs as (`run --user`) will do.
                let owner = std::fs::metadata(config)
                    .ok()
                    .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
                Ok(control::default_path(&Config::load_trusting(config, owner)?.name))
            }
            (None, None) => anyhow::bail!("say which gateway: --socket PATH or --config FILE"),
        }
    }
}

// Its field docs are the CLI's help, where `[gateway]` and `[keying]` name
// the configuration's tables, not Rust items.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The gateway configuration (TOML).
    #[arg(long)]
    config: PathBuf,
    /// Write final counters as JSON here when stopping.
    #[arg(long, value_name = "STATS.json")]
    stats: Option<PathBuf>,
    /// Control socket for `espgw stats` and `espgw sa` (default /run/espgw/NAME.sock).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Once the sockets are open, run as this user (its primary group
    /// alone) instead of root. Its configuration must be readable by it
    /// (owned by it or by root) for reloads; `--stats` is opened before.
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// How the forwarding sockets take frames from the kernel: a shared
    /// TPACKET_V2 ring, or recvmmsg batches from the socket's queue.
    #[arg(long, value_enum, default_value_t = ReceiveArg::Ring)]
    receive: ReceiveArg,
    /// Receive moderation, as a NIC's adaptive rx-usecs: while frames keep
    /// coming in small turns, wait for more before the next, up to this
    /// long (the wait adapts to the rate, from an eighth of it; 0: never).
    /// A packet after an idle spell is never delayed.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=1000))]
    rx_coalesce_us: u64,
    /// Where SAs with static keys keep their sequence numbers across
    /// restarts (overrides [gateway] state_dir; under systemd,
    /// $STATE_DIRECTORY is taken when neither is given). Without one,
    /// static keys with an AEAD proposal are refused.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Where SAs come from besides the file (overrides [keying] source):
    /// `xfrm` mirrors the XFRM SAD and SPD of the keying namespace, where
    /// an IKE daemon writes them.
    #[arg(long, value_enum, value_name = "SOURCE")]
    keying: Option<KeyingArg>,
    /// The keying namespace (/run/netns/NAME) for `--keying xfrm`
    /// (overrides [keying] netns; default: espgw's own namespace).
    #[arg(long, value_name = "NAME")]
    keying_netns: Option<String>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (off unless
    /// given; a loopback address keeps them on this host).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
    #[command(flatten)]
    accel: AccelArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum KeyingArg {
    Config,
    Xfrm,
}

impl RunArgs {
    /// The keying source: the file's, as `--keying` and `--keying-netns`
    /// change it.
    pub(crate) fn keying(&self, file: &ike_stub::Keying) -> Result<ike_stub::Keying> {
        self.keying_flags().apply(file)
    }

    pub(crate) fn keying_flags(&self) -> KeyingFlags {
        KeyingFlags {
            keying: self.keying,
            netns: self.keying_netns.clone(),
        }
    }
}

/// `--keying` and `--keying-netns`, kept for a reload to apply to the
/// file it reads.
#[derive(Clone, Default)]
pub(crate) struct KeyingFlags {
    keying: Option<KeyingArg>,
    netns: Option<String>,
}

impl KeyingFlags {
    /// The keying source: `file`'s, as the flags change it.
    pub(crate) fn apply(&self, file: &ike_stub::Keying) -> Result<ike_stub::Keying> {
        use ike_stub::Keying;
        if let Some(name) = &self.netns {
            if !Keying::valid_netns(name) {
                anyhow::bail!("--keying-netns `{name}` is not a namespace name (/run/netns/NAME; no `/`)");
            }
        }
        let file_netns = match file {
            Keying::Xfrm { netns } => netns.clone(),
            Keying::Config => None,
        };
        Ok(match (self.keying, &self.netns) {
            (Some(KeyingArg::Config), Some(_)) => {
                anyhow::bail!("--keying-netns names the namespace to mirror: it needs --keying xfrm")
            }
            (Some(KeyingArg::Config), None) => Keying::Config,
            (Some(KeyingArg::Xfrm), netns) => Keying::Xfrm {
                netns: netns.clone().or(file_netns),
            },
            (None, Some(netns)) => match file {
                Keying::Xfrm { .. } => Keying::Xfrm {
                    netns: Some(netns.clone()),
                },
                Keying::Config => {
                    anyhow::bail!("--keying-netns needs --keying xfrm (or [keying] source = \"xfrm\")")
                }
            },
            (None, None) => file.clone(),
        })
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ReceiveArg {
    Ring,
    Recvmmsg,
}

impl From<ReceiveArg> for drivers::afpacket::Receive {
    fn from(arg: ReceiveArg) -> Self {
        match arg {
            ReceiveArg::Ring => drivers::afpacket::Receive::Ring,
            ReceiveArg::Recvmmsg => drivers::afpacket::Receive::Batch,
        }
    }
}

// Its field docs are the CLI's help, where `[gateway]` and `[keying]` name
// the configuration's tables, not Rust items.
#[allow(rustdoc::broken_intra_doc_links)]
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
    /// Write one JSON line per input frame here ("-": standard output):
    /// its index, port, verdict (forwarded, consumed, dropped), drop
    /// reason, SA, SPI and sequence number where known.
    #[arg(long, value_name = "VERDICTS.jsonl")]
    verdicts: Option<PathBuf>,
    /// Where SAs with static keys keep their sequence numbers from one run
    /// to the next (overrides [gateway] state_dir, as for `run`).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    #[command(flatten)]
    accel: AccelArgs,
}

/// Engine choices that override the config's `[accel]` section.
#[derive(clap::Args)]
struct AccelArgs {
    /// Crypto engine: soft, sec, afalg or shared (shared takes its socket
    /// from the config's [accel] socket).
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
    /// The shared engine's server socket (overrides [accel] socket).
    #[arg(long, value_name = "PATH")]
    engine_socket: Option<PathBuf>,
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
        if let Some(socket) = &self.engine_socket {
            spec.shared.socket = socket.clone();
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
    let cli = Cli::parse();
    // A gateway says at start what it forwards and which link settings it
    // took; the one-shot commands speak only of trouble.
    let default_filter = if matches!(cli.command, Command::Run(_)) {
        "info"
    } else {
        "warn"
    };
    let subscriber = log_subscriber(
        cli.log_format,
        stderr_wants_colour(),
        default_filter,
        std::io::stderr,
    );
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        eprintln!("espgw: warning: a log subscriber was already set");
    }
    let result = match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Pcap(args) => pcap(&args),
        Command::Bench(args) if args.veth => bench_veth(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Run(args) => daemon::run(&args),
        Command::Reload(query) => show(&query, "reload", report::reload_text),
        Command::Demo(args) => match args.soak {
            Some(seconds) => soak::run(&args, std::time::Duration::from_secs(seconds)),
            None => demo::run(&args),
        },
        Command::Engine { command } => engine_serve::run(&command),
        Command::Manpages { dir } => write_manpages(&dir).map(|pages| {
            for page in pages {
                println!("{}", page.display());
            }
        }),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            // Into memory first: the generator panics on a failed write,
            // and a closed pipe is an error to report, not a crash.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "espgw", &mut script);
            std::io::stdout()
                .write_all(&script)
                .context("cannot write the completion script")
        }
        Command::Xfrm { command } => match command {
            XfrmCommand::Show(args) => xfrm_source::show(&args),
        },
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

/// Loads a configuration, warning when its keys are readable by others
/// or an inbound SA admits every inner packet.
pub(crate) fn load_config(file: &Path) -> Result<Config> {
    let config = Config::load(file)?;
    for warning in config.warnings() {
        eprintln!("espgw: warning: {warning}");
    }
    Ok(config)
}

fn check_config(file: &Path) -> Result<()> {
    let config = load_config(file)?;
    print!("{}", report::config_summary(&config));
    Ok(())
}

fn pcap(args: &PcapArgs) -> Result<()> {
    let config = load_config(&args.config)?;
    // Offline there is no peer to run the keying exchange with.
    if let Some(t) = config.tunnels.iter().find(|t| t.secret.is_some()) {
        anyhow::bail!(
            "{}: tunnel `{}` has a `secret`, so its keys come from an exchange with its peer at start, \
             which `espgw pcap` (offline, no peer) cannot run; give the tunnel spi_out, spi_in and its keys instead of the secret to process captures",
            args.config.display(),
            t.name
        );
    }
    // Opened before anything is read, so that a second run on the same
    // directory is refused before it does any work.
    let state = match state_dir::resolve(args.state_dir.as_deref(), &config) {
        Some(path) => Some(state_dir::StateDir::open(&path, None)?),
        None => {
            if let Some(warning) = state_dir::without_state_dir(&config, "pcap")? {
                eprintln!("espgw: warning: {warning}");
            }
            None
        }
    };
    let mut commands = config.commands();
    if let Some(state) = &state {
        state.prepare(
            commands
                .iter_mut()
                .filter_map(dataplane::command::SaCommand::installs_mut),
        );
    }
    let input = File::open(&args.input).with_context(|| format!("cannot open {}", args.input.display()))?;
    let (reader, link) =
        drivers::pcap::open(BufReader::new(input)).with_context(|| format!("{}", args.input.display()))?;
    let (spec, style) = args.accel.apply(&config);
    let engine = accel::build_engine(&spec)?;
    let mut gateway = Gateway::with_commands(config.setup(link, style), engine, &commands, Duration::ZERO)
        .with_context(|| format!("cannot install {}", args.config.display()))?;
    if let Some(state) = &state {
        // The first reservations are durable before the first frame.
        state.attach(
            &gateway,
            commands
                .iter()
                .filter_map(dataplane::command::SaCommand::installs),
        );
        state.round(Duration::ZERO)?;
    }
    let output =
        File::create(&args.output).with_context(|| format!("cannot create {}", args.output.display()))?;
    let mut output = BufWriter::new(output);
    let from = args.from.into();
    let mut verdicts: Option<BufWriter<Box<dyn Write>>> = match &args.verdicts {
        None => None,
        Some(path) => Some(BufWriter::new(if path.as_os_str() == "-" {
            Box::new(std::io::stdout().lock())
        } else {
            Box::new(File::create(path).with_context(|| format!("cannot create {}", path.display()))?)
        })),
    };
    let run = match (&state, verdicts.as_mut()) {
        // Offline, one thread: reservations are written in line, between
        // frames, on the capture's clock.
        (Some(state), verdicts) => drivers::pcap::run_with(
            &mut gateway,
            from,
            reader,
            &mut output,
            verdicts.map(|v| v as &mut dyn Write),
            &mut |now| {
                state
                    .round(now)
                    .map(drop)
                    .map_err(|e| std::io::Error::other(format!("{e:#}")))
            },
        ),
        (None, None) => drivers::pcap::run(&mut gateway, from, reader, &mut output),
        (None, Some(verdicts)) => {
            drivers::pcap::run_with_verdicts(&mut gateway, from, reader, &mut output, verdicts)
        }
    }
    .with_context(|| format!("{} -> {}", args.input.display(), args.output.display()))?;
    if let Some(state) = &state {
        // The capture is done: the next run resumes exactly where this one
        // stopped.
        gateway.flush_sa_usage();
        state.settle()?;
    }
    if let (Some(path), Some(verdicts)) = (&args.verdicts, verdicts.as_mut()) {
        verdicts
            .flush()
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    output
        .flush()
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    if let Some(path) = &args.stats {
        let doc = control::encode(&report::pcap_stats(&gateway), true)?;
        std::fs::write(path, doc + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    eprintln!("{}", report::pcap_summary(&gateway, &run));
    Ok(())
}

/// Asks the gateway and prints its answer: as it came with `--json`, else
/// read as `T` (the request's document, see `status`) into a table.
fn show<T: serde::de::DeserializeOwned>(
    query: &QueryArgs,
    request: &str,
    table: fn(&T) -> String,
) -> Result<()> {
    let answer = control::ask_raw(&query.socket()?, request)?;
    if query.json {
        println!("{}", answer.pretty());
    } else {
        print!("{}", table(&answer.parse()?));
    }
    Ok(())
}

fn bench_veth(args: &bench::BenchArgs) -> Result<()> {
    veth_bench::run(&veth_bench::Options {
        prefix: args.veth_prefix.clone(),
        tcp_seconds: args.tcp_seconds,
        udp_seconds: args.udp_seconds,
        tcp_runs: args.tcp_runs,
        udp_probes: args.udp_probes,
        json: args.json.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer, as a log file would be.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("the buffer").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(format: LogFormat, ansi: bool) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = log_subscriber(format, ansi, "info", move || writer.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(tunnel = "site-b", generation = 3u64, "rekeyed");
            tracing::debug!("below the filter");
        });
        let bytes = out.0.lock().expect("the buffer").clone();
        String::from_utf8(bytes).expect("UTF-8 log lines")
    }

    #[test]
    fn text_lines_carry_key_value_fields_and_no_escape_codes_off_a_terminal() {
        let text = logged(LogFormat::Text, false);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("rekeyed") && text.contains("tunnel=\"site-b\"") && text.contains("generation=3"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "no ANSI escape codes: {text:?}");
        // The same on a terminal has them: the check above can fail.
        assert!(logged(LogFormat::Text, true).contains('\u{1b}'));
    }

    #[test]
    fn json_lines_are_one_object_each_with_the_fields_at_the_top() {
        let text = logged(LogFormat::Json, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        /// The fields the line must have at its top level.
        #[derive(Debug, serde::Deserialize)]
        struct Event {
            level: String,
            message: String,
            tunnel: String,
            generation: u32,
            timestamp: String,
        }
        let event: Event = serde_json::from_str(lines[0]).expect("a JSON object with the fields at the top");
        assert_eq!(event.level, "INFO", "{event:?}");
        assert_eq!(event.message, "rekeyed", "{event:?}");
        assert_eq!(event.tunnel, "site-b", "{event:?}");
        assert_eq!(event.generation, 3, "{event:?}");
        assert!(!event.timestamp.is_empty(), "{event:?}");
    }

    #[test]
    fn log_format_is_an_option_of_every_command() {
        let cli = Cli::try_parse_from(["espgw", "stats", "--log-format", "json"]).expect("parses");
        assert_eq!(cli.log_format, LogFormat::Json);
        assert!(Cli::try_parse_from(["espgw", "--log-format", "xml", "stats"]).is_err());
    }
}

/// The service units under packaging/systemd: every command they run is
/// one this binary takes.
#[cfg(test)]
mod service_units {
    use super::*;

    const UNITS: [(&str, &str); 2] = [
        (
            "espgw@.service",
            include_str!("../packaging/systemd/espgw@.service"),
        ),
        (
            "espgw-engine.service",
            include_str!("../packaging/systemd/espgw-engine.service"),
        ),
    ];

    #[test]
    fn every_exec_line_parses_as_an_espgw_command() {
        let mut seen = 0;
        for (unit, text) in UNITS {
            for line in text.lines() {
                let Some((key, command)) = line.split_once('=') else {
                    continue;
                };
                if !key.starts_with("Exec") {
                    continue;
                }
                let command = command.replace("%i", "site-a");
                let words: Vec<&str> = command.split_whitespace().collect();
                assert_eq!(words.first(), Some(&"/usr/bin/espgw"), "{unit}: {line}");
                if let Err(e) = Cli::try_parse_from(&words) {
                    panic!("{unit}: `{line}` does not parse: {e}");
                }
                seen += 1;
            }
        }
        assert_eq!(
            seen, 4,
            "ExecStartPre, ExecStart and ExecReload of the gateway, ExecStart of the engine"
        );
    }
}

#[cfg(test)]
mod manpages_and_completions {
    use super::*;

    #[test]
    fn a_page_per_command_with_its_options() {
        let dir = std::env::temp_dir().join(format!("espgw-man-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pages = write_manpages(&dir).expect("written");
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().expect("a name").to_string_lossy().into_owned())
            .collect();
        for want in [
            "espgw.8",
            "espgw-run.8",
            "espgw-bench.8",
            "espgw-engine.8",
            "espgw-sa.8",
            "espgw-reload.8",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        let run = std::fs::read_to_string(dir.join("espgw-run.8")).expect("espgw-run.8");
        assert!(run.starts_with(".ie") && run.contains(".TH espgw-run 8"), "{run}");
        for option in [
            "\\-\\-config",
            "\\-\\-state\\-dir",
            "\\-\\-user",
            "\\-\\-log\\-format",
        ] {
            assert!(run.contains(option), "espgw-run(8) names {option}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn completion_scripts_name_every_command() {
        use clap::CommandFactory;
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "espgw", &mut script);
            let script = String::from_utf8(script).expect("UTF-8");
            for command in ["run", "bench", "reload", "engine", "check-config"] {
                assert!(script.contains(command), "{shell}: {command}");
            }
        }
    }
}
