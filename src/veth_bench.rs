//! `espgw bench --veth`: the end-to-end benchmark. The demo's
//! four namespaces (hostA - gwA - gwB - hostB, veth pairs, the kernel's
//! default offloads) are built once per row: first with plain kernel IPv4
//! forwarding in the gateway namespaces (the reference row), then with
//! `espgw run` in each: forwarding in the clear under bypass policies (what
//! espgw's packet I/O, segmentation and checksums cost without ESP: the
//! floor under the tunnel rows), then an aes128gcm16 tunnel between them,
//! once as raw ESP and once as ESP in UDP (RFC 3948, whose datagrams the
//! gateways can hand the middle link as UDP GSO super-packets). Each row
//! gets iperf3 TCP with 1 and 4 streams (median of a few runs) and UDP at
//! 64 and 1400 bytes of payload at the highest rate with at most 1 % loss
//! (bisection); the espgw rows also get the gateways' CPU cycles per
//! forwarded 64-byte packet.
//!
//! Owns: the rows' method (medians, the loss bisection, cycles), the
//! gateways' configuration and the table and JSON report. The namespaces,
//! starting the gateways and iperf3 are the lab's (`crate::lab`); this
//! module must not build or tear down any of them itself.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use accel::Algorithm;
use anyhow::{bail, ensure, Context, Result};
use ike_stub::builder::{pattern_key, ConfigBuilder, InterfaceBuilder, PolicyBuilder, TunnelBuilder};
use serde::Serialize;
use spd_sad::{Ipv4Prefix, PolicyDirection};

use crate::lab::topology::{gateway_command, have_tool, in_ns, is_root, kernel_forwarding, Lab, Names};
use crate::lab::traffic;

/// Loss a UDP rate may cost and still count (percent).
const LOSS_LIMIT: f64 = 1.0;

pub struct Options {
    pub prefix: String,
    pub tcp_seconds: u32,
    pub udp_seconds: u32,
    pub tcp_runs: usize,
    pub udp_probes: usize,
    pub json: Option<PathBuf>,
}

/// One row of the table.
#[derive(Default, Clone)]
struct Row {
    tcp1_gbps: f64,
    tcp4_gbps: f64,
    udp64: Udp,
    udp1400: Udp,
    /// Cycles per forwarded 64-byte packet at gwA (per packet encapsulated,
    /// or bypassed) and gwB (per packet decapsulated, or bypassed); espgw
    /// rows only.
    cycles: Option<(f64, f64)>,
}

/// The best UDP probe with at most 1 % loss.
#[derive(Default, Clone, Copy)]
struct Udp {
    /// Packets per second that arrived at hostB.
    received_pps: f64,
    loss_percent: f64,
    /// The unlimited probe already passed: iperf3 could send no faster,
    /// so this is the sender's limit, not the path's.
    sender_bound: bool,
}

fn check_prerequisites(prefix: &str) -> Result<()> {
    if !is_root() {
        bail!("espgw bench --veth needs root (network namespaces and veth pairs); run it with sudo");
    }
    ensure!(
        !prefix.is_empty() && prefix != "espgw" && prefix.len() <= 8,
        "--veth-prefix `{prefix}`: give 1 to 8 characters other than `espgw` (the demo's namespaces)"
    );
    for (tool, package) in [("ip", "iproute2"), ("ping", "iputils-ping"), ("iperf3", "iperf3")] {
        ensure!(
            have_tool(tool),
            "espgw bench --veth needs `{tool}`: install it, e.g. `apt-get install -y {package}` (Debian, Ubuntu) or `dnf install -y {package}`"
        );
    }
    Ok(())
}

/// The lab of one row: the topology, with room at the sink (iperf3 -w 4M),
/// so that the sink is not what is measured; rmem_max is per namespace.
fn build(names: &Names) -> Result<Lab> {
    let lab = Lab::new(names.clone(), None);
    lab.build(false, false)?;
    in_ns(&names.host_b, &["sysctl", "-qw", "net.core.rmem_max=16777216"])?;
    Ok(lab)
}

