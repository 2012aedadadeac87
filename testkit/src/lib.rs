//! Test binaries whose prerequisites (a kernel feature, a tool, root) may be
//! missing on the machine that runs them.
//!
//! A test that cannot run must not pass: where its [`Prerequisite`] is
//! missing it shows as `ignored (needs NAME: why)` on its own line and in
//! the `N ignored` count of the summary, never as `ok` with the reason in
//! captured output. Under `CI=true` it fails instead, unless the environment
//! variable [`SKIPS_VAR`] (`ESPGW_SKIPS`, set by `.ci/run`) names the
//! prerequisite and says why skipping it there is acceptable, one skip per
//! line:
//!
//! ```text
//! ESPGW_SKIPS="afalg: the CI host's kernel has no AF_ALG; the linux-peer VM step runs those tests"
//! ```
//!
//! To see what such a test would do on a machine without the prerequisite,
//! run it with `CI=true`: it fails with the missing prerequisite's reason.
//!
//! The binaries are built with `harness = false` on libtest-mimic, so they
//! take libtest's usual arguments (a filter, `--exact`, `--test-threads`,
//! `--list`, `--include-ignored`) and print the same `test NAME ... ok` and
//! `test result:` lines.

#![warn(missing_docs, unreachable_pub)]

pub mod memscan;
pub mod netns;

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// The probe of a test that builds network namespaces or devices: root
/// (`why_root` says what needs it) and each `(tool, Debian package)` on the
/// PATH; the error names what is missing and what to install.
pub fn root_and_tools(why_root: &str, tools: &[(&str, &str)]) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!("not running as root, which {why_root} need"));
    }
    tools_installed(tools)
}

/// The probe of a test that runs other programs: each `(tool, Debian
/// package)` on the PATH; the error names what is missing and what to
/// install.
pub fn tools_installed(tools: &[(&str, &str)]) -> Result<(), String> {
    for (tool, package) in tools {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Err(format!("no `{tool}` (apt-get install {package})"));
        }
    }
    Ok(())
}

/// The probe of a test that adds XFRM policies in a namespace of its own:
/// root, `ip`, and a kernel with XFRM netlink (`CONFIG_XFRM_USER`).
pub fn xfrm_netlink() -> Result<(), String> {
    root_and_tools("network namespaces and XFRM policies", &[("ip", "iproute2")])?;
    let listed = std::process::Command::new("ip")
        .args(["xfrm", "policy", "count"])
        .output()
        .map_err(|e| format!("cannot run `ip xfrm policy count`: {e}"))?;
    if !listed.status.success() {
        return Err(format!(
            "`ip xfrm policy count` failed (a kernel without XFRM netlink, CONFIG_XFRM_USER): {}",
            String::from_utf8_lossy(&listed.stderr).trim()
        ));
    }
    Ok(())
}

/// The environment variable that names the skips CI accepts.
pub const SKIPS_VAR: &str = "ESPGW_SKIPS";

/// Something a test needs that a machine may lack. Probed at most once per
/// test binary, when the first test that needs it runs.
pub struct Prerequisite {
    name: &'static str,
    probe: fn() -> Result<(), String>,
    found: OnceLock<Result<(), String>>,
}

impl Prerequisite {
    /// `name` is what `ESPGW_SKIPS` calls it (letters, digits, `-`);
    /// `probe` says why it is missing, in a line that names the fix.
    pub const fn new(name: &'static str, probe: fn() -> Result<(), String>) -> Self {
        Prerequisite {
            name,
            probe,
            found: OnceLock::new(),
        }
    }

    /// What `ESPGW_SKIPS` and the `ignored (needs NAME: ...)` line call it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// `Err(why)` when the prerequisite is missing on this machine.
    pub fn check(&self) -> Result<(), String> {
        self.found.get_or_init(self.probe).clone()
    }
}

/// One test of a `harness = false` test binary.
pub struct Test {
    name: &'static str,
    needs: Option<&'static Prerequisite>,
    body: fn(),
}

impl Test {
    /// A test that runs everywhere.
    pub fn new(name: &'static str, body: fn()) -> Test {
        Test {
            name,
            needs: None,
            body,
        }
    }

    /// A test that runs only where `prerequisite` is present.
    pub fn needs(prerequisite: &'static Prerequisite, name: &'static str, body: fn()) -> Test {
        Test {
            name,
            needs: Some(prerequisite),
            body,
        }
    }

