//! The decrypted-trailer parser: any bytes give a trailer whose payload
//! length fits, or an error.
#![no_main]

use dataplane::wire::EspTrailer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|plaintext: &[u8]| {
    if let Ok((trailer, payload_len)) = EspTrailer::parse(plaintext) {
        assert!(payload_len + usize::from(trailer.pad_len) + 2 == plaintext.len());
    }
});
