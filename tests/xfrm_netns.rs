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
use testkit::Prerequisite;

static XFRM_NETLINK: Prerequisite = Prerequisite::new("xfrm-netlink", || {
    testkit::root_and_tools("network namespaces and XFRM policies", &[("ip", "iproute2")])?;
    let listed = Command::new("ip")
        .args(["xfrm", "policy", "count"])
        .output()
        .map_err(|e| format!("cannot run `ip xfrm policy count`: {e}"))?;
    if !listed.status.success() {
        return Err(format!(
            "`ip xfrm policy count` failed (a kernel without XFRM netlink, CONFIG_XFRM_USER): {}",
            String::from_utf8_lossy(&listed.stderr).trim()
        ));
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
    ])
}

/// Names of their own, so that other namespace tests may run beside.
const NS: &str = "espgw-xfrm-keying";
const RUN_KEYING: &str = "espgw-xfrm-rk";
const RUN_GW: &str = "espgw-xfrm-rgw";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Removes the namespaces (and stops a gateway), also when the test fails.
struct Namespace {
    dir: PathBuf,
    names: Vec<&'static str>,
    gateway: Option<std::process::Child>,
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Some(mut gateway) = self.gateway.take() {
            let _ = gateway.kill();
            let _ = gateway.wait();
        }
        for name in &self.names {
            let _ = Command::new("ip")
                .args(["netns", "del", name])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn policy<'a>(doc: &'a Value, selector: &str) -> Option<&'a Value> {
    doc["policies"]
        .as_array()?
        .iter()
        .find(|p| p["selector"].as_str().is_some_and(|s| s.starts_with(selector)))
}

fn policies_added_before_and_while_espgw_follows_are_mirrored() {
    let _ = Command::new("ip")
        .args(["netns", "del", NS])
        .stderr(Stdio::null())
        .status();
    let dir = std::env::temp_dir().join(format!("espgw-xfrm-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lab = Namespace {
        dir: dir.clone(),
        names: vec![NS],
        gateway: None,
    };
    ip(&["netns", "add", NS]);
    let config = lab.dir.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            r#"[gateway]
name = "xfrm-netns"
[keying]
source = "xfrm"
netns = "{NS}"
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
    let show = Command::new(env!("CARGO_BIN_EXE_espgw"))
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
    for ns in [RUN_KEYING, RUN_GW] {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
    let dir = std::env::temp_dir().join(format!("espgw-xfrm-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lab = Namespace {
        dir: dir.clone(),
        names: vec![RUN_KEYING, RUN_GW],
        gateway: None,
    };
    ip(&["netns", "add", RUN_KEYING]);
    ip(&["netns", "add", RUN_GW]);
    for (dev, peer) in [("in0", "in0p"), ("out0", "out0p")] {
        ip(&[
            "-n", RUN_GW, "link", "add", dev, "type", "veth", "peer", "name", peer,
        ]);
        ip(&["-n", RUN_GW, "link", "set", dev, "up"]);
        ip(&["-n", RUN_GW, "link", "set", peer, "up"]);
    }
    // The file says nothing of keying: the flags turn it on.
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        r#"[gateway]
name = "xfrm-run"
[[interface]]
name = "inside"
device = "in0"
address = "10.1.0.1/16"
[[interface]]
name = "outside"
device = "out0"
address = "192.0.2.1/24"
"#,
    )
    .unwrap();
    ip(&[
        "-n",
        RUN_KEYING,
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
        "198.51.100.2",
        "proto",
        "esp",
        "reqid",
        "5",
        "mode",
        "tunnel",
    ]);
    let socket = dir.join("gw.sock");
    let stats = dir.join("final.json");
    lab.gateway = Some(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                RUN_GW,
                env!("CARGO_BIN_EXE_espgw"),
                "run",
                "--config",
            ])
            .arg(&config)
            .arg("--control")
            .arg(&socket)
            .arg("--stats")
            .arg(&stats)
            .args(["--workers", "1", "--keying", "xfrm", "--keying-netns", RUN_KEYING])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting espgw run"),
    );
    let query = |what: &[&str]| -> Option<Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_espgw"))
            .args(what)
            .arg("--socket")
            .arg(&socket)
            .arg("--json")
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    };
    let started = std::time::Instant::now();
    let mut doc = None;
    while started.elapsed() < Duration::from_secs(30) {
        doc = query(&["stats"]).filter(|d| d["xfrm"]["dumps"] == 2);
        if doc.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let doc = doc.expect("espgw run answers with the mirror's counters after its dumps");
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
    let mut followed = None;
    while started.elapsed() < Duration::from_secs(30) {
        followed = query(&["stats"]).filter(|d| d["xfrm"]["policies_installed"] == 2);
        if followed.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let followed = followed.expect("the block added while running is mirrored");
    assert_eq!(followed["xfrm"]["policies_held"], 1, "{:#}", followed["xfrm"]);
    assert_eq!(followed["xfrm"]["malformed"], 0);
    let sas = query(&["sa", "list"]).expect("sa list");
    assert!(sas["sas"].as_array().is_some_and(Vec::is_empty), "{sas:#}");
    let gateway = lab.gateway.take().expect("the gateway");
    // SAFETY: kill(2) with the child's pid, which has not been reaped.
    unsafe { libc::kill(gateway.id() as libc::pid_t, libc::SIGINT) };
    let out = gateway.wait_with_output().expect("espgw run stops");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let last: Value = serde_json::from_slice(&std::fs::read(&stats).expect("the final stats")).unwrap();
    assert_eq!(last["xfrm"]["policies_mirrored"], 2, "{:#}", last["xfrm"]);
    drop(lab);
}
