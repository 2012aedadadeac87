//! The TUN driver against the kernel (root, in CI): a ping routed into the
//! TUN arrives as a bare IPv4 packet, and the reply written back reaches
//! the pinging process. Without root or /dev/net/tun it shows as ignored,
//! and fails under `CI=true` unless `ESPGW_SKIPS` names `tun` (testkit).

use std::process::Command;
use std::time::{Duration, Instant};

use dataplane::PacketPool;
use drivers::tun::Tun;
use testkit::Prerequisite;

const NS: &str = "espgw-tuntest";

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

static TUN: Prerequisite = Prerequisite::new("tun", || {
    testkit::root_and_tools(
        "a network namespace and a TUN device",
        &[("ip", "iproute2"), ("ping", "iputils-ping")],
    )?;
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err("no /dev/net/tun (modprobe tun)".into());
    }
    Ok(())
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(&TUN, a_ping_through_the_tun_is_answered)])
}

fn a_ping_through_the_tun_is_answered() {
    // A namespace left by an earlier run, if any.
    let _ = Command::new("ip")
        .args(["netns", "del", NS])
        .stderr(std::process::Stdio::null())
        .status();
    assert!(ip(&["netns", "add", NS]));
    let result = std::thread::spawn(|| {
        let ns = std::fs::File::open(format!("/var/run/netns/{NS}")).unwrap();
        // SAFETY: setns on a namespace file we opened; this thread only.
        assert_eq!(
            unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) },
            0
        );
        let tun = Tun::open("espgwtun0").expect("TUN opens");
        let exec = |args: &[&str]| {
            let mut full = vec!["netns", "exec", NS];
            full.extend_from_slice(args);
            assert!(ip(&full), "{args:?}");
        };
        exec(&["ip", "addr", "add", "192.168.77.1/24", "dev", "espgwtun0"]);
        exec(&["ip", "link", "set", "espgwtun0", "up"]);
        let ping = Command::new("ip")
            .args([
                "netns",
                "exec",
                NS,
                "ping",
                "-c",
                "3",
                "-i",
                "0.2",
                "-W",
                "2",
                "192.168.77.2",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("ping starts");
        // Answer every echo request that comes out of the TUN.
        let mut pool = PacketPool::new(8);
        let mut bufs = Vec::new();
        let mut answered = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while answered < 3 && Instant::now() < deadline {
            tun.recv_batch(&mut pool, &mut bufs, 8).expect("reads");
            for mut buf in bufs.drain(..) {
                let data = buf.data();
                let is_echo = data.first().is_some_and(|b| b >> 4 == 4)
                    && data.get(9) == Some(&1)
                    && data.get(20) == Some(&8);
                if is_echo && dataplane::icmp::echo_reply_in_place(&mut buf) {
                    tun.send(buf.data()).expect("writes");
                    answered += 1;
                }
                pool.free(buf);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let out = ping.wait_with_output().expect("ping ends");
        (
            answered,
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    })
    .join();
    let _ = Command::new("ip").args(["netns", "del", NS]).status();
    let (answered, ok, text) = result.expect("the TUN thread ran");
    assert_eq!(answered, 3, "{text}");
    assert!(ok, "ping got its replies through the TUN: {text}");
}
