//! Loading and validating a gateway configuration (TOML), and the commands
//! that install it ([`Config::commands`]): the SAs and policies it holds,
//! in the gateway's own setup types ([`dataplane::command`]). A driver
//! applies them to its gateways; nothing here holds one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use accel::{
    Algorithm, BufferPolicy, Completion, CompletionKind, DeviceProfile, EngineKind, EngineSpec, SecConfig,
    Session, Style,
};
use dataplane::command::{SaCommand, SaSetup};
use dataplane::icmp::IcmpLimits;
use dataplane::neighbor::NeighborLimits;
use dataplane::{EthernetAddress, GatewaySetup, Interface, InterfaceKind, LinkLayer, Port, Route, Route6};
use smoltcp::wire::Ipv4Cidr;
use spd_sad::{
    IpPrefix, Ipv4Prefix, Ipv6Prefix, Lifetime, Limits, Mode, PolicyDirection, PortRange, ProtocolSelector,
    SaDirection, SaParams, Selector, UdpEncap, MAX_WINDOW,
};
use zeroize::Zeroizing;

use crate::error::{ConfigError, ConfigErrorKind, Locator};
use crate::raw::{RawConfig, RawLifetime, RawPolicy, RawPorts, RawRoute, RawSa, RawTunnel, SecretText, S};

// The file's policies and key sources are the gateway's own vocabulary.
pub use dataplane::command::{KeySource, PolicyAction, PolicySetup};

/// Default anti-replay window (packets).
pub const DEFAULT_REPLAY_WINDOW: u32 = 64;
/// Default priority of policies and tunnels; lower is consulted first.
pub const DEFAULT_PRIORITY: u32 = 100;
/// Interval of NAT keepalives (RFC 3948 §2.3) unless the file says.
pub const DEFAULT_NAT_KEEPALIVE: Duration = Duration::from_secs(20);

/// Default TTL of outer tunnel headers.
pub const DEFAULT_OUTER_TTL: u8 = 64;

/// A validated SA with its keys, as the file gives it; the gateway
/// installs its [`setup`](SaConfig::setup).
#[derive(Clone, PartialEq, Eq)]
pub struct SaConfig {
    /// Name, direction, SPI, mode, ends, ESN, replay window, lifetime and
    /// encapsulation; an inbound SA's selectors are filled in by
    /// validation.
    pub params: SaParams,
    /// The ESP transform (the file's `proposal`).
    pub algorithm: Algorithm,
    /// The encryption key (for an AEAD, the AES key then its 4-byte
    /// salt), wiped when dropped; empty for a template of an exchange.
    pub enc_key: Zeroizing<Vec<u8>>,
    /// The integrity key; empty for an AEAD or NULL, and for a template
    /// of an exchange.
    pub auth_key: Zeroizing<Vec<u8>>,
    /// Sequence state to start from, like XFRM's `oseq`/`seq`: outbound,
    /// the last number sent (the first packet gets one more); inbound, the
    /// highest number already seen. Zero for a new SA; tests of 2^32
    /// crossings start near the boundary.
    pub initial_seq: u64,
    /// Inbound, `selectors = "any"`: named by no policy, the SA admits
    /// every inner packet (its selectors are [`Selector::ANY`]); a warning
    /// in `check-config`. Otherwise an inbound SA's selectors are those of
    /// the inbound policies naming it.
    pub admits_any: bool,
    /// Where the keys came from. [`KeySource::Exchange`]: an SA of a
    /// `[[tunnel]]` with a `secret`, which in [`Config::sas`] is a template
    /// without keys or SPI: it names the tunnel's first SAs for its
    /// policies and carries their selectors; the control plane installs
    /// the real ones once the exchange is done.
    pub keys: KeySource,
}

impl SaConfig {
    /// The SA as the gateway installs it: its keys copied into key memory,
    /// no ledger mark (a driver that keeps a ledger sets it).
    pub fn setup(&self) -> SaSetup {
        SaSetup {
            params: self.params.clone(),
            algorithm: self.algorithm,
            enc_key: accel::SecretBytes::new(&self.enc_key),
            auth_key: accel::SecretBytes::new(&self.auth_key),
            initial_seq: self.initial_seq,
            key_source: self.keys,
            ledger_mark: None,
        }
    }
}

impl std::fmt::Debug for SaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaConfig")
            .field("params", &self.params)
            .field("algorithm", &self.algorithm)
            .field("initial_seq", &self.initial_seq)
            .field("admits_any", &self.admits_any)
            .field("key_source", &self.keys)
            .field("keys", &"<redacted>")
            .finish()
    }
}

/// A `[[tunnel]]`: what the control plane needs to rekey it. Its first
/// SAs and policies are in [`Config::sas`] and [`Config::policies`] under
/// the names below.
#[derive(Clone, PartialEq, Eq)]
pub struct TunnelConfig {
    /// The same at both ends: it names the tunnel's SAs and policies,
    /// and goes into the rekey messages and the keys.
    pub name: String,
    /// Our end's outer address.
    pub local: IpAddr,
    /// The peer's outer address.
    pub remote: IpAddr,
    /// The ESP transform of every SA of the tunnel.
    pub algorithm: Algorithm,
    /// Tunnel or transport, for every SA of the tunnel.
    pub mode: Mode,
    /// Whether its SAs use 64-bit extended sequence numbers.
    pub esn: bool,
    /// The inbound SAs' anti-replay window, in packets (0: none).
    pub replay_window: u32,
    /// Each SA's limits; the soft one starts a rekey.
    pub lifetime: Lifetime,
    /// RFC 3948 UDP encapsulation, and with it the rekey exchange on the
    /// encapsulation's ports (with the non-ESP marker).
    pub encap: Option<UdpEncap>,
    /// The pre-shared secret the keying exchange is authenticated with:
    /// with one, every key comes from an exchange with the peer (the first
    /// at start); without one, the tunnel keeps its configured keys until
    /// they expire.
    pub secret: Option<Zeroizing<Vec<u8>>>,
}

impl TunnelConfig {
    /// Name of the SA or policy of `direction` in generation `generation`.
    pub fn sa_name(&self, direction: SaDirection, generation: u32) -> String {
        match generation {
            0 => format!("{}-{direction}", self.name),
            g => format!("{}-{direction}.{g}", self.name),
        }
    }

    /// Name of the tunnel's policy of `direction`.
    pub fn policy_name(&self, direction: PolicyDirection) -> String {
        format!("{}-{direction}", self.name)
    }
}

impl std::fmt::Debug for TunnelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelConfig")
            .field("name", &self.name)
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("algorithm", &self.algorithm)
            .field("mode", &self.mode)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// Timing of the rekey exchange (`[rekey]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RekeySettings {
    /// How long a replaced inbound SA keeps accepting packets that were
    /// already on their way; replaced SAs are deleted after it.
    pub grace: Duration,
    /// First retransmission timeout; doubled on every retry.
    pub retransmit: Duration,
    /// Retransmissions before giving up on the peer.
    pub retries: u32,
    /// After giving up, when to try again while the SAs still work.
    pub retry_after: Duration,
}

impl Default for RekeySettings {
    fn default() -> Self {
        RekeySettings {
            grace: Duration::from_secs(2),
            retransmit: Duration::from_millis(500),
            retries: 5,
            retry_after: Duration::from_secs(30),
        }
    }
}

/// Where SAs come from besides the file's `[[sa]]` and `[[tunnel]]`
/// (`[keying]`, or `espgw run --keying`). Read at start: `espgw run`
/// refuses a reload that would change it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Keying {
    /// The file alone (and the rekey exchange of tunnels with a secret).
    #[default]
    Config,
    /// Also the kernel's XFRM SAD and SPD of network namespace `netns`
    /// (`/run/netns/NAME`; `None`: espgw's own namespace), where an IKE
    /// daemon or `ip xfrm` writes them: see [`crate::xfrm`].
    Xfrm {
        /// The keying namespace's name; `None`: espgw's own.
        netns: Option<String>,
    },
}

impl Keying {
    /// A namespace name as `ip netns` makes them: a file name under
    /// `/run/netns`, so no `/`, not `.` or `..`, not empty.
    pub fn valid_netns(name: &str) -> bool {
        !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
    }
}

/// What `espgw run` does when the device of one of its interfaces is
/// deleted (`[gateway] on_device_loss`). Read at start: a reload that
/// changes it is refused (waiting needs a helper process that only a start
/// can fork, see `espgw run`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, strum::VariantNames, strum::EnumString, strum::Display,
)]
#[strum(serialize_all = "kebab-case")]
pub enum DeviceLoss {
    /// Keep running with every SA and counter, use no CPU for that
    /// device, and open its sockets again once a device of that name is
    /// back and up.
    #[default]
    Wait,
    /// Stop with an error naming the device, for a service manager to
    /// start the gateway again.
    Exit,
}

/// Bounds against floods (`[limits]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FloodLimits {
    /// The neighbour table.
    pub neighbors: NeighborLimits,
    /// The ICMP error token buckets.
    pub icmp: IcmpLimits,
}

