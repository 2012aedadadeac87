//! Charts of a sweep as small multiples: one panel per algorithm, size or
//! engine, at most [`MAX_SERIES`] series in a chart (one shared legend,
//! one colour each), and the same drawing for every output: PNG and SVG
//! files for `--plot`, inline SVG for the report's page.
//!
//! Owns: which charts a sweep has, their layout and drawing. Must not:
//! compute an answer (the crossover comes from [`crate::studies`]) or
//! decide what a legend says about data that is not drawn: a series with
//! no point has no legend entry.
//!
//! Text is laid out and rasterised with the `ab_glyph` feature of
//! `plotters` from DejaVu Sans embedded in the binary (the `dejavu` crate),
//! so no system font library or font file is needed at build or run time.

use std::path::{Path as FsPath, PathBuf};
use std::sync::OnceLock;

use accel::{Algorithm, EngineKind, Style};
use anyhow::{anyhow, Context};
use plotters::coord::Shift;
use plotters::prelude::{
    BitMapBackend, ChartBuilder, Circle, Color, DashedLineSeries, DrawingArea, DrawingBackend, EmptyElement,
    IntoDrawingArea, IntoFont, LineSeries, PathElement, RGBColor, Rectangle, SVGBackend, Text, TextStyle,
    WHITE,
};
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use crate::scenario::Scenario;
use crate::studies::{self, Crossing};
use crate::tenants::Mode;
use crate::{Path, Sweep};

const FONT: &str = "sans-serif";
/// A chart never has more series than this (one legend for its panels).
pub const MAX_SERIES: usize = 6;

/// Distinguishable colours, one per series of a chart (Okabe–Ito, which
/// colour-blind readers tell apart, with black for the sixth).
pub const COLORS: [RGBColor; MAX_SERIES] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(40, 40, 40),
];
const GREY: RGBColor = RGBColor(110, 110, 110);

/// What the x axis is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Frame or request sizes in bytes.
    Linear,
    /// Powers of two (burst sizes), drawn evenly.
    Log2,
    /// Named groups of bars (the panel's `groups`).
    Groups,
}

/// An annotated point (the crossover), drawn as a ring with its label.
#[derive(Debug, Clone)]
pub struct Marker {
    /// Where the ring goes on the x axis, in the panel's data units.
    pub x: f64,
    /// Where the ring goes on the y axis, in the panel's data units.
    pub y: f64,
    /// Text drawn beside the ring (`crossover ...`).
    pub label: String,
}

/// One panel of a chart.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    /// The caption above the panel (an algorithm, size or engine).
    pub title: String,
    /// (legend index, points); bars: x is the group's index.
    pub series: Vec<(usize, Vec<(f64, f64)>)>,
    /// Bar group names.
    pub groups: Vec<String>,
    /// Annotated points drawn over the series.
    pub markers: Vec<Marker>,
    /// A horizontal reference (a published figure), dashed and labelled.
    pub reference: Option<(f64, String)>,
    /// The y axis's description where it is not the chart's.
    pub y_desc: Option<String>,
}

impl Panel {
    fn new(title: impl Into<String>) -> Panel {
        Panel {
            title: title.into(),
            ..Panel::default()
        }
    }

    fn push(&mut self, series: usize, points: Vec<(f64, f64)>) {
        let points: Vec<(f64, f64)> = points
            .into_iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite() && *y > 0.0)
            .collect();
        if !points.is_empty() {
            self.series.push((series, points));
        }
    }
}

/// One chart: panels side by side under one legend.
#[derive(Debug, Clone)]
pub struct Chart {
    /// File name stem (`--plot`) and the page's anchor.
    pub stem: &'static str,
    /// The heading drawn at the image's top left.
    pub title: String,
    /// What the chart shows and where its numbers come from.
    pub caption: String,
    /// Series names; series `i` is drawn in `COLORS[i]` in every panel.
    pub legend: Vec<String>,
    /// The panels in reading order, up to three to a row.
    pub panels: Vec<Panel>,
    /// How the x axis is scaled and labelled, the same in every panel.
    pub x: XAxis,
    /// The x axis's description with its unit; a bar chart may leave it
    /// empty.
    pub x_desc: String,
    /// The y axis's description with its unit, unless a panel has its own.
    pub y_desc: String,
    /// Machine and timing, at the foot of the image.
    pub note: String,
}

impl Chart {
    fn new(stem: &'static str, title: impl Into<String>, x: XAxis, x_desc: &str, y_desc: &str) -> Chart {
        Chart {
            stem,
            title: title.into(),
            caption: String::new(),
            legend: Vec::new(),
            panels: Vec::new(),
            x,
            x_desc: x_desc.into(),
            y_desc: y_desc.into(),
            note: String::new(),
        }
    }

    /// The legend index of `name`, added if new.
    fn series(&mut self, name: &str) -> usize {
        match self.legend.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                self.legend.push(name.to_owned());
                self.legend.len() - 1
            }
        }
    }

    /// Drops panels without data and legend entries no panel draws, and
    /// renumbers the rest; `None` when nothing is left.
    fn finish(mut self, note: &str) -> Option<Chart> {
        self.panels.retain(|p| !p.series.is_empty());
        let used: Vec<usize> = (0..self.legend.len())
            .filter(|i| self.panels.iter().any(|p| p.series.iter().any(|(s, _)| s == i)))
            .collect();
        for panel in &mut self.panels {
            for (s, _) in &mut panel.series {
                *s = used.iter().position(|u| u == s).unwrap_or(*s);
            }
        }
        self.legend = used.iter().map(|&i| self.legend[i].clone()).collect();
        debug_assert!(
            self.legend.len() <= MAX_SERIES,
            "{}: {:?}",
            self.stem,
            self.legend
        );
        self.legend.truncate(MAX_SERIES);
        for panel in &mut self.panels {
            panel.series.retain(|(s, _)| *s < MAX_SERIES);
        }
        self.note = note.to_owned();
        (!self.panels.is_empty()).then_some(self)
    }
}

