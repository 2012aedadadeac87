//! The keying exchange's messages on the wire (UDP port 500, or behind the
//! non-ESP marker on a tunnel's encapsulation port).
//!
//! A stand-in for IKEv2 between two espgw gateways, not an implementation
//! of it. Every message starts with an IKEv2 header (RFC 7296 §3.1) whose
//! exchange type is 240, from the private-use range, so an IKE daemon that
//! receives one rejects it as an exchange it does not know. As in IKEv2,
//! the header's two SPIs name the *control SA* (IKEv2's IKE SA) the message
//! belongs to: both are random and chosen afresh by every exchange that
//! creates one, so a message captured before a restart names a control SA
//! that no longer exists. The body is fixed-layout and the whole message
//! is authenticated with HMAC-SHA-256:
//!
//! ```text
//!  0  initiator SPI     8   chosen by the control SA's initiator
//!  8  responder SPI     8   chosen by its responder; zero in an INIT request
//! 16  next payload      1   zero
//! 17  version           1   0x20
//! 18  exchange type     1   240
//! 19  flags             1   0x08 sender is the control SA's initiator, 0x20 response
//! 20  message ID        4
//! 24  length            4   whole message
//! 28  kind              1   1 init, 2 rekey, 3 switched
//! 29  name length       1   1..=64
//! 30  tunnel name       n
//!  .  child             4   the child SA pair the exchange creates or switches to
//!  .  SPI               4   init, rekey: the sender's new inbound SPI; else 0
//!  .  nonce            32   init, rekey: the sender's nonce; else zero
//!  .  ICV              32   HMAC-SHA-256 over everything before it
//! ```
//!
//! Which key authenticates a message is the plane's business
//! ([`crate::prf`]): an INIT request is keyed from the pre-shared secret
//! and the sender's side, everything else from the control SA, with one
//! key per direction, so that nothing a gateway sends is accepted when it
//! is sent back to it.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::prf::{NONCE_LEN, PRF_LEN};

/// IKEv2 header length.
const HEADER_LEN: usize = 28;
/// The private-use exchange type this stand-in uses (RFC 7296 §3.1).
pub const EXCHANGE_TYPE: u8 = 240;
const VERSION: u8 = 0x20;
const FLAG_INITIATOR: u8 = 0x08;
const FLAG_RESPONSE: u8 = 0x20;
const ICV_LEN: usize = PRF_LEN;
/// Length of a control SA's SPI (RFC 7296 §3.1).
pub const SPI_LEN: usize = 8;
/// Longest tunnel name a message carries.
pub const MAX_NAME: usize = 64;
/// Body bytes after the name: child, SPI, nonce.
const TAIL_LEN: usize = 4 + 4 + NONCE_LEN;
/// Longest message: header, body with the longest name, ICV.
pub const MAX_LEN: usize = HEADER_LEN + 2 + MAX_NAME + TAIL_LEN + ICV_LEN;

/// A control SA's SPI.
pub type ControlSpi = [u8; SPI_LEN];

/// What a message asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Request: "create a control SA and its first child SAs; here are my
    /// SPI, my new inbound SPI and my nonce". Response: the same from the
    /// responder, authenticated with the new control SA's key, which only
    /// a holder of the secret who saw the request's nonce can compute.
    Init,
    /// Request: "create the next child SAs; here is my new inbound SPI and
    /// my nonce". Response: the same from the responder.
    Rekey,
    /// Request: "I now send on the new SAs". Response: the acknowledgement.
    Switched,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Init => 1,
            Kind::Rekey => 2,
            Kind::Switched => 3,
        }
    }

    fn from_code(code: u8) -> Option<Kind> {
        match code {
            1 => Some(Kind::Init),
            2 => Some(Kind::Rekey),
            3 => Some(Kind::Switched),
            _ => None,
        }
    }
}

