//! Several workers, one SA: forked gateways give out unique sequence
//! numbers, count lifetimes together, and the peer accepts everything.

mod common;

use std::collections::HashSet;

use accel::{Algorithm, EngineSpec};
use common::*;
use dataplane::{DropReason, Port, Verdict};
use ike_stub::builder::{Encap, LifetimeBuilder};

#[test]
fn forked_workers_share_sequence_numbers_and_lifetimes() {
    let mut pair = Pair::new(Algorithm::Aes128Gcm16, "tunnel", false);
    let mut forks: Vec<_> = (0..3)
        .map(|_| {
            pair.a
                .fork(accel::build_engine(&EngineSpec::default()).unwrap())
                .expect("the fork registers every SA")
        })
        .collect();
    // Four workers encapsulating concurrently, as threads would.
    let packets: Vec<Vec<u8>> = (0..400)
        .map(|i| udp_packet(HOST_A, HOST_B, 64, i as u8))
        .collect();
    let esp: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        let chunks: Vec<Vec<Vec<u8>>> = packets.chunks(100).map(|c| c.to_vec()).collect();
        let mut workers: Vec<&mut dataplane::Gateway> = vec![&mut pair.a];
        workers.extend(forks.iter_mut());
        for (gateway, chunk) in workers.into_iter().zip(chunks) {
            handles.push(scope.spawn(move || {
                let mut pool = dataplane::PacketPool::new(4);
                chunk
                    .iter()
                    .map(|p| {
                        let (verdict, bytes) =
                            run(gateway, &mut pool, std::time::Duration::ZERO, Port::Inside, p);
                        assert_eq!(verdict, Verdict::Forward(Port::Outside));
                        bytes
                    })
                    .collect::<Vec<_>>()
            }));
        }
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let seqs: HashSet<u32> = esp
        .iter()
        .map(|e| u32::from_be_bytes([e[24], e[25], e[26], e[27]]))
        .collect();
    assert_eq!(seqs.len(), 400, "every sequence number is used once");
    // Shared by several workers, the counter hands out one number at a
    // time: none is skipped, so none comes out behind the others' by a
    // reserved block.
    assert_eq!(seqs.iter().max(), Some(&400));
    // Put in sequence order (the wire between workers and peer can
    // reorder only within the window), the peer accepts every one.
    let mut sorted = esp.clone();
    sorted.sort_by_key(|e| u32::from_be_bytes([e[24], e[25], e[26], e[27]]));
    for frame in &sorted {
        let (verdict, _) = pair.decapsulate(frame);
        assert_eq!(verdict, Verdict::Forward(Port::Inside));
    }
    assert_eq!(pair.b.stats().decapsulated, 400);
    // Usage counts every worker's packets once each has added its share,
    // at the latest at its next tick.
    let mut pool = dataplane::PacketPool::new(4);
    let mut out = Vec::new();
    for gateway in std::iter::once(&mut pair.a).chain(forks.iter_mut()) {
        gateway.handle_timeout(std::time::Duration::ZERO, &mut out, &mut pool);
    }
    let sa = pair.a.sad().get(pair.a.sad().find("t-out").unwrap()).unwrap();
    assert_eq!(sa.counters().packets, 400);
}

#[test]
fn a_hard_packet_limit_holds_across_workers() {
    let mut pair = Pair::edited(Algorithm::Aes128Sha1, "tunnel", false, |c| {
        c.tunnels[0].lifetime = Some(LifetimeBuilder {
            hard_packets: Some(10),
            ..LifetimeBuilder::default()
        });
    });
    let mut fork = pair
        .a
        .fork(accel::build_engine(&EngineSpec::default()).unwrap())
        .expect("the fork registers every SA");
    let mut pool = dataplane::PacketPool::new(4);
    let packet = udp_packet(HOST_A, HOST_B, 20, 0);
    let mut sent = 0;
    for i in 0..20 {
        let gateway = if i % 2 == 0 { &mut pair.a } else { &mut fork };
        let (verdict, _) = run(
            gateway,
            &mut pool,
            std::time::Duration::ZERO,
            Port::Inside,
            &packet,
        );
        match verdict {
            Verdict::Forward(_) => sent += 1,
            Verdict::Drop(reason) => assert_eq!(reason, DropReason::SaExpired),
            Verdict::Consumed | Verdict::Control => panic!("not for the gateway"),
        }
    }
    assert_eq!(sent, 10, "ten packets over both workers, then the SA is spent");
}

