//! What the sweep measures: scenarios, and the pair of gateways each one
//! runs through, configured from TOML (written by `ike_stub::builder`)
//! and validated exactly as a user's file is.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use accel::{Algorithm, BufferPolicy, Completion, DeviceProfile, EngineKind, EngineSpec, SecConfig, Style};
use dataplane::{Gateway, LinkLayer};
use ike_stub::builder::{pattern_key, ConfigBuilder, InterfaceBuilder, PolicyBuilder, TunnelBuilder};
use smoltcp::wire::EthernetAddress;
use spd_sad::{Ipv4Prefix, Ipv6Prefix, PolicyDirection};
use strum::{Display, EnumString, IntoStaticStr, VariantArray, VariantNames};

/// How the `sec` engine signals completions (`--completion`).
///
/// Names (`--completion` values, JSON, scenario names) are the variants in
/// kebab case, derived once for strum and serde alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[derive(VariantArray, VariantNames, IntoStaticStr, EnumString, Display)]
#[strum(serialize_all = "kebab-case")]
pub enum CompletionMode {
    /// Wake the dataplane on every completion.
    #[default]
    Interrupt,
    /// The dataplane spins on the done rings.
    Polling,
    /// Wake after 8 completions or 50 µs.
    Coalesced,
}

accel::name_table!(CompletionMode);

impl CompletionMode {
    /// The mode named by a `--completion` value; fails with a message
    /// naming the accepted values.
    pub fn parse(text: &str) -> anyhow::Result<CompletionMode> {
        text.parse().map_err(|_| {
            anyhow::anyhow!(
                "--completion `{text}`: expected {}",
                accel::one_of(CompletionMode::NAMES)
            )
        })
    }

    /// The engine's setting for this mode (coalesced: 8 completions or
    /// 50 µs, whichever comes first).
    pub fn to_accel(self) -> Completion {
        match self {
            CompletionMode::Interrupt => Completion::Interrupt,
            CompletionMode::Polling => Completion::Polling,
            CompletionMode::Coalesced => Completion::Coalesced {
                count: 8,
                timeout: Duration::from_micros(50),
            },
        }
    }
}

/// Buffer policy, completion signalling, device profile and burst size of
/// an ESP scenario. The sweep's own (`--buffers`, `--completion`, `--rate`)
/// apply to every main ESP scenario; the comparison cells change one or two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Knobs {
    /// Registered buffers (zero copy) or a bounce buffer per request.
    pub buffers: BufferPolicy,
    /// Only the `sec` engine signals completions; ignored elsewhere.
    pub completion: CompletionMode,
    /// The `sec` model's device profile (a `DeviceProfile::NAMES` entry).
    pub profile: &'static str,
    /// Frames per `handle_batch` call (descriptors per doorbell, at most).
    pub burst: usize,
}

/// The profile scenario names leave unsaid.
pub const DEFAULT_PROFILE: &str = "sec2-266mhz";

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            buffers: BufferPolicy::default(),
            completion: CompletionMode::default(),
            profile: DEFAULT_PROFILE,
            burst: crate::measure::BATCH,
        }
    }
}

impl Knobs {
    /// `name` as the `&'static str` of a known profile.
    pub fn profile_name(name: &str) -> anyhow::Result<&'static str> {
        DeviceProfile::NAMES
            .iter()
            .copied()
            .find(|n| *n == name)
            .ok_or_else(|| anyhow::anyhow!("--rate: {}", accel::UnknownProfile(name.to_owned())))
    }
}

/// One row group of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// Plain IPv4 forwarding through the same pipeline, no IPsec.
    Ipv4Forward,
    /// Plain IPv6 forwarding: the IPv6 baseline.
    Ipv6Forward,
    /// ESP null/null with IPv6 inside and out (6-in-6) on the inline
    /// engine: against `ipv6-fwd`, the stack's cost for IPv6.
    EspNull6,
    /// ESP with a transform, on an engine, in a submission style.
    Esp {
        /// The ESP transform.
        algorithm: Algorithm,
        /// The engine behind the boundary.
        engine: EngineKind,
        /// How the gateway submits to it: sync, dual-pass or async.
        style: Style,
        /// Buffers, completion, device profile and burst size.
        knobs: Knobs,
    },
    /// The transform's primitive alone over a buffer of the same size: the
    /// ceiling the ESP path is measured against.
    RawCrypto {
        /// The transform whose primitive runs.
        algorithm: Algorithm,
    },
}

