//! The control plane's state machine: keying tunnels with the peer
//! (connecting at start, rekeying), retiring replaced SAs, and applying
//! configuration reloads.
//!
//! Sans-IO like the gateway: it is fed SA lifetime events, the control
//! datagrams the gateway delivered, what the gateway's ESP showed (which
//! SAs carried packets, where encapsulated peers are: the driver reads it
//! off its gateway, as the plane holds none) and the time, and it answers
//! with [`SaCommand`]s for every worker's gateway to apply and
//! [`Datagram`]s to send.
//! A datagram must not leave before the commands issued ahead of it are
//! applied everywhere ([`Datagram::after_commands`]): the responder's new
//! inbound SA must exist before the initiator can learn it and switch.
//!
//! A tunnel with a secret has no SAs until it connects: an INIT exchange
//! makes a *control SA* (IKEv2's IKE SA) from fresh SPIs and nonces of both
//! ends, and its first child SAs; every later message is authenticated
//! under the control SA, with one key per direction. So nothing captured
//! before a restart (of either end) names a control SA that exists, a
//! message sent back to its sender does not verify, and no ESP key is
//! ever used twice. Traffic moves to SAs only once the peer has proven it
//! is live, with a key that depends on this end's fresh nonce.
//!
//! Connecting, make-before-break (I initiates, R responds):
//!
//! ```text
//! I  INIT request (SPIi, Ni, SPI_I; key from the secret and I's side)  ->  R
//!       R installs in+out (not used yet), keeps what it had
//! I  <-  INIT response (SPIi, SPIr, Nr, SPI_R; key of the new control SA)
//! I  installs in+out, sends on them, "switched"  ->  R moves to them and to the new control SA
//! I  <-  switched acknowledged; both delete what they had after the grace period
//! ```
//!
//! One rekey, under the control SA, is the same with a rekey request
//! (child+1, SPI, nonce) in place of INIT. An answer that is never
//! confirmed expires and its SAs are removed.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use dataplane::command::{KeySource, SaCommand, SaSetup};
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};
use spd_sad::{PolicyDirection, SaDirection, SaEvent, SaParams, Selector, UdpEncap};

use crate::config::{Config, PolicySetup, RekeySettings, SaConfig, TunnelConfig};
use crate::message::{peek, ControlSpi, Kind, Message, MessageError, SPI_LEN};
use crate::prf::{ControlKeys, Side, TunnelSecrets, NONCE_LEN};
use crate::removal::{Issued, Removal, RemovalNote};
use dataplane::nat::NON_ESP_MARKER;
use dataplane::CONTROL_PORT;

/// The one line of a gateway refusing `command`: what it would have
/// installed or changed stays out, and the policies naming a missing SA
/// discard. Never the SA's keys.
pub fn log_refused(command: &SaCommand, error: &dyn std::fmt::Display) {
    let (mut sa, mut policy, mut port, mut spi, mut reqid) = (None, None, None, None, None);
    match command {
        SaCommand::InstallSa(new) | SaCommand::ReplaceSa { new, .. } => {
            sa = Some(new.params.name.as_str());
            spi = Some(format!("{:#010x}", new.params.spi));
            if let KeySource::Xfrm { reqid: r } = new.key_source {
                reqid = Some(r);
            }
        }
        SaCommand::RemoveSa(name) | SaCommand::SetSelectors { sa: name, .. } => sa = Some(name.as_str()),
        SaCommand::InsertPolicy(p) => policy = Some(p.name.as_str()),
        SaCommand::RemovePolicy(name)
        | SaCommand::Repoint { policy: name, .. }
        | SaCommand::SetPolicyAction { policy: name, .. } => policy = Some(name.as_str()),
        SaCommand::OpenEncapsulationPort(p) => port = Some(*p),
    }
    tracing::error!(
        event = "install_refused",
        sa,
        spi,
        reqid,
        policy,
        port,
        reason = %error,
        "the gateway refused a change, its traffic is dropped: {error}"
    );
}

/// A control message to send from the gateway's address on `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// The peer's address (where a UDP-encapsulated peer was last seen).
    pub to: Ipv4Addr,
    /// Our UDP port and the peer's.
    pub ports: (u16, u16),
    /// The UDP payload: the sealed message, behind the non-ESP marker on
    /// an encapsulation port.
    pub payload: Vec<u8>,
    /// How many commands the plane had issued when it produced this
    /// datagram: all of them must be applied on every worker first.
    pub after_commands: u64,
}

/// Counters of the control plane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlCounters {
    /// Datagrams handed to the plane, whatever became of them.
    pub received: u64,
    /// Messages sent, retransmissions included.
    pub sent: u64,
    /// Requests sent again because no response came in time.
    pub retransmitted: u64,
    /// Retransmitted requests answered again from the cached response.
    pub duplicates: u64,
    /// Ignored: the ICV did not verify.
    pub forged: u64,
    /// Ignored: a request with a message ID already used, or an INIT
    /// request of the control SA already in place.
    pub replayed: u64,
    /// Ignored: a message of ours sent back to us.
    pub reflected: u64,
    /// Ignored: a message of a control SA this end does not have (from
    /// before a restart of either end, or a replay of one).
    pub unknown_control_sa: u64,
    /// Ignored: a response to no outstanding request (a late duplicate of
    /// one already handled, or a replay).
    pub stale_responses: u64,
    /// Ignored: shorter or longer than its fields say.
    pub truncated: u64,
    /// Ignored: not IPv4/UDP, not our message format, or a bad field.
    pub malformed: u64,
    /// Ignored: names no tunnel with a secret.
    pub unknown_tunnel: u64,
    /// Ignored: from or to an address that is not the tunnel's.
    pub wrong_peer: u64,
    /// Ignored: for a child SA pair other than the next one.
    pub out_of_step: u64,
    /// Both ends started an exchange at once; the lower address gave way.
    pub collisions: u64,
    /// INIT exchanges this end started, and those that ended with both
    /// ends on the new control SA.
    pub connects_started: u64,
    /// INIT exchanges, started by either end, that ended with both ends on
    /// the new control SA and its first child SAs.
    pub connects_completed: u64,
    /// INIT requests answered whose initiator never confirmed (a replayed
    /// INIT, or a peer that gave up): their SAs were removed.
    pub half_open_expired: u64,
    /// INIT requests answered and dropped for a newer one, past the bound.
    pub half_open_evicted: u64,
    /// Rekeys answered whose initiator never confirmed the switch: their
    /// SAs were removed.
    pub responded_expired: u64,
    /// Rekey exchanges this end started.
    pub rekeys_started: u64,
    /// Rekeys, started by either end, after which both ends send on the
    /// new SAs.
    pub rekeys_completed: u64,
    /// Exchanges abandoned because the peer never answered.
    pub gave_up: u64,
    /// Soft lifetime events of SAs, one per worker's copy.
    pub soft_expired: u64,
    /// Hard lifetime events of SAs, one per worker's copy.
    pub hard_expired: u64,
    /// SAs deleted after being replaced (or with their tunnel).
    pub sas_deleted: u64,
    /// Reloads whose configuration was taken.
    pub reloads: u64,
    /// Reloads refused, the running configuration kept
    /// ([`ReloadError`]).
    pub reloads_rejected: u64,
}

/// INIT requests a tunnel answers and keeps waiting for confirmation at
/// once; a newer one evicts the oldest. Only a holder of the secret can
/// confirm one, so these are the peer's own (one at a time) or replays of
/// old ones, which cost SAs until they expire.
pub const MAX_HALF_OPEN: usize = 4;

/// Old inbound SAs a tunnel keeps to their hard lifetime after switches
/// the peer never confirmed (it may still send on them); past this, the
/// oldest goes.
pub const MAX_KEPT_UNCONFIRMED: usize = 2;

/// A control SA (IKEv2's IKE SA): made by an INIT exchange with fresh
/// SPIs and nonces from both ends, so every start of either end makes a new
/// one, and what was captured under an earlier one names nothing. It
/// authenticates every later message of the tunnel, with one key per
/// direction.
struct ControlSa {
    spi_i: ControlSpi,
    spi_r: ControlSpi,
    /// Whether this end started the INIT exchange that made it.
    initiator: bool,
    keys: ControlKeys,
    /// The ID of this end's next request.
    next_message_id: u32,
    /// Highest request ID seen from the peer, and our answer to it, if we
    /// gave one (sent again if the request is retransmitted).
    peer_request: Option<(u32, Option<Vec<u8>>)>,
    /// The last child SA pair both ends switched to (the INIT's is 0).
    child: u32,
}

impl ControlSa {
    /// Seals `message` as this end sends it: the SPIs, the initiator flag
    /// and the key of this end's role.
    fn seal(&self, mut message: Message) -> Vec<u8> {
        message.spi_i = self.spi_i;
        message.spi_r = self.spi_r;
        message.from_initiator = self.initiator;
        let key = if self.initiator {
            &self.keys.sk_ai
        } else {
            &self.keys.sk_ar
        };
        message.seal(&key[..])
    }

    /// Opens a message the peer sent under this control SA: with the key
    /// of the peer's role, so that our own messages sent back to us fail.
    fn open(&self, bytes: &[u8]) -> Result<Message, MessageError> {
        let key = if self.initiator {
            &self.keys.sk_ar
        } else {
            &self.keys.sk_ai
        };
        Message::open(bytes, &key[..])
    }

    fn is(&self, spi_i: &ControlSpi, spi_r: &ControlSpi) -> bool {
        &self.spi_i == spi_i && &self.spi_r == spi_r
    }

    fn take_message_id(&mut self) -> u32 {
        let id = self.next_message_id;
        self.next_message_id = self.next_message_id.wrapping_add(1);
        id
    }
}

/// An INIT request this end answered: its SAs are installed, and traffic
/// moves to them once the initiator proves it holds the new control SA's
/// key (its `switched` request).
struct HalfOpen {
    control: ControlSa,
    generation: u32,
    /// Our answer, sent again if the request is.
    answer: Vec<u8>,
    /// Where the request came from, and so where the answer goes.
    reply_to: (Ipv4Addr, u16),
    expires_at: Duration,
}

/// Which exchange a request of ours starts.
#[derive(Debug, Clone, Copy)]
enum Exchange {
    /// A new control SA and its first child SAs.
    Init { spi_i: ControlSpi },
    /// The next child SAs under the control SA.
    Rekey,
}

/// Where a tunnel's exchanges are.
#[derive(Debug, Clone)]
enum Phase {
    /// No exchange under way.
    Idle,
    /// We asked and wait for the answer.
    Requested {
        exchange: Exchange,
        id: u32,
        nonce: [u8; NONCE_LEN],
        /// Our new inbound SPI (reserved).
        spi: u32,
        wire: Vec<u8>,
        attempts: u32,
        /// When it last left, and when it leaves again.
        sent_at: Duration,
        next_send: Duration,
    },
    /// We switched to the new SAs and wait for the peer to confirm it did
    /// too; `old_in` is deleted once it has (and the grace period passed).
    Confirming {
        connect: bool,
        id: u32,
        wire: Vec<u8>,
        attempts: u32,
        next_send: Duration,
        old_in: Option<String>,
    },
    /// We answered a rekey and installed its SAs; we switch when the
    /// initiator says it has, or remove them at `expires_at`.
    Responded {
        generation: u32,
        child: u32,
        expires_at: Duration,
    },
}

