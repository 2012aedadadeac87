//! Shared by the fuzz targets: gateways from the shipped configurations
//! (the site pair also with IPv6 over its tunnel, [`site`]) or
//! from ones built with `ike_stub::builder` (one tunnel, every proposal, both modes, ESN on or
//! off), small packet builders, and the end-of-input checks every gateway
//! target makes (every buffer back in the pool, counters balanced).
#![allow(dead_code)]

#[path = "six_in_four.rs"]
mod six_in_four;
pub use six_in_four::*;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use accel::{Algorithm, EngineSpec, Style};
use dataplane::{Gateway, LinkLayer, Output, PacketPool};
use ike_stub::builder::{pattern_key, test_site, ConfigBuilder};
use ike_stub::Config;
use spd_sad::Mode;

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

/// Site A (`a`) or site B from `configs/site-a.toml` or `site-b.toml`,
/// with the IPv6 networks and the 6-in-4 tunnel `a-b-v6` of
/// [`six_in_four`] added (the seed generator builds its site A the same
/// way).
pub fn site(a: bool, link: LinkLayer) -> Gateway {
    let name = if a { "site-a.toml" } else { "site-b.toml" };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("shipped config is readable");
    let config = Config::parse(&path, &with_ipv6(&text, a))
        .unwrap_or_else(|e| panic!("{name} with IPv6 is valid: {e}"));
    build(&config, link)
}

pub fn build(config: &Config, link: LinkLayer) -> Gateway {
    let engine = accel::build_engine(&EngineSpec::default()).expect("the soft engine builds");
    Gateway::with_commands(
        config.setup(link, Style::Async),
        engine,
        &config.commands(),
        Duration::ZERO,
    )
    .expect("config installs")
}

/// The (encryption, integrity) keys site A sends with, which site B
/// receives with (the same keys as lib-tests/tests/common's).
pub fn a_to_b_keys(alg: Algorithm) -> (Vec<u8>, Vec<u8>) {
    (
        pattern_key(alg.enc_key_len(), 7, 1),
        pattern_key(alg.auth_key_len(), 7, 101),
    )
}

/// One end of the tunnel `t` the gateway tests share ([`test_site`]),
/// raw IP.
pub fn tunnel_builder(alg: Algorithm, transport: bool, esn: bool, a: bool) -> ConfigBuilder {
    let mode = if transport { Mode::Transport } else { Mode::Tunnel };
    test_site(alg, mode, esn, a)
}

/// The validated configuration `builder` describes.
pub fn parse(builder: &ConfigBuilder) -> Config {
    builder
        .parse_as(Path::new("fuzz.toml"))
        .unwrap_or_else(|e| panic!("{e}\n{}", builder.to_toml()))
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
