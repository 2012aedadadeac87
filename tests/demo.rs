//! `espgw demo` end to end (root, in CI): traffic flows both ways, the
//! middle link carries only ESP, the gateways' counters match each other,
//! and nothing is left behind. Without root or the namespace tools each test
//! shows as ignored, and fails under `CI=true` unless `ESPGW_SKIPS` names
//! `netns` (testkit); `.ci/run` installs the tools and runs as root.

use std::process::Command;
use std::sync::Mutex;

use testkit::netns::NETNS_PING as NETNS;
use testkit::Prerequisite;

/// The demo's namespaces have fixed names: one test at a time uses them.
static TOPOLOGY: Mutex<()> = Mutex::new(());

/// `espgw demo --nat` also needs nftables for its masquerading namespace.
static NFTABLES: Prerequisite = Prerequisite::new("nftables", || {
    NETNS.check()?;
    let found = Command::new("sh").args(["-c", "command -v nft"]).output();
    if !found.is_ok_and(|o| o.status.success()) {
        return Err("no `nft` (apt-get install nftables)".into());
    }
    Ok(())
});

fn main() -> std::process::ExitCode {
    testkit::run([
        testkit::needs!(&NETNS, demo_passes_traffic_only_as_esp_and_cleans_up),
        testkit::needs!(&NETNS, demo_carries_ipv6_over_the_ipv4_tunnel),
        testkit::needs!(&NETNS, demo_rekeys_and_reloads_without_losing_a_packet),
        testkit::needs!(&NETNS, a_flood_of_bad_esp_does_not_starve_good_traffic),
        testkit::needs!(&NETNS, io_comparison_runs_every_method),
        testkit::needs!(&NETNS, run_takes_the_devices_mac_and_mtu),
        testkit::needs!(&NETNS, demo_keyed_by_strongswan_runs_or_says_why_not),
        testkit::needs!(
            &NFTABLES,
            demo_behind_a_nat_follows_the_mapping_and_passes_only_esp_in_udp
        ),
    ])
}

