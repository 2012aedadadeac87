//! Tables, derived answers and machine-readable output of a sweep.

use std::fmt::Write;
use std::path::Path as FsPath;

use accel::Algorithm;
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
        }
    }

    /// Estimated cycles for `ns` nanoseconds (time × clock, not a counter).
    pub fn cycles(&self, ns: f64) -> Option<f64> {
        self.mhz.map(|mhz| ns * mhz / 1000.0)
    }
}

fn cycles_text(sweep: &Sweep, ns: f64) -> String {
    sweep
        .machine
        .cycles(ns)
        .map_or_else(|| "-".into(), |c| format!("{c:.0}"))
}

/// The main table: one row per scenario and frame size.
pub fn table(sweep: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "espgw bench: {} ({} cores); medians of {} × {} ms after warm-up; ESP on {}; cycles = time × {} (estimate, not a counter)",
        sweep.machine.cpu,
        sweep.machine.cores,
        sweep.repetitions,
        sweep.slice_ms,
        sweep.engine,
        sweep.machine.mhz.map_or_else(|| "unknown clock".into(), |m| format!("{m:.0} MHz")),
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<22} {:>5} {:>9} {:>9} {:>10} {:>9} {:>8} {:>9} {:>7}",
        "scenario", "bytes", "encap ns", "decap ns", "round ns", "kpps", "Gbit/s", "cycles", "spread"
    );
    let mut sizes: Vec<usize> = sweep.cells.iter().map(|c| c.frame_size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut scenarios: Vec<Scenario> = Vec::new();
    for c in &sweep.cells {
        if !scenarios.contains(&c.scenario) {
            scenarios.push(c.scenario);
        }
    }
    for scenario in scenarios {
        for &size in &sizes {
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
            let _ = writeln!(
                out,
                "{:<22} {:>5} {:>9.0} {:>9.0} {:>10} {:>9.0} {:>8.2} {:>9} {:>6.0}%",
                scenario.name(),
                size,
                a.ns(),
                b.ns(),
                round.map_or_else(|| "-".into(), |r| format!("{:.0}", r.ns())),
                headline.packets_per_second() / 1e3,
                headline.gbit_per_second(),
                cycles_text(sweep, headline.ns()),
                spread * 100.0,
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
    out
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// The answers the studies ask for, computed from this run.
pub fn derived(sweep: &Sweep) -> String {
    let mut out = String::from("\nDerived from this run:\n");
    let null = Scenario::Esp {
        algorithm: Algorithm::Null,
    };
    let mut sizes: Vec<usize> = sweep.cells.iter().map(|c| c.frame_size).collect();
    sizes.sort_unstable();
    sizes.dedup();
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
            "- ESP null/null costs {:.2}x the time of plain IPv4 forwarding per packet on the outbound path (median over sizes; {}). The Freescale study found 3.2x in cycles.",
            median(ratios.iter().map(|r| r.1).collect()).unwrap_or(f64::NAN),
            list.join(", ")
        );
    }
    let mut algorithms: Vec<Algorithm> = Vec::new();
    for c in &sweep.cells {
        if let Scenario::RawCrypto { algorithm } = c.scenario {
            if !algorithms.contains(&algorithm) {
                algorithms.push(algorithm);
            }
        }
    }
    for algorithm in algorithms {
        let esp = Scenario::Esp { algorithm };
        let raw = Scenario::RawCrypto { algorithm };
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
                "- {algorithm}: share of the outbound ESP path spent outside the primitive (the stack's overhead over the raw crypto ceiling): {}",
                parts.join(", ")
            );
        }
    }
    let _ = writeln!(
        out,
        "- Not measured in this run: the `sec` engine model, its sync / dual-pass / async styles and buffer policies (the crossover and sec-vs-soft speed-ups) arrive with the look-aside offload work."
    );
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
            })
        })
        .collect();
    json!({
        "machine": sweep.machine,
        "slice_ms": sweep.slice_ms,
        "repetitions": sweep.repetitions,
        "engine": sweep.engine,
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
        ])?;
    }
    writer.flush()?;
    Ok(())
}