impl Phase {
    fn name(&self, connected: bool) -> &'static str {
        match self {
            Phase::Idle if connected => "established",
            Phase::Idle => "down",
            Phase::Requested {
                exchange: Exchange::Init { .. },
                ..
            } => "connecting",
            Phase::Requested { .. } => "rekey-requested",
            Phase::Confirming { connect: true, .. } => "connect-confirming",
            Phase::Confirming { .. } => "rekey-confirming",
            Phase::Responded { .. } => "rekey-responded",
        }
    }
}

/// The state of one tunnel.
struct Tunnel {
    config: TunnelConfig,
    /// UDP-encapsulated tunnels: the address and port the peer's latest
    /// message proven fresh came from, where our messages go (RFC 7296
    /// §2.23); `None` until one came.
    peer_at: Option<(Ipv4Addr, u16)>,
    /// Where the gateway's ESP last said the peer was (see `follow_peers`).
    dataplane_peer: Option<(Ipv4Addr, u16)>,
    secrets: Option<TunnelSecrets>,
    /// This end's side (a tunnel with a secret has IPv4 ends).
    side: Side,
    control: Option<ControlSa>,
    half_open: Vec<HalfOpen>,
    /// The generation of the SAs traffic uses: a local count that names
    /// the SAs (`{tunnel}-out.{generation}`). `None` while a tunnel keyed
    /// by exchange has had none yet.
    current: Option<u32>,
    next_generation: u32,
    phase: Phase,
    /// Replaced SAs and when to delete them; `None`: at their hard expiry
    /// (the peer may still send on them).
    retiring: Vec<(String, Option<Duration>)>,
    /// When to start the next exchange: at start (a tunnel with a secret
    /// connects at once), and after giving up.
    retry_at: Option<Duration>,
    rekeys: u64,
    last_rekey: Option<Duration>,
    /// The latest problem, for `sa show`.
    note: Option<String>,
    /// SAs of this tunnel that reached their soft limit. One that does so
    /// while an exchange is under way (or before it is current) gets its
    /// rekey as soon as the exchange is over.
    soft_seen: HashSet<String>,
}

impl Tunnel {
    fn new(config: TunnelConfig) -> Tunnel {
        let secrets = config
            .secret
            .as_ref()
            .map(|s| TunnelSecrets::derive(s, &config.name));
        let side = match (config.local, config.remote) {
            (IpAddr::V4(local), IpAddr::V4(remote)) => Side::of(local, remote),
            // No secret (the config refuses one with IPv6 ends): no exchange.
            _ => Side::Low,
        };
        let keyed_by_exchange = secrets.is_some();
        Tunnel {
            config,
            secrets,
            side,
            control: None,
            half_open: Vec::new(),
            current: (!keyed_by_exchange).then_some(0),
            next_generation: u32::from(!keyed_by_exchange),
            phase: Phase::Idle,
            peer_at: None,
            dataplane_peer: None,
            retiring: Vec::new(),
            retry_at: keyed_by_exchange.then_some(Duration::ZERO),
            rekeys: 0,
            last_rekey: None,
            note: None,
            soft_seen: HashSet::new(),
        }
    }

    fn sa(&self, direction: SaDirection, generation: u32) -> String {
        self.config.sa_name(direction, generation)
    }

    fn current(&self, direction: SaDirection) -> Option<String> {
        self.current.map(|g| self.sa(direction, g))
    }

    fn take_generation(&mut self) -> u32 {
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        generation
    }

    /// The commands that point the tunnel's policies at its current SAs.
    fn repoints(&self) -> Vec<SaCommand> {
        let Some(generation) = self.current else {
            return Vec::new();
        };
        [
            (PolicyDirection::Out, SaDirection::Outbound),
            (PolicyDirection::In, SaDirection::Inbound),
        ]
        .into_iter()
        .map(|(policy, sa)| SaCommand::Repoint {
            policy: self.config.policy_name(policy),
            sa: self.sa(sa, generation),
        })
        .collect()
    }

    /// Every SA of this tunnel that may exist in the gateways.
    fn all_sas(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let mut pair = |generation: u32| {
            names.push(self.sa(SaDirection::Outbound, generation));
            names.push(self.sa(SaDirection::Inbound, generation));
        };
        if let Some(generation) = self.current {
            pair(generation);
        }
        if let Phase::Responded { generation, .. } = self.phase {
            pair(generation);
        }
        for half in &self.half_open {
            pair(half.generation);
        }
        if let Phase::Confirming {
            old_in: Some(old_in), ..
        } = &self.phase
        {
            names.push(old_in.clone());
        }
        names.extend(self.retiring.iter().map(|(n, _)| n.clone()));
        names
    }
}

/// What one tunnel looks like, for `espgw sa list/show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunnelStatus {
    /// The tunnel's name.
    pub name: String,
    /// Our end's outer address.
    pub local: IpAddr,
    /// The peer's configured outer address.
    pub remote: IpAddr,
    /// The ESP proposal keyword, as the file writes it.
    pub proposal: String,
    /// The generation of the SAs traffic uses, which their names end with
    /// (`.N`; none for 0, the first).
    pub generation: u32,
    /// `established`, `down`, `connecting`, `rekey-requested`,
    /// `connect-confirming`, `rekey-confirming` or `rekey-responded`.
    pub state: String,
    /// The tunnel has a `secret`, so it is rekeyed; without one it keeps
    /// the file's keys until they expire.
    pub can_rekey: bool,
    /// Rekeys completed since the tunnel started.
    pub rekeys: u64,
    /// Seconds since the last completed rekey.
    pub last_rekey_ago: Option<f64>,
    /// The SAs traffic uses; empty while a tunnel keyed by exchange has
    /// none yet.
    pub sa_out: String,
    /// The inbound SA of the current generation (empty as `sa_out`).
    pub sa_in: String,
    /// Replaced SAs kept a while for packets already on their way.
    pub retiring: Vec<String>,
    /// The latest problem (the peer gave up answering, a soft lifetime
    /// with no rekey), if any.
    pub note: Option<String>,
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadReport {
    /// Tunnels the new configuration adds: they start.
    pub added: Vec<String>,
    /// Tunnels it drops: their SAs and policies are removed.
    pub removed: Vec<String>,
    /// Tunnels it changes: they restart.
    pub changed: Vec<String>,
    /// Tunnels it leaves as they were, SAs and rekey state kept.
    pub unchanged: Vec<String>,
    /// Manually keyed SAs and policies added, removed or replaced.
    pub manual_changes: usize,
    /// SAs replaced by a changed one with the same keys, which took over
    /// their sequence counter and replay window.
    pub carried_over: Vec<String>,
}

/// Why a new configuration was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// The new configuration changes sections (named) that only a restart
    /// applies: interfaces, routes, neighbours, `[accel]`, `[limits]` or
    /// `[gateway]`.
    #[error(
        "the new configuration changes {0}, which needs a restart of espgw; the running configuration stays"
    )]
    NeedsRestart(String),
    /// RFC 4301 §5.2; [`Config::load`] refuses such files, this guards
    /// configurations built some other way.
    #[error("inbound SA `{0}` has no selectors, so nothing says what may arrive through it; the running configuration stays")]
    UnselectedSa(String),
}

/// The control plane of one gateway (all its workers).
pub struct ControlPlane {
    config: Config,
    tunnels: Vec<Tunnel>,
    /// Inbound SPIs in use or reserved, by SA name.
    inbound_spis: HashMap<String, u32>,
    /// The SPI of every SA this plane installed (or found in the file), by
    /// name, for its log lines; gone once the SA is removed.
    sa_spis: HashMap<String, u32>,
    /// SA lifetime events already logged, by SA name and whether hard:
    /// every worker's copy of an SA reports its own.
    expiries_logged: HashSet<(String, bool)>,
    reserved: HashSet<u32>,
    commands: Issued,
    commands_issued: u64,
    datagrams: Vec<Datagram>,
    counters: ControlCounters,
    rng: StdRng,
}

impl ControlPlane {
    /// The plane for a gateway that has `config` installed. Tunnels with a
    /// secret connect (run an INIT exchange) at the first
    /// [`handle_timeout`](Self::handle_timeout).
    pub fn new(config: Config) -> ControlPlane {
        let mut plane = ControlPlane {
            tunnels: config.tunnels.iter().cloned().map(Tunnel::new).collect(),
            inbound_spis: HashMap::new(),
            sa_spis: HashMap::new(),
            expiries_logged: HashSet::new(),
            reserved: HashSet::new(),
            commands: Issued::default(),
            commands_issued: 0,
            datagrams: Vec::new(),
            counters: ControlCounters::default(),
            rng: rand::make_rng(),
            config,
        };
        for sa in plane.config.sas.iter().filter(|s| s.keys == KeySource::File) {
            if sa.params.direction == SaDirection::Inbound {
                plane.inbound_spis.insert(sa.params.name.clone(), sa.params.spi);
            }
            plane.sa_spis.insert(sa.params.name.clone(), sa.params.spi);
        }
        for t in plane.tunnels.iter().filter(|t| t.secrets.is_none()) {
            plane.log_static_tunnel_up(t);
        }
        plane
    }

    /// Makes nonces and SPIs a function of `seed` (tests only).
    pub fn set_seed(&mut self, seed: u64) {
        use rand::SeedableRng;
        self.rng = StdRng::seed_from_u64(seed);
    }

    /// The configuration in force (the last one a reload took).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The plane's counters so far.
    pub fn counters(&self) -> ControlCounters {
        self.counters
    }

    /// Commands issued so far (the number the next one will follow).
    pub fn commands_issued(&self) -> u64 {
        self.commands_issued
    }

    /// Takes the commands issued since the last call, in order.
    pub fn take_commands(&mut self, into: &mut Vec<SaCommand>) {
        self.commands.take(into);
    }

    /// [`take_commands`](Self::take_commands), each SA removal with why
    /// (for its `sa_removed` line).
    pub fn take_noted_commands(&mut self, into: &mut Vec<(SaCommand, Option<RemovalNote>)>) {
        self.commands.take_noted(into);
    }

    /// Takes the datagrams to send, in order.
    pub fn take_datagrams(&mut self, into: &mut Vec<Datagram>) {
        into.append(&mut self.datagrams);
    }

    /// Whether every tunnel keyed by exchange has SAs to send on.
    pub fn all_connected(&self) -> bool {
        self.tunnels.iter().all(|t| t.current.is_some())
    }

