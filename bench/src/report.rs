//! Tables, derived answers and machine-readable output of a sweep.

use std::fmt::Write;
use std::path::Path as FsPath;

use accel::{Algorithm, EngineKind, Style};

use serde_json::{json, Value};

use crate::scenario::Scenario;
use crate::studies::{self, offload_of, out_ns, Study};
use crate::{Path, Sweep};

/// What the numbers were measured on.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// The CPU's model name from /proc/cpuinfo (`unknown CPU` without one).
    pub cpu: String,
    /// CPUs this process may run on.
    pub cores: usize,
    /// Nominal clock used to turn time into estimated cycles.
    pub mhz: Option<f64>,
    /// Why there is no hardware cycle counter (`None`: there is one).
    pub no_cycle_counter: Option<String>,
}

impl Machine {
    /// This machine: its CPU and clock from /proc/cpuinfo, and whether the
    /// cycle counter opens.
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

/// What else the numbers depend on: where and when they were taken.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Conditions {
    /// The host's name (empty where unreadable).
    pub hostname: String,
    /// The kernel's release, as `uname -r` prints it.
    pub kernel: String,
    /// The CPU reports a hypervisor (a VM: other guests share the host).
    pub virtualised: bool,
    /// The kernel's clock source, behind every time measured here.
    pub clocksource: String,
    /// 1, 5 and 15 minute load averages when the run started (`None`:
    /// unreadable).
    pub load_before: Option<[f64; 3]>,
    /// The same load averages when the run ended.
    pub load_after: Option<[f64; 3]>,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix: u64,
    /// Wall time of the whole run.
    pub seconds: f64,
}

impl Conditions {
    /// The conditions now, as a run starts.
    pub fn start() -> Conditions {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Conditions {
            hostname: read("/proc/sys/kernel/hostname"),
            kernel: read("/proc/sys/kernel/osrelease"),
            virtualised: cpuinfo
                .lines()
                .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor")),
            clocksource: read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
            load_before: load_average(),
            load_after: None,
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            seconds: 0.0,
        }
    }

    /// Records the end of the run that started `elapsed` ago.
    pub fn finish(&mut self, elapsed: std::time::Duration) {
        self.load_after = load_average();
        self.seconds = elapsed.as_secs_f64();
    }

    /// `0.52 0.61 0.70`, or `unknown`.
    pub fn load_text(load: Option<[f64; 3]>) -> String {
        load.map_or_else(|| "unknown".into(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"))
    }

    /// The start as `YYYY-MM-DD HH:MM UTC`.
    pub fn started_text(&self) -> String {
        let days = (self.started_unix / 86_400) as i64;
        let secs = self.started_unix % 86_400;
        // Civil from days (Howard Hinnant's algorithm), to print a date
        // without a time-zone database.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!(
            "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
            secs / 3600,
            secs % 3600 / 60
        )
    }
}

/// The 1, 5 and 15 minute load averages, from /proc/loadavg.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
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
    let (scenarios, width) = table_rows(sweep, false);
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
        "\nMeasured on this host (wall clock, medians). encap/decap: one gateway's ESP path per packet (raw rows: the primitive alone, encrypt/decrypt);"
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
    out.push_str(&offload_table(sweep));
    out
}

/// Everything `--tables` prints: the tables, the derived lines, and the
/// shared-engine rows when the run has them.
pub fn full_tables(sweep: &Sweep) -> String {
    let mut out = table(sweep);
    out.push_str(&derived(sweep));
    if !sweep.tenants.is_empty() {
        let options = crate::tenants::Options {
            tenants: vec![1],
            transports: accel::shared::Transport::ALL.to_vec(),
            sizes: studies::TENANT_SIZES.to_vec(),
            engines: Vec::new(),
            algorithm: studies::algorithms(sweep)
                .into_iter()
                .find(|a| EngineKind::Sec.supports(*a))
                .unwrap_or(Algorithm::Aes128Gcm16),
            slice: std::time::Duration::from_millis(sweep.slice_ms),
            repetitions: sweep.repetitions,
            profile: sweep.rate.clone(),
            json: None,
            hostile: false,
        };
        out.push('\n');
        out.push_str(&crate::tenants::table(&sweep.tenants, &options));
        out.push_str(&crate::tenants::derived(&sweep.tenants, options.algorithm));
    }
    out
}