    fn trial(self, env: Arc<Env>) -> Trial {
        let Test { name, needs, body } = self;
        let Some(prerequisite) = needs else {
            return Trial::test(name, move || {
                body();
                Ok(())
            });
        };
        Trial::ignorable_test(name, move || {
            match decide(prerequisite.name, prerequisite.check(), env.ci, &env.skips) {
                Decision::Run => {
                    body();
                    Ok(Completion::Completed)
                }
                Decision::Ignore(reason) => Ok(Completion::ignored_with(reason)),
                Decision::Fail(reason) => Err(Failed::from(reason)),
            }
        })
    }
}

/// `test!(f)`: the [`Test`] named after the function `f`, run everywhere.
#[macro_export]
macro_rules! test {
    ($f:ident) => {
        $crate::Test::new(stringify!($f), $f)
    };
}

/// `needs!(&PREREQUISITE, f)`: the [`Test`] named after the function `f`,
/// run only where the prerequisite is present.
#[macro_export]
macro_rules! needs {
    ($prerequisite:expr, $f:ident) => {
        $crate::Test::needs($prerequisite, stringify!($f), $f)
    };
}

/// Runs `tests` as libtest would, with the command line's arguments; the
/// test binary's `main` returns this.
pub fn run(tests: impl IntoIterator<Item = Test>) -> ExitCode {
    let args = Arguments::from_args();
    let env = Arc::new(Env::from_process());
    let trials = tests.into_iter().map(|t| t.trial(Arc::clone(&env))).collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// What the process environment says about skipping.
struct Env {
    ci: bool,
    skips: Result<Skips, SkipsError>,
}

impl Env {
    fn from_process() -> Env {
        Env {
            ci: std::env::var("CI").is_ok_and(|v| v == "true"),
            skips: Skips::parse(&std::env::var(SKIPS_VAR).unwrap_or_default()),
        }
    }
}

/// What becomes of a test that needs a prerequisite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The prerequisite is present: the test runs.
    Run,
    /// Shown as `ignored (reason)`.
    Ignore(String),
    /// Shown as a failure with this message.
    Fail(String),
}

/// The rule: present, the test runs; missing, it is ignored, except under
/// `CI=true`, where it fails unless `skips` names the prerequisite. A
/// malformed `ESPGW_SKIPS` fails every test with a prerequisite, so a typo
/// cannot pass anywhere.
pub fn decide(
    prerequisite: &str,
    probe: Result<(), String>,
    ci: bool,
    skips: &Result<Skips, SkipsError>,
) -> Decision {
    let skips = match skips {
        Ok(skips) => skips,
        Err(e) => return Decision::Fail(e.to_string()),
    };
    let Err(missing) = probe else {
        return Decision::Run;
    };
    match skips.reason(prerequisite) {
        Some(why) => Decision::Ignore(format!(
            "needs {prerequisite}: {missing}; skip named in {SKIPS_VAR}: {why}"
        )),
        None if ci => Decision::Fail(format!(
            "needs {prerequisite}: {missing}. Under CI=true a test that cannot run fails: \
             provide {prerequisite}, or name the skip and why in .ci/run's \
             {SKIPS_VAR} (a line `{prerequisite}: why`)"
        )),
        None => Decision::Ignore(format!("needs {prerequisite}: {missing}")),
    }
}

/// The skips `ESPGW_SKIPS` names, each with its reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skips(Vec<(String, String)>);

impl Skips {
    /// One skip per line, `NAME: why`; blank lines are allowed.
    pub fn parse(text: &str) -> Result<Skips, SkipsError> {
        let mut skips: Vec<(String, String)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let Some((name, why)) = line.split_once(':') else {
                return Err(SkipsError::Malformed {
                    line: line_no,
                    text: line.to_string(),
                });
            };
            let (name, why) = (name.trim(), why.trim());
            let valid_name = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !valid_name {
                return Err(SkipsError::Malformed {
                    line: line_no,
                    text: line.to_string(),
                });
            }
            if why.is_empty() {
                return Err(SkipsError::NoReason {
                    line: line_no,
                    name: name.to_string(),
                });
            }
            if skips.iter().any(|(n, _)| n == name) {
                return Err(SkipsError::Duplicate {
                    line: line_no,
                    name: name.to_string(),
                });
            }
            skips.push((name.to_string(), why.to_string()));
        }
        Ok(Skips(skips))
    }

    /// Why skipping `name` is acceptable, if it is named.
    pub fn reason(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, why)| why.as_str())
    }
}

