//! `espgw run --log-format json` as an operator searches it, in the demo's
//! topology (hostA — gwA — gwB — hostB, the shipped demo configurations:
//! tunnel `a-b` keyed by its exchange and rekeyed every 300 kB, beside a
//! tunnel with static keys and lifetimes of a few seconds). Through a
//! start, a numbered UDP stream with a few rekeys, a reload that changes
//! `a-b`, a reload of a broken file and a stop, every line either gateway
//! writes to standard error must be one JSON object; each event (tunnel
//! up and down, rekey, SA installed, expired soft and hard, removed with
//! why, reload, reload refused) must be there with its level and the
//! fields that identify it; there must be as many `rekey` lines as `espgw
//! stats` counts rekeys; nothing may be logged per packet (far fewer lines
//! than packets, and no line names the hosts' addresses); and no line may
//! carry the tunnel's secret or a key of the file. The reload also removes
//! the tunnel with static keys, whose SAs' lines must still name it.
//!
//! The `xfrm` keying source's events, from a gateway of its own keyed by
//! a keying namespace's XFRM policies: a policy it cannot mirror is
//! refused on a line of its own (`policy_refused`), whether the start's
//! dump or a later notification brings it. Its SA events (`sa_installed`
//! with `reqid`, `sa_refused`, `sa_expired` from the kernel's EXPIRE,
//! `sa_removed` with an `xfrm_*` reason) need XFRM states, which a kernel
//! without ESP for XFRM (this one: `ip xfrm state add` fails with
//! "Requested type not found") cannot hold, so they are not asserted
//! here; `ike-stub/tests/xfrm_mirror.rs` drives the mirror with recorded
//! states.
//!
//! Without root, the namespace tools or python3 (or, for the `xfrm`
//! part, XFRM netlink) the tests show as ignored (testkit `netns`,
//! `xfrm-netlink`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::netns::{self, wait_for, Lab};
use testkit::Prerequisite;

mod common;
use common::repo;

static NETNS: Prerequisite = Prerequisite::new("netns", || {
    testkit::root_and_tools(
        "network namespaces",
        &[("ip", "iproute2"), ("python3", "python3")],
    )
});

static XFRM_NETLINK: Prerequisite = Prerequisite::new("xfrm-netlink", testkit::xfrm_netlink);

fn main() -> std::process::ExitCode {
    testkit::run([
        testkit::needs!(
            &NETNS,
            every_event_is_one_json_line_with_its_fields_and_none_is_per_packet
        ),
        testkit::needs!(&XFRM_NETLINK, the_xfrm_sources_refusals_are_events_of_their_own),
    ])
}

const HOST_A: &str = "espgw-ev-hostA";
const GW_A: &str = "espgw-ev-gwA";
const GW_B: &str = "espgw-ev-gwB";
const HOST_B: &str = "espgw-ev-hostB";

/// The stream's datagrams, of 1,000 bytes each: about 13 rekeys' worth at
/// 300 kB, of which each gateway starts some.
const PACKETS: u64 = 4000;

/// The static tunnel's keys, as its file writes them.
const STATIC_KEYS: [&str; 4] = [
    "4f1c2a9be07d3658a1c4e2f90b7d6a35",
    "9d27e4b1c6a0f8352e7b4c19d8a6f0e3",
    "c35e8a1f7b2d904e6a1c3f5b8d7e9a2c4b6d8f01",
    "7a9c1e3b5d7f092b4d6f8a1c3e5b7d9f0a2c4e6b",
];