/// Registers the embedded font as plotters' `sans-serif` family. Needed
/// before plotters draws or measures any text: with the `ab_glyph` feature
/// (which this crate turns on for every user of `plotters` in the same
/// build, criterion's HTML report included) plotters has no fonts of its own.
pub fn register_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| anyhow!("the embedded chart font is not a valid font"))
}

/// Every chart of `sweep` that has data, in the report's order.
pub fn charts(sweep: &Sweep) -> Vec<Chart> {
    let note = format!(
        "{} ({} cores); medians of {} x {} ms; espgw bench",
        sweep.machine.cpu, sweep.machine.cores, sweep.repetitions, sweep.slice_ms
    );
    [
        styles(sweep, false),
        styles(sweep, true),
        stack(sweep),
        overhead(sweep),
        boundary(sweep),
        burst(sweep),
        modes(sweep),
        speedups(sweep),
        tenants(sweep),
        bus(sweep),
    ]
    .into_iter()
    .filter_map(|c| c.finish(&note))
    .collect()
}

fn points(
    sweep: &Sweep,
    scenario: Scenario,
    path: Path,
    value: impl Fn(&crate::Cell) -> Option<f64>,
) -> Vec<(f64, f64)> {
    let mut list: Vec<(f64, f64)> = sweep
        .cells
        .iter()
        .filter(|c| c.scenario == scenario && c.path == path)
        .filter_map(|c| Some((c.frame_size as f64, value(c)?)))
        .collect();
    list.sort_by(|a, b| a.0.total_cmp(&b.0));
    list
}

/// The sec model's styles per algorithm: the period (with inline
/// esp-null, the ceiling, and the crossover marked) or the host's cost.
fn styles(sweep: &Sweep, host: bool) -> Chart {
    let mut chart = if host {
        Chart::new(
            "styles-host",
            format!(
                "Host cost per packet by submission style (sec model, {})",
                sweep.rate
            ),
            XAxis::Linear,
            "Ethernet frame (bytes)",
            "host ns per packet",
        )
    } else {
        Chart::new(
            "styles-period",
            format!("Time per packet by submission style (sec model, {})", sweep.rate),
            XAxis::Linear,
            "Ethernet frame (bytes)",
            "ns per packet, outbound",
        )
    };
    chart.caption = if host {
        "The host's own work per packet on the outbound gateway, measured, plus the host costs the model adds (doorbell, interrupt, completion misses; with polling the spin). Sync always polls, so its host cost is its whole period.".into()
    } else {
        "System time per packet on the outbound gateway: the host's measured work combined with the modelled device (sync in series, dual-pass and async overlapped). The ring marks the first size where async beats sync; inline esp-null is the ceiling no style should beat.".into()
    };
    let null = studies::null_scenario(sweep);
    for a in studies::algorithms(sweep) {
        let mut panel = style_panel(&mut chart, sweep, a, |c| match host {
            true => c.offload.as_ref().map(|o| o.host_total()),
            false => Some(c.ns()),
        });
        if panel.series.is_empty() {
            continue;
        }
        if !host {
            if let Some(null) = null {
                let i = chart.series(&format!("{null} (inline)"));
                panel.push(i, points(sweep, null, Path::Encap, |c| Some(c.ns())));
            }
            let (sync, async_) = (
                studies::sec_style(sweep, a, Style::Sync),
                studies::sec_style(sweep, a, Style::Async),
            );
            if let (Some(sync), Some(async_)) = (sync, async_) {
                if let Some(crossing @ Crossing::At { size, .. }) = studies::crossover_of(sweep, sync, async_)
                {
                    if let Some(y) = studies::out_ns(sweep, async_, size) {
                        panel.markers.push(Marker {
                            x: size as f64,
                            y,
                            label: format!("crossover {}", crossing.label()),
                        });
                    }
                }
            }
        }
        chart.panels.push(panel);
    }
    chart
}

/// Bus bytes per packet per style (dual-pass moves the data twice).
fn bus(sweep: &Sweep) -> Chart {
    let mut chart = Chart::new(
        "styles-bus",
        format!(
            "Bytes over the device bus per packet by style (sec model, {})",
            sweep.rate
        ),
        XAxis::Linear,
        "Ethernet frame (bytes)",
        "bus bytes per packet",
    );
    chart.caption = "Modelled: descriptors, keys and context, data in and data out per packet on the outbound gateway, from the engine's counters. Identical in every run.".into();
    for a in studies::algorithms(sweep) {
        let panel = style_panel(&mut chart, sweep, a, |c| {
            c.offload.as_ref().map(|o| o.modelled.bus_bytes)
        });
        chart.panels.push(panel);
    }
    chart
}

/// The panel of `algorithm` on the sec model: one series per submission
/// style (`sec/STYLE`), `value` of each outbound cell against frame size.
fn style_panel(
    chart: &mut Chart,
    sweep: &Sweep,
    algorithm: Algorithm,
    value: impl Fn(&crate::Cell) -> Option<f64>,
) -> Panel {
    let mut panel = Panel::new(algorithm.to_string());
    for st in Style::ALL {
        let Some(sc) = studies::sec_style(sweep, algorithm, st) else {
            continue;
        };
        let i = chart.series(&format!("sec/{st}"));
        panel.push(i, points(sweep, sc, Path::Encap, &value));
    }
    panel
}

