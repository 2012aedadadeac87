//! Interop with an independent ESP implementation: runs
//! `tests/interop/scapy_interop.py`, which drives the `espgw` binary with
//! captures built and checked by scapy's `SecurityAssociation`.
//!
//! Needs `python3` with scapy (and `cryptography`). Without scapy the test
//! is skipped, except under `CI=true`, where it fails: CI must install it.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/scapy_interop.py");

fn scapy_available() -> bool {
    Command::new("python3")
        .args(["-c", "import scapy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("espgw-scapy-interop-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).expect("cannot create temp dir");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies each line of `pipe` to the test's output as it arrives
/// (captured by the test harness; shown with `--nocapture` or on failure).
fn forward_lines(pipe: impl Read + Send + 'static, to_stderr: bool) -> thread::JoinHandle<Vec<String>> {
    thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
            lines.push(line);
        }
        lines
    })
}

#[test]
fn scapy_interop() {
    if !scapy_available() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!(
                "scapy is not installed (`python3 -c \"import scapy\"` failed); CI must `pip install scapy`"
            );
        }
        eprintln!("skipped: scapy not installed; pip install scapy");
        return;
    }
    let workdir = TempDir::new();
    let mut child = Command::new("python3")
        .arg("-u")
        .arg(SCRIPT)
        .arg("--espgw")
        .arg(env!("CARGO_BIN_EXE_espgw"))
        .arg("--workdir")
        .arg(workdir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run python3");
    let stdout = forward_lines(child.stdout.take().expect("stdout is piped"), false);
    let stderr = forward_lines(child.stderr.take().expect("stderr is piped"), true);
    let status = child.wait().expect("cannot wait for python3");
    let lines = stdout.join().expect("stdout reader panicked");
    stderr.join().expect("stderr reader panicked");

    let failures: Vec<&String> = lines.iter().filter(|l| l.starts_with("FAIL")).collect();
    let summary = lines.last().map_or("(no output)", String::as_str);
    assert!(
        status.success(),
        "{SCRIPT} exited with {status}; {summary}\n{}",
        failures.iter().map(|l| l.as_str()).collect::<Vec<_>>().join("\n")
    );
    assert!(
        summary.ends_with(" passed, 0 failed"),
        "unexpected summary line: {summary}"
    );
}
