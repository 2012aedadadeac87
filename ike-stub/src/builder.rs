//! A typed builder of configuration files (feature `testing`), for the
//! tests, the fuzz targets and the benchmark, which need gateways of many
//! shapes and used to write their TOML by hand, each in its own way.
//!
//! Owns: the shape of a file as typed values ([`ConfigBuilder`] and the
//! builders of its sections), and its text, serialized with serde and
//! `toml`, so that it is always well-formed TOML with the parser's key
//! names (`crate::raw` is the other side; the tests below hold the two
//! together). What a file means is not decided here: [`ConfigBuilder::parse`]
//! hands the text to [`Config::parse`], the one validator, so a builder
//! can describe a file the gateway refuses (as tests of refusals need).
//!
//! Must not: be used by `espgw run` or hold defaults of its own (a field
//! left `None` is a key left out, and the parser's default applies).
//! Key material here is test material: it is not wiped.

use std::fmt::Display;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::str::FromStr;

use accel::{Algorithm, BufferPolicy, EngineKind, Style};
use serde::{Deserialize, Serialize};
use smoltcp::wire::{EthernetAddress, Ipv4Cidr};
use spd_sad::{IpPrefix, Ipv4Prefix, Mode, PolicyDirection, SaDirection};

use crate::{Config, ConfigError, DeviceLoss};

/// Deterministic key bytes for tests: byte `i` is `i * step + seed`
/// (wrapping), so that every end and direction can have its own key.
pub fn pattern_key(len: usize, step: u8, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(step).wrapping_add(seed))
        .collect()
}

/// One end of the tunnel `t` that the gateway tests (`lib-tests/tests/common`) and
/// the fuzz targets share, so that seeds written by one are read by the
/// other: between 10.0.0.1 (site A, 192.168.1.0/24) and 10.0.0.2 (site B,
/// 192.168.2.0/24), `a` choosing the end, on a jumbo outside link
/// (tests send inner packets of up to 1500 bytes with DF set, which must
/// not need fragmenting there). Keys are [`pattern_key`]s with step 7,
/// seeded 1 (A to B) and 2 (B to A), plus 100 for integrity keys. Both
/// modes protect the host networks (transport mode keeps the packet's own
/// addresses as it is forwarded).
pub fn test_site(alg: Algorithm, mode: Mode, esn: bool, a: bool) -> ConfigBuilder {
    let third = |a: bool| if a { 1 } else { 2 };
    let gw = |a: bool| Ipv4Addr::new(10, 0, 0, third(a));
    let net = |a: bool| Ipv4Prefix::new(Ipv4Addr::new(192, 168, third(a), 0), 24).unwrap_or(Ipv4Prefix::ANY);
    let spis = if a { (0x1001, 0x1002) } else { (0x1002, 0x1001) };
    let (seed_out, seed_in) = if a { (1, 2) } else { (2, 1) };
    ConfigBuilder::new()
        .allow_insecure_null()
        .interface(InterfaceBuilder::inside(
            "in0",
            Ipv4Addr::new(192, 168, third(a), 1),
            24,
        ))
        .interface(InterfaceBuilder::outside("out0", gw(a), 24).mtu(9000))
        .route_via(net(!a), gw(!a))
        .tunnel(
            TunnelBuilder::new("t", (gw(a), gw(!a)), alg, spis)
                .subnets(net(a), net(!a))
                .mode(mode)
                .keys_with(|dir, len, auth| {
                    let seed = if dir == "out" { seed_out } else { seed_in };
                    pattern_key(len, 7, if auth { seed + 100 } else { seed })
                })
                .esn(esn)
                .replay_window(64),
        )
}

