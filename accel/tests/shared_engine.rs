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
        // The release is answered at once, but the keys are wiped only
        // once the session's earlier requests are with the engine: wait
        // until the server has done it (the previous round's tenant took
        // its other session with it).
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

/// A release does not wait for the session's jobs: jobs the tenant
/// submitted before releasing still run with the session's keys.
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

/// A timeout needs real time too, as the driver's waits see it: a
/// caller's clock that jumps (an offline capture's timestamps across a
/// gap) times out nothing of a server that is answering, and the engine
/// stays available.
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

/// An engine that takes every job and never gives one back: a server
/// stuck on its engine, still connected.
#[derive(Default)]
struct BlackHole {
    sessions: SoftEngine,
    held: Vec<Job>,
}

impl Engine for BlackHole {
    fn kind(&self) -> EngineKind {
        EngineKind::Soft
    }
    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, accel::RegisterError> {
        self.sessions.register(spec)
    }
    fn release(&mut self, handle: SessionHandle) {
        self.sessions.release(handle)
    }
    fn submit_burst(&mut self, _now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        let n = jobs.len();
        self.held.extend(jobs.drain(..));
        n
    }
    fn poll_burst(&mut self, _now: Duration, _out: &mut Vec<Job>) -> usize {
        0
    }
    fn next_completion(&self) -> NextCompletion {
        NextCompletion::External
    }
    fn in_flight(&self) -> usize {
        self.held.len()
    }
    fn counters(&self) -> accel::EngineCounters {
        accel::EngineCounters::default()
    }
}

/// The tenant's poll path reads no clock: behind a server that never
/// answers, jobs overdue on the caller's clock are only suspect however
/// much real time passes between polls, and time out (in submission
/// order, the engine then unavailable) once the driver has waited out a
/// quarter of the deadline in `wait`, the one call that reads the clock.
#[test]
fn a_timeout_is_confirmed_by_the_drivers_waits_not_by_the_poll_path() {
    timeouts_confirmed_by(|t| t.wait(Duration::from_millis(5)));
}

/// A live driver whose traffic never lets it wait reports its clock once
/// a turn instead (`observe_clock`): that confirms the timeouts as well.
#[test]
fn a_busy_drivers_clock_confirms_timeouts_without_a_wait() {
    timeouts_confirmed_by(|t| {
        std::thread::sleep(Duration::from_millis(5));
        t.observe_clock(Instant::now());
    });
}

/// Jobs behind a server that never answers time out once `confirm`, the
/// driver's part, has let a quarter of the deadline of real time pass.
fn timeouts_confirmed_by(confirm: impl Fn(&mut SharedEngine)) {
    let deadline = Duration::from_millis(200);
    let server = accel::shared::spawn_with_engine(
        ServerConfig::new(socket_path(), EngineSpec::default()),
        Box::new(BlackHole::default()),
    )
    .expect("server starts");
    for transport in Transport::ALL {
        let mut t = SharedEngine::attach(&SharedSpec {
            socket: server.socket.clone(),
            transport,
            entries: 16,
            slot_size: 2048,
            deadline,
        })
        .expect("tenant attaches");
        let alg = Algorithm::Aes128Gcm16;
        let h = t.register(&spec(alg, 3)).expect("registers");
        let mut queue: VecDeque<Job> = (0..6).map(|i| job(h, alg, 64, i)).collect();
        assert_eq!(t.submit_burst(Duration::ZERO, &mut queue), 6);
        let later = Duration::from_secs(10);
        let mut out = Vec::new();
        // Real time well past the grace, but no wait: nothing times out.
        for _ in 0..4 {
            t.poll_burst(later, &mut out);
            t.reclaim(later, &mut out);
            std::thread::sleep(deadline / 4);
        }
        assert!(
            out.is_empty(),
            "{transport}: {:?}",
            out.iter().map(|j| j.desc.status).collect::<Vec<_>>()
        );
        assert!(!t.unavailable(), "{transport}");
        // The driver's clock: once the grace is over on it, they do.
        let waiting = Instant::now();
        while out.len() < 6 && waiting.elapsed() < Duration::from_secs(5) {
            confirm(&mut t);
            t.poll_burst(later, &mut out);
        }
        assert!(
            waiting.elapsed() >= deadline / 4,
            "{transport}: {:?}",
            waiting.elapsed()
        );
        assert_eq!(
            users(&out),
            (0..6).collect::<Vec<u64>>(),
            "{transport}: in submission order"
        );
        assert!(out
            .iter()
            .all(|j| j.desc.status == Status::Error(DescriptorError::Timeout)));
        assert!(t.unavailable(), "{transport}");
        assert_eq!(t.counters().timed_out, 6, "{transport}");
    }
}

