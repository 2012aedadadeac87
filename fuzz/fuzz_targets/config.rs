//! Configuration loading: any text is a config or an error with a location
//! inside the text.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = ike_stub::Config::parse(Path::new("fuzz.toml"), text) {
        assert!(e.line <= text.lines().count() + 1, "{e}");
        let _ = e.to_string();
    }
});
