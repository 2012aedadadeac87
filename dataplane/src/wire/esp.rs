//! ESP header and trailer views (RFC 4303 §2).
//!
//! ```text
//!  0                   1                   2                   3
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |               Security Parameters Index (SPI)                 |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                      Sequence Number                          |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                IV, Payload Data, Padding, Pad Length,         |
//! |                Next Header (variable), ICV (variable)         |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//! IV and ICV lengths are properties of the SA, not of the packet, so this
//! view only splits off the fixed header; the trailer view works on the
//! decrypted bytes.

/// Length of the SPI and sequence number fields.
pub const HEADER_LEN: usize = 8;
/// Pad Length and Next Header.
pub const TRAILER_LEN: usize = 2;

mod field {
    use std::ops::Range;
    pub(crate) const SPI: Range<usize> = 0..4;
    pub(crate) const SEQUENCE: Range<usize> = 4..8;
    pub(crate) const PAYLOAD: std::ops::RangeFrom<usize> = 8..;
}

/// An ESP packet, from the SPI onwards.
#[derive(Debug, Clone)]
pub struct EspPacket<T: AsRef<[u8]>> {
    buffer: T,
}

/// The buffer is too short for what was asked of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("truncated ESP packet")]
pub struct Truncated;

impl<T: AsRef<[u8]>> EspPacket<T> {
    /// A view without a length check: the accessors panic on a buffer
    /// shorter than [`HEADER_LEN`]. For headers being written, whose room
    /// the caller made.
    pub fn new_unchecked(buffer: T) -> Self {
        EspPacket { buffer }
    }

    /// A view that is at least long enough for the fixed header.
    pub fn new_checked(buffer: T) -> Result<Self, Truncated> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Truncated);
        }
        Ok(EspPacket { buffer })
    }

    /// The Security Parameters Index (RFC 4303 §2.1): with the
    /// destination, names the inbound SA.
    pub fn spi(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::SPI];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// The low 32 bits of the sequence number (all of it without ESN).
    pub fn sequence_number(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::SEQUENCE];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// IV, payload, padding, trailer and ICV.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }

    /// The buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EspPacket<T> {
    /// Writes the SPI, in network byte order.
    pub fn set_spi(&mut self, spi: u32) {
        self.buffer.as_mut()[field::SPI].copy_from_slice(&spi.to_be_bytes());
    }

    /// Writes the low 32 bits of the sequence number (RFC 4303 §2.2; with
    /// ESN the high half is never sent: it enters only the ICV, §2.2.1).
    pub fn set_sequence_number(&mut self, seq: u32) {
        self.buffer.as_mut()[field::SEQUENCE].copy_from_slice(&seq.to_be_bytes());
    }
}

/// The decrypted end of an ESP payload: padding, pad length, next header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EspTrailer {
    /// Bytes of padding in front of the trailer (RFC 4303 §2.5).
    pub pad_len: u8,
    /// The protocol of the payload (RFC 4303 §2.6): 4 (IPv4) or 41 (IPv6)
    /// in tunnel mode, the upper layer in transport mode, 59 for a dummy
    /// packet to discard.
    pub next_header: u8,
}

/// What is wrong with a decrypted trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TrailerError {
    /// The pad length claims more bytes than lie before the trailer.
    #[error("pad length exceeds the payload")]
    PadTooLong,
    /// RFC 4303 §2.4: padding bytes are 1, 2, 3, … unless the algorithm says otherwise.
    #[error("padding bytes are not 1, 2, 3, ...")]
    BadPadding,
    /// Fewer than [`TRAILER_LEN`] bytes of plaintext.
    #[error("payload too short for the ESP trailer")]
    Truncated,
}

impl EspTrailer {
    /// Parses and checks the trailer at the end of `plaintext`; returns it
    /// with the length of the payload data in front of the padding.
    pub fn parse(plaintext: &[u8]) -> Result<(EspTrailer, usize), TrailerError> {
        let n = plaintext.len();
        if n < TRAILER_LEN {
            return Err(TrailerError::Truncated);
        }
        let trailer = EspTrailer {
            pad_len: plaintext[n - 2],
            next_header: plaintext[n - 1],
        };
        let payload_len = (n - TRAILER_LEN)
            .checked_sub(usize::from(trailer.pad_len))
            .ok_or(TrailerError::PadTooLong)?;
        let padding = &plaintext[payload_len..n - TRAILER_LEN];
        if !padding.iter().enumerate().all(|(i, &b)| usize::from(b) == i + 1) {
            return Err(TrailerError::BadPadding);
        }
        Ok((trailer, payload_len))
    }

    /// Padding needed after `payload_len` bytes so that payload, padding and
    /// trailer fill whole multiples of `align` (RFC 4303 §2.4).
    pub fn pad_len_for(payload_len: usize, align: usize) -> usize {
        // Every ESP alignment is a power of two (4, 8 or 16): a mask, not
        // two divisions, on the per-packet path.
        debug_assert!(align.is_power_of_two());
        let mask = align.wrapping_sub(1);
        align.wrapping_sub((payload_len + TRAILER_LEN) & mask) & mask
    }

    /// Writes padding 1, 2, 3, … then pad length and next header into `out`,
    /// which must be `pad_len + 2` bytes long.
    pub fn emit(out: &mut [u8], next_header: u8) {
        let pad_len = out.len() - TRAILER_LEN;
        for (i, b) in out[..pad_len].iter_mut().enumerate() {
            *b = (i + 1) as u8;
        }
        out[pad_len] = pad_len as u8;
        out[pad_len + 1] = next_header;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 3602 §4 case 5: ESP header of SPI 0x4321, sequence 1.
    static HEADER: [u8; 8] = [0x00, 0x00, 0x43, 0x21, 0x00, 0x00, 0x00, 0x01];

    #[test]
    fn deconstruct() {
        let p = EspPacket::new_checked(&HEADER[..]).unwrap();
        assert_eq!(p.spi(), 0x4321);
        assert_eq!(p.sequence_number(), 1);
        assert!(p.payload().is_empty());
    }

    #[test]
    fn construct() {
        let mut bytes = [0u8; 8];
        let mut p = EspPacket::new_unchecked(&mut bytes[..]);
        p.set_spi(0x4321);
        p.set_sequence_number(1);
        assert_eq!(bytes, HEADER);
    }

    #[test]
    fn check_len() {
        for n in 0..HEADER_LEN {
            assert_eq!(EspPacket::new_checked(&HEADER[..n]).unwrap_err(), Truncated);
        }
    }

    #[test]
    fn trailer_parse_and_emit() {
        assert_eq!(EspTrailer::pad_len_for(5, 4), 1);
        assert_eq!(EspTrailer::pad_len_for(14, 16), 0);
        assert_eq!(EspTrailer::pad_len_for(0, 16), 14);
        let mut plain = vec![0xee; 5 + 1 + 2];
        EspTrailer::emit(&mut plain[5..], 4);
        assert_eq!(&plain[5..], &[1, 1, 4]);
        assert_eq!(
            EspTrailer::parse(&plain),
            Ok((
                EspTrailer {
                    pad_len: 1,
                    next_header: 4
                },
                5
            ))
        );
        let mut bad = plain.clone();
        bad[5] = 9;
        assert_eq!(EspTrailer::parse(&bad), Err(TrailerError::BadPadding));
        assert_eq!(EspTrailer::parse(&[200, 4]), Err(TrailerError::PadTooLong));
        assert_eq!(EspTrailer::parse(&[4]), Err(TrailerError::Truncated));
    }
}