/// Runs `espgw ARGS`, which must succeed; returns what it printed.
fn espgw(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_espgw"))
        .args(args)
        .output()
        .expect("espgw runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "espgw {}:\n{stdout}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn counter(report: &str, gateway: &str, name: &str) -> u64 {
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with(gateway))
        .unwrap_or_else(|| panic!("no {gateway} line in:\n{report}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == name)
        .unwrap_or_else(|| panic!("no {name} in {line}"));
    words[at + 1]
        .parse()
        .unwrap_or_else(|_| panic!("{name} in {line}"))
}

/// `espgw demo --ipv6`: the hosts' kernels resolve the gateways by
/// neighbour discovery and send ping, UDP and TCP over IPv6 with their
/// default offloads (TCPv6 GSO super-packets, partial checksums); all of it
/// crosses gwA–gwB as ESP in IPv4 through its own tunnel, with the tunnel's
/// MTU learnt from gwA's packet-too-big errors.
fn demo_carries_ipv6_over_the_ipv4_tunnel() {
    let _topology = TOPOLOGY.lock().unwrap_or_else(|e| e.into_inner());
    let report = espgw(&["demo", "--ipv6", "--tcp-bytes", "1000000"]);
    for (line, says) in [
        ("ping6 hostA → hostB", " 0% packet loss"),
        ("udp6  200 datagrams", "200 echoed back intact"),
        ("tcp6  1000000 bytes", "byte count and checksum match"),
    ] {
        let found = report
            .lines()
            .find(|l| l.contains(line))
            .unwrap_or_else(|| panic!("no `{line}`:\n{report}"));
        assert!(found.contains(says), "{found}");
    }
    assert!(report.contains("0 plaintext IPv4, 0 other"), "{report}");
    assert!(report.contains("a-b-v6-out"), "the IPv6 tunnel's SAs:\n{report}");
    assert_eq!(
        counter(&report, "gwA", "encapsulated"),
        counter(&report, "gwB", "decapsulated"),
        "{report}"
    );
    // hostA's TCPv6 arrived as GSO super-packets, cut by gwA's driver.
    assert!(counter(&report, "gwA", "gso_segmented") > 0, "{report}");
    assert_no_offload_drops(&report);
    assert!(
        report.contains("all namespaces and veth pairs removed"),
        "{report}"
    );
}

/// Neither gateway's driver dropped a frame it could not make whole
/// (the offload part of its report line lists no drop reason).
fn assert_no_offload_drops(report: &str) {
    for gw in ["gwA", "gwB"] {
        let line = report
            .lines()
            .find(|l| l.trim_start().starts_with(gw))
            .unwrap_or_else(|| panic!("{report}"));
        let offload = line.split("offload:").nth(1).unwrap_or_default();
        assert!(!offload.contains(','), "offload drops at {gw}: {line}");
    }
}

fn demo_passes_traffic_only_as_esp_and_cleans_up() {
    let _topology = TOPOLOGY.lock().unwrap_or_else(|e| e.into_inner());
    for (algorithm, engine) in [("aes128gcm16", "soft"), ("aes128-sha1", "sec")] {
        let report = espgw(&[
            "demo",
            "--algorithm",
            algorithm,
            "--engine",
            engine,
            "--tcp-bytes",
            "300000",
        ]);
        assert!(report.contains("0% packet loss"), "{report}");
        assert!(report.contains("200 echoed back intact"), "{report}");
        assert!(report.contains("byte count and checksum match"), "{report}");
        assert!(report.contains("0 plaintext IPv4"), "{report}");
        assert!(
            report.contains("all namespaces and veth pairs removed"),
            "{report}"
        );
        // What one gateway encapsulated, the other decapsulated.
        assert_eq!(
            counter(&report, "gwA", "encapsulated"),
            counter(&report, "gwB", "decapsulated"),
            "{report}"
        );
        assert_eq!(
            counter(&report, "gwB", "encapsulated"),
            counter(&report, "gwA", "decapsulated"),
            "{report}"
        );
        assert!(counter(&report, "gwA", "encapsulated") > 200, "{report}");
        // The hosts keep the kernel's default offloads: their TCP and UDP
        // reach the gateways with partial checksums, and hostA's TCP as
        // GSO super-packets, which the driver completed and cut, and none
        // of it was lost there.
        assert!(counter(&report, "gwA", "csum_completed") > 0, "{report}");
        assert!(counter(&report, "gwB", "csum_completed") > 0, "{report}");
        assert!(counter(&report, "gwA", "gso_segmented") > 0, "{report}");
        // On the way out to hostB, gwB sent runs of hostA's TCP segments
        // as super-packets again (and the transfer above still matched).
        assert!(counter(&report, "gwB", "coalesced") > 0, "{report}");
        assert_no_offload_drops(&report);
        // Each gateway took its devices' own MACs and MTUs.
        for link in [
            "gwA inside a-in",
            "gwA outside a-out",
            "gwB inside b-in",
            "gwB outside b-out",
        ] {
            let line = report
                .lines()
                .find(|l| l.contains(link))
                .unwrap_or_else(|| panic!("no link line for {link}:\n{report}"));
            assert!(line.contains("(the device's), MTU 1500 (the device's)"), "{line}");
        }
    }
    let left = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains("espgw-"),
        "namespaces left behind"
    );
}

/// Short byte lifetimes make the gateways rekey over and over while
/// numbered UDP flows both ways; gwA also refuses a broken config (by
/// `espgw reload` and SIGHUP) and takes a valid one, mid-stream.
fn demo_rekeys_and_reloads_without_losing_a_packet() {
    let _topology = TOPOLOGY.lock().unwrap_or_else(|e| e.into_inner());
    let report = espgw(&[
        "demo",
        "--rekey-every",
        "200kB",
        "--reload-check",
        "--tcp-bytes",
        "300000",
    ]);
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with("rekey every"))
        .unwrap_or_else(|| panic!("no rekey line:\n{report}"));
    assert!(line.ends_with("nothing lost"), "{line}");
    assert!(
        line.contains("2000/2000 hostA→hostB and 2000/2000 hostB→hostA"),
        "{line}"
    );
    let words: Vec<&str> = line.split_whitespace().collect();
    let rekeys: u64 = words
        .iter()
        .position(|w| *w == "rekeys")
        .and_then(|at| words[at - 1].parse().ok())
        .unwrap_or(0);
    // About 2 MB each way at one rekey per 200 kB.
    assert!(rekeys >= 5, "{line}");
    assert!(report.contains("broken configs refused three times"), "{report}");
    assert!(
        report.contains("a policy-less inbound SA: \"reload refused, the running configuration stays: "),
        "{report}"
    );
    assert!(report.contains("tunnels added [\"extra\"]"), "{report}");
    assert!(report.contains("0 plaintext IPv4"), "{report}");
}

/// Floods of bad ESP into gwB, ten times the good traffic's rate, cost it
/// nothing; every bad frame is counted. (At full speed, which depends on
/// the build and the machine, docs/results.md records what a release build does.)
fn a_flood_of_bad_esp_does_not_starve_good_traffic() {
    let _topology = TOPOLOGY.lock().unwrap_or_else(|e| e.into_inner());
    let report = espgw(&[
        "demo",
        "--flood-check",
        "--flood-rate",
        "20000",
        "--tcp-bytes",
        "300000",
    ]);
    let floods: Vec<&str> = report
        .lines()
        .filter(|l| l.trim_start().starts_with("flood "))
        .collect();
    assert_eq!(floods.len(), 3, "{report}");
    for flood in &floods {
        let good: Vec<u64> = flood
            .split("good UDP")
            .nth(1)
            .unwrap_or_default()
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        assert!(good.len() >= 4, "{flood}");
        // Both directions: at least 95% of the numbered datagrams arrived.
        assert!(
            good[0] * 100 >= good[1] * 95 && good[2] * 100 >= good[3] * 95,
            "{flood}"
        );
    }
    assert!(!report.contains("STARVED"), "{report}");
    let gw_b = report
        .lines()
        .find(|l| l.trim_start().starts_with("gwB"))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        gw_b.contains("unknown_spi") && gw_b.contains("auth_failed"),
        "{gw_b}"
    );
}

