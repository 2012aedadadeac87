//! The systemd units under packaging/systemd, checked by systemd itself:
//! `systemd-analyze verify` finds nothing wrong with them (with this
//! build's binary in place of /usr/bin/espgw, which verify requires to
//! exist), and `systemd-analyze security` rates each no worse than
//! [`EXPOSURE_AT_MOST`] (0 is locked down, 10 fully exposed); the figures
//! are printed. Without `systemd-analyze` (Debian's `systemd` package) the
//! test shows as ignored (testkit `systemd`).

use std::path::Path;
use std::process::Command;

use testkit::Prerequisite;

static SYSTEMD_ANALYZE: Prerequisite = Prerequisite::new("systemd", || {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        Ok(())
    } else {
        Err("systemd-analyze is not installed (Debian package `systemd`)".into())
    }
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(
        &SYSTEMD_ANALYZE,
        the_units_verify_and_their_exposure_is_low
    )])
}

/// The exposure level `systemd-analyze security` may give a unit at most:
/// "OK" in its words is below 5; a network gateway that must open raw
/// sockets cannot reach the 1.x of a daemon without network access.
const EXPOSURE_AT_MOST: f64 = 3.5;

const UNITS: [&str; 2] = ["espgw@.service", "espgw-engine.service"];

fn the_units_verify_and_their_exposure_is_low() {
    let dir = std::env::temp_dir().join(format!("espgw-units-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("a fresh directory");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd");
    for unit in UNITS {
        let text = std::fs::read_to_string(source.join(unit)).expect("the unit");
        let text = text.replace("/usr/bin/espgw", env!("CARGO_BIN_EXE_espgw"));
        std::fs::write(dir.join(unit), &text).expect("a copy");
        if unit.ends_with("@.service") {
            // An instance, as `systemctl start espgw@site-a` makes.
            std::fs::write(dir.join(unit.replace('@', "@site-a")), &text).expect("an instance");
        }
    }
    let checked = ["espgw@site-a.service", "espgw-engine.service"];
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(checked.map(|u| dir.join(u)))
        .output()
        .expect("systemd-analyze runs");
    let said =
        String::from_utf8_lossy(&verify.stderr).into_owned() + &String::from_utf8_lossy(&verify.stdout);
    // Lines about the unit files themselves (verify also reports on units
    // of the host's own that it loads on the way).
    let ours: Vec<&str> = said.lines().filter(|l| l.contains("espgw")).collect();
    assert!(
        verify.status.success() && ours.is_empty(),
        "systemd-analyze verify:\n{said}"
    );
    for unit in checked {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(dir.join(unit))
            .output()
            .expect("systemd-analyze runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let level = text
            .lines()
            .find_map(|l| {
                l.split_once("Overall exposure level for ")?
                    .1
                    .split_once(": ")?
                    .1
                    .split_whitespace()
                    .next()?
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or_else(|| {
                panic!(
                    "no exposure level for {unit}:\n{text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        println!("{unit}: exposure {level} (at most {EXPOSURE_AT_MOST})");
        assert!(level <= EXPOSURE_AT_MOST, "{unit}: exposure {level}\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
