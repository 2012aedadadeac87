//! The published figures the lab compares itself against, and this run's
//! answer to each: the studies side by side.
//!
//! Owns: the one copy of every published figure (the derived lines of
//! [`crate::report`], the shared-engine lines of [`crate::tenants`], the
//! HTML report and the terminal summary all quote these constants), and the
//! rule that says whether a run's figure has the study's shape. Must not:
//! measure anything, or hold a figure of this machine; every number it
//! prints beside a published one comes from the [`Sweep`] it is given.

use accel::{Algorithm, BufferPolicy, EngineKind, Style};

use crate::offload::Offload;
use crate::scenario::{CompletionMode, Knobs, Scenario};
use crate::tenants::{Mode, Row};
use crate::{Path, Sweep};

/// Freescale's SEC study: ESP null/null over plain forwarding, in cycles.
pub const STACK_RATIO: f64 = 3.2;
/// Freescale: async single-pass overtakes sync between these frame sizes.
pub const CROSSOVER_BYTES: (usize, usize) = (64, 256);
/// TrustZone: registering buffers once and reusing them saved up to this
/// share of cycles.
pub const REGISTRATION_SAVING: f64 = 0.37;
/// TrustZone: passing pointers instead of copies saved up to this share.
pub const POINTER_SAVING: f64 = 0.39;
/// TrustZone: interrupts taken during the engine's work added up to this
/// share to a call ...
pub const INTERRUPT_ADDED: f64 = 0.60;
/// ... and this much with interrupts masked.
pub const INTERRUPT_MASKED: &str = "2–4.5 %";
/// TrustZone: world switches took up to this share of cycles at 1 KB ...
pub const WORLD_SWITCH_SHARE: f64 = 0.49;
/// ... and this share with a buffer sized for fewer calls.
pub const WORLD_SWITCH_SHARE_FEWER: f64 = 0.31;
/// The microcontroller study: a 3DES engine ran about this many times
/// software.
pub const SPEEDUP_3DES: f64 = 10.0;
/// The microcontroller study: an AES engine ran about this many times
/// software.
pub const SPEEDUP_AES: f64 = 7.0;
/// The microcontroller study: a SHA-1/SHA-256 engine ran about this many
/// times software.
pub const SPEEDUP_SHA: f64 = 2.0;
/// DPDK ipsec-secgw on CN106xx: host cycles per packet with look-aside
/// crypto.
pub const DPDK_LOOKASIDE_CYCLES: f64 = 390.0;
/// DPDK ipsec-secgw on CN106xx: host cycles per packet with look-aside
/// protocol offload.
pub const DPDK_PROTOCOL_CYCLES: f64 = 280.0;
/// The shared-engine study: one tenant over shared memory reached this
/// share of the host's own throughput ...
pub const SHM_OF_HOST: f64 = 0.95;
/// ... which this project holds as a bar of at least this share.
pub const SHM_OF_HOST_BAR: f64 = 0.90;
/// ... and shared memory beat the socket transport: (request bytes, shm
/// Mb/s, socket Mb/s).
pub const SHM_OVER_SOCKET: [(usize, f64, f64); 2] = [(4096, 2000.0, 1600.0), (8192, 4000.0, 3000.0)];
/// The bar this project holds for shm over socket.
pub const SHM_OVER_SOCKET_BAR: f64 = 1.2;
/// Request size of the shm-over-host comparison.
pub const SHM_OF_HOST_BYTES: usize = 1420;
/// Request sizes the shared-engine rows of a sweep measure.
pub const TENANT_SIZES: [usize; 3] = [SHM_OF_HOST_BYTES, SHM_OVER_SOCKET[0].0, SHM_OVER_SOCKET[1].0];

/// One published figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, strum::IntoStaticStr, strum::VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Study {
    /// Freescale: ESP null/null against plain IPv4 forwarding per packet
    /// ([`STACK_RATIO`]).
    Stack,
    /// Freescale: the frame size where async single-pass overtakes sync
    /// ([`CROSSOVER_BYTES`]).
    Crossover,
    /// Freescale: dual-pass is never faster than single-pass.
    DualPass,
    /// Freescale: no look-aside style beats ESP null/null.
    Ceiling,
    /// TrustZone: registering buffers once and reusing them
    /// ([`REGISTRATION_SAVING`]).
    Registration,
    /// TrustZone: passing pointers instead of copies ([`POINTER_SAVING`]).
    Pointers,
    /// TrustZone: interrupts taken during the engine's work
    /// ([`INTERRUPT_ADDED`]).
    Interrupts,
    /// TrustZone: the cycles boundary crossings take
    /// ([`WORLD_SWITCH_SHARE`]).
    WorldSwitches,
    /// The microcontroller study: a 3DES engine over software
    /// ([`SPEEDUP_3DES`]).
    Speedup3des,
    /// The microcontroller study: an AES (CBC, GCM) engine over software
    /// ([`SPEEDUP_AES`]).
    SpeedupAes,
    /// The microcontroller study: an HMAC-SHA-1/256 engine over software
    /// ([`SPEEDUP_SHA`]).
    SpeedupSha,
    /// DPDK ipsec-secgw: the look-aside boundary's own host cost per
    /// packet ([`DPDK_LOOKASIDE_CYCLES`] over [`DPDK_PROTOCOL_CYCLES`]).
    Boundary,
    /// The shared-engine study: one tenant over shared memory against the
    /// engine in-process ([`SHM_OF_HOST`]).
    ShmOfHost,
    /// The shared-engine study: the shared-memory transport against the
    /// socket ([`SHM_OVER_SOCKET`]).
    ShmOverSocket,
}

impl Study {
    /// Every study, in the order the summary, report and JSON list them.
    pub const ALL: &'static [Study] = <Study as strum::VariantArray>::VARIANTS;

