//! Configuration loading: any text is a config or an error with a location
//! inside the text. A config that validates also installs into a gateway
//! (or says why not) and starts a control plane, without panicking.
#![no_main]

use std::path::Path;
use std::time::Duration;

use accel::{EngineSpec, Style};
use dataplane::LinkLayer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ike_stub::Config::parse(Path::new("fuzz.toml"), text) {
        Err(e) => {
            assert!(e.line <= text.lines().count() + 1, "{e}");
            let _ = e.to_string();
        }
        Ok(config) => {
            let engine = accel::build_engine(&EngineSpec::default()).expect("the soft engine builds");
            let _ = dataplane::Gateway::with_commands(
                config.setup(LinkLayer::Ethernet, Style::Async),
                engine,
                &config.commands(),
                Duration::ZERO,
            );
            let plane = ike_stub::ControlPlane::new(config);
            let _ = plane.tunnels(Duration::ZERO);
        }
    }
});
