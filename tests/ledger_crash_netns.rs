//! A gateway with static keys killed mid-traffic (SIGKILL: nothing is
//! flushed) and started again on the same state directory (root, in CI):
//! every ESP packet the second run sends carries a sequence number above
//! everything the first run sent, so no (key, nonce) pair of its AEAD
//! repeats; a reload that changes the tunnel but keeps its keys goes on
//! above both, and not a packet is dropped for want of a reservation
//! (`seq_not_reserved`); killed again after it, the gateway resumes above
//! what the reloaded SA sent; stopped cleanly (SIGTERM) after that, it
//! resumes right after the last number it sent. The ESP is captured on the veth at the peer's end
//! (AF_PACKET);
//! the peer is a plain namespace that answers ARP and drops the ESP.
//! Without root or the namespace tools the test shows as ignored (testkit
//! `netns`).

use std::fs::File;
use std::net::UdpSocket;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::netns::{self, enter, ip, Lab, NETNS};

mod common;

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(
        &NETNS,
        a_gateway_killed_mid_traffic_resumes_above_every_number_it_sent
    )])
}

/// Names of their own, so that other namespace tests may run beside it.
const HOST: &str = "espgw-lc-host";
const GW: &str = "espgw-lc-gw";
const PEER: &str = "espgw-lc-peer";

/// ESP the first run must have sent before it is killed: past the first
/// reservation (written before the workers started), so that the writer
/// thread's reservations are what the restart has to respect.
const FIRST_RUN: usize = 6000;
const SECOND_RUN: usize = 1500;
const AFTER_RELOAD: usize = 6000;
const THIRD_RUN: usize = 1500;
const FOURTH_RUN: usize = 1500;

/// Tells the test's threads to stop, also when the test fails.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The gateway's config, written to `DIR/lc.toml`; `replay_window` is
/// what a reload changes.
fn config(dir: &std::path::Path, replay_window: u32) -> std::path::PathBuf {
    let text = format!(
        "[gateway]\nname = \"lc\"\n\n\
         [[interface]]\nname = \"inside\"\ndevice = \"lcg-in\"\naddress = \"192.168.1.1/24\"\n\n\
         [[interface]]\nname = \"outside\"\ndevice = \"lcg-out\"\naddress = \"10.0.0.1/24\"\n\n\
         [[route]]\ndestination = \"192.168.2.0/24\"\nvia = \"10.0.0.2\"\n\n\
         [[tunnel]]\nname = \"t\"\nlocal = \"10.0.0.1\"\nremote = \"10.0.0.2\"\n\
         local_subnet = \"192.168.1.0/24\"\nremote_subnet = \"192.168.2.0/24\"\n\
         proposal = \"aes128gcm16\"\nspi_out = 0x1001\nspi_in = 0x1002\n\
         enc_key_out = \"000102030405060708090a0b0c0d0e0f10111213\"\n\
         enc_key_in = \"202122232425262728292a2b2c2d2e2f30313233\"\nreplay_window = {replay_window}\n"
    );
    let path = dir.join("lc.toml");
    std::fs::write(&path, text).expect("write config");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    path
}

/// `espgw run` in the gateway's namespace on `state`, started (the lab's
/// one child) and forwarding; its log is `log`.
fn start(lab: &mut Lab, config: &std::path::Path, state: &std::path::Path, log: &std::path::Path) {
    let child = common::espgw_in(GW)
        .args(["run", "--workers", "2"])
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state)
        .arg("--control")
        .arg(log.with_extension("sock"))
        .stderr(File::create(log).expect("log file"))
        .spawn()
        .expect("espgw run starts");
    lab.children.push(child);
    common::wait_forwarding(&mut lab.children[0], log);
}

/// Kills the lab's gateway (SIGKILL: no shutdown, no last write).
fn kill(lab: &mut Lab) {
    for mut child in lab.children.drain(..) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The sequence numbers of the SA's ESP captured on the peer's veth, with
/// the phase each arrived in (1: the first run, 2: the second).
type Captured = Arc<Mutex<Vec<(u8, u32)>>>;

fn capture(phase: Arc<AtomicU8>, stop: Arc<AtomicBool>, captured: Captured) -> std::thread::JoinHandle<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        enter(PEER);
        let protocol = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: a new AF_PACKET socket, owned at once.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(protocol)) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a socket we just opened and own alone.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: setsockopt on our socket with a timeval of its size.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        let _ = ready_tx.send(());
        let mut frame = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: recv into a buffer of the length given.
            let n = unsafe { libc::recv(socket.as_raw_fd(), frame.as_mut_ptr().cast(), frame.len(), 0) };
            let Ok(n) = usize::try_from(n) else {
                continue;
            };
            // Ethernet, IPv4 without options, ESP with our SPI.
            if n >= 14 + 20 + 8
                && frame[12..14] == [0x08, 0x00]
                && frame[14 + 9] == 50
                && frame[34..38] == 0x1001u32.to_be_bytes()
            {
                let seq = u32::from_be_bytes(frame[38..42].try_into().unwrap());
                captured
                    .lock()
                    .unwrap()
                    .push((phase.load(Ordering::Acquire), seq));
            }
        }
    });
    ready_rx.recv().expect("the capture starts");
    handle
}

