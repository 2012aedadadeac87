//! `espgw bench --report DIR` of a short run, rendered by headless
//! Chromium (Debian's `chromium`; `.ci/run` installs it): the page renders
//! to a PNG from a file with every request to a network refused, makes no
//! request of its own, has a studies row per published figure, and every
//! chart draws data for each legend entry (at most six per chart). And the
//! default terminal output fits a screen. Without Chromium the rendering
//! test shows as ignored (testkit `chromium`).
//!
//! "No request of its own" is checked twice: the page holds no URL with a
//! scheme, no script, no `src=` and no `url(` at all, and Chromium's net log
//! of the rendering has no URL request that the page initiated (Chromium's
//! own background requests carry the initiator `not an origin`; a page
//! opened from a file initiates with the origin `null` under a `file://`
//! network isolation key). A control page with one external image checks
//! that the net-log check sees such a request.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use bench::studies::Study;
use testkit::Prerequisite;

static CHROMIUM: Prerequisite = Prerequisite::new("chromium", || {
    let found = Command::new("sh").args(["-c", "command -v chromium"]).output();
    match found {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("no `chromium` (apt-get install chromium)".into()),
    }
});

fn main() -> ExitCode {
    testkit::run([
        testkit::test!(the_default_output_fits_a_screen),
        testkit::needs!(
            &CHROMIUM,
            the_report_renders_offline_with_data_for_every_legend_entry
        ),
    ])
}

/// A short sweep: every kind of row, three sizes, tiny slices.
const SHORT: [&str; 8] = [
    "--sizes",
    "64,256,1518",
    "--slice-ms",
    "3",
    "--repetitions",
    "1",
    "--packets",
    "64",
];

