//! The `sec` engine: a SEC 2.x-class look-aside accelerator.
//!
//! Two implementations share the configuration and the bus accounting
//! here:
//! - `model.rs`, [`SecEngine`], the default: a discrete-event model in
//!   modelled time. Its timeline comes from a [`DeviceProfile`] and from the
//!   `now` values it is given, never from this machine's scheduler; the
//!   crypto runs for real so the bytes are the soft engine's.
//! - `threaded.rs`, [`ThreadedSecEngine`], chosen with
//!   [`SecConfig::threads`]: channel workers on other cores that busy-poll
//!   their rings. Real parallelism, at host speed, and only sensible with a
//!   spare core per channel; never a figure of the default sweep.
//!
//! `profile.rs` holds the device numbers and the host costs they imply.
//! This file owns the configuration types, the mapping from a descriptor to
//! the execution units it needs, and the bytes it moves over the bus. It
//! must not keep engine state or read a clock.

use std::time::Duration;

use crate::algorithm::{Algorithm, CipherKind, IntegrityKind};
use crate::descriptor::{Descriptor, DescriptorKind, Direction};
use crate::engine::BusBytes;
use crate::job::BufferPolicy;

mod model;
mod profile;
mod threaded;

pub use model::SecEngine;
pub use profile::{DeviceProfile, EuKind, EuRate, HostCosts, Throughput, UnknownProfile};
pub use threaded::{SpawnError, ThreadedSecEngine};

/// Size of a SEC descriptor on the bus: a header dword and seven pointer
/// dwords (length, extent, pointer) of 8 bytes each.
pub const DESCRIPTOR_BYTES: u64 = 64;

/// How the engine tells the dataplane that work is done.
///
/// [`CompletionKind`] is the same without the coalescing parameters: its
/// names (the config's `[accel] completion`) are the variants in kebab
/// case, derived for parsing as for serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, strum::EnumDiscriminants)]
#[serde(rename_all = "kebab-case")]
#[strum_discriminants(
    name(CompletionKind),
    doc = "A completion mode without its parameters: what the config's `[accel] completion` names.",
    derive(strum::EnumString, strum::VariantNames, strum::IntoStaticStr),
    strum(serialize_all = "kebab-case")
)]
pub enum Completion {
    /// An interrupt per completion; a job becomes visible when its
    /// interrupt fires, at its completion time.
    #[default]
    Interrupt,
    /// No interrupt: the host reads the done words; a job is visible from
    /// its completion time on (the spin until then is the host's cost).
    Polling,
    /// One interrupt after `count` completions, or `timeout` after the first
    /// completion not yet signalled, whichever comes first; jobs become
    /// visible when it fires.
    Coalesced {
        /// Completions that raise the interrupt.
        count: usize,
        /// Longest a completion waits to be signalled, in modelled time.
        timeout: Duration,
    },
}

impl Completion {
    /// The config name of the mode (`interrupt`, `polling`, `coalesced`), without its parameters.
    pub fn name(&self) -> &'static str {
        CompletionKind::from(self).into()
    }
}

/// Injected faults, by global descriptor number (1-based, in submission
/// order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// These descriptors complete with `Status::Error(Fault)`.
    pub fail: Vec<u64>,
    /// These descriptors never complete (the completion is lost); `reclaim`
    /// gives them back once their completion time has passed.
    pub drop_completion: Vec<u64>,
    /// Before fetching this descriptor, its channel stalls for the duration
    /// (modelled time in the model; the threaded engine spins it out).
    pub stall: Option<(u64, Duration)>,
    /// Every this-many-th descriptor fails too (soak tests).
    pub fail_every: Option<u64>,
    /// Every this-many-th descriptor's completion is lost too.
    pub drop_completion_every: Option<u64>,
}

impl FaultPlan {
    pub(crate) fn fails(&self, number: u64) -> bool {
        self.fail.contains(&number) || self.fail_every.is_some_and(|n| n > 0 && number.is_multiple_of(n))
    }

    pub(crate) fn loses_completion(&self, number: u64) -> bool {
        self.drop_completion.contains(&number)
            || self
                .drop_completion_every
                .is_some_and(|n| n > 0 && number.is_multiple_of(n))
    }

    pub(crate) fn stall_before(&self, number: u64) -> Option<Duration> {
        self.stall.and_then(|(at, pause)| (at == number).then_some(pause))
    }
}

/// Configuration of the `sec` engine.
#[derive(Debug, Clone, PartialEq)]
pub struct SecConfig {
    /// The modelled part: rates, setup, latency, host costs.
    pub profile: DeviceProfile,
    /// Channels in use (a session's jobs all go to one channel).
    /// Defaults to the profile's.
    pub channels: usize,
    /// Descriptors a channel's fetch FIFO holds (SEC 2.x: 24). Defaults to
    /// the profile's.
    pub fifo_depth: usize,
    /// How completions are signalled to the host.
    pub completion: Completion,
    /// How jobs' buffers reach the device.
    pub buffers: BufferPolicy,
    /// Faults to inject (tests and soaks); none by default.
    pub faults: FaultPlan,
    /// Use [`ThreadedSecEngine`] (busy-polling channel threads, host speed,
    /// needs a spare core per channel) instead of the model.
    pub threads: bool,
}