    /// The stable key (HTML `data-study`, JSON).
    pub fn key(self) -> &'static str {
        self.into()
    }

    /// Where the figure was published.
    pub fn source(self) -> &'static str {
        match self {
            Study::Stack | Study::Crossover | Study::DualPass | Study::Ceiling => "Freescale SEC study",
            Study::Registration | Study::Pointers | Study::Interrupts | Study::WorldSwitches => {
                "TrustZone study"
            }
            Study::Speedup3des | Study::SpeedupAes | Study::SpeedupSha => "microcontroller study",
            Study::Boundary => "DPDK ipsec-secgw, CN106xx",
            Study::ShmOfHost | Study::ShmOverSocket => "shared-engine study",
        }
    }

    /// A short name for the row.
    pub fn title(self) -> &'static str {
        match self {
            Study::Stack => "Stack cost: ESP null/null over forwarding",
            Study::Crossover => "Crossover: async single-pass overtakes sync",
            Study::DualPass => "Dual-pass against single-pass",
            Study::Ceiling => "Ceiling: no look-aside style beats null/null",
            Study::Registration => "Registering buffers once",
            Study::Pointers => "Pointers instead of copies",
            Study::Interrupts => "Interrupts during the engine's work",
            Study::WorldSwitches => "Boundary crossings (world switches)",
            Study::Speedup3des => "Engine over software: 3DES",
            Study::SpeedupAes => "Engine over software: AES",
            Study::SpeedupSha => "Engine over software: SHA",
            Study::Boundary => "The boundary's own host cost",
            Study::ShmOfHost => "One tenant over shared memory against in-process",
            Study::ShmOverSocket => "Shared memory against a socket",
        }
    }

    /// The published figure, briefly.
    pub fn figure(self) -> String {
        match self {
            Study::Stack => format!("{STACK_RATIO}x (cycles)"),
            Study::Crossover => format!("{}–{} B", CROSSOVER_BYTES.0, CROSSOVER_BYTES.1),
            Study::DualPass => "never faster".into(),
            Study::Ceiling => "none beats it".into(),
            Study::Registration => format!("up to {} % saved", pct(REGISTRATION_SAVING)),
            Study::Pointers => format!("up to {} % saved", pct(POINTER_SAVING)),
            Study::Interrupts => format!("up to +{} % per call", pct(INTERRUPT_ADDED)),
            Study::WorldSwitches => format!("up to {} % of cycles", pct(WORLD_SWITCH_SHARE)),
            Study::Speedup3des => format!("~{SPEEDUP_3DES}x"),
            Study::SpeedupAes => format!("~{SPEEDUP_AES}x"),
            Study::SpeedupSha => format!("~{SPEEDUP_SHA}x"),
            Study::Boundary => format!("{:.2}x", DPDK_LOOKASIDE_CYCLES / DPDK_PROTOCOL_CYCLES),
            Study::ShmOfHost => format!("≥ {} % of host", pct(SHM_OF_HOST)),
            Study::ShmOverSocket => format!(
                "{:.2}–{:.2}x",
                SHM_OVER_SOCKET[0].1 / SHM_OVER_SOCKET[0].2,
                SHM_OVER_SOCKET[1].1 / SHM_OVER_SOCKET[1].2
            ),
        }
    }

    /// What the study found, in a sentence.
    pub fn claim(self) -> String {
        match self {
            Study::Stack => format!(
                "ESP with null cipher and null MAC cost {STACK_RATIO}x the cycles of plain IPv4 forwarding per packet"
            ),
            Study::Crossover => format!(
                "async single-pass overtakes sync between {} and {} B and stays ahead",
                CROSSOVER_BYTES.0, CROSSOVER_BYTES.1
            ),
            Study::DualPass => "dual-pass moves the data twice and is never faster than single-pass".into(),
            Study::Ceiling => "no look-aside style beats ESP null/null".into(),
            Study::Registration => format!(
                "registering buffers once and reusing them saved up to {} % of cycles",
                pct(REGISTRATION_SAVING)
            ),
            Study::Pointers => format!(
                "passing pointers instead of copying the data saved up to {} % of cycles",
                pct(POINTER_SAVING)
            ),
            Study::Interrupts => format!(
                "taking interrupts during the engine's work added up to {} % to a call ({INTERRUPT_MASKED} masked)",
                pct(INTERRUPT_ADDED)
            ),
            Study::WorldSwitches => format!(
                "world switches took up to {} % of cycles at 1 KB, {} % with a buffer sized for fewer calls",
                pct(WORLD_SWITCH_SHARE),
                pct(WORLD_SWITCH_SHARE_FEWER)
            ),
            Study::Speedup3des => format!("a 3DES engine ran about {SPEEDUP_3DES}x software, growing with size"),
            Study::SpeedupAes => format!("an AES engine ran about {SPEEDUP_AES}x software, growing with size"),
            Study::SpeedupSha => format!("a SHA-1/256 engine ran about {SPEEDUP_SHA}x software, growing with size"),
            Study::Boundary => format!(
                "about {DPDK_LOOKASIDE_CYCLES} host cycles per packet with look-aside crypto, {DPDK_PROTOCOL_CYCLES} with look-aside protocol offload"
            ),
            Study::ShmOfHost => format!(
                "a guest reached {} %+ of the host's own throughput through shared memory",
                pct(SHM_OF_HOST)
            ),
            Study::ShmOverSocket => {
                let [(s1, a1, b1), (s2, a2, b2)] = SHM_OVER_SOCKET;
                format!(
                    "shared memory beat the socket: {a1} vs {b1} Mb/s at {} KB ({:.2}x), {a2} vs {b2} Mb/s at {} KB ({:.2}x)",
                    s1 / 1024,
                    a1 / b1,
                    s2 / 1024,
                    a2 / b2
                )
            }
        }
    }

    /// The shape this run is held to, in a few words.
    pub fn shape(self) -> String {
        match self {
            Study::Stack => "ESP null/null slower than forwarding".into(),
            Study::Crossover => format!(
                "sync ahead at {} B, async ahead from ≤ {} B on",
                CROSSOVER_BYTES.0, CROSSOVER_BYTES.1
            ),
            Study::DualPass => "dual-pass faster at no size".into(),
            Study::Ceiling => "no sec period below esp-null's".into(),
            Study::Registration | Study::Pointers => "registered buffers cheaper at every size".into(),
            Study::Interrupts => "interrupts add to the time per packet".into(),
            Study::WorldSwitches => "fewer calls per packet cost the host less".into(),
            Study::Speedup3des | Study::SpeedupAes | Study::SpeedupSha => {
                "an engine beats this host's software at 1 KB".into()
            }
            Study::Boundary => "the boundary costs the host more than inline".into(),
            Study::ShmOfHost => format!("sec: ≥ {} % of in-process", pct(SHM_OF_HOST_BAR)),
            Study::ShmOverSocket => format!("soft: shm ≥ {SHM_OVER_SOCKET_BAR}x socket"),
        }
    }
}

