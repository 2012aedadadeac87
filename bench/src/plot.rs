//! Charts of a sweep: SVG always, and PNG from the same drawing code.
//!
//! Text is laid out and rasterised with the `ab_glyph` feature of
//! `plotters` from DejaVu Sans embedded in the binary (the `dejavu` crate),
//! so no system font library or font file is needed at build or run time.

use std::path::{Path as FsPath, PathBuf};
use std::sync::OnceLock;

use anyhow::anyhow;
use plotters::chart::ChartContext;
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::{
    BitMapBackend, ChartBuilder, Circle, Color, DrawingArea, DrawingBackend, IntoDrawingArea, IntoFont,
    IntoLogRange, LineSeries, PathElement, RGBColor, SVGBackend, Text, TextStyle, WHITE,
};
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::scenario::Scenario;
use crate::{Path, Sweep};

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 620;
const LEGEND_WIDTH: u32 = 250;
const FONT: &str = "sans-serif";

/// Distinguishable line colours (Tableau 10, then lighter Tableau 20 tones).
const COLORS: [RGBColor; 16] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(255, 152, 150),
    RGBColor(197, 176, 213),
    RGBColor(196, 156, 148),
];

/// One line of a chart: (frame size, value) points sorted by size.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

struct Chart {
    stem: &'static str,
    title: String,
    y_desc: &'static str,
    series: Vec<Series>,
}

/// Writes the charts of `sweep` into `dir` (which must exist) as SVG and
/// PNG, and returns the paths written:
///
/// * `throughput`: Gbit/s of the round trip per scenario (raw-crypto rows:
///   the encrypt cells) against frame size;
/// * `cycles`: estimated CPU cycles per packet of the round trip (only when
///   the machine's clock is known);
/// * `encap-ns`: nanoseconds per packet of encapsulation alone;
/// * `moved-bytes`: bytes moved per packet by the outbound gateway (frame in,
///   engine bus bytes, frame out; `ipv4-fwd` is 2 × frame bytes).
///
/// The y axis is logarithmic when a chart's values span 10x or more.
pub fn write_charts(sweep: &Sweep, dir: &FsPath) -> anyhow::Result<Vec<PathBuf>> {
    register_font()?;
    let mut charts = vec![Chart {
        stem: "throughput",
        title: "Throughput vs frame size (round trip; raw rows: encrypt)".into(),
        y_desc: "Gbit/s (frame bytes incl. FCS)",
        series: series(
            sweep,
            |scenario| match scenario {
                Scenario::RawCrypto { .. } => Some((Path::Encrypt, "raw encrypt")),
                _ => Some((Path::RoundTrip, "round trip")),
            },
            |cell| cell.gbit_per_second(),
        ),
    }];
    if let Some(mhz) = sweep.machine.mhz {
        charts.push(Chart {
            stem: "cycles",
            title: format!("Estimated CPU cycles per packet, round trip (time x {mhz:.0} MHz)"),
            y_desc: "cycles per packet (estimate)",
            series: series(
                sweep,
                |scenario| match scenario {
                    Scenario::RawCrypto { .. } => None,
                    _ => Some((Path::RoundTrip, "round trip")),
                },
                |cell| cell.ns() * mhz / 1000.0,
            ),
        });
    }
    charts.push(Chart {
        stem: "encap-ns",
        title: "Encapsulation time per packet vs frame size".into(),
        y_desc: "ns per packet",
        series: series(
            sweep,
            |scenario| match scenario {
                Scenario::RawCrypto { .. } => None,
                _ => Some((Path::Encap, "encap")),
            },
            |cell| cell.ns(),
        ),
    });
    charts.push(Chart {
        stem: "moved-bytes",
        title: "Bytes moved per packet, outbound gateway (NIC in + engine bus + NIC out)".into(),
        y_desc: "bytes per packet",
        series: series(
            sweep,
            |scenario| match scenario {
                Scenario::RawCrypto { .. } => None,
                _ => Some((Path::Encap, "encap")),
            },
            |cell| cell.metrics.moved_bytes_per_packet.unwrap_or(f64::NAN),
        ),
    });
    // The style comparison on the sec model, crossover marked.
    let modelled = |scenario: &Scenario| {
        (sweep.is_modelled(scenario) && !sweep.is_extra(scenario)).then_some((Path::Encap, "outbound"))
    };
    if let Some(mhz) = sweep.machine.mhz {
        let mut styles = series(sweep, modelled, |cell| {
            cell.offload
                .as_ref()
                .map_or(f64::NAN, |o| o.host_total() * mhz / 1000.0)
        });
        mark_crossovers(sweep, &mut styles);
        charts.push(Chart {
            stem: "styles-host-cycles",
            title: format!(
                "sec {}: host cycles per packet by style (measured + modelled, x {mhz:.0} MHz)",
                sweep.rate
            ),
            y_desc: "host cycles per packet",
            series: styles,
        });
    }
    let mut styles = series(sweep, modelled, |cell| cell.gbit_per_second());
    mark_crossovers(sweep, &mut styles);
    charts.push(Chart {
        stem: "styles-throughput",
        title: format!("sec {}: outbound throughput by style (modelled time)", sweep.rate),
        y_desc: "Gbit/s (frame bytes incl. FCS)",
        series: styles,
    });
    let note = format!(
        "{} ({} cores); ESP on {}; medians of {} x {} ms",
        sweep.machine.cpu, sweep.machine.cores, sweep.engine, sweep.repetitions, sweep.slice_ms
    );
    let mut written = Vec::new();
    for chart in charts
        .iter()
        .filter(|c| c.series.iter().any(|s| !s.points.is_empty()))
    {
        let svg = dir.join(format!("{}.svg", chart.stem));
        draw(
            &SVGBackend::new(&svg, (WIDTH, HEIGHT)).into_drawing_area(),
            chart,
            &note,
        )?;
        written.push(svg);
        let png = dir.join(format!("{}.png", chart.stem));
        draw(
            &BitMapBackend::new(&png, (WIDTH, HEIGHT)).into_drawing_area(),
            chart,
            &note,
        )?;
        written.push(png);
    }
    Ok(written)
}

