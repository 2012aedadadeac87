//! The shared engine: bytes identical to the in-process engine over both
//! transports, and every isolation rule of the server refusing and
//! counting (another tenant's session, a released handle, regions outside
//! the tenant's own buffer, a dead or hung tenant reclaimed without
//! disturbing the others), plus a short soak of tenants attaching and
//! dying under load.
#![cfg(target_os = "linux")]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use accel::shared::wire::RequestEntry;
use accel::shared::{spawn, ServerConfig, ServerHandle, SharedEngine, SharedSpec, StatsReply, Transport};
use accel::{
    Algorithm, Descriptor, DescriptorError, Direction, Engine, EngineKind, EngineSpec, Job, NextCompletion,
    PacketBuf, Region, SessionHandle, SessionSpec, SoftEngine, Status,
};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn socket_path() -> PathBuf {
    std::env::temp_dir().join(format!(
        "espgw-shared-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fn server_with(engine: EngineKind, tweak: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    let mut config = ServerConfig::new(
        socket_path(),
        EngineSpec {
            kind: engine,
            ..EngineSpec::default()
        },
    );
    // Long enough that a tenant thread descheduled on a loaded machine is
    // not taken for a hung one.
    config.hung_after = Duration::from_millis(1000);
    tweak(&mut config);
    spawn(config).expect("server starts")
}

fn server() -> ServerHandle {
    server_with(EngineKind::Soft, |_| {})
}

fn tenant(server: &ServerHandle, transport: Transport) -> SharedEngine {
    SharedEngine::attach(&SharedSpec {
        socket: server.socket.clone(),
        transport,
        entries: 64,
        slot_size: 8192 + 256,
        ..SharedSpec::default()
    })
    .expect("tenant attaches")
}

fn spec(alg: Algorithm, seed: u8) -> SessionSpec {
    let enc: Vec<u8> = (0..alg.enc_key_len())
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect();
    let auth: Vec<u8> = (0..alg.auth_key_len()).map(|i| (0x40 + i as u8) ^ seed).collect();
    SessionSpec::new(alg, false, &enc, &auth).expect("valid keys")
}

fn descriptor(alg: Algorithm, payload: usize) -> Descriptor {
    Descriptor::esp(Direction::Encrypt, alg, payload, None)
}

fn request(alg: Algorithm, payload: usize, seed: u32) -> Vec<u8> {
    let len = 8 + alg.iv_len() + payload + alg.icv_len();
    (0..len)
        .map(|i| (seed as usize * 31 + i * 7 + (i >> 8)) as u8)
        .collect()
}

fn job(session: SessionHandle, alg: Algorithm, payload: usize, seed: u32) -> Job {
    let bytes = request(alg, payload, seed);
    let mut buf = PacketBuf::with_len(bytes.len());
    buf.data_mut().copy_from_slice(&bytes);
    Job::new(session, descriptor(alg, payload), buf, 0, u64::from(seed))
}

/// Submits every job and collects them back, waiting when the engine says so.
fn run(engine: &mut dyn Engine, jobs: Vec<Job>) -> Vec<Job> {
    let total = jobs.len();
    let mut queue: VecDeque<Job> = jobs.into();
    let mut out = Vec::with_capacity(total);
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < total && Instant::now() < deadline {
        engine.submit_burst(Duration::ZERO, &mut queue);
        engine.poll_burst(Duration::ZERO, &mut out);
        if engine.next_completion() == NextCompletion::External {
            engine.wait(Duration::from_millis(5));
        }
    }
    assert_eq!(out.len(), total, "every job comes back");
    assert_eq!(engine.in_flight(), 0);
    out.sort_by_key(|j| j.user);
    out
}

fn results(jobs: &[Job]) -> Vec<(Vec<u8>, Status)> {
    jobs.iter()
        .map(|j| (j.buf.data().to_vec(), j.desc.status))
        .collect()
}

/// Polls the server's published counters until `check` holds (they are
/// published every few passes).
fn eventually(server: &ServerHandle, what: &str, check: impl Fn(&StatsReply) -> bool) -> StatsReply {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = server.stats();
        if check(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn padded(alg: Algorithm, n: usize) -> usize {
    n.div_ceil(alg.pad_align()) * alg.pad_align()
}

#[test]
fn same_bytes_as_the_engine_in_process_over_both_transports() {
    let server = server();
    for transport in Transport::ALL {
        let mut shared = tenant(&server, transport);
        for alg in [
            Algorithm::Aes128Gcm16,
            Algorithm::Aes128Sha1,
            Algorithm::Aes256Sha256,
        ] {
            let mut soft = SoftEngine::default();
            let hs = shared.register(&spec(alg, 1)).expect("registers");
            let hl = soft.register(&spec(alg, 1)).expect("registers");
            // ESP sizes and 4 KB / 8 KB requests, more than the ring holds.
            let sizes: Vec<usize> = [16, 100, 1400, 4096, 8000].map(|n| padded(alg, n)).to_vec();
            let make = |h| -> Vec<Job> {
                (0..150u32)
                    .map(|i| job(h, alg, sizes[i as usize % sizes.len()], i))
                    .collect()
            };
            let got = run(&mut shared, make(hs));
            let want = run(&mut soft, make(hl));
            assert!(
                got.iter().all(|j| j.desc.status == Status::Done),
                "{transport} {alg}"
            );
            assert_eq!(
                results(&got),
                results(&want),
                "{transport} {alg}: identical bytes"
            );
            shared.release(hs);
        }
    }
    let s = eventually(&server, "executed", |s| {
        s.executed >= 900 && s.sessions_wiped >= 6
    });
    assert_eq!(s.refused(), 0, "{s:?}");
}

#[test]
fn another_tenants_session_is_refused_and_counted() {
    let server = server();
    let mut a = tenant(&server, Transport::Shm);
    let mut b = tenant(&server, Transport::Socket);
    let alg = Algorithm::Aes128Gcm16;
    let ha = a.register(&spec(alg, 1)).expect("registers");
    let hb = b.register(&spec(alg, 2)).expect("registers");
    // B names A's handle; A names B's: neither runs, neither sees the other's keys.
    let original = request(alg, 64, 3);
    for (engine, foreign) in [(&mut b as &mut dyn Engine, ha), (&mut a as &mut dyn Engine, hb)] {
        let back = run(engine, vec![job(foreign, alg, 64, 3)]);
        assert_eq!(back[0].desc.status, Status::Error(DescriptorError::BadSession));
        assert_eq!(back[0].buf.data(), &original[..], "nothing was executed");
    }
    let s = eventually(&server, "foreign refusals", |s| s.foreign_session == 2);
    assert_eq!(s.executed, 0);
    // Releasing another tenant's session is refused too, and it stays usable.
    b.release(ha);
    let s = eventually(&server, "foreign release", |s| s.foreign_session == 3);
    assert_eq!(s.sessions_wiped, 0);
    let back = run(&mut a, vec![job(ha, alg, 64, 4)]);
    assert_eq!(back[0].desc.status, Status::Done);
}

#[test]
fn a_released_or_forged_handle_is_refused_and_counted() {
    let server = server();
    for (k, transport) in Transport::ALL.into_iter().enumerate() {
        let mut t = tenant(&server, transport);
        let alg = Algorithm::Aes128Sha1;
        let h = t.register(&spec(alg, 1)).expect("registers");
        t.release(h);
        // Releases have no reply: wait until the server has done it (the
        // previous round's tenant took its other session with it).
        eventually(&server, "released", |s| s.sessions_wiped > 2 * k as u64);
        // The slot is reused by the next registration: the old generation
        // must still be refused, never reach the new keys.
        let h2 = t.register(&spec(alg, 9)).expect("registers");
        assert_eq!(h2.index, h.index);
        let forged = SessionHandle {
            index: 999,
            generation: 1,
        };
        let back = run(
            &mut t,
            vec![job(h, alg, 64, 1), job(forged, alg, 64, 2), job(h2, alg, 64, 3)],
        );
        assert_eq!(back[0].desc.status, Status::Error(DescriptorError::BadSession));
        assert_eq!(back[1].desc.status, Status::Error(DescriptorError::BadSession));
        assert_eq!(back[2].desc.status, Status::Done);
        assert_eq!(back[0].buf.data(), &request(alg, 64, 1)[..]);
    }
    // Each tenant released one session and took its other one with it.
    let s = eventually(&server, "stale refusals", |s| {
        s.stale_session == 4 && s.sessions_wiped == 4
    });
    assert_eq!(s.executed, 2);
}

#[test]
fn regions_outside_the_tenants_own_buffer_are_refused_and_counted() {
    let server = server();
    let mut t = tenant(&server, Transport::Shm);
    let alg = Algorithm::Aes128Gcm16;
    let h = t.register(&spec(alg, 1)).expect("registers");
    let area = 64 * (8192 + 256);
    let good = descriptor(alg, 64);
    let len = good.icv.end() as u32;
    let cases: Vec<(u32, u32, Descriptor)> = vec![
        // Data past the end of the data area (into the next mapping).
        (area as u32 - 16, len, good),
        // An offset that wraps round in 32 bits.
        (u32::MAX - 8, len, good),
        // Data inside, but the ICV region past the request's data.
        (0, len - 8, good),
        // Regions out of ESP order.
        (
            0,
            len,
            Descriptor {
                iv: Region::new(4, 8),
                ..good
            },
        ),
        // Larger than the slot the tenant asked for.
        (0, 8192 + 512, good),
    ];
    let n = cases.len();
    for (offset, data_len, desc) in cases {
        let entry = RequestEntry {
            user: 0,
            session: h,
            desc,
            data_offset: offset,
            data_len,
        };
        t.submit_raw(entry, job(h, alg, 64, 0)).expect("a free slot");
    }
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < n && Instant::now() < deadline {
        t.poll_burst(Duration::ZERO, &mut out);
        t.wait(Duration::from_millis(5));
    }
    assert_eq!(out.len(), n);
    assert!(out
        .iter()
        .all(|j| j.desc.status == Status::Error(DescriptorError::BadRegions)));
    let s = eventually(&server, "region refusals", |s| s.bad_region == n as u64);
    assert_eq!(s.executed, 0);
    // The tenant is still served.
    let back = run(&mut t, vec![job(h, alg, 64, 1)]);
    assert_eq!(back[0].desc.status, Status::Done);
    // Over the socket: a descriptor whose ICV runs past the request's data
    // (the tenant side does not check; the server does).
    let mut st = tenant(&server, Transport::Socket);
    let hs = st.register(&spec(alg, 1)).expect("registers");
    let mut bad = job(hs, alg, 64, 2);
    bad.desc.icv = Region::new(bad.desc.icv.offset as usize, 64);
    let original = bad.buf.data().to_vec();
    let back = run(&mut st, vec![bad, job(hs, alg, 64, 3)]);
    assert_eq!(back[0].desc.status, Status::Error(DescriptorError::BadRegions));
    assert_eq!(back[0].buf.data(), &original[..], "nothing was executed");
    assert_eq!(back[1].desc.status, Status::Done);
    eventually(&server, "socket region refusal", |s| s.bad_region == n as u64 + 1);
}

/// Keeps one tenant busy and checks every result against soft: how many
/// rounds it ran, and the tenant, still attached (it detaches, and is
/// counted reclaimed, when the caller drops it).
fn steady(server: &ServerHandle, for_how_long: Duration) -> (usize, SharedEngine) {
    let mut t = tenant(server, Transport::Shm);
    let mut soft = SoftEngine::default();
    let alg = Algorithm::Aes128Sha1;
    let hs = t.register(&spec(alg, 5)).expect("registers");
    let hl = soft.register(&spec(alg, 5)).expect("registers");
    let until = Instant::now() + for_how_long;
    let mut rounds = 0;
    while Instant::now() < until {
        let seeds = (rounds * 32)..(rounds * 32 + 32);
        let got = run(
            &mut t,
            seeds.clone().map(|i| job(hs, alg, 256, i as u32)).collect(),
        );
        let want = run(&mut soft, seeds.map(|i| job(hl, alg, 256, i as u32)).collect());
        assert_eq!(results(&got), results(&want), "the steady tenant is undisturbed");
        rounds += 1;
    }
    (rounds, t)
}

#[test]
fn a_hung_tenant_is_reclaimed_and_the_others_notice_nothing() {
    let server = server();
    let mut hung = tenant(&server, Transport::Shm);
    let alg = Algorithm::Aes128Gcm16;
    let h = hung.register(&spec(alg, 1)).expect("registers");
    let mut queue: VecDeque<Job> = (0..8).map(|i| job(h, alg, 64, i)).collect();
    assert_eq!(hung.submit_burst(Duration::ZERO, &mut queue), 8);
    // ... and never polls again.
    // The steady tenant stays attached until the counts below are read:
    // its detach would count as a second reclaim.
    let (rounds, _steady) = steady(&server, Duration::from_millis(1500));
    assert!(rounds > 0);
    let s = eventually(&server, "hung tenant reclaimed", |s| s.reclaimed == 1);
    assert_eq!(s.tenants, 1, "only the steady tenant is left: {s:?}");
    assert!(s.sessions_wiped >= 1, "the hung tenant's keys are wiped");
    // The hung tenant, when it wakes, finds what completed before it was
    // let go; what it submits afterwards comes back failed once it learns
    // (from the server's parting message) that it was, never lost.
    let mut back = Vec::new();
    hung.poll_burst(Duration::ZERO, &mut back);
    assert_eq!(back.len(), 8);
    assert!(back.iter().all(|j| j.desc.status == Status::Done));
    let mut late: VecDeque<Job> = vec![job(h, alg, 64, 9)].into();
    hung.submit_burst(Duration::ZERO, &mut late);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !hung.server_gone() && Instant::now() < deadline {
        hung.wait(Duration::from_millis(10));
    }
    assert!(hung.server_gone());
    back.clear();
    assert_eq!(hung.reclaim(Duration::ZERO, &mut back), 1);
    assert_eq!(back[0].desc.status, Status::Error(DescriptorError::Fault));
    assert_eq!(hung.in_flight(), 0);
}

/// Run as a child process by the next test: attaches, floods, and is
/// killed mid-flight.
#[test]
fn child_tenant_that_is_killed() {
    let Ok(path) = std::env::var("ESPGW_SHARED_CHILD") else {
        return;
    };
    let mut t = SharedEngine::attach(&SharedSpec {
        socket: path.into(),
        transport: Transport::Shm,
        entries: 64,
        slot_size: 4096,
        ..SharedSpec::default()
    })
    .expect("child attaches");
    let alg = Algorithm::Aes128Sha1;
    let h = t.register(&spec(alg, 7)).expect("registers");
    println!("READY");
    let mut queue = VecDeque::new();
    let mut out = Vec::new();
    let mut i = 0u32;
    loop {
        while queue.len() < 64 {
            queue.push_back(job(h, alg, 1024, i));
            i += 1;
        }
        t.submit_burst(Duration::ZERO, &mut queue);
        t.poll_burst(Duration::ZERO, &mut out);
        out.clear();
    }
}

fn kill_child_tenants(server: &ServerHandle, count: usize) {
    use std::io::{BufRead, BufReader};
    for _ in 0..count {
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "child_tenant_that_is_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ESPGW_SHARED_CHILD", &server.socket)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("child starts");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        assert!(
            lines.any(|l| l.is_ok_and(|l| l.contains("READY"))),
            "the child attached"
        );
        std::thread::sleep(Duration::from_millis(30));
        child.kill().expect("kill");
        child.wait().expect("reaped");
    }
}

#[test]
fn a_killed_tenant_is_reclaimed_and_the_others_notice_nothing() {
    let server = server();
    let watcher = std::thread::scope(|scope| {
        let steady = scope.spawn(|| steady(&server, Duration::from_millis(1200)).0);
        kill_child_tenants(&server, 2);
        steady.join().expect("steady tenant")
    });
    assert!(watcher > 0);
    let s = eventually(&server, "killed tenants reclaimed", |s| s.reclaimed >= 3);
    // Two children and the steady tenant, which detached at the end.
    assert_eq!(s.tenants, 0, "{s:?}");
    assert_eq!(s.sessions_wiped, 3, "every session's keys wiped: {s:?}");
    assert_eq!(s.refused(), 0, "{s:?}");
}

/// Soak: tenants attach, work and die (killed processes and dropped
/// engines) for a few seconds while a steady tenant checks every byte.
#[test]
fn soak_tenants_attaching_and_dying_under_load() {
    let server = server_with(EngineKind::Soft, |c| c.quota = 32);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let steady = scope.spawn(|| steady(&server, Duration::from_secs(3)).0);
        let churn = scope.spawn(|| {
            let mut n = 0;
            while started.elapsed() < Duration::from_millis(2500) {
                let transport = Transport::ALL[n % 2];
                let mut t = tenant(&server, transport);
                let alg = Algorithm::Aes128Gcm16;
                let h = t.register(&spec(alg, n as u8)).expect("registers");
                let jobs: Vec<Job> = (0..48).map(|i| job(h, alg, 512, i)).collect();
                if n % 4 < 2 {
                    let back = run(&mut t, jobs);
                    assert!(back.iter().all(|j| j.desc.status == Status::Done));
                } else {
                    // Leave with jobs in flight.
                    t.submit_burst(Duration::ZERO, &mut jobs.into());
                }
                drop(t);
                n += 1;
            }
            n
        });
        kill_child_tenants(&server, 3);
        assert!(steady.join().expect("steady") > 0);
        assert!(churn.join().expect("churn") > 0);
    });
    let s = eventually(&server, "all reclaimed", |s| s.tenants == 0);
    assert_eq!(s.reclaimed, s.attached, "{s:?}");
    assert_eq!(s.refused(), 0, "{s:?}");
}

