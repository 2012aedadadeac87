//! `espgw run --metrics` scraped by a real Prometheus (Debian's
//! `prometheus`), in the demo's topology (hostA — gwA — gwB — hostB, the
//! shipped demo configurations, a tunnel keyed by its exchange and
//! rekeyed every 100 kB). While hostA sends a numbered UDP stream
//! through the tunnel, Prometheus scrapes gwA every second; afterwards its
//! HTTP API must show the tunnel's outbound packet counter equal to
//! gwA's own count of encapsulated packets (`espgw stats`) within one
//! packet, never reset across the rekeys, and `promtool check metrics`
//! must pass on the exposition. Without root, the namespace tools,
//! python3 or Prometheus the test shows as ignored (testkit
//! `prometheus`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::netns::{self, wait_for, Lab};
use testkit::Prerequisite;

mod common;

static PROMETHEUS: Prerequisite = Prerequisite::new("prometheus", || {
    testkit::root_and_tools(
        "network namespaces",
        &[
            ("ip", "iproute2"),
            ("python3", "python3"),
            ("prometheus", "prometheus"),
            ("promtool", "prometheus"),
        ],
    )
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(
        &PROMETHEUS,
        a_prometheus_scrape_matches_the_gateways_counts_across_rekeys
    )])
}

const HOST_A: &str = "espgw-mx-hostA";
const GW_A: &str = "espgw-mx-gwA";
const GW_B: &str = "espgw-mx-gwB";
const HOST_B: &str = "espgw-mx-hostB";
const METRICS: &str = "127.0.0.1:9464";
const PROMETHEUS_API: &str = "127.0.0.1:9090";

/// An HTTP GET in namespace `ns`, by python3's standard library.
fn get(ns: &str, url: &str) -> String {
    netns::output(
        ns,
        &[
            "python3",
            "-c",
            "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())",
            url,
        ],
    )
}

/// A Prometheus instant query's single value.
fn query(expr: &str) -> Option<f64> {
    let url = format!(
        "http://{PROMETHEUS_API}/api/v1/query?query={}",
        expr.bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b"_-.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            })
            .collect::<String>()
    );
    let doc: Value = serde_json::from_str(&get(GW_A, &url)).ok()?;
    doc["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

fn stats(socket: &Path) -> Option<Value> {
    common::ask(socket, &["stats"])
}

/// The shipped demo configuration of `side`, rekeying every 100 kB.
fn config(dir: &Path, side: &str) -> PathBuf {
    let mut text = std::fs::read_to_string(common::repo(&format!("configs/demo-{side}.toml"))).unwrap();
    // The file ends with its one [[tunnel]]: this table is that tunnel's.
    text.push_str("\n[tunnel.lifetime]\nsoft_bytes = 100000\nhard_bytes = 5000000\n");
    let path = dir.join(format!("demo-{side}.toml"));
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    path
}

fn a_prometheus_scrape_matches_the_gateways_counts_across_rekeys() {
    let dir = std::env::temp_dir().join(format!("espgw-metrics-{}", std::process::id()));
    let mut lab = Lab::new(&[HOST_A, GW_A, GW_B, HOST_B], dir.clone());
    netns::demo_topology([HOST_A, GW_A, GW_B, HOST_B]);

    let sockets = [dir.join("a.sock"), dir.join("b.sock")];
    for (ns, side, socket) in [(GW_A, "a", &sockets[0]), (GW_B, "b", &sockets[1])] {
        let mut command = common::espgw_in(ns);
        command
            .args(["run", "--config"])
            .arg(config(&dir, side))
            .arg("--control")
            .arg(socket)
            .args(["--workers", "1"]);
        if side == "a" {
            command.args(["--metrics", METRICS]);
        }
        let log = std::fs::File::create(dir.join(format!("gw-{side}.log"))).unwrap();
        lab.children.push(
            command
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("espgw run"),
        );
    }
    wait_for("the tunnel's exchange", Duration::from_secs(30), || {
        stats(&sockets[0]).filter(|s| s["tunnels"][0]["sa_out"].as_str().is_some_and(|n| !n.is_empty()))
    });

    // Prometheus, in gwA's namespace, scraping gwA every second.
    let prometheus_config = dir.join("prometheus.yml");
    std::fs::write(
        &prometheus_config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: espgw\n    static_configs:\n      - targets: ['{METRICS}']\n"
        ),
    )
    .unwrap();
    let tsdb = dir.join("tsdb");
    let prometheus_log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    lab.children.push(
        Command::new("ip")
            .args(["netns", "exec", GW_A, "prometheus"])
            .arg(format!("--config.file={}", prometheus_config.display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg(format!("--web.listen-address={PROMETHEUS_API}"))
            .stdout(Stdio::null())
            .stderr(prometheus_log)
            .spawn()
            .expect("prometheus"),
    );
    wait_for("Prometheus scraping gwA", Duration::from_secs(60), || {
        query("up{job=\"espgw\"}").filter(|up| *up == 1.0)
    });

    // A numbered stream through the tunnel: 2,000 datagrams of 1,000
    // bytes, about 20 rekeys' worth at 100 kB each.
    let sender = [
        "import socket, time",
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        "for i in range(2000):",
        "    s.sendto(i.to_bytes(4, 'big') + bytes(996), ('192.168.2.20', 9))",
        "    if i % 50 == 49: time.sleep(0.1)",
    ]
    .join("\n");
    netns::output(HOST_A, &["python3", "-c", &sender]);
    // The last packets counted, then two scrapes at least.
    std::thread::sleep(Duration::from_secs(4));

    let gw = stats(&sockets[0]).expect("gwA's stats");
    let encapsulated = gw["encapsulated"].as_u64().expect("encapsulated");
    let rekeys = gw["tunnels"][0]["rekeys"].as_u64().unwrap_or(0);
    assert!(encapsulated >= 2000, "{encapsulated} packets encapsulated");
    assert!(rekeys >= 5, "only {rekeys} rekeys: {:#}", gw["tunnels"]);
    let scraped = wait_for("the last count in Prometheus", Duration::from_secs(20), || {
        query("espgw_tunnel_packets_total{tunnel=\"a-b\",direction=\"out\"}")
            .filter(|n| (*n as u64).abs_diff(encapsulated) <= 1)
    });
    eprintln!(
        "Prometheus: {scraped} packets out on tunnel a-b; gwA encapsulated {encapsulated}, {rekeys} rekeys"
    );
    let resets = query("resets(espgw_tunnel_packets_total{tunnel=\"a-b\",direction=\"out\"}[10m])");
    assert_eq!(
        resets,
        Some(0.0),
        "the tunnel's counter went back across the rekeys"
    );
    let prom_rekeys = query("espgw_tunnel_rekeys_total{tunnel=\"a-b\"}").unwrap_or(0.0);
    assert!(prom_rekeys >= 5.0, "{prom_rekeys} rekeys in Prometheus");
    // Each SA's own series starts over: several SAs came and went.
    let series =
        query("count(count_over_time(espgw_sa_packets_total{tunnel=\"a-b\",direction=\"out\"}[10m]))")
            .unwrap_or(0.0);
    assert!(series >= 3.0, "{series} outbound SAs seen");

    let exposition = get(GW_A, &format!("http://{METRICS}/metrics"));
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    std::io::Write::write_all(&mut check.stdin.take().expect("stdin"), exposition.as_bytes()).unwrap();
    let checked = check.wait_with_output().expect("promtool");
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(
        !exposition.contains("secret") && !exposition.contains("demo secret"),
        "no secret in the metrics"
    );
    drop(lab);
}
