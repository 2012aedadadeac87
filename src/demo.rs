//! `espgw demo`: four network namespaces (hostA, gwA, gwB, hostB) joined by
//! veth pairs, two gateways from `configs/demo-{a,b}.toml`, ping, UDP and
//! TCP traffic both ways, a capture of the gwA–gwB link that must hold only
//! ESP (and ARP), a short report, and everything removed again, also on
//! Ctrl-C or failure. With `--nat`, a fifth namespace masquerades gwA
//! behind an address and port of its own (nftables), and the tunnel is
//! RFC 3948 ESP in UDP that gwB must follow to wherever the NAT put gwA.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dataplane::io::offload::OffloadCounters;

use accel::{Algorithm, BufferPolicy, EngineKind, Style};
use anyhow::{bail, ensure, Context, Result};

/// Every namespace the demo may make; `espgw-nat` only with `--nat`.
const NAMESPACES: [&str; 5] = ["espgw-hostA", "espgw-gwA", "espgw-gwB", "espgw-hostB", NAT_NS];
const NAT_NS: &str = "espgw-nat";
/// `--nat`: gwA keeps 10.0.0.1 behind the NAT's inside address; gwB and
/// the NAT's outside address are on 172.16.0.0/24.
const NAT_INSIDE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
const NAT_PUBLIC: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 1);
const GW_B_PUBLIC: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 2);
/// The source ports the NAT maps gwA's 4500 to: never 4500 itself, so gwB
/// has a port to learn as well as an address.
const NAT_PORTS: &str = "40000-40999";
const HOST_A: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 10);
const HOST_B: Ipv4Addr = Ipv4Addr::new(192, 168, 2, 20);

#[derive(clap::Args)]
pub struct DemoArgs {
    /// ESP proposal for the tunnel.
    #[arg(long, default_value_t = Algorithm::Aes128Gcm16)]
    algorithm: Algorithm,
    /// Crypto engine of both gateways.
    #[arg(long, default_value_t = EngineKind::Soft)]
    engine: EngineKind,
    /// Submission style of both gateways.
    #[arg(long, default_value_t = Style::Async)]
    style: Style,
    /// Buffer policy of both gateways.
    #[arg(long, default_value_t = BufferPolicy::Registered)]
    buffers: BufferPolicy,
    /// Bytes sent over the TCP connection.
    #[arg(long, default_value_t = 2_000_000)]
    tcp_bytes: usize,
    /// Keep the work directory (configs, stats, gateway logs).
    #[arg(long)]
    keep: bool,
    /// Give the tunnel a soft byte lifetime of this size (e.g. 200kB, 1MB,
    /// 64KiB), so that the gateways rekey over and over while traffic flows.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    rekey_every: Option<u64>,
    /// While traffic flows, make gwA reload a broken configuration and one
    /// with an inbound SA that no policy names (by `espgw reload` and by
    /// SIGHUP), which it must refuse without losing a packet, then a valid
    /// one with one more tunnel, which it must take.
    #[arg(long)]
    reload_check: bool,
    /// Also measure what floods of bad ESP into gwB (unknown SPI, and the
    /// tunnel's SPI with sequence numbers that force an ICV check) cost the
    /// numbered UDP traffic, against a run without a flood.
    #[arg(long)]
    flood_check: bool,
    /// Frames per second of the flood check's floods (default: as fast as
    /// one thread can send).
    #[arg(long, value_name = "FRAMES_PER_SECOND")]
    flood_rate: Option<u64>,
    /// Instead of one round, run mixed traffic for this many seconds and
    /// check for leaks and unexplained loss (see scripts/soak.sh).
    #[arg(long, value_name = "SECONDS")]
    soak: Option<u64>,
    /// Run both gateways on the `sec` engine model with every N-th
    /// descriptor failing (fault injection).
    #[arg(long, value_name = "N")]
    fail_every: Option<u64>,
    /// Run both gateways on the `sec` engine model with every N-th
    /// completion lost (reclaimed after the job timeout).
    #[arg(long, value_name = "N")]
    lose_completion_every: Option<u64>,
    /// Put gwA behind a masquerading NAT (a fifth namespace, nftables) and
    /// run the tunnel as RFC 3948 ESP in UDP on both gateways: gwB knows
    /// only gwA's private address and must learn the NAT's address and
    /// port from gwA's authenticated packets.
    #[arg(long, conflicts_with_all = ["flood_check", "soak"])]
    nat: bool,
}

/// "200kB", "1MB", "64KiB", "5000": a size in bytes.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size; write e.g. 200kB, 1MB or 65536"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        other => return Err(format!("unknown unit `{other}`; use B, kB, KiB, MB, MiB or GB")),
    };
    number
        .checked_mul(scale)
        .filter(|n| *n >= 1000)
        .ok_or_else(|| format!("`{text}` is out of range; rekey every 1kB or more"))
}

