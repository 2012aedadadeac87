//! Tables, derived answers and machine-readable output of a sweep.

use std::fmt::Write;
use std::path::Path as FsPath;

use accel::{Algorithm, EngineKind, Style};
use serde_json::{json, Value};

use crate::scenario::Scenario;
use crate::{Path, Sweep};

/// What the numbers were measured on.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    /// Nominal clock used to turn time into estimated cycles.
    pub mhz: Option<f64>,
    /// Why there is no hardware cycle counter (`None`: there is one).
    pub no_cycle_counter: Option<String>,
}

impl Machine {
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        };
        Machine {
            cpu: field("model name").unwrap_or_else(|| "unknown CPU".into()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mhz: field("cpu MHz").and_then(|v| v.parse().ok()),
            no_cycle_counter: crate::measure::CycleCounter::open().err(),
        }
    }

    /// Estimated cycles for `ns` nanoseconds (time × clock, not a counter).
    pub fn cycles(&self, ns: f64) -> Option<f64> {
        self.mhz.map(|mhz| ns * mhz / 1000.0)
    }
}

/// Cycles per packet of a cell: the hardware counter's median where there
/// is one, otherwise time × clock.
fn cycles_text(sweep: &Sweep, cell: &crate::Cell) -> String {
    let counted = &cell.samples.cycles_per_packet;
    if !counted.is_empty() {
        let mut v = counted.clone();
        v.sort_by(f64::total_cmp);
        return format!("{:.0}", v[v.len() / 2]);
    }
    sweep
        .machine
        .cycles(cell.ns())
        .map_or_else(|| "-".into(), |c| format!("{c:.0}"))
}

fn opt(value: Option<f64>, text: impl Fn(f64) -> String) -> String {
    value.filter(|v| v.is_finite()).map_or_else(|| "-".into(), text)
}

/// The main table: one row per scenario and frame size.
pub fn table(sweep: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "espgw bench: {} ({} cores); medians of {} × {} ms after warm-up; ESP on {}; {}",
        sweep.machine.cpu,
        sweep.machine.cores,
        sweep.repetitions,
        sweep.slice_ms,
        sweep.engine,
        match &sweep.machine.no_cycle_counter {
            None => "cycles = the CPU's cycle counter, dataplane thread only".to_owned(),
            Some(why) => format!(
                "cycles = time × {} (estimate: no hardware cycle counter here: {why})",
                sweep
                    .machine
                    .mhz
                    .map_or_else(|| "unknown clock".into(), |m| format!("{m:.0} MHz"))
            ),
        },
    );
    let _ = writeln!(out);
    let scenarios = sweep.scenarios();
    let width = scenarios
        .iter()
        .map(|s| s.name().len())
        .max()
        .unwrap_or(0)
        .max(22);
    let _ = writeln!(
        out,
        "{:<width$} {:>5} {:>9} {:>9} {:>10} {:>9} {:>8} {:>9} {:>7} {:>7} {:>8} {:>7} {:>5}",
        "scenario",
        "bytes",
        "encap ns",
        "decap ns",
        "round ns",
        "kpps",
        "Gbit/s",
        "cycles",
        "spread",
        "bus B",
        "moved B",
        "vs fwd",
        "util",
    );
    for scenario in scenarios {
        for size in sweep.sizes() {
            let (first, second, third) = match scenario {
                Scenario::RawCrypto { .. } => (Path::Encrypt, Path::Decrypt, None),
                _ => (Path::Encap, Path::Decap, Some(Path::RoundTrip)),
            };
            let (Some(a), Some(b)) = (
                sweep.get(scenario, first, size),
                sweep.get(scenario, second, size),
            ) else {
                continue;
            };
            let round = third.and_then(|p| sweep.get(scenario, p, size));
            // Throughput and cycles of the round trip, or of encryption for raw rows.
            let headline = round.unwrap_or(a);
            let spread = [Some(a), Some(b), round]
                .into_iter()
                .flatten()
                .map(|c| c.samples.spread())
                .fold(0.0, f64::max);
            // Bytes and utilisation of the outbound gateway (the encap cell).
            let m = a.metrics;
            let _ = writeln!(
                out,
                "{:<width$} {:>5} {:>9.0} {:>9.0} {:>10} {:>9.0} {:>8.2} {:>9} {:>6.0}% {:>7} {:>8} {:>7} {:>5}",
                scenario.name(),
                size,
                a.ns(),
                b.ns(),
                round.map_or_else(|| "-".into(), |r| format!("{:.0}", r.ns())),
                headline.packets_per_second() / 1e3,
                headline.gbit_per_second(),
                cycles_text(sweep, headline),
                spread * 100.0,
                opt(m.bus_bytes_per_packet, |v| format!("{v:.0}")),
                opt(m.moved_bytes_per_packet, |v| format!("{v:.0}")),
                opt(a.moved_over_ipv4_fwd(), |v| format!("{:+.0}%", v * 100.0)),
                opt(m.engine_utilisation, |v| format!("{:.0}%", v * 100.0)),
            );
        }
    }
    let _ = writeln!(
        out,
        "\nencap/decap: one gateway's ESP path per packet (raw rows: the primitive alone, encrypt/decrypt);"
    );
    let _ = writeln!(
        out,
        "round: both gateways on one core, every packet checked; kpps, Gbit/s (frame bytes) and cycles are of the round trip."
    );
    let _ = writeln!(
        out,
        "bus B: bytes the sec engine moved across its modelled bus per packet on the outbound gateway (descriptor, keys/context, data in, data out),"
    );
    let _ = writeln!(
        out,
        "  from its counters over the encap cell; `-` where there is no engine bus (soft and afalg run on the CPU that owns the data; raw rows)."
    );
    let _ = writeln!(
        out,
        "moved B: frame in from the NIC + frame out to the NIC + bus B, per packet on the outbound gateway; vs fwd: over ipv4-fwd, defined as"
    );
    let _ = writeln!(
        out,
        "  2 × frame bytes (in and out, FCS included). util: busy time of the sec engine's busiest execution unit / wall time of the encap cell."
    );
    out
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// Round-trip nanoseconds of `scenario` at `size`.
fn round_ns(sweep: &Sweep, scenario: Scenario, size: usize) -> Option<f64> {
    sweep.get(scenario, Path::RoundTrip, size).map(|c| c.ns())
}