/// The shipped demo configuration of `side`: its tunnel `a-b` rekeying
/// every `soft_bytes`, and (with `with_static`) a tunnel with static keys
/// whose SAs reach their soft and hard lifetimes seconds after the start.
fn config_text(side: &str, soft_bytes: u64, with_static: bool) -> String {
    let mut text = std::fs::read_to_string(repo(&format!("configs/demo-{side}.toml"))).unwrap();
    // The file ends with its one [[tunnel]]: this table is that tunnel's.
    text.push_str(&format!(
        "\n[tunnel.lifetime]\nsoft_bytes = {soft_bytes}\nhard_bytes = 50000000\n"
    ));
    if !with_static {
        return text;
    }
    let (local, remote, local_net, remote_net, spis, keys) = match side {
        "a" => (
            "10.0.0.1",
            "10.0.0.2",
            "192.168.11.0/24",
            "192.168.12.0/24",
            ("0x5001", "0x5002"),
            [0, 1, 2, 3],
        ),
        _ => (
            "10.0.0.2",
            "10.0.0.1",
            "192.168.12.0/24",
            "192.168.11.0/24",
            ("0x5002", "0x5001"),
            [1, 0, 3, 2],
        ),
    };
    text.push_str(&format!(
        "\n[[tunnel]]\nname = \"static\"\nlocal = \"{local}\"\nremote = \"{remote}\"\n\
         local_subnet = \"{local_net}\"\nremote_subnet = \"{remote_net}\"\nproposal = \"aes128-sha1\"\n\
         spi_out = {}\nspi_in = {}\nenc_key_out = \"{}\"\nenc_key_in = \"{}\"\n\
         auth_key_out = \"{}\"\nauth_key_in = \"{}\"\n\
         [tunnel.lifetime]\nsoft_seconds = 3\nhard_seconds = 6\n",
        spis.0,
        spis.1,
        STATIC_KEYS[keys[0]],
        STATIC_KEYS[keys[1]],
        STATIC_KEYS[keys[2]],
        STATIC_KEYS[keys[3]],
    ));
    text
}

fn write_config(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

/// Every line of a gateway's standard error, each parsed as JSON.
fn read_log(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .enumerate()
        .map(|(n, line)| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: not JSON ({e}): {line}", path.display(), n + 1));
            assert!(
                value.is_object(),
                "{}:{}: not an object: {line}",
                path.display(),
                n + 1
            );
            value
        })
        .collect()
}

fn events<'a>(log: &'a [Value], event: &str) -> Vec<&'a Value> {
    log.iter().filter(|l| l["event"] == event).collect()
}

/// The lines of `event` for which `matches` holds; at least one, each at
/// `level`.
fn expect<'a>(
    side: &str,
    log: &'a [Value],
    event: &str,
    level: &str,
    matches: impl Fn(&Value) -> bool,
) -> Vec<&'a Value> {
    let found: Vec<&Value> = events(log, event).into_iter().filter(|l| matches(l)).collect();
    assert!(!found.is_empty(), "gw{side}: no `{event}` line as expected");
    for line in &found {
        assert_eq!(line["level"], level, "gw{side}: {line}");
    }
    found
}

