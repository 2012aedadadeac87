//! The configuration file as written, before validation. Fields that can
//! be wrong in ways TOML does not catch keep their spans for error messages.

use serde::Deserialize;
use toml::Spanned;

pub(crate) type S<T> = Spanned<T>;

/// Key material as written in the file: never shown by `Debug`, wiped
/// when dropped.
#[derive(Deserialize, Clone, PartialEq, Eq)]
#[serde(transparent)]
pub(crate) struct SecretText(String);

impl Drop for SecretText {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl SecretText {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub gateway: RawGateway,
    #[serde(default)]
    pub accel: RawAccel,
    #[serde(default)]
    pub interface: Vec<S<RawInterface>>,
    #[serde(default)]
    pub route: Vec<S<RawRoute>>,
    #[serde(default)]
    pub neighbor: Vec<S<RawNeighbor>>,
    #[serde(default)]
    pub sa: Vec<S<RawSa>>,
    #[serde(default)]
    pub policy: Vec<S<RawPolicy>>,
    #[serde(default)]
    pub tunnel: Vec<S<RawTunnel>>,
    #[serde(default)]
    pub rekey: RawRekey,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub keying: RawKeying,
}

/// `[keying]`: where SAs come from besides the file.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKeying {
    pub source: Option<S<String>>,
    pub netns: Option<S<String>>,
}

/// `[limits]`: bounds against floods. Signed, so that a negative value
/// gets the range message rather than serde's.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub neighbors_per_interface: Option<S<i64>>,
    pub icmp_errors_per_second: Option<S<i64>>,
    pub icmp_burst: Option<S<i64>>,
    pub icmp_per_source_ms: Option<S<i64>>,
    pub icmp_per_source_burst: Option<S<i64>>,
    pub icmp_sources: Option<S<i64>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRekey {
    pub grace_ms: Option<S<u64>>,
    pub retransmit_ms: Option<S<u64>>,
    pub retries: Option<S<u32>>,
    pub retry_after_s: Option<S<u64>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGateway {
    pub name: Option<String>,
    #[serde(default)]
    pub allow_insecure_null: bool,
    pub outer_ttl: Option<S<u8>>,
    /// Seconds between NAT keepalives to UDP-encapsulated peers (RFC 3948
    /// §2.3); 0 sends none.
    pub nat_keepalive_s: Option<S<i64>>,
    /// Where sequence numbers of SAs with static keys are kept.
    pub state_dir: Option<S<String>>,
    /// What `espgw run` does when one of its devices is deleted.
    pub on_device_loss: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccel {
    pub engine: Option<S<String>>,
    pub style: Option<S<String>>,
    pub buffers: Option<S<String>>,
    pub channels: Option<S<usize>>,
    pub fifo_depth: Option<S<usize>>,
    pub completion: Option<S<String>>,
    pub coalesce_count: Option<S<usize>>,
    pub coalesce_usecs: Option<S<u64>>,
    /// The `sec` model's device profile (`rate` is the older name).
    pub profile: Option<S<String>>,
    pub rate: Option<S<String>>,
    /// The threaded `sec` engine (real parallelism on a spare core).
    pub threads: Option<S<bool>>,
    pub afalg_io: Option<S<String>>,
    /// The `shared` engine: the server's control socket and the transport.
    pub socket: Option<S<String>>,
    pub transport: Option<S<String>>,
    /// How long a job may wait for the server before it times out.
    pub deadline_ms: Option<S<u64>>,
    pub fail_every: Option<S<u64>>,
    pub lose_completion_every: Option<S<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawInterface {
    pub name: S<String>,
    pub device: String,
    pub kind: Option<S<String>>,
    pub address: S<String>,
    /// The interface's IPv6 address and prefix length (`2001:db8:1::1/64`).
    pub address6: Option<S<String>>,
    pub mac: Option<S<String>>,
    pub mtu: Option<S<u16>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub destination: S<String>,
    pub via: Option<S<String>>,
    pub interface: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNeighbor {
    pub address: S<String>,
    pub mac: S<String>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLifetime {
    pub soft_bytes: Option<u64>,
    pub hard_bytes: Option<u64>,
    pub soft_packets: Option<u64>,
    pub hard_packets: Option<u64>,
    pub soft_seconds: Option<u64>,
    pub hard_seconds: Option<u64>,
    /// Seconds since the SA's last packet. Signed, so that a negative
    /// value gets the range message rather than serde's.
    pub soft_idle_s: Option<S<i64>>,
    pub hard_idle_s: Option<S<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSa {
    pub name: S<String>,
    pub direction: S<String>,
    pub spi: S<u32>,
    pub mode: Option<S<String>>,
    pub local: S<String>,
    pub remote: S<String>,
    pub proposal: S<String>,
    pub enc_key: Option<S<SecretText>>,
    pub auth_key: Option<S<SecretText>>,
    #[serde(default)]
    pub esn: bool,
    pub replay_window: Option<S<u32>>,
    pub lifetime: Option<S<RawLifetime>>,
    pub initial_seq: Option<u64>,
    /// Inbound only: `"any"` admits every inner packet. Without it the SA
    /// admits what the inbound policies naming it select.
    pub selectors: Option<S<String>>,
    /// `"udp"`: RFC 3948 UDP encapsulation (NAT traversal); `"none"` or
    /// absent: raw ESP.
    pub encap: Option<S<String>>,
    /// Our UDP port for `encap = "udp"` (4500).
    pub udp_port: Option<S<u16>>,
    /// The peer's UDP port for `encap = "udp"` (4500).
    pub peer_udp_port: Option<S<u16>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub name: S<String>,
    pub direction: S<String>,
    pub priority: Option<u32>,
    pub source: Option<S<String>>,
    pub destination: Option<S<String>>,
    pub protocol: Option<S<String>>,
    pub source_ports: Option<S<RawPorts>>,
    pub destination_ports: Option<S<RawPorts>>,
    pub action: S<String>,
    pub sa: Option<S<String>>,
}

/// Ports as `53`, `"53"`, `"1024-65535"` or `"any"`.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub(crate) enum RawPorts {
    Number(u16),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTunnel {
    pub name: S<String>,
    pub local: S<String>,
    pub remote: S<String>,
    pub local_subnet: Option<S<String>>,
    pub remote_subnet: Option<S<String>>,
    pub protocol: Option<S<String>>,
    pub mode: Option<S<String>>,
    pub proposal: S<String>,
    /// Required without a `secret`; with one, the exchange picks them.
    pub spi_out: Option<S<u32>>,
    pub spi_in: Option<S<u32>>,
    pub enc_key_out: Option<S<SecretText>>,
    pub auth_key_out: Option<S<SecretText>>,
    pub enc_key_in: Option<S<SecretText>>,
    pub auth_key_in: Option<S<SecretText>>,
    #[serde(default)]
    pub esn: bool,
    pub replay_window: Option<S<u32>>,
    pub priority: Option<u32>,
    pub lifetime: Option<S<RawLifetime>>,
    pub initial_seq_out: Option<u64>,
    pub initial_seq_in: Option<u64>,
    pub secret: Option<S<SecretText>>,
    /// As for `[[sa]]`: `"udp"` for RFC 3948 encapsulation.
    pub encap: Option<S<String>>,
    pub udp_port: Option<S<u16>>,
    pub peer_udp_port: Option<S<u16>>,
}
