//! Human renderings of configurations and counters, and the documents of
//! `crate::status` built from a gateway (and read back into tables). Key
//! material is never rendered. Must not write JSON itself: the documents
//! become JSON in `crate::control`.

use std::fmt::Write;

use dataplane::Gateway;
use drivers::offload::{OffloadCounters, OffloadDrop};
use drivers::pcap::PcapRun;
use ike_stub::xfrm::XfrmMirror;
use ike_stub::{Config, ControlPlane, ControlRequest, KeySource, PolicyAction};

use crate::status::{
    EngineStatus, FinalStats, LifetimeRemaining, PcapStats, PoolStats, ReloadReply, Remaining,
    ReplayWindowStatus, Reply, SaStatus, SaSummary, SasReply, StatsReply,
};

pub fn config_summary(config: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}: OK ({})", config.path.display(), config.name);
    for iface in [&config.inside, &config.outside] {
        let set = config.link_overrides[iface.port.index()];
        let mac = if set.mac {
            iface.mac.to_string()
        } else {
            "the device's".to_owned()
        };
        let mtu = if set.mtu {
            iface.mtu.to_string()
        } else {
            "the device's".to_owned()
        };
        let address6 = iface
            .address6
            .map_or_else(String::new, |(a, p)| format!(" address6 {a}/{}", p.len()));
        let _ = writeln!(
            out,
            "  interface {:<7} device {:<10} {}/{}{address6} mac {mac} mtu {mtu}",
            iface.port,
            iface.device,
            iface.address,
            iface.network.len(),
        );
    }
    let v4 = config
        .routes
        .iter()
        .map(|r| (r.destination.to_string(), r.via.map(Into::into), r.port));
    let v6 = config
        .routes6
        .iter()
        .map(|r| (r.destination.to_string(), r.via.map(Into::into), r.port));
    for (destination, via, port) in v4.chain(v6) {
        let via = via.map_or_else(|| "direct".to_owned(), |v: std::net::IpAddr| format!("via {v}"));
        let _ = writeln!(out, "  route {destination} {via} dev {port}");
    }
    for (addr, mac) in &config.neighbors {
        let _ = writeln!(out, "  neighbor {addr} lladdr {mac}");
    }
    let e = &config.engine;
    let _ = write!(
        out,
        "  engine {} style {} buffers {}",
        e.kind, config.style, e.buffers
    );
    if e.kind == accel::EngineKind::Shared {
        let _ = write!(
            out,
            " socket {} transport {}",
            e.shared.socket.display(),
            e.shared.transport
        );
    }
    if e.kind == accel::EngineKind::Sec {
        let _ = write!(
            out,
            " channels {} fifo {} completion {} profile {}{}",
            e.sec.channels,
            e.sec.fifo_depth,
            e.sec.completion.name(),
            e.sec.profile.name,
            if e.sec.threads { " (threaded)" } else { "" }
        );
    }
    let _ = writeln!(out);
    let (n, icmp) = (&config.limits.neighbors, &config.limits.icmp);
    let per_source = if icmp.per_source_interval.is_zero() {
        "no per-source limit".to_owned()
    } else {
        format!(
            "per source 1 per {} ms, burst {}, {} sources",
            icmp.per_source_interval.as_millis(),
            icmp.per_source_burst,
            icmp.sources
        )
    };
    let _ = writeln!(
        out,
        "  limits: {} learnt neighbours per interface; ICMP errors {}/s, burst {}; {per_source}",
        n.max_learnt, icmp.per_second, icmp.burst
    );
    for sa in &config.sas {
        let p = &sa.params;
        let (from, to) = match p.direction {
            spd_sad::SaDirection::Outbound => (p.local, p.remote),
            spd_sad::SaDirection::Inbound => (p.remote, p.local),
        };
        let admits = match p.direction {
            spd_sad::SaDirection::Outbound => String::new(),
            spd_sad::SaDirection::Inbound if sa.admits_any => " admits ANY inner packet".into(),
            spd_sad::SaDirection::Inbound => {
                let selectors: Vec<String> = p.selectors.iter().map(ToString::to_string).collect();
                format!(" admits {}", selectors.join(" or "))
            }
        };
        let _ = writeln!(
            out,
            "  sa {:<20} {:<3} spi {:#010x} {} {} {} -> {} esn {} replay {}{admits}",
            p.name,
            p.direction,
            p.spi,
            p.mode,
            sa.algorithm,
            from,
            to,
            if p.esn { "on" } else { "off" },
            p.replay_window
        );
    }
    for policy in &config.policies {
        let action = match &policy.action {
            PolicyAction::Protect(sa) => format!("protect with {sa}"),
            PolicyAction::Bypass => "bypass".into(),
            PolicyAction::Discard => "discard".into(),
        };
        let _ = writeln!(
            out,
            "  policy {:<20} {:<3} prio {:<5} {} : {}",
            policy.name, policy.direction, policy.priority, policy.selector, action
        );
    }
    // Decapsulated packets meet their SA's selectors, not the SPD: say so,
    // and name the SAs whose selectors admit everything.
    let any: Vec<&str> = config
        .sas
        .iter()
        .filter(|s| s.admits_any)
        .map(|s| s.params.name.as_str())
        .collect();
    let _ = write!(
        out,
        "  {} SAs, {} policies; what no policy matches is discarded; what an inbound SA decapsulates must match the selectors of the policies naming it",
        config.sas.len(),
        config.policies.len()
    );
    let _ = if any.is_empty() {
        writeln!(out)
    } else {
        writeln!(
            out,
            ", except that {} admit{} every inner packet (selectors = \"any\")",
            any.join(", "),
            if any.len() == 1 { "s" } else { "" }
        )
    };
    out
}

