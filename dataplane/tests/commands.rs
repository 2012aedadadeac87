//! The gateway driven through its command API alone (`dataplane::command`),
//! as a keying source drives it, with no configuration crate: two sites
//! with one tunnel, SAs and policies installed by commands, a rekey
//! (install, repoint, remove), a replacement that keeps the sequence
//! counter and replay window, and the same on a second worker.

use std::net::Ipv4Addr;
use std::time::Duration;

use accel::{Algorithm, EngineSpec, SecretBytes, Style};
use dataplane::command::{
    ApplyError, KeySource, PolicyAction, PolicySetup, SaCommand, SaSetup, WorkerCommand,
};
use dataplane::{
    DropReason, EthernetAddress, Gateway, GatewaySetup, Interface, InterfaceKind, LinkLayer, PacketPool,
    Port, Route, Verdict,
};
use smoltcp::wire::{IpProtocol, Ipv4Packet};
use spd_sad::{Ipv4Prefix, Lifetime, Mode, PolicyDirection, SaDirection, SaParams, Selector};

const ALG: Algorithm = Algorithm::Aes128Gcm16;
const T0: Duration = Duration::ZERO;

fn outer(a: bool) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, if a { 1 } else { 2 })
}

fn subnet(a: bool) -> Ipv4Prefix {
    Ipv4Prefix::new(Ipv4Addr::new(192, 168, if a { 1 } else { 2 }, 0), 24).expect("a /24")
}

fn interface(port: Port, address: Ipv4Addr, network: Ipv4Prefix, last: u8) -> Interface {
    Interface {
        port,
        kind: InterfaceKind::Ethernet,
        device: format!("{port}0"),
        address,
        network,
        mac: EthernetAddress([0x02, 0, 0, 0, 0, last]),
        mtu: 1500,
        address6: None,
    }
}

/// Site A (`a`) or B: an inside subnet, an outside address, the peer's
/// subnet routed via the peer; bare IPv4 frames.
fn setup(a: bool) -> GatewaySetup {
    let inside_address = Ipv4Addr::new(192, 168, if a { 1 } else { 2 }, 1);
    let outside_net = Ipv4Prefix::new(Ipv4Addr::new(10, 0, 0, 0), 24).expect("a /24");
    GatewaySetup {
        inside: interface(Port::Inside, inside_address, subnet(a), 1),
        outside: interface(Port::Outside, outer(a), outside_net, 2),
        routes: vec![Route {
            destination: subnet(!a),
            via: Some(outer(!a)),
            port: Port::Outside,
        }],
        routes6: Vec::new(),
        neighbors: Vec::new(),
        link: LinkLayer::RawIp,
        outer_ttl: 64,
        nat_keepalive: None,
        style: Style::Async,
        resolve_neighbors: false,
        answer_arp: true,
        inside_link: None,
        control_port: None,
        only_own_mac: false,
        neighbor_limits: Default::default(),
        icmp_limits: Default::default(),
    }
}

fn engine() -> Box<dyn accel::Engine> {
    accel::build_engine(&EngineSpec::default()).expect("the soft engine")
}