/// The rows of a table: the sweep's scenarios on the `sec` model, or
/// those measured whole (`modelled` false), and the width of the longest
/// name (22 at least).
fn table_rows(sweep: &Sweep, modelled: bool) -> (Vec<Scenario>, usize) {
    let scenarios: Vec<Scenario> = sweep
        .scenarios()
        .into_iter()
        .filter(|s| sweep.is_modelled(s) == modelled)
        .collect();
    let width = scenarios
        .iter()
        .map(|s| s.name().len())
        .max()
        .unwrap_or(0)
        .max(22);
    (scenarios, width)
}

/// The `sec` model rows: host measured, device modelled.
pub fn offload_table(sweep: &Sweep) -> String {
    let mut out = String::new();
    let (scenarios, width) = table_rows(sweep, true);
    if scenarios.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\nsec engine model, outbound gateway: host measured ({} × {} packets after a warm-up, median), device modelled ({}; identical in every run)\n",
        sweep.repetitions, sweep.packets, sweep.rate
    );
    let _ = writeln!(
        out,
        "{:<width$} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7} {:>7} {:>8} {:>6} {:>5} {:>5}",
        "scenario", "bytes", "host ms", "host md", "host", "timeln", "period", "in per", "kpps", "Gbit/s", "host cyc",
        "spread", "lat ns", "eng ns", "bus B", "eu%", "bus%",
    );
    for scenario in scenarios {
        for size in sweep.sizes() {
            let Some(a) = sweep.get(scenario, Path::Encap, size) else {
                continue;
            };
            let Some(o) = &a.offload else { continue };
            let m = o.modelled;
            let inbound = sweep.get(scenario, Path::Decap, size).map(|c| c.ns());
            let host = o.host_total();
            let h = &o.host_measured_ns;
            let spread = (h.iter().copied().fold(0.0, f64::max)
                - h.iter().copied().fold(f64::INFINITY, f64::min))
                / o.host_measured();
            let _ = writeln!(
                out,
                "{:<width$} {:>5} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8.0} {:>8} {:>8.1} {:>7.3} {:>8} {:>6.0}% {:>7.0} {:>8.0} {:>6.0} {:>4.0}% {:>4.0}%",
                scenario.name(),
                size,
                o.host_measured(),
                m.host_ns,
                host,
                m.timeline_ns,
                a.ns(),
                opt(inbound, |v| format!("{v:.0}")),
                a.packets_per_second() / 1e3,
                a.gbit_per_second(),
                opt(sweep.machine.cycles(host), |v| format!("{v:.0}")),
                spread * 100.0,
                m.latency_ns,
                m.engine_ns,
                m.bus_bytes,
                m.eu_utilisation * 100.0,
                m.bus_utilisation * 100.0,
            );
        }
    }
    for line in [
        "Measured on this host: host ms = the host's own work per packet (prepare, descriptor build, submit, completion handling, finish:",
        "  wall time of the gateway calls minus the model's emulation of the device's crypto), median over repetitions; spread = its (max-min)/median.",
        "Modelled (from the device profile and the packet count only, identical in every run): host md = host costs this machine cannot show",
        "  (doorbell MMIO write per burst, interrupt entry/handler/exit, cache misses per completion; polling: the spin until completion);",
        "  timeln = the modelled timeline per packet with the host's own work free (host md plus waits for the engine); lat ns = device latency",
        "  per packet (submission to completion, queueing included, all its descriptors); eng ns = busy time of the busiest execution unit per",
        "  packet; bus B = bytes across the device bus per packet; eu%/bus% = busiest unit's / bus's busy time over the timeline.",
        "Combined: host = host ms + host md (polling: the whole period, the host spins); period = system time per packet on the outbound",
        "  gateway: sync pays host ms + timeln in series, dual-pass and async overlap them: max(host ms + host md, timeln); kpps and Gbit/s",
        "  (frame bytes) from it; in per = the same for the inbound gateway; host cyc = host × the nominal clock.",
    ] {
        let _ = writeln!(out, "{line}");
    }
    out
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
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

