//! Key memory: every copy of a key an engine holds (the spec's raw keys,
//! AES's round keys, which start with the key) is on pages locked in RAM
//! and left out of core dumps, and none is left once the session is
//! released; when the kernel refuses to lock (RLIMIT_MEMLOCK without
//! CAP_IPC_LOCK), keys are still kept, unlocked, and the refusal is logged
//! once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use accel::{Algorithm, Engine, SessionSpec, SoftEngine};
use testkit::memscan::{self, Needle};

/// Counts WARN events on the thread it is the default for.
struct Warnings(Arc<AtomicUsize>);

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

const CAP_IPC_LOCK: u32 = 14;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Sets whether this thread's effective set holds CAP_IPC_LOCK (while its
/// permitted set does); returns whether it did.
fn set_ipc_lock(on: bool) -> bool {
    let mut header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two CapData for version 3.
    assert_eq!(
        unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) },
        0
    );
    let had = data[0].effective & (1 << CAP_IPC_LOCK) != 0;
    if on && data[0].permitted & (1 << CAP_IPC_LOCK) != 0 {
        data[0].effective |= 1 << CAP_IPC_LOCK;
    } else if !on {
        data[0].effective &= !(1 << CAP_IPC_LOCK);
    }
    // SAFETY: capset of this thread (pid 0) with the sets just read, one
    // effective bit changed within the permitted set.
    assert_eq!(
        unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) },
        0
    );
    had
}

fn memlock_limit(soft: Option<libc::rlim_t>) -> libc::rlimit {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit), 0);
        if let Some(soft) = soft {
            let lowered = libc::rlimit {
                rlim_cur: soft,
                rlim_max: limit.rlim_max,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &lowered), 0);
        }
    }
    limit
}

/// One test, in phases: the memory lock limit is the process's.
#[test]
fn keys_are_locked_out_of_dumps_gone_after_release_and_a_refused_lock_degrades() {
    memscan::mark_stack();
    // AES-CBC with HMAC-SHA1: AWS-LC's round keys and the raw keys.
    let (enc, auth) = (Needle::random(16), Needle::random(20));
    let mut raw = [0u8; 36];
    enc.unmask_into(&mut raw[..16]);
    auth.unmask_into(&mut raw[16..]);
    let spec = SessionSpec::new(Algorithm::Aes128Sha1, false, &raw[..16], &raw[16..]).unwrap();
    zeroize::Zeroize::zeroize(&mut raw);
    let mut engine = SoftEngine::default();
    let handle = engine.register(&spec).unwrap();

    let installed = memscan::scan(&[&enc, &auth]);
    let locked = accel::key_memory().lock_failures == 0;
    assert!(
        installed.hits.len() >= 3,
        "the spec's two keys and the encryption round keys: {:#?}",
        installed.hits
    );
    for hit in &installed.hits {
        assert!(hit.flags.split(' ').any(|f| f == "dd"), "in core dumps: {hit}");
        if locked {
            assert!(hit.flags.split(' ').any(|f| f == "lo"), "not locked: {hit}");
        }
    }

    engine.release(handle);
    drop(spec);
    let released = memscan::scan(&[&enc, &auth]);
    assert!(
        released.hits.is_empty(),
        "left after release: {:#?}",
        released.hits
    );

    // The kernel refuses to lock: no CAP_IPC_LOCK, no RLIMIT_MEMLOCK.
    let warned_before = !locked;
    let failures_before = accel::key_memory().lock_failures;
    let had_ipc_lock = set_ipc_lock(false);
    let old_limit = memlock_limit(Some(0));
    let warnings = Arc::new(AtomicUsize::new(0));
    let secrets = tracing::subscriber::with_default(Warnings(Arc::clone(&warnings)), || {
        // Larger than a slot: each takes a mapping of its own, so each
        // asks the kernel to lock.
        let big = Needle::random(5000);
        let mut raw = vec![0u8; 5000];
        big.unmask_into(&mut raw);
        let secrets = [accel::SecretBytes::new(&raw), accel::SecretBytes::new(&raw)];
        zeroize::Zeroize::zeroize(&mut raw[..]);
        (big, secrets)
    });
    memlock_limit(Some(old_limit.rlim_cur));
    if had_ipc_lock {
        set_ipc_lock(true);
    }
    let (big, secrets) = secrets;
    assert_eq!(accel::key_memory().lock_failures, failures_before + 2);
    assert_eq!(
        warnings.load(Ordering::Relaxed),
        usize::from(!warned_before),
        "one warning per process"
    );
    let prefix = big.prefix(64);
    let unlocked = memscan::scan(&[&prefix]);
    assert_eq!(unlocked.hits.len(), 2, "both kept: {:#?}", unlocked.hits);
    for hit in &unlocked.hits {
        let flags: Vec<&str> = hit.flags.split(' ').collect();
        assert!(flags.contains(&"dd") && !flags.contains(&"lo"), "{hit}");
    }
    drop(secrets);
    assert!(memscan::scan(&[&prefix]).hits.is_empty());
}
