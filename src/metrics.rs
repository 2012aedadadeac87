//! `espgw run --metrics ADDR:PORT`: the gateway's counters in Prometheus's
//! text exposition format, served over HTTP at `/metrics`.
//!
//! Owns three things: the per-tunnel totals that outlive rekeys
//! ([`TunnelTotals`], kept by worker 0: an SA's counts join its tunnel's
//! when it goes, so a tunnel's counters only ever grow), the snapshot
//! worker 0 publishes once a second ([`Snapshot`]), and the HTTP thread
//! that renders the latest snapshot and the workers' own counters
//! ([`WorkerCounters`]). Workers and worker 0 publish with `try_lock`, and
//! a scrape copies out under the lock and renders after, so a scrape never
//! stalls the fast path. Must not touch a gateway: it reads what is
//! published. Nothing in it is secret: names, SPIs, states and counts.
//!
//! Names follow Prometheus's conventions: an `espgw_` prefix, `_total` on
//! counters, base units (bytes, seconds), labels from bounded sets (a
//! tunnel's name, an SA's name and SPI while it lives, a drop reason).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use drivers::run::RunSummary;
use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use spd_sad::SaCounters;

/// What one worker publishes (every 64 ticks, with `try_lock`).
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkerCounters {
    pub stats: dataplane::Stats,
    pub run: RunSummary,
    pub engine: EngineTotals,
}

/// A worker's engine counters that add up across workers.
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineTotals {
    pub submitted: u64,
    pub completed: u64,
    pub ring_full: u64,
    pub errors: u64,
    pub timed_out: u64,
    pub refused_unavailable: u64,
    pub unavailable: bool,
}

impl From<&accel::EngineCounters> for EngineTotals {
    fn from(c: &accel::EngineCounters) -> EngineTotals {
        EngineTotals {
            submitted: c.submitted,
            completed: c.completed,
            ring_full: c.ring_full,
            errors: c.errors,
            timed_out: c.timed_out,
            refused_unavailable: c.refused_unavailable,
            unavailable: c.unavailable,
        }
    }
}

/// Every worker's counters, by worker.
pub type Published = Mutex<Vec<WorkerCounters>>;

/// Traffic and drops of a tunnel, or of one SA, by direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// `[inbound, outbound]`.
    pub bytes: [u64; 2],
    pub packets: [u64; 2],
    pub drops: BTreeMap<&'static str, u64>,
}

impl Totals {
    fn add(&mut self, inbound: bool, c: &SaCounters) {
        let d = usize::from(!inbound);
        self.bytes[d] += c.bytes;
        self.packets[d] += c.packets;
        for (reason, n) in c.drops() {
            *self.drops.entry(reason.name()).or_default() += n;
        }
    }
}

struct LiveSa {
    tunnel: String,
    inbound: bool,
    last: SaCounters,
}

/// A tunnel's counters across its SAs, past and present: what an SA
/// counted stays with its tunnel after the SA is gone (a rekey, a
/// teardown), so `espgw_tunnel_*_total` never go back.
#[derive(Default)]
pub struct TunnelTotals {
    retired: BTreeMap<String, Totals>,
    live: BTreeMap<String, LiveSa>,
}

/// One SA as observed: its name, tunnel, direction and counters.
pub struct Observed<'a> {
    pub name: &'a str,
    pub tunnel: String,
    pub inbound: bool,
    pub counters: SaCounters,
}

impl TunnelTotals {
    /// SA `name` is about to go, with these counters (read just before, so
    /// that nothing it counted since the last observation is lost).
    pub fn retire(&mut self, observed: Observed<'_>) {
        let (tunnel, inbound, last) = match self.live.remove(observed.name) {
            // The tunnel it was seen under: the control plane may have
            // forgotten it by now.
            Some(live) => (live.tunnel, live.inbound, latest(live.last, observed.counters)),
            None => (observed.tunnel, observed.inbound, observed.counters),
        };
        self.retired.entry(tunnel).or_default().add(inbound, &last);
    }