/// SAs the control plane installs later (a rekey, a reload) reach the other
/// workers as forks of the first worker's: one sequence counter, one usage.
#[test]
fn sas_installed_later_are_shared_by_every_worker() {
    use dataplane::command::{SaCommand, WorkerCommand};
    use std::time::Duration;

    let text = tunnel_config(Algorithm::Aes128Gcm16, "tunnel", false, true);
    let config = ike_stub::Config::parse(std::path::Path::new("t.toml"), &text).unwrap();
    let mut first = gateway_from(&text);
    let mut second = first
        .fork(accel::build_engine(&EngineSpec::default()).unwrap())
        .expect("the fork registers every SA");
    // A replacement for the outbound SA, as a rekey installs it.
    let mut sa = config.sa("t-out").unwrap().clone();
    sa.params.name = "t-out.1".into();
    sa.params.spi = 0x4444;
    let commands = [
        SaCommand::InstallSa(Box::new(sa.setup())),
        SaCommand::Repoint {
            policy: "t-out".into(),
            sa: "t-out.1".into(),
        },
    ];
    for command in commands {
        for copy in first.apply_first(command, Duration::ZERO, 1).unwrap() {
            assert!(matches!(copy, WorkerCommand::Adopt(_) | WorkerCommand::Apply(_)));
            second.apply_worker(copy, Duration::ZERO).unwrap();
        }
    }
    let mut pool = dataplane::PacketPool::new(4);
    let mut seqs = Vec::new();
    for i in 0..10u8 {
        let gateway = if i % 2 == 0 { &mut first } else { &mut second };
        let (verdict, esp) = run(
            gateway,
            &mut pool,
            Duration::ZERO,
            Port::Inside,
            &udp_packet(HOST_A, HOST_B, 64, i),
        );
        assert_eq!(verdict, Verdict::Forward(Port::Outside));
        assert_eq!(u32::from_be_bytes([esp[20], esp[21], esp[22], esp[23]]), 0x4444);
        seqs.push(u32::from_be_bytes([esp[24], esp[25], esp[26], esp[27]]));
    }
    // Each worker draws from its own block of the shared counter: no number
    // twice, and each worker's in order.
    let (firsts, seconds): (Vec<_>, Vec<_>) = seqs.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    for own in [firsts, seconds] {
        assert!(own.windows(2).all(|w| w[0].1 < w[1].1), "{seqs:?}");
    }
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        10,
        "the workers share the new SA's counter: {seqs:?}"
    );
    let mut out = Vec::new();
    for gateway in [&mut first, &mut second] {
        gateway.handle_timeout(Duration::ZERO, &mut out, &mut pool);
    }
    for gateway in [&first, &second] {
        let sad = gateway.sad();
        let sa = sad.get(sad.find("t-out.1").unwrap()).unwrap();
        assert_eq!(sa.counters().packets, 10);
    }
}

