//! The terminal summary of a sweep: the conditions, one line per derived
//! answer, where the report went. Fits a screen (at most [`MAX_LINES`]);
//! `--tables` prints the full tables instead.
//!
//! Owns: the summary's text and the run's conditions as label/value pairs
//! (the HTML report shows the same pairs). Must not: compute an answer;
//! those come from [`crate::studies`].

use std::fmt::Write;
use std::path::Path as FsPath;

use crate::scenario::Scenario;
use crate::studies::{self, Verdict};
use crate::Sweep;

/// The summary never prints more lines than this.
pub const MAX_LINES: usize = 60;

/// The run's conditions as (label, value) pairs: machine, CPU, clock
/// source, load before and after, engine, profiles, slices and repetitions.
pub fn conditions(sweep: &Sweep) -> Vec<(&'static str, String)> {
    let c = &sweep.conditions;
    let m = &sweep.machine;
    let mut machine = if c.hostname.is_empty() {
        "this host".to_owned()
    } else {
        c.hostname.clone()
    };
    if !c.kernel.is_empty() {
        machine += &format!(", Linux {}", c.kernel);
    }
    if c.virtualised {
        machine += ", a virtual machine";
    }
    let clock = if c.clocksource.is_empty() {
        "unknown clock source".to_owned()
    } else {
        format!("clock source {}", c.clocksource)
    };
    let cycles = match &m.no_cycle_counter {
        None => "cycles from the CPU's cycle counter (dataplane thread)".to_owned(),
        Some(why) => format!(
            "cycles estimated as time × {} (no hardware cycle counter: {why})",
            m.mhz
                .map_or_else(|| "an unknown clock".into(), |f| format!("{f:.0} MHz"))
        ),
    };
    let mut profiles: Vec<&str> = Vec::new();
    for s in sweep.scenarios() {
        if let Scenario::Esp {
            engine: accel::EngineKind::Sec,
            knobs,
            ..
        } = s
        {
            if !profiles.contains(&knobs.profile) {
                profiles.push(knobs.profile);
            }
        }
    }
    let sizes = sweep.sizes();
    let size_text = match (sizes.first(), sizes.last()) {
        (Some(a), Some(b)) if a != b => format!("frames {a}–{b} B ({} sizes)", sizes.len()),
        (Some(a), _) => format!("frames of {a} B"),
        _ => "no frames".into(),
    };
    let mut list = vec![
        ("Machine", machine),
        ("CPU", format!("{} ({} cores)", m.cpu, m.cores)),
        ("Clock", format!("{clock}; {cycles}")),
        (
            "Load average",
            format!(
                "{} before, {} after (1, 5, 15 min); the run took {:.0} s",
                crate::report::Conditions::load_text(c.load_before),
                crate::report::Conditions::load_text(c.load_after),
                c.seconds
            ),
        ),
        ("Engine", sweep.engine.clone()),
        (
            "Profiles",
            if profiles.is_empty() {
                "no sec model cells".to_owned()
            } else {
                format!("sec model: {}", profiles.join(", "))
            },
        ),
        (
            "Slices",
            format!(
                "{} cells, {size_text}; medians of {} × {} ms after a warm-up (sec model: {} × {} packets)",
                sweep.cells.len(),
                sweep.repetitions,
                sweep.slice_ms,
                sweep.repetitions,
                sweep.packets
            ),
        ),
    ];
    if c.started_unix > 0 {
        list.push(("Started", c.started_text()));
    }
    list
}

