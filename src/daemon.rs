//! `espgw run`: opens the interfaces, starts one worker per core with a
//! gateway each, runs the control plane beside worker 0, answers the
//! control socket and reloads on SIGHUP.
//!
//! Worker 0 owns the [`ControlPlane`]. The other workers pass it the
//! control datagrams and SA lifetime events they see, and apply its
//! commands in order, each recording how many it has applied; a control
//! datagram leaves only once every worker has applied the commands issued
//! before it (a new inbound SA exists everywhere before the peer hears of
//! it).
//!
//! With several workers, the inside fanout group is steered so that each
//! outbound SA's packets reach the one worker that owns it (see
//! `drivers::steer`); worker 0 reinstalls the program whenever the
//! commands it applies may have changed the policies.
//!
//! With a state directory, a thread of its own keeps the durable ceilings
//! of SAs with static keys ahead of them (`crate::state_dir`); worker 0
//! writes the first reservations of the SAs a reload installs before it
//! hands them to the other workers.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use dataplane::command::{SaCommand, WorkerCommand};
use dataplane::{Gateway, Port};
use drivers::afpacket::{AfPacket, Receive};
use drivers::reopen::{OnDeviceLoss, Reopener};
use drivers::run::{Device, RunSummary, Sockets, Tick};
use drivers::tun::Tun;
use ike_stub::{Config, ControlPlane, Datagram};
use spd_sad::SaEvent;

use crate::metrics::{self, MetricsServer, Observed, Published, Snapshot, TunnelTotals, WorkerCounters};
use crate::socket_broker::SocketBroker;
use crate::state_dir::StateDir;
use crate::status::{FinalStats, ReloadReply, Reply};
use crate::xfrm_source::XfrmSource;
use crate::{control, privileges, report, RunArgs};
use ike_stub::xfrm::XfrmMirror;

/// What a worker other than worker 0 tells the control plane.
enum Report {
    /// A control datagram it received (the IPv4 packet).
    Datagram(Vec<u8>),
    /// A lifetime event of the SA with this name.
    Event(String, SaEvent),
    /// An outbound packet the policy of this name discarded.
    Discarded(String, spd_sad::FlowKey),
}

/// A command for another worker: its sequence number, the command, and
/// whether worker 0's gateway refused it already (and logged that).
type Queued = (u64, WorkerCommand, bool);

/// A worker's command queue.
type CommandQueue = (Sender<Queued>, Receiver<Queued>);

/// How the workers reach each other.
struct Links {
    /// To worker 0, from the others.
    reports: (Sender<Report>, Receiver<Report>),
    /// To each worker but 0: commands with their sequence numbers.
    commands: Vec<CommandQueue>,
    /// Commands each worker has applied (index 0 unused).
    applied: Vec<AtomicU64>,
    /// Reports dropped because worker 0's queue was full.
    reports_dropped: AtomicU64,
}

impl Links {
    fn new(workers: usize) -> Links {
        Links {
            reports: bounded(1024),
            commands: (0..workers).map(|_| unbounded()).collect(),
            applied: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            reports_dropped: AtomicU64::new(0),
        }
    }

    /// Sends a report to worker 0, counting it if the queue is full.
    fn report(&self, report: Report) {
        if self.reports.0.try_send(report).is_err() {
            self.reports_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Commands every other worker has applied.
    fn applied_everywhere(&self) -> u64 {
        self.applied[1..]
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .min()
            .unwrap_or(u64::MAX)
    }
}

/// Worker 0's part: the control plane and what waits on it.
struct Plane {
    plane: ControlPlane,
    config_path: std::path::PathBuf,
    /// `--user`'s uid: its configuration files are trusted (it reads them).
    trusted: Option<u32>,
    /// Datagrams waiting for the other workers to catch up.
    pending: VecDeque<Datagram>,
    /// Commands issued and sent so far.
    issued: u64,
    reload: Arc<AtomicBool>,
    /// When the plane's timers last ran: they walk every tunnel, so not
    /// after every batch.
    last_timeout: Duration,
    /// The fanout groups' steering, kept in step with the SPD.
    steering: Option<Steering>,
    /// The sequence ledger of SAs with static keys, and the state
    /// directory `--state-dir` named (a reload must not move it).
    state: Option<Arc<StateDir>>,
    state_flag: Option<std::path::PathBuf>,
    /// The keying source the gateway started with, and the flags that
    /// chose it (a reload must not change it).
    keying: ike_stub::Keying,
    keying_flags: crate::KeyingFlags,
    /// The `xfrm` keying source: the socket's reader and the mirror its
    /// datagrams go through (between batches, never per packet).
    xfrm: Option<(XfrmSource, XfrmMirror)>,
    /// Messages for the keying namespace's kernel, sent once a tick.
    feedback: Vec<u8>,
    last_usage_report: Duration,
    /// With `--metrics`: tunnels' totals across rekeys and the snapshot
    /// the metrics thread reads.
    metrics: Option<PlaneMetrics>,
}

struct PlaneMetrics {
    totals: TunnelTotals,
    snapshot: Arc<Mutex<Arc<Snapshot>>>,
    last: Option<Duration>,
}

/// How often worker 0 publishes the metrics' snapshot.
const METRICS_INTERVAL: Duration = Duration::from_secs(1);

/// The tunnel an SA counts for: the control plane's tunnel that uses it,
/// the CHILD_SA (reqid) of the keying namespace's daemon, or the SA alone.
fn tunnel_of(tunnels: &[ike_stub::TunnelStatus], sa: &str) -> String {
    if let Some(t) = tunnels
        .iter()
        .find(|t| t.sa_out == sa || t.sa_in == sa || t.retiring.iter().any(|r| r == sa))
    {
        return t.name.clone();
    }
    if let Some(reqid) = sa.strip_prefix("xfrm-r").and_then(|rest| rest.split('-').next()) {
        return format!("xfrm-reqid-{reqid}");
    }
    sa.to_owned()
}

/// How often the SAs' counters go to the keying namespace's kernel
/// (`XFRM_MSG_NEWAE`): what the daemon's inactivity and dead-peer checks,
/// and `swanctl --list-sas`, read.
const USAGE_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// With several workers, the programs of the fanout groups: the inside's
/// sends every packet an outbound policy protects to the worker owning
/// its SA; the outside's sends every ESP packet to the worker owning its
/// inbound SA (see `drivers::steer`). Worker 0 installs them through its
/// sockets (`Tick::steer`), which keep them for the groups made anew if a
/// device is deleted and comes back.
struct Steering {
    /// False with a TUN inside, which is not a fanout group.
    inside: bool,
    workers: usize,
    program: Vec<drivers::steer::Insn>,
    outside_program: Vec<drivers::steer::Insn>,
}

impl Steering {
    /// Rebuilds the programs from `gateway`'s policies and has `install`
    /// put each that changed on its port's group. A rekey keeps the outer
    /// addresses and so the owner; a reload may add policies.
    fn update(
        &mut self,
        gateway: &Gateway,
        install: &mut dyn FnMut(Port, &[drivers::steer::Insn]) -> std::io::Result<()>,
    ) -> Result<()> {
        if self.inside {
            let program = drivers::steer::inside_program(gateway.spd(), gateway.sad(), self.workers)?;
            if program != self.program {
                install(Port::Inside, &program).context("installing the inside's steering program")?;
                self.program = program;
            }
        }
        // A reload may add an encapsulation port.
        let outside = drivers::steer::outside_program(gateway.nat_ports())?;
        if outside != self.outside_program {
            install(Port::Outside, &outside).context("installing the outside's steering program")?;
            self.outside_program = outside;
        }
        Ok(())
    }
}

impl Plane {
    fn tick(&mut self, t: &mut Tick<'_>, links: &Links, workers: usize) {
        let now = t.now;
        while let Some(event) = t.gateway.poll_event() {
            let (SaEvent::SoftExpired(id) | SaEvent::HardExpired(id)) = event;
            if let Some(name) = t.gateway.sad().get(id).map(|sa| sa.name().to_owned()) {
                self.sa_event(t.gateway, now, &name, event);
            }
        }
        for buf in t.received {
            self.control_datagram(now, buf.data());
        }
        while let Ok(report) = links.reports.1.try_recv() {
            match report {
                Report::Datagram(packet) => self.control_datagram(now, &packet),
                Report::Event(name, event) => self.sa_event(t.gateway, now, &name, event),
                Report::Discarded(policy, flow) => self.discarded(now, &policy, &flow),
            }
        }
        let mut discards = Vec::new();
        t.gateway
            .take_outbound_discards(|policy, flow| discards.push((policy.to_owned(), *flow)));
        for (policy, flow) in discards {
            self.discarded(now, &policy, &flow);
        }
        if self.reload.swap(false, Ordering::Relaxed) {
            let _ = self.reload();
        }
        if let Some((source, mirror)) = &mut self.xfrm {
            source.drain(mirror, now);
            if let Some(relay) = source.relay() {
                relay.pass_from_daemon(|ports, to, payload| match t.send_datagram(ports, to, payload) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::debug!(%to, "ike relay: a datagram of the daemon's not sent: {e}");
                        false
                    }
                });
            }
            if now.saturating_sub(self.last_usage_report) >= USAGE_REPORT_INTERVAL {
                self.last_usage_report = now;
                let epoch = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let sad = t.gateway.sad();
                let mut out = Vec::new();
                mirror.report_usage(
                    |name| {
                        let id = sad.find(name)?;
                        let sa = sad.get(id)?;
                        let c = sa.counters();
                        Some((c.bytes, c.packets, sa.idle(now)))
                    },
                    epoch,
                    &mut out,
                );
                self.feedback.extend_from_slice(&out);
            }
            if !self.feedback.is_empty() {
                let failed = source.send_feedback(&self.feedback);
                mirror.note_feedback_failed(failed);
                self.feedback.clear();
            }
        }
        if now.saturating_sub(self.last_timeout) >= Duration::from_millis(5) {
            self.last_timeout = now;
            let gateway: &Gateway = t.gateway;
            self.plane.observe(
                now,
                |name| gateway.sa_carried_packets(name),
                |local, remote, encap| {
                    gateway
                        .encapsulated_peer(local, remote, encap)
                        .map(|at| (at.address, at.port))
                },
            );
            self.plane.handle_timeout(now);
        }
        self.apply(t, links, workers);
        self.publish_metrics(t.gateway, now);
    }