fn users(jobs: &[Job]) -> Vec<u64> {
    jobs.iter().map(|j| j.user).collect()
}

// ---------------------------------------------------------------------------
// Hostile tenants: the server's threat model.
// ---------------------------------------------------------------------------

use accel::shared::hostile::{RawTenant, UnsealedServer};
use accel::shared::server::MAX_STRIKES;
use accel::shared::wire::op;

/// A tenant flooding its control socket (garbage, or valid requests whose
/// answers it never reads) is let go after a bounded number of its
/// messages, while a steady tenant's every request is served and right.
/// Over both transports, and from a connection that never attached.
#[test]
fn a_tenant_flooding_its_control_socket_is_evicted_while_the_others_are_served() {
    let server = server();
    let garbage = [0x42u8; 16];
    let shm = RawTenant::attach(&server.socket, Transport::Shm, 16, 2048).expect("attaches");
    let socket = RawTenant::attach(&server.socket, Transport::Socket, 16, 2048).expect("attaches");
    let unattached = RawTenant::connect(&server.socket).expect("connects");
    // Valid requests, pipelined, their answers never read.
    let deaf = RawTenant::attach(&server.socket, Transport::Shm, 16, 2048).expect("attaches");
    let flooders = [
        ("garbage over shm", &shm, &garbage[..]),
        ("garbage over socket", &socket, &garbage[..]),
        ("garbage before attaching", &unattached, &garbage[..]),
        ("stats never read", &deaf, &[op::STATS][..]),
    ];
    for (who, t, msg) in flooders {
        let sent = t.fill(msg, 100_000);
        assert!(sent > 2 * MAX_STRIKES, "{who}: only {sent} messages went out");
    }
    let (rounds, _steady) = steady(&server, Duration::from_millis(500));
    assert!(rounds > 0);
    for (who, t, _) in flooders {
        let (answers, closed) = t.drain_until_closed(Duration::from_secs(5));
        assert!(closed, "{who}: still connected after {} answers", answers.len());
        // The strikes' refusals (or the one answer read in lock-step) and
        // the parting message: nothing like the flood's length.
        assert!(
            answers.len() <= MAX_STRIKES + 1,
            "{who}: the server answered {} of its messages",
            answers.len()
        );
    }
    let s = eventually(&server, "flooders evicted", |s| s.evicted == 4);
    assert!(
        s.malformed <= 3 * MAX_STRIKES as u64,
        "the server read only a bounded part of the floods: {s:?}"
    );
}

/// Connections that never attach are closed after the attach deadline (or
/// to make room for newer ones) and counted; they never lock out a tenant
/// or the operator's `stats`, which also answers with the tenant table full.
#[test]
fn idle_connections_lock_out_neither_tenants_nor_stats() {
    let server = server_with(EngineKind::Soft, |c| {
        c.max_tenants = 2;
        c.attach_within = Duration::from_millis(300);
    });
    let idle: Vec<RawTenant> = (0..64)
        .map(|_| RawTenant::connect(&server.socket).expect("connects"))
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let s = accel::shared::query_stats(&server.socket).expect("stats answers beside idle connections");
    assert_eq!(s.tenants, 0, "{s:?}");
    let alg = Algorithm::Aes128Gcm16;
    let mut a = tenant(&server, Transport::Shm);
    let mut b = tenant(&server, Transport::Socket);
    for t in [&mut a, &mut b] {
        let h = t.register(&spec(alg, 1)).expect("registers");
        let back = run(t, vec![job(h, alg, 64, 1)]);
        assert_eq!(back[0].desc.status, Status::Done);
    }
    // The table is full: a third tenant is refused, stats still answers.
    let third = SharedEngine::attach(&SharedSpec {
        socket: server.socket.clone(),
        ..SharedSpec::default()
    });
    assert!(
        matches!(&third, Err(accel::shared::AttachError::Refused(r)) if r.contains("maximum")),
        "{third:?}"
    );
    let s = accel::shared::query_stats(&server.socket).expect("stats answers with the table full");
    assert_eq!(s.tenants, 2, "{s:?}");
    for c in &idle {
        let (_, closed) = c.drain_until_closed(Duration::from_secs(5));
        assert!(closed, "an idle connection is closed");
    }
    let s = eventually(&server, "idle connections counted", |s| s.idle_closed == 64);
    assert_eq!(s.evicted, 0, "{s:?}");
}

