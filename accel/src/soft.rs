//! The inline software engine, and the primitive passes every engine that
//! computes on the CPU shares: cipher, MAC and AEAD over a descriptor's
//! regions, in place.

use aes::cipher::{
    array::Array, BlockCipherDecrypt, BlockCipherEncrypt, BlockModeDecrypt, BlockModeEncrypt, InnerIvInit,
};
use subtle::ConstantTimeEq;

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
    if let CipherState::AesGcm { .. } = session.cipher {
        return match desc.kind {
            DescriptorKind::SinglePass => aead_pass(session, desc, buf),
            // GCM's tag depends on the ciphertext through GHASH inside the
            // same primitive; it cannot be split into two passes.
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
    let CipherState::AesGcm { key, salt } = &session.cipher else {
        return Err(DescriptorError::Unsupported);
    };
    // RFC 4106 §4: nonce = salt ‖ explicit IV.
    let mut nonce = [0u8; 12];
    nonce[..4].copy_from_slice(&salt[..]);
    nonce[4..].copy_from_slice(&buf[desc.iv.range()]);
    let nonce = ring::aead::Nonce::assume_unique_for_key(nonce);
    // RFC 4106 §5: AAD = SPI ‖ seq (32-bit) or SPI ‖ seq_hi ‖ seq_lo (ESN).
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
    let (iv_bytes, data) = buf[desc.iv.offset as usize..desc.cipher.end()].split_at_mut(desc.iv.len as usize);
    match &session.cipher {
        CipherState::Aes128Cbc(cipher) => cbc::<aes::Aes128>(cipher, iv_bytes, data, desc.direction),
        CipherState::Aes256Cbc(cipher) => cbc::<aes::Aes256>(cipher, iv_bytes, data, desc.direction),
        CipherState::TripleDesCbc(cipher) => cbc::<des::TdesEde3>(cipher, iv_bytes, data, desc.direction),
        CipherState::Null => Ok(()),
        CipherState::AesGcm { .. } => Err(DescriptorError::Unsupported),
    }
}

fn cbc<C>(cipher: &C, iv: &[u8], data: &mut [u8], direction: Direction) -> Result<(), DescriptorError>
where
    C: BlockCipherEncrypt + BlockCipherDecrypt + Clone,
{
    let block_size = C::block_size();
    if !data.len().is_multiple_of(block_size) {
        return Err(DescriptorError::Misaligned);
    }
    let (blocks, rest) = Array::slice_as_chunks_mut(data);
    debug_assert!(rest.is_empty());
    match direction {
        Direction::Encrypt => {
            let mut mode = cbc::Encryptor::<C>::inner_iv_slice_init(cipher.clone(), iv)
                .map_err(|_| DescriptorError::BadRegions)?;
            mode.encrypt_blocks(blocks);
        }
        Direction::Decrypt => {
            let mut mode = cbc::Decryptor::<C>::inner_iv_slice_init(cipher.clone(), iv)
                .map_err(|_| DescriptorError::BadRegions)?;
            mode.decrypt_blocks(blocks);
        }
    }
    Ok(())
}

/// Computes the ICV (encrypt) or checks it in constant time (decrypt).
fn mac_pass(session: &Session, desc: &Descriptor, buf: &mut [u8]) -> Result<bool, DescriptorError> {
    let MacState::Hmac(key) = &session.mac else {
        return Ok(true); // null integrity: nothing to compute or check
    };
    let mut ctx = ring::hmac::Context::with_key(key);
    ctx.update(&buf[desc.authenticated()]);
    // RFC 4303 §2.2.1: with ESN the high 32 bits are appended to the
    // authenticated data, after the payload, but never sent.
    if let Some(high) = desc.esn_high {
        ctx.update(&high.to_be_bytes());
    }
    let tag = ctx.sign();
    let icv = &mut buf[desc.icv.range()];
    let truncated = tag.as_ref().get(..icv.len()).ok_or(DescriptorError::BadRegions)?;
    match desc.direction {
        Direction::Encrypt => {
            icv.copy_from_slice(truncated);
            Ok(true)
        }
        Direction::Decrypt => Ok(bool::from(icv.ct_eq(truncated))),
    }
}