/// The main-sweep ESP scenario of `algorithm` on `engine`/`style`.
fn main_esp(sweep: &Sweep, algorithm: Algorithm, engine: EngineKind, style: Style) -> Option<Scenario> {
    let scenario = Scenario::Esp {
        algorithm,
        engine,
        style,
        knobs: sweep.knobs,
    };
    sweep
        .cells
        .iter()
        .any(|c| c.scenario == scenario)
        .then_some(scenario)
}

/// The first size at which `fast` takes less round-trip time than `slow`,
/// and whether it stays ahead at every larger measured size.
pub fn crossover(sweep: &Sweep, slow: Scenario, fast: Scenario) -> Option<(usize, bool)> {
    let pairs: Vec<(usize, f64, f64)> = sweep
        .sizes()
        .into_iter()
        .filter_map(|s| Some((s, round_ns(sweep, slow, s)?, round_ns(sweep, fast, s)?)))
        .collect();
    let first = pairs.iter().position(|(_, slow, fast)| fast < slow)?;
    let stays = pairs[first..].iter().all(|(_, slow, fast)| fast < slow);
    Some((pairs[first].0, stays))
}

fn percent_change(base: f64, other: f64) -> String {
    format!("{:+.0}%", 100.0 * (other - base) / base)
}

/// The answers the studies ask for, computed from this run.
pub fn derived(sweep: &Sweep) -> String {
    let mut out = String::from("\nDerived from this run:\n");
    let sizes = sweep.sizes();
    let scenarios = sweep.scenarios();
    let mut algorithms: Vec<Algorithm> = Vec::new();
    for algorithm in scenarios.iter().filter_map(Scenario::algorithm) {
        if algorithm != Algorithm::Null && !algorithms.contains(&algorithm) {
            algorithms.push(algorithm);
        }
    }

    // (a) The stack: ESP null/null vs plain forwarding.
    if let Some(null) = scenarios
        .iter()
        .copied()
        .find(|s| s.algorithm() == Some(Algorithm::Null) && !sweep.is_extra(s))
    {
        let ratios: Vec<(usize, f64)> = sizes
            .iter()
            .filter_map(|&s| {
                let esp = sweep.get(null, Path::Encap, s)?;
                let fwd = sweep.get(Scenario::Ipv4Forward, Path::Encap, s)?;
                Some((s, esp.ns() / fwd.ns()))
            })
            .collect();
        if !ratios.is_empty() {
            let list: Vec<String> = ratios.iter().map(|(s, r)| format!("{s} B {r:.2}x")).collect();
            let _ = writeln!(
                out,
                "- Stack: {null} costs {:.2}x the time of plain IPv4 forwarding per packet on the outbound path (median over sizes; {}). The Freescale study found 3.2x in cycles.",
                median(ratios.iter().map(|r| r.1).collect()).unwrap_or(f64::NAN),
                list.join(", ")
            );
        }
    }

    // (b) Where async single-pass overtakes sync on the sec engine.
    for &algorithm in &algorithms {
        let (Some(sync), Some(async_)) = (
            main_esp(sweep, algorithm, EngineKind::Sec, Style::Sync),
            main_esp(sweep, algorithm, EngineKind::Sec, Style::Async),
        ) else {
            continue;
        };
        let ratios: Vec<String> = sizes
            .iter()
            .filter_map(|&s| {
                Some(format!(
                    "{s} B {:.2}x",
                    round_ns(sweep, sync, s)? / round_ns(sweep, async_, s)?
                ))
            })
            .collect();
        let answer = match crossover(sweep, sync, async_) {
            Some((size, stays)) if Some(&size) == sizes.first() => format!(
                "async is already ahead at the smallest measured size, {size} B{}",
                if stays {
                    ""
                } else {
                    " (but not at every larger size)"
                }
            ),
            Some((size, stays)) => format!(
                "async overtakes sync at {size} B{}",
                if stays {
                    " and stays ahead"
                } else {
                    " (but not at every larger size)"
                }
            ),
            None => "async does not overtake sync within the measured sizes".into(),
        };
        let _ = writeln!(
            out,
            "- Crossover, {algorithm} on sec: {answer} (sync/async round-trip time: {}). The Freescale study found 64–256 B.",
            ratios.join(", ")
        );
    }

    // (c) ESP overhead over the raw crypto ceiling.
    for &algorithm in &algorithms {
        let raw = Scenario::RawCrypto { algorithm };
        let Some(esp) = main_esp(sweep, algorithm, EngineKind::Soft, Style::Async).or_else(|| {
            scenarios.iter().copied().find(|s| {
                matches!(s, Scenario::Esp { algorithm: a, .. } if *a == algorithm) && !sweep.is_extra(s)
            })
        }) else {
            continue;
        };
        let parts: Vec<String> = sizes
            .iter()
            .filter_map(|&s| {
                let e = sweep.get(esp, Path::Encap, s)?;
                let r = sweep.get(raw, Path::Encrypt, s)?;
                Some(format!("{s} B {:.0}%", 100.0 * (e.ns() - r.ns()) / e.ns()))
            })
            .collect();
        if !parts.is_empty() {
            let _ = writeln!(
                out,
                "- Overhead, {esp}: share of the outbound ESP path spent outside the primitive (the stack's cost over the raw crypto ceiling): {}",
                parts.join(", ")
            );
        }
    }

    // (d) sec vs soft.
    if let Some(&largest) = sizes.last() {
        let mut parts = Vec::new();
        for &algorithm in &algorithms {
            let (Some(soft), Some(sec)) = (
                main_esp(sweep, algorithm, EngineKind::Soft, Style::Async),
                main_esp(sweep, algorithm, EngineKind::Sec, Style::Async),
            ) else {
                continue;
            };
            if let (Some(soft_ns), Some(sec_ns)) =
                (round_ns(sweep, soft, largest), round_ns(sweep, sec, largest))
            {
                parts.push(format!("{algorithm} {:.2}x", soft_ns / sec_ns));
            }
        }
        if !parts.is_empty() {
            let caveat = if sweep.rate == "none" {
                "Here the \"engine\" is this same CPU running the same code in other threads, so the figure is the cost (or, on an idle second core, the parallelism) of the offload boundary, not a hardware speed-up; `--rate sec2-266mhz` makes the engine as slow as an MPC8548-class SEC 2.x instead."
            } else {
                "The engine is rate-limited to a modelled SEC 2.x (`--rate`), so this is the modelled part against this machine's CPU, not a measurement of real hardware."
            };
            let _ = writeln!(
                out,
                "- Speed-up of sec/async over soft inline at {largest} B (soft round-trip time / sec's): {}. The microcontroller study found 3DES ~10x, AES ~7x, SHA ~2x with real engines. {caveat}",
                parts.join(", ")
            );
        }
    }

    // (e) Buffer registration and completion signalling.
    for scenario in scenarios.iter().filter(|s| sweep.is_extra(s)) {
        let Scenario::Esp {
            algorithm,
            engine,
            style,
            knobs,
        } = *scenario
        else {
            continue;
        };
        let base = Scenario::Esp {
            algorithm,
            engine,
            style,
            knobs: sweep.knobs,
        };
        let parts: Vec<String> = sizes
            .iter()
            .filter_map(|&s| {
                let b = round_ns(sweep, base, s)?;
                let o = round_ns(sweep, *scenario, s)?;
                Some(format!(
                    "{s} B {:.0} vs {:.0} ns ({})",
                    o,
                    b,
                    percent_change(b, o)
                ))
            })
            .collect();
        if parts.is_empty() {
            continue;
        }
        let (what, study) = if knobs.buffers != sweep.knobs.buffers {
            (
                format!("{} buffers instead of {}", knobs.buffers, sweep.knobs.buffers),
                "per-request here both allocates a bounce buffer per request and copies in and out, so it is the TrustZone study's two effects together: registering once and reusing gave up to 37%, passing pointers instead of copies up to 39%.",
            )
        } else {
            (
                format!("{} completion instead of {}", knobs.completion, sweep.knobs.completion),
                "the TrustZone study found interrupts during the engine's work added up to 60% jitter to a call (2–4.5% masked).",
            )
        };
        let _ = writeln!(
            out,
            "- {base} with {what}: round trip {}; {study}",
            parts.join(", ")
        );
    }
    out
}

