//! Two gateways of two workers each (root, in CI), on a veth topology of
//! their own: a flood of large, fragmented UDP on many flows from hostA to
//! hostB must cost the peer no `replay_*` and no reassembly drop. Without
//! the inside steering, the flows spread over gwA's two workers, which
//! then both sent for the one outbound SA: one fell behind the peer's
//! window, and both started their outer IPv4 IDs at 1, so their fragments
//! collided in gwB's reassembly. With workers, the outside fanout
//! reassembles fragments in the kernel before steering each SPI to its
//! worker, so overlapping fragments would show in gwB's namespace as the
//! kernel's `ReasmFails`, and ESP at the wrong worker as `not_owner`.
//! Without root or the namespace tools the test shows as ignored (testkit
//! `netns`).

use std::fs::File;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::Prerequisite;

static NETNS: Prerequisite = Prerequisite::new("netns", || {
    testkit::root_and_tools("network namespaces", &[("ip", "iproute2")])
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(
        &NETNS,
        two_workers_cost_the_peer_no_replay_or_reassembly_drop
    )])
}

/// Names of their own, so that tests/demo.rs may run beside this one.
const HOST_A: &str = "espgw-w2-hostA";
const GW_A: &str = "espgw-w2-gwA";
const GW_B: &str = "espgw-w2-gwB";
const HOST_B: &str = "espgw-w2-hostB";

/// Rounds of the flood, one datagram per flow each.
const ROUNDS: usize = 800;

/// A counter of the `Ip:` lines of `/proc/net/snmp` in namespace `ns`.
fn ip_mib(ns: &str, field: &str) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .expect("ip netns exec cat");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == field)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no Ip {field} in {ns}'s /proc/net/snmp:\n{text}"))
}

fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().is_ok_and(|s| s.success());
    assert!(ok, "ip {}", args.join(" "));
}