/// The stack's cost: ESP null/null against plain forwarding.
fn stack(sweep: &Sweep) -> Chart {
    let mut chart = Chart::new(
        "stack",
        "The stack's cost: ESP null/null against plain forwarding",
        XAxis::Linear,
        "Ethernet frame (bytes)",
        "ns per packet, outbound",
    );
    chart.caption = format!(
        "Measured on this host (wall clock, medians): one gateway's outbound path per packet. The right panel divides ESP null/null by forwarding; the dashed line is the Freescale study's {}x (in cycles).",
        studies::STACK_RATIO
    );
    let ns = |c: &crate::Cell| Some(c.ns());
    let mut v4 = Panel::new("IPv4");
    if let Some(null) = studies::null_scenario(sweep) {
        let i = chart.series("ipv4-fwd");
        v4.push(i, points(sweep, Scenario::Ipv4Forward, Path::Encap, ns));
        let i = chart.series(&null.name());
        v4.push(i, points(sweep, null, Path::Encap, ns));
    }
    let mut v6 = Panel::new("IPv6 (6-in-6)");
    let i = chart.series("ipv6-fwd");
    v6.push(i, points(sweep, Scenario::Ipv6Forward, Path::Encap, ns));
    let i = chart.series("esp-null-ipv6");
    v6.push(i, points(sweep, Scenario::EspNull6, Path::Encap, ns));
    let mut ratio = Panel::new("ESP null/null ÷ forwarding");
    for (name, esp, fwd) in [
        (
            "ratio, IPv4",
            studies::null_scenario(sweep),
            Scenario::Ipv4Forward,
        ),
        ("ratio, IPv6", Some(Scenario::EspNull6), Scenario::Ipv6Forward),
    ] {
        let Some(esp) = esp else { continue };
        let pts: Vec<(f64, f64)> = studies::time_ratios(sweep, esp, fwd)
            .into_iter()
            .map(|(s, r)| (s as f64, r))
            .collect();
        let i = chart.series(name);
        ratio.push(i, pts);
    }
    ratio.reference = Some((
        studies::STACK_RATIO,
        format!("Freescale: {}x", studies::STACK_RATIO),
    ));
    ratio.y_desc = Some("ESP null ÷ forwarding (×)".into());
    chart.panels.extend([v4, v6, ratio]);
    chart
}

/// The ESP path (soft inline) against its primitive alone.
fn overhead(sweep: &Sweep) -> Chart {
    let mut chart = Chart::new(
        "overhead",
        "The ESP path against the crypto primitive alone (soft engine, inline)",
        XAxis::Linear,
        "Ethernet frame (bytes)",
        "ns per packet",
    );
    chart.caption = "Measured on this host: one gateway's outbound ESP path per packet, and the same transform's primitive alone over a buffer of the payload's size (the ceiling). The gap is the stack's share.".into();
    for a in studies::algorithms(sweep) {
        let esp = Scenario::Esp {
            algorithm: a,
            engine: EngineKind::Soft,
            style: Style::Async,
            knobs: sweep.knobs,
        };
        let mut panel = Panel::new(a.to_string());
        let i = chart.series("ESP outbound path");
        panel.push(i, points(sweep, esp, Path::Encap, |c| Some(c.ns())));
        let i = chart.series("primitive alone (encrypt)");
        panel.push(
            i,
            points(sweep, Scenario::RawCrypto { algorithm: a }, Path::Encrypt, |c| {
                Some(c.ns())
            }),
        );
        if panel.series.len() == 2 {
            chart.panels.push(panel);
        }
    }
    chart
}

/// The boundary's own host cost at profile none, against inline esp-null.
fn boundary(sweep: &Sweep) -> Chart {
    let mut chart = Chart::new(
        "boundary",
        "The boundary's host cost with an infinitely fast engine (profile none, async, polling)",
        XAxis::Groups,
        "",
        "host ns per packet",
    );
    chart.caption = "What crossing the look-aside boundary costs the host when the device takes no time: the host's own work, measured, and with the modelled doorbell and completion cache misses. The dashed line is inline esp-null at the same size.".into();
    let null = studies::null_scenario(sweep);
    let algorithms: Vec<_> = studies::algorithms(sweep)
        .into_iter()
        .filter(|a| sweep.is_modelled(&studies::boundary_scenario(sweep, *a)))
        .collect();
    let sizes: Vec<usize> = sweep
        .sizes()
        .into_iter()
        .filter(|&s| {
            algorithms
                .iter()
                .any(|a| studies::offload_of(sweep, studies::boundary_scenario(sweep, *a), s).is_some())
        })
        .collect();
    for size in sizes {
        let mut panel = Panel::new(format!("{size} B frames"));
        panel.groups = algorithms.iter().map(|a| a.to_string()).collect();
        let bars = |f: &dyn Fn(&crate::offload::Offload) -> f64| -> Vec<(f64, f64)> {
            algorithms
                .iter()
                .enumerate()
                .filter_map(|(g, a)| {
                    let o = studies::offload_of(sweep, studies::boundary_scenario(sweep, *a), size)?;
                    Some((g as f64, f(o)))
                })
                .collect()
        };
        let i = chart.series("host, measured");
        panel.push(i, bars(&|o| o.host_measured()));
        let i = chart.series("host, measured + modelled");
        panel.push(i, bars(&|o| o.host_total()));
        if let Some(n) = null.and_then(|n| studies::out_ns(sweep, n, size)) {
            panel.reference = Some((n, format!("inline esp-null {n:.0} ns")));
        }
        chart.panels.push(panel);
    }
    chart
}

/// The burst curve: host cost per packet against frames per call.
fn burst(sweep: &Sweep) -> Chart {
    let list = studies::bursts(sweep);
    let (alg, size) = list.first().map_or((String::new(), 0), |b| {
        (
            b.1.algorithm().map_or_else(String::new, |a| a.to_string()),
            sweep.sizes().first().copied().unwrap_or(0),
        )
    });
    let mut chart = Chart::new(
        "burst",
        format!("Host cost per packet against burst size ({alg}, {size} B, profile none, polling)"),
        XAxis::Log2,
        "frames per call (burst; at most that many descriptors per doorbell)",
        "host ns per packet",
    );
    chart.caption = "Fewer calls per packet, fewer crossings: the host's measured work, the modelled doorbell and completion costs, and their sum, per packet.".into();
    let mut panel = Panel::new(format!("{alg}, {size} B"));
    if list.len() > 1 {
        let curve = |f: &dyn Fn(&crate::offload::Offload) -> f64| -> Vec<(f64, f64)> {
            list.iter().map(|(b, _, o)| (*b as f64, f(o))).collect()
        };
        let i = chart.series("measured + modelled");
        panel.push(i, curve(&|o| o.host_total()));
        let i = chart.series("measured (host's own work)");
        panel.push(i, curve(&|o| o.host_measured()));
        let i = chart.series("modelled (doorbell, completions)");
        panel.push(i, curve(&|o| o.modelled.host_ns));
    }
    chart.panels.push(panel);
    chart
}

