//! Key derivation: HMAC-SHA-256 as the PRF (RFC 4868 §2) and IKEv2's
//! `prf+` (RFC 7296 §2.13), and the keys of a tunnel derived from its
//! pre-shared secret.
//!
//! There is no Diffie-Hellman exchange here, so there is no perfect
//! forward secrecy: whoever learns a tunnel's secret and records its
//! control messages can derive every key it ever used.

use std::net::Ipv4Addr;

use accel::Algorithm;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

/// Output length of the PRF.
pub const PRF_LEN: usize = 32;
/// Length of the nonces each side contributes to a rekey.
pub const NONCE_LEN: usize = 32;

/// `prf(key, data)`: HMAC-SHA-256.
pub fn prf(key: &[u8], data: &[&[u8]]) -> Zeroizing<[u8; PRF_LEN]> {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    for part in data {
        mac.update(part);
    }
    Zeroizing::new(mac.finalize().into_bytes().into())
}

/// `prf+(key, seed)` truncated to `len` bytes (RFC 7296 §2.13):
/// T1 = prf(K, S | 0x01), Tn = prf(K, Tn-1 | S | n).
///
/// # Panics
/// If `len` is more than 255 PRF outputs, which the RFC forbids and no
/// caller here asks for.
pub fn prf_plus(key: &[u8], seed: &[&[u8]], len: usize) -> Zeroizing<Vec<u8>> {
    assert!(len <= 255 * PRF_LEN, "prf+ gives at most 255 blocks");
    let mut out = Zeroizing::new(Vec::with_capacity(len + PRF_LEN));
    let mut previous: Zeroizing<[u8; PRF_LEN]> = Zeroizing::new([0; PRF_LEN]);
    let mut counter = 1u8;
    while out.len() < len {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(seed.len() + 2);
        if counter > 1 {
            parts.push(&previous[..]);
        }
        parts.extend_from_slice(seed);
        let count = [counter];
        parts.push(&count);
        previous = prf(key, &parts);
        out.extend_from_slice(&previous[..]);
        counter = counter.wrapping_add(1);
    }
    out.truncate(len);
    out
}

/// The keys one SA needs.
pub struct SaKeys {
    pub enc: Zeroizing<Vec<u8>>,
    pub auth: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for SaKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SaKeys(<redacted>)")
    }
}

/// The keys of both directions of a tunnel, named by who sends with them.
#[derive(Debug)]
pub struct KeyPair {
    /// Keys of the SA from the first party (the initiator, or the lower
    /// address for the first generation) to the second.
    pub first_to_second: SaKeys,
    pub second_to_first: SaKeys,
}

/// A tunnel's long-lived secrets, from its pre-shared secret and name:
/// `SK_d` for keying material and `SK_a` for authenticating control
/// messages, as IKEv2 derives them from SKEYSEED (RFC 7296 §2.14).
pub struct TunnelSecrets {
    pub sk_d: Zeroizing<Vec<u8>>,
    pub sk_a: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for TunnelSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunnelSecrets(<redacted>)")
    }
}

impl TunnelSecrets {
    pub fn derive(secret: &[u8], tunnel: &str) -> TunnelSecrets {
        let both = prf_plus(
            secret,
            &[b"espgw tunnel keys v1\0", tunnel.as_bytes()],
            2 * PRF_LEN,
        );
        TunnelSecrets {
            sk_d: Zeroizing::new(both[..PRF_LEN].to_vec()),
            sk_a: Zeroizing::new(both[PRF_LEN..].to_vec()),
        }
    }

    /// Splits `KEYMAT = prf+(SK_d, seed)` into the keys of both directions
    /// in RFC 7296 §2.17 order: first-to-second encryption then integrity,
    /// then second-to-first.
    pub fn keymat(&self, algorithm: Algorithm, seed: &[&[u8]]) -> KeyPair {
        let (enc, auth) = (algorithm.enc_key_len(), algorithm.auth_key_len());
        let keymat = prf_plus(&self.sk_d, seed, 2 * (enc + auth));
        let take = |from: usize, len: usize| Zeroizing::new(keymat[from..from + len].to_vec());
        KeyPair {
            first_to_second: SaKeys {
                enc: take(0, enc),
                auth: take(enc, auth),
            },
            second_to_first: SaKeys {
                enc: take(enc + auth, enc),
                auth: take(2 * enc + auth, auth),
            },
        }
    }

