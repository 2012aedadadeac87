//! The `sec` engine model: its timeline comes from its profile and the
//! `now` it is given (deterministic, exact), its bytes are the soft
//! engine's, and it keeps the `Engine` contract (order, back-pressure,
//! faults, sessions). The threaded variant is checked for bytes and order.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use accel::sec::{bus_bytes, DESCRIPTOR_BYTES};
use accel::{
    Algorithm, BufferPolicy, Completion, Descriptor, DescriptorError, DescriptorKind, DeviceProfile,
    Direction, Engine, EngineCounters, EuKind, FaultPlan, Job, NextCompletion, PacketPool, Region, SecConfig,
    SecEngine, SessionHandle, SessionSpec, SoftEngine, Status, ThreadedSecEngine,
};

const HDR: usize = 8;

fn spec(alg: Algorithm, seed: u8) -> SessionSpec {
    // Distinct bytes, so 3DES's three parts always differ.
    let enc: Vec<u8> = (0..alg.enc_key_len() as u8)
        .map(|i| i.wrapping_mul(7).wrapping_add(seed).wrapping_add(1))
        .collect();
    let auth: Vec<u8> = (0..alg.auth_key_len() as u8)
        .map(|i| i.wrapping_mul(3) ^ seed)
        .collect();
    SessionSpec::new(alg, false, &enc, &auth).expect("valid keys")
}

fn desc(
    alg: Algorithm,
    kind: DescriptorKind,
    direction: Direction,
    cipher_len: usize,
    esn: Option<u32>,
) -> Descriptor {
    let (iv, icv) = (alg.iv_len(), alg.icv_len());
    Descriptor {
        kind,
        direction,
        auth_only: Region::new(0, HDR),
        esn_high: esn,
        iv: Region::new(HDR, iv),
        cipher: Region::new(HDR + iv, cipher_len),
        icv: Region::new(HDR + iv + cipher_len, icv),
        status: Status::Pending,
    }
}

fn packet(alg: Algorithm, cipher_len: usize, seed: u32) -> Vec<u8> {
    let len = HDR + alg.iv_len() + cipher_len + alg.icv_len();
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (x >> 16) as u8
        })
        .collect()
}

fn job(handle: SessionHandle, desc: Descriptor, bytes: &[u8], user: u64) -> Job {
    let mut pool = PacketPool::new(1);
    let mut buf = pool.alloc().expect("a buffer");
    assert!(buf.fill(bytes));
    Job::new(handle, desc, buf, 0, user)
}

fn aes_job(handle: SessionHandle, cipher_len: usize, user: u64) -> Job {
    let alg = Algorithm::Aes128Sha1;
    let d = desc(
        alg,
        DescriptorKind::SinglePass,
        Direction::Encrypt,
        cipher_len,
        None,
    );
    job(handle, d, &packet(alg, cipher_len, user as u32), user)
}

/// Collects every job the engine will hand back, advancing modelled time
/// to each completion. For the model, `External` means only lost
/// completions remain; the threaded engine says it while its workers run,
/// so for it (`live`) this waits.
fn drain_live(engine: &mut dyn Engine, now: &mut Duration, live: bool) -> Vec<Job> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match engine.next_completion() {
            NextCompletion::Ready => {}
            NextCompletion::At(t) => *now = (*now).max(t),
            NextCompletion::External if live && engine.in_flight() > 0 && Instant::now() < deadline => {
                engine.wait(Duration::from_millis(5));
            }
            NextCompletion::External | NextCompletion::Idle => return out,
        }
        engine.poll_burst(*now, &mut out);
    }
}

fn drain(engine: &mut SecEngine, now: &mut Duration) -> Vec<Job> {
    drain_live(engine, now, false)
}

/// Runs one packet through `kinds` in order (one descriptor after the
/// other, as the sync and dual-pass styles do); returns the bytes and the
/// status of each pass.
fn run_passes(
    (engine, live): (&mut dyn Engine, bool),
    handle: SessionHandle,
    (alg, esn): (Algorithm, Option<u32>),
    bytes: &[u8],
    kinds: &[DescriptorKind],
    direction: Direction,
) -> (Vec<u8>, Vec<Status>) {
    let cipher_len = bytes.len() - HDR - alg.iv_len() - alg.icv_len();
    let mut bytes = bytes.to_vec();
    let mut statuses = Vec::new();
    let mut now = Duration::ZERO;
    for &kind in kinds {
        let mut q = VecDeque::from([job(
            handle,
            desc(alg, kind, direction, cipher_len, esn),
            &bytes,
            1,
        )]);
        assert_eq!(engine.submit_burst(now, &mut q), 1);
        let mut back = drain_live(engine, &mut now, live);
        assert_eq!(back.len(), 1, "{alg} {kind:?}");
        let done = back.remove(0);
        statuses.push(done.desc.status);
        bytes = done.buf.data().to_vec();
    }
    (bytes, statuses)
}

