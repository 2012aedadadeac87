//! The `espgw` command line: check-config and the offline pcap mode, run as
//! a user would run them.

use std::path::Path;
use std::time::Duration;

use pcap_file::DataLink;
use serde::Deserialize;

mod common;

use common::{
    espgw, ethernet, json_file as stats, pcap_command, read_pcap, repo, succeeded, write_pcap, write_pcap_at,
};

fn temp_dir(name: &str) -> common::Scratch {
    common::Scratch::new("espgw-cli", name)
}

/// `espgw pcap`, with a state directory of its own beside `output`.
fn run_pcap(config: &Path, from: &str, input: &Path, output: &Path, stats: &Path) {
    let state = common::fresh_state_dir(output.parent().unwrap(), "state");
    succeeded(
        pcap_command(config, from, input, output)
            .arg("--state-dir")
            .arg(&state)
            .arg("--stats")
            .arg(stats)
            .output()
            .unwrap(),
    );
}

#[test]
fn check_config_accepts_good_and_names_the_spot_of_bad() {
    let ok = espgw()
        .arg("check-config")
        .arg(repo("configs/site-a.toml"))
        .output()
        .unwrap();
    assert!(ok.status.success());
    let summary = String::from_utf8_lossy(&ok.stdout);
    assert!(
        summary.contains("OK (site-a)") && summary.contains("a-b-out"),
        "{summary}"
    );
    assert!(!summary.contains("000102030405"), "keys must never be printed");

    let dir = temp_dir("check");
    let bad = dir.join("bad.toml");
    let text = std::fs::read_to_string(repo("configs/site-a.toml"))
        .unwrap()
        .replace("proposal = \"aes128gcm16\"", "proposal = \"aes128gcm8\"");
    std::fs::write(&bad, &text).unwrap();
    let line = text.lines().position(|l| l.contains("aes128gcm8")).unwrap() + 1;
    let out = espgw().arg("check-config").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("bad.toml:{line}:12: unknown ESP proposal `aes128gcm8`")),
        "{err}"
    );
}