    /// The SAs there are now: those missing since the last observation are
    /// retired with what they last showed; one whose counts went back is a
    /// new SA under an old name, and the old one's counts are retired.
    /// Returns every tunnel's totals.
    pub fn observe<'a>(&mut self, now: impl Iterator<Item = Observed<'a>>) -> BTreeMap<String, Totals> {
        let mut seen = BTreeMap::new();
        for o in now {
            if let Some(live) = self.live.get(o.name) {
                if o.counters.packets < live.last.packets || o.counters.bytes < live.last.bytes {
                    let (tunnel, inbound, last) = (live.tunnel.clone(), live.inbound, live.last);
                    self.retired.entry(tunnel).or_default().add(inbound, &last);
                }
            }
            seen.insert(
                o.name.to_owned(),
                LiveSa {
                    tunnel: o.tunnel,
                    inbound: o.inbound,
                    last: o.counters,
                },
            );
        }
        let before = std::mem::replace(&mut self.live, seen);
        for (name, gone) in before {
            if !self.live.contains_key(&name) {
                self.retired
                    .entry(gone.tunnel)
                    .or_default()
                    .add(gone.inbound, &gone.last);
            }
        }
        let mut totals = self.retired.clone();
        for live in self.live.values() {
            totals
                .entry(live.tunnel.clone())
                .or_default()
                .add(live.inbound, &live.last);
        }
        totals
    }
}

/// The later of two readings of the same SA.
fn latest(a: SaCounters, b: SaCounters) -> SaCounters {
    if b.packets >= a.packets && b.bytes >= a.bytes {
        b
    } else {
        a
    }
}

/// The counts among a counters struct's fields, under their names in its
/// JSON (the keys `espgw stats` shows them under); what is not a count (a
/// map of refusals by reason) is left out. `None` if it is not a struct.
pub fn flat_counters<T: serde::Serialize>(counters: &T) -> Option<BTreeMap<String, u64>> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Field {
        Count(u64),
        Other(serde::de::IgnoredAny),
    }
    let text = serde_json::to_string(counters).ok()?;
    let fields: BTreeMap<String, Field> = serde_json::from_str(&text).ok()?;
    Some(
        fields
            .into_iter()
            .filter_map(|(name, field)| match field {
                Field::Count(n) => Some((name, n)),
                Field::Other(_) => None,
            })
            .collect(),
    )
}

/// A tunnel as the snapshot shows it.
#[derive(Debug, Clone, Default)]
pub struct TunnelSample {
    pub name: String,
    pub totals: Totals,
    /// The control plane's state (`up`, `rekeying`, ...), for tunnels it
    /// runs; `None` for SAs of the file and of the keying namespace.
    pub state: Option<String>,
    pub generation: u32,
    pub rekeys: u64,
    /// Seconds since its newest packet (over its live SAs).
    pub idle_seconds: Option<f64>,
}

/// A live SA as the snapshot shows it.
#[derive(Debug, Clone)]
pub struct SaSample {
    pub name: String,
    pub tunnel: String,
    pub spi: u32,
    pub inbound: bool,
    pub counters: SaCounters,
    pub idle_seconds: f64,
}

/// What worker 0 publishes once a second.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub tunnels: Vec<TunnelSample>,
    pub sas: Vec<SaSample>,
    /// The `xfrm` keying source's counters, flattened (`None` without it).
    pub xfrm: Option<BTreeMap<String, u64>>,
    pub ike_relay: Option<[u64; 2]>,
}

/// The HTTP side: the listener, bound before privileges are dropped, and
/// what it reads.
pub struct MetricsServer {
    listener: TcpListener,
}

impl MetricsServer {
    /// Binds `address` (`ADDR:PORT`).
    pub fn bind(address: &str) -> Result<MetricsServer> {
        let listener = TcpListener::bind(address)
            .with_context(|| format!("--metrics {address}: cannot listen there"))?;
        tracing::info!(address = %listener.local_addr().map_or_else(|_| address.to_owned(), |a| a.to_string()), "serving Prometheus metrics at /metrics");
        Ok(MetricsServer { listener })
    }

