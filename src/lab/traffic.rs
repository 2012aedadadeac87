//! The lab's traffic: ping, numbered UDP streams both ways, a UDP echo and
//! a checked TCP transfer between the hosts, floods of bad ESP into gwB,
//! and iperf3 for `bench --veth`. Each sender and receiver runs on a
//! thread of its own moved into its host's namespace.
//!
//! Owns: the sockets and iperf3 processes it opens, for as long as one
//! call runs (an iperf3 server is handed to the [`Lab`] to stop).
//! Must not: build or change the topology or the gateways, or judge the
//! figures it returns (demo, soak and the veth bench do).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::topology::{enter, Lab, Names, HOST_A, HOST_A6, HOST_B, HOST_B6};

/// hostA's and hostB's addresses of one family (IPv6: `--ipv6`'s).
pub fn hosts(ipv6: bool) -> (IpAddr, IpAddr) {
    if ipv6 {
        (HOST_A6.into(), HOST_B6.into())
    } else {
        (HOST_A.into(), HOST_B.into())
    }
}

/// iperf3's port in hostB.
const IPERF3_PORT: &str = "5301";

/// What one flood did to the numbered UDP streams.
pub struct FloodRound {
    pub label: &'static str,
    pub sent: u64,
    pub rate: f64,
    pub good: (Stream, Stream),
}

