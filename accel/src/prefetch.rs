//! Cache prefetch hints for the engines' per-burst lookups: with thousands
//! of SAs each job's session and key schedule are otherwise a cache miss,
//! paid one after another. Hints only: they read and write nothing the
//! program can see, so any address will do.

const LINE: usize = 64;

/// Starts loading the cache lines `value` occupies.
#[inline]
pub(crate) fn bytes<T>(value: &T) {
    let start = (value as *const T).cast::<u8>();
    // From the line the value starts in to the one it ends in.
    let into_line = start as usize & (LINE - 1);
    let lines = (into_line + std::mem::size_of::<T>().max(1)).div_ceil(LINE);
    let first = start.wrapping_sub(into_line);
    for k in 0..lines {
        hint(first.wrapping_add(k * LINE));
    }
}

#[inline(always)]
fn hint(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch neither faults nor changes memory.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