fn count(captured: &Captured, phase: u8) -> usize {
    captured
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _)| *p == phase)
        .count()
}

fn wait_for(captured: &Captured, phase: u8, n: usize, what: &str, log: &std::path::Path) {
    let started = Instant::now();
    while count(captured, phase) < n {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: {} of {n} ESP packets captured\n{}",
            count(captured, phase),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn a_gateway_killed_mid_traffic_resumes_above_every_number_it_sent() {
    let dir = std::env::temp_dir().join(format!("espgw-lc-{}", std::process::id()));
    let mut lab = Lab::new(&[HOST, GW, PEER], dir.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_threads = StopOnDrop(Arc::clone(&stop));
    netns::create(&[HOST, GW, PEER]);
    for (left, left_ns, right, right_ns) in [("lch0", HOST, "lcg-in", GW), ("lcg-out", GW, "lcp0", PEER)] {
        netns::veth(left, left_ns, right, right_ns);
    }
    ip(&["-n", HOST, "addr", "add", "192.168.1.10/24", "dev", "lch0"]);
    ip(&["-n", HOST, "route", "add", "default", "via", "192.168.1.1"]);
    ip(&["-n", PEER, "addr", "add", "10.0.0.2/24", "dev", "lcp0"]);
    let config = config(&dir, 64);
    let state = dir.join("state");
    let phase = Arc::new(AtomicU8::new(0));
    let captured: Captured = Arc::new(Mutex::new(Vec::new()));
    let capturer = capture(Arc::clone(&phase), Arc::clone(&stop), Arc::clone(&captured));

    let (log1, log2) = (dir.join("run1.log"), dir.join("run2.log"));
    start(&mut lab, &config, &state, &log1);
    phase.store(1, Ordering::Release);
    // hostA sends steadily to a host behind the tunnel until told to stop.
    let sending = Arc::clone(&stop);
    let sender = std::thread::spawn(move || {
        enter(HOST);
        let socket = UdpSocket::bind("192.168.1.10:0").expect("bind at hostA");
        socket.connect("192.168.2.20:9000").expect("connect");
        let mut sent = 0u64;
        while !sending.load(Ordering::Relaxed) {
            if socket.send(&sent.to_be_bytes()).is_ok() {
                sent += 1;
            }
            if sent.is_multiple_of(8) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        sent
    });
    wait_for(&captured, 1, FIRST_RUN, "the first run", &log1);
    // Killed mid-traffic.
    kill(&mut lab);
    // Whatever the first run had on the wire has arrived by now.
    std::thread::sleep(Duration::from_millis(300));
    phase.store(2, Ordering::Release);
    start(&mut lab, &config, &state, &log2);
    wait_for(&captured, 2, SECOND_RUN, "the second run", &log2);
    // A reload that changes the tunnel but not its keys: its SAs are
    // replaced, and the new ones go on from the ledger.
    let socket = log2.with_extension("sock");
    phase.store(3, Ordering::Release);
    self::config(&dir, 128);
    let reload = common::espgw()
        .args(["reload", "--json", "--socket"])
        .arg(&socket)
        .output()
        .expect("espgw reload");
    let answer: serde_json::Value = serde_json::from_slice(&reload.stdout).unwrap_or_default();
    assert!(
        reload.status.success() && answer["report"]["changed"] == serde_json::json!(["t"]),
        "{answer}{}",
        String::from_utf8_lossy(&reload.stderr)
    );
    wait_for(&captured, 3, AFTER_RELOAD, "after the reload", &log2);
    let stats = common::espgw()
        .args(["stats", "--json", "--socket"])
        .arg(&socket)
        .output()
        .expect("espgw stats");
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    // Killed again, and started once more.
    kill(&mut lab);
    std::thread::sleep(Duration::from_millis(300));
    phase.store(4, Ordering::Release);
    let log3 = dir.join("run3.log");
    start(&mut lab, &config, &state, &log3);
    wait_for(&captured, 4, THIRD_RUN, "the third run", &log3);
    // Stopped cleanly this time (SIGTERM, as a service manager stops it):
    // the ledger is settled, and the fourth run goes on right after the
    // last number the third sent instead of after its reservation.
    for status in lab.stop_all() {
        assert!(
            status.success(),
            "espgw run stopped with {status}:\n{}",
            std::fs::read_to_string(&log3).unwrap_or_default()
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    phase.store(5, Ordering::Release);
    let log4 = dir.join("run4.log");
    start(&mut lab, &config, &state, &log4);
    wait_for(&captured, 5, FOURTH_RUN, "the fourth run", &log4);
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("the sender");
    capturer.join().expect("the capture");

    let captured = captured.lock().unwrap().clone();
    let phase_of = |phase: u8| -> Vec<u32> {
        captured
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, s)| *s)
            .collect()
    };
    let (first, second, third, fourth, fifth) =
        (phase_of(1), phase_of(2), phase_of(3), phase_of(4), phase_of(5));
    let top = first.iter().copied().max().expect("the first run sent");
    let lowest = second.iter().copied().min().expect("the second run sent");
    let logs = format!(
        "hostA sent {sent}; first run: {} packets up to {top}; second run: {} packets from {lowest}; \
         after the reload: {} packets; third run: {} from {:?}\n{}\n{}\n{}",
        first.len(),
        second.len(),
        third.len(),
        fourth.len(),
        fourth.iter().min(),
        std::fs::read_to_string(&log1).unwrap_or_default(),
        std::fs::read_to_string(&log2).unwrap_or_default(),
        std::fs::read_to_string(&log3).unwrap_or_default()
            + &std::fs::read_to_string(&log4).unwrap_or_default()
    );
    assert!(
        top as usize >= FIRST_RUN,
        "the first run went past its first reservation: {logs}"
    );
    assert!(
        lowest > top,
        "the second run sent {lowest}, which the first may have sent (it reached {top}): {logs}"
    );
    // After the reload (the packets in its phase may still be the old
    // SA's): never a number sent before, and nothing twice.
    let mut all: Vec<u32> = second.iter().chain(&third).copied().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        second.len() + third.len(),
        "a number sent twice by the second run, across its reload: {logs}"
    );
    assert!(third.iter().all(|s| *s > top), "{logs}");
    // The SA the reload put in place keeps the ledger going: killed, its
    // gateway resumes above everything it sent.
    let before: u32 = second.iter().chain(&third).copied().max().unwrap_or(0);
    assert!(
        fourth.iter().all(|s| *s > before),
        "the third run sent numbers up to {before} again: {logs}"
    );
    assert!(
        std::fs::read_to_string(&log2)
            .unwrap_or_default()
            .contains("resume from the state directory"),
        "{logs}"
    );
    // Both SAs the reload put in place are under the ledger: each has a
    // durable ceiling, the outbound one above what it has sent.
    for sa in stats["sas"].as_array().expect("the SAs") {
        let ceiling = sa["sequence_ceiling"].as_u64();
        assert!(
            ceiling.is_some_and(|c| c >= sa["last_sequence"].as_u64().unwrap_or(u64::MAX)),
            "SA {} has no durable ceiling after the reload: {sa:#}\n{logs}",
            sa["name"]
        );
    }
    assert_eq!(
        stats["drops"]["seq_not_reserved"], 0,
        "a packet was dropped for want of a reservation: {stats:#}\n{logs}"
    );
    // After the clean stop: above everything the third run sent, and
    // right after it. A restart from reservations skips at least half of
    // one (`ike_stub::ledger::OUT_FLOOR` / 2 = 2,048); the margin allows
    // for the capture missing the third run's last packets.
    let third_top = fourth.iter().copied().max().unwrap_or(0);
    let fourth_low = fifth.iter().copied().min().expect("the fourth run sent");
    assert!(
        fourth_low > third_top,
        "the fourth run sent {fourth_low}, which the third may have sent (it reached {third_top}): {logs}"
    );
    assert!(
        fourth_low - third_top < 1024,
        "after a clean stop the fourth run skipped from {third_top} to {fourth_low}: {logs}"
    );
    for (log, says) in [
        (&log3, "sequence ledger settled"),
        (&log4, "previous_stop=\"clean: exact marks\""),
        (&log2, "previous_stop=\"not clean: reserved marks\""),
    ] {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            text.contains(says),
            "{} does not say `{says}`:\n{text}",
            log.display()
        );
    }
    eprintln!(
        "first run: {} ESP packets, up to {top}; killed; second run: {} packets, from {lowest}; \
         reloaded, {} more, up to {before}; killed; third run: {} packets, from {}, up to {third_top}; \
         stopped cleanly; fourth run: {} packets, from {fourth_low}",
        first.len(),
        second.len(),
        third.len(),
        fourth.len(),
        fourth.iter().min().unwrap_or(&0),
        fifth.len(),
    );
    drop(lab);
}
