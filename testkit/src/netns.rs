//! Network namespaces and veth pairs for the tests that build a topology
//! of their own (root, iproute2): what every such test did by hand.
//! Owns nothing beyond the `ip` commands it runs; the topology's names are
//! the caller's, so that tests may run beside each other.

use std::process::{Command, Stdio};

/// Runs `ip ARGS`, failing the test if it fails.
pub fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().is_ok_and(|s| s.success());
    assert!(ok, "ip {}", args.join(" "));
}

/// Deletes `namespaces` (those that exist; what is in them goes too).
pub fn remove(namespaces: &[&str]) {
    for ns in namespaces {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
}

/// Makes `namespaces` afresh (a leftover of an earlier run removed first),
/// each with its loopback up.
pub fn create(namespaces: &[&str]) {
    remove(namespaces);
    for ns in namespaces {
        ip(&["netns", "add", ns]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
}

/// A veth pair from `left` in `left_ns` to `right` in `right_ns`, both up.
pub fn veth(left: &str, left_ns: &str, right: &str, right_ns: &str) {
    ip(&[
        "link", "add", left, "netns", left_ns, "type", "veth", "peer", "name", right, "netns", right_ns,
    ]);
    ip(&["-n", left_ns, "link", "set", left, "up"]);
    ip(&["-n", right_ns, "link", "set", right, "up"]);
}