/// A whole configuration file. Fields are public so that a test can
/// change what a shared helper built (`config.interfaces[1].mtu = ...`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigBuilder {
    /// `[gateway]`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub gateway: GatewaySection,
    /// `[accel]`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub accel: AccelSection,
    /// The `[[interface]]`s: a valid file has `inside` and `outside`.
    #[serde(default, rename = "interface", skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceBuilder>,
    /// The `[[route]]`s.
    #[serde(default, rename = "route", skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteBuilder>,
    /// The `[[neighbor]]`s: static neighbours.
    #[serde(default, rename = "neighbor", skip_serializing_if = "Vec::is_empty")]
    pub neighbors: Vec<NeighborBuilder>,
    /// The `[[policy]]`s, in file order.
    #[serde(default, rename = "policy", skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<PolicyBuilder>,
    /// Manually keyed SAs (`[[sa]]`).
    #[serde(default, rename = "sa", skip_serializing_if = "Vec::is_empty")]
    pub sas: Vec<SaBuilder>,
    /// `[rekey]`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub rekey: RekeySection,
    /// `[limits]`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub limits: LimitsSection,
    /// Last, so that the text ends with the last tunnel's table (or its
    /// `lifetime`, when it has one).
    #[serde(default, rename = "tunnel", skip_serializing_if = "Vec::is_empty")]
    pub tunnels: Vec<TunnelBuilder>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl ConfigBuilder {
    /// An empty file: every section and key left out.
    pub fn new() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// `[gateway] name`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.gateway.name = Some(name.into());
        self
    }

    /// `[gateway] allow_insecure_null = true`: proposal `null` allowed.
    pub fn allow_insecure_null(mut self) -> Self {
        self.gateway.allow_insecure_null = true;
        self
    }

    /// `[gateway] outer_ttl`: TTL of tunnel-mode outer headers.
    pub fn outer_ttl(mut self, ttl: u8) -> Self {
        self.gateway.outer_ttl = Some(ttl);
        self
    }

    /// `[gateway] nat_keepalive_s` (0: none).
    pub fn nat_keepalive_s(mut self, seconds: u32) -> Self {
        self.gateway.nat_keepalive_s = Some(seconds);
        self
    }

    /// `[gateway] state_dir`: where SAs with static keys keep their
    /// sequence numbers.
    pub fn state_dir(mut self, dir: impl Into<String>) -> Self {
        self.gateway.state_dir = Some(dir.into());
        self
    }

    /// `[gateway] on_device_loss`: what `espgw run` does when a device is
    /// deleted.
    pub fn on_device_loss(mut self, loss: DeviceLoss) -> Self {
        self.gateway.on_device_loss = Some(loss);
        self
    }

    /// The `[accel]` section.
    pub fn accel(mut self, accel: AccelSection) -> Self {
        self.accel = accel;
        self
    }

    /// Adds an `[[interface]]`.
    pub fn interface(mut self, interface: InterfaceBuilder) -> Self {
        self.interfaces.push(interface);
        self
    }

    /// A route to `destination` through the next hop `via` (both IPv4,
    /// or both IPv6).
    pub fn route_via(mut self, destination: impl Into<IpPrefix>, via: impl Into<IpAddr>) -> Self {
        self.routes.push(RouteBuilder {
            destination: destination.into(),
            via: Some(via.into()),
            interface: None,
        });
        self
    }

    /// Adds a `[[route]]` as given (a direct one names its interface).
    pub fn route(mut self, route: RouteBuilder) -> Self {
        self.routes.push(route);
        self
    }

    /// A static neighbour.
    pub fn neighbor(mut self, address: impl Into<IpAddr>, mac: EthernetAddress) -> Self {
        self.neighbors.push(NeighborBuilder {
            address: address.into(),
            mac,
        });
        self
    }

    /// Adds a `[[policy]]`, after those already there.
    pub fn policy(mut self, policy: PolicyBuilder) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds a `[[tunnel]]`.
    pub fn tunnel(mut self, tunnel: TunnelBuilder) -> Self {
        self.tunnels.push(tunnel);
        self
    }

    /// A manually keyed `[[sa]]`.
    pub fn sa(mut self, sa: SaBuilder) -> Self {
        self.sas.push(sa);
        self
    }

    /// The `[rekey]` section.
    pub fn rekey(mut self, rekey: RekeySection) -> Self {
        self.rekey = rekey;
        self
    }

    /// The `[limits]` section.
    pub fn limits(mut self, limits: LimitsSection) -> Self {
        self.limits = limits;
        self
    }

    /// The interface named `name` (`"inside"` or `"outside"`).
    pub fn interface_mut(&mut self, name: &str) -> Option<&mut InterfaceBuilder> {
        self.interfaces.iter_mut().find(|i| i.name == name)
    }

    /// The tunnel named `name`, to change what a shared helper built.
    pub fn tunnel_mut(&mut self, name: &str) -> Option<&mut TunnelBuilder> {
        self.tunnels.iter_mut().find(|t| t.name == name)
    }

    /// The file's text. Every value the builder holds has a TOML form, so
    /// serializing cannot fail; a failure would be a bug in this module.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| panic!("a ConfigBuilder always serializes: {e}"))
    }

    /// The text, validated by the real parser as a file named `path`.
    pub fn parse_as(&self, path: &Path) -> Result<Config, ConfigError> {
        Config::parse(path, &self.to_toml())
    }

    /// [`Self::parse_as`] a file named `builder.toml`.
    pub fn parse(&self) -> Result<Config, ConfigError> {
        self.parse_as(Path::new("builder.toml"))
    }
}

/// `[gateway]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySection {
    /// `name`: the gateway's name; absent, the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `allow_insecure_null`: proposal `null` allowed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_insecure_null: bool,
    /// `outer_ttl`: TTL of tunnel-mode outer headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outer_ttl: Option<u8>,
    /// `nat_keepalive_s`: seconds between NAT keepalives (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat_keepalive_s: Option<u32>,
    /// `state_dir`: where SAs with static keys keep their sequence
    /// numbers (relative to the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    /// `on_device_loss`: `wait` for a deleted device to come back, or
    /// `exit` (absent: `wait`).
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub on_device_loss: Option<DeviceLoss>,
}