    /// Where the metrics thread reads the snapshot (an empty one without
    /// `--metrics`).
    fn metrics_snapshot(&self) -> Arc<Mutex<Arc<Snapshot>>> {
        self.metrics.as_ref().map_or_else(
            || Arc::new(Mutex::new(Arc::new(Snapshot::default()))),
            |m| Arc::clone(&m.snapshot),
        )
    }

    /// Once a second with `--metrics`: every SA's counters, folded into
    /// its tunnel's, published for the metrics thread (`try_lock`: a
    /// scrape in progress delays it to the next tick).
    fn publish_metrics(&mut self, gateway: &Gateway, now: Duration) {
        let Some(m) = &mut self.metrics else { return };
        if m.last
            .is_some_and(|last| now.saturating_sub(last) < METRICS_INTERVAL)
        {
            return;
        }
        let Ok(mut slot) = m.snapshot.try_lock() else {
            return;
        };
        m.last = Some(now);
        let status = self.plane.tunnels(now);
        let sad = gateway.sad();
        let sas: Vec<metrics::SaSample> = sad
            .iter()
            .map(|(_, sa)| metrics::SaSample {
                name: sa.name().to_owned(),
                tunnel: tunnel_of(&status, sa.name()),
                spi: sa.spi(),
                inbound: sa.params().direction == spd_sad::SaDirection::Inbound,
                counters: sa.counters(),
                idle_seconds: sa.idle(now).as_secs_f64(),
            })
            .collect();
        let totals = m.totals.observe(sas.iter().map(|s| Observed {
            name: &s.name,
            tunnel: s.tunnel.clone(),
            inbound: s.inbound,
            counters: s.counters,
        }));
        let tunnels = totals
            .into_iter()
            .map(|(name, totals)| {
                let plane = status.iter().find(|t| t.name == name);
                let idle_seconds = sas
                    .iter()
                    .filter(|s| s.tunnel == name)
                    .map(|s| s.idle_seconds)
                    .reduce(f64::min);
                metrics::TunnelSample {
                    state: plane.map(|t| t.state.clone()),
                    generation: plane.map_or(0, |t| t.generation),
                    rekeys: plane.map_or(0, |t| t.rekeys),
                    idle_seconds,
                    totals,
                    name,
                }
            })
            .collect();
        let (xfrm, ike_relay) = match &mut self.xfrm {
            Some((source, mirror)) => {
                let flat = metrics::flat_counters(mirror.counters());
                let relay = source
                    .relay()
                    .map(|r| [r.counters().to_daemon, r.counters().from_daemon]);
                (flat, relay)
            }
            None => (None, None),
        };
        *slot = Arc::new(Snapshot {
            tunnels,
            sas,
            xfrm,
            ike_relay,
        });
    }

    /// An SA about to be removed: its last counts join its tunnel's.
    fn retire_for_metrics(&mut self, gateway: &Gateway, now: Duration, command: &SaCommand) {
        let Some(m) = &mut self.metrics else { return };
        let name = match command {
            SaCommand::RemoveSa(name) => name,
            SaCommand::ReplaceSa { old, .. } => old,
            _ => return,
        };
        let Some(sa) = gateway.sad().find(name).and_then(|id| gateway.sad().get(id)) else {
            return;
        };
        m.totals.retire(Observed {
            name,
            tunnel: tunnel_of(&self.plane.tunnels(now), name),
            inbound: sa.params().direction == spd_sad::SaDirection::Inbound,
            counters: sa.counters(),
        });
    }