    /// Serves scrapes on a thread of its own until the process ends:
    /// `espgw run`'s, from the workers' counters and worker 0's latest
    /// snapshot.
    pub fn start(
        self,
        workers: Arc<Published>,
        snapshot: Arc<Mutex<Arc<Snapshot>>>,
    ) -> Result<JoinHandle<()>> {
        self.serve(move || {
            let counters = workers.lock().map(|w| w.clone()).unwrap_or_default();
            let latest = snapshot.lock().map(|s| Arc::clone(&s)).unwrap_or_default();
            render(&counters, &latest)
        })
    }

    /// Serves scrapes on a thread of its own until the process ends, each
    /// page from `page`.
    pub fn serve(self, page: impl Fn() -> Vec<u8> + Send + 'static) -> Result<JoinHandle<()>> {
        let server = tiny_http::Server::from_listener(self.listener, None)
            .map_err(|e| anyhow::anyhow!("starting the metrics server: {e}"))?;
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for request in server.incoming_requests() {
                    let response = if request.method() != &tiny_http::Method::Get {
                        tiny_http::Response::from_string("only GET\n").with_status_code(405)
                    } else if request.url() != "/metrics" {
                        tiny_http::Response::from_string("espgw serves /metrics\n").with_status_code(404)
                    } else {
                        let content_type = tiny_http::Header::from_bytes(
                            &b"Content-Type"[..],
                            &b"text/plain; version=0.0.4; charset=utf-8"[..],
                        )
                        .unwrap_or_else(|()| unreachable!("a constant header"));
                        tiny_http::Response::from_data(page()).with_header(content_type)
                    };
                    let _ = request.respond(response);
                }
            })
            .context("starting the metrics thread")
    }

    /// The address it listens on (with `:0`, the port the kernel chose).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.local_addr().ok()
    }
}

/// The shared engine server's counters (`espgw engine serve --metrics`):
/// its tenants (attached now and since start, reclaimed, evicted), their
/// requests by outcome and refusals by rule, the sessions it wiped, the
/// connections and peers it turned away, and its back end's time. Per
/// tenant would be a label set without bound (tenants come and go); these
/// are the server's totals over all of them.
pub fn render_engine_server(
    s: &accel::shared::StatsReply,
    busy_ns: u64,
    cpu_ns: u64,
    control_ns: u64,
) -> Vec<u8> {
    let registry = Registry::new();
    let p = "espgw_engine_server_";
    let gauge = |name: &str, help: &str, value: u64| {
        gauges(&registry, &format!("{p}{name}"), help, &[])
            .with_label_values(&[] as &[&str])
            .set(value as i64);
    };
    let counter = |name: &str, help: &str, value: u64| {
        counters(&registry, &format!("{p}{name}_total"), help, &[])
            .with_label_values(&[] as &[&str])
            .inc_by(value);
    };
    gauge("tenants", "Tenants attached now.", s.tenants);
    counter(
        "tenants_attached",
        "Tenants that attached since the start.",
        s.attached,
    );
    counter(
        "tenants_reclaimed",
        "Tenants whose sessions and rings were reclaimed (gone, hung or evicted).",
        s.reclaimed,
    );
    counter(
        "tenants_evicted",
        "Tenants let go for breaking the protocol: hung, a ring no honest tenant writes, repeated garbage.",
        s.evicted,
    );
    let requests = counters(
        &registry,
        &format!("{p}requests_total"),
        "Tenants' requests by outcome: executed, discarded (the tenant was gone when it completed), quota_full.",
        &["outcome"],
    );
    for (outcome, n) in [
        ("executed", s.executed),
        ("discarded", s.discarded),
        ("quota_full", s.quota_full),
    ] {
        requests.with_label_values(&[outcome]).inc_by(n);
    }
    let refused = counters(
        &registry,
        &format!("{p}requests_refused_total"),
        "Requests refused, never executed, by the rule they broke.",
        &["rule"],
    );
    for (rule, n) in [
        ("foreign_session", s.foreign_session),
        ("stale_session", s.stale_session),
        ("bad_region", s.bad_region),
        ("malformed", s.malformed),
    ] {
        refused.with_label_values(&[rule]).inc_by(n);
    }
    counter(
        "sessions_wiped",
        "Sessions whose keys were wiped.",
        s.sessions_wiped,
    );
    counter(
        "connections_closed_idle",
        "Connections closed without attaching (past the attach deadline, or the oldest waiting).",
        s.idle_closed,
    );
    counter(
        "peers_refused",
        "Connections turned away by their peer's credentials.",
        s.refused_peers,
    );
    counter(
        "registrations_over_budget",
        "Session registrations refused for the file descriptors they would cost.",
        s.over_budget,
    );
    let seconds = |name: &str, help: &str, ns: u64| {
        let vec = prometheus::CounterVec::new(Opts::new(format!("{p}{name}_seconds_total"), help), &[])
            .unwrap_or_else(|e| panic!("metric {name}: {e}"));
        register(&registry, vec)
            .with_label_values(&[] as &[&str])
            .inc_by(ns as f64 / 1e9);
    };
    seconds(
        "busy",
        "Time the back end spent in passes that moved work.",
        busy_ns,
    );
    seconds("cpu", "The back end's CPU time, its polling included.", cpu_ns);
    seconds(
        "control",
        "Time the back end spent on the control path.",
        control_ns,
    );
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::error!("metrics: {e}");
    }
    out
}

