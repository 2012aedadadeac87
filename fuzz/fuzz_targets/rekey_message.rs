//! The rekey message codec (`ike_stub::message`). Any bytes: `peek_tunnel`
//! and `Message::open` refuse them or decode them without panicking; what
//! `peek_tunnel` returns is a name of 1 to 64 bytes; what `open` accepts
//! (only seeds sealed with the key) seals again to a message that opens to
//! the same fields.
//! Then the same bytes read as message fields, sealed with the key, must
//! open to the same message (every name of 1 to 64 bytes travels).
#![no_main]

use ike_stub::message::{peek_tunnel, Kind, Message, MessageError, MAX_LEN, MAX_NAME};
use ike_stub::prf::NONCE_LEN;
use libfuzzer_sys::fuzz_target;

const KEY: [u8; 32] = [0x5c; 32];

fuzz_target!(|data: &[u8]| {
    match peek_tunnel(data) {
        Ok(name) => {
            assert!(!name.is_empty() && name.len() <= MAX_NAME);
            assert!(data.len() <= MAX_LEN);
        }
        Err(MessageError::Forged) => panic!("peek_tunnel does not check the ICV"),
        Err(_) => {}
    }
    if let Ok(message) = Message::open(data, &KEY) {
        // Only a seed sealed with KEY gets here: it reads back the same way.
        assert_eq!(peek_tunnel(data), Ok(message.tunnel.as_str()));
        assert_eq!(Message::open(&message.seal(&KEY), &KEY), Ok(message));
    }

    // Fields: kind, flags, message ID, generation, SPI, nonce byte, name.
    if data.len() < 15 {
        return;
    }
    let word = |at: usize| u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    let name = String::from_utf8_lossy(&data[15..]).into_owned();
    let message = Message {
        kind: if data[0] & 1 == 0 {
            Kind::Rekey
        } else {
            Kind::Switched
        },
        response: data[1] & 1 != 0,
        from_initiator: data[1] & 2 != 0,
        message_id: word(2),
        tunnel: name.clone(),
        generation: word(6),
        spi: word(10),
        nonce: [data[14]; NONCE_LEN],
    };
    let wire = message.seal(&KEY);
    assert!(wire.len() <= MAX_LEN);
    let opened = Message::open(&wire, &KEY);
    if !name.is_empty() && name.len() <= MAX_NAME {
        assert_eq!(peek_tunnel(&wire), Ok(name.as_str()));
        assert_eq!(opened, Ok(message.clone()));
        let mut other_key = KEY;
        other_key[0] ^= 1;
        assert_eq!(Message::open(&wire, &other_key), Err(MessageError::Forged));
    }
});