/// A malformed `ESPGW_SKIPS`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkipsError {
    /// A line that is not `NAME: why`.
    #[error(
        "{SKIPS_VAR} line {line}: `{text}` is not `NAME: why` (NAME in lowercase letters, digits and `-`)"
    )]
    Malformed {
        /// The line's number, from 1.
        line: usize,
        /// The line as written.
        text: String,
    },
    /// A skip without its reason.
    #[error(
        "{SKIPS_VAR} line {line}: the skip of `{name}` gives no reason; \
         write `{name}: why it cannot run here and where it does run`"
    )]
    NoReason {
        /// The line's number, from 1.
        line: usize,
        /// The prerequisite it names.
        name: String,
    },
    /// The same skip twice.
    #[error("{SKIPS_VAR} line {line}: `{name}` is named twice; keep one line with one reason")]
    Duplicate {
        /// The number of the second line naming it, from 1.
        line: usize,
        /// The prerequisite named twice.
        name: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skips(text: &str) -> Result<Skips, SkipsError> {
        Skips::parse(text)
    }

    #[test]
    fn parses_one_skip_per_line_with_its_reason() {
        let s =
            skips("\n afalg: no AF_ALG here; the VM runs it \nlinux-peer: no VM: tools absent\n").unwrap();
        assert_eq!(s.reason("afalg"), Some("no AF_ALG here; the VM runs it"));
        // Only the first colon separates: the reason may contain more.
        assert_eq!(s.reason("linux-peer"), Some("no VM: tools absent"));
        assert_eq!(s.reason("scapy"), None);
        assert_eq!(skips("").unwrap(), Skips::default());
    }

    #[test]
    fn refuses_skips_without_a_name_or_a_reason() {
        assert_eq!(
            skips("afalg: ok\njust text"),
            Err(SkipsError::Malformed {
                line: 2,
                text: "just text".into()
            })
        );
        assert!(matches!(
            skips("AF_ALG: why"),
            Err(SkipsError::Malformed { line: 1, .. })
        ));
        assert!(matches!(
            skips(": why"),
            Err(SkipsError::Malformed { line: 1, .. })
        ));
        let e = skips("scapy:   ").unwrap_err();
        assert_eq!(
            e,
            SkipsError::NoReason {
                line: 1,
                name: "scapy".into()
            }
        );
        assert!(e.to_string().contains("`scapy: why"), "{e}");
        assert!(matches!(
            skips("tun: a\ntun: b"),
            Err(SkipsError::Duplicate { line: 2, .. })
        ));
    }

    #[test]
    fn a_present_prerequisite_runs_everywhere() {
        for ci in [false, true] {
            assert_eq!(decide("afalg", Ok(()), ci, &skips("")), Decision::Run);
            assert_eq!(decide("afalg", Ok(()), ci, &skips("afalg: x")), Decision::Run);
        }
    }

    #[test]
    fn a_missing_prerequisite_is_ignored_with_its_reason_outside_ci() {
        let d = decide("scapy", Err("pip install scapy".into()), false, &skips(""));
        assert_eq!(d, Decision::Ignore("needs scapy: pip install scapy".into()));
    }

    #[test]
    fn under_ci_a_missing_prerequisite_fails_unless_named() {
        let missing = || Err::<(), _>("no AF_ALG in this kernel".to_string());
        let Decision::Fail(why) = decide("afalg", missing(), true, &skips("scapy: other")) else {
            panic!("must fail")
        };
        assert!(
            why.contains("no AF_ALG in this kernel") && why.contains("ESPGW_SKIPS"),
            "{why}"
        );
        assert!(why.contains("`afalg: why`"), "{why}");
        let named = decide("afalg", missing(), true, &skips("afalg: the VM runs it"));
        assert_eq!(
            named,
            Decision::Ignore(
                "needs afalg: no AF_ALG in this kernel; skip named in ESPGW_SKIPS: the VM runs it".into()
            )
        );
    }

    #[test]
    fn a_malformed_skip_list_fails_every_test_with_a_prerequisite() {
        let bad = skips("afalg");
        for (probe, ci) in [
            (Ok(()), false),
            (Err("x".to_string()), false),
            (Err("x".to_string()), true),
        ] {
            let Decision::Fail(why) = decide("afalg", probe, ci, &bad) else {
                panic!("must fail")
            };
            assert!(why.starts_with("ESPGW_SKIPS line 1"), "{why}");
        }
    }

    #[test]
    fn a_prerequisite_is_probed_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static PROBES: AtomicUsize = AtomicUsize::new(0);
        static P: Prerequisite = Prerequisite::new("thing", || {
            PROBES.fetch_add(1, Ordering::SeqCst);
            Err("absent".into())
        });
        assert_eq!(P.check(), Err("absent".into()));
        assert_eq!(P.check(), Err("absent".into()));
        assert_eq!(PROBES.load(Ordering::SeqCst), 1);
        assert_eq!(P.name(), "thing");
    }
}
