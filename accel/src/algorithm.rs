//! ESP transforms by strongSwan proposal keyword, with the wire parameters
//! (key, IV, ICV and block sizes) that the dataplane lays packets out by.

/// An ESP transform: one cipher and one integrity algorithm, or one AEAD.
///
/// The keyword beside each variant is the only place it is written: the
/// list, `FromStr`, `Display` and the error's suggestions derive from it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::VariantArray,
    strum::VariantNames,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
#[strum(parse_err_ty = UnknownAlgorithm, parse_err_fn = UnknownAlgorithm::new)]
pub enum Algorithm {
    /// AES-GCM-128 with a 16-byte ICV (RFC 4106).
    #[strum(serialize = "aes128gcm16")]
    Aes128Gcm16,
    /// AES-GCM-256 with a 16-byte ICV (RFC 4106).
    #[strum(serialize = "aes256gcm16")]
    Aes256Gcm16,
    /// ChaCha20-Poly1305 (RFC 7634): 256-bit key, 4-byte salt, 16-byte ICV.
    #[strum(serialize = "chacha20poly1305")]
    ChaCha20Poly1305,
    /// AES-CBC-128 (RFC 3602) with HMAC-SHA1-96 (RFC 2404).
    #[strum(serialize = "aes128-sha1")]
    Aes128Sha1,
    /// AES-CBC-256 (RFC 3602) with HMAC-SHA-256-128 (RFC 4868).
    #[strum(serialize = "aes256-sha256")]
    Aes256Sha256,
    /// 3DES-EDE-CBC (RFC 2451) with HMAC-SHA1-96 (RFC 2404).
    #[strum(serialize = "3des-sha1")]
    TripleDesSha1,
    /// ESP-NULL (RFC 2410) with HMAC-SHA1-96: integrity only.
    #[strum(serialize = "null-sha1")]
    NullSha1,
    /// Neither encryption nor integrity. Insecure: the benchmark baseline only.
    #[strum(serialize = "null")]
    Null,
}

/// The confidentiality half of a transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherKind {
    /// AES in Galois/Counter Mode, an AEAD (RFC 4106).
    AesGcm,
    /// ChaCha20 with Poly1305, an AEAD (RFC 7634).
    ChaCha20Poly1305,
    /// AES in CBC mode (RFC 3602), with a separate integrity algorithm.
    AesCbc,
    /// Triple DES (EDE) in CBC mode (RFC 2451), with a separate integrity algorithm.
    TripleDesCbc,
    /// No encryption (RFC 2410): the payload travels in the clear.
    Null,
}

/// The integrity half of a transform (AEADs carry their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegrityKind {
    /// HMAC-SHA1 truncated to a 12-byte ICV (RFC 2404).
    HmacSha1_96,
    /// HMAC-SHA-256 truncated to a 16-byte ICV (RFC 4868).
    HmacSha256_128,
    /// Integrity comes from the AEAD cipher.
    Aead,
    /// No integrity: no ICV at all (the `null` transform only).
    None,
}

/// A proposal keyword that names no transform espgw implements.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown ESP proposal `{keyword}`; expected one of: {}", Algorithm::KEYWORDS.join(", "))]
pub struct UnknownAlgorithm {
    /// The keyword as given.
    pub keyword: String,
}

impl UnknownAlgorithm {
    fn new(keyword: &str) -> UnknownAlgorithm {
        UnknownAlgorithm {
            keyword: keyword.to_owned(),
        }
    }
}

impl Algorithm {
    /// Every transform, in declaration order (the shared engine's wire
    /// codes index it).
    pub const ALL: [Algorithm; <Algorithm as strum::VariantArray>::VARIANTS.len()] =
        crate::variant_array(<Algorithm as strum::VariantArray>::VARIANTS);