/// Every SA of `gateway`, as the documents describe them (the `source`
/// is left to [`answer`], which knows the keying).
fn sa_statuses(gateway: &Gateway) -> Vec<SaStatus> {
    let now = gateway.now();
    gateway
        .sad()
        .iter()
        .map(|(_, sa)| {
            let c = sa.counters();
            let p = sa.params();
            let age = sa.age(now);
            let idle = sa.idle(now);
            let remaining = |limits: &spd_sad::Limits| Remaining {
                bytes: limits.bytes.map(|b| b.saturating_sub(c.bytes)),
                packets: limits.packets.map(|n| n.saturating_sub(c.packets)),
                seconds: limits.seconds.map(|s| s.saturating_sub(age.as_secs())),
                idle_seconds: limits.idle_seconds.map(|s| s.saturating_sub(idle.as_secs())),
            };
            let window = sa.replay_window();
            SaStatus {
                summary: sa_summary(sa, None),
                state: format!("{:?}", sa.state()).to_lowercase(),
                age_seconds: age.as_secs_f64(),
                idle_seconds: idle.as_secs_f64(),
                packets: c.packets,
                bytes: c.bytes,
                lifetime_remaining: LifetimeRemaining {
                    soft: remaining(&p.lifetime.soft),
                    hard: remaining(&p.lifetime.hard),
                },
                esn: p.esn,
                last_sequence: sa.last_sequence(),
                sequence_ceiling: sa.ceiling(),
                replay_top: window.top(),
                replay_window: ReplayWindowStatus {
                    size: window.size(),
                    top: window.top(),
                    received_in_window: window.received_in_window().count(),
                },
                drops: c.drops().collect(),
            }
        })
        .collect()
}

/// What SA `sa` is, with where it came from if that is known.
pub fn sa_summary(
    sa: &spd_sad::SecurityAssociation<dataplane::SaCrypto>,
    source: Option<String>,
) -> SaSummary {
    let p = sa.params();
    SaSummary {
        name: sa.name().to_owned(),
        spi: format!("{:#010x}", sa.spi()),
        direction: p.direction.to_string(),
        mode: p.mode.to_string(),
        proposal: sa.crypto().algorithm.keyword().to_owned(),
        local: p.local.to_string(),
        remote: p.remote.to_string(),
        source,
    }
}

fn engine_status(gateway: &Gateway) -> EngineStatus {
    EngineStatus {
        kind: gateway.engine_kind().name().to_owned(),
        style: gateway.style().name().to_owned(),
        counters: gateway.engine_counters(),
    }
}

/// The `--stats` document of `espgw pcap`.
pub fn pcap_stats(gateway: &Gateway) -> PcapStats {
    PcapStats {
        gateway: *gateway.stats(),
        sas: sa_statuses(gateway),
        engine: engine_status(gateway),
    }
}