/// The first size at which `fast` takes less outbound time than `slow`,
/// and whether it stays ahead at every larger measured size.
pub fn crossover(sweep: &Sweep, slow: Scenario, fast: Scenario) -> Option<(usize, bool)> {
    crossover_by(sweep, slow, fast, out_ns)
}

fn percent_change(base: f64, other: f64) -> String {
    format!("{:+.0}%", 100.0 * (other - base) / base)
}

/// The answers the studies ask for, computed from this run.
pub fn derived(sweep: &Sweep) -> String {
    let mut out = String::from(
        "\nDerived from this run (each with the study's figure; sec figures combine measured host work with the modelled device):\n",
    );
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
        let ratios = studies::time_ratios(sweep, null, Scenario::Ipv4Forward);
        if !ratios.is_empty() {
            let list: Vec<String> = ratios.iter().map(|(s, r)| format!("{s} B {r:.2}x")).collect();
            let _ = writeln!(
                out,
                "- Stack: {null} costs {:.2}x the time of plain IPv4 forwarding per packet on the outbound path (median over sizes; {}). The Freescale study found {}x in cycles.",
                median(ratios.iter().map(|r| r.1).collect()).unwrap_or(f64::NAN),
                list.join(", "),
                studies::STACK_RATIO
            );
        }
    }

    // (a') The same for IPv6: 6-in-6 null/null against plain IPv6 forwarding.
    let ratios6 = studies::time_ratios(sweep, Scenario::EspNull6, Scenario::Ipv6Forward);
    if !ratios6.is_empty() {
        let list: Vec<String> = ratios6.iter().map(|(s, r)| format!("{s} B {r:.2}x")).collect();
        let _ = writeln!(
            out,
            "- Stack over IPv6: {} (IPv6 inside and out) costs {:.2}x the time of plain IPv6 forwarding per packet on the outbound path (median over sizes from {} B, the smallest IPv6/UDP frame; {}).",
            Scenario::EspNull6,
            median(ratios6.iter().map(|r| r.1).collect()).unwrap_or(f64::NAN),
            crate::measure::MIN_FRAME6,
            list.join(", ")
        );
    }

    // (b) Seed study 1 on the sec model: styles, crossover, bus bytes.
    out.push_str(&study_one(sweep, &algorithms));

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

    out.push_str(&study_two(sweep));
    out.push_str(&boundary_and_fast_part(sweep, &algorithms));
    out.push_str(&study_four(sweep));
    out
}