    /// Every tunnel's state at time `now`, in the configuration's order.
    pub fn tunnels(&self, now: Duration) -> Vec<TunnelStatus> {
        self.tunnels
            .iter()
            .map(|t| TunnelStatus {
                name: t.config.name.clone(),
                local: t.config.local,
                remote: t.config.remote,
                proposal: t.config.algorithm.to_string(),
                generation: t.current.unwrap_or(0),
                state: t.phase.name(t.current.is_some()).to_owned(),
                can_rekey: t.secrets.is_some(),
                rekeys: t.rekeys,
                last_rekey_ago: t.last_rekey.map(|at| now.saturating_sub(at).as_secs_f64()),
                sa_out: t.current(SaDirection::Outbound).unwrap_or_default(),
                sa_in: t.current(SaDirection::Inbound).unwrap_or_default(),
                retiring: t.retiring.iter().map(|(n, _)| n.clone()).collect(),
                note: t.note.clone(),
            })
            .collect()
    }

    fn command(&mut self, command: SaCommand) {
        match &command {
            SaCommand::InstallSa(sa) => {
                if sa.params.direction == SaDirection::Inbound {
                    self.reserved.remove(&sa.params.spi);
                    self.inbound_spis.insert(sa.params.name.clone(), sa.params.spi);
                }
                self.sa_spis.insert(sa.params.name.clone(), sa.params.spi);
                self.forget_expiries(&sa.params.name);
            }
            SaCommand::ReplaceSa { old, new } => {
                self.sa_spis.remove(old);
                self.forget_expiries(old);
                self.sa_spis.insert(new.params.name.clone(), new.params.spi);
                self.forget_expiries(&new.params.name);
            }
            SaCommand::RemoveSa(name) => self.forget_sa(name),
            _ => {}
        }
        self.commands.push(command);
        self.commands_issued += 1;
    }

    /// Issues the removal of SA `name` of tunnel `tunnel`, for `why`.
    fn remove_sa(&mut self, name: String, why: Removal, tunnel: Option<&str>) {
        self.forget_sa(&name);
        self.commands.remove_sa(name, why, tunnel);
        self.commands_issued += 1;
    }

    /// What the plane knows of SA `name` goes with it.
    fn forget_sa(&mut self, name: &str) {
        self.inbound_spis.remove(name);
        self.sa_spis.remove(name);
        self.forget_expiries(name);
        self.counters.sas_deleted += 1;
    }

    fn forget_expiries(&mut self, name: &str) {
        for hard in [false, true] {
            self.expiries_logged.remove(&(name.to_owned(), hard));
        }
    }

    /// The SPI of SA `name`, as its log lines write it.
    fn spi_of(&self, name: &str) -> Option<String> {
        self.sa_spis.get(name).map(|spi| format!("{spi:#010x}"))
    }

    /// The one line of a tunnel with static keys coming up (at start, or
    /// added by a reload): its SAs are those of the file.
    fn log_static_tunnel_up(&self, t: &Tunnel) {
        tracing::info!(
            event = "tunnel_up",
            tunnel = %t.config.name,
            keys = "static",
            spi_out = self.spi_of(&t.sa(SaDirection::Outbound, 0)),
            spi_in = self.spi_of(&t.sa(SaDirection::Inbound, 0)),
            "tunnel up with the keys of the file; no `secret`, so no rekey: it stops at their hard lifetime"
        );
    }

    /// The one line of a tunnel on new SAs: up (`rekey` false) or rekeyed.
    fn log_tunnel_switched(&self, index: usize, role: &'static str, rekey: bool) {
        let t = &self.tunnels[index];
        let generation = t.current.unwrap_or(0);
        let spi_out = self.spi_of(&t.sa(SaDirection::Outbound, generation));
        let spi_in = self.spi_of(&t.sa(SaDirection::Inbound, generation));
        if rekey {
            tracing::info!(event = "rekey", tunnel = %t.config.name, generation, role, rekeys = t.rekeys, spi_out, spi_in, "rekeyed: both ends send on the new SAs");
        } else {
            tracing::info!(event = "tunnel_up", tunnel = %t.config.name, generation, role, peer = %t.config.remote, spi_out, spi_in, "tunnel up: both ends send on the new SAs");
        }
    }

    /// The one line of an SA lifetime event, once per SA and limit
    /// however many workers' copies report it: at `warn` when it is
    /// trouble (`trouble`: what follows from it, its `reason`), else at
    /// `info` saying what happens `then`.
    fn log_expiry(
        &mut self,
        name: &str,
        tunnel: Option<&str>,
        hard: bool,
        trouble: Option<&str>,
        then: &str,
    ) {
        if !self.expiries_logged.insert((name.to_owned(), hard)) {
            return;
        }
        let limit = if hard { "hard" } else { "soft" };
        let generation = sa_generation(name);
        let spi = self.spi_of(name);
        match trouble {
            Some(reason) => tracing::warn!(
                event = "sa_expired",
                sa = name,
                spi,
                tunnel,
                generation,
                limit,
                reason,
                "{limit} lifetime reached: {reason}"
            ),
            None => tracing::info!(
                event = "sa_expired",
                sa = name,
                spi,
                tunnel,
                generation,
                limit,
                "{limit} lifetime reached: {then}"
            ),
        }
    }

    /// Removes the SA pair of `generation` of tunnel `index`.
    fn remove_pair(&mut self, index: usize, generation: u32) {
        let tunnel = &mut self.tunnels[index];
        let names = [
            tunnel.sa(SaDirection::Outbound, generation),
            tunnel.sa(SaDirection::Inbound, generation),
        ];
        for name in &names {
            tunnel.soft_seen.remove(name);
        }
        let tunnel = tunnel.config.name.clone();
        for name in names {
            self.remove_sa(name, Removal::Unconfirmed, Some(&tunnel));
        }
    }

    /// Takes in what the gateway's authenticated ESP tells the exchanges
    /// (see [`follow_peers`](Self::follow_peers)), and that the initiator
    /// of a rekey we answered already sends on its SAs while its
    /// `switched` is still on its way (or lost): ESP under keys from both
    /// ends' fresh nonces proves it switched as well as that message would,
    /// so the answer does not expire under traffic that uses it.
    ///
    /// The driver answers from its gateway (worker 0's, whose copies of
    /// the SAs share their counts): `used`, whether the SA of a name has
    /// carried packets; `peer`, as for [`follow_peers`](Self::follow_peers).
    pub fn observe(
        &mut self,
        now: Duration,
        used: impl Fn(&str) -> bool,
        peer: impl Fn(Ipv4Addr, Ipv4Addr, UdpEncap) -> Option<(Ipv4Addr, u16)>,
    ) {
        self.follow_peers(peer);
        for index in 0..self.tunnels.len() {
            let tunnel = &self.tunnels[index];
            match &tunnel.phase {
                Phase::Responded { generation, .. }
                    if used(&tunnel.sa(SaDirection::Inbound, *generation)) =>
                {
                    tracing::debug!(tunnel = %tunnel.config.name, "the peer sends on the SAs of the rekey we answered: it switched");
                    self.switch_responder(now, index);
                }
                _ => {}
            }
        }
    }

    /// Takes in where the gateway's authenticated ESP says each
    /// UDP-encapsulated peer moved to, so that an exchange this end starts
    /// reaches a peer whose NAT mapping changed before it spoke IKE again.
    ///
    /// `peer` is the driver's answer from its gateway: where the
    /// UDP-encapsulated peer configured as `remote` (with `encap`) of our
    /// `local` is now, address and port.
    pub fn follow_peers(&mut self, peer: impl Fn(Ipv4Addr, Ipv4Addr, UdpEncap) -> Option<(Ipv4Addr, u16)>) {
        for tunnel in &mut self.tunnels {
            let Some(encap) = tunnel.config.encap else {
                continue;
            };
            // UDP encapsulation has IPv4 ends (the config refuses others).
            let (IpAddr::V4(local), IpAddr::V4(remote)) = (tunnel.config.local, tunnel.config.remote) else {
                continue;
            };
            let Some(at) = peer(local, remote, encap) else {
                continue;
            };
            if tunnel.dataplane_peer != Some(at) {
                tunnel.dataplane_peer = Some(at);
                tunnel.peer_at = Some(at);
            }
        }
    }

    /// Where tunnel `index`'s messages go: its configured peer on IKE's
    /// port, or for a UDP-encapsulated tunnel where the peer last proved
    /// to be.
    fn destination(&self, index: usize) -> Option<(Ipv4Addr, u16)> {
        let tunnel = &self.tunnels[index];
        // Tunnels that exchange messages have IPv4 ends: the config gives
        // a `secret` to no other.
        let IpAddr::V4(remote) = tunnel.config.remote else {
            return None;
        };
        Some(match tunnel.config.encap {
            None => (remote, CONTROL_PORT),
            Some(encap) => tunnel.peer_at.unwrap_or((remote, encap.remote_port)),
        })
    }

    /// Sends to tunnel `index`'s peer (see [`Self::destination`]).
    fn send(&mut self, index: usize, payload: Vec<u8>) {
        if let Some(to) = self.destination(index) {
            self.send_to(index, to, payload);
        }
    }

    /// Sends to `to` for tunnel `index`: on IKE's port, or for a
    /// UDP-encapsulated tunnel on its ports behind the non-ESP marker
    /// (RFC 3948 §2.2).
    fn send_to(&mut self, index: usize, (to, port): (Ipv4Addr, u16), payload: Vec<u8>) {
        let tunnel = &self.tunnels[index];
        let (ports, payload) = match tunnel.config.encap {
            None => ((CONTROL_PORT, CONTROL_PORT), payload),
            Some(encap) => {
                let mut marked = Vec::with_capacity(NON_ESP_MARKER.len() + payload.len());
                marked.extend_from_slice(&NON_ESP_MARKER);
                marked.extend_from_slice(&payload);
                ((encap.local_port, port), marked)
            }
        };
        self.counters.sent += 1;
        self.datagrams.push(Datagram {
            to,
            ports,
            payload,
            after_commands: self.commands_issued,
        });
    }

    /// An SPI for a new inbound SA: random, unreserved, not in use.
    fn fresh_spi(&mut self) -> u32 {
        loop {
            let spi = self.rng.next_u32();
            let used =
                spi < 256 || self.reserved.contains(&spi) || self.inbound_spis.values().any(|s| *s == spi);
            if !used {
                self.reserved.insert(spi);
                return spi;
            }
        }
    }

    /// A control SA SPI: random and never zero (zero marks an INIT request's
    /// missing responder SPI).
    fn control_spi(&mut self) -> ControlSpi {
        loop {
            let mut spi = [0; SPI_LEN];
            self.rng.fill_bytes(&mut spi);
            if spi != [0; SPI_LEN] {
                return spi;
            }
        }
    }

    fn nonce(&mut self) -> [u8; NONCE_LEN] {
        let mut nonce = [0; NONCE_LEN];
        self.rng.fill_bytes(&mut nonce);
        nonce
    }