/// `espgw bench --io` compares the receive methods on a veth pair.
fn io_comparison_runs_every_method() {
    let table = espgw(&["bench", "--io", "--sizes", "64", "--slice-ms", "20"]);
    for method in [
        "ring",
        "recvmmsg",
        "recvmmsg_plain",
        "pnet",
        "io_uring",
        "send",
        "sendmmsg",
        "send_vnet",
        "sendmmsg_vnet",
    ] {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(method))
            .unwrap_or_else(|| panic!("no {method} in {table}"));
        let rate: f64 = line
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(rate > 0.0, "{method} moved nothing: {table}");
    }
    assert!(table.contains("fastest receive at 64 B"), "{table}");
    assert!(table.contains("fastest transmit at 64 B"), "{table}");
}

/// `espgw run` with neither `mac` nor `mtu` on the inside and only `mtu` on
/// the outside: it says so at startup, and the inside answers ARP with the
/// device's own MAC, so the host's neighbour cache holds the device's
/// address.
fn run_takes_the_devices_mac_and_mtu() {
    let _topology = TOPOLOGY.lock().unwrap_or_else(|e| e.into_inner());
    const NS: &str = "espgw-linktest";
    let ip = |args: &[&str]| {
        let ok = Command::new("ip").args(args).status().is_ok_and(|s| s.success());
        assert!(ok, "ip {}", args.join(" "));
    };
    let _ = Command::new("ip")
        .args(["netns", "del", NS])
        .stderr(std::process::Stdio::null())
        .status();
    ip(&["netns", "add", NS]);
    struct Cleanup;
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", NS]).status();
        }
    }
    let _cleanup = Cleanup;
    for (dev, peer) in [("l-in", "l-in-p"), ("l-out", "l-out-p")] {
        ip(&["-n", NS, "link", "add", dev, "type", "veth", "peer", "name", peer]);
    }
    ip(&[
        "-n",
        NS,
        "link",
        "set",
        "l-in",
        "address",
        "02:11:22:33:44:55",
        "mtu",
        "1400",
    ]);
    ip(&["-n", NS, "link", "set", "l-out", "mtu", "1600"]);
    for dev in ["lo", "l-in", "l-in-p", "l-out", "l-out-p"] {
        ip(&["-n", NS, "link", "set", dev, "up"]);
    }
    ip(&["-n", NS, "addr", "add", "192.168.1.10/24", "dev", "l-in-p"]);
    let dir = std::env::temp_dir().join(format!("espgw-linktest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("link.toml");
    std::fs::write(
        &config,
        "[gateway]\nname = \"linktest\"\n\n\
         [[interface]]\nname = \"inside\"\ndevice = \"l-in\"\naddress = \"192.168.1.1/24\"\n\n\
         [[interface]]\nname = \"outside\"\ndevice = \"l-out\"\naddress = \"10.0.0.1/24\"\nmtu = 1300\n",
    )
    .expect("write config");
    let log = dir.join("run.log");
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            NS,
            env!("CARGO_BIN_EXE_espgw"),
            "run",
            "--workers",
            "1",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--control")
        .arg(dir.join("control.sock"))
        .env("NO_COLOR", "1")
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("espgw run starts");
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("forwarding") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pinged = Command::new("ip")
        .args(["netns", "exec", NS, "ping", "-c", "1", "-W", "2", "192.168.1.1"])
        .output()
        .is_ok_and(|o| o.status.success());
    let neigh = Command::new("ip")
        .args(["-n", NS, "neigh", "show", "192.168.1.1"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // SAFETY: kill(2) on our own child (ip netns exec execs espgw).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        text.contains(
            "interface `inside` on `l-in`: MAC 02:11:22:33:44:55 (the device's), MTU 1400 (the device's)"
        ),
        "{text}"
    );
    assert!(text.contains("interface `outside` on `l-out`: MAC "), "{text}");
    assert!(text.contains("MTU 1300 (from the config)"), "{text}");
    assert!(pinged, "the gateway did not answer ping on its inside:\n{text}");
    assert!(
        neigh.contains("lladdr 02:11:22:33:44:55"),
        "neighbour cache: {neigh}"
    );
}

/// `espgw demo --nat`: gwA behind a masquerading namespace that maps its
/// 4500 to a port of 40000-40999, RFC 3948 ESP in UDP on both gateways,
/// gwB configured with gwA's private address only. Ping, UDP and TCP pass,
/// both sides of the NAT carry nothing but ESP in UDP (and ARP, IKE,
/// keepalives), and gwB sends to the NAT's mapping, having counted the move.
fn demo_behind_a_nat_follows_the_mapping_and_passes_only_esp_in_udp() {
    let _topology = TOPOLOGY.lock().unwrap_or_else(|e| e.into_inner());
    for (algorithm, engine) in [
        ("aes128gcm16", "soft"),
        ("aes128-sha1", "sec"),
        ("chacha20poly1305", "soft"),
    ] {
        let report = espgw(&[
            "demo",
            "--nat",
            "--algorithm",
            algorithm,
            "--engine",
            engine,
            "--tcp-bytes",
            "300000",
        ]);
        assert!(report.contains("ESP in UDP 4500 (RFC 3948)"), "{report}");
        assert!(report.contains("0% packet loss"), "{report}");
        assert!(report.contains("200 echoed back intact"), "{report}");
        assert!(report.contains("byte count and checksum match"), "{report}");
        let wires: Vec<&str> = report
            .lines()
            .filter(|l| l.trim_start().starts_with("wire "))
            .collect();
        assert_eq!(wires.len(), 2, "both sides of the NAT watched:\n{report}");
        for wire in &wires {
            assert!(
                wire.contains("ESP in UDP") && wire.contains(" 0 plaintext IPv4, 0 other"),
                "{wire}"
            );
        }
        let nat = report
            .lines()
            .find(|l| l.trim_start().starts_with("nat "))
            .unwrap_or_else(|| panic!("no nat line:\n{report}"));
        assert!(nat.ends_with("gwB followed gwA behind the NAT"), "{nat}");
        assert!(nat.contains("appears behind the NAT as 172.16.0.1:4"), "{nat}");
        assert!(counter(&report, "nat", "nat_peer_moved") >= 1, "{nat}");
        // All gwA sent reached gwB; gwB's first reply or so went to gwA's
        // configured address before it followed, which the NAT dropped.
        assert_eq!(
            counter(&report, "gwA", "encapsulated"),
            counter(&report, "gwB", "decapsulated"),
            "{report}"
        );
        let (sent_b, got_a) = (
            counter(&report, "gwB", "encapsulated"),
            counter(&report, "gwA", "decapsulated"),
        );
        assert!(got_a <= sent_b && sent_b - got_a <= 2, "{report}");
        assert!(counter(&report, "gwA", "encapsulated") > 200, "{report}");
        assert!(
            report.contains("all namespaces and veth pairs removed"),
            "{report}"
        );
    }
    let left = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains("espgw-"),
        "namespaces left behind"
    );
}