fn remove_namespaces() {
    for ns in [HOST_A, GW_A, GW_B, HOST_B] {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
}

/// Removes the namespaces and stops the gateways, also when the test fails.
struct Lab {
    gateways: Vec<Child>,
    dir: std::path::PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in &mut self.gateways {
            // SAFETY: kill(2) on our own child (ip netns exec execs espgw).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
        remove_namespaces();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(side: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let (inside, outside, local, remote, local_net, remote_net, here, there) = if side == "a" {
        (
            "w2a-in",
            "w2a-out",
            "10.0.0.1",
            "10.0.0.2",
            "192.168.1",
            "192.168.2",
            "1001",
            "1002",
        )
    } else {
        (
            "w2b-in",
            "w2b-out",
            "10.0.0.2",
            "10.0.0.1",
            "192.168.2",
            "192.168.1",
            "1002",
            "1001",
        )
    };
    let (key_out, key_in) = if side == "a" { ("00", "20") } else { ("20", "00") };
    let key = |first: &str| format!("{first}0102030405060708090a0b0c0d0e0f10111213");
    let text = format!(
        "[gateway]\nname = \"w2{side}\"\n\n\
         [[interface]]\nname = \"inside\"\ndevice = \"{inside}\"\naddress = \"{local_net}.1/24\"\n\n\
         [[interface]]\nname = \"outside\"\ndevice = \"{outside}\"\naddress = \"{local}/24\"\n\n\
         [[route]]\ndestination = \"{remote_net}.0/24\"\nvia = \"{remote}\"\n\n\
         [[tunnel]]\nname = \"t\"\nlocal = \"{local}\"\nremote = \"{remote}\"\n\
         local_subnet = \"{local_net}.0/24\"\nremote_subnet = \"{remote_net}.0/24\"\n\
         proposal = \"aes128gcm16\"\nspi_out = 0x{here}\nspi_in = 0x{there}\n\
         enc_key_out = \"{}\"\nenc_key_in = \"{}\"\nreplay_window = 64\n",
        key(key_out),
        key(key_in),
    );
    let path = dir.join(format!("w2{side}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

fn stats(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("stats JSON")
}

fn two_workers_cost_the_peer_no_replay_or_reassembly_drop() {
    remove_namespaces();
    let dir = std::env::temp_dir().join(format!("espgw-w2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut lab = Lab {
        gateways: Vec::new(),
        dir: dir.clone(),
    };
    for ns in [HOST_A, GW_A, GW_B, HOST_B] {
        ip(&["netns", "add", ns]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
    for (left, left_ns, right, right_ns) in [
        ("w2ha0", HOST_A, "w2a-in", GW_A),
        ("w2a-out", GW_A, "w2b-out", GW_B),
        ("w2b-in", GW_B, "w2hb0", HOST_B),
    ] {
        ip(&[
            "link", "add", left, "netns", left_ns, "type", "veth", "peer", "name", right, "netns", right_ns,
        ]);
        ip(&["-n", left_ns, "link", "set", left, "up"]);
        ip(&["-n", right_ns, "link", "set", right, "up"]);
    }
    ip(&["-n", HOST_A, "addr", "add", "192.168.1.10/24", "dev", "w2ha0"]);
    ip(&["-n", HOST_A, "route", "add", "default", "via", "192.168.1.1"]);
    ip(&["-n", HOST_B, "addr", "add", "192.168.2.20/24", "dev", "w2hb0"]);
    ip(&["-n", HOST_B, "addr", "add", "192.168.2.21/24", "dev", "w2hb0"]);
    ip(&["-n", HOST_B, "route", "add", "default", "via", "192.168.2.1"]);
    let mut stats_files = Vec::new();
    for (side, ns) in [("a", GW_A), ("b", GW_B)] {
        let config = config(side, &dir);
        let stats = dir.join(format!("w2{side}.json"));
        let log = File::create(dir.join(format!("w2{side}.log"))).expect("log file");
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                env!("CARGO_BIN_EXE_espgw"),
                "run",
                "--workers",
                "2",
            ])
            .arg("--config")
            .arg(&config)
            .arg("--control")
            .arg(dir.join(format!("w2{side}.sock")))
            .arg("--state-dir")
            .arg(dir.join(format!("w2{side}.state")))
            .arg("--stats")
            .arg(&stats)
            .env("NO_COLOR", "1")
            .stderr(log)
            .spawn()
            .expect("espgw run starts");
        lab.gateways.push(child);
        stats_files.push(stats);
    }
    for side in ["a", "b"] {
        let log = dir.join(format!("w2{side}.log"));
        let started = Instant::now();
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("forwarding")
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "gw{side} did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // hostB counts what arrives.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let sink = std::thread::spawn(move || {
        testkit::netns::enter(HOST_B);
        let socket = UdpSocket::bind("0.0.0.0:9000").expect("bind at hostB");
        // Room for the flood: the sink is not what is measured.
        let size: libc::c_int = 8 << 20;
        // SAFETY: setsockopt on our socket with an int of its size.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let _ = ready_tx.send(());
        let mut buf = vec![0u8; 65536];
        let mut received = 0u64;
        // Not the warm-up's 8-byte datagrams.
        while let Ok(n) = socket.recv(&mut buf) {
            received += u64::from(n >= 200);
        }
        received
    });
    ready_rx.recv().expect("the sink starts");
    // hostA: 16 flows (source ports), so that the kernel's flow hash would
    // have spread them over gwA's workers; 1460-byte datagrams fragment
    // after encapsulation, 3000-byte ones at hostA and again after.
    let sent = std::thread::spawn(|| {
        testkit::netns::enter(HOST_A);
        let sockets: Vec<UdpSocket> = (0..16)
            .map(|i| {
                let s = UdpSocket::bind("192.168.1.10:0").expect("bind at hostA");
                if i % 2 == 1 {
                    // The kernel's default: DF set, and hostA fragments to
                    // the path MTU that gwA's first ICMP teaches it (for
                    // this destination only).
                    s.connect("192.168.2.21:9000").expect("connect");
                    return s;
                }
                s.connect("192.168.2.20:9000").expect("connect");
                // DF clear, so that gwA fragments after encapsulation.
                let dont: libc::c_int = libc::IP_PMTUDISC_DONT;
                // SAFETY: setsockopt on our socket with an int of its size.
                let r = unsafe {
                    libc::setsockopt(
                        s.as_raw_fd(),
                        libc::IPPROTO_IP,
                        libc::IP_MTU_DISCOVER,
                        (&dont as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as u32,
                    )
                };
                assert_eq!(r, 0, "IP_MTU_DISCOVER: {}", std::io::Error::last_os_error());
                s
            })
            .collect();
        // Warm up: ARP on every link before the flood.
        for _ in 0..20 {
            for s in &sockets[..2] {
                let _ = s.send(&[0u8; 8]);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let payload = vec![0x5au8; 3000];
        let mut sent = 0u64;
        for round in 0..ROUNDS {
            for (i, s) in sockets.iter().enumerate() {
                let size = [1460, 3000, 200, 1200][(round + i) % 4];
                if s.send(&payload[..size]).is_ok() {
                    sent += 1;
                }
            }
            if round % 8 == 7 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        sent
    })
    .join()
    .expect("the sender");
    let received = sink.join().expect("the sink");
    for child in &mut lab.gateways {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
    }
    lab.gateways.clear();
    let (a, b) = (stats(&stats_files[0]), stats(&stats_files[1]));
    let drops = |v: &serde_json::Value, name: &str| v["drops"][name].as_u64().unwrap_or(0);
    let logs: String = ["a", "b"]
        .iter()
        .map(|s| std::fs::read_to_string(dir.join(format!("w2{s}.log"))).unwrap_or_default())
        .collect();
    let context = format!("sent {sent}, received {received}\ngwA {a:#}\ngwB {b:#}\n{logs}");
    // What the workers' coordination decides: sequence numbers in order
    // (no replay drop) and unique IPv4 IDs per tunnel (no overlapping
    // fragments). Always zero.
    let dropped: Vec<(&str, u64)> = [
        "replay_too_old",
        "replay_duplicate",
        "reassembly_failed",
        "not_owner",
    ]
    .into_iter()
    .map(|name| (name, drops(&b, name)))
    .filter(|(_, n)| *n > 0)
    .collect();
    assert!(dropped.is_empty(), "gwB dropped {dropped:?}: {context}");
    // A datagram whose fragment never came times out. With nothing lost
    // before gwB read it that is the workers' doing and must not happen;
    // on a host too busy for gwB to keep up, fragments the kernel dropped
    // at gwB's socket (counted) account for at most as many timeouts.
    let timeouts = drops(&b, "reassembly_timeout");
    let lost_at_gw_b = b["kernel_drops"].as_u64().unwrap_or(0);
    assert!(
        timeouts <= lost_at_gw_b,
        "gwB timed out {timeouts} reassemblies with {lost_at_gw_b} frames lost before it read them: {context}"
    );
    if timeouts > 0 {
        eprintln!("note: {timeouts} reassembly timeouts at gwB, explained by {lost_at_gw_b} frames the kernel dropped at its socket (a busy host)");
    }
    // The flood did fragment after encapsulation, and gwB's kernel put
    // every datagram together before steering it (with workers, espgw's
    // own reassembler is not needed): no overlap, no timeout.
    let (reassembled, failed) = (ip_mib(GW_B, "ReasmOKs"), ip_mib(GW_B, "ReasmFails"));
    assert!(
        reassembled >= 1000,
        "{reassembled} datagrams reassembled at gwB: {context}"
    );
    assert_eq!(failed, 0, "gwB's kernel failed {failed} reassemblies: {context}");
    eprintln!(
        "sent {sent}, received {received}; gwB's kernel reassembled {reassembled} datagrams, espgw {} fragments",
        b["fragments_absorbed"]
    );
    assert!(sent as usize >= ROUNDS * 16 * 9 / 10, "{context}");
    // Something lost at the kernel's sockets is not the workers' doing, but
    // the flood must have gone through to mean anything: 90 %, or on a host
    // too busy for the gateways to keep up (frames the kernel dropped at
    // their sockets, counted) at least half.
    let lost_at_sockets = a["kernel_drops"].as_u64().unwrap_or(0) + lost_at_gw_b;
    if received * 10 < sent * 9 {
        assert!(lost_at_sockets > 0 && received * 2 >= sent, "{context}");
        eprintln!("note: {received} of {sent} arrived; the kernel dropped {lost_at_sockets} frames at the gateways' sockets (a busy host)");
    }
    // Every datagram gwA read was encapsulated; those the kernel dropped
    // at its sockets (a busy host, counted) it never read.
    let encapsulated = a["encapsulated"].as_u64().unwrap_or(0);
    let lost_at_gw_a = a["kernel_drops"].as_u64().unwrap_or(0);
    assert!(encapsulated + lost_at_gw_a >= sent, "{context}");
}