    /// How long an exchange may take at most: every retransmission of the
    /// request and one more round. An answer not confirmed by then is
    /// given up.
    fn exchange_budget(&self) -> Duration {
        let settings = self.config.rekey;
        settings.retransmit * (1u32 << (settings.retries.min(16) + 2))
    }

    /// An SA lifetime event from the gateway about the SA called `name`.
    /// Every worker's copy of an SA reports its own: the first is acted on
    /// and logged, the others are counted.
    pub fn handle_sa_event(&mut self, now: Duration, name: &str, event: SaEvent) {
        let hard = matches!(event, SaEvent::HardExpired(_));
        let Some(index) = self.tunnel_of_sa(name) else {
            if hard {
                self.counters.hard_expired += 1;
            } else {
                self.counters.soft_expired += 1;
            }
            // An SA of the file's [[sa]] tables; not one removed already
            // (a late copy's report), nor one of the `xfrm` keying source
            // (its kernel expires it, and the mirror logs that).
            if self.sa_spis.contains_key(name) {
                if hard {
                    self.log_expiry(
                        name,
                        None,
                        true,
                        Some("an SA with static keys is not rekeyed: its packets drop as sa_expired"),
                        "",
                    );
                } else {
                    self.log_expiry(
                        name,
                        None,
                        false,
                        Some("an SA with static keys is not rekeyed: it stops at its hard lifetime"),
                        "",
                    );
                }
            }
            return;
        };
        let tunnel_name = self.tunnels[index].config.name.clone();
        let tunnel = &mut self.tunnels[index];
        match event {
            SaEvent::SoftExpired(_) => {
                self.counters.soft_expired += 1;
                // Every worker's copy reports it; act once.
                if !tunnel.soft_seen.insert(name.to_owned()) {
                    return;
                }
                let current = tunnel.current(SaDirection::Outbound).as_deref() == Some(name)
                    || tunnel.current(SaDirection::Inbound).as_deref() == Some(name);
                if !current {
                    // Being replaced, or not yet switched to: see rekey_if_pending.
                    self.log_expiry(
                        name,
                        Some(&tunnel_name),
                        false,
                        None,
                        "not in use, or the next rekey replaces it",
                    );
                } else if tunnel.secrets.is_none() {
                    if tunnel.note.is_none() {
                        tunnel.note = Some("soft lifetime reached; no `secret`, so no rekey".into());
                    }
                    self.log_expiry(
                        name,
                        Some(&tunnel_name),
                        false,
                        Some("the tunnel has no `secret` to rekey with; it stops at the hard lifetime"),
                        "",
                    );
                } else if matches!(tunnel.phase, Phase::Idle) && tunnel.retry_at.is_none() {
                    self.log_expiry(name, Some(&tunnel_name), false, None, "rekeying");
                    self.start_rekey(now, index);
                } else {
                    self.log_expiry(
                        name,
                        Some(&tunnel_name),
                        false,
                        None,
                        "rekeying once the exchange under way is over",
                    );
                }
            }
            SaEvent::HardExpired(_) => {
                self.counters.hard_expired += 1;
                if let Some(at) = tunnel
                    .retiring
                    .iter()
                    .position(|(n, deadline)| n == name && deadline.is_none())
                {
                    let (old, _) = tunnel.retiring.remove(at);
                    tunnel.soft_seen.remove(&old);
                    self.log_expiry(
                        name,
                        Some(&tunnel_name),
                        true,
                        None,
                        "a replaced SA kept for the peer is removed",
                    );
                    self.remove_sa(old, Removal::ExpiredHard, Some(&tunnel_name));
                } else if tunnel.retiring.iter().any(|(n, _)| n == name) {
                    self.log_expiry(
                        name,
                        Some(&tunnel_name),
                        true,
                        None,
                        "a replaced SA, removed at the end of its grace period",
                    );
                } else {
                    if !tunnel.note.as_deref().is_some_and(|n| n.contains(name)) {
                        let expired =
                            format!("{name} reached its hard lifetime; its packets drop as sa_expired");
                        tunnel.note = Some(match tunnel.note.take() {
                            Some(earlier) => format!("{earlier}; then {expired}"),
                            None => expired,
                        });
                    }
                    self.log_expiry(
                        name,
                        Some(&tunnel_name),
                        true,
                        Some("reached without a rekey: its packets drop as sa_expired"),
                        "",
                    );
                }
            }
        }
    }

    /// The tunnel that owns the SA called `name`. Tunnel SAs are named
    /// `{tunnel}-{direction}[.{generation}]` ([`TunnelConfig::sa_name`]):
    /// the tunnel that name points at is asked first, so that a rekey
    /// storm over thousands of tunnels does not list every tunnel's SAs
    /// for every event; other names (static SAs) ask every tunnel.
    fn tunnel_of_sa(&self, name: &str) -> Option<usize> {
        let owns = |t: &Tunnel| t.all_sas().iter().any(|n| n == name);
        let base = match name.rsplit_once('.') {
            Some((base, generation)) if generation.bytes().all(|b| b.is_ascii_digit()) => base,
            _ => name,
        };
        let named = base.strip_suffix("-out").or_else(|| base.strip_suffix("-in"));
        if let Some(at) = named.and_then(|n| self.tunnels.iter().position(|t| t.config.name == n)) {
            if owns(&self.tunnels[at]) {
                return Some(at);
            }
        }
        self.tunnels.iter().position(owns)
    }

    /// Starts an INIT exchange: a new control SA and the first child SAs.
    fn start_init(&mut self, now: Duration, index: usize) {
        let spi = self.fresh_spi();
        let nonce = self.nonce();
        let spi_i = self.control_spi();
        let tunnel = &self.tunnels[index];
        let Some(secrets) = &tunnel.secrets else { return };
        let wire = Message {
            kind: Kind::Init,
            response: false,
            from_initiator: true,
            spi_i,
            spi_r: [0; SPI_LEN],
            message_id: 0,
            tunnel: tunnel.config.name.clone(),
            child: 0,
            spi,
            nonce,
        }
        .seal(&secrets.init_key(tunnel.side)[..]);
        tracing::debug!(tunnel = %tunnel.config.name, peer = %tunnel.config.remote, "connecting: INIT exchange started");
        self.counters.connects_started += 1;
        self.send_request(now, index, (Exchange::Init { spi_i }, 0), (nonce, spi), wire);
    }

    /// Starts a rekey under the control SA: the next child SAs.
    fn start_rekey(&mut self, now: Duration, index: usize) {
        if self.tunnels[index].control.is_none() {
            // Nothing to rekey under: connect instead.
            return self.start_init(now, index);
        }
        let spi = self.fresh_spi();
        let nonce = self.nonce();
        let tunnel = &mut self.tunnels[index];
        let name = tunnel.config.name.clone();
        let Some(control) = tunnel.control.as_mut() else {
            return;
        };
        let id = control.take_message_id();
        let child = control.child.wrapping_add(1);
        let wire = control.seal(Message {
            spi,
            nonce,
            ..Message::new(Kind::Rekey, false, id, name, child)
        });
        tracing::debug!(tunnel = %tunnel.config.name, child, "rekey started");
        self.counters.rekeys_started += 1;
        self.send_request(now, index, (Exchange::Rekey, id), (nonce, spi), wire);
    }

    /// Sends `wire`, our request of `exchange` (message `id`, with our
    /// `nonce` and new inbound `spi`), and waits for the answer, sending it
    /// again until one comes.
    fn send_request(
        &mut self,
        now: Duration,
        index: usize,
        (exchange, id): (Exchange, u32),
        (nonce, spi): ([u8; NONCE_LEN], u32),
        wire: Vec<u8>,
    ) {
        let settings = self.config.rekey;
        let tunnel = &mut self.tunnels[index];
        tunnel.phase = Phase::Requested {
            exchange,
            id,
            nonce,
            spi,
            wire: wire.clone(),
            attempts: 0,
            sent_at: now,
            next_send: now + settings.retransmit,
        };
        tunnel.retry_at = None;
        self.send(index, wire);
    }

    /// A control datagram the gateway delivered: the whole IPv4 packet.
    /// Whether `packet` (a control datagram, IPv4) is for one of this
    /// plane's keyed tunnels: to its local address on its exchange port,
    /// from its peer unless encapsulated (a NAT may move the peer). The
    /// IKE relay takes the rest of what arrives on the daemon's ports.
    pub fn claims(&self, packet: &[u8]) -> bool {
        let Some(((src, _), (dst, dst_port), _)) = udp_endpoints(packet) else {
            return false;
        };
        self.tunnels.iter().any(|t| {
            t.secrets.is_some()
                && IpAddr::V4(dst) == t.config.local
                && dst_port == t.config.encap.map_or(CONTROL_PORT, |e| e.local_port)
                && (t.config.encap.is_some() || IpAddr::V4(src) == t.config.remote)
        })
    }

    /// A datagram the gateway handed to the control plane at time `now`:
    /// `packet` is the whole IPv4 packet. Anything that is not a fresh,
    /// authentic message of a tunnel is counted and ignored.
    pub fn handle_datagram(&mut self, now: Duration, packet: &[u8]) {
        self.counters.received += 1;
        let Some(((src, src_port), (dst, dst_port), payload)) = udp_endpoints(packet) else {
            self.counters.malformed += 1;
            return;
        };
        // RFC 3948 §2.2: IKE on an encapsulation port follows the marker.
        let encapsulated = dst_port != CONTROL_PORT;
        let payload = match payload.strip_prefix(&NON_ESP_MARKER[..]) {
            Some(ike) if encapsulated => ike,
            _ if encapsulated => {
                self.counters.malformed += 1;
                return;
            }
            _ => payload,
        };
        let peeked = match peek(payload) {
            Ok(peeked) => peeked,
            Err(e) => return self.count_refusal(e),
        };
        let Some(index) = self
            .tunnels
            .iter()
            .position(|t| t.config.name == peeked.tunnel && t.secrets.is_some())
        else {
            self.counters.unknown_tunnel += 1;
            return;
        };
        let tunnel = &self.tunnels[index];
        // A tunnel takes its messages on its own ports only. Behind a NAT
        // the peer's address may change: its messages are authenticated,
        // so any source will do, and the latest fresh one is where we answer.
        let expected_port = tunnel.config.encap.map_or(CONTROL_PORT, |e| e.local_port);
        let from_anywhere = tunnel.config.encap.is_some();
        if dst_port != expected_port
            || IpAddr::V4(dst) != tunnel.config.local
            || (!from_anywhere && IpAddr::V4(src) != tunnel.config.remote)
        {
            self.counters.wrong_peer += 1;
            return;
        }
        let from = match tunnel.config.encap {
            Some(_) => (src, src_port),
            None => (src, CONTROL_PORT),
        };
        match (peeked.kind, peeked.response) {
            (Kind::Init, false) => self.handle_init_request(now, index, payload, from),
            (Kind::Init, true) => self.handle_init_response(now, index, payload, from),
            _ => self.handle_in_control_sa(now, index, payload, &peeked, from),
        }
    }

