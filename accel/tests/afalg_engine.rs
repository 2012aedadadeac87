//! The AF_ALG engine on its own, against `accel::SoftEngine`: the same bytes
//! and statuses for every algorithm, direction, descriptor sequence, buffer
//! policy, I/O and ESN setting; per-session order; no allocation per job on
//! the registered-buffer path; `Drop` and `reclaim` with requests on the
//! ring; released handles.
//!
//! AF_ALG is missing from many kernels (this project's host among them).
//! There every test that needs it shows as `ignored (needs afalg: ...)`, and
//! under `CI=true` fails unless `ESPGW_SKIPS` names `afalg` (testkit's
//! harness); `scripts/afalg-engine-in-vm.sh` runs them inside the linux-peer
//! VM, whose kernel has it. One test runs everywhere: the engine is refused,
//! naming the kernel option, exactly where the probe says AF_ALG is missing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::time::Duration;

use accel::afalg::{session_fds, AfalgEngine, AfalgIo, SLOTS, SPARE_OPS};
use accel::{
    Algorithm, BufferPolicy, Descriptor, DescriptorError, DescriptorKind, Direction, Engine, Job,
    NextCompletion, PacketBuf, PacketPool, Region, SessionHandle, SessionSpec, SoftEngine, Status,
};
use testkit::Prerequisite;

const NEEDS: &str = "needs AF_ALG: run in the linux-peer VM with scripts/afalg-engine-in-vm.sh";

static AFALG: Prerequisite = Prerequisite::new("afalg", || {
    accel::afalg::probe()
        .map_err(|e| format!("{e}; scripts/afalg-engine-in-vm.sh runs this in the linux-peer VM"))
});

fn main() -> std::process::ExitCode {
    testkit::run([
        testkit::test!(the_engine_is_refused_exactly_where_the_kernel_has_no_af_alg),
        testkit::needs!(&AFALG, same_bytes_and_statuses_as_soft_for_every_combination),
        testkit::needs!(
            &AFALG,
            per_session_order_with_interleaved_sessions_and_bursts_larger_than_the_ring
        ),
        testkit::needs!(&AFALG, a_finished_job_waits_for_the_earlier_jobs_of_its_session),
        testkit::needs!(&AFALG, reclaim_cancels_only_requests_older_than_the_age),
        testkit::needs!(&AFALG, drop_with_requests_outstanding_cancels_and_waits),
        testkit::needs!(&AFALG, released_and_unknown_handles_complete_with_bad_session),
        testkit::needs!(&AFALG, no_allocation_per_job_on_the_registered_path),
        testkit::needs!(
            &AFALG,
            a_kernel_refusal_at_registration_is_refused_with_the_reason
        ),
        testkit::needs!(&AFALG, a_sessions_descriptors_are_what_session_fds_says),
    ])
}

