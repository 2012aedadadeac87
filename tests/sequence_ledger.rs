//! Static keys across restarts, offline (`espgw pcap`): with a state
//! directory no (SPI, sequence number) is sent twice under one key, and a
//! restarted receiver refuses what it accepted before while taking what
//! the restarted sender sends, and after a clean stop a receiver restarted
//! alone takes what its sender sends next; without one, AEAD proposals with static
//! keys are refused, saying why and what to do.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use pcap_file::DataLink;

mod common;

use common::{espgw, ethernet, json_file, pcap_command, read_pcap, repo, succeeded, write_pcap};

/// `count` UDP packets from behind site A, as Ethernet frames to site A's
/// inside; `seed` makes each capture's plaintext its own.
fn plaintext(count: usize, seed: u8) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            ethernet(&common::udp_packet(
                common::HOST_A,
                common::HOST_B,
                100 + i,
                seed.wrapping_add(i as u8),
            ))
        })
        .collect()
}

/// (SPI, sequence number) of each ESP frame (Ethernet, IPv4 without
/// options, raw ESP).
fn esp_numbers(frames: &[Vec<u8>]) -> Vec<(u32, u32)> {
    frames
        .iter()
        .map(|f| {
            assert_eq!(f[14 + 9], 50, "ESP");
            let esp = &f[14 + 20..];
            (
                u32::from_be_bytes(esp[0..4].try_into().unwrap()),
                u32::from_be_bytes(esp[4..8].try_into().unwrap()),
            )
        })
        .collect()
}

fn pcap(
    config: &Path,
    from: &str,
    state: Option<&Path>,
    input: &Path,
    output: &Path,
    extra: &[&str],
) -> Output {
    let mut command = pcap_command(config, from, input, output);
    command.args(extra);
    if let Some(state) = state {
        command.arg("--state-dir").arg(state);
    }
    command.output().unwrap()
}

/// Site B's run over `esp` from the outside with `state`, its output and
/// counters under `dir` named `run`; returns the counters.
fn receive(site_b: &Path, state: &Path, esp: &Path, dir: &Path, run: &str) -> serde_json::Value {
    let counters = dir.join(format!("{run}.json"));
    succeeded(pcap(
        site_b,
        "outside",
        Some(state),
        esp,
        &dir.join(format!("{run}.pcap")),
        &["--stats", counters.to_str().unwrap()],
    ));
    json_file(&counters)
}

/// Two runs of one config over different plaintexts, one state directory:
/// no (SPI, sequence number), and so no (key, nonce) of an AEAD, twice.
/// Without the ledger both runs sent 1, 2, 3, ... under the same key, and
/// the XOR of the two captures' ciphertexts was that of their plaintexts.
#[test]
fn two_runs_of_one_config_never_send_a_sequence_number_twice() {
    let dir = common::Scratch::new("espgw-ledger", "twice");
    for config in [
        "configs/site-a.toml",
        "configs/algorithms/chacha20poly1305-a.toml",
    ] {
        let state = common::fresh_state_dir(&dir, "state");
        let mut seen: HashSet<(u32, u32)> = HashSet::new();
        let mut last_top = 0;
        for run in 0..3u8 {
            let (input, esp) = (
                dir.join(format!("in{run}.pcap")),
                dir.join(format!("esp{run}.pcap")),
            );
            write_pcap(&input, DataLink::ETHERNET, &plaintext(30, run * 50));
            succeeded(pcap(&repo(config), "inside", Some(&state), &input, &esp, &[]));
            let numbers = esp_numbers(&read_pcap(&esp).1);
            assert_eq!(numbers.len(), 30, "{config} run {run}");
            for pair in &numbers {
                assert!(
                    seen.insert(*pair),
                    "{config} run {run}: {pair:x?} was sent before"
                );
            }
            // Each run resumes above everything the one before could send.
            let first = numbers.iter().map(|n| n.1).min().unwrap();
            assert!(
                first > last_top,
                "{config} run {run} starts at {first}, after {last_top}"
            );
            last_top = numbers.iter().map(|n| n.1).max().unwrap();
        }
    }
}

