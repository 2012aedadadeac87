//! The ICV bypass for fuzzing. Compiled only with `--cfg fuzzing`, which
//! `cargo fuzz` sets and no other build does (and a build with it but
//! without debug assertions refuses to compile, see `lib.rs`).
//!
//! While the bypass is on, the CPU engines (`soft`, `sec`) take every
//! inbound packet's ICV as valid and its ciphertext as already decrypted,
//! so that a fuzzer's bytes reach the padding, trailer and inner-packet
//! checks instead of stopping at the ICV. Outbound processing is unchanged.
//! It is on by default; a target that checks round trips turns it off.

use std::sync::atomic::{AtomicBool, Ordering};

static ICV_BYPASS: AtomicBool = AtomicBool::new(true);

/// Turns the bypass on or off for the whole process.
pub fn set_icv_bypass(on: bool) {
    ICV_BYPASS.store(on, Ordering::Relaxed);
}

pub(crate) fn icv_bypass() -> bool {
    ICV_BYPASS.load(Ordering::Relaxed)
}
