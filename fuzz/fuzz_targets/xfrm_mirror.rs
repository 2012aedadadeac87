//! The `xfrm` keying source's translator (`ike_stub::xfrm`): any sequence
//! of dumps and netlink datagrams (`fixtures::decode_steps`' form; the
//! seeds are the recorded fixtures of `ike-stub/testdata/xfrm/`).
//!
//! Nothing panics; every command the mirror issues applies to a gateway
//! without an error (it never names a policy it did not insert, installs
//! an inbound SA without selectors, or an SA the gateway refuses); and
//! what the mirror reports matches the gateway: its installed SAs are in
//! the SAD, its policies in the SPD, a held policy discards, and a
//! protect policy points at an SA that exists.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use ike_stub::xfrm::fixtures::{decode_steps, Step};
use ike_stub::xfrm::{MirrorSettings, XfrmMirror};
use ike_stub::Config;
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
[[interface]]
name = "inside"
device = "in0"
address = "10.1.0.1/16"
[[interface]]
name = "outside"
device = "out0"
address = "192.0.2.1/24"
address6 = "2001:db8::1/64"
"#;

fuzz_target!(|data: &[u8]| {
    let config = Config::parse(Path::new("xfrm.toml"), CONFIG).expect("the fixed configuration");
    let engine = accel::build_engine(&accel::EngineSpec::default()).expect("the soft engine");
    let now = Duration::from_secs(1);
    let mut gateway = dataplane::Gateway::with_commands(
        config.setup(dataplane::LinkLayer::Ethernet, accel::Style::Async),
        engine,
        &config.commands(),
        now,
    )
    .expect("a gateway");
    let mut mirror = XfrmMirror::new(MirrorSettings {
        local_addresses: vec![
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        ],
        durable_sequences: data.first().is_some_and(|b| b & 0x80 != 0),
    });
    let mut commands = Vec::new();
    for step in decode_steps(data) {
        match step {
            Step::Dump(kind) => mirror.begin_dump(kind),
            Step::Datagram(d) => mirror.handle_datagram(now, &d),
        }
        mirror.take_commands(&mut commands);
        for command in commands.drain(..) {
            if let Err(e) = gateway.apply(&command, now) {
                panic!("the gateway refused {command:?}: {e}");
            }
        }
    }
    // A dump left open is reconciled at its end; here, now.
    mirror.flush();
    mirror.take_commands(&mut commands);
    for command in commands.drain(..) {
        if let Err(e) = gateway.apply(&command, now) {
            panic!("the gateway refused {command:?}: {e}");
        }
    }
    for sa in mirror.sas() {
        let there = gateway.sad().find(&sa.name).is_some();
        assert_eq!(there, sa.state == "installed", "{sa:?}");
    }
    let counters = mirror.counters();
    assert_eq!(counters.sas_mirrored as usize, gateway.sad().len());
    assert_eq!(counters.policies_mirrored as usize, gateway.spd().len());
    for p in mirror.policies() {
        let installed = gateway.spd().get(&p.name).expect("a mirrored policy is in the SPD");
        match (p.action.strip_prefix("protect "), installed.action) {
            (Some(sa), spd_sad::Action::Protect(id)) => {
                assert_eq!(gateway.sad().find(sa), Some(id), "{p:?}");
            }
            (None, spd_sad::Action::Discard) => assert!(p.action == "discard"),
            (None, spd_sad::Action::Bypass) => assert!(p.action == "bypass"),
            (_, action) => panic!("{p:?} is {action:?} in the SPD"),
        }
        if p.held {
            assert_eq!(installed.action, spd_sad::Action::Discard);
        }
    }
});
