//! The control socket (`src/control.rs`, compiled in here): never reachable
//! with a loose mode, even under umask 0 (this binary runs with it); a
//! file at its path that is not a stale socket is refused, not deleted;
//! peers are admitted by their credentials; a client that never reads, or
//! many that never write, hold up no other client; and a failed connect
//! says what happened. The tests that act as another user (a thread with
//! uid 65534) need root and show as ignored without it (testkit `root`).

#[allow(dead_code)]
#[path = "../src/control.rs"]
mod control;

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use testkit::Prerequisite;

static ROOT: Prerequisite =
    Prerequisite::new("root", || testkit::root_and_tools("acting as another user", &[]));

fn main() -> std::process::ExitCode {
    // The loosest umask: nothing but the code under test keeps the socket
    // owner-only.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    testkit::run([
        testkit::test!(the_socket_is_never_seen_with_a_loose_mode),
        testkit::test!(what_is_not_a_stale_socket_is_refused_and_kept),
        testkit::test!(a_stale_socket_is_replaced_and_a_live_one_kept),
        testkit::test!(a_client_that_never_reads_holds_up_no_other),
        testkit::test!(idle_clients_are_bounded_and_the_rest_told_so),
        testkit::test!(a_missing_or_stale_socket_is_named_as_such),
        testkit::needs!(&ROOT, other_users_are_refused_by_their_credentials),
        testkit::needs!(&ROOT, a_socket_another_user_may_not_open_is_named_as_such),
    ])
}

/// A fresh directory others may traverse (not list), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("espgw-ctl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("scratch dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Answers every request on `path` with `answer`, as the dataplane would.
fn serve(path: &Path, answer: String) {
    let requests = control::listen(path).unwrap_or_else(|e| panic!("{e:#}"));
    std::thread::spawn(move || {
        for request in requests {
            let _ = request.reply.send(answer.clone());
        }
    });
}

/// Sends a request line and reads the whole answer (until the gateway
/// closes).
fn exchange(stream: &mut UnixStream, line: &str) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // A refusal may come (and the connection close) before the request
    // is sent.
    let _ = stream.write_all(line.as_bytes());
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// Switches the calling thread (only: the raw system calls, not glibc's
/// process-wide wrappers) to uid and gid 65534.
fn become_nobody() {
    // SAFETY: setgroups/setresgid/setresuid system calls with plain ids;
    // they change this thread's credentials alone.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
            0
        );
        assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
        assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
    }
}

fn the_socket_is_never_seen_with_a_loose_mode() {
    let scratch = Scratch::new("mode");
    let path = scratch.path("gw.sock");
    let stop = Arc::new(AtomicBool::new(false));
    // Looks at the path as fast as it can while sockets are created there.
    let watcher = {
        let (path, stop) = (path.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let (mut looks, mut seen, mut loose) = (0u64, 0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                looks += 1;
                if let Ok(meta) = std::fs::symlink_metadata(&path) {
                    if meta.file_type().is_socket() {
                        seen += 1;
                        if meta.permissions().mode() & 0o077 != 0 {
                            loose.push(meta.permissions().mode() & 0o777);
                        }
                    }
                }
            }
            (looks, seen, loose)
        })
    };
    for _ in 0..300 {
        let _requests = control::listen(&path).unwrap_or_else(|e| panic!("{e:#}"));
        let mode = std::fs::metadata(&path).expect("the socket").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_file(&path).expect("unlink");
    }
    stop.store(true, Ordering::Relaxed);
    let (looks, seen, loose) = watcher.join().expect("the watcher");
    assert!(seen > 0, "the watcher never saw a socket in {looks} looks");
    let modes: Vec<String> = loose.iter().map(|m| format!("{m:o}")).collect();
    assert!(
        loose.is_empty(),
        "seen with modes {modes:?} ({} of {seen} sightings)",
        loose.len()
    );
}

fn what_is_not_a_stale_socket_is_refused_and_kept() {
    let scratch = Scratch::new("other");
    let path = scratch.path("gw.sock");
    std::fs::write(&path, "not a socket").expect("write");
    let err = format!("{:#}", control::listen(&path).expect_err("refused"));
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).expect("kept"), "not a socket");

    std::fs::remove_file(&path).expect("unlink");
    let target = scratch.path("target");
    std::fs::write(&target, "precious").expect("write");
    std::os::unix::fs::symlink(&target, &path).expect("symlink");
    let err = format!("{:#}", control::listen(&path).expect_err("refused"));
    assert!(err.contains("symbolic link"), "{err}");
    assert!(std::fs::symlink_metadata(&path)
        .expect("kept")
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(&target).expect("kept"), "precious");
}