    fn count_refusal(&mut self, e: MessageError) {
        match e {
            MessageError::Truncated(_) | MessageError::BadLength => self.counters.truncated += 1,
            MessageError::Foreign | MessageError::Malformed => self.counters.malformed += 1,
            MessageError::Forged => self.counters.forged += 1,
        }
    }

    /// An INIT request: the peer wants a new control SA (it started, or
    /// restarted). Authenticated with the peer side's key from the secret,
    /// but a replay of an old one would verify too: so nothing moves to
    /// what it creates until the initiator proves, with a key that depends
    /// on our fresh nonce, that it is live.
    fn handle_init_request(&mut self, now: Duration, index: usize, payload: &[u8], from: (Ipv4Addr, u16)) {
        let tunnel = &self.tunnels[index];
        let Some(secrets) = &tunnel.secrets else { return };
        let message = match Message::open(payload, &secrets.init_key(tunnel.side.other())[..]) {
            Ok(m) => m,
            Err(e) => return self.count_refusal(e),
        };
        if !message.from_initiator
            || message.spi_r != [0; SPI_LEN]
            || message.message_id != 0
            || message.child != 0
            || !usable_spi(message.spi)
        {
            self.counters.malformed += 1;
            return;
        }
        let tunnel = &mut self.tunnels[index];
        if let Phase::Requested {
            exchange: Exchange::Init { spi_i },
            ..
        } = &tunnel.phase
        {
            if *spi_i == message.spi_i {
                // Our own request (the side keys make this unreachable
                // unless the secret is shared with a third party).
                self.counters.reflected += 1;
                return;
            }
        }
        if let Some(half) = tunnel.half_open.iter().find(|h| h.control.spi_i == message.spi_i) {
            // The initiator did not hear our answer: repeat it.
            let (to, answer) = (half.reply_to, half.answer.clone());
            self.counters.duplicates += 1;
            return self.send_to(index, to, answer);
        }
        if tunnel.control.as_ref().is_some_and(|c| c.spi_i == message.spi_i) {
            self.counters.replayed += 1;
            return;
        }
        let retransmit = self.config.rekey.retransmit;
        let destination = self.destination(index);
        let tunnel = &mut self.tunnels[index];
        if let Phase::Requested {
            exchange: Exchange::Init { .. },
            spi,
            wire,
            sent_at,
            ..
        } = &mut tunnel.phase
        {
            // Both connect at once: the higher address's exchange goes on.
            self.counters.collisions += 1;
            if tunnel.side == Side::High {
                // The peer is up now. If our request went elsewhere (it is
                // behind a NAT our requests could not cross until it
                // spoke) or a while ago (it was not up yet), ask again,
                // where it spoke from; otherwise ours is on its way.
                if destination != Some(from) || now >= *sent_at + retransmit / 2 {
                    *sent_at = now;
                    let wire = wire.clone();
                    self.send_to(index, from, wire);
                }
                return;
            }
            let spi = *spi;
            self.reserved.remove(&spi);
            self.tunnels[index].phase = Phase::Idle;
        }
        if self.tunnels[index].half_open.len() >= MAX_HALF_OPEN {
            let oldest = self.tunnels[index].half_open.remove(0);
            self.counters.half_open_evicted += 1;
            self.remove_pair(index, oldest.generation);
        }
        let spi = self.fresh_spi();
        let nonce = self.nonce();
        let spi_r = self.control_spi();
        let budget = self.exchange_budget();
        let tunnel = &mut self.tunnels[index];
        let Some(secrets) = &tunnel.secrets else { return };
        let keys = secrets.control((&message.nonce, &nonce), (&message.spi_i, &spi_r));
        let child_keys = keys.child(tunnel.config.algorithm, &message.nonce, &nonce);
        let generation = tunnel.take_generation();
        let control = ControlSa {
            spi_i: message.spi_i,
            spi_r,
            initiator: false,
            keys,
            next_message_id: 0,
            peer_request: Some((0, None)),
            child: 0,
        };
        let answer = control.seal(Message {
            spi,
            nonce,
            ..Message::new(Kind::Init, true, 0, tunnel.config.name.clone(), 0)
        });
        tunnel.half_open.push(HalfOpen {
            control,
            generation,
            answer: answer.clone(),
            reply_to: from,
            expires_at: now + budget,
        });
        tracing::debug!(tunnel = %tunnel.config.name, generation, "INIT answered; new SAs installed, waiting for the peer to confirm");
        let (inbound, outbound) = self.sa_pair(index, generation, (spi, message.spi), child_keys, false);
        self.command(SaCommand::InstallSa(Box::new(inbound)));
        self.command(SaCommand::InstallSa(Box::new(outbound)));
        self.send_to(index, from, answer);
    }

    /// The answer to our INIT request: authenticated with the new control
    /// SA's key, which depends on our fresh nonce, so it cannot be a
    /// replay.
    fn handle_init_response(&mut self, now: Duration, index: usize, payload: &[u8], from: (Ipv4Addr, u16)) {
        let tunnel = &self.tunnels[index];
        let Phase::Requested {
            exchange: Exchange::Init { spi_i },
            nonce: ni,
            spi: our_spi,
            ..
        } = tunnel.phase
        else {
            self.counters.stale_responses += 1;
            return;
        };
        let Some(secrets) = &tunnel.secrets else { return };
        let mut derived = None;
        let opened = Message::open_keyed(payload, |m| {
            let keys = secrets.control((&ni, &m.nonce), (&spi_i, &m.spi_r));
            let key = keys.sk_ar.clone();
            derived = Some(keys);
            key
        });
        let message = match opened {
            // A response to another request of ours (or none) cannot verify.
            Ok(m) if m.spi_i == spi_i => m,
            Ok(_) => {
                self.counters.stale_responses += 1;
                return;
            }
            Err(MessageError::Forged) if payload.get(..SPI_LEN) != Some(&spi_i[..]) => {
                self.counters.stale_responses += 1;
                return;
            }
            Err(e) => return self.count_refusal(e),
        };
        let Some(keys) = derived else { return };
        if message.from_initiator
            || message.message_id != 0
            || message.child != 0
            || message.spi_r == [0; SPI_LEN]
            || !usable_spi(message.spi)
        {
            self.counters.malformed += 1;
            return;
        }
        let child_keys = keys.child(tunnel.config.algorithm, &ni, &message.nonce);
        let mut control = ControlSa {
            spi_i,
            spi_r: message.spi_r,
            initiator: true,
            keys,
            next_message_id: 1,
            peer_request: None,
            child: 0,
        };
        let tunnel = &mut self.tunnels[index];
        let generation = tunnel.take_generation();
        let old = tunnel.current;
        // Whatever ran under an earlier control SA ends with it.
        self.end_exchanges(now, index);
        let (inbound, outbound) = self.sa_pair(index, generation, (our_spi, message.spi), child_keys, true);
        let tunnel = &mut self.tunnels[index];
        let id = control.take_message_id();
        let wire = control.seal(Message::new(
            Kind::Switched,
            false,
            id,
            tunnel.config.name.clone(),
            0,
        ));
        if tunnel.config.encap.is_some() {
            tunnel.peer_at = Some(from);
        }
        tunnel.control = Some(control);
        tunnel.current = Some(generation);
        tracing::debug!(tunnel = %tunnel.config.name, generation, "INIT answered by the peer; sending on the new SAs");
        self.switch_to_new_sas(now, index, true, (id, wire), old, (inbound, outbound));
    }

    /// Our side of a switch to the current generation's SAs, `inbound`
    /// and `outbound` (an INIT's with `connect`, else a rekey's): installs
    /// them and repoints the policies, retires the `old` generation's
    /// outbound SA after the grace period, and sends `wire` (message
    /// `id`), again until the peer confirms it switched too.
    fn switch_to_new_sas(
        &mut self,
        now: Duration,
        index: usize,
        connect: bool,
        (id, wire): (u32, Vec<u8>),
        old: Option<u32>,
        (inbound, outbound): (SaSetup, SaSetup),
    ) {
        let settings = self.config.rekey;
        let tunnel = &mut self.tunnels[index];
        tunnel.phase = Phase::Confirming {
            connect,
            id,
            wire: wire.clone(),
            attempts: 0,
            next_send: now + settings.retransmit,
            old_in: old.map(|g| tunnel.sa(SaDirection::Inbound, g)),
        };
        if let Some(old) = old {
            // Nothing more leaves on the old outbound SA once repointed.
            tunnel
                .retiring
                .push((tunnel.sa(SaDirection::Outbound, old), Some(now + settings.grace)));
        }
        let repoints = tunnel.repoints();
        self.command(SaCommand::InstallSa(Box::new(inbound)));
        self.command(SaCommand::InstallSa(Box::new(outbound)));
        for repoint in repoints {
            self.command(repoint);
        }
        self.send(index, wire);
    }

    /// Ends whatever exchange ran under the control SA about to be
    /// replaced, and every INIT answered but not confirmed: their SAs go.
    fn end_exchanges(&mut self, now: Duration, index: usize) {
        let tunnel = &mut self.tunnels[index];
        let half_open: Vec<u32> = tunnel.half_open.drain(..).map(|h| h.generation).collect();
        for generation in half_open {
            self.remove_pair(index, generation);
        }
        let tunnel = &mut self.tunnels[index];
        match std::mem::replace(&mut tunnel.phase, Phase::Idle) {
            Phase::Idle => {}
            Phase::Requested { spi, .. } => {
                self.reserved.remove(&spi);
            }
            Phase::Confirming { old_in, .. } => {
                // The peer may still send on it until the grace period ends.
                if let Some(old_in) = old_in {
                    let grace = self.config.rekey.grace;
                    tunnel.retiring.push((old_in, Some(now + grace)));
                }
            }
            Phase::Responded { generation, .. } => self.remove_pair(index, generation),
        }
    }

    /// A message under a control SA: a rekey or switched request or
    /// response, or the initiator's confirmation of an INIT we answered.
    fn handle_in_control_sa(
        &mut self,
        now: Duration,
        index: usize,
        payload: &[u8],
        peeked: &crate::message::Peek<'_>,
        from: (Ipv4Addr, u16),
    ) {
        let tunnel = &self.tunnels[index];
        if let Some(at) = tunnel
            .half_open
            .iter()
            .position(|h| h.control.is(&peeked.spi_i, &peeked.spi_r))
        {
            return self.handle_confirm_init(now, index, at, payload, from);
        }
        let Some(control) = tunnel
            .control
            .as_ref()
            .filter(|c| c.is(&peeked.spi_i, &peeked.spi_r))
        else {
            self.counters.unknown_control_sa += 1;
            return;
        };
        if peeked.from_initiator == control.initiator {
            // The flag names the sender's role: this is one of ours.
            self.counters.reflected += 1;
            return;
        }
        let message = match control.open(payload) {
            Ok(m) => m,
            Err(e) => return self.count_refusal(e),
        };
        // Only a message that is not a replay may say where the peer is:
        // a request newer than the last, or the response to our latest.
        let fresh = match message.response {
            false => control
                .peer_request
                .as_ref()
                .is_none_or(|(last, _)| message.message_id > *last),
            true => message.message_id.wrapping_add(1) == control.next_message_id,
        };
        let tunnel = &mut self.tunnels[index];
        if tunnel.config.encap.is_some() && fresh {
            tunnel.peer_at = Some(from);
        }
        if message.response {
            self.handle_response(now, index, &message);
        } else {
            self.handle_request(now, index, &message);
        }
    }

