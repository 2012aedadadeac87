//! `espgw demo`: four network namespaces (hostA, gwA, gwB, hostB) joined by
//! veth pairs, two gateways from `configs/demo-{a,b}.toml`, ping, UDP and
//! TCP traffic both ways, a capture of the gwA–gwB link that must hold only
//! ESP (and ARP), a short report, and everything removed again, also on
//! Ctrl-C or failure. With `--nat`, a fifth namespace masquerades gwA
//! behind an address and port of its own (nftables), and the tunnel is
//! RFC 3948 ESP in UDP that gwB must follow to wherever the NAT put gwA.
//!
//! Owns: the run's sequence, the reload check and the report (what
//! passed). The namespaces, the gateways, the traffic and the captures
//! are the lab's (`crate::lab`); this module must not build or tear down
//! any of them itself.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use accel::Algorithm;
use anyhow::{bail, ensure, Context, Result};
use ike_stub::builder::{pattern_key, ConfigBuilder, SaBuilder, TunnelBuilder};
use spd_sad::{Ipv4Prefix, SaDirection};

use crate::lab::capture::{capture, FlowSeen, UdpFlow, Wire};
use crate::lab::gateways::start_lab;
use crate::lab::topology::{GW_B_PUBLIC, NAT_PUBLIC};
use crate::lab::traffic::{flood_check, hosts, ping, ping_once, udp_and_tcp, udp_streams};
pub use crate::lab::DemoArgs;
use crate::lab::DemoKeying;
use crate::report;
use crate::status::{ReloadReply, SasReply, StatsReply};

/// Makes gwA (process `pid`, reading `config`) reload while traffic flows:
/// a broken file and one with an inbound SA no policy names by `espgw
/// reload`, and the latter by SIGHUP, which must all be refused, then the
/// original plus one more tunnel, which must be taken.
fn reload_check(config: &Path, pid: u32) -> Result<String> {
    let original = std::fs::read_to_string(config)?;
    let socket = crate::control::default_path("demo-a");
    thread::sleep(Duration::from_millis(400));
    std::fs::write(
        config,
        format!("{original}\n[[tunnel]]\nname = \"broken\"\nproposal = \"aes128gcm8\"\n"),
    )?;
    let refused = match crate::control::ask::<ReloadReply>(&socket, "reload") {
        Ok(doc) => bail!("gwA took a broken configuration: {:?}", doc.report),
        Err(e) => e.to_string(),
    };
    // An inbound SA that no policy names would admit nothing said: refused
    // at its line, the running SAs stay (RFC 4301 §5.2).
    let stray = ConfigBuilder::new().sa(SaBuilder {
        enc_key: Some(pattern_key(20, 1, 0)),
        ..SaBuilder::new(
            "stray-in",
            SaDirection::Inbound,
            0x3001,
            (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)),
            Algorithm::Aes128Gcm16,
        )
    });
    std::fs::write(config, format!("{original}\n{}", stray.to_toml()))?;
    let unselected = match crate::control::ask::<ReloadReply>(&socket, "reload") {
        Ok(doc) => bail!("gwA took an inbound SA that no policy names: {:?}", doc.report),
        Err(e) => e.to_string(),
    };
    ensure!(
        unselected.contains("inbound SA `stray-in` is named by no inbound `protect` policy"),
        "gwA refused the policy-less SA for another reason: {unselected}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    thread::sleep(Duration::from_millis(300));
    let network =
        |third: u8| Ipv4Prefix::new(Ipv4Addr::new(192, 168, third, 0), 24).unwrap_or(Ipv4Prefix::ANY);
    let extra = ConfigBuilder::new().tunnel(
        TunnelBuilder::new(
            "extra",
            (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)),
            Algorithm::Aes256Sha256,
            (0x2001, 0x2002),
        )
        .subnets(network(101), network(102))
        // Keyed by hand: gwB has no such tunnel to run an exchange with.
        .keys_with(|dir, len, auth| {
            ike_stub::builder::pattern_key(len, 5, u8::from(dir == "in") + 2 * u8::from(auth))
        }),
    );
    std::fs::write(config, format!("{original}\n{}", extra.to_toml()))?;
    let taken = crate::control::ask::<ReloadReply>(&socket, "reload")?.report;
    let added = &taken.added;
    ensure!(
        added == &["extra"],
        "gwA's reload added {added:?}, not [\"extra\"]"
    );
    ensure!(
        taken.unchanged == ["a-b"],
        "gwA's reload did not keep `a-b`: {taken:?}"
    );
    let listed = crate::control::ask::<SasReply>(&socket, "sa show extra")?;
    ensure!(
        listed.sas.len() == 2,
        "the new tunnel's SAs are not installed: {listed:?}"
    );
    Ok(format!(
        "broken configs refused three times (espgw reload: \"{}\"; a policy-less inbound SA: \"{}\"; SIGHUP) with traffic flowing; then a valid one taken: tunnels added {added:?}, `a-b` kept its SAs",
        refused.lines().next().unwrap_or_default(),
        unselected.lines().next().unwrap_or_default()
    ))
}

