//! The keying exchange's message codec (`ike_stub::message`).
//!
//! Any bytes: `peek` and `Message::open` (and `open_keyed`) refuse them or
//! decode them without panicking, and agree: `open` refuses what `peek`
//! refuses, with the same error, and otherwise only with `Forged`; what
//! `peek` reads (a name of 1 to 64 bytes, kind, flags, both SPIs from the
//! header) is what `open_keyed` hands its key function and what `open`
//! returns; a datagram `peek` takes is exactly as long as its name says and
//! at most `MAX_LEN`. What `open` accepts (only seeds sealed with the key:
//! the fuzzer cannot make one) seals again to a message that opens to the
//! same fields, and does not open with another key.
//!
//! Then the same bytes read as fields (kind, flags, SPIs, message ID,
//! child, SPI, nonce, name: see `fields`), sealed with the key: every kind,
//! both flags and every SPI round-trips through `peek` and `open`; a name
//! of 1 to 64 bytes travels, an empty one is refused as malformed, a longer
//! one is cut to 64 bytes; any flipped byte, a byte more or less, or
//! another key is refused.
#![no_main]

use ike_stub::message::{peek, Kind, Message, MessageError, Peek, MAX_LEN, MAX_NAME, SPI_LEN};
use ike_stub::prf::NONCE_LEN;
use libfuzzer_sys::fuzz_target;

const KEY: [u8; 32] = [0x5c; 32];
/// Header, kind and name length, child, SPI, nonce, ICV.
const FIXED: usize = 28 + 2 + 4 + 4 + NONCE_LEN + 32;
/// Field bytes before the name (see `fields`).
const FIELDS: usize = 2 + 2 * SPI_LEN + 4 + 4 + 4 + NONCE_LEN;

fn agrees(peeked: &Peek<'_>, message: &Message) {
    assert_eq!(peeked.tunnel, message.tunnel);
    assert_eq!(peeked.kind, message.kind);
    assert_eq!(peeked.response, message.response);
    assert_eq!(peeked.from_initiator, message.from_initiator);
    assert_eq!(peeked.spi_i, message.spi_i);
    assert_eq!(peeked.spi_r, message.spi_r);
}

/// `data` read as message fields: kind and flags, the SPIs, message ID,
/// child, SPI, nonce, then the name (lossy UTF-8).
fn fields(data: &[u8]) -> Option<Message> {
    let f = data.get(..FIELDS)?;
    let word = |at: usize| u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]);
    let mut spi_i = [0; SPI_LEN];
    let mut spi_r = [0; SPI_LEN];
    spi_i.copy_from_slice(&f[2..2 + SPI_LEN]);
    spi_r.copy_from_slice(&f[2 + SPI_LEN..2 + 2 * SPI_LEN]);
    let at = 2 + 2 * SPI_LEN;
    let mut nonce = [0; NONCE_LEN];
    nonce.copy_from_slice(&f[at + 12..at + 12 + NONCE_LEN]);
    Some(Message {
        kind: match f[0] % 3 {
            0 => Kind::Init,
            1 => Kind::Rekey,
            _ => Kind::Switched,
        },
        response: f[1] & 1 != 0,
        from_initiator: f[1] & 2 != 0,
        spi_i,
        spi_r,
        message_id: word(at),
        tunnel: String::from_utf8_lossy(&data[FIELDS..]).into_owned(),
        child: word(at + 4),
        spi: word(at + 8),
        nonce,
    })
}

fuzz_target!(|data: &[u8]| {
    let peeked = peek(data);
    match &peeked {
        Ok(p) => {
            assert!(!p.tunnel.is_empty() && p.tunnel.len() <= MAX_NAME);
            assert_eq!(data.len(), FIXED + p.tunnel.len());
            assert!(data.len() <= MAX_LEN);
            assert_eq!(&data[..SPI_LEN], &p.spi_i[..]);
            assert_eq!(&data[SPI_LEN..2 * SPI_LEN], &p.spi_r[..]);
        }
        Err(MessageError::Forged) => panic!("peek does not check the ICV"),
        Err(_) => {}
    }
    let mut seen = None;
    let opened = Message::open_keyed(data, |m| {
        seen = Some(m.clone());
        KEY
    });
    assert_eq!(Message::open(data, &KEY), opened);
    match (&peeked, &opened) {
        (Err(e), _) => {
            assert_eq!(opened, Err(*e), "open and peek refuse differently");
            assert!(seen.is_none(), "the key function saw a datagram peek refuses");
        }
        (Ok(p), Err(e)) => {
            assert_eq!(*e, MessageError::Forged, "open refused what peek took");
            agrees(p, seen.as_ref().expect("the key function saw the fields"));
        }
        (Ok(p), Ok(message)) => {
            // Only a seed sealed with KEY gets here.
            agrees(p, message);
            assert_eq!(seen.as_ref(), Some(message));
            assert_eq!(Message::open(&message.seal(&KEY), &KEY).as_ref(), Ok(message));
            assert_eq!(Message::open(data, &[0x5d; 32]), Err(MessageError::Forged));
        }
    }

    let Some(message) = fields(data) else { return };
    let wire = message.seal(&KEY);
    assert!(wire.len() <= MAX_LEN);
    let name = message.tunnel.as_bytes();
    if name.is_empty() {
        assert_eq!(peek(&wire), Err(MessageError::Malformed));
        assert_eq!(Message::open(&wire, &KEY), Err(MessageError::Malformed));
        return;
    }
    let sent = &name[..name.len().min(MAX_NAME)];
    assert_eq!(wire.len(), FIXED + sent.len());
    let Ok(sent) = std::str::from_utf8(sent) else {
        // A long name cut inside a character.
        assert_eq!(peek(&wire), Err(MessageError::Malformed));
        return;
    };
    let expected = Message {
        tunnel: sent.to_owned(),
        ..message
    };
    let peeked = peek(&wire).expect("a sealed message peeks");
    agrees(&peeked, &expected);
    assert_eq!(Message::open(&wire, &KEY).as_ref(), Ok(&expected));
    let mut other_key = KEY;
    other_key[usize::from(data[0]) % KEY.len()] ^= 1 << (data[1] % 8);
    assert_eq!(Message::open(&wire, &other_key), Err(MessageError::Forged));
    let mut flipped = wire.clone();
    flipped[usize::from(data[2]) % wire.len()] ^= 1 << (data[3] % 8);
    assert!(Message::open(&flipped, &KEY).is_err(), "a flipped byte opened");
    assert!(
        Message::open(&wire[..wire.len() - 1], &KEY).is_err(),
        "a byte less opened"
    );
    let mut longer = wire.clone();
    longer.push(data[4]);
    assert!(Message::open(&longer, &KEY).is_err(), "a byte more opened");
});