/// What the gateways of an espgw row do with hostA's and hostB's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carry {
    /// Bypass policies, no tunnel: forwarded in the clear.
    Clear,
    /// An aes128gcm16 tunnel.
    Esp(Encap),
}

impl Carry {
    /// The packets a gateway forwarded, from its stats: gwA's (`a`)
    /// encapsulated or gwB's decapsulated, or either's bypassed.
    fn forwarded(self, stats: &dataplane::Stats, a: bool) -> u64 {
        match (self, a) {
            (Carry::Clear, _) => stats.bypassed,
            (Carry::Esp(_), true) => stats.encapsulated,
            (Carry::Esp(_), false) => stats.decapsulated,
        }
    }
}

/// How the espgw rows carry ESP between the gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encap {
    /// IP protocol 50.
    Raw,
    /// RFC 3948 UDP on port 4500: the middle link can carry a tunnel's
    /// packets as UDP GSO super-packets.
    Udp,
}

/// The configuration of gwA (`a`) or gwB: the demo's addresses and an
/// aes128gcm16 tunnel `t` with published test keys (as in
/// configs/demo-*.toml), raw ESP or ESP in UDP; or, for `Carry::Clear`,
/// bypass policies between the two sites instead of the tunnel.
fn gateway_config_builder(a: bool, carry: Carry) -> ConfigBuilder {
    let third = |a: bool| if a { 1 } else { 2 };
    let gw = |a: bool| Ipv4Addr::new(10, 0, 0, third(a));
    let net = |a: bool| Ipv4Prefix::new(Ipv4Addr::new(192, 168, third(a), 0), 24).unwrap_or(Ipv4Prefix::ANY);
    let spis = if a { (0x1001, 0x1002) } else { (0x1002, 0x1001) };
    let (first_out, first_in) = if a { (0x00, 0x20) } else { (0x20, 0x00) };
    // 20 bytes (key and salt): `first`, then 01 02 ... 13.
    let key = |first: u8| {
        let mut key = pattern_key(20, 1, 0);
        key[0] = first;
        key
    };
    let (inside, outside) = if a { ("a-in", "a-out") } else { ("b-in", "b-out") };
    let config = ConfigBuilder::new()
        .name(format!("bench-{}", if a { "a" } else { "b" }))
        .interface(InterfaceBuilder::inside(
            inside,
            Ipv4Addr::new(192, 168, third(a), 1),
            24,
        ))
        .interface(InterfaceBuilder::outside(outside, gw(a), 24))
        .route_via(net(!a), gw(!a));
    let Carry::Esp(encap) = carry else {
        return config
            .policy(PolicyBuilder::bypass(
                "clear-out",
                PolicyDirection::Out,
                net(a),
                net(!a),
            ))
            .policy(PolicyBuilder::bypass(
                "clear-in",
                PolicyDirection::In,
                net(!a),
                net(a),
            ));
    };
    let mut tunnel = TunnelBuilder::new("t", (gw(a), gw(!a)), Algorithm::Aes128Gcm16, spis)
        .subnets(net(a), net(!a))
        .replay_window(1024);
    tunnel.enc_key_out = Some(key(first_out));
    tunnel.enc_key_in = Some(key(first_in));
    if encap == Encap::Udp {
        tunnel = tunnel.udp_encap();
    }
    config.tunnel(tunnel)
}

/// What the bench's work directories are called, before their random part.
pub const WORK_DIR: &str = "espgw-bench-veth-";

/// The bench's work directory: fresh and private (see
/// [`crate::lab::work_dir`]).
pub fn work_dir() -> Result<PathBuf> {
    crate::lab::work_dir(WORK_DIR)
}