/// A per-packet count: `2`, `0.12`.
fn count(v: f64) -> String {
    if (v - v.round()).abs() < 0.005 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// `1 descriptor`, `2 descriptors`, `0.12 interrupts`.
fn per_packet(v: f64, noun: &str) -> String {
    let n = count(v);
    if n == "1" {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn pct(share: f64) -> String {
    format!("{:.0}", share * 100.0)
}

/// Whether a run's figure has the study's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// This run's figure has the study's shape wherever it was checked.
    Holds,
    /// Holds for some algorithms or sizes, not all.
    Partly,
    /// This run's figure has the shape nowhere it was checked.
    Differs,
    /// This run has no cells for it.
    NotMeasured,
}

impl Verdict {
    /// The verdict as the summary and the HTML report print it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Partly => "partly",
            Verdict::Differs => "differs",
            Verdict::NotMeasured => "not measured",
        }
    }

    fn of(held: usize, of: usize) -> Verdict {
        match (held, of) {
            (_, 0) => Verdict::NotMeasured,
            (h, o) if h == o => Verdict::Holds,
            (0, _) => Verdict::Differs,
            _ => Verdict::Partly,
        }
    }
}

/// One published figure beside this run's.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Answer {
    /// The published figure answered (its kebab-case key in the JSON).
    pub study: Study,
    /// This run's figure, briefly.
    pub here: String,
    /// Whether this run's figure has the study's shape.
    pub verdict: Verdict,
    /// Why the shape does not hold (or what was not measured), one sentence.
    pub why: Option<String>,
}

impl Answer {
    fn new(study: Study, here: String, verdict: Verdict, why: Option<String>) -> Answer {
        Answer {
            study,
            here,
            verdict,
            why: if verdict == Verdict::Holds { None } else { why },
        }
    }

    fn not_measured(study: Study, what: &str) -> Answer {
        Answer {
            study,
            here: "-".into(),
            verdict: Verdict::NotMeasured,
            why: Some(format!("not in this run: {what}")),
        }
    }
}

/// Every published figure beside this run's, in [`Study::ALL`] order.
pub fn answers(sweep: &Sweep) -> Vec<Answer> {
    Study::ALL.iter().map(|&study| answer(sweep, study)).collect()
}

/// This run's answer to `study`, from `sweep`'s cells (not measured where
/// the sweep lacks them).
pub fn answer(sweep: &Sweep, study: Study) -> Answer {
    match study {
        Study::Stack => stack(sweep),
        Study::Crossover => crossover(sweep),
        Study::DualPass => dual_pass(sweep),
        Study::Ceiling => ceiling(sweep),
        Study::Registration | Study::Pointers => registration(sweep, study),
        Study::Interrupts => interrupts(sweep),
        Study::WorldSwitches => world_switches(sweep),
        Study::Speedup3des => speedup(sweep, study, &["3DES-CBC"]),
        Study::SpeedupAes => speedup(sweep, study, &["AES-128-CBC", "AES-128-GCM"]),
        Study::SpeedupSha => speedup(sweep, study, &["HMAC-SHA-1", "HMAC-SHA-256"]),
        Study::Boundary => boundary(sweep),
        Study::ShmOfHost => shm_of_host(sweep),
        Study::ShmOverSocket => shm_over_socket(sweep),
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn range(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
        (lo.min(x), hi.max(x))
    })
}

/// Outbound system time per packet (sec model: the period; others: encap ns).
pub(crate) fn out_ns(sweep: &Sweep, scenario: Scenario, size: usize) -> Option<f64> {
    sweep.get(scenario, Path::Encap, size).map(|c| c.ns())
}

pub(crate) fn offload_of(sweep: &Sweep, scenario: Scenario, size: usize) -> Option<&Offload> {
    sweep.get(scenario, Path::Encap, size)?.offload.as_ref()
}

/// At each size where both were measured, `esp`'s outbound time over
/// `fwd`'s: what the ESP stack costs over plain forwarding.
pub(crate) fn time_ratios(sweep: &Sweep, esp: Scenario, fwd: Scenario) -> Vec<(usize, f64)> {
    sweep
        .sizes()
        .into_iter()
        .filter_map(|s| Some((s, out_ns(sweep, esp, s)? / out_ns(sweep, fwd, s)?)))
        .collect()
}

/// The main-sweep `esp-null` scenario (inline, not a comparison cell).
pub(crate) fn null_scenario(sweep: &Sweep) -> Option<Scenario> {
    sweep
        .scenarios()
        .into_iter()
        .find(|s| s.algorithm() == Some(Algorithm::Null) && !s.is_ipv6() && !sweep.is_extra(s))
}

