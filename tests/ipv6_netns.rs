//! The gateway's IPv6 address on a real link (root, in CI): a host
//! namespace's kernel resolves the gateway's inside `address6` by
//! neighbour discovery and pings it, over a veth pair with the kernel's
//! default offloads, and gets every reply. The host's own IPv6 chatter
//! (router solicitations, MLD reports) is counted by the gateway as
//! `unsupported`, never answered. Without root or `ip`/`ping` the test
//! shows as ignored (testkit `netns`).

use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::Prerequisite;

static NETNS: Prerequisite = Prerequisite::new("netns", || {
    testkit::root_and_tools(
        "network namespaces",
        &[("ip", "iproute2"), ("ping", "iputils-ping")],
    )
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(
        &NETNS,
        a_host_resolves_and_pings_the_gateways_ipv6_address
    )])
}

/// Names of their own, so that other netns tests may run beside this one.
const HOST: &str = "espgw-v6-host";
const GW: &str = "espgw-v6-gw";
const PEER: &str = "espgw-v6-peer";

fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().is_ok_and(|s| s.success());
    assert!(ok, "ip {}", args.join(" "));
}

fn remove_namespaces() {
    for ns in [HOST, GW, PEER] {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
}

/// Stops the gateway and removes the namespaces, also when the test fails.
struct Lab {
    gateway: Option<Child>,
    dir: std::path::PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(child) = &mut self.gateway {
            // SAFETY: kill(2) on our own child (ip netns exec execs espgw).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
        remove_namespaces();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn a_host_resolves_and_pings_the_gateways_ipv6_address() {
    remove_namespaces();
    let dir = std::env::temp_dir().join(format!("espgw-v6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut lab = Lab {
        gateway: None,
        dir: dir.clone(),
    };
    for ns in [HOST, GW, PEER] {
        ip(&["netns", "add", ns]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
    for (left, left_ns, right, right_ns) in [("v6h0", HOST, "v6g-in", GW), ("v6g-out", GW, "v6p0", PEER)] {
        ip(&[
            "link", "add", left, "netns", left_ns, "type", "veth", "peer", "name", right, "netns", right_ns,
        ]);
        ip(&["-n", left_ns, "link", "set", left, "up"]);
        ip(&["-n", right_ns, "link", "set", right, "up"]);
    }
    // `nodad`: the address is usable at once rather than after DAD's second.
    ip(&[
        "-n",
        HOST,
        "addr",
        "add",
        "2001:db8:1::10/64",
        "dev",
        "v6h0",
        "nodad",
    ]);
    let text = "[gateway]\nname = \"v6\"\n\n\
         [[interface]]\nname = \"inside\"\ndevice = \"v6g-in\"\naddress = \"192.168.1.1/24\"\n\
         address6 = \"2001:db8:1::1/64\"\n\n\
         [[interface]]\nname = \"outside\"\ndevice = \"v6g-out\"\naddress = \"10.0.0.1/24\"\n\n\
         [[policy]]\nname = \"drop-all\"\ndirection = \"out\"\naction = \"discard\"\n";
    let config = dir.join("v6.toml");
    std::fs::write(&config, text).expect("write config");
    let stats = dir.join("v6.json");
    let log_path = dir.join("v6.log");
    let log = File::create(&log_path).expect("log file");
    lab.gateway = Some(
        Command::new("ip")
            .args(["netns", "exec", GW, env!("CARGO_BIN_EXE_espgw"), "run"])
            .arg("--config")
            .arg(&config)
            .arg("--stats")
            .arg(&stats)
            .env("NO_COLOR", "1")
            .stderr(log)
            .spawn()
            .expect("espgw run starts"),
    );
    let started = Instant::now();
    while !std::fs::read_to_string(&log_path)
        .unwrap_or_default()
        .contains("forwarding")
    {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the gateway did not start:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            HOST,
            "ping",
            "-6",
            "-c",
            "5",
            "-i",
            "0.2",
            "-W",
            "2",
            "2001:db8:1::1",
        ])
        .output()
        .expect("ping runs");
    let said = String::from_utf8_lossy(&ping.stdout);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        ping.status.success() && said.contains("5 received"),
        "ping -6:\n{said}\n{}\ngateway log:\n{log}",
        String::from_utf8_lossy(&ping.stderr)
    );
    // The host's kernel learnt the gateway's MAC from our advertisement.
    let neigh = Command::new("ip")
        .args(["-n", HOST, "-6", "neigh", "show", "2001:db8:1::1"])
        .output()
        .expect("ip neigh");
    let neigh = String::from_utf8_lossy(&neigh.stdout);
    assert!(neigh.contains("lladdr"), "no neighbour entry: {neigh}");
    // The gateway's own count: SIGTERM writes the stats file.
    if let Some(child) = &mut lab.gateway {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
    }
    lab.gateway = None;
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats file")).expect("stats JSON");
    let generated = stats.pointer("/generated").and_then(|v| v.as_u64());
    assert!(
        generated.is_some_and(|n| n >= 6),
        "five echo replies and at least one advertisement: {generated:?} in {stats}"
    );
}
