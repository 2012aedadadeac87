//! `espgw demo`: four network namespaces (hostA, gwA, gwB, hostB) joined by
//! veth pairs, two gateways from `configs/demo-{a,b}.toml`, ping, UDP and
//! TCP traffic both ways, a capture of the gwA–gwB link that must hold only
//! ESP (and ARP), a short report, and everything removed again, also on
//! Ctrl-C or failure.

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

const NAMESPACES: [&str; 4] = ["espgw-hostA", "espgw-gwA", "espgw-gwB", "espgw-hostB"];
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

fn check_prerequisites() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("espgw demo needs root (network namespaces, veth pairs and raw sockets); run it with sudo");
    }
    for (tool, package) in [("ip", "iproute2"), ("ping", "iputils-ping")] {
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

/// Builds the four namespaces and three veth pairs.
fn build_topology() -> Result<()> {
    remove_namespaces();
    for ns in NAMESPACES {
        ip(&["netns", "add", ns])?;
        in_ns(ns, &["ip", "link", "set", "lo", "up"])?;
        // Only IPv4 in this lab: no router solicitations or ND noise.
        in_ns(ns, &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
    }
    let pairs = [
        ("ha0", "espgw-hostA", "a-in", "espgw-gwA"),
        ("a-out", "espgw-gwA", "b-out", "espgw-gwB"),
        ("b-in", "espgw-gwB", "hb0", "espgw-hostB"),
    ];
    for (left, left_ns, right, right_ns) in pairs {
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
    Ok(())
}

/// The shipped demo config, with another proposal and fitting keys if
/// asked, and a short byte lifetime for `--rekey-every`.
fn demo_config(side: &str, args: &DemoArgs, dir: &Path) -> Result<PathBuf> {
    let (algorithm, rekey_every) = (args.algorithm, args.rekey_every);
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("configs/demo-{side}.toml"));
    let mut text =
        std::fs::read_to_string(&shipped).with_context(|| format!("reading {}", shipped.display()))?;
    if algorithm != Algorithm::Aes128Gcm16 {
        let key = |len: usize, seed: u8| -> String {
            (0..len)
                .map(|i| format!("{:02x}", (i as u8).wrapping_add(seed)))
                .collect()
        };
        let (out_seed, in_seed) = if side == "a" { (0x00, 0x20) } else { (0x20, 0x00) };
        let mut keys = String::new();
        for (dir, seed) in [("out", out_seed), ("in", in_seed)] {
            if algorithm.enc_key_len() > 0 {
                keys += &format!("enc_key_{dir} = \"{}\"\n", key(algorithm.enc_key_len(), seed));
            }
            if algorithm.auth_key_len() > 0 {
                keys += &format!(
                    "auth_key_{dir} = \"{}\"\n",
                    key(algorithm.auth_key_len(), seed + 0x10)
                );
            }
        }
        text = text
            .lines()
            .filter(|l| !l.starts_with("enc_key_") && !l.starts_with("auth_key_"))
            .map(|l| {
                if l.starts_with("proposal = ") {
                    format!("proposal = \"{algorithm}\"\n{keys}")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        if algorithm.is_insecure() {
            text = text.replacen("[gateway]\n", "[gateway]\nallow_insecure_null = true\n", 1);
        }
    }
    if args.fail_every.is_some() || args.lose_completion_every.is_some() {
        let mut accel = "engine = \"sec\"\n".to_owned();
        if let Some(n) = args.fail_every {
            accel += &format!("fail_every = {n}\n");
        }
        if let Some(n) = args.lose_completion_every {
            accel += &format!("lose_completion_every = {n}\n");
        }
        text = text.replacen("engine = \"soft\"\n", &accel, 1);
    }
    if let Some(bytes) = rekey_every {
        // The tunnel is the file's last table, so its lifetime goes last.
        text += &format!(
            "\n[tunnel.lifetime]\nsoft_bytes = {bytes}\nhard_bytes = {}\n\n[rekey]\ngrace_ms = 500\nretransmit_ms = 100\n",
            // Far beyond the soft limit: a rekey takes a few milliseconds,
            // in which a TCP burst through two workers moves megabytes.
            bytes * 50
        );
    }
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

#[derive(Default)]
struct Wire {
    frames: AtomicU64,
    esp: AtomicU64,
    arp: AtomicU64,
    plaintext: AtomicU64,
    /// The gateways' rekey exchange (UDP port 500 between them).
    control: AtomicU64,
    other: AtomicU64,
    sample: std::sync::Mutex<Option<Vec<u8>>>,
}

/// Watches the gwA–gwB link from inside gwA until `stop`.
fn capture(wire: Arc<Wire>, stop: Arc<AtomicBool>) -> thread::JoinHandle<Result<()>> {
    thread::spawn(move || {
        enter("espgw-gwA")?;
        let socket = dataplane::io::afpacket::AfPacket::open_capture("a-out")?;
        let mut pool = dataplane::PacketPool::new(64);
        let mut bufs = Vec::new();
        let mut scratch = dataplane::io::afpacket::RxScratch::new();
        while !stop.load(Ordering::Relaxed) {
            if socket.recv_batch(&mut pool, &mut bufs, 64, &mut scratch)? == 0 {
                thread::sleep(Duration::from_millis(2));
            }
            for buf in bufs.drain(..) {
                let frame = buf.data();
                wire.frames.fetch_add(1, Ordering::Relaxed);
                match (frame.get(12..14), frame.get(14 + 9)) {
                    (Some([0x08, 0x06]), _) => wire.arp.fetch_add(1, Ordering::Relaxed),
                    (Some([0x08, 0x00]), Some(50)) => {
                        if let Ok(mut sample) = wire.sample.lock() {
                            if sample.is_none() && frame.len() > 200 {
                                *sample = Some(frame.to_vec());
                            }
                        }
                        wire.esp.fetch_add(1, Ordering::Relaxed)
                    }
                    (Some([0x08, 0x00]), Some(17)) if is_control(frame) => {
                        wire.control.fetch_add(1, Ordering::Relaxed)
                    }
                    (Some([0x08, 0x00]), _) => wire.plaintext.fetch_add(1, Ordering::Relaxed),
                    _ => wire.other.fetch_add(1, Ordering::Relaxed),
                };
                pool.free(buf);
            }
        }
        Ok(())
    })
}

/// UDP between the two gateways' outside addresses, to port 500: their
/// own rekey exchange, which is meant to be on the wire.
fn is_control(frame: &[u8]) -> bool {
    let ip = match frame.get(14..) {
        Some(ip) if ip.len() >= 28 => ip,
        _ => return false,
    };
    let header = usize::from(ip[0] & 0x0f) * 4;
    let gateways = [[10, 0, 0, 1], [10, 0, 0, 2]];
    gateways.contains(&[ip[12], ip[13], ip[14], ip[15]])
        && gateways.contains(&[ip[16], ip[17], ip[18], ip[19]])
        && ip.get(header + 2..header + 4) == Some(&dataplane::CONTROL_PORT.to_be_bytes()[..])
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
    check_prerequisites()?;
    let dir = std::env::temp_dir().join(format!("espgw-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut lab = Lab {
        gateways: Vec::new(),
        dir: dir.clone(),
        keep: args.keep,
    };
    eprintln!("building hostA — gwA — gwB — hostB ...");
    build_topology()?;
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
    let wire = Arc::new(Wire::default());
    let stop_capture = Arc::new(AtomicBool::new(false));
    let capturer = capture(Arc::clone(&wire), Arc::clone(&stop_capture));
    thread::sleep(Duration::from_millis(200));
    ensure!(!interrupted.load(Ordering::Relaxed), "interrupted");

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
    let capture_result = capturer
        .join()
        .map_err(|_| anyhow::anyhow!("the capture panicked"))?;
    capture_result.context("capturing the gwA–gwB link")?;

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

    let frames = wire.frames.load(Ordering::Relaxed);
    let esp = wire.esp.load(Ordering::Relaxed);
    let plaintext = wire.plaintext.load(Ordering::Relaxed);
    println!(
        "espgw demo: {} tunnel, engine {}, style {}, buffers {}",
        args.algorithm, args.engine, args.style, args.buffers
    );
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
    println!(
        "  wire  gwA–gwB link: {frames} frames: {esp} ESP, {} ARP, {} rekey exchange (UDP 500), {plaintext} plaintext IPv4, {} other → {}",
        wire.arp.load(Ordering::Relaxed),
        wire.control.load(Ordering::Relaxed),
        wire.other.load(Ordering::Relaxed),
        if plaintext == 0 {
            "no plaintext leaked"
        } else {
            "PLAINTEXT LEAKED"
        }
    );
    if let Ok(sample) = wire.sample.lock() {
        if let Some(f) = sample.as_ref() {
            let spi = u32::from_be_bytes([f[34], f[35], f[36], f[37]]);
            let seq = u32::from_be_bytes([f[38], f[39], f[40], f[41]]);
            println!(
                "  esp   sample: {}.{}.{}.{} → {}.{}.{}.{} SPI {spi:#010x} seq {seq} {} bytes: {}…",
                f[26],
                f[27],
                f[28],
                f[29],
                f[30],
                f[31],
                f[32],
                f[33],
                f.len() - 14,
                f[42..58].iter().map(|b| format!("{b:02x}")).collect::<String>()
            );
        }
    }
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
        && esp > 0
        && plaintext == 0
        && nothing_lost
        && leftover.is_empty();
    ensure!(all_ok, "the demo found a problem (see above)");
    println!("  ok");
    Ok(())
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