#[test]
fn the_socket_is_owner_only_and_never_taken_from_a_live_server_or_a_file() {
    use std::os::unix::fs::PermissionsExt;
    let server = server();
    let mode = std::fs::metadata(&server.socket)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let spec = EngineSpec::default();
    let again = accel::shared::Server::bind(ServerConfig::new(server.socket.clone(), spec.clone()));
    assert!(matches!(again, Err(accel::shared::ServeError::InUse { .. })));
    let path = server.socket.clone();
    server.stop().expect("stops");
    assert!(!path.exists(), "a stopped server removes its socket");
    std::fs::write(&path, b"not a socket").unwrap();
    let on_file = accel::shared::Server::bind(ServerConfig::new(path.clone(), spec.clone()));
    assert!(matches!(
        on_file,
        Err(accel::shared::ServeError::NotASocket { .. })
    ));
    std::fs::remove_file(&path).unwrap();
    let nested = accel::shared::Server::bind(ServerConfig::new(
        path,
        EngineSpec {
            kind: EngineKind::Shared,
            ..spec
        },
    ));
    assert!(matches!(nested, Err(accel::shared::ServeError::Nested)));
}

/// Round robin with quotas: a tenant flooding large requests does not hold
/// up a light one, whose every small burst comes back promptly and right.
#[test]
fn a_flooding_tenant_does_not_starve_a_light_one() {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let server = server_with(EngineKind::Soft, |c| c.quota = 16);
    let stop = AtomicBool::new(false);
    let flooded = AtomicUsize::new(0);
    let alg = Algorithm::Aes128Sha1;
    std::thread::scope(|scope| {
        let flood = scope.spawn(|| {
            let mut t = tenant(&server, Transport::Shm);
            let h = t.register(&spec(alg, 3)).expect("registers");
            let mut queue = VecDeque::new();
            let mut out = Vec::new();
            let mut done = 0usize;
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                while queue.len() + t.in_flight() < 64 {
                    queue.push_back(job(h, alg, 8000, i));
                    i += 1;
                }
                t.submit_burst(Duration::ZERO, &mut queue);
                done += t.poll_burst(Duration::ZERO, &mut out);
                flooded.store(done, Ordering::Relaxed);
                out.clear();
                if t.next_completion() == NextCompletion::External {
                    t.wait(Duration::from_millis(1));
                }
            }
            done
        });
        // The flood is under way before the light tenant starts.
        let deadline = Instant::now() + Duration::from_secs(10);
        while flooded.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let before = flooded.load(Ordering::Relaxed);
        assert!(before > 0, "the flood started");
        let mut light = tenant(&server, Transport::Socket);
        let mut soft = SoftEngine::default();
        let hl = light.register(&spec(alg, 4)).expect("registers");
        let hs = soft.register(&spec(alg, 4)).expect("registers");
        let mut slowest = Duration::ZERO;
        for round in 0..20u32 {
            let seeds = round * 8..round * 8 + 8;
            let began = Instant::now();
            let got = run(&mut light, seeds.clone().map(|i| job(hl, alg, 64, i)).collect());
            slowest = slowest.max(began.elapsed());
            let want = run(&mut soft, seeds.map(|i| job(hs, alg, 64, i)).collect());
            assert_eq!(results(&got), results(&want));
        }
        stop.store(true, Ordering::Relaxed);
        let total = flood.join().expect("flooder");
        assert!(total > before, "the flooder was served meanwhile too");
        assert!(
            slowest < Duration::from_secs(1),
            "a light burst took {slowest:?} behind the flood"
        );
    });
}