    /// The initiator of an INIT we answered confirms it switched: it holds
    /// the new control SA's key, so the request was live. Traffic moves to
    /// the new SAs, and the new control SA replaces the old.
    fn handle_confirm_init(
        &mut self,
        now: Duration,
        index: usize,
        at: usize,
        payload: &[u8],
        from: (Ipv4Addr, u16),
    ) {
        let half = &self.tunnels[index].half_open[at];
        let message = match half.control.open(payload) {
            Ok(m) => m,
            Err(e) => return self.count_refusal(e),
        };
        if message.kind != Kind::Switched || message.response || message.message_id != 1 || message.child != 0
        {
            self.counters.out_of_step += 1;
            return;
        }
        let tunnel = &mut self.tunnels[index];
        let mut half = tunnel.half_open.remove(at);
        let old = tunnel.current;
        self.end_exchanges(now, index);
        let tunnel = &mut self.tunnels[index];
        let answer = half.control.seal(Message::new(
            Kind::Switched,
            true,
            1,
            tunnel.config.name.clone(),
            0,
        ));
        half.control.peer_request = Some((1, Some(answer.clone())));
        if tunnel.config.encap.is_some() {
            tunnel.peer_at = Some(from);
        }
        tunnel.control = Some(half.control);
        tunnel.current = Some(half.generation);
        tunnel.retry_at = None;
        self.responder_switched(now, index, old, false);
        self.send(index, answer);
    }

    fn handle_request(&mut self, now: Duration, index: usize, message: &Message) {
        let Some(control) = self.tunnels[index].control.as_ref() else {
            return;
        };
        match &control.peer_request {
            Some((last, _)) if message.message_id < *last => {
                self.counters.replayed += 1;
                return;
            }
            Some((last, answer)) if message.message_id == *last => {
                // The peer did not hear our answer: repeat it, do nothing again.
                self.counters.duplicates += 1;
                if let Some(answer) = answer.clone() {
                    self.send(index, answer);
                }
                return;
            }
            _ => {}
        }
        match message.kind {
            Kind::Rekey if !usable_spi(message.spi) => self.counters.malformed += 1,
            Kind::Rekey => self.answer_rekey(now, index, message),
            Kind::Switched => self.answer_switched(now, index, message),
            Kind::Init => self.counters.malformed += 1,
        }
    }

    fn answer_rekey(&mut self, now: Duration, index: usize, message: &Message) {
        let tunnel = &mut self.tunnels[index];
        // A rekey for the child after the one we answered proves the
        // initiator finished that one: finish it here too.
        if let Phase::Responded { child, .. } = tunnel.phase {
            if message.child == child.wrapping_add(1) {
                self.switch_responder(now, index);
            }
        }
        // Likewise a rekey for the child after ours proves the responder
        // switched, even if its acknowledgement is still on the way.
        let tunnel = &mut self.tunnels[index];
        let Some(control) = tunnel.control.as_ref() else {
            return;
        };
        let next = control.child.wrapping_add(1);
        if matches!(tunnel.phase, Phase::Confirming { .. }) && message.child == next {
            self.finish_initiator(now, index);
        }
        let tunnel = &mut self.tunnels[index];
        let Some(control) = tunnel.control.as_ref() else {
            return;
        };
        if message.child != control.child.wrapping_add(1) {
            // Not recorded as seen: a retransmission may fit later.
            self.counters.out_of_step += 1;
            return;
        }
        match &tunnel.phase {
            Phase::Idle => {}
            Phase::Requested { spi, exchange, .. } => {
                if matches!(exchange, Exchange::Init { .. }) {
                    self.counters.out_of_step += 1;
                    return;
                }
                self.counters.collisions += 1;
                // Both asked at once: the higher address's exchange goes on.
                if tunnel.side == Side::High {
                    // The peer drops its request when it sees ours.
                    if let Some(control) = tunnel.control.as_mut() {
                        control.peer_request = Some((message.message_id, None));
                    }
                    return;
                }
                let spi = *spi;
                tunnel.phase = Phase::Idle;
                self.reserved.remove(&spi);
            }
            Phase::Confirming { .. } | Phase::Responded { .. } => {
                self.counters.out_of_step += 1;
                return;
            }
        }
        let spi = self.fresh_spi();
        let nonce = self.nonce();
        let budget = self.exchange_budget();
        let tunnel = &mut self.tunnels[index];
        let generation = tunnel.take_generation();
        let Some(control) = tunnel.control.as_ref() else {
            return;
        };
        let keys = control
            .keys
            .child(tunnel.config.algorithm, &message.nonce, &nonce);
        let answer = control.seal(Message {
            spi,
            nonce,
            ..Message::new(
                Kind::Rekey,
                true,
                message.message_id,
                tunnel.config.name.clone(),
                message.child,
            )
        });
        if let Some(control) = tunnel.control.as_mut() {
            control.peer_request = Some((message.message_id, Some(answer.clone())));
        }
        tunnel.phase = Phase::Responded {
            generation,
            child: message.child,
            expires_at: now + budget,
        };
        tracing::debug!(tunnel = %tunnel.config.name, generation, "rekey answered; new SAs installed");
        let (inbound, outbound) = self.sa_pair(index, generation, (spi, message.spi), keys, false);
        self.command(SaCommand::InstallSa(Box::new(inbound)));
        self.command(SaCommand::InstallSa(Box::new(outbound)));
        self.send(index, answer);
    }

    fn answer_switched(&mut self, now: Duration, index: usize, message: &Message) {
        let tunnel = &self.tunnels[index];
        let child = match tunnel.phase {
            Phase::Responded { child, .. } if message.child == child => {
                self.switch_responder(now, index);
                child
            }
            // Switched already, on the initiator's ESP (see `observe`).
            Phase::Idle if tunnel.control.as_ref().is_some_and(|c| c.child == message.child) => message.child,
            _ => {
                self.counters.out_of_step += 1;
                return;
            }
        };
        let tunnel = &mut self.tunnels[index];
        let name = tunnel.config.name.clone();
        let Some(control) = tunnel.control.as_mut() else {
            return;
        };
        let answer = control.seal(Message::new(
            Kind::Switched,
            true,
            message.message_id,
            name,
            child,
        ));
        control.peer_request = Some((message.message_id, Some(answer.clone())));
        self.send(index, answer);
    }

    /// The responder moves its traffic to the child SAs it answered for.
    fn switch_responder(&mut self, now: Duration, index: usize) {
        let tunnel = &mut self.tunnels[index];
        let Phase::Responded {
            generation, child, ..
        } = tunnel.phase
        else {
            return;
        };
        let old = tunnel.current;
        tunnel.current = Some(generation);
        if let Some(control) = tunnel.control.as_mut() {
            control.child = child;
        }
        tunnel.phase = Phase::Idle;
        tunnel.rekeys += 1;
        tunnel.last_rekey = Some(now);
        self.responder_switched(now, index, old, true);
        self.rekey_if_pending(now, index);
    }

    /// The responder's side of a switch, once its tunnel's current
    /// generation is the new one: the `old` generation's SAs retire after
    /// the grace period, the policies are repointed, and the tunnel is up
    /// (or, `rekey`, rekeyed).
    fn responder_switched(&mut self, now: Duration, index: usize, old: Option<u32>, rekey: bool) {
        let grace = self.config.rekey.grace;
        let tunnel = &mut self.tunnels[index];
        if let Some(old) = old {
            for direction in [SaDirection::Outbound, SaDirection::Inbound] {
                tunnel
                    .retiring
                    .push((tunnel.sa(direction, old), Some(now + grace)));
            }
        }
        tunnel.note = None;
        let repoints = tunnel.repoints();
        if rekey {
            self.counters.rekeys_completed += 1;
        } else {
            self.counters.connects_completed += 1;
        }
        for repoint in repoints {
            self.command(repoint);
        }
        self.log_tunnel_switched(index, "responder", rekey);
    }

    /// Starts the rekey a soft expiry asked for during the last exchange.
    fn rekey_if_pending(&mut self, now: Duration, index: usize) {
        let tunnel = &mut self.tunnels[index];
        let soft = |direction| {
            tunnel
                .current(direction)
                .is_some_and(|name| tunnel.soft_seen.contains(&name))
        };
        let due = soft(SaDirection::Outbound) || soft(SaDirection::Inbound);
        if due && matches!(tunnel.phase, Phase::Idle) && tunnel.control.is_some() {
            self.start_rekey(now, index);
        }
    }

    fn handle_response(&mut self, now: Duration, index: usize, message: &Message) {
        let tunnel = &mut self.tunnels[index];
        match (&tunnel.phase, message.kind) {
            (
                Phase::Requested {
                    exchange: Exchange::Rekey,
                    id,
                    nonce,
                    spi,
                    ..
                },
                Kind::Rekey,
            ) if *id == message.message_id => {
                if !usable_spi(message.spi) {
                    self.counters.malformed += 1;
                    return;
                }
                let Some(control) = tunnel.control.as_ref() else {
                    return;
                };
                let child = control.child.wrapping_add(1);
                if message.child != child {
                    self.counters.out_of_step += 1;
                    return;
                }
                let (our_nonce, our_spi) = (*nonce, *spi);
                let keys = control
                    .keys
                    .child(tunnel.config.algorithm, &our_nonce, &message.nonce);
                let generation = tunnel.take_generation();
                let (inbound, outbound) = self.sa_pair(index, generation, (our_spi, message.spi), keys, true);
                let tunnel = &mut self.tunnels[index];
                let old = tunnel.current;
                tunnel.current = Some(generation);
                let name = tunnel.config.name.clone();
                let Some(control) = tunnel.control.as_mut() else {
                    return;
                };
                control.child = child;
                let id = control.take_message_id();
                let wire = control.seal(Message::new(Kind::Switched, false, id, name, child));
                self.switch_to_new_sas(now, index, false, (id, wire), old, (inbound, outbound));
            }
            (Phase::Confirming { id, .. }, Kind::Switched) if *id == message.message_id => {
                self.finish_initiator(now, index);
            }
            _ => self.counters.stale_responses += 1,
        }
    }