/// The SA `name` of site `a` in `direction`, keyed from `seed`.
fn sa(a: bool, name: &str, direction: SaDirection, spi: u32, seed: u8) -> SaSetup {
    let (local, remote) = (outer(a), outer(!a));
    let selectors = match direction {
        SaDirection::Inbound => vec![selector(subnet(!a), subnet(a))],
        SaDirection::Outbound => Vec::new(),
    };
    let key: Vec<u8> = (0..ALG.enc_key_len())
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect();
    SaSetup {
        params: SaParams {
            name: name.into(),
            direction,
            spi,
            mode: Mode::Tunnel,
            local: local.into(),
            remote: remote.into(),
            esn: false,
            replay_window: 64,
            lifetime: Lifetime::default(),
            encap: None,
            selectors,
        },
        algorithm: ALG,
        enc_key: SecretBytes::new(&key),
        auth_key: SecretBytes::new(&[]),
        initial_seq: 0,
        key_source: KeySource::File,
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

fn policy(name: &str, direction: PolicyDirection, selector: Selector, sa: &str) -> PolicySetup {
    PolicySetup {
        name: name.into(),
        direction,
        priority: 100,
        selector,
        action: PolicyAction::Protect(sa.into()),
    }
}

/// What installs the tunnel at site `a`: its SA pair (A sends on SPI
/// 0x1001, B on 0x1002), then the policies naming them.
fn tunnel(a: bool) -> Vec<SaCommand> {
    let (spi_out, spi_in) = if a { (0x1001, 0x1002) } else { (0x1002, 0x1001) };
    let (seed_out, seed_in) = if a { (1, 2) } else { (2, 1) };
    vec![
        SaCommand::InstallSa(Box::new(sa(a, "t-out", SaDirection::Outbound, spi_out, seed_out))),
        SaCommand::InstallSa(Box::new(sa(a, "t-in", SaDirection::Inbound, spi_in, seed_in))),
        SaCommand::InsertPolicy(policy(
            "t-out",
            PolicyDirection::Out,
            selector(subnet(a), subnet(!a)),
            "t-out",
        )),
        SaCommand::InsertPolicy(policy(
            "t-in",
            PolicyDirection::In,
            selector(subnet(!a), subnet(a)),
            "t-in",
        )),
    ]
}

fn site(a: bool) -> Gateway {
    Gateway::with_commands(setup(a), engine(), &tunnel(a), T0).expect("the tunnel installs")
}

/// A UDP packet from A's subnet to B's; `seed` varies its payload.
fn packet(seed: u8) -> Vec<u8> {
    let total = 20 + 8 + 32;
    let mut p = vec![0u8; total];
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
        ip.set_version(4);
        ip.set_header_len(20);
        ip.set_total_len(total as u16);
        ip.set_ident(u16::from(seed));
        ip.set_hop_limit(64);
        ip.set_next_header(IpProtocol::Udp);
        ip.set_src_addr(Ipv4Addr::new(192, 168, 1, 10));
        ip.set_dst_addr(Ipv4Addr::new(192, 168, 2, 20));
        ip.fill_checksum();
    }
    p[20..22].copy_from_slice(&4000u16.to_be_bytes());
    p[22..24].copy_from_slice(&5000u16.to_be_bytes());
    p[24..26].copy_from_slice(&40u16.to_be_bytes());
    for (i, b) in p[28..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_add(seed);
    }
    p
}

/// One frame through one gateway: its verdict and what it became.
fn run(gw: &mut Gateway, from: Port, frame: &[u8]) -> (Verdict, Vec<u8>) {
    let mut pool = PacketPool::new(8);
    let mut buf = pool.alloc().expect("a buffer");
    assert!(buf.fill(frame));
    let mut outputs = Vec::new();
    gw.handle_batch(T0, from, &mut vec![buf], &mut outputs, &mut pool);
    // The core never waits: the engine's completions are collected by
    // polling on the engine's own clock until nothing is in flight.
    let mut now = T0;
    for _ in 0..1000 {
        if gw.in_flight() == 0 {
            break;
        }
        now = gw.poll_timeout().unwrap_or(now).max(now);
        gw.poll(now, &mut outputs, &mut pool);
    }
    assert_eq!(outputs.len(), 1, "one frame in, one frame out");
    let (buf, verdict) = outputs.pop().expect("one output");
    (verdict, buf.data().to_vec())
}

/// Sends packet `seed` out of `gw` and returns its ESP frame's SPI and
/// sequence number, and the frame.
fn send(gw: &mut Gateway, seed: u8) -> (u32, u32, Vec<u8>) {
    let (verdict, esp) = run(gw, Port::Inside, &packet(seed));
    assert_eq!(
        verdict,
        Verdict::Forward(Port::Outside),
        "packet {seed} is protected"
    );
    assert_eq!(esp[9], 50, "ESP");
    let word = |at: usize| u32::from_be_bytes([esp[at], esp[at + 1], esp[at + 2], esp[at + 3]]);
    (word(20), word(24), esp)
}

/// `esp` through B: delivered inside as packet `seed`, or dropped.
fn receive(b: &mut Gateway, esp: &[u8], seed: u8) -> Result<(), DropReason> {
    let (verdict, inner) = run(b, Port::Outside, esp);
    match verdict {
        Verdict::Forward(Port::Inside) => {
            // Both gateways forwarded it: its TTL is down by two, and its
            // checksum redone.
            let mut expected = packet(seed);
            let mut ip = Ipv4Packet::new_unchecked(&mut expected[..]);
            ip.set_hop_limit(62);
            ip.fill_checksum();
            assert_eq!(inner, expected, "B delivers what A protected");
            Ok(())
        }
        Verdict::Drop(reason) => Err(reason),
        other => panic!("unexpected verdict {other:?}"),
    }
}

/// `command` on the first worker, and its copy on the second.
fn both(command: SaCommand, first: &mut Gateway, second: &mut Gateway) {
    for copy in first
        .apply_first(command, T0, 1)
        .expect("the first worker applies it")
    {
        second
            .apply_worker(copy, T0)
            .expect("the second worker applies its copy");
    }
}

fn apply(gw: &mut Gateway, commands: &[SaCommand]) {
    for command in commands {
        gw.apply(command, T0)
            .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    }
}

#[test]
fn a_tunnel_lives_through_commands_alone() {
    let (mut a, mut b) = (site(true), site(false));
    assert_eq!((a.sad().len(), a.spd().len()), (2, 2));

    // Installed: A protects with SPI 0x1001 from 1 on, B delivers.
    let mut sent = Vec::new();
    for seed in 1..=3 {
        let (spi, seq, esp) = send(&mut a, seed);
        assert_eq!((spi, seq), (0x1001, u32::from(seed)));
        receive(&mut b, &esp, seed).expect("B accepts A's ESP");
        sent.push(esp);
    }

    // A rekey, make-before-break: B takes the new inbound SA, A installs
    // its outbound one, moves its policy to it and removes the old one.
    apply(
        &mut b,
        &[SaCommand::InstallSa(Box::new(sa(
            false,
            "t-in.1",
            SaDirection::Inbound,
            0x2001,
            9,
        )))],
    );
    apply(
        &mut a,
        &[
            SaCommand::InstallSa(Box::new(sa(true, "t-out.1", SaDirection::Outbound, 0x2001, 9))),
            SaCommand::Repoint {
                policy: "t-out".into(),
                sa: "t-out.1".into(),
            },
            SaCommand::RemoveSa("t-out".into()),
        ],
    );
    assert!(a.sad().find("t-out").is_none(), "the old SA is gone");
    for seed in 4..=5 {
        let (spi, seq, esp) = send(&mut a, seed);
        assert_eq!(
            (spi, seq),
            (0x2001, u32::from(seed) - 3),
            "the new SA counts from 1"
        );
        receive(&mut b, &esp, seed).expect("B accepts the new SA's ESP");
        sent.push(esp);
    }

    // A replacement with the same keys (a reload that changed its
    // lifetime) takes over the counter and the replay window: A goes on
    // past every number the old SA sent (and the block it had reserved),
    // and B still refuses what it already accepted.
    let replacement = |a: bool, direction| {
        let mut new = sa(a, "t-out.1", direction, 0x2001, 9);
        if direction == SaDirection::Inbound {
            new.params.name = "t-in.1".into();
        }
        new.params.lifetime.hard.packets = Some(1000);
        Box::new(new)
    };
    apply(
        &mut a,
        &[
            SaCommand::ReplaceSa {
                old: "t-out.1".into(),
                new: replacement(true, SaDirection::Outbound),
            },
            // The policy named the old SA's id.
            SaCommand::Repoint {
                policy: "t-out".into(),
                sa: "t-out.1".into(),
            },
        ],
    );
    apply(
        &mut b,
        &[SaCommand::ReplaceSa {
            old: "t-in.1".into(),
            new: replacement(false, SaDirection::Inbound),
        }],
    );
    let (spi, seq, esp) = send(&mut a, 6);
    assert_eq!(spi, 0x2001);
    assert!(
        seq > 2 && u64::from(seq) <= 2 + spd_sad::SEQUENCE_BLOCK + 1,
        "the replaced SA continues its sequence numbers, not from 1: {seq}"
    );
    receive(&mut b, &esp, 6).expect("B accepts the next number");
    assert_eq!(
        receive(&mut b, &sent[4], 5),
        Err(DropReason::ReplayDuplicate),
        "B's replaced SA kept its replay window"
    );

    // Removed: A has no SA for its policy and drops; B's SA is gone too.
    apply(&mut a, &[SaCommand::RemoveSa("t-out.1".into())]);
    let (verdict, _) = run(&mut a, Port::Inside, &packet(7));
    assert!(matches!(verdict, Verdict::Drop(_)), "{verdict:?}");
    apply(
        &mut b,
        &[
            SaCommand::RemovePolicy("t-in".into()),
            SaCommand::RemoveSa("t-in.1".into()),
        ],
    );
    assert_eq!(
        (b.sad().len(), b.spd().len()),
        (2, 1),
        "B keeps t-out and t-in, and policy t-out"
    );
    assert!(
        receive(&mut b, &esp, 6).is_err(),
        "no SA takes SPI 0x2001 any more"
    );
}

#[test]
fn refusals_are_typed_and_change_nothing() {
    let mut a = site(true);
    let err = a
        .apply(
            &SaCommand::Repoint {
                policy: "nope".into(),
                sa: "t-out".into(),
            },
            T0,
        )
        .unwrap_err();
    assert!(matches!(&err, ApplyError::NoPolicy(p) if p == "nope"), "{err}");
    let err = a
        .apply(
            &SaCommand::SetSelectors {
                sa: "nope".into(),
                selectors: Vec::new(),
            },
            T0,
        )
        .unwrap_err();
    assert!(matches!(&err, ApplyError::NoSa(s) if s == "nope"), "{err}");
    // Keys of the wrong length: refused with the SA's name, never shown.
    let mut short = sa(true, "short", SaDirection::Outbound, 0x3001, 3);
    short.enc_key = SecretBytes::new(&[0x5a; 5]);
    let err = a
        .apply(&SaCommand::InstallSa(Box::new(short.clone())), T0)
        .unwrap_err();
    assert!(err.to_string().contains("SA `short`"), "{err}");
    assert!(a.sad().find("short").is_none());
    let shown = format!("{:?}", SaCommand::InstallSa(Box::new(short)));
    assert!(
        shown.contains("<redacted>") && !shown.contains("90, 90"),
        "{shown}"
    );
    // A policy naming an SA the gateway does not have discards.
    apply(
        &mut a,
        &[SaCommand::SetPolicyAction {
            policy: "t-out".into(),
            action: PolicyAction::Protect("missing".into()),
        }],
    );
    let (verdict, _) = run(&mut a, Port::Inside, &packet(1));
    assert!(matches!(verdict, Verdict::Drop(_)), "{verdict:?}");
}

/// Two workers: the first applies a command and hands the second its
/// copy; SAs arrive there as forks sharing one counter, and a
/// replacement keeps it on both.
#[test]
fn workers_share_the_sequence_of_installed_and_replaced_sas() {
    let mut first = site(true);
    let mut second = first.fork(engine()).expect("the fork registers every SA");
    both(
        SaCommand::InstallSa(Box::new(sa(true, "t-out.1", SaDirection::Outbound, 0x2001, 9))),
        &mut first,
        &mut second,
    );
    both(
        SaCommand::Repoint {
            policy: "t-out".into(),
            sa: "t-out.1".into(),
        },
        &mut first,
        &mut second,
    );
    let mut seqs = Vec::new();
    for seed in 0..4 {
        let gw = if seed % 2 == 0 { &mut first } else { &mut second };
        seqs.push(send(gw, seed).1);
    }
    assert_eq!(seqs, [1, 2, 3, 4], "one counter over both workers");

    let copies = first
        .apply_first(
            SaCommand::ReplaceSa {
                old: "t-out.1".into(),
                new: Box::new(sa(true, "t-out.1", SaDirection::Outbound, 0x2001, 9)),
            },
            T0,
            1,
        )
        .expect("the replacement applies");
    assert!(
        matches!(copies.as_slice(), [WorkerCommand::AdoptReplacing { old, .. }] if old == "t-out.1"),
        "{copies:?}"
    );
    for copy in copies {
        second.apply_worker(copy, T0).expect("the copy applies");
    }
    both(
        SaCommand::Repoint {
            policy: "t-out".into(),
            sa: "t-out.1".into(),
        },
        &mut first,
        &mut second,
    );
    for seed in 4..8 {
        let gw = if seed % 2 == 0 { &mut first } else { &mut second };
        seqs.push(send(gw, seed).1);
    }
    assert_eq!(
        seqs[4..],
        [5, 6, 7, 8],
        "the replacement goes on from the shared counter"
    );
}

/// One deadline: a driver that calls `handle_timeout` only when
/// `poll_timeout` says it is due still sees a time lifetime end within one
/// housekeeping period of its limit, and is not asked for more than that
/// while nothing else is due.
#[test]
fn a_driver_following_poll_timeout_alone_sees_a_lifetime_end_on_time() {
    use dataplane::gateway::HOUSEKEEPING;
    use spd_sad::{Limits, SaEvent};

    let mut short = sa(true, "t-out", SaDirection::Outbound, 0x1001, 1);
    short.params.lifetime = Lifetime {
        soft: Limits::default(),
        hard: Limits {
            seconds: Some(2),
            ..Limits::default()
        },
    };
    let mut commands = tunnel(true);
    commands[0] = SaCommand::InstallSa(Box::new(short));
    let mut gw = Gateway::with_commands(setup(true), engine(), &commands, T0).expect("the tunnel installs");
    let mut pool = PacketPool::new(8);
    let mut out = Vec::new();

    let (mut now, mut calls, mut expired_at) = (T0, 0u32, None);
    while now <= Duration::from_secs(3) && expired_at.is_none() {
        let due = gw
            .poll_timeout()
            .expect("SAs installed: housekeeping is always ahead");
        assert!(
            due >= now || calls == 0,
            "a deadline that was served moves past now ({due:?} at {now:?})"
        );
        now = due.max(now);
        gw.handle_timeout(now, &mut out, &mut pool);
        calls += 1;
        while let Some(event) = gw.poll_event() {
            if matches!(event, SaEvent::HardExpired(_)) {
                expired_at = Some(now);
            }
        }
        assert!(
            gw.poll_timeout().is_some_and(|next| next > now),
            "after handle_timeout({now:?}) nothing is due at once"
        );
    }
    let expired_at = expired_at.expect("the hard lifetime ended within 3 s");
    assert!(
        expired_at >= Duration::from_secs(2) && expired_at <= Duration::from_secs(2) + HOUSEKEEPING,
        "ended at {expired_at:?}"
    );
    let periods = (expired_at.as_millis() / HOUSEKEEPING.as_millis()) as u32;
    assert!(
        calls <= periods + 2,
        "{calls} calls in {expired_at:?}: only housekeeping was due"
    );
    assert!(out.is_empty(), "no traffic, nothing sent");
}