/// Registration and completion modes as grouped bars.
fn modes(sweep: &Sweep) -> Chart {
    let mut chart = Chart::new(
        "modes",
        format!(
            "Buffer registration and completion modes (sec model, {})",
            sweep.rate
        ),
        XAxis::Groups,
        "",
        "ns per packet, outbound",
    );
    chart.caption = format!(
        "One algorithm on sec/async: the main run ({} buffers, {} completion) beside each other buffer policy and completion mode. Host: the host's work per packet (measured + modelled); period: the system's time per packet.",
        sweep.knobs.buffers, sweep.knobs.completion
    );
    let pairs = studies::extra_pairs(sweep, |_, _| true);
    let Some(&(base, _)) = pairs.first() else {
        return chart;
    };
    let extras = pairs.iter().map(|&(_, extra)| extra);
    let label = |s: &Scenario| match s {
        Scenario::Esp { knobs, .. } if *knobs == sweep.knobs => {
            format!("{}, {} (main)", knobs.buffers, knobs.completion)
        }
        Scenario::Esp { knobs, .. } if knobs.buffers != sweep.knobs.buffers => {
            format!("{} buffers", knobs.buffers)
        }
        Scenario::Esp { knobs, .. } => format!("{} completion", knobs.completion),
        other => other.name(),
    };
    let all: Vec<Scenario> = std::iter::once(base).chain(extras).collect();
    let sizes: Vec<usize> = sweep
        .sizes()
        .into_iter()
        .filter(|&s| {
            all.iter()
                .skip(1)
                .any(|sc| studies::offload_of(sweep, *sc, s).is_some())
        })
        .collect();
    for size in sizes {
        let mut panel = Panel::new(format!(
            "{}, {size} B",
            base.algorithm().map_or_else(String::new, |a| a.to_string())
        ));
        panel.groups = vec!["host".into(), "period".into()];
        for sc in &all {
            let Some(o) = studies::offload_of(sweep, *sc, size) else {
                continue;
            };
            let Some(period) = studies::out_ns(sweep, *sc, size) else {
                continue;
            };
            let i = chart.series(&label(sc));
            panel.push(i, vec![(0.0, o.host_total()), (1.0, period)]);
        }
        chart.panels.push(panel);
    }
    chart
}

/// Engine against software per primitive, as grouped bars of speed-ups.
fn speedups(sweep: &Sweep) -> Chart {
    let mut chart = Chart::new(
        "speedup",
        "Engine against software per primitive (speed-up = software time ÷ engine time)",
        XAxis::Groups,
        "",
        "speed-up (×)",
    );
    chart.caption = "Software: this host, measured. Engine: the modelled part, one operation on an idle engine and per operation in a burst of 32 on one channel. Above the dashed line the engine is faster.".into();
    let mut payloads: Vec<usize> = sweep.speedups.iter().map(|s| s.payload).collect();
    payloads.sort_unstable();
    payloads.dedup();
    let mut primitives: Vec<&str> = Vec::new();
    for s in &sweep.speedups {
        if !primitives.contains(&s.primitive) {
            primitives.push(s.primitive);
        }
    }
    for payload in payloads {
        let mut panel = Panel::new(format!("{payload} B"));
        panel.groups = primitives.iter().map(|p| p.to_string()).collect();
        let mut by_series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for (g, p) in primitives.iter().enumerate() {
            let Some(s) = sweep
                .speedups
                .iter()
                .find(|s| s.primitive == *p && s.payload == payload)
            else {
                continue;
            };
            for (profile, idle, burst) in &s.engine_ns {
                for (what, ns) in [("idle", idle), ("burst", burst)] {
                    let name = format!("{profile}, {what}");
                    let x = if *ns > 0.0 { s.software_ns / ns } else { f64::NAN };
                    match by_series.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, pts)) => pts.push((g as f64, x)),
                        None => by_series.push((name, vec![(g as f64, x)])),
                    }
                }
            }
        }
        for (name, pts) in by_series {
            let i = chart.series(&name);
            panel.push(i, pts);
        }
        panel.reference = Some((1.0, "engine = software".into()));
        chart.panels.push(panel);
    }
    chart
}

/// The shared engine: one tenant over shm and socket beside in-process.
fn tenants(sweep: &Sweep) -> Chart {
    let mut chart = Chart::new(
        "tenants",
        "One engine shared through espgw engine serve: one tenant per transport",
        XAxis::Groups,
        "request size",
        "Mb/s",
    );
    chart.caption = "Measured on this host: requests per second × request bytes, one tenant with a window of requests in flight, beside the same engine driven in-process.".into();
    for engine in [EngineKind::Soft, EngineKind::Sec] {
        let rows: Vec<_> = sweep
            .tenants
            .iter()
            .filter(|r| r.engine == engine && r.tenants == 1)
            .collect();
        let mut sizes: Vec<usize> = rows.iter().map(|r| r.size).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut panel = Panel::new(engine.to_string());
        panel.groups = sizes.iter().map(|s| format!("{s} B")).collect();
        for mode in [Mode::InProcessAsync, Mode::InProcessSync, Mode::Shm, Mode::Socket] {
            let pts: Vec<(f64, f64)> = sizes
                .iter()
                .enumerate()
                .filter_map(|(g, s)| {
                    let r = rows.iter().find(|r| r.mode == mode && r.size == *s)?;
                    Some((g as f64, r.aggregate_mbps))
                })
                .collect();
            if !pts.is_empty() {
                let i = chart.series(mode.name());
                panel.push(i, pts);
            }
        }
        chart.panels.push(panel);
    }
    chart
}

// ---- layout and drawing ------------------------------------------------------