/// Every profile of the model, and the threaded engine (`live`).
fn sec_engines(buffers: BufferPolicy) -> Vec<(String, Box<dyn Engine>, bool)> {
    let mut engines: Vec<(String, Box<dyn Engine>, bool)> = DeviceProfile::all()
        .into_iter()
        .map(|profile| {
            let engine: Box<dyn Engine> = Box::new(SecEngine::new(SecConfig {
                buffers,
                ..SecConfig::with_profile(profile)
            }));
            (profile.name.to_owned(), engine, false)
        })
        .collect();
    let threaded = ThreadedSecEngine::new(SecConfig {
        buffers,
        channels: 1,
        threads: true,
        ..SecConfig::default()
    })
    .expect("a worker thread");
    engines.push(("threaded".to_owned(), Box::new(threaded), true));
    engines
}

#[test]
fn bytes_are_the_soft_engines_for_every_algorithm_direction_style_and_policy() {
    use DescriptorKind::*;
    for buffers in BufferPolicy::ALL {
        let mut soft = SoftEngine::new(buffers);
        let mut secs = sec_engines(buffers);
        for (i, alg) in Algorithm::ALL.into_iter().enumerate() {
            let spec = spec(alg, i as u8);
            let soft_handle = soft.register(&spec).expect("soft registers");
            if alg == Algorithm::ChaCha20Poly1305 {
                // The SEC has no unit for it: refused with the reason, not run.
                for (name, engine, _) in secs.iter_mut() {
                    let refused = engine.register(&spec).expect_err("sec has no ChaCha20 unit");
                    assert!(refused.to_string().contains("no ChaCha20"), "{name}: {refused}");
                }
                soft.release(soft_handle);
                continue;
            }
            let handles: Vec<_> = secs
                .iter_mut()
                .map(|(_, e, _)| e.register(&spec).expect("sec registers"))
                .collect();
            for (cipher_len, esn) in [(64, None), (1424, Some(7))] {
                let plain = packet(alg, cipher_len, cipher_len as u32);
                let styles: [(&[DescriptorKind], &[DescriptorKind]); 2] = [
                    (&[SinglePass], &[SinglePass]),
                    (&[CipherOnly, MacOnly], &[MacOnly, CipherOnly]),
                ];
                for (encrypt, decrypt) in styles {
                    let (sealed, s1) = run_passes(
                        (&mut soft, false),
                        soft_handle,
                        (alg, esn),
                        &plain,
                        encrypt,
                        Direction::Encrypt,
                    );
                    let (opened, s2) = run_passes(
                        (&mut soft, false),
                        soft_handle,
                        (alg, esn),
                        &sealed,
                        decrypt,
                        Direction::Decrypt,
                    );
                    if !alg.is_aead() {
                        assert!(
                            s1.iter().chain(&s2).all(|s| *s == Status::Done),
                            "{alg} {encrypt:?}"
                        );
                        // Decryption leaves the ICV in place; the rest is the plaintext.
                        let body = plain.len() - alg.icv_len();
                        assert_eq!(opened[..body], plain[..body], "{alg}: soft round-trips");
                    }
                    for ((name, engine, live), &handle) in secs.iter_mut().zip(&handles) {
                        let what = format!("{name} {alg} {buffers} {cipher_len} {encrypt:?}");
                        let (e_bytes, e_status) = run_passes(
                            (engine.as_mut(), *live),
                            handle,
                            (alg, esn),
                            &plain,
                            encrypt,
                            Direction::Encrypt,
                        );
                        assert_eq!((&e_bytes, &e_status), (&sealed, &s1), "{what}: encrypt");
                        let (d_bytes, d_status) = run_passes(
                            (engine.as_mut(), *live),
                            handle,
                            (alg, esn),
                            &sealed,
                            decrypt,
                            Direction::Decrypt,
                        );
                        assert_eq!((&d_bytes, &d_status), (&opened, &s2), "{what}: decrypt");
                    }
                }
            }
        }
        for (name, engine, _) in &secs {
            let c = engine.counters();
            assert_eq!(c.submitted, c.completed, "{name}");
            let bounced = buffers == BufferPolicy::PerRequest;
            assert_eq!(
                c.bounce_buffers == c.submitted,
                bounced,
                "{name} {buffers}: {c:?}"
            );
        }
    }
}

