//! `espgw demo --soak SECONDS`: the demo topology under mixed traffic for a
//! bounded time (numbered UDP both ways at several sizes, TCP, ping), with
//! whatever rekeys and engine faults the flags ask for. It fails if a
//! gateway dies, if memory or pool buffers grow, if a gateway's counters
//! do not add up, or if more datagrams are lost than the gateways and the
//! kernel counted as dropped.
//!
//! Owns: the soak's rounds, its samples of the gateways and its verdict.
//! The namespaces, the gateways and the traffic are the lab's
//! (`crate::lab`); this module must not build or tear down any of them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::lab::gateways::start_lab;
use crate::lab::topology::Names;
use crate::lab::{traffic, DemoArgs};
use crate::report::read_final;
use crate::status::StatsReply;

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no VmRSS for {pid}"))
}

/// UDP datagrams a host's kernel refused to deliver (receive buffer full,
/// bad checksum): `Udp: InErrors` of /proc/net/snmp in namespace `ns`.
fn udp_in_errors(ns: &str) -> Result<u64> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .with_context(|| format!("reading /proc/net/snmp in {ns}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        bail!("no Udp counters in {ns}'s /proc/net/snmp");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "InErrors")
        .and_then(|(_, v)| v.parse().ok())
        .with_context(|| format!("no Udp InErrors in {ns}"))
}

fn host_udp_errors(names: &Names) -> Result<u64> {
    Ok(udp_in_errors(&names.host_a)? + udp_in_errors(&names.host_b)?)
}

fn ask(name: &str) -> Result<StatsReply> {
    crate::control::ask(&crate::control::default_path(name), "stats")
}

/// What one gateway looked like at a moment.
struct Sample {
    rss_kib: u64,
    pool_in_use: u64,
}

fn sample(pid: u32, name: &str) -> Result<Sample> {
    let stats = ask(name)?;
    Ok(Sample {
        rss_kib: rss_kib(pid)?,
        pool_in_use: stats.pool.in_use as u64,
    })
}

pub fn run(args: &DemoArgs, duration: Duration) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))?;
    }
    let (mut lab, dir, [stats_a, stats_b]) = start_lab(args)?;
    let lab_names = lab.names.clone();
    let pids: Vec<u32> = lab.children.iter().map(std::process::Child::id).collect();
    let names = ["demo-a", "demo-b"];
    // Warm up (ARP, first SAs), then take the baseline.
    let _ = traffic::ping(&lab_names, traffic::hosts(false).1, 5);
    let _ = traffic::udp_streams(&lab_names, 200, 500, Duration::from_micros(500))?;
    let start: Vec<Sample> = pids
        .iter()
        .zip(names)
        .map(|(pid, name)| sample(*pid, name))
        .collect::<Result<_>>()?;
    eprintln!(
        "soaking for {} s: numbered UDP both ways, TCP, ping{}{} ...",
        duration.as_secs(),
        args_rekey(args),
        args_faults(args)
    );
    let host_errors_before = host_udp_errors(&lab_names)?;
    let began = Instant::now();
    let (mut rounds, mut udp_sent, mut udp_received, mut udp_duplicates) = (0u64, 0usize, 0usize, 0usize);
    let (mut tcp_ok, mut tcp_bytes, mut pings_ok) = (0u64, 0usize, 0u64);
    let mut peak_pool = [0u64; 2];
    let sizes = [64usize, 1400, 576, 1000, 200];
    while began.elapsed() < duration && !interrupted.load(Ordering::Relaxed) {
        let size = sizes[rounds as usize % sizes.len()];
        let (ab, ba) = traffic::udp_streams(&lab_names, 1000, size, Duration::from_micros(500))?;
        udp_sent += ab.sent + ba.sent;
        udp_received += ab.received + ba.received;
        udp_duplicates += ab.duplicates + ba.duplicates;
        // TCP and a little ping every other round; TCP retransmits what faults cost it.
        if rounds % 2 == 0 {
            match traffic::udp_and_tcp(&lab_names, traffic::hosts(false), 500_000) {
                Ok((_, _, bytes, _, true)) => {
                    tcp_ok += 1;
                    tcp_bytes += bytes;
                }
                Ok(_) => bail!("a TCP transfer arrived damaged"),
                Err(e) => eprintln!(
                    "  round {rounds}: TCP did not finish ({e:#}); faults can stall a short transfer"
                ),
            }
            if traffic::ping(&lab_names, traffic::hosts(false).1, 5).1 {
                pings_ok += 1;
            }
        }
        for (i, (child, name)) in lab.children.iter_mut().zip(["gwA", "gwB"]).enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
                bail!(
                    "gateway {name} died ({status}) after {} s:\n{log}",
                    began.elapsed().as_secs()
                );
            }
            let pool = ask(names[i])?.pool.in_use as u64;
            peak_pool[i] = peak_pool[i].max(pool);
        }
        rounds += 1;
    }
    let end: Vec<Sample> = pids
        .iter()
        .zip(names)
        .map(|(pid, name)| sample(*pid, name))
        .collect::<Result<_>>()?;
    let elapsed = began.elapsed();
    let host_errors = host_udp_errors(&lab_names)?.saturating_sub(host_errors_before);
    // Stop the gateways so they drain and write their final counters.
    for mut child in std::mem::take(&mut lab.children) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait()?;
        ensure!(
            status.success(),
            "a gateway stopped with {status}: buffers not returned?"
        );
    }
    let finals = [read_final(&stats_a), read_final(&stats_b)];
    drop(lab);

    println!(
        "espgw soak: {} s, {rounds} rounds{}{}",
        elapsed.as_secs(),
        args_rekey(args),
        args_faults(args)
    );
    let lost = udp_sent.saturating_sub(udp_received);
    println!(
        "  udp   {udp_received}/{udp_sent} numbered datagrams arrived, {lost} lost, {udp_duplicates} duplicates; tcp {tcp_ok} transfers ({tcp_bytes} bytes) intact; ping ok in {pings_ok} rounds"
    );
    let mut problems = Vec::new();
    // Datagrams the receiving hosts' kernels refused (a receiver thread
    // not scheduled in time on a busy machine) are lost outside the gateways.
    let mut explained = host_errors;
    println!("  hosts UDP receive errors in the host namespaces' kernels: {host_errors}");
    for (i, (name, f)) in ["gwA", "gwB"].iter().zip(&finals).enumerate() {
        let (f, send_errors) = match f {
            Ok(f) => (&f.stats, f.send_errors),
            Err(e) => {
                problems.push(format!("{name}'s final counters: {e:#}"));
                continue;
            }
        };
        let (came, went) = f.gateway.balance();
        let growth = end[i].rss_kib as i64 - start[i].rss_kib as i64;
        println!(
            "  {name}   rss {} → {} KiB ({growth:+} KiB) · pool in use {} → {} (peak {} of {}) · rx {} + generated {} = {came}, tx + consumed + drops = {went} · drops: {} · kernel drops {} · rekeys {}",
            start[i].rss_kib,
            end[i].rss_kib,
            start[i].pool_in_use,
            end[i].pool_in_use,
            peak_pool[i],
            f.pool.capacity,
            f.gateway.rx_packets,
            f.gateway.generated,
            crate::report::drops_line(&f.gateway),
            f.kernel_drops,
            f.control.as_ref().map_or_else(|| "-".into(), |c| c.rekeys_completed.to_string()),
        );
        explained += f.gateway.drops.total() + f.offload.drops_total() + f.kernel_drops + send_errors;
        if came != went {
            problems.push(format!(
                "{name}'s counters do not add up: {came} in, {went} accounted for"
            ));
        }
        // Memory may settle a little (allocator, caches); a leak grows with time.
        if growth > 8 * 1024 && growth * 10 > start[i].rss_kib as i64 {
            problems.push(format!("{name}'s memory grew by {growth} KiB"));
        }
        if end[i].pool_in_use > start[i].pool_in_use + 256 {
            problems.push(format!(
                "{name} holds {} pool buffers, {} at the start",
                end[i].pool_in_use, start[i].pool_in_use
            ));
        }
    }
    // Every datagram that did not arrive must be one the gateways or the
    // kernel counted as dropped (other drops, e.g. of TCP, only add slack).
    if lost as u64 > explained {
        problems.push(format!(
            "{lost} datagrams lost but only {explained} drops counted (gateways, their kernels, the hosts' UDP)"
        ));
    }
    if udp_duplicates > 0 {
        problems.push(format!("{udp_duplicates} duplicated datagrams"));
    }
    if args.fail_every.is_none() && args.lose_completion_every.is_none() && lost > 0 {
        problems.push(format!("{lost} datagrams lost without injected faults"));
    }
    if problems.is_empty() {
        println!("  ok: no crash, no growth, every drop counted under a reason, counters add up");
        Ok(())
    } else {
        for p in &problems {
            println!("  PROBLEM: {p}");
        }
        bail!("the soak found {} problem(s)", problems.len())
    }
}

