//! Shared by the fuzz targets: gateways from the shipped configurations or
//! from generated ones (one tunnel, every proposal, both modes, ESN on or
//! off), small packet builders, and the end-of-input checks every gateway
//! target makes (every buffer back in the pool, counters balanced).
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use accel::{Algorithm, EngineSpec, Style};
use dataplane::{Gateway, LinkLayer, Output, PacketPool};
use ike_stub::Config;

/// Site B's outside address; site A (the peer) is 10.0.0.1.
pub const GW_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const GW_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const HOST_A: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 10);
pub const HOST_B: Ipv4Addr = Ipv4Addr::new(192, 168, 2, 20);
/// The shared secret of the generated configurations' tunnel `t`.
pub const SECRET: &str = "a fuzzing secret, longer than sixteen bytes";

pub fn gateway(config: &str, link: LinkLayer) -> Gateway {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(config);
    let config = Config::load(&path).expect("shipped config is valid");
    build(&config, link)
}

pub fn build(config: &Config, link: LinkLayer) -> Gateway {
    let engine = accel::build_engine(&EngineSpec::default()).expect("the soft engine builds");
    config
        .build_gateway(link, engine, Style::Async, Duration::ZERO)
        .expect("config installs")
}

/// Deterministic key bytes (the same function as tests/common).
fn key_hex(len: usize, seed: u8) -> String {
    (0..len)
        .map(|i| format!("{:02x}", (i as u8).wrapping_mul(7).wrapping_add(seed)))
        .collect()
}

/// The (encryption, integrity) keys site A sends with, which site B
/// receives with.
pub fn a_to_b_keys(alg: Algorithm) -> (Vec<u8>, Vec<u8>) {
    let bytes = |len: usize, seed: u8| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    };
    (bytes(alg.enc_key_len(), 1), bytes(alg.auth_key_len(), 101))
}

/// One end of a tunnel `t` between 10.0.0.1 (A, 192.168.1.0/24) and
/// 10.0.0.2 (B, 192.168.2.0/24), raw IP, with `extra` TOML appended to the
/// tunnel table.
pub fn tunnel_config(alg: Algorithm, transport: bool, esn: bool, a: bool, extra: &str) -> String {
    let (me, peer, my_net, peer_net, my_in) = if a {
        ("10.0.0.1", "10.0.0.2", "192.168.1", "192.168.2", "192.168.1.1")
    } else {
        ("10.0.0.2", "10.0.0.1", "192.168.2", "192.168.1", "192.168.2.1")
    };
    let (spi_out, spi_in) = if a { (0x1001, 0x1002) } else { (0x1002, 0x1001) };
    let (seed_out, seed_in) = if a { (1, 2) } else { (2, 1) };
    let keys = |dir: &str, seed: u8| {
        let mut s = String::new();
        if alg.enc_key_len() > 0 {
            s += &format!("enc_key_{dir} = \"{}\"\n", key_hex(alg.enc_key_len(), seed));
        }
        if alg.auth_key_len() > 0 {
            s += &format!(
                "auth_key_{dir} = \"{}\"\n",
                key_hex(alg.auth_key_len(), seed + 100)
            );
        }
        s
    };
    let mode = if transport { "transport" } else { "tunnel" };
    format!(
        r#"
[gateway]
allow_insecure_null = true

[[interface]]
name = "inside"
device = "in0"
address = "{my_in}/24"

[[interface]]
name = "outside"
device = "out0"
address = "{me}/24"
mtu = 9000

[[route]]
destination = "{peer_net}.0/24"
via = "{peer}"

[[tunnel]]
name = "t"
local = "{me}"
remote = "{peer}"
local_subnet = "{my_net}.0/24"
remote_subnet = "{peer_net}.0/24"
proposal = "{alg}"
mode = "{mode}"
spi_out = {spi_out}
spi_in = {spi_in}
{keys_out}{keys_in}esn = {esn}
replay_window = 64
{extra}
"#,
        keys_out = keys("out", seed_out),
        keys_in = keys("in", seed_in),
    )
}

pub fn parse(text: &str) -> Config {
    Config::parse(Path::new("fuzz.toml"), text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The Internet checksum of `bytes`.
pub fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Makes `packet`'s IPv4 total length and header checksum right, if it has
/// a header at all, so that mutations of the body are not all refused as
/// malformed headers.
pub fn fix_ipv4_header(packet: &mut [u8]) {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return;
    }
    let header_len = usize::from(packet[0] & 0x0f) * 4;
    if header_len < 20 || header_len > packet.len() {
        return;
    }
    let total = packet.len().min(usize::from(u16::MAX)) as u16;
    packet[2..4].copy_from_slice(&total.to_be_bytes());
    packet[10..12].copy_from_slice(&[0, 0]);
    let sum = checksum(&packet[..header_len]);
    packet[10..12].copy_from_slice(&sum.to_be_bytes());
}

/// An IPv4/UDP packet from `src` to `dst` carrying `payload` (UDP checksum
/// left zero, as IPv4 allows).
pub fn udp_packet(src: Ipv4Addr, dst: Ipv4Addr, ports: (u16, u16), payload: &[u8]) -> Vec<u8> {
    let total = 28 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p[20..22].copy_from_slice(&ports.0.to_be_bytes());
    p[22..24].copy_from_slice(&ports.1.to_be_bytes());
    p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    p
}

/// The end of every gateway target's input: the gateway gives back what it
/// still holds, every output goes back to the pool, and then the pool must
/// be whole and the counters balanced (each received frame transmitted,
/// consumed or dropped exactly once).
pub fn finish(gateway: &mut Gateway, mut outputs: Vec<Output>, pool: &mut PacketPool) {
    gateway.shutdown(Duration::from_secs(3600), &mut outputs, pool);
    for (buf, _) in outputs {
        pool.free(buf);
    }
    assert_eq!(pool.in_use(), 0, "a packet buffer was lost");
    assert_eq!(gateway.in_flight(), 0, "a job is still in flight");
    let stats = gateway.stats();
    assert!(stats.balanced(), "{stats:?}");
}
