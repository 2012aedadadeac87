//! `espgw bench --tunnels 1,100,10000 [--policies N,...]`: the in-memory
//! sweep as the tables grow.
//!
//! One outbound gateway (site A of the sweep, soft engine, inline single
//! pass) is given `tunnels` tunnels to its peer, each with its own SA pair
//! and subnet pair (10.100.0.0/24, 10.100.1.0/24, ... beside the sweep's
//! own 192.168.2.0/24) and a protect policy each way, through the
//! commands keying sources give a gateway
//! ([`dataplane::command::SaCommand`]). `--policies` pads the
//! SPD with TCP discard policies consulted first (so a linear SPD would
//! walk them all); the UDP test traffic matches none of them. Traffic is
//! spread evenly over every tunnel, one flow each, in batches of
//! [`BATCH`].
//!
//! Each row reports, for one table size:
//! - encapsulation time per packet (median of the timed slices);
//! - SPD lookup time per packet for the row's flows: through the index
//!   alone (a flow-cache miss) and through the flow cache as the dataplane
//!   calls it, with its hit rate;
//! - memory: the SA state per SA ([`spd_sad::SecurityAssociation::state_bytes`])
//!   and the process's resident-memory growth per tunnel while the tunnels
//!   were installed (everything: SAD, engine sessions, SPD and its index);
//! - the control plane's rate while traffic flows: `--churn` SA installs,
//!   as many rekeys of existing tunnels (new outbound SA, policy repointed,
//!   old SA deleted), then the deletes of the installed SAs, with a batch
//!   of traffic over the unchanged tunnels between every 100 commands. Any
//!   packet of that traffic that is not encapsulated is counted as a drop.
//!
//! Rates time the commands alone, never the traffic between them.

use std::net::Ipv4Addr;
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

use accel::{Algorithm, EngineSpec, SecretBytes, Style};
use anyhow::{bail, ensure, Context};
use dataplane::command::{KeySource, PolicyAction, PolicySetup, SaCommand, SaSetup};
use dataplane::{Gateway, Output, PacketBuf, PacketPool, Port, Verdict};
use smoltcp::wire::Ipv4Packet;
use spd_sad::{
    proto, FlowKey, Ipv4Prefix, Lifetime, Mode, PolicyDirection, PortRange, ProtocolSelector, SaDirection,
    SaParams, Selector,
};
use zeroize::Zeroizing;

use crate::measure::{plaintext_frame, BATCH};
use crate::scenario::{gateway, EngineSetup};

/// What to measure.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// Tunnel counts, one row group each (empty: one tunnel).
    pub tunnels: Vec<usize>,
    /// Total SPD sizes to pad to (each at least the tunnels' own policies);
    /// empty: the tunnels' policies alone.
    pub policies: Vec<usize>,
    /// The tunnels' transform.
    pub algorithm: Algorithm,
    /// Ethernet frame size of the traffic in bytes on the wire, FCS
    /// included.
    pub frame_size: usize,
    /// Wall-clock length of one timed encapsulation slice.
    pub slice: Duration,
    /// Timed slices per row; the row reports their median.
    pub repetitions: usize,
    /// SAs installed (and deleted, and tunnels rekeyed) while traffic flows.
    pub churn: usize,
}

/// One row: one table size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleRow {
    /// Tunnels installed: an SA pair and a protect policy each way each.
    pub tunnels: usize,
    /// Policies in the SPD (both directions).
    pub policies: usize,
    /// Selector shapes of the outbound SPD: probes of an uncached lookup.
    pub shapes: usize,
    /// Encapsulation time per packet in ns, traffic spread evenly over
    /// every tunnel: the median of the timed slices.
    pub encap_ns: f64,
    /// Outbound SPD lookup time per packet in ns through the index alone
    /// (as on a flow-cache miss), over the row's flows.
    pub spd_index_ns: f64,
    /// Outbound SPD lookup time per packet in ns through the flow cache, as
    /// the dataplane calls it, over the row's flows.
    pub spd_cached_ns: f64,
    /// Flow-cache hits over lookups during the encapsulation slices.
    pub cache_hit_rate: f64,
    /// Bytes of state per SA, the mean over the SAD
    /// ([`spd_sad::SecurityAssociation::state_bytes`]).
    pub sa_state_bytes: f64,
    /// One `handle_timeout` (the tick that adds up the usage of the SAs
    /// used since the last one and re-evaluates their lifetimes and those
    /// whose time limit is due), in microseconds, after a pass of traffic
    /// over every tunnel: the dataplane does nothing else meanwhile.
    pub tick_us: f64,
    /// The same with no SA used since the last tick.
    pub idle_tick_us: f64,
    /// Resident-memory growth per tunnel while they were installed; `None`
    /// where /proc/self/statm is not readable.
    pub rss_bytes_per_tunnel: Option<f64>,
    /// Installing the tunnels (SAs and policies) at set-up, per second.
    pub setup_tunnels_per_s: f64,
    /// SAs installed and then deleted during the churn, and tunnels
    /// rekeyed (`--churn`).
    pub churn: usize,
    /// SA installs per second while traffic flows (the commands alone
    /// timed).
    pub installs_per_s: f64,
    /// Tunnel rekeys per second while traffic flows: new outbound SA,
    /// policy repointed, old SA deleted.
    pub rekeys_per_s: f64,
    /// SA deletes per second while traffic flows.
    pub deletes_per_s: f64,
    /// Seconds the churn's `churn` installs took in all.
    pub install_s: f64,
    /// Seconds the churn's `churn` deletes took in all.
    pub delete_s: f64,
    /// Packets of unchanged tunnels sent during the churn.
    pub churn_packets: u64,
    /// Of `churn_packets`, those that did not leave encapsulated.
    pub churn_dropped: u64,
}

