//! Micro-benchmarks of the pieces every packet goes through: SPD lookup,
//! SAD lookup by SPI, the anti-replay window, and one soft-engine crypto
//! descriptor per algorithm.
//!
//! Ids:
//! * `spd_lookup/{match,miss}/<policies>`: outbound lookup by the
//!   tuple-space index alone (`Spd::lookup`, what a flow-cache miss costs
//!   before the cache is filled); `match` hits a policy near the end of the
//!   list (the worst case for a linear SPD), `miss` falls through to the
//!   default discard.
//! * `spd_lookup/{cache_hit,cache_miss}/<policies>`: the dataplane's call,
//!   `Spd::lookup_cached`; `cache_hit` repeats one flow, `cache_miss`
//!   cycles through 65,536 flows (16 x the cache) matching that same
//!   policy, so that every lookup misses and refills an entry.
//! * `spd_lookup/linear_match/<policies>`: the first-match scan over the
//!   ordered list that the index replaced, for comparison (at 100,000 only
//!   with `SPD_LINEAR_100K=1`: it takes hundreds of microseconds).
//! * `sad_lookup_inbound/{hit,miss}/<sas>`: `Sad<()>::lookup_inbound`.
//! * `replay/{in-order,reordered}/w<size>[-esn]`: one `check` + `update`
//!   per sequence number.
//! * `soft_encrypt/<algorithm>/<payload bytes>`: `accel::primitive::process`
//!   with a single-pass encrypt descriptor laid out as in
//!   `bench::measure::raw_crypto`.
//!
//! Quick run on a small shared box:
//! `cargo bench -p bench --bench micro -- --warm-up-time 1 --measurement-time 1`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use accel::{Algorithm, Descriptor, DescriptorKind, Direction, Region, Session, Status};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use spd_sad::{
    Action, FlowKey, Ipv4Prefix, Lifetime, Mode, Policy, PolicyDirection, PortRange, ProtocolSelector,
    ReplayWindow, SaDirection, SaId, SaParams, Sad, Selector, Spd,
};

const TABLE_SIZES: [usize; 3] = [10, 1_000, 100_000];

/// A small deterministic generator (xorshift64*), so every run builds the
/// same tables without pulling in `rand`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random prefix inside 10.0.0.0/8 of length 16, 24, 28 or 32.
fn random_prefix(rng: &mut Rng) -> Ipv4Prefix {
    let len = [16u8, 24, 28, 32][rng.below(4) as usize];
    let addr = 0x0a00_0000 | (rng.next() as u32 & 0x00ff_ffff);
    let mask = u32::MAX << (32 - u32::from(len));
    Ipv4Prefix::new(Ipv4Addr::from(addr & mask), len).expect("masked prefix")
}

fn random_ports(rng: &mut Rng) -> PortRange {
    match rng.below(3) {
        0 => PortRange::ANY,
        1 => {
            let port = 1 + rng.below(65_535) as u16;
            PortRange {
                first: port,
                last: port,
            }
        }
        _ => {
            let first = 1024 + rng.below(60_000) as u16;
            PortRange {
                first,
                last: first + rng.below(1_000) as u16,
            }
        }
    }
}

/// `n` outbound policies with random selectors, all at one priority so
/// that they are consulted in insertion order.
fn random_spd(n: usize, rng: &mut Rng) -> Spd {
    let mut spd = Spd::new();
    for i in 0..n {
        let protocol = match rng.below(3) {
            0 => ProtocolSelector::Any,
            1 => ProtocolSelector::Number(spd_sad::proto::UDP),
            _ => ProtocolSelector::Number(spd_sad::proto::TCP),
        };
        spd.insert(Policy {
            name: format!("p{i}"),
            direction: PolicyDirection::Out,
            priority: 100,
            selector: Selector {
                src: random_prefix(rng).into(),
                dst: random_prefix(rng).into(),
                protocol,
                src_ports: random_ports(rng),
                dst_ports: random_ports(rng),
            },
            action: if i % 2 == 0 {
                Action::Protect(SaId(i as u32))
            } else {
                Action::Bypass
            },
        });
    }
    spd
}