/// Stops child processes: SIGTERM to all, up to 5 s for each to exit,
/// then SIGKILL.
pub(crate) fn stop_children(children: &mut [Child]) {
    for child in children.iter() {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    }
    for child in children.iter_mut() {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Everything the demo created, removed on drop.
pub(crate) struct Lab {
    pub(crate) gateways: Vec<Child>,
    pub(crate) dir: PathBuf,
    keep: bool,
}

impl Drop for Lab {
    fn drop(&mut self) {
        stop_children(&mut self.gateways);
        remove_namespaces();
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn remove_namespaces() {
    for ns in NAMESPACES {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let status = Command::new("ip")
        .args(args)
        .status()
        .with_context(|| format!("running `ip {}`", args.join(" ")))?;
    ensure!(status.success(), "`ip {}` failed", args.join(" "));
    Ok(())
}

fn in_ns(ns: &str, cmd: &[&str]) -> Result<()> {
    let status = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd)
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running `{}` in {ns}", cmd.join(" ")))?;
    ensure!(status.success(), "`{}` failed in {ns}", cmd.join(" "));
    Ok(())
}

fn check_prerequisites(nat: bool) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("espgw demo needs root (network namespaces, veth pairs and raw sockets); run it with sudo");
    }
    let nft = nat.then_some(("nft", "nftables"));
    for (tool, package) in [("ip", "iproute2"), ("ping", "iputils-ping")]
        .into_iter()
        .chain(nft)
    {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ensure!(
            found,
            "espgw demo needs `{tool}`; install the `{package}` package"
        );
    }
    Ok(())
}

/// Builds the four namespaces and three veth pairs; with `nat`, a fifth
/// namespace between the gateways and one more pair.
fn build_topology(nat: bool) -> Result<()> {
    remove_namespaces();
    for ns in NAMESPACES.into_iter().filter(|ns| nat || *ns != NAT_NS) {
        ip(&["netns", "add", ns])?;
        in_ns(ns, &["ip", "link", "set", "lo", "up"])?;
        // Only IPv4 in this lab: no router solicitations or ND noise.
        in_ns(ns, &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
    }
    let middle: &[_] = if nat {
        &[
            ("a-out", "espgw-gwA", "n-in", NAT_NS),
            ("n-out", NAT_NS, "b-out", "espgw-gwB"),
        ]
    } else {
        &[("a-out", "espgw-gwA", "b-out", "espgw-gwB")]
    };
    let pairs = [("ha0", "espgw-hostA", "a-in", "espgw-gwA")]
        .iter()
        .chain(middle)
        .chain(&[("b-in", "espgw-gwB", "hb0", "espgw-hostB")]);
    for &(left, left_ns, right, right_ns) in pairs {
        ip(&[
            "link", "add", left, "netns", left_ns, "type", "veth", "peer", "name", right, "netns", right_ns,
        ])?;
        for (dev, ns) in [(left, left_ns), (right, right_ns)] {
            // The kernel's default offloads stay on: the hosts' TCP and UDP
            // reach the gateways with partial checksums and as GSO
            // super-packets, which espgw's driver completes and segments.
            in_ns(ns, &["ip", "link", "set", dev, "up"])?;
        }
    }
    // The hosts have addresses and default routes; the gateway namespaces
    // have none: espgw answers ARP and ICMP for its addresses itself.
    in_ns(
        "espgw-hostA",
        &["ip", "addr", "add", "192.168.1.10/24", "dev", "ha0"],
    )?;
    in_ns(
        "espgw-hostA",
        &["ip", "route", "add", "default", "via", "192.168.1.1"],
    )?;
    in_ns(
        "espgw-hostB",
        &["ip", "addr", "add", "192.168.2.20/24", "dev", "hb0"],
    )?;
    in_ns(
        "espgw-hostB",
        &["ip", "route", "add", "default", "via", "192.168.2.1"],
    )?;
    if nat {
        build_nat()?;
    }
    Ok(())
}

/// The NAT in `espgw-nat`: a router that masquerades what leaves on
/// `n-out` (source address and port rewritten), and lets in from there only
/// what answers a mapping gwA opened, as a home router does. gwB therefore
/// cannot reach gwA's private address at all, and must send to the mapping.
fn build_nat() -> Result<()> {
    let inside = format!("{NAT_INSIDE}/24");
    let public = format!("{NAT_PUBLIC}/24");
    in_ns(NAT_NS, &["ip", "addr", "add", &inside, "dev", "n-in"])?;
    in_ns(NAT_NS, &["ip", "addr", "add", &public, "dev", "n-out"])?;
    in_ns(NAT_NS, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    let rules = format!(
        "table ip espgw_demo_nat {{
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        oifname \"n-out\" meta l4proto {{ tcp, udp }} masquerade to :{NAT_PORTS}
        oifname \"n-out\" masquerade
    }}
    chain forward {{
        type filter hook forward priority filter; policy drop;
        iifname \"n-in\" oifname \"n-out\" accept
        iifname \"n-out\" oifname \"n-in\" ct state established,related accept
    }}
}}
"
    );
    let mut nft = Command::new("ip")
        .args(["netns", "exec", NAT_NS, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .context("running `nft -f -` in espgw-nat")?;
    nft.stdin
        .take()
        .context("nft's standard input")?
        .write_all(rules.as_bytes())?;
    let status = nft.wait()?;
    ensure!(status.success(), "nft refused the NAT rules:\n{rules}");
    Ok(())
}

/// The tables of the shipped demo configs that the edits below change.
/// Each edit names the value it expects to find, so that a shipped file
/// that changed under them fails the demo with the key to look at,
/// instead of the edit silently not happening.
struct Shipped<'a> {
    side: &'a str,
    doc: toml_edit::DocumentMut,
}

impl Shipped<'_> {
    /// The file's one `[[tunnel]]`.
    fn tunnel(&mut self) -> Result<&mut toml_edit::Table> {
        let side = self.side;
        self.doc
            .get_mut("tunnel")
            .and_then(toml_edit::Item::as_array_of_tables_mut)
            .and_then(|tunnels| tunnels.get_mut(0))
            .ok_or_else(|| anyhow::anyhow!("configs/demo-{side}.toml has no [[tunnel]]"))
    }

    /// A top-level table, made if the file has none.
    fn table(&mut self, name: &str) -> Result<&mut toml_edit::Table> {
        let side = self.side;
        self.doc
            .entry(name)
            .or_insert_with(toml_edit::table)
            .as_table_mut()
            .ok_or_else(|| anyhow::anyhow!("configs/demo-{side}.toml: `{name}` is not a table"))
    }

    /// The `[[name]]` entry whose `key` is `value`.
    fn entry_where(&mut self, name: &str, key: &str, value: &str) -> Result<&mut toml_edit::Table> {
        let found = self
            .doc
            .get_mut(name)
            .and_then(toml_edit::Item::as_array_of_tables_mut)
            .and_then(|all| {
                all.iter_mut()
                    .find(|t| t.get(key).and_then(|v| v.as_str()) == Some(value))
            });
        match found {
            Some(table) => Ok(table),
            None => Err(anyhow::anyhow!(
                "configs/demo-{}.toml has no [[{name}]] with {key} = \"{value}\" for the demo to edit",
                self.side
            )),
        }
    }
}

/// Sets `key` of `table` from `from` to `to`; `from` must be its value.
fn replace_value(table: &mut toml_edit::Table, key: &str, from: &str, to: &str) -> Result<()> {
    let current = table.get(key).and_then(|v| v.as_str());
    ensure!(
        current == Some(from),
        "the demo expects {key} = \"{from}\" where the shipped config has {current:?}"
    );
    table[key] = toml_edit::value(to);
    Ok(())
}

/// `--nat`: the shipped demo config rewritten for the NAT between the
/// gateways. gwA reaches gwB's public address through the NAT; gwB knows
/// gwA only by its private address (as a peer behind a NAT is configured),
/// which it cannot reach: it learns the NAT's address and port.
fn nat_config(config: &mut Shipped<'_>) -> Result<()> {
    let (destination, via) = if config.side == "a" {
        replace_value(
            config.entry_where("route", "via", "10.0.0.2")?,
            "via",
            "10.0.0.2",
            &NAT_INSIDE.to_string(),
        )?;
        replace_value(config.tunnel()?, "remote", "10.0.0.2", &GW_B_PUBLIC.to_string())?;
        ("172.16.0.0/24", NAT_INSIDE)
    } else {
        replace_value(
            config.entry_where("interface", "name", "outside")?,
            "address",
            "10.0.0.2/24",
            &format!("{GW_B_PUBLIC}/24"),
        )?;
        replace_value(
            config.entry_where("route", "via", "10.0.0.1")?,
            "via",
            "10.0.0.1",
            &NAT_PUBLIC.to_string(),
        )?;
        replace_value(config.tunnel()?, "local", "10.0.0.2", &GW_B_PUBLIC.to_string())?;
        ("10.0.0.0/24", NAT_PUBLIC)
    };
    let mut route = toml_edit::Table::new();
    route["destination"] = toml_edit::value(destination);
    route["via"] = toml_edit::value(via.to_string());
    let routes = config
        .doc
        .get_mut("route")
        .and_then(toml_edit::Item::as_array_of_tables_mut)
        .ok_or_else(|| anyhow::anyhow!("configs/demo-{}.toml has no [[route]]", config.side))?;
    routes.push(route);
    config.tunnel()?["encap"] = toml_edit::value("udp");
    Ok(())
}

/// The shipped demo config of `side` (its text), with another proposal
/// and fitting keys if asked, the `sec` engine with faults, the NAT's
/// addresses, and a short byte lifetime for `--rekey-every`. The shipped
/// file stays the authority: only what a flag changes is edited, through
/// `toml_edit`, and the rest (comments included) is kept as shipped.
fn edited_demo_config(side: &str, args: &DemoArgs, shipped: &str) -> Result<String> {
    let doc = shipped
        .parse::<toml_edit::DocumentMut>()
        .with_context(|| format!("configs/demo-{side}.toml is not TOML"))?;
    let mut config = Shipped { side, doc };
    let algorithm = args.algorithm;
    if algorithm != Algorithm::Aes128Gcm16 {
        let key = |len: usize, seed: u8| -> String {
            (0..len)
                .map(|i| format!("{:02x}", (i as u8).wrapping_add(seed)))
                .collect()
        };
        let (out_seed, in_seed) = if side == "a" { (0x00, 0x20) } else { (0x20, 0x00) };
        let tunnel = config.tunnel()?;
        ensure!(
            tunnel.contains_key("proposal"),
            "configs/demo-{side}.toml: its [[tunnel]] has no proposal for --algorithm to replace"
        );
        tunnel["proposal"] = toml_edit::value(algorithm.to_string());
        for dir in ["out", "in"] {
            tunnel.remove(&format!("enc_key_{dir}"));
            tunnel.remove(&format!("auth_key_{dir}"));
        }
        for (dir, seed) in [("out", out_seed), ("in", in_seed)] {
            if algorithm.enc_key_len() > 0 {
                tunnel[&format!("enc_key_{dir}")] = toml_edit::value(key(algorithm.enc_key_len(), seed));
            }
            if algorithm.auth_key_len() > 0 {
                tunnel[&format!("auth_key_{dir}")] =
                    toml_edit::value(key(algorithm.auth_key_len(), seed + 0x10));
            }
        }
        if algorithm.is_insecure() {
            config.table("gateway")?["allow_insecure_null"] = toml_edit::value(true);
        }
    }
    if args.fail_every.is_some() || args.lose_completion_every.is_some() {
        let accel = config.table("accel")?;
        accel["engine"] = toml_edit::value("sec");
        if let Some(n) = args.fail_every {
            accel["fail_every"] = toml_edit::value(i64::try_from(n).context("--fail-every")?);
        }
        if let Some(n) = args.lose_completion_every {
            accel["lose_completion_every"] =
                toml_edit::value(i64::try_from(n).context("--lose-completion-every")?);
        }
    }
    if args.nat {
        nat_config(&mut config)?;
    }
    if let Some(bytes) = args.rekey_every {
        let mut lifetime = toml_edit::Table::new();
        lifetime["soft_bytes"] = toml_edit::value(i64::try_from(bytes).context("--rekey-every")?);
        // Far beyond the soft limit: a rekey takes a few milliseconds, in
        // which a TCP burst through two workers moves megabytes.
        lifetime["hard_bytes"] = toml_edit::value(i64::try_from(bytes * 50).context("--rekey-every")?);
        config
            .tunnel()?
            .insert("lifetime", toml_edit::Item::Table(lifetime));
        let rekey = config.table("rekey")?;
        rekey["grace_ms"] = toml_edit::value(500);
        rekey["retransmit_ms"] = toml_edit::value(100);
    }
    Ok(config.doc.to_string())
}