/// The sweep's priority for tunnel policies; padding goes first.
const TUNNEL_PRIORITY: u32 = 100;
const PADDING_PRIORITY: u32 = 50;
const LOCAL_NET: [u8; 3] = [192, 168, 1];
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// Tunnel `t`'s remote subnet: the sweep's own for 0, then 10.100.0.0/24 on.
fn remote_net(t: usize) -> Ipv4Prefix {
    let addr = if t == 0 {
        Ipv4Addr::new(192, 168, 2, 0)
    } else {
        let i = t - 1;
        Ipv4Addr::new(10, 100 + (i >> 8) as u8, (i & 0xff) as u8, 0)
    };
    Ipv4Prefix::new(addr, 24).unwrap_or(Ipv4Prefix::ANY)
}

fn local_net() -> Ipv4Prefix {
    Ipv4Prefix::new(Ipv4Addr::new(LOCAL_NET[0], LOCAL_NET[1], LOCAL_NET[2], 0), 24).unwrap_or(Ipv4Prefix::ANY)
}

fn host_in(net: Ipv4Prefix, host: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.addr()) | u32::from(host))
}

/// Names of tunnel `t`'s outbound SA and policy (the sweep's tunnel is `t`).
fn names(t: usize) -> (String, String) {
    if t == 0 {
        ("t-out".into(), "t-out".into())
    } else {
        (format!("s{t}-out"), format!("s{t}-out"))
    }
}

fn key(len: usize, seed: usize) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(29) ^ seed as u8)
            .collect(),
    )
}

fn sa(
    algorithm: Algorithm,
    name: String,
    direction: SaDirection,
    spi: u32,
    selector: Option<Selector>,
) -> SaSetup {
    SaSetup {
        params: SaParams {
            name,
            direction,
            spi,
            mode: Mode::Tunnel,
            local: LOCAL.into(),
            remote: PEER.into(),
            esn: false,
            replay_window: 64,
            lifetime: Lifetime::default(),
            encap: None,
            selectors: selector.into_iter().collect(),
        },
        algorithm,
        enc_key: SecretBytes::new(&key(algorithm.enc_key_len(), spi as usize)),
        auth_key: SecretBytes::new(&key(algorithm.auth_key_len(), spi as usize + 7)),
        initial_seq: 0,
        // Synthetic keys that never leave the process.
        key_source: KeySource::File,
        // Nothing leaves the process: no sequence ledger.
        ledger_mark: None,
    }
}

fn selector(src: Ipv4Prefix, dst: Ipv4Prefix) -> Selector {
    Selector {
        src: src.into(),
        dst: dst.into(),
        ..Selector::ANY
    }
}

/// The commands that add tunnel `t` (`t >= 1`).
fn tunnel_commands(algorithm: Algorithm, t: usize) -> [SaCommand; 4] {
    let (out_sa, out_policy) = names(t);
    let inward = selector(remote_net(t), local_net());
    [
        SaCommand::InstallSa(Box::new(sa(
            algorithm,
            out_sa.clone(),
            SaDirection::Outbound,
            0x10_0000 + t as u32,
            None,
        ))),
        SaCommand::InstallSa(Box::new(sa(
            algorithm,
            format!("s{t}-in"),
            SaDirection::Inbound,
            0x20_0000 + t as u32,
            Some(inward),
        ))),
        SaCommand::InsertPolicy(PolicySetup {
            name: out_policy,
            direction: PolicyDirection::Out,
            priority: TUNNEL_PRIORITY,
            selector: selector(local_net(), remote_net(t)),
            action: PolicyAction::Protect(out_sa),
        }),
        SaCommand::InsertPolicy(PolicySetup {
            name: format!("s{t}-in"),
            direction: PolicyDirection::In,
            priority: TUNNEL_PRIORITY,
            selector: inward,
            action: PolicyAction::Protect(format!("s{t}-in")),
        }),
    ]
}

