//! Instructions per packet of the outbound path, for profiling under
//! callgrind (whose counts, unlike this shared machine's timings, do not
//! change with load):
//!
//! ```sh
//! cargo build --release --example ipp
//! valgrind --tool=callgrind --toggle-collect='ipp::run_batches' target/release/examples/ipp esp-null
//! ```
//!
//! Runs 1000 batches of 32 64-byte frames through one gateway's outbound
//! path (`ipv4-fwd`, `esp-null` or an ESP proposal such as `aes128gcm16`)
//! and checks every frame is forwarded. The figure callgrind gives for
//! `run_batches`, divided by 32,000, is the path's instructions per packet.

use std::path::Path;
use std::time::Duration;

use accel::{Algorithm, EngineSpec, Style};
use dataplane::{Gateway, LinkLayer, PacketBuf, PacketPool, Port, Verdict};

const BATCH: usize = 32;
const BATCHES: usize = 1000;

fn config(algorithm: Option<Algorithm>) -> String {
    let mut text = String::from(
        r#"[gateway]
allow_insecure_null = true
[[interface]]
name = "inside"
device = "in0"
address = "192.168.1.1/24"
[[interface]]
name = "outside"
device = "out0"
address = "10.0.0.1/24"
[[route]]
destination = "192.168.2.0/24"
via = "10.0.0.2"
[[neighbor]]
address = "10.0.0.2"
mac = "02:00:00:00:00:02"
"#,
    );
    match algorithm {
        None => text.push_str(
            "[[policy]]\nname = \"fwd\"\ndirection = \"out\"\nsource = \"192.168.1.0/24\"\ndestination = \"192.168.2.0/24\"\naction = \"bypass\"\n",
        ),
        Some(alg) => {
            let hex = |n: usize, seed: u8| (0..n).map(|i| format!("{:02x}", i as u8 ^ seed)).collect::<String>();
            text.push_str(&format!(
                "[[tunnel]]\nname = \"t\"\nlocal = \"10.0.0.1\"\nremote = \"10.0.0.2\"\nlocal_subnet = \"192.168.1.0/24\"\nremote_subnet = \"192.168.2.0/24\"\nproposal = \"{alg}\"\nspi_out = 4097\nspi_in = 4098\n"
            ));
            for (dir, seed) in [("out", 1u8), ("in", 2)] {
                if alg.enc_key_len() > 0 {
                    text.push_str(&format!("enc_key_{dir} = \"{}\"\n", hex(alg.enc_key_len(), seed)));
                }
                if alg.auth_key_len() > 0 {
                    text.push_str(&format!("auth_key_{dir} = \"{}\"\n", hex(alg.auth_key_len(), seed + 9)));
                }
            }
        }
    }
    text
}

fn frame() -> Vec<u8> {
    let size: usize = std::env::var("IPP_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let ip_len = size - 18;
    let mut f = vec![0u8; 14 + ip_len];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    let ip = &mut f[14..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[192, 168, 1, 10]);
    ip[16..20].copy_from_slice(&[192, 168, 2, 20]);
    let sum = ip[..20]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let folded = (sum & 0xffff) + (sum >> 16);
    ip[10..12].copy_from_slice(&(!(folded as u16)).to_be_bytes());
    ip[20..22].copy_from_slice(&4000u16.to_be_bytes());
    ip[22..24].copy_from_slice(&5000u16.to_be_bytes());
    ip[24..26].copy_from_slice(&((ip_len - 20) as u16).to_be_bytes());
    f
}

#[inline(never)]
fn run_batches(gw: &mut Gateway, pool: &mut PacketPool, frame: &[u8]) -> usize {
    let mut bufs: Vec<PacketBuf> = Vec::with_capacity(BATCH);
    let mut out = Vec::with_capacity(BATCH * 2);
    let mut forwarded = 0;
    for _ in 0..BATCHES {
        for _ in 0..BATCH {
            let mut buf = pool.alloc().expect("pool has room");
            buf.fill(frame);
            bufs.push(buf);
        }
        gw.handle_batch(Duration::ZERO, Port::Inside, &mut bufs, &mut out, pool);
        if gw.in_flight() > 0 {
            drivers::drive::flush(gw, Duration::ZERO, &mut out, pool);
        }
        for (buf, verdict) in out.drain(..) {
            forwarded += usize::from(verdict == Verdict::Forward(Port::Outside));
            pool.free(buf);
        }
    }
    forwarded
}

fn gateway(algorithm: Option<Algorithm>) -> Gateway {
    let config =
        ike_stub::Config::parse(Path::new("ipp.toml"), &config(algorithm)).unwrap_or_else(|e| panic!("{e}"));
    let engine = accel::build_engine(&EngineSpec::default()).expect("soft engine");
    dataplane::Gateway::with_commands(
        config.setup(LinkLayer::Ethernet, Style::Async),
        engine,
        &config.commands(),
        Duration::ZERO,
    )
    .expect("installs")
}

/// `ipp time`: wall-clock ns per packet of ipv4-fwd, esp-null and
/// aes128gcm16, measured in turns so that the machine's noise hits each
/// alike; medians of 21 turns and their ratios.
fn time_all() {
    let kinds = [None, Some(Algorithm::Null), Some(Algorithm::Aes128Gcm16)];
    let mut gateways: Vec<Gateway> = kinds.iter().map(|k| gateway(*k)).collect();
    let mut pool = PacketPool::new(BATCH * 4);
    let frame = frame();
    let mut samples = vec![Vec::new(); kinds.len()];
    for _ in 0..21 {
        for (gw, s) in gateways.iter_mut().zip(samples.iter_mut()) {
            let start = std::time::Instant::now();
            run_batches(gw, &mut pool, &frame);
            s.push(start.elapsed().as_nanos() as f64 / (BATCH * BATCHES) as f64);
        }
    }
    let medians: Vec<f64> = samples
        .iter_mut()
        .map(|s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect();
    println!(
        "ns/packet: ipv4-fwd {:.1}, esp-null {:.1} ({:.2}x), aes128gcm16 {:.1}",
        medians[0],
        medians[1],
        medians[1] / medians[0],
        medians[2]
    );
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "esp-null".into());
    if which == "time" {
        return time_all();
    }
    let algorithm = match which.as_str() {
        "ipv4-fwd" => None,
        "esp-null" => Some(Algorithm::Null),
        other => Some(other.parse::<Algorithm>().unwrap_or_else(|e| panic!("{e}"))),
    };
    let mut gw = gateway(algorithm);
    let mut pool = PacketPool::new(BATCH * 4);
    let frame = frame();
    // A second argument repeats the run (for `perf record`).
    let rounds: usize = std::env::args().nth(2).and_then(|n| n.parse().ok()).unwrap_or(1);
    let mut forwarded = 0;
    for _ in 0..rounds {
        forwarded = run_batches(&mut gw, &mut pool, &frame);
    }
    assert_eq!(
        forwarded,
        BATCH * BATCHES,
        "every frame forwarded: {:?}",
        gw.stats()
    );
    println!("{which}: {forwarded} frames forwarded");
}