fn ratio_list(sizes: &[usize], f: impl Fn(usize) -> Option<f64>) -> String {
    sizes
        .iter()
        .filter_map(|&s| Some(format!("{s} B {:.2}x", f(s)?)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn study_one(sweep: &Sweep, algorithms: &[Algorithm]) -> String {
    let mut out = String::new();
    let sizes = sweep.sizes();
    let null = sweep
        .scenarios()
        .into_iter()
        .find(|s| s.algorithm() == Some(Algorithm::Null) && !sweep.is_extra(s));
    for &algorithm in algorithms {
        let styles: Vec<(Style, Scenario)> = Style::ALL
            .iter()
            .filter_map(|&st| Some((st, main_esp(sweep, algorithm, EngineKind::Sec, st)?)))
            .filter(|(_, s)| sweep.is_modelled(s))
            .collect();
        let get = |st: Style| styles.iter().find(|(s, _)| *s == st).map(|(_, sc)| *sc);
        if let (Some(sync), Some(async_)) = (get(Style::Sync), get(Style::Async)) {
            let answer = match crossover_by(sweep, sync, async_, out_ns) {
                Some((size, stays)) if Some(&size) == sizes.first() => format!(
                    "async is already ahead at the smallest measured size, {size} B{}",
                    if stays {
                        ""
                    } else {
                        " (but not at every larger size)"
                    }
                ),
                Some((size, stays)) => {
                    let below = sizes.iter().copied().filter(|s| *s < size).max().unwrap_or(size);
                    format!(
                        "async overtakes sync between {below} and {size} B{}",
                        if stays {
                            " and stays ahead"
                        } else {
                            " (but not at every larger size)"
                        }
                    )
                }
                None => "async does not overtake sync within the measured sizes".into(),
            };
            let _ = writeln!(
                out,
                "- Crossover, {algorithm} on sec ({}): Freescale: {}; here: {answer} (sync/async outbound period: {}).",
                sweep.rate,
                Study::Crossover.claim().replace(" and stays ahead", ""),
                ratio_list(&sizes, |s| Some(out_ns(sweep, sync, s)? / out_ns(sweep, async_, s)?))
            );
        }
        if let (Some(dual), Some(async_)) = (get(Style::DualPass), get(Style::Async)) {
            let bytes = ratio_list(&sizes, |s| {
                Some(
                    offload_of(sweep, dual, s)?.modelled.bus_bytes
                        / offload_of(sweep, async_, s)?.modelled.bus_bytes,
                )
            });
            let faster: Vec<String> = sizes
                .iter()
                .filter(|&&s| matches!((out_ns(sweep, dual, s), out_ns(sweep, async_, s)), (Some(d), Some(a)) if d < a))
                .map(|s| format!("{s} B"))
                .collect();
            let _ = writeln!(
                out,
                "- Dual-pass, {algorithm}: Freescale: {}; here: bus bytes dual/single {bytes}; dual-pass faster than async single-pass at {}.",
                Study::DualPass.claim(),
                if faster.is_empty() { "no size".to_owned() } else { faster.join(", ") }
            );
        }
        if let Some(null) = null {
            let beats: Vec<String> = styles
                .iter()
                .flat_map(|(st, sc)| {
                    sizes.iter().filter_map(move |&s| {
                        let n = out_ns(sweep, null, s)?;
                        let o = out_ns(sweep, *sc, s)?;
                        (o < n).then(|| format!("{st} at {s} B ({o:.0} < {n:.0} ns)"))
                    })
                })
                .collect();
            if !styles.is_empty() {
                let _ = writeln!(
                    out,
                    "- Ceiling, {algorithm}: Freescale: {}; here: {}.",
                    Study::Ceiling.claim(),
                    if beats.is_empty() {
                        format!("no sec style's outbound period is below {null}'s at any size")
                    } else {
                        format!(
                            "below {null} (its measured host time plus a modelled device that is faster than this host's stack): {}",
                            beats.join(", ")
                        )
                    }
                );
            }
        }
    }
    // Bus bytes per packet, per style, for every algorithm on sec.
    let mut rows = Vec::new();
    for &algorithm in algorithms {
        for st in Style::ALL {
            let Some(sc) = main_esp(sweep, algorithm, EngineKind::Sec, st).filter(|s| sweep.is_modelled(s))
            else {
                continue;
            };
            let cells: Vec<String> = sizes
                .iter()
                .map(|&s| {
                    offload_of(sweep, sc, s)
                        .map_or_else(|| "-".into(), |o| format!("{:.0}", o.modelled.bus_bytes))
                })
                .map(|v| format!("{v:>6}"))
                .collect();
            rows.push(format!("    {:<26}{}", sc.name(), cells.join("")));
        }
    }
    if !rows.is_empty() {
        let header: Vec<String> = sizes.iter().map(|s| format!("{s:>6}")).collect();
        let _ = writeln!(
            out,
            "- Bus bytes per packet, outbound (descriptor, keys/context, data in, data out; modelled):\n    {:<26}{}\n{}",
            "frame bytes",
            header.join(""),
            rows.join("\n")
        );
    }
    out
}

/// The first size at which `fast` takes less time than `slow` by `f`, and
/// whether it stays ahead at every larger measured size.
fn crossover_by(
    sweep: &Sweep,
    slow: Scenario,
    fast: Scenario,
    f: fn(&Sweep, Scenario, usize) -> Option<f64>,
) -> Option<(usize, bool)> {
    let pairs: Vec<(usize, f64, f64)> = sweep
        .sizes()
        .into_iter()
        .filter_map(|s| Some((s, f(sweep, slow, s)?, f(sweep, fast, s)?)))
        .collect();
    let first = pairs.iter().position(|(_, slow, fast)| fast < slow)?;
    let stays = pairs[first..].iter().all(|(_, slow, fast)| fast < slow);
    Some((pairs[first].0, stays))
}

fn study_two(sweep: &Sweep) -> String {
    let mut out = String::new();
    let sizes = sweep.sizes();
    for (base, scenario) in studies::extra_pairs(sweep, |_, _| true) {
        let knobs = studies::knobs_of(scenario);
        let parts: Vec<String> = sizes
            .iter()
            .filter_map(|&s| {
                let b = offload_of(sweep, base, s)?;
                let o = offload_of(sweep, scenario, s)?;
                let bp = out_ns(sweep, base, s)?;
                let op = out_ns(sweep, scenario, s)?;
                Some(format!(
                    "{s} B host {:.0} vs {:.0} ns ({}), period {:.0} vs {:.0} ns ({}), interrupts/packet {:.2} vs {:.2}",
                    o.host_total(),
                    b.host_total(),
                    percent_change(b.host_total(), o.host_total()),
                    op,
                    bp,
                    percent_change(bp, op),
                    o.modelled.interrupts,
                    b.modelled.interrupts
                ))
            })
            .collect();
        if parts.is_empty() {
            continue;
        }
        let (what, study) = if knobs.buffers != sweep.knobs.buffers {
            (
                format!("{} buffers instead of {}", knobs.buffers, sweep.knobs.buffers),
                format!(
                    "TrustZone: {}, {}; here per-request allocates a bounce buffer, copies in and out and frees it per request (both effects; measured host work)",
                    Study::Registration.claim(),
                    Study::Pointers.claim()
                ),
            )
        } else {
            (
                format!("{} completion instead of {}", knobs.completion, sweep.knobs.completion),
                format!(
                    "TrustZone: {}; here the interrupt cost is modelled (HostCosts), the polling spin charged to the host",
                    Study::Interrupts.claim()
                ),
            )
        };
        let _ = writeln!(out, "- {base} with {what}: {}. {study}.", parts.join("; "));
    }
    // The burst-size sweep.
    let mut bursts: Vec<(usize, &crate::offload::Offload, Scenario, usize)> = Vec::new();
    for scenario in sweep.scenarios() {
        let Scenario::Esp { knobs, .. } = scenario else {
            continue;
        };
        if knobs.profile != "none" || knobs.completion != crate::scenario::CompletionMode::Polling {
            continue;
        }
        let Some(&small) = sizes.first() else { continue };
        // Only the algorithm the burst cells were run for.
        if let Some(o) = offload_of(sweep, scenario, small) {
            bursts.push((knobs.burst, o, scenario, small));
        }
    }
    let burst_alg = bursts
        .iter()
        .find(|b| b.0 != crate::measure::BATCH)
        .map(|b| b.2.algorithm());
    bursts.retain(|b| Some(b.2.algorithm()) == burst_alg);
    bursts.sort_by_key(|b| b.0);
    if bursts.len() > 1 {
        let parts: Vec<String> = bursts
            .iter()
            .map(|(burst, o, _, _)| {
                format!(
                    "{burst}: host {:.0} ns ({:.0} measured + {:.0} modelled), {:.3} doorbells/packet",
                    o.host_total(),
                    o.host_measured(),
                    o.modelled.host_ns,
                    o.modelled.doorbells
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "- Burst size (frames per call, at most that many descriptors per doorbell), {} at {} B, profile none, polling: {}. TrustZone: {}.",
            burst_alg.flatten().map_or_else(String::new, |a| a.to_string()),
            bursts[0].3,
            parts.join("; "),
            Study::WorldSwitches.claim()
        );
    }
    out
}

fn boundary_and_fast_part(sweep: &Sweep, algorithms: &[Algorithm]) -> String {
    let mut out = String::new();
    let sizes = sweep.sizes();
    let null = sweep
        .scenarios()
        .into_iter()
        .find(|s| s.algorithm() == Some(Algorithm::Null) && !sweep.is_extra(s) && !sweep.is_modelled(s));
    let boundary = |algorithm| Scenario::Esp {
        algorithm,
        engine: EngineKind::Sec,
        style: Style::Async,
        knobs: crate::scenario::Knobs {
            profile: "none",
            completion: crate::scenario::CompletionMode::Polling,
            ..sweep.knobs
        },
    };
    let mut parts = Vec::new();
    for &algorithm in algorithms {
        let sc = boundary(algorithm);
        for &s in &sizes {
            let (Some(o), Some(n)) = (offload_of(sweep, sc, s), null.and_then(|n| out_ns(sweep, n, s)))
            else {
                continue;
            };
            parts.push(format!(
                "{algorithm} {s} B: {:.0} ns measured ({:.2}x), {:.0} ns with the modelled doorbell and completion misses ({:.2}x)",
                o.host_measured(),
                o.host_measured() / n,
                o.host_total(),
                o.host_total() / n
            ));
        }
    }
    if let (false, Some(null)) = (parts.is_empty(), null) {
        let _ = writeln!(
            out,
            "- Boundary cost (profile none: an infinitely fast engine; async single-pass, polling): the host's cost per packet against inline {null} ({}): {}. {}: {} ({}).",
            ratio_list(&sizes, |s| out_ns(sweep, null, s)).replace('x', " ns"),
            parts.join("; "),
            Study::Boundary.source(),
            Study::Boundary.claim(),
            Study::Boundary.figure()
        );
    }
    // When offload pays on a fast host: qat-class against soft inline.
    let mut lines = Vec::new();
    for &algorithm in algorithms {
        let qat = Scenario::Esp {
            algorithm,
            engine: EngineKind::Sec,
            style: Style::Async,
            knobs: crate::scenario::Knobs {
                profile: "qat-class",
                completion: crate::scenario::CompletionMode::Polling,
                ..sweep.knobs
            },
        };
        let Some(soft) = main_esp(sweep, algorithm, EngineKind::Soft, Style::Async) else {
            continue;
        };
        if !sweep.is_modelled(&qat) {
            continue;
        }
        let ratios = ratio_list(&sizes, |s| Some(out_ns(sweep, soft, s)? / out_ns(sweep, qat, s)?));
        let answer = match crossover_by(sweep, soft, qat, out_ns) {
            Some((size, true)) if Some(&size) == sizes.first() => "pays at every measured size".to_owned(),
            Some((size, true)) => format!("pays from {size} B"),
            Some((size, false)) => format!("pays at {size} B but not at every larger size"),
            None => "does not pay at any measured size: this host's software is faster".into(),
        };
        lines.push(format!("{algorithm}: {answer} (soft/qat outbound time {ratios})"));
    }
    if !lines.is_empty() {
        let _ = writeln!(
            out,
            "- Fast part (qat-class, async, polling) against soft inline on this host: {}.",
            lines.join("; ")
        );
    }
    out
}

fn study_four(sweep: &Sweep) -> String {
    let mut out = String::new();
    if sweep.speedups.is_empty() {
        return out;
    }
    let profiles: Vec<&str> = sweep.speedups[0].engine_ns.iter().map(|e| e.0).collect();
    let _ = writeln!(
        out,
        "- Engine vs software per primitive (microcontroller study: 3DES {}, AES {}, SHA-1/256 {} with real engines, growing with size).\n  Software: this host, measured; engine: the modelled part, one operation on an idle engine (latency) and per operation in a burst of 32 on one channel;\n  speed-up = software time / engine time (below 1x: this host beats the modelled part).",
        Study::Speedup3des.figure(),
        Study::SpeedupAes.figure(),
        Study::SpeedupSha.figure()
    );
    let mut header = format!("    {:<14}{:>7}{:>10}", "primitive", "bytes", "soft ns");
    for p in &profiles {
        header += &format!("  {:>26}", format!("{p}: idle / burst"));
    }
    let _ = writeln!(out, "{header}");
    let mut beats = Vec::new();
    for s in &sweep.speedups {
        let mut line = format!("    {:<14}{:>7}{:>10.0}", s.primitive, s.payload, s.software_ns);
        for (profile, idle, burst) in &s.engine_ns {
            let sp = |e: f64| if e > 0.0 { s.software_ns / e } else { f64::INFINITY };
            line += &format!(
                "  {:>26}",
                format!(
                    "{idle:.0} ns {:.2}x / {burst:.0} ns {:.2}x",
                    sp(*idle),
                    sp(*burst)
                )
            );
            if sp(*burst) < 1.0 {
                beats.push(format!("{} {} B on {profile}", s.primitive, s.payload));
            }
        }
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "  This host beats the modelled part (even with many in flight) for: {}.",
        if beats.is_empty() {
            "nothing".to_owned()
        } else {
            beats.join(", ")
        }
    );
    out
}

/// The sweep as `--json` and the report's bench.json hold it: machine,
/// conditions, study answers, tenant rows, settings and speed-ups, and per
/// cell its ns, packets/s, Gbit/s, estimated cycles, spread and metrics.
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
                "offload": c.offload.as_ref().map(|o| json!({
                    "host_measured_ns": o.host_measured(),
                    "host_measured_ns_repetitions": o.host_measured_ns,
                    "host_total_ns": o.host_total(),
                    "modelled": o.modelled,
                })),
            })
        })
        .collect();
    json!({
        "machine": sweep.machine,
        "conditions": sweep.conditions,
        "studies": studies::answers(sweep),
        "tenants": sweep.tenants,
        "slice_ms": sweep.slice_ms,
        "repetitions": sweep.repetitions,
        "engine": sweep.engine,
        "knobs": sweep.knobs,
        "rate": sweep.rate,
        "packets": sweep.packets,
        "sec_threads": sweep.threads,
        "speedups": sweep.speedups,
        "cells": cells,
    })
}

/// Writes one CSV row per cell to `path` (`--csv`, the report's bench.csv):
/// scenario, path, size, ns, packets/s, Gbit/s, estimated cycles, spread
/// and metrics, then the `sec` cells' offload figures (empty for other
/// cells). Fails if `path` cannot be created or written.
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
        "host_measured_ns",
        "host_modelled_ns",
        "timeline_ns",
        "latency_ns",
        "engine_ns",
        "bus_utilisation",
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
            offload(c, |o| format!("{:.1}", o.host_measured())),
            offload(c, |o| format!("{:.1}", o.modelled.host_ns)),
            offload(c, |o| format!("{:.1}", o.modelled.timeline_ns)),
            offload(c, |o| format!("{:.1}", o.modelled.latency_ns)),
            offload(c, |o| format!("{:.1}", o.modelled.engine_ns)),
            offload(c, |o| format!("{:.4}", o.modelled.bus_utilisation)),
        ])?;
    }
    writer.flush()?;
    Ok(())
}

/// A `sec` cell's offload figure as CSV text; empty for other cells.
fn offload(cell: &crate::Cell, figure: impl Fn(&crate::offload::Offload) -> String) -> String {
    cell.offload.as_ref().map_or_else(String::new, figure)
}