impl SecConfig {
    /// The configuration of `profile` with its own channel count and FIFO
    /// depth, interrupt completion and registered buffers.
    pub fn with_profile(profile: DeviceProfile) -> SecConfig {
        SecConfig {
            channels: profile.channels,
            fifo_depth: profile.fifo_depth,
            profile,
            completion: Completion::Interrupt,
            buffers: BufferPolicy::Registered,
            faults: FaultPlan::default(),
            threads: false,
        }
    }
}

impl Default for SecConfig {
    /// `sec2-266mhz`: 4 channels, 24-deep FIFOs.
    fn default() -> Self {
        SecConfig::with_profile(DeviceProfile::sec2_266mhz())
    }
}

/// Refuses what the SEC's execution units cannot run: it has no
/// ChaCha20 or Poly1305 unit (AESU, DEU and MDEU do AES, DES/3DES and the
/// MD5/SHA family), so such a session never reaches the model.
pub(crate) fn check_supported(alg: Algorithm) -> Result<(), crate::engine::RegisterError> {
    if !crate::engine::EngineKind::Sec.supports(alg) {
        return Err(crate::engine::RegisterError::Refused {
            engine: crate::engine::EngineKind::Sec,
            reason: format!(
                "`{alg}`: the SEC has no ChaCha20 or Poly1305 execution unit (AESU, DEU and MDEU only); use the soft or afalg engine"
            ),
        });
    }
    Ok(())
}

fn cipher_unit(alg: Algorithm) -> EuKind {
    match alg.cipher() {
        // ChaCha20: refused at registration (`check_supported`).
        CipherKind::AesGcm | CipherKind::AesCbc | CipherKind::ChaCha20Poly1305 => EuKind::Aesu,
        CipherKind::TripleDesCbc => EuKind::Deu,
        CipherKind::Null => EuKind::Null,
    }
}

fn mac_unit(alg: Algorithm) -> Option<EuKind> {
    match alg.integrity() {
        IntegrityKind::HmacSha1_96 => Some(EuKind::MdeuSha1),
        IntegrityKind::HmacSha256_128 => Some(EuKind::MdeuSha256),
        IntegrityKind::Aead | IntegrityKind::None => None,
    }
}

/// The execution units a descriptor occupies, with the bytes each one
/// walks: a single-pass descriptor holds the cipher unit and the MDEU
/// together on one walk (the MDEU snoops the cipher unit's FIFO), a
/// cipher-only or MAC-only descriptor one unit. The second entry is `None`
/// when one unit is enough.
pub(crate) fn units_for(alg: Algorithm, desc: &Descriptor) -> [Option<(EuKind, u64)>; 2] {
    let cipher_bytes = u64::from(desc.cipher.len);
    let mac_bytes = desc.authenticated().len() as u64;
    let cipher = (cipher_unit(alg), cipher_bytes);
    match (desc.kind, mac_unit(alg)) {
        (DescriptorKind::SinglePass, Some(mac)) => [Some(cipher), Some((mac, mac_bytes))],
        (DescriptorKind::SinglePass, None) | (DescriptorKind::CipherOnly, _) => [Some(cipher), None],
        (DescriptorKind::MacOnly, Some(mac)) => [Some((mac, mac_bytes)), None],
        // A MAC-only pass of a transform without a MAC moves the data through
        // the null unit (the primitive refuses GCM; null/null has nothing).
        (DescriptorKind::MacOnly, None) => [Some((EuKind::Null, mac_bytes)), None],
    }
}

/// Bytes a descriptor moves across the bus.
pub fn bus_bytes(alg: Algorithm, desc: &Descriptor) -> BusBytes {
    let mac_state = match alg.integrity() {
        // Precomputed inner and outer hash states.
        IntegrityKind::HmacSha1_96 => 40,
        IntegrityKind::HmacSha256_128 => 64,
        IntegrityKind::Aead | IntegrityKind::None => 0,
    };
    let cipher_key = alg.enc_key_len() as u64;
    let iv = u64::from(desc.iv.len);
    let header = u64::from(desc.auth_only.len);
    let cipher = u64::from(desc.cipher.len);
    let icv = u64::from(desc.icv.len);
    let decrypting = desc.direction == Direction::Decrypt;
    let (context, data_in, data_out) = match desc.kind {
        DescriptorKind::SinglePass => (
            cipher_key + mac_state + iv,
            header + iv + cipher + if decrypting { icv } else { 0 },
            cipher + if decrypting { 0 } else { icv },
        ),
        DescriptorKind::CipherOnly => (cipher_key + iv, cipher, cipher),
        DescriptorKind::MacOnly => (
            mac_state,
            header + iv + cipher + if decrypting { icv } else { 0 },
            if decrypting { 0 } else { icv },
        ),
    };
    BusBytes {
        descriptors: DESCRIPTOR_BYTES,
        context,
        data_in,
        data_out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the config's `[accel] completion` values and JSON
    /// text: deriving them must not rename one.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        use strum::VariantNames;
        assert_eq!(CompletionKind::VARIANTS, ["interrupt", "polling", "coalesced"]);
        let coalesced = Completion::Coalesced {
            count: 8,
            timeout: Duration::from_micros(50),
        };
        for (completion, name) in [
            (Completion::Interrupt, "interrupt"),
            (Completion::Polling, "polling"),
            (coalesced, "coalesced"),
        ] {
            assert_eq!(completion.name(), name);
            assert_eq!(
                name.parse::<CompletionKind>(),
                Ok(CompletionKind::from(completion))
            );
        }
    }
}