/// [`edited_demo_config`] of the shipped file, written to `dir`.
fn demo_config(side: &str, args: &DemoArgs, dir: &Path) -> Result<PathBuf> {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("configs/demo-{side}.toml"));
    let text = std::fs::read_to_string(&shipped).with_context(|| format!("reading {}", shipped.display()))?;
    let text = edited_demo_config(side, args, &text)?;
    let path = dir.join(format!("demo-{side}.toml"));
    std::fs::write(&path, text)?;
    // The file holds keys: owner-only, as for a real gateway.
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(path)
}

fn start_gateway(ns: &str, config: &Path, stats: &Path, log: &Path, args: &DemoArgs) -> Result<Child> {
    let exe = std::env::current_exe().context("locating the espgw binary")?;
    let log = File::create(log)?;
    let faults = args.fail_every.is_some() || args.lose_completion_every.is_some();
    let engine = if faults { EngineKind::Sec } else { args.engine };
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .arg("run")
        .arg("--config")
        .arg(config)
        .arg("--stats")
        .arg(stats)
        .args([
            "--engine",
            engine.name(),
            "--style",
            args.style.name(),
            "--buffers",
            args.buffers.name(),
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting the gateway in {ns}"))
}

/// Moves the calling thread into network namespace `ns`.
fn enter(ns: &str) -> Result<()> {
    let file =
        File::open(format!("/var/run/netns/{ns}")).with_context(|| format!("opening namespace {ns}"))?;
    // SAFETY: setns on a namespace file we opened; affects only this thread.
    let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    ensure!(
        r == 0,
        "entering namespace {ns}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// A UDP flow of ESP between the gateways as one link shows it: source
/// address and port, destination address and port.
type UdpFlow = (Ipv4Addr, u16, Ipv4Addr, u16);

#[derive(Default)]
struct Wire {
    frames: AtomicU64,
    esp: AtomicU64,
    arp: AtomicU64,
    plaintext: AtomicU64,
    /// The gateways' rekey exchange (UDP port 500 between them, or behind
    /// the non-ESP marker on an encapsulation port).
    control: AtomicU64,
    /// RFC 3948 NAT keepalives.
    keepalives: AtomicU64,
    other: AtomicU64,
    /// A large ESP frame and where its ESP header starts.
    sample: std::sync::Mutex<Option<(Vec<u8>, usize)>>,
    /// The distinct flows of ESP in UDP seen (a handful: one each way, one
    /// more per NAT mapping), in order of their first frame.
    udp_flows: std::sync::Mutex<Vec<FlowSeen>>,
}

/// One flow of ESP in UDP on a link, by frame number on that link.
#[derive(Debug, Clone, Copy)]
struct FlowSeen {
    flow: UdpFlow,
    frames: u64,
    first: u64,
    last: u64,
}

/// What a frame on the link between the gateways is.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Arp,
    /// ESP, raw or in UDP (with where the ESP header starts), or a
    /// later fragment of either.
    Esp(Option<(usize, UdpFlow)>),
    Control,
    Keepalive,
    Plaintext,
    Other,
}

/// The gateways' outer addresses, with and without `--nat`: only the
/// gateways (and the NAT on their behalf) send from them, so a packet
/// between two of them is never a host's plaintext.
const OUTER: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 0, 0, 1),
    Ipv4Addr::new(10, 0, 0, 2),
    NAT_PUBLIC,
    GW_B_PUBLIC,
];

fn classify(frame: &[u8]) -> Seen {
    match frame.get(12..14) {
        Some([0x08, 0x06]) => return Seen::Arp,
        Some([0x08, 0x00]) => {}
        _ => return Seen::Other,
    }
    let Some(ip) = frame.get(14..).filter(|ip| ip.len() >= 20) else {
        return Seen::Other;
    };
    let header = usize::from(ip[0] & 0x0f) * 4;
    let addr = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
    let (src, dst) = (addr(12), addr(16));
    let between_gateways = OUTER.contains(&src) && OUTER.contains(&dst);
    let later_fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0;
    match ip[9] {
        50 => Seen::Esp(None),
        // A later fragment carries no UDP header to look at; between the
        // gateways' outer addresses it is part of an encapsulated packet.
        17 if later_fragment && between_gateways => Seen::Esp(None),
        17 if between_gateways => {
            let Some(udp) = ip.get(header..header + dataplane::nat::UDP_HEADER_LEN) else {
                return Seen::Plaintext;
            };
            let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
            let (sport, dport) = (port(0), port(2));
            let payload = ip
                .get(header + dataplane::nat::UDP_HEADER_LEN..)
                .unwrap_or_default();
            if sport == dataplane::CONTROL_PORT || dport == dataplane::CONTROL_PORT {
                return Seen::Control;
            }
            let nat_t = spd_sad::UdpEncap::NAT_T.local_port;
            if sport != nat_t && dport != nat_t {
                return Seen::Plaintext;
            }
            match dataplane::nat::Payload::of(payload) {
                dataplane::nat::Payload::Esp => Seen::Esp(Some((
                    14 + header + dataplane::nat::UDP_HEADER_LEN,
                    (src, sport, dst, dport),
                ))),
                dataplane::nat::Payload::Ike => Seen::Control,
                dataplane::nat::Payload::Keepalive => Seen::Keepalive,
                dataplane::nat::Payload::Malformed => Seen::Other,
            }
        }
        _ => Seen::Plaintext,
    }
}

/// Watches device `dev` in namespace `ns` (a link between the gateways)
/// until `stop`.
fn capture(
    ns: &'static str,
    dev: &'static str,
    wire: Arc<Wire>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Result<()>> {
    thread::spawn(move || {
        enter(ns)?;
        let socket = dataplane::io::afpacket::AfPacket::open_capture(dev)?;
        let mut pool = dataplane::PacketPool::new(64);
        let mut bufs = Vec::new();
        let mut scratch = dataplane::io::afpacket::RxScratch::new();
        while !stop.load(Ordering::Relaxed) {
            if socket.recv_batch(&mut pool, &mut bufs, 64, &mut scratch)? == 0 {
                thread::sleep(Duration::from_millis(2));
            }
            for buf in bufs.drain(..) {
                let frame = buf.data();
                let number = wire.frames.fetch_add(1, Ordering::Relaxed);
                let counter = match classify(frame) {
                    Seen::Arp => &wire.arp,
                    Seen::Esp(udp) => {
                        let (offset, flow) = udp.map_or((34, None), |(at, flow)| (at, Some(flow)));
                        if let Ok(mut sample) = wire.sample.lock() {
                            if sample.is_none() && frame.len() > 200 && frame.len() >= offset + 24 {
                                *sample = Some((frame.to_vec(), offset));
                            }
                        }
                        if let (Some(flow), Ok(mut flows)) = (flow, wire.udp_flows.lock()) {
                            match flows.iter_mut().find(|f| f.flow == flow) {
                                Some(seen) => {
                                    seen.frames += 1;
                                    seen.last = number;
                                }
                                None => flows.push(FlowSeen {
                                    flow,
                                    frames: 1,
                                    first: number,
                                    last: number,
                                }),
                            }
                        }
                        &wire.esp
                    }
                    Seen::Control => &wire.control,
                    Seen::Keepalive => &wire.keepalives,
                    Seen::Plaintext => &wire.plaintext,
                    Seen::Other => &wire.other,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                pool.free(buf);
            }
        }
        Ok(())
    })
}

/// Makes gwA (process `pid`, reading `config`) reload while traffic flows:
/// a broken file and one with an inbound SA no policy names by `espgw
/// reload`, and the latter by SIGHUP, which must all be refused, then the
/// original plus one more tunnel, which must be taken.
fn reload_check(config: &Path, pid: u32) -> Result<String> {
    let original = std::fs::read_to_string(config)?;
    let socket = crate::control::default_path("demo-a");
    thread::sleep(Duration::from_millis(400));
    std::fs::write(
        config,
        format!("{original}\n[[tunnel]]\nname = \"broken\"\nproposal = \"aes128gcm8\"\n"),
    )?;
    let refused = match crate::control::ask(&socket, "reload") {
        Ok(doc) => bail!("gwA took a broken configuration: {doc}"),
        Err(e) => e.to_string(),
    };
    // An inbound SA that no policy names would admit nothing said: refused
    // at its line, the running SAs stay (RFC 4301 §5.2).
    std::fs::write(
        config,
        format!(
            "{original}\n[[sa]]\nname = \"stray-in\"\ndirection = \"in\"\nspi = 0x3001\nlocal = \"10.0.0.1\"\n\
             remote = \"10.0.0.2\"\nproposal = \"aes128gcm16\"\n\
             enc_key = \"000102030405060708090a0b0c0d0e0f10111213\"\n"
        ),
    )?;
    let unselected = match crate::control::ask(&socket, "reload") {
        Ok(doc) => bail!("gwA took an inbound SA that no policy names: {doc}"),
        Err(e) => e.to_string(),
    };
    ensure!(
        unselected.contains("inbound SA `stray-in` is named by no inbound `protect` policy"),
        "gwA refused the policy-less SA for another reason: {unselected}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    thread::sleep(Duration::from_millis(300));
    let extra = "\n[[tunnel]]\nname = \"extra\"\nlocal = \"10.0.0.1\"\nremote = \"10.0.0.2\"\n\
                 local_subnet = \"192.168.101.0/24\"\nremote_subnet = \"192.168.102.0/24\"\n\
                 proposal = \"aes256gcm16\"\nspi_out = 0x2001\nspi_in = 0x2002\n\
                 secret = \"another published demo secret\"\n";
    std::fs::write(config, format!("{original}{extra}"))?;
    let taken = crate::control::ask(&socket, "reload")?;
    let added = taken["report"]["added"].clone();
    ensure!(
        added == serde_json::json!(["extra"]),
        "gwA's reload added {added}, not [\"extra\"]"
    );
    let unchanged = &taken["report"]["unchanged"];
    ensure!(
        *unchanged == serde_json::json!(["a-b"]),
        "gwA's reload did not keep `a-b`: {taken}"
    );
    let listed = crate::control::ask(&socket, "sa show extra")?;
    ensure!(
        listed["sas"].as_array().is_some_and(|sas| sas.len() == 2),
        "the new tunnel's SAs are not installed: {listed}"
    );
    Ok(format!(
        "broken configs refused three times (espgw reload: \"{}\"; a policy-less inbound SA: \"{}\"; SIGHUP) with traffic flowing; then a valid one taken: tunnels added {added}, `a-b` kept its SAs",
        refused.lines().next().unwrap_or_default(),
        unselected.lines().next().unwrap_or_default()
    ))
}

/// What one flood did to the numbered UDP streams.
pub(crate) struct FloodRound {
    pub(crate) label: &'static str,
    pub(crate) sent: u64,
    pub(crate) rate: f64,
    pub(crate) good: (Stream, Stream),
}

/// Sends bad ESP from gwA's side of the link to gwB for `duration`, as
/// fast as one thread can: `spi` with sequence numbers far ahead of any
/// window (so gwB must check the ICV), random bytes after them.
fn flood(
    spi: u32,
    duration: Duration,
    rate: Option<u64>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Result<(u64, f64)>> {
    thread::spawn(move || {
        // To gwB's MAC, which is its device's own (the demo configs set none).
        let mac = |ns: &str, dev: &str| -> Result<[u8; 6]> {
            enter(ns)?;
            let link = dataplane::io::device::link(dev)?;
            Ok(link.mac.map_or([0x02, 0, 0, 0, 0, 0x02], |m| m.0))
        };
        let to = mac("espgw-gwB", "b-out")?;
        let from = mac("espgw-gwA", "a-out")?;
        let socket = dataplane::io::afpacket::AfPacket::open("a-out")?;
        let mut frame = vec![0u8; 14 + 20 + 8 + 16 + 100];
        frame[..6].copy_from_slice(&to);
        frame[6..12].copy_from_slice(&from);
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        let total = (frame.len() - 14) as u16;
        {
            let mut ip = smoltcp::wire::Ipv4Packet::new_unchecked(&mut frame[14..34]);
            ip.set_version(4);
            ip.set_header_len(20);
            ip.set_total_len(total);
            ip.set_hop_limit(64);
            ip.set_next_header(smoltcp::wire::IpProtocol::IpSecEsp);
            ip.set_src_addr(Ipv4Addr::new(10, 0, 0, 1));
            ip.set_dst_addr(Ipv4Addr::new(10, 0, 0, 2));
            ip.fill_checksum();
        }
        frame[34..38].copy_from_slice(&spi.to_be_bytes());
        for (i, b) in frame[42..].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(29).wrapping_add(7);
        }
        let start = Instant::now();
        let mut sent = 0u64;
        let mut seq = 1_000_000u32;
        while start.elapsed() < duration && !stop.load(Ordering::Relaxed) {
            if let Some(rate) = rate {
                // Paced: never ahead of `rate` frames per second.
                let due = Duration::from_secs_f64(sent as f64 / rate.max(1) as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    thread::sleep(wait);
                }
            }
            frame[38..42].copy_from_slice(&seq.to_be_bytes());
            seq = seq.wrapping_add(1);
            if socket.send(&frame).is_ok() {
                sent += 1;
            }
        }
        Ok((sent, sent as f64 / start.elapsed().as_secs_f64().max(1e-9)))
    })
}

/// The numbered streams without a flood, then under each kind of flood.
pub(crate) fn flood_check(rate: Option<u64>) -> Result<Vec<FloodRound>> {
    let mut rounds = Vec::new();
    for (label, spi) in [
        ("no flood", None),
        ("unknown SPI", Some(0xdead_beef)),
        ("tunnel SPI, bad ICV", Some(0x1001)),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let flooder = spi.map(|spi| flood(spi, Duration::from_secs(3), rate, Arc::clone(&stop)));
        let good = udp_streams(2000, 500, Duration::from_millis(1))?;
        stop.store(true, Ordering::Relaxed);
        let (sent, rate) = match flooder {
            Some(h) => h.join().map_err(|_| anyhow::anyhow!("the flooder panicked"))??,
            None => (0, 0.0),
        };
        rounds.push(FloodRound {
            label,
            sent,
            rate,
            good,
        });
    }
    Ok(rounds)
}

/// Counts of one numbered UDP stream.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stream {
    pub(crate) sent: usize,
    pub(crate) received: usize,
    pub(crate) duplicates: usize,
}

/// Numbered UDP datagrams of `size` bytes, `count` each way at once
/// (hostA → hostB and back), one every `gap`: steady traffic through the
/// tunnel while it rekeys. Returns (A → B, B → A).
pub(crate) fn udp_streams(count: usize, size: usize, gap: Duration) -> Result<(Stream, Stream)> {
    let receiver = |ns: &'static str, addr: Ipv4Addr| {
        thread::spawn(move || -> Result<Stream> {
            enter(ns)?;
            let socket = UdpSocket::bind(SocketAddrV4::new(addr, 7100))?;
            socket.set_read_timeout(Some(Duration::from_millis(1500)))?;
            let mut seen = vec![false; count];
            let mut stream = Stream::default();
            let mut buf = [0u8; 2048];
            // Until the sender has been quiet for the read timeout.
            while let Ok(n) = socket.recv(&mut buf) {
                if n >= 4 {
                    let seq = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                    match seen.get_mut(seq) {
                        Some(s) if *s => stream.duplicates += 1,
                        Some(s) => {
                            *s = true;
                            stream.received += 1;
                        }
                        None => {}
                    }
                }
            }
            Ok(stream)
        })
    };
    let sender = |ns: &'static str, from: Ipv4Addr, to: Ipv4Addr| {
        thread::spawn(move || -> Result<usize> {
            enter(ns)?;
            let socket = UdpSocket::bind(SocketAddrV4::new(from, 0))?;
            let mut payload = vec![0x5au8; size.max(4)];
            let start = Instant::now();
            for seq in 0..count {
                payload[..4].copy_from_slice(&(seq as u32).to_be_bytes());
                socket.send_to(&payload, SocketAddrV4::new(to, 7100))?;
                let due = gap * (seq as u32 + 1);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    thread::sleep(wait);
                }
            }
            Ok(count)
        })
    };
    let (at_b, at_a) = (receiver("espgw-hostB", HOST_B), receiver("espgw-hostA", HOST_A));
    thread::sleep(Duration::from_millis(100));
    let (to_b, to_a) = (
        sender("espgw-hostA", HOST_A, HOST_B),
        sender("espgw-hostB", HOST_B, HOST_A),
    );
    let join = |h: thread::JoinHandle<Result<usize>>| {
        h.join().map_err(|_| anyhow::anyhow!("a UDP sender panicked"))?
    };
    let (sent_b, sent_a) = (join(to_b)?, join(to_a)?);
    let collect = |h: thread::JoinHandle<Result<Stream>>| {
        h.join().map_err(|_| anyhow::anyhow!("a UDP receiver panicked"))?
    };
    let (mut ab, mut ba) = (collect(at_b)?, collect(at_a)?);
    ab.sent = sent_b;
    ba.sent = sent_a;
    Ok((ab, ba))
}