fn gateway_config(side: &str, dir: &Path, carry: Carry) -> Result<PathBuf> {
    let text = gateway_config_builder(side == "a", carry).to_toml();
    let path = dir.join(format!("bench-{side}.toml"));
    // The previous row's, in our own directory; and its sequence ledger:
    // each row is a fresh pair of gateways. Kept, the ledger would have the
    // receiver count everything up to its reserved mark as received, which
    // may lie beyond where the sender resumes (its own reservation), and
    // the row's first packets would be refused as replays.
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(dir.join(format!("bench-{side}.state")));
    // The file holds keys: owner-only from its creation.
    crate::lab::write_new(&path, &text)?;
    Ok(path)
}

/// Side `side`'s configuration of the ESP row, written to `dir`.
#[cfg(test)]
pub fn write_gateway_config(side: &str, dir: &Path) -> Result<PathBuf> {
    gateway_config(side, dir, Carry::Esp(Encap::Raw))
}

/// `espgw run` in each gateway namespace; returns their control sockets.
fn espgw_gateways(lab: &mut Lab, dir: &Path, carry: Carry) -> Result<Vec<PathBuf>> {
    let mut sockets = Vec::new();
    for (side, ns) in [("a", lab.names.gw_a.clone()), ("b", lab.names.gw_b.clone())] {
        let config = gateway_config(side, dir, carry)?;
        let socket = dir.join(format!("bench-{side}.sock"));
        let log = dir.join(format!("gw{side}.log"));
        let child = gateway_command(&ns, &config)?
            .arg("--control")
            .arg(&socket)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting the gateway in {ns}"))?;
        lab.children.push(child);
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("forwarding") && socket.exists() {
                break;
            }
            if let Some(child) = lab.children.last_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    bail!("the gateway in {ns} exited ({status}):\n{text}");
                }
            }
            ensure!(
                started.elapsed() < Duration::from_secs(20),
                "the gateway in {ns} did not start in 20 s:\n{text}"
            );
            thread::sleep(Duration::from_millis(50));
        }
        sockets.push(socket);
    }
    Ok(sockets)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn tcp(names: &Names, streams: u32, options: &Options) -> Result<f64> {
    let mut runs = Vec::new();
    for _ in 0..options.tcp_runs.max(1) {
        runs.push(traffic::iperf3_tcp(names, streams, options.tcp_seconds)?);
    }
    Ok(median(runs))
}

/// The highest rate with at most 1 % loss: an unlimited probe, then
/// bisection between nothing and what it sent.
fn udp(names: &Names, len: usize, options: &Options) -> Result<Udp> {
    let (sent, received, loss) = traffic::iperf3_udp(names, len, 0.0, options.udp_seconds)?;
    if loss <= LOSS_LIMIT {
        return Ok(Udp {
            received_pps: received,
            loss_percent: loss,
            sender_bound: true,
        });
    }
    let bits = |pps: f64| pps * len as f64 * 8.0;
    let (mut low, mut high) = (0.0, bits(sent));
    let mut best = Udp::default();
    for _ in 0..options.udp_probes {
        let rate = (low + high) / 2.0;
        let (_, received, loss) = traffic::iperf3_udp(names, len, rate, options.udp_seconds)?;
        if loss <= LOSS_LIMIT {
            low = rate;
            if received > best.received_pps {
                best = Udp {
                    received_pps: received,
                    loss_percent: loss,
                    sender_bound: false,
                };
            }
        } else {
            high = rate;
        }
    }
    // Too few steps to come down far enough (a slow debug build, a loaded
    // machine): keep halving, so that the row still has a figure.
    for _ in 0..8 {
        if best.received_pps > 0.0 {
            break;
        }
        high /= 2.0;
        let (_, received, loss) = traffic::iperf3_udp(names, len, high, options.udp_seconds)?;
        if loss <= LOSS_LIMIT {
            best = Udp {
                received_pps: received,
                loss_percent: loss,
                sender_bound: false,
            };
        }
    }
    Ok(best)
}