/// An inbound `[[sa]]` that no policy names: `check-config` refuses it at
/// its line and says how to fix it; with `selectors = "any"` it passes,
/// with a warning, and the summary says which SA admits everything.
#[test]
fn check_config_on_inbound_sas_without_policies() {
    let dir = temp_dir("unselected");
    let path = dir.join("gw.toml");
    let site = std::fs::read_to_string(repo("configs/site-b.toml")).unwrap();
    let head = &site[..site.find("[[tunnel]]").expect("site-b has a tunnel")];
    let sa = ike_stub::builder::ConfigBuilder::new().sa(ike_stub::builder::SaBuilder {
        enc_key: Some(ike_stub::builder::pattern_key(20, 1, 0)),
        ..ike_stub::builder::SaBuilder::new(
            "m-in",
            spd_sad::SaDirection::Inbound,
            0x1001,
            (
                std::net::Ipv4Addr::new(10, 0, 0, 2),
                std::net::Ipv4Addr::new(10, 0, 0, 1),
            ),
            accel::Algorithm::Aes128Gcm16,
        )
    });
    let text = format!("{head}\n{}", sa.to_toml());
    std::fs::write(&path, &text).unwrap();
    let line = text.lines().position(|l| l == "name = \"m-in\"").unwrap() + 1;
    let out = espgw().arg("check-config").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "gw.toml:{line}:8: inbound SA `m-in` is named by no inbound `protect` policy"
        )) && err.contains("selectors = \"any\""),
        "{err}"
    );

    std::fs::write(&path, format!("{text}selectors = \"any\"\n")).unwrap();
    let out = espgw().arg("check-config").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning:")
            && err.contains("inbound SA `m-in` has selectors = \"any\": it admits every inner packet"),
        "{err}"
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains("m-in") && summary.contains("admits ANY inner packet"),
        "{summary}"
    );
    assert!(
        summary.contains("except that m-in admits every inner packet (selectors = \"any\")"),
        "{summary}"
    );
    assert!(!summary.contains("unmatched traffic is discarded"), "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every shipped algorithm pair: site A encapsulates a capture from its
/// inside, site B decapsulates A's output; B's output is the input, two hops on.
#[test]
fn pcap_round_trip_through_every_shipped_pair() {
    let dir = temp_dir("pairs");
    let packets: Vec<Vec<u8>> = [0usize, 1, 17, 100, 600, 1400]
        .iter()
        .enumerate()
        .map(|(i, &n)| common::udp_packet(common::HOST_A, common::HOST_B, n, i as u8))
        .collect();
    let input = dir.join("in.pcap");
    write_pcap(
        &input,
        DataLink::ETHERNET,
        &packets.iter().map(|p| ethernet(p)).collect::<Vec<_>>(),
    );
    for alg in accel::Algorithm::ALL {
        let (esp, out) = (
            dir.join(format!("{alg}-esp.pcap")),
            dir.join(format!("{alg}-out.pcap")),
        );
        let (stats_a, stats_b) = (
            dir.join(format!("{alg}-a.json")),
            dir.join(format!("{alg}-b.json")),
        );
        run_pcap(
            &repo(&format!("configs/algorithms/{alg}-a.toml")),
            "inside",
            &input,
            &esp,
            &stats_a,
        );
        run_pcap(
            &repo(&format!("configs/algorithms/{alg}-b.toml")),
            "outside",
            &esp,
            &out,
            &stats_b,
        );
        let (link, wire) = read_pcap(&esp);
        assert_eq!(link, DataLink::ETHERNET);
        for frame in &wire {
            assert_eq!(
                &frame[..6],
                &[0x02, 0, 0, 0, 0, 0x02],
                "{alg}: next hop MAC from the neighbour table"
            );
            assert_eq!(frame[14 + 9], 50, "{alg}: only ESP on the outside");
        }
        let (_, delivered) = read_pcap(&out);
        assert_eq!(delivered.len(), packets.len(), "{alg}");
        for (got, sent) in delivered.iter().zip(&packets) {
            assert_eq!(&got[14..], &common::after_hops(sent, 2)[..], "{alg}");
            assert_eq!(
                &got[..6],
                &[0x02, 0, 0, 0, 0x02, 0x20],
                "{alg}: host MAC from the neighbour table"
            );
        }
        let a = stats(&stats_a);
        let b = stats(&stats_b);
        assert_eq!(a["encapsulated"], 6, "{alg}");
        assert_eq!(b["decapsulated"], 6, "{alg}");
        assert_eq!(b["tx_packets"], 6);
        // Typed: a renamed counter fails to parse rather than reading 0.
        let counters = dataplane::Stats::deserialize(&b).expect("gwB's stats");
        for (reason, n) in counters.drops.iter() {
            assert_eq!(n, 0, "{alg}: drops.{}", reason.name());
        }
        let sa_in = b["sas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["direction"] == "in")
            .unwrap();
        assert_eq!(sa_in["packets"], 6);
        assert_eq!(sa_in["proposal"], alg.keyword());
    }
}

#[test]
fn raw_ipv4_captures_keep_their_linktype() {
    let dir = temp_dir("raw");
    let packets = vec![common::udp_packet(common::HOST_A, common::HOST_B, 33, 1)];
    for datalink in [DataLink::RAW, DataLink::IPV4] {
        let input = dir.join("in.pcap");
        write_pcap(&input, datalink, &packets);
        let (esp, out, s) = (dir.join("esp.pcap"), dir.join("out.pcap"), dir.join("s.json"));
        run_pcap(&repo("configs/site-a.toml"), "inside", &input, &esp, &s);
        run_pcap(&repo("configs/site-b.toml"), "outside", &esp, &out, &s);
        let (link, frames) = read_pcap(&out);
        assert_eq!(link, datalink);
        assert_eq!(frames, vec![common::after_hops(&packets[0], 2)]);
    }
}

#[test]
fn garbage_frames_are_counted_not_fatal() {
    let dir = temp_dir("garbage");
    let mut frames: Vec<Vec<u8>> = vec![vec![], vec![0xff; 5], vec![0x45; 60], ethernet(&[0x60; 40])];
    frames.push(vec![0u8; 9000]);
    frames.push(ethernet(&common::udp_packet(
        common::HOST_A,
        common::HOST_B,
        10,
        0,
    )));
    let input = dir.join("in.pcap");
    write_pcap(&input, DataLink::ETHERNET, &frames);
    let (out, s) = (dir.join("out.pcap"), dir.join("s.json"));
    run_pcap(&repo("configs/site-a.toml"), "inside", &input, &out, &s);
    let stats = stats(&s);
    assert_eq!(stats["rx_packets"], 6);
    assert_eq!(stats["tx_packets"], 1);
    // Empty, 5 bytes and 9000 bytes are malformed; EtherType 0x4545 and an
    // IPv6 packet are not IPv4.
    assert_eq!(stats["drops"]["malformed"], 3);
    assert_eq!(stats["drops"]["unsupported"], 2);
}

/// `--verdicts FILE` (or `-`, standard output): a JSON line per frame,
/// whose reasons are the `--stats` drop counters.
#[test]
fn pcap_verdicts_give_a_line_per_frame() {
    let dir = temp_dir("verdicts");
    let frames = vec![
        ethernet(&common::udp_packet(common::HOST_A, common::HOST_B, 10, 0)),
        vec![0xff; 5],
        ethernet(&common::udp_packet(common::HOST_A, common::HOST_B, 20, 1)),
        ethernet(&[0x60; 40]),
    ];
    let input = dir.join("in.pcap");
    write_pcap(&input, DataLink::ETHERNET, &frames);
    let (out, s, v) = (dir.join("out.pcap"), dir.join("s.json"), dir.join("v.jsonl"));
    for target in [v.to_str().unwrap(), "-"] {
        let result = pcap_command(&repo("configs/site-a.toml"), "inside", &input, &out)
            .arg("--state-dir")
            .arg(common::fresh_state_dir(&dir, "state"))
            .arg("--stats")
            .arg(&s)
            .args(["--verdicts", target])
            .output()
            .unwrap();
        assert!(
            result.status.success(),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
        let text = if target == "-" {
            String::from_utf8(result.stdout).unwrap()
        } else {
            std::fs::read_to_string(&v).unwrap()
        };
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), frames.len(), "{text}");
        let verdicts: Vec<(&str, &str)> = lines
            .iter()
            .map(|l| (l["verdict"].as_str().unwrap(), l["reason"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("forwarded", ""),
                ("dropped", "malformed"),
                ("forwarded", ""),
                ("dropped", "unsupported")
            ]
        );
        assert_eq!(lines[2]["sa"], "a-b-out");
        assert_eq!(lines[2]["seq"], 2);
        let stats = stats(&s);
        assert_eq!(stats["drops"]["malformed"], 1);
        assert_eq!(stats["drops"]["unsupported"], 1);
    }
}

#[test]
fn unsupported_linktype_is_a_clear_error() {
    let dir = temp_dir("linktype");
    let input = dir.join("in.pcap");
    write_pcap(&input, DataLink::LINUX_SLL, &[vec![0; 20]]);
    let out = pcap_command(
        &repo("configs/site-a.toml"),
        "inside",
        &input,
        &dir.join("out.pcap"),
    )
    .arg("--state-dir")
    .arg(common::fresh_state_dir(&dir, "state"))
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("linktype 1") && err.contains("101 and 228"), "{err}");
}

/// Lifetimes in seconds run on the capture's clock.
#[test]
fn second_lifetimes_follow_capture_timestamps() {
    let dir = temp_dir("lifetime");
    let config = dir.join("short.toml");
    let text = std::fs::read_to_string(repo("configs/site-a.toml"))
        .unwrap()
        .replace("soft_seconds = 3000", "soft_seconds = 1")
        .replace("hard_seconds = 3600", "hard_seconds = 2");
    std::fs::write(&config, text).unwrap();
    let packet = ethernet(&common::udp_packet(common::HOST_A, common::HOST_B, 10, 0));
    let stamps = [1000, 1500, 2600, 3100].map(Duration::from_millis);
    let input = dir.join("in.pcap");
    write_pcap_at(&input, DataLink::ETHERNET, &vec![packet; 4], &stamps);
    let (out, s) = (dir.join("out.pcap"), dir.join("s.json"));
    run_pcap(&config, "inside", &input, &out, &s);
    let stats = stats(&s);
    // 0, 0.5 and 1.6 s after the first frame: sent (soft limit passed at
    // 1 s); 2.1 s: past the 2 s hard limit.
    assert_eq!(stats["encapsulated"], 3);
    assert_eq!(stats["drops"]["sa_expired"], 1);
    let sa_out = stats["sas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["direction"] == "out")
        .unwrap();
    assert_eq!(sa_out["state"], "hardexpired");
}

/// Keys and secrets stay in the config file: not in summaries, errors,
/// stats, logs or `Debug` output. A config whose keys others can read is
/// warned about.
#[test]
fn keys_never_leave_the_config() {
    use std::os::unix::fs::PermissionsExt;
    let secret = "SECRET-MARKER-0123456789abcdef";
    let alg = accel::Algorithm::Aes128Sha1;
    // A tunnel keyed by hand, whose keys the test knows, beside one keyed
    // by exchange from a secret (offline `pcap` takes only the first).
    let keyed = common::tunnel_edited(alg, "tunnel", false, true, |_| {});
    let text = keyed
        .clone()
        .tunnel(
            ike_stub::builder::TunnelBuilder::new(
                "s",
                (
                    std::net::Ipv4Addr::new(10, 0, 0, 1),
                    std::net::Ipv4Addr::new(10, 0, 0, 3),
                ),
                alg,
                (0x3001, 0x3002),
            )
            .subnets(
                "192.168.1.0/24".parse::<spd_sad::Ipv4Prefix>().unwrap(),
                "192.168.9.0/24".parse::<spd_sad::Ipv4Prefix>().unwrap(),
            )
            .secret(secret),
        )
        .to_toml();
    let mut hidden: Vec<String> = vec![secret.to_owned()];
    for (len, seed) in [(16, 1), (16, 2), (20, 101), (20, 102)] {
        hidden.push(common::key_hex(len, seed));
    }
    for key in &hidden[1..] {
        assert!(text.contains(key.as_str()), "the test knows the config's keys");
    }
    let leaks = |what: &str, output: &str| {
        for h in &hidden {
            assert!(
                !output.to_lowercase().contains(&h.to_lowercase()),
                "{what} shows key material {h}:\n{output}"
            );
        }
    };
    let dir = temp_dir("secrets");
    let config = dir.join("gw.toml");
    std::fs::write(&config, &text).unwrap();

    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = espgw().arg("check-config").arg(&config).output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("chmod 600"), "{stderr}");
    leaks(
        "check-config",
        &format!("{}{stderr}", String::from_utf8_lossy(&out.stdout)),
    );

    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = espgw().arg("check-config").arg(&config).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).is_empty(),
        "no warning for an owner-only file"
    );

    let parsed = ike_stub::Config::load(&config).unwrap();
    leaks("Debug of the config", &format!("{parsed:?}"));

    // A capture through the gateway, logging everything it logs.
    std::fs::write(&config, keyed.to_toml()).unwrap();
    let frames: Vec<Vec<u8>> = (0..20)
        .map(|i| ethernet(&common::udp_packet(common::HOST_A, common::HOST_B, 100, i)))
        .collect();
    let (input, output, stats_path) = (dir.join("in.pcap"), dir.join("out.pcap"), dir.join("stats.json"));
    write_pcap(&input, DataLink::ETHERNET, &frames);
    let out = pcap_command(&config, "inside", &input, &output)
        .env("RUST_LOG", "trace")
        .arg("--stats")
        .arg(&stats_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    leaks("pcap's output", &String::from_utf8_lossy(&out.stdout));
    leaks("pcap's logs", &String::from_utf8_lossy(&out.stderr));
    leaks("stats", &std::fs::read_to_string(&stats_path).unwrap());
    assert_eq!(stats(&stats_path)["encapsulated"], 20);

    // A key of the wrong length is refused without being quoted.
    let short = text.replace(&hidden[1], &hidden[1][..30]);
    std::fs::write(&config, &short).unwrap();
    let out = espgw().arg("check-config").arg(&config).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("must be 16 bytes"), "{stderr}");
    leaks("a key error", &stderr);
    assert!(!stderr.contains(&hidden[1][..30]), "{stderr}");
}