fn args_rekey(args: &DemoArgs) -> String {
    args.rekey_every
        .map_or_else(String::new, |b| format!(", rekey every {b} bytes"))
}

fn args_faults(args: &DemoArgs) -> String {
    let mut out = String::new();
    if let Some(n) = args.fail_every {
        out += &format!(", every {n}th descriptor fails");
    }
    if let Some(n) = args.lose_completion_every {
        out += &format!(", every {n}th completion lost");
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::status::FinalStats;

    /// The document a gateway leaves at exit parses back into its type:
    /// the gateway counters whole (a missing one is an error, not a 0),
    /// and the run's keys beside them.
    #[test]
    fn a_gateways_final_document_parses() {
        let run = drivers::run::RunSummary {
            kernel_drops: 2,
            pool_capacity: 4096,
            ..Default::default()
        };
        let (stats, total) = crate::report::tests::answer_for(
            |s| {
                s.rx_packets = 3;
                s.generated = 1;
                s.tx_packets = 3;
                s.drops.count(dataplane::DropReason::NoRoute);
            },
            &run,
        );
        let written = FinalStats {
            stats,
            send_errors: 5,
            workers: 1,
        };
        let text = crate::control::encode(&written, false).unwrap();
        let f: FinalStats = serde_json::from_str(&text).unwrap();
        assert_eq!(f, written);
        assert_eq!(f.stats.gateway, total);
        assert_eq!(f.stats.gateway.balance(), (4, 4));
        assert_eq!(
            (f.stats.kernel_drops, f.send_errors, f.stats.pool.capacity),
            (2, 5, 4096)
        );
        assert!(f.stats.control.is_none());

        let missing = text.replace("\"tx_packets\":3,", "");
        assert_ne!(missing, text);
        assert!(serde_json::from_str::<FinalStats>(&missing).is_err());
    }
}
