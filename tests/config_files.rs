//! Configuration files that hold keys: one another user could write (its
//! group or everyone may, or it belongs to another user) is refused, by
//! `Config::load` and so by every command that reads one, with a message
//! that names the file and the fix; one others can read is warned about;
//! both judged by the file that was read, not by what its path names
//! afterwards. The owner case needs root (to give the file away) and shows
//! as ignored without it (testkit `root`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ike_stub::Config;
use testkit::Prerequisite;

static ROOT: Prerequisite = Prerequisite::new("root", || {
    testkit::root_and_tools("giving a file to another user", &[])
});

fn main() -> std::process::ExitCode {
    testkit::run([
        testkit::test!(a_key_file_others_can_write_is_refused),
        testkit::test!(a_keyless_file_others_can_write_is_read),
        testkit::test!(the_readable_warning_is_about_the_file_that_was_read),
        testkit::needs!(
            &ROOT,
            a_key_file_of_another_user_is_refused_unless_it_is_run_as_that_user
        ),
    ])
}

const NOBODY: u32 = 65534;

/// The shipped site-a file: a tunnel with static keys.
fn keyed() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/site-a.toml"))
        .expect("the shipped config")
}

/// A private scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("espgw-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("scratch dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        Scratch(dir)
    }

    /// `text` written at `name` with `mode`.
    fn file(&self, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn check_config(path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_espgw"))
        .arg("check-config")
        .arg(path)
        .output()
        .expect("espgw runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn a_key_file_others_can_write_is_refused() {
    let scratch = Scratch::new("cfg-writable");
    for (mode, who) in [
        (0o620, "its group"),
        (0o602, "every user"),
        (0o666, "its group and every user"),
    ] {
        let path = scratch.file("keys.toml", &keyed(), mode);
        let err = Config::load(&path).expect_err("refused").to_string();
        let fix = format!("chmod 600 {}", path.display());
        assert!(
            err.starts_with(&path.display().to_string())
                && err.contains(&format!("holds keys and can be written by {who} (mode {mode:o})"))
                && err.contains(&fix),
            "{err}"
        );
        let (ok, stderr) = check_config(&path);
        assert!(!ok && stderr.contains(&fix), "check-config: {stderr}");
    }
    // Owner-only, or readable by others (warned about below): taken.
    for mode in [0o600, 0o400, 0o644] {
        let path = scratch.file("keys.toml", &keyed(), mode);
        Config::load(&path).unwrap_or_else(|e| panic!("mode {mode:o}: {e}"));
    }
}

fn a_keyless_file_others_can_write_is_read() {
    let scratch = Scratch::new("cfg-keyless");
    // site-a without its tunnel: interfaces, routes and policies only.
    let text = keyed();
    let keyless: String = text
        .split("[[tunnel]]")
        .next()
        .map(|head| head.to_owned() + &text[text.find("# The gateways' own traffic").expect("policies")..])
        .expect("a head");
    let path = scratch.file("keyless.toml", &keyless, 0o666);
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}\n{keyless}"));
    assert!(config.tunnels.is_empty() && config.exposed_keys_warning().is_none());
}

fn the_readable_warning_is_about_the_file_that_was_read() {
    let scratch = Scratch::new("cfg-readable");
    let path = scratch.file("keys.toml", &keyed(), 0o644);
    let config = Config::load(&path).expect("taken, with a warning");
    // The path changes after the read: the warning is about what was read.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let warning = config.exposed_keys_warning().expect("a warning");
    assert!(
        warning.contains("can be read by other users (mode 644)") && warning.contains("chmod 600"),
        "{warning}"
    );
    let (ok, stderr) = check_config(&scratch.file("keys.toml", &keyed(), 0o640));
    assert!(
        ok && stderr.contains("can be read by other users (mode 640)"),
        "{stderr}"
    );
    let (ok, stderr) = check_config(&scratch.file("keys.toml", &keyed(), 0o600));
    assert!(ok && !stderr.contains("warning"), "{stderr}");
    // Parsed from text, there is no file to judge.
    let parsed = Config::parse(&path, &keyed()).expect("valid");
    assert!(parsed.exposed_keys_warning().is_none());
}

fn a_key_file_of_another_user_is_refused_unless_it_is_run_as_that_user() {
    let scratch = Scratch::new("cfg-owner");
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let path = scratch.file("keys.toml", &keyed(), 0o600);
    std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).expect("chown");
    let err = Config::load(&path).expect_err("refused").to_string();
    assert!(
        err.contains(&format!("holds keys and belongs to uid {NOBODY}"))
            && err.contains(&format!("chown root {}", path.display())),
        "{err}"
    );
    let (ok, stderr) = check_config(&path);
    assert!(!ok && stderr.contains("belongs to uid 65534"), "{stderr}");
    // `espgw run --user nobody` reads it at every reload: trusted.
    Config::load_trusting(&path, Some(NOBODY)).expect("nobody's own file");
    // Root's file, owner-only, is trusted by everyone who can read it.
    std::os::unix::fs::chown(&path, Some(0), Some(0)).expect("chown");
    Config::load_trusting(&path, Some(NOBODY)).expect("root's file");
}