pub fn pcap_summary(gateway: &Gateway, run: &PcapRun) -> String {
    let s = gateway.stats();
    let mut out = format!(
        "{} frames in, {} out: {} encapsulated, {} decapsulated, {} bypassed, {} to the gateway",
        run.frames_in, run.frames_out, s.encapsulated, s.decapsulated, s.bypassed, s.local_delivered
    );
    let drops: Vec<String> = s
        .drops
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    if drops.is_empty() {
        out.push_str("; no drops");
    } else {
        let _ = write!(out, "; dropped: {}", drops.join(", "));
    }
    out
}

/// Where SA `name` came from: `xfrm reqid N` (the keying namespace's
/// XFRM SAD), `config` (static keys in the file) or `exchange` (a
/// tunnel's keying exchange).
pub fn sa_source(name: &str, config: Option<&Config>, mirror: Option<&XfrmMirror>) -> String {
    if let Some(reqid) = mirror.and_then(|m| m.reqid_of(name)) {
        return format!("xfrm reqid {reqid}");
    }
    match config.and_then(|c| c.sa(name)) {
        Some(sa) if sa.keys == KeySource::Exchange => "exchange".into(),
        Some(_) => "config".into(),
        // A tunnel's SAs after its first exchange have names of their own.
        None if config.is_some() => "exchange".into(),
        None => "config".into(),
    }
}

/// The answer to `stats`. `total` is every worker's counters added up;
/// SAs are described from `gateway` (their packet and byte counts are
/// shared by all workers); tunnels and control-plane counters come from
/// `plane`.
pub fn stats_reply(
    gateway: &Gateway,
    plane: Option<&ControlPlane>,
    mirror: Option<&XfrmMirror>,
    total: dataplane::Stats,
    run: &drivers::run::RunSummary,
) -> StatsReply {
    StatsReply {
        gateway: total,
        sas: sourced_sas(gateway, plane, mirror),
        engine: engine_status(gateway),
        kernel_drops: run.kernel_drops,
        link_downs: run.link_downs,
        devices_lost: run.devices_lost,
        devices: crate::status::DeviceStatus::from_run(run),
        frames_in: run.frames_in,
        frames_out: run.frames_out,
        control_overflow: run.control_overflow,
        rx_moderated: run.moderated,
        offload: run.offload,
        pool: PoolStats {
            in_use: run.pool_in_use,
            capacity: run.pool_capacity,
        },
        xfrm: mirror.map(|m| m.counters().clone()),
        control: plane.map(ControlPlane::counters),
        tunnels: plane.map(|p| p.tunnels(gateway.now())),
        ike_relay: None,
    }
}

/// Every SA of `gateway`, each with where it came from.
fn sourced_sas(
    gateway: &Gateway,
    plane: Option<&ControlPlane>,
    mirror: Option<&XfrmMirror>,
) -> Vec<SaStatus> {
    let mut sas = sa_statuses(gateway);
    for sa in &mut sas {
        sa.summary.source = Some(sa_source(
            &sa.summary.name,
            plane.map(ControlPlane::config),
            mirror,
        ));
    }
    sas
}

/// The answer to one control-socket request other than `reload` (which
/// the control plane answers): see [`stats_reply`].
pub fn answer(
    gateway: &Gateway,
    plane: Option<&ControlPlane>,
    mirror: Option<&XfrmMirror>,
    total: dataplane::Stats,
    run: &drivers::run::RunSummary,
    request: &str,
) -> Reply {
    let tunnels = || plane.map(|p| p.tunnels(gateway.now()));
    match ControlRequest::parse(request) {
        Ok(ControlRequest::Stats) => Reply::Stats(Box::new(stats_reply(gateway, plane, mirror, total, run))),
        Ok(ControlRequest::SaList) => Reply::Sas(SasReply {
            sas: sourced_sas(gateway, plane, mirror),
            tunnels: Some(tunnels()),
        }),
        Ok(ControlRequest::SaShow(name)) => {
            let sas = sourced_sas(gateway, plane, mirror);
            if let Some(sa) = sas.iter().find(|s| s.summary.name == name) {
                return Reply::Sas(SasReply {
                    sas: vec![sa.clone()],
                    tunnels: None,
                });
            }
            // A tunnel: its status and every SA it has now.
            match tunnels().unwrap_or_default().into_iter().find(|t| t.name == name) {
                Some(t) => {
                    let names: Vec<&str> = [t.sa_out.as_str(), t.sa_in.as_str()]
                        .into_iter()
                        .chain(t.retiring.iter().map(String::as_str))
                        .collect();
                    let mine = sas
                        .into_iter()
                        .filter(|s| names.contains(&s.summary.name.as_str()))
                        .collect();
                    Reply::Sas(SasReply {
                        sas: mine,
                        tunnels: Some(Some(vec![t])),
                    })
                }
                None => Reply::error(format!(
                    "no SA or tunnel named `{name}`; `espgw sa list` shows them"
                )),
            }
        }
        Ok(ControlRequest::Reload) => Reply::error("reload is answered by the control plane"),
        Err(e) => Reply::error(e.to_string()),
    }
}