/// Adding a policy in front of all the others and removing it again: the
/// control plane's cost per policy change, which must not grow with the
/// table (a rekey storm or a tunnel set-up at a hub with 100,000 policies).
fn spd_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("spd_update");
    for n in TABLE_SIZES {
        let mut rng = Rng::new(0x5bd1_e995 ^ n as u64);
        let mut spd = random_spd(n, &mut rng);
        let front = Policy {
            name: "front".into(),
            direction: PolicyDirection::Out,
            priority: 1,
            selector: Selector {
                src: random_prefix(&mut rng).into(),
                dst: random_prefix(&mut rng).into(),
                protocol: ProtocolSelector::Any,
                src_ports: PortRange::ANY,
                dst_ports: PortRange::ANY,
            },
            action: Action::Bypass,
        };
        group.bench_function(BenchmarkId::new("insert_remove_front", n), |b| {
            b.iter(|| {
                spd.insert(black_box(front.clone()));
                spd.remove("front").expect("just inserted")
            })
        });
    }
    group.finish();
}

/// The benchmark's prefixes are IPv4 (`random_prefix`).
fn v4(prefix: spd_sad::IpPrefix) -> spd_sad::Ipv4Prefix {
    match prefix {
        spd_sad::IpPrefix::V4(p) => p,
        other => panic!("an IPv4 benchmark prefix, not {other}"),
    }
}

/// A flow that the policy's selector matches (its first address and port).
fn flow_for(selector: &Selector) -> FlowKey {
    let protocol = match selector.protocol {
        ProtocolSelector::Any => spd_sad::proto::UDP,
        ProtocolSelector::Number(n) => n,
    };
    FlowKey {
        src: v4(selector.src).addr().into(),
        dst: v4(selector.dst).addr().into(),
        protocol,
        ports: Some((selector.src_ports.first, selector.dst_ports.first)),
    }
}

fn spd_lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("spd_lookup");
    for n in TABLE_SIZES {
        let mut rng = Rng::new(0x5bd1_e995 ^ n as u64);
        let spd = random_spd(n, &mut rng);
        let policies: Vec<(u64, &Policy)> = spd.numbered(PolicyDirection::Out).collect();
        // The last policy that is not shadowed by an earlier one: with random
        // selectors that is almost always the very last.
        let (index, flow) = (0..n)
            .rev()
            .map(|i| (i, flow_for(&policies[i].1.selector)))
            .find(|(i, flow)| spd.lookup(PolicyDirection::Out, flow).policy == Some(policies[*i].0))
            .expect("some policy is reachable");
        assert!(
            index + 10 >= n,
            "matching policy {index} of {n} is not near the end"
        );
        // 172.16.0.0/12 is outside every generated prefix.
        let miss = FlowKey {
            src: Ipv4Addr::new(172, 16, 1, 10).into(),
            dst: Ipv4Addr::new(172, 17, 2, 20).into(),
            protocol: spd_sad::proto::UDP,
            ports: Some((4000, 5000)),
        };
        assert_eq!(spd.lookup(PolicyDirection::Out, &miss).policy, None);
        group.bench_with_input(BenchmarkId::new("match", n), &flow, |b, flow| {
            b.iter(|| spd.lookup(PolicyDirection::Out, black_box(flow)))
        });
        group.bench_with_input(BenchmarkId::new("miss", n), &miss, |b, flow| {
            b.iter(|| spd.lookup(PolicyDirection::Out, black_box(flow)))
        });
        let mut cached = spd.clone();
        group.bench_with_input(BenchmarkId::new("cache_hit", n), &flow, |b, flow| {
            b.iter(|| cached.lookup_cached(PolicyDirection::Out, black_box(flow)))
        });
        // Same policy, different source ports where its selector allows
        // them, else different source addresses inside its prefix.
        let selector = policies[index].1.selector;
        let flows: Vec<FlowKey> = (0..65_536u32)
            .map(|i| {
                let mut f = flow;
                if selector.src_ports.is_any() {
                    f.ports = f.ports.map(|(_, dp)| (i as u16, dp));
                } else if selector.src.len() <= 16 {
                    let src = v4(selector.src);
                    f.src = Ipv4Addr::from(u32::from(src.addr()) | (i & !src.mask())).into();
                } else {
                    f.dst = Ipv4Addr::from(i.wrapping_mul(2_654_435_761)).into();
                    f.ports = Some((f.ports.map_or(0, |p| p.0), i as u16));
                }
                f
            })
            .collect();
        let mut at = 0usize;
        group.bench_function(BenchmarkId::new("cache_miss", n), |b| {
            b.iter(|| {
                at = (at + 1) & 0xffff;
                cached.lookup_cached(PolicyDirection::Out, black_box(&flows[at]))
            })
        });
        // (at 0 when a filter left the benchmark out, since its loop did not run)
        assert!(
            at == 0 || cached.cache_stats().misses > 0,
            "cache_miss missed the cache"
        );
        if n <= 1_000 || std::env::var_os("SPD_LINEAR_100K").is_some() {
            let ordered: Vec<Policy> = policies.iter().map(|(_, p)| (*p).clone()).collect();
            group.bench_with_input(BenchmarkId::new("linear_match", n), &flow, |b, flow| {
                b.iter(|| ordered.iter().position(|p| p.selector.matches(black_box(flow))))
            });
        }
    }
    group.finish();
}