    /// A control datagram: the IKE relay's if it is on the daemon's ports
    /// and no tunnel of the file claims it, else the control plane's.
    fn control_datagram(&mut self, now: Duration, packet: &[u8]) {
        if let Some(relay) = self.xfrm.as_mut().and_then(|(source, _)| source.relay()) {
            if relay.takes(packet) && !self.plane.claims(packet) {
                relay.pass_to_daemon(packet);
                return;
            }
        }
        self.plane.handle_datagram(now, packet);
    }

    /// An SA's lifetime event: a mirrored SA that passed a byte or packet
    /// limit tells the kernel (time limits are the kernel's own); others
    /// are the control plane's.
    fn sa_event(&mut self, gateway: &Gateway, now: Duration, name: &str, event: SaEvent) {
        if let Some((_, mirror)) = &mut self.xfrm {
            let hard = matches!(event, SaEvent::HardExpired(_));
            let by_volume = gateway
                .sad()
                .find(name)
                .and_then(|id| gateway.sad().get(id))
                .is_some_and(|sa| {
                    let c = sa.counters();
                    let limits = if hard {
                        sa.params().lifetime.hard
                    } else {
                        sa.params().lifetime.soft
                    };
                    limits.bytes.is_some_and(|b| c.bytes >= b)
                        || limits.packets.is_some_and(|p| c.packets >= p)
                });
            if by_volume && mirror.volume_expired(name, hard, &mut self.feedback) {
                return;
            }
        }
        self.plane.handle_sa_event(now, name, event);
    }

    /// An outbound packet a policy discarded: a trap of the keying
    /// namespace's daemon asks it for an SA.
    fn discarded(&mut self, now: Duration, policy: &str, flow: &spd_sad::FlowKey) {
        if let Some((_, mirror)) = &mut self.xfrm {
            mirror.trapped(now, policy, flow, &mut self.feedback);
        }
    }

    /// Applies new commands here, sends them on to the other workers, and
    /// sends the datagrams whose commands every worker has applied.
    fn apply(&mut self, t: &mut Tick<'_>, links: &Links, workers: usize) {
        let mut commands = Vec::new();
        self.plane.take_noted_commands(&mut commands);
        let from_plane = commands.len();
        if let Some((_, mirror)) = &mut self.xfrm {
            // The ledger forgets the keys a rekey replaced before the
            // commands install anything (an SA of this batch may take a
            // name that one had).
            let mut superseded = Vec::new();
            mirror.take_superseded(&mut superseded);
            if let (Some(state), false) = (&self.state, superseded.is_empty()) {
                state.forget(&superseded);
            }
            mirror.take_noted_commands(&mut commands);
        }
        let changed = !commands.is_empty();
        let mut sent = Vec::with_capacity(commands.len());
        let mut ledgered = Vec::new();
        for (index, (mut command, note)) in commands.into_iter().enumerate() {
            self.issued += 1;
            // An SA with static keys resumes above its ledger's mark (one
            // that replaces an SA with the same keys also above where that
            // one got to).
            if let (Some(state), Some(sa)) = (&self.state, command.installs_mut()) {
                state.prepare([&mut *sa]);
                if sa.ledger_mark.is_some() {
                    ledgered.push(sa.clone());
                }
            }
            self.retire_for_metrics(t.gateway, t.now, &command);
            let fallback = command.clone();
            // What goes, as it was before the command removes it.
            let removed = match &command {
                SaCommand::RemoveSa(name) => installed_sa(t.gateway, name),
                _ => None,
            };
            let (copies, refused) = match t.gateway.apply_first(command, t.now, workers - 1) {
                Ok(copies) => {
                    log_sa_change(self.plane.config(), &fallback, removed, note.as_ref());
                    (copies, false)
                }
                Err(e) => {
                    match &mut self.xfrm {
                        Some((_, mirror)) if index >= from_plane => mirror.note_apply_failed(&fallback, &e),
                        _ => ike_stub::plane::log_refused(&fallback, &e),
                    }
                    let copies = (1..workers)
                        .map(|_| WorkerCommand::Apply(fallback.clone()))
                        .collect();
                    (copies, true)
                }
            };
            sent.push((self.issued, copies, refused));
        }
        // Their first reservation is durable before any worker has them:
        // a write here, on a reload, rather than drops there.
        if let (Some(state), false) = (&self.state, ledgered.is_empty()) {
            state.attach(t.gateway, &ledgered);
            if let Err(e) = state.round(state.elapsed()) {
                tracing::error!("{e:#}");
            }
        }
        for (issued, copies, refused) in sent {
            for (copy, (tx, _)) in copies.into_iter().zip(&links.commands[1..]) {
                let _ = tx.send((issued, copy, refused));
            }
        }
        if changed {
            if let Some(steering) = self.steering.as_mut() {
                let t: &Tick<'_> = t;
                if let Err(e) = steering.update(t.gateway, &mut |port, program| t.steer(port, program)) {
                    // The old program stays: packets of new policies may
                    // reach a worker that does not own their SA.
                    tracing::error!("{e:#}");
                }
            }
        }
        let mut datagrams = Vec::new();
        self.plane.take_datagrams(&mut datagrams);
        self.pending.extend(datagrams);
        let ready = links.applied_everywhere();
        while self.pending.front().is_some_and(|d| d.after_commands <= ready) {
            let Some(d) = self.pending.pop_front() else { break };
            if let Err(e) = t.send_datagram(d.ports, d.to.into(), &d.payload) {
                tracing::warn!(
                    event = "control_not_sent",
                    to = %d.to,
                    reason = %e,
                    "control message not sent: {e}"
                );
            }
        }
    }

    /// Re-reads the configuration; on any error the running one stays.
    fn reload(&mut self) -> Reply {
        let result = Config::load_trusting(&self.config_path, self.trusted)
            .map_err(|e| e.to_string())
            .and_then(|mut config| {
                // The same device defaults as at start, so that only what
                // the file changed counts as a change.
                device_defaults(&mut config).map_err(|e| format!("{e:#}"))?;
                let state_dir = crate::state_dir::resolve(self.state_flag.as_deref(), &config);
                if state_dir.as_deref() != self.state.as_ref().map(|s| s.path()) {
                    return Err(format!(
                        "the state directory would change from {} to {}, which needs a restart",
                        self.state
                            .as_ref()
                            .map_or("none".into(), |s| s.path().display().to_string()),
                        state_dir.map_or("none".into(), |p| p.display().to_string()),
                    ));
                }
                let keying = self
                    .keying_flags
                    .apply(&config.keying)
                    .map_err(|e| format!("{e:#}"))?;
                keying_unchanged(&self.keying, &keying)?;
                let mut warnings = config.warnings();
                if self.state.is_none() {
                    warnings.extend(
                        crate::state_dir::without_state_dir(&config, "run").map_err(|e| format!("{e:#}"))?,
                    );
                }
                let report = self.plane.reload(config).map_err(|e| e.to_string())?;
                for warning in warnings {
                    tracing::warn!("{warning}");
                }
                Ok(report)
            });
        let reloads = self.plane.counters().reloads;
        match result {
            Ok(report) => {
                tracing::info!(
                    event = "reload",
                    config = %self.config_path.display(),
                    reloads,
                    added = ?report.added,
                    removed = ?report.removed,
                    changed = ?report.changed,
                    unchanged = report.unchanged.len(),
                    manual_changes = report.manual_changes,
                    "configuration reloaded"
                );
                Reply::Reload(ReloadReply {
                    reloaded: true,
                    report,
                })
            }
            Err(e) => {
                // Trouble the gateway runs on through: its running
                // configuration stays, so a warning rather than an error.
                tracing::warn!(
                    event = "reload_refused",
                    config = %self.config_path.display(),
                    reason = %e,
                    "reload refused, the running configuration stays: {e}"
                );
                Reply::error(format!("reload refused, the running configuration stays: {e}"))
            }
        }
    }
}

