//! Sessions: an SA's algorithm and keys, registered once with an engine and
//! used for every packet of that SA.
//!
//! A [`SessionSpec`] is what the control plane hands to an engine at SA
//! install: the algorithm and the raw keys, in key memory. The engine
//! keeps whatever form of the keys it needs (the CPU engines an expanded
//! [`Session`], the kernel engine its own sockets) and answers with a
//! [`SessionHandle`], which is all a job carries; `release` wipes them at
//! SA delete. [`SessionTable`] is the slot table the engines keep their
//! sessions in, with generations so that a released handle is refused.
//!
//! Key material never appears in `Debug`. Each primitive comes from the
//! crate that measured fastest here (the `crypto_libs` bench): AES-GCM and
//! ChaCha20-Poly1305 from `ring`, AES-CBC and 3DES from `aws-lc-rs`, HMAC
//! from RustCrypto. All of them keep their expanded keys inline in the
//! key types (`ring`'s `LessSafeKey`, AWS-LC's `AES_KEY` and DES schedules
//! inside `EncryptingKey`, the keyed hash states of `Hmac`), so each lives
//! in one slot of key memory (`wiped.rs`: locked, out of core dumps,
//! zeroed after the value is dropped; `ring` does not wipe its keys, AWS-LC
//! and RustCrypto with `zeroize` do, the slot is zeroed either way). A
//! session is built below [`Session::new`]'s frame, and the stack there is
//! scrubbed before it returns: the crates return their schedules by value
//! and leave copies in every frame they pass through.

use std::fmt;

use crate::algorithm::{Algorithm, CipherKind, IntegrityKind};
use crate::wiped::{SecretBytes, Wiped};
use aws_lc_rs::cipher::{DecryptingKey, EncryptingKey, UnboundCipherKey};
use hmac::{Hmac, KeyInit};

/// Why a session could not be created from the supplied keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The encryption key has the wrong length for the algorithm.
    #[error("{algorithm} needs a {expected}-byte encryption key{salt_note}, got {got} bytes", salt_note = if algorithm.is_aead() { " (AES key followed by the 4-byte salt)" } else { "" })]
    EncKeyLength {
        /// The transform the key is for.
        algorithm: Algorithm,
        /// Bytes it takes (salt included).
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The integrity key has the wrong length for the algorithm.
    #[error("{algorithm} needs a {expected}-byte integrity key, got {got} bytes")]
    AuthKeyLength {
        /// The transform the key is for.
        algorithm: Algorithm,
        /// Bytes it takes.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// A 3DES key whose three parts are not independent degenerates to
    /// single DES (RFC 2451 §2.3 asks implementations to reject it).
    #[error("3des-sha1 key has repeated 8-byte parts, which weakens 3DES towards single DES; use three different parts")]
    DegenerateTripleDesKey,
    /// The crypto library refused the key.
    #[error("the crypto library rejected the {algorithm} key")]
    Rejected {
        /// The transform the key is for.
        algorithm: Algorithm,
    },
}

/// What an engine is asked to register for one SA: the algorithm, whether
/// the SA uses extended sequence numbers (some engines pick their template
/// by it), and the raw keys, in key memory, wiped when the spec is dropped.
#[derive(Clone)]
pub struct SessionSpec {
    /// The SA's transform.
    pub algorithm: Algorithm,
    /// Whether the SA uses extended (64-bit) sequence numbers.
    pub esn: bool,
    /// The encryption key material (with the salt for GCM and ChaCha20-Poly1305).
    pub enc_key: SecretBytes,
    /// The HMAC key; empty for AEADs and `null`.
    pub auth_key: SecretBytes,
}

impl fmt::Debug for SessionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionSpec")
            .field("algorithm", &self.algorithm)
            .field("esn", &self.esn)
            .field("keys", &"<redacted>")
            .finish()
    }
}

impl SessionSpec {
    /// Copies the keys into key memory; the caller's copies stay the
    /// caller's to zeroize. Lengths are checked here, so every engine sees
    /// the same errors.
    pub fn new(
        algorithm: Algorithm,
        esn: bool,
        enc_key: &[u8],
        auth_key: &[u8],
    ) -> Result<Self, SessionError> {
        check_key_lengths(algorithm, enc_key, auth_key)?;
        Ok(SessionSpec {
            algorithm,
            esn,
            enc_key: SecretBytes::new(enc_key),
            auth_key: SecretBytes::new(auth_key),
        })
    }
}

