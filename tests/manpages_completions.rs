//! What `espgw manpages` and `espgw completions` write works where an
//! operator uses it: `man -l` renders every page (its NAME and SYNOPSIS
//! there, no warning from groff), and each completion script loads in its
//! own shell and completes espgw's commands: bash (`complete -p espgw`,
//! then the completion function asked for `espgw ch`), zsh (the script
//! defines `_espgw` for `compdef`), fish (`complete -C 'espgw '` lists the
//! commands). Without man-db, zsh or fish the test shows as ignored
//! (testkit `man-shells`).

use std::path::Path;
use std::process::Command;

use testkit::Prerequisite;

static MAN_SHELLS: Prerequisite = Prerequisite::new("man-shells", || {
    testkit::tools_installed(&[
        ("man", "man-db"),
        ("bash", "bash"),
        ("zsh", "zsh"),
        ("fish", "fish"),
    ])
});

fn main() -> std::process::ExitCode {
    testkit::run([
        testkit::needs!(&MAN_SHELLS, every_manual_page_renders_with_man),
        testkit::needs!(&MAN_SHELLS, every_completion_script_loads_in_its_shell),
    ])
}

/// Runs `command`; its standard output and error, or a panic saying what
/// failed.
fn run(command: &mut Command) -> (String, String) {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{command:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

fn espgw() -> Command {
    Command::new(env!("CARGO_BIN_EXE_espgw"))
}

fn every_manual_page_renders_with_man() {
    let dir = std::env::temp_dir().join(format!("espgw-manl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    run(espgw().arg("manpages").arg(&dir));
    let mut pages: Vec<_> = std::fs::read_dir(&dir)
        .expect("the pages' directory")
        .map(|e| e.expect("an entry").path())
        .collect();
    pages.sort();
    assert!(pages.len() >= 10, "a page per command: {pages:?}");
    for page in &pages {
        let name = page.file_stem().and_then(|n| n.to_str()).expect("a page name");
        // Plain text at a fixed width, warnings on: what `man` shows, with
        // anything groff could not lay out said on stderr.
        let (text, warnings) = run(Command::new("man")
            .args(["-l", "-Tutf8", "--warnings=all"])
            .arg(page)
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "0"));
        let text = strip_overstrike(&text);
        assert!(
            text.contains("NAME") && text.contains(name) && text.contains("SYNOPSIS"),
            "{}: no NAME, {name} or SYNOPSIS in:\n{text}",
            page.display()
        );
        assert!(
            warnings.trim().is_empty(),
            "{}: groff warns:\n{warnings}",
            page.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `man`'s output with its bold and underline (`c\bc`, `_\bc`) taken out.
fn strip_overstrike(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\u{8}' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out
}

fn completion(shell: &str, dir: &Path) -> std::path::PathBuf {
    let (script, _) = run(espgw().args(["completions", shell]));
    let path = dir.join(format!("espgw.{shell}"));
    std::fs::write(&path, script).expect("the script written");
    path
}

fn every_completion_script_loads_in_its_shell() {
    let dir = std::env::temp_dir().join(format!("espgw-compl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");

    // bash: registered for espgw, and asked as the shell asks it for
    // `espgw ch<TAB>`, it offers check-config.
    let bash = completion("bash", &dir);
    let (out, _) = run(Command::new("bash").arg("-c").arg(format!(
        "set -e; source '{}'; complete -p espgw; \
         COMP_WORDS=(espgw ch); COMP_CWORD=1; COMP_LINE='espgw ch'; COMP_POINT=8; \
         fn=$(complete -p espgw | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p'); \"$fn\" espgw ch espgw; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        bash.display()
    )));
    assert!(
        out.contains("-F _espgw espgw"),
        "bash registers its function for espgw: {out}"
    );
    assert!(
        out.lines().any(|l| l == "check-config"),
        "bash offers check-config for `espgw ch`: {out}"
    );

    // zsh: the script loads under compinit and defines the completion
    // function compdef names.
    let zsh = completion("zsh", &dir);
    let (out, _) = run(Command::new("zsh").args(["-f", "-c"]).arg(format!(
        "autoload -U compinit && compinit -u -d '{}' && source '{}' && whence -w _espgw",
        dir.join("zcompdump").display(),
        zsh.display()
    )));
    assert!(out.contains("_espgw: function"), "zsh defines _espgw: {out}");

    // fish: the commands come back as completions of `espgw `.
    let fish = completion("fish", &dir);
    let (out, _) = run(Command::new("fish")
        .args(["--no-config", "-c"])
        .arg(format!("source '{}'; complete -C 'espgw '", fish.display())));
    for command in ["run", "bench", "check-config", "reload"] {
        assert!(
            out.lines().any(|l| l.split('\t').next() == Some(command)),
            "fish completes `espgw ` with {command}: {out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