/// A message. Decoded only by [`Message::open`] and [`Message::open_keyed`],
/// which check its ICV first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// What the message asks or answers.
    pub kind: Kind,
    /// A response (IKEv2's Response flag) rather than a request.
    pub response: bool,
    /// Set when the sender is the initiator of the control SA (IKEv2's
    /// Initiator flag, RFC 7296 §3.1), whoever started this exchange.
    pub from_initiator: bool,
    /// The control SA's SPI chosen by its initiator.
    pub spi_i: ControlSpi,
    /// The control SA's SPI chosen by its responder; zero in an INIT
    /// request.
    pub spi_r: ControlSpi,
    /// As in IKEv2: each side numbers its requests on a control SA from 0
    /// up, and a response carries its request's number; an older one is a
    /// replay, the same one a retransmission.
    pub message_id: u32,
    /// The tunnel's name (at most [`MAX_NAME`] bytes are sent).
    pub tunnel: String,
    /// The child SA pair the exchange creates (init: 0) or switches to.
    pub child: u32,
    /// INIT and REKEY: the SPI the sender will receive on in the new child
    /// SA pair; 0 otherwise.
    pub spi: u32,
    /// INIT and REKEY: the sender's fresh random nonce, from which (with
    /// the peer's) the new keys are derived; zero otherwise.
    pub nonce: [u8; NONCE_LEN],
}

/// Why a datagram is not a message to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Fewer bytes (how many) than the header or the body it announces.
    #[error("shorter than its fields ({0} bytes)")]
    Truncated(usize),
    /// Not this stand-in's version and exchange type: perhaps real IKE.
    #[error("not an espgw keying message (IKE header version or exchange type)")]
    Foreign,
    /// The length field or the body's layout says another length than the
    /// datagram has.
    #[error("length field disagrees with the datagram")]
    BadLength,
    /// An unknown kind, or a tunnel name that is empty, too long or not
    /// UTF-8.
    #[error("malformed body")]
    Malformed,
    /// The ICV does not verify with the key: forged, corrupted, replayed
    /// to its sender, or keyed by another secret or control SA.
    #[error("ICV does not verify")]
    Forged,
}

/// What can be read of a message before it is authenticated: enough to
/// find the tunnel, the control SA and so the key. Nothing here is
/// trusted yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peek<'a> {
    /// The tunnel's name, as [`Message::tunnel`].
    pub tunnel: &'a str,
    /// As [`Message::kind`].
    pub kind: Kind,
    /// As [`Message::response`].
    pub response: bool,
    /// As [`Message::from_initiator`].
    pub from_initiator: bool,
    /// As [`Message::spi_i`].
    pub spi_i: ControlSpi,
    /// As [`Message::spi_r`].
    pub spi_r: ControlSpi,
}

/// Checks the framing of `bytes` and reads its routing fields.
pub fn peek(bytes: &[u8]) -> Result<Peek<'_>, MessageError> {
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
    let expected = HEADER_LEN + 2 + name_len + TAIL_LEN + ICV_LEN;
    if bytes.len() < expected {
        return Err(MessageError::Truncated(bytes.len()));
    }
    if bytes.len() > expected {
        return Err(MessageError::BadLength);
    }
    let kind = Kind::from_code(bytes[HEADER_LEN]).ok_or(MessageError::Malformed)?;
    let tunnel = std::str::from_utf8(&bytes[HEADER_LEN + 2..HEADER_LEN + 2 + name_len])
        .map_err(|_| MessageError::Malformed)?;
    let flags = bytes[19];
    let mut spi_i = [0; SPI_LEN];
    let mut spi_r = [0; SPI_LEN];
    spi_i.copy_from_slice(&bytes[..SPI_LEN]);
    spi_r.copy_from_slice(&bytes[SPI_LEN..2 * SPI_LEN]);
    Ok(Peek {
        tunnel,
        kind,
        response: flags & FLAG_RESPONSE != 0,
        from_initiator: flags & FLAG_INITIATOR != 0,
        spi_i,
        spi_r,
    })
}

fn icv(key: &[u8], covered: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(covered);
    mac
}

impl Message {
    /// A message of `kind` (a `response`, or a request) numbered
    /// `message_id`, about `tunnel`'s child SA pair `child`, with no SPI
    /// and no nonce (INIT and REKEY set theirs). The control SA's SPIs
    /// and the initiator flag are left zero: the end that seals it under
    /// a control SA sets them.
    pub fn new(kind: Kind, response: bool, message_id: u32, tunnel: String, child: u32) -> Message {
        Message {
            kind,
            response,
            from_initiator: false,
            spi_i: [0; SPI_LEN],
            spi_r: [0; SPI_LEN],
            message_id,
            tunnel,
            child,
            spi: 0,
            nonce: [0; NONCE_LEN],
        }
    }