fn check_key_lengths(algorithm: Algorithm, enc_key: &[u8], auth_key: &[u8]) -> Result<(), SessionError> {
    if enc_key.len() != algorithm.enc_key_len() {
        return Err(SessionError::EncKeyLength {
            algorithm,
            expected: algorithm.enc_key_len(),
            got: enc_key.len(),
        });
    }
    if auth_key.len() != algorithm.auth_key_len() {
        return Err(SessionError::AuthKeyLength {
            algorithm,
            expected: algorithm.auth_key_len(),
            got: auth_key.len(),
        });
    }
    Ok(())
}

/// An engine's name for a registered session: a slot and the generation it
/// was registered in, so that a handle kept after `release` (or forged) is
/// refused rather than reaching another SA's keys. Meaningful only to the
/// engine that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionHandle {
    /// The slot in the issuing engine's table.
    pub index: u32,
    /// The slot's generation when issued: a handle from before a release names an older one and is refused.
    pub generation: u32,
}

impl SessionHandle {
    /// A handle no table ever issues (generation 0 is never used).
    pub const INVALID: SessionHandle = SessionHandle {
        index: u32::MAX,
        generation: 0,
    };
}

/// Registered sessions of one engine, in slots reused after release.
/// Lookups are an index and a generation compare: nothing per packet
/// hashes, locks or counts references.
#[derive(Debug)]
pub struct SessionTable<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

impl<T> Default for SessionTable<T> {
    fn default() -> Self {
        SessionTable {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> SessionTable<T> {
    /// Stores `value` and returns its handle: a free slot with its generation bumped (never 0), or a new one.
    pub fn insert(&mut self, value: T) -> SessionHandle {
        self.live += 1;
        match self.free.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = slot.generation.wrapping_add(1).max(1);
                slot.value = Some(value);
                SessionHandle {
                    index,
                    generation: slot.generation,
                }
            }
            None => {
                let index = self.slots.len() as u32;
                self.slots.push(Slot {
                    generation: 1,
                    value: Some(value),
                });
                SessionHandle { index, generation: 1 }
            }
        }
    }

    /// Starts loading `handle`'s slot into the cache (a hint: a stale or
    /// foreign handle loads nothing harmful).
    #[inline]
    pub fn prefetch(&self, handle: SessionHandle) {
        if let Some(slot) = self.slots.get(handle.index as usize) {
            crate::prefetch::bytes(slot);
        }
    }

    /// The session `handle` names, unless it was released (its generation moved on) or never issued.
    #[inline]
    pub fn get(&self, handle: SessionHandle) -> Option<&T> {
        let slot = self.slots.get(handle.index as usize)?;
        (slot.generation == handle.generation).then_some(slot.value.as_ref()?)
    }

    /// As [`get`](Self::get), writable.
    #[inline]
    pub fn get_mut(&mut self, handle: SessionHandle) -> Option<&mut T> {
        let slot = self.slots.get_mut(handle.index as usize)?;
        if slot.generation != handle.generation {
            return None;
        }
        slot.value.as_mut()
    }

    /// Takes the session out; the handle is refused from now on. The value
    /// is returned so the engine can wipe or close it.
    pub fn remove(&mut self, handle: SessionHandle) -> Option<T> {
        let slot = self.slots.get_mut(handle.index as usize)?;
        if slot.generation != handle.generation {
            return None;
        }
        let value = slot.value.take()?;
        self.free.push(handle.index);
        self.live -= 1;
        Some(value)
    }

    /// Sessions registered and not released.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Every live session (shutdown, reclaim).
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.free.clear();
        self.live = 0;
        let n = self.slots.len() as u32;
        self.free.extend((0..n).rev());
        self.slots.iter_mut().filter_map(|s| {
            s.generation = s.generation.wrapping_add(1).max(1);
            s.value.take()
        })
    }
}

pub(crate) enum CipherState {
    /// AES-GCM or ChaCha20-Poly1305: the same ESP layout (RFC 4106, RFC
    /// 7634): nonce = salt ‖ explicit IV, the same AAD.
    Aead(Wiped<AeadKey>),
    /// AES-CBC or 3DES-CBC; AWS-LC keys are one-directional.
    Cbc(Wiped<CbcKeys>),
    Null,
}

/// An AEAD key with its salt, in one slot of key memory.
pub(crate) struct AeadKey {
    pub(crate) key: ring::aead::LessSafeKey,
    pub(crate) salt: [u8; 4],
}

/// Both directions' CBC schedules, in one slot of key memory.
pub(crate) struct CbcKeys {
    pub(crate) encrypt: EncryptingKey,
    pub(crate) decrypt: DecryptingKey,
}

pub(crate) enum MacState {
    HmacSha1(Wiped<Hmac<sha1::Sha1>>),
    HmacSha256(Wiped<Hmac<sha2::Sha256>>),
    None,
}