/// The tenant maps memory the server created only if the server sealed it
/// against resizing: an unsealed region (which a third party holding the
/// descriptor could shrink under the tenant) is refused, with the reason.
#[test]
fn a_tenant_refuses_a_region_the_server_did_not_seal() {
    let path = socket_path();
    let fake = UnsealedServer::start(&path).expect("listens");
    let attached = SharedEngine::attach(&SharedSpec {
        socket: path.clone(),
        transport: Transport::Shm,
        entries: 16,
        slot_size: 2048,
        ..SharedSpec::default()
    });
    let err = attached.expect_err("an unsealed region is refused");
    assert!(err.to_string().contains("sealed"), "{err}");
    fake.finish().expect("the fake server ran");
    let _ = std::fs::remove_file(&path);
}

const MASK: u8 = 0xa5;

/// Where `masked` (a key XOR [`MASK`], so that the needle itself never
/// lies in memory in the clear) occurs in this process's readable memory,
/// every mapping of it: the heap, every thread's stack, the shared regions.
fn occurrences_in_memory(masked: &[&[u8]]) -> Vec<usize> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let mem = std::fs::File::open("/proc/self/mem").expect("mem");
    let mut chunk = vec![0u8; 1 << 20];
    // The buffer itself is not scanned: it holds what the last read copied.
    let own = (chunk.as_ptr() as u64, chunk.as_ptr() as u64 + chunk.len() as u64);
    let longest = masked.iter().map(|m| m.len()).max().unwrap_or(1);
    let mut found = vec![0; masked.len()];
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.contains("[vvar") || line.contains("[vsyscall]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut at = start;
        while at < end {
            if (own.0..own.1).contains(&at) {
                at = own.1;
                continue;
            }
            let stop = if at < own.0 { end.min(own.0) } else { end };
            let want = ((stop - at) as usize).min(chunk.len());
            let Ok(got) = mem.read_at(&mut chunk[..want], at) else {
                break;
            };
            if got == 0 {
                break;
            }
            let hay = &chunk[..got];
            for (k, needle) in masked.iter().enumerate() {
                let first = needle[0] ^ MASK;
                let mut i = 0;
                while let Some(p) = hay[i..].iter().position(|&b| b == first) {
                    let s = i + p;
                    if s + needle.len() > hay.len() {
                        break;
                    }
                    if hay[s..s + needle.len()]
                        .iter()
                        .zip(needle.iter())
                        .all(|(h, n)| *h == *n ^ MASK)
                    {
                        found[k] += 1;
                    }
                    i = s + 1;
                }
            }
            zeroize_vec(&mut chunk[..got]);
            // Overlap the next read so that a key across the boundary is seen.
            at += if got == want && at + (got as u64) < stop {
                (got - (longest - 1)) as u64
            } else {
                got as u64
            };
        }
    }
    zeroize_vec(&mut chunk);
    found
}

fn zeroize_vec(v: &mut [u8]) {
    for b in v.iter_mut() {
        // SAFETY: a volatile write to a byte we own.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
}

/// Random key bytes, returned masked (the clear key is handed to `use_key`
/// and wiped after).
fn random_key(len: usize) -> (zeroize::Zeroizing<Vec<u8>>, Vec<u8>) {
    let mut key = zeroize::Zeroizing::new(vec![0u8; len]);
    // SAFETY: getrandom writes `len` bytes into the buffer we own.
    let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), len, 0) };
    assert_eq!(n, len as isize);
    let masked = key.iter().map(|b| b ^ MASK).collect();
    (key, masked)
}

/// Keys die with their sessions: once a tenant releases a session (or
/// detaches, taking its sessions with it), no copy of its keys, on any
/// heap or stack of this process (the server is a thread of it), remains.
#[test]
fn a_released_sessions_keys_are_nowhere_in_the_servers_memory() {
    let server = server();
    // The scanner finds what is there: a canary held while it scans.
    let (canary, canary_masked) = random_key(24);
    assert_eq!(occurrences_in_memory(&[&canary_masked]), vec![1]);
    drop(canary);
    assert_eq!(occurrences_in_memory(&[&canary_masked]), vec![0]);
    for (k, alg) in [
        Algorithm::Aes128Gcm16,
        Algorithm::Aes256Sha256,
        Algorithm::Aes128Sha1,
    ]
    .into_iter()
    .enumerate()
    {
        let mut t = tenant(&server, Transport::ALL[k % 2]);
        let (enc, enc_masked) = random_key(alg.enc_key_len());
        let (auth, auth_masked) = random_key(alg.auth_key_len().max(1));
        let session = SessionSpec::new(alg, false, &enc, &auth[..alg.auth_key_len()]).expect("keys");
        drop((enc, auth));
        let h = t.register(&session).expect("registers");
        drop(session);
        let back = run(&mut t, (0..16).map(|i| job(h, alg, 256, i)).collect());
        assert!(back.iter().all(|j| j.desc.status == Status::Done));
        // The AES key without its salt: what a key schedule starts with.
        let aes = &enc_masked[..alg.enc_key_len() - if alg.is_aead() { 4 } else { 0 }];
        let mut needles: Vec<&[u8]> = vec![aes];
        if alg.auth_key_len() > 0 {
            needles.push(&auth_masked);
        }
        let wiped = server.stats().sessions_wiped;
        if k < 2 {
            t.release(h);
        } else {
            // Detaching takes the session with it.
            drop(t);
        }
        eventually(&server, "session wiped", |s| s.sessions_wiped > wiped);
        // The server goes on serving meanwhile (its stack in use again).
        steady(&server, Duration::from_millis(50));
        let found = occurrences_in_memory(&needles);
        assert!(found.iter().all(|&n| n == 0), "{alg}: key copies found {found:?}");
    }
}