fn sad_lookup(c: &mut Criterion) {
    let local = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let mut group = c.benchmark_group("sad_lookup_inbound");
    for n in TABLE_SIZES {
        let mut rng = Rng::new(0x9e37_79b9 ^ n as u64);
        let mut sad: Sad<()> = Sad::new();
        let mut spis = std::collections::HashSet::with_capacity(n);
        while spis.len() < n {
            spis.insert(256 + rng.below(u64::from(u32::MAX - 256)) as u32);
        }
        // Insertion order is not the probe order: probe a random SPI of the set.
        let spis: Vec<u32> = spis.into_iter().collect();
        for (i, &spi) in spis.iter().enumerate() {
            let params = SaParams {
                name: format!("sa{i}"),
                direction: SaDirection::Inbound,
                spi,
                mode: Mode::Tunnel,
                local,
                remote: Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8).into(),
                esn: false,
                replay_window: 64,
                lifetime: Lifetime::default(),
                encap: None,
                selectors: vec![Selector::ANY],
            };
            sad.insert(params, (), Duration::ZERO).expect("insert SA");
        }
        let hit = spis[rng.below(n as u64) as usize];
        let miss = (256..).find(|spi| !spis.contains(spi)).expect("an unused SPI");
        assert!(sad.lookup_inbound(hit, local).is_some());
        assert!(sad.lookup_inbound(miss, local).is_none());
        group.bench_with_input(BenchmarkId::new("hit", n), &hit, |b, &spi| {
            b.iter(|| sad.lookup_inbound(black_box(spi), black_box(local)))
        });
        group.bench_with_input(BenchmarkId::new("miss", n), &miss, |b, &spi| {
            b.iter(|| sad.lookup_inbound(black_box(spi), black_box(local)))
        });
    }
    group.finish();
}