/// `[accel]`: which engine and how it is set up. Keywords the engine
/// modules name (`completion`, `profile`, `afalg_io`, `transport`) are
/// written as the file writes them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccelSection {
    /// `engine`: `soft`, `sec`, `afalg` or `shared`.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,
    /// `style`: how crypto is submitted (`sync`, `dual-pass`, `async`).
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub style: Option<Style>,
    /// `buffers`: `registered` or `per-request`.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub buffers: Option<BufferPolicy>,
    /// `channels` (`sec`): channels in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<usize>,
    /// `fifo_depth` (`sec`): descriptors a channel's fetch FIFO holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fifo_depth: Option<usize>,
    /// `completion` (`sec`): `interrupt`, `polling` or `coalesced`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<String>,
    /// `coalesce_count`: completions that raise a coalesced interrupt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce_count: Option<usize>,
    /// `coalesce_usecs`: longest a completion waits for a coalesced
    /// interrupt, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce_usecs: Option<u64>,
    /// `profile` (`sec`): the modelled device (`none`, `sec2-266mhz`,
    /// `qat-class`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// `threads` (`sec`): the threaded engine instead of the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<bool>,
    /// `afalg_io` (`afalg`): `io-uring` or `sync`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub afalg_io: Option<String>,
    /// The `shared` engine's server socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// `transport` (`shared`): `shm` or `socket`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// `fail_every` (`sec`): every this-many-th descriptor fails (soak
    /// tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_every: Option<u64>,
    /// `lose_completion_every` (`sec`): every this-many-th
    /// descriptor's completion is lost (soak tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lose_completion_every: Option<u64>,
}

/// An `[[interface]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceBuilder {
    /// `inside` or `outside`.
    pub name: String,
    /// The OS device it runs on.
    pub device: String,
    /// `"ethernet"` or `"tun"`; absent: Ethernet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Our address and its network, written as smoltcp prints it (the
    /// parser's canonical form).
    #[serde(with = "text")]
    pub address: Ipv4Cidr,
    /// `mac`; absent, `espgw run` takes the device's own.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub mac: Option<EthernetAddress>,
    /// `mtu`; absent, the device's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Our IPv6 address and prefix length, as `2001:db8:1::1/64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<String>,
}

impl InterfaceBuilder {
    /// The `inside` interface on `device` with `address`/`prefix_len`.
    pub fn inside(device: impl Into<String>, address: Ipv4Addr, prefix_len: u8) -> InterfaceBuilder {
        InterfaceBuilder::new("inside", device, address, prefix_len)
    }

    /// The `outside` interface on `device` with `address`/`prefix_len`.
    pub fn outside(device: impl Into<String>, address: Ipv4Addr, prefix_len: u8) -> InterfaceBuilder {
        InterfaceBuilder::new("outside", device, address, prefix_len)
    }

    fn new(name: &str, device: impl Into<String>, address: Ipv4Addr, prefix_len: u8) -> InterfaceBuilder {
        InterfaceBuilder {
            name: name.to_owned(),
            device: device.into(),
            kind: None,
            address: Ipv4Cidr::new(address, prefix_len),
            mac: None,
            mtu: None,
            address6: None,
        }
    }

    /// `mac`: the interface's MAC, instead of the device's.
    pub fn mac(mut self, mac: EthernetAddress) -> Self {
        self.mac = Some(mac);
        self
    }

    /// `mtu`, instead of the device's.
    pub fn mtu(mut self, mtu: u16) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// `address6 = "address/prefix-length"`: IPv6 on the interface.
    pub fn address6(mut self, address6: impl Into<String>) -> Self {
        self.address6 = Some(address6.into());
        self
    }

    /// `kind = "tun"`.
    pub fn tun(mut self) -> Self {
        self.kind = Some("tun".to_owned());
        self
    }
}

/// A `[[route]]`: through `via`, or straight out of `interface`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteBuilder {
    /// The network it reaches (IPv4 or IPv6).
    #[serde(with = "text")]
    pub destination: IpPrefix,
    /// The next hop, on a connected network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<IpAddr>,
    /// `inside` or `outside`: a direct route, without a next hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
}

/// A `[[neighbor]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighborBuilder {
    /// The neighbour's address (IPv4 or IPv6).
    pub address: IpAddr,
    /// Its MAC.
    #[serde(with = "text")]
    pub mac: EthernetAddress,
}

/// A `[[policy]]`. `action` is `"protect"` (with `sa`), `"bypass"` or
/// `"discard"`; selectors left out are `any`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyBuilder {
    /// Unique among policies.
    pub name: String,
    /// `out` (from inside) or `in` (from outside).
    #[serde(with = "text")]
    pub direction: PolicyDirection,
    /// Lower is consulted first; absent, the default (100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Source prefix; absent, any.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub source: Option<IpPrefix>,
    /// Destination prefix; absent, any.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub destination: Option<IpPrefix>,
    /// `any`, `tcp`, `udp`, `icmp`, `sctp` or a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// `"any"`, `"53"` or `"1024-65535"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ports: Option<String>,
    /// As `source_ports`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_ports: Option<String>,
    /// `protect`, `bypass` or `discard`.
    pub action: String,
    /// The SA a `protect` policy names, of its direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sa: Option<String>,
}

impl PolicyBuilder {
    /// Traffic from `source` to `destination` in `direction` passes in the
    /// clear.
    pub fn bypass(
        name: impl Into<String>,
        direction: PolicyDirection,
        source: impl Into<IpPrefix>,
        destination: impl Into<IpPrefix>,
    ) -> PolicyBuilder {
        PolicyBuilder {
            name: name.into(),
            direction,
            priority: None,
            source: Some(source.into()),
            destination: Some(destination.into()),
            protocol: None,
            source_ports: None,
            destination_ports: None,
            action: "bypass".to_owned(),
            sa: None,
        }
    }

