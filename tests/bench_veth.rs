//! `espgw bench --veth` with tiny durations (root, in CI): every row, the
//! kernel's forwarding, espgw without ESP and espgw's two tunnels, must come
//! out with nonzero TCP and UDP figures, and the espgw rows with cycles per
//! packet. Namespaces of
//! its own (`--veth-prefix ebt`), so that it may run beside tests/demo.rs
//! and tests/workers_netns.rs. Without root, `ip` or iperf3 the test shows
//! as ignored (testkit `netns`).

use std::process::Command;

use testkit::Prerequisite;

static NETNS: Prerequisite = Prerequisite::new("netns", || {
    testkit::root_and_tools(
        "network namespaces",
        &[("ip", "iproute2"), ("ping", "iputils-ping"), ("iperf3", "iperf3")],
    )
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(&NETNS, every_row_has_nonzero_figures)])
}

fn every_row_has_nonzero_figures() {
    let json = std::env::temp_dir().join(format!("espgw-bench-veth-test-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_espgw"))
        .args([
            "bench",
            "--veth",
            "--veth-prefix",
            "ebt",
            "--tcp-seconds",
            "1",
            "--udp-seconds",
            "1",
            "--tcp-runs",
            "1",
            "--udp-probes",
            "1",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("espgw bench --veth runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "{context}");
    for row in [
        "kernel forwarding",
        "espgw, no ESP",
        "no ESP / kernel",
        "in UDP / no ESP",
        "TCP x1 without ESP",
        "espgw aes128gcm16",
        "espgw / kernel",
        "in UDP 4500",
        "in UDP / kernel",
    ] {
        assert!(stdout.contains(row), "no `{row}` row: {context}");
    }
    let text = std::fs::read_to_string(&json).expect("the JSON report");
    let _ = std::fs::remove_file(&json);
    let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for row in ["kernel", "espgw_bypass", "espgw", "espgw_udp_encap"] {
        let r = &doc[row];
        for figure in [
            &r["tcp_x1_gbit_s"],
            &r["tcp_x4_gbit_s"],
            &r["udp_64"]["received_pps"],
            &r["udp_1400"]["received_pps"],
        ] {
            assert!(
                figure.as_f64().unwrap_or(0.0) > 0.0,
                "{row}: a zero figure in {text}\n{context}"
            );
        }
    }
    for row in ["espgw_bypass", "espgw", "espgw_udp_encap"] {
        for gateway in ["gwA", "gwB"] {
            let cycles = doc[row]["cycles_per_packet_64"][gateway].as_f64().unwrap_or(0.0);
            assert!(
                cycles > 0.0 && cycles.is_finite(),
                "{row} {gateway} cycles: {text}"
            );
        }
    }
    assert!(doc["kernel"]["cycles_per_packet_64"].is_null(), "{text}");
    for ns in ["ebt-hostA", "ebt-gwA", "ebt-gwB", "ebt-hostB"] {
        assert!(
            !std::path::Path::new(&format!("/var/run/netns/{ns}")).exists(),
            "{ns} left behind"
        );
    }
}