fn a_stale_socket_is_replaced_and_a_live_one_kept() {
    let scratch = Scratch::new("stale");
    let path = scratch.path("gw.sock");
    drop(UnixListener::bind(&path).expect("a socket"));
    serve(&path, r#"{"ok":1}"#.into());
    assert_eq!(
        control::ask::<serde_json::Value>(&path, "stats").expect("served")["ok"],
        1
    );
    let err = format!("{:#}", control::listen(&path).expect_err("refused"));
    assert!(err.contains("already answers"), "{err}");
    assert_eq!(
        control::ask::<serde_json::Value>(&path, "stats").expect("still served")["ok"],
        1
    );
}

fn a_client_that_never_reads_holds_up_no_other() {
    let scratch = Scratch::new("reader");
    let path = scratch.path("gw.sock");
    // Far more than a socket buffer holds: a client that does not read
    // leaves the gateway's write waiting.
    let big = format!(r#"{{"big":"{}"}}"#, "x".repeat(8 << 20));
    serve(&path, big.clone());
    let mut stuck = UnixStream::connect(&path).expect("connect");
    stuck.write_all(b"stats\n").expect("send");
    std::thread::sleep(Duration::from_millis(200));
    let other =
        control::ask::<serde_json::Value>(&path, "stats").expect("another client is answered meanwhile");
    assert_eq!(other["big"].as_str().map(str::len), Some(8 << 20));
    // The gateway gives up on the stuck one: it gets part, then the end.
    std::thread::sleep(control::WRITE_DEADLINE + Duration::from_millis(500));
    let mut got = Vec::new();
    stuck
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = stuck.read_to_end(&mut got);
    assert!(
        got.len() < big.len(),
        "the stalled client got it all ({} bytes)",
        got.len()
    );
}

fn idle_clients_are_bounded_and_the_rest_told_so() {
    let scratch = Scratch::new("idle");
    let path = scratch.path("gw.sock");
    serve(&path, r#"{"ok":1}"#.into());
    // Connections that never send their request.
    let idle: Vec<UnixStream> = (0..16)
        .map(|_| UnixStream::connect(&path).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let err = format!(
        "{:#}",
        control::ask::<serde_json::Value>(&path, "stats").expect_err("busy")
    );
    assert!(err.contains("busy"), "{err}");
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        control::ask::<serde_json::Value>(&path, "stats").expect("served again")["ok"],
        1
    );
}

fn a_missing_or_stale_socket_is_named_as_such() {
    let scratch = Scratch::new("errors");
    let path = scratch.path("gw.sock");
    let err = format!(
        "{:#}",
        control::ask::<serde_json::Value>(&path, "stats").expect_err("no socket")
    );
    assert!(err.contains("no control socket at"), "{err}");
    drop(UnixListener::bind(&path).expect("a socket"));
    let err = format!(
        "{:#}",
        control::ask::<serde_json::Value>(&path, "stats").expect_err("stale")
    );
    assert!(err.contains("nothing answers on"), "{err}");
}

fn other_users_are_refused_by_their_credentials() {
    let scratch = Scratch::new("peer");
    let path = scratch.path("gw.sock");
    serve(&path, r#"{"secret":"counters"}"#.into());
    // Open to every user by mode: only the credentials stop them.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let answer = {
        let path = path.clone();
        std::thread::spawn(move || {
            become_nobody();
            let mut stream = UnixStream::connect(&path).expect("connect as nobody");
            exchange(&mut stream, "stats\n")
        })
        .join()
        .expect("the client")
    };
    assert!(
        answer.contains("refused: uid 65534") && !answer.contains("counters"),
        "{answer}"
    );
    // Root is admitted.
    assert_eq!(
        control::ask::<serde_json::Value>(&path, "stats").expect("root")["secret"],
        "counters"
    );
}

fn a_socket_another_user_may_not_open_is_named_as_such() {
    let scratch = Scratch::new("denied");
    let path = scratch.path("gw.sock");
    serve(&path, r#"{"ok":1}"#.into());
    let err = {
        let path = path.clone();
        std::thread::spawn(move || {
            become_nobody();
            format!(
                "{:#}",
                control::ask::<serde_json::Value>(&path, "stats").expect_err("denied")
            )
        })
        .join()
        .expect("the client")
    };
    assert!(err.contains("permission denied on"), "{err}");
}