/// A final `--stats` file of `espgw run`, typed.
pub fn read_final(path: &std::path::Path) -> anyhow::Result<FinalStats> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a gateway's stats", path.display()))
}

/// `espgw stats` as a table.
pub fn stats_table(doc: &StatsReply) -> String {
    let s = &doc.gateway;
    let mut out = String::new();
    for (key, n) in [
        ("rx_packets", s.rx_packets),
        ("tx_packets", s.tx_packets),
        ("encapsulated", s.encapsulated),
        ("decapsulated", s.decapsulated),
        ("bypassed", s.bypassed),
        ("local_delivered", s.local_delivered),
        ("generated", s.generated),
        ("fragments_absorbed", s.fragments_absorbed),
    ] {
        let _ = writeln!(out, "{key:<20} {n}");
    }
    // The run's counters, beside the gateway's.
    let _ = writeln!(out, "{:<20} {}", "kernel_drops", doc.kernel_drops);
    let _ = writeln!(out, "{:<20} {}", "link_downs", doc.link_downs);
    let _ = writeln!(out, "{:<20} {}", "devices_lost", doc.devices_lost);
    for device in &doc.devices {
        if device.state != crate::status::DeviceState::Up {
            let key = format!("{}_device", <&str>::from(device.interface));
            // The JSON's word for the state, not the variant's name.
            let _ = writeln!(out, "{key:<20} {}", <&str>::from(device.state));
        }
    }
    for (key, n) in [
        ("icmp_rate_limited", s.icmp_rate_limited),
        ("neighbor_table_full", s.neighbor_table_full),
        ("arp_unsolicited", s.arp_unsolicited),
    ] {
        let _ = writeln!(out, "{key:<20} {n}");
    }
    let _ = writeln!(out, "drops:");
    // By name, as the table always listed them.
    let mut drops: Vec<(dataplane::DropReason, u64)> = s.drops.iter().filter(|(_, n)| *n > 0).collect();
    drops.sort_by_key(|(reason, _)| reason.name());
    for (reason, n) in drops {
        let _ = writeln!(out, "  {:<18} {n}", reason.name());
    }
    // In quotes: the line has always shown the names so (they are plain
    // words, which `{:?}` quotes as JSON did).
    let _ = writeln!(out, "engine: {:?} style {:?}", doc.engine.kind, doc.engine.style);
    if let Some(x) = &doc.xfrm {
        let _ = writeln!(
            out,
            "xfrm: {} SAs mirrored ({} held, {} refused), {} policies ({} held, {} refused), \
             {} dumps, {} resyncs, {} dump errors, {} malformed, {} apply failed",
            x.sas_mirrored,
            x.sas_held,
            x.sas_refused,
            x.policies_mirrored,
            x.policies_held,
            x.policies_refused,
            x.dumps,
            x.resyncs,
            x.dump_errors,
            x.malformed,
            x.apply_failed
        );
        for (reason, n) in &x.refused {
            let _ = writeln!(out, "  refused {reason:<16} {n}");
        }
    }
    out
}

pub(crate) use bench::table::{plain_table, table_text};