/// The receiving side restarted (a second `pcap` run with its state
/// directory) over what it accepted before followed by what the restarted
/// sender sent: the old ESP is refused as a replay, the new is delivered,
/// all of it, though the sender's packets before it were lost on the way
/// and it lies beyond the receiver's first reservation (it waits for the
/// next, in line).
#[test]
fn a_restarted_receiver_refuses_the_old_capture_and_takes_the_new() {
    // The receiver is given the last 25 of them: more than its first
    // reservation (`ike_stub::ledger::IN_FLOOR`, 64) beyond its mark.
    const SENT: usize = 200;
    let dir = common::Scratch::new("espgw-ledger", "receiver");
    let (state_a, state_b) = (
        common::fresh_state_dir(&dir, "state-a"),
        common::fresh_state_dir(&dir, "state-b"),
    );
    let (site_a, site_b) = (repo("configs/site-a.toml"), repo("configs/site-b.toml"));
    let (in1, in2) = (dir.join("in1.pcap"), dir.join("in2.pcap"));
    write_pcap(&in1, DataLink::ETHERNET, &plaintext(25, 1));
    write_pcap(&in2, DataLink::ETHERNET, &plaintext(SENT, 101));
    let (esp1, esp2) = (dir.join("esp1.pcap"), dir.join("esp2.pcap"));
    succeeded(pcap(&site_a, "inside", Some(&state_a), &in1, &esp1, &[]));
    let b1 = receive(&site_b, &state_b, &esp1, &dir, "b1");
    assert_eq!(b1["decapsulated"], 25);
    // Both ends restart; the attacker replays the first capture ahead of
    // the sender's new packets.
    succeeded(pcap(&site_a, "inside", Some(&state_a), &in2, &esp2, &[]));
    let mut replayed = read_pcap(&esp1).1;
    replayed.extend(read_pcap(&esp2).1.split_off(SENT - 25));
    let mixed = dir.join("mixed.pcap");
    write_pcap(&mixed, DataLink::ETHERNET, &replayed);
    let (s2, v2) = (dir.join("b2.json"), dir.join("b2.jsonl"));
    succeeded(pcap(
        &site_b,
        "outside",
        Some(&state_b),
        &mixed,
        &dir.join("out2.pcap"),
        &[
            "--stats",
            s2.to_str().unwrap(),
            "--verdicts",
            v2.to_str().unwrap(),
        ],
    ));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&v2)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 50);
    for (i, line) in lines.iter().enumerate() {
        if i < 25 {
            let reason = line["reason"].as_str().unwrap_or("");
            assert!(
                line["verdict"] == "dropped" && reason.starts_with("replay_"),
                "replayed frame {i} was not refused: {line}"
            );
        } else {
            assert_eq!(line["verdict"], "forwarded", "the sender's new frame {i}: {line}");
        }
    }
    let b2 = json_file(&s2);
    assert_eq!(b2["decapsulated"], 25, "{b2:#}");
    assert_eq!(b2["drops"]["seq_not_reserved"], 0, "{b2:#}");
    assert!(
        b2["seq_awaited"].as_u64().unwrap() > 0,
        "the sender's packets lay beyond the receiver's first reservation: {b2:#}"
    );
    // And once more, after another restart: all of it is old now.
    let b3 = receive(&site_b, &state_b, &mixed, &dir, "b3");
    assert_eq!(b3["decapsulated"], 0, "{b3:#}");
}