/// Which link settings of an interface its `[[interface]]` gives. Those it
/// leaves out are, in `Config::inside`/`outside`, stand-ins for offline use
/// (a MAC derived from the address, MTU 1500); `espgw run` replaces them
/// with the device's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkOverrides {
    /// The file gave the interface's `mac`.
    pub mac: bool,
    /// The file gave the interface's `mtu`.
    pub mtu: bool,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from, as given: error messages and warnings
    /// name it, and a reload reads it again.
    pub path: PathBuf,
    /// `[gateway] name`, or the file's name without its extension: names
    /// the gateway in logs, its control socket and its state directory.
    pub name: String,
    /// `[gateway] allow_insecure_null`: SAs may use the `null` proposal
    /// (no encryption, no integrity; benchmarks only).
    pub allow_insecure_null: bool,
    /// The `[accel]` section: which engine, and how it is set up.
    pub engine: EngineSpec,
    /// How crypto is submitted to the engine.
    pub style: Style,
    /// The protected side's interface.
    pub inside: Interface,
    /// The interface toward the peers.
    pub outside: Interface,
    /// What the file set of each interface, by `Port::index()`.
    pub link_overrides: [LinkOverrides; 2],
    /// IPv4 routes (the interfaces' networks are connected without one).
    pub routes: Vec<Route>,
    /// IPv6 routes (the networks of the interfaces' `address6` are
    /// connected without one).
    pub routes6: Vec<Route6>,
    /// Static neighbours (`[[neighbor]]`): an address and its MAC.
    pub neighbors: Vec<(IpAddr, EthernetAddress)>,
    /// TTL of the outer header of tunnel-mode packets.
    pub outer_ttl: u8,
    /// Interval of NAT keepalives to UDP-encapsulated peers; `None`: none.
    pub nat_keepalive: Option<Duration>,
    /// The `[[sa]]`s, then each `[[tunnel]]`'s two, in file order.
    pub sas: Vec<SaConfig>,
    /// Each `[[tunnel]]`'s two policies, then the `[[policy]]`s, in the
    /// order they are inserted (equal priorities keep it).
    pub policies: Vec<PolicySetup>,
    /// The `[[tunnel]]`s, for the control plane to rekey.
    pub tunnels: Vec<TunnelConfig>,
    /// `[rekey]`.
    pub rekey: RekeySettings,
    /// `[limits]`.
    pub limits: FloodLimits,
    /// `[keying]`.
    pub keying: Keying,
    /// `[gateway] state_dir`: where sequence numbers of SAs with static
    /// keys are kept across restarts (relative to the file's directory).
    pub state_dir: Option<PathBuf>,
    /// The permission bits of the file as it was read ([`Config::load`]);
    /// `None` for text parsed without a file.
    pub file_mode: Option<u32>,
    /// `[gateway] on_device_loss`.
    pub on_device_loss: DeviceLoss,
}

impl Config {
    /// Reads and validates `path` (at start and on every reload). The
    /// file's text holds keys and secrets: it is read into memory wiped
    /// when this returns, whether it validates or not.
    ///
    /// What cannot be wiped from here: the kernel's page cache of the
    /// file, and a key or secret written with TOML escapes (`\u0041`),
    /// which the TOML parser decodes into a string of its own (grown as
    /// it goes, so earlier copies are freed unwiped). Plain strings, as
    /// every key is written, are borrowed from the text, not copied.
    ///
    /// A file that holds keys or secrets is refused if a user other than
    /// root or this process's could have written it: its owner is another
    /// user, or its group or others may write it. What is checked is the
    /// file that was read (its descriptor's status), not whatever the path
    /// names by then.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_trusting(path, None)
    }

    /// [`Config::load`], trusting files owned by `also` too: the user
    /// `espgw run --user` becomes, which reads the file at every reload.
    pub fn load_trusting(path: &Path, also: Option<u32>) -> Result<Config, ConfigError> {
        let error = |kind| ConfigError {
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            kind,
        };
        let io_error = |e: std::io::Error| error(ConfigErrorKind::Io(e.to_string()));
        let (text, file) = read_wiped(path).map_err(io_error)?;
        let text = std::str::from_utf8(&text).map_err(|e| {
            io_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the file is not UTF-8 (at byte {})", e.valid_up_to()),
            ))
        })?;
        let mut config = Self::parse(path, text)?;
        config.file_mode = Some(file.mode);
        if config.holds_keys() {
            if let Some(why) = file.writable_by_others(path, also) {
                return Err(error(ConfigErrorKind::Exposed(format!(
                    "the file holds keys and {why}, who could change them (and so what this gateway trusts)"
                ))));
            }
        }
        Ok(config)
    }

    /// Validates `text`; `path` is used in error messages. Key material
    /// is copied out of `text` only into memory that is wiped when
    /// dropped; wiping `text` itself is the caller's ([`Config::load`]
    /// does).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let loc = Locator::new(path, text);
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| loc.error(e.span(), ConfigErrorKind::Syntax(e.message().to_owned())))?;
        Validator { loc: &loc, raw: &raw }.validate(path)
    }

    /// The gateway's static setup, for frames of `link`, submitting crypto
    /// in `style`.
    pub fn setup(&self, link: LinkLayer, style: Style) -> GatewaySetup {
        GatewaySetup {
            inside: self.inside.clone(),
            outside: self.outside.clone(),
            routes: self.routes.clone(),
            routes6: self.routes6.clone(),
            neighbors: self.neighbors.clone(),
            link,
            outer_ttl: self.outer_ttl,
            nat_keepalive: self.nat_keepalive,
            style,
            // Offline work has no ARP; `espgw run` turns resolution on.
            resolve_neighbors: false,
            answer_arp: true,
            // A TUN inside carries bare IPv4.
            inside_link: (self.inside.kind == InterfaceKind::Tun).then_some(LinkLayer::RawIp),
            control_port: Some(dataplane::CONTROL_PORT),
            only_own_mac: false,
            neighbor_limits: self.limits.neighbors,
            icmp_limits: self.limits.icmp,
        }
    }

    /// What installs this configuration in a gateway, in order: SAs with
    /// static keys (inbound ones with their selectors, filled in by
    /// validation), the encapsulation ports the keying needs open, then
    /// policies. SAs keyed by an exchange are not installed: until the
    /// control plane has keyed them, their policies discard.
    pub fn commands(&self) -> Vec<SaCommand> {
        let mut commands: Vec<SaCommand> = self
            .sas
            .iter()
            .filter(|s| s.keys == KeySource::File)
            .map(|sa| SaCommand::InstallSa(Box::new(sa.setup())))
            .collect();
        // The IKE daemon of the keying namespace may move to the NAT-T
        // port before any SA of it exists there (the IKE relay's).
        if matches!(self.keying, Keying::Xfrm { netns: Some(_) }) {
            commands.push(SaCommand::OpenEncapsulationPort(
                crate::xfrm::relay::RelayPorts::default().nat_t,
            ));
        }
        // The exchange of a UDP-encapsulated tunnel runs on its port.
        for tunnel in self.tunnels.iter().filter(|t| t.secret.is_some()) {
            if let Some(encap) = tunnel.encap {
                commands.push(SaCommand::OpenEncapsulationPort(encap.local_port));
            }
        }
        commands.extend(self.policies.iter().cloned().map(SaCommand::InsertPolicy));
        commands
    }

    /// Whether this configuration holds keys or secrets.
    fn holds_keys(&self) -> bool {
        self.sas
            .iter()
            .any(|s| !s.enc_key.is_empty() || !s.auth_key.is_empty())
            || self.tunnels.iter().any(|t| t.secret.is_some())
    }

    /// A warning when this configuration holds keys or secrets and its
    /// file, as it was read, could be read by users other than its owner.
    pub fn exposed_keys_warning(&self) -> Option<String> {
        let mode = self.file_mode?;
        (self.holds_keys() && mode & 0o077 != 0).then(|| {
            format!(
                "{} holds keys and can be read by other users (mode {:o}); run `chmod 600 {}`",
                self.path.display(),
                mode & 0o777,
                self.path.display()
            )
        })
    }

    /// Everything `check-config` and `run` should warn about: keys in a
    /// file others can read, and inbound SAs that admit every inner
    /// packet because they say `selectors = "any"`.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self.exposed_keys_warning().into_iter().collect();
        for sa in self.sas.iter().filter(|s| s.admits_any) {
            warnings.push(format!(
                "{}: inbound SA `{}` has selectors = \"any\": it admits every inner packet its peer sends, whatever the addresses (RFC 4301 §5.2); name it in an inbound `protect` [[policy]] and remove `selectors` to admit only that policy's traffic",
                self.path.display(),
                sa.params.name
            ));
        }
        warnings
    }

    /// The `[[tunnel]]` called `name`, if any.
    pub fn tunnel(&self, name: &str) -> Option<&TunnelConfig> {
        self.tunnels.iter().find(|t| t.name == name)
    }

    /// What may arrive through inbound SA `name` (RFC 4301 §5.2): the
    /// selectors of the inbound policies that name it, or
    /// [`Selector::ANY`] if it says `selectors = "any"`. Empty, admitting
    /// nothing, for a name that is no inbound SA of this configuration.
    pub fn inbound_selectors(&self, name: &str) -> Vec<Selector> {
        self.sa(name)
            .filter(|s| s.params.direction == SaDirection::Inbound)
            .map_or_else(Vec::new, |s| s.params.selectors.clone())
    }

    /// The SA called `name` (an `[[sa]]` or a tunnel's), if any.
    pub fn sa(&self, name: &str) -> Option<&SaConfig> {
        self.sas.iter().find(|s| s.params.name == name)
    }
}

/// Who owns a configuration file and who may write it, from the status of
/// the descriptor it was read through.
struct FileStatus {
    uid: u32,
    mode: u32,
}

impl FileStatus {
    /// Why users other than root, this process's effective user and `also`
    /// could have written the file, if they could.
    fn writable_by_others(&self, path: &Path, also: Option<u32>) -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if self.uid != 0 && self.uid != euid && Some(self.uid) != also {
            return Some(format!(
                "belongs to uid {}, not root or the gateway's user; make root its owner (`chown root {}`) or run the gateway as its owner",
                self.uid,
                path.display()
            ));
        }
        let who = match (self.mode & 0o020 != 0, self.mode & 0o002 != 0) {
            (true, true) => "its group and every user",
            (true, false) => "its group",
            (false, true) => "every user",
            (false, false) => return None,
        };
        Some(format!(
            "can be written by {who} (mode {:o}); run `chmod 600 {}`",
            self.mode & 0o777,
            path.display()
        ))
    }
}

/// Reads a file into memory that is wiped when dropped, with the status of
/// the descriptor it was read through. The buffer is sized from the
/// file's length up front so that growing it leaves no unwiped copy
/// behind (unless the file grows while being read).
fn read_wiped(path: &Path) -> std::io::Result<(Zeroizing<Vec<u8>>, FileStatus)> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut file = std::fs::File::open(path)?;
    // fstat: the file this descriptor reads, whatever the path names later.
    let meta = file.metadata()?;
    let status = FileStatus {
        uid: meta.uid(),
        mode: meta.mode(),
    };
    let mut text = Zeroizing::new(Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0)));
    file.read_to_end(&mut text)?;
    Ok((text, status))
}

/// The selectors of the inbound policies naming SA `name`.
fn selectors_of(policies: &[PolicySetup], name: &str) -> Vec<Selector> {
    policies
        .iter()
        .filter(|p| p.direction == PolicyDirection::In && p.action == PolicyAction::Protect(name.to_owned()))
        .map(|p| p.selector)
        .collect()
}