/// An SA's expanded keys, as the CPU engines (`soft`, `sec`) keep them.
/// The raw keys are not kept: they were the spec's, and are wiped with it.
/// The struct itself holds only pointers into key memory, so moving it
/// copies no key.
pub struct Session {
    algorithm: Algorithm,
    pub(crate) cipher: CipherState,
    pub(crate) mac: MacState,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("algorithm", &self.algorithm)
            .field("keys", &"<redacted>")
            .finish()
    }
}

impl Session {
    /// Starts loading the key schedules a job of this session reads (the
    /// expanded keys live in key memory, a second miss after the session's
    /// slot). `encrypt` picks the CBC key of that direction.
    #[inline]
    pub(crate) fn prefetch_keys(&self, encrypt: bool) {
        match &self.cipher {
            CipherState::Aead(key) => crate::prefetch::bytes::<AeadKey>(key),
            CipherState::Cbc(keys) => {
                if encrypt {
                    crate::prefetch::bytes::<EncryptingKey>(&keys.encrypt);
                } else {
                    crate::prefetch::bytes::<DecryptingKey>(&keys.decrypt);
                }
            }
            CipherState::Null => {}
        }
        match &self.mac {
            MacState::HmacSha1(mac) => crate::prefetch::bytes::<Hmac<sha1::Sha1>>(mac),
            MacState::HmacSha256(mac) => crate::prefetch::bytes::<Hmac<sha2::Sha256>>(mac),
            MacState::None => {}
        }
    }

    /// Expands `enc_key` and `auth_key` for `algorithm`. The caller's copies
    /// remain the caller's to zeroize; the copies the crypto crates leave
    /// on the stack while expanding are scrubbed before this returns.
    pub fn new(algorithm: Algorithm, enc_key: &[u8], auth_key: &[u8]) -> Result<Self, SessionError> {
        let session = Self::expand(algorithm, enc_key, auth_key);
        // `expand` ran in frames below this one: wipe them.
        crate::wiped::scrub_stack();
        session
    }

    /// The expansion itself, never inlined so that its frames (and those of
    /// the crates it calls) lie below [`Session::new`]'s.
    #[inline(never)]
    fn expand(algorithm: Algorithm, enc_key: &[u8], auth_key: &[u8]) -> Result<Self, SessionError> {
        check_key_lengths(algorithm, enc_key, auth_key)?;
        let rejected = SessionError::Rejected { algorithm };
        let cipher = match algorithm.cipher() {
            CipherKind::AesGcm | CipherKind::ChaCha20Poly1305 => {
                let (key, salt) = enc_key.split_at(enc_key.len() - 4);
                // ring for both: the fastest here (accel/benches/crypto_libs.rs).
                let aead = match (algorithm.cipher(), key.len()) {
                    (CipherKind::ChaCha20Poly1305, _) => &ring::aead::CHACHA20_POLY1305,
                    (_, 16) => &ring::aead::AES_128_GCM,
                    _ => &ring::aead::AES_256_GCM,
                };
                CipherState::Aead(Wiped::try_new_with(|| {
                    let key = ring::aead::UnboundKey::new(aead, key).map_err(|_| rejected.clone())?;
                    let mut salt_bytes = [0u8; 4];
                    salt_bytes.copy_from_slice(salt);
                    Ok(AeadKey {
                        key: ring::aead::LessSafeKey::new(key),
                        salt: salt_bytes,
                    })
                })?)
            }
            CipherKind::AesCbc | CipherKind::TripleDesCbc => {
                let cipher = match (algorithm.cipher(), enc_key.len()) {
                    (CipherKind::AesCbc, 16) => &aws_lc_rs::cipher::AES_128,
                    (CipherKind::AesCbc, _) => &aws_lc_rs::cipher::AES_256,
                    _ => {
                        // RFC 2451 §2.3 / NIST SP 800-67: the three DES keys must
                        // differ, or 3DES degenerates towards single DES.
                        let (k1, rest) = enc_key.split_at(8);
                        let (k2, k3) = rest.split_at(8);
                        if k1 == k2 || k2 == k3 || k1 == k3 {
                            return Err(SessionError::DegenerateTripleDesKey);
                        }
                        #[allow(deprecated)]
                        &aws_lc_rs::cipher::DES_EDE3_FOR_LEGACY_USE_ONLY
                    }
                };
                // `UnboundCipherKey` copies the key into a vector it wipes
                // when dropped (aws-lc-rs's `Buffer`).
                CipherState::Cbc(Wiped::try_new_with(|| {
                    Ok(CbcKeys {
                        encrypt: EncryptingKey::cbc(
                            UnboundCipherKey::new(cipher, enc_key).map_err(|_| rejected.clone())?,
                        )
                        .map_err(|_| rejected.clone())?,
                        decrypt: DecryptingKey::cbc(
                            UnboundCipherKey::new(cipher, enc_key).map_err(|_| rejected.clone())?,
                        )
                        .map_err(|_| rejected.clone())?,
                    })
                })?)
            }
            CipherKind::Null => CipherState::Null,
        };
        let mac = match algorithm.integrity() {
            IntegrityKind::HmacSha1_96 => MacState::HmacSha1(Wiped::try_new_with(|| {
                Hmac::<sha1::Sha1>::new_from_slice(auth_key).map_err(|_| rejected.clone())
            })?),
            IntegrityKind::HmacSha256_128 => MacState::HmacSha256(Wiped::try_new_with(|| {
                Hmac::<sha2::Sha256>::new_from_slice(auth_key).map_err(|_| rejected.clone())
            })?),
            IntegrityKind::Aead | IntegrityKind::None => MacState::None,
        };
        Ok(Session {
            algorithm,
            cipher,
            mac,
        })
    }