struct Results {
    ping: String,
    ping_ok: bool,
    udp_sent: usize,
    udp_echoed: usize,
    tcp_bytes: usize,
    tcp_seconds: f64,
    tcp_ok: bool,
}

impl Results {
    /// Every ping answered, every datagram echoed, the stream intact.
    fn passed(&self) -> bool {
        self.ping_ok && self.udp_echoed == self.udp_sent && self.tcp_ok
    }

    /// The report's lines; `family` is "" for IPv4 and "6" for IPv6.
    fn print(&self, family: &str) {
        println!("  ping{family:<2}hostA → hostB: {}", self.ping);
        println!(
            "  udp{family:<3}{} datagrams of 1..1400 bytes, {} echoed back intact",
            self.udp_sent, self.udp_echoed
        );
        println!(
            "  tcp{family:<3}{} bytes in {:.2} s = {:.1} Mbit/s, {}",
            self.tcp_bytes,
            self.tcp_seconds,
            self.tcp_bytes as f64 * 8.0 / self.tcp_seconds.max(1e-9) / 1e6,
            if self.tcp_ok {
                "byte count and checksum match"
            } else {
                "MISMATCH"
            }
        );
    }
}

/// Ping, the UDP echo and the TCP stream between the hosts' addresses of
/// one family.
fn traffic(names: &crate::lab::topology::Names, ipv6: bool, tcp_bytes: usize) -> Result<Results> {
    let (from, to) = hosts(ipv6);
    let (ping, ping_ok) = ping(names, to, 5);
    let (udp_sent, udp_echoed, tcp_bytes, tcp_seconds, tcp_ok) = udp_and_tcp(names, (from, to), tcp_bytes)?;
    Ok(Results {
        ping,
        ping_ok,
        udp_sent,
        udp_echoed,
        tcp_bytes,
        tcp_seconds,
        tcp_ok,
    })
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))?;
    }
    let (mut lab, dir, [stats_a, stats_b]) = start_lab(args)?;
    let names = lab.names.clone();
    // With --nat, both sides of the NAT: gwA's private link and the
    // public one, where gwB sees the NAT's mapping.
    let links: Vec<(&str, &'static str, &str)> = if args.nat {
        vec![
            (&names.gw_a, "a-out", "gwA–NAT link"),
            (&names.gw_b, "b-out", "NAT–gwB link"),
        ]
    } else {
        vec![(&names.gw_a, "a-out", "gwA–gwB link")]
    };
    let stop_capture = Arc::new(AtomicBool::new(false));
    let captures: Vec<_> = links
        .iter()
        .map(|&(ns, dev, label)| {
            let wire = Arc::new(Wire::default());
            let capturer = capture(ns.to_owned(), dev, Arc::clone(&wire), Arc::clone(&stop_capture));
            (label, wire, capturer)
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    ensure!(!interrupted.load(Ordering::Relaxed), "interrupted");

    // --nat: gwB knows gwA only once gwA's first ESP arrives, and its
    // workers follow the move at their next timeout, so the reply to that
    // very packet may still go to gwA's configured address, which the NAT
    // drops. One ping first, reported apart, is that first contact.
    let first_contact = args.nat.then(|| {
        eprintln!("first contact: one ping from hostA, gwB's first news of gwA ...");
        ping_once(&names)
    });
    eprintln!("sending ping, UDP and TCP from hostA to hostB ...");
    let results = traffic(&names, false, args.tcp_bytes)?;
    ensure!(!interrupted.load(Ordering::Relaxed), "interrupted");
    let results6 = match args.ipv6 {
        true => {
            eprintln!("and over IPv6, through the 6-in-4 tunnel ...");
            Some(traffic(&names, true, args.tcp_bytes)?)
        }
        false => None,
    };
    ensure!(!interrupted.load(Ordering::Relaxed), "interrupted");
    // With rekeys: steady traffic both ways for long enough to rekey again
    // and again (about 2 MB each way over 2 s).
    let floods = if args.flood_check {
        eprintln!("numbered UDP both ways, alone and under floods of bad ESP ...");
        Some(flood_check(
            &names,
            args.flood_rate,
            inbound_spi("demo-b", "a-b")?,
        )?)
    } else {
        None
    };
    let streams = if args.rekey_every.is_some() || args.reload_check {
        eprintln!("streaming numbered UDP both ways ...");
        let reloads = args.reload_check.then(|| {
            let config = dir.join("demo-a.toml");
            let pid = lab.children.first().map_or(0, Child::id);
            thread::spawn(move || reload_check(&config, pid))
        });
        let streams = udp_streams(&names, 2000, 1000, Duration::from_millis(1))?;
        let reloads = match reloads {
            Some(handle) => Some(
                handle
                    .join()
                    .map_err(|_| anyhow::anyhow!("the reload check panicked"))??,
            ),
            None => None,
        };
        Some((streams, reloads))
    } else {
        None
    };
    thread::sleep(Duration::from_millis(200));
    stop_capture.store(true, Ordering::Relaxed);
    let mut wires = Vec::new();
    for (label, wire, capturer) in captures {
        capturer
            .join()
            .map_err(|_| anyhow::anyhow!("the capture panicked"))?
            .with_context(|| format!("capturing the {label}"))?;
        wires.push((label, wire));
    }

    // Ask gwA over its control socket, as `espgw sa list` would.
    let sa_list = crate::control::ask::<SasReply>(&crate::control::default_path("demo-a"), "sa list")
        .map(|doc| crate::report::sa_table(&doc))
        .unwrap_or_else(|e| format!("control socket: {e}\n"));
    // What the charons see of the traffic: espgw's counts, through their
    // kernel (NEWAE once a second).
    let strongswan = args.keying == DemoKeying::Strongswan;
    let charon_sas = if strongswan {
        thread::sleep(Duration::from_millis(1500));
        crate::lab::strongswan::list_sas(&dir)
    } else {
        Vec::new()
    };
    // Stop the gateways so they write their final counters.
    for mut child in std::mem::take(&mut lab.children) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
    }
    let (typed_a, typed_b) = (
        report::read_final(&stats_a)?.stats,
        report::read_final(&stats_b)?.stats,
    );

    let total =
        |c: fn(&Wire) -> &AtomicU64| -> u64 { wires.iter().map(|(_, w)| c(w).load(Ordering::Relaxed)).sum() };
    // Every link must carry ESP: the smallest count stands for all.
    let esp = wires
        .iter()
        .map(|(_, w)| w.esp.load(Ordering::Relaxed))
        .min()
        .unwrap_or(0);
    let plaintext = total(|w| &w.plaintext);
    println!(
        "espgw demo: {} tunnel{}{}, engine {}, style {}, buffers {}",
        args.algorithm,
        if args.nat {
            ", ESP in UDP 4500 (RFC 3948), gwA behind a masquerading NAT"
        } else {
            ""
        },
        if args.ipv6 {
            ", and IPv6 between the hosts through a second tunnel over IPv4 (6-in-4)"
        } else {
            ""
        },
        args.engine,
        args.style,
        args.buffers
    );
    if strongswan {
        println!(
            "  keys  strongSwan's charon in {} and {} (IKEv2, pre-shared key, IKE through espgw's relay), SAs mirrored from their XFRM tables; what charon counts is what espgw told its kernel:",
            crate::lab::strongswan::KEYING[0],
            crate::lab::strongswan::KEYING[1]
        );
        for (who, listed) in &charon_sas {
            for line in listed
                .lines()
                .map(str::trim)
                .filter(|l| l.contains("INSTALLED") || l.contains(" bytes,"))
            {
                println!("        {who}: {line}");
            }
        }
    }
    if let Some(answered) = first_contact {
        println!(
            "  first ping hostA → hostB, gwB's first packet from gwA: {} (see `nat` below for where gwB sent the reply)",
            if answered { "answered" } else { "not answered" }
        );
    }
    results.print("");
    if let Some(six) = &results6 {
        six.print("6");
    }
    for (label, wire) in &wires {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let leaked = n(&wire.plaintext);
        let keepalives = if args.nat {
            format!("{} NAT keepalives, ", n(&wire.keepalives))
        } else {
            String::new()
        };
        println!(
            "  wire  {label}: {} frames: {} ESP{}, {} ARP, {} rekey exchange ({}), {keepalives}{leaked} plaintext IPv4, {} other → {}",
            n(&wire.frames),
            n(&wire.esp),
            if args.nat { " in UDP" } else { "" },
            n(&wire.arp),
            n(&wire.control),
            if args.nat { "IKE on 4500" } else { "UDP 500" },
            n(&wire.other),
            if leaked == 0 {
                "no plaintext leaked"
            } else {
                "PLAINTEXT LEAKED"
            }
        );
    }
    for (_, wire) in wires.iter().take(1) {
        if let Ok(sample) = wire.sample.lock() {
            if let Some((f, at)) = sample.as_ref() {
                let word = |i: usize| u32::from_be_bytes([f[i], f[i + 1], f[i + 2], f[i + 3]]);
                let (spi, seq) = (word(*at), word(at + 4));
                let udp = if *at > 34 {
                    format!(
                        " UDP {} → {}",
                        u16::from_be_bytes([f[34], f[35]]),
                        u16::from_be_bytes([f[36], f[37]])
                    )
                } else {
                    String::new()
                };
                println!(
                    "  esp   sample: {} → {}{udp} SPI {spi:#010x} seq {seq} {} bytes: {}…",
                    Ipv4Addr::from(word(26)),
                    Ipv4Addr::from(word(30)),
                    f.len() - 14,
                    f[at + 8..at + 24]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                );
            }
        }
    }
    let nat_ok = !args.nat || nat_report(&wires, &typed_a.gateway, &typed_b.gateway);
    for (name, s) in [("gwA", &typed_a), ("gwB", &typed_b)] {
        let g = &s.gateway;
        println!(
            "  {name}   rx {} tx {} encapsulated {} decapsulated {} generated {} · drops: {} · kernel socket drops {} · offload: {}",
            g.rx_packets,
            g.tx_packets,
            g.encapsulated,
            g.decapsulated,
            g.generated,
            report::drops_line(g),
            s.kernel_drops,
            report::offload_line(&s.offload)
        );
    }
    // Which MAC and MTU each gateway took, as its startup log says.
    for name in ["gwA", "gwB"] {
        let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        for line in log
            .lines()
            .filter_map(|l| l.split_once("interface `").map(|(_, rest)| rest))
        {
            println!(
                "  link  {name} {}",
                line.replacen("` on `", " ", 1).replacen("`:", ":", 1)
            );
        }
    }
    let mut nothing_lost = true;
    if let Some(floods) = &floods {
        for f in floods {
            let (ab, ba) = &f.good;
            println!(
                "  flood {:<20} {:>9} bad ESP frames ({:>7.0} /s) · good UDP {:>4}/{} hostA→hostB, {:>4}/{} hostB→hostA",
                f.label, f.sent, f.rate, ab.received, ab.sent, ba.received, ba.sent
            );
        }
        // A flood may cost good traffic, but must never shut it out.
        let starved = floods
            .iter()
            .any(|f| f.good.0.received * 2 < f.good.0.sent || f.good.1.received * 2 < f.good.1.sent);
        if starved {
            println!("  flood STARVED the good traffic (less than half arrived)");
        }
        nothing_lost = !starved;
    }
    if let Some((_, Some(reloads))) = &streams {
        println!("  reload {reloads}");
    }
    if let Some(((ab, ba), _)) = &streams {
        let whole = ab.received == ab.sent && ba.received == ba.sent && ab.duplicates + ba.duplicates == 0;
        nothing_lost = nothing_lost && whole;
        if args.rekey_every.is_none() {
            println!(
                "  udp   numbered: {}/{} hostA→hostB, {}/{} hostB→hostA, {} duplicates",
                ab.received,
                ab.sent,
                ba.received,
                ba.sent,
                ab.duplicates + ba.duplicates
            );
        }
    }
    if let (Some(every), Some(((ab, ba), _))) = (args.rekey_every, &streams) {
        // Keyed by charon, a CHILD_SA rekey is a new pair of SAs mirrored.
        let rekeys = |s: &StatsReply| match (&s.xfrm, strongswan) {
            (Some(x), true) => (x.sas_installed / 2).saturating_sub(1),
            _ => s.control.as_ref().map_or(0, |c| c.rekeys_completed),
        };
        // Packets the gateways lost: every drop but the fragmentation-needed
        // refusals, which answer TCP's path-MTU probing with ICMP by design.
        let lost = |s: &StatsReply| {
            s.gateway
                .drops
                .iter()
                .filter(|(reason, _)| *reason != dataplane::DropReason::FragNeeded)
                .map(|(_, n)| n)
                .sum::<u64>()
        };
        let (lost_a, lost_b) = (lost(&typed_a), lost(&typed_b));
        let streams_whole =
            ab.received == ab.sent && ba.received == ba.sent && ab.duplicates + ba.duplicates == 0;
        nothing_lost = nothing_lost
            && lost_a + lost_b == 0
            && streams_whole
            && results.udp_echoed == results.udp_sent
            && results.tcp_ok
            && rekeys(&typed_a) > 0
            && rekeys(&typed_a) == rekeys(&typed_b);
        println!(
            "  rekey every {every} bytes: {} rekeys at gwA, {} at gwB ({}); numbered UDP {}/{} hostA→hostB and {}/{} hostB→hostA received, {} duplicates; {} packets lost in the gateways → {}",
            rekeys(&typed_a),
            rekeys(&typed_b),
            if strongswan {
                "CHILD_SA rekeys by charon, on espgw's EXPIRE".to_owned()
            } else {
                let generation = typed_a.tunnels.as_deref().and_then(|t| t.first()).map(|t| t.generation);
                format!("now generation {}", generation.map_or("null".into(), |g| g.to_string()))
            },
            ab.received,
            ab.sent,
            ba.received,
            ba.sent,
            ab.duplicates + ba.duplicates,
            lost_a + lost_b,
            if nothing_lost { "nothing lost" } else { "PACKETS LOST" }
        );
    }
    println!("  gwA's SAs (espgw sa list --config configs/demo-a.toml):");
    for line in sa_list.lines() {
        println!("        {line}");
    }
    drop(lab);
    let leftover: Vec<&str> = names
        .all()
        .filter(|ns| Path::new(&format!("/var/run/netns/{ns}")).exists())
        .collect();
    println!(
        "  clean {}",
        if leftover.is_empty() {
            "all namespaces and veth pairs removed".to_owned()
        } else {
            format!("LEFT BEHIND: {leftover:?}")
        }
    );
    let all_ok = results.passed()
        && results6.as_ref().is_none_or(Results::passed)
        && nat_ok
        && esp > 0
        && plaintext == 0
        && nothing_lost
        && leftover.is_empty();
    ensure!(all_ok, "the demo found a problem (see above)");
    println!("  ok");
    Ok(())
}

