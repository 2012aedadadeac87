//! `espgw engine serve` as its own process, and `espgw pcap` through it
//! with `engine = "shared"` over both transports: the same verdicts and
//! bytes as in-process, an owner-only socket, the server's counters in
//! `espgw engine stats` and for Prometheus alike, and config errors that
//! name the spot and the fix.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use accel::shared::{SharedEngine, SharedSpec, Transport};
use accel::{Algorithm, Descriptor, DescriptorError, Direction, Engine, Job, PacketBuf, SessionSpec, Status};
use pcap_file::DataLink;

mod common;

use common::{espgw, ethernet, pcap_command, read_pcap, repo, succeeded, write_pcap, Serve};

fn temp_dir(name: &str) -> common::Scratch {
    common::Scratch::new("espgw-shcli", name)
}

fn serve(socket: &Path, engine: &str) -> Serve {
    serve_with(socket, engine, &[], None)
}

/// `espgw engine serve` with `extra` flags, its standard error to `log`.
fn serve_with(socket: &Path, engine: &str, extra: &[&str], log: Option<&Path>) -> Serve {
    let mut command = espgw();
    command
        .args(["engine", "serve", "--engine", engine, "--socket"])
        .arg(socket)
        .args(extra);
    if let Some(log) = log {
        command.stderr(std::fs::File::create(log).unwrap());
    }
    Serve::start(command, socket)
}

fn shared_config(from: &str, socket: &Path, transport: &str, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo(from)).unwrap().replace(
        "engine = \"soft\"",
        &format!(
            "engine = \"shared\"\nsocket = \"{}\"\ntransport = \"{transport}\"",
            socket.display()
        ),
    );
    assert!(text.contains("shared"), "{from} has an [accel] engine line");
    let name = Path::new(from).file_name().unwrap().to_string_lossy().to_string();
    let path = dir.join(format!("{transport}-{name}"));
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    path
}

/// `espgw pcap`, with a state directory of its own beside `output`.
fn pcap(config: &Path, from: &str, input: &Path, output: &Path) {
    let state = output.with_extension("state");
    let _ = std::fs::remove_dir_all(&state);
    succeeded(
        pcap_command(config, from, input, output)
            .arg("--state-dir")
            .arg(&state)
            .output()
            .unwrap(),
    );
}