    /// Expands the keys of `spec`.
    pub fn from_spec(spec: &SessionSpec) -> Result<Self, SessionError> {
        Session::new(spec.algorithm, &spec.enc_key, &spec.auth_key)
    }

    /// The transform the keys were expanded for.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_handle_is_refused_even_when_its_slot_is_reused() {
        let mut table = SessionTable::default();
        let a = table.insert("a");
        let b = table.insert("b");
        assert_eq!(table.get(a), Some(&"a"));
        assert_eq!(table.remove(a), Some("a"));
        assert_eq!(table.get(a), None);
        assert_eq!(table.remove(a), None);
        let c = table.insert("c");
        assert_eq!(c.index, a.index, "the slot is reused");
        assert_eq!(table.get(a), None, "the old generation is refused");
        assert_eq!(table.get(c), Some(&"c"));
        assert_eq!(table.get(b), Some(&"b"));
        assert_eq!(table.get(SessionHandle::INVALID), None);
        assert_eq!(table.len(), 2);
        let drained: Vec<_> = table.drain().collect();
        assert_eq!(drained.len(), 2);
        assert!(table.is_empty());
        assert_eq!(table.get(b), None);
    }

    /// The stack `Session::new` scrubs must cover what building a session
    /// uses: the region below a frame is painted, a session is built there
    /// without the scrub, and the deepest byte it changed must lie well
    /// within the scrubbed span (a new crate version that goes deeper
    /// fails here, not silently in a memory scan).
    #[test]
    fn the_scrubbed_stack_covers_every_sessions_construction() {
        use std::os::unix::fs::FileExt;
        const SPAN: usize = 256 * 1024;

        #[inline(never)]
        fn paint() {
            let mut area = [0xa5u8; SPAN];
            std::hint::black_box(&mut area);
        }

        #[inline(never)]
        fn depth(alg: Algorithm, mem: &std::fs::File, seen: &mut [u8]) -> usize {
            let here = 0u8;
            let top = std::ptr::addr_of!(here) as usize;
            let (enc, auth) = (vec![0x11; alg.enc_key_len()], vec![0x22; alg.auth_key_len()]);
            paint();
            let session = std::hint::black_box(Session::expand(alg, &enc, &auth));
            mem.read_at(seen, (top - SPAN) as u64)
                .expect("read our own stack");
            drop(session);
            SPAN - seen.iter().position(|&b| b != 0xa5).unwrap_or(SPAN)
        }

        let mem = std::fs::File::open("/proc/self/mem").expect("/proc/self/mem");
        let mut seen = vec![0u8; SPAN];
        for alg in Algorithm::ALL {
            let used = depth(alg, &mem, &mut seen);
            assert!(
                used * 2 <= crate::wiped::SCRUB_BYTES,
                "{alg}: building a session used {used} bytes of stack; scrub_stack covers {}",
                crate::wiped::SCRUB_BYTES
            );
        }
    }

    #[test]
    fn spec_checks_key_lengths_and_redacts() {
        let err = SessionSpec::new(Algorithm::Aes128Gcm16, false, &[0; 16], &[]).unwrap_err();
        assert!(matches!(
            err,
            SessionError::EncKeyLength {
                expected: 20,
                got: 16,
                ..
            }
        ));
        let spec = SessionSpec::new(Algorithm::Aes128Sha1, true, &[7; 16], &[9; 20]).expect("valid");
        let shown = format!("{spec:?}");
        assert!(shown.contains("redacted") && !shown.contains('7'), "{shown}");
    }
}