impl Scenario {
    /// ESP with the default buffer policy and completion signalling.
    pub fn esp(algorithm: Algorithm, engine: EngineKind, style: Style) -> Scenario {
        Scenario::Esp {
            algorithm,
            engine,
            style,
            knobs: Knobs::default(),
        }
    }

    /// `ipv4-fwd`, `esp-null`, `aes128gcm16/soft` (soft inline, single
    /// pass), `aes128gcm16/sec/async`, `aes128-sha1/sec/async+per-request`,
    /// `aes128-sha1/sec/async+polling`, `aes128gcm16/raw`.
    pub fn name(&self) -> String {
        match *self {
            Scenario::Ipv4Forward => "ipv4-fwd".into(),
            Scenario::Ipv6Forward => "ipv6-fwd".into(),
            Scenario::EspNull6 => "esp-null-ipv6".into(),
            Scenario::Esp {
                algorithm,
                engine,
                style,
                knobs,
            } => {
                let mut name = if algorithm == Algorithm::Null {
                    "esp-null".to_owned()
                } else {
                    algorithm.to_string()
                };
                let inline = engine == EngineKind::Soft && style == Style::Async;
                let mut suffix = String::new();
                if knobs.buffers != BufferPolicy::Registered {
                    suffix += &format!("+{}", knobs.buffers);
                }
                if engine == EngineKind::Sec && knobs.completion != CompletionMode::Interrupt {
                    suffix += &format!("+{}", knobs.completion);
                }
                if engine == EngineKind::Sec && knobs.profile != DEFAULT_PROFILE {
                    suffix = format!("@{}{suffix}", knobs.profile);
                }
                if knobs.burst != crate::measure::BATCH {
                    suffix += &format!("+burst{}", knobs.burst);
                }
                if !(algorithm == Algorithm::Null && inline && suffix.is_empty()) {
                    if inline {
                        name += "/soft";
                    } else {
                        name += &format!("/{engine}/{style}");
                    }
                }
                name + &suffix
            }
            Scenario::RawCrypto { algorithm } => format!("{algorithm}/raw"),
        }
    }

    /// The scenario's transform (`null` for `esp-null-ipv6`); `None` for
    /// plain forwarding.
    pub fn algorithm(&self) -> Option<Algorithm> {
        match *self {
            Scenario::Ipv4Forward | Scenario::Ipv6Forward => None,
            Scenario::EspNull6 => Some(Algorithm::Null),
            Scenario::Esp { algorithm, .. } | Scenario::RawCrypto { algorithm } => Some(algorithm),
        }
    }
}

impl Scenario {
    /// Whether the scenario's packets (and tunnel) are IPv6.
    pub fn is_ipv6(&self) -> bool {
        matches!(self, Scenario::Ipv6Forward | Scenario::EspNull6)
    }

    /// The plain forwarding row of the scenario's address family.
    pub fn forwarding(&self) -> Scenario {
        if self.is_ipv6() {
            Scenario::Ipv6Forward
        } else {
            Scenario::Ipv4Forward
        }
    }
}