/// `--nat`: prints where the NAT put gwA and where gwB sent its ESP, and
/// says whether gwB followed gwA there. On the public link, gwA's ESP must
/// come from one NAT mapping of its 4500 (not 4500 itself: the NAT maps
/// to 40000-40999), gwB must send its ESP to that mapping, and to gwA's
/// configured address only before it first did (what it sent there the
/// NAT dropped), and gwB must have counted the move (`nat_peer_moved`).
fn nat_report(wires: &[(&str, Arc<Wire>)], gw_a: &dataplane::Stats, gw_b: &dataplane::Stats) -> bool {
    let flows = wires
        .get(1)
        .and_then(|(_, w)| w.udp_flows.lock().ok().map(|f| f.clone()))
        .unwrap_or_default();
    let nat_t = spd_sad::UdpEncap::NAT_T.local_port;
    let configured = Ipv4Addr::new(10, 0, 0, 1);
    let from_a: Vec<FlowSeen> = flows
        .iter()
        .filter(|f| (f.flow.0, f.flow.2, f.flow.3) == (NAT_PUBLIC, GW_B_PUBLIC, nat_t))
        .copied()
        .collect();
    let from_b = |to: Ipv4Addr| -> Vec<FlowSeen> {
        flows
            .iter()
            .filter(|f| (f.flow.0, f.flow.1, f.flow.2) == (GW_B_PUBLIC, nat_t, to))
            .copied()
            .collect()
    };
    let (to_mapping, to_configured) = (from_b(NAT_PUBLIC), from_b(configured));
    let stale: u64 = to_configured.iter().map(|f| f.frames).sum();
    let moved = gw_b.nat_peer_moved;
    let followed = match (from_a.as_slice(), to_mapping.as_slice()) {
        ([a], [b]) => {
            a.flow.1 != nat_t
                && b.flow.3 == a.flow.1
                && to_configured.iter().all(|f| f.last < b.first)
                && flows.len() == 2 + to_configured.len()
                && moved >= 1
        }
        _ => false,
    };
    let list = |fs: &[FlowSeen], pick: fn(&UdpFlow) -> (Ipv4Addr, u16)| -> String {
        let text: Vec<String> = fs
            .iter()
            .map(|f| {
                let (a, p) = pick(&f.flow);
                format!("{a}:{p} ({} frames)", f.frames)
            })
            .collect();
        if text.is_empty() {
            "nowhere".into()
        } else {
            text.join(", ")
        }
    };
    println!(
        "  nat   gwA {configured}:{nat_t} appears behind the NAT as {}; gwB, configured with {configured}:{nat_t}, sent its ESP to {}{} · gwB nat_peer_moved {moved} · keepalives gwA sent {} gwB received {}, gwB sent {} gwA received {} → {}",
        list(&from_a, |f| (f.0, f.1)),
        list(&to_mapping, |f| (f.2, f.3)),
        if stale > 0 {
            format!(
                " and, before it followed, {stale} to {configured}:{nat_t}, which the NAT dropped"
            )
        } else {
            String::new()
        },
        gw_a.nat_keepalives_sent,
        gw_b.nat_keepalives_received,
        gw_b.nat_keepalives_sent,
        gw_a.nat_keepalives_received,
        if followed {
            "gwB followed gwA behind the NAT"
        } else {
            "gwB DID NOT FOLLOW gwA's NAT mapping"
        }
    );
    followed
}

/// The SPI of the inbound SA `tunnel` uses now at gateway `name`, from its
/// control socket: the exchange picks it at start and at every rekey.
fn inbound_spi(name: &str, tunnel: &str) -> Result<u32> {
    let doc: SasReply =
        crate::control::ask(&crate::control::default_path(name), &format!("sa show {tunnel}"))?;
    let sa_in = doc
        .tunnels()
        .first()
        .map(|t| t.sa_in.as_str())
        .unwrap_or_default();
    let spi = doc
        .sas
        .iter()
        .find(|sa| sa.summary.name == sa_in)
        .and_then(|sa| u32::from_str_radix(sa.summary.spi.trim_start_matches("0x"), 16).ok());
    spi.ok_or_else(|| anyhow::anyhow!("{name} shows no inbound SA for tunnel `{tunnel}`: {doc:?}"))
}