/// Adds a family to `registry`, which never refuses one of ours (distinct
/// names, valid labels): a refusal is a bug in this file, shown as a
/// missing family rather than a failed scrape.
fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    if let Err(e) = registry.register(Box::new(metric.clone())) {
        tracing::error!("metrics: {e}");
    }
    metric
}

fn counters(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let opts = Opts::new(name, help);
    let vec = IntCounterVec::new(opts, labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(registry, vec)
}

fn gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let vec =
        IntGaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(registry, vec)
}

fn float_gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let vec = GaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(registry, vec)
}

const DIRECTIONS: [&str; 2] = ["in", "out"];

/// The exposition of `workers`' counters and `snapshot`.
pub fn render(workers: &[WorkerCounters], snapshot: &Snapshot) -> Vec<u8> {
    let registry = Registry::new();
    let mut stats = dataplane::Stats::default();
    let mut run = RunSummary::default();
    let mut engine = EngineTotals::default();
    for w in workers {
        stats.add(&w.stats);
        run.add(&w.run);
        engine.submitted += w.engine.submitted;
        engine.completed += w.engine.completed;
        engine.ring_full += w.engine.ring_full;
        engine.errors += w.engine.errors;
        engine.timed_out += w.engine.timed_out;
        engine.refused_unavailable += w.engine.refused_unavailable;
        engine.unavailable |= w.engine.unavailable;
    }
    gauges(
        &registry,
        "espgw_build_info",
        "espgw's version (always 1).",
        &["version"],
    )
    .with_label_values(&[env!("CARGO_PKG_VERSION")])
    .set(1);
    gauges(&registry, "espgw_workers", "Forwarding worker threads.", &[])
        .with_label_values::<&str>(&[])
        .set(workers.len() as i64);

    let frames = counters(
        &registry,
        "espgw_frames_total",
        "Frames read from and written to the devices.",
        &["direction"],
    );
    frames.with_label_values(&["received"]).inc_by(run.frames_in);
    frames.with_label_values(&["sent"]).inc_by(run.frames_out);
    let packets = counters(
        &registry,
        "espgw_packets_total",
        "Packets by what the gateway did with them.",
        &["outcome"],
    );
    for (outcome, n) in [
        ("received", stats.rx_packets),
        ("transmitted", stats.tx_packets),
        ("encapsulated", stats.encapsulated),
        ("decapsulated", stats.decapsulated),
        ("bypassed", stats.bypassed),
        ("local", stats.local_delivered),
    ] {
        packets.with_label_values(&[outcome]).inc_by(n);
    }
    let drops = counters(
        &registry,
        "espgw_drops_total",
        "Packets dropped, by reason.",
        &["reason"],
    );
    for (reason, n) in stats.drops.iter() {
        drops.with_label_values(&[&reason.to_string()]).inc_by(n);
    }
    for (name, help, n) in [
        (
            "espgw_kernel_drops_total",
            "Frames the kernel dropped at the gateway's sockets before it read them.",
            run.kernel_drops,
        ),
        (
            "espgw_link_downs_total",
            "Times a device was found down or without carrier.",
            run.link_downs,
        ),
        (
            "espgw_devices_lost_total",
            "Times a device was deleted under the running gateway.",
            run.devices_lost,
        ),
    ] {
        counters(&registry, name, help, &[])
            .with_label_values::<&str>(&[])
            .inc_by(n);
    }
    let device_up = gauges(
        &registry,
        "espgw_device_up",
        "1 while the interface's device is up, 0 while it is down or deleted.",
        &["interface"],
    );
    for device in crate::status::DeviceStatus::from_run(&run) {
        let up = device.state == crate::status::DeviceState::Up;
        device_up
            .with_label_values(&[<&str>::from(device.interface)])
            .set(i64::from(up));
    }

    let jobs = counters(
        &registry,
        "espgw_engine_jobs_total",
        "Crypto jobs given to the engine and how they ended.",
        &["outcome"],
    );
    for (outcome, n) in [
        ("submitted", engine.submitted),
        ("completed", engine.completed),
        ("ring_full", engine.ring_full),
        ("error", engine.errors),
        ("timed_out", engine.timed_out),
        ("refused_unavailable", engine.refused_unavailable),
    ] {
        jobs.with_label_values(&[outcome]).inc_by(n);
    }
    gauges(
        &registry,
        "espgw_engine_up",
        "1 while the engine answers, 0 while it is down.",
        &[],
    )
    .with_label_values::<&str>(&[])
    .set(i64::from(!engine.unavailable));

    let t_bytes = counters(
        &registry,
        "espgw_tunnel_bytes_total",
        "Protected bytes of a tunnel, over all its SAs so far (rekeys included).",
        &["tunnel", "direction"],
    );
    let t_packets = counters(
        &registry,
        "espgw_tunnel_packets_total",
        "Protected packets of a tunnel, over all its SAs so far (rekeys included).",
        &["tunnel", "direction"],
    );
    let t_drops = counters(
        &registry,
        "espgw_tunnel_drops_total",
        "Packets of a tunnel's SAs dropped, by reason.",
        &["tunnel", "reason"],
    );
    let t_rekeys = counters(
        &registry,
        "espgw_tunnel_rekeys_total",
        "Completed rekeys of a tunnel.",
        &["tunnel"],
    );
    let t_up = gauges(
        &registry,
        "espgw_tunnel_up",
        "1 while a tunnel has SAs to carry traffic.",
        &["tunnel"],
    );
    let t_generation = gauges(
        &registry,
        "espgw_tunnel_generation",
        "The key generation a tunnel's traffic uses now.",
        &["tunnel"],
    );
    let t_idle = float_gauges(
        &registry,
        "espgw_tunnel_idle_seconds",
        "Seconds since a tunnel's last packet (or since its SAs were installed).",
        &["tunnel"],
    );
    for t in &snapshot.tunnels {
        for (d, direction) in DIRECTIONS.iter().enumerate() {
            t_bytes
                .with_label_values(&[t.name.as_str(), direction])
                .inc_by(t.totals.bytes[d]);
            t_packets
                .with_label_values(&[t.name.as_str(), direction])
                .inc_by(t.totals.packets[d]);
        }
        for (reason, n) in &t.totals.drops {
            t_drops.with_label_values(&[t.name.as_str(), reason]).inc_by(*n);
        }
        t_rekeys.with_label_values(&[t.name.as_str()]).inc_by(t.rekeys);
        let up = t
            .state
            .as_deref()
            .map_or(t.idle_seconds.is_some(), |s| s == "up" || s == "rekeying");
        t_up.with_label_values(&[t.name.as_str()]).set(i64::from(up));
        t_generation
            .with_label_values(&[t.name.as_str()])
            .set(i64::from(t.generation));
        if let Some(idle) = t.idle_seconds {
            t_idle.with_label_values(&[t.name.as_str()]).set(idle);
        }
    }

    let s_bytes = counters(
        &registry,
        "espgw_sa_bytes_total",
        "Protected bytes of a live SA.",
        &["sa", "spi", "tunnel", "direction"],
    );
    let s_packets = counters(
        &registry,
        "espgw_sa_packets_total",
        "Protected packets of a live SA.",
        &["sa", "spi", "tunnel", "direction"],
    );
    let s_drops = counters(
        &registry,
        "espgw_sa_drops_total",
        "Packets a live SA dropped, by reason.",
        &["sa", "spi", "reason"],
    );
    let s_idle = float_gauges(
        &registry,
        "espgw_sa_idle_seconds",
        "Seconds since a live SA's last packet.",
        &["sa", "spi"],
    );
    for sa in &snapshot.sas {
        let spi = format!("{:#010x}", sa.spi);
        let direction = DIRECTIONS[usize::from(!sa.inbound)];
        s_bytes
            .with_label_values(&[sa.name.as_str(), spi.as_str(), sa.tunnel.as_str(), direction])
            .inc_by(sa.counters.bytes);
        s_packets
            .with_label_values(&[sa.name.as_str(), spi.as_str(), sa.tunnel.as_str(), direction])
            .inc_by(sa.counters.packets);
        for (reason, n) in sa.counters.drops() {
            s_drops
                .with_label_values(&[sa.name.as_str(), spi.as_str(), reason.name()])
                .inc_by(n);
        }
        s_idle
            .with_label_values(&[sa.name.as_str(), spi.as_str()])
            .set(sa.idle_seconds);
    }

    if let Some(xfrm) = &snapshot.xfrm {
        let mirror = counters(
            &registry,
            "espgw_xfrm_events_total",
            "What the xfrm keying source did, by event (see espgw stats' xfrm section).",
            &["event"],
        );
        for (event, n) in xfrm {
            mirror.with_label_values(&[event]).inc_by(*n);
        }
    }
    if let Some([to_daemon, from_daemon]) = snapshot.ike_relay {
        let relayed = counters(
            &registry,
            "espgw_ike_relay_datagrams_total",
            "IKE datagrams the relay carried between peers and the keying namespace's daemon.",
            &["direction"],
        );
        relayed.with_label_values(&["to_daemon"]).inc_by(to_daemon);
        relayed.with_label_values(&["from_daemon"]).inc_by(from_daemon);
    }

    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::error!("metrics: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(packets: u64, bytes: u64) -> SaCounters {
        let mut c = SaCounters::default();
        (c.packets, c.bytes) = (packets, bytes);
        c
    }

    fn observed<'a>(name: &'a str, tunnel: &str, c: SaCounters) -> Observed<'a> {
        Observed {
            name,
            tunnel: tunnel.to_owned(),
            inbound: false,
            counters: c,
        }
    }

    /// A rekey replaces the SA: the tunnel's counter goes on from where the
    /// old SA left it, whether the old one was retired explicitly (with
    /// its last counts), vanished between observations, or came back under
    /// the same name with fresh counters.
    #[test]
    fn a_tunnels_counters_never_go_back_across_rekeys() {
        let mut t = TunnelTotals::default();
        let total = |m: &BTreeMap<String, Totals>| m.get("site").map_or(0, |t| t.packets[1]);
        let m = t.observe([observed("gen1", "site", counts(10, 1000))].into_iter());
        assert_eq!(total(&m), 10);
        // Removed with 12 packets, two more than last observed.
        t.retire(observed("gen1", "elsewhere", counts(12, 1200)));
        let m = t.observe([observed("gen2", "site", counts(3, 300))].into_iter());
        assert_eq!(
            total(&m),
            15,
            "12 of gen1 (under the tunnel it was seen in) and 3 of gen2"
        );
        // gen2 vanishes between observations after 5 packets were seen.
        let m = t.observe([observed("gen2", "site", counts(5, 500))].into_iter());
        assert_eq!(total(&m), 17);
        let m = t.observe([observed("gen3", "site", counts(1, 100))].into_iter());
        assert_eq!(total(&m), 18);
        // The same name with counters gone back: a new SA.
        let m = t.observe([observed("gen3", "site", counts(2, 200))].into_iter());
        assert_eq!(total(&m), 19);
        let m = t.observe([observed("gen3", "site", counts(1, 50))].into_iter());
        assert_eq!(total(&m), 20, "2 of the old gen3 and 1 of the new");
        assert_eq!(m["site"].bytes[1], 1200 + 500 + 200 + 50);
    }

    #[test]
    fn the_exposition_has_the_families_and_no_secret() {
        let mut sample = counts(7, 700);
        sample.count(spd_sad::DropReason::AuthFailed);
        sample.count(spd_sad::DropReason::AuthFailed);
        let snapshot = Snapshot {
            tunnels: vec![TunnelSample {
                name: "site-b".into(),
                totals: Totals {
                    bytes: [100, 700],
                    packets: [1, 7],
                    drops: [("auth_failed", 2)].into_iter().collect(),
                },
                state: Some("up".into()),
                generation: 3,
                rekeys: 2,
                idle_seconds: Some(0.5),
            }],
            sas: vec![SaSample {
                name: "site-b-g3-out".into(),
                tunnel: "site-b".into(),
                spi: 0x1234,
                inbound: false,
                counters: sample,
                idle_seconds: 0.5,
            }],
            xfrm: None,
            ike_relay: Some([4, 5]),
        };
        // Two workers that both saw the outside device go down once.
        let mut worker = WorkerCounters::default();
        worker.run.link_downs = 1;
        worker.run.link_down = [false, true];
        let workers = [worker, worker];
        let text = String::from_utf8(render(&workers, &snapshot)).unwrap();
        for line in [
            "espgw_link_downs_total 1",
            "espgw_devices_lost_total 0",
            "espgw_device_up{interface=\"inside\"} 1",
            "espgw_device_up{interface=\"outside\"} 0",
            "espgw_tunnel_bytes_total{direction=\"out\",tunnel=\"site-b\"} 700",
            "espgw_tunnel_packets_total{direction=\"in\",tunnel=\"site-b\"} 1",
            "espgw_tunnel_rekeys_total{tunnel=\"site-b\"} 2",
            "espgw_tunnel_generation{tunnel=\"site-b\"} 3",
            "espgw_tunnel_up{tunnel=\"site-b\"} 1",
            "espgw_tunnel_drops_total{reason=\"auth_failed\",tunnel=\"site-b\"} 2",
            "espgw_sa_packets_total{direction=\"out\",sa=\"site-b-g3-out\",spi=\"0x00001234\",tunnel=\"site-b\"} 7",
            "espgw_ike_relay_datagrams_total{direction=\"from_daemon\"} 5",
            "# TYPE espgw_drops_total counter",
            "espgw_workers 2",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
        }
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let mut parts = line.split_whitespace().skip(2);
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
        }
    }

    /// The engine server's page: its totals under their names, counters
    /// in `_total` and nothing else, seconds from nanoseconds.
    #[test]
    fn the_engine_servers_page_names_its_totals() {
        let stats = accel::shared::StatsReply {
            tenants: 2,
            attached: 5,
            executed: 1000,
            quota_full: 3,
            malformed: 1,
            ..Default::default()
        };
        let text = String::from_utf8(render_engine_server(&stats, 1_500_000_000, 2_000_000_000, 0)).unwrap();
        for line in [
            "espgw_engine_server_tenants 2",
            "espgw_engine_server_tenants_attached_total 5",
            "espgw_engine_server_requests_total{outcome=\"executed\"} 1000",
            "espgw_engine_server_requests_total{outcome=\"quota_full\"} 3",
            "espgw_engine_server_requests_refused_total{rule=\"malformed\"} 1",
            "espgw_engine_server_busy_seconds_total 1.5",
            "espgw_engine_server_cpu_seconds_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
        }
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let mut parts = line.split_whitespace().skip(2);
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
        }
    }
}
