//! Shared helpers for the tests of the `espgw` binary: the binary itself
//! (in a namespace too, and waiting for its `run` to forward), the
//! repository's files, captures, server processes, scratch and state
//! directories; and, re-exported, the in-memory gateway helpers and packet
//! builder of the library tests (`lib-tests/tests/common`), whose keys and
//! addresses these tests share.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::DataLink;

#[path = "../../lib-tests/tests/common/mod.rs"]
mod gateways;
// Not every test of the binary builds packets or gateways.
#[allow(unused_imports)]
pub use gateways::*;

/// The `espgw` binary under test, with only the state directory a test
/// gives it (not one systemd would).
pub fn espgw() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_espgw"));
    command.env_remove("STATE_DIRECTORY");
    command
}

/// [`espgw`] in network namespace `ns` (`ip netns exec` execs it, so the
/// child's pid is espgw's), its log without colours.
pub fn espgw_in(ns: &str) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_espgw")])
        .env("NO_COLOR", "1")
        .env_remove("STATE_DIRECTORY");
    command
}

/// Waits until `espgw run` says in `log` that it forwards; fails the test
/// if `gateway` exits first or 20 seconds pass.
pub fn wait_forwarding(gateway: &mut Child, log: &Path) {
    let read = || std::fs::read_to_string(log).unwrap_or_default();
    let started = Instant::now();
    while !read().contains("forwarding") {
        if let Ok(Some(status)) = gateway.try_wait() {
            panic!("espgw run exited ({status}):\n{}", read());
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "espgw run did not start:\n{}",
            read()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `espgw WHAT --socket SOCKET --json`'s answer, parsed; `None` until the
/// gateway answers.
pub fn ask(socket: &Path, what: &[&str]) -> Option<serde_json::Value> {
    let out = espgw()
        .args(what)
        .arg("--socket")
        .arg(socket)
        .arg("--json")
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// `path` in the repository (a shipped configuration, a script).
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `espgw pcap --config CONFIG --from FROM --in INPUT --out OUTPUT`, for
/// the caller to add its options to.
pub fn pcap_command(config: &Path, from: &str, input: &Path, output: &Path) -> Command {
    let mut command = espgw();
    command
        .args(["pcap", "--config"])
        .arg(config)
        .args(["--from", from, "--in"])
        .arg(input)
        .arg("--out")
        .arg(output);
    command
}

/// The standard error of a command that must have succeeded (the test
/// fails with it otherwise).
pub fn succeeded(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}: {stderr}", out.status);
    stderr
}

/// `packet` in an Ethernet frame from the inside host to site A's inside
/// interface (the MACs the shipped site-a.toml expects).
pub fn ethernet(packet: &[u8]) -> Vec<u8> {
    let mut frame = vec![0x02, 0, 0, 0, 0x01, 0x01, 0x02, 0, 0, 0, 0x01, 0x10, 0x08, 0x00];
    frame.extend_from_slice(packet);
    frame
}

/// A JSON file's value (a `--stats` file, a report).
pub fn json_file(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()))
}

/// A capture of `frames` with link type `datalink`, a millisecond apart.
pub fn write_pcap(path: &Path, datalink: DataLink, frames: &[Vec<u8>]) {
    let stamps: Vec<Duration> = (0..frames.len())
        .map(|i| Duration::from_millis(i as u64))
        .collect();
    write_pcap_at(path, datalink, frames, &stamps);
}

/// A capture of `frames` with link type `datalink`, each at its stamp.
pub fn write_pcap_at(path: &Path, datalink: DataLink, frames: &[Vec<u8>], stamps: &[Duration]) {
    let file = std::fs::File::create(path).unwrap();
    let header = PcapHeader {
        datalink,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(file, header).unwrap();
    for (frame, stamp) in frames.iter().zip(stamps) {
        let packet = PcapPacket::new(*stamp, frame.len() as u32, frame);
        writer.write_packet(&packet).unwrap();
    }
}

/// A capture's link type and frames.
pub fn read_pcap(path: &Path) -> (DataLink, Vec<Vec<u8>>) {
    let mut reader = PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let datalink = reader.header().datalink;
    let mut frames = Vec::new();
    while let Some(packet) = reader.next_packet() {
        frames.push(packet.unwrap().data.into_owned());
    }
    (datalink, frames)
}

/// Spawns `command`, whose program may be a copy just written: while
/// another test's thread forks, its child holds the copy's descriptor
/// open for writing until it execs, and executing the copy meanwhile fails
/// with `ETXTBSY`. That passes in moments; it is tried again, a second at
/// most.
pub fn spawn_fresh_copy(command: &mut Command) -> Child {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match command.spawn() {
            Ok(child) => return child,
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("{command:?}: {e}"),
        }
    }
}

/// A server process (`espgw engine serve`), stopped with SIGTERM and
/// reaped when dropped.
pub struct Serve(pub Child);

impl Serve {
    /// Spawns `command` and waits, ten seconds at most, for it to bind
    /// `socket`.
    pub fn start(mut command: Command, socket: &Path) -> Serve {
        let server = Serve(spawn_fresh_copy(&mut command));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "the server did not bind {}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    /// Sends the server `signal`.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, by its pid.
        assert_eq!(unsafe { libc::kill(self.0.id() as libc::pid_t, signal) }, 0);
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, by its pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// A test's scratch directory, removed with everything in it when the
/// test is done with it (a failing test's stays for a look).
pub struct Scratch(std::path::PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A state directory of its own for one `espgw run` or `espgw pcap`
/// (where SAs with static keys keep their sequence numbers): `DIR/NAME`,
/// removed first, so that each run starts as a first one.
pub fn fresh_state_dir(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let _ = std::fs::remove_dir_all(&path);
    path
}

impl Scratch {
    /// `$TMPDIR/PREFIX-PID-NAME`, made afresh.
    pub fn new(prefix: &str, name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}