/// The summary: conditions, one line per derived answer, the report's
/// place. `index` is the report's page, if one was written.
pub fn summary(sweep: &Sweep, index: Option<&FsPath>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "espgw bench");
    for (label, value) in conditions(sweep) {
        let _ = writeln!(out, "  {label:<13}{value}");
    }
    let answers = studies::answers(sweep);
    let _ = writeln!(
        out,
        "\nThe studies beside this run ({} of {} shapes hold; [study's figure]):",
        answers.iter().filter(|a| a.verdict == Verdict::Holds).count(),
        answers.len()
    );
    for a in &answers {
        let _ = writeln!(
            out,
            "  {:<13}{}: {} [{}]",
            a.verdict.name(),
            a.study.title(),
            a.here,
            a.study.figure()
        );
    }
    let others = studies::other_answers(sweep);
    if !others.is_empty() {
        let _ = writeln!(out, "\nOther answers of this run:");
        for line in others {
            let _ = writeln!(out, "  {line}");
        }
    }
    let _ = writeln!(out);
    match index {
        Some(page) => {
            let _ = writeln!(
                out,
                "Report: {} (open it in a browser: file://{}); why a shape differs is there.",
                page.display(),
                page.display()
            );
        }
        None => {
            let _ = writeln!(
                out,
                "No report written: --report DIR writes one page with these answers, why a shape differs, and the charts."
            );
        }
    }
    let _ = writeln!(
        out,
        "--tables prints the full tables and derived lines instead of this summary."
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::studies::Study;

    /// The summary of a fixed synthetic result, line for line. To accept a
    /// deliberate change: `GOLDEN_UPDATE=1 cargo test -p bench summary`.
    #[test]
    fn summary_of_a_fixed_result_matches_the_golden_file() {
        let sweep = crate::synthetic::sweep();
        let text = summary(&sweep, Some(FsPath::new("/tmp/espgw-report/index.html")));
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/summary.golden");
        if std::env::var_os("GOLDEN_UPDATE").is_some() {
            std::fs::write(&golden, &text).unwrap();
        }
        let want = std::fs::read_to_string(&golden).expect("bench/testdata/summary.golden");
        assert_eq!(text, want, "the summary changed; GOLDEN_UPDATE=1 accepts it");

        // Its shape: it fits a screen, every published figure has exactly
        // one line, every other answer one line, and the report's place.
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() <= MAX_LINES, "{} lines:\n{text}", lines.len());
        for study in Study::ALL {
            let rows: Vec<&&str> = lines
                .iter()
                .filter(|l| l.contains(&format!("{}: ", study.title())))
                .collect();
            assert_eq!(rows.len(), 1, "{study:?}: {rows:?}");
            assert!(rows[0].ends_with(&format!("[{}]", study.figure())), "{}", rows[0]);
        }
        let others = studies::other_answers(&sweep);
        assert_eq!(others.len(), 4, "{others:?}");
        for line in &others {
            assert_eq!(lines.iter().filter(|l| l.trim() == line).count(), 1, "{line}");
        }
        let conditions = conditions(&sweep).len();
        assert_eq!(
            lines.len(),
            1 + conditions + 2 + Study::ALL.len() + 2 + others.len() + 3,
            "{text}"
        );
        assert!(text.contains("Report: /tmp/espgw-report/index.html"));
        for label in [
            "Machine",
            "CPU",
            "Clock",
            "Load average",
            "Engine",
            "Profiles",
            "Slices",
        ] {
            assert!(lines.iter().any(|l| l.trim_start().starts_with(label)), "{label}");
        }
    }

    /// Every published figure is measured by the full synthetic sweep, and
    /// the verdicts follow the figures (the synthetic run is built so that
    /// some shapes hold and some do not).
    #[test]
    fn every_study_has_an_answer_with_a_reason_where_it_differs() {
        let sweep = crate::synthetic::sweep();
        let answers = studies::answers(&sweep);
        assert_eq!(answers.len(), Study::ALL.len());
        for a in &answers {
            assert_ne!(a.verdict, Verdict::NotMeasured, "{a:?}");
            assert_eq!(a.why.is_some(), a.verdict != Verdict::Holds, "{a:?}");
        }
        let verdict = |s: Study| answers.iter().find(|a| a.study == s).unwrap().verdict;
        assert_eq!(verdict(Study::Stack), Verdict::Holds);
        assert_eq!(verdict(Study::Crossover), Verdict::Partly);
        assert_eq!(verdict(Study::SpeedupAes), Verdict::Differs);
        assert_eq!(verdict(Study::Speedup3des), Verdict::Holds);
        // Why the crossover differs comes from the model's structure.
        let why = answers
            .iter()
            .find(|a| a.study == Study::Crossover)
            .and_then(|a| a.why.clone())
            .unwrap_or_default();
        assert_eq!(
            why,
            "aes128gcm16: sync takes 1 descriptor and waits for no interrupt, so async's 1 interrupt per packet keeps it behind up to 256 B; \
             aes128-sha1: sync takes 2 descriptors per packet to async's 1, and the extra setup outweighs async's 1 interrupt already at 64 B"
        );
        // Without the cells, a study says what to run.
        let mut empty = crate::synthetic::sweep();
        empty.cells.clear();
        empty.speedups.clear();
        empty.tenants.clear();
        for a in studies::answers(&empty) {
            assert_eq!(a.verdict, Verdict::NotMeasured, "{a:?}");
            assert!(a.why.as_deref().is_some_and(|w| w.starts_with("not in this run")));
        }
    }
}