// ---------------------------------------------------------------------------
// A global allocator that counts this thread's allocations while asked to.
// ---------------------------------------------------------------------------

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note_allocation() {
    let on = COUNTING.try_with(Cell::get).unwrap_or(false);
    if on {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are const-initialised thread locals without destructors, so
// touching them never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f`, returning what it returns and how many allocations it made.
fn counting<T>(f: impl FnOnce() -> T) -> (T, u64) {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCATIONS.with(Cell::get))
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// An outer header in front of the ESP header (the job's offset).
const OFFSET: usize = 20;
const ESN_HIGH: u32 = 0x0102_0304;

fn engine(buffers: BufferPolicy, io: AfalgIo) -> AfalgEngine {
    match AfalgEngine::new(buffers, io) {
        Ok(e) => e,
        Err(reason) => panic!("AF_ALG engine unavailable ({reason}); {NEEDS}"),
    }
}

fn spec(alg: Algorithm, esn: bool) -> SessionSpec {
    let enc: Vec<u8> = (0..alg.enc_key_len()).map(|i| (i * 7 + 1) as u8).collect();
    let auth: Vec<u8> = (0..alg.auth_key_len()).map(|i| (0x40 + i) as u8).collect();
    SessionSpec::new(alg, esn, &enc, &auth).expect("valid keys")
}

fn round_up(n: usize, align: usize) -> usize {
    n.div_ceil(align) * align
}

/// Payload lengths from one block to nearly the largest frame.
fn payloads(alg: Algorithm) -> Vec<usize> {
    let a = alg.pad_align();
    [a, 2 * a, 52, 100, 256, 1000, 1444, 1980]
        .into_iter()
        .map(|n| round_up(n, a))
        .collect()
}

fn descriptor(alg: Algorithm, payload: usize, kind: DescriptorKind, dir: Direction, esn: bool) -> Descriptor {
    let (iv, icv) = (alg.iv_len(), alg.icv_len());
    Descriptor {
        kind,
        direction: dir,
        auth_only: Region::new(0, 8),
        esn_high: esn.then_some(ESN_HIGH),
        iv: Region::new(8, iv),
        cipher: Region::new(8 + iv, payload),
        icv: Region::new(8 + iv + payload, icv),
        status: Status::Pending,
    }
}

/// Outer header ‖ SPI ‖ seq ‖ IV ‖ payload ‖ ICV room, from `seed`.
fn frame(alg: Algorithm, payload: usize, seed: u32) -> Vec<u8> {
    let mut f: Vec<u8> = (0..OFFSET).map(|i| 0xe0 ^ i as u8).collect();
    f.extend_from_slice(&0x1001u32.to_be_bytes());
    f.extend_from_slice(&seed.wrapping_add(1).to_be_bytes());
    f.extend((0..alg.iv_len()).map(|i| (seed as usize * 13 + i * 5) as u8));
    f.extend((0..payload).map(|i| (seed as usize * 31 + i * 7 + (i >> 8)) as u8));
    f.extend(std::iter::repeat_n(0, alg.icv_len()));
    f
}

fn buf(bytes: &[u8]) -> PacketBuf {
    let mut pool = PacketPool::new(1);
    let mut b = pool.alloc().expect("a buffer");
    assert!(b.fill(bytes), "frame fits");
    b
}

fn job(session: SessionHandle, desc: Descriptor, bytes: &[u8], user: u64) -> Job {
    Job::new(session, desc, buf(bytes), OFFSET, user)
}

/// Submits every job and collects them all back, waiting on the engine
/// when it works on its own.
fn run(engine: &mut dyn Engine, now: Duration, jobs: Vec<Job>) -> Vec<Job> {
    let total = jobs.len();
    let mut queue: VecDeque<Job> = jobs.into();
    let mut out = Vec::with_capacity(total);
    for _ in 0..200_000 {
        engine.submit_burst(now, &mut queue);
        engine.poll_burst(now, &mut out);
        if out.len() == total {
            break;
        }
        if engine.next_completion() == NextCompletion::External {
            engine.wait(Duration::from_millis(5));
        }
    }
    assert_eq!(out.len(), total, "every job comes back");
    assert_eq!(engine.in_flight(), 0);
    assert_eq!(engine.next_completion(), NextCompletion::Idle);
    out
}

/// (bytes, status) per job, in submission (`user`) order.
fn results(mut jobs: Vec<Job>) -> Vec<(Vec<u8>, Status)> {
    jobs.sort_by_key(|j| j.user);
    jobs.into_iter()
        .map(|j| (j.buf.data().to_vec(), j.desc.status))
        .collect()
}

/// Runs the same step on both engines and checks they agree.
struct Both {
    afalg: AfalgEngine,
    soft: SoftEngine,
    a: SessionHandle,
    s: SessionHandle,
    alg: Algorithm,
    esn: bool,
    what: String,
}

impl Both {
    /// Forged packets through the AF_ALG engine alone.
    fn forged(&mut self, kind: DescriptorKind, forged: &[(usize, Vec<u8>)]) -> Vec<(Vec<u8>, Status)> {
        let jobs = forged
            .iter()
            .enumerate()
            .map(|(i, (p, bytes))| {
                let d = descriptor(self.alg, *p, kind, Direction::Decrypt, self.esn);
                job(self.a, d, bytes, i as u64)
            })
            .collect();
        results(run(&mut self.afalg, Duration::ZERO, jobs))
    }

    fn step(
        &mut self,
        kind: DescriptorKind,
        dir: Direction,
        inputs: &[(usize, Vec<u8>)],
        step: &str,
    ) -> Vec<(Vec<u8>, Status)> {
        let mk = |h| {
            inputs
                .iter()
                .enumerate()
                .map(|(i, (payload, bytes))| {
                    job(
                        h,
                        descriptor(self.alg, *payload, kind, dir, self.esn),
                        bytes,
                        i as u64,
                    )
                })
                .collect::<Vec<_>>()
        };
        let (ja, js) = (mk(self.a), mk(self.s));
        let got = run(&mut self.afalg, Duration::ZERO, ja);
        for (n, j) in got.iter().enumerate() {
            assert_eq!(
                j.user, n as u64,
                "{}: {step}: one session's jobs come back in order",
                self.what
            );
        }
        let got = results(got);
        let want = results(run(&mut self.soft, Duration::ZERO, js));
        for (i, ((gb, gs), (wb, ws))) in got.iter().zip(&want).enumerate() {
            assert_eq!(gs, ws, "{}: {step}: job {i} status", self.what);
            if gb != wb {
                let at = gb.iter().zip(wb).position(|(x, y)| x != y);
                panic!(
                    "{}: {step}: job {i} ({} payload bytes) differs from soft at byte {at:?}",
                    self.what, inputs[i].0
                );
            }
        }
        got
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Runs everywhere.
// ---------------------------------------------------------------------------

fn the_engine_is_refused_exactly_where_the_kernel_has_no_af_alg() {
    match (
        accel::afalg::probe(),
        AfalgEngine::new(BufferPolicy::Registered, AfalgIo::Sync),
    ) {
        (Ok(()), Ok(_)) => {}
        (Ok(()), Err(e)) => panic!("the kernel has AF_ALG, yet the engine is refused: {e}"),
        (Err(missing), Ok(_)) => panic!("the probe says {missing}, yet the engine was built"),
        (Err(_), Err(e)) => assert!(e.to_string().contains("CONFIG_CRYPTO_USER_API_AEAD"), "{e}"),
    }
}

// ---------------------------------------------------------------------------
// In the VM.
// ---------------------------------------------------------------------------

fn same_bytes_and_statuses_as_soft_for_every_combination() {
    use DescriptorKind::*;
    let mut combinations = 0;
    for alg in Algorithm::ALL {
        for esn in [false, true] {
            for buffers in BufferPolicy::ALL {
                for io in AfalgIo::ALL {
                    let what = format!("{alg} esn={esn} {buffers} {io}");
                    let mut afalg = engine(buffers, io);
                    let mut soft = SoftEngine::new(buffers);
                    let a = afalg.register(&spec(alg, esn)).expect("afalg registers");
                    let s = soft.register(&spec(alg, esn)).expect("soft registers");
                    let mut both = Both {
                        afalg,
                        soft,
                        a,
                        s,
                        alg,
                        esn,
                        what,
                    };
                    let plain: Vec<(usize, Vec<u8>)> = payloads(alg)
                        .into_iter()
                        .enumerate()
                        .map(|(i, p)| (p, frame(alg, p, i as u32)))
                        .collect();
                    let mut encrypts = vec![vec![SinglePass]];
                    let mut decrypts = vec![vec![SinglePass]];
                    if !alg.is_aead() {
                        encrypts.push(vec![CipherOnly, MacOnly]);
                        decrypts.push(vec![MacOnly, CipherOnly]);
                    }
                    for enc in &encrypts {
                        let mut data = plain.clone();
                        for kind in enc {
                            let out =
                                both.step(*kind, Direction::Encrypt, &data, &format!("encrypt {kind:?}"));
                            for ((_, bytes), (got, status)) in data.iter_mut().zip(out) {
                                assert_eq!(status, Status::Done, "{}: encrypt {kind:?}", both.what);
                                *bytes = got;
                            }
                        }
                        for dec in &decrypts {
                            let mut back = data.clone();
                            for kind in dec {
                                let out =
                                    both.step(*kind, Direction::Decrypt, &back, &format!("decrypt {kind:?}"));
                                for ((_, bytes), (got, status)) in back.iter_mut().zip(out) {
                                    assert_eq!(status, Status::Done, "{}: decrypt {kind:?}", both.what);
                                    *bytes = got;
                                }
                            }
                            // The plaintext is back (the ICV stays where it was).
                            let icv = alg.icv_len();
                            for ((_, got), (_, sent)) in back.iter().zip(&plain) {
                                assert!(
                                    got[..got.len() - icv] == sent[..sent.len() - icv],
                                    "{}: {enc:?} then {dec:?}: the round trip differs",
                                    both.what
                                );
                            }
                        }
                        if alg == Algorithm::Null {
                            continue;
                        }
                        // A flipped ICV bit, and a flipped ciphertext bit.
                        for flip in ["icv", "ciphertext"] {
                            let forged: Vec<(usize, Vec<u8>)> = data
                                .iter()
                                .map(|(p, bytes)| {
                                    let mut b = bytes.clone();
                                    let at = if flip == "icv" {
                                        b.len() - 1
                                    } else {
                                        OFFSET + 8 + alg.iv_len()
                                    };
                                    b[at] ^= 1;
                                    (*p, b)
                                })
                                .collect();
                            let kinds: &[DescriptorKind] = if alg.is_aead() {
                                &[SinglePass]
                            } else {
                                &[SinglePass, MacOnly]
                            };
                            for &kind in kinds {
                                let got = both.forged(kind, &forged);
                                let mut jobs = Vec::new();
                                for (i, (p, bytes)) in forged.iter().enumerate() {
                                    let d = descriptor(alg, *p, kind, Direction::Decrypt, esn);
                                    jobs.push(job(both.s, d, bytes, i as u64));
                                }
                                let want = results(run(&mut both.soft, Duration::ZERO, jobs));
                                for (((bytes, status), (_, sent)), (soft_bytes, soft_status)) in
                                    got.iter().zip(&forged).zip(&want)
                                {
                                    let what = format!("{}: forged {flip}, {kind:?}", both.what);
                                    assert_eq!(*status, Status::AuthFailed, "{what}");
                                    assert_eq!(soft_status, status, "{what}: soft agrees");
                                    assert_eq!(bytes, sent, "{what}: a forged packet is left as it came");
                                    // An AEAD's output after a failed tag is
                                    // unspecified in the CPU library.
                                    if !alg.is_aead() {
                                        assert_eq!(bytes, soft_bytes, "{what}: same bytes as soft");
                                    }
                                }
                            }
                        }
                    }
                    combinations += 1;
                }
            }
        }
    }
    assert_eq!(combinations, Algorithm::ALL.len() * 2 * 2 * 2);
}

fn per_session_order_with_interleaved_sessions_and_bursts_larger_than_the_ring() {
    let algs = [
        (Algorithm::Aes128Gcm16, false),
        (Algorithm::Aes128Sha1, false),
        (Algorithm::TripleDesSha1, true),
        (Algorithm::NullSha1, false),
        (Algorithm::Aes256Gcm16, true),
    ];
    for buffers in BufferPolicy::ALL {
        for io in AfalgIo::ALL {
            let mut afalg = engine(buffers, io);
            let mut soft = SoftEngine::new(buffers);
            let handles: Vec<(SessionHandle, SessionHandle)> = algs
                .iter()
                .map(|&(alg, esn)| {
                    (
                        afalg.register(&spec(alg, esn)).expect("afalg"),
                        soft.register(&spec(alg, esn)).expect("soft"),
                    )
                })
                .collect();
            let n = 3 * SLOTS + 17;
            let mut ja = Vec::new();
            let mut js = Vec::new();
            let mut session_of = Vec::new();
            for i in 0..n {
                let k = (i * 7 + i / 5) % algs.len();
                let (alg, esn) = algs[k];
                let p = round_up(16 + (i * 37) % 1400, alg.pad_align());
                let d = descriptor(alg, p, DescriptorKind::SinglePass, Direction::Encrypt, esn);
                let f = frame(alg, p, i as u32);
                ja.push(job(handles[k].0, d, &f, i as u64));
                js.push(job(handles[k].1, d, &f, i as u64));
                session_of.push(k);
            }
            let got = run(&mut afalg, Duration::ZERO, ja);
            let mut last = vec![None; algs.len()];
            for j in &got {
                let k = session_of[j.user as usize];
                assert!(
                    last[k] < Some(j.user),
                    "{buffers} {io}: session {k}: job {} after {:?}",
                    j.user,
                    last[k]
                );
                last[k] = Some(j.user);
            }
            let got = results(got);
            assert_eq!(got.len(), n);
            assert_eq!(got, results(run(&mut soft, Duration::ZERO, js)), "{buffers} {io}");
            assert!(got.iter().all(|(_, s)| *s == Status::Done));
        }
    }
}

fn a_finished_job_waits_for_the_earlier_jobs_of_its_session() {
    let alg = Algorithm::Aes128Gcm16;
    let mut afalg = engine(BufferPolicy::Registered, AfalgIo::IoUring);
    let mut soft = SoftEngine::new(BufferPolicy::Registered);
    let a = afalg.register(&spec(alg, false)).expect("a");
    let b = afalg.register(&spec(alg, false)).expect("b");
    let sa = soft.register(&spec(alg, false)).expect("soft");
    let d = descriptor(alg, 64, DescriptorKind::SinglePass, Direction::Encrypt, false);
    let f = frame(alg, 64, 9);
    // A0 stalls in the kernel (submitted at t=0); the rest follow at t=1 s.
    afalg.stall_next_requests_for_test(1);
    let mut queue: VecDeque<Job> = [job(a, d, &f, 0)].into();
    assert_eq!(afalg.submit_burst(Duration::ZERO, &mut queue), 1);
    let later = Duration::from_secs(1);
    let mut queue: VecDeque<Job> = (1..5)
        .map(|i| job(a, d, &f, i))
        .chain((0..5).map(|i| job(b, d, &f, 100 + i)))
        .collect();
    assert_eq!(afalg.submit_burst(later, &mut queue), 9);
    let mut out = Vec::new();
    for _ in 0..1000 {
        afalg.poll_burst(later, &mut out);
        if out.len() == 5 {
            break;
        }
        afalg.wait(Duration::from_millis(5));
    }
    let users: Vec<u64> = out.iter().map(|j| j.user).collect();
    assert_eq!(users, [100, 101, 102, 103, 104], "only B's jobs: A's wait for A0");
    assert_eq!(afalg.in_flight(), 5);
    assert_eq!(afalg.next_completion(), NextCompletion::External);
    // Reclaim at t = 1.05 s: only A0 is older than the 100 ms reclaim age.
    let mut out = Vec::new();
    afalg.reclaim(later + Duration::from_millis(50), &mut out);
    let users: Vec<u64> = out.iter().map(|j| j.user).collect();
    assert_eq!(users, [0, 1, 2, 3, 4], "A0, then the ones held behind it");
    assert_eq!(out[0].desc.status, Status::Error(DescriptorError::Fault));
    assert_eq!(out[0].buf.data(), &f[..], "a reclaimed job's bytes are untouched");
    let want = results(run(&mut soft, Duration::ZERO, vec![job(sa, d, &f, 0)]));
    for j in &out[1..] {
        assert_eq!(j.desc.status, Status::Done);
        assert_eq!(j.buf.data(), &want[0].0[..]);
    }
    assert_eq!(afalg.in_flight(), 0);
    assert_eq!(afalg.next_completion(), NextCompletion::Idle);
    // The session still works (its stalled socket was closed, not reused).
    let again = results(run(&mut afalg, later, vec![job(a, d, &f, 7)]));
    assert_eq!(again[0], want[0]);
}

fn reclaim_cancels_only_requests_older_than_the_age() {
    for alg in [Algorithm::Aes128Gcm16, Algorithm::Aes128Sha1] {
        let mut afalg = engine(BufferPolicy::Registered, AfalgIo::IoUring);
        let a = afalg.register(&spec(alg, false)).expect("registers");
        let p = round_up(96, alg.pad_align());
        let d = descriptor(alg, p, DescriptorKind::SinglePass, Direction::Encrypt, false);
        let f = frame(alg, p, 3);
        afalg.stall_next_requests_for_test(3);
        let mut queue: VecDeque<Job> = (0..3).map(|i| job(a, d, &f, i)).collect();
        assert_eq!(afalg.submit_burst(Duration::ZERO, &mut queue), 3);
        assert_eq!(afalg.next_completion(), NextCompletion::External);
        let mut out = Vec::new();
        assert_eq!(
            afalg.reclaim(Duration::from_millis(50), &mut out),
            0,
            "{alg}: too young"
        );
        assert_eq!(afalg.in_flight(), 3);
        assert_eq!(afalg.reclaim(Duration::from_millis(200), &mut out), 3, "{alg}");
        for (i, j) in out.iter().enumerate() {
            assert_eq!(j.user, i as u64);
            assert_eq!(j.desc.status, Status::Error(DescriptorError::Fault), "{alg}");
            assert_eq!(j.buf.data(), &f[..]);
        }
        assert_eq!(afalg.in_flight(), 0);
        assert_eq!(afalg.next_completion(), NextCompletion::Idle);
        assert!(afalg.counters().errors >= 3);
        // A longer age spares them.
        afalg.set_reclaim_after(Duration::from_secs(10));
        afalg.stall_next_requests_for_test(1);
        let mut queue: VecDeque<Job> = [job(a, d, &f, 9)].into();
        afalg.submit_burst(Duration::ZERO, &mut queue);
        let mut out = Vec::new();
        assert_eq!(afalg.reclaim(Duration::from_secs(5), &mut out), 0);
        assert_eq!(afalg.reclaim(Duration::from_secs(10), &mut out), 1);
    }
    // Synchronous I/O has nothing on a ring: reclaim just hands back what is done.
    let mut afalg = engine(BufferPolicy::Registered, AfalgIo::Sync);
    let a = afalg
        .register(&spec(Algorithm::Aes128Gcm16, false))
        .expect("registers");
    let d = descriptor(
        Algorithm::Aes128Gcm16,
        64,
        DescriptorKind::SinglePass,
        Direction::Encrypt,
        false,
    );
    let mut queue: VecDeque<Job> = [job(a, d, &frame(Algorithm::Aes128Gcm16, 64, 1), 0)].into();
    afalg.submit_burst(Duration::ZERO, &mut queue);
    assert_eq!(afalg.next_completion(), NextCompletion::Ready);
    let mut out = Vec::new();
    assert_eq!(afalg.reclaim(Duration::from_secs(60), &mut out), 1);
    assert_eq!(out[0].desc.status, Status::Done);
}

fn drop_with_requests_outstanding_cancels_and_waits() {
    let alg = Algorithm::Aes128Gcm16;
    let d = descriptor(alg, 256, DescriptorKind::SinglePass, Direction::Encrypt, false);
    let f = frame(alg, 256, 5);
    // Warm up whatever the process opens once (the first io_uring, libc).
    drop(engine(BufferPolicy::Registered, AfalgIo::IoUring));
    let before = open_fds();
    for round in 0..5 {
        for buffers in BufferPolicy::ALL {
            let mut afalg = engine(buffers, AfalgIo::IoUring);
            let a = afalg.register(&spec(alg, false)).expect("registers");
            let b = afalg
                .register(&spec(Algorithm::Aes128Sha1, true))
                .expect("registers");
            afalg.stall_next_requests_for_test(4 + round);
            let mut queue: VecDeque<Job> = (0..SLOTS as u64 + 20)
                .map(|i| {
                    if i % 3 == 0 {
                        let p = 96;
                        let d = descriptor(
                            Algorithm::Aes128Sha1,
                            p,
                            DescriptorKind::SinglePass,
                            Direction::Encrypt,
                            true,
                        );
                        job(b, d, &frame(Algorithm::Aes128Sha1, p, i as u32), i)
                    } else {
                        job(a, d, &f, i)
                    }
                })
                .collect();
            let taken = afalg.submit_burst(Duration::ZERO, &mut queue);
            assert_eq!(taken, SLOTS, "the engine takes as many jobs as it has slots");
            assert_eq!(queue.len(), 20, "the rest stay queued, in order");
            assert_eq!(queue.front().map(|j| j.user), Some(SLOTS as u64));
            assert_eq!(afalg.next_completion(), NextCompletion::External);
            drop(afalg);
        }
        assert_eq!(
            open_fds(),
            before,
            "round {round}: every socket and the ring are closed"
        );
    }
}

fn released_and_unknown_handles_complete_with_bad_session() {
    let alg = Algorithm::Aes256Sha256;
    let d = descriptor(alg, 128, DescriptorKind::SinglePass, Direction::Encrypt, false);
    let f = frame(alg, 128, 2);
    let mut soft = SoftEngine::new(BufferPolicy::Registered);
    let s = soft.register(&spec(alg, false)).expect("soft");
    let want = results(run(&mut soft, Duration::ZERO, vec![job(s, d, &f, 0)]));
    for io in AfalgIo::ALL {
        let mut afalg = engine(BufferPolicy::Registered, io);
        let before = open_fds();
        let a = afalg.register(&spec(alg, false)).expect("registers");
        assert!(
            open_fds() > before,
            "{io}: the sockets are opened at registration"
        );
        // Jobs in flight when their session is released still complete.
        let mut queue: VecDeque<Job> = (0..40).map(|i| job(a, d, &f, i)).collect();
        assert_eq!(afalg.submit_burst(Duration::ZERO, &mut queue), 40);
        afalg.release(a);
        let mut out = Vec::new();
        for _ in 0..1000 {
            afalg.poll_burst(Duration::ZERO, &mut out);
            if out.len() == 40 {
                break;
            }
            afalg.wait(Duration::from_millis(5));
        }
        assert_eq!(out.len(), 40, "{io}");
        for (i, j) in out.iter().enumerate() {
            assert_eq!(j.user, i as u64, "{io}: in order");
            assert_eq!(
                j.desc.status,
                Status::Done,
                "{io}: released in flight still completes"
            );
            assert_eq!(j.buf.data(), &want[0].0[..], "{io}");
        }
        assert_eq!(
            open_fds(),
            before,
            "{io}: release closed every socket of the session"
        );
        // Now the handle is refused, as are unknown ones, even once the
        // slot is reused by another session.
        let b = afalg.register(&spec(alg, false)).expect("registers");
        assert_eq!(b.index, a.index);
        let got = results(run(
            &mut afalg,
            Duration::ZERO,
            vec![
                job(a, d, &f, 0),
                job(SessionHandle::INVALID, d, &f, 1),
                job(b, d, &f, 2),
            ],
        ));
        assert_eq!(got[0].1, Status::Error(DescriptorError::BadSession), "{io}");
        assert_eq!(got[0].0, f, "{io}: untouched");
        assert_eq!(got[1].1, Status::Error(DescriptorError::BadSession), "{io}");
        assert_eq!(got[2], want[0], "{io}");
    }
}

fn no_allocation_per_job_on_the_registered_path() {
    use DescriptorKind::*;
    let cases = [
        (Algorithm::Aes128Gcm16, false, vec![SinglePass]),
        (Algorithm::Aes128Sha1, true, vec![SinglePass, CipherOnly, MacOnly]),
        (Algorithm::Aes256Sha256, false, vec![SinglePass]),
    ];
    for io in AfalgIo::ALL {
        for (alg, esn, kinds) in &cases {
            let (alg, esn) = (*alg, *esn);
            let mut afalg = engine(BufferPolicy::Registered, io);
            let h = afalg.register(&spec(alg, esn)).expect("registers");
            let p = round_up(1400, alg.pad_align());
            let f = frame(alg, p, 4);
            let mut pool = PacketPool::new(64);
            let mut bufs: Vec<PacketBuf> = (0..64).map(|_| pool.alloc().expect("pool")).collect();
            let mut queue: VecDeque<Job> = VecDeque::with_capacity(64);
            let mut out: Vec<Job> = Vec::with_capacity(64);
            let (warm, measured) = (300usize, 1000usize);
            let mut sent = 0usize;
            let mut back = 0usize;
            let mut allocations = 0u64;
            while back < warm + measured {
                while sent < warm + measured && queue.len() < 32 {
                    let Some(mut b) = bufs.pop() else { break };
                    assert!(b.fill(&f));
                    let kind = kinds[sent % kinds.len()];
                    let d = descriptor(alg, p, kind, Direction::Encrypt, esn);
                    queue.push_back(Job::new(h, d, b, OFFSET, sent as u64));
                    sent += 1;
                }
                let ((), n) = counting(|| {
                    afalg.submit_burst(Duration::ZERO, &mut queue);
                    afalg.poll_burst(Duration::ZERO, &mut out);
                    if out.is_empty() && afalg.next_completion() == NextCompletion::External {
                        afalg.wait(Duration::from_millis(2));
                    }
                });
                if back >= warm {
                    allocations += n;
                }
                for j in out.drain(..) {
                    assert_eq!(j.desc.status, Status::Done, "{alg} {io}");
                    back += 1;
                    bufs.push(j.buf);
                }
            }
            assert_eq!(
                allocations, 0,
                "{alg} esn={esn} {io}: allocations in submit_burst/poll_burst/wait over {measured} jobs after warm-up"
            );
            // The per-request policy allocates its bounce buffers, by design.
            let mut per_request = engine(BufferPolicy::PerRequest, io);
            let h = per_request.register(&spec(alg, esn)).expect("registers");
            let d = descriptor(alg, p, kinds[0], Direction::Encrypt, esn);
            let mut queue: VecDeque<Job> = [Job::new(h, d, buf(&f), OFFSET, 0)].into();
            let (_, n) = counting(|| per_request.submit_burst(Duration::ZERO, &mut queue));
            assert!(n > 0, "the per-request policy bounces");
            let mut out = Vec::new();
            while out.is_empty() {
                per_request.poll_burst(Duration::ZERO, &mut out);
                per_request.wait(Duration::from_millis(2));
            }
        }
    }
}

fn a_kernel_refusal_at_registration_is_refused_with_the_reason() {
    let mut afalg = engine(BufferPolicy::Registered, AfalgIo::IoUring);
    let before = open_fds();
    // Room for two more descriptors: aes-sha1 needs six (three transforms,
    // an operation socket on each), so the kernel refuses the third socket.
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) };
    let tight = libc::rlimit {
        rlim_cur: open_fds() as u64 + 2,
        rlim_max: old.rlim_max,
    };
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &tight) };
    let refused = afalg.register(&spec(Algorithm::Aes128Sha1, false));
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) };
    match refused {
        Err(accel::RegisterError::Refused { engine, reason }) => {
            assert_eq!(engine, accel::EngineKind::Afalg);
            assert!(reason.contains("open files"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Nothing half-open stays behind, and the engine still registers.
    assert_eq!(
        open_fds(),
        before,
        "the sockets opened before the refusal are closed"
    );
    let h = afalg
        .register(&spec(Algorithm::Aes128Sha1, false))
        .expect("registers");
    afalg.release(h);
}

/// What a session holds in file descriptors is what `session_fds` says,
/// however many of its requests were once in flight together (beyond each
/// transform's own idle socket the engine keeps at most `SPARE_OPS` for
/// all sessions), and a release gives every one back: `espgw engine
/// serve` bounds its tenants' sessions by this count.
fn a_sessions_descriptors_are_what_session_fds_says() {
    for alg in [
        Algorithm::Aes128Gcm16,
        Algorithm::Aes128Sha1,
        Algorithm::Aes256Sha256,
        Algorithm::NullSha1,
        Algorithm::Null,
    ] {
        for io in AfalgIo::ALL {
            let mut afalg = engine(BufferPolicy::Registered, io);
            let base = open_fds();
            let sessions = 4;
            let handles: Vec<SessionHandle> = (0..sessions)
                .map(|_| afalg.register(&spec(alg, false)).expect("registers"))
                .collect();
            assert_eq!(
                open_fds() - base,
                sessions * session_fds(alg),
                "{alg} {io}: what registration opened"
            );
            // Every session once with a ring's worth of requests in flight.
            let payload = round_up(64, alg.pad_align());
            let d = descriptor(
                alg,
                payload,
                DescriptorKind::SinglePass,
                Direction::Encrypt,
                false,
            );
            for &h in &handles {
                let jobs = (0..SLOTS as u32)
                    .map(|i| job(h, d, &frame(alg, payload, i), u64::from(i)))
                    .collect();
                let back = run(&mut afalg, Duration::ZERO, jobs);
                assert!(back.iter().all(|j| j.desc.status == Status::Done), "{alg} {io}");
            }
            let held = open_fds() - base;
            assert!(
                held <= sessions * session_fds(alg) + SPARE_OPS,
                "{alg} {io}: {held} descriptors held, the bound is {} + {SPARE_OPS}",
                sessions * session_fds(alg)
            );
            for h in handles {
                afalg.release(h);
            }
            assert_eq!(open_fds(), base, "{alg} {io}: released, every descriptor closed");
        }
    }
}