/// A release costs the tenant no round trip, and jobs it submitted before
/// releasing still run with the session's keys.
#[test]
fn jobs_submitted_before_a_release_still_run() {
    let server = server();
    for transport in Transport::ALL {
        let mut t = tenant(&server, transport);
        let mut soft = SoftEngine::default();
        let alg = Algorithm::Aes128Gcm16;
        let h = t.register(&spec(alg, 6)).expect("registers");
        let hl = soft.register(&spec(alg, 6)).expect("registers");
        let mut queue: VecDeque<Job> = (0..40).map(|i| job(h, alg, 1400, i)).collect();
        let taken = t.submit_burst(Duration::ZERO, &mut queue);
        assert_eq!(taken, 40);
        t.release(h);
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.len() < 40 && Instant::now() < deadline {
            t.poll_burst(Duration::ZERO, &mut out);
            t.wait(Duration::from_millis(2));
        }
        out.sort_by_key(|j| j.user);
        let want = run(&mut soft, (0..40).map(|i| job(hl, alg, 1400, i)).collect());
        assert_eq!(results(&out), results(&want), "{transport}");
        // And afterwards the handle is refused.
        let back = run(&mut t, vec![job(h, alg, 64, 99)]);
        assert_eq!(back[0].desc.status, Status::Error(DescriptorError::BadSession));
    }
    let s = eventually(&server, "wiped", |s| {
        s.sessions_wiped >= 2 && s.stale_session == 2
    });
    assert_eq!(s.executed, 80);
}

