//! `espgw engine serve` and who may reach it, as root (testkit: without
//! root these show as ignored, and fail under `CI=true` unless
//! `ESPGW_SKIPS` names `root`):
//! - `--user NAME` creates the socket with its final owner, group and mode
//!   (root, the user's group or `--group`'s, 0660) and keeps its
//!   descriptor: nothing is chowned by path, so a file swapped in at the
//!   path cannot be handed to the user;
//! - peers are admitted by the kernel's record of their credentials: the
//!   user, root and `--group`'s members; a peer that passes the socket's
//!   mode but is none of these is turned away and counted;
//! - the server cannot be dumped or read: another process of its own user
//!   cannot open its /proc files, and a crash leaves no core file (the
//!   review found nine copies of a tenant's key in one).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use testkit::Prerequisite;

mod common;

use common::Serve;

static ROOT: Prerequisite = Prerequisite::new("root", || {
    testkit::root_and_tools("switching to other users", &[])
});

fn main() -> std::process::ExitCode {
    testkit::run([
        testkit::needs!(
            &ROOT,
            user_gets_a_socket_made_for_it_and_peers_are_admitted_by_credentials
        ),
        testkit::needs!(&ROOT, group_members_are_admitted_and_others_cannot_connect),
        testkit::needs!(&ROOT, the_server_is_neither_readable_nor_dumped),
    ])
}

const NOBODY: u32 = 65534;
const NOGROUP: u32 = 65534;

/// A directory everyone may traverse, holding a copy of the binary that
/// other users can run.
fn scratch(name: &str) -> (common::Scratch, PathBuf) {
    let dir = common::Scratch::new("espgw-serve-user", name);
    std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("espgw");
    std::fs::copy(env!("CARGO_BIN_EXE_espgw"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, bin)
}

fn serve(bin: &Path, socket: &Path, extra: &[&str], as_user: Option<(u32, u32)>, cwd: &Path) -> Serve {
    let mut command = Command::new(bin);
    command
        .args(["engine", "serve", "--engine", "soft", "--socket"])
        .arg(socket)
        .args(extra)
        .current_dir(cwd);
    if let Some((uid, gid)) = as_user {
        command.uid(uid).gid(gid);
    }
    let server = Serve::start(command, socket);
    // Bound, then (with --user) switched: give it the moment it takes.
    std::thread::sleep(Duration::from_millis(100));
    server
}

fn stats_as(bin: &Path, socket: &Path, uid: u32, gid: u32) -> Output {
    Command::new(bin)
        .args(["engine", "stats", "--json", "--socket"])
        .arg(socket)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap()
}

fn stats(bin: &Path, socket: &Path) -> serde_json::Value {
    let out = stats_as(bin, socket, 0, 0);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn status_ids(pid: u32, field: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect()
}

fn user_gets_a_socket_made_for_it_and_peers_are_admitted_by_credentials() {
    let (dir, bin) = scratch("user");
    let socket = dir.join("engine.sock");
    let server = serve(&bin, &socket, &["--user", "nobody"], None, &dir);
    // Created as it stays: root's, the user's group, 0660; never chowned.
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (0, NOGROUP, 0o660),
        "the socket's owner, group and mode"
    );
    assert_eq!(
        status_ids(server.0.id(), "Uid:"),
        vec![NOBODY; 4],
        "runs as nobody"
    );
    assert_eq!(status_ids(server.0.id(), "Gid:"), vec![NOGROUP; 4]);
    assert_eq!(status_ids(server.0.id(), "Groups:"), Vec::<u32>::new());
    // The user is admitted.
    let ok = stats_as(&bin, &socket, NOBODY, NOGROUP);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    // Another user who passes the socket's mode (it is in the group) but
    // is not admitted is turned away by its credentials, and counted.
    let other = stats_as(&bin, &socket, 1, NOGROUP);
    assert!(!other.status.success(), "uid 1 was admitted");
    let s = stats(&bin, &socket);
    assert_eq!(s["refused_peers"], 1, "{s}");
    assert_eq!(s["tenants"], 0, "{s}");
}

fn group_members_are_admitted_and_others_cannot_connect() {
    let (dir, bin) = scratch("group");
    let socket = dir.join("engine.sock");
    let _server = serve(&bin, &socket, &["--user", "nobody", "--group", "bin"], None, &dir);
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o777), (0, 2, 0o660));
    // bin (uid 2, group bin) is a member: admitted.
    let member = stats_as(&bin, &socket, 2, 2);
    assert!(
        member.status.success(),
        "{}",
        String::from_utf8_lossy(&member.stderr)
    );
    // daemon (uid 1, group daemon) is not: the socket's mode keeps it out.
    let outsider = stats_as(&bin, &socket, 1, 1);
    assert!(!outsider.status.success());
    let err = String::from_utf8_lossy(&outsider.stderr);
    assert!(err.contains("Permission denied"), "{err}");
    let s = stats(&bin, &socket);
    assert_eq!(s["refused_peers"], 0, "{s}");
}

fn the_server_is_neither_readable_nor_dumped() {
    let (dir, bin) = scratch("dump");
    // The server runs as nobody from the start (no --user: no change of
    // credentials to clear the dumpable flag for it), in a directory it
    // may write a core file to, with no core size limit.
    std::os::unix::fs::chown(&*dir, Some(NOBODY), Some(NOGROUP)).unwrap();
    let socket = dir.join("engine.sock");
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: this process's own limit, inherited by the server.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &unlimited) }, 0);
    let server = serve(&bin, &socket, &[], Some((NOBODY, NOGROUP)), &dir);
    let pid = server.0.id();
    // Another process of the same user cannot read the server's memory
    // or environment (ptrace access needs a dumpable target).
    let peek = Command::new("cat")
        .arg(format!("/proc/{pid}/environ"))
        .uid(NOBODY)
        .gid(NOGROUP)
        .output()
        .unwrap();
    assert!(
        !peek.status.success(),
        "another process of the server's user read its environment"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert!(core.split_whitespace().nth(4) == Some("0"), "{core}");
    // A crash leaves no core file where the kernel would write one.
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    // SAFETY: signals our own child, by its pid.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGABRT) }, 0);
    let mut server = server;
    let status = server.0.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGABRT)
    );
    if pattern.trim_start().starts_with('|') {
        eprintln!(
            "core_pattern pipes to a program ({}): the core file check is skipped",
            pattern.trim()
        );
    } else {
        let cores: Vec<_> = std::fs::read_dir(&*dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("core"))
            .collect();
        assert!(cores.is_empty(), "a core file was written: {cores:?}");
        assert!(
            !std::os::unix::process::ExitStatusExt::core_dumped(&status),
            "the kernel dumped core"
        );
    }
}
