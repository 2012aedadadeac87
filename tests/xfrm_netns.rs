//! The `xfrm` keying source's socket driver against a real kernel: in a
//! namespace of its own, policies are added with `ip xfrm policy add`
//! before espgw starts (the dump) and while it follows (the
//! notifications), one is deleted, and `espgw xfrm show` must report the
//! mirror holding exactly those. This kernel may lack ESP (`ip xfrm state
//! add` then fails with "Protocol not supported"), so states are covered
//! by the recorded fixtures of `ike-stub/tests/xfrm_mirror.rs` instead.
//! Without root, `ip` or XFRM netlink the test shows as ignored (testkit
//! `xfrm-netlink`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::netns::{self, ip, Lab};
use testkit::Prerequisite;

mod common;

static XFRM_NETLINK: Prerequisite = Prerequisite::new("xfrm-netlink", testkit::xfrm_netlink);

static RELAY: Prerequisite = Prerequisite::new("xfrm-relay", || {
    XFRM_NETLINK.check()?;
    testkit::root_and_tools("the IKE relay's peer and daemon", &[("python3", "python3")])?;
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err("no /dev/net/tun (CONFIG_TUN): the IKE relay is a TUN device".into());
    }
    Ok(())
});

fn main() -> std::process::ExitCode {
    testkit::run([
        testkit::needs!(
            &XFRM_NETLINK,
            policies_added_before_and_while_espgw_follows_are_mirrored
        ),
        testkit::needs!(&XFRM_NETLINK, espgw_run_keyed_by_xfrm_mirrors_and_reports),
        testkit::needs!(
            &RELAY,
            the_ike_relay_carries_a_peers_ike_both_ways_and_a_trap_asks_for_an_sa
        ),
    ])
}

/// Names of their own, so that other namespace tests may run beside.
const NS: &str = "espgw-xfrm-keying";
const RUN_KEYING: &str = "espgw-xfrm-rk";
const RUN_GW: &str = "espgw-xfrm-rgw";

/// A gateway's file with the interfaces every test here uses and no
/// `[keying]` table (the command line's flags key it, or a table a test
/// appends); the outside interface is its last table.
fn write_config(dir: &std::path::Path, name: &str) -> PathBuf {
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            r#"[gateway]
name = "{name}"
[[interface]]
name = "inside"
device = "in0"
address = "10.1.0.1/16"
[[interface]]
name = "outside"
device = "out0"
address = "192.0.2.1/24"
"#
        ),
    )
    .unwrap();
    config
}

/// `espgw run --keying xfrm --keying-netns KEYING` in namespace `ns`, one
/// worker, its control socket at `socket`, then `extra`.
fn start_gateway(
    ns: &str,
    config: &std::path::Path,
    socket: &std::path::Path,
    keying: &str,
    extra: &[&std::ffi::OsStr],
) -> std::process::Child {
    common::espgw_in(ns)
        .args(["run", "--config"])
        .arg(config)
        .arg("--control")
        .arg(socket)
        .args(extra)
        .args(["--workers", "1", "--keying", "xfrm", "--keying-netns", keying])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting espgw run")
}

/// In the keying namespace `keying`, an outbound policy from 10.1.0.0/16
/// to 10.2.0.0/16 through a tunnel from 192.0.2.1 to `remote` (reqid 5)
/// whose SA does not exist: a trap.
fn trap(keying: &str, remote: &str) {
    ip(&[
        "-n",
        keying,
        "xfrm",
        "policy",
        "add",
        "src",
        "10.1.0.0/16",
        "dst",
        "10.2.0.0/16",
        "dir",
        "out",
        "priority",
        "100",
        "tmpl",
        "src",
        "192.0.2.1",
        "dst",
        remote,
        "proto",
        "esp",
        "reqid",
        "5",
        "mode",
        "tunnel",
    ]);
}