/// Sends bad ESP from gwA's side of the link to gwB for `duration`, as
/// fast as one thread can: `spi` with sequence numbers far ahead of any
/// window (so gwB must check the ICV), random bytes after them.
fn flood(
    names: &Names,
    spi: u32,
    duration: Duration,
    rate: Option<u64>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Result<(u64, f64)>> {
    let (gw_a, gw_b) = (names.gw_a.clone(), names.gw_b.clone());
    thread::spawn(move || {
        // To gwB's MAC, which is its device's own (the demo configs set none).
        let mac = |ns: &str, dev: &str| -> Result<[u8; 6]> {
            enter(ns)?;
            let link = drivers::device::link(dev)?;
            Ok(link.mac.map_or([0x02, 0, 0, 0, 0, 0x02], |m| m.0))
        };
        let to = mac(&gw_b, "b-out")?;
        let from = mac(&gw_a, "a-out")?;
        let socket = drivers::afpacket::AfPacket::open("a-out")?;
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

/// The numbered streams without a flood, then under each kind of flood;
/// `tunnel_spi` is gwB's live inbound SPI of the tunnel (its exchange
/// picked it at start).
pub fn flood_check(names: &Names, rate: Option<u64>, tunnel_spi: u32) -> Result<Vec<FloodRound>> {
    let mut rounds = Vec::new();
    for (label, spi) in [
        ("no flood", None),
        ("unknown SPI", Some(0xdead_beef)),
        ("tunnel SPI, bad ICV", Some(tunnel_spi)),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let flooder = spi.map(|spi| flood(names, spi, Duration::from_secs(3), rate, Arc::clone(&stop)));
        let good = udp_streams(names, 2000, 500, Duration::from_millis(1))?;
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
pub struct Stream {
    pub sent: usize,
    pub received: usize,
    pub duplicates: usize,
}

/// Numbered UDP datagrams of `size` bytes, `count` each way at once
/// (hostA → hostB and back), one every `gap`: steady traffic through the
/// tunnel while it rekeys. Returns (A → B, B → A).
pub fn udp_streams(names: &Names, count: usize, size: usize, gap: Duration) -> Result<(Stream, Stream)> {
    let receiver = |ns: String, addr: Ipv4Addr| {
        thread::spawn(move || -> Result<Stream> {
            enter(&ns)?;
            let socket = UdpSocket::bind(SocketAddrV4::new(addr, 7100))?;
            // Room for the whole stream: a receiver that a busy host (or
            // an emulated one) schedules late must not lose datagrams in
            // its own socket, which the count would blame on the tunnel.
            let room: libc::c_int = 8 << 20;
            let _ = accel::os::set_sockopt(&socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &room);
            // Long enough for a pause under emulation (a rekey in a
            // TCG VM) not to end the count early.
            socket.set_read_timeout(Some(Duration::from_millis(3000)))?;
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
    let sender = |ns: String, from: Ipv4Addr, to: Ipv4Addr| {
        thread::spawn(move || -> Result<usize> {
            enter(&ns)?;
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
    let (at_b, at_a) = (
        receiver(names.host_b.clone(), HOST_B),
        receiver(names.host_a.clone(), HOST_A),
    );
    thread::sleep(Duration::from_millis(100));
    let (to_b, to_a) = (
        sender(names.host_a.clone(), HOST_A, HOST_B),
        sender(names.host_b.clone(), HOST_B, HOST_A),
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

/// `count` pings hostA → `to` (hostB's address of one family), 0.2 s apart: the summary lines, and
/// whether all were answered.
pub fn ping(names: &Names, to: IpAddr, count: u32) -> (String, bool) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &names.host_a,
            "ping",
            "-c",
            &count.to_string(),
            "-i",
            "0.2",
            "-W",
            "2",
        ])
        .arg(to.to_string())
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
pub fn ping_once(names: &Names) -> bool {
    Command::new("ip")
        .args(["netns", "exec", &names.host_a, "ping", "-c", "1", "-W", "1"])
        .arg(HOST_B.to_string())
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// UDP echo and a TCP stream, hostA → hostB and back, between `from` and
/// `to` (the hosts' addresses of one family, [`hosts`]).
pub fn udp_and_tcp(
    names: &Names,
    (from, to): (IpAddr, IpAddr),
    tcp_bytes: usize,
) -> Result<(usize, usize, usize, f64, bool)> {
    let ready = Arc::new(AtomicBool::new(false));
    let server_ready = Arc::clone(&ready);
    let (host_a, host_b) = (names.host_a.clone(), names.host_b.clone());
    let server = thread::spawn(move || -> Result<()> {
        enter(&host_b)?;
        let udp = UdpSocket::bind(SocketAddr::new(to, 7000))?;
        udp.set_read_timeout(Some(Duration::from_millis(200)))?;
        let tcp = TcpListener::bind(SocketAddr::new(to, 7001))?;
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
        enter(&host_a)?;
        let udp = UdpSocket::bind(SocketAddr::new(from, 0))?;
        udp.set_read_timeout(Some(Duration::from_millis(500)))?;
        let sent = 200usize;
        let mut echoed = 0;
        let mut buf = [0u8; 2048];
        for i in 0..sent {
            let payload: Vec<u8> = (0..(i * 7) % 1400 + 1).map(|j| (j + i) as u8 & 0x7f).collect();
            udp.send_to(&payload, SocketAddr::new(to, 7000))?;
            if let Ok((n, _)) = udp.recv_from(&mut buf) {
                if buf[..n] == payload[..] {
                    echoed += 1;
                }
            }
        }
        let mut stream = TcpStream::connect_timeout(&SocketAddr::new(to, 7001), Duration::from_secs(5))?;
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

/// What the lab reads of `iperf3 -J`'s report; a figure it leaves out
/// reads as none.
#[derive(Debug, Default, Deserialize)]
struct Iperf3Report {
    error: Option<String>,
    #[serde(default)]
    end: Iperf3End,
}

#[derive(Debug, Default, Deserialize)]
struct Iperf3End {
    /// UDP: what the client sent, with the server's loss count.
    #[serde(default)]
    sum: Iperf3Sum,
    /// TCP: what the server received.
    #[serde(default)]
    sum_received: Iperf3Sum,
}

#[derive(Debug, Default, Deserialize)]
struct Iperf3Sum {
    bits_per_second: Option<f64>,
    packets: Option<f64>,
    lost_packets: Option<f64>,
    seconds: Option<f64>,
}

/// Runs `iperf3 -J ARGS` in namespace `ns`; its report.
fn iperf3(ns: &str, args: &[&str]) -> Result<Iperf3Report> {
    // The server takes a moment to finish a test after its client has
    // (longer when the last UDP test filled queues): "busy" is retried.
    let mut attempt = 0;
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "iperf3", "-J"])
            .args(args)
            .output()
            .context("running iperf3")?;
        let doc: Iperf3Report = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("iperf3 {}: no JSON answer", args.join(" ")))?;
        match doc.error.as_deref() {
            Some(error) if error.contains("busy") && attempt < 10 => {
                attempt += 1;
                thread::sleep(Duration::from_millis(500));
            }
            Some(error) => bail!("iperf3 {}: {error}", args.join(" ")),
            None => return Ok(doc),
        }
    }
}

/// An iperf3 server in hostB, stopped with the lab.
pub fn start_iperf3_server(lab: &mut Lab) -> Result<()> {
    let server = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.names.host_b,
            "iperf3",
            "-s",
            "-p",
            IPERF3_PORT,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the iperf3 server in hostB")?;
    lab.children.push(server);
    wait_for_listener(&lab.names.host_b, IPERF3_PORT, Duration::from_secs(10))
}

/// Returns once a TCP socket in namespace `ns` listens on `port`: a
/// client started before that is refused, not queued.
fn wait_for_listener(ns: &str, port: &str, limit: Duration) -> Result<()> {
    let filter = format!("sport = :{port}");
    let deadline = Instant::now() + limit;
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "ss", "-H", "-l", "-t", "-n", &filter])
            .output()
            .context("running ss")?;
        if out.status.success() && !out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("nothing listens on TCP port {port} in {ns} after {limit:?}");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// `iperf3 -c hostB` from hostA for `seconds`, with `args` after.
fn iperf3_client(names: &Names, seconds: u32, args: &[&str]) -> Result<Iperf3Report> {
    let (host_b, seconds) = (HOST_B.to_string(), seconds.max(1).to_string());
    let mut all = vec!["-c", &host_b, "-p", IPERF3_PORT, "-t", &seconds];
    all.extend_from_slice(args);
    iperf3(&names.host_a, &all)
}

/// One iperf3 TCP run hostA → hostB of `streams` streams for `seconds`:
/// Gbit/s received.
pub fn iperf3_tcp(names: &Names, streams: u32, seconds: u32) -> Result<f64> {
    let doc = iperf3_client(names, seconds, &["-P", &streams.to_string()])?;
    Ok(doc.end.sum_received.bits_per_second.unwrap_or(0.0) / 1e9)
}

/// One iperf3 UDP probe hostA → hostB: `rate` bits/s of payload (0: as
/// fast as iperf3 can). Returns (sent packets/s, received packets/s, loss %).
pub fn iperf3_udp(names: &Names, len: usize, rate: f64, seconds: u32) -> Result<(f64, f64, f64)> {
    let (len, rate) = (len.to_string(), format!("{}", rate as u64));
    let doc = iperf3_client(names, seconds, &["-u", "-l", &len, "-b", &rate, "-w", "4M"])?;
    let sum = &doc.end.sum;
    let packets = sum.packets.unwrap_or(0.0);
    let lost = sum.lost_packets.unwrap_or(0.0);
    let secs = sum.seconds.filter(|s| *s > 0.0).unwrap_or(1.0);
    let loss = if packets > 0.0 {
        100.0 * lost / packets
    } else {
        100.0
    };
    Ok((packets / secs, (packets - lost).max(0.0) / secs, loss))
}