/// The receiver alone restarted, its sender going on (a peer that did
/// not restart, as an IKE daemon's peer does not when espgw restarts
/// under it): after a clean stop the receiver resumes exactly where it
/// stopped, so it takes every packet its sender sends next and still
/// refuses the ones it took before. It used to resume at its
/// reservation's end and refuse the sender's next packets up to there as
/// replays.
#[test]
fn a_receiver_restarted_alone_after_a_clean_stop_takes_what_its_sender_sends_next() {
    let dir = common::Scratch::new("espgw-ledger", "alone");
    let (state_a, state_b) = (
        common::fresh_state_dir(&dir, "state-a"),
        common::fresh_state_dir(&dir, "state-b"),
    );
    let (site_a, site_b) = (repo("configs/site-a.toml"), repo("configs/site-b.toml"));
    let input = dir.join("in.pcap");
    write_pcap(&input, DataLink::ETHERNET, &plaintext(50, 1));
    let esp = dir.join("esp.pcap");
    succeeded(pcap(&site_a, "inside", Some(&state_a), &input, &esp, &[]));
    let frames = read_pcap(&esp).1;
    assert_eq!(frames.len(), 50);
    let (before, after) = frames.split_at(25);
    let (esp1, esp2) = (dir.join("esp1.pcap"), dir.join("esp2.pcap"));
    write_pcap(&esp1, DataLink::ETHERNET, before);
    // The receiver's second run also meets a replay of what it took in
    // its first.
    let mut second: Vec<Vec<u8>> = before[20..].to_vec();
    second.extend_from_slice(after);
    write_pcap(&esp2, DataLink::ETHERNET, &second);
    let b1 = receive(&site_b, &state_b, &esp1, &dir, "b1");
    assert_eq!(b1["decapsulated"], 25);
    let ledger = std::fs::read_to_string(state_b.join("ledger")).unwrap();
    assert!(
        ledger.contains("\nsettled\n"),
        "a clean stop settles the ledger: {ledger}"
    );
    let b2 = receive(&site_b, &state_b, &esp2, &dir, "b2");
    assert_eq!(
        b2["decapsulated"], 25,
        "after a clean stop the receiver takes all its sender sends next: {b2:#}"
    );
    let drops = &b2["drops"];
    let replays =
        drops["replay_duplicate"].as_u64().unwrap_or(0) + drops["replay_too_old"].as_u64().unwrap_or(0);
    assert_eq!(replays, 5, "only the 5 replayed packets are refused: {b2:#}");
}

/// Site A's config with devices that do not exist, so that a build that
/// got past the check could not touch this host's interfaces.
fn nowhere_config(dir: &Path, shipped: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo(shipped))
        .unwrap()
        .replace("device = \"eth0\"", "device = \"espgw-none0\"")
        .replace("device = \"eth1\"", "device = \"espgw-none1\"");
    let path = dir.join("gw.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    path
}

/// Without a state directory `run` and `pcap` refuse an AEAD proposal with
/// static keys, naming the file, the SA, why and the fix; systemd's
/// `$STATE_DIRECTORY` counts as one; a CBC proposal starts with a warning.
#[test]
fn without_a_state_directory_aead_static_keys_are_refused() {
    let dir = common::Scratch::new("espgw-ledger", "refused");
    let config = nowhere_config(&dir, "configs/site-a.toml");
    let input = dir.join("in.pcap");
    write_pcap(&input, DataLink::ETHERNET, &plaintext(3, 7));
    let run = espgw()
        .args(["run", "--config"])
        .arg(&config)
        .arg("--control")
        .arg(dir.join("gw.sock"))
        .output()
        .unwrap();
    let pcap_run = pcap(&config, "inside", None, &input, &dir.join("esp.pcap"), &[]);
    for (command, out) in [("run", run), ("pcap", pcap_run)] {
        assert!(!out.status.success(), "{command} started");
        let err = String::from_utf8_lossy(&out.stderr);
        let needles = [
            format!(
                "{}: SA `a-b-out` has a static key (aes128gcm16)",
                config.display()
            ),
            format!("`espgw {command}` has no state directory"),
            "RFC 4106".into(),
            "RFC 8221".into(),
            "state_dir".into(),
            "--state-dir".into(),
            "$STATE_DIRECTORY".into(),
            "give the tunnel a `secret`".into(),
        ];
        for needle in needles {
            assert!(err.contains(&needle), "{command}: `{needle}` missing from: {err}");
        }
    }
    // systemd's StateDirectory= is a state directory.
    let systemd = dir.join("systemd-state");
    let out = espgw()
        .args(["pcap", "--config"])
        .arg(&config)
        .args(["--from", "inside", "--in"])
        .arg(&input)
        .arg("--out")
        .arg(dir.join("esp.pcap"))
        .env("STATE_DIRECTORY", &systemd)
        .output()
        .unwrap();
    succeeded(out);
    assert!(systemd.join("ledger").exists());
    // CBC with HMAC: no nonce to repeat, but replays: a warning.
    let cbc = nowhere_config(&dir, "configs/algorithms/aes128-sha1-a.toml");
    let err = succeeded(pcap(&cbc, "inside", None, &input, &dir.join("cbc.pcap"), &[]));
    assert!(
        err.contains("have static keys and there is no state directory") && err.contains("replay windows"),
        "{err}"
    );
}