/// Padding policy `k` of `tunnels`: TCP to one port of some tunnel's
/// subnet, in three shapes, discarded.
fn padding(k: usize, tunnels: usize) -> PolicySetup {
    let net = remote_net(k % tunnels);
    let (src, dst) = match k % 3 {
        0 => (Ipv4Prefix::host(host_in(local_net(), (k % 253 + 2) as u8)), net),
        1 => (local_net(), Ipv4Prefix::host(host_in(net, (k % 253 + 2) as u8))),
        _ => (local_net(), net),
    };
    let port = (k % 60_000 + 1) as u16;
    PolicySetup {
        name: format!("pad{k}"),
        direction: PolicyDirection::Out,
        priority: PADDING_PRIORITY,
        selector: Selector {
            src: src.into(),
            dst: dst.into(),
            protocol: ProtocolSelector::Number(proto::TCP),
            src_ports: PortRange::ANY,
            dst_ports: PortRange {
                first: port,
                last: port,
            },
        },
        action: PolicyAction::Discard,
    }
}

/// Tunnel `t`'s test frame and flow: UDP 192.168.1.10:4000 → its subnet's .20:5000.
fn frame_for(frame_size: usize, t: usize) -> (Vec<u8>, FlowKey) {
    let mut frame = plaintext_frame(frame_size, t as u8);
    let dst = host_in(remote_net(t), 20);
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut frame[14..]);
        ip.set_dst_addr(dst);
        ip.fill_checksum();
    }
    let flow = FlowKey {
        src: host_in(local_net(), 10).into(),
        dst: dst.into(),
        protocol: proto::UDP,
        ports: Some((4000, 5000)),
    };
    (frame, flow)
}

/// Resident memory of this process, in bytes.
fn rss_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the running system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Batches of the tunnels' frames, round robin, through one gateway.
struct Traffic {
    pool: PacketPool,
    bufs: Vec<PacketBuf>,
    out: Vec<Output>,
    frames: Vec<Vec<u8>>,
    next: usize,
}

impl Traffic {
    fn new(frames: Vec<Vec<u8>>) -> Traffic {
        Traffic {
            pool: PacketPool::new(BATCH * 4),
            bufs: Vec::with_capacity(BATCH),
            out: Vec::with_capacity(BATCH * 2),
            frames,
            next: 0,
        }
    }

    /// Fills a batch from the next frames, skipping tunnel indexes for
    /// which `skip` says so (tunnels being changed).
    fn fill(&mut self, skip: impl Fn(usize) -> bool) -> anyhow::Result<()> {
        let mut tried = 0;
        while self.bufs.len() < BATCH && tried < 2 * BATCH.max(self.frames.len()) {
            let t = self.next % self.frames.len();
            self.next = self.next.wrapping_add(1);
            tried += 1;
            if skip(t) {
                continue;
            }
            let Some(mut buf) = self.pool.alloc() else {
                bail!("the traffic pool ran dry");
            };
            ensure!(buf.fill(&self.frames[t]), "a test frame does not fit a buffer");
            self.bufs.push(buf);
        }
        Ok(())
    }