/// A refusal keeps its place: behind the sec model (whose jobs take
/// modelled time, so they are still in the engine when the server reads
/// the refused request) the tenant sees its completions in submission
/// order, the refused job after every job submitted before it and before
/// every job submitted after it, and the refusal is counted.
#[test]
fn a_refusal_does_not_overtake_the_tenants_earlier_jobs() {
    let server = server_with(EngineKind::Sec, |_| {});
    let alg = Algorithm::Aes128Sha1;
    for (k, transport) in Transport::ALL.into_iter().enumerate() {
        let mut t = tenant(&server, transport);
        let h = t.register(&spec(alg, 3)).expect("registers");
        let forged = SessionHandle {
            index: 777,
            generation: 3,
        };
        // 16 accepted, one refused (a handle that was never registered),
        // 8 accepted: one burst, so the server reads them in one pass.
        let mut queue: VecDeque<Job> = (0..25u32)
            .map(|i| job(if i == 16 { forged } else { h }, alg, padded(alg, 1400), i))
            .collect();
        assert_eq!(t.submit_burst(Duration::ZERO, &mut queue), 25);
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.len() < 25 && Instant::now() < deadline {
            t.poll_burst(Duration::ZERO, &mut out);
            t.wait(Duration::from_millis(2));
        }
        let order: Vec<u64> = out.iter().map(|j| j.user).collect();
        assert_eq!(
            order,
            (0..25).collect::<Vec<u64>>(),
            "{transport}: submission order"
        );
        for j in &out {
            let want = if j.user == 16 {
                Status::Error(DescriptorError::BadSession)
            } else {
                Status::Done
            };
            assert_eq!(j.desc.status, want, "{transport}: job {}", j.user);
        }
        let s = eventually(&server, "the refusal counted", |s| {
            s.stale_session == k as u64 + 1 && s.executed == 24 * (k as u64 + 1)
        });
        assert_eq!(s.refused(), k as u64 + 1, "{s:?}");
    }
}

