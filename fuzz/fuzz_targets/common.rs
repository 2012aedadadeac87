//! A site-B gateway for the fuzz targets (every proposal would do; GCM and
//! CBC cover both layouts), built from the shipped configuration.

use std::path::Path;
use std::time::Duration;

use accel::{EngineSpec, Style};
use dataplane::{Gateway, LinkLayer};
use ike_stub::Config;

pub fn gateway(config: &str, link: LinkLayer) -> Gateway {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(config);
    let config = Config::load(&path).expect("shipped config is valid");
    let engine = accel::build_engine(&EngineSpec::default()).expect("the soft engine builds");
    config
        .build_gateway(link, engine, Style::Async, Duration::ZERO)
        .expect("shipped config installs")
}
