//! The look-aside offload boundary.
//!
//! Owns every cryptographic primitive espgw uses: algorithms and their wire
//! parameters, sessions (an SA's keys, registered once with an engine), the packet
//! buffers that are the boundary's registered memory, descriptors and jobs
//! that carry one packet's crypto across the boundary, and the engines behind
//! it. Knows nothing of policies, SAs' sequence state or packet headers
//! beyond the regions a descriptor names; must not log per packet.
//!
//! Invariants: a descriptor's regions are validated before any engine
//! indexes a buffer; an inbound packet is never decrypted unless its ICV
//! verified (AEADs check inside the primitive); keys never appear in `Debug`;
//! every job submitted to an engine comes back exactly once, through `poll`
//! or `reclaim`, with its buffer.

#![warn(missing_docs, unreachable_pub)]

pub mod algorithm;
pub mod buffer;
pub mod descriptor;
pub mod engine;
#[cfg(fuzzing)]
pub mod fuzzing;
pub mod job;
pub mod os;
mod prefetch;
pub mod primitive;
pub mod session;
mod wiped;

#[cfg(target_os = "linux")]
pub use engine::afalg;
pub use engine::sec;
#[cfg(target_os = "linux")]
pub use engine::shared;

// The ICV bypass (`fuzzing.rs`) exists for `cargo fuzz`, whose builds keep
// debug assertions; an optimised build without them is a release build, and
// must never have it.
#[cfg(all(fuzzing, not(debug_assertions)))]
compile_error!(
    "`--cfg fuzzing` disables ICV checks and is for `cargo fuzz` builds only (with debug assertions)"
);

/// A derived variant list (`strum::VariantArray`) as an array, so an enum's
/// `ALL` iterates by value and carries its length in its type. `N` other
/// than the number of variants fails const evaluation, so the build.
pub const fn variant_array<T: Copy, const N: usize>(variants: &'static [T]) -> [T; N] {
    match variants.first_chunk::<N>() {
        Some(all) if variants.len() == N => *all,
        _ => panic!("the array length is not the number of variants"),
    }
}

// For `name_table!` and `unknown_name!` in crates that call them.
#[doc(hidden)]
pub use strum;

/// `ALL` (every variant by value, in declaration order), `NAMES` (their
/// names, in the same order) and `name()` for an enum that derives strum's
/// `VariantArray`, `VariantNames` and `IntoStaticStr`: the tables follow
/// the enum, none is kept by hand.
#[macro_export]
macro_rules! name_table {
    ($t:ident) => {
        impl $t {
            /// Every variant, in declaration order.
            pub const ALL: [$t; <$t as $crate::strum::VariantArray>::VARIANTS.len()] =
                $crate::variant_array(<$t as $crate::strum::VariantArray>::VARIANTS);
            /// The names, in the order of `ALL`.
            pub const NAMES: &'static [&'static str] = <$t as $crate::strum::VariantNames>::VARIANTS;

            /// The name configs, the command line and JSON use.
            pub fn name(self) -> &'static str {
                self.into()
            }
        }
    };
}

/// The error of a name `$t` does not have, offering `$t::NAMES`; `$t`
/// derives `EnumString` with `parse_err_ty = $err, parse_err_fn = $err::new`.
#[macro_export]
macro_rules! unknown_name {
    ($(#[$doc:meta])* $err:ident, $t:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
        #[error("unknown {} `{}`; expected {}", $what, .0, $crate::one_of($t::NAMES))]
        pub struct $err(pub String);

        impl $err {
            fn new(name: &str) -> $err {
                $err(name.to_owned())
            }
        }
    };
}

/// Checks what a `name_table!` enum publishes: its names are `expected`,
/// in order, and `name`, `Display`, `FromStr` and serde all agree on them.
#[cfg(test)]
pub(crate) fn assert_published_names<T>(expected: &[&str])
where
    T: strum::VariantArray + strum::VariantNames + Copy + PartialEq + std::fmt::Debug,
    T: std::fmt::Display + std::str::FromStr + serde::Serialize + Into<&'static str>,
    T::Err: std::fmt::Debug,
{
    assert_eq!(<T as strum::VariantNames>::VARIANTS, expected);
    for (&v, name) in <T as strum::VariantArray>::VARIANTS.iter().zip(expected) {
        assert_eq!(v.into(), *name);
        assert_eq!(v.to_string(), *name);
        assert_eq!(name.parse::<T>().ok(), Some(v), "{name}");
        assert_eq!(serde_json::to_value(v).unwrap(), *name);
    }
}

/// `a, b or c`: the names an unknown-name error offers, from the derived
/// list, so a new variant is offered too.
pub fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

pub use algorithm::{Algorithm, CipherKind, IntegrityKind, UnknownAlgorithm};
pub use buffer::{PacketBuf, PacketPool};
pub use descriptor::{Descriptor, DescriptorError, DescriptorKind, Direction, Region, Status};
pub use engine::{
    build_engine, BusBytes, Engine, EngineCounters, EngineError, EngineKind, EngineSpec, HostCharges,
    NextCompletion, RegisterError, SoftEngine, UnknownEngine,
};
pub use job::{BufferPolicy, Job, Style, UnknownBufferPolicy, UnknownStyle};
pub use sec::{
    Completion, CompletionKind, DeviceProfile, EuKind, EuRate, FaultPlan, HostCosts, SecConfig, SecEngine,
    ThreadedSecEngine, Throughput, UnknownProfile,
};
pub use session::{Session, SessionError, SessionHandle, SessionSpec, SessionTable};
pub use wiped::{key_memory, scrub_stack, KeyMemoryStats, SecretBytes};