/// Adds a vertical line at each algorithm's sync/async crossover size.
fn mark_crossovers(sweep: &Sweep, series: &mut Vec<Series>) {
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (lo, hi) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if lo > hi {
        return;
    }
    let mut marks = Vec::new();
    for scenario in sweep.scenarios() {
        let Scenario::Esp {
            algorithm,
            engine: accel::EngineKind::Sec,
            style: accel::Style::Sync,
            knobs,
        } = scenario
        else {
            continue;
        };
        if knobs != sweep.knobs {
            continue;
        }
        let async_ = Scenario::Esp {
            algorithm,
            engine: accel::EngineKind::Sec,
            style: accel::Style::Async,
            knobs,
        };
        if let Some((size, _)) = crate::report::crossover(sweep, scenario, async_) {
            marks.push(Series {
                name: format!("crossover {algorithm}: {size} B"),
                points: vec![(size as f64, lo), (size as f64, hi)],
            });
        }
    }
    series.extend(marks);
}

/// Registers the embedded font as plotters' `sans-serif` family. Needed
/// before plotters draws any text: with the `ab_glyph` feature (which this
/// crate turns on for every user of `plotters` in the same build, criterion's
/// HTML report included) plotters has no fonts of its own.
pub fn register_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, plotters::style::FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| anyhow!("the embedded chart font is not a valid font"))
}

/// One series per scenario, in sweep order: `pick` says which path's cells
/// to plot (and how to label them), or `None` to leave the scenario out.
fn series(
    sweep: &Sweep,
    pick: impl Fn(&Scenario) -> Option<(Path, &'static str)>,
    value: impl Fn(&crate::Cell) -> f64,
) -> Vec<Series> {
    let mut scenarios: Vec<Scenario> = Vec::new();
    for cell in &sweep.cells {
        if !scenarios.contains(&cell.scenario) {
            scenarios.push(cell.scenario);
        }
    }
    scenarios
        .into_iter()
        // The registration/completion comparison cells have two sizes only.
        .filter(|scenario| !sweep.is_extra(scenario))
        .filter_map(|scenario| {
            let (path, label) = pick(&scenario)?;
            let mut points: Vec<(f64, f64)> = sweep
                .cells
                .iter()
                .filter(|c| c.scenario == scenario && c.path == path)
                .map(|c| (c.frame_size as f64, value(c)))
                .filter(|(_, v)| v.is_finite() && *v > 0.0)
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Some(Series {
                name: format!("{scenario} ({label})"),
                points,
            })
        })
        .collect()
}

fn draw_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("cannot draw chart: {e}")
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart, note: &str) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(draw_error)?;
    let body = root
        .titled(&chart.title, (FONT, 22).into_font())
        .map_err(draw_error)?;
    let body_height = body.dim_in_pixel().1 as i32;
    let (body, footer) = body.split_vertically(body_height - 32);
    footer
        .draw(&Text::new(
            note.to_owned(),
            (20, 8),
            TextStyle::from((FONT, 13).into_font()).color(&RGBColor(90, 90, 90)),
        ))
        .map_err(draw_error)?;
    let (plot, legend) = body.split_horizontally(WIDTH - LEGEND_WIDTH);

    let points = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    let x_range = (x_min - 60.0).max(0.0)..x_max + 60.0;
    let mut builder = ChartBuilder::on(&plot);
    builder.margin(15).x_label_area_size(50).y_label_area_size(80);
    if y_max / y_min >= 10.0 {
        let lo = 10f64.powf(y_min.log10().floor());
        let hi = 10f64.powf(y_max.log10().ceil());
        let ctx = builder
            .build_cartesian_2d(x_range, (lo..hi).log_scale())
            .map_err(draw_error)?;
        plot_series(ctx, chart, " (log scale)")?;
    } else {
        let ctx = builder
            .build_cartesian_2d(x_range, 0.0..y_max * 1.1)
            .map_err(draw_error)?;
        plot_series(ctx, chart, "")?;
    }

    for (i, s) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let y = 40 + 26 * i as i32;
        legend
            .draw(&PathElement::new(vec![(5, y), (35, y)], color.stroke_width(2)))
            .map_err(draw_error)?;
        legend
            .draw(&Circle::new((20, y), 3, color.filled()))
            .map_err(draw_error)?;
        legend
            .draw(&Text::new(
                s.name.clone(),
                (42, y),
                TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(draw_error)?;
    }
    root.present().map_err(draw_error)?;
    Ok(())
}