/// The words of a policy's `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::VariantNames)]
#[strum(serialize_all = "lowercase")]
enum ActionWord {
    Protect,
    Bypass,
    Discard,
}

/// The words of an SA's or tunnel's `encap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::VariantNames)]
#[strum(serialize_all = "lowercase")]
enum EncapWord {
    None,
    Udp,
}

struct Validator<'a> {
    loc: &'a Locator<'a>,
    raw: &'a RawConfig,
}

fn span<T>(s: &S<T>) -> Option<Range<usize>> {
    Some(s.span())
}

impl Validator<'_> {
    fn err<T>(&self, at: Option<Range<usize>>, kind: ConfigErrorKind) -> Result<T, ConfigError> {
        Err(self.loc.error(at, kind))
    }

    fn value<T>(&self, at: &S<String>, what: &str, example: &str) -> Result<T, ConfigError>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        at.get_ref().parse::<T>().or_else(|e| {
            self.err(
                span(at),
                ConfigErrorKind::Value(format!(
                    "{what}: {e}{}",
                    if example.is_empty() {
                        String::new()
                    } else {
                        format!(" (for example {example})")
                    }
                )),
            )
        })
    }

    fn addr(&self, at: &S<String>, what: &str) -> Result<Ipv4Addr, ConfigError> {
        at.get_ref().parse::<Ipv4Addr>().or_else(|_| {
            self.err(
                span(at),
                ConfigErrorKind::Value(format!(
                    "{what} `{}` is not an IPv4 address (for example 10.0.0.1)",
                    at.get_ref()
                )),
            )
        })
    }

    /// An SA's or tunnel's ends: IPv4, or IPv6 (without UDP
    /// encapsulation); `local` and `remote` of one family.
    fn ends(
        &self,
        (local, remote): (&S<String>, &S<String>),
        encapsulated: bool,
        name: &str,
    ) -> Result<(IpAddr, IpAddr), ConfigError> {
        let parse = |at: &S<String>, what: &str| -> Result<IpAddr, ConfigError> {
            at.get_ref().parse::<IpAddr>().or_else(|_| {
                self.err(
                    span(at),
                    ConfigErrorKind::Value(format!(
                        "{what} `{}` is not an IP address (for example 10.0.0.1 or 2001:db8::1)",
                        at.get_ref()
                    )),
                )
            })
        };
        let ends = (parse(local, "local")?, parse(remote, "remote")?);
        match ends {
            (IpAddr::V4(_), IpAddr::V4(_)) => Ok(ends),
            (IpAddr::V6(_), IpAddr::V6(_)) if !encapsulated => Ok(ends),
            (IpAddr::V6(_), IpAddr::V6(_)) => self.err(
                span(remote),
                ConfigErrorKind::Value(format!(
                    "`{name}` has IPv6 ends, which this gateway carries without `encap` only so far \
                     (no NAT-T over IPv6)"
                )),
            ),
            _ => self.err(
                span(remote),
                ConfigErrorKind::Value(format!(
                    "`{name}`: local {} and remote {} are of different address families",
                    ends.0, ends.1
                )),
            ),
        }
    }

    /// A keyword field, parsed by `T`'s derived `FromStr`. An unknown word
    /// is reported by `message(word, the accepted words)`, the accepted
    /// words from the derived list (`` `a`, `b` or `c` ``).
    fn keyword<T>(
        &self,
        at: &S<String>,
        kind: fn(String) -> ConfigErrorKind,
        message: impl FnOnce(&str, &str) -> String,
    ) -> Result<T, ConfigError>
    where
        T: FromStr + strum::VariantNames,
    {
        at.get_ref().parse::<T>().or_else(|_| {
            let quoted: Vec<String> = T::VARIANTS.iter().map(|n| format!("`{n}`")).collect();
            let quoted: Vec<&str> = quoted.iter().map(String::as_str).collect();
            self.err(span(at), kind(message(at.get_ref(), &accel::one_of(&quoted))))
        })
    }

    /// An IPv6 `[[route]]`: out of an interface with an `address6`, by a
    /// next hop on its network (or link-local, with `interface`).
    fn route6(
        &self,
        r: &RawRoute,
        destination: Ipv6Prefix,
        connected: &[&Interface; 2],
    ) -> Result<Route6, ConfigError> {
        let via = match &r.via {
            None => None,
            Some(v) => match v.get_ref().parse::<Ipv6Addr>() {
                Ok(addr) if !addr.is_multicast() && !addr.is_unspecified() => Some(addr),
                _ => {
                    return self.err(
                        span(v),
                        ConfigErrorKind::Value(format!(
                            "route via `{}` must be a unicast IPv6 address for an IPv6 destination",
                            v.get_ref()
                        )),
                    )
                }
            },
        };
        let on_network = |i: &&&Interface, gw: Ipv6Addr| i.address6.is_some_and(|(_, net)| net.contains(gw));
        let port = match (&r.interface, via) {
            (Some(name), _) => self.port(name)?,
            (None, Some(gw)) => match connected.iter().find(|i| on_network(i, gw)) {
                Some(i) => i.port,
                None => {
                    return self.err(
                        r.via.as_ref().and_then(span),
                        ConfigErrorKind::Value(format!(
                            "next hop {gw} is on neither interface's address6 network; add `interface = \"inside\"` or `\"outside\"`"
                        )),
                    );
                }
            },
            (None, None) => {
                return self.err(
                    span(&r.destination),
                    ConfigErrorKind::Value("a route needs `via` (a next hop) or `interface`".into()),
                );
            }
        };
        if connected.iter().all(|i| i.port != port || i.address6.is_none()) {
            return self.err(
                span(&r.destination),
                ConfigErrorKind::Value(format!(
                    "IPv6 route to {destination} leaves by `{port}`, which has no `address6`; give that interface one"
                )),
            );
        }
        Ok(Route6 {
            destination,
            via,
            port,
        })
    }

    /// smoltcp's parser: six octets of one or two hex digits, all joined
    /// by `:` or all by `-`.
    fn mac(&self, at: &S<String>) -> Result<EthernetAddress, ConfigError> {
        match at.get_ref().parse::<EthernetAddress>() {
            Ok(mac) => Ok(mac),
            Err(()) => self.err(
                span(at),
                ConfigErrorKind::Value(format!(
                    "`{}` is not a MAC address; write six hex pairs separated by colons, e.g. 02:00:00:00:00:01",
                    at.get_ref()
                )),
            ),
        }
    }

    fn validate(&self, path: &Path) -> Result<Config, ConfigError> {
        let raw = self.raw;
        let (engine, style) = self.accel()?;
        let (inside, outside, link_overrides) = self.interfaces()?;
        let connected = [&inside, &outside];
        let mut routes = Vec::new();
        let mut routes6 = Vec::new();
        for r in &raw.route {
            let r = r.get_ref();
            let destination: IpPrefix = self.value(&r.destination, "route destination", "192.168.2.0/24")?;
            if let IpPrefix::V6(destination) = destination {
                routes6.push(self.route6(r, destination, &connected)?);
                continue;
            }
            let IpPrefix::V4(destination) = destination else {
                return self.err(
                    span(&r.destination),
                    ConfigErrorKind::Value(
                        "a route destination is a prefix, e.g. 192.168.2.0/24 or 0.0.0.0/0".into(),
                    ),
                );
            };
            let via = r.via.as_ref().map(|v| self.addr(v, "route via")).transpose()?;
            let port = match (&r.interface, via) {
                (Some(name), _) => self.port(name)?,
                (None, Some(gw)) => match connected.iter().find(|i| i.network.contains(gw)) {
                    Some(i) => i.port,
                    None => {
                        return self.err(
                            r.via.as_ref().and_then(span),
                            ConfigErrorKind::Value(format!(
                                "next hop {gw} is on neither interface's network; add `interface = \"inside\"` or `\"outside\"`"
                            )),
                        );
                    }
                },
                (None, None) => {
                    return self.err(
                        span(&r.destination),
                        ConfigErrorKind::Value("a route needs `via` (a next hop) or `interface`".into()),
                    );
                }
            };
            routes.push(Route {
                destination,
                via,
                port,
            });
        }
        let mut neighbors = Vec::new();
        for n in &raw.neighbor {
            let n = n.get_ref();
            // IPv4 or IPv6: one table serves ARP and neighbour discovery.
            let address = n.address.get_ref().parse::<IpAddr>().or_else(|_| {
                self.err(
                    span(&n.address),
                    ConfigErrorKind::Value(format!(
                        "neighbor address `{}` is not an IP address (for example 10.0.0.2 or 2001:db8::2)",
                        n.address.get_ref()
                    )),
                )
            })?;
            neighbors.push((address, self.mac(&n.mac)?));
        }
        let mut sas = Vec::new();
        let mut policies = Vec::new();
        for s in &raw.sa {
            sas.push((span(&s.get_ref().name), self.sa(s.get_ref())?));
        }
        let mut tunnels = Vec::new();
        for t in &raw.tunnel {
            let (tunnel, out_sa, in_sa, out_policy, in_policy) = self.tunnel(t.get_ref())?;
            tunnels.push(tunnel);
            sas.push((span(&t.get_ref().name), out_sa));
            sas.push((span(&t.get_ref().name), in_sa));
            policies.push((span(&t.get_ref().name), out_policy));
            policies.push((span(&t.get_ref().name), in_policy));
        }
        for p in &raw.policy {
            policies.push((span(&p.get_ref().name), self.policy(p.get_ref())?));
        }
        self.cross_check(&sas, &policies)?;
        self.distinct_keys(&sas)?;
        // ESP over IPv6 arrives at the outside interface's `address6`.
        for (at, sa) in &sas {
            let IpAddr::V6(local) = sa.params.local else {
                continue;
            };
            if outside.address6.map(|(a, _)| a) != Some(local) {
                return self.err(
                    at.clone(),
                    ConfigErrorKind::Value(format!(
                        "`{}` has the IPv6 local end {local}, which is not the outside interface's `address6`; \
                         give the outside interface `address6 = \"{local}/64\"` (with its prefix length)",
                        sa.params.name
                    )),
                );
            }
        }
        let policies: Vec<PolicySetup> = policies.into_iter().map(|(_, p)| p).collect();
        let sas = sas
            .into_iter()
            .map(|(_, mut sa)| {
                if sa.params.direction == SaDirection::Inbound {
                    sa.params.selectors = if sa.admits_any {
                        vec![Selector::ANY]
                    } else {
                        selectors_of(&policies, &sa.params.name)
                    };
                }
                sa
            })
            .collect();
        Ok(Config {
            path: path.to_path_buf(),
            name: raw.gateway.name.clone().unwrap_or_else(|| {
                path.file_stem()
                    .map_or_else(|| "espgw".to_owned(), |s| s.to_string_lossy().into_owned())
            }),
            allow_insecure_null: raw.gateway.allow_insecure_null,
            engine,
            style,
            inside,
            outside,
            link_overrides,
            routes,
            routes6,
            neighbors,
            outer_ttl: raw
                .gateway
                .outer_ttl
                .as_ref()
                .map_or(DEFAULT_OUTER_TTL, |t| *t.get_ref()),
            nat_keepalive: self.nat_keepalive()?,
            sas,
            policies,
            tunnels,
            rekey: self.rekey()?,
            limits: self.limits()?,
            keying: self.keying()?,
            state_dir: raw.gateway.state_dir.as_ref().map(|dir| {
                let dir = Path::new(dir.get_ref());
                path.parent()
                    .map_or_else(|| dir.to_path_buf(), |base| base.join(dir))
            }),
            file_mode: None,
            on_device_loss: self.on_device_loss()?,
        })
    }

    /// One encryption key on two SAs of a file: with an AEAD both would
    /// draw nonces from one (key, sequence number) space, the same number
    /// twice under one key as soon as both send (a key out and in: both
    /// ends' outbound SAs); without one it is still one key doing the work
    /// of two. Static keys only: exchanged ones are new every time.
    fn distinct_keys(&self, sas: &[(Option<Range<usize>>, SaConfig)]) -> Result<(), ConfigError> {
        // The cipher key without an AEAD's salt: a different salt does not
        // make a different GHASH key.
        let cipher_key = |sa: &SaConfig| -> Vec<u8> {
            let key = &sa.enc_key[..];
            let salt = if sa.algorithm.is_aead() { 4 } else { 0 };
            key[..key.len().saturating_sub(salt)].to_vec()
        };
        let key_span = |name: &str| -> Option<Range<usize>> {
            let raw = self.raw;
            let sa = raw.sa.iter().find(|s| s.get_ref().name.get_ref() == name);
            if let Some(sa) = sa {
                return sa
                    .get_ref()
                    .enc_key
                    .as_ref()
                    .and_then(span)
                    .or(span(&sa.get_ref().name));
            }
            raw.tunnel.iter().find_map(|t| {
                let t = t.get_ref();
                let key = match name.strip_prefix(t.name.get_ref().as_str()) {
                    Some("-out") => t.enc_key_out.as_ref(),
                    Some("-in") => t.enc_key_in.as_ref(),
                    _ => return None,
                };
                Some(key.and_then(span).or(span(&t.name)))
            })?
        };
        let keyed: Vec<&SaConfig> = sas
            .iter()
            .map(|(_, sa)| sa)
            .filter(|sa| sa.keys == KeySource::File && !sa.enc_key.is_empty())
            .collect();
        for (i, second) in keyed.iter().enumerate() {
            let Some(first) = keyed[..i]
                .iter()
                .find(|first| cipher_key(first) == cipher_key(second))
            else {
                continue;
            };
            let (a, b) = (&first.params.name, &second.params.name);
            let why = if second.algorithm.is_aead() {
                format!(
                    "{} takes its nonce from the sequence number, so both would encrypt packets 1, 2, 3, ... \
                     under one key (RFC 4106 §8, RFC 7634): the XOR of two ciphertexts gives the plaintexts away, \
                     and two packets give away the authentication key",
                    second.algorithm
                )
            } else {
                "one key must not do the work of two SAs".to_owned()
            };
            let fix = if first.params.direction == second.params.direction {
                "give each SA its own key"
            } else {
                "give each direction its own key (a tunnel's enc_key_out and enc_key_in differ, and the peer's are \
                 these two swapped)"
            };
            return self.err(
                key_span(b),
                ConfigErrorKind::Key(format!(
                    "`{b}` has the same encryption key as `{a}`: {why}; {fix}, or give the tunnel a `secret` so that its keys are exchanged"
                )),
            );
        }
        Ok(())
    }

    /// `[gateway] on_device_loss`: `wait` unless the file says `exit`.
    fn on_device_loss(&self) -> Result<DeviceLoss, ConfigError> {
        self.raw
            .gateway
            .on_device_loss
            .as_ref()
            .map_or(Ok(DeviceLoss::default()), |at| {
                self.keyword(at, ConfigErrorKind::Value, |other, expected| {
                    format!("[gateway] on_device_loss `{other}` must be {expected}")
                })
            })
    }

    /// `[gateway] nat_keepalive_s`: RFC 3948 §2.3 leaves the interval to
    /// the implementation; 20 s is strongSwan's and Linux's usual choice.
    fn nat_keepalive(&self) -> Result<Option<Duration>, ConfigError> {
        match self.raw.gateway.nat_keepalive_s.as_ref() {
            None => Ok(Some(DEFAULT_NAT_KEEPALIVE)),
            Some(s) => match *s.get_ref() {
                0 => Ok(None),
                n @ 1..=3600 => Ok(Some(Duration::from_secs(n as u64))),
                n => self.err(
                    span(s),
                    ConfigErrorKind::Value(format!(
                        "nat_keepalive_s {n} is outside 0 (none) to 3600; NAT mappings of UDP \
                         usually last 30 s or more, so 20 is the usual choice"
                    )),
                ),
            },
        }
    }

    fn limits(&self) -> Result<FloodLimits, ConfigError> {
        let raw = &self.raw.limits;
        let mut limits = FloodLimits::default();
        let get = |v: &Option<S<i64>>,
                   what: &str,
                   range: std::ops::RangeInclusive<u64>,
                   default: u64|
         -> Result<u64, ConfigError> {
            match v {
                None => Ok(default),
                Some(n) if u64::try_from(*n.get_ref()).is_ok_and(|n| range.contains(&n)) => {
                    Ok(*n.get_ref() as u64)
                }
                Some(n) => self.err(
                    span(n),
                    ConfigErrorKind::Value(format!(
                        "[limits] {what} must be between {} and {} (default {default})",
                        range.start(),
                        range.end()
                    )),
                ),
            }
        };
        let icmp = &mut limits.icmp;
        // Each value fits its field: the ranges are checked first.
        limits.neighbors.max_learnt = get(
            &raw.neighbors_per_interface,
            "neighbors_per_interface",
            1..=1_000_000,
            limits.neighbors.max_learnt as u64,
        )? as usize;
        icmp.per_second = get(
            &raw.icmp_errors_per_second,
            "icmp_errors_per_second",
            1..=1_000_000,
            u64::from(icmp.per_second),
        )? as u32;
        icmp.burst = get(
            &raw.icmp_burst,
            "icmp_burst",
            1..=1_000_000,
            u64::from(icmp.burst),
        )? as u32;
        icmp.per_source_interval = Duration::from_millis(get(
            &raw.icmp_per_source_ms,
            "icmp_per_source_ms",
            0..=3_600_000,
            icmp.per_source_interval.as_millis() as u64,
        )?);
        icmp.per_source_burst = get(
            &raw.icmp_per_source_burst,
            "icmp_per_source_burst",
            1..=10_000,
            u64::from(icmp.per_source_burst),
        )? as u32;
        icmp.sources = get(
            &raw.icmp_sources,
            "icmp_sources",
            1..=1_000_000,
            icmp.sources as u64,
        )? as usize;
        Ok(limits)
    }

    fn keying(&self) -> Result<Keying, ConfigError> {
        let k = &self.raw.keying;
        let source = k.source.as_ref().map_or("config", |s| s.get_ref().as_str());
        let netns = match &k.netns {
            Some(n) if !Keying::valid_netns(n.get_ref()) => {
                return self.err(
                    span(n),
                    ConfigErrorKind::Value(format!(
                        "[keying] netns `{}` is not a namespace name (`ip netns add NAME` makes /run/netns/NAME; \
                         no `/`)",
                        n.get_ref()
                    )),
                )
            }
            n => n.as_ref().map(|n| n.get_ref().clone()),
        };
        match (source, netns) {
            ("config", None) => Ok(Keying::Config),
            ("config", Some(_)) => self.err(
                k.netns.as_ref().and_then(span),
                ConfigErrorKind::Value(
                    "[keying] netns names the namespace whose XFRM SAD is mirrored: it needs source = \"xfrm\"".into(),
                ),
            ),
            ("xfrm", netns) => Ok(Keying::Xfrm { netns }),
            (other, _) => self.err(
                k.source.as_ref().and_then(span),
                ConfigErrorKind::Value(format!(
                    "[keying] source `{other}` is not a keying source; expected one of: config, xfrm"
                )),
            ),
        }
    }

    fn rekey(&self) -> Result<RekeySettings, ConfigError> {
        let r = &self.raw.rekey;
        let mut settings = RekeySettings::default();
        let ms =
            |v: &S<u64>, what: &str, range: std::ops::RangeInclusive<u64>| -> Result<Duration, ConfigError> {
                if range.contains(v.get_ref()) {
                    Ok(Duration::from_millis(*v.get_ref()))
                } else {
                    self.err(
                        span(v),
                        ConfigErrorKind::Value(format!(
                            "[rekey] {what} must be between {} and {}",
                            range.start(),
                            range.end()
                        )),
                    )
                }
            };
        if let Some(v) = &r.grace_ms {
            settings.grace = ms(v, "grace_ms", 300..=600_000)?;
        }
        if let Some(v) = &r.retransmit_ms {
            settings.retransmit = ms(v, "retransmit_ms", 10..=60_000)?;
        }
        if let Some(v) = &r.retry_after_s {
            settings.retry_after = ms(v, "retry_after_s", 1..=86_400)? * 1000;
        }
        if let Some(v) = &r.retries {
            if *v.get_ref() > 20 {
                return self.err(
                    span(v),
                    ConfigErrorKind::Value("[rekey] retries must be at most 20".into()),
                );
            }
            settings.retries = *v.get_ref();
        }
        Ok(settings)
    }

    fn secret(&self, secret: &S<SecretText>) -> Result<Zeroizing<Vec<u8>>, ConfigError> {
        let bytes = Zeroizing::new(secret.get_ref().as_str().as_bytes().to_vec());
        if bytes.len() < 16 {
            return self.err(
                span(secret),
                ConfigErrorKind::Key(
                    "`secret` must be at least 16 characters; generate one with `openssl rand -hex 32`"
                        .into(),
                ),
            );
        }
        Ok(bytes)
    }

    fn accel(&self) -> Result<(EngineSpec, Style), ConfigError> {
        let a = &self.raw.accel;
        let kind = match &a.engine {
            Some(e) => self.value::<EngineKind>(e, "[accel] engine", "")?,
            None => EngineKind::default(),
        };
        let style = match &a.style {
            Some(s) => self.value::<Style>(s, "[accel] style", "")?,
            None => Style::default(),
        };
        let buffers = match &a.buffers {
            Some(b) => self.value::<BufferPolicy>(b, "[accel] buffers", "")?,
            None => BufferPolicy::default(),
        };
        let profile_key = a.profile.as_ref().or(a.rate.as_ref());
        let profile = match profile_key {
            None => DeviceProfile::sec2_266mhz(),
            Some(p) => match DeviceProfile::by_name(p.get_ref()) {
                Ok(profile) => profile,
                Err(e) => return self.err(span(p), ConfigErrorKind::Value(format!("[accel] profile: {e}"))),
            },
        };
        let mut sec = SecConfig::with_profile(profile);
        if let Some(t) = &a.threads {
            if *t.get_ref() && kind != EngineKind::Sec {
                return self.err(
                    span(t),
                    ConfigErrorKind::Value(
                        "[accel] threads runs the `sec` engine on threads of its own: set engine = \"sec\""
                            .into(),
                    ),
                );
            }
            sec.threads = *t.get_ref();
        }
        let positive = |v: Option<&S<usize>>, what: &str, default: usize| -> Result<usize, ConfigError> {
            match v {
                None => Ok(default),
                Some(n) if (1..=1024).contains(n.get_ref()) => Ok(*n.get_ref()),
                Some(n) => self.err(
                    span(n),
                    ConfigErrorKind::Value(format!("[accel] {what} must be between 1 and 1024")),
                ),
            }
        };
        sec.channels = positive(a.channels.as_ref(), "channels", sec.channels)?;
        sec.fifo_depth = positive(a.fifo_depth.as_ref(), "fifo_depth", sec.fifo_depth)?;
        let completion = a.completion.as_ref().map(|c| {
            self.keyword(c, ConfigErrorKind::Value, |other, expected| {
                format!("[accel] completion `{other}` must be {expected}")
            })
        });
        sec.completion = match completion.transpose()? {
            None | Some(CompletionKind::Interrupt) => Completion::Interrupt,
            Some(CompletionKind::Polling) => Completion::Polling,
            Some(CompletionKind::Coalesced) => Completion::Coalesced {
                count: positive(a.coalesce_count.as_ref(), "coalesce_count", 8)?,
                timeout: std::time::Duration::from_micros(
                    a.coalesce_usecs.as_ref().map_or(50, |u| *u.get_ref()),
                ),
            },
        };
        sec.buffers = buffers;
        // Fault injection for soak tests: the sec engine model only.
        for (field, value, what) in [
            (&a.fail_every, &mut sec.faults.fail_every, "fail_every"),
            (
                &a.lose_completion_every,
                &mut sec.faults.drop_completion_every,
                "lose_completion_every",
            ),
        ] {
            if let Some(n) = field {
                if *n.get_ref() < 2 || kind != EngineKind::Sec {
                    return self.err(
                        span(n),
                        ConfigErrorKind::Value(format!(
                            "[accel] {what} injects faults into the `sec` engine model: set engine = \"sec\" and a period of 2 or more"
                        )),
                    );
                }
                *value = Some(*n.get_ref());
            }
        }
        let afalg_io = match &a.afalg_io {
            Some(io) => io.get_ref().parse().or_else(|e: accel::afalg::UnknownAfalgIo| {
                self.err(span(io), ConfigErrorKind::Value(format!("[accel] afalg_io: {e}")))
            })?,
            None => accel::afalg::AfalgIo::default(),
        };
        let shared = self.shared_engine(kind)?;
        Ok((
            EngineSpec {
                kind,
                buffers,
                sec,
                afalg_io,
                shared,
            },
            style,
        ))
    }

    /// `socket`, `transport` and `deadline_ms` of `engine = "shared"`.
    fn shared_engine(&self, kind: EngineKind) -> Result<accel::shared::SharedSpec, ConfigError> {
        let a = &self.raw.accel;
        let mut shared = accel::shared::SharedSpec::default();
        for (key, what) in [(&a.socket, "socket"), (&a.transport, "transport")] {
            if let Some(v) = key {
                if kind != EngineKind::Shared {
                    return self.err(
                        span(v),
                        ConfigErrorKind::Value(format!(
                            "[accel] {what} is a setting of the shared engine: set engine = \"shared\" or remove it"
                        )),
                    );
                }
            }
        }
        if let Some(t) = &a.transport {
            shared.transport = self.value::<accel::shared::Transport>(t, "[accel] transport", "")?;
        }
        if let Some(d) = &a.deadline_ms {
            if kind != EngineKind::Shared {
                return self.err(
                    span(d),
                    ConfigErrorKind::Value(
                        "[accel] deadline_ms is a setting of the shared engine: set engine = \"shared\" or remove it"
                            .into(),
                    ),
                );
            }
            let ms = *d.get_ref();
            if !(1..=60_000).contains(&ms) {
                return self.err(
                    span(d),
                    ConfigErrorKind::Value(format!(
                        "[accel] deadline_ms must be from 1 to 60000 (milliseconds a job may wait for the engine server; default {}), not {ms}",
                        accel::shared::DEFAULT_DEADLINE.as_millis()
                    )),
                );
            }
            shared.deadline = std::time::Duration::from_millis(ms);
        }
        match (&a.socket, &a.engine) {
            (Some(path), _) if path.get_ref().is_empty() => {
                return self.err(
                    span(path),
                    ConfigErrorKind::Value("[accel] socket must name the engine server's socket".into()),
                );
            }
            (Some(path), _) => shared.socket = path.get_ref().into(),
            (None, Some(engine)) if kind == EngineKind::Shared => {
                return self.err(
                    span(engine),
                    ConfigErrorKind::Value(
                        "[accel] engine = \"shared\" needs socket = \"PATH\", the socket `espgw engine serve --socket PATH` listens on"
                            .into(),
                    ),
                );
            }
            _ => {}
        }
        Ok(shared)
    }

    fn port(&self, name: &S<String>) -> Result<Port, ConfigError> {
        self.keyword(name, ConfigErrorKind::Interfaces, |other, expected| {
            format!("interface name `{other}` must be {expected}")
        })
    }

    fn interfaces(&self) -> Result<(Interface, Interface, [LinkOverrides; 2]), ConfigError> {
        let mut found: [Option<Interface>; 2] = [None, None];
        let mut overrides = [LinkOverrides::default(); 2];
        for i in &self.raw.interface {
            let at = span(i);
            let i = i.get_ref();
            let port = self.port(&i.name)?;
            // smoltcp's parser, held to its canonical form: it would take
            // `010.0.0.1` as 10.0.0.1, which tools that read octal take as
            // 8.0.0.1 (std refuses it for that reason, and so do we).
            let text = i.address.get_ref();
            let cidr = text.parse::<Ipv4Cidr>().ok().filter(|c| c.to_string() == *text);
            let Some(cidr) = cidr else {
                return self.err(
                    span(&i.address),
                    ConfigErrorKind::Value(format!(
                        "interface address `{}` must be address/prefix-length, e.g. 192.168.1.1/24",
                        i.address.get_ref()
                    )),
                );
            };
            let address = cidr.address();
            let network =
                Ipv4Prefix::new(cidr.network().address(), cidr.prefix_len()).unwrap_or(Ipv4Prefix::ANY);
            let mac = match &i.mac {
                Some(m) => self.mac(m)?,
                // A stand-in for offline use (pcap, bench): a locally
                // administered address derived from the IP address. `espgw
                // run` takes the device's own (see `LinkOverrides`).
                None => {
                    let o = address.octets();
                    EthernetAddress([0x02, 0x00, o[0], o[1], o[2], o[3]])
                }
            };
            let address6 = match &i.address6 {
                None => None,
                Some(at) => Some(self.interface_address6(at)?),
            };
            let mtu = i.mtu.as_ref().map_or(1500, |m| *m.get_ref());
            if !(576..=9000).contains(&mtu) {
                return self.err(
                    i.mtu.as_ref().and_then(span),
                    ConfigErrorKind::Value(format!("MTU {mtu} is out of range; use 576 to 9000")),
                );
            }
            // RFC 8200 §5: every link that carries IPv6 carries 1280 bytes.
            if address6.is_some() && mtu < 1280 {
                return self.err(
                    i.mtu.as_ref().and_then(span),
                    ConfigErrorKind::Value(format!(
                        "MTU {mtu} is below IPv6's minimum link MTU; an interface with `address6` needs 1280 or more"
                    )),
                );
            }
            let kind = match &i.kind {
                None => InterfaceKind::Ethernet,
                Some(k) => match self.keyword(k, ConfigErrorKind::Interfaces, |other, expected| {
                    format!("interface kind `{other}` must be {expected}")
                })? {
                    InterfaceKind::Tun if port != Port::Inside => {
                        return self.err(
                            span(k),
                            ConfigErrorKind::Interfaces(
                                "only the `inside` interface can be a TUN device; the outside needs Ethernet for ESP to peers"
                                    .into(),
                            ),
                        );
                    }
                    kind => kind,
                },
            };
            if found[port.index()].is_some() {
                return self.err(
                    at,
                    ConfigErrorKind::Interfaces(format!("interface `{port}` is defined twice")),
                );
            }
            overrides[port.index()] = LinkOverrides {
                mac: i.mac.is_some(),
                mtu: i.mtu.is_some(),
            };
            found[port.index()] = Some(Interface {
                port,
                kind,
                device: i.device.clone(),
                address,
                network,
                mac,
                mtu,
                address6,
            });
        }
        match found {
            [Some(inside), Some(outside)] => Ok((inside, outside, overrides)),
            [None, _] => self.err(None, ConfigErrorKind::Interfaces("no [[interface]] named `inside`; a gateway needs an `inside` and an `outside` interface".into())),
            [_, None] => self.err(None, ConfigErrorKind::Interfaces("no [[interface]] named `outside`; a gateway needs an `inside` and an `outside` interface".into())),
        }
    }

    /// An interface's `address6`: a unicast IPv6 address with the length
    /// of its on-link prefix.
    fn interface_address6(&self, at: &S<String>) -> Result<(Ipv6Addr, Ipv6Prefix), ConfigError> {
        let text = at.get_ref();
        let parsed = text.split_once('/').and_then(|(a, l)| {
            let addr = a.parse::<Ipv6Addr>().ok()?;
            let len = l.parse::<u8>().ok().filter(|l| (1..=128).contains(l))?;
            let mask = u128::MAX << (128 - u32::from(len));
            Some((
                addr,
                Ipv6Prefix::new(Ipv6Addr::from(u128::from(addr) & mask), len)?,
            ))
        });
        let Some((addr, network)) = parsed else {
            return self.err(
                span(at),
                ConfigErrorKind::Value(format!(
                    "interface address6 `{text}` must be address/prefix-length, e.g. 2001:db8:1::1/64"
                )),
            );
        };
        if addr.is_unspecified()
            || addr.is_loopback()
            || addr.is_multicast()
            || addr.to_ipv4_mapped().is_some()
        {
            return self.err(
                span(at),
                ConfigErrorKind::Value(format!(
                    "interface address6 `{addr}` must be a unicast address of this link (not unspecified, loopback, multicast or IPv4-mapped)"
                )),
            );
        }
        Ok((addr, network))
    }

    fn algorithm(&self, proposal: &S<String>) -> Result<Algorithm, ConfigError> {
        let alg: Algorithm = proposal
            .get_ref()
            .parse()
            .map_err(|e: accel::UnknownAlgorithm| self.loc.error(span(proposal), e.into()))?;
        if alg.is_insecure() && !self.raw.gateway.allow_insecure_null {
            return self.err(span(proposal), ConfigErrorKind::InsecureNull);
        }
        Ok(alg)
    }

    fn key(
        &self,
        key: Option<&S<SecretText>>,
        field: &str,
        expected: usize,
        alg: Algorithm,
        near: Option<Range<usize>>,
    ) -> Result<Zeroizing<Vec<u8>>, ConfigError> {
        let Some(key) = key else {
            if expected == 0 {
                return Ok(Zeroizing::new(Vec::new()));
            }
            let or_secret = if field.ends_with("_out") || field.ends_with("_in") {
                ", or give the tunnel a `secret` (16 characters or more) to derive every key from"
            } else {
                ""
            };
            return self.err(
                near,
                ConfigErrorKind::Key(format!(
                    "{alg} needs `{field}`: {expected} bytes as {} hex digits{or_secret}",
                    expected * 2
                )),
            );
        };
        let Some(bytes) = decode_hex_key(key.get_ref().as_str()) else {
            return self.err(
                span(key),
                ConfigErrorKind::Key(format!(
                    "`{field}` is not hexadecimal (an even number of digits 0-9 and a-f, optional 0x prefix and colons)"
                )),
            );
        };
        if bytes.len() != expected {
            let salt = if alg.is_aead() {
                ", the AES key followed by the 4-byte salt"
            } else {
                ""
            };
            return self.err(
                span(key),
                ConfigErrorKind::Key(if expected == 0 {
                    format!("{alg} takes no `{field}`; remove it")
                } else {
                    format!(
                        "`{field}` for {alg} must be {expected} bytes ({} hex digits{salt}), not {} bytes",
                        expected * 2,
                        bytes.len()
                    )
                }),
            );
        }
        Ok(bytes)
    }

    fn lifetime(&self, raw: Option<&S<RawLifetime>>) -> Result<Lifetime, ConfigError> {
        let Some(raw) = raw else {
            return Ok(Lifetime::default());
        };
        let l = raw.get_ref();
        let soft_idle = self.idle_seconds("soft_idle_s", l.soft_idle_s.as_ref())?;
        let hard_idle = self.idle_seconds("hard_idle_s", l.hard_idle_s.as_ref())?;
        let lifetime = Lifetime {
            soft: Limits {
                bytes: l.soft_bytes,
                packets: l.soft_packets,
                seconds: l.soft_seconds,
                idle_seconds: soft_idle,
            },
            hard: Limits {
                bytes: l.hard_bytes,
                packets: l.hard_packets,
                seconds: l.hard_seconds,
                idle_seconds: hard_idle,
            },
        };
        if let (Some(s), Some(h), Some(at)) = (soft_idle, hard_idle, l.soft_idle_s.as_ref()) {
            if s > h {
                return self.err(
                    span(at),
                    ConfigErrorKind::Value(format!(
                        "soft_idle_s ({s}) is above hard_idle_s ({h}); the soft limit must come first"
                    )),
                );
            }
        }
        for (what, soft, hard) in [
            ("bytes", l.soft_bytes, l.hard_bytes),
            ("packets", l.soft_packets, l.hard_packets),
            ("seconds", l.soft_seconds, l.hard_seconds),
        ] {
            if let (Some(s), Some(h)) = (soft, hard) {
                if s > h {
                    return self.err(
                        span(raw),
                        ConfigErrorKind::Value(format!(
                            "soft_{what} ({s}) is above hard_{what} ({h}); the soft limit must come first"
                        )),
                    );
                }
            }
        }
        Ok(lifetime)
    }

    /// An idle limit: whole seconds since the SA's last packet, at least 1
    /// (0 would retire every SA at once).
    fn idle_seconds(&self, field: &str, raw: Option<&S<i64>>) -> Result<Option<u64>, ConfigError> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        match u64::try_from(*raw.get_ref()) {
            Ok(s) if s >= 1 => Ok(Some(s)),
            _ => self.err(
                span(raw),
                ConfigErrorKind::Value(format!(
                    "{field} = {} is not a number of seconds of at least 1; it counts the seconds since the SA's last packet (leave it out for no idle limit)",
                    raw.get_ref()
                )),
            ),
        }
    }

    fn mode(&self, mode: Option<&S<String>>) -> Result<Mode, ConfigError> {
        mode.map_or(Ok(Mode::Tunnel), |m| {
            self.keyword(m, ConfigErrorKind::Value, |other, expected| {
                format!("mode `{other}` is not {expected}")
            })
        })
    }

    /// `encap`, `udp_port` and `peer_udp_port` of an SA or tunnel.
    fn encap(
        &self,
        encap: Option<&S<String>>,
        udp_port: Option<&S<u16>>,
        peer_udp_port: Option<&S<u16>>,
        mode: Mode,
    ) -> Result<Option<UdpEncap>, ConfigError> {
        let encap_word = encap.map(|e| {
            // Each word's meaning is in the message, so it is written out.
            self.keyword(e, ConfigErrorKind::Value, |other, _| {
                format!("encap `{other}` is not `udp` (RFC 3948 NAT traversal) or `none` (raw ESP)")
            })
        });
        let udp = match encap_word.transpose()? {
            None | Some(EncapWord::None) => false,
            Some(EncapWord::Udp) => true,
        };
        if !udp {
            if let Some(port) = udp_port.or(peer_udp_port) {
                return self.err(
                    span(port),
                    ConfigErrorKind::Value("UDP ports need `encap = \"udp\"`; raw ESP has no ports".into()),
                );
            }
            return Ok(None);
        }
        if mode == Mode::Transport {
            // RFC 3948 §3.1.2: transport mode behind a NAT needs the inner
            // TCP/UDP checksums fixed up from the peers' original addresses
            // (NAT-OA), which a configured tunnel does not know.
            return self.err(
                encap.and_then(span),
                ConfigErrorKind::Value(
                    "encap = \"udp\" needs tunnel mode: transport mode behind a NAT needs the \
                     original addresses to fix inner checksums (RFC 3948 §3.1.2); use mode = \"tunnel\""
                        .into(),
                ),
            );
        }
        let port = |p: Option<&S<u16>>, field: &str| match p {
            None => Ok(UdpEncap::NAT_T.local_port),
            Some(p) if *p.get_ref() == 0 => self.err(
                span(p),
                ConfigErrorKind::Value(format!("{field} 0 is not a port; RFC 3948 uses 4500")),
            ),
            // IKE's own port: its messages would be taken for ESP.
            Some(p) if *p.get_ref() == dataplane::CONTROL_PORT => self.err(
                span(p),
                ConfigErrorKind::Value(format!(
                    "{field} {} is IKE's port and carries no ESP; RFC 3948 uses 4500",
                    dataplane::CONTROL_PORT
                )),
            ),
            Some(p) => Ok(*p.get_ref()),
        };
        Ok(Some(UdpEncap {
            local_port: port(udp_port, "udp_port")?,
            remote_port: port(peer_udp_port, "peer_udp_port")?,
        }))
    }

    fn replay_window(&self, window: Option<&S<u32>>, esn: bool) -> Result<u32, ConfigError> {
        let size = window.map_or(DEFAULT_REPLAY_WINDOW, |w| *w.get_ref());
        if size > MAX_WINDOW {
            return self.err(
                window.and_then(span),
                ConfigErrorKind::Value(format!(
                    "replay_window {size} is above the maximum of {MAX_WINDOW}"
                )),
            );
        }
        if esn && size == 0 {
            // RFC 4303 §2.2.1: ESN needs the window to infer the high bits.
            return self.err(
                window.and_then(span),
                ConfigErrorKind::Value(
                    "ESN needs an anti-replay window; set replay_window to at least 1".into(),
                ),
            );
        }
        Ok(size)
    }

    fn spi(&self, spi: &S<u32>) -> Result<u32, ConfigError> {
        let value = *spi.get_ref();
        if value < 256 {
            return self.err(
                span(spi),
                ConfigErrorKind::Value(format!(
                    "SPI {value} is reserved (RFC 4303 §2.1); use a value of 256 or more"
                )),
            );
        }
        Ok(value)
    }

    /// Checks that keys are usable by creating (and dropping) a session.
    fn check_session(&self, sa: &SaConfig, at: Option<Range<usize>>) -> Result<(), ConfigError> {
        Session::new(sa.algorithm, &sa.enc_key, &sa.auth_key)
            .map(drop)
            .or_else(|e| self.err(at, ConfigErrorKind::Key(format!("SA `{}`: {e}", sa.params.name))))
    }

    fn sa(&self, s: &RawSa) -> Result<SaConfig, ConfigError> {
        let direction: SaDirection =
            self.keyword(&s.direction, ConfigErrorKind::Value, |other, expected| {
                format!("SA direction `{other}` must be {expected}")
            })?;
        let algorithm = self.algorithm(&s.proposal)?;
        let mode = self.mode(s.mode.as_ref())?;
        let encap = self.encap(
            s.encap.as_ref(),
            s.udp_port.as_ref(),
            s.peer_udp_port.as_ref(),
            mode,
        )?;
        let (local, remote) = self.ends((&s.local, &s.remote), encap.is_some(), s.name.get_ref())?;
        let sa = SaConfig {
            params: SaParams {
                name: s.name.get_ref().clone(),
                direction,
                spi: self.spi(&s.spi)?,
                mode,
                encap,
                local,
                remote,
                esn: s.esn,
                replay_window: self.replay_window(s.replay_window.as_ref(), s.esn)?,
                lifetime: self.lifetime(s.lifetime.as_ref())?,
                // Filled in once the policies are known.
                selectors: Vec::new(),
            },
            algorithm,
            enc_key: self.key(
                s.enc_key.as_ref(),
                "enc_key",
                algorithm.enc_key_len(),
                algorithm,
                span(&s.proposal),
            )?,
            auth_key: self.key(
                s.auth_key.as_ref(),
                "auth_key",
                algorithm.auth_key_len(),
                algorithm,
                span(&s.proposal),
            )?,
            initial_seq: s.initial_seq.unwrap_or(0),
            admits_any: self.admits_any(s.selectors.as_ref(), direction)?,
            keys: KeySource::File,
        };
        self.check_session(&sa, s.enc_key.as_ref().and_then(span).or(span(&s.name)))?;
        Ok(sa)
    }

    /// Whether an SA's `selectors` field says it admits everything.
    fn admits_any(&self, selectors: Option<&S<String>>, direction: SaDirection) -> Result<bool, ConfigError> {
        let Some(selectors) = selectors else {
            return Ok(false);
        };
        if direction == SaDirection::Outbound {
            return self.err(
                span(selectors),
                ConfigErrorKind::Value(
                    "only inbound SAs have `selectors` (what may arrive through them); an outbound SA carries what the `out` policies naming it select: remove `selectors`".into(),
                ),
            );
        }
        match selectors.get_ref().as_str() {
            "any" => Ok(true),
            other => self.err(
                span(selectors),
                ConfigErrorKind::Value(format!(
                    "selectors `{other}` must be \"any\"; to admit less, leave `selectors` out and name the SA in inbound `protect` policies with the source and destination it carries"
                )),
            ),
        }
    }

    #[allow(clippy::type_complexity)]
    fn tunnel(
        &self,
        t: &RawTunnel,
    ) -> Result<(TunnelConfig, SaConfig, SaConfig, PolicySetup, PolicySetup), ConfigError> {
        let name = t.name.get_ref();
        if name.is_empty() || name.len() > crate::message::MAX_NAME || name.contains(char::is_whitespace) {
            return self.err(
                span(&t.name),
                ConfigErrorKind::Value(format!(
                    "tunnel name `{name}` must be 1 to {} characters without spaces",
                    crate::message::MAX_NAME
                )),
            );
        }
        let algorithm = self.algorithm(&t.proposal)?;
        let mode = self.mode(t.mode.as_ref())?;
        let encap = self.encap(
            t.encap.as_ref(),
            t.udp_port.as_ref(),
            t.peer_udp_port.as_ref(),
            mode,
        )?;
        let (local, remote) = self.ends((&t.local, &t.remote), encap.is_some(), name)?;
        // The rekey exchange runs over IPv4 so far (`Gateway::send_datagram`).
        if let (IpAddr::V6(_), Some(secret)) = (local, &t.secret) {
            return self.err(
                span(secret),
                ConfigErrorKind::Value(format!(
                    "tunnel `{name}` has IPv6 ends, and the rekey exchange a `secret` drives runs over IPv4 only so far; \
                     give the tunnel its keys (enc_key_out, enc_key_in, ...) instead"
                )),
            );
        }
        let subnet = |s: Option<&S<String>>, host: IpAddr, field: &str| -> Result<IpPrefix, ConfigError> {
            match (s, host) {
                (Some(s), _) => self.value(s, field, "192.168.1.0/24"),
                (None, IpAddr::V4(host)) if mode == Mode::Transport => Ok(Ipv4Prefix::host(host).into()),
                (None, IpAddr::V6(host)) if mode == Mode::Transport => {
                    Ok(Ipv6Prefix::new(host, 128).map_or(IpPrefix::Any, IpPrefix::V6))
                }
                (None, _) => self.err(
                    span(&t.name),
                    ConfigErrorKind::Value(format!(
                        "tunnel `{name}` needs `{field}` (the network behind this end)"
                    )),
                ),
            }
        };
        let local_subnet = subnet(t.local_subnet.as_ref(), local, "local_subnet")?;
        let remote_subnet = subnet(t.remote_subnet.as_ref(), remote, "remote_subnet")?;
        // IPv6 networks ride an IPv4 tunnel (RFC 4301 §5.1.2 allows any
        // inner family in tunnel mode); transport mode protects the
        // packets of the ends themselves, IPv4 ones.
        let families = (local_subnet.family(), remote_subnet.family());
        let at = t
            .remote_subnet
            .as_ref()
            .or(t.local_subnet.as_ref())
            .and_then(span);
        if families.0 != families.1 {
            return self.err(
                at,
                ConfigErrorKind::Value(format!(
                    "tunnel `{name}`: local_subnet {local_subnet} and remote_subnet {remote_subnet} are of different families; \
                     give both IPv4 or both IPv6 (one tunnel per family)"
                )),
            );
        }
        let ends_family = if local.is_ipv6() {
            spd_sad::Family::V6
        } else {
            spd_sad::Family::V4
        };
        if mode == Mode::Transport && families.0.is_some_and(|f| f != ends_family) {
            return self.err(
                at,
                ConfigErrorKind::Value(format!(
                    "tunnel `{name}`: transport mode carries the packets of {local} and {remote} themselves, \
                     so its subnets are of their family; other networks need `mode = \"tunnel\"`"
                )),
            );
        }
        let protocol = match &t.protocol {
            Some(p) => self.value(p, "protocol", "udp")?,
            None => ProtocolSelector::Any,
        };
        let replay_window = self.replay_window(t.replay_window.as_ref(), t.esn)?;
        let lifetime = self.lifetime(t.lifetime.as_ref())?;
        let near = span(&t.proposal);
        let secret = t.secret.as_ref().map(|s| self.secret(s)).transpose()?;
        if let Some(at) = &t.secret {
            // Keys and SPIs come from the exchange, fresh at every start:
            // configured ones would be used again after a restart.
            let configured = [
                ("spi_out", t.spi_out.as_ref().and_then(span)),
                ("spi_in", t.spi_in.as_ref().and_then(span)),
                ("enc_key_out", t.enc_key_out.as_ref().and_then(span)),
                ("enc_key_in", t.enc_key_in.as_ref().and_then(span)),
                ("auth_key_out", t.auth_key_out.as_ref().and_then(span)),
                ("auth_key_in", t.auth_key_in.as_ref().and_then(span)),
                ("initial_seq_out", t.initial_seq_out.and(span(at))),
                ("initial_seq_in", t.initial_seq_in.and(span(at))),
            ];
            if let Some((field, where_)) = configured.into_iter().find(|(_, s)| s.is_some()) {
                return self.err(
                    where_,
                    ConfigErrorKind::Value(format!(
                        "tunnel `{name}` has a `secret`, so its keys and SPIs come from an exchange with the peer, \
                         fresh at every start (keys from the file would be used again after a restart, with the \
                         same sequence numbers); remove `{field}`, or remove `secret` to key the tunnel by hand"
                    )),
                );
            }
        }
        let required_spi = |spi: &Option<S<u32>>, field: &str| -> Result<u32, ConfigError> {
            match spi {
                Some(spi) => self.spi(spi),
                None => self.err(
                    span(&t.name),
                    ConfigErrorKind::Value(format!(
                        "tunnel `{name}` needs `{field}` (256 or more), or a `secret` to key it by an exchange with the peer"
                    )),
                ),
            }
        };
        let keys = if secret.is_some() {
            KeySource::Exchange
        } else {
            KeySource::File
        };
        let make_sa = |suffix: &str,
                       direction,
                       spi: &Option<S<u32>>,
                       enc: Option<&S<SecretText>>,
                       auth: Option<&S<SecretText>>,
                       initial_seq: Option<u64>,
                       (l, r)|
         -> Result<SaConfig, ConfigError> {
            let (spi, enc_key, auth_key) = match keys {
                // A template: the plane fills these in for each exchange.
                // (A tunnel is never keyed by the kernel's SAD.)
                KeySource::Exchange | KeySource::Xfrm { .. } => {
                    (0, Zeroizing::new(Vec::new()), Zeroizing::new(Vec::new()))
                }
                KeySource::File => (
                    required_spi(spi, &format!("spi_{suffix}"))?,
                    self.key(
                        enc,
                        &format!("enc_key_{suffix}"),
                        algorithm.enc_key_len(),
                        algorithm,
                        near.clone(),
                    )?,
                    self.key(
                        auth,
                        &format!("auth_key_{suffix}"),
                        algorithm.auth_key_len(),
                        algorithm,
                        near.clone(),
                    )?,
                ),
            };
            let sa = SaConfig {
                params: SaParams {
                    name: format!("{name}-{suffix}"),
                    direction,
                    spi,
                    mode,
                    encap,
                    local: l,
                    remote: r,
                    esn: t.esn,
                    replay_window,
                    lifetime,
                    selectors: Vec::new(),
                },
                algorithm,
                enc_key,
                auth_key,
                initial_seq: initial_seq.unwrap_or(0),
                admits_any: false,
                keys,
            };
            if keys == KeySource::File {
                self.check_session(&sa, enc.and_then(span).or(span(&t.name)))?;
            }
            Ok(sa)
        };
        let out_sa = make_sa(
            "out",
            SaDirection::Outbound,
            &t.spi_out,
            t.enc_key_out.as_ref(),
            t.auth_key_out.as_ref(),
            t.initial_seq_out,
            (local, remote),
        )?;
        let in_sa = make_sa(
            "in",
            SaDirection::Inbound,
            &t.spi_in,
            t.enc_key_in.as_ref(),
            t.auth_key_in.as_ref(),
            t.initial_seq_in,
            (local, remote),
        )?;
        let priority = t.priority.unwrap_or(DEFAULT_PRIORITY);
        let selector = |src, dst| Selector {
            src,
            dst,
            protocol,
            src_ports: PortRange::ANY,
            dst_ports: PortRange::ANY,
        };
        let out_policy = PolicySetup {
            name: format!("{name}-out"),
            direction: PolicyDirection::Out,
            priority,
            selector: selector(local_subnet, remote_subnet),
            action: PolicyAction::Protect(out_sa.params.name.clone()),
        };
        let in_policy = PolicySetup {
            name: format!("{name}-in"),
            direction: PolicyDirection::In,
            priority,
            selector: selector(remote_subnet, local_subnet),
            action: PolicyAction::Protect(in_sa.params.name.clone()),
        };
        let tunnel = TunnelConfig {
            name: name.clone(),
            local,
            remote,
            algorithm,
            mode,
            esn: t.esn,
            replay_window,
            lifetime,
            secret,
            encap,
        };
        Ok((tunnel, out_sa, in_sa, out_policy, in_policy))
    }

    fn ports(&self, ports: Option<&S<RawPorts>>) -> Result<PortRange, ConfigError> {
        match ports {
            None => Ok(PortRange::ANY),
            Some(p) => match p.get_ref() {
                RawPorts::Number(n) => Ok(PortRange { first: *n, last: *n }),
                RawPorts::Text(t) => t.parse().or_else(|e: spd_sad::SelectorError| {
                    self.err(span(p), ConfigErrorKind::Value(e.to_string()))
                }),
            },
        }
    }

    fn policy(&self, p: &RawPolicy) -> Result<PolicySetup, ConfigError> {
        let direction: PolicyDirection =
            self.keyword(&p.direction, ConfigErrorKind::Value, |other, expected| {
                format!("policy direction `{other}` must be {expected}")
            })?;
        let prefix = |s: Option<&S<String>>, field: &str| -> Result<IpPrefix, ConfigError> {
            match s {
                Some(s) => self.value(s, field, "192.168.1.0/24"),
                None => Ok(IpPrefix::Any),
            }
        };
        let selector = Selector {
            src: prefix(p.source.as_ref(), "source")?,
            dst: prefix(p.destination.as_ref(), "destination")?,
            protocol: match &p.protocol {
                Some(s) => self.value(s, "protocol", "udp")?,
                None => ProtocolSelector::Any,
            },
            src_ports: self.ports(p.source_ports.as_ref())?,
            dst_ports: self.ports(p.destination_ports.as_ref())?,
        };
        if let Err(e) = selector.families() {
            return self.err(
                p.destination.as_ref().and_then(span),
                ConfigErrorKind::Value(e.to_string()),
            );
        }
        let word = self.keyword(&p.action, ConfigErrorKind::Value, |other, expected| {
            format!("action `{other}` must be {expected}")
        })?;
        let action = match (word, &p.sa) {
            (ActionWord::Protect, Some(sa)) => PolicyAction::Protect(sa.get_ref().clone()),
            (ActionWord::Protect, None) => {
                return self.err(
                    span(&p.action),
                    ConfigErrorKind::Value(
                        "a `protect` policy needs `sa = \"NAME\"` naming the SA to use".into(),
                    ),
                );
            }
            (ActionWord::Bypass | ActionWord::Discard, Some(sa)) => {
                return self.err(
                    span(sa),
                    ConfigErrorKind::Value(
                        "only `protect` policies name an SA; remove `sa` or make the action `protect`".into(),
                    ),
                );
            }
            (ActionWord::Bypass, None) => PolicyAction::Bypass,
            (ActionWord::Discard, None) => PolicyAction::Discard,
        };
        Ok(PolicySetup {
            name: p.name.get_ref().clone(),
            direction,
            priority: p.priority.unwrap_or(DEFAULT_PRIORITY),
            selector,
            action,
        })
    }

    fn cross_check(
        &self,
        sas: &[(Option<Range<usize>>, SaConfig)],
        policies: &[(Option<Range<usize>>, PolicySetup)],
    ) -> Result<(), ConfigError> {
        for (i, (at, sa)) in sas.iter().enumerate() {
            let earlier = &sas[..i];
            if earlier.iter().any(|(_, e)| e.params.name == sa.params.name) {
                return self.err(at.clone(), ConfigErrorKind::DuplicateName(sa.params.name.clone()));
            }
            // A template's SPI is chosen by each exchange.
            if sa.params.direction == SaDirection::Inbound && sa.keys == KeySource::File {
                if let Some((_, first)) = earlier.iter().find(|(_, e)| {
                    e.params.direction == SaDirection::Inbound
                        && e.keys == KeySource::File
                        && e.params.spi == sa.params.spi
                }) {
                    return self.err(
                        at.clone(),
                        ConfigErrorKind::DuplicateSpi {
                            spi: sa.params.spi,
                            first: first.params.name.clone(),
                            second: sa.params.name.clone(),
                        },
                    );
                }
            }
        }
        for (i, (at, policy)) in policies.iter().enumerate() {
            if policies[..i].iter().any(|(_, e)| e.name == policy.name) {
                return self.err(at.clone(), ConfigErrorKind::DuplicateName(policy.name.clone()));
            }
            let PolicyAction::Protect(name) = &policy.action else {
                continue;
            };
            let Some((_, sa)) = sas.iter().find(|(_, s)| &s.params.name == name) else {
                return self.err(
                    at.clone(),
                    ConfigErrorKind::MissingSa {
                        policy: policy.name.clone(),
                        sa: name.clone(),
                    },
                );
            };
            let matches = matches!(
                (policy.direction, sa.params.direction),
                (PolicyDirection::Out, SaDirection::Outbound) | (PolicyDirection::In, SaDirection::Inbound)
            );
            if !matches {
                return self.err(
                    at.clone(),
                    ConfigErrorKind::WrongSaDirection {
                        policy: policy.name.clone(),
                        sa: name.clone(),
                        direction: policy.direction.to_string(),
                    },
                );
            }
            // Transport mode protects the ends' own packets, of their family.
            let (ends, other, names) = if sa.params.local.is_ipv6() {
                (spd_sad::Family::V6, spd_sad::Family::V4, ("IPv6", "IPv4"))
            } else {
                (spd_sad::Family::V4, spd_sad::Family::V6, ("IPv4", "IPv6"))
            };
            debug_assert_ne!(ends, other);
            if sa.params.mode == Mode::Transport && policy.selector.families() == Ok(&[other]) {
                return self.err(
                    at.clone(),
                    ConfigErrorKind::Value(format!(
                        "policy `{}` selects {} packets for SA `{name}`, which is in transport mode between {} ends; \
                         carry them in a tunnel-mode SA",
                        policy.name, names.1, names.0
                    )),
                );
            }
        }
        // RFC 4301 §5.2: every inbound SA admits what its policies select;
        // one without policies admits everything only when it says so.
        for (at, sa) in sas
            .iter()
            .filter(|(_, s)| s.params.direction == SaDirection::Inbound)
        {
            let name = &sa.params.name;
            let naming = policies.iter().find(|(_, p)| {
                p.direction == PolicyDirection::In && p.action == PolicyAction::Protect(name.clone())
            });
            match (sa.admits_any, naming) {
                (false, None) => {
                    return self.err(at.clone(), ConfigErrorKind::UnselectedSa { sa: name.clone() });
                }
                (true, Some((_, policy))) => {
                    let selectors = self
                        .raw
                        .sa
                        .iter()
                        .find(|s| s.get_ref().name.get_ref() == name)
                        .and_then(|s| s.get_ref().selectors.as_ref().map(span));
                    return self.err(
                        selectors.flatten().or(at.clone()),
                        ConfigErrorKind::AnySaWithPolicy {
                            sa: name.clone(),
                            policy: policy.name.clone(),
                        },
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Hex key text (optional `0x`, optional colons between digits) as bytes,
/// decoded straight into wiped memory: no intermediate copy of the text.
pub(crate) fn decode_hex_key(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    let text = text.trim();
    let text = text.strip_prefix("0x").unwrap_or(text);
    let digits = || text.bytes().filter(|b| *b != b':');
    let count = digits().count();
    if count % 2 != 0 {
        return None;
    }
    let mut bytes = Zeroizing::new(Vec::with_capacity(count / 2));
    let mut high = None;
    for digit in digits() {
        let value = char::from(digit).to_digit(16)? as u8;
        match high.take() {
            None => high = Some(value),
            Some(h) => bytes.push(h << 4 | value),
        }
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::{decode_hex_key, read_wiped};

    #[test]
    fn the_file_is_read_into_one_buffer_of_its_size() {
        let path = std::env::temp_dir().join(format!("espgw-read-wiped-{}", std::process::id()));
        let text = "enc_key = \"00112233\"\n".repeat(500);
        std::fs::write(&path, &text).unwrap();
        let (read, _) = read_wiped(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&read[..], text.as_bytes());
        // Never regrown: no copy of the text was freed unwiped on the way.
        assert_eq!(read.capacity(), text.len());
    }

    #[test]
    fn hex_keys_decode_with_prefix_and_colons() {
        assert_eq!(
            decode_hex_key("0x00ff").as_deref().map(|v| v.as_slice()),
            Some(&[0, 255][..])
        );
        assert_eq!(
            decode_hex_key(" 0a:Bc ").as_deref().map(|v| v.as_slice()),
            Some(&[10, 188][..])
        );
        assert_eq!(decode_hex_key("").as_deref().map(|v| v.len()), Some(0));
        assert!(decode_hex_key("abc").is_none(), "odd number of digits");
        assert!(decode_hex_key("zz").is_none());
        assert!(decode_hex_key("0x+1").is_none());
    }
}