impl serde::Serialize for Scenario {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name())
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The bench tunnel `t` between `ends`, for `nets`, with both ends'
/// keys from one pattern (either family).
fn tunnel(
    alg: Algorithm,
    a: bool,
    ends: (impl Into<std::net::IpAddr>, impl Into<std::net::IpAddr>),
    (my_net, peer_net): (impl Into<spd_sad::IpPrefix>, impl Into<spd_sad::IpPrefix>),
    replay_window: u32,
) -> TunnelBuilder {
    let (spis, seed_out, seed_in) = if a {
        ((0x1001, 0x1002), 1, 2)
    } else {
        ((0x1002, 0x1001), 2, 1)
    };
    TunnelBuilder::new("t", ends, alg, spis)
        .subnets(my_net, peer_net)
        .keys_with(|dir, len, auth| {
            let seed = if dir == "out" { seed_out } else { seed_in };
            pattern_key(len, 13, if auth { seed + 50 } else { seed })
        })
        .replay_window(replay_window)
}

/// The configuration of one end; `a` is the 192.168.1.0/24 side.
pub fn config(algorithm: Option<Algorithm>, a: bool, replay_window: u32) -> ConfigBuilder {
    let third = |a: bool| if a { 1 } else { 2 };
    let gw = |a: bool| Ipv4Addr::new(10, 0, 0, third(a));
    let net = |a: bool| Ipv4Prefix::new(Ipv4Addr::new(192, 168, third(a), 0), 24).expect("a /24 network");
    let (me, peer) = (gw(a), gw(!a));
    let (my_net, peer_net) = (net(a), net(!a));
    let config = ConfigBuilder::new()
        .name(format!("bench-{}", if a { "a" } else { "b" }))
        .allow_insecure_null()
        .interface(InterfaceBuilder::inside(
            "bench-in",
            Ipv4Addr::new(192, 168, third(a), 1),
            24,
        ))
        .interface(InterfaceBuilder::outside("bench-out", me, 24))
        .route_via(peer_net, peer)
        .neighbor(peer, EthernetAddress([0x02, 0, 0, 0, 0, third(!a)]));
    between(
        config,
        algorithm,
        a,
        (me, peer),
        (my_net, peer_net),
        replay_window,
    )
}

/// [`config`] for IPv6 (`ipv6-fwd`, `esp-null-ipv6`): the same two
/// gateways, with 2001:db8:1::/64 and 2001:db8:2::/64 inside and their
/// outside ends 2001:db8:ff::1 and ::2; a tunnel with IPv6 ends, or
/// bypass policies and an IPv6 route for plain forwarding.
pub fn config6(algorithm: Option<Algorithm>, a: bool, replay_window: u32) -> ConfigBuilder {
    let third = |a: bool| if a { 1 } else { 2 };
    let outer = |a: bool| Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, third(a));
    let net = |a: bool| {
        Ipv6Prefix::new(Ipv6Addr::new(0x2001, 0xdb8, third(a), 0, 0, 0, 0, 0), 64).expect("a /64 network")
    };
    let (me, peer) = (outer(a), outer(!a));
    let (my_net, peer_net) = (net(a), net(!a));
    let config = ConfigBuilder::new()
        .name(format!("bench6-{}", if a { "a" } else { "b" }))
        .allow_insecure_null()
        .interface(
            InterfaceBuilder::inside("bench-in", Ipv4Addr::new(192, 168, third(a) as u8, 1), 24)
                .address6(format!("2001:db8:{}::1/64", third(a))),
        )
        // A jumbo outside link: an IPv6 tunnel never fragments, and every
        // size of the sweep must cross it (the IPv4 rows fragment instead).
        .interface(
            InterfaceBuilder::outside("bench-out", Ipv4Addr::new(10, 0, 0, third(a) as u8), 24)
                .address6(format!("{me}/64"))
                .mtu(9000),
        );
    // The IPv4 pair's route to the peer's network is in `config`; IPv6
    // forwarding needs one of its own.
    let config = match algorithm {
        None => config.route_via(peer_net, peer),
        Some(_) => config,
    };
    between(
        config,
        algorithm,
        a,
        (me, peer),
        (my_net, peer_net),
        replay_window,
    )
}