/// A fixed script of registers, bursts and polls; returns everything the
/// engine showed (each poll's users, each next_completion) and its counters.
fn script(config: SecConfig) -> (Vec<(u64, Vec<u64>, NextCompletion)>, EngineCounters) {
    let mut e = SecEngine::new(config);
    let algs = [
        Algorithm::Aes128Sha1,
        Algorithm::TripleDesSha1,
        Algorithm::Aes256Gcm16,
        Algorithm::NullSha1,
    ];
    let handles: Vec<_> = algs
        .iter()
        .enumerate()
        .map(|(i, a)| e.register(&spec(*a, i as u8)).expect("registers"))
        .collect();
    let mut seen = Vec::new();
    let mut user = 0;
    for round in 0..12u64 {
        let now = Duration::from_nanos(round * 3_700);
        let mut q = VecDeque::new();
        for k in 0..(round % 5 + 1) {
            let s = ((round + k) % 4) as usize;
            let alg = algs[s];
            let len = [64, 256, 1424][((round * 3 + k) % 3) as usize];
            user += 1;
            let d = desc(alg, DescriptorKind::SinglePass, Direction::Encrypt, len, None);
            q.push_back(job(handles[s], d, &packet(alg, len, user as u32), user));
        }
        e.submit_burst(now, &mut q);
        let mut out = Vec::new();
        e.poll_burst(now + Duration::from_nanos(1_900), &mut out);
        seen.push((round, out.iter().map(|j| j.user).collect(), e.next_completion()));
    }
    let mut now = Duration::from_millis(1);
    let rest = drain(&mut e, &mut now);
    seen.push((99, rest.iter().map(|j| j.user).collect(), e.next_completion()));
    let mut counters = e.counters();
    // Host wall time of the real crypto: measured, so it varies by design.
    assert!(counters.emulation_ns > 0);
    counters.emulation_ns = 0;
    (seen, counters)
}

#[test]
fn the_same_inputs_give_the_same_timeline() {
    for completion in [
        Completion::Interrupt,
        Completion::Polling,
        Completion::Coalesced {
            count: 3,
            timeout: Duration::from_micros(20),
        },
    ] {
        for profile in DeviceProfile::all() {
            let config = SecConfig {
                completion,
                ..SecConfig::with_profile(profile)
            };
            let (a, ca) = script(config.clone());
            let (b, cb) = script(config);
            assert_eq!(a, b, "{} {}", profile.name, completion.name());
            assert_eq!(ca, cb, "{} {}", profile.name, completion.name());
            assert_eq!(ca.submitted, ca.completed);
            assert!(ca.bus.total() > 0 && ca.doorbells == 12);
            if profile.name != "none" {
                assert!(ca.eu_busy_ns.iter().any(|(_, ns)| *ns > 0), "{ca:?}");
                assert!(ca.bus_busy_ns > 0 && ca.device_done_ns > 0);
            }
        }
    }
}

#[test]
fn poll_returns_nothing_before_the_modelled_completion_and_everything_after() {
    let mut e = SecEngine::new(SecConfig::default());
    let h = e.register(&spec(Algorithm::Aes128Sha1, 1)).expect("registers");
    assert_eq!(e.next_completion(), NextCompletion::Idle);
    let start = Duration::from_micros(10);
    let mut q: VecDeque<_> = (0..3).map(|u| aes_job(h, 1424, u)).collect();
    assert_eq!(e.submit_burst(start, &mut q), 3);
    let mut out = Vec::new();
    let mut last = start;
    for expected in 0..3 {
        let NextCompletion::At(t) = e.next_completion() else {
            panic!("a modelled completion time");
        };
        assert!(t > last, "the device takes time");
        assert_eq!(
            e.poll_burst(t - Duration::from_nanos(1), &mut out),
            0,
            "not before {t:?}"
        );
        assert_eq!(e.poll_burst(t, &mut out), 1, "exactly at {t:?}");
        assert_eq!(out.last().map(|j| j.user), Some(expected));
        assert_eq!(out.last().map(|j| j.desc.status), Some(Status::Done));
        last = t;
    }
    assert_eq!(e.next_completion(), NextCompletion::Idle);
    assert_eq!(e.in_flight(), 0);
    let c = e.counters();
    assert_eq!((c.interrupts, c.doorbells, c.completed), (3, 1, 3));
    assert_eq!(c.device_done_ns, last.as_nanos() as u64);
}

