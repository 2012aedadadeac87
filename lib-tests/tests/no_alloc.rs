//! Nothing on the fast path allocates (a rule of the design): once warmed
//! up, a gateway carries batch after batch of ESP both ways on the `soft`
//! engine and on the `sec` model, in every style, with registered buffers,
//! and through the shared engine (tenant and server), without one heap
//! allocation. A counting global allocator watches the
//! steady state; the per-request buffer policy, whose point is a bounce
//! buffer per request, is shown to allocate so that the counter is seen to
//! work.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use accel::{Algorithm, BufferPolicy, EngineKind, EngineSpec, Style};
use common::*;
use dataplane::{Gateway, PacketBuf, PacketPool, Port, Verdict};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only
// counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BATCH: usize = 32;

/// One round: a batch through A (encapsulate), its ESP through B
/// (decapsulate), waiting for the engine as a driver does. Buffers and
/// vectors are the caller's, reused round after round.
struct Rig {
    pair: Pair,
    pool: PacketPool,
    bufs: Vec<PacketBuf>,
    out: Vec<dataplane::Output>,
    plain: Vec<Vec<u8>>,
    now: Duration,
}

impl Rig {
    fn new(alg: Algorithm, spec: &EngineSpec, style: Style) -> Rig {
        let pair = Pair::on(alg, "tunnel", false, spec, style);
        let plain = (0..BATCH)
            .map(|i| udp_packet(HOST_A, HOST_B, 64 + i * 7, i as u8))
            .collect();
        Rig {
            pair,
            pool: PacketPool::new(BATCH * 4),
            bufs: Vec::with_capacity(BATCH),
            out: Vec::with_capacity(BATCH * 2),
            plain,
            now: Duration::ZERO,
        }
    }

    fn through(
        gw: &mut Gateway,
        from: Port,
        rig_now: &mut Duration,
        bufs: &mut Vec<PacketBuf>,
        out: &mut Vec<dataplane::Output>,
        pool: &mut PacketPool,
    ) {
        gw.handle_batch(*rig_now, from, bufs, out, pool);
        drivers::drive::settle(gw, rig_now, out, pool);
        *rig_now += Duration::from_micros(1);
    }

    fn round(&mut self) {
        for p in &self.plain {
            let mut buf = self.pool.alloc().expect("pool sized for the batch");
            assert!(buf.fill(p));
            self.bufs.push(buf);
        }
        let Rig {
            pair,
            pool,
            bufs,
            out,
            now,
            ..
        } = self;
        Self::through(&mut pair.a, Port::Inside, now, bufs, out, pool);
        for (buf, verdict) in out.drain(..) {
            assert_eq!(verdict, Verdict::Forward(Port::Outside));
            bufs.push(buf);
        }
        Self::through(&mut pair.b, Port::Outside, now, bufs, out, pool);
        for (buf, verdict) in out.drain(..) {
            assert_eq!(verdict, Verdict::Forward(Port::Inside));
            pool.free(buf);
        }
    }

    /// Allocations over `rounds` rounds after `warm` rounds of warm-up.
    fn allocations(&mut self, warm: usize, rounds: usize) -> u64 {
        for _ in 0..warm {
            self.round();
        }
        ALLOCATIONS.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        for _ in 0..rounds {
            self.round();
        }
        COUNTING.store(false, Ordering::Relaxed);
        ALLOCATIONS.load(Ordering::Relaxed)
    }
}

// One test function: the counter is process-wide, so the cases must not
// run in parallel threads.
#[test]
fn the_steady_state_allocates_nothing_on_soft_and_sec() {
    for kind in [EngineKind::Soft, EngineKind::Sec] {
        for style in Style::ALL {
            for alg in [Algorithm::Aes128Gcm16, Algorithm::Aes128Sha1, Algorithm::Null] {
                let mut rig = Rig::new(alg, &engine_spec(kind, BufferPolicy::Registered), style);
                let n = rig.allocations(20, 50);
                assert_eq!(
                    n, 0,
                    "{kind} {style} {alg}: {n} allocations in 50 rounds of {BATCH} packets each way"
                );
            }
        }
    }
    // The shared engine: the tenant's side and the server's (a thread of
    // this process, so the counter sees both) over both transports.
    let socket = std::env::temp_dir().join(format!("espgw-noalloc-{}.sock", std::process::id()));
    let server = accel::shared::spawn(accel::shared::ServerConfig::new(
        socket.clone(),
        engine_spec(EngineKind::Soft, BufferPolicy::Registered),
    ))
    .expect("server starts");
    for transport in accel::shared::Transport::ALL {
        for style in Style::ALL {
            for alg in [Algorithm::Aes128Gcm16, Algorithm::Aes128Sha1] {
                let mut spec = engine_spec(EngineKind::Shared, BufferPolicy::Registered);
                spec.shared.socket = socket.clone();
                spec.shared.transport = transport;
                let mut rig = Rig::new(alg, &spec, style);
                let n = rig.allocations(20, 50);
                assert_eq!(
                    n, 0,
                    "shared/{transport} {style} {alg}: {n} allocations in 50 rounds of {BATCH} packets each way"
                );
            }
        }
    }
    drop(server);
    // The counter counts: per-request buffers allocate a bounce buffer for
    // every request.
    let mut rig = Rig::new(
        Algorithm::Aes128Gcm16,
        &engine_spec(EngineKind::Soft, BufferPolicy::PerRequest),
        Style::Async,
    );
    let n = rig.allocations(5, 10);
    assert!(n >= (10 * BATCH * 2) as u64, "per-request: {n} allocations");
}
