//! Shared helpers for the tests of the `espgw` binary: scratch and state
//! directories, and (re-exported) the in-memory gateway helpers and packet
//! builder of the library tests (`lib-tests/tests/common`), whose keys and
//! addresses these tests share.
#![allow(dead_code)]

use std::path::Path;

#[path = "../../lib-tests/tests/common/mod.rs"]
mod gateways;
// Not every test of the binary builds packets or gateways.
#[allow(unused_imports)]
pub use gateways::*;

/// A test's scratch directory, removed with everything in it when the
/// test is done with it (a failing test's stays for a look).
pub struct Scratch(std::path::PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A state directory of its own for one `espgw run` or `espgw pcap`
/// (where SAs with static keys keep their sequence numbers): `DIR/NAME`,
/// removed first, so that each run starts as a first one.
pub fn fresh_state_dir(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let _ = std::fs::remove_dir_all(&path);
    path
}

impl Scratch {
    /// `$TMPDIR/PREFIX-PID-NAME`, made afresh.
    pub fn new(prefix: &str, name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}