    /// Runs the batch; returns (packets in, packets that did not leave
    /// encapsulated on the outside) and the time the gateway took.
    fn run(&mut self, gw: &mut Gateway, now: Duration) -> (usize, usize, Duration) {
        let sent = self.bufs.len();
        let start = Instant::now();
        gw.handle_batch(now, Port::Inside, &mut self.bufs, &mut self.out, &mut self.pool);
        if gw.in_flight() > 0 {
            drivers::drive::flush(gw, now, &mut self.out, &mut self.pool);
        }
        let took = start.elapsed();
        let mut ok = 0;
        for (buf, verdict) in self.out.drain(..) {
            // ESP (protocol 50) out of the outside port, nothing else.
            if verdict == Verdict::Forward(Port::Outside) && buf.data().get(14 + 9) == Some(&proto::ESP) {
                ok += 1;
            }
            self.pool.free(buf);
        }
        (sent, sent.saturating_sub(ok), took)
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One row's gateway with its traffic, built and warmed up.
struct Rig {
    tunnels: usize,
    gw: Gateway,
    traffic: Traffic,
    flows: Vec<FlowKey>,
    rss_per_tunnel: Option<f64>,
    setup_s: f64,
    samples: Vec<f64>,
    cache_before: spd_sad::FlowCacheStats,
}

/// Builds the gateway of one row: its tunnels, then the padding.
fn build(opts: &ScaleOptions, tunnels: usize, policies: usize) -> anyhow::Result<Rig> {
    ensure!(tunnels >= 1, "--tunnels: at least one tunnel");
    ensure!(
        tunnels <= 40_000,
        "--tunnels {tunnels}: at most 40000 (the subnets 10.100.0.0/24 on run out)"
    );
    let setup = EngineSetup {
        spec: EngineSpec::default(),
        style: Style::Async,
    };
    let rss_before = rss_bytes();
    let mut gw = gateway(Some(opts.algorithm), true, 64, &setup)?;
    let now = Duration::ZERO;
    let started = Instant::now();
    for t in 1..tunnels {
        for command in tunnel_commands(opts.algorithm, t) {
            gw.apply(&command, now)
                .with_context(|| format!("installing tunnel {t}"))?;
        }
    }
    let setup_s = started.elapsed().as_secs_f64();
    let own = gw.spd().len();
    for k in 0..policies.saturating_sub(own) {
        gw.apply(&SaCommand::InsertPolicy(padding(k, tunnels)), now)?;
    }
    let (frames, flows): (Vec<_>, Vec<_>) = (0..tunnels).map(|t| frame_for(opts.frame_size, t)).unzip();
    for flow in &flows {
        ensure!(
            matches!(
                gw.spd().lookup(PolicyDirection::Out, flow).action,
                spd_sad::Action::Protect(_)
            ),
            "a test flow is not protected: {flow:?}"
        );
    }
    let mut traffic = Traffic::new(frames);
    // A pass over every tunnel: engine sessions, next hops and the flow
    // cache filled before anything is timed.
    for _ in 0..tunnels.div_ceil(BATCH) {
        traffic.fill(|_| false)?;
        let (_, dropped, _) = traffic.run(&mut gw, now);
        ensure!(dropped == 0, "{dropped} packets were not encapsulated");
    }
    // After the warm-up pass: the flow cache's pages count too.
    let rss_per_tunnel = match (rss_before, rss_bytes()) {
        (Some(a), Some(b)) if tunnels > 1 => Some(b.saturating_sub(a) as f64 / tunnels as f64),
        _ => None,
    };
    let cache_before = gw.spd().cache_stats();
    Ok(Rig {
        tunnels,
        gw,
        traffic,
        flows,
        rss_per_tunnel,
        setup_s,
        samples: Vec::new(),
        cache_before,
    })
}

impl Rig {
    /// One timed slice of encapsulation: ns per packet.
    fn slice(&mut self, length: Duration) -> anyhow::Result<()> {
        // Untimed, a pass over every tunnel first: the other rows' slices
        // ran in between and took the CPU caches.
        for _ in 0..self.tunnels.div_ceil(BATCH) {
            self.traffic.fill(|_| false)?;
            self.traffic.run(&mut self.gw, Duration::ZERO);
        }
        let (mut packets, mut timed) = (0usize, Duration::ZERO);
        let slice = Instant::now();
        while slice.elapsed() < length {
            self.traffic.fill(|_| false)?;
            let (sent, dropped, took) = self.traffic.run(&mut self.gw, Duration::ZERO);
            ensure!(dropped == 0, "{dropped} packets were not encapsulated");
            packets += sent;
            timed += took;
        }
        self.samples.push(timed.as_nanos() as f64 / packets.max(1) as f64);
        Ok(())
    }

    /// The rest of the row: SPD lookups, memory, the churn.
    fn finish(mut self, opts: &ScaleOptions) -> anyhow::Result<ScaleRow> {
        let cache = self.gw.spd().cache_stats();
        let (hits, misses) = (
            cache.hits - self.cache_before.hits,
            cache.misses - self.cache_before.misses,
        );
        let encap_ns = median(std::mem::take(&mut self.samples));
        let flows = &self.flows;
        // SPD lookups for the row's flows, the index alone and then the
        // cache: the median of 9 rounds of at least 30,000 lookups each
        // (whole passes over the flows), so a round the scheduler took the
        // CPU from does not decide the figure.
        let lookups = 30_000usize.div_ceil(flows.len().max(1)) * flows.len();
        let time_lookups = |gw: &mut Gateway, cached: bool| {
            let rounds = (0..9).map(|_| {
                let start = Instant::now();
                for i in 0..lookups {
                    let flow = &flows[i % flows.len()];
                    let d = if cached {
                        gw.spd_mut()
                            .lookup_cached(PolicyDirection::Out, std::hint::black_box(flow))
                    } else {
                        gw.spd().lookup(PolicyDirection::Out, std::hint::black_box(flow))
                    };
                    std::hint::black_box(d);
                }
                start.elapsed().as_nanos() as f64 / lookups as f64
            });
            median(rounds.collect())
        };
        let spd_index_ns = time_lookups(&mut self.gw, false);
        let spd_cached_ns = time_lookups(&mut self.gw, true);
        // The tick after a pass of traffic over every tunnel (each SA used
        // since the last tick: the most a tick has to add up, of which it
        // takes its budget), then with none used (only deadlines due).
        let mut tick_us = |used: bool| -> anyhow::Result<f64> {
            let mut out = Vec::new();
            let mut samples = Vec::new();
            for i in 1..=9u64 {
                if used {
                    for _ in 0..self.tunnels.div_ceil(BATCH) {
                        self.traffic.fill(|_| false)?;
                        self.traffic.run(&mut self.gw, Duration::ZERO);
                    }
                }
                // A housekeeping period apart, so that each call is a tick.
                let at = dataplane::gateway::HOUSEKEEPING * i as u32;
                let start = Instant::now();
                self.gw.handle_timeout(at, &mut out, &mut self.traffic.pool);
                samples.push(start.elapsed().as_nanos() as f64 / 1e3);
                // What the tick left past its budget goes in the calls
                // after it (the next turns of a worker's loop).
                while self.gw.sad().tick_backlog() {
                    self.gw.handle_timeout(at, &mut out, &mut self.traffic.pool);
                }
                for (buf, _) in out.drain(..) {
                    self.traffic.pool.free(buf);
                }
            }
            Ok(median(samples))
        };
        let (tick_us, idle_tick_us) = (tick_us(true)?, tick_us(false)?);
        let sa_state_bytes = {
            let (n, total) = self
                .gw
                .sad()
                .iter()
                .fold((0usize, 0usize), |(n, t), (_, sa)| (n + 1, t + sa.state_bytes()));
            total as f64 / n.max(1) as f64
        };
        let tunnels = self.tunnels;
        let churn = churn(opts, &mut self.gw, &mut self.traffic, tunnels)?;
        Ok(ScaleRow {
            tunnels,
            policies: self.gw.spd().len(),
            shapes: self.gw.spd().shapes(PolicyDirection::Out),
            encap_ns,
            spd_index_ns,
            spd_cached_ns,
            cache_hit_rate: hits as f64 / (hits + misses).max(1) as f64,
            sa_state_bytes,
            tick_us,
            idle_tick_us,
            rss_bytes_per_tunnel: self.rss_per_tunnel,
            setup_tunnels_per_s: (tunnels - 1) as f64 / self.setup_s.max(1e-9),
            ..churn
        })
    }
}

/// Builds the gateway of one row and measures it.
pub fn measure_row(opts: &ScaleOptions, tunnels: usize, policies: usize) -> anyhow::Result<ScaleRow> {
    let mut rig = build(opts, tunnels, policies)?;
    for _ in 0..opts.repetitions {
        rig.slice(opts.slice)?;
    }
    rig.finish(opts)
}

/// Installs `opts.churn` SAs, rekeys as many tunnels (all of them, round
/// robin), then deletes the installed SAs, with traffic over the tunnels
/// not being changed between every 100 commands.
fn churn(
    opts: &ScaleOptions,
    gw: &mut Gateway,
    traffic: &mut Traffic,
    tunnels: usize,
) -> anyhow::Result<ScaleRow> {
    let now = Duration::ZERO;
    let n = opts.churn;
    let (mut packets, mut dropped) = (0u64, 0u64);
    let mut between =
        |gw: &mut Gateway, traffic: &mut Traffic, changing: Option<usize>| -> anyhow::Result<()> {
            traffic.fill(|t| Some(t) == changing)?;
            let (sent, lost, _) = traffic.run(gw, now);
            packets += sent as u64;
            dropped += lost as u64;
            Ok(())
        };
    let churn_sa = |i: usize| {
        let spi = 0x40_0000 + i as u32;
        // Alternately outbound and inbound, each inbound one for a subnet
        // no traffic uses.
        if i.is_multiple_of(2) {
            sa(
                opts.algorithm,
                format!("churn{i}"),
                SaDirection::Outbound,
                spi,
                None,
            )
        } else {
            let net = Ipv4Prefix::new(Ipv4Addr::from(0xac10_0000 | ((i as u32 & 0xffff) << 8)), 24)
                .unwrap_or(Ipv4Prefix::ANY);
            sa(
                opts.algorithm,
                format!("churn{i}"),
                SaDirection::Inbound,
                spi,
                Some(selector(net, local_net())),
            )
        }
    };

    let mut install = Duration::ZERO;
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let commands: Vec<SaCommand> = chunk
            .iter()
            .map(|&i| SaCommand::InstallSa(Box::new(churn_sa(i))))
            .collect();
        let start = Instant::now();
        for c in &commands {
            gw.apply(c, now).context("churn install")?;
        }
        install += start.elapsed();
        between(gw, traffic, None)?;
    }

    // Rekeys: tunnel t's outbound SA replaced make-before-break; its own
    // traffic pauses for the switch (the others keep flowing).
    let mut rekey = Duration::ZERO;
    for i in 0..n {
        let t = i % tunnels;
        let generation = i / tunnels + 1;
        let (old_sa, policy) = names(t);
        let old = if generation == 1 {
            old_sa
        } else {
            format!("{old_sa}.{}", generation - 1)
        };
        let new = format!("{}.{generation}", names(t).0);
        let spi = 0x80_0000 + i as u32;
        let commands = [
            SaCommand::InstallSa(Box::new(sa(
                opts.algorithm,
                new.clone(),
                SaDirection::Outbound,
                spi,
                None,
            ))),
            SaCommand::Repoint { policy, sa: new },
            SaCommand::RemoveSa(old),
        ];
        let start = Instant::now();
        for c in &commands {
            gw.apply(c, now).context("churn rekey")?;
        }
        rekey += start.elapsed();
        if i % 100 == 99 {
            between(gw, traffic, Some(t))?;
        }
    }

    let mut delete = Duration::ZERO;
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let start = Instant::now();
        for &i in chunk {
            gw.apply(&SaCommand::RemoveSa(format!("churn{i}")), now)?;
        }
        delete += start.elapsed();
        between(gw, traffic, None)?;
    }
    ensure!(
        (0..n).all(|i| gw.sad().find(&format!("churn{i}")).is_none()),
        "a churn SA survived its delete"
    );
    let rate = |d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    Ok(ScaleRow {
        tunnels,
        policies: 0,
        shapes: 0,
        encap_ns: f64::NAN,
        spd_index_ns: f64::NAN,
        spd_cached_ns: f64::NAN,
        cache_hit_rate: f64::NAN,
        sa_state_bytes: f64::NAN,
        tick_us: f64::NAN,
        idle_tick_us: f64::NAN,
        rss_bytes_per_tunnel: None,
        setup_tunnels_per_s: f64::NAN,
        churn: n,
        installs_per_s: rate(install),
        rekeys_per_s: rate(rekey),
        deletes_per_s: rate(delete),
        install_s: install.as_secs_f64(),
        delete_s: delete.as_secs_f64(),
        churn_packets: packets,
        churn_dropped: dropped,
    })
}