    /// The keywords, in the order of [`ALL`](Self::ALL).
    pub const KEYWORDS: &'static [&'static str] = <Algorithm as strum::VariantNames>::VARIANTS;

    /// The strongSwan ESP proposal keyword.
    pub fn keyword(self) -> &'static str {
        self.into()
    }

    /// The cipher this transform encrypts with.
    #[inline]
    pub fn cipher(self) -> CipherKind {
        match self {
            Algorithm::Aes128Gcm16 | Algorithm::Aes256Gcm16 => CipherKind::AesGcm,
            Algorithm::ChaCha20Poly1305 => CipherKind::ChaCha20Poly1305,
            Algorithm::Aes128Sha1 | Algorithm::Aes256Sha256 => CipherKind::AesCbc,
            Algorithm::TripleDesSha1 => CipherKind::TripleDesCbc,
            Algorithm::NullSha1 | Algorithm::Null => CipherKind::Null,
        }
    }

    /// How this transform protects integrity: an HMAC, the AEAD itself, or not at all.
    #[inline]
    pub fn integrity(self) -> IntegrityKind {
        match self {
            Algorithm::Aes128Gcm16 | Algorithm::Aes256Gcm16 | Algorithm::ChaCha20Poly1305 => {
                IntegrityKind::Aead
            }
            Algorithm::Aes128Sha1 | Algorithm::TripleDesSha1 | Algorithm::NullSha1 => {
                IntegrityKind::HmacSha1_96
            }
            Algorithm::Aes256Sha256 => IntegrityKind::HmacSha256_128,
            Algorithm::Null => IntegrityKind::None,
        }
    }

    /// Whether the cipher authenticates too (GCM, ChaCha20-Poly1305): one pass, no separate HMAC key.
    #[inline]
    pub fn is_aead(self) -> bool {
        self.integrity() == IntegrityKind::Aead
    }

    /// True for the transform that must be explicitly allowed: it protects nothing.
    pub fn is_insecure(self) -> bool {
        self == Algorithm::Null
    }

    /// Encryption key length in bytes. For GCM this is RFC 4106 §8.1 KEYMAT:
    /// the AES key followed by the 4-byte salt; for ChaCha20-Poly1305 RFC
    /// 7634 §2: the 256-bit key followed by the 4-byte salt.
    #[inline]
    pub fn enc_key_len(self) -> usize {
        match self {
            Algorithm::Aes128Gcm16 => 16 + 4,
            Algorithm::Aes256Gcm16 | Algorithm::ChaCha20Poly1305 => 32 + 4,
            Algorithm::Aes128Sha1 => 16,
            Algorithm::Aes256Sha256 => 32,
            Algorithm::TripleDesSha1 => 24,
            Algorithm::NullSha1 | Algorithm::Null => 0,
        }
    }

    /// Integrity key length in bytes (RFC 2404 §3: 160 bits; RFC 4868 §2.1.1: 256 bits).
    #[inline]
    pub fn auth_key_len(self) -> usize {
        match self.integrity() {
            IntegrityKind::HmacSha1_96 => 20,
            IntegrityKind::HmacSha256_128 => 32,
            IntegrityKind::Aead | IntegrityKind::None => 0,
        }
    }

    /// Bytes of explicit IV carried in each packet.
    #[inline]
    pub fn iv_len(self) -> usize {
        match self.cipher() {
            CipherKind::AesGcm => 8,           // RFC 4106 §3.1
            CipherKind::ChaCha20Poly1305 => 8, // RFC 7634 §2
            CipherKind::AesCbc => 16,
            CipherKind::TripleDesCbc => 8,
            CipherKind::Null => 0,
        }
    }

    /// Bytes of Integrity Check Value at the end of each packet.
    #[inline]
    pub fn icv_len(self) -> usize {
        match self.integrity() {
            IntegrityKind::Aead => 16,
            IntegrityKind::HmacSha1_96 => 12,
            IntegrityKind::HmacSha256_128 => 16,
            IntegrityKind::None => 0,
        }
    }

    /// What the payload+padding+trailer must be a multiple of: the cipher's
    /// block, and at least 4 so the ICV stays 32-bit aligned (RFC 4303 §2.4).
    #[inline]
    pub fn pad_align(self) -> usize {
        match self.cipher() {
            CipherKind::AesCbc => 16,
            CipherKind::TripleDesCbc => 8,
            CipherKind::AesGcm | CipherKind::ChaCha20Poly1305 | CipherKind::Null => 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dataplane pads and checks alignment with masks.
    #[test]
    fn every_alignment_is_a_power_of_two() {
        for alg in Algorithm::ALL {
            assert!(alg.pad_align().is_power_of_two(), "{alg}");
        }
    }

    #[test]
    fn keywords_round_trip() {
        for (alg, kw) in Algorithm::ALL.iter().zip(Algorithm::KEYWORDS) {
            assert_eq!(alg.keyword(), *kw);
            assert_eq!(alg.to_string(), *kw);
            assert_eq!(kw.parse::<Algorithm>().unwrap(), *alg);
        }
        let err = "aes128".parse::<Algorithm>().unwrap_err();
        assert_eq!(err.keyword, "aes128");
        assert!(err.to_string().contains("aes128gcm16"));
    }

    /// The keywords are config values, CLI values and JSON text, and their
    /// order is the shared engine's wire code: deriving them must not
    /// rename or reorder one. A new transform is added here too.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        assert_eq!(
            Algorithm::KEYWORDS,
            [
                "aes128gcm16",
                "aes256gcm16",
                "chacha20poly1305",
                "aes128-sha1",
                "aes256-sha256",
                "3des-sha1",
                "null-sha1",
                "null",
            ]
        );
        assert_eq!(Algorithm::ALL.len(), Algorithm::KEYWORDS.len());
    }

    #[test]
    fn layout_parameters_follow_the_rfcs() {
        assert_eq!(Algorithm::Aes128Gcm16.enc_key_len(), 20);
        assert_eq!(Algorithm::Aes256Gcm16.icv_len(), 16);
        assert_eq!(Algorithm::Aes128Sha1.icv_len(), 12);
        assert_eq!(Algorithm::Aes256Sha256.auth_key_len(), 32);
        assert_eq!(Algorithm::TripleDesSha1.pad_align(), 8);
        assert_eq!(Algorithm::Null.pad_align(), 4);
        assert!(Algorithm::Null.is_insecure());
    }
}
