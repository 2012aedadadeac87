//! The AF_ALG engine against the soft engine: identical ESP bytes and round
//! trips for every algorithm, style and buffer policy. Where the kernel has
//! no AF_ALG (it needs CONFIG_CRYPTO_USER_API_AEAD) the comparison shows as
//! `ignored (needs afalg: ...)`, and fails under `CI=true` unless
//! `ESPGW_SKIPS` names `afalg` (testkit); `scripts/afalg-in-vm.sh` (run by
//! `scripts/linux-interop.sh`) runs it inside a VM whose kernel has it.

mod common;

use std::time::Duration;

use accel::afalg::AfalgIo;
use accel::{Algorithm, BufferPolicy, EngineKind, EngineSpec, SecConfig, Style};
use common::*;
use dataplane::gateway::Output;
use dataplane::{Gateway, PacketPool, Port, Verdict};

fn main() -> std::process::ExitCode {
    testkit::run([
        testkit::needs!(&AFALG, afalg_gives_the_same_bytes_as_soft),
        testkit::test!(the_engine_builds_exactly_where_the_kernel_has_af_alg),
    ])
}

fn through(gw: &mut Gateway, from: Port, frames: &[Vec<u8>]) -> Vec<(Verdict, Vec<u8>)> {
    let mut pool = PacketPool::new(frames.len().max(1));
    let mut bufs: Vec<_> = frames
        .iter()
        .map(|f| {
            let mut buf = pool.alloc().expect("pool sized for the frames");
            assert!(buf.fill(f));
            buf
        })
        .collect();
    let mut out: Vec<Output> = Vec::new();
    gw.handle_batch(Duration::ZERO, from, &mut bufs, &mut out, &mut pool);
    drivers::drive::flush(gw, Duration::ZERO, &mut out, &mut pool);
    let results = out.iter().map(|(b, v)| (*v, b.data().to_vec())).collect();
    for (buf, _) in out {
        pool.free(buf);
    }
    assert_eq!(pool.in_use(), 0);
    results
}

fn combos() -> Vec<(Style, BufferPolicy, AfalgIo)> {
    let mut list = Vec::new();
    for style in Style::ALL {
        for buffers in BufferPolicy::ALL {
            for io in [AfalgIo::Sync, AfalgIo::IoUring] {
                list.push((style, buffers, io));
            }
        }
    }
    list
}

fn afalg_gives_the_same_bytes_as_soft() {
    for alg in Algorithm::ALL {
        for esn in [false, true] {
            let frames: Vec<Vec<u8>> = (0..=1472)
                .step_by(37)
                .map(|n| udp_packet(HOST_A, HOST_B, n, n as u8))
                .collect();
            let soft = EngineSpec::default();
            let mut reference_pair = Pair::on(alg, "tunnel", esn, &soft, Style::Async);
            reference_pair.a.set_iv_seed(3);
            let reference = through(&mut reference_pair.a, Port::Inside, &frames);
            for (style, buffers, io) in combos() {
                {
                    let what = format!("{alg} esn={esn} {style} {buffers} {io}");
                    let spec = EngineSpec {
                        kind: EngineKind::Afalg,
                        buffers,
                        sec: SecConfig::default(),
                        afalg_io: io,
                        ..EngineSpec::default()
                    };
                    let mut pair = Pair::on(alg, "tunnel", esn, &spec, style);
                    pair.a.set_iv_seed(3);
                    let esp = through(&mut pair.a, Port::Inside, &frames);
                    if let Some((i, ((va, a), (vb, b)))) =
                        esp.iter().zip(&reference).enumerate().find(|(_, (x, y))| x != y)
                    {
                        let at = a.iter().zip(b).position(|(x, y)| x != y);
                        panic!(
                            "{what}: packet {i} differs from the soft engine ({va:?} {} bytes vs {vb:?} {} bytes, first difference at byte {at:?})\nafalg {}\nsoft  {}",
                            a.len(),
                            b.len(),
                            hex::encode(a),
                            hex::encode(b)
                        );
                    }
                    let wire: Vec<Vec<u8>> = esp.into_iter().map(|(_, b)| b).collect();
                    let back = through(&mut pair.b, Port::Outside, &wire);
                    for ((verdict, inner), sent) in back.iter().zip(&frames) {
                        assert_eq!(*verdict, Verdict::Forward(Port::Inside), "{what}");
                        assert_eq!(inner, &after_hops(sent, 2), "{what}");
                    }
                    // A flipped ICV bit is refused by the kernel.
                    if alg != Algorithm::Null {
                        // A packet B has not seen yet, so only its ICV is wrong.
                        let fresh = through(&mut pair.a, Port::Inside, &frames[..1]);
                        let mut bad = fresh[0].1.clone();
                        let last = bad.len() - 1;
                        bad[last] ^= 1;
                        let refused = through(&mut pair.b, Port::Outside, &[bad]);
                        assert_eq!(
                            refused[0].0,
                            Verdict::Drop(dataplane::DropReason::AuthFailed),
                            "{what}"
                        );
                    }
                }
            }
        }
    }
}

/// Runs everywhere: the engine is refused, naming the kernel option, exactly
/// where the probe says AF_ALG is missing.
fn the_engine_builds_exactly_where_the_kernel_has_af_alg() {
    let built = accel::build_engine(&EngineSpec {
        kind: EngineKind::Afalg,
        ..EngineSpec::default()
    });
    match (accel::afalg::probe(), built) {
        (Ok(()), Ok(_)) => {}
        (Ok(()), Err(e)) => panic!("the kernel has AF_ALG, yet the engine is refused: {e}"),
        (Err(missing), Ok(_)) => panic!("the probe says {missing}, yet the engine was built"),
        (Err(_), Err(e)) => assert!(e.to_string().contains("CONFIG_CRYPTO_USER_API_AEAD"), "{e}"),
    }
}