fn is_hex_spi(value: &Value) -> bool {
    value
        .as_str()
        .and_then(|s| s.strip_prefix("0x"))
        .is_some_and(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn every_event_is_one_json_line_with_its_fields_and_none_is_per_packet() {
    let dir = std::env::temp_dir().join(format!("espgw-events-{}", std::process::id()));
    let mut lab = Lab::new(&[HOST_A, GW_A, GW_B, HOST_B], dir.clone());
    netns::demo_topology([HOST_A, GW_A, GW_B, HOST_B]);

    let sides = ["a", "b"];
    let sockets = [dir.join("a.sock"), dir.join("b.sock")];
    let configs = [dir.join("demo-a.toml"), dir.join("demo-b.toml")];
    let logs = [dir.join("gw-a.log"), dir.join("gw-b.log")];
    for (i, ns) in [GW_A, GW_B].into_iter().enumerate() {
        write_config(&configs[i], &config_text(sides[i], 300_000, true));
        let log = std::fs::File::create(&logs[i]).unwrap();
        lab.children.push(
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    ns,
                    env!("CARGO_BIN_EXE_espgw"),
                    "--log-format",
                    "json",
                    "run",
                ])
                .arg("--config")
                .arg(&configs[i])
                .arg("--control")
                .arg(&sockets[i])
                .args(["--workers", "2"])
                .env_remove("RUST_LOG")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("espgw run"),
        );
    }
    wait_for("the tunnel's exchange", Duration::from_secs(30), || {
        common::ask(&sockets[0], &["stats"]).filter(|s| {
            s["tunnels"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "a-b" && t["sa_out"] != ""))
        })
    });
    // The static tunnel's SAs reach their hard lifetime (6 s).
    std::thread::sleep(Duration::from_secs(7));

    // A numbered stream through `a-b`.
    let sender = [
        "import socket, time",
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        &format!("for i in range({PACKETS}):"),
        "    s.sendto(i.to_bytes(4, 'big') + bytes(996), ('192.168.2.20', 9))",
        "    if i % 50 == 49: time.sleep(0.05)",
    ]
    .join("\n");
    netns::output(HOST_A, &["python3", "-c", &sender]);
    // The last rekey's switch confirmed, the replaced SAs' grace over.
    std::thread::sleep(Duration::from_secs(4));

    // The rekeys each gateway counts, against its `rekey` lines so far
    // (a reload that changes `a-b` starts its count again).
    let mut rekeys = [0u64; 2];
    let mut encapsulated = 0;
    for i in 0..2 {
        let stats = common::ask(&sockets[i], &["stats"]).expect("stats");
        if i == 0 {
            encapsulated = stats["encapsulated"].as_u64().expect("encapsulated");
        }
        rekeys[i] = stats["tunnels"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == "a-b"))
            .and_then(|t| t["rekeys"].as_u64())
            .expect("a-b's rekeys");
        let lines = events(&read_log(&logs[i]), "rekey").len() as u64;
        assert_eq!(
            lines, rekeys[i],
            "gw{}: rekey lines against `espgw stats`",
            sides[i]
        );
    }
    assert!(encapsulated >= PACKETS, "{encapsulated} packets encapsulated");
    assert!(rekeys[0] + rekeys[1] >= 3, "only {rekeys:?} rekeys");

    // A reload that changes `a-b` on gwA (another lifetime) and removes
    // the tunnel with static keys, then one of a broken file.
    write_config(&configs[0], &config_text("a", 400_000, false));
    let reloaded = common::ask(&sockets[0], &["reload"]).expect("reload");
    assert_eq!(reloaded["reloaded"], true, "{reloaded}");
    wait_for("a-b connected again", Duration::from_secs(30), || {
        common::ask(&sockets[0], &["stats"]).filter(|s| {
            s["tunnels"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "a-b" && t["sa_out"] != ""))
        })
    });
    write_config(&configs[0], "[gateway]\nname = \"demo-a\"\n[[tunnel]]\nname = ");
    // `espgw reload` says so on its standard error, and fails.
    let refused = Command::new(env!("CARGO_BIN_EXE_espgw"))
        .arg("reload")
        .arg("--socket")
        .arg(&sockets[0])
        .output()
        .expect("espgw reload");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("reload refused"),
        "{said}"
    );
    // Grace periods of the reconnect over.
    std::thread::sleep(Duration::from_secs(3));

    // A stop: SIGTERM, as a service manager sends it.
    for child in &mut lab.children {
        // SAFETY: kill(2) on the child's own process id.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    }
    for child in &mut lab.children {
        let status = child.wait().expect("espgw run");
        assert!(status.success(), "espgw run: {status}");
    }

    let secret = "demo secret";
    let mut counts: Vec<BTreeMap<String, usize>> = Vec::new();
    for i in 0..2 {
        let side = sides[i];
        let text = std::fs::read_to_string(&logs[i]).unwrap();
        let log = read_log(&logs[i]);
        for line in text.lines() {
            assert!(!line.contains(secret), "gw{side}: the secret in {line}");
            for key in STATIC_KEYS {
                assert!(!line.contains(key), "gw{side}: a key in {line}");
            }
            for host in ["192.168.1.10", "192.168.2.20"] {
                assert!(!line.contains(host), "gw{side}: a packet's address in {line}");
            }
            assert!(!line.contains('\u{1b}'), "gw{side}: an escape code in {line}");
        }
        assert!(
            (log.len() as u64) * 10 < PACKETS,
            "gw{side}: {} lines for {PACKETS} packets",
            log.len()
        );

        // Tunnel up: `a-b` by its exchange (at start, and gwA again after
        // its reload; gwB as the responder), `static` with the file's keys.
        let up = expect(side, &log, "tunnel_up", "INFO", |l| l["tunnel"] == "a-b");
        for l in &up {
            assert!(l["generation"].is_u64() && l["role"].is_string(), "{l}");
            assert!(is_hex_spi(&l["spi_out"]) && is_hex_spi(&l["spi_in"]), "{l}");
        }
        assert!(up.len() >= 2, "gw{side}: a-b came up {} times", up.len());
        expect(side, &log, "tunnel_up", "INFO", |l| {
            l["tunnel"] == "static" && l["keys"] == "static" && is_hex_spi(&l["spi_out"])
        });
        // Rekeys: as many as counted, each naming the tunnel, its
        // generation and role.
        for l in expect(side, &log, "rekey", "INFO", |_| true) {
            assert!(l["tunnel"] == "a-b" && l["generation"].is_u64(), "{l}");
            assert!(l["role"] == "initiator" || l["role"] == "responder", "{l}");
        }
        // SAs.
        for l in expect(side, &log, "sa_installed", "INFO", |_| true) {
            assert!(
                l["sa"].is_string() && is_hex_spi(&l["spi"]) && l["direction"].is_string(),
                "{l}"
            );
        }
        let keyed = |l: &Value| l["tunnel"] == "a-b" && l["generation"].is_u64();
        assert!(
            events(&log, "sa_installed").iter().filter(|l| keyed(l)).count() >= 4,
            "gw{side}: a-b's SAs installed"
        );
        // Every removal says why.
        for l in expect(side, &log, "sa_removed", "INFO", |_| true) {
            assert!(l["sa"].is_string() && is_hex_spi(&l["spi"]), "{l}");
            assert!(
                l["reason"].is_string(),
                "gw{side}: a removal without its reason: {l}"
            );
        }
        assert!(
            events(&log, "sa_removed")
                .iter()
                .any(|l| keyed(l) && l["reason"] == "rekeyed"),
            "gw{side}: a replaced SA of a-b removed once its rekey is done"
        );
        // Expiries: a-b's soft limits start its rekeys; the static
        // tunnel's are trouble (no rekey: warned, with the reason), and
        // each SA's is logged once although two workers hold it.
        expect(side, &log, "sa_expired", "INFO", |l| {
            l["limit"] == "soft" && l["tunnel"] == "a-b" && is_hex_spi(&l["spi"])
        });
        for limit in ["soft", "hard"] {
            let lines = expect(side, &log, "sa_expired", "WARN", |l| {
                l["limit"] == limit && l["tunnel"] == "static"
            });
            for l in &lines {
                assert!(is_hex_spi(&l["spi"]) && l["reason"].is_string(), "{l}");
            }
            assert_eq!(lines.len(), 2, "gw{side}: static's two SAs, once each: {lines:?}");
        }
        let mut expired: Vec<(String, String)> = events(&log, "sa_expired")
            .iter()
            .map(|l| (l["sa"].to_string(), l["limit"].to_string()))
            .collect();
        let all = expired.len();
        expired.sort();
        expired.dedup();
        assert_eq!(all, expired.len(), "gw{side}: an SA's expiry logged twice");

        if side == "a" {
            let down = expect(side, &log, "tunnel_down", "INFO", |l| {
                l["tunnel"] == "a-b" && l["reason"].as_str().is_some_and(|r| r.contains("reload"))
            });
            assert!(down[0]["generation"].is_u64(), "{}", down[0]);
            // The changed tunnel's SAs go for the reload.
            expect(side, &log, "sa_removed", "INFO", |l| {
                keyed(l) && l["reason"] == "reload"
            });
            // The static tunnel, removed: its line, and its two SAs' lines
            // name it although the running configuration no longer has it.
            expect(side, &log, "tunnel_down", "INFO", |l| {
                l["tunnel"] == "static" && l["reason"] == "removed by a reload"
            });
            let mut gone: Vec<&str> = expect(side, &log, "sa_removed", "INFO", |l| {
                l["tunnel"] == "static" && l["reason"] == "reload"
            })
            .iter()
            .filter_map(|l| l["sa"].as_str())
            .collect();
            gone.sort();
            assert_eq!(gone, ["static-in", "static-out"], "gw{side}");
            let reload = expect(side, &log, "reload", "INFO", |_| true);
            assert_eq!(reload.len(), 1, "one reload taken");
            assert_eq!(reload[0]["changed"], "[\"a-b\"]", "{}", reload[0]);
            // Refused: a warning (the gateway runs on with its running
            // configuration), saying why.
            let refused = expect(side, &log, "reload_refused", "WARN", |_| true);
            assert_eq!(refused.len(), 1);
            assert!(refused[0]["reason"].is_string(), "{}", refused[0]);
        }
        // The stop.
        expect(side, &log, "tunnel_down", "INFO", |l| {
            l["tunnel"] == "a-b" && l["reason"] == "espgw stopped"
        });
        let last = log.last().expect("a last line");
        assert_eq!(last["message"], "stopped", "{last}");
        // Routine events are at INFO; nothing ERROR in this run.
        for l in &log {
            assert_ne!(l["level"], "ERROR", "gw{side}: {l}");
        }

        let mut kinds = BTreeMap::new();
        for l in &log {
            if let Some(event) = l["event"].as_str() {
                *kinds.entry(event.to_owned()).or_default() += 1;
            }
        }
        eprintln!(
            "gw{side}: {} lines for {encapsulated} packets encapsulated by gwA; {} rekeys counted by espgw stats, as many rekey lines; events: {kinds:?}",
            log.len(),
            rekeys[i]
        );
        counts.push(kinds);
    }
    assert_eq!(
        counts[0]["rekey"], counts[1]["rekey"],
        "each rekey logged at both ends"
    );

    // The text format, into a file: key=value fields, no escape codes.
    write_config(&configs[0], &config_text("a", 300_000, true));
    let text_log = dir.join("gw-a.txt");
    let mut gateway = Command::new("ip")
        .args([
            "netns",
            "exec",
            GW_A,
            env!("CARGO_BIN_EXE_espgw"),
            "run",
            "--config",
        ])
        .arg(&configs[0])
        .arg("--control")
        .arg(&sockets[0])
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&text_log).unwrap())
        .spawn()
        .expect("espgw run");
    wait_for("gwA's control socket", Duration::from_secs(20), || {
        common::ask(&sockets[0], &["stats"])
    });
    // SAFETY: kill(2) on the child's own process id.
    assert_eq!(
        unsafe { libc::kill(gateway.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    assert!(gateway.wait().expect("espgw run").success());
    let text = std::fs::read_to_string(&text_log).unwrap();
    assert!(!text.contains('\u{1b}'), "escape codes in a file: {text}");
    assert!(
        text.lines().any(|l| l.contains(" INFO ")
            && l.contains("event=\"sa_installed\"")
            && l.contains("sa=\"static-out\"")
            && l.contains("spi=0x00005001")),
        "{text}"
    );
    drop(lab);
}

const XFRM_KEYING: &str = "espgw-ev-xkey";
const XFRM_GW: &str = "espgw-ev-xgw";

/// `ip -n XFRM_KEYING xfrm policy add ...` of an outbound policy from
/// `src` to 10.2.0.0/16 through a tunnel template of `proto`.
fn add_policy(src: &str, proto: &str) {
    let command = format!(
        "-n {XFRM_KEYING} xfrm policy add src {src} dst 10.2.0.0/16 dir out priority 100 \
         tmpl src 192.0.2.1 dst 198.51.100.2 proto {proto} reqid 5 mode tunnel"
    );
    netns::ip(&command.split_whitespace().collect::<Vec<_>>());
}

fn the_xfrm_sources_refusals_are_events_of_their_own() {
    let dir = std::env::temp_dir().join(format!("espgw-events-xfrm-{}", std::process::id()));
    let mut lab = Lab::new(&[XFRM_KEYING, XFRM_GW], dir.clone());
    netns::create(&[XFRM_KEYING, XFRM_GW]);
    for (dev, peer) in [("in0", "in0p"), ("out0", "out0p")] {
        netns::ip(&[
            "-n", XFRM_GW, "link", "add", dev, "type", "veth", "peer", "name", peer,
        ]);
        netns::ip(&["-n", XFRM_GW, "link", "set", dev, "up"]);
        netns::ip(&["-n", XFRM_GW, "link", "set", peer, "up"]);
    }
    let config = dir.join("gw.toml");
    write_config(
        &config,
        &format!(
            "[gateway]\nname = \"ev-xfrm\"\n[keying]\nsource = \"xfrm\"\nnetns = \"{XFRM_KEYING}\"\n\
             [[interface]]\nname = \"inside\"\ndevice = \"in0\"\naddress = \"10.1.0.1/16\"\n\
             [[interface]]\nname = \"outside\"\ndevice = \"out0\"\naddress = \"192.0.2.1/24\"\n"
        ),
    );
    // Before the start, in the first dump: one policy espgw mirrors (an
    // ESP tunnel), one it refuses (an AH template).
    add_policy("10.1.0.0/16", "esp");
    add_policy("10.3.0.0/16", "ah");
    let socket = dir.join("gw.sock");
    let log_path = dir.join("gw.log");
    lab.children.push(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                XFRM_GW,
                env!("CARGO_BIN_EXE_espgw"),
                "--log-format",
                "json",
                "run",
            ])
            .arg("--config")
            .arg(&config)
            .arg("--control")
            .arg(&socket)
            .args(["--workers", "1"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("espgw run"),
    );
    wait_for("the first dumps", Duration::from_secs(30), || {
        common::ask(&socket, &["stats"]).filter(|s| s["xfrm"]["dumps"] == 2)
    });
    // While it follows: a refused policy in a notification.
    add_policy("10.4.0.0/16", "ah");
    // (A refused policy still stands in the SPD, discarding.)
    wait_for("the refusals", Duration::from_secs(10), || {
        common::ask(&socket, &["stats"]).filter(|s| s["xfrm"]["policies_refused"] == 2)
    });
    let child = lab.children.last_mut().expect("the gateway");
    // SAFETY: kill(2) on the child's own process id.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    assert!(child.wait().expect("espgw run").success());

    let log = read_log(&log_path);
    let refused = expect("x", &log, "policy_refused", "WARN", |_| true);
    assert_eq!(refused.len(), 2, "one line per refused policy: {refused:?}");
    let mut names: Vec<&str> = refused.iter().filter_map(|l| l["policy"].as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 2, "each names its policy: {refused:?}");
    for l in &refused {
        assert!(
            l["policy"].as_str().is_some_and(|p| p.starts_with("xfrm-out-")),
            "{l}"
        );
        assert_eq!(l["reason"], "template", "an AH template: {l}");
    }
    for l in &log {
        assert_ne!(l["level"], "ERROR", "{l}");
    }
    let last = log.last().expect("a last line");
    assert_eq!(last["message"], "stopped", "{last}");
    drop(lab);
}