/// utime + stime of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces: fields count from after its ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("unreadable /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of proc(5); `rest` starts at field 3.
    let tick = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<u64>().ok());
    match (tick(14), tick(15)) {
        (Some(u), Some(s)) => Ok(u + s),
        _ => bail!("unreadable /proc/{pid}/stat"),
    }
}

fn cpu_mhz() -> f64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// A running gateway's counters, typed: a renamed field fails here
/// instead of reading 0.
fn gateway_stats(socket: &Path) -> Result<dataplane::Stats> {
    let doc: crate::status::StatsReply =
        crate::control::ask(socket, "stats").with_context(|| format!("the stats of {}", socket.display()))?;
    Ok(doc.gateway)
}

/// Gateway cycles per forwarded packet over one UDP probe of 64 bytes at
/// `pps`: (gwA, gwB), each over the packets it forwarded as `carry` says.
fn cycles(lab: &Lab, sockets: &[PathBuf], carry: Carry, pps: f64, seconds: u32) -> Result<(f64, f64)> {
    // The gateways are the lab's first two children, the iperf3 server the third.
    let pids: Vec<u32> = lab.children.iter().take(2).map(Child::id).collect();
    ensure!(pids.len() == 2 && sockets.len() == 2, "two gateways expected");
    let ticks_before = [cpu_ticks(pids[0])?, cpu_ticks(pids[1])?];
    let forwarded = |socket: &Path, a: bool| gateway_stats(socket).map(|s| carry.forwarded(&s, a));
    let before = [forwarded(&sockets[0], true)?, forwarded(&sockets[1], false)?];
    traffic::iperf3_udp(&lab.names, 64, (pps * 64.0 * 8.0).max(1.0), seconds)?;
    // The gateways fold their workers' counters in at tick time.
    thread::sleep(Duration::from_millis(300));
    let ticks_after = [cpu_ticks(pids[0])?, cpu_ticks(pids[1])?];
    let after = [forwarded(&sockets[0], true)?, forwarded(&sockets[1], false)?];
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let hz_cpu = cpu_mhz() * 1e6;
    let per = |i: usize| {
        let packets = after[i].saturating_sub(before[i]).max(1) as f64;
        (ticks_after[i] - ticks_before[i]) as f64 / hz * hz_cpu / packets
    };
    Ok((per(0), per(1)))
}

/// One row's figures; `gateways`: the espgw gateways' control sockets and
/// what they carry, for the cycles (none for the kernel's row).
fn measure(lab: &mut Lab, options: &Options, gateways: Option<(&[PathBuf], Carry)>) -> Result<Row> {
    let names = lab.names.clone();
    // ARP everywhere before anything is timed.
    let _ = traffic::ping(&names, traffic::hosts(false).1, 3);
    traffic::start_iperf3_server(lab)?;
    thread::sleep(Duration::from_millis(300));
    let mut row = Row {
        tcp1_gbps: tcp(&names, 1, options)?,
        tcp4_gbps: tcp(&names, 4, options)?,
        udp64: udp(&names, 64, options)?,
        udp1400: udp(&names, 1400, options)?,
        cycles: None,
    };
    if let Some((sockets, carry)) = gateways {
        row.cycles = Some(cycles(
            lab,
            sockets,
            carry,
            row.udp64.received_pps,
            options.udp_seconds,
        )?);
    }
    Ok(row)
}

// The `--json` report. Each struct declares its fields in the order of
// their names, the order the report has always listed its keys in.

/// The whole report.
#[derive(Serialize)]
struct Report {
    cycles_source: &'static str,
    espgw: RowReport,
    espgw_bypass: RowReport,
    espgw_udp_encap: RowReport,
    kernel: RowReport,
    loss_limit_percent: f64,
    ratio: Ratios,
    ratio_bypass: Ratios,
    ratio_udp_encap: Ratios,
    ratio_udp_encap_over_bypass: Ratios,
    tcp_runs: usize,
    tcp_seconds: u32,
    topology: &'static str,
    udp_probes: usize,
    udp_seconds: u32,
}

