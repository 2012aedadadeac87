//! The control plane between two gateways joined in memory under a virtual
//! clock: connecting at start, rekeys while traffic flows both ways, hard
//! expiry without a rekey, a peer that never answers, hostile control
//! messages (forged, replayed across restarts, reflected), reloads; and
//! UDP-encapsulated tunnels (RFC 3948) with one end behind a NAT whose
//! mapping changes, rekeying over port 4500.

mod common;

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use accel::{Algorithm, EngineKind, EngineSpec, Style};
use common::{interface, tunnel_edited, udp_packet, HOST_A, HOST_B};
use dataplane::{DropReason, Gateway, LinkLayer, Output, PacketPool, Port, Verdict};
use ike_stub::builder::{ConfigBuilder, Encap, LifetimeBuilder, LimitsSection, RekeySection, TunnelBuilder};
use ike_stub::message::{self, Kind};
use ike_stub::{Config, ControlPlane, ReloadError};
use smoltcp::wire::{Ipv4Cidr, Ipv4Packet};
use spd_sad::Ipv4Prefix;

const SECRET: &str = "a test secret, longer than sixteen bytes";
/// One-way delay of the wire between the gateways.
const WIRE_DELAY: Duration = Duration::from_millis(2);
const STEP: Duration = Duration::from_millis(1);

/// Site A's (`a`) or site B's end of the test tunnel, changed by `edit`.
fn site(a: bool, alg: Algorithm, edit: impl FnOnce(&mut ConfigBuilder)) -> ConfigBuilder {
    tunnel_edited(alg, "tunnel", false, a, edit)
}

/// [`site`]'s text.
fn config_text(a: bool, alg: Algorithm, edit: impl FnOnce(&mut ConfigBuilder)) -> String {
    site(a, alg, edit).to_toml()
}

/// The tunnel gets `SECRET`: it is keyed by exchanges with the peer, the
/// first at start.
fn secret(config: &mut ConfigBuilder) {
    config.tunnels[0] = config.tunnels[0].clone().secret(SECRET);
}

/// The tunnel's lifetime is `lifetime`.
fn lifetime(lifetime: LifetimeBuilder) -> impl Fn(&mut ConfigBuilder) {
    move |config| config.tunnels[0].lifetime = Some(lifetime)
}

/// A lifetime of `soft` and `hard` packets.
fn packets(soft: u64, hard: u64) -> LifetimeBuilder {
    LifetimeBuilder {
        soft_packets: Some(soft),
        hard_packets: Some(hard),
        ..LifetimeBuilder::default()
    }
}

/// A lifetime of `soft` and `hard` bytes.
fn bytes(soft: u64, hard: u64) -> LifetimeBuilder {
    LifetimeBuilder {
        soft_bytes: Some(soft),
        hard_bytes: Some(hard),
        ..LifetimeBuilder::default()
    }
}

/// A lifetime of `soft` and `hard` seconds without traffic.
fn idle(soft: u64, hard: u64) -> LifetimeBuilder {
    LifetimeBuilder {
        soft_idle_s: Some(soft),
        hard_idle_s: Some(hard),
        ..LifetimeBuilder::default()
    }
}

/// `[rekey]` for the virtual clock: a short grace, quick retransmits.
fn quick_rekey() -> RekeySection {
    RekeySection {
        grace_ms: Some(300),
        retransmit_ms: Some(20),
        ..RekeySection::default()
    }
}

/// An IPv4 prefix written as text.
fn prefix(text: &str) -> Ipv4Prefix {
    text.parse().expect("a prefix")
}