/// What joins the two ends: the tunnel `t`, or (`algorithm` none) bypass
/// policies between the networks for plain forwarding.
fn between<A: Into<std::net::IpAddr>, P: Into<spd_sad::IpPrefix> + Copy>(
    config: ConfigBuilder,
    algorithm: Option<Algorithm>,
    a: bool,
    ends: (A, A),
    (my_net, peer_net): (P, P),
    replay_window: u32,
) -> ConfigBuilder {
    match algorithm {
        None => config
            .policy(PolicyBuilder::bypass(
                "fwd-out",
                PolicyDirection::Out,
                my_net,
                peer_net,
            ))
            .policy(PolicyBuilder::bypass(
                "fwd-in",
                PolicyDirection::In,
                peer_net,
                my_net,
            )),
        Some(alg) => config.tunnel(tunnel(alg, a, ends, (my_net, peer_net), replay_window)),
    }
}

/// The engine one scenario runs on.
#[derive(Debug, Clone, Default)]
pub struct EngineSetup {
    /// The engine to build: kind, buffer policy and the `sec` model's
    /// settings.
    pub spec: EngineSpec,
    /// The submission style the gateway uses with it.
    pub style: Style,
}

impl EngineSetup {
    /// The engine of `scenario` (plain forwarding and raw crypto: inline
    /// software); the `sec` engine model's device is the scenario's
    /// profile; `threads` picks the threaded variant instead of the model.
    pub fn for_scenario(scenario: &Scenario, threads: bool) -> EngineSetup {
        match *scenario {
            Scenario::Esp {
                engine, style, knobs, ..
            } => EngineSetup {
                spec: EngineSpec {
                    kind: engine,
                    buffers: knobs.buffers,
                    sec: SecConfig {
                        buffers: knobs.buffers,
                        // A low-level synchronous engine has no interrupt to
                        // wait on: the caller spins on the done bit (the
                        // Freescale study's "polls the output FIFO").
                        completion: if style == Style::Sync && !threads {
                            Completion::Polling
                        } else {
                            knobs.completion.to_accel()
                        },
                        threads,
                        ..SecConfig::with_profile(
                            DeviceProfile::by_name(knobs.profile)
                                .unwrap_or_else(|_| DeviceProfile::sec2_266mhz()),
                        )
                    },
                    ..EngineSpec::default()
                },
                style,
            },
            _ => EngineSetup::default(),
        }
    }

    /// `kind/style`, e.g. `sec/async`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.spec.kind, self.style)
    }
}

/// A gateway for one end of `algorithm` (`None`: plain forwarding).
pub fn gateway(
    algorithm: Option<Algorithm>,
    a: bool,
    replay_window: u32,
    engine: &EngineSetup,
) -> anyhow::Result<Gateway> {
    gateway_of(config(algorithm, a, replay_window), engine)
}

/// [`gateway`] of the IPv6 pair ([`config6`]).
pub fn gateway6(
    algorithm: Option<Algorithm>,
    a: bool,
    replay_window: u32,
    engine: &EngineSetup,
) -> anyhow::Result<Gateway> {
    gateway_of(config6(algorithm, a, replay_window), engine)
}

fn gateway_of(config: ConfigBuilder, engine: &EngineSetup) -> anyhow::Result<Gateway> {
    let config = config.parse_as(Path::new("<bench>"))?;
    let built = accel::build_engine(&engine.spec)?;
    Ok(Gateway::with_commands(
        config.setup(LinkLayer::Ethernet, engine.style),
        built,
        &config.commands(),
        Duration::ZERO,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are `--completion` values and parts of scenario names in
    /// the results' JSON and CSV: deriving them must not rename one.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        assert_eq!(CompletionMode::NAMES, ["interrupt", "polling", "coalesced"]);
        for (mode, name) in CompletionMode::ALL.into_iter().zip(CompletionMode::NAMES) {
            assert_eq!(mode.to_string(), *name);
            assert_eq!(CompletionMode::parse(name).unwrap(), mode);
            assert_eq!(serde_json::to_value(mode).unwrap(), *name);
        }
        assert_eq!(
            CompletionMode::parse("msi").unwrap_err().to_string(),
            "--completion `msi`: expected interrupt, polling or coalesced"
        );
    }
}