/// One row's figures.
#[derive(Serialize)]
struct RowReport {
    cycles_per_packet_64: Option<Cycles>,
    tcp_x1_gbit_s: f64,
    tcp_x4_gbit_s: f64,
    udp_1400: UdpReport,
    udp_64: UdpReport,
}

#[derive(Serialize)]
struct Cycles {
    #[serde(rename = "gwA")]
    gw_a: f64,
    #[serde(rename = "gwB")]
    gw_b: f64,
}

#[derive(Serialize)]
struct UdpReport {
    loss_percent: f64,
    received_pps: f64,
    sender_bound: bool,
}

/// A row's figures over a reference row's.
#[derive(Serialize)]
struct Ratios {
    tcp_x1: f64,
    tcp_x4: f64,
    udp_1400: f64,
    udp_64: f64,
}

fn row_report(row: &Row) -> RowReport {
    let udp = |u: &Udp| UdpReport {
        loss_percent: u.loss_percent,
        received_pps: u.received_pps,
        sender_bound: u.sender_bound,
    };
    RowReport {
        cycles_per_packet_64: row.cycles.map(|(gw_a, gw_b)| Cycles { gw_a, gw_b }),
        tcp_x1_gbit_s: row.tcp1_gbps,
        tcp_x4_gbit_s: row.tcp4_gbps,
        udp_1400: udp(&row.udp1400),
        udp_64: udp(&row.udp64),
    }
}