pub fn json(sweep: &Sweep) -> Value {
    let cells: Vec<Value> = sweep
        .cells
        .iter()
        .map(|c| {
            json!({
                "scenario": c.scenario.name(),
                "path": c.path.name(),
                "frame_size": c.frame_size,
                "ns_per_packet": c.ns(),
                "packets_per_second": c.packets_per_second(),
                "gbit_per_second": c.gbit_per_second(),
                "est_cycles_per_packet": sweep.machine.cycles(c.ns()),
                "spread": c.samples.spread(),
                "repetitions_ns": c.samples.ns_per_packet,
                "packets": c.samples.packets,
                "bus_bytes_per_packet": c.metrics.bus_bytes_per_packet,
                "moved_bytes_per_packet": c.metrics.moved_bytes_per_packet,
                "moved_over_ipv4_fwd": c.moved_over_ipv4_fwd(),
                "engine_utilisation": c.metrics.engine_utilisation,
            })
        })
        .collect();
    json!({
        "machine": sweep.machine,
        "slice_ms": sweep.slice_ms,
        "repetitions": sweep.repetitions,
        "engine": sweep.engine,
        "knobs": sweep.knobs,
        "rate": sweep.rate,
        "cells": cells,
    })
}

pub fn write_csv(sweep: &Sweep, path: &FsPath) -> anyhow::Result<()> {
    let mut writer = csv::Writer::from_path(path)?;
    writer.write_record([
        "scenario",
        "path",
        "frame_size",
        "ns_per_packet",
        "packets_per_second",
        "gbit_per_second",
        "est_cycles_per_packet",
        "spread",
        "bus_bytes_per_packet",
        "moved_bytes_per_packet",
        "moved_over_ipv4_fwd",
        "engine_utilisation",
    ])?;
    for c in &sweep.cells {
        writer.write_record([
            c.scenario.name(),
            c.path.name().to_owned(),
            c.frame_size.to_string(),
            format!("{:.1}", c.ns()),
            format!("{:.0}", c.packets_per_second()),
            format!("{:.3}", c.gbit_per_second()),
            sweep
                .machine
                .cycles(c.ns())
                .map_or_else(String::new, |v| format!("{v:.0}")),
            format!("{:.3}", c.samples.spread()),
            c.metrics
                .bus_bytes_per_packet
                .map_or_else(String::new, |v| format!("{v:.1}")),
            c.metrics
                .moved_bytes_per_packet
                .map_or_else(String::new, |v| format!("{v:.1}")),
            c.moved_over_ipv4_fwd()
                .map_or_else(String::new, |v| format!("{v:.4}")),
            c.metrics
                .engine_utilisation
                .map_or_else(String::new, |v| format!("{v:.4}")),
        ])?;
    }
    writer.flush()?;
    Ok(())
}