/// Offsets 0..len, shuffled within blocks of 32 when `reorder`: every
/// packet arrives at most 31 places from its turn, well inside a
/// 64-packet window, and none is lost or duplicated.
fn sequence_pattern(len: usize, reorder: bool) -> Vec<u64> {
    let mut pattern: Vec<u64> = (0..len as u64).collect();
    if reorder {
        let mut rng = Rng::new(0x2545_f491);
        for block in pattern.chunks_mut(32) {
            for i in (1..block.len()).rev() {
                block.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
    }
    pattern
}

fn replay(c: &mut Criterion) {
    const PATTERN: usize = 1 << 14;
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(1));
    for (stream, reorder) in [("in-order", false), ("reordered", true)] {
        let pattern = sequence_pattern(PATTERN, reorder);
        for size in [64u32, 4096] {
            for esn in [false, true] {
                let id = format!("w{size}{}", if esn { "-esn" } else { "" });
                group.bench_function(BenchmarkId::new(stream, id), |b| {
                    let mut window = ReplayWindow::new(size, esn);
                    let mut base = 1u64;
                    let mut i = 0usize;
                    b.iter(|| {
                        let seq = base + pattern[i];
                        i += 1;
                        if i == PATTERN {
                            i = 0;
                            base += PATTERN as u64;
                        }
                        let full = window
                            .check(black_box(seq as u32))
                            .expect("fresh sequence number");
                        window.update(full);
                        full
                    })
                });
            }
        }
    }
    group.finish();
}

fn soft_encrypt(c: &mut Criterion) {
    let mut group = c.benchmark_group("soft_encrypt");
    for algorithm in [
        Algorithm::Aes128Gcm16,
        Algorithm::Aes128Sha1,
        Algorithm::TripleDesSha1,
    ] {
        let enc_key: Vec<u8> = (0..algorithm.enc_key_len()).map(|i| i as u8 * 3 + 1).collect();
        let auth_key: Vec<u8> = (0..algorithm.auth_key_len()).map(|i| i as u8 * 5 + 2).collect();
        let session = Session::new(algorithm, &enc_key, &auth_key).expect("session");
        for payload_len in [64usize, 1420] {
            // The layout of bench::measure::raw_crypto: SPI ‖ seq, IV, the
            // payload plus ESP trailer padded to the cipher's alignment, ICV.
            let align = algorithm.pad_align();
            let cipher_len = (payload_len + 2).div_ceil(align) * align;
            let iv_len = algorithm.iv_len();
            let icv_len = algorithm.icv_len();
            let total = 8 + iv_len + cipher_len + icv_len;
            let descriptor = || Descriptor {
                kind: DescriptorKind::SinglePass,
                direction: Direction::Encrypt,
                auth_only: Region::new(0, 8),
                esn_high: None,
                iv: Region::new(8, iv_len),
                cipher: Region::new(8 + iv_len, cipher_len),
                icv: Region::new(8 + iv_len + cipher_len, icv_len),
                status: Status::Pending,
            };
            let mut buf: Vec<u8> = (0..total).map(|i| i as u8).collect();
            let mut desc = descriptor();
            accel::primitive::process(&session, &mut desc, &mut buf);
            assert_eq!(desc.status, Status::Done, "{algorithm} encrypt");
            let mut counter = 0u64;
            let iv_bytes = iv_len.min(8);
            group.throughput(Throughput::Bytes(payload_len as u64));
            group.bench_function(BenchmarkId::new(algorithm.to_string(), payload_len), |b| {
                b.iter(|| {
                    counter += 1;
                    buf[8..8 + iv_bytes].copy_from_slice(&counter.to_be_bytes()[..iv_bytes]);
                    let mut desc = descriptor();
                    accel::primitive::process(&session, &mut desc, black_box(&mut buf));
                    desc.status
                })
            });
        }
    }
    group.finish();
}

fn config() -> Criterion {
    // This crate builds plotters with `ab_glyph`, which draws text only in
    // fonts registered by the program: criterion's report charts need one too.
    bench::plot::register_font().expect("chart font");
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! {
    name = micro;
    config = config();
    targets = spd_lookup, spd_update, sad_lookup, replay, soft_encrypt
}
criterion_main!(micro);