pub fn run(options: &Options) -> Result<()> {
    check_prerequisites(&options.prefix)?;
    let names = Names::new(&options.prefix);
    let dir = work_dir()?;
    let started = Instant::now();
    eprintln!("kernel forwarding row ({}-*) ...", options.prefix);
    let kernel = {
        let mut lab = build(&names)?;
        kernel_forwarding(&names)?;
        measure(&mut lab, options, None)?
    };
    let espgw_row = |carry: Carry| {
        eprintln!(
            "espgw row, {} ...",
            match carry {
                Carry::Clear => "no ESP (bypass policies)",
                Carry::Esp(Encap::Raw) => "ESP raw",
                Carry::Esp(Encap::Udp) => "ESP in UDP",
            }
        );
        let mut lab = build(&names)?;
        let sockets = espgw_gateways(&mut lab, &dir, carry)?;
        measure(&mut lab, options, Some((&sockets, carry)))
    };
    // A failed row stops the run: its lab is torn down, the next is not built.
    let rows = (|| -> Result<[Row; 3]> {
        Ok([
            espgw_row(Carry::Clear)?,
            espgw_row(Carry::Esp(Encap::Raw))?,
            espgw_row(Carry::Esp(Encap::Udp))?,
        ])
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let [clear, espgw, espgw_udp] = rows?;
    print!(
        "{}",
        table(&kernel, &clear, &[&espgw, &espgw_udp], options, started.elapsed())
    );
    if let Some(path) = &options.json {
        let doc = Report {
            topology: "hostA - gwA - gwB - hostB, veth, kernel default offloads",
            tcp_seconds: options.tcp_seconds,
            tcp_runs: options.tcp_runs,
            udp_seconds: options.udp_seconds,
            udp_probes: options.udp_probes,
            loss_limit_percent: LOSS_LIMIT,
            cycles_source:
                "/proc/PID/stat utime+stime x cpu MHz (/proc/cpuinfo) / packets from the gateway's counters",
            kernel: row_report(&kernel),
            espgw_bypass: row_report(&clear),
            espgw: row_report(&espgw),
            espgw_udp_encap: row_report(&espgw_udp),
            ratio: ratios(&espgw, &kernel),
            ratio_udp_encap: ratios(&espgw_udp, &kernel),
            ratio_bypass: ratios(&clear, &kernel),
            ratio_udp_encap_over_bypass: ratios(&espgw_udp, &clear),
        };
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// `a` over `b`, 0 when there is no `b` (a row that measured nothing).
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// A row's figures over a reference row's (the kernel's, or espgw's
/// without ESP), in the JSON report.
fn ratios(row: &Row, kernel: &Row) -> Ratios {
    Ratios {
        tcp_x1: ratio(row.tcp1_gbps, kernel.tcp1_gbps),
        tcp_x4: ratio(row.tcp4_gbps, kernel.tcp4_gbps),
        udp_64: ratio(row.udp64.received_pps, kernel.udp64.received_pps),
        udp_1400: ratio(row.udp1400.received_pps, kernel.udp1400.received_pps),
    }
}

/// `clear`: espgw without ESP; `espgw`: the raw-ESP row, then the
/// ESP-in-UDP row.
fn table(kernel: &Row, clear: &Row, espgw: &[&Row; 2], options: &Options, took: Duration) -> String {
    use std::fmt::Write as _;
    let udp = |u: &Udp| {
        format!(
            "{:.1}{}",
            u.received_pps / 1e3,
            if u.sender_bound { "*" } else { "" }
        )
    };
    let mut out = format!(
        "espgw bench --veth: hostA - gwA - gwB - hostB on veth, kernel default offloads; TCP median of {} x {} s, UDP highest rate with <= 1 % loss ({} s probes, {} bisection steps, iperf3 -w 4M); {:.0} s in all\n",
        options.tcp_runs,
        options.tcp_seconds,
        options.udp_seconds,
        options.udp_probes,
        took.as_secs_f64()
    );
    let mut rows = crate::report::plain_table(
        &[
            "",
            "TCP x1",
            "TCP x4",
            "UDP 64 B",
            "UDP 1400 B",
            "cycles/pkt 64 B",
        ],
        &[1, 2, 3, 4, 5],
    );
    rows.add_row(["", "Gbit/s", "Gbit/s", "kpps", "kpps", "gwA / gwB"]);
    let names = [
        "kernel forwarding",
        "espgw, no ESP",
        "espgw aes128gcm16",
        "espgw ... in UDP 4500",
    ];
    for (name, row) in names.into_iter().zip([kernel, clear, espgw[0], espgw[1]]) {
        rows.add_row([
            name.to_owned(),
            format!("{:.2}", row.tcp1_gbps),
            format!("{:.2}", row.tcp4_gbps),
            udp(&row.udp64),
            udp(&row.udp1400),
            row.cycles
                .map_or("-".to_owned(), |(a, b)| format!("{a:.0} / {b:.0}")),
        ]);
    }
    for (name, row, reference) in [
        ("no ESP / kernel", clear, kernel),
        ("espgw / kernel", espgw[0], kernel),
        ("... in UDP / kernel", espgw[1], kernel),
        ("... in UDP / no ESP", espgw[1], clear),
    ] {
        let times = |a: f64, b: f64| format!("{:.2}x", ratio(a, b));
        rows.add_row([
            name.to_owned(),
            times(row.tcp1_gbps, reference.tcp1_gbps),
            times(row.tcp4_gbps, reference.tcp4_gbps),
            times(row.udp64.received_pps, reference.udp64.received_pps),
            times(row.udp1400.received_pps, reference.udp1400.received_pps),
            String::new(),
        ]);
    }
    out.push_str(&crate::report::table_text(&rows));
    let _ = writeln!(
        out,
        "(* iperf3 could send no faster without loss: the sender's limit. Cycles: /proc/PID/stat utime+stime x {:.0} MHz over one 64 B probe at the rate found, per packet encapsulated (gwA) or decapsulated (gwB), or bypassed (no ESP); no hardware counters. No ESP: the same gateways under bypass policies, their packet I/O, segmentation and checksums without the tunnel.)",
        cpu_mhz()
    );
    // The tunnel rows cannot beat the same gateways forwarding in the clear:
    // that row is the ceiling the packet I/O alone sets on the TCP bar.
    let _ = writeln!(
        out,
        "TCP x1 without ESP: {:.2}x the kernel's (espgw's packet I/O, segmentation and checksums, which the tunnel rows do too, and the crypto besides); ESP in UDP keeps {:.2}x of it",
        ratio(clear.tcp1_gbps, kernel.tcp1_gbps),
        ratio(espgw[1].tcp1_gbps, clear.tcp1_gbps),
    );
    for (name, row) in [("raw ESP", espgw[0]), ("ESP in UDP", espgw[1])] {
        let worst = row.cycles.map_or(f64::INFINITY, |(a, b)| a.max(b));
        for (bar, holds) in [
            (
                "TCP x1 >= 0.6x kernel",
                ratio(row.tcp1_gbps, kernel.tcp1_gbps) >= 0.6,
            ),
            (
                "UDP 64 B (<= 1 % loss) >= 0.75x kernel",
                ratio(row.udp64.received_pps, kernel.udp64.received_pps) >= 0.75,
            ),
            (
                "<= 2,400 cycles per forwarded 64 B packet (each gateway)",
                worst <= 2400.0,
            ),
        ] {
            let verdict = if holds { "holds" } else { "DOES NOT HOLD" };
            let _ = writeln!(out, "bar {bar}, {name}: {verdict}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ike_stub::PolicyAction;
    use spd_sad::IpPrefix;

    /// The table's columns line up whatever the figures' widths: every
    /// number ends where its header ends, and the bars are judged from the
    /// figures (here the no-ESP row is the only one near the kernel's).
    #[test]
    fn the_table_keeps_its_columns_and_judges_the_bars() {
        let row = |tcp: f64, pps: f64, cycles: Option<(f64, f64)>| Row {
            tcp1_gbps: tcp,
            tcp4_gbps: tcp * 2.0,
            udp64: Udp {
                received_pps: pps,
                loss_percent: 0.0,
                sender_bound: pps > 100e3,
            },
            udp1400: Udp {
                received_pps: pps / 2.0,
                ..Udp::default()
            },
            cycles,
        };
        let kernel = row(14.15, 152_500.0, None);
        let clear = row(13.0, 150_000.0, Some((1800.0, 1700.0)));
        let raw = row(1.99, 9_000.0, Some((10_877.0, 6_446.0)));
        let udp = row(3.47, 148_400.0, Some((5_104.0, 4_871.0)));
        let options = Options {
            prefix: "t".into(),
            tcp_seconds: 3,
            udp_seconds: 1,
            tcp_runs: 3,
            udp_probes: 5,
            json: None,
        };
        let text = table(&kernel, &clear, &[&raw, &udp], &options, Duration::from_secs(111));
        let lines: Vec<&str> = text.lines().collect();
        let end_of = |line: &str, cell: &str| line.find(cell).map(|at| at + cell.len());
        let tcp_column = end_of(lines[1], "TCP x1").expect("the header");
        for (line, cell) in [
            (lines[3], "14.15"),
            (lines[4], "13.00"),
            (lines[5], "1.99"),
            (lines[6], "3.47"),
            (lines[7], "0.92x"),
        ] {
            assert_eq!(end_of(line, cell), Some(tcp_column), "{line}\n{text}");
        }
        assert!(
            lines[6].trim_start().starts_with("espgw ... in UDP 4500 "),
            "{text}"
        );
        assert!(lines[3].contains("152.5*") && lines[5].contains("9.0 "), "{text}");
        assert!(text.contains("TCP x1 without ESP: 0.92x the kernel's"), "{text}");
        assert!(
            text.contains("bar TCP x1 >= 0.6x kernel, ESP in UDP: DOES NOT HOLD"),
            "{text}"
        );
        assert!(
            text.contains("bar UDP 64 B (<= 1 % loss) >= 0.75x kernel, ESP in UDP: holds"),
            "{text}"
        );
        assert!(
            text.contains("bar UDP 64 B (<= 1 % loss) >= 0.75x kernel, raw ESP: DOES NOT HOLD"),
            "{text}"
        );
    }

    /// The no-ESP row's gateways forward the two sites to each other in the
    /// clear, both ways, and hold no tunnel or SA.
    #[test]
    fn the_clear_rows_configs_bypass_both_sites_and_hold_no_sa() {
        let prefix =
            |third: u8| IpPrefix::V4(Ipv4Prefix::new(Ipv4Addr::new(192, 168, third, 0), 24).unwrap());
        for (a, (local, remote)) in [(true, (1, 2)), (false, (2, 1))] {
            let built = gateway_config_builder(a, Carry::Clear);
            let config = built
                .parse()
                .unwrap_or_else(|e| panic!("{e}\n{}", built.to_toml()));
            assert!(config.tunnels.is_empty() && config.sas.is_empty());
            let policies: Vec<_> = config
                .policies
                .iter()
                .map(|p| (p.direction, p.selector.src, p.selector.dst, p.action.clone()))
                .collect();
            assert_eq!(
                policies,
                [
                    (
                        PolicyDirection::Out,
                        prefix(local),
                        prefix(remote),
                        PolicyAction::Bypass
                    ),
                    (
                        PolicyDirection::In,
                        prefix(remote),
                        prefix(local),
                        PolicyAction::Bypass
                    ),
                ]
            );
        }
        let stats = dataplane::Stats {
            encapsulated: 1,
            decapsulated: 2,
            bypassed: 3,
            ..dataplane::Stats::default()
        };
        let esp = Carry::Esp(Encap::Udp);
        assert_eq!(
            [true, false].map(|a| (Carry::Clear.forwarded(&stats, a), esp.forwarded(&stats, a))),
            [(3, 1), (3, 2)]
        );
    }

    /// The gateways' files parse, and carry the keys, SPIs and
    /// encapsulation the two ends must agree on.
    #[test]
    fn the_gateways_configs_are_valid_and_agree() {
        let hex = |k: &[u8]| k.iter().map(|b| format!("{b:02x}")).collect::<String>();
        for encap in [Encap::Raw, Encap::Udp] {
            let [a, b] = [true, false].map(|a| {
                let built = gateway_config_builder(a, Carry::Esp(encap));
                built
                    .parse()
                    .unwrap_or_else(|e| panic!("{e}\n{}", built.to_toml()))
            });
            let (a_out, b_in) = (a.sa("t-out").unwrap(), b.sa("t-in").unwrap());
            assert_eq!((a_out.params.spi, b_in.params.spi), (0x1001, 0x1001));
            assert_eq!(hex(&a_out.enc_key), "000102030405060708090a0b0c0d0e0f10111213");
            assert_eq!(a_out.enc_key, b_in.enc_key);
            let (b_out, a_in) = (b.sa("t-out").unwrap(), a.sa("t-in").unwrap());
            assert_eq!((b_out.params.spi, a_in.params.spi), (0x1002, 0x1002));
            assert_eq!(hex(&b_out.enc_key), "200102030405060708090a0b0c0d0e0f10111213");
            assert_eq!(b_out.enc_key, a_in.enc_key);
            for config in [&a, &b] {
                let tunnel = config.tunnel("t").unwrap();
                assert_eq!(tunnel.encap.is_some(), encap == Encap::Udp);
                assert_eq!(
                    (tunnel.algorithm, tunnel.replay_window),
                    (Algorithm::Aes128Gcm16, 1024)
                );
                // No MAC or MTU: `espgw run` takes each device's own.
                assert_eq!(config.link_overrides, [ike_stub::LinkOverrides::default(); 2]);
            }
            assert_eq!(
                (
                    a.name.as_str(),
                    a.inside.device.as_str(),
                    a.outside.device.as_str()
                ),
                ("bench-a", "a-in", "a-out")
            );
            assert_eq!(
                (
                    b.name.as_str(),
                    b.inside.device.as_str(),
                    b.outside.device.as_str()
                ),
                ("bench-b", "b-in", "b-out")
            );
            assert_eq!(b.routes[0].via, Some(Ipv4Addr::new(10, 0, 0, 1)));
        }
    }
}