/// The gateway's stats at `socket` once `ok` holds of them, within 30
/// seconds; the test fails with `what` and the last stats otherwise.
fn stats_once(socket: &std::path::Path, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let query = || common::ask(socket, &["stats"]);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if let Some(doc) = query().filter(&ok) {
            return doc;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{what}: last stats {:#}", query().unwrap_or_default());
}

/// Stops the lab's gateway as Ctrl-C does (SIGINT), which must end it
/// cleanly.
fn interrupt(lab: &mut Lab) {
    let gateway = lab.children.pop().expect("the gateway");
    // SAFETY: kill(2) with the child's pid, which has not been reaped.
    unsafe { libc::kill(gateway.id() as libc::pid_t, libc::SIGINT) };
    let out = gateway.wait_with_output().expect("espgw run stops");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn policy<'a>(doc: &'a Value, selector: &str) -> Option<&'a Value> {
    doc["policies"]
        .as_array()?
        .iter()
        .find(|p| p["selector"].as_str().is_some_and(|s| s.starts_with(selector)))
}

fn policies_added_before_and_while_espgw_follows_are_mirrored() {
    let dir = std::env::temp_dir().join(format!("espgw-xfrm-netns-{}", std::process::id()));
    let lab = Lab::new(&[NS], dir.clone());
    netns::create(&[NS]);
    // Keyed by the file.
    let config = write_config(&dir, "xfrm-netns");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("[keying]\nsource = \"xfrm\"\nnetns = \"{NS}\"\n"));
    std::fs::write(&config, text).unwrap();
    // Before espgw starts: what the dump shows.
    let ns = ["-n", NS, "xfrm", "policy", "add"];
    let tunnel = ["proto", "esp", "reqid", "5", "mode", "tunnel"];
    let add = |rest: &[&str]| ip(&[&ns[..], rest].concat());
    add(&[
        &[
            "src",
            "10.1.0.0/16",
            "dst",
            "10.2.0.0/16",
            "dir",
            "out",
            "priority",
            "100",
        ][..],
        &["tmpl", "src", "192.0.2.1", "dst", "198.51.100.2"],
        &tunnel,
    ]
    .concat());
    add(&[
        &[
            "src",
            "10.2.0.0/16",
            "dst",
            "10.1.0.0/16",
            "dir",
            "fwd",
            "priority",
            "100",
        ][..],
        &["tmpl", "src", "198.51.100.2", "dst", "192.0.2.1"],
        &tunnel,
    ]
    .concat());
    add(&[
        "src",
        "10.9.0.0/16",
        "dst",
        "10.2.0.0/16",
        "dir",
        "out",
        "priority",
        "10",
    ]);
    let show = common::espgw()
        .args(["xfrm", "show", "--config"])
        .arg(&config)
        .args(["--follow", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting espgw xfrm show");
    // While it follows: a notification of each kind.
    std::thread::sleep(Duration::from_millis(1200));
    add(&[
        "src",
        "10.3.0.0/16",
        "dst",
        "10.4.0.0/16",
        "proto",
        "tcp",
        "dport",
        "443",
        "dir",
        "out",
        "priority",
        "50",
        "action",
        "block",
    ]);
    ip(&[
        "-n",
        NS,
        "xfrm",
        "policy",
        "del",
        "src",
        "10.9.0.0/16",
        "dst",
        "10.2.0.0/16",
        "dir",
        "out",
    ]);
    let out = show.wait_with_output().expect("espgw xfrm show");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "espgw xfrm show failed: {stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    let counters = &doc["counters"];
    assert_eq!(counters["dumps"], 2, "{doc:#}");
    assert_eq!(counters["malformed"], 0, "{doc:#}");
    // The tunnel's policies: no SA for reqid 5 (none can be added here),
    // so both discard, held.
    let out_policy = policy(&doc, "10.1.0.0/16 -> 10.2.0.0/16").expect("the outbound policy");
    assert_eq!(out_policy["direction"], "out");
    assert_eq!(out_policy["action"], "discard");
    assert_eq!(out_policy["held"], true);
    assert_eq!(out_policy["priority"], 100);
    let fwd = policy(&doc, "10.2.0.0/16 -> 10.1.0.0/16").expect("the forward policy");
    assert_eq!(fwd["direction"], "in");
    assert!(fwd["name"].as_str().is_some_and(|n| n.starts_with("xfrm-fwd-")));
    // Added while following: a block.
    let block = policy(&doc, "10.3.0.0/16 -> 10.4.0.0/16 proto tcp ports any -> 443").expect("the block");
    assert_eq!(block["action"], "discard");
    assert_eq!(block["held"], false);
    // Deleted while following: gone from the mirror and the gateway.
    assert!(policy(&doc, "10.9.0.0/16").is_none(), "{doc:#}");
    assert_eq!(counters["policies_removed"], 1, "{doc:#}");
    assert_eq!(doc["gateway_policies"], 3, "{doc:#}");
    assert_eq!(counters["policies_held"], 2, "{doc:#}");
    drop(lab);
}

/// `espgw run --keying xfrm --keying-netns NAME`: the sockets opened and the
/// first dumps read before privileges are dropped, notifications followed
/// after; `espgw stats` shows the mirror's counters and `espgw sa list`
/// each SA's source.
fn espgw_run_keyed_by_xfrm_mirrors_and_reports() {
    let dir = std::env::temp_dir().join(format!("espgw-xfrm-run-{}", std::process::id()));
    let mut lab = Lab::new(&[RUN_KEYING, RUN_GW], dir.clone());
    netns::create(&[RUN_KEYING, RUN_GW]);
    netns::veth("in0", RUN_GW, "in0p", RUN_GW);
    netns::veth("out0", RUN_GW, "out0p", RUN_GW);
    // The file says nothing of keying: the flags turn it on.
    let config = write_config(&dir, "xfrm-run");
    trap(RUN_KEYING, "198.51.100.2");
    let socket = dir.join("gw.sock");
    let stats = dir.join("final.json");
    lab.children.push(start_gateway(
        RUN_GW,
        &config,
        &socket,
        RUN_KEYING,
        &["--stats".as_ref(), stats.as_os_str()],
    ));
    let doc = stats_once(&socket, "the mirror's counters after its dumps", |d| {
        d["xfrm"]["dumps"] == 2
    });
    assert_eq!(doc["xfrm"]["policies_installed"], 1, "{:#}", doc["xfrm"]);
    // After privileges are dropped: notifications still arrive.
    ip(&[
        "-n",
        RUN_KEYING,
        "xfrm",
        "policy",
        "add",
        "src",
        "10.3.0.0/16",
        "dst",
        "10.4.0.0/16",
        "dir",
        "out",
        "priority",
        "50",
        "action",
        "block",
    ]);
    let followed = stats_once(&socket, "the block added while running", |d| {
        d["xfrm"]["policies_installed"] == 2
    });
    assert_eq!(followed["xfrm"]["policies_held"], 1, "{:#}", followed["xfrm"]);
    assert_eq!(followed["xfrm"]["malformed"], 0);
    let sas = common::ask(&socket, &["sa", "list"]).expect("sa list");
    assert!(sas["sas"].as_array().is_some_and(Vec::is_empty), "{sas:#}");
    interrupt(&mut lab);
    let last: Value = serde_json::from_slice(&std::fs::read(&stats).expect("the final stats")).unwrap();
    assert_eq!(last["xfrm"]["policies_mirrored"], 2, "{:#}", last["xfrm"]);
    drop(lab);
}

/// A UDP socket on port 500 of `ns` that prints, as JSON, what it received
/// and from where, after answering it (as a daemon does): `listen`; or
/// one that sends an IKE-shaped datagram from port 500 and prints the
/// answer's length: `ask`.
const UDP_PEER: &str = r#"
import json, socket, sys
mode, addr, gateway = sys.argv[1], sys.argv[2], sys.argv[3]
v6 = ":" in addr
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.settimeout(20)
if mode == "listen":
    s.bind(("::" if v6 else "0.0.0.0", 500))
    print("ready", flush=True)
    data, peer = s.recvfrom(2048)
    s.sendto(bytes(range(1, 9)) + bytes(32), peer)
    print(json.dumps({"from": peer[0], "port": peer[1], "len": len(data)}), flush=True)
else:
    s.bind((addr, 500))
    s.sendto(bytes(range(11, 19)) + bytes(36), (gateway, 500))
    data, peer = s.recvfrom(2048)
    print(json.dumps({"from": peer[0], "port": peer[1], "len": len(data)}), flush=True)
"#;

/// The IKE relay and ACQUIRE on this host's kernel (which keeps XFRM
/// policies without ESP): a peer on the outside sends an IKE-shaped
/// datagram to the gateway's address; a UDP socket on port 500 in the
/// keying namespace (where the daemon would be) receives it from the peer's
/// own address and port and answers, and the answer reaches the peer; the
/// same over IPv6, to the outside interface's `address6`. Then
/// a host inside sends to a network whose outbound policy has no SA (a
/// trap): espgw asks the kernel, which tells the keying namespace's
/// listeners (`ip xfrm monitor acquire`), as it would tell the daemon,
/// by way of the broker, the only process of espgw's that keeps
/// `CAP_NET_ADMIN`.
fn the_ike_relay_carries_a_peers_ike_both_ways_and_a_trap_asks_for_an_sa() {
    const KEYING: &str = "espgw-relay-k";
    const GW: &str = "espgw-relay-gw";
    const PEER: &str = "espgw-relay-peer";
    const LAN: &str = "espgw-relay-lan";
    let namespaces = [KEYING, GW, PEER, LAN];
    let dir = std::env::temp_dir().join(format!("espgw-xfrm-relay-{}", std::process::id()));
    let mut lab = Lab::new(&namespaces, dir.clone());
    netns::create(&namespaces);
    netns::veth("out0", GW, "peer0", PEER);
    netns::veth("in0", GW, "lan0", LAN);
    ip(&["-n", PEER, "addr", "add", "192.0.2.2/24", "dev", "peer0"]);
    ip(&[
        "-n",
        PEER,
        "addr",
        "add",
        "2001:db8:2::2/64",
        "dev",
        "peer0",
        "nodad",
    ]);
    ip(&["-n", LAN, "addr", "add", "10.1.0.2/16", "dev", "lan0"]);
    ip(&["-n", LAN, "route", "add", "default", "via", "10.1.0.1"]);
    // The daemon's trap: an outbound policy whose SA does not exist yet.
    trap(KEYING, "192.0.2.2");
    let config = write_config(&dir, "xfrm-relay");
    // The outside interface is the file's last table.
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("address6 = \"2001:db8:2::1/64\"\n");
    std::fs::write(&config, text).unwrap();
    let socket = dir.join("gw.sock");
    lab.children
        .push(start_gateway(GW, &config, &socket, KEYING, &[]));
    let wait_for = |what: &str, ok: &dyn Fn(&Value) -> bool| stats_once(&socket, what, ok);
    wait_for("the dumps", &|d| d["xfrm"]["dumps"] == 2);
    // Privileges: the forwarding process (every thread) has no
    // CAP_NET_ADMIN; of its two children, the xfrm broker has that alone
    // and the packet socket broker (`on_device_loss = "wait"`) CAP_NET_RAW
    // alone.
    let pid = lab.children[0].id();
    let status = |path: String, field: &str| -> u64 {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:\t")))
            .unwrap_or_else(|| panic!("{path}: no {field}"));
        u64::from_str_radix(line.trim(), 16).unwrap_or_else(|_| line.trim().parse().unwrap_or(u64::MAX))
    };
    const CAP_NET_ADMIN: u64 = 1 << 12;
    const CAP_NET_RAW: u64 = 1 << 13;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        for set in ["CapEff", "CapPrm"] {
            let caps = status(format!("{}/status", task.display()), set);
            assert_eq!(
                caps & (CAP_NET_ADMIN | CAP_NET_RAW),
                0,
                "{} {set} {caps:#x}",
                task.display()
            );
        }
    }
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let mut named: Vec<(String, &str)> = children
        .split_whitespace()
        .map(|child| {
            let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap();
            (comm.trim().to_owned(), child)
        })
        .collect();
    named.sort();
    let names: Vec<&str> = named.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["espgw-broker", "espgw-sockets"],
        "the two brokers: {children:?}"
    );
    // Each holds what it serves with, nothing of the gateway's (packet
    // sockets, TUN, control socket): the xfrm broker its netlink sockets
    // and two links, the socket broker its one link.
    for ((_, child), (caps, kept)) in named.iter().zip([(CAP_NET_ADMIN, 4), (CAP_NET_RAW, 1)]) {
        let broker = format!("/proc/{child}/status");
        for (field, want) in [
            ("CapEff", caps),
            ("CapPrm", caps),
            ("CapBnd", 0),
            ("CapAmb", 0),
            ("NoNewPrivs", 1),
        ] {
            assert_eq!(status(broker.clone(), field), want, "{broker}'s {field}");
        }
        let fds = std::fs::read_dir(format!("/proc/{child}/fd")).unwrap().count();
        assert_eq!(fds, 3 + kept, "{broker}: stdin, stdout, stderr and its own");
    }
    // The relay's device, as the daemon sees it.
    let shown = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().expect("ip");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let addresses = shown(&["-n", KEYING, "addr", "show", "dev", "espgw-ike"]);
    assert!(
        addresses.contains("192.0.2.1/32") && addresses.contains("2001:db8:2::1/128"),
        "{addresses}"
    );
    for family in ["-4", "-6"] {
        let routes = shown(&["-n", KEYING, family, "route", "show", "default"]);
        assert!(routes.contains("dev espgw-ike"), "{family}: {routes}");
    }

    let python = |ns: &str, mode: &str, peer: &str, gateway: &str| {
        Command::new("ip")
            .args([
                "netns", "exec", ns, "python3", "-c", UDP_PEER, mode, peer, gateway,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3")
    };
    for (peer, gateway) in [("192.0.2.2", "192.0.2.1"), ("2001:db8:2::2", "2001:db8:2::1")] {
        let mut daemon = python(KEYING, "listen", peer, gateway);
        let mut line = String::new();
        {
            use std::io::BufRead;
            let stdout = daemon.stdout.as_mut().expect("the listener's output");
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .expect("the listener starts");
        }
        assert_eq!(line.trim(), "ready");
        let asked = python(PEER, "ask", peer, gateway)
            .wait_with_output()
            .expect("the peer");
        let heard = daemon.wait_with_output().expect("the listener");
        let parse = |out: &std::process::Output| -> Value {
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "{peer}: {e}: {} {}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )
            })
        };
        // Who sent what was received, and how long it was.
        let received = |said: &std::process::Output| {
            let doc = parse(said);
            let (from, port, len) = (doc["from"].as_str(), doc["port"].as_u64(), doc["len"].as_u64());
            (from.map(str::to_owned), port, len)
        };
        assert_eq!(
            received(&heard),
            (Some(peer.to_owned()), Some(500), Some(44)),
            "the daemon's side sees the peer's own address and port"
        );
        assert_eq!(
            received(&asked),
            (Some(gateway.to_owned()), Some(500), Some(40)),
            "the answer leaves from the gateway's address and the daemon's port"
        );
    }
    let doc = wait_for("the relay's counters", &|d| d["ike_relay"]["from_daemon"] == 2);
    assert_eq!(doc["ike_relay"]["to_daemon"], 2, "{:#}", doc["ike_relay"]);

    // The trap: the kernel tells its listeners, as it would the daemon.
    let monitor = Command::new("timeout")
        .args(["15", "ip", "-n", KEYING, "xfrm", "monitor", "acquire"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ip xfrm monitor");
    std::thread::sleep(Duration::from_millis(500));
    let ping = Command::new("ip")
        .args([
            "netns", "exec", LAN, "ping", "-c", "3", "-i", "0.3", "-W", "1", "10.2.0.5",
        ])
        .output()
        .expect("ping");
    assert!(!ping.status.success(), "nothing answers behind a trap");
    let doc = wait_for("an ACQUIRE", &|d| d["xfrm"]["acquire_sent"].as_u64() >= Some(1));
    assert_eq!(doc["xfrm"]["feedback_failed"], 0, "{:#}", doc["xfrm"]);
    interrupt(&mut lab);
    let acquires = monitor.wait_with_output().expect("the monitor");
    let acquires = String::from_utf8_lossy(&acquires.stdout);
    assert!(
        acquires.contains("acquire") && acquires.contains("10.1.0.2") && acquires.contains("reqid 5"),
        "the keying namespace's listeners hear the ACQUIRE: {acquires}"
    );
    drop(lab);
}
