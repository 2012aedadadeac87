//! The rekey exchange's messages on the wire (UDP port 500).
//!
//! A stand-in for IKEv2's CREATE_CHILD_SA, not an implementation of it. The
//! message starts with an IKEv2 header (RFC 7296 §3.1) whose exchange type
//! is 240, from the private-use range, so an IKE daemon that receives one
//! rejects it as an exchange it does not know. The body is fixed-layout and
//! the whole message is authenticated with HMAC-SHA-256 under the tunnel's
//! `SK_a`:
//!
//! ```text
//!  0  initiator "SPI"   8   tunnel tag: first 8 bytes of prf(SK_a, name)
//!  8  responder "SPI"   8   zero
//! 16  next payload      1   zero
//! 17  version           1   0x20
//! 18  exchange type     1   240
//! 19  flags             1   0x08 sender is the exchange's initiator, 0x20 response
//! 20  message ID        4
//! 24  length            4   whole message
//! 28  kind              1   1 rekey, 2 switched
//! 29  name length       1   1..=64
//! 30  tunnel name       n
//!  .  generation        4   the generation the exchange creates
//!  .  SPI               4   rekey: the sender's new inbound SPI; else 0
//!  .  nonce            32   rekey: the sender's nonce; else zero
//!  .  ICV              32   HMAC-SHA-256 over everything before it
//! ```

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::prf::{prf, NONCE_LEN, PRF_LEN};

/// IKEv2 header length.
const HEADER_LEN: usize = 28;
/// The private-use exchange type this stand-in uses (RFC 7296 §3.1).
pub const EXCHANGE_TYPE: u8 = 240;
const VERSION: u8 = 0x20;
const FLAG_INITIATOR: u8 = 0x08;
const FLAG_RESPONSE: u8 = 0x20;
const ICV_LEN: usize = PRF_LEN;
/// Longest tunnel name a message carries.
pub const MAX_NAME: usize = 64;
/// Longest message: header, body with the longest name, ICV.
pub const MAX_LEN: usize = HEADER_LEN + 2 + MAX_NAME + 4 + 4 + NONCE_LEN + ICV_LEN;

/// What a message asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Request: "rekey to this generation; here is my new inbound SPI and
    /// my nonce". Response: the same from the responder.
    Rekey,
    /// Request: "I now send on the new SAs". Response: the acknowledgement.
    Switched,
}

/// A decoded message (authenticated by [`Message::open`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub kind: Kind,
    pub response: bool,
    /// Set when the sender started the exchange.
    pub from_initiator: bool,
    pub message_id: u32,
    pub tunnel: String,
    pub generation: u32,
    pub spi: u32,
    pub nonce: [u8; NONCE_LEN],
}

/// Why a datagram is not a message to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("shorter than its fields ({0} bytes)")]
    Truncated(usize),
    #[error("not an espgw rekey message (IKE header version or exchange type)")]
    Foreign,
    #[error("length field disagrees with the datagram")]
    BadLength,
    #[error("malformed body")]
    Malformed,
    #[error("ICV does not verify")]
    Forged,
}

/// The tunnel a message names, read before authentication so that the
/// right key can be found. Nothing else about the message is trusted yet.
pub fn peek_tunnel(bytes: &[u8]) -> Result<&str, MessageError> {
    if bytes.len() < HEADER_LEN + 2 {
        return Err(MessageError::Truncated(bytes.len()));
    }
    if bytes[17] != VERSION || bytes[18] != EXCHANGE_TYPE {
        return Err(MessageError::Foreign);
    }
    let declared = u32::from_be_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
    if usize::try_from(declared).ok() != Some(bytes.len()) {
        return Err(MessageError::BadLength);
    }
    let name_len = usize::from(bytes[HEADER_LEN + 1]);
    if name_len == 0 || name_len > MAX_NAME {
        return Err(MessageError::Malformed);
    }
    let expected = HEADER_LEN + 2 + name_len + 4 + 4 + NONCE_LEN + ICV_LEN;
    if bytes.len() < expected {
        return Err(MessageError::Truncated(bytes.len()));
    }
    if bytes.len() > expected {
        return Err(MessageError::BadLength);
    }
    std::str::from_utf8(&bytes[HEADER_LEN + 2..HEADER_LEN + 2 + name_len])
        .map_err(|_| MessageError::Malformed)
}

fn tag(sk_a: &[u8], tunnel: &str) -> [u8; 8] {
    let full = prf(sk_a, &[b"tag", tunnel.as_bytes()]);
    let mut tag = [0; 8];
    tag.copy_from_slice(&full[..8]);
    tag
}