const MIN_WIDTH: u32 = 820;
const MAX_WIDTH: u32 = 1200;
const PANEL_HEIGHT: u32 = 300;
const Y_LABEL_AREA: u32 = 74;
const X_LABEL_AREA: u32 = 50;
const TITLE_SIZE: f64 = 19.0;
const LEGEND_SIZE: f64 = 14.0;
const LABEL_SIZE: f64 = 12.0;
const LEGEND_ROW: i32 = 24;

fn text_width(text: &str, size: f64) -> u32 {
    (FONT, size)
        .into_font()
        .box_size(text)
        .map_or(text.len() as u32 * 8, |(w, _)| w)
}

/// Where everything goes.
struct Layout {
    width: u32,
    height: u32,
    cols: usize,
    rows: usize,
    /// (legend index, x, y) of each legend entry.
    legend: Vec<(usize, i32, i32)>,
    /// Top of the panels.
    top: u32,
}

fn layout(chart: &Chart) -> Layout {
    let n = chart.panels.len().max(1);
    let mut panel_width: u32 = 360;
    if chart.x == XAxis::Groups {
        let groups = chart.panels.iter().map(|p| p.groups.len()).max().unwrap_or(1) as u32;
        let widest = chart
            .panels
            .iter()
            .flat_map(|p| p.groups.iter())
            .map(|g| text_width(g, LABEL_SIZE))
            .max()
            .unwrap_or(40);
        panel_width = panel_width.max(Y_LABEL_AREA + 40 + groups * (widest + 18).max(64));
    }
    let mut cols = match n {
        4 => 2,
        n => n.min(3),
    };
    while cols > 1 && cols as u32 * panel_width + 20 > MAX_WIDTH {
        cols -= 1;
    }
    let rows = n.div_ceil(cols);
    let title = text_width(&chart.title, TITLE_SIZE) + 40;
    let note = text_width(&chart.note, LABEL_SIZE) + 40;
    let width = (cols as u32 * panel_width + 20)
        .max(MIN_WIDTH)
        .max(title)
        .max(note);
    // The legend flows left to right under the title.
    let mut legend = Vec::new();
    let (mut x, mut y) = (20i32, 46i32);
    for (i, name) in chart.legend.iter().enumerate() {
        let w = 40 + text_width(name, LEGEND_SIZE) as i32 + 26;
        if x > 20 && x + w > width as i32 - 20 {
            x = 20;
            y += LEGEND_ROW;
        }
        legend.push((i, x, y));
        x += w;
    }
    let top = (y + LEGEND_ROW / 2 + 8) as u32;
    Layout {
        width,
        height: top + rows as u32 * PANEL_HEIGHT + 30,
        cols,
        rows,
        legend,
        top,
    }
}

/// What one drawing pass draws: the inline SVG keeps each series and
/// legend entry in a group of its own, so a reader (or a test) can tell
/// which marks belong to which entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layer {
    All,
    /// Background, titles, axes.
    Base,
    Legend(usize),
    /// (panel, series)
    Marks(usize, usize),
    /// References and markers, drawn over the marks.
    Annotations,
}

fn draw_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw chart: {e}")
}

fn text_style(size: f64, color: &'static RGBColor, pos: Pos) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(color).pos(pos)
}

/// Linear value → drawn coordinate, and back for tick labels.
#[derive(Clone, Copy)]
enum Scale {
    Linear,
    Log10,
    Log2,
}

impl Scale {
    fn to(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log10 => v.log10(),
            Scale::Log2 => v.log2(),
        }
    }

    fn from(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log10 => 10f64.powf(v),
            Scale::Log2 => 2f64.powf(v),
        }
    }
}

