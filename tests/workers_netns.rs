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
use std::time::Duration;

use testkit::netns::{self, enter, ip, Lab, NETNS};

mod common;

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
    let text = netns::output(ns, &["cat", "/proc/net/snmp"]);
    let mut lines = text.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == field)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no Ip {field} in {ns}'s /proc/net/snmp:\n{text}"))
}

fn config(side: &str, dir: &std::path::Path) -> std::path::PathBuf {
    // The devices are netns::demo_topology's: a-in, a-out, b-in, b-out.
    let (local, remote, local_net, remote_net, here, there) = if side == "a" {
        ("10.0.0.1", "10.0.0.2", "192.168.1", "192.168.2", "1001", "1002")
    } else {
        ("10.0.0.2", "10.0.0.1", "192.168.2", "192.168.1", "1002", "1001")
    };
    let (key_out, key_in) = if side == "a" { ("00", "20") } else { ("20", "00") };
    let key = |first: &str| format!("{first}0102030405060708090a0b0c0d0e0f10111213");
    let text = format!(
        "[gateway]\nname = \"w2{side}\"\n\n\
         [[interface]]\nname = \"inside\"\ndevice = \"{side}-in\"\naddress = \"{local_net}.1/24\"\n\n\
         [[interface]]\nname = \"outside\"\ndevice = \"{side}-out\"\naddress = \"{local}/24\"\n\n\
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

fn two_workers_cost_the_peer_no_replay_or_reassembly_drop() {
    let dir = std::env::temp_dir().join(format!("espgw-w2-{}", std::process::id()));
    let mut lab = Lab::new(&[HOST_A, GW_A, GW_B, HOST_B], dir.clone());
    netns::demo_topology([HOST_A, GW_A, GW_B, HOST_B]);
    ip(&["-n", HOST_B, "addr", "add", "192.168.2.21/24", "dev", "hb0"]);
    let mut stats_files = Vec::new();
    for (side, ns) in [("a", GW_A), ("b", GW_B)] {
        let config = config(side, &dir);
        let stats = dir.join(format!("w2{side}.json"));
        let log = dir.join(format!("w2{side}.log"));
        lab.children.push(
            common::espgw_in(ns)
                .args(["run", "--workers", "2"])
                .arg("--config")
                .arg(&config)
                .arg("--control")
                .arg(dir.join(format!("w2{side}.sock")))
                .arg("--state-dir")
                .arg(dir.join(format!("w2{side}.state")))
                .arg("--stats")
                .arg(&stats)
                .stderr(File::create(&log).expect("log file"))
                .spawn()
                .expect("espgw run starts"),
        );
        common::wait_forwarding(lab.children.last_mut().expect("the gateway"), &log);
        stats_files.push(stats);
    }

    // hostB counts what arrives.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let sink = std::thread::spawn(move || {
        enter(HOST_B);
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
        enter(HOST_A);
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
    lab.stop_all();
    let (a, b) = (
        common::json_file(&stats_files[0]),
        common::json_file(&stats_files[1]),
    );
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