    /// Traffic from `source` to `destination` in `direction` goes through
    /// (out) or must have come through (in) the SA named `sa`.
    pub fn protect(
        name: impl Into<String>,
        direction: PolicyDirection,
        (source, destination): (impl Into<IpPrefix>, impl Into<IpPrefix>),
        sa: impl Into<String>,
    ) -> PolicyBuilder {
        PolicyBuilder {
            action: "protect".to_owned(),
            sa: Some(sa.into()),
            ..PolicyBuilder::bypass(name, direction, source, destination)
        }
    }
}

/// A manually keyed `[[sa]]`: one direction, its own SPI and keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaBuilder {
    /// Unique among SAs.
    pub name: String,
    /// `out` (we encapsulate) or `in` (we decapsulate).
    #[serde(with = "text")]
    pub direction: SaDirection,
    /// Its SPI: 256 and up.
    pub spi: u32,
    /// Tunnel or transport; absent, tunnel.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Our end.
    pub local: IpAddr,
    /// The peer's end, of the same family.
    pub remote: IpAddr,
    /// The ESP proposal.
    #[serde(with = "text")]
    pub proposal: Algorithm,
    /// The encryption key (for GCM, the AES key then the salt).
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub enc_key: Option<Vec<u8>>,
    /// The integrity key, for proposals with HMAC.
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub auth_key: Option<Vec<u8>>,
    /// 64-bit extended sequence numbers.
    #[serde(default, skip_serializing_if = "is_false")]
    pub esn: bool,
    /// Inbound: the anti-replay window, in packets (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_window: Option<u32>,
    /// Out: the last number sent; in: the highest seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_seq: Option<u64>,
    /// Inbound only: `"any"` admits every inner packet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selectors: Option<String>,
    /// `udp`: ESP in UDP (RFC 3948).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<Encap>,
    /// With UDP encapsulation, our port (default 4500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_port: Option<u16>,
    /// With UDP encapsulation, the peer's port (default 4500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_udp_port: Option<u16>,
    /// Last: a table, written after the SA's own keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<LifetimeBuilder>,
}

impl SaBuilder {
    /// SA `name` in `direction` with `spi` between `local` and `remote`,
    /// for `proposal`; no keys yet.
    pub fn new(
        name: impl Into<String>,
        direction: SaDirection,
        spi: u32,
        (local, remote): (impl Into<IpAddr>, impl Into<IpAddr>),
        proposal: Algorithm,
    ) -> SaBuilder {
        SaBuilder {
            name: name.into(),
            direction,
            spi,
            mode: None,
            local: local.into(),
            remote: remote.into(),
            proposal,
            enc_key: None,
            auth_key: None,
            esn: false,
            replay_window: None,
            initial_seq: None,
            selectors: None,
            encap: None,
            udp_port: None,
            peer_udp_port: None,
            lifetime: None,
        }
    }

    /// Keys of the proposal's lengths from `key(length, is_auth)`: the
    /// encryption key (with a GCM salt) and, for proposals with HMAC, the
    /// integrity key.
    pub fn keys_with(mut self, mut key: impl FnMut(usize, bool) -> Vec<u8>) -> Self {
        let (enc, auth) = (self.proposal.enc_key_len(), self.proposal.auth_key_len());
        self.enc_key = (enc > 0).then(|| key(enc, false));
        self.auth_key = (auth > 0).then(|| key(auth, true));
        self
    }

    /// `selectors = "any"`: an inbound SA that admits every inner packet.
    pub fn any_selectors(mut self) -> Self {
        self.selectors = Some("any".to_owned());
        self
    }
}

/// RFC 3948 encapsulation of a tunnel's ESP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encap {
    /// Raw ESP, IP protocol 50 (the default).
    None,
    /// ESP in UDP.
    Udp,
}

/// A `[tunnel.lifetime]` (or `[sa.lifetime]`): whichever limit comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifetimeBuilder {
    /// Bytes after which the SA is soft-expired (an event; a tunnel
    /// with a secret rekeys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_bytes: Option<u64>,
    /// Bytes after which the SA stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_bytes: Option<u64>,
    /// Packets after which the SA is soft-expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_packets: Option<u64>,
    /// Packets after which the SA stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_packets: Option<u64>,
    /// Seconds after installation when the SA is soft-expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_seconds: Option<u64>,
    /// Seconds after installation when the SA stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_seconds: Option<u64>,
    /// Seconds without a packet after which the SA is soft-expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_idle_s: Option<u64>,
    /// Seconds without a packet after which the SA stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_idle_s: Option<u64>,
}