/// The server's /metrics, at the address its log names.
fn scrape(log: &Path) -> String {
    use std::io::{Read, Write};
    let text = std::fs::read_to_string(log).unwrap();
    let address = text
        .lines()
        .find_map(|l| l.split("Prometheus metrics at http://").nth(1))
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in the server's log:\n{text}"));
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{response}"));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

#[test]
fn pcap_through_the_server_delivers_what_was_sent_over_both_transports() {
    let dir = temp_dir("pcap");
    let socket = dir.join("engine.sock");
    let log = dir.join("serve.log");
    let _server = serve_with(&socket, "soft", &["--metrics", "127.0.0.1:0"], Some(&log));
    let mode = std::fs::metadata(&socket).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600,
        "the socket is the owner's alone"
    );
    let packets: Vec<Vec<u8>> = [0usize, 17, 600, 1400]
        .iter()
        .enumerate()
        .map(|(i, &n)| common::udp_packet(common::HOST_A, common::HOST_B, n, i as u8))
        .collect();
    let frames: Vec<Vec<u8>> = packets.iter().map(|p| ethernet(p)).collect();
    let input = dir.join("in.pcap");
    write_pcap(&input, DataLink::ETHERNET, &frames);
    for transport in ["shm", "socket"] {
        let a = shared_config("configs/site-a.toml", &socket, transport, &dir);
        let b = shared_config("configs/site-b.toml", &socket, transport, &dir);
        let summary = espgw().arg("check-config").arg(&a).output().unwrap();
        let summary = String::from_utf8_lossy(&summary.stdout);
        let want = format!(
            "engine shared style async buffers registered socket {} transport {transport}",
            socket.display()
        );
        assert!(summary.contains(&want), "{summary}");
        let (esp, out) = (
            dir.join(format!("{transport}-esp.pcap")),
            dir.join(format!("{transport}-out.pcap")),
        );
        pcap(&a, "inside", &input, &esp);
        pcap(&b, "outside", &esp, &out);
        assert!(
            read_pcap(&esp).1.iter().all(|f| f[14 + 9] == 50),
            "{transport}: ESP on the outside"
        );
        let (_, delivered) = read_pcap(&out);
        assert_eq!(delivered.len(), packets.len(), "{transport}");
        for (got, sent) in delivered.iter().zip(&packets) {
            assert_eq!(&got[14..], &common::after_hops(sent, 2)[..], "{transport}");
        }
    }
    // The operator's view: four gateways came and went, nothing refused.
    let out = espgw()
        .args(["engine", "stats", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["attached"], 4, "{stats}");
    assert_eq!(stats["reclaimed"], 4, "{stats}");
    assert_eq!(stats["tenants"], 0, "{stats}");
    assert!(stats["executed"].as_u64().unwrap() >= 8, "{stats}");
    assert_eq!(stats["foreign_session"], 0);
    assert_eq!(stats["bad_region"], 0);
    // The same for Prometheus, from the server's /metrics.
    let page = scrape(&log);
    for (metric, want) in [
        ("espgw_engine_server_tenants", &stats["tenants"]),
        ("espgw_engine_server_tenants_attached_total", &stats["attached"]),
        ("espgw_engine_server_tenants_reclaimed_total", &stats["reclaimed"]),
        (
            "espgw_engine_server_requests_total{outcome=\"executed\"}",
            &stats["executed"],
        ),
        (
            "espgw_engine_server_requests_refused_total{rule=\"foreign_session\"}",
            &stats["foreign_session"],
        ),
    ] {
        let value = page
            .lines()
            .find_map(|l| l.strip_prefix(metric).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {metric} in\n{page}"));
        assert_eq!(value.parse::<u64>().ok(), want.as_u64(), "{metric}\n{page}");
    }
    assert!(
        page.contains("# TYPE espgw_engine_server_cpu_seconds_total counter"),
        "{page}"
    );
    // A second server on the same socket is refused, naming the path.
    let second = espgw()
        .args(["engine", "serve", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("another server answers"));
}

#[test]
fn shared_engine_settings_are_checked_where_they_are_written() {
    let dir = temp_dir("config");
    let text = std::fs::read_to_string(repo("configs/site-a.toml")).unwrap();
    let cases = [
        ("engine = \"shared\"", "needs socket = \"PATH\""),
        (
            "engine = \"soft\"\nsocket = \"/tmp/x.sock\"",
            "set engine = \"shared\"",
        ),
        (
            "engine = \"shared\"\nsocket = \"/tmp/x.sock\"\ntransport = \"vsock\"",
            "expected shm or socket",
        ),
        (
            "engine = \"shared\"\nsocket = \"/tmp/x.sock\"\ndeadline_ms = 0",
            "deadline_ms must be from 1 to 60000",
        ),
        ("engine = \"soft\"\ndeadline_ms = 500", "set engine = \"shared\""),
    ];
    for (i, (accel, want)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad-{i}.toml"));
        std::fs::write(&path, text.replace("engine = \"soft\"", accel)).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let result = espgw().arg("check-config").arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success());
        assert!(
            err.contains(want) && err.contains(&format!("bad-{i}.toml:")),
            "{err}"
        );
    }
    // No server: the engine is refused with the command that starts one.
    let path = dir.join("no-server.toml");
    let missing = dir.join("missing.sock");
    std::fs::write(
        &path,
        text.replace(
            "engine = \"soft\"",
            &format!("engine = \"shared\"\nsocket = \"{}\"", missing.display()),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let input = dir.join("empty.pcap");
    write_pcap(&input, DataLink::ETHERNET, &[]);
    let result = pcap_command(&path, "inside", &input, &dir.join("out.pcap"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success());
    assert!(err.contains("espgw engine serve --socket"), "{err}");
}

/// An AES-GCM encryption job of `payload` bytes (a multiple of the block).
fn gcm_job(session: accel::SessionHandle, payload: usize, user: u64) -> Job {
    let alg = Algorithm::Aes128Gcm16;
    let desc = Descriptor::esp(Direction::Encrypt, alg, payload, None);
    let buf = PacketBuf::with_len(desc.icv.end());
    Job::new(session, desc, buf, 0, user)
}

/// Polls until `n` jobs are back or `within` has passed, on a clock that
/// starts at `clock` (the `now` the engine is given).
fn collect(t: &mut SharedEngine, clock: Instant, n: usize, within: Duration) -> Vec<Job> {
    let mut out = Vec::new();
    let until = Instant::now() + within;
    while out.len() < n && Instant::now() < until {
        t.poll_burst(clock.elapsed(), &mut out);
        if out.len() < n {
            t.wait(Duration::from_millis(5));
        }
    }
    out
}

/// A server that stops serving while still connected (SIGSTOP): the
/// tenant's jobs come back with `Timeout` once past the deadline, in a
/// bounded time and in submission order; the engine is then unavailable,
/// refusing new jobs at once (so a gateway drops and counts them) and
/// saying so in its counters; once the server runs again (SIGCONT) its
/// late completions free the slots and jobs run again.
#[test]
fn a_stopped_server_times_the_tenants_jobs_out_and_it_recovers() {
    let dir = temp_dir("stopped");
    let socket = dir.join("engine.sock");
    let server = serve(&socket, "soft");
    let deadline = Duration::from_millis(300);
    let clock = Instant::now();
    for transport in Transport::ALL {
        let mut t = SharedEngine::attach(&SharedSpec {
            socket: socket.clone(),
            transport,
            entries: 16,
            slot_size: 2048,
            deadline,
        })
        .expect("attaches");
        let spec = SessionSpec::new(Algorithm::Aes128Gcm16, false, &[7; 20], &[]).expect("keys");
        let h = t.register(&spec).expect("registers");
        t.submit_burst(clock.elapsed(), &mut vec![gcm_job(h, 64, 100)].into());
        let back = collect(&mut t, clock, 1, Duration::from_secs(5));
        assert_eq!(back[0].desc.status, Status::Done, "{transport}: served");
        // Let the server go idle (asleep on its doorbells), then stop it.
        std::thread::sleep(Duration::from_millis(100));
        server.signal(libc::SIGSTOP);
        let submitted = Instant::now();
        let mut queue: VecDeque<Job> = (0..8).map(|i| gcm_job(h, 64, i)).collect();
        assert_eq!(t.submit_burst(clock.elapsed(), &mut queue), 8);
        let back = collect(&mut t, clock, 8, Duration::from_secs(10));
        let took = submitted.elapsed();
        assert_eq!(back.len(), 8, "{transport}: every job came back");
        assert!(
            took >= deadline && took < deadline + Duration::from_secs(2),
            "{transport}: timed out after {took:?}, deadline {deadline:?}"
        );
        assert!(back
            .iter()
            .all(|j| j.desc.status == Status::Error(DescriptorError::Timeout)));
        let order: Vec<u64> = back.iter().map(|j| j.user).collect();
        assert_eq!(
            order,
            (0..8).collect::<Vec<u64>>(),
            "{transport}: in submission order"
        );
        assert!(t.unavailable());
        assert_eq!(t.in_flight(), 0, "{transport}: nothing left to wait for");
        // Unavailable: new jobs are taken and given back at once.
        let mut queue: VecDeque<Job> = (10..14).map(|i| gcm_job(h, 64, i)).collect();
        assert_eq!(t.submit_burst(clock.elapsed(), &mut queue), 4);
        let mut out = Vec::new();
        assert_eq!(t.poll_burst(clock.elapsed(), &mut out), 4);
        assert!(out
            .iter()
            .all(|j| j.desc.status == Status::Error(DescriptorError::Unavailable)));
        let c = t.counters();
        assert!(c.unavailable, "{transport}: {c:?}");
        assert_eq!((c.timed_out, c.refused_unavailable), (8, 4), "{transport}: {c:?}");
        // The server runs again: its late completions bring the engine back.
        server.signal(libc::SIGCONT);
        let until = Instant::now() + Duration::from_secs(5);
        while t.unavailable() && Instant::now() < until {
            t.poll_burst(clock.elapsed(), &mut out);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(!t.unavailable(), "{transport}: available again");
        assert!(!t.counters().unavailable);
        t.submit_burst(clock.elapsed(), &mut vec![gcm_job(h, 64, 200)].into());
        let back = collect(&mut t, clock, 1, Duration::from_secs(5));
        assert_eq!(back[0].desc.status, Status::Done, "{transport}: served again");
    }
}

/// A tenant that resizes its shared region (`ftruncate` on the memfd it
/// was given, shrinking it to nothing or growing it) cannot take the
/// server down: the region is sealed against both, so the call fails, and
/// the server goes on serving the other tenants. Before the seals, the
/// server died of SIGBUS at its next look at that tenant's ring, and with
/// it every tenant's engine.
#[test]
fn a_tenant_resizing_its_region_cannot_take_the_server_down() {
    use accel::shared::hostile::RawTenant;
    let dir = temp_dir("truncate");
    let socket = dir.join("engine.sock");
    let mut server = serve(&socket, "soft");
    let clock = Instant::now();
    let mut good = SharedEngine::attach(&SharedSpec {
        socket: socket.clone(),
        transport: Transport::Shm,
        entries: 16,
        slot_size: 2048,
        ..SharedSpec::default()
    })
    .expect("attaches");
    let spec = SessionSpec::new(Algorithm::Aes128Gcm16, false, &[7; 20], &[]).expect("keys");
    let h = good.register(&spec).expect("registers");
    for (round, shrink) in [true, false].into_iter().enumerate() {
        let hostile =
            RawTenant::attach(&socket, Transport::Shm, 16, 2048).expect("the hostile tenant attaches");
        let len = if shrink { 0 } else { hostile.region_len() * 4 };
        let resized = hostile.truncate(len);
        // Wake the server to look at the hostile tenant's ring.
        hostile.ring();
        std::thread::sleep(Duration::from_millis(200));
        let status = server.0.try_wait().expect("wait");
        assert!(status.is_none(), "the server died: {status:?}");
        let err = resized.expect_err("the region is sealed against resizing");
        assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
        let user = 10 * round as u64;
        t_submit(
            &mut good,
            clock,
            (0..8).map(|i| gcm_job(h, 64, user + i)).collect(),
        );
        let back = collect(&mut good, clock, 8, Duration::from_secs(5));
        assert_eq!(back.len(), 8, "the other tenant is served");
        assert!(back.iter().all(|j| j.desc.status == Status::Done));
    }
}

fn t_submit(t: &mut SharedEngine, clock: Instant, jobs: Vec<Job>) {
    let mut queue: VecDeque<Job> = jobs.into();
    let n = queue.len();
    assert_eq!(t.submit_burst(clock.elapsed(), &mut queue), n);
}
