//! What the sweep measures: scenarios, and the pair of gateways each one
//! runs through, configured from generated TOML exactly as a user would.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use accel::{Algorithm, BufferPolicy, Completion, DeviceProfile, EngineKind, EngineSpec, SecConfig, Style};
use dataplane::{Gateway, LinkLayer};
use ike_stub::Config;
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
    pub fn parse(text: &str) -> anyhow::Result<CompletionMode> {
        text.parse().map_err(|_| {
            anyhow::anyhow!(
                "--completion `{text}`: expected {}",
                accel::one_of(CompletionMode::NAMES)
            )
        })
    }

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
    /// ESP with a transform, on an engine, in a submission style.
    Esp {
        algorithm: Algorithm,
        engine: EngineKind,
        style: Style,
        knobs: Knobs,
    },
    /// The transform's primitive alone over a buffer of the same size: the
    /// ceiling the ESP path is measured against.
    RawCrypto { algorithm: Algorithm },
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

    pub fn algorithm(&self) -> Option<Algorithm> {
        match *self {
            Scenario::Ipv4Forward => None,
            Scenario::Esp { algorithm, .. } | Scenario::RawCrypto { algorithm } => Some(algorithm),
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

fn key_hex(len: usize, seed: u8) -> String {
    (0..len)
        .map(|i| format!("{:02x}", (i as u8).wrapping_mul(13).wrapping_add(seed)))
        .collect()
}

/// Configuration text of one end; `a` is the 192.168.1.0/24 side.
pub fn config_text(algorithm: Option<Algorithm>, a: bool, replay_window: u32) -> String {
    let (me, peer, my_net, peer_net) = if a {
        ("10.0.0.1", "10.0.0.2", "192.168.1", "192.168.2")
    } else {
        ("10.0.0.2", "10.0.0.1", "192.168.2", "192.168.1")
    };
    let mut text = format!(
        r#"[gateway]
name = "bench-{side}"
allow_insecure_null = true

[[interface]]
name = "inside"
device = "bench-in"
address = "{my_net}.1/24"

[[interface]]
name = "outside"
device = "bench-out"
address = "{me}/24"

[[route]]
destination = "{peer_net}.0/24"
via = "{peer}"

[[neighbor]]
address = "{peer}"
mac = "02:00:00:00:00:0{peer_id}"
"#,
        side = if a { "a" } else { "b" },
        peer_id = if a { 2 } else { 1 },
    );
    match algorithm {
        None => {
            text += &format!(
                "\n[[policy]]\nname = \"fwd-out\"\ndirection = \"out\"\nsource = \"{my_net}.0/24\"\ndestination = \"{peer_net}.0/24\"\naction = \"bypass\"\n\n[[policy]]\nname = \"fwd-in\"\ndirection = \"in\"\nsource = \"{peer_net}.0/24\"\ndestination = \"{my_net}.0/24\"\naction = \"bypass\"\n"
            );
        }
        Some(alg) => {
            let (spi_out, spi_in, seed_out, seed_in) = if a {
                (0x1001, 0x1002, 1, 2)
            } else {
                (0x1002, 0x1001, 2, 1)
            };
            let mut keys = String::new();
            for (dir, seed) in [("out", seed_out), ("in", seed_in)] {
                if alg.enc_key_len() > 0 {
                    keys += &format!("enc_key_{dir} = \"{}\"\n", key_hex(alg.enc_key_len(), seed));
                }
                if alg.auth_key_len() > 0 {
                    keys += &format!(
                        "auth_key_{dir} = \"{}\"\n",
                        key_hex(alg.auth_key_len(), seed + 50)
                    );
                }
            }
            text += &format!(
                "\n[[tunnel]]\nname = \"t\"\nlocal = \"{me}\"\nremote = \"{peer}\"\nlocal_subnet = \"{my_net}.0/24\"\nremote_subnet = \"{peer_net}.0/24\"\nproposal = \"{alg}\"\nspi_out = {spi_out}\nspi_in = {spi_in}\n{keys}replay_window = {replay_window}\n"
            );
        }
    }
    text
}

/// The engine one scenario runs on.
#[derive(Debug, Clone, Default)]
pub struct EngineSetup {
    pub spec: EngineSpec,
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
    let text = config_text(algorithm, a, replay_window);
    let config = Config::parse(Path::new("<bench>"), &text)?;
    let built = accel::build_engine(&engine.spec)?;
    Ok(config.build_gateway(LinkLayer::Ethernet, built, engine.style, Duration::ZERO)?)
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