/// A `[[tunnel]]`: two SAs and two policies between `local_subnet` behind
/// `local` and `remote_subnet` behind `remote`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelBuilder {
    /// The same at both ends; names its SAs and policies.
    pub name: String,
    /// Our end.
    pub local: IpAddr,
    /// The peer's end.
    pub remote: IpAddr,
    /// The network behind us; absent in transport mode, `local`/32.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub local_subnet: Option<IpPrefix>,
    /// The network behind the peer.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub remote_subnet: Option<IpPrefix>,
    /// The protocol its policies select; absent, any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Tunnel or transport; absent, tunnel.
    #[serde(default, with = "opt_text", skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The ESP proposal of both SAs.
    #[serde(with = "text")]
    pub proposal: Algorithm,
    /// Left out with a `secret`: the exchange picks them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spi_out: Option<u32>,
    /// The SPI we expect; left out with a `secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spi_in: Option<u32>,
    /// Our outbound encryption key (the peer's inbound one).
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub enc_key_out: Option<Vec<u8>>,
    /// Our inbound encryption key.
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub enc_key_in: Option<Vec<u8>>,
    /// Our outbound integrity key, for proposals with HMAC.
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub auth_key_out: Option<Vec<u8>>,
    /// Our inbound integrity key.
    #[serde(default, with = "opt_hex", skip_serializing_if = "Option::is_none")]
    pub auth_key_in: Option<Vec<u8>>,
    /// 64-bit extended sequence numbers on both SAs.
    #[serde(default, skip_serializing_if = "is_false")]
    pub esn: bool,
    /// The inbound SA's anti-replay window, in packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_window: Option<u32>,
    /// Its policies' priority; lower is consulted first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// As [`SaBuilder::initial_seq`], for the outbound SA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_seq_out: Option<u64>,
    /// As [`SaBuilder::initial_seq`], for the inbound SA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_seq_in: Option<u64>,
    /// A pre-shared secret (16 characters or more): the tunnel is keyed
    /// by exchanges with the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// `udp`: ESP in UDP, and the rekey exchange on its ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encap: Option<Encap>,
    /// With UDP encapsulation, our port (default 4500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_port: Option<u16>,
    /// With UDP encapsulation, the peer's port (default 4500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_udp_port: Option<u16>,
    /// Last: a table, written after the tunnel's own keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<LifetimeBuilder>,
}

impl TunnelBuilder {
    /// Tunnel `name` from `local` to `remote` with `proposal`, sending
    /// with `spi_out` and receiving with `spi_in`; no keys yet.
    pub fn new(
        name: impl Into<String>,
        (local, remote): (impl Into<IpAddr>, impl Into<IpAddr>),
        proposal: Algorithm,
        (spi_out, spi_in): (u32, u32),
    ) -> TunnelBuilder {
        TunnelBuilder {
            name: name.into(),
            local: local.into(),
            remote: remote.into(),
            local_subnet: None,
            remote_subnet: None,
            protocol: None,
            mode: None,
            proposal,
            spi_out: Some(spi_out),
            spi_in: Some(spi_in),
            enc_key_out: None,
            enc_key_in: None,
            auth_key_out: None,
            auth_key_in: None,
            esn: false,
            replay_window: None,
            priority: None,
            initial_seq_out: None,
            initial_seq_in: None,
            secret: None,
            encap: None,
            udp_port: None,
            peer_udp_port: None,
            lifetime: None,
        }
    }

    /// The networks behind the two ends: IPv4 or IPv6 (both the same).
    pub fn subnets(mut self, local: impl Into<IpPrefix>, remote: impl Into<IpPrefix>) -> Self {
        self.local_subnet = Some(local.into());
        self.remote_subnet = Some(remote.into());
        self
    }

    /// `mode`: tunnel (the default) or transport.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Keys of the proposal's lengths, from `key(direction, length,
    /// is_auth)`: the encryption key (with a GCM salt) and, for proposals
    /// with HMAC, the integrity key, for `"out"` and `"in"`. A proposal
    /// without a key of a kind gets no such key.
    pub fn keys_with(mut self, mut key: impl FnMut(&str, usize, bool) -> Vec<u8>) -> Self {
        let (enc, auth) = (self.proposal.enc_key_len(), self.proposal.auth_key_len());
        let some = |len: usize, k: Vec<u8>| (len > 0).then_some(k);
        self.enc_key_out = some(enc, key("out", enc, false));
        self.auth_key_out = some(auth, key("out", auth, true));
        self.enc_key_in = some(enc, key("in", enc, false));
        self.auth_key_in = some(auth, key("in", auth, true));
        self
    }

    /// `esn`: 64-bit extended sequence numbers on both SAs.
    pub fn esn(mut self, esn: bool) -> Self {
        self.esn = esn;
        self
    }

    /// `replay_window`: the inbound SA's window, in packets (0: none).
    pub fn replay_window(mut self, window: u32) -> Self {
        self.replay_window = Some(window);
        self
    }

    /// A `secret`: the tunnel is keyed by an exchange with the peer, so
    /// its SPIs, keys and initial sequence numbers go.
    pub fn secret(mut self, secret: impl Into<String>) -> Self {
        self.secret = Some(secret.into());
        self.spi_out = None;
        self.spi_in = None;
        self.enc_key_out = None;
        self.enc_key_in = None;
        self.auth_key_out = None;
        self.auth_key_in = None;
        self.initial_seq_out = None;
        self.initial_seq_in = None;
        self
    }

    /// `encap = "udp"`, on the default ports unless set after.
    pub fn udp_encap(mut self) -> Self {
        self.encap = Some(Encap::Udp);
        self
    }

    /// `[tunnel.lifetime]`: its SAs' limits; the soft ones start a rekey
    /// when the tunnel has a secret.
    pub fn lifetime(mut self, lifetime: LifetimeBuilder) -> Self {
        self.lifetime = Some(lifetime);
        self
    }
}

/// `[rekey]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RekeySection {
    /// How long replaced SAs still take packets already on their way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
    /// First retransmission timeout; doubled on each retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmit_ms: Option<u64>,
    /// Retransmissions before giving up on the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// After giving up, when a new attempt starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
}

