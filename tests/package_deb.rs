//! The Debian package (scripts/package-deb.sh) built from this build's
//! binary, installed with dpkg into an empty root of its own (its
//! dependencies forced: that root has no libc6 package) and removed again:
//! the binary runs from where the package put it and accepts the
//! configurations it installed (`check-config`), the configuration
//! directory and the files with keys are owner-only and registered as
//! conffiles (kept on remove), the units are the repository's, and the
//! manual pages and completions are there. Without dpkg-deb, objdump and
//! strip the test shows as ignored (testkit `dpkg`).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use testkit::Prerequisite;

static DPKG: Prerequisite = Prerequisite::new("dpkg", || {
    testkit::tools_installed(&[
        ("dpkg-deb", "dpkg"),
        ("objdump", "binutils"),
        ("strip", "binutils"),
    ])
});

fn main() -> std::process::ExitCode {
    testkit::run([testkit::needs!(&DPKG, the_package_installs_runs_and_removes)])
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{command:?}:\n{text}");
    text
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn the_package_installs_runs_and_removes() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("espgw-deb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("root");
    for sub in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(root.join(sub)).expect("dpkg's database directories");
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").expect("an empty status file");
    let built = run(Command::new(repo.join("scripts/package-deb.sh"))
        .arg(env!("CARGO_BIN_EXE_espgw"))
        .arg(dir.join("out"))
        .env("DEB_COMPRESS", "gzip"));
    let deb = built
        .lines()
        .last()
        .expect("the package's path")
        .trim()
        .to_owned();
    assert!(deb.ends_with("_amd64.deb") || deb.ends_with(".deb"), "{built}");
    let info = run(Command::new("dpkg-deb").args(["--info", &deb]));
    assert!(
        info.contains("Package: espgw") && info.contains("Depends: libc6 (>= 2."),
        "{info}"
    );

    let dpkg = |args: &[&str]| {
        run(Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["--force-script-chrootless", "--force-depends", "--force-not-root"])
            .args(args))
    };
    dpkg(&["-i", &deb]);
    let status = dpkg(&["-s", "espgw"]);
    assert!(status.contains("Status: install ok installed"), "{status}");
    let version = run(Command::new(root.join("usr/bin/espgw")).arg("--version"));
    assert!(version.starts_with("espgw "), "{version}");

    assert_eq!(mode(&root.join("etc/espgw")), 0o700);
    for config in [
        "site-a.toml",
        "site-b.toml",
        "site-a.toml.example",
        "site-b.toml.example",
    ] {
        let path = root.join("etc/espgw").join(config);
        assert_eq!(mode(&path), 0o600, "{}: it holds keys", path.display());
        assert!(
            status.contains(&format!("/etc/espgw/{config}")),
            "a conffile: {status}"
        );
        // The installed binary accepts the installed example as it is.
        let checked = run(Command::new(root.join("usr/bin/espgw"))
            .arg("check-config")
            .arg(&path));
        assert!(!checked.trim().is_empty(), "check-config says what it checked");
    }
    for unit in ["espgw@.service", "espgw-engine.service"] {
        let installed =
            std::fs::read_to_string(root.join("lib/systemd/system").join(unit)).expect("the unit");
        let ours = std::fs::read_to_string(repo.join("packaging/systemd").join(unit)).expect("ours");
        assert_eq!(installed, ours, "{unit}");
    }
    for file in [
        "usr/share/man/man8/espgw.8.gz",
        "usr/share/man/man8/espgw-run.8.gz",
        "usr/share/bash-completion/completions/espgw",
        "usr/share/zsh/vendor-completions/_espgw",
        "usr/share/fish/vendor_completions.d/espgw.fish",
        "usr/share/doc/espgw/README.md",
        "usr/share/doc/espgw/SECURITY.md",
    ] {
        let len = std::fs::metadata(root.join(file)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "{file} is installed");
    }

    dpkg(&["-r", "espgw"]);
    assert!(!root.join("usr/bin/espgw").exists(), "the binary goes on remove");
    assert!(
        root.join("etc/espgw/site-a.toml").exists(),
        "an operator's configuration stays until purge"
    );
    dpkg(&["--purge", "espgw"]);
    assert!(
        !root.join("etc/espgw/site-a.toml").exists(),
        "purge takes the configuration"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