/// Refuses a reload that would change the keying source: its sockets, the
/// relay's device and the mirror were set up at start, with privileges a
/// reload no longer has.
fn keying_unchanged(running: &ike_stub::Keying, wanted: &ike_stub::Keying) -> Result<(), String> {
    use ike_stub::Keying;
    let describe = |k: &Keying| match k {
        Keying::Config => "the file".to_owned(),
        Keying::Xfrm { netns: None } => "xfrm (espgw's own namespace)".to_owned(),
        Keying::Xfrm { netns: Some(ns) } => format!("xfrm (namespace {ns})"),
    };
    if running == wanted {
        return Ok(());
    }
    Err(format!(
        "the keying source would change from {} to {}, which needs a restart",
        describe(running),
        describe(wanted)
    ))
}

/// A worker other than 0: applies commands, reports datagrams and events.
fn follow(t: &mut Tick<'_>, index: usize, links: &Links) {
    let (_, commands) = &links.commands[index];
    let mut applied = None;
    while let Ok((seq, command, refused_first)) = commands.try_recv() {
        if let Err(e) = t.gateway.apply_worker(command, t.now) {
            if refused_first {
                // Worker 0 refused it too, and logged that.
                tracing::debug!(worker = index, "control plane command: {e}");
            } else {
                tracing::error!(
                    worker = index,
                    "control plane command refused by this worker alone: {e}"
                );
            }
        }
        applied = Some(seq);
    }
    if let Some(seq) = applied {
        links.applied[index].store(seq, Ordering::Release);
    }
    for buf in t.received {
        links.report(Report::Datagram(buf.data().to_vec()));
    }
    while let Some(event) = t.gateway.poll_event() {
        let (SaEvent::SoftExpired(id) | SaEvent::HardExpired(id)) = event;
        if let Some(name) = t.gateway.sad().get(id).map(|sa| sa.name().to_owned()) {
            links.report(Report::Event(name, event));
        }
    }
    t.gateway.take_outbound_discards(|policy, flow| {
        links.report(Report::Discarded(policy.to_owned(), *flow));
    });
}