    /// The initiator's exchange is over: the peer sends on the new SAs.
    fn finish_initiator(&mut self, now: Duration, index: usize) {
        let grace = self.config.rekey.grace;
        let tunnel = &mut self.tunnels[index];
        let Phase::Confirming { old_in, connect, .. } = &tunnel.phase else {
            return;
        };
        let connect = *connect;
        if let Some(old_in) = old_in.clone() {
            tunnel.retiring.push((old_in, Some(now + grace)));
        }
        tunnel.phase = Phase::Idle;
        tunnel.note = None;
        if connect {
            self.counters.connects_completed += 1;
        } else {
            tunnel.rekeys += 1;
            tunnel.last_rekey = Some(now);
            self.counters.rekeys_completed += 1;
        }
        self.log_tunnel_switched(index, "initiator", !connect);
        self.rekey_if_pending(now, index);
    }

    /// A tunnel's SA pair of `generation` from an exchange's child keys:
    /// inbound on `our_spi`, outbound to the peer's `peer_spi`. `started`
    /// says whether this end started the exchange (then what it sends is
    /// keyed first to second).
    fn sa_pair(
        &self,
        index: usize,
        generation: u32,
        (our_spi, peer_spi): (u32, u32),
        keys: crate::prf::KeyPair,
        started: bool,
    ) -> (SaSetup, SaSetup) {
        let (keys_in, keys_out) = if started {
            (keys.second_to_first, keys.first_to_second)
        } else {
            (keys.first_to_second, keys.second_to_first)
        };
        (
            self.sa_setup(index, SaDirection::Inbound, generation, our_spi, keys_in),
            self.sa_setup(index, SaDirection::Outbound, generation, peer_spi, keys_out),
        )
    }

    /// The SA of `direction` of a tunnel's generation.
    fn sa_setup(
        &self,
        index: usize,
        direction: SaDirection,
        generation: u32,
        spi: u32,
        keys: crate::prf::SaKeys,
    ) -> SaSetup {
        let t = &self.tunnels[index].config;
        let selectors = match direction {
            SaDirection::Inbound => self.config.inbound_selectors(&t.sa_name(SaDirection::Inbound, 0)),
            SaDirection::Outbound => Vec::new(),
        };
        SaSetup {
            params: SaParams {
                name: t.sa_name(direction, generation),
                direction,
                spi,
                mode: t.mode,
                local: t.local,
                remote: t.remote,
                esn: t.esn,
                replay_window: t.replay_window,
                lifetime: t.lifetime,
                encap: t.encap,
                selectors,
            },
            algorithm: t.algorithm,
            enc_key: accel::SecretBytes::new(&keys.enc),
            auth_key: accel::SecretBytes::new(&keys.auth),
            initial_seq: 0,
            key_source: KeySource::Exchange,
            ledger_mark: None,
        }
    }

    /// Retransmits, gives up, retries, expires unconfirmed answers and
    /// deletes retired SAs as time passes; connects tunnels with a secret
    /// at the first call.
    pub fn handle_timeout(&mut self, now: Duration) {
        let settings: RekeySettings = self.config.rekey;
        for index in 0..self.tunnels.len() {
            let tunnel = &mut self.tunnels[index];
            let mut due = Vec::new();
            tunnel.retiring.retain(|(name, deadline)| match deadline {
                Some(at) if *at <= now => {
                    due.push(name.clone());
                    false
                }
                _ => true,
            });
            for name in &due {
                tunnel.soft_seen.remove(name);
            }
            let expired: Vec<u32> = tunnel
                .half_open
                .iter()
                .filter(|h| h.expires_at <= now)
                .map(|h| h.generation)
                .collect();
            tunnel.half_open.retain(|h| h.expires_at > now);
            for generation in expired {
                self.counters.half_open_expired += 1;
                self.remove_pair(index, generation);
            }
            let tunnel = &mut self.tunnels[index];
            if let Phase::Responded {
                generation,
                expires_at,
                ..
            } = tunnel.phase
            {
                if expires_at <= now {
                    // The initiator never said it switched (or the request
                    // was reflected or replayed): its SAs carry nothing.
                    tunnel.phase = Phase::Idle;
                    tunnel.note =
                        Some("a rekey we answered was never confirmed; its SAs were removed".into());
                    tracing::warn!(
                        event = "exchange_failed",
                        tunnel = %tunnel.config.name,
                        peer = %tunnel.config.remote,
                        generation,
                        role = "responder",
                        reason = "the initiator never confirmed the rekey we answered; its SAs are removed",
                        "rekey answered but never confirmed: its SAs are removed"
                    );
                    self.counters.responded_expired += 1;
                    self.remove_pair(index, generation);
                }
            }
            let tunnel = &mut self.tunnels[index];
            let mut resend = None;
            let mut gave_up = false;
            // The exchange waiting for the peer, if any: its message, its
            // attempts, when it leaves again and (a request) when it last left.
            let waiting = match &mut tunnel.phase {
                Phase::Requested {
                    wire,
                    attempts,
                    next_send,
                    sent_at,
                    ..
                } => Some((wire, attempts, next_send, Some(sent_at))),
                Phase::Confirming {
                    wire,
                    attempts,
                    next_send,
                    ..
                } => Some((wire, attempts, next_send, None)),
                _ => None,
            };
            if let Some((wire, attempts, next_send, sent_at)) = waiting.filter(|w| *w.2 <= now) {
                if *attempts >= settings.retries {
                    gave_up = true;
                } else {
                    *attempts += 1;
                    if let Some(sent_at) = sent_at {
                        *sent_at = now;
                    }
                    *next_send = now + settings.retransmit * (1 << (*attempts).min(16));
                    resend = Some(wire.clone());
                }
            }
            if gave_up {
                self.give_up(now, index);
            }
            let tunnel = &mut self.tunnels[index];
            let retry = matches!(tunnel.phase, Phase::Idle) && tunnel.retry_at.is_some_and(|at| at <= now);
            let tunnel_name = tunnel.config.name.clone();
            for name in due {
                self.remove_sa(name, Removal::Rekeyed, Some(&tunnel_name));
            }
            if let Some(wire) = resend {
                self.counters.retransmitted += 1;
                self.send(index, wire);
            }
            if retry {
                self.start_rekey(now, index);
            }
        }
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) has
    /// something to do, if any.
    pub fn timer_deadline(&self) -> Option<Duration> {
        let mut deadline: Option<Duration> = None;
        let mut at = |t: Duration| deadline = Some(deadline.map_or(t, |d| d.min(t)));
        for tunnel in &self.tunnels {
            tunnel.retiring.iter().filter_map(|(_, d)| *d).for_each(&mut at);
            tunnel.half_open.iter().for_each(|h| at(h.expires_at));
            match &tunnel.phase {
                Phase::Requested { next_send, .. } | Phase::Confirming { next_send, .. } => at(*next_send),
                Phase::Responded { expires_at, .. } => at(*expires_at),
                Phase::Idle => tunnel.retry_at.into_iter().for_each(&mut at),
            }
        }
        deadline
    }

    fn give_up(&mut self, now: Duration, index: usize) {
        let settings = self.config.rekey;
        self.counters.gave_up += 1;
        let tunnel = &mut self.tunnels[index];
        let why = match std::mem::replace(&mut tunnel.phase, Phase::Idle) {
            Phase::Requested {
                spi,
                exchange: Exchange::Init { .. },
                ..
            } => {
                self.reserved.remove(&spi);
                tunnel.retry_at = Some(now + settings.retry_after);
                "the peer never answered the INIT request; trying again later"
            }
            Phase::Requested { spi, .. } => {
                self.reserved.remove(&spi);
                tunnel.retry_at = Some(now + settings.retry_after);
                "the peer never answered the rekey request; the current SAs stay until their hard lifetime"
            }
            Phase::Confirming {
                connect: true,
                old_in,
                ..
            } => {
                // The peer never confirmed the new control SA: it may not
                // have it. Connect again from the start.
                if let Some(old_in) = old_in {
                    tunnel.retiring.push((old_in, None));
                }
                tunnel.control = None;
                tunnel.retry_at = Some(now + settings.retry_after);
                "the peer never confirmed the INIT exchange; connecting again later"
            }
            Phase::Confirming { old_in, .. } => {
                // The peer may still send on the old SA: keep it to its end.
                if let Some(old_in) = old_in {
                    tunnel.retiring.push((old_in, None));
                }
                "the peer never confirmed the switch; the old inbound SA stays until its hard lifetime"
            }
            phase @ (Phase::Idle | Phase::Responded { .. }) => {
                tunnel.phase = phase;
                return;
            }
        };
        tunnel.note = Some(why.into());
        tracing::warn!(
            event = "exchange_failed",
            tunnel = %tunnel.config.name,
            peer = %tunnel.config.remote,
            role = "initiator",
            tries = settings.retries + 1,
            reason = why,
            "{why}"
        );
        // SAs kept to their hard lifetime are bounded: an SA with only a
        // byte or packet limit that the peer no longer uses would stay
        // for ever, one more each time a switch goes unconfirmed.
        let kept: Vec<usize> = tunnel
            .retiring
            .iter()
            .enumerate()
            .filter(|(_, (_, deadline))| deadline.is_none())
            .map(|(at, _)| at)
            .collect();
        if kept.len() > MAX_KEPT_UNCONFIRMED {
            let (oldest, _) = tunnel.retiring.remove(kept[0]);
            tunnel.soft_seen.remove(&oldest);
            let tunnel_name = tunnel.config.name.clone();
            self.remove_sa(oldest, Removal::KeptTooMany, Some(&tunnel_name));
        }
    }

