//! Key memory: where every key and key schedule of an SA lives, and how it
//! dies with the SA.
//!
//! Owns a small arena of page-aligned mappings that are locked in RAM
//! (`mlock`, so never written to swap) and left out of core dumps
//! (`MADV_DONTDUMP`), carved into power-of-two slots; [`Wiped`] (an
//! engine's expanded keys) and [`SecretBytes`] (raw keys) take their
//! storage there and overwrite it with zeros when they are dropped. A
//! refused `mlock` (RLIMIT_MEMLOCK without CAP_IPC_LOCK) is logged once and
//! the memory is used unlocked: keys still die with their SA, they may only
//! reach swap. Allocation takes a lock, so it belongs to SA install and
//! delete; nothing here runs per packet.
//!
//! The crypto crates build their key schedules on the stack and return
//! them by value (`ring` and `aws-lc-rs` both), so each construction leaves
//! copies in stack frames below the caller that nothing wipes;
//! [`scrub_stack`] overwrites that region once a session is built.
//! Must not know algorithms, sessions or engines.

use std::alloc::Layout;
use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use zeroize::Zeroize;

const PAGE: usize = 4096;
/// Each slot class takes mappings of this size from the kernel.
const CHUNK: usize = 4 * PAGE;
/// Slot sizes; a larger value gets a mapping of its own.
const CLASSES: [usize; 7] = [64, 128, 256, 512, 1024, 2048, 4096];

/// What the key memory holds now; for tests and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyMemoryStats {
    /// Bytes mapped for keys.
    pub mapped: usize,
    /// Of those, bytes the kernel locked in RAM.
    pub locked: usize,
    /// Allocations in use.
    pub in_use: usize,
    /// Mappings `mlock` refused (used unlocked).
    pub lock_failures: usize,
}

struct Arena {
    /// Free slots of each class, by address.
    free: [Vec<usize>; CLASSES.len()],
    stats: KeyMemoryStats,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena {
    free: [const { Vec::new() }; CLASSES.len()],
    stats: KeyMemoryStats {
        mapped: 0,
        locked: 0,
        in_use: 0,
        lock_failures: 0,
    },
});

/// `mlock` refusals are logged once per process.
static LOCK_WARNED: AtomicBool = AtomicBool::new(false);

fn arena() -> std::sync::MutexGuard<'static, Arena> {
    // A panic while the lock was held cannot leave the free lists in a
    // state worse than missing a slot.
    ARENA.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the key memory holds now.
pub fn key_memory() -> KeyMemoryStats {
    arena().stats
}

fn class_of(layout: Layout) -> Option<usize> {
    CLASSES
        .iter()
        .position(|&size| size >= layout.size() && size >= layout.align())
}

/// Maps `len` bytes (a multiple of the page size) for keys: out of core
/// dumps, locked if the kernel allows.
fn map(len: usize, stats: &mut KeyMemoryStats) -> Option<NonNull<u8>> {
    let ptr = crate::os::map_anonymous(len).ok()?;
    let raw = ptr.as_ptr().cast();
    // SAFETY: advice and locking on the mapping just made, of `len` bytes.
    // MADV_DONTDUMP cannot fail on a private anonymous mapping of a kernel
    // that knows it (3.4 on); an older one dumps it, as it dumps the rest.
    unsafe { libc::madvise(raw, len, libc::MADV_DONTDUMP) };
    // SAFETY: as above.
    if unsafe { libc::mlock(raw, len) } == 0 {
        stats.locked += len;
    } else {
        let error = std::io::Error::last_os_error();
        stats.lock_failures += 1;
        if !LOCK_WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "cannot lock key memory in RAM ({error}; RLIMIT_MEMLOCK is {} bytes): keys are kept unlocked and may reach swap; raise the limit (ulimit -l, LimitMEMLOCK=) or keep CAP_IPC_LOCK",
                memlock_limit()
            );
        }
    }
    stats.mapped += len;
    Some(ptr)
}

/// Unmaps a mapping made by [`map`], of `len` bytes.
fn unmap(ptr: NonNull<u8>, len: usize, stats: &mut KeyMemoryStats) {
    // SAFETY: the caller gives a whole mapping made by `map`, wiped and no
    // longer referred to. munlock of pages that were not locked is harmless.
    unsafe {
        if libc::munlock(ptr.as_ptr().cast(), len) == 0 && stats.locked >= len {
            stats.locked -= len;
        }
        libc::munmap(ptr.as_ptr().cast(), len);
    }
    stats.mapped -= len;
}

