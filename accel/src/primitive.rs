//! The primitive passes every engine that computes on the CPU shares
//! (`soft`, `sec`): cipher, MAC and AEAD over a descriptor's regions, in
//! place. Knows nothing of engines, queues or time.

use aws_lc_rs::cipher::{DecryptionContext, EncryptionContext};
use aws_lc_rs::iv::FixedLength;
use hmac::Mac;

use crate::descriptor::{Descriptor, DescriptorError, DescriptorKind, Direction, Status};
use crate::session::{CipherState, MacState, Session};

/// Runs `desc` over `buf` in the caller's thread and writes its status.
pub fn process(session: &Session, desc: &mut Descriptor, buf: &mut [u8]) {
    desc.status = match run(session, desc, buf) {
        Ok(true) => Status::Done,
        Ok(false) => Status::AuthFailed,
        Err(e) => Status::Error(e),
    };
}

/// Ok(false) means the ICV did not verify.
fn run(session: &Session, desc: &Descriptor, buf: &mut [u8]) -> Result<bool, DescriptorError> {
    desc.validate(buf.len())?;
    if desc.icv.len as usize != session.algorithm().icv_len()
        || desc.iv.len as usize != session.algorithm().iv_len()
    {
        return Err(DescriptorError::BadRegions);
    }
    // Fuzzing builds only: take the ICV as valid and the ciphertext as
    // plaintext (see `fuzzing.rs`).
    #[cfg(fuzzing)]
    if desc.direction == Direction::Decrypt && crate::fuzzing::icv_bypass() {
        return Ok(true);
    }
    // Null/null: nothing to compute or check once the regions are sound.
    if let (CipherState::Null, MacState::None) = (&session.cipher, &session.mac) {
        return Ok(true);
    }
    if let CipherState::Aead(_) = session.cipher {
        return match desc.kind {
            DescriptorKind::SinglePass => aead_pass(session, desc, buf),
            // An AEAD's tag depends on the ciphertext inside the same
            // primitive (GHASH, Poly1305); it cannot be split into two passes.
            DescriptorKind::CipherOnly | DescriptorKind::MacOnly => Err(DescriptorError::Unsupported),
        };
    }
    match (desc.kind, desc.direction) {
        (DescriptorKind::SinglePass, Direction::Encrypt) => {
            cipher_pass(session, desc, buf)?;
            mac_pass(session, desc, buf)
        }
        (DescriptorKind::SinglePass, Direction::Decrypt) => {
            // Verify before decrypting: a forged packet is never decrypted.
            if !mac_pass(session, desc, buf)? {
                return Ok(false);
            }
            cipher_pass(session, desc, buf)?;
            Ok(true)
        }
        (DescriptorKind::CipherOnly, _) => cipher_pass(session, desc, buf).map(|()| true),
        (DescriptorKind::MacOnly, _) => mac_pass(session, desc, buf),
    }
}

fn aead_pass(session: &Session, desc: &Descriptor, buf: &mut [u8]) -> Result<bool, DescriptorError> {
    let CipherState::Aead(aead) = &session.cipher else {
        return Err(DescriptorError::Unsupported);
    };
    let (key, salt) = (&aead.key, &aead.salt);
    // RFC 4106 §4, RFC 7634 §2: nonce = salt ‖ explicit IV.
    let mut nonce = [0u8; 12];
    nonce[..4].copy_from_slice(&salt[..]);
    nonce[4..].copy_from_slice(&buf[desc.iv.range()]);
    let nonce = ring::aead::Nonce::assume_unique_for_key(nonce);
    // RFC 4106 §5, RFC 7634 §2.1: AAD = SPI ‖ seq (32-bit) or
    // SPI ‖ seq_hi ‖ seq_lo (ESN).
    let auth_only = &buf[desc.auth_only.range()];
    if auth_only.len() != 8 {
        return Err(DescriptorError::BadRegions);
    }
    let mut aad = [0u8; 12];
    let aad_len = match desc.esn_high {
        Some(high) => {
            aad[..4].copy_from_slice(&auth_only[..4]);
            aad[4..8].copy_from_slice(&high.to_be_bytes());
            aad[8..12].copy_from_slice(&auth_only[4..8]);
            12
        }
        None => {
            aad[..8].copy_from_slice(auth_only);
            8
        }
    };
    let aad = ring::aead::Aad::from(&aad[..aad_len]);
    match desc.direction {
        Direction::Encrypt => {
            let tag = key
                .seal_in_place_separate_tag(nonce, aad, &mut buf[desc.cipher.range()])
                .map_err(|_| DescriptorError::BadRegions)?;
            buf[desc.icv.range()].copy_from_slice(tag.as_ref());
            Ok(true)
        }
        Direction::Decrypt => {
            let tag =
                ring::aead::Tag::try_from(&buf[desc.icv.range()]).map_err(|_| DescriptorError::BadRegions)?;
            Ok(key
                .open_in_place_separate_tag(nonce, aad, tag, &mut buf[desc.cipher.range()], 0..)
                .is_ok())
        }
    }
}

