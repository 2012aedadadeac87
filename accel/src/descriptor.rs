//! Descriptors: one unit of work handed across the offload boundary.
//!
//! Modelled on the Freescale SEC `IPSEC_ESP` descriptor (HMAC-only data,
//! cipher IV, cipher data with an ICV extent) and on Intel ipsec-mb jobs
//! (offsets and lengths, chain order, status). Regions are byte offsets into
//! the packet buffer the descriptor travels with, so the engine works in
//! place and nothing is copied to describe a packet.

use std::ops::Range;

/// A byte range of the packet buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Region {
    /// Offset of the first byte, from where the descriptor's regions start.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

impl Region {
    /// The region `offset..offset + len`; both must fit in `u32` (a buffer is far smaller).
    pub fn new(offset: usize, len: usize) -> Self {
        Region {
            offset: offset as u32,
            len: len as u32,
        }
    }

    /// The region as a range of indices.
    #[inline]
    pub fn range(self) -> Range<usize> {
        self.offset as usize..self.end()
    }

    /// One past the region's last byte.
    #[inline]
    pub fn end(self) -> usize {
        self.offset as usize + self.len as usize
    }
}

/// Outbound packets are encrypted then authenticated; inbound packets are
/// verified then decrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Outbound: encrypt, then compute the ICV.
    Encrypt,
    /// Inbound: verify the ICV, then decrypt.
    Decrypt,
}

/// What a descriptor asks the engine to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorKind {
    /// Cipher and integrity (or the AEAD) in one walk over the data.
    SinglePass,
    /// The cipher alone (first half of a dual-pass encrypt, second of a decrypt).
    CipherOnly,
    /// The integrity function alone: compute the ICV when encrypting,
    /// verify it when decrypting.
    MacOnly,
}

/// What the engine wrote back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Not yet processed.
    Pending,
    /// Processed: encrypted with its ICV written, or verified and decrypted.
    Done,
    /// The ICV did not verify; the payload was left undecrypted.
    AuthFailed,
    /// The engine could not process the descriptor.
    Error(DescriptorError),
}

/// Why an engine refused a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// A region lies outside the buffer, or regions are not in ESP order.
    #[error("descriptor regions do not fit the buffer or are out of ESP order")]
    BadRegions,
    /// The cipher region is not a whole number of cipher blocks.
    #[error("cipher region is not a multiple of the cipher block size")]
    Misaligned,
    /// The descriptor kind makes no sense for the session's algorithm
    /// (for example a MAC-only pass for an AEAD).
    #[error("descriptor kind is not supported for this algorithm")]
    Unsupported,
    /// The engine failed (an injected fault, a channel reset, a device error).
    #[error("the engine reported a fault")]
    Fault,
    /// The descriptor names a session the engine does not hold (never
    /// registered, or released).
    #[error("the descriptor names no session registered with this engine")]
    BadSession,
    /// The engine held the job past its deadline without an answer (an
    /// engine server that stopped serving while still connected): given
    /// back so that the caller drops it rather than waits.
    #[error("the engine did not complete the job within its deadline")]
    Timeout,
    /// Refused at submission: the engine has timed out jobs and its
    /// server has not answered since.
    #[error("the engine is unavailable: its server stopped answering")]
    Unavailable,
}

/// One ESP crypto request. `auth_only` is the SPI and low sequence number;
/// it, the IV and the cipher region must be contiguous and in that order,
/// which is how they lie in an ESP packet (RFC 4303 §2).
// Laid out in whole 16-byte lines: a descriptor is copied as it travels
// (prepare, job, completion), and copies in matching aligned pieces let the
// CPU forward each store to the next load instead of stalling on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(16))]
pub struct Descriptor {
    /// Which passes the engine runs.
    pub kind: DescriptorKind,
    /// Encrypt (outbound) or decrypt (inbound).
    pub direction: Direction,
    /// SPI and sequence number: authenticated, not encrypted.
    pub auth_only: Region,
    /// High 32 bits of an extended sequence number; authenticated but never
    /// transmitted (RFC 4303 §2.2.1, RFC 4106 §5).
    pub esn_high: Option<u32>,
    /// The IV as it travels in the packet (for GCM and ChaCha20 the 8-byte explicit part).
    pub iv: Region,
    /// Payload, padding, pad length and next header.
    pub cipher: Region,
    /// The ICV: written when encrypting, checked when decrypting.
    pub icv: Region,
    /// `Pending` when submitted; what the engine wrote back once complete.
    pub status: Status,
}

/// Bytes of ESP's SPI and sequence number, which the ICV covers
/// unencrypted (RFC 4303 §2).
const ESP_HEADER_LEN: usize = 8;

impl Descriptor {
    /// The single-pass descriptor of an ESP packet that starts at offset 0
    /// of its buffer: SPI and sequence number authenticated only, then the
    /// IV, `cipher_len` bytes of payload (with padding and trailer) and the
    /// ICV, as `alg` sizes them.
    #[inline]
    pub fn esp(
        direction: Direction,
        alg: crate::Algorithm,
        cipher_len: usize,
        esn_high: Option<u32>,
    ) -> Descriptor {
        let iv_len = alg.iv_len();
        Descriptor {
            kind: DescriptorKind::SinglePass,
            direction,
            auth_only: Region::new(0, ESP_HEADER_LEN),
            esn_high,
            iv: Region::new(ESP_HEADER_LEN, iv_len),
            cipher: Region::new(ESP_HEADER_LEN + iv_len, cipher_len),
            icv: Region::new(ESP_HEADER_LEN + iv_len + cipher_len, alg.icv_len()),
            status: Status::Pending,
        }
    }

    /// Checks the regions against a buffer of `buf_len` bytes and against
    /// each other, so engines can index without panicking.
    #[inline]
    pub fn validate(&self, buf_len: usize) -> Result<(), DescriptorError> {
        let contiguous = self.auth_only.end() == self.iv.offset as usize
            && self.iv.end() == self.cipher.offset as usize
            && self.cipher.end() == self.icv.offset as usize;
        if !contiguous || self.icv.end() > buf_len {
            return Err(DescriptorError::BadRegions);
        }
        Ok(())
    }

    /// The bytes the integrity function covers: SPI, sequence, IV, ciphertext.
    pub fn authenticated(&self) -> Range<usize> {
        self.auth_only.offset as usize..self.cipher.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    /// The ESP layout every caller relied on when each built it by hand:
    /// 8 bytes of SPI and sequence, the IV, the payload, the ICV, in one
    /// contiguous run that `validate` accepts.
    #[test]
    fn an_esp_descriptor_lays_out_header_iv_payload_and_icv() {
        for alg in [Algorithm::Aes128Gcm16, Algorithm::Aes128Sha1, Algorithm::Null] {
            let d = Descriptor::esp(Direction::Decrypt, alg, 64, Some(3));
            assert_eq!((d.auth_only.offset, d.auth_only.len), (0, 8));
            assert_eq!(d.iv.offset as usize, 8);
            assert_eq!(d.cipher.offset as usize, 8 + alg.iv_len());
            assert_eq!(d.icv.end(), 8 + alg.iv_len() + 64 + alg.icv_len());
            assert_eq!(d.authenticated(), 0..8 + alg.iv_len() + 64);
            assert_eq!(
                (d.kind, d.direction, d.esn_high),
                (DescriptorKind::SinglePass, Direction::Decrypt, Some(3))
            );
            assert_eq!(d.validate(d.icv.end()), Ok(()));
            assert_eq!(d.validate(d.icv.end() - 1), Err(DescriptorError::BadRegions));
        }
    }
}