/// The tick label of drawn coordinate `v`: every tick on a linear axis;
/// on a log axis only 1, 2 and 5 times a power of ten (powers of two on
/// the burst axis), so the labels read as round numbers.
fn tick(scale: Scale, v: f64) -> String {
    let value = scale.from(v);
    match scale {
        Scale::Linear => short(value),
        Scale::Log2 => {
            if (v - v.round()).abs() < 0.02 {
                format!("{:.0}", value)
            } else {
                String::new()
            }
        }
        Scale::Log10 => {
            let decade = 10f64.powf(value.log10().floor());
            let m = value / decade;
            let round = [1.0, 2.0, 5.0, 10.0]
                .into_iter()
                .any(|r| (m - r).abs() / r < 0.02);
            if round {
                short((m.round() * decade * 1e6).round() / 1e6)
            } else {
                String::new()
            }
        }
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &Chart,
    lay: &Layout,
    layer: Layer,
) -> anyhow::Result<()> {
    let base = matches!(layer, Layer::All | Layer::Base);
    if base {
        root.fill(&WHITE).map_err(draw_error)?;
        root.draw(&Text::new(
            chart.title.clone(),
            (20, 12),
            TextStyle::from((FONT, TITLE_SIZE, FontStyle::Bold).into_font())
                .pos(Pos::new(HPos::Left, VPos::Top)),
        ))
        .map_err(draw_error)?;
        root.draw(&Text::new(
            chart.note.clone(),
            (20, lay.height as i32 - 10),
            text_style(LABEL_SIZE, &GREY, Pos::new(HPos::Left, VPos::Bottom)),
        ))
        .map_err(draw_error)?;
    }
    for &(i, x, y) in &lay.legend {
        if !matches!(layer, Layer::All) && layer != Layer::Legend(i) {
            continue;
        }
        let color = COLORS[i];
        root.draw(&PathElement::new(
            vec![(x, y), (x + 32, y)],
            color.stroke_width(3),
        ))
        .map_err(draw_error)?;
        root.draw(&Circle::new((x + 16, y), 4, color.filled()))
            .map_err(draw_error)?;
        root.draw(&Text::new(
            chart.legend[i].clone(),
            (x + 40, y),
            text_style(
                LEGEND_SIZE,
                &RGBColor(20, 20, 20),
                Pos::new(HPos::Left, VPos::Center),
            ),
        ))
        .map_err(draw_error)?;
    }
    let grid_area = root.margin(lay.top, 30, 10, 10);
    let cells = grid_area.split_evenly((lay.rows, lay.cols));
    let notes = matches!(layer, Layer::All | Layer::Annotations);
    for (p, (panel, area)) in chart.panels.iter().zip(cells.iter()).enumerate() {
        let wanted: Vec<usize> = match layer {
            Layer::All => (0..panel.series.len()).collect(),
            Layer::Marks(lp, s) if lp == p => panel
                .series
                .iter()
                .position(|(i, _)| *i == s)
                .into_iter()
                .collect(),
            _ => Vec::new(),
        };
        if !base && !notes && wanted.is_empty() {
            continue;
        }
        draw_panel(area, chart, panel, (base, notes), &wanted)?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    chart: &Chart,
    panel: &Panel,
    (base, notes): (bool, bool),
    wanted: &[usize],
) -> anyhow::Result<()> {
    let values = panel.series.iter().flat_map(|(_, p)| p.iter().map(|v| v.1));
    let refs = panel.reference.iter().map(|r| r.0);
    let (lo, hi) = values
        .chain(refs)
        .chain(panel.markers.iter().map(|m| m.y))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    let y_scale = if hi / lo >= 10.0 {
        Scale::Log10
    } else {
        Scale::Linear
    };
    let x_scale = match chart.x {
        XAxis::Log2 => Scale::Log2,
        _ => Scale::Linear,
    };
    let (y0, y1) = match y_scale {
        Scale::Log10 => {
            let (a, b) = (lo.log10(), hi.log10());
            (a - 0.06 * (b - a), b + 0.12 * (b - a))
        }
        _ => (0.0, hi * 1.15),
    };
    let (x0, x1) = match chart.x {
        XAxis::Groups => (-0.5, panel.groups.len().max(1) as f64 - 0.5),
        _ => {
            let xs = panel
                .series
                .iter()
                .flat_map(|(_, p)| p.iter().map(|v| x_scale.to(v.0)));
            let (a, b) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
            let pad = ((b - a) * 0.04).max(0.25);
            (a - pad, b + pad)
        }
    };
    // The other layers lay out the same caption, undrawn, so that their
    // coordinates match the base's.
    let invisible = WHITE.mix(0.0);
    let caption = TextStyle::from((FONT, 15.0, FontStyle::Bold).into_font());
    let caption = if base {
        caption.color(&RGBColor(20, 20, 20))
    } else {
        caption.color(&invisible)
    };
    let mut ctx = ChartBuilder::on(area)
        .margin(8)
        .margin_right(22)
        .caption(&panel.title, caption)
        .x_label_area_size(X_LABEL_AREA)
        .y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(draw_error)?;
    let log_note = |scale: Scale| match scale {
        Scale::Log10 => " (log scale)",
        Scale::Log2 => " (log scale)",
        Scale::Linear => "",
    };
    if base {
        let x_desc = format!("{}{}", chart.x_desc, log_note(x_scale));
        let y_desc = format!(
            "{}{}",
            panel.y_desc.as_deref().unwrap_or(&chart.y_desc),
            log_note(y_scale)
        );
        let x_fmt = |v: &f64| tick(x_scale, *v);
        let y_fmt = |v: &f64| tick(y_scale, *v);
        let log_y = matches!(y_scale, Scale::Log10);
        let mut mesh = ctx.configure_mesh();
        mesh.y_desc(y_desc)
            .y_labels(if log_y { 0 } else { 10 })
            .y_label_formatter(&y_fmt)
            .axis_desc_style((FONT, 13))
            .label_style((FONT, LABEL_SIZE))
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(222, 222, 222));
        match chart.x {
            XAxis::Groups => {
                mesh.disable_x_mesh().x_labels(0);
                if !chart.x_desc.is_empty() {
                    mesh.x_desc(x_desc);
                }
            }
            XAxis::Log2 => {
                mesh.disable_x_mesh().x_labels(0).x_desc(x_desc);
            }
            XAxis::Linear => {
                mesh.x_desc(x_desc).x_labels(8).x_label_formatter(&x_fmt);
            }
        }
        mesh.draw().map_err(draw_error)?;
        if log_y {
            // 1, 2 and 5 times each power of ten in range (only the powers
            // when the range spans many decades), with a light grid line.
            let mut ticks = Vec::new();
            let decades = (y0.floor() as i32)..=(y1.ceil() as i32);
            let steps: &[f64] = if y1 - y0 > 4.0 { &[1.0] } else { &[1.0, 2.0, 5.0] };
            for k in decades {
                for m in steps {
                    let t = (m * 10f64.powi(k)).log10();
                    if (y0..=y1).contains(&t) {
                        ticks.push(t);
                    }
                }
            }
            for t in ticks {
                grid_line(&mut ctx, [(x0, t), (x1, t)], RGBColor(228, 228, 228))?;
                let at_left = Pos::new(HPos::Right, VPos::Center);
                axis_label(&mut ctx, (x0, t), short(10f64.powf(t)), (-8, 0), at_left)?;
            }
        }
        if chart.x == XAxis::Log2 {
            // A label at every measured burst.
            let mut xs: Vec<f64> = panel
                .series
                .iter()
                .flat_map(|(_, p)| p.iter().map(|v| v.0))
                .collect();
            xs.sort_by(f64::total_cmp);
            xs.dedup();
            for x in xs {
                let t = x_scale.to(x);
                grid_line(&mut ctx, [(t, y0), (t, y1)], RGBColor(236, 236, 236))?;
                axis_label(&mut ctx, (t, y0), format!("{x:.0}"), (0, 8), BELOW)?;
            }
        }
        if chart.x == XAxis::Groups {
            for (g, name) in panel.groups.iter().enumerate() {
                axis_label(&mut ctx, (g as f64, y0), name.clone(), (0, 8), BELOW)?;
            }
        }
    }
    let n = panel.series.len().max(1) as f64;
    for &k in wanted {
        let (i, pts) = &panel.series[k];
        let color = COLORS[*i];
        if chart.x == XAxis::Groups {
            let w = 0.8 / n;
            ctx.draw_series(pts.iter().map(|&(g, v)| {
                let left = g - 0.4 + k as f64 * w;
                Rectangle::new(
                    [(left + 0.01, y0), (left + w - 0.01, y_scale.to(v))],
                    color.filled(),
                )
            }))
            .map_err(draw_error)?;
        } else {
            let drawn: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (x_scale.to(x), y_scale.to(y))).collect();
            ctx.draw_series(LineSeries::new(drawn.iter().copied(), color.stroke_width(3)))
                .map_err(draw_error)?;
            ctx.draw_series(drawn.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(draw_error)?;
        }
    }
    if notes {
        if let Some((value, label)) = &panel.reference {
            let y = y_scale.to(*value);
            ctx.draw_series(DashedLineSeries::new(
                vec![(x0, y), (x1, y)],
                7,
                5,
                GREY.stroke_width(2),
            ))
            .map_err(draw_error)?;
            boxed(
                &mut ctx,
                (x1, y),
                label,
                LABEL_SIZE,
                (-6, -4),
                Pos::new(HPos::Right, VPos::Bottom),
            )?;
        }
        for m in &panel.markers {
            let (x, y) = (x_scale.to(m.x), y_scale.to(m.y));
            let right_half = x > (x0 + x1) / 2.0;
            let near_top = y > y0 + 0.8 * (y1 - y0);
            let h = if right_half { HPos::Right } else { HPos::Left };
            let (dx, dy, v) = match (right_half, near_top) {
                (true, false) => (-6, -14, VPos::Bottom),
                (false, false) => (6, -14, VPos::Bottom),
                (true, true) => (-6, 14, VPos::Top),
                (false, true) => (6, 14, VPos::Top),
            };
            ctx.draw_series(std::iter::once(
                EmptyElement::at((x, y)) + Circle::new((0, 0), 9, RGBColor(0, 0, 0).stroke_width(2)),
            ))
            .map_err(draw_error)?;
            boxed(&mut ctx, (x, y), &m.label, 13.0, (dx, dy), Pos::new(h, v))?;
        }
    }
    Ok(())
}

/// Where a panel is drawn: linear coordinates (scaled values, see
/// [`Scale`]) on both axes.
type PanelContext<'a, DB> = plotters::chart::ChartContext<
    'a,
    DB,
    plotters::coord::cartesian::Cartesian2d<
        plotters::coord::types::RangedCoordf64,
        plotters::coord::types::RangedCoordf64,
    >,
>;

/// An axis label's anchor under the axis.
const BELOW: Pos = Pos {
    h_pos: HPos::Center,
    v_pos: VPos::Top,
};

/// A light grid line.
fn grid_line<DB: DrawingBackend>(
    ctx: &mut PanelContext<'_, DB>,
    ends: [(f64, f64); 2],
    color: RGBColor,
) -> anyhow::Result<()> {
    ctx.draw_series(LineSeries::new(ends, color.stroke_width(1)))
        .map_err(draw_error)?;
    Ok(())
}

/// A tick or group label: `text` at `(dx, dy)` pixels from `at`, anchored
/// by `pos`.
fn axis_label<DB: DrawingBackend>(
    ctx: &mut PanelContext<'_, DB>,
    at: (f64, f64),
    text: String,
    (dx, dy): (i32, i32),
    pos: Pos,
) -> anyhow::Result<()> {
    let style = text_style(LABEL_SIZE, &RGBColor(30, 30, 30), pos);
    ctx.draw_series(std::iter::once(
        EmptyElement::at(at) + Text::new(text, (dx, dy), style),
    ))
    .map_err(draw_error)?;
    Ok(())
}

/// `text` at `(dx, dy)` pixels from `at`, on a white box so that lines
/// and bars behind it do not make it unreadable.
fn boxed<DB: DrawingBackend>(
    ctx: &mut PanelContext<'_, DB>,
    at: (f64, f64),
    text: &str,
    size: f64,
    (dx, dy): (i32, i32),
    pos: Pos,
) -> anyhow::Result<()> {
    let w = text_width(text, size) as i32;
    let h = (size * 1.25) as i32;
    let (left, right) = match pos.h_pos {
        HPos::Left => (dx - 3, dx + w + 3),
        HPos::Right => (dx - w - 3, dx + 3),
        HPos::Center => (dx - w / 2 - 3, dx + w / 2 + 3),
    };
    let (top, bottom) = match pos.v_pos {
        VPos::Bottom => (dy - h, dy + 2),
        VPos::Top => (dy - 2, dy + h),
        VPos::Center => (dy - h / 2, dy + h / 2),
    };
    ctx.draw_series(std::iter::once(
        EmptyElement::at(at) + Rectangle::new([(left, top), (right, bottom)], WHITE.mix(0.85).filled()),
    ))
    .map_err(draw_error)?;
    ctx.draw_series(std::iter::once(
        EmptyElement::at(at)
            + Text::new(
                text.to_owned(),
                (dx, dy),
                TextStyle::from((FONT, size, FontStyle::Bold).into_font()).pos(pos),
            ),
    ))
    .map_err(draw_error)?;
    Ok(())
}

/// `chart` as one SVG document: the background, axes and labels in
/// `<g class="base">`, each legend entry in `<g class="legend-entry"
/// data-series="sN">` and each series' marks, per panel, in `<g
/// class="series" data-series="sN" data-panel="P">`. `standalone` adds the
/// XML namespace a file needs (a page's inline SVG needs none).
pub fn svg(chart: &Chart, standalone: bool) -> anyhow::Result<String> {
    register_font()?;
    let lay = layout(chart);
    let render = |layer: Layer| -> anyhow::Result<String> {
        let mut buf = String::new();
        {
            let root = SVGBackend::with_string(&mut buf, (lay.width, lay.height)).into_drawing_area();
            draw(&root, chart, &lay, layer)?;
            root.present().map_err(draw_error)?;
        }
        // Keep the drawing, not plotters' own <svg> wrapper.
        let body = buf.split_once('\n').map_or("", |(_, rest)| rest);
        Ok(body.trim_end().trim_end_matches("</svg>").to_owned())
    };
    let mut out = format!(
        "<svg {}class=\"chart\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-labelledby=\"{stem}-title\">\n<title id=\"{stem}-title\">{}</title>\n",
        if standalone {
            "xmlns=\"http://www.w3.org/2000/svg\" "
        } else {
            ""
        },
        crate::html::escape(&chart.title),
        w = lay.width,
        h = lay.height,
        stem = chart.stem,
    );
    out += &format!("<g class=\"base\">\n{}\n</g>\n", render(Layer::Base)?);
    for (i, name) in chart.legend.iter().enumerate() {
        out += &format!(
            "<g class=\"legend-entry\" data-series=\"s{i}\" data-name=\"{}\">\n{}\n</g>\n",
            crate::html::escape(name),
            render(Layer::Legend(i))?
        );
    }
    for (p, panel) in chart.panels.iter().enumerate() {
        for (i, _) in &panel.series {
            out += &format!(
                "<g class=\"series\" data-series=\"s{i}\" data-panel=\"{p}\">\n{}\n</g>\n",
                render(Layer::Marks(p, *i))?
            );
        }
    }
    out += &format!(
        "<g class=\"annotations\">\n{}\n</g>\n",
        render(Layer::Annotations)?
    );
    out += "</svg>\n";
    Ok(out)
}

/// `chart` as a PNG file.
pub fn png(chart: &Chart, path: &FsPath) -> anyhow::Result<()> {
    register_font()?;
    let lay = layout(chart);
    let root = BitMapBackend::new(path, (lay.width, lay.height)).into_drawing_area();
    draw(&root, chart, &lay, Layer::All)?;
    root.present().map_err(draw_error)?;
    Ok(())
}

/// Writes the charts of `sweep` into `dir` (which must exist) as SVG and
/// PNG, and returns the paths written. The y axis of a panel is
/// logarithmic when its values span 10x or more, and says so.
pub fn write_charts(sweep: &Sweep, dir: &FsPath) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for chart in charts(sweep) {
        let svg_path = dir.join(format!("{}.svg", chart.stem));
        std::fs::write(&svg_path, svg(&chart, true)?)
            .with_context(|| format!("cannot write {}", svg_path.display()))?;
        written.push(svg_path);
        let png_path = dir.join(format!("{}.png", chart.stem));
        png(&chart, &png_path)?;
        written.push(png_path);
    }
    Ok(written)
}

