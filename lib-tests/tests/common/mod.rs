//! Shared helpers for the gateway integration tests: two gateways joined
//! back to back in memory, configured from generated TOML, and a small
//! packet builder.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use accel::{Algorithm, BufferPolicy, EngineKind, EngineSpec, SecConfig, Style};
use dataplane::{DropReason, Gateway, LinkLayer, PacketBuf, PacketPool, Port, Verdict};
use ike_stub::builder::{pattern_key, test_site, ConfigBuilder, InterfaceBuilder};
use ike_stub::Config;
use smoltcp::wire::{IpProtocol, Ipv4Packet};
use spd_sad::Mode;
use testkit::Prerequisite;

/// The kernel's AF_ALG AEAD sockets, which this host's kernel lacks and the
/// linux-peer VM's has (`scripts/afalg-in-vm.sh` runs these tests there).
pub static AFALG: Prerequisite = Prerequisite::new("afalg", || {
    accel::afalg::probe().map_err(|e| format!("{e}; scripts/afalg-in-vm.sh runs this in the linux-peer VM"))
});

pub const HOST_A: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 10);
pub const HOST_B: Ipv4Addr = Ipv4Addr::new(192, 168, 2, 20);

/// Deterministic key bytes of `len`, different per `seed`.
pub fn key(len: usize, seed: u8) -> Vec<u8> {
    pattern_key(len, 7, seed)
}

/// [`key`] in hex, as a file writes it.
pub fn key_hex(len: usize, seed: u8) -> String {
    key(len, seed).iter().map(|b| format!("{b:02x}")).collect()
}

/// One end of the shared test tunnel `t` ([`test_site`]) in `mode`
/// (`"tunnel"` or `"transport"`); `a` is the 192.168.1.0/24 end.
pub fn tunnel_builder(alg: Algorithm, mode: &str, esn: bool, a: bool) -> ConfigBuilder {
    let mode: Mode = mode.parse().unwrap_or_else(|_| panic!("mode `{mode}`"));
    test_site(alg, mode, esn, a)
}

/// The interface `name` of `config`, for a test to change a setting of it.
pub fn interface<'a>(config: &'a mut ConfigBuilder, name: &str) -> &'a mut InterfaceBuilder {
    config
        .interface_mut(name)
        .unwrap_or_else(|| panic!("no interface `{name}`"))
}

/// [`tunnel_builder`]'s text.
pub fn tunnel_config(alg: Algorithm, mode: &str, esn: bool, a: bool) -> String {
    tunnel_builder(alg, mode, esn, a).to_toml()
}

/// [`tunnel_builder`], changed by `edit` (the tunnel is `tunnels[0]`).
pub fn tunnel_edited(
    alg: Algorithm,
    mode: &str,
    esn: bool,
    a: bool,
    edit: impl FnOnce(&mut ConfigBuilder),
) -> ConfigBuilder {
    let mut config = tunnel_builder(alg, mode, esn, a);
    edit(&mut config);
    config
}

/// [`tunnel_edited`]'s text.
pub fn tunnel_config_edited(
    alg: Algorithm,
    mode: &str,
    esn: bool,
    a: bool,
    edit: impl FnOnce(&mut ConfigBuilder),
) -> String {
    tunnel_edited(alg, mode, esn, a, edit).to_toml()
}

/// The engine `kind` with `buffers`, everything else at its defaults (the
/// `sec` model's buffer policy follows).
pub fn engine_spec(kind: EngineKind, buffers: BufferPolicy) -> EngineSpec {
    EngineSpec {
        kind,
        buffers,
        sec: SecConfig {
            buffers,
            ..SecConfig::default()
        },
        ..EngineSpec::default()
    }
}

/// Whether engine `kind` can run `alg`: the SEC model has no ChaCha20 or
/// Poly1305 unit and refuses such sessions (`accel/tests/sec_model.rs`
/// checks the refusal).
pub fn engine_runs(kind: accel::EngineKind, alg: accel::Algorithm) -> bool {
    kind.supports(alg)
}