/// `espgw sa list` as a table; never shows key material.
pub fn sa_table(doc: &SasReply) -> String {
    let mut sas = plain_table(
        &[
            "name",
            "dir",
            "spi",
            "mode",
            "proposal",
            "source",
            "state",
            "age s",
            "idle s",
            "packets",
            "bytes",
            "hard left",
            "seq/window",
        ],
        &[7, 8, 9, 10, 11, 12],
    );
    for sa in &doc.sas {
        let hard = &sa.lifetime_remaining.hard;
        let left = [
            (hard.bytes, "B"),
            (hard.packets, "p"),
            (hard.seconds, "s"),
            (hard.idle_seconds, "s idle"),
        ]
        .iter()
        .find_map(|(v, unit)| v.map(|v| format!("{v}{unit}")))
        .unwrap_or_else(|| "-".into());
        let window = if sa.summary.direction == "in" {
            format!("{}/{}", sa.replay_window.top, sa.replay_window.size)
        } else {
            sa.last_sequence.to_string()
        };
        let summary = &sa.summary;
        sas.add_row([
            summary.name.clone(),
            summary.direction.clone(),
            summary.spi.clone(),
            summary.mode.clone(),
            summary.proposal.clone(),
            summary.source.clone().unwrap_or_else(|| "-".into()),
            sa.state.clone(),
            format!("{:.1}", sa.age_seconds),
            format!("{:.1}", sa.idle_seconds),
            sa.packets.to_string(),
            sa.bytes.to_string(),
            left,
            window,
        ]);
    }
    let mut out = table_text(&sas);
    let tunnels = doc.tunnels();
    if !tunnels.is_empty() {
        let mut table = plain_table(
            &["tunnel", "peer", "state", "gen", "rekeys", "rekey", "note"],
            &[3, 4],
        );
        for t in tunnels {
            table.add_row([
                t.name.clone(),
                t.remote.to_string(),
                t.state.clone(),
                t.generation.to_string(),
                t.rekeys.to_string(),
                if t.can_rekey {
                    "secret".into()
                } else {
                    "manual".into()
                },
                t.note.clone().unwrap_or_default(),
            ]);
        }
        out.push('\n');
        out.push_str(&table_text(&table));
    }
    out
}

/// `espgw reload`'s answer as text.
pub fn reload_text(doc: &ReloadReply) -> String {
    let r = &doc.report;
    let list = |names: &[String]| {
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    format!(
        "reloaded: tunnels added {}, removed {}, changed {}, unchanged {}; {} manual SA/policy changes; SAs that kept their keys and so their sequence numbers: {}\n",
        list(&r.added),
        list(&r.removed),
        list(&r.changed),
        list(&r.unchanged),
        r.manual_changes,
        list(&r.carried_over)
    )
}

/// A gateway's drops with a count, `reason count, ...`, or `none` (the
/// demo's and the soak's report lines).
pub fn drops_line(stats: &dataplane::Stats) -> String {
    let drops: Vec<String> = stats
        .drops
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(reason, n)| format!("{} {n}", reason.name()))
        .collect();
    if drops.is_empty() {
        "none".into()
    } else {
        drops.join(", ")
    }
}