/// The main sweep's algorithms other than null, in sweep order.
pub(crate) fn algorithms(sweep: &Sweep) -> Vec<Algorithm> {
    let mut list = Vec::new();
    for a in sweep.scenarios().iter().filter_map(Scenario::algorithm) {
        if a != Algorithm::Null && !list.contains(&a) {
            list.push(a);
        }
    }
    list
}

/// The main-sweep sec model scenario of `algorithm` in `style`.
pub(crate) fn sec_style(sweep: &Sweep, algorithm: Algorithm, style: Style) -> Option<Scenario> {
    let s = Scenario::Esp {
        algorithm,
        engine: EngineKind::Sec,
        style,
        knobs: sweep.knobs,
    };
    sweep.is_modelled(&s).then_some(s)
}

/// The boundary-cost scenario (profile none, async, polling) of `algorithm`.
pub(crate) fn boundary_scenario(sweep: &Sweep, algorithm: Algorithm) -> Scenario {
    Scenario::Esp {
        algorithm,
        engine: EngineKind::Sec,
        style: Style::Async,
        knobs: Knobs {
            profile: "none",
            completion: CompletionMode::Polling,
            ..sweep.knobs
        },
    }
}

/// The first size at which `fast` takes less outbound time than `slow`,
/// the measured size below it, and whether `fast` stays ahead at every
/// larger measured size.
pub(crate) fn crossover_of(sweep: &Sweep, slow: Scenario, fast: Scenario) -> Option<Crossing> {
    let pairs: Vec<(usize, f64, f64)> = sweep
        .sizes()
        .into_iter()
        .filter_map(|s| Some((s, out_ns(sweep, slow, s)?, out_ns(sweep, fast, s)?)))
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let Some(first) = pairs.iter().position(|(_, slow, fast)| fast < slow) else {
        return Some(Crossing::Never {
            largest: pairs[pairs.len() - 1].0,
        });
    };
    Some(Crossing::At {
        size: pairs[first].0,
        below: first.checked_sub(1).map(|i| pairs[i].0),
        stays: pairs[first..].iter().all(|(_, slow, fast)| fast < slow),
    })
}

/// Where one style overtakes another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crossing {
    /// Ahead from `size`; `below` is the measured size before it (None:
    /// already ahead at the smallest).
    At {
        /// The first measured frame size, in bytes, where it is ahead.
        size: usize,
        /// The measured size just below `size`, in bytes.
        below: Option<usize>,
        /// It stays ahead at every larger measured size.
        stays: bool,
    },
    /// Behind up to the largest measured size.
    Never {
        /// The largest measured frame size, in bytes.
        largest: usize,
    },
}

impl Crossing {
    /// `256–512 B`, `≤ 64 B`, `> 1518 B`.
    pub fn label(self) -> String {
        match self {
            Crossing::At {
                size, below: Some(b), ..
            } => format!("{b}–{size} B"),
            Crossing::At {
                size, below: None, ..
            } => format!("≤ {size} B"),
            Crossing::Never { largest } => format!("> {largest} B"),
        }
    }
}

fn stack(sweep: &Sweep) -> Answer {
    let Some(null) = null_scenario(sweep) else {
        return Answer::not_measured(
            Study::Stack,
            "esp-null and ipv4-fwd (--scenarios ipv4-fwd,esp-null)",
        );
    };
    let cells: Vec<(f64, f64)> = sweep
        .sizes()
        .iter()
        .filter_map(|&s| {
            let esp = sweep.get(null, Path::Encap, s)?;
            let fwd = sweep.get(Scenario::Ipv4Forward, Path::Encap, s)?;
            Some((
                esp.ns() / fwd.ns(),
                esp.samples.spread().max(fwd.samples.spread()),
            ))
        })
        .collect();
    let ratios: Vec<f64> = cells.iter().map(|c| c.0).collect();
    let Some(m) = median(ratios.clone()) else {
        return Answer::not_measured(
            Study::Stack,
            "esp-null and ipv4-fwd (--scenarios ipv4-fwd,esp-null)",
        );
    };
    let (lo, hi) = range(&ratios);
    let spread = cells.iter().map(|c| c.1).fold(0.0, f64::max);
    Answer::new(
        Study::Stack,
        format!("{m:.2}x time (median of {} sizes, {lo:.2}–{hi:.2}x)", ratios.len()),
        if m > 1.0 { Verdict::Holds } else { Verdict::Differs },
        Some(format!(
            "esp-null took no longer than ipv4-fwd in this run; the cells' spread ({:.0} %) is larger than the difference, so repeat with longer slices",
            spread * 100.0
        )),
    )
}

