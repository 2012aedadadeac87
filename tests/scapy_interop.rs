//! Interop with an independent ESP implementation: runs
//! `tests/interop/scapy_interop.py`, which drives the `espgw` binary with
//! captures built and checked by scapy's `SecurityAssociation`: both
//! directions and negative cases for each proposal in tunnel and transport
//! mode, with ESN, with UDP encapsulation (RFC 3948), with IPv6 inner
//! packets over IPv4 tunnels (6-in-4: selectors, packet-too-big), and over
//! tunnels with IPv6 ends (4-in-6 and 6-in-6: the outer IPv6 header,
//! selectors, fragmentation-needed / packet-too-big, extension headers and
//! outer fragments), and in IPv6 transport mode (RFC 4303 §3.1.1: where ESP
//! goes among hop-by-hop, destination options and routing headers, both
//! ways; selectors; packet-too-big; fragments and next header 59 refused).
//! The script's docstring lists the cases.
//!
//! Needs `python3` with scapy (and `cryptography`). Without scapy the test
//! shows as `ignored (needs scapy: ...)`; under `CI=true` it fails unless
//! `ESPGW_SKIPS` names the skip (testkit). The script's output is shown when
//! the test fails.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use testkit::Prerequisite;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/scapy_interop.py");

static SCAPY: Prerequisite = Prerequisite::new("scapy", || {
    let found = Command::new("python3")
        .args(["-c", "import scapy, cryptography"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        Ok(())
    } else {
        Err("`python3 -c \"import scapy, cryptography\"` failed; pip install scapy cryptography".into())
    }
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(&SCAPY, scapy_interop)])
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

/// Collects the lines of `pipe`. testkit's harness does not capture output,
/// so they are kept for the failure message rather than printed as they come.
fn collect_lines(pipe: impl Read + Send + 'static) -> thread::JoinHandle<Vec<String>> {
    thread::spawn(move || BufReader::new(pipe).lines().map_while(Result::ok).collect())
}

fn scapy_interop() {
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
    let stdout = collect_lines(child.stdout.take().expect("stdout is piped"));
    let stderr = collect_lines(child.stderr.take().expect("stderr is piped"));
    let status = child.wait().expect("cannot wait for python3");
    let lines = stdout.join().expect("stdout reader panicked");
    let errors = stderr.join().expect("stderr reader panicked");

    let summary = lines.last().map_or("(no output)", String::as_str);
    let output = || {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            lines.join("\n"),
            errors.join("\n")
        )
    };
    assert!(
        status.success(),
        "{SCRIPT} exited with {status}; {summary}\n{}",
        output()
    );
    assert!(
        summary.ends_with(" passed, 0 failed"),
        "unexpected summary line: {summary}\n{}",
        output()
    );
}
