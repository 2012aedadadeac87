//! Which SAs the XFRM mirror lets the sequence ledger forget: those a
//! rekey replaced (a new SA of their reqid and direction, with other
//! keys, was installed when the kernel deleted them), never one deleted
//! with no successor (a teardown, or a manual key that may be added
//! again). Run over strongSwan's capture of a rekey and a teardown, and
//! over the built teardown.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use dataplane::command::SaCommand;
use ike_stub::xfrm::fixtures::{parse_fixture, Step};
use ike_stub::xfrm::{MirrorSettings, XfrmMirror};

/// What a fixture's run removed and what it listed as superseded, in
/// order.
fn run(name: &str, local: IpAddr) -> (Vec<String>, Vec<String>, XfrmMirror) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/xfrm")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut mirror = XfrmMirror::new(MirrorSettings {
        local_addresses: vec![local],
        durable_sequences: true,
    });
    let (mut removed, mut superseded, mut commands) = (Vec::new(), Vec::new(), Vec::new());
    for step in parse_fixture(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        match step {
            Step::Dump(kind) => mirror.begin_dump(kind),
            Step::Datagram(bytes) => mirror.handle_datagram(Duration::from_secs(1), &bytes),
        }
        mirror.take_superseded(&mut superseded);
        mirror.take_commands(&mut commands);
    }
    for command in commands {
        if let SaCommand::RemoveSa(name) = command {
            removed.push(name);
        }
    }
    (removed, superseded, mirror)
}

/// charon's rekey deletes the old outbound and inbound SAs after
/// installing their successors: both are superseded. The teardown that
/// follows deletes the new ones with nothing after them: neither is.
#[test]
fn a_rekeyed_sa_is_superseded_and_a_torn_down_one_is_not() {
    let (removed, superseded, mirror) = run(
        "captured-strongswan-gcm-rekey.nl",
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
    );
    assert_eq!(
        removed.len(),
        4,
        "two by the rekey, two by the teardown: {removed:?}"
    );
    assert_eq!(superseded, removed[..2].to_vec(), "removed in order: {removed:?}");
    assert_eq!(mirror.counters().sas_superseded, 2);
    assert_eq!(mirror.counters().sas_removed, 4);
}

/// A teardown alone (policies, then SAs, no successor): nothing is
/// forgotten.
#[test]
fn a_teardown_supersedes_nothing() {
    let (removed, superseded, mirror) = run("built-delete.nl", IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
    assert!(!removed.is_empty(), "the fixture removes its SAs");
    assert!(superseded.is_empty(), "{superseded:?}");
    assert_eq!(mirror.counters().sas_superseded, 0);
}