struct Results {
    ping: String,
    ping_ok: bool,
    udp_sent: usize,
    udp_echoed: usize,
    tcp_bytes: usize,
    tcp_seconds: f64,
    tcp_ok: bool,
}

pub(crate) fn ping() -> (String, bool) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            "espgw-hostA",
            "ping",
            "-c",
            "5",
            "-i",
            "0.2",
            "-W",
            "2",
        ])
        .arg(HOST_B.to_string())
        .output();
    match out {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let summary = text
                .lines()
                .filter(|l| l.contains("packets transmitted") || l.contains("rtt"))
                .collect::<Vec<_>>()
                .join("; ");
            (summary, out.status.success())
        }
        Err(e) => (format!("ping failed to run: {e}"), false),
    }
}

/// One ping hostA → hostB, waiting a second for the answer: whether it came.
fn ping_once() -> bool {
    Command::new("ip")
        .args(["netns", "exec", "espgw-hostA", "ping", "-c", "1", "-W", "1"])
        .arg(HOST_B.to_string())
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// UDP echo and a TCP stream, hostA → hostB and back.
pub(crate) fn udp_and_tcp(tcp_bytes: usize) -> Result<(usize, usize, usize, f64, bool)> {
    let ready = Arc::new(AtomicBool::new(false));
    let server_ready = Arc::clone(&ready);
    let server = thread::spawn(move || -> Result<()> {
        enter("espgw-hostB")?;
        let udp = UdpSocket::bind(SocketAddrV4::new(HOST_B, 7000))?;
        udp.set_read_timeout(Some(Duration::from_millis(200)))?;
        let tcp = TcpListener::bind(SocketAddrV4::new(HOST_B, 7001))?;
        server_ready.store(true, Ordering::Release);
        // Echoes until the TCP part is over (or 20 s), then frees the port
        // for the next round.
        let tcp_done = Arc::new(AtomicBool::new(false));
        let echo_done = Arc::clone(&tcp_done);
        let udp_thread = thread::spawn(move || {
            let mut buf = [0u8; 2048];
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && !echo_done.load(Ordering::Relaxed) {
                if let Ok((n, from)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(&buf[..n], from);
                }
            }
        });
        let (mut stream, _) = tcp.accept()?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut total = 0u64;
        let mut sum = 0u64;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            total += n as u64;
            sum = chunk[..n]
                .iter()
                .fold(sum, |s, &b| s.wrapping_mul(31).wrapping_add(u64::from(b)));
        }
        stream.write_all(&total.to_be_bytes())?;
        stream.write_all(&sum.to_be_bytes())?;
        tcp_done.store(true, Ordering::Relaxed);
        let _ = udp_thread.join();
        Ok(())
    });
    while !ready.load(Ordering::Acquire) {
        if server.is_finished() {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let client = thread::spawn(move || -> Result<(usize, usize, usize, f64, bool)> {
        enter("espgw-hostA")?;
        let udp = UdpSocket::bind(SocketAddrV4::new(HOST_A, 0))?;
        udp.set_read_timeout(Some(Duration::from_millis(500)))?;
        let sent = 200usize;
        let mut echoed = 0;
        let mut buf = [0u8; 2048];
        for i in 0..sent {
            let payload: Vec<u8> = (0..(i * 7) % 1400 + 1).map(|j| (j + i) as u8 & 0x7f).collect();
            udp.send_to(&payload, SocketAddrV4::new(HOST_B, 7000))?;
            if let Ok((n, _)) = udp.recv_from(&mut buf) {
                if buf[..n] == payload[..] {
                    echoed += 1;
                }
            }
        }
        let mut stream =
            TcpStream::connect_timeout(&SocketAddrV4::new(HOST_B, 7001).into(), Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(15)))?;
        let data: Vec<u8> = (0..tcp_bytes).map(|i| (i * 13 % 251) as u8).collect();
        let expected = data
            .iter()
            .fold(0u64, |s, &b| s.wrapping_mul(31).wrapping_add(u64::from(b)));
        let start = Instant::now();
        stream.write_all(&data)?;
        stream.shutdown(std::net::Shutdown::Write)?;
        let mut answer = [0u8; 16];
        stream.read_exact(&mut answer)?;
        let seconds = start.elapsed().as_secs_f64();
        let total = u64::from_be_bytes(answer[..8].try_into().unwrap_or_default());
        let sum = u64::from_be_bytes(answer[8..].try_into().unwrap_or_default());
        Ok((
            sent,
            echoed,
            tcp_bytes,
            seconds,
            total == tcp_bytes as u64 && sum == expected,
        ))
    });
    let result = client
        .join()
        .map_err(|_| anyhow::anyhow!("the traffic client panicked"))??;
    let _ = server.join();
    Ok(result)
}

pub(crate) fn drops_line(stats: &serde_json::Value) -> String {
    let drops: Vec<String> = stats["drops"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
                .map(|(k, v)| format!("{k} {v}"))
                .collect()
        })
        .unwrap_or_default();
    if drops.is_empty() {
        "none".into()
    } else {
        drops.join(", ")
    }
}

