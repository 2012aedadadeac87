//! Human and JSON renderings of configurations and counters. Key material
//! is never rendered.

use std::fmt::Write;

use dataplane::io::offload::{OffloadCounters, OffloadDrop};
use dataplane::io::pcap::PcapRun;
use dataplane::Gateway;
use ike_stub::xfrm::XfrmMirror;
use ike_stub::{Config, ControlPlane, ControlRequest, KeySource, PolicyAction};
use serde::Deserialize;
use serde_json::{json, Value};

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

/// The `--stats` document.
pub fn stats_json(gateway: &Gateway) -> Value {
    let stats = gateway.stats();
    let mut doc = serde_json::to_value(stats).unwrap_or(Value::Null);
    let now = gateway.now();
    let sas: Vec<Value> = gateway
        .sad()
        .iter()
        .map(|(_, sa)| {
            let c = sa.counters();
            let p = sa.params();
            let age = sa.age(now);
            let idle = sa.idle(now);
            let remaining = |limits: &spd_sad::Limits| {
                json!({
                    "bytes": limits.bytes.map(|b| b.saturating_sub(c.bytes)),
                    "packets": limits.packets.map(|n| n.saturating_sub(c.packets)),
                    "seconds": limits.seconds.map(|s| s.saturating_sub(age.as_secs())),
                    "idle_seconds": limits.idle_seconds.map(|s| s.saturating_sub(idle.as_secs())),
                })
            };
            let window = sa.replay_window();
            json!({
                "name": sa.name(),
                "spi": format!("{:#010x}", sa.spi()),
                "direction": p.direction.to_string(),
                "mode": p.mode.to_string(),
                "proposal": sa.crypto().algorithm.keyword(),
                "local": p.local.to_string(),
                "remote": p.remote.to_string(),
                "state": format!("{:?}", sa.state()).to_lowercase(),
                "age_seconds": age.as_secs_f64(),
                "idle_seconds": idle.as_secs_f64(),
                "packets": c.packets,
                "bytes": c.bytes,
                "lifetime_remaining": {
                    "soft": remaining(&p.lifetime.soft),
                    "hard": remaining(&p.lifetime.hard),
                },
                "esn": p.esn,
                "last_sequence": sa.last_sequence(),
                // Static keys with a state directory: the highest number
                // made durable (none otherwise).
                "sequence_ceiling": sa.ceiling(),
                "replay_top": window.top(),
                "replay_window": {
                    "size": window.size(),
                    "top": window.top(),
                    "received_in_window": window.received_in_window().count(),
                },
                "drops": c
                    .drops()
                    .iter()
                    .map(|(reason, n)| ((*reason).to_owned(), Value::from(*n)))
                    .collect::<serde_json::Map<String, Value>>(),
            })
        })
        .collect();
    let engine = gateway.engine_counters();
    if let Value::Object(map) = &mut doc {
        map.insert("sas".into(), Value::Array(sas));
        map.insert(
            "engine".into(),
            json!({
                "kind": gateway.engine_kind().name(),
                "style": gateway.style().name(),
                "counters": engine,
            }),
        );
    }
    doc
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

/// The answer to one control-socket request. `total` is every worker's
/// counters added up; SAs are described from `gateway` (their packet and
/// byte counts are shared by all workers); tunnels and control-plane
/// counters come from `plane`.
pub fn answer(
    gateway: &Gateway,
    plane: Option<&ControlPlane>,
    mirror: Option<&XfrmMirror>,
    total: dataplane::Stats,
    run: &dataplane::io::run::RunSummary,
    request: &str,
) -> Value {
    let mut doc = stats_json(gateway);
    if let Some(Value::Array(sas)) = doc.get_mut("sas") {
        for sa in sas.iter_mut() {
            let name = sa["name"].as_str().unwrap_or_default().to_owned();
            if let Value::Object(fields) = sa {
                fields.insert(
                    "source".into(),
                    sa_source(&name, plane.map(ControlPlane::config), mirror).into(),
                );
            }
        }
    }
    let tunnels = plane.map(|p| p.tunnels(gateway.now())).unwrap_or_default();
    if let (Value::Object(map), Ok(Value::Object(summed))) = (&mut doc, serde_json::to_value(total)) {
        for (key, value) in summed {
            map.insert(key, value);
        }
        map.insert("kernel_drops".into(), run.kernel_drops.into());
        map.insert("frames_in".into(), run.frames_in.into());
        map.insert("frames_out".into(), run.frames_out.into());
        map.insert("control_overflow".into(), run.control_overflow.into());
        map.insert("rx_moderated".into(), run.moderated.into());
        map.insert(
            "offload".into(),
            serde_json::to_value(run.offload).unwrap_or(Value::Null),
        );
        map.insert(
            "pool".into(),
            json!({ "in_use": run.pool_in_use, "capacity": run.pool_capacity }),
        );
        if let Some(mirror) = mirror {
            map.insert(
                "xfrm".into(),
                serde_json::to_value(mirror.counters()).unwrap_or(Value::Null),
            );
        }
        if let Some(plane) = plane {
            map.insert(
                "control".into(),
                serde_json::to_value(plane.counters()).unwrap_or(Value::Null),
            );
            map.insert(
                "tunnels".into(),
                serde_json::to_value(&tunnels).unwrap_or(Value::Null),
            );
        }
    }
    match ControlRequest::parse(request) {
        Ok(ControlRequest::Stats) => doc,
        Ok(ControlRequest::SaList) => json!({ "sas": doc["sas"], "tunnels": doc["tunnels"] }),
        Ok(ControlRequest::SaShow(name)) => {
            let sas = doc["sas"].as_array().cloned().unwrap_or_default();
            if let Some(sa) = sas.iter().find(|s| s["name"] == *name) {
                return json!({ "sas": [sa] });
            }
            // A tunnel: its status and every SA it has now.
            match tunnels.iter().find(|t| t.name == name) {
                Some(t) => {
                    let names: Vec<&str> = [t.sa_out.as_str(), t.sa_in.as_str()]
                        .into_iter()
                        .chain(t.retiring.iter().map(String::as_str))
                        .collect();
                    let mine: Vec<&Value> = sas
                        .iter()
                        .filter(|s| s["name"].as_str().is_some_and(|n| names.contains(&n)))
                        .collect();
                    json!({ "sas": mine, "tunnels": [t] })
                }
                None => {
                    json!({ "error": format!("no SA or tunnel named `{name}`; `espgw sa list` shows them") })
                }
            }
        }
        Ok(ControlRequest::Reload) => json!({ "error": "reload is answered by the control plane" }),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

/// The part of a gateway's `--stats` document the lab (demo, soak)
/// reads, typed: a field the daemon renames fails to parse here instead of
/// reading 0.
#[derive(Debug, Deserialize)]
pub struct FinalStats {
    #[serde(flatten)]
    pub gateway: dataplane::Stats,
    pub kernel_drops: u64,
    pub send_errors: u64,
    pub pool: PoolStats,
    pub control: Option<ControlStats>,
    pub offload: OffloadCounters,
    /// The `xfrm` keying source's counters, when it ran.
    pub xfrm: Option<XfrmFinal>,
}

#[derive(Debug, Deserialize)]
pub struct XfrmFinal {
    pub sas_installed: u64,
}

#[derive(Debug, Deserialize)]
pub struct PoolStats {
    pub in_use: u64,
    pub capacity: u64,
}

#[derive(Debug, Deserialize)]
pub struct ControlStats {
    pub rekeys_completed: u64,
}

/// A final `--stats` file: the document (for the parts still read as
/// text) and its typed counters.
pub fn read_final(path: &std::path::Path) -> anyhow::Result<(Value, FinalStats)> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let typed = FinalStats::deserialize(&doc)
        .with_context(|| format!("{} is not a gateway's stats", path.display()))?;
    Ok((doc, typed))
}

/// `espgw stats` as a table, from the gateway counters parsed typed (a
/// field renamed on one side fails to parse, it does not show as null).
pub fn stats_table(doc: &Value) -> String {
    let s = match dataplane::Stats::deserialize(doc) {
        Ok(s) => s,
        Err(e) => {
            return match doc["error"].as_str() {
                Some(error) => format!("{error}\n"),
                None => format!("the answer holds no gateway counters: {e}\n"),
            }
        }
    };
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
    // The run's counter, beside the gateway's.
    let _ = writeln!(out, "{:<20} {}", "kernel_drops", doc["kernel_drops"]);
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
    let _ = writeln!(
        out,
        "engine: {} style {}",
        doc["engine"]["kind"], doc["engine"]["style"]
    );
    // The `xfrm` keying source's mirror, typed: a renamed counter fails
    // here rather than showing as nothing.
    if let Ok(x) = ike_stub::xfrm::MirrorCountersView::deserialize(&doc["xfrm"]) {
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
pub fn sa_table(doc: &Value) -> String {
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
    for sa in doc["sas"].as_array().into_iter().flatten() {
        let text = |k: &str| sa[k].as_str().unwrap_or("-").to_owned();
        let hard = &sa["lifetime_remaining"]["hard"];
        let left = [
            ("bytes", "B"),
            ("packets", "p"),
            ("seconds", "s"),
            ("idle_seconds", "s idle"),
        ]
        .iter()
        .filter_map(|(k, unit)| hard[*k].as_u64().map(|v| format!("{v}{unit}")))
        .next()
        .unwrap_or_else(|| "-".into());
        let window = if text("direction") == "in" {
            format!("{}/{}", sa["replay_window"]["top"], sa["replay_window"]["size"])
        } else {
            sa["last_sequence"].to_string()
        };
        sas.add_row([
            text("name"),
            text("direction"),
            text("spi"),
            text("mode"),
            text("proposal"),
            text("source"),
            text("state"),
            format!("{:.1}", sa["age_seconds"].as_f64().unwrap_or(0.0)),
            format!("{:.1}", sa["idle_seconds"].as_f64().unwrap_or(0.0)),
            sa["packets"].to_string(),
            sa["bytes"].to_string(),
            left,
            window,
        ]);
    }
    let mut out = table_text(&sas);
    let tunnels: Vec<&Value> = doc["tunnels"].as_array().into_iter().flatten().collect();
    if !tunnels.is_empty() {
        let mut table = plain_table(
            &["tunnel", "peer", "state", "gen", "rekeys", "rekey", "note"],
            &[3, 4],
        );
        for t in tunnels {
            let text = |k: &str| t[k].as_str().unwrap_or("-").to_owned();
            table.add_row([
                text("name"),
                text("remote"),
                text("state"),
                t["generation"].to_string(),
                t["rekeys"].to_string(),
                if t["can_rekey"].as_bool() == Some(true) {
                    "secret".into()
                } else {
                    "manual".into()
                },
                t["note"].as_str().unwrap_or("").to_owned(),
            ]);
        }
        out.push('\n');
        out.push_str(&table_text(&table));
    }
    out
}

/// `espgw reload`'s answer as text.
pub fn reload_text(doc: &Value) -> String {
    let r = &doc["report"];
    let list = |k: &str| {
        let names: Vec<&str> = r[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    format!(
        "reloaded: tunnels added {}, removed {}, changed {}, unchanged {}; {} manual SA/policy changes; SAs that kept their keys and so their sequence numbers: {}\n",
        list("added"),
        list("removed"),
        list("changed"),
        list("unchanged"),
        r["manual_changes"],
        list("carried_over")
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
        let sa = |name: &str, dir: &str| {
            serde_json::json!({
                "name": name, "direction": dir, "spi": "0x00001001", "mode": "tunnel",
                "proposal": "aes128gcm16", "state": "active", "age_seconds": 1.5,
                "idle_seconds": 0.0, "packets": 12, "bytes": 3456,
                "lifetime_remaining": {"hard": {"seconds": 100}},
                "replay_window": {"top": 12, "size": 64}, "last_sequence": 12,
            })
        };
        let doc = serde_json::json!({
            "sas": [sa("a", "out"), sa("a-tunnel-name-much-longer-than-twenty", "in")],
            "tunnels": [],
        });
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
        run: &dataplane::io::run::RunSummary,
    ) -> (Value, dataplane::Stats) {
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
        (answer(&gateway, None, None, stats, run, "stats"), stats)
    }

    #[test]
    fn the_stats_table_shows_the_typed_counters() {
        let run = dataplane::io::run::RunSummary {
            kernel_drops: 4,
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
            "arp_unsolicited      1\n",
            "drops:\n  auth_failed        2\n  unknown_spi        1\nengine: ",
        ] {
            assert!(table.contains(line), "`{line}` missing from:\n{table}");
        }
        assert!(stats_table(&json!({ "error": "no such gateway" })).starts_with("no such gateway"));
        let mut stale = doc;
        stale["drops"]["icv_failed"] = 1.into();
        assert!(stats_table(&stale).contains("unknown drop reason `icv_failed`"));
    }

    /// With the `xfrm` keying source: the mirror's counters in the table,
    /// from a recorded tunnel and a refused SA.
    #[test]
    fn the_stats_table_shows_the_xfrm_mirror() {
        use ike_stub::xfrm::fixtures::{parse_fixture, Step};
        use ike_stub::xfrm::{MirrorSettings, XfrmMirror};
        let run = dataplane::io::run::RunSummary::default();
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
        doc["xfrm"] = serde_json::to_value(mirror.counters()).unwrap();
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
