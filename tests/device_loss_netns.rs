//! A device that goes away under a running `espgw run` (root, in CI): one
//! gateway with two workers on a veth topology of its own, run as a
//! service manager runs it (it says READY=1 on `$NOTIFY_SOCKET` once it
//! forwards, as systemd's Type=notify expects). Taken down,
//! its inside device is waited for without spinning (the process uses
//! under a tenth of a core while it is down), logged once, and forwarding
//! resumes when it comes back up (the host's ping is answered again).
//! Deleted, it ends the run: the process exits non-zero within seconds,
//! saying which device went, again without spinning meanwhile, so that a
//! service manager can restart it. Without root or the namespace tools
//! the test shows as ignored (testkit `netns`).

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::netns::{self, ip};
use testkit::Prerequisite;

static NETNS: Prerequisite = Prerequisite::new("netns", || {
    testkit::root_and_tools(
        "network namespaces",
        &[("ip", "iproute2"), ("ping", "iputils-ping")],
    )
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(
        &NETNS,
        a_device_down_is_waited_for_and_a_deleted_one_ends_the_run
    )])
}

/// Names of their own, so that other namespace tests may run beside.
const HOST: &str = "espgw-dl-host";
const GW: &str = "espgw-dl-gw";
const PEER: &str = "espgw-dl-peer";

/// Removes the namespaces and stops the gateway, also when the test fails.
struct Lab {
    gateway: Option<Child>,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(child) = &mut self.gateway {
            // SAFETY: kill(2) on our own child (ip netns exec execs espgw).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
        netns::remove(&[HOST, GW, PEER]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const CONFIG: &str = "[gateway]\nname = \"dl\"\n\n\
    [[interface]]\nname = \"inside\"\ndevice = \"dl-in\"\naddress = \"192.168.1.1/24\"\n\n\
    [[interface]]\nname = \"outside\"\ndevice = \"dl-out\"\naddress = \"10.0.0.1/24\"\n";

fn ping_gateway() -> bool {
    // The first answer waits for ARP.
    (0..5).any(|_| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                HOST,
                "ping",
                "-c",
                "2",
                "-i",
                "0.2",
                "-W",
                "1",
                "192.168.1.1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// CPU time (user and system, every thread) of `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state is field 3, utime 14,
    // stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Share of one core `pid` used over `span`.
fn cpu_share(pid: u32, span: Duration) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let before = cpu_ticks(pid).expect("the gateway's stat");
    std::thread::sleep(span);
    let after = cpu_ticks(pid).expect("the gateway's stat");
    (after - before) as f64 / hz / span.as_secs_f64()
}

fn a_device_down_is_waited_for_and_a_deleted_one_ends_the_run() {
    netns::remove(&[HOST, GW, PEER]);
    let dir = std::env::temp_dir().join(format!("espgw-dl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("a fresh work dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let mut lab = Lab {
        gateway: None,
        dir: dir.clone(),
    };
    netns::create(&[HOST, GW, PEER]);
    for (left, left_ns, right, right_ns) in [("dl-h0", HOST, "dl-in", GW), ("dl-out", GW, "dl-p0", PEER)] {
        netns::veth(left, left_ns, right, right_ns);
    }
    ip(&["-n", HOST, "addr", "add", "192.168.1.10/24", "dev", "dl-h0"]);
    let config = dir.join("dl.toml");
    std::fs::write(&config, CONFIG).expect("write config");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let log_path = dir.join("dl.log");
    let notify_path = dir.join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("a notify socket");
    notify
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("a timeout");
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            GW,
            env!("CARGO_BIN_EXE_espgw"),
            "run",
            "--workers",
            "2",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--control")
        .arg(dir.join("dl.sock"))
        .env("NO_COLOR", "1")
        .env("NOTIFY_SOCKET", &notify_path)
        .stderr(File::create(&log_path).expect("log file"))
        .spawn()
        .expect("espgw run starts");
    let pid = child.id();
    lab.gateway = Some(child);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let since = Instant::now();
    while !log().contains("forwarding") {
        assert!(
            since.elapsed() < Duration::from_secs(20),
            "the gateway did not start:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut message = [0u8; 512];
    let n = notify
        .recv(&mut message)
        .expect("a notification from the gateway");
    let message = String::from_utf8_lossy(&message[..n]).into_owned();
    assert!(
        message.lines().any(|l| l == "READY=1") && log().contains("forwarding"),
        "ready once forwarding: {message:?}\n{}",
        log()
    );
    assert!(ping_gateway(), "the host reaches the gateway:\n{}", log());

    // Down: waited for, once in the log, without spinning.
    ip(&["-n", GW, "link", "set", "dl-in", "down"]);
    std::thread::sleep(Duration::from_millis(500));
    let share = cpu_share(pid, Duration::from_secs(2));
    assert!(
        share < 0.1,
        "while its inside device is down the gateway waits, not spins: {:.0} % of a core\n{}",
        share * 100.0,
        log()
    );
    let downs = log().matches("device down").count();
    assert_eq!(downs, 1, "the device going down is logged once:\n{}", log());
    ip(&["-n", GW, "link", "set", "dl-in", "up"]);
    assert!(
        ping_gateway(),
        "the gateway forwards again once its device is back:\n{}",
        log()
    );
    let since = Instant::now();
    while !log().contains("device up again") {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "the device's return is logged:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Deleted: the run ends, non-zero, naming the device, without spinning
    // on the way.
    ip(&["-n", GW, "link", "del", "dl-in"]);
    let since = Instant::now();
    let status = loop {
        let child = lab.gateway.as_mut().expect("the gateway");
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "the gateway did not stop after its inside device was deleted: {:.0} % of a core\n{}",
            cpu_share(pid, Duration::from_millis(500)) * 100.0,
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    lab.gateway = None;
    assert!(
        !status.success(),
        "a deleted device is a failure: {status}\n{}",
        log()
    );
    assert!(
        log().contains("device `dl-in` of the inside interface was deleted"),
        "the log names the device:\n{}",
        log()
    );
}
