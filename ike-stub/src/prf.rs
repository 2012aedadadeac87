//! Key derivation: HMAC-SHA-256 as the PRF (RFC 4868 §2) and IKEv2's
//! `prf+` (RFC 7296 §2.13); a tunnel's keys from its pre-shared secret and
//! the nonces both ends contribute to each exchange.
//!
//! Every ESP key comes from nonces both ends chose fresh for the exchange
//! that made it, so no key is ever used again after a restart. There is no
//! Diffie-Hellman exchange, though, so there is no perfect forward
//! secrecy: whoever learns a tunnel's secret and records its control
//! messages can derive every key it ever used.

use std::net::Ipv4Addr;

use accel::Algorithm;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

/// Output length of the PRF.
pub const PRF_LEN: usize = 32;
/// Length of the nonces each side contributes to an exchange.
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
    /// The encryption key, as long as the algorithm's (salt included).
    pub enc: Zeroizing<Vec<u8>>,
    /// The integrity key; empty for an AEAD.
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
    /// Keys of the SA from the first party (the exchange's initiator) to
    /// the second.
    pub first_to_second: SaKeys,
    /// Keys of the SA the other way, from the responder.
    pub second_to_first: SaKeys,
}

/// Which end of a tunnel: the one with the lower or the higher address
/// (their 32-bit values). Both ends agree on it without a message, and it
/// tells the two directions of an INIT request apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The end whose address is the lower.
    Low,
    /// The end whose address is the higher (or equal).
    High,
}

impl Side {
    /// This end's side, from its configured addresses.
    pub fn of(local: Ipv4Addr, remote: Ipv4Addr) -> Side {
        if u32::from(local) < u32::from(remote) {
            Side::Low
        } else {
            Side::High
        }
    }

    /// The peer's side.
    pub fn other(self) -> Side {
        match self {
            Side::Low => Side::High,
            Side::High => Side::Low,
        }
    }

    fn label(self) -> &'static [u8] {
        match self {
            Side::Low => b"low",
            Side::High => b"high",
        }
    }
}

/// A tunnel's long-lived secret, from its pre-shared secret and name. It
/// authenticates INIT requests (one key per sending side, so that a request
/// sent back to its sender does not verify) and seeds every control SA's
/// keys together with both ends' fresh nonces. No key it gives is used for
/// ESP: child SAs are keyed from a control SA, which every start makes anew.
pub struct TunnelSecrets {
    psk: Zeroizing<[u8; PRF_LEN]>,
}

impl std::fmt::Debug for TunnelSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TunnelSecrets(<redacted>)")
    }
}

impl TunnelSecrets {
    /// The secrets of tunnel `tunnel` with pre-shared secret `secret`:
    /// another name gives other keys from the same secret.
    pub fn derive(secret: &[u8], tunnel: &str) -> TunnelSecrets {
        TunnelSecrets {
            psk: prf(secret, &[b"espgw tunnel key v2\0", tunnel.as_bytes()]),
        }
    }

    /// The key that authenticates INIT requests sent by the end on `sender`.
    pub fn init_key(&self, sender: Side) -> Zeroizing<[u8; PRF_LEN]> {
        prf(&self.psk[..], &[b"init request ", sender.label()])
    }

    /// The keys of a control SA, from both ends' nonces and SPIs as IKEv2
    /// derives them (RFC 7296 §2.14): `SKEYSEED = prf(K, Ni | Nr)` and
    /// `SK_d | SK_ai | SK_ar = prf+(SKEYSEED, Ni | Nr | SPIi | SPIr)`,
    /// with the secret-derived key in place of the Diffie-Hellman secret's
    /// role (so there is no forward secrecy: see the module doc).
    pub fn control(
        &self,
        (ni, nr): (&[u8; NONCE_LEN], &[u8; NONCE_LEN]),
        (spi_i, spi_r): (&[u8; 8], &[u8; 8]),
    ) -> ControlKeys {
        let seed = prf(&self.psk[..], &[b"control sa ", ni, nr]);
        let all = prf_plus(&seed[..], &[ni, nr, spi_i, spi_r], 3 * PRF_LEN);
        let take = |at: usize| {
            let mut key = Zeroizing::new([0; PRF_LEN]);
            key.copy_from_slice(&all[at * PRF_LEN..(at + 1) * PRF_LEN]);
            key
        };
        ControlKeys {
            sk_d: take(0),
            sk_ai: take(1),
            sk_ar: take(2),
        }
    }
}