    /// Takes `new` in place of the running configuration: tunnels added
    /// start, removed ones stop, changed ones restart, unchanged ones keep
    /// their SAs, counters and rekey state. A changed SA that keeps its
    /// keys keeps its sequence counter and replay window; a tunnel keyed by
    /// exchange that restarts connects anew, with fresh keys. Parts that
    /// cannot change while running (interfaces, routes, engine) are
    /// refused.
    pub fn reload(&mut self, new: Config) -> Result<ReloadReport, ReloadError> {
        let old = &self.config;
        let mut fixed = Vec::new();
        if old.inside != new.inside || old.outside != new.outside {
            fixed.push("[[interface]]");
        }
        if old.routes != new.routes {
            fixed.push("[[route]]");
        }
        if old.neighbors != new.neighbors {
            fixed.push("[[neighbor]]");
        }
        if old.engine != new.engine || old.style != new.style {
            fixed.push("[accel]");
        }
        if old.limits != new.limits {
            fixed.push("[limits]");
        }
        if old.name != new.name
            || old.outer_ttl != new.outer_ttl
            || old.allow_insecure_null != new.allow_insecure_null
            || old.on_device_loss != new.on_device_loss
        {
            fixed.push("[gateway]");
        }
        if !fixed.is_empty() {
            self.counters.reloads_rejected += 1;
            return Err(ReloadError::NeedsRestart(fixed.join(", ")));
        }
        if let Some(sa) = new
            .sas
            .iter()
            .find(|s| s.params.direction == SaDirection::Inbound && s.params.selectors.is_empty())
        {
            self.counters.reloads_rejected += 1;
            return Err(ReloadError::UnselectedSa(sa.params.name.clone()));
        }
        let mut report = ReloadReport::default();
        let owned = |config: &Config, name: &str| {
            config.tunnels.iter().any(|t| {
                [SaDirection::Outbound, SaDirection::Inbound]
                    .iter()
                    .any(|d| t.sa_name(*d, 0) == name)
            })
        };
        // Tunnels.
        let same_tunnel = |t: &TunnelConfig| {
            let Some(n) = new.tunnel(&t.name) else {
                return false;
            };
            let parts_equal = |c: &Config, d: SaDirection| {
                let name = t.sa_name(d, 0);
                (
                    c.sa(&name).cloned(),
                    c.policies.iter().find(|p| p.name == name).cloned(),
                )
            };
            n == t
                && [SaDirection::Outbound, SaDirection::Inbound]
                    .iter()
                    .all(|d| parts_equal(old, *d) == parts_equal(&new, *d))
                && old.inbound_selectors(&t.sa_name(SaDirection::Inbound, 0))
                    == new.inbound_selectors(&t.sa_name(SaDirection::Inbound, 0))
        };
        let mut stopping = Vec::new();
        for t in &self.tunnels {
            if same_tunnel(&t.config) {
                report.unchanged.push(t.config.name.clone());
            } else {
                if new.tunnel(&t.config.name).is_some() {
                    report.changed.push(t.config.name.clone());
                } else {
                    report.removed.push(t.config.name.clone());
                }
                stopping.push(t.config.name.clone());
            }
        }
        let starting: Vec<TunnelConfig> = new
            .tunnels
            .iter()
            .filter(|t| old.tunnel(&t.name).is_none() || stopping.contains(&t.name))
            .cloned()
            .collect();
        report.added = starting
            .iter()
            .filter(|t| old.tunnel(&t.name).is_none())
            .map(|t| t.name.clone())
            .collect();
        // Manual SAs and policies: by name, replaced when anything differs,
        // except that an SA whose policies alone changed keeps its state
        // and takes their new selectors.
        let reselected: Vec<(String, Vec<Selector>)> = new
            .sas
            .iter()
            .filter(|s| !owned(&new, &s.params.name))
            .filter_map(|s| {
                let before = old.sa(&s.params.name)?;
                (before.params.selectors != s.params.selectors && same_but_selectors(before, s))
                    .then(|| (s.params.name.clone(), s.params.selectors.clone()))
            })
            .collect();
        let kept = |name: &str| reselected.iter().any(|(n, _)| n == name);
        let sa_gone: Vec<String> = old
            .sas
            .iter()
            .filter(|s| {
                !owned(old, &s.params.name) && !kept(&s.params.name) && new.sa(&s.params.name) != Some(*s)
            })
            .map(|s| s.params.name.clone())
            .collect();
        let sa_new: Vec<SaConfig> = new
            .sas
            .iter()
            .filter(|s| {
                !owned(&new, &s.params.name) && !kept(&s.params.name) && old.sa(&s.params.name) != Some(*s)
            })
            .cloned()
            .collect();
        let policy_differs = |p: &PolicySetup, other: &Config| {
            let named_sa_changed = match &p.action {
                crate::PolicyAction::Protect(sa) => {
                    sa_gone.contains(sa) || sa_new.iter().any(|s| &s.params.name == sa)
                }
                _ => false,
            };
            named_sa_changed || other.policies.iter().find(|q| q.name == p.name) != Some(p)
        };
        let policy_gone: Vec<String> = old
            .policies
            .iter()
            .filter(|p| !owned(old, &p.name) && policy_differs(p, &new))
            .map(|p| p.name.clone())
            .collect();
        let policy_new: Vec<PolicySetup> = new
            .policies
            .iter()
            .filter(|p| !owned(&new, &p.name) && policy_differs(p, old))
            .cloned()
            .collect();
        report.manual_changes =
            sa_gone.len() + sa_new.len() + reselected.len() + policy_gone.len() + policy_new.len();
        // An SA that goes and comes back with the same keys (a changed
        // tunnel or [[sa]] whose keys stay) takes over its predecessor's
        // sequence counter and replay window: starting them again would
        // send sequence numbers already sent under those keys, and accept
        // packets already accepted.
        let restarted_tunnel_sas = stopping
            .iter()
            .filter_map(|name| new.tunnel(name))
            .flat_map(|t| [SaDirection::Outbound, SaDirection::Inbound].map(|d| t.sa_name(d, 0)));
        let carried: Vec<String> = restarted_tunnel_sas
            .chain(sa_new.iter().map(|s| s.params.name.clone()))
            .filter(|name| match (old.sa(name), new.sa(name)) {
                (Some(before), Some(after)) => same_keys(before, after),
                _ => false,
            })
            .collect();
        report.carried_over = carried.clone();

        // Stop: policies first (traffic then meets the default discard
        // rather than a missing SA), then every SA the tunnel may have.
        for name in &stopping {
            let Some(index) = self.tunnels.iter().position(|t| &t.config.name == name) else {
                continue;
            };
            let tunnel = self.tunnels.remove(index);
            if let Some(generation) = tunnel.current {
                let reason = if report.changed.contains(name) {
                    "changed by a reload: it starts again with its new settings"
                } else {
                    "removed by a reload"
                };
                tracing::info!(event = "tunnel_down", tunnel = %name, generation, reason, "tunnel down: {reason}");
            }
            for direction in [PolicyDirection::Out, PolicyDirection::In] {
                self.command(SaCommand::RemovePolicy(tunnel.config.policy_name(direction)));
            }
            if let Phase::Requested { spi, .. } = tunnel.phase {
                self.reserved.remove(&spi);
            }
            for sa in tunnel.all_sas().into_iter().filter(|sa| !carried.contains(sa)) {
                self.remove_sa(sa, Removal::Reload, Some(name.as_str()));
            }
        }
        for name in policy_gone {
            self.command(SaCommand::RemovePolicy(name));
        }
        for name in sa_gone.into_iter().filter(|sa| !carried.contains(sa)) {
            self.remove_sa(name, Removal::Reload, None);
        }
        for (sa, selectors) in reselected {
            self.command(SaCommand::SetSelectors { sa, selectors });
        }
        // Start: SAs, then the policies that name them.
        self.config = new;
        let mut sas: Vec<SaConfig> = sa_new;
        let mut policies: Vec<PolicySetup> = Vec::new();
        for t in &starting {
            for direction in [SaDirection::Outbound, SaDirection::Inbound] {
                // A tunnel keyed by exchange connects anew instead.
                if let Some(sa) = self
                    .config
                    .sa(&t.sa_name(direction, 0))
                    .filter(|s| s.keys == KeySource::File)
                {
                    sas.push(sa.clone());
                }
            }
            for direction in [PolicyDirection::Out, PolicyDirection::In] {
                let name = t.policy_name(direction);
                if let Some(p) = self.config.policies.iter().find(|p| p.name == name) {
                    policies.push(p.clone());
                }
            }
        }
        policies.extend(policy_new);
        // Inbound SAs carry their selectors from validation.
        for sa in sas {
            if carried.contains(&sa.params.name) {
                let old = sa.params.name.clone();
                self.command(SaCommand::ReplaceSa {
                    old,
                    new: Box::new(sa.setup()),
                });
            } else {
                self.command(SaCommand::InstallSa(Box::new(sa.setup())));
            }
        }
        for p in policies {
            self.command(SaCommand::InsertPolicy(p));
        }
        for t in starting.iter().filter(|t| t.secret.is_some()) {
            if let Some(encap) = t.encap {
                self.command(SaCommand::OpenEncapsulationPort(encap.local_port));
            }
        }
        // Keep the rekey state of unchanged tunnels, in the new file's order.
        let mut kept: Vec<Tunnel> = std::mem::take(&mut self.tunnels);
        self.tunnels = self
            .config
            .tunnels
            .iter()
            .map(|t| match kept.iter().position(|k| k.config.name == t.name) {
                Some(i) => kept.swap_remove(i),
                None => Tunnel::new(t.clone()),
            })
            .collect();
        for t in self.tunnels.iter().filter(|t| t.secrets.is_none()) {
            if starting.iter().any(|s| s.name == t.config.name) {
                self.log_static_tunnel_up(t);
            }
        }
        self.counters.reloads += 1;
        Ok(report)
    }
}

/// The generation an SA of a tunnel keyed by exchange has in its name
/// (`{tunnel}-out.{generation}`), if it has one.
pub fn sa_generation(name: &str) -> Option<u32> {
    let (_, generation) = name.rsplit_once('.')?;
    generation.parse().ok()
}

/// Whether a peer may ask us to send with `spi`: 1 to 255 are reserved
/// (RFC 4303 §2.1), and an SA with one would be refused by every gateway,
/// leaving the tunnel pointed at nothing.
fn usable_spi(spi: u32) -> bool {
    spi >= 256
}

/// Whether `after` uses the keys of `before` the same way: the same
/// direction, SPI, proposal, keys and sequence-number width, keyed from the
/// file. Such an SA must carry on where `before` stopped.
fn same_keys(before: &SaConfig, after: &SaConfig) -> bool {
    before.keys == KeySource::File
        && after.keys == KeySource::File
        && before.params.direction == after.params.direction
        && before.params.spi == after.params.spi
        && before.params.esn == after.params.esn
        && before.algorithm == after.algorithm
        && before.enc_key == after.enc_key
        && before.auth_key == after.auth_key
}

/// Whether two SAs differ in their selectors at most (and so in whether
/// they say `selectors = "any"`).
fn same_but_selectors(a: &SaConfig, b: &SaConfig) -> bool {
    let unselected = |s: &SaConfig| SaParams {
        selectors: Vec::new(),
        ..s.params.clone()
    };
    unselected(a) == unselected(b)
        && a.algorithm == b.algorithm
        && a.enc_key == b.enc_key
        && a.auth_key == b.auth_key
        && a.initial_seq == b.initial_seq
}

/// Source, destination and UDP payload of an IPv4/UDP packet.
pub fn udp_payload(packet: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, &[u8])> {
    udp_endpoints(packet).map(|((src, _), (dst, _), payload)| (src, dst, payload))
}

/// Source and destination addresses and ports, and the payload, of an
/// IPv4/UDP packet.
#[allow(clippy::type_complexity)]
pub fn udp_endpoints(packet: &[u8]) -> Option<((Ipv4Addr, u16), (Ipv4Addr, u16), &[u8])> {
    // smoltcp's checked views: after `new_checked` no accessor can read
    // past the datagram (the fuzzer once found this parser doing so when it
    // was written by hand).
    let ip = smoltcp::wire::Ipv4Packet::new_checked(packet).ok()?;
    if ip.version() != 4 || ip.next_header() != smoltcp::wire::IpProtocol::Udp {
        return None;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let udp = smoltcp::wire::UdpPacket::new_checked(ip.payload()).ok()?;
    Some(((src, udp.src_port()), (dst, udp.dst_port()), udp.payload()))
}