/// Placed workers (`espgw run` steers each outbound SA's packets to its
/// owner): the owner reserves sequence blocks, and SAs installed later
/// (a rekey) are placed too; the other worker, which sends only what the
/// gateway generates itself, takes one number at a time from beyond the
/// owner's block, and no two workers' outer IPv4 IDs are ever equal.
#[test]
fn placed_workers_keep_sequence_blocks_and_ip_ids_apart() {
    use std::collections::HashSet;
    use std::time::Duration;

    let mut pair = Pair::new(Algorithm::Aes128Gcm16, "tunnel", false);
    let mut fork = pair
        .a
        .fork(accel::build_engine(&EngineSpec::default()).unwrap())
        .expect("the fork registers every SA");
    pair.a.place(0, 2);
    fork.place(1, 2);
    let sad = pair.a.sad();
    let params = sad.get(sad.find("t-out").unwrap()).unwrap().params().clone();
    let owner = spd_sad::owner_worker(params.local, params.remote, 2);
    let (owner_gw, other_gw) = if owner == 0 {
        (&mut pair.a, &mut fork)
    } else {
        (&mut fork, &mut pair.a)
    };
    let mut pool = dataplane::PacketPool::new(4);
    let mut send = |gateway: &mut dataplane::Gateway, i: u8| {
        let (verdict, esp) = run(
            gateway,
            &mut pool,
            Duration::ZERO,
            Port::Inside,
            &udp_packet(HOST_A, HOST_B, 64, i),
        );
        assert_eq!(verdict, Verdict::Forward(Port::Outside));
        (
            u32::from_be_bytes([esp[24], esp[25], esp[26], esp[27]]),
            u16::from_be_bytes([esp[4], esp[5]]),
        )
    };
    let (mut owner_ids, mut other_ids) = (HashSet::new(), HashSet::new());
    let mut owner_seqs = Vec::new();
    for i in 0..10 {
        let (seq, id) = send(owner_gw, i);
        owner_seqs.push(seq);
        owner_ids.insert(id);
    }
    assert_eq!(owner_seqs, (1..=10).collect::<Vec<u32>>());
    let (seq, id) = send(other_gw, 10);
    assert_eq!(
        seq,
        spd_sad::SEQUENCE_BLOCK as u32 + 1,
        "the other worker takes the number after the owner's block"
    );
    other_ids.insert(id);
    assert_eq!(send(owner_gw, 11).0, 11, "the owner goes on in its block");
    for i in 0..40 {
        owner_ids.insert(send(owner_gw, i).1);
        other_ids.insert(send(other_gw, i).1);
    }
    assert!(owner_ids.is_disjoint(&other_ids), "{owner_ids:?} {other_ids:?}");
    for (worker, ids) in [(owner, &owner_ids), (1 - owner, &other_ids)] {
        assert!(
            ids.iter().all(|id| usize::from(*id) % 2 == (worker + 1) % 2),
            "worker {worker}: {ids:?}"
        );
    }
    // Only the owner's copy is the owner, and an SA installed later (as a
    // rekey installs it, through `Sad::adopt`) is placed as well.
    for (gateway, expected) in [(&pair.a, owner == 0), (&fork, owner == 1)] {
        let sad = gateway.sad();
        assert_eq!(
            sad.get(sad.find("t-out").unwrap()).unwrap().owner(),
            Some(expected)
        );
    }
    let mut rekeyed = spd_sad::SaParams {
        name: "t-out.1".into(),
        spi: 0x4444,
        ..params
    };
    rekeyed.selectors.clear();
    let mut fresh: spd_sad::Sad<()> = spd_sad::Sad::new();
    fresh.place(owner, 2);
    let id = fresh.insert(rekeyed, (), Duration::ZERO).unwrap();
    assert_eq!(
        fresh.get(id).unwrap().owner(),
        Some(true),
        "a rekeyed SA keeps its owner"
    );
}

/// Each inbound SA has one replay window, at the worker that owns its SPI:
/// the outside steering sends the SA's packets there, and another
/// worker's copy refuses them rather than check them against a second
/// window that has not seen their sequence numbers (which would let a
/// replay with a spoofed source, hashed to another worker, through).
#[test]
fn an_inbound_sa_is_checked_by_one_replay_window_only() {
    for encap in [None, Some(Encap::Udp)] {
        let mut pair = Pair::edited(Algorithm::Aes128Gcm16, "tunnel", false, |c| {
            c.tunnels[0].encap = encap;
        });
        let mut fork = pair
            .b
            .fork(accel::build_engine(&EngineSpec::default()).unwrap())
            .expect("the fork registers every SA");
        pair.b.place(0, 2);
        fork.place(1, 2);
        let spi = pair
            .b
            .sad()
            .get(pair.b.sad().find("t-in").unwrap())
            .unwrap()
            .params()
            .spi;
        let owner = spd_sad::inbound_owner(spi, 2);
        let mut pool = dataplane::PacketPool::new(4);
        let frames: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let (verdict, frame) = pair.encapsulate(&udp_packet(HOST_A, HOST_B, 64, i));
                assert_eq!(verdict, Verdict::Forward(Port::Outside));
                frame
            })
            .collect();
        let (owning, other) = if owner == 0 {
            (&mut pair.b, &mut fork)
        } else {
            (&mut fork, &mut pair.b)
        };
        let now = std::time::Duration::ZERO;
        for frame in &frames {
            let (verdict, _) = run(owning, &mut pool, now, Port::Outside, frame);
            assert_eq!(verdict, Verdict::Forward(Port::Inside), "{encap:?}");
        }
        // A replay at the owner is a duplicate; at the other worker, whose
        // window never saw it, it is refused all the same.
        let (verdict, _) = run(owning, &mut pool, now, Port::Outside, &frames[1]);
        assert_eq!(verdict, Verdict::Drop(DropReason::ReplayDuplicate), "{encap:?}");
        for frame in &frames {
            let (verdict, _) = run(other, &mut pool, now, Port::Outside, frame);
            assert_eq!(verdict, Verdict::Drop(DropReason::NotOwner), "{encap:?}");
        }
        assert_eq!(other.stats().decapsulated, 0);
    }
}
