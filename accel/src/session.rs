//! Sessions: an SA's algorithm and expanded keys, registered once with an
//! engine and used for every packet of that SA.
//!
//! Key material lives only here. Expanded AES/DES schedules zeroize on drop
//! (RustCrypto's `zeroize` feature); raw key bytes are held in `Zeroizing`
//! buffers; `Debug` prints the algorithm and session id, never keys.

use std::fmt;

use aes::cipher::{array::Array, KeyInit};
use zeroize::Zeroizing;

use crate::algorithm::{Algorithm, CipherKind, IntegrityKind};
use crate::wiped::Wiped;

/// Why a session could not be created from the supplied keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The encryption key has the wrong length for the algorithm.
    #[error("{algorithm} needs a {expected}-byte encryption key{salt_note}, got {got} bytes", salt_note = if algorithm.is_aead() { " (AES key followed by the 4-byte salt)" } else { "" })]
    EncKeyLength {
        algorithm: Algorithm,
        expected: usize,
        got: usize,
    },
    /// The integrity key has the wrong length for the algorithm.
    #[error("{algorithm} needs a {expected}-byte integrity key, got {got} bytes")]
    AuthKeyLength {
        algorithm: Algorithm,
        expected: usize,
        got: usize,
    },
    /// A 3DES key whose three parts are not independent degenerates to
    /// single DES (RFC 2451 §2.3 asks implementations to reject it).
    #[error("3des-sha1 key has repeated 8-byte parts, which reduces 3DES to single DES")]
    DegenerateTripleDesKey,
    /// The crypto library refused the key.
    #[error("the crypto library rejected the {algorithm} key")]
    Rejected { algorithm: Algorithm },
}

/// A process-unique identifier, so that engines and logs can name a session
/// without touching its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

pub(crate) enum CipherState {
    AesGcm {
        key: Wiped<ring::aead::LessSafeKey>,
        salt: Zeroizing<[u8; 4]>,
    },
    Aes128Cbc(Box<aes::Aes128>),
    Aes256Cbc(Box<aes::Aes256>),
    TripleDesCbc(Box<des::TdesEde3>),
    Null,
}

pub(crate) enum MacState {
    Hmac(Wiped<ring::hmac::Key>),
    None,
}

/// An SA's crypto context: algorithm plus expanded keys.
pub struct Session {
    id: SessionId,
    algorithm: Algorithm,
    pub(crate) cipher: CipherState,
    pub(crate) mac: MacState,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("algorithm", &self.algorithm)
            .field("keys", &"<redacted>")
            .finish()
    }
}

fn next_session_id() -> SessionId {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    SessionId(NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Session {
    /// Expands `enc_key` and `auth_key` for `algorithm`. The caller's copies
    /// remain the caller's to zeroize.
    pub fn new(algorithm: Algorithm, enc_key: &[u8], auth_key: &[u8]) -> Result<Self, SessionError> {
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
        let cipher = match algorithm.cipher() {
            CipherKind::AesGcm => {
                let (key, salt) = enc_key.split_at(enc_key.len() - 4);
                let ring_alg = if key.len() == 16 {
                    &ring::aead::AES_128_GCM
                } else {
                    &ring::aead::AES_256_GCM
                };
                let unbound = ring::aead::UnboundKey::new(ring_alg, key)
                    .map_err(|_| SessionError::Rejected { algorithm })?;
                let mut salt_bytes = Zeroizing::new([0u8; 4]);
                salt_bytes.copy_from_slice(salt);
                CipherState::AesGcm {
                    key: Wiped::new(ring::aead::LessSafeKey::new(unbound)),
                    salt: salt_bytes,
                }
            }
            CipherKind::AesCbc if enc_key.len() == 16 => CipherState::Aes128Cbc(Box::new(aes::Aes128::new(
                &Array::try_from(enc_key).map_err(|_| SessionError::Rejected { algorithm })?,
            ))),
            CipherKind::AesCbc => CipherState::Aes256Cbc(Box::new(aes::Aes256::new(
                &Array::try_from(enc_key).map_err(|_| SessionError::Rejected { algorithm })?,
            ))),
            CipherKind::TripleDesCbc => {
                let (k1, rest) = enc_key.split_at(8);
                let (k2, k3) = rest.split_at(8);
                if k1 == k2 || k2 == k3 {
                    return Err(SessionError::DegenerateTripleDesKey);
                }
                CipherState::TripleDesCbc(Box::new(des::TdesEde3::new(
                    &Array::try_from(enc_key).map_err(|_| SessionError::Rejected { algorithm })?,
                )))
            }
            CipherKind::Null => CipherState::Null,
        };
        let mac = match algorithm.integrity() {
            IntegrityKind::HmacSha1_96 => MacState::Hmac(Wiped::new(ring::hmac::Key::new(
                ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
                auth_key,
            ))),
            IntegrityKind::HmacSha256_128 => MacState::Hmac(Wiped::new(ring::hmac::Key::new(
                ring::hmac::HMAC_SHA256,
                auth_key,
            ))),
            IntegrityKind::Aead | IntegrityKind::None => MacState::None,
        };
        Ok(Session {
            id: next_session_id(),
            algorithm,
            cipher,
            mac,
        })
    }

    pub fn id(&self) -> SessionId {
        self.id
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}