fn memlock_limit() -> String {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return "unknown".into();
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        limit.rlim_cur.to_string()
    }
}

/// Storage for `layout` in key memory; aborts like the global allocator
/// when the kernel has no memory left.
fn alloc(layout: Layout) -> NonNull<u8> {
    if layout.size() == 0 {
        // A zero-sized value needs an aligned address, no storage.
        return NonNull::new(layout.align() as *mut u8).unwrap_or(NonNull::dangling());
    }
    let mut arena = arena();
    let Arena { free, stats } = &mut *arena;
    let ptr = match class_of(layout) {
        Some(class) => {
            if free[class].is_empty() {
                let size = CLASSES[class];
                let Some(chunk) = map(CHUNK, stats) else {
                    drop(arena);
                    std::alloc::handle_alloc_error(layout);
                };
                // Handed out from the chunk's start.
                free[class].extend(
                    (0..CHUNK / size)
                        .rev()
                        .map(|i| chunk.as_ptr() as usize + i * size),
                );
            }
            free[class].pop().and_then(|at| NonNull::new(at as *mut u8))
        }
        None => map(layout.size().next_multiple_of(PAGE), stats),
    };
    let Some(ptr) = ptr else {
        drop(arena);
        std::alloc::handle_alloc_error(layout);
    };
    stats.in_use += 1;
    ptr
}

/// Wipes and gives back storage from [`alloc`].
///
/// # Safety
/// `ptr` came from `alloc(layout)` and nothing refers to it any more.
unsafe fn free(ptr: NonNull<u8>, layout: Layout) {
    if layout.size() == 0 {
        return;
    }
    // SAFETY: the caller's promise: `layout.size()` bytes at `ptr` are ours.
    // Zeroize writes with volatile stores, which the compiler keeps.
    unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), layout.size()) }.zeroize();
    let mut arena = arena();
    let Arena { free, stats } = &mut *arena;
    stats.in_use -= 1;
    match class_of(layout) {
        Some(class) => free[class].push(ptr.as_ptr() as usize),
        None => unmap(ptr, layout.size().next_multiple_of(PAGE), stats),
    }
}

/// A value in key memory, dropped and then overwritten with zeros.
///
/// Dropping first lets a type that cleans up after itself (AWS-LC's keys
/// wipe their own bytes, RustCrypto's hash states with `zeroize` too) do
/// so; `ring`'s keys do not, and are plain bytes once dropped, so wiping
/// the slot afterwards removes every schedule whatever its type does.
pub(crate) struct Wiped<T> {
    ptr: NonNull<T>,
}

// SAFETY: a Wiped<T> owns its T exclusively, as a Box<T> does.
unsafe impl<T: Send> Send for Wiped<T> {}
// SAFETY: shared access only hands out &T.
unsafe impl<T: Sync> Sync for Wiped<T> {}

impl<T> Wiped<T> {
    /// Builds the value with `build` and stores it in key memory, taking
    /// the slot first so that the value is written once, where it stays.
    /// A failed `build` gives the slot back.
    pub(crate) fn try_new_with<E>(build: impl FnOnce() -> Result<T, E>) -> Result<Self, E> {
        let layout = Layout::new::<T>();
        let ptr = alloc(layout).cast::<T>();
        match build() {
            Ok(value) => {
                // SAFETY: `ptr` is fresh storage for one T, suitably aligned
                // (slots are aligned to their size, at least T's alignment).
                unsafe { ptr.as_ptr().write(value) };
                Ok(Wiped { ptr })
            }
            Err(e) => {
                // SAFETY: from `alloc(layout)` just above, never written.
                unsafe { free(ptr.cast(), layout) };
                Err(e)
            }
        }
    }
}

impl<T> Deref for Wiped<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: `ptr` holds a live T until drop.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for Wiped<T> {
    fn drop(&mut self) {
        // SAFETY: the value is dropped exactly once, here; afterwards its
        // storage is plain bytes that `free` wipes and takes back.
        unsafe {
            std::ptr::drop_in_place(self.ptr.as_ptr());
            free(self.ptr.cast(), Layout::new::<T>());
        }
    }
}