fn icv(sk_a: &[u8], covered: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(sk_a).unwrap_or_else(|_| unreachable!());
    mac.update(covered);
    mac
}

impl Message {
    /// The message on the wire, authenticated with `sk_a`.
    pub fn seal(&self, sk_a: &[u8]) -> Vec<u8> {
        let name = self.tunnel.as_bytes();
        let name = &name[..name.len().min(MAX_NAME)];
        let total = HEADER_LEN + 2 + name.len() + 4 + 4 + NONCE_LEN + ICV_LEN;
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&tag(sk_a, &self.tunnel));
        out.extend_from_slice(&[0; 8]);
        let mut flags = 0;
        if self.from_initiator {
            flags |= FLAG_INITIATOR;
        }
        if self.response {
            flags |= FLAG_RESPONSE;
        }
        out.extend_from_slice(&[0, VERSION, EXCHANGE_TYPE, flags]);
        out.extend_from_slice(&self.message_id.to_be_bytes());
        out.extend_from_slice(&(total as u32).to_be_bytes());
        out.push(match self.kind {
            Kind::Rekey => 1,
            Kind::Switched => 2,
        });
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.extend_from_slice(&self.spi.to_be_bytes());
        out.extend_from_slice(&self.nonce);
        let sum = icv(sk_a, &out).finalize().into_bytes();
        out.extend_from_slice(&sum);
        out
    }

    /// Checks and decodes `bytes` with the key of the tunnel it names
    /// (see [`peek_tunnel`]). The ICV is compared in constant time.
    pub fn open(bytes: &[u8], sk_a: &[u8]) -> Result<Message, MessageError> {
        let tunnel = peek_tunnel(bytes)?;
        let (covered, sum) = bytes.split_at(bytes.len() - ICV_LEN);
        icv(sk_a, covered)
            .verify_slice(sum)
            .map_err(|_| MessageError::Forged)?;
        let name_end = HEADER_LEN + 2 + tunnel.len();
        let word = |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let kind = match bytes[HEADER_LEN] {
            1 => Kind::Rekey,
            2 => Kind::Switched,
            _ => return Err(MessageError::Malformed),
        };
        let flags = bytes[19];
        let mut nonce = [0; NONCE_LEN];
        nonce.copy_from_slice(&bytes[name_end + 8..name_end + 8 + NONCE_LEN]);
        Ok(Message {
            kind,
            response: flags & FLAG_RESPONSE != 0,
            from_initiator: flags & FLAG_INITIATOR != 0,
            message_id: word(20),
            tunnel: tunnel.to_owned(),
            generation: word(name_end),
            spi: word(name_end + 4),
            nonce,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Message {
        Message {
            kind: Kind::Rekey,
            response: false,
            from_initiator: true,
            message_id: 7,
            tunnel: "site-b".into(),
            generation: 3,
            spi: 0xc0ffee01,
            nonce: [0x5a; NONCE_LEN],
        }
    }

    #[test]
    fn seal_then_open_is_the_identity() {
        let key = [9u8; 32];
        let wire = sample().seal(&key);
        assert_eq!(wire.len(), HEADER_LEN + 2 + 6 + 8 + NONCE_LEN + ICV_LEN);
        assert!(wire.len() <= MAX_LEN);
        assert_eq!(peek_tunnel(&wire), Ok("site-b"));
        assert_eq!(Message::open(&wire, &key), Ok(sample()));
        let answer = Message {
            kind: Kind::Switched,
            response: true,
            from_initiator: false,
            ..sample()
        };
        assert_eq!(Message::open(&answer.seal(&key), &key), Ok(answer));
    }

    #[test]
    fn any_changed_byte_or_key_is_refused() {
        let key = [9u8; 32];
        let wire = sample().seal(&key);
        for i in 0..wire.len() {
            let mut bad = wire.clone();
            bad[i] ^= 0x01;
            assert!(Message::open(&bad, &key).is_err(), "flipped byte {i} accepted");
        }
        assert_eq!(Message::open(&wire, &[8u8; 32]), Err(MessageError::Forged));
    }

    #[test]
    fn truncated_and_foreign_datagrams_are_refused_without_panicking() {
        let key = [9u8; 32];
        let wire = sample().seal(&key);
        for len in 0..wire.len() {
            assert!(Message::open(&wire[..len], &key).is_err(), "{len} bytes accepted");
        }
        let mut ike = wire.clone();
        ike[18] = 34; // IKE_SA_INIT
        assert_eq!(peek_tunnel(&ike), Err(MessageError::Foreign));
        let mut long = wire.clone();
        long.push(0);
        assert_eq!(peek_tunnel(&long), Err(MessageError::BadLength));
    }
}