    /// The message on the wire, authenticated with `key`.
    pub fn seal(&self, key: &[u8]) -> Vec<u8> {
        let name = self.tunnel.as_bytes();
        let name = &name[..name.len().min(MAX_NAME)];
        let total = HEADER_LEN + 2 + name.len() + TAIL_LEN + ICV_LEN;
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&self.spi_i);
        out.extend_from_slice(&self.spi_r);
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
        out.push(self.kind.code());
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&self.child.to_be_bytes());
        out.extend_from_slice(&self.spi.to_be_bytes());
        out.extend_from_slice(&self.nonce);
        let sum = icv(key, &out).finalize().into_bytes();
        out.extend_from_slice(&sum);
        out
    }

    /// Checks `bytes` with `key` (in constant time) and decodes them.
    pub fn open(bytes: &[u8], key: &[u8]) -> Result<Message, MessageError> {
        Self::open_keyed(bytes, |_| key)
    }

    /// Checks and decodes `bytes` with the key `key_for` computes from the
    /// fields as sent: an INIT response is authenticated with a key that
    /// depends on the responder's nonce and SPI it carries. What `key_for`
    /// sees is not yet authenticated; nothing else is returned until the
    /// ICV verifies.
    pub fn open_keyed<K: AsRef<[u8]>>(
        bytes: &[u8],
        key_for: impl FnOnce(&Message) -> K,
    ) -> Result<Message, MessageError> {
        let peeked = peek(bytes)?;
        let name_end = HEADER_LEN + 2 + peeked.tunnel.len();
        let word = |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut nonce = [0; NONCE_LEN];
        nonce.copy_from_slice(&bytes[name_end + 8..name_end + 8 + NONCE_LEN]);
        let message = Message {
            kind: peeked.kind,
            response: peeked.response,
            from_initiator: peeked.from_initiator,
            spi_i: peeked.spi_i,
            spi_r: peeked.spi_r,
            message_id: word(20),
            tunnel: peeked.tunnel.to_owned(),
            child: word(name_end),
            spi: word(name_end + 4),
            nonce,
        };
        let key = key_for(&message);
        let (covered, sum) = bytes.split_at(bytes.len() - ICV_LEN);
        icv(key.as_ref(), covered)
            .verify_slice(sum)
            .map_err(|_| MessageError::Forged)?;
        Ok(message)
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
            spi_i: [1, 2, 3, 4, 5, 6, 7, 8],
            spi_r: [9, 10, 11, 12, 13, 14, 15, 16],
            message_id: 7,
            tunnel: "site-b".into(),
            child: 3,
            spi: 0xc0ffee01,
            nonce: [0x5a; NONCE_LEN],
        }
    }

    #[test]
    fn seal_then_open_is_the_identity() {
        let key = [9u8; 32];
        let wire = sample().seal(&key);
        assert_eq!(wire.len(), HEADER_LEN + 2 + 6 + TAIL_LEN + ICV_LEN);
        assert!(wire.len() <= MAX_LEN);
        let peeked = peek(&wire).expect("framed");
        assert_eq!(
            (peeked.tunnel, peeked.kind, peeked.spi_i, peeked.spi_r),
            ("site-b", Kind::Rekey, sample().spi_i, sample().spi_r)
        );
        assert_eq!(Message::open(&wire, &key), Ok(sample()));
        for kind in [Kind::Init, Kind::Switched] {
            let answer = Message {
                kind,
                response: true,
                from_initiator: false,
                ..sample()
            };
            assert_eq!(Message::open(&answer.seal(&key), &key), Ok(answer));
        }
    }

    #[test]
    fn the_key_may_depend_on_the_fields_as_sent() {
        let wire = sample().seal(&[0x03; 32]);
        let opened = Message::open_keyed(&wire, |m| [m.child as u8; 32]);
        assert_eq!(opened, Ok(sample()));
        assert_eq!(
            Message::open_keyed(&wire, |m| [m.spi as u8; 32]),
            Err(MessageError::Forged)
        );
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
        assert_eq!(peek(&ike), Err(MessageError::Foreign));
        let mut long = wire.clone();
        long.push(0);
        assert_eq!(peek(&long), Err(MessageError::BadLength));
        let mut unknown = wire.clone();
        unknown[28] = 9;
        assert_eq!(peek(&unknown), Err(MessageError::Malformed));
    }
}