pub fn run(args: &RunArgs) -> Result<()> {
    let user = args.user.as_deref().map(privileges::User::lookup).transpose()?;
    let mut config = Config::load_trusting(&args.config, user.as_ref().map(|u| u.uid))?;
    config.keying = args.keying(&config.keying)?;
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    // Before any device is opened: a gateway that may not run with its
    // keys, or whose ledger is held or damaged, stops here.
    let state = match crate::state_dir::resolve(args.state_dir.as_deref(), &config) {
        Some(path) => Some(Arc::new(StateDir::open(
            &path,
            user.as_ref().map(|u| (u.uid, u.gid)),
        )?)),
        None => {
            if let Some(warning) = crate::state_dir::without_state_dir(&config, "run")? {
                tracing::warn!("{warning}");
            }
            None
        }
    };
    let (spec, style) = args.accel.apply(&config);
    let tun_inside = config.inside.kind == dataplane::InterfaceKind::Tun;
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, 64);
    if tun_inside && workers > 1 {
        tracing::info!("a TUN inside is served by one worker");
    }
    // IPv6 transit is read by worker 0 alone (the steered sockets take
    // IPv4), and an SA fed by two workers would send its sequence numbers
    // out of order: a gateway that tunnels IPv6 runs one worker.
    let ipv6_tunnels = [&config.inside, &config.outside]
        .iter()
        .any(|i| i.address6.is_some())
        && config.policies.iter().any(|p| {
            matches!(p.action, ike_stub::config::PolicyAction::Protect(_))
                && p.selector
                    .families()
                    .is_ok_and(|f| f.contains(&spd_sad::Family::V6))
        })
        || config.sas.iter().any(|sa| sa.params.remote.is_ipv6());
    if ipv6_tunnels && workers > 1 && !tun_inside {
        tracing::info!("IPv6 tunnels are served by one worker so far");
    }
    // The same for SAs the keying namespace may add: over IPv6 if the
    // gateway has IPv6 addresses.
    let xfrm_keyed = matches!(config.keying, ike_stub::Keying::Xfrm { .. });
    let ipv6_tunnels = ipv6_tunnels
        || xfrm_keyed
            && [&config.inside, &config.outside]
                .iter()
                .any(|i| i.address6.is_some());
    let workers = if tun_inside || ipv6_tunnels { 1 } else { workers };
    let mut sockets = open_sockets(&config, workers, args.receive.into())?;
    let moderation = drivers::run::Moderation {
        max: Duration::from_micros(args.rx_coalesce_us),
    };
    // After the sockets: a TUN inside exists only once it is opened.
    for line in device_defaults(&mut config)? {
        tracing::info!("{line}");
    }
    // The last files created where root may: then root goes.
    let control_path = args
        .control
        .clone()
        .unwrap_or_else(|| control::default_path(&config.name));
    let control = control::Listener::bind(&control_path, user.as_ref().map(|u| (u.uid, u.gid)))?;
    let _socket_file = control::SocketFile(control_path);
    let metrics_server = args.metrics.as_deref().map(MetricsServer::bind).transpose()?;
    let metrics_on = metrics_server.is_some();
    let mut stats_file = match &args.stats {
        Some(path) => {
            Some(std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?)
        }
        None => None,
    };
    // The keying namespace's XFRM sockets and first dumps, while root may
    // still enter it and dump; the reader starts once privileges are
    // dropped (which needs a single thread running).
    let xfrm = match &config.keying {
        ike_stub::Keying::Xfrm { netns } => {
            // The relay's TUN goes into the keying namespace; without one
            // the daemon shares espgw's namespace and its interfaces.
            let relay = netns.is_some().then_some(ike_stub::xfrm::relay::Outside {
                v4: config.outside.address,
                v6: config.outside.address6.map(|(address, _)| address),
            });
            let opened = XfrmSource::open(netns.as_deref(), relay).with_context(|| {
                format!(
                    "the xfrm keying source (namespace {})",
                    netns.as_deref().unwrap_or("of espgw")
                )
            })?;
            tracing::info!(
                netns = netns.as_deref().unwrap_or("(espgw's own)"),
                "mirroring the XFRM SAD and SPD of the keying namespace"
            );
            Some(opened)
        }
        ike_stub::Keying::Config => None,
    };
    // Telling the keying namespace's kernel what espgw did (and dumping
    // it again after an overrun) is a netlink request that needs
    // CAP_NET_ADMIN at every send: a broker process of its own keeps that
    // privilege and takes those requests alone, so that this one, which
    // parses the network's packets, keeps none that reaches the SAD.
    let xfrm = match xfrm {
        Some(opened) => {
            let (opened, broker) = opened.with_broker(user.as_ref())?;
            tracing::info!(
                pid = broker,
                "xfrm: the broker holds CAP_NET_ADMIN for feedback and dumps; this process gives it up"
            );
            Some(opened)
        }
        None => None,
    };
    // Opening a deleted device's sockets again, once it is back, needs
    // CAP_NET_RAW for each new socket: a broker of its own keeps that
    // privilege and creates only unbound packet sockets, so that this
    // process gives it up too.
    let reopener = match config.on_device_loss {
        ike_stub::DeviceLoss::Wait => {
            let broker = SocketBroker::spawn(user.as_ref())?;
            tracing::info!(
                pid = broker.pid(),
                "the packet socket broker holds CAP_NET_RAW to reopen a deleted device's sockets; this process gives it up"
            );
            Some(Reopener::new(Box::new(broker), workers))
        }
        ike_stub::DeviceLoss::Exit => None,
    };
    let losses: Vec<OnDeviceLoss> = (0..workers)
        .map(|index| match &reopener {
            Some(reopener) => OnDeviceLoss::Wait(reopener.worker(index)),
            None => OnDeviceLoss::Exit,
        })
        .collect();
    let dropped = privileges::drop_privileges(user.as_ref())?;
    tracing::info!(
        uid = dropped.uid,
        capabilities = ?dropped.kept,
        bounding_set_left = dropped.bounding_left,
        "privileges dropped: no new privileges, not dumpable"
    );
    let xfrm = match xfrm {
        Some(opened) => Some((
            opened.start()?,
            XfrmMirror::new(crate::xfrm_source::mirror_settings(&config, state.is_some())),
        )),
        None => None,
    };
    let mut setup = config.setup(dataplane::LinkLayer::Ethernet, style);
    setup.resolve_neighbors = true;
    setup.only_own_mac = true;
    // Every worker resolves its own next hops and sees every ARP reply.
    setup.neighbor_limits.replies_for_other_workers = workers > 1;
    // SAs with static keys resume above their ledger's marks, set on the
    // commands that install them: the plane's copy of the configuration,
    // which a reload is compared with, has none.
    let mut commands = config.commands();
    if let Some(state) = &state {
        state.prepare(commands.iter_mut().filter_map(SaCommand::installs_mut));
    }
    let first = Gateway::with_commands(setup, accel::build_engine(&spec)?, &commands, Duration::ZERO)
        .with_context(|| format!("cannot install {}", args.config.display()))?;
    for (_, sa) in first.sad().iter() {
        log_sa_installed(&config, sa.name(), sa.spi(), sa.params().direction, None, None);
    }
    if let Some(state) = &state {
        // The first reservations are durable before any worker starts.
        state.attach(&first, commands.iter().filter_map(SaCommand::installs));
        let reserved = state.round(state.elapsed())?;
        tracing::info!(
            dir = %state.path().display(),
            sas = reserved,
            previous_stop = if state.was_settled() { "clean: exact marks" } else { "not clean: reserved marks" },
            "sequence numbers of SAs with static keys resume from the state directory"
        );
    }
    let mut gateways = vec![first];
    for _ in 1..workers {
        let fork = gateways[0]
            .fork(accel::build_engine(&spec)?)
            .context("registering the SAs with another worker's engine")?;
        gateways.push(fork);
    }
    for (index, gateway) in gateways.iter_mut().enumerate() {
        gateway.place(index, workers);
    }
    let mut steering = match sockets.first().map(|s| (&s.inside, &s.outside)) {
        Some((inside, Device::Packet(_))) if workers > 1 => Some(Steering {
            inside: matches!(inside, Device::Packet(_)),
            workers,
            program: Vec::new(),
            outside_program: Vec::new(),
        }),
        _ => None,
    };
    if let (Some(steering), Some(first)) = (steering.as_mut(), sockets.first()) {
        steering.update(&gateways[0], &mut |port, program| {
            first.steer(port, program, &losses[0])
        })?;
        tracing::info!(
            "inside steered by a {}-instruction BPF program: each outbound SA's packets go to the worker that owns it",
            steering.program.len()
        );
        tracing::info!(
            "outside steered by a {}-instruction BPF program, fragments reassembled first: each inbound SA's packets go to the worker that owns its replay window",
            steering.outside_program.len()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&reload))
        .context("installing the SIGHUP handler")?;
    let requests = control.serve()?;
    // Each worker publishes its counters now and then (not per packet);
    // worker 0 answers the control socket from all of them.
    let published: Arc<Published> = Arc::new(Mutex::new(vec![WorkerCounters::default(); workers]));
    let links = Links::new(workers);
    let mut plane = Some(Plane {
        plane: ControlPlane::new(config.clone()),
        config_path: args.config.clone(),
        trusted: user.as_ref().map(|u| u.uid),
        pending: VecDeque::new(),
        issued: 0,
        reload,
        last_timeout: Duration::ZERO,
        steering,
        state: state.clone(),
        state_flag: args.state_dir.clone(),
        keying: config.keying.clone(),
        keying_flags: args.keying_flags(),
        xfrm,
        feedback: Vec::new(),
        last_usage_report: Duration::ZERO,
        metrics: metrics_on.then(|| PlaneMetrics {
            totals: TunnelTotals::default(),
            snapshot: Arc::new(Mutex::new(Arc::new(Snapshot::default()))),
            last: None,
        }),
    });
    let _metrics_thread = match (metrics_server, &plane) {
        (Some(server), Some(p)) => Some(server.start(Arc::clone(&published), p.metrics_snapshot())?),
        _ => None,
    };
    let writer = state.as_ref().map(|state| state.spawn_writer(Arc::clone(&stop)));
    tracing::info!(
        name = %config.name,
        inside = %config.inside.device,
        outside = %config.outside.device,
        engine = %spec.kind,
        style = %style,
        workers,
        receive = drivers::afpacket::Receive::from(args.receive).name(),
        udp_gso = drivers::afpacket::udp_gso_supported(),
        rx_coalesce_us = moderation.max.as_micros(),
        tunnels = config.tunnels.len(),
        "forwarding"
    );
    // The sockets are open, privileges dropped, the tunnels installed: a
    // service manager (systemd's Type=notify) may start what depends on
    // the gateway. Without $NOTIFY_SOCKET this does nothing.
    notify_service_manager(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!("forwarding, {} tunnels", config.tunnels.len())),
    ]);
    let mut final_plane = None;
    let (inside_device, outside_device) = (config.inside.device.as_str(), config.outside.device.as_str());
    let config_for_log = &config;
    let mut final_mirror = None;
    let mut panicked = false;
    let results: Vec<std::io::Result<RunSummary>> = std::thread::scope(|scope| {
        let handles: Vec<_> = gateways
            .iter_mut()
            .zip(sockets.iter_mut())
            .zip(&losses)
            .enumerate()
            .map(|(index, ((gateway, sockets), loss))| {
                let stop = Arc::clone(&stop);
                let published = Arc::clone(&published);
                let with_engine = metrics_on;
                let requests = requests.clone();
                let links = &links;
                let mut plane = if index == 0 { plane.take() } else { None };
                let state = state.clone();
                scope.spawn(move || {
                    let mut ticks = 0u32;
                    let mut unreserved = 0u64;
                    let mut link_down = [false; 2];
                    let mut device_lost = [false; 2];
                    let devices = [inside_device, outside_device];
                    let mut tick = |t: &mut Tick<'_>| {
                        ticks = ticks.wrapping_add(1);
                        // Once per change, from the first worker (they
                        // share the devices).
                        if index == 0
                            && (t.summary.link_down != link_down || t.summary.device_lost != device_lost)
                        {
                            log_device_changes(
                                config_for_log,
                                devices,
                                (link_down, t.summary.link_down),
                                (device_lost, t.summary.device_lost),
                                t.summary.devices_lost,
                            );
                            link_down = t.summary.link_down;
                            device_lost = t.summary.device_lost;
                        }
                        // Packets waiting for (or dropped for want of) a
                        // durable ceiling: the ledger's writer goes now.
                        if let Some(state) = &state {
                            let stats = t.gateway.stats();
                            let now =
                                stats.seq_awaited + stats.drops.get(dataplane::DropReason::SeqNotReserved);
                            if now != unreserved {
                                unreserved = now;
                                state.nudge();
                            }
                        }
                        // `try_lock`: a scrape or a status request reading
                        // them never makes a worker wait.
                        if ticks.is_multiple_of(64) {
                            if let Ok(mut p) = published.try_lock() {
                                p[index] = worker_counters(t, with_engine);
                            }
                        }
                        let Some(plane) = plane.as_mut() else {
                            return follow(t, index, links);
                        };
                        plane.tick(t, links, workers);
                        while let Ok(request) = requests.try_recv() {
                            let reply = if ike_stub::ControlRequest::parse(&request.line)
                                == Ok(ike_stub::ControlRequest::Reload)
                            {
                                let reply = plane.reload();
                                plane.apply(t, links, workers);
                                reply
                            } else {
                                if let Ok(mut p) = published.lock() {
                                    p[0] = worker_counters(t, with_engine);
                                }
                                let (total, mut run) = sum(&published);
                                run.control_overflow += links.reports_dropped.load(Ordering::Relaxed);
                                let relay = plane
                                    .xfrm
                                    .as_mut()
                                    .and_then(|(source, _)| source.relay().map(|r| r.counters().clone()));
                                let mirror = plane.xfrm.as_ref().map(|(_, m)| m);
                                let mut reply = report::answer(
                                    t.gateway,
                                    Some(&plane.plane),
                                    mirror,
                                    total,
                                    &run,
                                    &request.line,
                                );
                                if let Reply::Stats(stats) = &mut reply {
                                    if stats.xfrm.is_some() {
                                        stats.ike_relay = relay;
                                    }
                                }
                                reply
                            };
                            let _ = request.reply.send(control::encode_line(&reply));
                        }
                    };
                    let result = drivers::run::run(gateway, sockets, &stop, moderation, loss, &mut tick);
                    if result.is_err() {
                        // The others stop too: the gateway is one process,
                        // and its service manager restarts it whole.
                        stop.store(true, Ordering::Relaxed);
                    }
                    (result, plane.map(|p| (p.plane, p.xfrm.map(|(_, mirror)| mirror))))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok((result, plane)) => {
                    if let Some((plane, mirror)) = plane {
                        final_plane = Some(plane);
                        final_mirror = mirror;
                    }
                    result
                }
                Err(_) => {
                    panicked = true;
                    Err(std::io::Error::other("a worker panicked"))
                }
            })
            .collect()
    });
    if let Some(writer) = writer {
        // `stop` is set once the workers are done.
        stop.store(true, Ordering::Relaxed);
        let _ = writer.join();
    }
    // Every worker has stopped: no copy of an SA can use another number,
    // so the ledger may hold each SA's exact mark instead of its
    // reservation's end, and a peer that goes on is not refused after the
    // next start. Not after a panic, whose SA state is not to be trusted:
    // the reservations stand then, as after a crash.
    if let Some(state) = &state {
        if panicked {
            tracing::warn!("a worker panicked: the sequence ledger keeps its reservations, as after a crash");
        } else {
            for gateway in &mut gateways {
                gateway.flush_sa_usage();
            }
            match state.settle() {
                Ok(sas) => tracing::info!(
                    dir = %state.path().display(),
                    sas,
                    "sequence ledger settled: the next start resumes where these SAs stopped"
                ),
                Err(e) => {
                    tracing::warn!("{e:#}: the sequence ledger keeps its reservations, as after a crash")
                }
            }
        }
    }
    let mut summary = RunSummary::default();
    for result in results {
        summary.add(&result?);
    }
    let mut total = dataplane::Stats::default();
    for gateway in &gateways {
        total.add(gateway.stats());
    }
    notify_service_manager(&[sd_notify::NotifyState::Stopping]);
    if let Some(plane) = &final_plane {
        for t in plane
            .tunnels(Duration::ZERO)
            .iter()
            .filter(|t| !t.sa_out.is_empty())
        {
            tracing::info!(
                event = "tunnel_down",
                tunnel = %t.name,
                generation = t.generation,
                reason = "espgw stopped",
                "tunnel down: espgw stopped"
            );
        }
    }
    // The last line, in the log's format like every other (a JSON log
    // stays JSON to its end).
    tracing::info!(
        name = %config.name,
        workers,
        frames_in = summary.frames_in,
        frames_out = summary.frames_out,
        send_errors = summary.send_errors,
        kernel_drops = summary.kernel_drops,
        "stopped"
    );
    if let (Some(path), Some(file)) = (&args.stats, stats_file.as_mut()) {
        let doc = FinalStats {
            stats: report::stats_reply(
                &gateways[0],
                final_plane.as_ref(),
                final_mirror.as_ref(),
                total,
                &summary,
            ),
            send_errors: summary.send_errors,
            workers,
        };
        let text = control::encode(&doc, true)?;
        std::io::Write::write_all(file, (text + "\n").as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// An SA of a gateway as its log lines name it.
struct SaSummary {
    name: String,
    spi: u32,
    direction: spd_sad::SaDirection,
}

/// SA `name` of `gateway`, if it is there.
fn installed_sa(gateway: &Gateway, name: &str) -> Option<SaSummary> {
    let sa = gateway.sad().get(gateway.sad().find(name)?)?;
    Some(SaSummary {
        name: name.to_owned(),
        spi: sa.spi(),
        direction: sa.params().direction,
    })
}

/// What an SA's log lines say it belongs to: the tunnel of `config`
/// whose name it bears (`{tunnel}-out`, `{tunnel}-in.{generation}`), its
/// generation, and the reqid of an SA of the `xfrm` keying source
/// (`xfrm-r{reqid}-...`).
fn sa_owner(config: &Config, name: &str) -> (Option<String>, Option<u32>, Option<u32>) {
    let generation = ike_stub::plane::sa_generation(name);
    let base = match generation {
        Some(_) => name.rsplit_once('.').map_or(name, |(base, _)| base),
        None => name,
    };
    let tunnel = base
        .strip_suffix("-out")
        .or_else(|| base.strip_suffix("-in"))
        .filter(|t| generation.is_some() || config.tunnel(t).is_some())
        .map(str::to_owned);
    let reqid = name
        .strip_prefix("xfrm-r")
        .and_then(|rest| rest.split('-').next())
        .and_then(|r| r.parse().ok());
    (tunnel, generation, reqid)
}

/// The one line of an SA installed in the gateways (`replaces`: the SA
/// it took the sequence counter and replay window of). Never its keys.
fn log_sa_installed(
    config: &Config,
    name: &str,
    spi: u32,
    direction: spd_sad::SaDirection,
    reqid: Option<u32>,
    replaces: Option<&str>,
) {
    let (tunnel, generation, named_reqid) = sa_owner(config, name);
    tracing::info!(
        event = "sa_installed",
        sa = name,
        spi = %format_args!("{spi:#010x}"),
        direction = %direction,
        tunnel,
        generation,
        reqid = reqid.or(named_reqid),
        replaces,
        "SA installed"
    );
}

/// The one line of a command that installed or removed an SA, applied by
/// worker 0 (the others apply the same; their copies share its state). A
/// removal says why (`reason`) and the tunnel its source named (one a
/// reload removed is no longer in `config`).
fn log_sa_change(
    config: &Config,
    command: &SaCommand,
    removed: Option<SaSummary>,
    note: Option<&ike_stub::RemovalNote>,
) {
    let reqid_of = |sa: &dataplane::command::SaSetup| match sa.key_source {
        ike_stub::KeySource::Xfrm { reqid } => Some(reqid),
        _ => None,
    };
    match command {
        SaCommand::InstallSa(sa) => log_sa_installed(
            config,
            &sa.params.name,
            sa.params.spi,
            sa.params.direction,
            reqid_of(sa),
            None,
        ),
        SaCommand::ReplaceSa { old, new } => log_sa_installed(
            config,
            &new.params.name,
            new.params.spi,
            new.params.direction,
            reqid_of(new),
            Some(old),
        ),
        SaCommand::RemoveSa(_) => {
            // A removal of an SA that is not there (one a gateway refused)
            // removes nothing.
            let Some(sa) = removed else { return };
            let (tunnel, generation, reqid) = sa_owner(config, &sa.name);
            let tunnel = note.and_then(|n| n.tunnel.clone()).or(tunnel);
            let reason = note.map(|n| n.why.as_str());
            tracing::info!(
                event = "sa_removed",
                sa = %sa.name,
                spi = %format_args!("{:#010x}", sa.spi),
                direction = %sa.direction,
                tunnel,
                generation,
                reqid,
                reason,
                "SA removed"
            );
        }
        _ => {}
    }
}

/// The lines of devices gone down or come up, deleted or back (`was`,
/// `is`: by `Port::index`), once per change; `lost` is how many
/// deletions the workers have seen.
fn log_device_changes(
    config: &Config,
    devices: [&str; 2],
    down: ([bool; 2], [bool; 2]),
    gone: ([bool; 2], [bool; 2]),
    lost: u64,
) {
    for port in [Port::Inside, Port::Outside] {
        let i = port.index();
        let device = devices[i];
        match (gone.0[i], gone.1[i]) {
            (false, true) => tracing::warn!(
                event = "device_lost",
                device,
                interface = %port,
                devices_lost = lost,
                "device deleted: SAs and counters kept; its sockets are opened again once a device of that name is up"
            ),
            (true, false) => {
                tracing::info!(
                    event = "device_back",
                    device,
                    interface = %port,
                    "device back: its sockets opened again, forwarding"
                );
                device_mismatch(config, port, device);
            }
            _ => {}
        }
        if gone.1[i] {
            continue;
        }
        match (down.0[i], down.1[i]) {
            (false, true) => tracing::warn!(
                event = "device_down",
                device,
                interface = %port,
                "device down: waiting for it to come back up"
            ),
            (true, false) => tracing::info!(
                event = "device_up",
                device,
                interface = %port,
                "device up again: forwarding"
            ),
            _ => {}
        }
    }
}

/// A device made again with another MAC address or MTU than the one the
/// gateway took at start: the gateway goes on with those (it answers ARP
/// with its own MAC, which a promiscuous socket still receives), and says
/// so.
fn device_mismatch(config: &Config, port: Port, device: &str) {
    let (iface, set) = match port {
        Port::Inside => (&config.inside, config.link_overrides[0]),
        Port::Outside => (&config.outside, config.link_overrides[1]),
    };
    if iface.kind == dataplane::InterfaceKind::Tun {
        return;
    }
    let Ok(link) = drivers::device::link(device) else {
        return;
    };
    let mac = link.mac.filter(|m| !set.mac && *m != iface.mac);
    let mtu = (!set.mtu && link.mtu.min(MAX_DEVICE_MTU) != u32::from(iface.mtu)).then_some(link.mtu);
    if mac.is_some() || mtu.is_some() {
        tracing::warn!(
            device,
            interface = %port,
            mac = colon_mac(iface.mac),
            device_mac = mac.map(colon_mac),
            mtu = iface.mtu,
            device_mtu = mtu,
            "the device came back with another MAC address or MTU than at start: the gateway keeps its own until a restart"
        );
    }
}

/// The largest MTU a pool buffer carries (an Ethernet frame of
/// `MAX_FRAME` bytes); a device with a larger one (jumbo frames) is used
/// with this, and what does not fit is refused as a router refuses it.
const MAX_DEVICE_MTU: u32 = (dataplane::buffer::MAX_FRAME - 14) as u32;

/// Takes each interface's MAC address and MTU from its device where the
/// config leaves them out, so that the hosts' neighbour caches and the
/// kernel agree with the gateway; returns a line per interface saying
/// which were used and where they came from.
fn device_defaults(config: &mut Config) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for port in [Port::Inside, Port::Outside] {
        let set = config.link_overrides[port.index()];
        let iface = match port {
            Port::Inside => &mut config.inside,
            Port::Outside => &mut config.outside,
        };
        let link = drivers::device::link(&iface.device)
            .with_context(|| format!("interface `{port}` (device `{}`)", iface.device))?;
        let tun = iface.kind == dataplane::InterfaceKind::Tun;
        let mac_from = match (tun, set.mac, link.mac) {
            (true, _, _) => "unused on a TUN device",
            (false, true, _) => "from the config",
            (false, false, Some(mac)) => {
                iface.mac = mac;
                "the device's"
            }
            (false, false, None) => "derived from the address: the device has no Ethernet address",
        };
        let mtu_from = if set.mtu {
            "from the config".to_owned()
        } else if link.mtu < 576 {
            anyhow::bail!(
                "interface `{port}`: device `{}` has MTU {}, below the 576 bytes every IPv4 host must accept (RFC 791); raise it (ip link set {} mtu 1500) or set `mtu` in its [[interface]]",
                iface.device,
                link.mtu,
                iface.device
            );
        } else if link.mtu > MAX_DEVICE_MTU {
            iface.mtu = MAX_DEVICE_MTU as u16;
            format!(
                "the device's {} capped to {MAX_DEVICE_MTU}, the largest frame espgw's buffers hold",
                link.mtu
            )
        } else {
            iface.mtu = link.mtu as u16;
            "the device's".to_owned()
        };
        lines.push(format!(
            "interface `{port}` on `{}`: MAC {} ({mac_from}), MTU {} ({mtu_from})",
            iface.device,
            colon_mac(iface.mac),
            iface.mtu
        ));
    }
    Ok(lines)
}

/// A MAC address as `ip link` writes it.
fn colon_mac(mac: dataplane::EthernetAddress) -> String {
    let m = mac.0;
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// One set of sockets per worker.
fn open_sockets(config: &Config, workers: usize, receive: Receive) -> Result<Vec<Sockets>> {
    let tun_inside = config.inside.kind == dataplane::InterfaceKind::Tun;
    let open = |device: &str, role: &str, worker: bool, group: u16| -> Result<AfPacket> {
        let socket = if worker {
            AfPacket::open_worker_outside(device, group, receive)
        } else {
            AfPacket::open_receiving(device, receive)
        };
        socket.with_context(|| format!("interface `{role}` (device `{device}`)"))
    };
    // One fanout group per interface and process, shared by its workers
    // (a group holds sockets of one device only).
    let group = ((std::process::id() & 0x7fff) as u16) << 1;
    let mut sockets = Vec::with_capacity(workers);
    for worker in 0..workers {
        let many = workers > 1;
        let inside = if tun_inside {
            Device::Tun(
                Tun::open(&config.inside.device)
                    .with_context(|| format!("interface `inside` (TUN `{}`)", config.inside.device))?,
            )
        } else {
            // Steered, so that each outbound SA is fed by one worker.
            let device = &config.inside.device;
            let socket = if many {
                AfPacket::open_worker_steered(device, group, receive)
            } else {
                AfPacket::open_receiving(device, receive)
            };
            Device::Packet(socket.with_context(|| format!("interface `inside` (device `{device}`)"))?)
        };
        let mut s = Sockets::single(
            inside,
            // Steered by SPI, so that each inbound SA has one replay window.
            Device::Packet(open(&config.outside.device, "outside", many, group + 1)?),
        );
        if many {
            s.receive.push((
                Port::Inside,
                Device::Packet(AfPacket::open_arp(&config.inside.device)?),
            ));
            s.receive.push((
                Port::Outside,
                Device::Packet(AfPacket::open_arp(&config.outside.device)?),
            ));
            // IPv6 for our own addresses: read by the worker that answers
            // ARP (worker 0) only, so that each solicitation and echo
            // gets one reply.
            for (port, iface) in [(Port::Inside, &config.inside), (Port::Outside, &config.outside)] {
                if worker == 0 && iface.address6.is_some() && !(port == Port::Inside && tun_inside) {
                    s.receive
                        .push((port, Device::Packet(AfPacket::open_ipv6(&iface.device)?)));
                }
            }
        }
        sockets.push(s);
    }
    Ok(sockets)
}

/// The counters every worker published, added up.
fn sum(published: &Published) -> (dataplane::Stats, RunSummary) {
    let mut total = dataplane::Stats::default();
    let mut run = RunSummary::default();
    if let Ok(p) = published.lock() {
        for w in p.iter() {
            total.add(&w.stats);
            run.add(&w.run);
        }
    }
    (total, run)
}

/// What a worker publishes: its gateway's and its loop's counters, and
/// its engine's when the metrics show them (reading those allocates).
fn worker_counters(t: &Tick<'_>, with_engine: bool) -> WorkerCounters {
    WorkerCounters {
        stats: *t.gateway.stats(),
        run: *t.summary,
        engine: if with_engine {
            (&t.gateway.engine_counters()).into()
        } else {
            Default::default()
        },
    }
}

/// Tells the service manager (`$NOTIFY_SOCKET`) where the gateway stands; a
/// failure to is logged, never fatal.
fn notify_service_manager(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(false, states) {
        tracing::warn!(%error, "could not notify the service manager");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ike_stub::Keying;

    /// A reload reads the file again and applies the start's flags to it:
    /// the keying source it gives must be the one running, or the reload
    /// is refused, saying from what to what.
    #[test]
    fn a_reload_may_not_change_the_keying_source() {
        let xfrm = |ns: Option<&str>| Keying::Xfrm {
            netns: ns.map(str::to_owned),
        };
        assert_eq!(keying_unchanged(&xfrm(Some("key")), &xfrm(Some("key"))), Ok(()));
        assert_eq!(
            keying_unchanged(&Keying::Config, &xfrm(Some("key"))),
            Err(
                "the keying source would change from the file to xfrm (namespace key), which needs a restart"
                    .into()
            )
        );
        assert_eq!(
            keying_unchanged(&xfrm(Some("a")), &xfrm(None)),
            Err("the keying source would change from xfrm (namespace a) to xfrm (espgw's own namespace), which needs a restart".into())
        );
        // The flags win over the file, at a reload as at the start: a file
        // that moved to another namespace changes nothing under
        // `--keying xfrm --keying-netns a`, and without flags it does.
        let flags = crate::KeyingFlags {
            keying: Some(crate::KeyingArg::Xfrm),
            netns: Some("a".into()),
        };
        let running = flags.apply(&xfrm(Some("a"))).unwrap();
        let reread = flags.apply(&xfrm(Some("b"))).unwrap();
        assert_eq!(keying_unchanged(&running, &reread), Ok(()));
        let none = crate::KeyingFlags::default();
        assert!(keying_unchanged(&running, &none.apply(&xfrm(Some("b"))).unwrap()).is_err());
        assert!(keying_unchanged(&running, &none.apply(&Keying::Config).unwrap()).is_err());
    }
}