/// Raw key bytes in key memory, wiped when dropped. Never shown by `Debug`;
/// compared in constant time.
pub struct SecretBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: SecretBytes owns its bytes exclusively and hands out only
// references tied to itself, as a Box<[u8]> does.
unsafe impl Send for SecretBytes {}
// SAFETY: as above.
unsafe impl Sync for SecretBytes {}

impl SecretBytes {
    /// A copy of `bytes` in key memory; `bytes` stays the caller's to wipe.
    pub fn new(bytes: &[u8]) -> SecretBytes {
        let ptr = alloc(Self::layout(bytes.len()));
        // SAFETY: fresh storage of `bytes.len()` bytes that cannot overlap
        // the caller's slice.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
        SecretBytes {
            ptr,
            len: bytes.len(),
        }
    }

    fn layout(len: usize) -> Layout {
        // A byte array's layout: size len, alignment 1, always valid.
        Layout::array::<u8>(len).unwrap_or(Layout::new::<u8>())
    }
}

impl Deref for SecretBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes at `ptr`, ours until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for SecretBytes {
    fn clone(&self) -> Self {
        SecretBytes::new(self)
    }
}

impl PartialEq for SecretBytes {
    fn eq(&self, other: &Self) -> bool {
        use subtle::ConstantTimeEq;
        bool::from(self[..].ct_eq(&other[..]))
    }
}

impl Eq for SecretBytes {}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} key bytes, redacted>", self.len)
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        // SAFETY: from `alloc` with this layout; nothing refers to it after
        // this drop.
        unsafe { free(self.ptr, Self::layout(self.len)) };
    }
}

/// How much stack [`scrub_stack`] overwrites: at least twice what the
/// deepest key construction takes (about 6 KiB optimised, 24 KiB in an
/// unoptimised build here; `session.rs` tests it).
#[cfg(not(debug_assertions))]
pub(crate) const SCRUB_BYTES: usize = 16 * 1024;
#[cfg(debug_assertions)]
pub(crate) const SCRUB_BYTES: usize = 64 * 1024;

/// Overwrites the stack below the caller's frame with zeros: where the
/// functions it called just built key schedules and left copies of them
/// (returned by value through several frames). Call it from the frame
/// that called the construction, after it returned, so that the region
/// lies below; `#[inline(never)]` gives it a frame of its own there.
#[inline(never)]
pub fn scrub_stack() {
    let mut area = std::mem::MaybeUninit::<[u8; SCRUB_BYTES]>::uninit();
    // SAFETY: zeros written over a local array of exactly that size. A
    // plain memset (the array is too large for byte-by-byte volatile
    // writes at every SA install); `black_box` then takes the array as
    // read, so the writes cannot be left out as dead stores.
    unsafe { area.as_mut_ptr().cast::<u8>().write_bytes(0, SCRUB_BYTES) };
    std::hint::black_box(&mut area);
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derefs_to_value_and_drops_inner() {
        use std::sync::Arc;
        let shared = Arc::new(5u32);
        let wiped = Wiped::try_new_with(|| Ok::<_, ()>(Arc::clone(&shared))).unwrap();
        assert_eq!(**wiped, 5);
        assert_eq!(Arc::strong_count(&shared), 2);
        drop(wiped);
        assert_eq!(Arc::strong_count(&shared), 1);
        assert_eq!(
            Wiped::<u64>::try_new_with(|| Err("refused")).err(),
            Some("refused")
        );
    }

    #[test]
    fn slots_hold_their_values_aligned() {
        let a = SecretBytes::new(&[7; 20]);
        let b = a.clone();
        assert_eq!(&a[..], &[7; 20]);
        assert_eq!(a, b);
        assert_ne!(a, SecretBytes::new(&[8; 20]));
        assert_eq!(format!("{a:?}"), "<20 key bytes, redacted>");
        assert!(SecretBytes::new(&[]).is_empty());
        let big = Wiped::try_new_with(|| Ok::<_, ()>([3u8; 5000])).unwrap();
        assert_eq!(big[4999], 3);
        assert_eq!(big.ptr.as_ptr() as usize % PAGE, 0);
        let aligned = Wiped::try_new_with(|| Ok::<_, ()>(0u128)).unwrap();
        assert_eq!(aligned.ptr.as_ptr() as usize % std::mem::align_of::<u128>(), 0);
    }
}