/// A control SA's keys: `SK_d` for child SAs' keying material, `SK_ai` and
/// `SK_ar` to authenticate the messages the initiator and the responder
/// send (RFC 7296 §2.14), so that a message reflected back to its sender
/// does not verify.
pub struct ControlKeys {
    sk_d: Zeroizing<[u8; PRF_LEN]>,
    /// Authenticates the messages the control SA's initiator sends.
    pub sk_ai: Zeroizing<[u8; PRF_LEN]>,
    /// Authenticates the messages its responder sends.
    pub sk_ar: Zeroizing<[u8; PRF_LEN]>,
}

impl std::fmt::Debug for ControlKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlKeys(<redacted>)")
    }
}

impl ControlKeys {
    /// The keys of a child SA pair: `KEYMAT = prf+(SK_d, Ni | Nr)` from the
    /// nonces of the exchange that creates it, split in RFC 7296 §2.17
    /// order: initiator-to-responder encryption then integrity, then
    /// responder-to-initiator. The first party is the exchange's initiator.
    pub fn child(&self, algorithm: Algorithm, ni: &[u8; NONCE_LEN], nr: &[u8; NONCE_LEN]) -> KeyPair {
        let (enc, auth) = (algorithm.enc_key_len(), algorithm.auth_key_len());
        let keymat = prf_plus(&self.sk_d[..], &[ni, nr], 2 * (enc + auth));
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
    fn init_keys_differ_by_side_and_control_keys_by_every_input() {
        let secrets = TunnelSecrets::derive(b"correct horse battery staple", "t");
        assert_ne!(secrets.init_key(Side::Low)[..], secrets.init_key(Side::High)[..]);
        let other = TunnelSecrets::derive(b"correct horse battery staple", "u");
        assert_ne!(secrets.init_key(Side::Low)[..], other.init_key(Side::Low)[..]);
        let (ni, nr) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let (spi_i, spi_r) = ([3; 8], [4; 8]);
        let keys = secrets.control((&ni, &nr), (&spi_i, &spi_r));
        assert_ne!(keys.sk_ai[..], keys.sk_ar[..]);
        assert_ne!(keys.sk_ai[..], keys.sk_d[..]);
        for changed in [
            secrets.control((&nr, &nr), (&spi_i, &spi_r)),
            secrets.control((&ni, &ni), (&spi_i, &spi_r)),
            secrets.control((&ni, &nr), (&spi_r, &spi_r)),
            secrets.control((&ni, &nr), (&spi_i, &spi_i)),
            other.control((&ni, &nr), (&spi_i, &spi_r)),
        ] {
            assert_ne!(changed.sk_ai[..], keys.sk_ai[..]);
            assert_ne!(changed.sk_d[..], keys.sk_d[..]);
        }
    }

    #[test]
    fn child_keys_depend_on_both_nonces_and_split_by_direction() {
        let secrets = TunnelSecrets::derive(b"0123456789abcdef", "t");
        let keys = secrets.control((&[7; NONCE_LEN], &[8; NONCE_LEN]), (&[1; 8], &[2; 8]));
        let alg = Algorithm::Aes128Gcm16;
        let one = keys.child(alg, &[1; NONCE_LEN], &[2; NONCE_LEN]);
        let two = keys.child(alg, &[1; NONCE_LEN], &[3; NONCE_LEN]);
        assert_eq!(one.first_to_second.enc.len(), 20);
        assert!(one.first_to_second.auth.is_empty());
        assert_ne!(one.first_to_second.enc[..], two.first_to_second.enc[..]);
        assert_ne!(one.first_to_second.enc[..], one.second_to_first.enc[..]);
        let cbc = keys.child(Algorithm::Aes128Sha1, &[1; NONCE_LEN], &[2; NONCE_LEN]);
        assert_eq!(
            (cbc.first_to_second.enc.len(), cbc.first_to_second.auth.len()),
            (16, 20)
        );
    }
}