/// At most three significant digits after the point, no exponent, no
/// trailing zeros: 0.0123, 0.1, 1.23, 10, 12346.
fn short(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{v:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chart of a full sweep: at most six series, a legend entry only
    /// for a series with points, distinct colours, panels with data.
    #[test]
    fn every_chart_is_small_multiples_with_a_legend_entry_per_drawn_series() {
        let sweep = crate::synthetic::sweep();
        let charts = charts(&sweep);
        let stems: Vec<&str> = charts.iter().map(|c| c.stem).collect();
        assert_eq!(
            stems,
            [
                "styles-period",
                "styles-host",
                "stack",
                "overhead",
                "boundary",
                "burst",
                "modes",
                "speedup",
                "tenants",
                "styles-bus"
            ]
        );
        for c in &charts {
            assert!(
                !c.legend.is_empty() && c.legend.len() <= MAX_SERIES,
                "{}: {:?}",
                c.stem,
                c.legend
            );
            for (i, name) in c.legend.iter().enumerate() {
                assert!(
                    c.panels
                        .iter()
                        .any(|p| p.series.iter().any(|(s, pts)| *s == i && !pts.is_empty())),
                    "{}: legend entry {name} has no data",
                    c.stem
                );
            }
            for p in &c.panels {
                assert!(p.series.len() <= MAX_SERIES, "{}: {}", c.stem, p.title);
                if c.x == XAxis::Groups {
                    assert!(!p.groups.is_empty());
                    assert!(p
                        .series
                        .iter()
                        .all(|(_, pts)| pts.iter().all(|(g, _)| (*g as usize) < p.groups.len())));
                }
            }
        }
        // The crossover is a labelled marker, not a series.
        let period = &charts[0];
        assert!(period.legend.iter().all(|n| !n.contains("crossover")));
        let labels: Vec<&str> = period
            .panels
            .iter()
            .flat_map(|p| p.markers.iter().map(|m| m.label.as_str()))
            .collect();
        assert_eq!(
            labels,
            ["crossover 256–512 B", "crossover ≤ 64 B", "crossover 64–128 B"]
        );
    }

    #[test]
    fn writes_svg_and_png_for_each_chart() {
        let sweep = crate::synthetic::sweep();
        let dir = std::env::temp_dir().join(format!("espgw-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let written = write_charts(&sweep, &dir).unwrap();
        assert_eq!(written.len(), 2 * charts(&sweep).len());
        let svg = std::fs::read_to_string(dir.join("styles-period.svg")).unwrap();
        assert!(
            svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            "{}",
            &svg[..80]
        );
        assert!(svg.contains("data-name=\"sec/async\""));
        assert!(svg.contains("crossover 256–512 B"));
        let png = std::fs::read(dir.join("styles-period.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn log_ticks_are_round_numbers() {
        assert_eq!(tick(Scale::Log10, 2.0), "100");
        assert_eq!(tick(Scale::Log10, 2.0f64.log10() + 2.0), "200");
        assert_eq!(tick(Scale::Log10, 2.1), "");
        assert_eq!(tick(Scale::Log2, 3.0), "8");
        assert_eq!(tick(Scale::Log2, 2.5), "");
    }

    #[test]
    fn short_keeps_three_significant_digits() {
        assert_eq!(short(0.0123456), "0.0123");
        assert_eq!(short(1.23456), "1.23");
        assert_eq!(short(123.456), "123");
        assert_eq!(short(12345.6), "12346");
        assert_eq!(short(10.0), "10");
        assert_eq!(short(0.1), "0.1");
    }
}