/// Whether this kernel takes an ESP state: `ip xfrm state add` in a
/// namespace of its own (deleted after), independent of how espgw decides.
fn kernel_takes_esp() -> bool {
    let ns = "espgw-demo-esp-probe";
    let _ = Command::new("ip").args(["netns", "add", ns]).status();
    let added = Command::new("ip")
        .args([
            "-n",
            ns,
            "xfrm",
            "state",
            "add",
            "src",
            "10.0.0.1",
            "dst",
            "10.0.0.2",
            "proto",
            "esp",
            "spi",
            "0x1000",
            "mode",
            "tunnel",
            "aead",
            "rfc4106(gcm(aes))",
            "0x0102030405060708090a0b0c0d0e0f1011121314",
            "128",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
    added
}

/// `espgw demo --keying strongswan`: on a kernel with ESP, charon keys
/// both gateways through their keying namespaces and the demo passes;
/// on one without (this project's CI host), it stops before it changes
/// anything and says why.
fn demo_keyed_by_strongswan_runs_or_says_why_not() {
    let _topology = TOPOLOGY.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_espgw"))
        .args(["demo", "--keying", "strongswan", "--tcp-bytes", "200000"])
        .output()
        .expect("espgw runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if kernel_takes_esp() {
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("keys  strongSwan's charon"), "{stdout}");
        assert!(stdout.contains("bytes,"), "charon's counters: {stdout}");
    } else {
        assert!(!out.status.success(), "{stdout}");
        assert!(stderr.contains("has no ESP"), "{stderr}");
        assert!(
            !stderr.contains("building"),
            "it stops before it builds anything: {stderr}"
        );
        for left in ["espgw-keyA", "espgw-keyB", "espgw-gwA", "espgw-hostA"] {
            assert!(
                !std::path::Path::new(&format!("/run/netns/{left}")).exists(),
                "{left} was made"
            );
            assert!(!std::path::Path::new(&format!("/etc/netns/{left}")).exists());
        }
    }
}