fn cipher_pass(session: &Session, desc: &Descriptor, buf: &mut [u8]) -> Result<(), DescriptorError> {
    let (encrypt, decrypt) = match &session.cipher {
        CipherState::Cbc(keys) => (&keys.encrypt, &keys.decrypt),
        CipherState::Null => return Ok(()),
        CipherState::Aead(_) => return Err(DescriptorError::Unsupported),
    };
    let block = session.algorithm().pad_align();
    // Block sizes are powers of two: a mask, not a division, per packet.
    if desc.cipher.len as usize & (block - 1) != 0 {
        return Err(DescriptorError::Misaligned);
    }
    let (iv, data) = buf[desc.iv.offset as usize..desc.cipher.end()].split_at_mut(desc.iv.len as usize);
    let failed = |_| DescriptorError::BadRegions;
    match (desc.direction, iv.len()) {
        (Direction::Encrypt, 16) => {
            let iv: [u8; 16] = iv.try_into().map_err(|_| DescriptorError::BadRegions)?;
            encrypt
                .less_safe_encrypt(data, EncryptionContext::Iv128(FixedLength::from(iv)))
                .map_err(failed)?;
        }
        (Direction::Encrypt, 8) => {
            let iv: [u8; 8] = iv.try_into().map_err(|_| DescriptorError::BadRegions)?;
            encrypt
                .less_safe_encrypt(data, EncryptionContext::Iv64(FixedLength::from(iv)))
                .map_err(failed)?;
        }
        (Direction::Decrypt, 16) => {
            let iv: [u8; 16] = iv.try_into().map_err(|_| DescriptorError::BadRegions)?;
            decrypt
                .decrypt(data, DecryptionContext::Iv128(FixedLength::from(iv)))
                .map_err(failed)?;
        }
        (Direction::Decrypt, 8) => {
            let iv: [u8; 8] = iv.try_into().map_err(|_| DescriptorError::BadRegions)?;
            decrypt
                .decrypt(data, DecryptionContext::Iv64(FixedLength::from(iv)))
                .map_err(failed)?;
        }
        _ => return Err(DescriptorError::BadRegions),
    }
    Ok(())
}

/// Computes the ICV (encrypt) or checks it in constant time (decrypt).
fn mac_pass(session: &Session, desc: &Descriptor, buf: &mut [u8]) -> Result<bool, DescriptorError> {
    match &session.mac {
        MacState::HmacSha1(key) => hmac_pass(&**key, desc, buf),
        MacState::HmacSha256(key) => hmac_pass(&**key, desc, buf),
        // Null integrity: nothing to compute or check.
        MacState::None => Ok(true),
    }
}

fn hmac_pass<M: Mac + Clone>(key: &M, desc: &Descriptor, buf: &mut [u8]) -> Result<bool, DescriptorError> {
    // The keyed inner/outer state was computed once per session; each packet
    // starts from a copy of it.
    let mut mac = key.clone();
    mac.update(&buf[desc.authenticated()]);
    // RFC 4303 §2.2.1: with ESN the high 32 bits are appended to the
    // authenticated data, after the payload, but never sent.
    if let Some(high) = desc.esn_high {
        mac.update(&high.to_be_bytes());
    }
    let icv = &mut buf[desc.icv.range()];
    match desc.direction {
        Direction::Encrypt => {
            let tag = mac.finalize().into_bytes();
            icv.copy_from_slice(tag.get(..icv.len()).ok_or(DescriptorError::BadRegions)?);
            Ok(true)
        }
        // Constant-time comparison of the leftmost icv.len() bytes.
        Direction::Decrypt => Ok(mac.verify_truncated_left(icv).is_ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, Region};

    /// The ICV bypass for fuzzing (`fuzzing.rs`) is compiled only with
    /// `--cfg fuzzing` (and would fail this test if it were on): in every
    /// other build a changed ICV or ciphertext byte is refused and nothing
    /// is decrypted.
    #[test]
    fn icv_is_verified_in_every_build_but_fuzzing() {
        for alg in Algorithm::ALL.into_iter().filter(|a| *a != Algorithm::Null) {
            let enc_key: Vec<u8> = (0..alg.enc_key_len() as u8).map(|i| i * 3 + 1).collect();
            let auth_key = vec![0x42; alg.auth_key_len()];
            let session = Session::new(alg, &enc_key, &auth_key).expect("valid keys");
            let cipher_len = alg.pad_align() * 2;
            let (iv, icv) = (alg.iv_len(), alg.icv_len());
            let desc = |direction| Descriptor {
                kind: DescriptorKind::SinglePass,
                direction,
                auth_only: Region::new(0, 8),
                esn_high: None,
                iv: Region::new(8, iv),
                cipher: Region::new(8 + iv, cipher_len),
                icv: Region::new(8 + iv + cipher_len, icv),
                status: Status::Pending,
            };
            let mut packet: Vec<u8> = (0..8 + iv + cipher_len + icv).map(|i| i as u8).collect();
            let mut d = desc(Direction::Encrypt);
            process(&session, &mut d, &mut packet);
            assert_eq!(d.status, Status::Done, "{alg}");
            for at in [8 + iv, packet.len() - 1] {
                let mut forged = packet.clone();
                forged[at] ^= 1;
                let before = forged.clone();
                let mut d = desc(Direction::Decrypt);
                process(&session, &mut d, &mut forged);
                assert_eq!(d.status, Status::AuthFailed, "{alg}: byte {at} changed");
                if !alg.is_aead() {
                    assert_eq!(forged, before, "{alg}: a forged packet is never decrypted");
                }
            }
            let mut d = desc(Direction::Decrypt);
            process(&session, &mut d, &mut packet);
            assert_eq!(d.status, Status::Done, "{alg}");
        }
    }
}