/// `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Learnt ARP entries per interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbors_per_interface: Option<u32>,
    /// ICMP errors the whole gateway may send a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_errors_per_second: Option<u32>,
    /// How many of them may go at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_burst: Option<u32>,
    /// One error per source this often (0: no per-source limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_per_source_ms: Option<u32>,
    /// How many a source may get at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_per_source_burst: Option<u32>,
    /// Sources tracked at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_sources: Option<u32>,
}

/// A value written as its `Display` text and read back with `FromStr`.
mod text {
    use super::*;

    pub(crate) fn serialize<T: Display, S: serde::Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub(crate) fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: std::fmt::Debug,
        D: serde::Deserializer<'de>,
    {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| serde::de::Error::custom(format!("`{text}`: {e:?}")))
    }
}

/// [`text`] for an optional value (with `skip_serializing_if`).
mod opt_text {
    use super::*;

    pub(crate) fn serialize<T: Display, S: serde::Serializer>(
        value: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: std::fmt::Debug,
        D: serde::Deserializer<'de>,
    {
        super::text::deserialize(d).map(Some)
    }
}

/// Key bytes as lower-case hex.
mod opt_hex {
    use super::*;

    pub(crate) fn serialize<S: serde::Serializer>(value: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => s.serialize_str(&bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text = String::deserialize(d)?;
        crate::config::decode_hex_key(&text)
            .map(|k| Some(k.to_vec()))
            .ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not hex")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use accel::EngineSpec;
    use spd_sad::UdpEncap;

    fn net(text: &str) -> Ipv4Prefix {
        text.parse().unwrap()
    }

    /// Every key a builder writes, set to something other than the
    /// parser's default.
    fn everything() -> ConfigBuilder {
        let alg = Algorithm::Aes256Sha256;
        ConfigBuilder::new()
            .name("everything")
            .allow_insecure_null()
            .outer_ttl(32)
            .nat_keepalive_s(7)
            .state_dir("state")
            .on_device_loss(DeviceLoss::Exit)
            .accel(AccelSection {
                engine: Some(EngineKind::Sec),
                style: Some(Style::Sync),
                buffers: Some(BufferPolicy::PerRequest),
                channels: Some(2),
                fifo_depth: Some(16),
                completion: Some("coalesced".into()),
                coalesce_count: Some(4),
                coalesce_usecs: Some(20),
                fail_every: Some(9),
                lose_completion_every: Some(11),
                ..AccelSection::default()
            })
            .interface(
                InterfaceBuilder::inside("in0", Ipv4Addr::new(192, 168, 1, 1), 24)
                    .mac(EthernetAddress([2, 0, 0, 0, 1, 1]))
                    .mtu(1400),
            )
            .interface(InterfaceBuilder::outside("out0", Ipv4Addr::new(10, 0, 0, 1), 24).mtu(9000))
            .route_via(net("192.168.2.0/24"), Ipv4Addr::new(10, 0, 0, 2))
            .route(RouteBuilder {
                destination: net("172.16.0.0/16").into(),
                via: None,
                interface: Some("outside".into()),
            })
            .neighbor(Ipv4Addr::new(10, 0, 0, 2), EthernetAddress([2, 0, 0, 0, 0, 2]))
            .policy(PolicyBuilder {
                priority: Some(5),
                protocol: Some("udp".into()),
                destination_ports: Some("53".into()),
                source_ports: Some("1024-65535".into()),
                ..PolicyBuilder::bypass(
                    "dns",
                    PolicyDirection::Out,
                    net("192.168.1.0/24"),
                    net("192.168.3.0/24"),
                )
            })
            .policy(PolicyBuilder::protect(
                "m-in",
                PolicyDirection::In,
                (net("192.168.4.0/24"), net("192.168.1.0/24")),
                "m-in",
            ))
            .sa(SaBuilder {
                mode: Some(Mode::Transport),
                esn: true,
                replay_window: Some(256),
                initial_seq: Some(41),
                lifetime: Some(LifetimeBuilder {
                    hard_packets: Some(99),
                    ..LifetimeBuilder::default()
                }),
                ..SaBuilder::new(
                    "m-in",
                    SaDirection::Inbound,
                    0x3001,
                    (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 4)),
                    alg,
                )
                .keys_with(|len, auth| pattern_key(len, 3, 50 + u8::from(auth)))
            })
            .sa(SaBuilder {
                encap: Some(Encap::Udp),
                udp_port: Some(4503),
                peer_udp_port: Some(4504),
                ..SaBuilder::new(
                    "m-out",
                    SaDirection::Outbound,
                    0x3002,
                    (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 5)),
                    Algorithm::Aes128Gcm16,
                )
                .keys_with(|len, _| pattern_key(len, 5, 60))
            })
            .sa(SaBuilder::new(
                "m-any",
                SaDirection::Inbound,
                0x3003,
                (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 6)),
                Algorithm::Aes128Gcm16,
            )
            .keys_with(|len, _| pattern_key(len, 5, 70))
            .any_selectors())
            .rekey(RekeySection {
                grace_ms: Some(300),
                retransmit_ms: Some(20),
                retries: Some(3),
                retry_after_s: Some(9),
            })
            .limits(LimitsSection {
                neighbors_per_interface: Some(64),
                icmp_errors_per_second: Some(10),
                icmp_burst: Some(3),
                icmp_per_source_ms: Some(0),
                icmp_per_source_burst: Some(2),
                icmp_sources: Some(16),
            })
            .tunnel(TunnelBuilder {
                protocol: Some("udp".into()),
                priority: Some(50),
                initial_seq_out: Some(7),
                initial_seq_in: Some(8),
                udp_port: Some(4501),
                peer_udp_port: Some(4502),
                ..TunnelBuilder::new(
                    "t",
                    (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)),
                    alg,
                    (0x1001, 0x1002),
                )
                .subnets(net("192.168.1.0/24"), net("192.168.2.0/24"))
                .mode(Mode::Tunnel)
                .keys_with(|dir, len, auth| pattern_key(len, 7, u8::from(dir == "in") + u8::from(auth) * 100))
                .esn(true)
                .replay_window(128)
                .udp_encap()
                .lifetime(LifetimeBuilder {
                    soft_bytes: Some(1000),
                    hard_bytes: Some(2000),
                    soft_packets: Some(10),
                    hard_packets: Some(20),
                    soft_seconds: Some(30),
                    hard_seconds: Some(60),
                    soft_idle_s: Some(5),
                    hard_idle_s: Some(9),
                })
            })
            .tunnel(
                TunnelBuilder::new(
                    "s",
                    (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 3)),
                    alg,
                    (0x1003, 0x1004),
                )
                .subnets(net("192.168.1.0/24"), net("192.168.5.0/24"))
                .secret("a builder test secret, long enough"),
            )
    }

    /// The text reads back into the same builder: nothing is lost or
    /// renamed on the way through TOML.
    #[test]
    fn the_text_reads_back_as_the_builder() {
        let built = everything();
        let text = built.to_toml();
        let back: ConfigBuilder = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, built, "{text}");
    }

    /// The real parser takes the text, and what it validates is what was
    /// built, key by key.
    #[test]
    fn the_parser_reads_what_was_built() {
        let built = everything();
        let config = built
            .parse()
            .unwrap_or_else(|e| panic!("{e}\n{}", built.to_toml()));
        assert_eq!(config.name, "everything");
        assert!(config.allow_insecure_null);
        assert_eq!(config.outer_ttl, 32);
        assert_eq!(config.nat_keepalive, Some(std::time::Duration::from_secs(7)));
        assert_eq!(config.state_dir, Some(std::path::PathBuf::from("state")));
        assert_eq!(config.on_device_loss, DeviceLoss::Exit);

        let EngineSpec {
            kind, buffers, sec, ..
        } = &config.engine;
        assert_eq!(
            (*kind, *buffers, config.style),
            (EngineKind::Sec, BufferPolicy::PerRequest, Style::Sync)
        );
        assert_eq!((sec.channels, sec.fifo_depth), (2, 16));
        assert_eq!(
            sec.completion,
            accel::Completion::Coalesced {
                count: 4,
                timeout: std::time::Duration::from_micros(20)
            }
        );
        assert_eq!(
            (sec.faults.fail_every, sec.faults.drop_completion_every),
            (Some(9), Some(11))
        );

        assert_eq!(config.inside.device, "in0");
        assert_eq!(config.inside.address, Ipv4Addr::new(192, 168, 1, 1));
        assert_eq!(config.inside.network, net("192.168.1.0/24"));
        assert_eq!(config.inside.mac, EthernetAddress([2, 0, 0, 0, 1, 1]));
        assert_eq!((config.inside.mtu, config.outside.mtu), (1400, 9000));
        assert_eq!(config.outside.address, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(config.routes.len(), 2);
        assert_eq!(config.routes[0].destination, net("192.168.2.0/24"));
        assert_eq!(config.routes[0].via, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(config.routes[1].via, None);
        assert_eq!(
            config.neighbors,
            [(
                Ipv4Addr::new(10, 0, 0, 2).into(),
                EthernetAddress([2, 0, 0, 0, 0, 2])
            )]
        );
        assert_eq!(config.rekey.grace, std::time::Duration::from_millis(300));
        assert_eq!(config.rekey.retries, 3);
        assert_eq!(config.limits.icmp.burst, 3);

        let tunnel = config.tunnel("t").expect("the tunnel");
        let built_tunnel = &built.tunnels[0];
        assert_eq!(
            (tunnel.local, tunnel.remote),
            (built_tunnel.local, built_tunnel.remote)
        );
        assert_eq!(
            (tunnel.algorithm, tunnel.mode, tunnel.esn),
            (Algorithm::Aes256Sha256, Mode::Tunnel, true)
        );
        assert_eq!(tunnel.replay_window, 128);
        assert_eq!(
            tunnel.encap,
            Some(UdpEncap {
                local_port: 4501,
                remote_port: 4502
            })
        );
        assert!(tunnel.secret.is_none());
        let keyed = config.tunnel("s").expect("the tunnel with a secret");
        assert_eq!(
            keyed.secret.as_deref().map(Vec::as_slice),
            Some(&b"a builder test secret, long enough"[..])
        );
        // Its SAs are templates the exchange keys: no SPI, no keys.
        let template = config.sa("s-in").expect("the template");
        assert_eq!(template.keys, crate::KeySource::Exchange);
        assert_eq!((template.params.spi, template.enc_key.len()), (0, 0));
        assert_eq!(template.params.selectors.len(), 1, "the inbound policy's");
        let life = tunnel.lifetime;
        assert_eq!((life.soft.bytes, life.hard.bytes), (Some(1000), Some(2000)));
        assert_eq!((life.soft.packets, life.hard.packets), (Some(10), Some(20)));
        assert_eq!((life.soft.seconds, life.hard.seconds), (Some(30), Some(60)));
        assert_eq!(
            (life.soft.idle_seconds, life.hard.idle_seconds),
            (Some(5), Some(9))
        );

        let out = config.sa("t-out").expect("the outbound SA");
        assert_eq!(out.keys, crate::KeySource::File);
        assert_eq!(out.params.direction, SaDirection::Outbound);
        assert_eq!(out.params.spi, 0x1001);
        assert_eq!(out.initial_seq, 7);
        assert_eq!(Some(out.enc_key.to_vec()), built_tunnel.enc_key_out);
        assert_eq!(Some(out.auth_key.to_vec()), built_tunnel.auth_key_out);
        let inbound = config.sa("t-in").expect("the inbound SA");
        assert_eq!(inbound.params.spi, 0x1002);
        assert_eq!(inbound.initial_seq, 8);
        assert_eq!(Some(inbound.enc_key.to_vec()), built_tunnel.enc_key_in);
        assert_eq!(Some(inbound.auth_key.to_vec()), built_tunnel.auth_key_in);

        let dns = config
            .policies
            .iter()
            .find(|p| p.name == "dns")
            .expect("the bypass policy");
        assert_eq!(dns.priority, 5);
        assert_eq!(dns.action, crate::PolicyAction::Bypass);
        assert_eq!(dns.selector.dst, net("192.168.3.0/24").into());
        let tunnel_out = config
            .policies
            .iter()
            .find(|p| p.name == "t-out")
            .expect("the tunnel's policy");
        assert_eq!(tunnel_out.priority, 50);

        // The manually keyed SAs, every key of the first.
        let manual = config.sa("m-in").expect("the manual inbound SA");
        let built_manual = &built.sas[0];
        let p = &manual.params;
        assert_eq!(
            (p.direction, p.spi, p.mode, p.esn, p.replay_window),
            (SaDirection::Inbound, 0x3001, Mode::Transport, true, 256)
        );
        assert_eq!((p.local, p.remote), (built_manual.local, built_manual.remote));
        assert_eq!(manual.algorithm, Algorithm::Aes256Sha256);
        assert_eq!(Some(manual.enc_key.to_vec()), built_manual.enc_key);
        assert_eq!(Some(manual.auth_key.to_vec()), built_manual.auth_key);
        assert_eq!(manual.initial_seq, 41);
        assert_eq!(p.encap, None);
        assert_eq!(p.lifetime.hard.packets, Some(99));
        assert!(!manual.admits_any);
        assert_eq!(p.selectors.len(), 1, "the protect policy's");
        assert_eq!(p.selectors[0].src, net("192.168.4.0/24").into());
        let out = config.sa("m-out").expect("the manual outbound SA");
        assert_eq!(
            (out.params.direction, out.params.spi, out.algorithm),
            (SaDirection::Outbound, 0x3002, Algorithm::Aes128Gcm16)
        );
        assert!(out.auth_key.is_empty(), "GCM has no integrity key");
        assert_eq!(
            out.params.encap,
            Some(UdpEncap {
                local_port: 4503,
                remote_port: 4504
            })
        );
        assert!(config.sa("m-any").expect("the any SA").admits_any);
    }

    /// The shared test site parses for every proposal, mode and end.
    #[test]
    fn the_test_site_is_valid_for_every_proposal() {
        for alg in Algorithm::ALL {
            for mode in [Mode::Tunnel, Mode::Transport] {
                for a in [true, false] {
                    let site = test_site(alg, mode, true, a);
                    let config = site.parse().unwrap_or_else(|e| panic!("{e}\n{}", site.to_toml()));
                    assert_eq!(
                        config.tunnel("t").map(|t| (t.algorithm, t.mode)),
                        Some((alg, mode))
                    );
                }
            }
        }
    }

    /// A minimal tunnel in transport mode with its defaults left to the
    /// parser, and the `shared` engine's keys.
    #[test]
    fn left_out_keys_take_the_parsers_defaults() {
        let built = ConfigBuilder::new()
            .accel(AccelSection {
                engine: Some(EngineKind::Shared),
                socket: Some("/run/espgw-engine.sock".into()),
                ..AccelSection::default()
            })
            .interface(InterfaceBuilder::inside("in0", Ipv4Addr::new(192, 168, 1, 1), 24))
            .interface(InterfaceBuilder::outside("out0", Ipv4Addr::new(10, 0, 0, 1), 24))
            .tunnel(
                TunnelBuilder::new(
                    "t",
                    (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)),
                    Algorithm::Aes128Gcm16,
                    (0x1001, 0x1002),
                )
                .mode(Mode::Transport)
                .keys_with(|dir, len, _| pattern_key(len, 1, u8::from(dir == "in"))),
            );
        let text = built.to_toml();
        assert!(!text.contains("esn"), "{text}");
        let config = built.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(config.engine.shared.socket, Path::new("/run/espgw-engine.sock"));
        let tunnel = config.tunnel("t").unwrap();
        assert_eq!(
            (tunnel.mode, tunnel.esn, tunnel.encap),
            (Mode::Transport, false, None)
        );
        assert_eq!(tunnel.replay_window, crate::config::DEFAULT_REPLAY_WINDOW);
        assert!(config.sa("t-out").unwrap().auth_key.is_empty());
    }
}
