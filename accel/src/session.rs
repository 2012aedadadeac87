//! Sessions: an SA's algorithm and expanded keys, registered once with an
//! engine and used for every packet of that SA.
//!
//! Key material lives only here, and never appears in `Debug`. Each
//! primitive comes from the crate that measured fastest here (the
//! `crypto_libs` bench): AES-GCM from `ring`, AES-CBC and 3DES from
//! `aws-lc-rs`, HMAC from RustCrypto. AWS-LC keeps its keys in its own
//! allocations and cleanses them when they are freed (`OPENSSL_free` zeroes
//! before it frees); `ring` keys and the keyed HMAC state (built with its
//! `zeroize` feature) are held in boxes that are wiped on drop.

use std::fmt;

use aws_lc_rs::cipher::{DecryptingKey, EncryptingKey, UnboundCipherKey};
use hmac::{Hmac, KeyInit};
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
    #[error("3des-sha1 key has repeated 8-byte parts, which weakens 3DES towards single DES; use three different parts")]
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
    /// AES-CBC or 3DES-CBC; AWS-LC keys are one-directional.
    Cbc {
        encrypt: Box<EncryptingKey>,
        decrypt: Box<DecryptingKey>,
    },
    Null,
}

pub(crate) enum MacState {
    HmacSha1(Wiped<Hmac<sha1::Sha1>>),
    HmacSha256(Wiped<Hmac<sha2::Sha256>>),
    None,
}

/// An SA's crypto context: algorithm plus expanded keys.
pub struct Session {
    id: SessionId,
    algorithm: Algorithm,
    /// The raw keys, for engines that are given keys rather than schedules
    /// (the kernel crypto API, a hardware descriptor's key pointer).
    pub(crate) raw_enc_key: Zeroizing<Vec<u8>>,
    pub(crate) raw_auth_key: Zeroizing<Vec<u8>>,
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
                let aead = if key.len() == 16 {
                    &ring::aead::AES_128_GCM
                } else {
                    &ring::aead::AES_256_GCM
                };
                let unbound = ring::aead::UnboundKey::new(aead, key)
                    .map_err(|_| SessionError::Rejected { algorithm })?;
                let mut salt_bytes = Zeroizing::new([0u8; 4]);
                salt_bytes.copy_from_slice(salt);
                CipherState::AesGcm {
                    key: Wiped::new(ring::aead::LessSafeKey::new(unbound)),
                    salt: salt_bytes,
                }
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
                CipherState::Cbc {
                    encrypt: Box::new(
                        EncryptingKey::cbc(
                            UnboundCipherKey::new(cipher, enc_key)
                                .map_err(|_| SessionError::Rejected { algorithm })?,
                        )
                        .map_err(|_| SessionError::Rejected { algorithm })?,
                    ),
                    decrypt: Box::new(
                        DecryptingKey::cbc(
                            UnboundCipherKey::new(cipher, enc_key)
                                .map_err(|_| SessionError::Rejected { algorithm })?,
                        )
                        .map_err(|_| SessionError::Rejected { algorithm })?,
                    ),
                }
            }
            CipherKind::Null => CipherState::Null,
        };
        let mac = match algorithm.integrity() {
            IntegrityKind::HmacSha1_96 => MacState::HmacSha1(Wiped::new(
                Hmac::<sha1::Sha1>::new_from_slice(auth_key)
                    .map_err(|_| SessionError::Rejected { algorithm })?,
            )),
            IntegrityKind::HmacSha256_128 => MacState::HmacSha256(Wiped::new(
                Hmac::<sha2::Sha256>::new_from_slice(auth_key)
                    .map_err(|_| SessionError::Rejected { algorithm })?,
            )),
            IntegrityKind::Aead | IntegrityKind::None => MacState::None,
        };
        Ok(Session {
            id: next_session_id(),
            algorithm,
            raw_enc_key: Zeroizing::new(enc_key.to_vec()),
            raw_auth_key: Zeroizing::new(auth_key.to_vec()),
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