/// `built` as a parsed configuration file (the test fails on an error).
pub fn parsed(built: &ConfigBuilder) -> Config {
    let text = built.to_toml();
    Config::parse(Path::new("test.toml"), &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// A gateway on the default (soft) engine from a parsed `config`, with a
/// `setup` the test may have changed.
pub fn soft_gateway(config: &Config, setup: dataplane::GatewaySetup) -> Gateway {
    let engine = accel::build_engine(&EngineSpec::default()).expect("engine builds");
    Gateway::with_commands(setup, engine, &config.commands(), Duration::ZERO).expect("config installs")
}

pub fn gateway_from(toml: &str) -> Gateway {
    gateway_on(toml, &EngineSpec::default(), Style::Async)
}

/// A gateway from `toml` on the engine `spec` describes, in `style`.
pub fn gateway_on(toml: &str, spec: &EngineSpec, style: Style) -> Gateway {
    let config = Config::parse(Path::new("test.toml"), toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let engine = accel::build_engine(spec).expect("engine builds");
    Gateway::with_commands(
        config.setup(LinkLayer::RawIp, style),
        engine,
        &config.commands(),
        Duration::ZERO,
    )
    .expect("config installs")
}

/// Runs `plane` beside one gateway (a single worker, as a test has it):
/// tells it what the gateway's ESP showed, feeds it the gateway's
/// lifetime events and `received` control datagrams, applies its
/// commands, and returns what to send, in order. Several workers need
/// `ControlPlane::take_commands`, `Gateway::apply_first` and the ordering
/// rule of `Datagram::after_commands` instead (`espgw run`'s daemon).
pub fn service<'a>(
    plane: &mut ike_stub::ControlPlane,
    now: Duration,
    gateway: &mut Gateway,
    received: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<ike_stub::Datagram> {
    {
        let gateway: &Gateway = gateway;
        plane.observe(
            now,
            |name| gateway.sa_carried_packets(name),
            |local, remote, encap| {
                gateway
                    .encapsulated_peer(local, remote, encap)
                    .map(|at| (at.address, at.port))
            },
        );
    }
    while let Some(event) = gateway.poll_event() {
        let id = match event {
            spd_sad::SaEvent::SoftExpired(id) | spd_sad::SaEvent::HardExpired(id) => id,
        };
        if let Some(name) = gateway.sad().get(id).map(|sa| sa.name().to_owned()) {
            plane.handle_sa_event(now, &name, event);
        }
    }
    for packet in received {
        plane.handle_datagram(now, packet);
    }
    plane.handle_timeout(now);
    let mut commands = Vec::new();
    plane.take_commands(&mut commands);
    for command in &commands {
        if let Err(e) = gateway.apply(command, now) {
            ike_stub::plane::log_refused(command, &e);
        }
    }
    let mut datagrams = Vec::new();
    plane.take_datagrams(&mut datagrams);
    datagrams
}

/// Site A and site B of one tunnel, raw-IP framing.
pub struct Pair {
    pub a: Gateway,
    pub b: Gateway,
    pub pool: PacketPool,
    pub now: Duration,
}

impl Pair {
    pub fn new(alg: Algorithm, mode: &str, esn: bool) -> Pair {
        Self::edited(alg, mode, esn, |_| {})
    }

    /// Both ends changed by the same `edit` (the tunnel is `tunnels[0]`).
    pub fn edited(alg: Algorithm, mode: &str, esn: bool, edit: impl Fn(&mut ConfigBuilder)) -> Pair {
        Self::edited_on(alg, mode, esn, edit, &EngineSpec::default(), Style::Async)
    }

    /// On the engine `spec` describes, in `style`.
    pub fn on(alg: Algorithm, mode: &str, esn: bool, spec: &EngineSpec, style: Style) -> Pair {
        Self::edited_on(alg, mode, esn, |_| {}, spec, style)
    }

    /// [`Self::edited`], on the engine `spec` describes, in `style`.
    pub fn edited_on(
        alg: Algorithm,
        mode: &str,
        esn: bool,
        edit: impl Fn(&mut ConfigBuilder),
        spec: &EngineSpec,
        style: Style,
    ) -> Pair {
        let end = |a: bool| {
            let config = tunnel_edited(alg, mode, esn, a, &edit);
            gateway_on(&config.to_toml(), spec, style)
        };
        Pair {
            a: end(true),
            b: end(false),
            pool: PacketPool::new(8),
            now: Duration::ZERO,
        }
    }

    /// Runs `packet` into A's inside port; returns A's verdict and output.
    pub fn encapsulate(&mut self, packet: &[u8]) -> (Verdict, Vec<u8>) {
        run(&mut self.a, &mut self.pool, self.now, Port::Inside, packet)
    }

    /// Runs `frame` into B's outside port.
    pub fn decapsulate(&mut self, frame: &[u8]) -> (Verdict, Vec<u8>) {
        run(&mut self.b, &mut self.pool, self.now, Port::Outside, frame)
    }
}

/// One frame through one gateway.
pub fn run(
    gw: &mut Gateway,
    pool: &mut PacketPool,
    now: Duration,
    from: Port,
    frame: &[u8],
) -> (Verdict, Vec<u8>) {
    let mut buf: PacketBuf = pool.alloc().expect("pool has a buffer");
    assert!(buf.fill(frame));
    let mut outputs = drivers::drive::handle_frame(gw, now, from, buf, pool);
    assert_eq!(outputs.len(), 1, "one frame in, one frame out");
    let (buf, verdict) = outputs.pop().expect("the engine returns every buffer");
    let out = buf.data().to_vec();
    pool.free(buf);
    (verdict, out)
}

pub fn dropped(verdict: Verdict) -> Option<DropReason> {
    match verdict {
        Verdict::Drop(r) => Some(r),
        _ => None,
    }
}

/// An IPv4/UDP packet with `payload_len` bytes of payload.
pub fn udp_packet(src: Ipv4Addr, dst: Ipv4Addr, payload_len: usize, seed: u8) -> Vec<u8> {
    let udp_len = 8 + payload_len;
    let total = 20 + udp_len;
    let mut p = vec![0u8; total];
    {
        let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
        ip.set_version(4);
        ip.set_header_len(20);
        ip.set_total_len(total as u16);
        ip.set_ident(u16::from(seed) * 3 + payload_len as u16);
        ip.set_dont_frag(true);
        ip.set_hop_limit(64);
        ip.set_next_header(IpProtocol::Udp);
        ip.set_src_addr(src);
        ip.set_dst_addr(dst);
        ip.fill_checksum();
    }
    p[20..22].copy_from_slice(&4000u16.to_be_bytes());
    p[22..24].copy_from_slice(&5000u16.to_be_bytes());
    p[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
    for (i, b) in p[28..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_add(seed);
    }
    p
}

/// An ARP packet (Ethernet and IPv4) of operation `op` from `sender` about
/// `target`, each a (MAC, IPv4 address) pair.
pub fn arp(
    op: smoltcp::wire::ArpOperation,
    sender: ([u8; 6], [u8; 4]),
    target: ([u8; 6], [u8; 4]),
) -> Vec<u8> {
    use smoltcp::wire::{ArpHardware, ArpPacket, EthernetProtocol};
    let mut p = vec![0u8; 28];
    let mut a = ArpPacket::new_unchecked(&mut p[..]);
    a.set_hardware_type(ArpHardware::Ethernet);
    a.set_protocol_type(EthernetProtocol::Ipv4);
    a.set_hardware_len(6);
    a.set_protocol_len(4);
    a.set_operation(op);
    a.set_source_hardware_addr(&sender.0);
    a.set_source_protocol_addr(&sender.1);
    a.set_target_hardware_addr(&target.0);
    a.set_target_protocol_addr(&target.1);
    p
}

/// `payload` in an Ethernet frame from `src` to `dst`.
pub fn ether(
    dst: [u8; 6],
    src: [u8; 6],
    ethertype: smoltcp::wire::EthernetProtocol,
    payload: &[u8],
) -> Vec<u8> {
    use smoltcp::wire::{EthernetAddress, EthernetFrame};
    let mut f = vec![0u8; 14 + payload.len()];
    let mut frame = EthernetFrame::new_unchecked(&mut f[..]);
    frame.set_dst_addr(EthernetAddress(dst));
    frame.set_src_addr(EthernetAddress(src));
    frame.set_ethertype(ethertype);
    f[14..].copy_from_slice(payload);
    f
}

/// `packet` as it looks after `hops` forwarding hops (TTL down, checksum redone).
pub fn after_hops(packet: &[u8], hops: u8) -> Vec<u8> {
    let mut p = packet.to_vec();
    let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
    ip.set_hop_limit(ip.hop_limit() - hops);
    ip.fill_checksum();
    p
}

/// A bare IPv6 packet carrying `icmp`, its checksum filled, written by
/// smoltcp's wire types.
pub fn icmpv6_packet(
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    hop_limit: u8,
    icmp: &smoltcp::wire::Icmpv6Repr,
) -> Vec<u8> {
    use smoltcp::wire::{Icmpv6Packet, Ipv6Packet, Ipv6Repr};
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmpv6,
        payload_len: icmp.buffer_len(),
        hop_limit,
    };
    let mut p = vec![0u8; ip.buffer_len() + icmp.buffer_len()];
    ip.emit(&mut Ipv6Packet::new_unchecked(&mut p[..40]));
    icmp.emit(
        &src,
        &dst,
        &mut Icmpv6Packet::new_unchecked(&mut p[40..]),
        &smoltcp::phy::ChecksumCapabilities::default(),
    );
    p
}