/// Every row of `opts`: each tunnel count with each SPD size. All rows'
/// gateways are built first and their timed slices taken in turn (row 1,
/// row 2, ..., row 1, ...), so that other work on the machine weighs on
/// every row alike and the ratios between rows hold even when the
/// absolute figures drift.
pub fn measure(opts: &ScaleOptions, mut progress: impl FnMut(&ScaleRow)) -> anyhow::Result<Vec<ScaleRow>> {
    let tunnels = if opts.tunnels.is_empty() {
        vec![1]
    } else {
        opts.tunnels.clone()
    };
    let policies = if opts.policies.is_empty() {
        vec![0]
    } else {
        opts.policies.clone()
    };
    let mut rigs = Vec::new();
    for &t in &tunnels {
        for &p in &policies {
            rigs.push(build(opts, t, p)?);
        }
    }
    for _ in 0..opts.repetitions {
        for rig in &mut rigs {
            rig.slice(opts.slice)?;
        }
    }
    let mut rows = Vec::new();
    for rig in rigs {
        let row = rig.finish(opts)?;
        progress(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The rows as a table, then the scale bars against the first row.
pub fn table(rows: &[ScaleRow], opts: &ScaleOptions) -> String {
    use std::fmt::Write;
    // Other work on the machine moves every figure; say how much there was.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "-".into());
    let mut out = format!(
        "espgw bench --tunnels: {} {} B frames, soft engine inline; medians of {} x {} ms; churn {} SAs; load average {load}\n",
        opts.algorithm,
        opts.frame_size,
        opts.repetitions,
        opts.slice.as_millis(),
        opts.churn
    );
    let _ = writeln!(
        out,
        "{:>8} {:>8} {:>6} {:>10} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "tunnels",
        "policies",
        "shapes",
        "encap ns",
        "spd idx",
        "spd cache",
        "hit %",
        "SA B",
        "tick µs",
        "idle µs",
        "RSS B/tun",
        "setup t/s",
        "install/s",
        "rekey/s",
        "delete/s",
        "dropped"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:>6} {:>10.1} {:>9.1} {:>9.1} {:>6.1} {:>8.0} {:>8.1} {:>8.1} {:>10} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>8}",
            r.tunnels,
            r.policies,
            r.shapes,
            r.encap_ns,
            r.spd_index_ns,
            r.spd_cached_ns,
            r.cache_hit_rate * 100.0,
            r.sa_state_bytes,
            r.tick_us,
            r.idle_tick_us,
            r.rss_bytes_per_tunnel.map_or("-".into(), |b| format!("{b:.0}")),
            r.setup_tunnels_per_s,
            r.installs_per_s,
            r.rekeys_per_s,
            r.deletes_per_s,
            format!("{}/{}", r.churn_dropped, r.churn_packets),
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let most_tunnels = rows.iter().max_by_key(|r| r.tunnels).unwrap_or(last);
        let fewest_tunnels = rows.iter().min_by_key(|r| r.tunnels).unwrap_or(first);
        let most_policies = rows.iter().max_by_key(|r| r.policies).unwrap_or(last);
        let fewest_policies = rows.iter().min_by_key(|r| r.policies).unwrap_or(first);
        if most_tunnels.tunnels != fewest_tunnels.tunnels {
            let _ = writeln!(
                out,
                "encap with {} tunnels / {}: {:.2}x (bar <= 1.5x)",
                most_tunnels.tunnels,
                fewest_tunnels.tunnels,
                most_tunnels.encap_ns / fewest_tunnels.encap_ns
            );
        }
        if most_policies.policies != fewest_policies.policies {
            let _ = writeln!(
                out,
                "SPD index lookup at {} policies / {}: {:.2}x (bar <= 10x); via the cache {:.1} / {:.1} ns",
                most_policies.policies,
                fewest_policies.policies,
                most_policies.spd_index_ns / fewest_policies.spd_index_ns,
                most_policies.spd_cached_ns,
                fewest_policies.spd_cached_ns
            );
        }
        let slowest_index = rows.iter().map(|r| r.spd_index_ns).fold(0.0f64, f64::max);
        let _ = writeln!(
            out,
            "SPD lookup on a cache miss (the index): at most {slowest_index:.0} ns (bar < 1000 ns)"
        );
        let slowest = rows
            .iter()
            .map(|r| r.install_s.max(r.delete_s))
            .fold(0.0f64, f64::max);
        let dropped: u64 = rows.iter().map(|r| r.churn_dropped).sum();
        let _ = writeln!(
            out,
            "churn: {} installs and {} deletes took at most {:.3} s each (bar < 1 s for 10,000); {} packets of unchanged tunnels dropped",
            opts.churn, opts.churn, slowest, dropped
        );
    }
    out
}

/// A chart of the rows against the tunnel count (log x): encapsulation
/// and SPD lookup time per packet; SVG and PNG.
pub fn write_chart(rows: &[ScaleRow], dir: &FsPath) -> anyhow::Result<Vec<PathBuf>> {
    use plotters::prelude::*;
    crate::plot::register_font()?;
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot draw chart: {e}");
    let mut by_policies: Vec<usize> = rows.iter().map(|r| r.policies).collect();
    by_policies.sort_unstable();
    by_policies.dedup();
    let series: Vec<(String, Vec<(f64, f64)>)> = [
        ("encap ns/packet", 0usize),
        ("SPD index ns", 1),
        ("SPD via cache ns", 2),
    ]
    .into_iter()
    .map(|(name, which)| {
        let mut points: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| {
                let y = match which {
                    0 => r.encap_ns,
                    1 => r.spd_index_ns,
                    _ => r.spd_cached_ns,
                };
                (r.tunnels as f64, y)
            })
            .filter(|(_, y)| y.is_finite() && *y > 0.0)
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        (name.to_owned(), points)
    })
    .collect();
    let xs = rows.iter().map(|r| r.tunnels as f64);
    let (x_lo, x_hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let ys = series.iter().flat_map(|(_, p)| p.iter().map(|p| p.1));
    let (y_lo, y_hi) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    ensure!(x_lo <= x_hi && y_lo <= y_hi, "nothing to plot");
    let x_range = (x_lo.max(1.0) / 2.0)..(x_hi * 2.0);
    let y_range =
        10f64.powf(y_lo.log10().floor())..10f64.powf(y_hi.log10().ceil().max(y_lo.log10().floor() + 1.0));
    let title = format!(
        "Cost per packet as the tables grow (policies: {})",
        by_policies
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut written = Vec::new();
    let svg = dir.join("scale.svg");
    let png = dir.join("scale.png");
    {
        let root = SVGBackend::new(&svg, (1000, 620)).into_drawing_area();
        draw_scale(&root, &title, &series, x_range.clone(), y_range.clone()).map_err(|e| err(&e))?;
    }
    written.push(svg);
    {
        let root = BitMapBackend::new(&png, (1000, 620)).into_drawing_area();
        draw_scale(&root, &title, &series, x_range, y_range).map_err(|e| err(&e))?;
    }
    written.push(png);
    Ok(written)
}

type Drawn<DB> =
    Result<(), plotters::drawing::DrawingAreaErrorKind<<DB as plotters::prelude::DrawingBackend>::ErrorType>>;

fn draw_scale<DB: plotters::prelude::DrawingBackend>(
    root: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    x_range: std::ops::Range<f64>,
    y_range: std::ops::Range<f64>,
) -> Drawn<DB> {
    use plotters::prelude::*;
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range.log_scale(), y_range.log_scale())?;
    chart
        .configure_mesh()
        .x_desc("tunnels (log scale)")
        .y_desc("ns (log scale)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .axis_desc_style(("sans-serif", 15))
        .label_style(("sans-serif", 13))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
    ];
    for (i, (name, points)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(churn: usize) -> ScaleOptions {
        ScaleOptions {
            tunnels: vec![1, 40],
            policies: vec![],
            algorithm: Algorithm::Aes128Gcm16,
            frame_size: 64,
            slice: Duration::from_millis(2),
            repetitions: 1,
            churn,
        }
    }

    /// Installs, rekeys and deletes while traffic flows drop nothing of
    /// the tunnels that are not being changed (the rate is the bench's).
    #[test]
    fn churn_while_traffic_flows_drops_nothing() {
        let opts = small(1_000);
        let row = measure_row(&opts, 40, 500).expect("a row");
        assert_eq!(row.tunnels, 40);
        assert_eq!(row.policies, 500);
        assert!(row.shapes >= 3, "padding in several shapes: {}", row.shapes);
        assert!(row.churn_packets >= 900, "traffic flowed: {}", row.churn_packets);
        assert_eq!(row.churn_dropped, 0, "{row:?}");
        assert!(row.encap_ns > 0.0 && row.spd_index_ns > 0.0);
        assert!(
            row.cache_hit_rate > 0.9,
            "40 flows fit the cache: {}",
            row.cache_hit_rate
        );
        assert!(row.sa_state_bytes > 0.0 && row.sa_state_bytes <= spd_sad::SA_STATE_BOUND as f64);
    }

    /// A packet that does not come out encapsulated counts as dropped: a
    /// tunnel whose SA is deleted under its traffic.
    #[test]
    fn a_packet_not_encapsulated_counts_as_dropped() {
        let opts = small(0);
        let setup = EngineSetup {
            spec: EngineSpec::default(),
            style: Style::Async,
        };
        let mut gw = gateway(Some(opts.algorithm), true, 64, &setup).unwrap();
        for t in 1..4 {
            for c in tunnel_commands(opts.algorithm, t) {
                gw.apply(&c, Duration::ZERO).unwrap();
            }
        }
        let frames = (0..4).map(|t| frame_for(64, t).0).collect();
        let mut traffic = Traffic::new(frames);
        traffic.fill(|_| false).unwrap();
        assert_eq!(traffic.run(&mut gw, Duration::ZERO).1, 0);
        gw.apply(&SaCommand::RemoveSa("s2-out".into()), Duration::ZERO)
            .unwrap();
        traffic.fill(|_| false).unwrap();
        let (sent, dropped, _) = traffic.run(&mut gw, Duration::ZERO);
        assert_eq!((sent, dropped), (BATCH, BATCH / 4));
    }

    #[test]
    fn table_and_chart() {
        let opts = small(200);
        let rows = measure(&opts, |_| {}).unwrap();
        let text = table(&rows, &opts);
        assert!(text.contains("encap with 40 tunnels / 1"), "{text}");
        let dir = std::env::temp_dir().join(format!("espgw-scale-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let written = write_chart(&rows, &dir).unwrap();
        assert_eq!(written.len(), 2);
        let png = std::fs::read(dir.join("scale.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