/// What the driver did with the hosts' offloads: checksums completed,
/// super-packets cut into segments and merged again on the way out, and
/// frames it could not make whole.
pub fn offload_line(o: &OffloadCounters) -> String {
    let mut line = format!(
        "csum_completed {} gso_segmented {} (into {} segments) coalesced {} (from {} segments)",
        o.csum_completed, o.gso_segmented, o.gso_segments, o.coalesced, o.coalesced_segments
    );
    for &reason in OffloadDrop::ALL {
        let n = o.dropped(reason);
        if n > 0 {
            line += &format!(", {} {n}", reason.name());
        }
    }
    line
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Names of any length keep the columns of `sa list` in line.
    #[test]
    fn the_sa_table_stays_aligned_with_long_names() {
        let sa = |name: &str, dir: &str| SaStatus {
            summary: SaSummary {
                name: name.into(),
                spi: "0x00001001".into(),
                direction: dir.into(),
                mode: "tunnel".into(),
                proposal: "aes128gcm16".into(),
                local: "10.0.0.1".into(),
                remote: "10.0.0.2".into(),
                source: None,
            },
            state: "active".into(),
            age_seconds: 1.5,
            idle_seconds: 0.0,
            packets: 12,
            bytes: 3456,
            lifetime_remaining: LifetimeRemaining {
                hard: Remaining {
                    seconds: Some(100),
                    ..Remaining::default()
                },
                ..LifetimeRemaining::default()
            },
            esn: false,
            last_sequence: 12,
            sequence_ceiling: None,
            replay_top: 12,
            replay_window: ReplayWindowStatus {
                top: 12,
                size: 64,
                received_in_window: 12,
            },
            drops: Default::default(),
        };
        let doc = SasReply {
            sas: vec![sa("a", "out"), sa("a-tunnel-name-much-longer-than-twenty", "in")],
            tunnels: Some(Some(vec![])),
        };
        let text = sa_table(&doc);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 3, "{text}");
        let column = |line: &str, word: &str| line.find(word).unwrap_or_else(|| panic!("{word} in {line}"));
        // Left-aligned columns start together, right-aligned ones end together.
        let mode = column(lines[0], " mode ");
        assert!(lines[1..].iter().all(|l| column(l, " tunnel ") == mode), "{text}");
        let bytes_end = column(lines[0], "bytes") + "bytes".len();
        assert!(
            lines[1..].iter().all(|l| column(l, "3456") + 4 == bytes_end),
            "{text}"
        );
        assert!(!text.contains("  \n"), "no trailing padding: {text:?}");
    }

    /// `espgw stats`'s answer from a gateway on `configs/demo-a.toml`
    /// whose summed counters are `total`.
    pub(crate) fn answer_for(
        total: impl FnOnce(&mut dataplane::Stats),
        run: &drivers::run::RunSummary,
    ) -> (StatsReply, dataplane::Stats) {
        let config = Config::load(std::path::Path::new("configs/demo-a.toml")).unwrap();
        let engine = accel::build_engine(&config.engine).unwrap();
        let gateway = dataplane::Gateway::with_commands(
            config.setup(dataplane::LinkLayer::Ethernet, config.style),
            engine,
            &config.commands(),
            std::time::Duration::ZERO,
        )
        .unwrap();
        let mut stats = *gateway.stats();
        total(&mut stats);
        (stats_reply(&gateway, None, None, stats, run), stats)
    }

    #[test]
    fn the_stats_table_shows_the_typed_counters() {
        let run = drivers::run::RunSummary {
            kernel_drops: 4,
            link_downs: 2,
            devices_lost: 1,
            device_lost: [true, false],
            ..Default::default()
        };
        let (doc, _) = answer_for(
            |s| {
                s.rx_packets = 12;
                s.arp_unsolicited = 1;
                s.drops.count(dataplane::DropReason::UnknownSpi);
                s.drops.count(dataplane::DropReason::AuthFailed);
                s.drops.count(dataplane::DropReason::AuthFailed);
            },
            &run,
        );
        let table = stats_table(&doc);
        for line in [
            "rx_packets           12\n",
            "kernel_drops         4\n",
            "link_downs           2\n",
            "devices_lost         1\n",
            "inside_device        deleted\n",
            "arp_unsolicited      1\n",
            "drops:\n  auth_failed        2\n  unknown_spi        1\nengine: ",
        ] {
            assert!(table.contains(line), "`{line}` missing from:\n{table}");
        }
        assert!(
            !table.contains("outside_device"),
            "an up device is not listed:\n{table}"
        );
        // A reason renamed on one side fails to parse on the other.
        let stale = crate::control::encode(&doc, false)
            .unwrap()
            .replace("\"auth_failed\"", "\"icv_failed\"");
        let err = serde_json::from_str::<StatsReply>(&stale)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown drop reason `icv_failed`"), "{err}");
    }

    /// With the `xfrm` keying source: the mirror's counters in the table,
    /// from a recorded tunnel and a refused SA.
    #[test]
    fn the_stats_table_shows_the_xfrm_mirror() {
        use ike_stub::xfrm::fixtures::{parse_fixture, Step};
        use ike_stub::xfrm::{MirrorSettings, XfrmMirror};
        let run = drivers::run::RunSummary::default();
        let (mut doc, _) = answer_for(|_| {}, &run);
        let mut mirror = XfrmMirror::new(MirrorSettings {
            local_addresses: vec!["192.0.2.1".parse().unwrap()],
            durable_sequences: false,
        });
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ike-stub/testdata/xfrm");
        let text = std::fs::read_to_string(dir.join("built-tunnel-dump.nl")).unwrap();
        for step in parse_fixture(&text).unwrap() {
            match step {
                Step::Dump(kind) => mirror.begin_dump(kind),
                Step::Datagram(d) => mirror.handle_datagram(std::time::Duration::ZERO, &d),
            }
        }
        doc.xfrm = Some(mirror.counters().clone());
        let table = stats_table(&doc);
        for line in [
            "xfrm: 1 SAs mirrored (0 held, 1 refused), 3 policies (1 held, 0 refused), 2 dumps, 0 resyncs",
            "  refused pre_existing     1\n",
        ] {
            assert!(table.contains(line), "`{line}` missing from:\n{table}");
        }
        assert_eq!(
            sa_source("xfrm-r1-in-c0000002", None, Some(&mirror)),
            "xfrm reqid 1"
        );
        assert_eq!(sa_source("static", None, None), "config");
    }
}
