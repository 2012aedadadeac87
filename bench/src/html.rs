//! The report of a sweep as one self-contained HTML page: the conditions,
//! the studies side by side, the charts as inline SVG, the full tables
//! collapsed. No script, no font, image or style sheet from anywhere: the
//! page opens from a file and asks no network for anything.
//!
//! Owns: the page's markup and style. Must not: compute an answer or draw
//! a chart (those are [`crate::studies`] and [`crate::plot`]).

use std::fmt::Write;

use crate::studies::{self, Verdict};
use crate::{plot, summary, Sweep};

/// `text` with the characters HTML gives meaning to escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = r#"
:root { color-scheme: light; }
body { margin: 0; background: #f6f6f4; color: #1d1d1d;
  font: 15px/1.45 "DejaVu Sans", "Liberation Sans", Verdana, Arial, sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 28px 40px; background: #fff; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 32px 0 10px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.lede { color: #444; margin: 0 0 12px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: 6px 10px; border-bottom: 1px solid #e6e6e6; }
th { background: #f0f0ee; font-weight: 600; }
table.conditions th { width: 9em; background: none; }
table.studies { table-layout: fixed; }
.source { color: #555; font-size: 13px; }
.verdict { display: inline-block; padding: 1px 8px; border-radius: 10px; font-weight: 600; font-size: 13px; }
.verdict.holds { background: #d8f0e0; color: #105a2c; }
.verdict.partly { background: #fbeccc; color: #6b4800; }
.verdict.differs { background: #f8d9d4; color: #7a1a0c; }
.verdict.not-measured { background: #e8e8e8; color: #444; }
.shape { color: #555; font-size: 13px; }
ul.answers li { margin: 3px 0; }
nav.charts a { margin-right: 14px; }
figure { margin: 22px 0; }
figure svg.chart { max-width: 100%; height: auto; display: block; }
svg.chart text { font-family: "DejaVu Sans", "Bitstream Vera Sans", Verdana, sans-serif; }
figcaption { color: #444; font-size: 14px; max-width: 70em; margin-top: 4px; }
details summary { cursor: pointer; font-weight: 600; }
pre { font: 12px/1.35 "DejaVu Sans Mono", "Liberation Mono", monospace; overflow-x: auto;
  background: #fafafa; border: 1px solid #e4e4e4; padding: 10px; }
footer { margin-top: 30px; color: #666; font-size: 13px; }
code { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 13px; }
"#;

fn verdict_class(v: Verdict) -> &'static str {
    match v {
        Verdict::Holds => "holds",
        Verdict::Partly => "partly",
        Verdict::Differs => "differs",
        Verdict::NotMeasured => "not-measured",
    }
}

/// The page. `command` is the command line that made the run.
pub fn page(sweep: &Sweep, command: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let date = if sweep.conditions.started_unix > 0 {
        sweep.conditions.started_text()
    } else {
        String::new()
    };
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>espgw bench: {}{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n",
        escape(&sweep.machine.cpu),
        if date.is_empty() { String::new() } else { format!(", {date}") }
    );
    let _ = writeln!(out, "<h1>espgw bench</h1>");
    let _ = writeln!(
        out,
        "<p class=\"lede\">Two gateways joined in memory, measured on this host; the <code>sec</code> engine's device is modelled and the host's work around it measured. Every figure on this page comes from this run; only the published figures are quoted.</p>"
    );

    let _ = writeln!(
        out,
        "<section id=\"conditions\">\n<h2>Conditions</h2>\n<table class=\"conditions\">"
    );
    for (label, value) in summary::conditions(sweep) {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(label),
            escape(&value)
        );
    }
    let _ = writeln!(out, "</table>\n</section>");

    let answers = studies::answers(sweep);
    let _ = writeln!(
        out,
        "<section id=\"studies\">\n<h2>The studies, side by side</h2>\n<p>One row per published figure: what the study found, this run's figure, whether this run has the study's shape ({} of {} do), and why where it does not.</p>",
        answers.iter().filter(|a| a.verdict == Verdict::Holds).count(),
        answers.len()
    );
    let _ = writeln!(
        out,
        "<table class=\"studies\">\n<colgroup><col style=\"width:26%\"><col style=\"width:11%\"><col style=\"width:25%\"><col style=\"width:13%\"><col style=\"width:25%\"></colgroup>\n<thead><tr><th>Published</th><th>Figure</th><th>This run</th><th>Shape</th><th>Why it does not hold</th></tr></thead>\n<tbody>"
    );
    for a in &answers {
        let _ = writeln!(
            out,
            "<tr data-study=\"{key}\" class=\"{class}\"><td><b>{title}</b><br><span class=\"source\">{source}: {claim}</span></td><td>{figure}</td><td>{here}</td><td><span class=\"verdict {class}\">{verdict}</span><br><span class=\"shape\">{shape}</span></td><td>{why}</td></tr>",
            key = a.study.key(),
            class = verdict_class(a.verdict),
            title = escape(a.study.title()),
            source = escape(a.study.source()),
            claim = escape(&a.study.claim()),
            figure = escape(&a.study.figure()),
            here = escape(&a.here),
            verdict = a.verdict.name(),
            shape = escape(&a.study.shape()),
            why = escape(a.why.as_deref().unwrap_or("")),
        );
    }
    let _ = writeln!(out, "</tbody>\n</table>\n</section>");

    let others = studies::other_answers(sweep);
    if !others.is_empty() {
        let _ = writeln!(
            out,
            "<section id=\"answers\">\n<h2>Other answers of this run</h2>\n<ul class=\"answers\">"
        );
        for line in others {
            let _ = writeln!(out, "<li>{}</li>", escape(&line));
        }
        let _ = writeln!(out, "</ul>\n</section>");
    }

    let charts = plot::charts(sweep);
    let _ = writeln!(
        out,
        "<section id=\"charts\">\n<h2>Charts</h2>\n<nav class=\"charts\">"
    );
    for c in &charts {
        let _ = writeln!(out, "<a href=\"#chart-{}\">{}</a>", c.stem, escape(c.stem));
    }
    let _ = writeln!(out, "</nav>");
    for c in &charts {
        let _ = writeln!(
            out,
            "<figure id=\"chart-{}\">\n{}<figcaption>{}</figcaption>\n</figure>",
            c.stem,
            plot::svg(c, false)?,
            escape(&c.caption)
        );
    }
    let _ = writeln!(out, "</section>");

    let _ = writeln!(
        out,
        "<section id=\"tables\">\n<h2>Full tables</h2>\n<details>\n<summary>Every cell, and the derived lines (what <code>espgw bench --tables</code> prints)</summary>\n<pre>{}</pre>\n</details>\n<p>The data this page was made from: <a href=\"bench.json\">bench.json</a> and <a href=\"bench.csv\">bench.csv</a>, beside it.</p>\n</section>",
        escape(&crate::report::full_tables(sweep))
    );
    let _ = writeln!(
        out,
        "<footer>Made by <code>{}</code>.</footer>\n</main>\n</body>\n</html>",
        escape(command)
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::studies::Study;

    #[test]
    fn the_page_has_a_row_per_study_and_nothing_from_a_network() {
        let sweep = crate::synthetic::sweep();
        let page = page(&sweep, "espgw bench --report x").unwrap();
        for study in Study::ALL {
            assert_eq!(
                page.matches(&format!("data-study=\"{}\"", study.key())).count(),
                1,
                "{study:?}"
            );
        }
        for banned in ["http:", "https:", "<script", "@import", "url(", "src="] {
            assert!(!page.contains(banned), "{banned}");
        }
        assert_eq!(page.matches("<svg ").count(), plot::charts(&sweep).len());
        assert!(page.contains("<details>"));
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
