//! Property test: gateway A's encapsulation followed by gateway B's
//! decapsulation is the identity (up to the two TTL decrements), for any
//! inner packet, every algorithm, mode, ESN setting, engine (`soft`, `sec`)
//! and submission style; flipping any one bit of the ESP part (SPI,
//! sequence number, IV, ciphertext, ICV) makes B refuse the packet; and
//! every buffer goes back to the pool.
//!
//! Building a pair of gateways (and, for `sec`, its channel threads) costs
//! far more than a packet, so the test loops over the 168 combinations,
//! builds one pair for each and runs a proptest `TestRunner` over packets
//! through it. The cases are spread evenly over the combinations:
//! `PROPTEST_CASES` sets the total (default 2016, twelve per combination;
//! `PROPTEST_CASES=20000` gives 120 per combination).

mod common;

use std::cell::RefCell;
use std::net::Ipv4Addr;

use accel::{Algorithm, EngineKind, EngineSpec, Style};
use common::*;
use dataplane::{DropReason, Port, Verdict};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use smoltcp::wire::Ipv4Packet;

/// Cases in total when `PROPTEST_CASES` is not set.
const DEFAULT_TOTAL_CASES: u32 = 2016;

/// An inner IPv4 packet, field by field.
#[derive(Debug, Clone)]
struct Inner {
    src_host: u8,
    dst_host: u8,
    protocol: u8,
    ttl: u8,
    tos: u8,
    ident: u16,
    dont_frag: bool,
    /// IP options (a multiple of four bytes).
    options: Vec<u8>,
    /// Everything after the IP header: for TCP/UDP/SCTP its first four
    /// bytes are the ports.
    payload: Vec<u8>,
}

impl Inner {
    fn bytes(&self) -> Vec<u8> {
        let header_len = 20 + self.options.len();
        let total = header_len + self.payload.len();
        let mut p = vec![0u8; total];
        p[20..header_len].copy_from_slice(&self.options);
        p[header_len..].copy_from_slice(&self.payload);
        let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
        ip.set_version(4);
        ip.set_header_len(header_len as u8);
        ip.set_dscp(self.tos >> 2);
        ip.set_ecn(self.tos & 3);
        ip.set_total_len(total as u16);
        ip.set_ident(self.ident);
        ip.set_dont_frag(self.dont_frag);
        ip.set_hop_limit(self.ttl);
        ip.set_next_header(self.protocol.into());
        ip.set_src_addr(Ipv4Addr::new(192, 168, 1, self.src_host));
        ip.set_dst_addr(Ipv4Addr::new(192, 168, 2, self.dst_host));
        ip.fill_checksum();
        p
    }
}

/// Protocols worth naming, and any other number.
const PROTOCOLS: [u8; 8] = [6, 17, 1, 132, 47, 50, 4, 41];

fn inner(mode: &str) -> impl Strategy<Value = Inner> {
    let transport = mode == "transport";
    let protocol = prop_oneof![
        3 => prop::sample::select(&PROTOCOLS[..]),
        1 => any::<u8>(),
    ]
    // RFC 4303 §2.6: next header 59 in the ESP trailer marks a dummy
    // packet, which the receiver discards. In transport mode the trailer
    // carries the inner protocol, so protocol 59 cannot be carried.
    .prop_filter("protocol 59 is ESP's dummy marker", move |p| {
        !(transport && *p == 59)
    });
    let payload_len = prop_oneof![
        1 => 0usize..=64,
        3 => 0usize..=1480,
        1 => 1440usize..=1480,
    ];
    (
        // .1 is each gateway's inside address, .255 the broadcast.
        2u8..=254,
        2u8..=254,
        protocol,
        // Two hops take two off; a TTL of 1 or 2 is time-exceeded, tested
        // elsewhere.
        3u8..=255,
        any::<u8>(),
        any::<u16>(),
        any::<bool>(),
        prop_oneof![3 => Just(0usize), 1 => 1usize..=10],
        payload_len,
    )
        .prop_flat_map(
            |(src_host, dst_host, protocol, ttl, tos, ident, dont_frag, option_words, payload_len)| {
                // Options are NOPs and an end-of-list: the gateways copy,
                // never interpret them.
                let options = prop::collection::vec(prop_oneof![Just(1u8), Just(0u8)], option_words * 4);
                // Keep the whole inner packet within 1500 bytes.
                let payload_len = payload_len.min(1480 - option_words * 4);
                (options, prop::collection::vec(any::<u8>(), payload_len)).prop_map(
                    move |(options, payload)| Inner {
                        src_host,
                        dst_host,
                        protocol,
                        ttl,
                        tos,
                        ident,
                        dont_frag,
                        options,
                        payload,
                    },
                )
            },
        )
}

/// One case: an inner packet and which bit of the ESP part to flip.
fn case(mode: &str) -> impl Strategy<Value = (Inner, prop::sample::Index)> {
    (inner(mode), any::<prop::sample::Index>())
}

fn engine(kind: EngineKind) -> EngineSpec {
    EngineSpec {
        kind,
        ..EngineSpec::default()
    }
}