#[test]
fn jobs_of_one_session_come_back_in_submission_order() {
    let algs = [
        Algorithm::TripleDesSha1,
        Algorithm::Null,
        Algorithm::Aes128Sha1,
        Algorithm::Aes256Sha256,
        Algorithm::NullSha1,
        Algorithm::Aes128Gcm16,
    ];
    for completion in [Completion::Interrupt, Completion::Polling] {
        let mut e = SecEngine::new(SecConfig {
            channels: 4,
            completion,
            ..SecConfig::default()
        });
        let handles: Vec<_> = algs
            .iter()
            .enumerate()
            .map(|(i, a)| e.register(&spec(*a, i as u8)).expect("registers"))
            .collect();
        let mut q = VecDeque::new();
        for user in 0..60u64 {
            let s = (user * 7 % 6) as usize;
            let len = [1424, 64, 512][(user % 3) as usize];
            let d = desc(algs[s], DescriptorKind::SinglePass, Direction::Encrypt, len, None);
            q.push_back(job(handles[s], d, &packet(algs[s], len, user as u32), user));
        }
        let mut now = Duration::ZERO;
        let mut out = Vec::new();
        while !q.is_empty() {
            e.submit_burst(now, &mut q);
            now += Duration::from_micros(3);
            e.poll_burst(now, &mut out);
        }
        out.extend(drain(&mut e, &mut now));
        assert_eq!(out.len(), 60);
        for h in &handles {
            let users: Vec<_> = out.iter().filter(|j| j.session == *h).map(|j| j.user).collect();
            assert!(users.windows(2).all(|w| w[0] < w[1]), "{h:?}: {users:?}");
        }
        let order: Vec<_> = out.iter().map(|j| j.user).collect();
        assert!(
            order.windows(2).any(|w| w[0] > w[1]),
            "sessions overtake each other"
        );
        assert!(e.counters().per_channel.iter().all(|&n| n > 0));
    }
}