/// What the driver did with the hosts' offloads: checksums completed,
/// super-packets cut into segments and merged again on the way out, and
/// frames it could not make whole.
pub(crate) fn offload_line(stats: &serde_json::Value) -> String {
    let o = &stats["offload"];
    let n = |k: &str| o[k].as_u64().unwrap_or(0);
    let mut line = format!(
        "csum_completed {} gso_segmented {} (into {} segments) coalesced {} (from {} segments)",
        n("csum_completed"),
        n("gso_segmented"),
        n("gso_segments"),
        n("tx_coalesced"),
        n("tx_coalesced_segments")
    );
    if let Some(map) = o.as_object() {
        for (k, v) in map {
            let v = v.as_u64().unwrap_or(0);
            if v > 0 && !OffloadCounters::WORK_KEYS.contains(&k.as_str()) {
                line += &format!(", {k} {v}");
            }
        }
    }
    line
}

/// Builds the topology and starts both gateways; everything goes away
/// when the returned `Lab` is dropped.
pub(crate) fn start_lab(args: &DemoArgs) -> Result<(Lab, PathBuf, PathBuf)> {
    check_prerequisites(args.nat)?;
    let dir = std::env::temp_dir().join(format!("espgw-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut lab = Lab {
        gateways: Vec::new(),
        dir: dir.clone(),
        keep: args.keep,
    };
    eprintln!("building hostA — gwA — gwB — hostB ...");
    build_topology(args.nat)?;
    let (config_a, config_b) = (demo_config("a", args, &dir)?, demo_config("b", args, &dir)?);
    let (stats_a, stats_b) = (dir.join("gwA.json"), dir.join("gwB.json"));
    lab.gateways.push(start_gateway(
        "espgw-gwA",
        &config_a,
        &stats_a,
        &dir.join("gwA.log"),
        args,
    )?);
    lab.gateways.push(start_gateway(
        "espgw-gwB",
        &config_b,
        &stats_b,
        &dir.join("gwB.log"),
        args,
    )?);
    thread::sleep(Duration::from_millis(500));
    for (child, name) in lab.gateways.iter_mut().zip(["gwA", "gwB"]) {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            bail!("gateway {name} exited ({status}):\n{log}");
        }
    }
    Ok((lab, stats_a, stats_b))
}