fn plot_series<DB, Y>(
    mut ctx: ChartContext<'_, DB, plotters::coord::cartesian::Cartesian2d<RangedCoordf64, Y>>,
    chart: &Chart,
    y_suffix: &str,
) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    ctx.configure_mesh()
        .x_desc("Ethernet frame size (bytes, FCS included)")
        .y_desc(format!("{}{y_suffix}", chart.y_desc))
        .x_labels(10)
        .y_labels(12)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| short(*v))
        .axis_desc_style((FONT, 15))
        .label_style((FONT, 13))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(draw_error)?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        ctx.draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(draw_error)?;
        ctx.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(draw_error)?;
    }
    Ok(())
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
    use crate::measure::Samples;
    use crate::report::Machine;
    use crate::{Cell, Metrics};
    use accel::{Algorithm, EngineKind, Style};

    fn cell(scenario: Scenario, path: Path, frame_size: usize, ns: f64) -> Cell {
        Cell {
            scenario,
            path,
            frame_size,
            samples: Samples {
                ns_per_packet: vec![ns],
                packets: 1,
                processed: 1,
                cycles_per_packet: Vec::new(),
                wall_ns: ns as u64,
            },
            metrics: Metrics {
                moved_bytes_per_packet: (path == Path::Encap).then_some(2.0 * frame_size as f64 + 100.0),
                ..Metrics::default()
            },
            offload: None,
        }
    }

    #[test]
    fn writes_svg_and_png_for_each_chart() {
        let gcm = Algorithm::Aes128Gcm16;
        let esp = Scenario::esp(gcm, EngineKind::Sec, Style::Async);
        let mut cells = Vec::new();
        for size in [64, 512, 1420] {
            let s = size as f64;
            cells.push(cell(Scenario::Ipv4Forward, Path::Encap, size, 50.0));
            cells.push(cell(Scenario::Ipv4Forward, Path::RoundTrip, size, 100.0));
            cells.push(cell(esp, Path::Encap, size, 200.0 + s));
            cells.push(cell(esp, Path::RoundTrip, size, 500.0 + s));
            cells.push(cell(
                Scenario::RawCrypto { algorithm: gcm },
                Path::Encrypt,
                size,
                80.0 + s / 5.0,
            ));
        }
        let mut sweep = Sweep {
            cells,
            engine: "sec/async".into(),
            knobs: crate::scenario::Knobs::default(),
            rate: "none".into(),
            machine: Machine {
                cpu: "test CPU".into(),
                cores: 2,
                mhz: Some(2000.0),
                no_cycle_counter: Some("test".into()),
            },
            slice_ms: 10,
            repetitions: 2,
            packets: 1,
            threads: false,
            speedups: Vec::new(),
        };
        let dir = std::env::temp_dir().join(format!("espgw-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let written = write_charts(&sweep, &dir).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "throughput.svg",
                "throughput.png",
                "cycles.svg",
                "cycles.png",
                "encap-ns.svg",
                "encap-ns.png",
                "moved-bytes.svg",
                "moved-bytes.png"
            ]
        );
        let svg = std::fs::read_to_string(dir.join("throughput.svg")).unwrap();
        assert!(svg.contains("aes128gcm16/sec/async (round trip)"));
        assert!(svg.contains("aes128gcm16/raw (raw encrypt)"));
        let png = std::fs::read(dir.join("throughput.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

        // Without a known clock there is no cycles chart.
        sweep.machine.mhz = None;
        let written = write_charts(&sweep, &dir).unwrap();
        assert_eq!(written.len(), 6);
        std::fs::remove_dir_all(&dir).unwrap();
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