#[test]
fn a_full_fifo_takes_only_what_fits_and_keeps_the_rest_in_order() {
    let mut e = SecEngine::new(SecConfig {
        channels: 1,
        fifo_depth: 3,
        ..SecConfig::default()
    });
    let h = e.register(&spec(Algorithm::Aes128Sha1, 2)).expect("registers");
    let mut q: VecDeque<_> = (0..5).map(|u| aes_job(h, 256, u)).collect();
    assert_eq!(e.submit_burst(Duration::ZERO, &mut q), 3);
    assert_eq!(q.iter().map(|j| j.user).collect::<Vec<_>>(), [3, 4]);
    let c = e.counters();
    assert_eq!((c.ring_full, c.doorbells, c.fifo_high_water), (1, 1, 3));
    // Still full at the same instant: nothing taken, no doorbell.
    assert_eq!(e.submit_burst(Duration::ZERO, &mut q), 0);
    assert_eq!(e.counters().doorbells, 1);
    let NextCompletion::At(first) = e.next_completion() else {
        panic!("in flight");
    };
    // One slot frees when the first completes, polled or not.
    assert_eq!(e.submit_burst(first, &mut q), 1);
    assert_eq!(q.iter().map(|j| j.user).collect::<Vec<_>>(), [4]);
    let mut now = first;
    let mut out = drain(&mut e, &mut now);
    e.submit_burst(now, &mut q);
    out.extend(drain(&mut e, &mut now));
    assert_eq!(out.iter().map(|j| j.user).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!(e.counters().fifo_high_water <= 3);
}

#[test]
fn faults_fail_lose_and_stall_in_modelled_time() {
    let faults = FaultPlan {
        fail: vec![2],
        drop_completion: vec![3],
        ..FaultPlan::default()
    };
    let mut e = SecEngine::new(SecConfig {
        channels: 1,
        faults,
        ..SecConfig::default()
    });
    let h = e.register(&spec(Algorithm::Aes128Sha1, 3)).expect("registers");
    let mut q: VecDeque<_> = (1..=4).map(|u| aes_job(h, 256, u)).collect();
    assert_eq!(e.submit_burst(Duration::ZERO, &mut q), 4);
    let mut lost = Vec::new();
    assert_eq!(e.reclaim(Duration::ZERO, &mut lost), 0, "not before it was due");
    let mut now = Duration::ZERO;
    let out = drain(&mut e, &mut now);
    let got: Vec<_> = out.iter().map(|j| (j.user, j.desc.status)).collect();
    assert_eq!(
        got,
        [
            (1, Status::Done),
            (2, Status::Error(DescriptorError::Fault)),
            (4, Status::Done)
        ]
    );
    assert_eq!(e.in_flight(), 1, "the lost job is still the engine's");
    assert_eq!(e.next_completion(), NextCompletion::External);
    assert_eq!(e.reclaim(now + Duration::from_millis(10), &mut lost), 1);
    assert_eq!(lost[0].user, 3);
    assert_eq!(lost[0].desc.status, Status::Error(DescriptorError::Fault));
    assert_eq!(e.in_flight(), 0);
    assert_eq!(e.next_completion(), NextCompletion::Idle);
    let c = e.counters();
    assert_eq!((c.errors, c.submitted, c.completed), (1, 4, 4));

    // A stall is modelled time: exactly that much later, and no host time.
    let pause = Duration::from_micros(250);
    let first_completion = |stall| {
        let mut e = SecEngine::new(SecConfig {
            faults: FaultPlan {
                stall,
                ..FaultPlan::default()
            },
            ..SecConfig::default()
        });
        let h = e.register(&spec(Algorithm::Aes128Sha1, 3)).expect("registers");
        e.submit_burst(Duration::ZERO, &mut VecDeque::from([aes_job(h, 256, 1)]));
        match e.next_completion() {
            NextCompletion::At(t) => t,
            other => panic!("{other:?}"),
        }
    };
    let started = Instant::now();
    assert_eq!(first_completion(Some((1, pause))), first_completion(None) + pause);
    assert!(
        started.elapsed() < pause * 40,
        "the stall is not spent on the host"
    );
}

#[test]
fn a_released_handle_completes_with_bad_session() {
    let mut e = SecEngine::new(SecConfig::default());
    let old = e.register(&spec(Algorithm::Aes128Sha1, 4)).expect("registers");
    e.release(old);
    let new = e.register(&spec(Algorithm::Aes128Sha1, 5)).expect("registers");
    assert_eq!(new.index, old.index, "the slot is reused");
    assert_ne!(new, old);
    let mut q = VecDeque::from([
        aes_job(old, 64, 1),
        aes_job(SessionHandle::INVALID, 64, 2),
        aes_job(new, 64, 3),
    ]);
    let plain = q[0].buf.data().to_vec();
    assert_eq!(e.submit_burst(Duration::ZERO, &mut q), 3);
    let mut now = Duration::ZERO;
    let out = drain(&mut e, &mut now);
    let status: Vec<_> = out.iter().map(|j| (j.user, j.desc.status)).collect();
    assert!(status.contains(&(1, Status::Error(DescriptorError::BadSession))));
    assert!(status.contains(&(2, Status::Error(DescriptorError::BadSession))));
    assert!(status.contains(&(3, Status::Done)));
    let refused = out.iter().find(|j| j.user == 1).expect("returned");
    assert_eq!(
        refused.buf.data(),
        &plain[..],
        "never run with the new session's keys"
    );
    assert_eq!(e.counters().errors, 2);
}

#[test]
fn completion_modes_signal_as_configured_and_charge_the_host() {
    let count = 4;
    for completion in [
        Completion::Interrupt,
        Completion::Polling,
        Completion::Coalesced {
            count,
            timeout: Duration::from_millis(1),
        },
    ] {
        let config = SecConfig {
            channels: 1,
            completion,
            ..SecConfig::default()
        };
        let host = config.profile.host;
        let mut e = SecEngine::new(config);
        let h = e.register(&spec(Algorithm::Aes128Sha1, 6)).expect("registers");
        let mut q: VecDeque<_> = (0..10).map(|u| aes_job(h, 512, u)).collect();
        e.submit_burst(Duration::ZERO, &mut q);
        let NextCompletion::At(first) = e.next_completion() else {
            panic!("in flight");
        };
        let mut now = Duration::ZERO;
        let out = drain(&mut e, &mut now);
        assert_eq!(out.len(), 10);
        let c = e.counters();
        let ns = |d: Duration| d.as_nanos() as u64;
        match completion {
            Completion::Polling => assert_eq!(c.interrupts, 0),
            Completion::Interrupt => assert_eq!(c.interrupts, 10),
            Completion::Coalesced { .. } => {
                // Two full groups of four, then the last two after the timeout.
                assert_eq!(c.interrupts, 3);
                let mut fresh = SecEngine::new(SecConfig {
                    channels: 1,
                    ..SecConfig::default()
                });
                let h = fresh
                    .register(&spec(Algorithm::Aes128Sha1, 6))
                    .expect("registers");
                let mut q: VecDeque<_> = (0..10).map(|u| aes_job(h, 512, u)).collect();
                fresh.submit_burst(Duration::ZERO, &mut q);
                let mut times = Vec::new();
                while let NextCompletion::At(t) = fresh.next_completion() {
                    times.push(t);
                    fresh.poll_burst(t, &mut Vec::new());
                }
                assert_eq!(
                    first,
                    times[count - 1],
                    "the group fires at its fourth completion"
                );
                assert_eq!(
                    now,
                    times[8] + Duration::from_millis(1),
                    "the rest after the timeout"
                );
            }
        }
        assert_eq!(c.modelled_host.doorbell_ns, c.doorbells * ns(host.doorbell));
        assert_eq!(c.modelled_host.interrupt_ns, c.interrupts * ns(host.interrupt));
        assert_eq!(
            c.modelled_host.completion_ns,
            c.completed * ns(host.per_completion())
        );
        assert_eq!(c.modelled_host_ns, c.modelled_host.total());
    }
}

/// The modelled time of one descriptor on an idle engine, from the
/// profile's fields: fetch, setup, the walk (slowest of the units and the
/// bus), latency.
fn expected_ns(profile: &DeviceProfile, alg: Algorithm, d: &Descriptor, units: &[(EuKind, u64)]) -> u64 {
    let bus = bus_bytes(alg, d);
    let fetch = profile.bus.nanos(bus.descriptors + bus.context);
    let walk = units
        .iter()
        .map(|&(k, bytes)| profile.unit(k).throughput.nanos(bytes))
        .chain([profile.bus.nanos(bus.data_in + bus.data_out)])
        .max()
        .unwrap_or(0);
    fetch + profile.setup.as_nanos() as u64 + walk + profile.latency.as_nanos() as u64
}

fn time_one(profile: DeviceProfile, kinds: &[DescriptorKind], cipher_len: usize) -> (u64, EngineCounters) {
    let alg = Algorithm::Aes128Sha1;
    let mut e = SecEngine::new(SecConfig::with_profile(profile));
    let h = e.register(&spec(alg, 8)).expect("registers");
    let start = Duration::from_micros(5);
    let mut now = start;
    let mut bytes = packet(alg, cipher_len, 9);
    for &kind in kinds {
        let d = desc(alg, kind, Direction::Encrypt, cipher_len, None);
        e.submit_burst(now, &mut VecDeque::from([job(h, d, &bytes, 0)]));
        let back = drain(&mut e, &mut now);
        bytes = back[0].buf.data().to_vec();
    }
    ((now - start).as_nanos() as u64, e.counters())
}

#[test]
fn profiles_give_times_consistent_with_their_rates() {
    let alg = Algorithm::Aes128Sha1;
    let sec2 = DeviceProfile::sec2_266mhz();
    for cipher_len in [64, 1424] {
        let d = desc(
            alg,
            DescriptorKind::SinglePass,
            Direction::Encrypt,
            cipher_len,
            None,
        );
        let units = [
            (EuKind::Aesu, cipher_len as u64),
            (EuKind::MdeuSha1, d.authenticated().len() as u64),
        ];
        let (single, single_c) = time_one(sec2, &[DescriptorKind::SinglePass], cipher_len);
        assert_eq!(
            single,
            expected_ns(&sec2, alg, &d, &units),
            "{cipher_len} B single-pass"
        );
        let mb_per_s = cipher_len as f64 / single as f64 * 1e3;
        assert!(mb_per_s < 125.0, "never faster than the AESU: {mb_per_s} MB/s");

        let (dual, dual_c) = time_one(
            sec2,
            &[DescriptorKind::CipherOnly, DescriptorKind::MacOnly],
            cipher_len,
        );
        let c = desc(
            alg,
            DescriptorKind::CipherOnly,
            Direction::Encrypt,
            cipher_len,
            None,
        );
        let m = desc(alg, DescriptorKind::MacOnly, Direction::Encrypt, cipher_len, None);
        let expected_dual = expected_ns(&sec2, alg, &c, &[(EuKind::Aesu, cipher_len as u64)])
            + expected_ns(
                &sec2,
                alg,
                &m,
                &[(EuKind::MdeuSha1, m.authenticated().len() as u64)],
            );
        assert_eq!(dual, expected_dual, "{cipher_len} B dual-pass");
        assert!(dual > single, "dual-pass is never faster");
        assert!(
            dual_c.bus.data_in > single_c.bus.data_in,
            "dual-pass reads the data twice"
        );
        assert!(dual_c.bus.total() > single_c.bus.total());
        assert_eq!(dual_c.bus.descriptors, 2 * DESCRIPTOR_BYTES);
    }

    // An infinitely fast engine completes at the submit time itself.
    let mut e = SecEngine::new(SecConfig::with_profile(DeviceProfile::none()));
    let h = e.register(&spec(alg, 8)).expect("registers");
    let at = Duration::from_micros(123);
    e.submit_burst(at, &mut VecDeque::from([aes_job(h, 1424, 0), aes_job(h, 64, 1)]));
    assert_eq!(e.next_completion(), NextCompletion::At(at));
    let mut out = Vec::new();
    assert_eq!(e.poll_burst(at, &mut out), 2);
    assert_eq!(e.counters().device_done_ns, at.as_nanos() as u64);

    // The modern part: faster per packet, and far faster in aggregate,
    // since its many slices work in parallel behind its latency.
    let (qat, _) = time_one(DeviceProfile::qat_class(), &[DescriptorKind::SinglePass], 1424);
    let (sec, _) = time_one(sec2, &[DescriptorKind::SinglePass], 1424);
    assert!(qat < sec, "qat-class {qat} ns vs sec2 {sec} ns per packet");
    let makespan = |profile: DeviceProfile| {
        let mut e = SecEngine::new(SecConfig::with_profile(profile));
        let handles: Vec<_> = (0..8)
            .map(|i| e.register(&spec(alg, i)).expect("registers"))
            .collect();
        let mut q: VecDeque<_> = (0..64).map(|u| aes_job(handles[u % 8], 1424, u as u64)).collect();
        let mut now = Duration::ZERO;
        let mut out = Vec::new();
        while !q.is_empty() {
            e.submit_burst(now, &mut q);
            out.extend(drain(&mut e, &mut now));
        }
        assert_eq!(out.len(), 64);
        e.counters().device_done_ns
    };
    let (qat, sec) = (makespan(DeviceProfile::qat_class()), makespan(sec2));
    assert!(qat * 20 < sec, "64 packets: qat-class {qat} ns vs sec2 {sec} ns");
}

#[test]
fn units_are_shared_between_channels_and_single_pass_overlaps() {
    // Two sessions on two channels, both AES: the one AESU serialises them,
    // so the second finishes one walk after the first.
    let sec2 = DeviceProfile::sec2_266mhz();
    let mut e = SecEngine::new(SecConfig::with_profile(sec2));
    let a = e.register(&spec(Algorithm::Aes128Sha1, 1)).expect("registers");
    let b = e.register(&spec(Algorithm::Aes128Sha1, 2)).expect("registers");
    assert_ne!(a.index % 4, b.index % 4);
    e.submit_burst(
        Duration::ZERO,
        &mut VecDeque::from([aes_job(a, 1424, 0), aes_job(b, 1424, 1)]),
    );
    let mut times = Vec::new();
    while let NextCompletion::At(t) = e.next_completion() {
        times.push(t.as_nanos() as u64);
        e.poll_burst(t, &mut Vec::new());
    }
    let walk = sec2.unit(EuKind::MdeuSha1).throughput.nanos(8 + 16 + 1424);
    assert_eq!(times.len(), 2);
    assert_eq!(times[1] - times[0], walk, "the second waits for the shared units");
    let busy: u64 = e
        .counters()
        .eu_busy_ns
        .iter()
        .filter(|(n, _)| n == "aesu")
        .map(|(_, ns)| *ns)
        .sum();
    assert_eq!(busy, 2 * walk, "the AESU is held for the whole single-pass walk");
}

#[test]
fn the_threaded_engine_keeps_order_and_returns_lost_jobs() {
    let mut e = ThreadedSecEngine::new(SecConfig {
        channels: 2,
        threads: true,
        faults: FaultPlan {
            drop_completion: vec![5],
            ..FaultPlan::default()
        },
        ..SecConfig::default()
    })
    .expect("worker threads");
    let a = e.register(&spec(Algorithm::Aes128Sha1, 1)).expect("registers");
    let b = e.register(&spec(Algorithm::Aes256Gcm16, 2)).expect("registers");
    let mut q = VecDeque::new();
    for user in 0..40u64 {
        let (h, alg) = if user % 3 == 0 {
            (b, Algorithm::Aes256Gcm16)
        } else {
            (a, Algorithm::Aes128Sha1)
        };
        let d = desc(alg, DescriptorKind::SinglePass, Direction::Encrypt, 256, None);
        q.push_back(job(h, d, &packet(alg, 256, user as u32), user));
    }
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while (out.len() < 39 || !q.is_empty()) && Instant::now() < deadline {
        e.submit_burst(Duration::ZERO, &mut q);
        e.wait(Duration::from_millis(1));
        e.poll_burst(Duration::ZERO, &mut out);
    }
    assert_eq!(out.len(), 39);
    for h in [a, b] {
        let users: Vec<_> = out.iter().filter(|j| j.session == h).map(|j| j.user).collect();
        assert!(users.windows(2).all(|w| w[0] < w[1]), "{users:?}");
    }
    let mut lost = Vec::new();
    assert_eq!(e.reclaim(Duration::ZERO, &mut lost), 1);
    assert_eq!(lost[0].user, 4, "the fifth descriptor");
    assert_eq!(e.in_flight(), 0);
    assert_eq!(e.next_completion(), NextCompletion::Idle);
    e.release(a);
    let mut q = VecDeque::from([aes_job(a, 64, 99)]);
    e.submit_burst(Duration::ZERO, &mut q);
    let mut now = Duration::ZERO;
    let back = drain_live(&mut e, &mut now, true);
    assert_eq!(back[0].desc.status, Status::Error(DescriptorError::BadSession));
}

/// The model must not wait on this machine: no threads, no blocking, and
/// exactly one clock read, in the helper that measures the emulation.
#[test]
fn the_model_never_waits_on_the_host() {
    let files = [
        ("model.rs", include_str!("../src/engine/sec/model.rs")),
        ("profile.rs", include_str!("../src/engine/sec/profile.rs")),
        ("mod.rs", include_str!("../src/engine/sec/mod.rs")),
    ];
    let forbidden = [
        "thread::",
        "sleep",
        "park",
        "Mutex",
        "Condvar",
        "RwLock",
        "futex",
        "yield_now",
        "spin_loop",
        "SystemTime",
        "Instant::now",
        ".elapsed()",
    ];
    let helper = "fn measure_emulation";
    let mut clock_reads = 0;
    for (name, text) in files {
        let mut in_helper = false;
        for (n, line) in text.lines().enumerate() {
            // Code only: comments may say what the model does not do.
            let code = line.split("//").next().unwrap_or("");
            if code.contains(helper) {
                in_helper = true;
            }
            for word in forbidden {
                if !code.contains(word) {
                    continue;
                }
                let allowed = in_helper && (word == "Instant::now" || word == ".elapsed()");
                assert!(allowed, "{name}:{}: `{word}` in the model: {line}", n + 1);
                if word == "Instant::now" {
                    clock_reads += 1;
                }
            }
            if in_helper && line == "}" {
                in_helper = false;
            }
        }
    }
    assert_eq!(clock_reads, 1, "one clock read, in {helper}");
}

/// The soft engine (the reference the model is checked against) runs a
/// burst with its sessions and keys requested ahead of each job: a burst
/// of mixed sessions, directions and a released handle must come back
/// exactly as each job run alone, whether submitted or run inline.
#[test]
fn a_soft_burst_runs_each_job_as_it_would_alone() {
    let algorithms = [
        Algorithm::Aes128Gcm16,
        Algorithm::Aes128Sha1,
        Algorithm::Aes256Gcm16,
        Algorithm::TripleDesSha1,
    ];
    let mut engine = SoftEngine::default();
    let handles: Vec<_> = algorithms
        .iter()
        .enumerate()
        .map(|(i, &alg)| engine.register(&spec(alg, i as u8)).expect("registers"))
        .collect();
    engine.release(handles[2]);
    let jobs = |n: u64| -> Vec<Job> {
        (0..n)
            .map(|user| {
                let k = (user as usize * 5 + user as usize / 3) % algorithms.len();
                let alg = algorithms[k];
                let direction = if user % 4 == 3 {
                    Direction::Decrypt
                } else {
                    Direction::Encrypt
                };
                let len = if alg.iv_len() == 8 {
                    64
                } else {
                    16 * (1 + user as usize % 5)
                };
                let d = desc(alg, DescriptorKind::SinglePass, direction, len, None);
                job(handles[k], d, &packet(alg, len, user as u32), user)
            })
            .collect()
    };
    let alone: Vec<(Status, Vec<u8>)> = jobs(23)
        .into_iter()
        .map(|mut one| {
            assert!(engine.run_inline(std::slice::from_mut(&mut one)));
            (one.desc.status, one.buf.data().to_vec())
        })
        .collect();
    assert!(alone
        .iter()
        .any(|(s, _)| *s == Status::Error(DescriptorError::BadSession)));
    assert!(alone.iter().any(|(s, _)| *s == Status::Done));
    let mut inline = jobs(23);
    assert!(engine.run_inline(&mut inline));
    let mut queue: VecDeque<Job> = jobs(23).into();
    assert_eq!(engine.submit_burst(Duration::ZERO, &mut queue), 23);
    let mut submitted = Vec::new();
    engine.poll_burst(Duration::ZERO, &mut submitted);
    for burst in [inline, submitted] {
        let got: Vec<(Status, Vec<u8>)> = burst
            .into_iter()
            .map(|j| (j.desc.status, j.buf.data().to_vec()))
            .collect();
        assert_eq!(got, alone);
    }
}