/// The kernel engine's costs without the kernel: soft's crypto under the
/// afalg engine's name, so that the server charges each session what an
/// afalg session holds in file descriptors ([`accel::afalg::session_fds`]).
struct CostsLikeAfalg(SoftEngine);

impl Engine for CostsLikeAfalg {
    fn kind(&self) -> EngineKind {
        EngineKind::Afalg
    }
    fn register(&mut self, spec: &SessionSpec) -> Result<SessionHandle, accel::RegisterError> {
        self.0.register(spec)
    }
    fn release(&mut self, handle: SessionHandle) {
        self.0.release(handle)
    }
    fn submit_burst(&mut self, now: Duration, jobs: &mut VecDeque<Job>) -> usize {
        self.0.submit_burst(now, jobs)
    }
    fn poll_burst(&mut self, now: Duration, out: &mut Vec<Job>) -> usize {
        self.0.poll_burst(now, out)
    }
    fn next_completion(&self) -> NextCompletion {
        self.0.next_completion()
    }
    fn in_flight(&self) -> usize {
        self.0.in_flight()
    }
    fn counters(&self) -> accel::EngineCounters {
        self.0.counters()
    }
}

/// Sessions are bounded by what they cost the server in file descriptors,
/// per tenant and for all tenants together: over either bound a
/// registration is refused with the reason and counted, and a release
/// gives its descriptors back. (Without the bound, one tenant registering
/// afalg sessions could take every descriptor the server has.)
#[test]
fn sessions_are_bounded_by_their_descriptors_per_tenant_and_in_all() {
    let alg = Algorithm::Aes128Sha1;
    let cost = accel::afalg::session_fds(alg);
    assert_eq!(cost, 6, "three transforms, each with its operation socket");
    let mut config = ServerConfig::new(socket_path(), EngineSpec::default());
    config.fds = accel::shared::FdLimits {
        per_tenant: Some(3 * cost),
        total: Some(5 * cost),
    };
    let server = accel::shared::spawn_with_engine(config, Box::new(CostsLikeAfalg(SoftEngine::default())))
        .expect("server starts");
    let mut a = tenant(&server, Transport::Shm);
    let mut b = tenant(&server, Transport::Socket);
    let held: Vec<SessionHandle> = (0..3)
        .map(|k| a.register(&spec(alg, k)).expect("within the tenant's share"))
        .collect();
    let over = a.register(&spec(alg, 9)).expect_err("past the tenant's share");
    assert!(
        over.to_string().contains("file descriptors") && over.to_string().contains("this tenant"),
        "{over}"
    );
    let hb: Vec<SessionHandle> = (0..2)
        .map(|k| b.register(&spec(alg, 10 + k)).expect("within the total"))
        .collect();
    let over = b.register(&spec(alg, 12)).expect_err("past the total");
    assert!(over.to_string().contains("all tenants"), "{over}");
    // Still served; and a release gives its descriptors back.
    let back = run(&mut a, vec![job(held[0], alg, 64, 1)]);
    assert_eq!(back[0].desc.status, Status::Done);
    a.release(held[0]);
    eventually(&server, "released", |s| s.sessions_wiped == 1);
    let again = b
        .register(&spec(alg, 12))
        .expect("a released session's descriptors are free again");
    let back = run(&mut b, vec![job(again, alg, 64, 2), job(hb[0], alg, 64, 3)]);
    assert!(back.iter().all(|j| j.desc.status == Status::Done));
    let s = eventually(&server, "refusals counted", |s| s.over_budget == 2);
    assert_eq!(s.refused(), 0, "{s:?}");
}