pub fn run(args: &DemoArgs) -> Result<()> {
    if let Some(seconds) = args.soak {
        return crate::soak::run(args, Duration::from_secs(seconds));
    }
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))?;
    }
    let (mut lab, stats_a, stats_b) = start_lab(args)?;
    // With --nat, both sides of the NAT: gwA's private link and the
    // public one, where gwB sees the NAT's mapping.
    let links: &[(&str, &str, &str)] = if args.nat {
        &[
            ("espgw-gwA", "a-out", "gwA–NAT link"),
            ("espgw-gwB", "b-out", "NAT–gwB link"),
        ]
    } else {
        &[("espgw-gwA", "a-out", "gwA–gwB link")]
    };
    let stop_capture = Arc::new(AtomicBool::new(false));
    let captures: Vec<_> = links
        .iter()
        .map(|&(ns, dev, label)| {
            let wire = Arc::new(Wire::default());
            let capturer = capture(ns, dev, Arc::clone(&wire), Arc::clone(&stop_capture));
            (label, wire, capturer)
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    ensure!(!interrupted.load(Ordering::Relaxed), "interrupted");

    // --nat: gwB knows gwA only once gwA's first ESP arrives, and its
    // workers follow the move at their next timeout, so the reply to that
    // very packet may still go to gwA's configured address, which the NAT
    // drops. One ping first, reported apart, is that first contact.
    let first_contact = args.nat.then(|| {
        eprintln!("first contact: one ping from hostA, gwB's first news of gwA ...");
        ping_once()
    });
    eprintln!("sending ping, UDP and TCP from hostA to hostB ...");
    let (ping_summary, ping_ok) = ping();
    ensure!(!interrupted.load(Ordering::Relaxed), "interrupted");
    let (udp_sent, udp_echoed, tcp_bytes, tcp_seconds, tcp_ok) = udp_and_tcp(args.tcp_bytes)?;
    // With rekeys: steady traffic both ways for long enough to rekey again
    // and again (about 2 MB each way over 2 s).
    let floods = if args.flood_check {
        eprintln!("numbered UDP both ways, alone and under floods of bad ESP ...");
        Some(flood_check(args.flood_rate)?)
    } else {
        None
    };
    let streams = if args.rekey_every.is_some() || args.reload_check {
        eprintln!("streaming numbered UDP both ways ...");
        let reloads = args.reload_check.then(|| {
            let config = lab.dir.join("demo-a.toml");
            let pid = lab.gateways.first().map_or(0, Child::id);
            thread::spawn(move || reload_check(&config, pid))
        });
        let streams = udp_streams(2000, 1000, Duration::from_millis(1))?;
        let reloads = match reloads {
            Some(handle) => Some(
                handle
                    .join()
                    .map_err(|_| anyhow::anyhow!("the reload check panicked"))??,
            ),
            None => None,
        };
        Some((streams, reloads))
    } else {
        None
    };
    let results = Results {
        ping: ping_summary,
        ping_ok,
        udp_sent,
        udp_echoed,
        tcp_bytes,
        tcp_seconds,
        tcp_ok,
    };
    thread::sleep(Duration::from_millis(200));
    stop_capture.store(true, Ordering::Relaxed);
    let mut wires = Vec::new();
    for (label, wire, capturer) in captures {
        capturer
            .join()
            .map_err(|_| anyhow::anyhow!("the capture panicked"))?
            .with_context(|| format!("capturing the {label}"))?;
        wires.push((label, wire));
    }

    // Ask gwA over its control socket, as `espgw sa list` would.
    let sa_list = crate::control::ask(&crate::control::default_path("demo-a"), "sa list")
        .map(|doc| crate::report::sa_table(&doc))
        .unwrap_or_else(|e| format!("control socket: {e}\n"));
    // Stop the gateways so they write their final counters.
    for mut child in std::mem::take(&mut lab.gateways) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
    }
    let read_stats = |p: &Path| -> serde_json::Value {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    let (a, b) = (read_stats(&stats_a), read_stats(&stats_b));

    let total =
        |c: fn(&Wire) -> &AtomicU64| -> u64 { wires.iter().map(|(_, w)| c(w).load(Ordering::Relaxed)).sum() };
    // Every link must carry ESP: the smallest count stands for all.
    let esp = wires
        .iter()
        .map(|(_, w)| w.esp.load(Ordering::Relaxed))
        .min()
        .unwrap_or(0);
    let plaintext = total(|w| &w.plaintext);
    println!(
        "espgw demo: {} tunnel{}, engine {}, style {}, buffers {}",
        args.algorithm,
        if args.nat {
            ", ESP in UDP 4500 (RFC 3948), gwA behind a masquerading NAT"
        } else {
            ""
        },
        args.engine,
        args.style,
        args.buffers
    );
    if let Some(answered) = first_contact {
        println!(
            "  first ping hostA → hostB, gwB's first packet from gwA: {} (see `nat` below for where gwB sent the reply)",
            if answered { "answered" } else { "not answered" }
        );
    }
    println!("  ping  hostA → hostB: {}", results.ping);
    println!(
        "  udp   {} datagrams of 1..1400 bytes, {} echoed back intact",
        results.udp_sent, results.udp_echoed
    );
    println!(
        "  tcp   {} bytes in {:.2} s = {:.1} Mbit/s, {}",
        results.tcp_bytes,
        results.tcp_seconds,
        results.tcp_bytes as f64 * 8.0 / results.tcp_seconds.max(1e-9) / 1e6,
        if results.tcp_ok {
            "byte count and checksum match"
        } else {
            "MISMATCH"
        }
    );
    for (label, wire) in &wires {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let leaked = n(&wire.plaintext);
        let keepalives = if args.nat {
            format!("{} NAT keepalives, ", n(&wire.keepalives))
        } else {
            String::new()
        };
        println!(
            "  wire  {label}: {} frames: {} ESP{}, {} ARP, {} rekey exchange ({}), {keepalives}{leaked} plaintext IPv4, {} other → {}",
            n(&wire.frames),
            n(&wire.esp),
            if args.nat { " in UDP" } else { "" },
            n(&wire.arp),
            n(&wire.control),
            if args.nat { "IKE on 4500" } else { "UDP 500" },
            n(&wire.other),
            if leaked == 0 {
                "no plaintext leaked"
            } else {
                "PLAINTEXT LEAKED"
            }
        );
    }
    for (_, wire) in wires.iter().take(1) {
        if let Ok(sample) = wire.sample.lock() {
            if let Some((f, at)) = sample.as_ref() {
                let word = |i: usize| u32::from_be_bytes([f[i], f[i + 1], f[i + 2], f[i + 3]]);
                let (spi, seq) = (word(*at), word(at + 4));
                let udp = if *at > 34 {
                    format!(
                        " UDP {} → {}",
                        u16::from_be_bytes([f[34], f[35]]),
                        u16::from_be_bytes([f[36], f[37]])
                    )
                } else {
                    String::new()
                };
                println!(
                    "  esp   sample: {} → {}{udp} SPI {spi:#010x} seq {seq} {} bytes: {}…",
                    Ipv4Addr::from(word(26)),
                    Ipv4Addr::from(word(30)),
                    f.len() - 14,
                    f[at + 8..at + 24]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                );
            }
        }
    }
    let nat_ok = !args.nat || nat_report(&wires, &a, &b);
    for (name, s) in [("gwA", &a), ("gwB", &b)] {
        println!(
            "  {name}   rx {} tx {} encapsulated {} decapsulated {} generated {} · drops: {} · kernel socket drops {} · offload: {}",
            s["rx_packets"],
            s["tx_packets"],
            s["encapsulated"],
            s["decapsulated"],
            s["generated"],
            drops_line(s),
            s["kernel_drops"],
            offload_line(s)
        );
    }
    // Which MAC and MTU each gateway took, as its startup log says.
    for name in ["gwA", "gwB"] {
        let log = std::fs::read_to_string(lab.dir.join(format!("{name}.log"))).unwrap_or_default();
        for line in log
            .lines()
            .filter_map(|l| l.split_once("interface `").map(|(_, rest)| rest))
        {
            println!(
                "  link  {name} {}",
                line.replacen("` on `", " ", 1).replacen("`:", ":", 1)
            );
        }
    }
    let mut nothing_lost = true;
    if let Some(floods) = &floods {
        for f in floods {
            let (ab, ba) = &f.good;
            println!(
                "  flood {:<20} {:>9} bad ESP frames ({:>7.0} /s) · good UDP {:>4}/{} hostA→hostB, {:>4}/{} hostB→hostA",
                f.label, f.sent, f.rate, ab.received, ab.sent, ba.received, ba.sent
            );
        }
        // A flood may cost good traffic, but must never shut it out.
        let starved = floods
            .iter()
            .any(|f| f.good.0.received * 2 < f.good.0.sent || f.good.1.received * 2 < f.good.1.sent);
        if starved {
            println!("  flood STARVED the good traffic (less than half arrived)");
        }
        nothing_lost = !starved;
    }
    if let Some((_, Some(reloads))) = &streams {
        println!("  reload {reloads}");
    }
    if let Some(((ab, ba), _)) = &streams {
        let whole = ab.received == ab.sent && ba.received == ba.sent && ab.duplicates + ba.duplicates == 0;
        nothing_lost = nothing_lost && whole;
        if args.rekey_every.is_none() {
            println!(
                "  udp   numbered: {}/{} hostA→hostB, {}/{} hostB→hostA, {} duplicates",
                ab.received,
                ab.sent,
                ba.received,
                ba.sent,
                ab.duplicates + ba.duplicates
            );
        }
    }
    if let (Some(every), Some(((ab, ba), _))) = (args.rekey_every, &streams) {
        let rekeys = |s: &serde_json::Value| s["control"]["rekeys_completed"].as_u64().unwrap_or(0);
        // Packets the gateways lost: every drop but the fragmentation-needed
        // refusals, which answer TCP's path-MTU probing with ICMP by design.
        let lost = |s: &serde_json::Value| {
            s["drops"].as_object().map_or(0, |m| {
                m.iter()
                    .filter(|(reason, _)| *reason != "frag_needed")
                    .filter_map(|(_, v)| v.as_u64())
                    .sum::<u64>()
            })
        };
        let (lost_a, lost_b) = (lost(&a), lost(&b));
        let streams_whole =
            ab.received == ab.sent && ba.received == ba.sent && ab.duplicates + ba.duplicates == 0;
        nothing_lost = nothing_lost
            && lost_a + lost_b == 0
            && streams_whole
            && results.udp_echoed == results.udp_sent
            && results.tcp_ok
            && rekeys(&a) > 0
            && rekeys(&a) == rekeys(&b);
        println!(
            "  rekey every {every} bytes: {} rekeys at gwA, {} at gwB (now generation {}); numbered UDP {}/{} hostA→hostB and {}/{} hostB→hostA received, {} duplicates; {} packets lost in the gateways → {}",
            rekeys(&a),
            rekeys(&b),
            a["tunnels"][0]["generation"],
            ab.received,
            ab.sent,
            ba.received,
            ba.sent,
            ab.duplicates + ba.duplicates,
            lost_a + lost_b,
            if nothing_lost { "nothing lost" } else { "PACKETS LOST" }
        );
    }
    println!("  gwA's SAs (espgw sa list --config configs/demo-a.toml):");
    for line in sa_list.lines() {
        println!("        {line}");
    }
    drop(lab);
    let leftover: Vec<&str> = NAMESPACES
        .iter()
        .copied()
        .filter(|ns| Path::new(&format!("/var/run/netns/{ns}")).exists())
        .collect();
    println!(
        "  clean {}",
        if leftover.is_empty() {
            "all namespaces and veth pairs removed".to_owned()
        } else {
            format!("LEFT BEHIND: {leftover:?}")
        }
    );
    let all_ok = results.ping_ok
        && results.udp_echoed == results.udp_sent
        && results.tcp_ok
        && nat_ok
        && esp > 0
        && plaintext == 0
        && nothing_lost
        && leftover.is_empty();
    ensure!(all_ok, "the demo found a problem (see above)");
    println!("  ok");
    Ok(())
}

/// `--nat`: prints where the NAT put gwA and where gwB sent its ESP, and
/// says whether gwB followed gwA there. On the public link, gwA's ESP must
/// come from one NAT mapping of its 4500 (not 4500 itself: the NAT maps
/// to 40000-40999), gwB must send its ESP to that mapping, and to gwA's
/// configured address only before it first did (what it sent there the
/// NAT dropped), and gwB must have counted the move (`nat_peer_moved`).
fn nat_report(wires: &[(&str, Arc<Wire>)], gw_a: &serde_json::Value, gw_b: &serde_json::Value) -> bool {
    let flows = wires
        .get(1)
        .and_then(|(_, w)| w.udp_flows.lock().ok().map(|f| f.clone()))
        .unwrap_or_default();
    let nat_t = spd_sad::UdpEncap::NAT_T.local_port;
    let configured = Ipv4Addr::new(10, 0, 0, 1);
    let from_a: Vec<FlowSeen> = flows
        .iter()
        .filter(|f| (f.flow.0, f.flow.2, f.flow.3) == (NAT_PUBLIC, GW_B_PUBLIC, nat_t))
        .copied()
        .collect();
    let from_b = |to: Ipv4Addr| -> Vec<FlowSeen> {
        flows
            .iter()
            .filter(|f| (f.flow.0, f.flow.1, f.flow.2) == (GW_B_PUBLIC, nat_t, to))
            .copied()
            .collect()
    };
    let (to_mapping, to_configured) = (from_b(NAT_PUBLIC), from_b(configured));
    let stale: u64 = to_configured.iter().map(|f| f.frames).sum();
    let moved = gw_b["nat_peer_moved"].as_u64().unwrap_or(0);
    let followed = match (from_a.as_slice(), to_mapping.as_slice()) {
        ([a], [b]) => {
            a.flow.1 != nat_t
                && b.flow.3 == a.flow.1
                && to_configured.iter().all(|f| f.last < b.first)
                && flows.len() == 2 + to_configured.len()
                && moved >= 1
        }
        _ => false,
    };
    let list = |fs: &[FlowSeen], pick: fn(&UdpFlow) -> (Ipv4Addr, u16)| -> String {
        let text: Vec<String> = fs
            .iter()
            .map(|f| {
                let (a, p) = pick(&f.flow);
                format!("{a}:{p} ({} frames)", f.frames)
            })
            .collect();
        if text.is_empty() {
            "nowhere".into()
        } else {
            text.join(", ")
        }
    };
    println!(
        "  nat   gwA {configured}:{nat_t} appears behind the NAT as {}; gwB, configured with {configured}:{nat_t}, sent its ESP to {}{} · gwB nat_peer_moved {moved} · keepalives gwA sent {} gwB received {}, gwB sent {} gwA received {} → {}",
        list(&from_a, |f| (f.0, f.1)),
        list(&to_mapping, |f| (f.2, f.3)),
        if stale > 0 {
            format!(
                " and, before it followed, {stale} to {configured}:{nat_t}, which the NAT dropped"
            )
        } else {
            String::new()
        },
        gw_a["nat_keepalives_sent"],
        gw_b["nat_keepalives_received"],
        gw_b["nat_keepalives_sent"],
        gw_a["nat_keepalives_received"],
        if followed {
            "gwB followed gwA behind the NAT"
        } else {
            "gwB DID NOT FOLLOW gwA's NAT mapping"
        }
    );
    followed
}

impl DemoArgs {
    pub(crate) fn rekey_every(&self) -> Option<u64> {
        self.rekey_every
    }

    pub(crate) fn fail_every(&self) -> Option<u64> {
        self.fail_every
    }

    pub(crate) fn lose_completion_every(&self) -> Option<u64> {
        self.lose_completion_every
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    fn edited(side: &str, flags: &[&str]) -> ike_stub::Config {
        let args =
            <Cli as clap::Parser>::parse_from(std::iter::once("demo").chain(flags.iter().copied())).demo;
        let shipped =
            std::fs::read_to_string(format!("{}/configs/demo-{side}.toml", env!("CARGO_MANIFEST_DIR")))
                .expect("the shipped config");
        let text = edited_demo_config(side, &args, &shipped).unwrap_or_else(|e| panic!("{e:#}"));
        ike_stub::Config::parse(Path::new("demo.toml"), &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    /// Every flag's edit takes on the shipped files and gives what the
    /// demo relies on: the gateways would otherwise run a config the demo
    /// did not mean.
    #[test]
    fn the_shipped_demo_configs_take_every_edit() {
        for side in ["a", "b"] {
            let plain = edited(side, &[]);
            let tunnel = plain.tunnel("a-b").expect("the shipped tunnel");
            assert_eq!(tunnel.algorithm, Algorithm::Aes128Gcm16);
            assert!(tunnel.secret.is_some() && tunnel.encap.is_none());

            let null = edited(side, &["--algorithm", "null"]);
            assert!(null.allow_insecure_null && !plain.allow_insecure_null);
            let hmac = edited(side, &["--algorithm", "aes128-sha1"]);
            assert_eq!(hmac.tunnel("a-b").unwrap().algorithm, Algorithm::Aes128Sha1);
            let sa = hmac.sa("a-b-out").expect("the outbound SA");
            assert_eq!((sa.enc_key.len(), sa.auth_key.len()), (16, 20));
            let other = edited(
                if side == "a" { "b" } else { "a" },
                &["--algorithm", "aes128-sha1"],
            );
            let peer_in = other.sa("a-b-in").unwrap();
            assert_eq!(
                (&sa.enc_key, &sa.auth_key),
                (&peer_in.enc_key, &peer_in.auth_key),
                "both ends' keys agree"
            );

            let faults = edited(side, &["--fail-every", "7", "--lose-completion-every", "9"]);
            assert_eq!(faults.engine.kind, EngineKind::Sec);
            assert_eq!(faults.engine.sec.faults.fail_every, Some(7));
            assert_eq!(faults.engine.sec.faults.drop_completion_every, Some(9));

            let rekey = edited(side, &["--rekey-every", "200kB"]);
            let life = rekey.tunnel("a-b").unwrap().lifetime;
            assert_eq!(
                (life.soft.bytes, life.hard.bytes),
                (Some(200_000), Some(10_000_000))
            );
            assert_eq!(rekey.rekey.grace, Duration::from_millis(500));
            assert_eq!(rekey.rekey.retransmit, Duration::from_millis(100));

            let nat = edited(side, &["--nat", "--rekey-every", "200kB"]);
            let tunnel = nat.tunnel("a-b").unwrap();
            assert!(tunnel.encap.is_some());
            assert!(tunnel.lifetime.soft.bytes.is_some());
            let vias: Vec<_> = nat.routes.iter().map(|r| r.via).collect();
            if side == "a" {
                assert_eq!(tunnel.remote, GW_B_PUBLIC);
                assert_eq!(vias, [Some(NAT_INSIDE), Some(NAT_INSIDE)]);
            } else {
                assert_eq!((tunnel.local, nat.outside.address), (GW_B_PUBLIC, GW_B_PUBLIC));
                assert_eq!(vias, [Some(NAT_PUBLIC), Some(NAT_PUBLIC)]);
            }
        }
    }

    /// An Ethernet frame with an IPv4 header from `src` to `dst` carrying
    /// `proto` and `payload`.
    fn frame(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0];
        ip.extend(src.octets());
        ip.extend(dst.octets());
        f.extend(ip);
        f.extend(payload);
        f
    }

    fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut u = Vec::new();
        u.extend(sport.to_be_bytes());
        u.extend(dport.to_be_bytes());
        u.extend((8 + payload.len() as u16).to_be_bytes());
        u.extend([0, 0]);
        u.extend(payload);
        u
    }

    #[test]
    fn the_wire_watch_tells_esp_in_udp_from_plaintext() {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let esp = [0, 0, 0x10, 0x01, 0, 0, 0, 7, 0xaa, 0xbb];
        assert_eq!(classify(&frame(a, b, 50, &esp)), Seen::Esp(None));
        let mapped = frame(NAT_PUBLIC, GW_B_PUBLIC, 17, &udp(40_123, 4500, &esp));
        assert_eq!(
            classify(&mapped),
            Seen::Esp(Some((42, (NAT_PUBLIC, 40_123, GW_B_PUBLIC, 4500))))
        );
        assert_eq!(
            classify(&frame(a, GW_B_PUBLIC, 17, &udp(4500, 4500, &[0xff]))),
            Seen::Keepalive
        );
        assert_eq!(
            classify(&frame(
                GW_B_PUBLIC,
                NAT_PUBLIC,
                17,
                &udp(4500, 40_123, &[0, 0, 0, 0, 1, 2, 3, 4])
            )),
            Seen::Control
        );
        assert_eq!(
            classify(&frame(a, b, 17, &udp(500, 500, &[1; 40]))),
            Seen::Control
        );
        // A host's datagram, even to 4500, is plaintext on this link; so is
        // one between the gateways on another port.
        assert_eq!(
            classify(&frame(HOST_A, HOST_B, 17, &udp(4500, 4500, &esp))),
            Seen::Plaintext
        );
        assert_eq!(
            classify(&frame(a, b, 17, &udp(7000, 7000, &esp))),
            Seen::Plaintext
        );
        assert_eq!(classify(&frame(HOST_A, HOST_B, 6, &[0; 20])), Seen::Plaintext);
        // A later fragment of ESP in UDP has no UDP header of its own.
        let mut later = frame(NAT_PUBLIC, GW_B_PUBLIC, 17, &[0x5a; 100]);
        later[14 + 6..14 + 8].copy_from_slice(&185u16.to_be_bytes());
        assert_eq!(classify(&later), Seen::Esp(None));
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(classify(&arp), Seen::Arp);
    }
}
