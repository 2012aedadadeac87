//! Human and JSON renderings of configurations and counters. Key material
//! is never rendered.

use std::fmt::Write;

use dataplane::io::pcap::PcapRun;
use dataplane::Gateway;
use ike_stub::{Config, PolicyAction};
use serde_json::{json, Value};

pub fn config_summary(config: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}: OK ({})", config.path.display(), config.name);
    for iface in [&config.inside, &config.outside] {
        let _ = writeln!(
            out,
            "  interface {:<7} device {:<10} {}/{} mac {} mtu {}",
            iface.port,
            iface.device,
            iface.address,
            iface.network.len(),
            iface.mac,
            iface.mtu
        );
    }
    for route in &config.routes {
        let via = route
            .via
            .map_or_else(|| "direct".to_owned(), |v| format!("via {v}"));
        let _ = writeln!(out, "  route {} {} dev {}", route.destination, via, route.port);
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
    if e.kind == accel::EngineKind::Sec {
        let _ = write!(
            out,
            " channels {} fifo {} completion {} rate {}",
            e.sec.channels,
            e.sec.fifo_depth,
            e.sec.completion.name(),
            if e.sec.rate.is_some() {
                "modelled"
            } else {
                "host speed"
            }
        );
    }
    let _ = writeln!(out);
    for sa in &config.sas {
        let p = &sa.params;
        let (from, to) = match p.direction {
            spd_sad::SaDirection::Outbound => (p.local, p.remote),
            spd_sad::SaDirection::Inbound => (p.remote, p.local),
        };
        let _ = writeln!(
            out,
            "  sa {:<20} {:<3} spi {:#010x} {} {} {} -> {} esn {} replay {}",
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
    let _ = writeln!(
        out,
        "  {} SAs, {} policies; unmatched traffic is discarded",
        config.sas.len(),
        config.policies.len()
    );
    out
}

/// The `--stats` document.
pub fn stats_json(gateway: &Gateway) -> Value {
    let stats = gateway.stats();
    let mut doc = serde_json::to_value(stats).unwrap_or(Value::Null);
    let sas: Vec<Value> = gateway
        .sad()
        .iter()
        .map(|(_, sa)| {
            let c = sa.counters();
            json!({
                "name": sa.name(),
                "spi": format!("{:#010x}", sa.spi()),
                "direction": sa.params().direction.to_string(),
                "mode": sa.params().mode.to_string(),
                "proposal": sa.crypto().algorithm().keyword(),
                "state": format!("{:?}", sa.state()).to_lowercase(),
                "packets": c.packets,
                "bytes": c.bytes,
                "last_sequence": sa.last_sequence(),
                "replay_top": sa.replay_window().top(),
                "drops": {
                    "auth_failed": c.auth_failed,
                    "replay": c.replay,
                    "policy_mismatch": c.policy_mismatch,
                    "malformed": c.malformed,
                    "sa_expired": c.expired,
                    "seq_overflow": c.seq_overflow,
                }
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

/// The answer to one control-socket request. `total` is every worker's
/// counters added up; SAs are described from `gateway` (their packet and
/// byte counts are shared by all workers).
pub fn answer(gateway: &Gateway, total: dataplane::Stats, kernel_drops: u64, request: &str) -> Value {
    let mut doc = stats_json(gateway);
    if let (Value::Object(map), Ok(Value::Object(summed))) = (&mut doc, serde_json::to_value(total)) {
        for (key, value) in summed {
            map.insert(key, value);
        }
        map.insert("kernel_drops".into(), kernel_drops.into());
    }
    let words: Vec<&str> = request.split_whitespace().collect();
    match words.as_slice() {
        ["stats"] => doc,
        ["sa", "list"] => json!({ "sas": doc["sas"] }),
        ["sa", "show", name] => match doc["sas"]
            .as_array()
            .and_then(|sas| sas.iter().find(|s| s["name"] == *name))
        {
            Some(sa) => json!({ "sas": [sa] }),
            None => json!({ "error": format!("no SA named `{name}`") }),
        },
        _ => json!({ "error": format!("unknown request `{request}`; try stats, sa list or sa show NAME") }),
    }
}

/// `espgw stats` as a table.
pub fn stats_table(doc: &Value) -> String {
    let mut out = String::new();
    for key in [
        "rx_packets",
        "tx_packets",
        "encapsulated",
        "decapsulated",
        "bypassed",
        "local_delivered",
        "generated",
        "fragments_absorbed",
        "kernel_drops",
    ] {
        let _ = writeln!(out, "{key:<20} {}", doc[key]);
    }
    let _ = writeln!(out, "drops:");
    if let Some(drops) = doc["drops"].as_object() {
        for (reason, n) in drops.iter().filter(|(_, n)| n.as_u64().unwrap_or(0) > 0) {
            let _ = writeln!(out, "  {reason:<18} {n}");
        }
    }
    let _ = writeln!(
        out,
        "engine: {} style {}",
        doc["engine"]["kind"], doc["engine"]["style"]
    );
    out
}

/// `espgw sa list` as a table; never shows key material.
pub fn sa_table(doc: &Value) -> String {
    let mut out = format!(
        "{:<20} {:<4} {:<11} {:<10} {:<14} {:<12} {:>10} {:>12} {:>10}\n",
        "name", "dir", "spi", "mode", "proposal", "state", "packets", "bytes", "last seq"
    );
    for sa in doc["sas"].as_array().into_iter().flatten() {
        let text = |k: &str| sa[k].as_str().unwrap_or("-").to_owned();
        let _ = writeln!(
            out,
            "{:<20} {:<4} {:<11} {:<10} {:<14} {:<12} {:>10} {:>12} {:>10}",
            text("name"),
            text("direction"),
            text("spi"),
            text("mode"),
            text("proposal"),
            text("state"),
            sa["packets"],
            sa["bytes"],
            if text("direction") == "in" {
                sa["replay_top"].to_string()
            } else {
                sa["last_sequence"].to_string()
            },
        );
    }
    out
}