    /// Keys of a rekey: `KEYMAT = prf+(SK_d, Ni | Nr)`; the first party is
    /// the initiator.
    pub fn rekey(&self, algorithm: Algorithm, ni: &[u8; NONCE_LEN], nr: &[u8; NONCE_LEN]) -> KeyPair {
        self.keymat(algorithm, &[ni, nr])
    }

    /// Keys of the first generation, which both ends derive alone: the
    /// first party is the lower address, and the SPIs of both directions
    /// (as seen from `local`) go into the seed.
    pub fn initial(
        &self,
        algorithm: Algorithm,
        (local, remote): (Ipv4Addr, Ipv4Addr),
        (spi_out, spi_in): (u32, u32),
    ) -> (SaKeys, SaKeys) {
        let we_are_first = u32::from(local) < u32::from(remote);
        let (low, high, spi_up, spi_down) = if we_are_first {
            (local, remote, spi_out, spi_in)
        } else {
            (remote, local, spi_in, spi_out)
        };
        let pair = self.keymat(
            algorithm,
            &[
                b"initial",
                &low.octets(),
                &high.octets(),
                &spi_up.to_be_bytes(),
                &spi_down.to_be_bytes(),
            ],
        );
        if we_are_first {
            (pair.first_to_second, pair.second_to_first)
        } else {
            (pair.second_to_first, pair.first_to_second)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prf_is_hmac_sha256_rfc4231_case_1() {
        let out = prf(&[0x0b; 20], &[b"Hi There"]);
        assert_eq!(
            hex::encode(&out[..]),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // Split input is the same as whole input.
        assert_eq!(prf(&[0x0b; 20], &[b"Hi ", b"There"])[..], out[..]);
    }

    /// Computed independently with Python's hmac module:
    /// prf+(bytes(range(32)), b"Ni-nonceNr-nonce", 80).
    #[test]
    fn prf_plus_matches_an_independent_implementation() {
        let key: Vec<u8> = (0..32).collect();
        let out = prf_plus(&key, &[b"Ni-nonce", b"Nr-nonce"], 80);
        assert_eq!(
            hex::encode(&out[..]),
            "f58d3fc912f6601537fab1bda0c13ab31677e409e5ee2650f96f9f46197ddd99\
             bd5341c9254ee126e8de8cc6a87834294c411e3c85ee51bc817b1f38d024b5b1\
             3fbdf387a3dcda45221e86cb2339c473"
        );
        assert_eq!(prf_plus(&key, &[b"Ni-nonceNr-nonce"], 7)[..], out[..7]);
    }

    #[test]
    fn both_ends_derive_matching_first_generation_keys() {
        let secrets = TunnelSecrets::derive(b"correct horse battery staple", "t");
        let a: Ipv4Addr = "10.0.0.1".parse().unwrap();
        let b: Ipv4Addr = "10.0.0.2".parse().unwrap();
        let alg = Algorithm::Aes128Sha1;
        let (a_out, a_in) = secrets.initial(alg, (a, b), (0x1001, 0x1002));
        let (b_out, b_in) = secrets.initial(alg, (b, a), (0x1002, 0x1001));
        assert_eq!(a_out.enc[..], b_in.enc[..]);
        assert_eq!(a_out.auth[..], b_in.auth[..]);
        assert_eq!(a_in.enc[..], b_out.enc[..]);
        assert_ne!(a_out.enc[..], a_in.enc[..]);
        assert_eq!((a_out.enc.len(), a_out.auth.len()), (16, 20));
        // Another tunnel name or secret gives other keys.
        let other = TunnelSecrets::derive(b"correct horse battery staple", "u");
        assert_ne!(
            other.initial(alg, (a, b), (0x1001, 0x1002)).0.enc[..],
            a_out.enc[..]
        );
        assert_ne!(secrets.sk_a[..], secrets.sk_d[..]);
    }

    #[test]
    fn rekey_keys_depend_on_both_nonces() {
        let secrets = TunnelSecrets::derive(b"0123456789abcdef", "t");
        let alg = Algorithm::Aes128Gcm16;
        let one = secrets.rekey(alg, &[1; NONCE_LEN], &[2; NONCE_LEN]);
        let two = secrets.rekey(alg, &[1; NONCE_LEN], &[3; NONCE_LEN]);
        assert_eq!(one.first_to_second.enc.len(), 20);
        assert!(one.first_to_second.auth.is_empty());
        assert_ne!(one.first_to_second.enc[..], two.first_to_second.enc[..]);
        assert_ne!(one.first_to_second.enc[..], one.second_to_first.enc[..]);
    }
}
