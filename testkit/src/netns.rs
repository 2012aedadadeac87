//! Network namespaces and veth pairs for the tests that build a topology
//! of their own (root, iproute2): what every such test did by hand, from
//! the prerequisite it names to the lab that cleans up after it.
//! Owns nothing beyond the `ip` commands it runs and the processes and
//! directories a [`Lab`] is given; the topology's names are the caller's,
//! so that tests may run beside each other.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, ExitStatus, Stdio};

use crate::{root_and_tools, Prerequisite};

/// `netns`: root and `ip`, for a test that builds namespaces of its own.
pub static NETNS: Prerequisite = Prerequisite::new("netns", || {
    root_and_tools("network namespaces", &[("ip", "iproute2")])
});

/// `netns` for a test that also pings across its namespaces: root, `ip`
/// and `ping`.
pub static NETNS_PING: Prerequisite = Prerequisite::new("netns", || {
    root_and_tools(
        "network namespaces",
        &[("ip", "iproute2"), ("ping", "iputils-ping")],
    )
});

/// Runs `ip ARGS`, failing the test with what `ip` said if it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Deletes `namespaces` (those that exist; what is in them goes too).
pub fn remove(namespaces: &[&str]) {
    for ns in namespaces {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
}

/// Makes `namespaces` afresh (a leftover of an earlier run removed first),
/// each with its loopback up.
pub fn create(namespaces: &[&str]) {
    remove(namespaces);
    for ns in namespaces {
        ip(&["netns", "add", ns]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
}

/// A veth pair from `left` in `left_ns` to `right` in `right_ns`, both up.
pub fn veth(left: &str, left_ns: &str, right: &str, right_ns: &str) {
    ip(&[
        "link", "add", left, "netns", left_ns, "type", "veth", "peer", "name", right, "netns", right_ns,
    ]);
    ip(&["-n", left_ns, "link", "set", left, "up"]);
    ip(&["-n", right_ns, "link", "set", right, "up"]);
}

/// Moves the calling thread into namespace `ns` (its sockets are then
/// that namespace's); other threads stay where they are.
pub fn enter(ns: &str) {
    let file = File::open(format!("/var/run/netns/{ns}")).expect("namespace file");
    // SAFETY: setns on a namespace file we opened; affects only this thread.
    let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

/// Runs `argv` in namespace `ns` and returns its standard output, failing
/// the test if it fails.
pub fn output(ns: &str, argv: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(argv)
        .output()
        .expect("ip netns exec");
    assert!(
        out.status.success(),
        "{argv:?} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The topology the shipped `configs/demo-*.toml` expect, in namespaces
/// `[host_a, gw_a, gw_b, host_b]` (made afresh): hostA 192.168.1.10 on
/// `ha0` — `a-in` gwA `a-out` — `b-out` gwB `b-in` — `hb0` hostB
/// 192.168.2.20, each host routing through its gateway.
pub fn demo_topology([host_a, gw_a, gw_b, host_b]: [&str; 4]) {
    create(&[host_a, gw_a, gw_b, host_b]);
    veth("ha0", host_a, "a-in", gw_a);
    veth("a-out", gw_a, "b-out", gw_b);
    veth("b-in", gw_b, "hb0", host_b);
    ip(&["-n", host_a, "addr", "add", "192.168.1.10/24", "dev", "ha0"]);
    ip(&["-n", host_a, "route", "add", "default", "via", "192.168.1.1"]);
    ip(&["-n", host_b, "addr", "add", "192.168.2.20/24", "dev", "hb0"]);
    ip(&["-n", host_b, "route", "add", "default", "via", "192.168.2.1"]);
}

/// Stops `child` as a service manager does, SIGTERM (so that a gateway
/// writes its counters and settles its ledger), and reaps it.
pub fn stop(child: &mut Child) -> ExitStatus {
    sigterm(child);
    child.wait().expect("reaping a child")
}

fn sigterm(child: &Child) {
    // SAFETY: kill(2) on our own child, by its pid (`ip netns exec` execs
    // the command, so the pid is the command's).
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
}

/// What a namespace test leaves behind, gone when the test ends, passed or
/// not: its processes (killed), its namespaces and its directory (kept
/// when the test fails, for a look).
pub struct Lab {
    namespaces: Vec<String>,
    dir: std::path::PathBuf,
    /// Processes the test started in its namespaces: killed and reaped when the lab is dropped.
    pub children: Vec<std::process::Child>,
}

impl Lab {
    /// Takes charge of `namespaces` and of `dir`, which it makes afresh (a
    /// leftover of an earlier run removed first).
    pub fn new(namespaces: &[&str], dir: std::path::PathBuf) -> Lab {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the test's directory");
        Lab {
            namespaces: namespaces.iter().map(|&n| n.to_owned()).collect(),
            dir,
            children: Vec::new(),
        }
    }

    /// [`stop`]s every child, all signalled before any is waited for, and
    /// forgets them; their exit statuses in order.
    pub fn stop_all(&mut self) -> Vec<ExitStatus> {
        self.children.iter().for_each(sigterm);
        self.children
            .drain(..)
            .map(|mut child| child.wait().expect("reaping a child"))
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let names: Vec<&str> = self.namespaces.iter().map(String::as_str).collect();
        remove(&names);
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Calls `check` every 250 ms until it gives something, failing the test
/// after `within`.
pub fn wait_for<T>(what: &str, within: std::time::Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}