fn espgw_bench(extra: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_espgw"))
        .arg("bench")
        .args(SHORT)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("espgw bench runs");
    assert!(
        out.status.success(),
        "espgw bench failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("espgw-bench-report-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

fn the_default_output_fits_a_screen() {
    let out = espgw_bench(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() <= 60, "{} lines:\n{stdout}", lines.len());
    for study in Study::ALL {
        let rows = lines
            .iter()
            .filter(|l| l.contains(&format!("{}: ", study.title())))
            .count();
        assert_eq!(rows, 1, "{study:?} has {rows} lines:\n{stdout}");
    }
    assert!(stdout.contains("--report DIR"), "{stdout}");
    // --tables prints the full tables, as before the summary existed.
    let tables = espgw_bench(&["--tables", "--scenarios", "ipv4-fwd,esp-null"]);
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(
        tables.contains("scenario") && tables.contains("Derived from this run"),
        "{tables}"
    );
}

fn the_report_renders_offline_with_data_for_every_legend_entry() {
    let dir = scratch("run");
    let report = dir.join("report");
    let out = espgw_bench(&["--report", report.to_str().expect("a UTF-8 path")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().count() <= 60, "{stdout}");
    let index = std::fs::canonicalize(report.join("index.html")).expect("index.html");
    assert!(
        stdout.contains(&format!("Report: {}", index.display())),
        "{stdout}"
    );
    for data in ["bench.json", "bench.csv"] {
        assert!(report.join(data).is_file(), "no {data} beside the page");
    }
    let page = std::fs::read_to_string(&index).expect("index.html");

    // Nothing in the page could reach a network.
    for banned in [
        "://", "<script", "src=", "url(", "@import", "<link", "<iframe", "<object",
    ] {
        assert!(!page.contains(banned), "the page contains `{banned}`");
    }
    // A row per published figure.
    for study in Study::ALL {
        assert_eq!(
            page.matches(&format!("<tr data-study=\"{}\"", study.key()))
                .count(),
            1,
            "no studies row for {study:?}"
        );
    }
    let charts = check_charts(&page);
    assert!(charts >= 8, "only {charts} charts");

    // Chromium renders it from the file with every host unresolvable.
    let shot = dir.join("report.png");
    let netlog = dir.join("netlog.json");
    let rendered = chromium(&index, &shot, &netlog, &dir.join("profile"));
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot ({e}); chromium said:\n{}",
            String::from_utf8_lossy(&rendered.stderr)
        )
    });
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        png.len() > 20_000,
        "a {} byte screenshot is too small for the page",
        png.len()
    );
    let requests = page_requests(&netlog);
    assert!(requests.is_empty(), "the page requested {requests:?}");

    // The control: a page that loads one image from a network is seen.
    let control = dir.join("control.html");
    std::fs::write(
        &control,
        "<!doctype html><html><body><img src=\"http://espgw-control.invalid/x.png\"></body></html>",
    )
    .expect("the control page");
    let control_log = dir.join("control-netlog.json");
    chromium(
        &control,
        &dir.join("control.png"),
        &control_log,
        &dir.join("control-profile"),
    );
    let seen = page_requests(&control_log);
    assert!(
        seen.iter().any(|u| u.contains("espgw-control.invalid")),
        "the net-log check missed the control page's request: {seen:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Renders `page` to `png` in headless Chromium with a fresh profile,
/// every host name unresolvable and the network log in `netlog`.
fn chromium(page: &Path, png: &Path, netlog: &Path, profile: &Path) -> Output {
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,2400",
            "--host-resolver-rules=MAP * ~NOTFOUND",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--log-net-log={}", netlog.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().expect("chromium's status").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish rendering {} in 120 s", page.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().expect("chromium's output")
}

/// The URLs the page itself asked for, from Chromium's net log: URL
/// requests not initiated by the browser, to anything but the file itself.
fn page_requests(netlog: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(netlog).expect("chromium's net log");
    let log: serde_json::Value = serde_json::from_str(&text).expect("the net log is JSON");
    let start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
        .as_u64()
        .expect("the net log names URL_REQUEST_START_JOB");
    let events = log["events"].as_array().expect("net log events");
    assert!(!events.is_empty(), "an empty net log");
    events
        .iter()
        .filter(|e| e["type"].as_u64() == Some(start_job))
        .filter_map(|e| {
            let params = &e["params"];
            let url = params["url"].as_str()?;
            let local = ["file:", "data:", "about:", "chrome:", "blob:"]
                .iter()
                .any(|s| url.starts_with(s));
            let browser = params["initiator"].as_str() == Some("not an origin")
                && !params["network_isolation_key"]
                    .as_str()
                    .unwrap_or("")
                    .contains("file://");
            (!local && !browser).then(|| url.to_owned())
        })
        .collect()
}

/// Checks every inline SVG chart of `page` and returns how many there are:
/// at most six legend entries, each with a group of drawn marks (a line
/// through points, dots or bars) in its own colour, and no drawn series
/// without a legend entry; at most six series in a panel.
fn check_charts(page: &str) -> usize {
    let mut count = 0;
    let mut rest = page;
    while let Some(start) = rest.find("<svg ") {
        let end = rest[start..].find("</svg>").expect("a closed <svg>") + start + "</svg>".len();
        check_chart(&rest[start..end]);
        count += 1;
        rest = &rest[end..];
    }
    count
}

fn check_chart(svg: &str) {
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("an SVG that does not parse: {e}"));
    let title = doc
        .descendants()
        .find(|n| n.has_tag_name("title"))
        .and_then(|n| n.text())
        .unwrap_or("?")
        .to_owned();
    let groups = |class: &str| -> Vec<roxmltree::Node<'_, '_>> {
        doc.descendants()
            .filter(|n| n.has_tag_name("g") && n.attribute("class") == Some(class))
            .collect()
    };
    let legend = groups("legend-entry");
    let series = groups("series");
    assert!(!legend.is_empty(), "{title}: no legend");
    assert!(legend.len() <= 6, "{title}: {} legend entries", legend.len());
    let mut colours = Vec::new();
    for entry in &legend {
        let id = entry.attribute("data-series").expect("data-series");
        let name = entry.attribute("data-name").unwrap_or(id);
        let swatch = entry
            .descendants()
            .find(|n| n.has_tag_name("polyline"))
            .and_then(|n| n.attribute("stroke"))
            .unwrap_or_else(|| panic!("{title}: legend entry {name} has no line"));
        let text = entry.descendants().filter_map(|n| n.text()).collect::<String>();
        assert!(text.contains(name), "{title}: legend entry {name} has no label");
        assert!(
            !colours.contains(&swatch),
            "{title}: two legend entries in {swatch}"
        );
        colours.push(swatch);
        let drawn: Vec<_> = series
            .iter()
            .filter(|g| g.attribute("data-series") == Some(id))
            .collect();
        assert!(!drawn.is_empty(), "{title}: legend entry {name} has no series");
        let points: usize = drawn.iter().map(|g| marks(g, swatch)).sum();
        assert!(
            points > 0,
            "{title}: legend entry {name} draws nothing in {swatch}"
        );
    }
    let ids: Vec<&str> = legend.iter().filter_map(|e| e.attribute("data-series")).collect();
    let mut panels: Vec<(&str, Vec<&str>)> = Vec::new();
    for g in &series {
        let id = g.attribute("data-series").expect("data-series");
        assert!(
            ids.contains(&id),
            "{title}: series {id} is drawn without a legend entry"
        );
        let panel = g.attribute("data-panel").expect("data-panel");
        match panels.iter_mut().find(|(p, _)| *p == panel) {
            Some((_, list)) if !list.contains(&id) => list.push(id),
            Some(_) => {}
            None => panels.push((panel, vec![id])),
        }
    }
    for (panel, list) in panels {
        assert!(
            list.len() <= 6,
            "{title}: panel {panel} has {} series",
            list.len()
        );
    }
}

/// Marks with points drawn in `colour` inside `group`: points of lines
/// (two or more), dots, bars of nonzero size.
fn marks(group: &roxmltree::Node<'_, '_>, colour: &str) -> usize {
    let mut n = 0;
    for node in group.descendants().filter(|n| n.is_element()) {
        let painted = node.attribute("stroke") == Some(colour) || node.attribute("fill") == Some(colour);
        if !painted {
            continue;
        }
        let size = |a: &str| {
            node.attribute(a)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        match node.tag_name().name() {
            "polyline" => {
                let points = node.attribute("points").unwrap_or("").split_whitespace().count();
                if points >= 2 {
                    n += points;
                }
            }
            "circle" if size("r") > 0.0 => n += 1,
            "rect" if size("width") > 0.0 && size("height") > 0.0 => n += 1,
            _ => {}
        }
    }
    n
}