fn crossover(sweep: &Sweep) -> Answer {
    let (lo, hi) = CROSSOVER_BYTES;
    let mut parts = Vec::new();
    let mut why: Vec<(String, Vec<String>)> = Vec::new();
    let mut held = 0;
    let algorithms: Vec<Algorithm> = algorithms(sweep);
    let mut of = 0;
    for &a in &algorithms {
        let (Some(sync), Some(async_)) = (
            sec_style(sweep, a, Style::Sync),
            sec_style(sweep, a, Style::Async),
        ) else {
            continue;
        };
        let Some(crossing) = crossover_of(sweep, sync, async_) else {
            continue;
        };
        of += 1;
        parts.push(format!("{a} {}", crossing.label()));
        let holds =
            matches!(crossing, Crossing::At { size, below: Some(b), stays: true } if b >= lo && size <= hi);
        if holds {
            held += 1;
            continue;
        }
        // The model's structure says why: descriptors and interrupts per
        // packet of each style at the size where they part.
        let at = match crossing {
            Crossing::At { size, .. } => size,
            Crossing::Never { largest } => largest,
        };
        let per =
            |s: Scenario| offload_of(sweep, s, at).map(|o| (o.modelled.descriptors, o.modelled.interrupts));
        let (Some((ds, is)), Some((da, ia))) = (per(sync), per(async_)) else {
            continue;
        };
        let reason = match crossing {
            Crossing::At { below: None, size, .. } if ds > da => format!(
                "sync takes {} per packet to async's {}, and the extra setup outweighs async's {} already at {size} B",
                per_packet(ds, "descriptor"), count(da), per_packet(ia, "interrupt")
            ),
            Crossing::At { below: None, size, .. } => format!("async is ahead already at {size} B"),
            Crossing::At { stays: false, size, .. } => {
                format!("async leads at {size} B but not at every larger size")
            }
            Crossing::At { below: Some(b), .. } | Crossing::Never { largest: b } if ia > is => format!(
                "sync takes {} and waits for no interrupt, so async's {} per packet keeps it behind up to {b} B",
                per_packet(ds, "descriptor"), per_packet(ia, "interrupt")
            ),
            Crossing::At { below: Some(b), .. } | Crossing::Never { largest: b } => {
                format!("async stays behind up to {b} B")
            }
        };
        // One sentence: algorithms that part for the same reason together.
        match why
            .iter_mut()
            .find(|(r, _): &&mut (String, Vec<String>)| *r == reason)
        {
            Some((_, names)) => names.push(a.to_string()),
            None => why.push((reason, vec![a.to_string()])),
        }
    }
    if of == 0 {
        return Answer::not_measured(
            Study::Crossover,
            "sec in sync and async (--engine sec or the default)",
        );
    }
    Answer::new(
        Study::Crossover,
        parts.join("; "),
        Verdict::of(held, of),
        Some(
            why.iter()
                .map(|(reason, names)| format!("{}: {reason}", names.join(", ")))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    )
}

fn dual_pass(sweep: &Sweep) -> Answer {
    let sizes = sweep.sizes();
    let mut ratios = Vec::new();
    let mut faster = Vec::new();
    let mut aead_ties = Vec::new();
    let mut of = 0;
    let mut held = 0;
    for a in algorithms(sweep) {
        let (Some(dual), Some(single)) = (
            sec_style(sweep, a, Style::DualPass),
            sec_style(sweep, a, Style::Async),
        ) else {
            continue;
        };
        of += 1;
        let mut fast_here = Vec::new();
        for &s in &sizes {
            if let (Some(d), Some(o)) = (offload_of(sweep, dual, s), offload_of(sweep, single, s)) {
                ratios.push(d.modelled.bus_bytes / o.modelled.bus_bytes);
            }
            if let (Some(d), Some(o)) = (out_ns(sweep, dual, s), out_ns(sweep, single, s)) {
                if d < o {
                    fast_here.push(format!("{s} B"));
                }
            }
        }
        if fast_here.is_empty() {
            held += 1;
        } else {
            if a.is_aead() {
                aead_ties.push(a);
            }
            faster.push(format!("{a} at {}", fast_here.join(", ")));
        }
    }
    if of == 0 {
        return Answer::not_measured(Study::DualPass, "sec in dual-pass and async");
    }
    let (lo, hi) = range(&ratios);
    let here = format!(
        "bus bytes dual/single {lo:.2}–{hi:.2}x; faster at {}",
        if faster.is_empty() {
            "no size".to_owned()
        } else {
            faster.join("; ")
        }
    );
    let why = if aead_ties.len() == faster.len() {
        format!(
            "{} cannot be split into cipher and MAC passes, so dual-pass is the same single descriptor as async (same bus bytes) and the measured host noise decides which is ahead",
            aead_ties.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")
        )
    } else {
        "dual-pass moved more bytes but its period was shorter: the host's own work, not the bus, set the pace at those sizes".into()
    };
    Answer::new(Study::DualPass, here, Verdict::of(held, of), Some(why))
}

fn ceiling(sweep: &Sweep) -> Answer {
    let Some(null) = null_scenario(sweep) else {
        return Answer::not_measured(Study::Ceiling, "esp-null");
    };
    let sizes = sweep.sizes();
    let mut beats = Vec::new();
    let mut cells = 0;
    for a in algorithms(sweep) {
        for st in Style::ALL {
            let Some(sc) = sec_style(sweep, a, st) else {
                continue;
            };
            for &s in &sizes {
                let (Some(n), Some(o)) = (out_ns(sweep, null, s), out_ns(sweep, sc, s)) else {
                    continue;
                };
                cells += 1;
                if o < n {
                    beats.push(format!("{a}/{st} at {s} B"));
                }
            }
        }
    }
    if cells == 0 {
        return Answer::not_measured(Study::Ceiling, "the sec styles beside esp-null");
    }
    let here = if beats.is_empty() {
        format!("no sec period below {null}'s ({cells} cells)")
    } else {
        let shown: Vec<String> = beats.iter().take(3).cloned().collect();
        format!(
            "{} of {cells} cells below {null}: {}{}",
            beats.len(),
            shown.join(", "),
            if beats.len() > 3 { ", …" } else { "" }
        )
    };
    Answer::new(
        Study::Ceiling,
        here,
        if beats.is_empty() { Verdict::Holds } else { Verdict::Differs },
        Some(format!(
            "the modelled device ({}) finished those packets sooner than this host runs {null} inline, so overlapping host and device beat the inline path",
            sweep.rate
        )),
    )
}

/// The comparison cells whose knobs differ from the main ones by `differs`.
pub(crate) fn extra_pairs(
    sweep: &Sweep,
    differs: impl Fn(&Knobs, &Knobs) -> bool,
) -> Vec<(Scenario, Scenario)> {
    let mut pairs = Vec::new();
    for scenario in sweep.scenarios().iter().filter(|s| sweep.is_extra(s)) {
        let Scenario::Esp {
            algorithm,
            engine,
            style,
            knobs,
        } = *scenario
        else {
            continue;
        };
        if knobs.profile != sweep.knobs.profile || knobs.burst != sweep.knobs.burst {
            continue;
        }
        if !differs(&knobs, &sweep.knobs) {
            continue;
        }
        let base = Scenario::Esp {
            algorithm,
            engine,
            style,
            knobs: sweep.knobs,
        };
        pairs.push((base, *scenario));
    }
    pairs
}

/// The knobs of an ESP scenario (the defaults for any other).
pub(crate) fn knobs_of(s: Scenario) -> Knobs {
    match s {
        Scenario::Esp { knobs, .. } => knobs,
        _ => Knobs::default(),
    }
}

fn registration(sweep: &Sweep, study: Study) -> Answer {
    let pairs = extra_pairs(sweep, |k, base| {
        k.buffers != base.buffers && k.completion == base.completion
    });
    let Some(&(base, other)) = pairs.first() else {
        return Answer::not_measured(study, "the per-request buffer comparison (--scenarios extra)");
    };
    let (registered, per_request) = if knobs_of(base).buffers == BufferPolicy::Registered {
        (base, other)
    } else {
        (other, base)
    };
    let mut parts = Vec::new();
    let mut held = 0;
    let mut of = 0;
    let mut spread: f64 = 0.0;
    for s in sweep.sizes() {
        let (Some(r), Some(p)) = (
            offload_of(sweep, registered, s),
            offload_of(sweep, per_request, s),
        ) else {
            continue;
        };
        of += 1;
        let saved = (p.host_total() - r.host_total()) / p.host_total();
        if saved > 0.0 {
            held += 1;
        }
        for o in [r, p] {
            let (lo, hi) = range(&o.host_measured_ns);
            spread = spread.max((hi - lo) / o.host_measured());
        }
        parts.push(format!("{:.0} % at {s} B", saved * 100.0));
    }
    if of == 0 {
        return Answer::not_measured(study, "the per-request buffer comparison (--scenarios extra)");
    }
    let both = if study == Study::Pointers {
        " (the same cells: per-request allocates and copies)"
    } else {
        ""
    };
    Answer::new(
        study,
        format!("registered saves {} of host time{both}", parts.join(", ")),
        Verdict::of(held, of),
        Some(format!(
            "a per-request bounce buffer costs this host little beside the rest of the packet's work: the difference is within the repetitions' spread ({:.0} %)",
            spread * 100.0
        )),
    )
}

fn interrupts(sweep: &Sweep) -> Answer {
    // Interrupt against polling, the other knobs the same.
    let mut with = None;
    let mut without = None;
    for s in sweep.scenarios() {
        let Scenario::Esp {
            algorithm,
            engine: EngineKind::Sec,
            style: Style::Async,
            knobs,
        } = s
        else {
            continue;
        };
        if knobs.profile != sweep.knobs.profile
            || knobs.burst != sweep.knobs.burst
            || knobs.buffers != sweep.knobs.buffers
        {
            continue;
        }
        let slot = match knobs.completion {
            CompletionMode::Interrupt => &mut with,
            CompletionMode::Polling => &mut without,
            CompletionMode::Coalesced => continue,
        };
        if slot.is_none() && (sweep.is_extra(&s) || extra_algorithm(sweep) == Some(algorithm)) {
            *slot = Some(s);
        }
    }
    let (Some(with), Some(without)) = (with, without) else {
        return Answer::not_measured(Study::Interrupts, "the completion comparison (--scenarios extra)");
    };
    let mut added = Vec::new();
    let mut parts = Vec::new();
    for s in sweep.sizes() {
        let (Some(i), Some(p)) = (out_ns(sweep, with, s), out_ns(sweep, without, s)) else {
            continue;
        };
        added.push(i / p - 1.0);
        parts.push(format!("{:+.0} % at {s} B", (i / p - 1.0) * 100.0));
    }
    let Some(max) = added.iter().copied().reduce(f64::max) else {
        return Answer::not_measured(Study::Interrupts, "the completion comparison (--scenarios extra)");
    };
    Answer::new(
        Study::Interrupts,
        format!("interrupt over polling period {}", parts.join(", ")),
        if max > 0.0 { Verdict::Holds } else { Verdict::Differs },
        Some("the device, not the host, set the period at every size here, so the modelled interrupt was hidden behind it".into()),
    )
}

/// The algorithm of the registration/completion comparison cells.
fn extra_algorithm(sweep: &Sweep) -> Option<Algorithm> {
    sweep
        .scenarios()
        .iter()
        .find(|s| sweep.is_extra(s) && knobs_of(**s).profile == sweep.knobs.profile)
        .and_then(Scenario::algorithm)
}

/// The burst-size cells: (burst, offload), ascending, of one algorithm.
pub(crate) fn bursts(sweep: &Sweep) -> Vec<(usize, Scenario, &Offload)> {
    let Some(&small) = sweep.sizes().first() else {
        return Vec::new();
    };
    let mut list: Vec<(usize, Scenario, &Offload)> = Vec::new();
    for scenario in sweep.scenarios() {
        let Scenario::Esp { knobs, .. } = scenario else {
            continue;
        };
        if knobs.profile != "none" || knobs.completion != CompletionMode::Polling {
            continue;
        }
        if let Some(o) = offload_of(sweep, scenario, small) {
            list.push((knobs.burst, scenario, o));
        }
    }
    // Only the algorithm the burst cells were run for.
    let alg = list
        .iter()
        .find(|b| b.0 != crate::measure::BATCH)
        .map(|b| b.1.algorithm());
    list.retain(|b| Some(b.1.algorithm()) == alg);
    list.sort_by_key(|b| b.0);
    list
}

fn world_switches(sweep: &Sweep) -> Answer {
    let list = bursts(sweep);
    let (Some(first), Some(last)) = (list.first(), list.last()) else {
        return Answer::not_measured(Study::WorldSwitches, "the burst-size cells (--scenarios burst)");
    };
    if list.len() < 2 {
        return Answer::not_measured(Study::WorldSwitches, "the burst-size cells (--scenarios burst)");
    }
    let (one, many) = (first.2.host_total(), last.2.host_total());
    let share = (one - many) / one;
    Answer::new(
        Study::WorldSwitches,
        format!(
            "{:.0} % of host time per call at burst {} ({one:.0} ns vs {many:.0} at burst {})",
            share * 100.0,
            first.0,
            last.0
        ),
        if share > 0.0 { Verdict::Holds } else { Verdict::Differs },
        Some("the per-call doorbell and the host's own per-call work were smaller than the repetitions' noise at this packet size".into()),
    )
}

fn speedup(sweep: &Sweep, study: Study, primitives: &[&str]) -> Answer {
    let mut parts = Vec::new();
    let mut held = 0;
    let mut of = 0;
    let mut slower = Vec::new();
    let mut payload = 0;
    for p in primitives {
        // The largest payload, where an engine gains most.
        let Some(s) = sweep
            .speedups
            .iter()
            .filter(|s| s.primitive == *p)
            .max_by_key(|s| s.payload)
        else {
            continue;
        };
        let best = s
            .engine_ns
            .iter()
            .map(|(profile, _, burst)| (*profile, s.software_ns / burst, *burst))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((profile, x, engine)) = best else {
            continue;
        };
        of += 1;
        if x > 1.0 {
            held += 1;
        } else {
            slower.push(format!(
                "{p}: {:.0} ns in software against {engine:.0} ns on {profile}",
                s.software_ns
            ));
        }
        payload = s.payload;
        parts.push(format!("{p} {x:.2}x ({profile})"));
    }
    if of == 0 {
        return Answer::not_measured(
            study,
            "the per-primitive speed-ups (--scenarios speedup, with sec)",
        );
    }
    Answer::new(
        study,
        format!("software ÷ best part in a burst at {payload} B: {}", parts.join(", ")),
        Verdict::of(held, of),
        Some(format!(
            "this host's software is faster per operation than the modelled parts even with 32 in flight ({}); the study's software ran on a microcontroller",
            slower.join("; ")
        )),
    )
}

fn boundary(sweep: &Sweep) -> Answer {
    let Some(null) = null_scenario(sweep).filter(|n| !sweep.is_modelled(n)) else {
        return Answer::not_measured(Study::Boundary, "inline esp-null");
    };
    let mut totals = Vec::new();
    let mut measured = Vec::new();
    let mut below = Vec::new();
    let mut spread: f64 = 0.0;
    for a in algorithms(sweep) {
        let sc = boundary_scenario(sweep, a);
        for s in sweep.sizes() {
            let (Some(o), Some(n)) = (offload_of(sweep, sc, s), sweep.get(null, Path::Encap, s)) else {
                continue;
            };
            let x = o.host_total() / n.ns();
            totals.push(x);
            measured.push(o.host_measured() / n.ns());
            if x <= 1.0 {
                below.push(format!("{a} at {s} B"));
                spread = spread.max(n.samples.spread());
            }
        }
    }
    if totals.is_empty() {
        return Answer::not_measured(
            Study::Boundary,
            "the boundary cells at profile none (--scenarios boundary)",
        );
    }
    let (lo, hi) = range(&totals);
    let (mlo, mhi) = range(&measured);
    let busy = spread > 0.2
        || sweep
            .conditions
            .load_after
            .is_some_and(|l| l[0] > sweep.machine.cores as f64);
    let load = sweep
        .conditions
        .load_before
        .zip(sweep.conditions.load_after)
        .map_or_else(String::new, |(b, a)| {
            format!(" at a load average of {:.1}–{:.1}", b[0], a[0])
        });
    Answer::new(
        Study::Boundary,
        format!("{lo:.2}–{hi:.2}x inline esp-null ({mlo:.2}–{mhi:.2}x measured alone)"),
        Verdict::of(totals.len() - below.len(), totals.len()),
        Some(if busy {
            format!(
                "inline esp-null, timed on the wall clock, took longer than the boundary's host work ({}); its cells spread up to {:.0} %{load}, so the inline figure carries other work on this machine",
                below.join(", "),
                spread * 100.0
            )
        } else {
            format!(
                "the boundary's host work without the crypto took less than the inline path with null crypto ({})",
                below.join(", ")
            )
        }),
    )
}

fn tenant(rows: &[Row], engine: EngineKind, mode: Mode, size: usize) -> Option<f64> {
    rows.iter()
        .find(|r| r.engine == engine && r.mode == mode && r.tenants == 1 && r.size == size)
        .map(|r| r.aggregate_mbps)
        .filter(|m| *m > 0.0)
}

/// No figure from the shared-engine rows: none were run, or a cell
/// completed no request within its slice.
fn tenants_missing(sweep: &Sweep, study: Study, what: &str) -> Answer {
    if sweep.tenants.is_empty() {
        return Answer::not_measured(study, what);
    }
    Answer {
        study,
        here: "0 Mb/s in a cell".into(),
        verdict: Verdict::NotMeasured,
        why: Some(format!(
            "a cell completed no request within its {} ms slices; longer slices (--slice-ms) measure it",
            sweep.slice_ms
        )),
    }
}

fn shm_of_host(sweep: &Sweep) -> Answer {
    let rows = &sweep.tenants;
    let ratio = |engine| {
        Some(
            tenant(rows, engine, Mode::Shm, SHM_OF_HOST_BYTES)?
                / tenant(rows, engine, Mode::InProcessAsync, SHM_OF_HOST_BYTES)?,
        )
    };
    let Some(sec) = ratio(EngineKind::Sec) else {
        return tenants_missing(
            sweep,
            Study::ShmOfHost,
            "the shared-engine rows with sec (--scenarios tenants)",
        );
    };
    // Soft is transport-bound (its crypto is cheaper than the copies), so
    // the bar is sec's; soft's figure is shown beside it.
    let soft = ratio(EngineKind::Soft).map_or_else(String::new, |x| format!(", soft {:.0} %", x * 100.0));
    Answer::new(
        Study::ShmOfHost,
        format!("sec {:.0} %{soft} of in-process at {SHM_OF_HOST_BYTES} B", sec * 100.0),
        if sec >= SHM_OF_HOST_BAR { Verdict::Holds } else { Verdict::Differs },
        Some(
            "the tenant and the server thread share this machine's cores with the sweep's own threads and other work, and the server's polling takes time from the tenant"
                .into(),
        ),
    )
}

fn shm_over_socket(sweep: &Sweep) -> Answer {
    let rows = &sweep.tenants;
    let mut parts = Vec::new();
    let mut held = 0;
    let mut of = 0;
    for (size, _, _) in SHM_OVER_SOCKET {
        let (Some(shm), Some(socket)) = (
            tenant(rows, EngineKind::Soft, Mode::Shm, size),
            tenant(rows, EngineKind::Soft, Mode::Socket, size),
        ) else {
            continue;
        };
        of += 1;
        let x = shm / socket;
        if x >= SHM_OVER_SOCKET_BAR {
            held += 1;
        }
        parts.push(format!("{x:.2}x at {size} B ({shm:.0} vs {socket:.0} Mb/s)"));
    }
    if of == 0 {
        return tenants_missing(
            sweep,
            Study::ShmOverSocket,
            "the shared-engine rows with soft (--scenarios tenants)",
        );
    }
    Answer::new(
        Study::ShmOverSocket,
        format!("soft shm/socket {}", parts.join(", ")),
        Verdict::of(held, of),
        Some(
            "the socket's copies were a small part of each request's time at these sizes on this host".into(),
        ),
    )
}

/// The run's other answers (no published figure to hold them to), one
/// line each: the IPv6 stack, the ESP path over its primitive, the fast
/// part against software, coalesced completion.
pub fn other_answers(sweep: &Sweep) -> Vec<String> {
    let mut out = Vec::new();
    let sizes = sweep.sizes();
    let ratios6: Vec<f64> = time_ratios(sweep, Scenario::EspNull6, Scenario::Ipv6Forward)
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    if let Some(m) = median(ratios6.clone()) {
        let (lo, hi) = range(&ratios6);
        out.push(format!(
            "Stack over IPv6: esp-null-ipv6 / ipv6-fwd {m:.2}x (median of {} sizes, {lo:.2}–{hi:.2}x)",
            ratios6.len()
        ));
    }
    let (small, large) = (sizes.first().copied(), sizes.last().copied());
    let mut overhead = Vec::new();
    for a in algorithms(sweep) {
        let esp = Scenario::Esp {
            algorithm: a,
            engine: EngineKind::Soft,
            style: Style::Async,
            knobs: sweep.knobs,
        };
        let raw = Scenario::RawCrypto { algorithm: a };
        let share = |s: Option<usize>| {
            let s = s?;
            let e = out_ns(sweep, esp, s)?;
            let r = sweep.get(raw, Path::Encrypt, s)?.ns();
            Some(format!("{:.0}", 100.0 * (e - r) / e))
        };
        if let (Some(x), Some(y)) = (share(small), share(large)) {
            overhead.push(format!("{a} {x}/{y} %"));
        }
    }
    if let (false, Some(s), Some(l)) = (overhead.is_empty(), small, large) {
        out.push(format!(
            "ESP path outside the primitive (soft inline, {s}/{l} B): {}",
            overhead.join(", ")
        ));
    }
    let mut fast = Vec::new();
    for a in algorithms(sweep) {
        let qat = Scenario::Esp {
            algorithm: a,
            engine: EngineKind::Sec,
            style: Style::Async,
            knobs: Knobs {
                profile: "qat-class",
                completion: CompletionMode::Polling,
                ..sweep.knobs
            },
        };
        let soft = Scenario::Esp {
            algorithm: a,
            engine: EngineKind::Soft,
            style: Style::Async,
            knobs: sweep.knobs,
        };
        if !sweep.is_modelled(&qat) || small.and_then(|s| sweep.get(soft, Path::Encap, s)).is_none() {
            continue;
        }
        fast.push(match crossover_of(sweep, soft, qat) {
            Some(Crossing::At {
                below: None,
                stays: true,
                ..
            }) => format!("{a} at every size"),
            Some(Crossing::At {
                size, stays: true, ..
            }) => format!("{a} from {size} B"),
            Some(Crossing::At { size, .. }) => format!("{a} at {size} B, not every larger"),
            Some(Crossing::Never { .. }) | None => format!("{a} never"),
        });
    }
    if !fast.is_empty() {
        out.push(format!(
            "A fast part (qat-class, polling) pays against soft inline: {}",
            fast.join("; ")
        ));
    }
    for (base, coalesced) in extra_pairs(sweep, |k, base| {
        k.completion != base.completion && k.buffers == base.buffers
    }) {
        if knobs_of(coalesced).completion != CompletionMode::Coalesced {
            continue;
        }
        let parts: Vec<String> = sizes
            .iter()
            .filter_map(|&s| {
                let (b, c) = (offload_of(sweep, base, s)?, offload_of(sweep, coalesced, s)?);
                Some(format!(
                    "{s} B host {:+.0} %, {:.2} interrupts/packet",
                    100.0 * (c.host_total() / b.host_total() - 1.0),
                    c.modelled.interrupts
                ))
            })
            .collect();
        if !parts.is_empty() {
            out.push(format!(
                "Coalesced completion against {}: {}",
                knobs_of(base).completion,
                parts.join("; ")
            ));
        }
    }
    out
}