fn parse(text: &str) -> Config {
    Config::parse(Path::new("test.toml"), text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// One gateway with its control plane, and what reached its inside.
struct Site {
    gw: Gateway,
    plane: ControlPlane,
    inbox: Vec<Vec<u8>>,
    /// Sequence numbers of the test packets delivered to this site's inside.
    delivered: Vec<u32>,
    drops: Vec<DropReason>,
    /// ESP frames this site sent, kept to replay later.
    sent_esp: Vec<Vec<u8>>,
    /// Control datagrams this site sent.
    sent_control: Vec<Vec<u8>>,
}

struct Net {
    sites: [Site; 2],
    pool: PacketPool,
    now: Duration,
    /// Frames on the wire: arrival time, receiving site, bytes.
    wire: VecDeque<(Duration, usize, Vec<u8>)>,
    /// Drop control datagrams to this site (a peer that never answers).
    mute: [bool; 2],
    sent: [u32; 2],
    last_timeout: Duration,
    /// A NAT in front of site 0 (A), translating its outside address and
    /// port 4500 to a public one, as a masquerading router would.
    nat: Option<Nat>,
    /// Frames the NAT had no mapping for.
    nat_dropped: usize,
}

/// Source NAT for site 0's UDP port 4500: out, its address and port become
/// `public`; in, only what is sent to `public` comes back, translated.
struct Nat {
    private: (Ipv4Addr, u16),
    public: (Ipv4Addr, u16),
}

impl Nat {
    /// Translates `frame` going from site `from`; `None`: dropped.
    fn translate(&self, from: usize, frame: &mut [u8]) -> Option<()> {
        // Out, the source is rewritten; in, the destination.
        let (addr_at, port_at, mapped, to) = match from {
            0 => (12, 20, self.private, self.public),
            _ => (16, 22, self.public, self.private),
        };
        let addr = Ipv4Addr::new(
            frame[addr_at],
            frame[addr_at + 1],
            frame[addr_at + 2],
            frame[addr_at + 3],
        );
        let port = u16::from_be_bytes([frame[port_at], frame[port_at + 1]]);
        // Only UDP of the mapping gets through: raw ESP cannot cross a
        // port-translating NAT.
        if frame[9] != 17 || (addr, port) != mapped {
            return None;
        }
        frame[addr_at..addr_at + 4].copy_from_slice(&to.0.octets());
        frame[port_at..port_at + 2].copy_from_slice(&to.1.to_be_bytes());
        let mut ip = Ipv4Packet::new_unchecked(&mut frame[..]);
        ip.fill_checksum();
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        // A zero UDP checksum (RFC 3948 ESP) stays zero; others are redone.
        if frame[26..28] != [0, 0] {
            smoltcp::wire::UdpPacket::new_unchecked(&mut frame[20..]).fill_checksum(&src.into(), &dst.into());
        }
        Some(())
    }
}

/// Whether an outer frame carries ESP: raw, or in UDP with neither the
/// non-ESP marker nor the keepalive byte.
fn is_esp(frame: &[u8]) -> bool {
    match frame.get(9) {
        Some(50) => true,
        // UDP not on IKE's port 500, longer than a keepalive, unmarked.
        Some(17) => {
            let ike = 500u16.to_be_bytes();
            frame.len() > 36 && frame[20..22] != ike && frame[22..24] != ike && frame[28..32] != [0; 4]
        }
        _ => false,
    }
}

impl Net {
    /// Two sites from their configuration texts; tunnels with a secret
    /// are connected before this returns.
    fn new(a: &str, b: &str, spec: &EngineSpec) -> Net {
        Net::with_seeds(a, b, spec, (1, 2))
    }

    /// [`Net::new`] with the planes' random numbers (nonces, SPIs) from
    /// `seeds`: a restart of both ends is a new `Net` with other seeds.
    fn with_seeds(a: &str, b: &str, spec: &EngineSpec, seeds: (u64, u64)) -> Net {
        let mut net = Net::unconnected(a, b, spec, seeds);
        net.connect();
        net
    }

    /// The two sites as they start: nothing exchanged yet.
    fn unconnected(a: &str, b: &str, spec: &EngineSpec, seeds: (u64, u64)) -> Net {
        let site = |text: &str, seed: u64| {
            let config = parse(text);
            let engine = accel::build_engine(spec).expect("engine");
            let gw = Gateway::with_commands(
                config.setup(LinkLayer::RawIp, Style::Async),
                engine,
                &config.commands(),
                Duration::ZERO,
            )
            .expect("installs");
            let mut plane = ControlPlane::new(config);
            plane.set_seed(seed);
            Site {
                gw,
                plane,
                inbox: Vec::new(),
                delivered: Vec::new(),
                drops: Vec::new(),
                sent_esp: Vec::new(),
                sent_control: Vec::new(),
            }
        };
        Net {
            sites: [site(a, seeds.0), site(b, seeds.1)],
            pool: PacketPool::new(4096),
            now: Duration::ZERO,
            wire: VecDeque::new(),
            mute: [false; 2],
            sent: [0; 2],
            last_timeout: Duration::ZERO,
            nat: None,
            nat_dropped: 0,
        }
    }

    /// Steps until every tunnel of both sites has SAs to send on.
    fn connect(&mut self) {
        let mut steps = 0;
        while !self.sites.iter().all(|s| s.plane.all_connected()) {
            self.step();
            steps += 1;
            assert!(
                steps < 5_000,
                "the tunnels never connected: {:?} {:?} / {:?} {:?}",
                self.sites[0].plane.tunnels(self.now),
                self.sites[0].plane.counters(),
                self.sites[1].plane.tunnels(self.now),
                self.sites[1].plane.counters()
            );
        }
        // Let the confirmation land.
        self.settle(10);
    }

    fn route(&mut self, from: usize, outputs: &mut Vec<Output>) {
        for (buf, verdict) in outputs.drain(..) {
            let site = &mut self.sites[from];
            match verdict {
                Verdict::Forward(Port::Outside) => {
                    // Kept as sent, before any NAT.
                    let mut frame = buf.data().to_vec();
                    if is_esp(&frame) {
                        site.sent_esp.push(frame.clone());
                    } else {
                        site.sent_control.push(frame.clone());
                    }
                    let translated = match &self.nat {
                        Some(nat) => nat.translate(from, &mut frame),
                        None => Some(()),
                    };
                    match translated {
                        Some(()) => self.wire.push_back((self.now + WIRE_DELAY, 1 - from, frame)),
                        None => self.nat_dropped += 1,
                    }
                }
                Verdict::Forward(Port::Inside) => {
                    let data = buf.data();
                    let seq = u32::from_be_bytes([data[28], data[29], data[30], data[31]]);
                    site.delivered.push(seq);
                }
                Verdict::Control => site.inbox.push(buf.data().to_vec()),
                Verdict::Consumed => {}
                Verdict::Drop(reason) => site.drops.push(reason),
            }
            self.pool.free(buf);
        }
    }

    fn inject(&mut self, to: usize, port: Port, frame: &[u8]) {
        let mut buf = self.pool.alloc().expect("pool has room");
        assert!(buf.fill(frame));
        let mut out = Vec::new();
        let now = self.now;
        let gw = &mut self.sites[to].gw;
        gw.handle_batch(now, port, &mut vec![buf], &mut out, &mut self.pool);
        drivers::drive::flush(gw, now, &mut out, &mut self.pool);
        self.route(to, &mut out);
    }

    /// Sends test packet number `seq` from site `from`'s inside.
    fn send(&mut self, from: usize, len: usize) {
        let seq = self.sent[from];
        self.sent[from] += 1;
        let (src, dst) = if from == 0 {
            (HOST_A, HOST_B)
        } else {
            (HOST_B, HOST_A)
        };
        let mut packet = udp_packet(src, dst, len.max(4), seq as u8);
        packet[28..32].copy_from_slice(&seq.to_be_bytes());
        self.inject(from, Port::Inside, &packet);
    }

    /// Moves the clock one step: delivers what arrived, runs both control
    /// planes and the gateways' timers.
    fn step(&mut self) {
        self.now += STEP;
        while self.wire.front().is_some_and(|(at, _, _)| *at <= self.now) {
            let Some((_, to, frame)) = self.wire.pop_front() else {
                break;
            };
            self.inject(to, Port::Outside, &frame);
        }
        let now = self.now;
        if now - self.last_timeout >= Duration::from_millis(10) {
            self.last_timeout = now;
            for s in 0..2 {
                let mut out = Vec::new();
                self.sites[s].gw.handle_timeout(now, &mut out, &mut self.pool);
                self.route(s, &mut out);
            }
        }
        for s in 0..2 {
            let inbox = std::mem::take(&mut self.sites[s].inbox);
            let inbox = if self.mute[s] { Vec::new() } else { inbox };
            let site = &mut self.sites[s];
            let datagrams = common::service(
                &mut site.plane,
                now,
                &mut site.gw,
                inbox.iter().map(Vec::as_slice),
            );
            for d in datagrams {
                let mut out = Vec::new();
                self.sites[s]
                    .gw
                    .send_datagram(now, d.ports, d.to.into(), &d.payload, &mut out, &mut self.pool)
                    .expect("route to the peer");
                self.route(s, &mut out);
            }
        }
    }

    fn generation(&self, site: usize) -> u32 {
        self.sites[site].plane.tunnels(self.now)[0].generation
    }

    fn sa_names(&self, site: usize) -> Vec<String> {
        let mut names: Vec<String> = self.sites[site]
            .gw
            .sad()
            .iter()
            .map(|(_, sa)| sa.name().to_owned())
            .collect();
        names.sort();
        names
    }

    /// Every test packet arrived exactly once, in order.
    fn assert_all_delivered_once(&self) {
        for (to, from) in [(1, 0), (0, 1)] {
            let got = &self.sites[to].delivered;
            let expected: Vec<u32> = (0..self.sent[from]).collect();
            assert_eq!(got.len(), expected.len(), "site {to}: lost or duplicated packets");
            assert_eq!(*got, expected, "site {to}: every packet exactly once, in order");
        }
    }
}

impl Net {
    /// Two ends of a tunnel with `SECRET`: `lifetime_a` at A, `lifetime_b`
    /// at B, and the same `rekey` section.
    fn with_secret(
        alg: Algorithm,
        lifetime_a: LifetimeBuilder,
        lifetime_b: LifetimeBuilder,
        rekey: RekeySection,
        spec: &EngineSpec,
    ) -> Net {
        let end = |a: bool, life: LifetimeBuilder| {
            config_text(a, alg, |c| {
                secret(c);
                lifetime(life)(c);
                c.rekey = rekey;
            })
        };
        Net::new(&end(true, lifetime_a), &end(false, lifetime_b), spec)
    }

    /// `steps` steps, each sending one packet from A (and from B if `both`).
    fn traffic(&mut self, steps: u32, both: bool) {
        for i in 0..steps {
            self.send(0, size(i));
            if both {
                self.send(1, size(i));
            }
            self.step();
        }
    }

    /// `steps` steps without new traffic: what is on the wire lands, timers run.
    fn settle(&mut self, steps: u32) {
        for _ in 0..steps {
            self.step();
        }
    }

    /// Sends from A until A reaches generation `target`.
    fn traffic_until_generation(&mut self, target: u32) {
        let mut i = 0;
        while self.generation(0) < target {
            self.send(0, 200);
            self.step();
            i += 1;
            assert!(i < 10_000, "no rekey to generation {target}");
        }
    }
}

/// The keying messages among `frames` (IPv4/UDP to port 500) of `kind`,
/// requests or responses.
fn control_messages(frames: &[Vec<u8>], kind: Kind, response: bool) -> Vec<Vec<u8>> {
    frames
        .iter()
        .filter(|f| {
            f.get(28..)
                .and_then(|m| message::peek(m).ok())
                .is_some_and(|p| p.kind == kind && p.response == response)
        })
        .cloned()
        .collect()
}

/// A deterministic mix of packet sizes.
fn size(i: u32) -> usize {
    [64usize, 1400, 300, 900, 40, 1200, 576][i as usize % 7]
}

fn rekey_while_traffic_flows(alg: Algorithm, spec: &EngineSpec, rekeys: u32) {
    let life = bytes(20000, 400000);
    let mut net = Net::with_secret(alg, life, life, quick_rekey(), spec);
    let mut i = 0u32;
    let mut replayed = 0;
    while net.generation(0) < rekeys || net.generation(1) < rekeys {
        // Both directions, at slightly different rates so that either end
        // may hit its soft limit first (and sometimes both at once).
        net.send(0, size(i));
        if !i.is_multiple_of(5) {
            net.send(1, size(i + 3));
        }
        // Now and then an attacker replays an old ESP frame at each end.
        if i % 97 == 50 {
            for s in 0..2 {
                let old = net.sites[1 - s].sent_esp.get((i / 2) as usize).cloned();
                if let Some(frame) = old {
                    net.inject(s, Port::Outside, &frame);
                    replayed += 1;
                }
            }
        }
        net.step();
        i += 1;
        assert!(
            i < 200_000,
            "rekeys stalled at generations {} / {}",
            net.generation(0),
            net.generation(1)
        );
    }
    // Let the last packets land and the grace period end.
    net.settle(400);
    net.assert_all_delivered_once();
    for s in 0..2 {
        let site = &net.sites[s];
        let counters = site.plane.counters();
        let replay_drops = site
            .drops
            .iter()
            .filter(|r| r.is_replay() || **r == DropReason::UnknownSpi)
            .count();
        assert_eq!(
            site.drops.len(),
            replay_drops,
            "site {s}: the only drops are replayed frames: {:?}",
            site.drops
        );
        assert_eq!(counters.forged + counters.malformed + counters.truncated, 0);
        assert!(
            counters.rekeys_completed >= u64::from(rekeys),
            "site {s}: {counters:?}"
        );
        let generation = net.generation(s);
        assert_eq!(
            net.sa_names(s),
            vec![format!("t-in.{generation}"), format!("t-out.{generation}")],
            "site {s}: every replaced SA is deleted"
        );
        let stats = site.gw.stats();
        assert!(stats.balanced(), "site {s}: {stats:?}");
        assert_eq!(stats.control_received, counters.received);
    }
    assert!(replayed > 0);
    assert_eq!(
        net.sites.iter().map(|s| s.drops.len()).sum::<usize>(),
        replayed,
        "every replayed frame was refused"
    );
    assert_eq!(net.generation(0), net.generation(1));
    assert!(net.pool.in_use() == 0, "every buffer came back");
}

#[test]
fn a_hundred_rekeys_lose_nothing_and_accept_no_replay() {
    rekey_while_traffic_flows(Algorithm::Aes128Gcm16, &EngineSpec::default(), 100);
}

#[test]
fn rekeys_on_the_sec_engine_model_with_cbc_hmac() {
    let spec = EngineSpec {
        kind: EngineKind::Sec,
        ..EngineSpec::default()
    };
    rekey_while_traffic_flows(Algorithm::Aes128Sha1, &spec, 20);
}

#[test]
fn both_ends_can_start_and_collisions_resolve() {
    // Symmetric traffic makes both ends reach the soft limit together.
    let life = packets(50, 5000);
    let alg = Algorithm::Aes256Gcm16;
    let mut net = Net::with_secret(alg, life, life, quick_rekey(), &EngineSpec::default());
    net.traffic(3000, true);
    net.settle(400);
    net.assert_all_delivered_once();
    let (a, b) = (net.sites[0].plane.counters(), net.sites[1].plane.counters());
    assert!(a.collisions + b.collisions > 0, "{a:?} {b:?}");
    assert!(a.rekeys_completed >= 10 && a.rekeys_completed == b.rekeys_completed);
    assert!(net.sites.iter().all(|s| s.drops.is_empty()));
}

#[test]
fn hard_expiry_without_a_rekey_drops_as_sa_expired() {
    // No secret: nothing can rekey.
    let life = lifetime(packets(5, 10));
    let alg = Algorithm::Aes128Gcm16;
    let mut net = Net::new(
        &config_text(true, alg, &life),
        &config_text(false, alg, &life),
        &EngineSpec::default(),
    );
    for _ in 0..15 {
        net.send(0, 100);
        net.step();
    }
    assert_eq!(net.sites[1].delivered.len(), 10);
    assert_eq!(net.sites[0].drops, vec![DropReason::SaExpired; 5]);
    assert_eq!(net.sites[0].gw.stats().drops.get(DropReason::SaExpired), 5);
    let status = &net.sites[0].plane.tunnels(net.now)[0];
    assert!(!status.can_rekey);
    assert!(
        status.note.as_deref().is_some_and(|n| n.contains("sa_expired")),
        "{status:?}"
    );
    assert!(net.sites[0].plane.counters().hard_expired >= 1);
    assert_eq!(
        net.sites[0].plane.counters().sent,
        0,
        "nothing to say without a secret"
    );
}

/// Runs `f` with this thread's log lines collected, as `espgw run
/// --log-format json` writes them: one JSON object each, the event's
/// fields at the top level.
fn logged(f: impl FnOnce()) -> Vec<serde_json::Value> {
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn a_silent_peer_leaves_the_old_sa_to_its_hard_expiry() {
    let life = packets(20, 400);
    let rekey = RekeySection {
        grace_ms: None,
        retransmit_ms: Some(10),
        retries: Some(3),
        retry_after_s: Some(3600),
    };
    let alg = Algorithm::Aes128Gcm16;
    let mut net = Net::with_secret(alg, life, life, rekey, &EngineSpec::default());
    net.mute = [true, true];
    let log = logged(|| {
        net.traffic(410, false);
        net.settle(500);
    });
    // The operator's line: an event to search for, saying who gave up on
    // which peer and why.
    // Both ends started a rekey the other never heard: one line each.
    let failed: Vec<&serde_json::Value> = log.iter().filter(|l| l["event"] == "exchange_failed").collect();
    let mut peers: Vec<&str> = failed.iter().filter_map(|l| l["peer"].as_str()).collect();
    peers.sort();
    assert_eq!(peers, ["10.0.0.1", "10.0.0.2"], "{log:?}");
    for line in failed {
        assert_eq!(line["level"], "WARN", "{line}");
        assert_eq!(line["role"], "initiator", "{line}");
        assert_eq!(line["tries"], 4, "{line}");
        assert_eq!(line["tunnel"], "t", "{line}");
        assert!(
            line["reason"]
                .as_str()
                .is_some_and(|r| r.contains("never answered the rekey request")),
            "{line}"
        );
    }
    let a = net.sites[0].plane.counters();
    assert_eq!(a.rekeys_started, 1);
    assert_eq!(a.retransmitted, 3, "{a:?}");
    assert_eq!(a.gave_up, 1);
    assert_eq!(net.generation(0), 0);
    assert_eq!(
        net.sites[1].delivered.len(),
        400,
        "the old SA carried traffic to its hard limit"
    );
    assert_eq!(net.sites[0].drops, vec![DropReason::SaExpired; 10]);
    let note = net.sites[0].plane.tunnels(net.now)[0]
        .note
        .clone()
        .unwrap_or_default();
    assert!(note.contains("never answered"), "{note}");
}

#[test]
fn forged_replayed_and_truncated_control_messages_are_ignored_and_counted() {
    // A reaches its soft limit long before B: A always initiates.
    let (soon, late) = (packets(30, 100000), packets(90000, 100000));
    let alg = Algorithm::Aes128Gcm16;
    let mut net = Net::with_secret(alg, soon, late, quick_rekey(), &EngineSpec::default());
    // Two rekeys, so there are old messages to replay.
    net.traffic_until_generation(2);
    net.settle(50);
    let before = (net.generation(1), net.sa_names(1), net.sites[1].plane.counters());
    let old = control_messages(&net.sites[0].sent_control, Kind::Rekey, false)[0].clone();
    // Replayed: an old request from the first rekey.
    net.inject(1, Port::Outside, &old);
    // Forged: one flipped bit in the ICV, in the body, in the header's
    // message ID.
    for at in [old.len() - 1, old.len() - 40, 20 + 8 + 21] {
        let mut forged = old.clone();
        forged[at] ^= 0x04;
        net.inject(1, Port::Outside, &forged);
    }
    // Truncated at every length past the UDP header: the IP and UDP
    // lengths are kept consistent so that the message itself is short.
    for len in 28..old.len() - 1 {
        let mut short = old[..len].to_vec();
        short[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        short[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
        let mut ip = smoltcp::wire::Ipv4Packet::new_unchecked(&mut short[..]);
        ip.fill_checksum();
        net.inject(1, Port::Outside, &short);
    }
    net.step();
    let after = net.sites[1].plane.counters();
    assert_eq!(after.replayed, before.2.replayed + 1, "{after:?}");
    assert_eq!(after.forged, before.2.forged + 3, "{after:?}");
    assert!(
        after.truncated >= before.2.truncated + (old.len() - 29) as u64 - 1,
        "{after:?}"
    );
    assert_eq!(after.sent, before.2.sent, "nothing answered");
    assert_eq!(
        (net.generation(1), net.sa_names(1)),
        (before.0, before.1),
        "nothing changed"
    );
    // Traffic still flows, and rekeys still work.
    let target = net.generation(0) + 1;
    net.traffic_until_generation(target);
    net.settle(50);
    net.assert_all_delivered_once();
}

#[test]
fn reload_adds_removes_and_keeps_tunnels() {
    let second = TunnelBuilder::new(
        "u",
        (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)),
        Algorithm::Aes128Gcm16,
        (0x2001, 0x2002),
    )
    .subnets(prefix("192.168.11.0/24"), prefix("192.168.12.0/24"))
    .keys_with(|dir, len, auth| {
        ike_stub::builder::pattern_key(len, 3, u8::from(dir == "in") + 2 * u8::from(auth))
    });
    let alg = Algorithm::Aes128Gcm16;
    let base = site(true, alg, secret);
    let mut net = Net::new(
        &base.to_toml(),
        &config_text(false, alg, secret),
        &EngineSpec::default(),
    );
    for _ in 0..5 {
        net.send(0, 100);
        net.step();
    }
    let sent = |net: &Net| {
        let sad = net.sites[0].gw.sad();
        sad.find("t-out")
            .and_then(|id| sad.get(id))
            .map(|sa| sa.counters().packets)
    };
    assert_eq!(sent(&net), Some(5));

    let now = net.now;
    let site = &mut net.sites[0];
    let both = base.clone().tunnel(second.clone());
    let report = site.plane.reload(parse(&both.to_toml())).expect("reload");
    assert_eq!(report.added, vec!["u".to_owned()]);
    assert_eq!(report.unchanged, vec!["t".to_owned()]);
    assert!(report.removed.is_empty() && report.changed.is_empty());
    drop(common::service(&mut site.plane, now, &mut site.gw, []));
    assert_eq!(net.sa_names(0), ["t-in", "t-out", "u-in", "u-out"]);
    assert_eq!(
        sent(&net),
        Some(5),
        "the unchanged tunnel kept its SAs and counters"
    );
    assert!(net.sites[0].gw.spd().get("u-out").is_some());

    // A config that changes what cannot change while running is refused.
    let mut moved = both.clone();
    interface(&mut moved, "inside").address = Ipv4Cidr::new(Ipv4Addr::new(192, 168, 1, 2), 24);
    let site = &mut net.sites[0];
    assert!(
        matches!(site.plane.reload(parse(&moved.to_toml())), Err(ReloadError::NeedsRestart(what)) if what.contains("[[interface]]"))
    );
    assert_eq!(site.plane.counters().reloads_rejected, 1);
    let limited = both.clone().limits(LimitsSection {
        neighbors_per_interface: Some(8),
        ..LimitsSection::default()
    });
    assert!(
        matches!(site.plane.reload(parse(&limited.to_toml())), Err(ReloadError::NeedsRestart(what)) if what == "[limits]")
    );
    assert_eq!(site.plane.counters().reloads_rejected, 2);
    // Waiting for a deleted device needs the socket helper forked at start.
    let exits = both.clone().on_device_loss(ike_stub::DeviceLoss::Exit);
    assert!(
        matches!(site.plane.reload(parse(&exits.to_toml())), Err(ReloadError::NeedsRestart(what)) if what == "[gateway]")
    );
    assert_eq!(site.plane.counters().reloads_rejected, 3);

    // Removing the first tunnel stops it; changing the second restarts it.
    let mut without_t = base.clone();
    without_t.tunnels = vec![TunnelBuilder {
        spi_in: Some(0x2003),
        ..second
    }];
    let report = site.plane.reload(parse(&without_t.to_toml())).expect("reload");
    assert_eq!(
        (report.removed, report.changed),
        (vec!["t".to_owned()], vec!["u".to_owned()])
    );
    drop(common::service(&mut site.plane, now, &mut site.gw, []));
    assert_eq!(net.sa_names(0), ["u-in", "u-out"]);
    let sad = net.sites[0].gw.sad();
    assert_eq!(
        sad.find("u-in").and_then(|id| sad.get(id)).map(|sa| sa.spi()),
        Some(0x2003)
    );
    assert!(net.sites[0].gw.spd().get("t-out").is_none());
    // Traffic of the removed tunnel now meets the default discard.
    net.send(0, 100);
    assert_eq!(net.sites[0].drops.last(), Some(&DropReason::NoPolicy));
}

#[test]
fn a_tunnel_with_a_secret_connects_with_fresh_keys_and_refuses_configured_ones() {
    let alg = Algorithm::Aes256Sha256;
    let keyed = |a: bool| config_text(a, alg, secret);
    let mut net = Net::new(&keyed(true), &keyed(false), &EngineSpec::default());
    net.traffic(20, true);
    net.settle(5);
    net.assert_all_delivered_once();
    for s in 0..2 {
        let counters = net.sites[s].plane.counters();
        assert_eq!(counters.connects_completed, 1, "site {s}: {counters:?}");
        assert_eq!(net.sites[s].plane.tunnels(net.now)[0].state, "established");
    }
    // Keys (or SPIs) beside a secret would be the same at every start: refused.
    let with_keys = config_text(true, alg, |c| {
        c.tunnels[0].secret = Some(SECRET.into());
    });
    let err = Config::parse(Path::new("x.toml"), &with_keys).expect_err("keys and a secret");
    assert!(
        err.to_string().contains("fresh at every start") && err.line > 0,
        "{err}"
    );
    // Without keys or a secret the config names the fix.
    let strip = |config: &mut ConfigBuilder| {
        let tunnel = &mut config.tunnels[0];
        tunnel.enc_key_out = None;
        tunnel.auth_key_out = None;
        tunnel.enc_key_in = None;
        tunnel.auth_key_in = None;
    };
    let err = Config::parse(Path::new("x.toml"), &config_text(true, alg, strip)).expect_err("no keys");
    assert!(err.to_string().contains("secret"), "{err}");
}

/// Until a tunnel with a secret is keyed, what its policy protects is
/// dropped, never sent in the clear or under a key of an earlier start.
#[test]
fn nothing_leaves_before_the_first_exchange_is_done() {
    let alg = Algorithm::Aes128Gcm16;
    let mut net = Net::unconnected(
        &config_text(true, alg, secret),
        &config_text(false, alg, secret),
        &EngineSpec::default(),
        (1, 2),
    );
    net.send(0, 100);
    assert_eq!(net.sites[0].drops, vec![DropReason::PolicyDiscard]);
    assert!(net.sites[0].sent_esp.is_empty() && net.sites[0].sent_control.is_empty());
    assert_eq!(net.sites[0].plane.tunnels(net.now)[0].state, "down");
    net.connect();
    net.sent[0] = 0;
    net.sites[0].drops.clear();
    net.traffic(10, true);
    net.settle(10);
    net.assert_all_delivered_once();
}

/// The review's attack on keys that are the same at every start: the same
/// packets' payloads, different in two runs, give the same keystream
/// (c1 ^ c2 = p1 ^ p2) when the key and the nonce (the sequence number)
/// repeat. After a restart of both ends every keystream is new.
#[test]
fn a_restart_of_both_ends_never_repeats_a_key_and_nonce() {
    let alg = Algorithm::Aes128Gcm16;
    let run = |seeds: (u64, u64), fill: u8| {
        let mut net = Net::with_seeds(
            &config_text(true, alg, secret),
            &config_text(false, alg, secret),
            &EngineSpec::default(),
            seeds,
        );
        let mut keystreams = Vec::new();
        for i in 0..20u8 {
            let mut packet = common::udp_packet(HOST_A, HOST_B, 64, fill.wrapping_add(i));
            packet[28..32].copy_from_slice(&u32::from(i).to_be_bytes());
            let before = net.sites[0].sent_esp.len();
            net.inject(0, Port::Inside, &packet);
            net.step();
            let frame = net.sites[0].sent_esp[before].clone();
            // Outer IPv4 (20), ESP header (8), GCM IV (8), inner IPv4 and
            // UDP headers (28): then the payload, encrypted as it was sent.
            let cipher = &frame[20 + 8 + 8 + 28..20 + 8 + 8 + 28 + 32];
            let stream: Vec<u8> = cipher.iter().zip(&packet[28..60]).map(|(c, p)| c ^ p).collect();
            keystreams.push(stream);
        }
        net.settle(10);
        keystreams
    };
    let first = run((1, 2), 0x10);
    // A restart is new random numbers at both ends (the plane draws them
    // from the operating system outside tests).
    let second = run((3, 4), 0x80);
    for (i, (a, b)) in first.iter().zip(&second).enumerate() {
        assert_ne!(a, b, "packet {i}: the same keystream after a restart");
    }
}

/// Every control message of a run, replayed at both ends after they both
/// restarted (a spoofing attacker on the link who recorded the earlier
/// run): the tunnel goes on, nothing switches, and what a replayed INIT
/// installed expires.
#[test]
fn exchanges_recorded_before_a_restart_change_nothing_after_it() {
    let life = packets(40, 100_000);
    let alg = Algorithm::Aes128Gcm16;
    let ends = |a: bool| {
        config_text(a, alg, |c| {
            secret(c);
            lifetime(life)(c);
            c.rekey = quick_rekey();
        })
    };
    let mut before = Net::with_seeds(&ends(true), &ends(false), &EngineSpec::default(), (1, 2));
    before.traffic_until_generation(3);
    before.settle(50);
    let recorded = [
        before.sites[0].sent_control.clone(),
        before.sites[1].sent_control.clone(),
    ];
    assert!(recorded[0].len() + recorded[1].len() >= 10);

    let mut after = Net::with_seeds(&ends(true), &ends(false), &EngineSpec::default(), (3, 4));
    let generations = (after.generation(0), after.generation(1));
    for round in 0..3 {
        for (from, frames) in recorded.iter().enumerate() {
            for frame in frames {
                after.inject(1 - from, Port::Outside, frame);
                after.send(0, 100);
                after.send(1, 100);
                after.step();
            }
        }
        if round == 0 {
            assert_eq!(
                (after.generation(0), after.generation(1)),
                generations,
                "a replay moved a tunnel"
            );
        }
    }
    // Long enough for every answered INIT to expire, with traffic.
    for _ in 0..60 {
        after.traffic(100, true);
    }
    after.settle(500);
    after.assert_all_delivered_once();
    for s in 0..2 {
        let site = &after.sites[s];
        let counters = site.plane.counters();
        assert!(site.drops.is_empty(), "site {s}: {:?}", site.drops);
        assert!(
            counters.unknown_control_sa + counters.stale_responses > 0,
            "site {s}: {counters:?}"
        );
        assert_eq!(counters.connects_completed, 1, "site {s}: {counters:?}");
        let generation = after.generation(s);
        let expected = match generation {
            0 => vec!["t-in".to_owned(), "t-out".to_owned()],
            g => vec![format!("t-in.{g}"), format!("t-out.{g}")],
        };
        assert_eq!(
            after.sa_names(s),
            expected,
            "site {s}: what replays installed is gone"
        );
    }
    let expired: u64 = after
        .sites
        .iter()
        .map(|s| s.plane.counters().half_open_expired)
        .sum();
    assert!(expired > 0, "a replayed INIT was answered, then expired");
    assert_eq!(after.generation(0), after.generation(1));
}

/// A request sent back to its sender (a reflection) is refused: the keys
/// differ by direction. The exchange it belonged to completes as usual.
#[test]
fn a_request_reflected_to_its_sender_is_refused() {
    let (soon, late) = (packets(30, 100_000), packets(90_000, 100_000));
    let alg = Algorithm::Aes128Gcm16;
    let mut net = Net::with_secret(alg, soon, late, quick_rekey(), &EngineSpec::default());
    let mut reflected = 0;
    while net.generation(0) < 3 {
        let seen = net.sites[0].sent_control.len();
        net.send(0, 200);
        net.send(1, 200);
        net.step();
        // Every request A sends comes back to it as if from B.
        let new: Vec<Vec<u8>> = net.sites[0].sent_control[seen..].to_vec();
        for frame in control_messages(&new, Kind::Rekey, false) {
            let mut back = frame.clone();
            back[12..16].copy_from_slice(&frame[16..20]);
            back[16..20].copy_from_slice(&frame[12..16]);
            Ipv4Packet::new_unchecked(&mut back[..]).fill_checksum();
            net.inject(0, Port::Outside, &back);
            reflected += 1;
        }
        assert!(net.now < Duration::from_secs(60), "rekeys stalled");
    }
    net.settle(400);
    net.assert_all_delivered_once();
    assert!(reflected >= 3);
    let a = net.sites[0].plane.counters();
    assert_eq!(a.reflected, reflected, "{a:?}");
    assert_eq!(a.rekeys_completed, 3, "{a:?}");
    for s in 0..2 {
        assert_eq!(net.sites[s].plane.tunnels(net.now)[0].state, "established");
    }
}

/// A rekey this end answered but whose initiator never says it switched
/// (its answer lost for good, or the request a replay) is given up: the
/// SAs installed for it are removed and the tunnel is established again.
#[test]
fn an_answered_rekey_that_is_never_confirmed_expires() {
    let (soon, late) = (packets(30, 100_000), packets(90_000, 100_000));
    let rekey = RekeySection {
        grace_ms: Some(300),
        retransmit_ms: Some(20),
        retries: Some(2),
        retry_after_s: Some(3600),
    };
    let alg = Algorithm::Aes128Gcm16;
    let mut net = Net::with_secret(alg, soon, late, rekey, &EngineSpec::default());
    // A hears nothing from now on: B's answer never arrives.
    net.mute[0] = true;
    let mut i = 0;
    while net.sites[1].plane.tunnels(net.now)[0].state != "rekey-responded" {
        net.send(0, 100);
        net.step();
        i += 1;
        assert!(i < 2_000, "B never answered a rekey");
    }
    assert_eq!(net.sa_names(1).len(), 4, "{:?}", net.sa_names(1));
    net.settle(2_000);
    let b = net.sites[1].plane.counters();
    assert_eq!(b.responded_expired, 1, "{b:?}");
    assert_eq!(net.sites[1].plane.tunnels(net.now)[0].state, "established");
    assert_eq!(net.sa_names(1), vec!["t-in".to_owned(), "t-out".to_owned()]);
}

/// The initiator's `switched` does not reach the responder for a while,
/// but its ESP on the new SAs does: that proves the switch as well (only
/// it holds those keys), so the responder moves to them at once, and its
/// answer never expires under traffic that uses it. The retransmitted
/// `switched` gets its acknowledgement later. Nothing is lost.
#[test]
fn a_lost_switch_is_inferred_from_the_peers_traffic() {
    let (soon, late) = (packets(30, 100_000), packets(90_000, 100_000));
    let alg = Algorithm::Aes128Gcm16;
    let mut net = Net::with_secret(alg, soon, late, quick_rekey(), &EngineSpec::default());
    let mut i = 0;
    while net.sites[1].plane.tunnels(net.now)[0].state != "rekey-responded" {
        net.send(0, 100);
        net.send(1, 100);
        net.step();
        i += 1;
        assert!(i < 2_000, "B never answered a rekey");
    }
    // B hears no control message for a while: A's `switched` is lost.
    net.mute[1] = true;
    net.traffic(15, true);
    let b = &net.sites[1].plane.tunnels(net.now)[0];
    assert_eq!(
        (b.state.as_str(), b.generation),
        ("established", 1),
        "B switched on A's ESP"
    );
    net.mute[1] = false;
    net.traffic(300, true);
    net.settle(400);
    net.assert_all_delivered_once();
    for s in 0..2 {
        let counters = net.sites[s].plane.counters();
        assert_eq!(
            counters.gave_up + counters.responded_expired,
            0,
            "site {s}: {counters:?}"
        );
        assert_eq!(net.sites[s].plane.tunnels(net.now)[0].state, "established");
    }
    assert_eq!(net.generation(0), net.generation(1));
    assert!(net.sites.iter().all(|s| s.drops.is_empty()));
}

/// A reload that changes a tunnel without a secret but keeps its keys
/// (here its replay window) carries its sequence counter and window over:
/// the next packet continues the count, and frames from before the reload
/// stay refused.
#[test]
fn a_reload_that_keeps_the_keys_keeps_the_sequence_numbers() {
    let alg = Algorithm::Aes128Gcm16;
    let window = |w: u32| move |c: &mut ConfigBuilder| c.tunnels[0].replay_window = Some(w);
    let mut net = Net::new(
        &config_text(true, alg, window(64)),
        &config_text(false, alg, window(64)),
        &EngineSpec::default(),
    );
    net.traffic(5, true);
    net.settle(5);
    let old_frames = net.sites[0].sent_esp.clone();
    let now = net.now;
    for s in 0..2 {
        let site = &mut net.sites[s];
        let report = site
            .plane
            .reload(parse(&config_text(s == 0, alg, window(128))))
            .expect("reload");
        assert_eq!(report.changed, vec!["t".to_owned()]);
        assert_eq!(report.carried_over.len(), 2, "{report:?}");
        drop(common::service(&mut site.plane, now, &mut site.gw, []));
    }
    net.traffic(5, true);
    net.settle(5);
    let seq = |frame: &Vec<u8>| u32::from_be_bytes([frame[24], frame[25], frame[26], frame[27]]);
    let sent: Vec<u32> = net.sites[0].sent_esp.iter().map(seq).collect();
    assert_eq!(sent[..5], [1, 2, 3, 4, 5]);
    // Past every number the old SA had reserved, in order.
    assert!(
        sent[5] > 5 && sent.windows(2).all(|w| w[0] < w[1]),
        "the count goes on: {sent:?}"
    );
    for frame in &old_frames {
        net.inject(1, Port::Outside, frame);
    }
    assert_eq!(net.sites[1].drops, vec![DropReason::ReplayDuplicate; 5]);
    net.sites[1].drops.clear();
    net.assert_all_delivered_once();
}

/// An idle soft lifetime starts a rekey like any soft limit, under the
/// virtual clock: a quiet tunnel gets fresh SAs (whose idle clocks start
/// at installation) and carries traffic afterwards without a loss.
#[test]
fn an_idle_tunnel_rekeys_at_its_soft_idle_lifetime() {
    let mut net = Net::with_secret(
        Algorithm::Aes128Gcm16,
        idle(1, 5),
        idle(2, 5),
        quick_rekey(),
        &EngineSpec::default(),
    );
    net.traffic(100, true);
    // 0.9 s of quiet after the last packet: not yet.
    net.settle(890);
    assert_eq!(net.generation(0), 0, "idle for less than soft_idle_s");
    net.settle(300);
    assert_eq!(net.generation(0), 1, "soft_idle_s reached: rekeyed");
    assert_eq!(net.generation(1), 1);
    net.traffic(100, true);
    net.settle(400);
    net.assert_all_delivered_once();
    assert!(net.sites.iter().all(|s| s.drops.is_empty()));
    assert_eq!(net.sa_names(0), vec!["t-in.1".to_owned(), "t-out.1".to_owned()]);
}

/// Without a secret nothing rekeys: the hard idle lifetime retires the SA
/// and a packet after it drops as `sa_expired`; traffic before it kept
/// the SA alive past the same span counted from installation.
#[test]
fn a_hard_idle_lifetime_retires_a_quiet_sa() {
    let life = lifetime(idle(1, 2));
    let alg = Algorithm::Aes128Gcm16;
    let mut net = Net::new(
        &config_text(true, alg, &life),
        &config_text(false, alg, &life),
        &EngineSpec::default(),
    );
    // A packet every 0.5 s for 3 s: never idle for 1 s.
    for _ in 0..6 {
        net.send(0, 100);
        net.settle(500);
    }
    assert_eq!(net.sites[1].delivered.len(), 6);
    assert!(net.sites[0].drops.is_empty());
    let out = net.sites[0].gw.sad().find("t-out").expect("installed");
    assert_eq!(
        net.sites[0].gw.sad().get(out).map(|sa| sa.state()),
        Some(spd_sad::SaState::Active)
    );
    net.settle(600);
    assert_eq!(
        net.sites[0].gw.sad().get(out).map(|sa| sa.state()),
        Some(spd_sad::SaState::SoftExpired),
        "1.1 s idle"
    );
    net.settle(1000);
    net.send(0, 100);
    net.settle(10);
    assert_eq!(net.sites[1].delivered.len(), 6);
    assert_eq!(net.sites[0].drops, vec![DropReason::SaExpired]);
    let status = &net.sites[0].plane.tunnels(net.now)[0];
    assert!(
        status.note.as_deref().is_some_and(|n| n.contains("sa_expired")),
        "{status:?}"
    );
}

/// The NAT's public address: on the gateways' link, so B routes to it.
const NAT_PUBLIC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 99);

/// A UDP-encapsulated tunnel with A behind a NAT that maps 10.0.0.1:4500
/// to `NAT_PUBLIC:port`, with `SECRET` and lifetimes `lifetime_a` at A and
/// `lifetime_b` at B (none: the parser's defaults).
fn behind_nat(lifetime_a: Option<LifetimeBuilder>, lifetime_b: Option<LifetimeBuilder>, port: u16) -> Net {
    let alg = Algorithm::Aes128Gcm16;
    let end = |a: bool, lifetime: Option<LifetimeBuilder>| {
        config_text(a, alg, |c| {
            c.tunnels[0].encap = Some(Encap::Udp);
            secret(c);
            c.tunnels[0].lifetime = lifetime;
            c.rekey = quick_rekey();
        })
    };
    let mut net = Net::unconnected(
        &end(true, lifetime_a),
        &end(false, lifetime_b),
        &EngineSpec::default(),
        (1, 2),
    );
    net.nat = Some(Nat {
        private: (Ipv4Addr::new(10, 0, 0, 1), 4500),
        public: (NAT_PUBLIC, port),
    });
    // B's first INIT request (and its first keepalive) go to A's
    // configured address, which the NAT hides; A's request reaches B, and
    // B asks again where it came from.
    net.connect();
    assert!(net.nat_dropped <= 2, "{}", net.nat_dropped);
    net.nat_dropped = 0;
    net
}

/// Where B's outer packets go: the destination and UDP port of its last ESP frame.
fn last_destination(net: &Net, site: usize) -> (Ipv4Addr, u16) {
    let frame = net.sites[site].sent_esp.last().expect("an ESP frame was sent");
    let ip = Ipv4Packet::new_unchecked(&frame[..]);
    (ip.dst_addr(), u16::from_be_bytes([frame[22], frame[23]]))
}

#[test]
fn a_udp_encapsulated_tunnel_behind_a_nat_carries_traffic_and_rekeys_over_4500() {
    let life = Some(bytes(20000, 400000));
    let mut net = behind_nat(life, life, 40_001);
    // B knows A only by its configured address, which the NAT hides: A
    // speaks first, and B follows the authenticated packet to the NAT.
    net.send(0, 100);
    net.settle(20);
    assert_eq!(net.sites[1].gw.stats().nat_peer_moved, 1);
    while net.generation(0) < 3 || net.generation(1) < 3 {
        let i = net.sent[0];
        net.send(0, size(i));
        net.send(1, size(i + 3));
        net.step();
        assert!(i < 100_000, "rekeys stalled");
    }
    net.settle(400);
    net.assert_all_delivered_once();
    for s in 0..2 {
        let site = &net.sites[s];
        assert!(site.drops.is_empty(), "site {s}: {:?}", site.drops);
        // Every ESP frame was UDP with checksum zero (RFC 3948 §2.1); none raw.
        assert!(site.sent_esp.iter().all(|f| f[9] == 17 && f[26..28] == [0, 0]));
        // The exchange ran on 4500, each message behind the non-ESP marker.
        let control: Vec<&Vec<u8>> = site.sent_control.iter().filter(|f| f.len() > 29).collect();
        assert!(!control.is_empty());
        for frame in control {
            assert_eq!(
                u16::from_be_bytes([frame[22], frame[23]]) % 40_001 % 4500,
                0,
                "{frame:02x?}"
            );
            assert_eq!(frame[28..32], [0; 4]);
        }
        assert!(site.plane.counters().rekeys_completed >= 3);
        let stats = site.gw.stats();
        assert!(stats.balanced(), "site {s}: {stats:?}");
    }
    // B's SAs, rekeyed ones included, send to where the NAT put A.
    assert_eq!(last_destination(&net, 1), (NAT_PUBLIC, 40_001));
    assert_eq!(net.nat_dropped, 0, "nothing went to A's hidden address");
    assert!(net.pool.in_use() == 0, "every buffer came back");
}

#[test]
fn a_peer_moves_only_on_an_authenticated_packet_that_is_its_newest() {
    let mut net = behind_nat(None, None, 40_001);
    net.traffic(20, false);
    net.settle(20);
    net.traffic(5, true);
    net.settle(20);
    assert_eq!(last_destination(&net, 1), (NAT_PUBLIC, 40_001));
    let stats = |net: &Net| *net.sites[1].gw.stats();
    let moved = stats(&net).nat_peer_moved;
    assert_eq!(moved, 1);

    // An attacker at another address replays an old frame of A's, sends
    // one with a sequence number ahead of the window and a broken ICV, and
    // a keepalive: none of them moves the tunnel.
    let attacker = |frame: &[u8]| {
        let mut f = frame.to_vec();
        f[12..16].copy_from_slice(&[10, 0, 0, 66]);
        f[20..22].copy_from_slice(&5555u16.to_be_bytes());
        Ipv4Packet::new_unchecked(&mut f[..]).fill_checksum();
        f
    };
    let old = net.sites[0].sent_esp[3].clone();
    net.inject(1, Port::Outside, &attacker(&old));
    let mut ahead = attacker(net.sites[0].sent_esp.last().expect("sent"));
    ahead[32..36].copy_from_slice(&1000u32.to_be_bytes());
    net.inject(1, Port::Outside, &ahead);
    let mut keepalive = attacker(&old[..29]);
    keepalive[2..4].copy_from_slice(&29u16.to_be_bytes());
    keepalive[24..26].copy_from_slice(&9u16.to_be_bytes());
    keepalive[26..28].copy_from_slice(&[0, 0]);
    keepalive[28] = 0xff;
    Ipv4Packet::new_unchecked(&mut keepalive[..]).fill_checksum();
    let keepalives = stats(&net).nat_keepalives_received;
    net.inject(1, Port::Outside, &keepalive);
    assert_eq!(
        net.sites[1].drops,
        vec![DropReason::ReplayDuplicate, DropReason::AuthFailed]
    );
    assert_eq!(
        stats(&net).nat_keepalives_received,
        keepalives + 1,
        "ignored, counted"
    );
    assert_eq!(stats(&net).nat_peer_moved, moved);
    net.traffic(3, true);
    net.settle(20);
    assert_eq!(
        last_destination(&net, 1),
        (NAT_PUBLIC, 40_001),
        "still at the NAT"
    );

    // The NAT forgets the mapping and makes a new one: A's next packet
    // moves the tunnel, and B's answers follow at once.
    net.nat = Some(Nat {
        private: (Ipv4Addr::new(10, 0, 0, 1), 4500),
        public: (NAT_PUBLIC, 40_777),
    });
    // The wire takes 2 ms: B has the packet after three steps, before its
    // next timeout (every 10 ms here, and just now).
    net.last_timeout = net.now;
    net.send(0, 100);
    for _ in 0..3 {
        net.step();
    }
    assert_eq!(stats(&net).nat_peer_moved, moved + 1);
    let dropped = net.nat_dropped;
    // B's answer to that very packet already goes to the new mapping.
    net.send(1, 100);
    net.settle(20);
    assert_eq!(net.nat_dropped, dropped, "the first answer followed the move");
    net.traffic(3, true);
    net.settle(20);
    assert_eq!(last_destination(&net, 1), (NAT_PUBLIC, 40_777));
    assert_eq!(net.nat_dropped, dropped, "nothing was sent to the old mapping");

    // Raw ESP to a UDP-encapsulated SA is refused: A's frame without its
    // UDP header.
    let frame = net.sites[0].sent_esp.last().expect("sent").clone();
    let mut raw = [&frame[..20], &frame[28..]].concat();
    raw[9] = 50;
    let len = raw.len() as u16;
    raw[2..4].copy_from_slice(&len.to_be_bytes());
    Ipv4Packet::new_unchecked(&mut raw[..]).fill_checksum();
    net.inject(1, Port::Outside, &raw);
    assert_eq!(net.sites[1].drops.last(), Some(&DropReason::EncapMismatch));
    assert!(stats(&net).balanced());
}

#[test]
fn keepalives_go_to_each_encapsulated_peer_every_interval() {
    let alg = Algorithm::Aes128Gcm16;
    let encap = |c: &mut ConfigBuilder| c.tunnels[0].encap = Some(Encap::Udp);
    // Without a NAT in between: A's keepalives reach B directly.
    let a = config_text(true, alg, |c| {
        encap(c);
        c.gateway.nat_keepalive_s = Some(1);
    });
    let b = config_text(false, alg, encap);
    let mut net = Net::new(&a, &b, &EngineSpec::default());
    net.settle(3500);
    let keepalives: Vec<&Vec<u8>> = net.sites[0]
        .sent_control
        .iter()
        .filter(|f| f.len() == 29 && f[28] == 0xff)
        .collect();
    // At the start, then after 1, 2 and 3 s.
    assert_eq!(keepalives.len(), 4, "{:?}", net.sites[0].gw.stats());
    for f in &keepalives {
        assert_eq!(f[20..24], [0x11, 0x94, 0x11, 0x94], "4500 to 4500");
    }
    assert_eq!(net.sites[0].gw.stats().nat_keepalives_sent, 4);
    assert_eq!(net.sites[1].gw.stats().nat_keepalives_received, 4);
    // B keeps the default interval (20 s): one at its start.
    assert_eq!(net.sites[1].gw.stats().nat_keepalives_sent, 1);
    assert!(net
        .sites
        .iter()
        .all(|s| s.drops.is_empty() && s.gw.stats().balanced()));
}

/// A replay of the peer's last rekey request, from anywhere, is not proof
/// that the peer moved: this end's next exchange still goes to where the
/// peer last proved to be.
#[test]
fn a_replayed_request_does_not_move_where_exchanges_go() {
    let (soon, late) = (Some(packets(30, 100_000)), Some(packets(300, 100_000)));
    let mut net = behind_nat(soon, late, 40_001);
    // A speaks first, so that B's ESP follows it to the NAT.
    net.send(0, 100);
    net.settle(20);
    // A rekeys first (its limit is lower).
    while net.generation(0) < 1 {
        net.send(0, 100);
        net.send(1, 100);
        net.step();
        assert!(net.now < Duration::from_secs(30));
    }
    net.settle(50);
    // An attacker elsewhere sends B a copy of A's last request (the
    // `switched` of its rekey).
    let frame = net.sites[0]
        .sent_control
        .iter()
        .rev()
        .find(|f| {
            // Behind the non-ESP marker: a request (no response flag) of
            // the control SA, rekey or switched.
            f.len() > 32
                && f.get(28..32) == Some(&[0; 4][..])
                && f.get(32..)
                    .and_then(|m| message::peek(m).ok())
                    .is_some_and(|p| !p.response && p.kind != Kind::Init)
        })
        .expect("A's last request")
        .clone();
    let replayed = net.sites[1].plane.counters().duplicates + net.sites[1].plane.counters().replayed;
    let mut spoofed = frame.clone();
    spoofed[12..16].copy_from_slice(&[10, 0, 0, 66]);
    spoofed[20..22].copy_from_slice(&5555u16.to_be_bytes());
    Ipv4Packet::new_unchecked(&mut spoofed[..]).fill_checksum();
    if spoofed[26..28] != [0, 0] {
        let (src, dst) = (Ipv4Addr::new(10, 0, 0, 66), Ipv4Addr::new(10, 0, 0, 2));
        smoltcp::wire::UdpPacket::new_unchecked(&mut spoofed[20..]).fill_checksum(&src.into(), &dst.into());
    }
    // From now on, what B sends (its answer to the copy included) must go
    // to the NAT, not to the attacker.
    let seen = net.sites[1].sent_control.len();
    net.inject(1, Port::Outside, &spoofed);
    while net.generation(1) < 2 {
        net.send(0, 100);
        net.send(1, 100);
        net.step();
        assert!(net.now < Duration::from_secs(60), "B's rekey stalled");
    }
    let to_attacker = net.sites[1].sent_control[seen..]
        .iter()
        .filter(|f| f[16..20] == [10, 0, 0, 66])
        .count();
    assert_eq!(to_attacker, 0, "B sent its exchange to the replay's source");
    let counters = net.sites[1].plane.counters();
    assert_eq!(
        counters.duplicates + counters.replayed,
        replayed + 1,
        "{counters:?}"
    );
    net.settle(400);
    let drops: Vec<_> = net.sites.iter().map(|s| s.drops.clone()).collect();
    assert!(drops.iter().all(Vec::is_empty), "{drops:?}");
    assert_eq!(net.nat_dropped, 0, "{:?}", net.sites[1].plane.counters());
    net.assert_all_delivered_once();
}