/// The deadline holds on the wall clock too: a caller's clock that jumps
/// (an offline capture's timestamps across a gap) times out nothing of a
/// server that is answering, and the engine stays available.
#[test]
fn a_jumping_caller_clock_times_out_nothing_of_a_live_server() {
    let server = server();
    for transport in Transport::ALL {
        let mut t = SharedEngine::attach(&SharedSpec {
            socket: server.socket.clone(),
            transport,
            entries: 64,
            slot_size: 8192 + 256,
            deadline: Duration::from_millis(200),
        })
        .expect("tenant attaches");
        let alg = Algorithm::Aes128Gcm16;
        let h = t.register(&spec(alg, 2)).expect("registers");
        let mut queue: VecDeque<Job> = (0..32).map(|i| job(h, alg, padded(alg, 1400), i)).collect();
        assert_eq!(t.submit_burst(Duration::ZERO, &mut queue), 32);
        // Ten seconds later on the caller's clock, microseconds on the wall's.
        let later = Duration::from_secs(10);
        let mut out = Vec::new();
        t.reclaim(later, &mut out);
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.len() < 32 && Instant::now() < deadline {
            t.poll_burst(later, &mut out);
            t.wait(Duration::from_millis(2));
        }
        assert_eq!(out.len(), 32, "{transport}");
        assert!(out.iter().all(|j| j.desc.status == Status::Done), "{transport}");
        assert!(!t.unavailable(), "{transport}");
        assert_eq!(t.counters().timed_out, 0, "{transport}");
    }
}