/// Runs one case through `pair`; `Err` describes what went wrong.
fn round_trip(
    pair: &mut Pair,
    alg: Algorithm,
    mode: &str,
    packet: &[u8],
    flip: prop::sample::Index,
) -> Result<(), TestCaseError> {
    let (verdict, esp) = pair.encapsulate(packet);
    prop_assert_eq!(verdict, Verdict::Forward(Port::Outside), "A must encapsulate");
    // Tunnel mode puts a 20-byte outer header in front of ESP; transport
    // mode keeps the packet's own, options included.
    let at = usize::from(esp[0] & 0x0f) * 4;
    let expected_at = if mode == "tunnel" {
        20
    } else {
        usize::from(packet[0] & 0x0f) * 4
    };
    prop_assert_eq!(at, expected_at, "outer header length");
    prop_assert!(esp.len() > at + 8);
    prop_assert_eq!(esp[9], 50, "ESP follows the outer header");
    // Null protects nothing: a flipped bit there may well be accepted.
    if alg != Algorithm::Null {
        let bit = flip.index((esp.len() - at) * 8);
        let mut bad = esp.clone();
        bad[at + bit / 8] ^= 0x80 >> (bit % 8);
        let (verdict, _) = pair.decapsulate(&bad);
        // A flipped SPI names no SA: in tunnel mode the packet is
        // addressed to B, which counts an unknown SPI; in transport mode it
        // is addressed to the host behind B, so it is transit ESP, which
        // B's inbound policy for that traffic refuses as not having come
        // through the SA. A flipped sequence number may be read as a
        // replay; everything else fails the ICV.
        let expected: &[DropReason] = match bit / 8 {
            0..=3 if mode == "tunnel" => &[DropReason::UnknownSpi],
            0..=3 => &[DropReason::PolicyMismatch],
            4..=7 => &[
                DropReason::AuthFailed,
                DropReason::ReplayDuplicate,
                DropReason::ReplayTooOld,
                DropReason::SeqZero,
            ],
            _ => &[DropReason::AuthFailed],
        };
        prop_assert!(
            matches!(verdict, Verdict::Drop(reason) if expected.contains(&reason)),
            "bit {} of the ESP part flipped: {:?}",
            bit,
            verdict
        );
        prop_assert_eq!(pair.pool.in_use(), 0, "a refused packet's buffer comes back");
    }
    // The refused copy did not move B's window: the authentic packet passes.
    let (verdict, out) = pair.decapsulate(&esp);
    prop_assert_eq!(verdict, Verdict::Forward(Port::Inside), "B must decapsulate");
    prop_assert_eq!(
        out,
        after_hops(packet, 2),
        "B forwards the packet A took in, two hops on"
    );
    prop_assert_eq!(pair.pool.in_use(), 0, "every buffer comes back to the pool");
    prop_assert_eq!(pair.a.in_flight() + pair.b.in_flight(), 0);
    Ok(())
}

#[test]
fn encapsulation_then_decapsulation_is_the_identity() {
    let mut combos = Vec::new();
    for alg in Algorithm::ALL {
        for mode in ["tunnel", "transport"] {
            for esn in [false, true] {
                for kind in [EngineKind::Soft, EngineKind::Sec]
                    .into_iter()
                    .filter(|k| engine_runs(*k, alg))
                {
                    for style in Style::ALL {
                        combos.push((alg, mode, esn, kind, style));
                    }
                }
            }
        }
    }
    let total = match std::env::var_os("PROPTEST_CASES") {
        Some(_) => Config::default().cases,
        None => DEFAULT_TOTAL_CASES,
    };
    let combos_len = combos.len();
    let per_combo = total.div_ceil(combos_len as u32).max(1);
    let mut ran = 0;
    for (alg, mode, esn, kind, style) in combos {
        let what = format!("{alg} {mode} esn={esn} {kind} {style}");
        let mut pair = Pair::on(alg, mode, esn, &engine(kind), style);
        if esn {
            // Start just below 2^32, so the cases cross into the next
            // subspace and the ICV covers inferred high bits of 1.
            let start = u64::from(u32::MAX) - 2;
            let out = pair.a.sad().find("t-out").unwrap();
            pair.a.sad_mut().get_mut(out).unwrap().set_last_sequence(start);
            let inbound = pair.b.sad().find("t-in").unwrap();
            pair.b.sad_mut().get_mut(inbound).unwrap().set_replay_top(start);
        }
        let pair = RefCell::new(pair);
        let mut runner = TestRunner::new(Config {
            cases: per_combo,
            failure_persistence: None,
            max_shrink_iters: 4096,
            ..Config::default()
        });
        let result = runner.run(&case(mode), |(inner, flip)| {
            round_trip(&mut pair.borrow_mut(), alg, mode, &inner.bytes(), flip)
        });
        if let Err(e) = result {
            panic!("{what}: {e}");
        }
        let pair = pair.into_inner();
        let (a, b) = (pair.a.stats(), pair.b.stats());
        assert!(a.balanced() && b.balanced(), "{what}: stats balance");
        assert_eq!(a.drops.total(), 0, "{what}: A dropped nothing");
        assert_eq!(
            b.decapsulated, a.encapsulated,
            "{what}: B took every packet A sent"
        );
        let flipped = if alg == Algorithm::Null {
            0
        } else {
            u64::from(per_combo)
        };
        assert_eq!(
            b.drops.total(),
            flipped,
            "{what}: B refused exactly the tampered copies"
        );
        ran += per_combo;
    }
    eprintln!("{ran} cases over {} combinations", combos_len);
}
