//! The control plane's state machine: rekeying tunnels with the peer,
//! retiring replaced SAs, and applying configuration reloads.
//!
//! Sans-IO like the gateway: it is fed SA lifetime events, the control
//! datagrams the gateway delivered and the time, and it answers with
//! [`SaCommand`]s for every worker's gateway and [`Datagram`]s to send.
//! A datagram must not leave before the commands issued ahead of it are
//! applied everywhere ([`Datagram::after_commands`]): the responder's new
//! inbound SA must exist before the initiator can learn it and switch.
//!
//! One rekey, make-before-break (I initiates, R responds):
//!
//! ```text
//! I  rekey request (gen+1, SPIi, Ni)  ->  R  installs in+out gen+1, keeps sending on gen
//! I  <-  rekey response (gen+1, SPIr, Nr)
//! I  installs in+out gen+1, switches outbound, sends "switched"  ->  R switches outbound
//! I  <-  switched acknowledged; both delete the gen SAs after the grace period
//! ```

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use dataplane::{Gateway, SaCrypto};
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;
use spd_sad::{PolicyDirection, SaDirection, SaEvent, SaParams, SecurityAssociation, Selector};

use crate::config::{
    install_policy, install_sa, resolve_action, Config, InstallError, PolicyConfig, RekeySettings, SaConfig,
    TunnelConfig,
};
use crate::message::{peek_tunnel, Kind, Message, MessageError};
use crate::prf::{TunnelSecrets, NONCE_LEN};
use dataplane::nat::NON_ESP_MARKER;
use dataplane::CONTROL_PORT;

/// A change to every worker's SAD or SPD.
#[derive(Debug, Clone)]
pub enum SaCommand {
    /// Install an SA (inbound selectors already filled in).
    InstallSa(Box<SaConfig>),
    /// Delete an SA; its keys are zeroized with its last session.
    RemoveSa(String),
    InsertPolicy(PolicyConfig),
    RemovePolicy(String),
    /// Point a `protect` policy at another SA (the switch of a rekey).
    Repoint {
        policy: String,
        sa: String,
    },
    /// Change what may arrive through an inbound SA, keeping its sequence
    /// state (a reload that changed only the policies naming it).
    SetSelectors {
        sa: String,
        selectors: Vec<Selector>,
    },
}

/// Why a command could not be applied to a gateway.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Install(#[from] InstallError),
    #[error("no policy `{0}` to repoint")]
    NoPolicy(String),
    #[error("no SA `{0}` to change the selectors of")]
    NoSa(String),
}

impl SaCommand {
    /// Applies the command to one gateway at time `now`.
    pub fn apply(&self, gateway: &mut Gateway, now: Duration) -> Result<(), ApplyError> {
        match self {
            SaCommand::InstallSa(sa) => install_sa(gateway, sa, now)?,
            SaCommand::RemoveSa(name) => {
                if let Some(id) = gateway.sad().find(name) {
                    drop(gateway.remove_sa(id));
                }
            }
            SaCommand::InsertPolicy(policy) => install_policy(gateway, policy),
            SaCommand::RemovePolicy(name) => {
                gateway.spd_mut().remove(name);
            }
            SaCommand::Repoint { policy, sa } => {
                let action = resolve_action(gateway, &crate::PolicyAction::Protect(sa.clone()));
                if !gateway.spd_mut().set_action(policy, action) {
                    return Err(ApplyError::NoPolicy(policy.clone()));
                }
            }
            SaCommand::SetSelectors { sa, selectors } => {
                let installed = gateway
                    .sad()
                    .find(sa)
                    .and_then(|id| gateway.sad_mut().get_mut(id))
                    .ok_or_else(|| ApplyError::NoSa(sa.clone()))?;
                installed
                    .set_selectors(selectors.clone())
                    .map_err(|e| ApplyError::Install(InstallError::Sad(e)))?;
            }
        }
        Ok(())
    }
}

/// A command as every worker but the first applies it: a new SA arrives
/// as a fork of the first worker's, so that all copies share one sequence
/// counter and one lifetime usage (see [`spd_sad::SecurityAssociation::fork`]).
pub enum WorkerCommand {
    Adopt(Box<SecurityAssociation<SaCrypto>>),
    Apply(SaCommand),
}

impl std::fmt::Debug for WorkerCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerCommand::Adopt(sa) => write!(f, "Adopt({})", sa.name()),
            WorkerCommand::Apply(c) => write!(f, "Apply({c:?})"),
        }
    }
}

impl WorkerCommand {
    pub fn apply(self, gateway: &mut Gateway, now: Duration) -> Result<(), ApplyError> {
        match self {
            WorkerCommand::Adopt(sa) => {
                let name = sa.name().to_owned();
                gateway
                    .adopt_sa(*sa)
                    .map_err(|e| ApplyError::Install(InstallError::from_gateway(&name, e)))?;
                Ok(())
            }
            WorkerCommand::Apply(command) => command.apply(gateway, now),
        }
    }
}

impl SaCommand {
    /// Applies the command to the first worker's gateway and returns what
    /// each other worker must apply for the same effect.
    pub fn apply_first(
        self,
        first: &mut Gateway,
        now: Duration,
        others: usize,
    ) -> Result<Vec<WorkerCommand>, ApplyError> {
        self.apply(first, now)?;
        let mut copies = Vec::with_capacity(others);
        for _ in 0..others {
            copies.push(match &self {
                SaCommand::InstallSa(sa) => match first
                    .sad()
                    .find(&sa.params.name)
                    .and_then(|id| first.sad().get(id))
                {
                    Some(installed) => WorkerCommand::Adopt(Box::new(installed.fork())),
                    None => WorkerCommand::Apply(self.clone()),
                },
                other => WorkerCommand::Apply(other.clone()),
            });
        }
        Ok(copies)
    }
}

/// A control message to send from the gateway's address on `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    pub to: Ipv4Addr,
    /// Our UDP port and the peer's.
    pub ports: (u16, u16),
    pub payload: Vec<u8>,
    /// How many commands the plane had issued when it produced this
    /// datagram: all of them must be applied on every worker first.
    pub after_commands: u64,
}

/// Counters of the control plane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ControlCounters {
    pub received: u64,
    pub sent: u64,
    pub retransmitted: u64,
    /// Retransmitted requests answered again from the cached response.
    pub duplicates: u64,
    /// Ignored: the ICV did not verify.
    pub forged: u64,
    /// Ignored: a request with a message ID already used.
    pub replayed: u64,
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
    /// Ignored: for a generation other than the next one.
    pub out_of_step: u64,
    /// Both ends started a rekey at once; the lower address gave way.
    pub collisions: u64,
    pub rekeys_started: u64,
    pub rekeys_completed: u64,
    /// Exchanges abandoned because the peer never answered.
    pub gave_up: u64,
    pub soft_expired: u64,
    pub hard_expired: u64,
    /// SAs deleted after being replaced (or with their tunnel).
    pub sas_deleted: u64,
    pub reloads: u64,
    pub reloads_rejected: u64,
}

/// Where a tunnel's rekey exchange is.
#[derive(Debug, Clone)]
enum Phase {
    Established,
    /// We asked for a rekey and wait for the answer.
    Requested {
        id: u32,
        nonce: [u8; NONCE_LEN],
        spi: u32,
        wire: Vec<u8>,
        attempts: u32,
        next_send: Duration,
    },
    /// We switched to the new SAs and wait for the peer to confirm it did
    /// too; `old_in` is deleted once it has (and the grace period passed).
    Confirming {
        id: u32,
        wire: Vec<u8>,
        attempts: u32,
        next_send: Duration,
        old_in: String,
    },
    /// We answered a rekey and installed its SAs; we switch when the
    /// initiator says it has.
    Responded {
        generation: u32,
    },
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Established => "established",
            Phase::Requested { .. } => "rekey-requested",
            Phase::Confirming { .. } => "rekey-confirming",
            Phase::Responded { .. } => "rekey-responded",
        }
    }
}

/// The state of one tunnel.
struct Tunnel {
    config: TunnelConfig,
    /// UDP-encapsulated tunnels: the address and port the peer's latest
    /// authenticated message came from, where our messages go (RFC 7296
    /// §2.23); `None` until one came.
    peer_at: Option<(Ipv4Addr, u16)>,
    /// Where the gateway's ESP last said the peer was (see `follow_peers`).
    dataplane_peer: Option<(Ipv4Addr, u16)>,
    secrets: Option<TunnelSecrets>,
    generation: u32,
    phase: Phase,
    next_message_id: u32,
    /// Highest request ID seen from the peer, and our answer to it, if we
    /// gave one (sent again if the request is retransmitted).
    peer_request: Option<(u32, Option<Vec<u8>>)>,
    /// Replaced SAs and when to delete them; `None`: at their hard expiry
    /// (the peer may still send on them).
    retiring: Vec<(String, Option<Duration>)>,
    /// After giving up, when to try again.
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
        Tunnel {
            config,
            secrets,
            generation: 0,
            phase: Phase::Established,
            next_message_id: 0,
            peer_at: None,
            dataplane_peer: None,
            peer_request: None,
            retiring: Vec::new(),
            retry_at: None,
            rekeys: 0,
            last_rekey: None,
            note: None,
            soft_seen: HashSet::new(),
        }
    }

    fn sa(&self, direction: SaDirection, generation: u32) -> String {
        self.config.sa_name(direction, generation)
    }

    fn current(&self, direction: SaDirection) -> String {
        self.sa(direction, self.generation)
    }

    /// The commands that point the tunnel's policies at its current SAs.
    fn repoints(&self) -> [SaCommand; 2] {
        [
            (PolicyDirection::Out, SaDirection::Outbound),
            (PolicyDirection::In, SaDirection::Inbound),
        ]
        .map(|(policy, sa)| SaCommand::Repoint {
            policy: self.config.policy_name(policy),
            sa: self.current(sa),
        })
    }

    /// Every SA of this tunnel that may exist in the gateways.
    fn all_sas(&self) -> Vec<String> {
        let mut names = vec![
            self.current(SaDirection::Outbound),
            self.current(SaDirection::Inbound),
        ];
        if let Phase::Responded { generation } = self.phase {
            names.push(self.sa(SaDirection::Outbound, generation));
            names.push(self.sa(SaDirection::Inbound, generation));
        }
        if let Phase::Confirming { old_in, .. } = &self.phase {
            names.push(old_in.clone());
        }
        names.extend(self.retiring.iter().map(|(n, _)| n.clone()));
        names
    }
}

/// What one tunnel looks like, for `espgw sa list/show`.
#[derive(Debug, Clone, Serialize)]
pub struct TunnelStatus {
    pub name: String,
    pub local: IpAddr,
    pub remote: IpAddr,
    pub proposal: String,
    pub generation: u32,
    pub state: &'static str,
    pub can_rekey: bool,
    pub rekeys: u64,
    /// Seconds since the last completed rekey.
    pub last_rekey_ago: Option<f64>,
    pub sa_out: String,
    pub sa_in: String,
    pub retiring: Vec<String>,
    pub note: Option<String>,
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
    /// Manually keyed SAs and policies added, removed or replaced.
    pub manual_changes: usize,
}

/// Why a new configuration was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
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
    reserved: HashSet<u32>,
    commands: Vec<SaCommand>,
    commands_issued: u64,
    datagrams: Vec<Datagram>,
    counters: ControlCounters,
    rng: StdRng,
}

impl ControlPlane {
    /// The plane for a gateway that has `config` installed.
    pub fn new(config: Config) -> ControlPlane {
        let mut plane = ControlPlane {
            tunnels: config.tunnels.iter().cloned().map(Tunnel::new).collect(),
            inbound_spis: HashMap::new(),
            reserved: HashSet::new(),
            commands: Vec::new(),
            commands_issued: 0,
            datagrams: Vec::new(),
            counters: ControlCounters::default(),
            rng: rand::make_rng(),
            config,
        };
        for sa in &plane.config.sas {
            if sa.params.direction == SaDirection::Inbound {
                plane.inbound_spis.insert(sa.params.name.clone(), sa.params.spi);
            }
        }
        for t in plane.tunnels.iter().filter(|t| t.secrets.is_none()) {
            tracing::info!(tunnel = %t.config.name, "no `secret`: this tunnel keeps its configured keys and stops at their hard lifetime");
        }
        plane
    }

    /// Makes nonces and SPIs a function of `seed` (tests only).
    pub fn set_seed(&mut self, seed: u64) {
        use rand::SeedableRng;
        self.rng = StdRng::seed_from_u64(seed);
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn counters(&self) -> ControlCounters {
        self.counters
    }

    /// Commands issued so far (the number the next one will follow).
    pub fn commands_issued(&self) -> u64 {
        self.commands_issued
    }

    /// Takes the commands issued since the last call, in order.
    pub fn take_commands(&mut self, into: &mut Vec<SaCommand>) {
        into.append(&mut self.commands);
    }

    /// Takes the datagrams to send, in order.
    pub fn take_datagrams(&mut self, into: &mut Vec<Datagram>) {
        into.append(&mut self.datagrams);
    }

    pub fn tunnels(&self, now: Duration) -> Vec<TunnelStatus> {
        self.tunnels
            .iter()
            .map(|t| TunnelStatus {
                name: t.config.name.clone(),
                local: t.config.local,
                remote: t.config.remote,
                proposal: t.config.algorithm.to_string(),
                generation: t.generation,
                state: t.phase.name(),
                can_rekey: t.secrets.is_some(),
                rekeys: t.rekeys,
                last_rekey_ago: t.last_rekey.map(|at| now.saturating_sub(at).as_secs_f64()),
                sa_out: t.current(SaDirection::Outbound),
                sa_in: t.current(SaDirection::Inbound),
                retiring: t.retiring.iter().map(|(n, _)| n.clone()).collect(),
                note: t.note.clone(),
            })
            .collect()
    }

    fn command(&mut self, command: SaCommand) {
        match &command {
            SaCommand::InstallSa(sa) if sa.params.direction == SaDirection::Inbound => {
                self.reserved.remove(&sa.params.spi);
                self.inbound_spis.insert(sa.params.name.clone(), sa.params.spi);
            }
            SaCommand::RemoveSa(name) => {
                self.inbound_spis.remove(name);
                self.counters.sas_deleted += 1;
            }
            _ => {}
        }
        self.commands.push(command);
        self.commands_issued += 1;
    }

    /// Takes in where the gateway's authenticated ESP says each
    /// UDP-encapsulated peer moved to, so that an exchange this end starts
    /// reaches a peer whose NAT mapping changed before it spoke IKE again.
    pub fn follow_peers(&mut self, gateway: &Gateway) {
        for tunnel in &mut self.tunnels {
            let Some(encap) = tunnel.config.encap else {
                continue;
            };
            // UDP encapsulation has IPv4 ends (the config refuses others).
            let (IpAddr::V4(local), IpAddr::V4(remote)) = (tunnel.config.local, tunnel.config.remote) else {
                continue;
            };
            let Some(at) = gateway.encapsulated_peer(local, remote, encap) else {
                continue;
            };
            let at = (at.address, at.port);
            if tunnel.dataplane_peer != Some(at) {
                tunnel.dataplane_peer = Some(at);
                tunnel.peer_at = Some(at);
            }
        }
    }

    /// Sends to tunnel `index`'s peer: on IKE's port, or for a
    /// UDP-encapsulated tunnel on its ports behind the non-ESP marker
    /// (RFC 3948 §2.2), to where the peer last spoke from.
    fn send(&mut self, index: usize, payload: Vec<u8>) {
        let tunnel = &self.tunnels[index];
        // Tunnels that exchange messages have IPv4 ends: the config gives
        // a `secret` to no other.
        let IpAddr::V4(remote) = tunnel.config.remote else {
            return;
        };
        let (to, ports, payload) = match tunnel.config.encap {
            None => (remote, (CONTROL_PORT, CONTROL_PORT), payload),
            Some(encap) => {
                let (to, port) = tunnel.peer_at.unwrap_or((remote, encap.remote_port));
                let mut marked = Vec::with_capacity(NON_ESP_MARKER.len() + payload.len());
                marked.extend_from_slice(&NON_ESP_MARKER);
                marked.extend_from_slice(&payload);
                (to, (encap.local_port, port), marked)
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

    fn nonce(&mut self) -> [u8; NONCE_LEN] {
        let mut nonce = [0; NONCE_LEN];
        self.rng.fill_bytes(&mut nonce);
        nonce
    }

    /// An SA lifetime event from the gateway about the SA called `name`.
    pub fn handle_sa_event(&mut self, now: Duration, name: &str, event: SaEvent) {
        let Some(index) = self.tunnel_of_sa(name) else {
            match event {
                SaEvent::SoftExpired(_) => self.counters.soft_expired += 1,
                SaEvent::HardExpired(_) => {
                    self.counters.hard_expired += 1;
                    tracing::warn!(
                        sa = name,
                        "hard lifetime reached: its packets now drop as sa_expired"
                    );
                }
            }
            return;
        };
        let tunnel = &mut self.tunnels[index];
        match event {
            SaEvent::SoftExpired(_) => {
                self.counters.soft_expired += 1;
                // Every worker's copy reports it; act once.
                if !tunnel.soft_seen.insert(name.to_owned()) {
                    return;
                }
                let current = tunnel.current(SaDirection::Outbound) == name
                    || tunnel.current(SaDirection::Inbound) == name;
                if !current {
                    // Being replaced, or not yet switched to: see rekey_if_pending.
                } else if tunnel.secrets.is_none() {
                    if tunnel.note.is_none() {
                        tunnel.note = Some("soft lifetime reached; no `secret`, so no rekey".into());
                        tracing::warn!(tunnel = %tunnel.config.name, sa = name, "soft lifetime reached, but the tunnel has no `secret` to rekey with; it stops at the hard lifetime");
                    }
                } else if matches!(tunnel.phase, Phase::Established) && tunnel.retry_at.is_none() {
                    self.start_rekey(now, index);
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
                    self.command(SaCommand::RemoveSa(old));
                } else if tunnel.retiring.iter().all(|(n, _)| n != name)
                    && !tunnel.note.as_deref().is_some_and(|n| n.contains(name))
                {
                    // Every worker's copy reports it; say it once.
                    let expired = format!("{name} reached its hard lifetime; its packets drop as sa_expired");
                    tunnel.note = Some(match tunnel.note.take() {
                        Some(earlier) => format!("{earlier}; then {expired}"),
                        None => expired,
                    });
                    tracing::warn!(tunnel = %tunnel.config.name, sa = name, "hard lifetime reached without a rekey: packets drop as sa_expired");
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

    fn start_rekey(&mut self, now: Duration, index: usize) {
        let spi = self.fresh_spi();
        let nonce = self.nonce();
        let settings = self.config.rekey;
        let tunnel = &mut self.tunnels[index];
        let Some(secrets) = &tunnel.secrets else { return };
        let id = tunnel.next_message_id;
        tunnel.next_message_id = tunnel.next_message_id.wrapping_add(1);
        let wire = Message {
            kind: Kind::Rekey,
            response: false,
            from_initiator: true,
            message_id: id,
            tunnel: tunnel.config.name.clone(),
            generation: tunnel.generation + 1,
            spi,
            nonce,
        }
        .seal(&secrets.sk_a);
        tunnel.phase = Phase::Requested {
            id,
            nonce,
            spi,
            wire: wire.clone(),
            attempts: 0,
            next_send: now + settings.retransmit,
        };
        tunnel.retry_at = None;
        tracing::info!(tunnel = %tunnel.config.name, generation = tunnel.generation + 1, "rekey started");
        let to = index;
        self.counters.rekeys_started += 1;
        self.send(to, wire);
    }

    /// A control datagram the gateway delivered: the whole IPv4 packet.
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
        let name = match peek_tunnel(payload) {
            Ok(name) => name,
            Err(e) => return self.count_refusal(e),
        };
        let Some(index) = self
            .tunnels
            .iter()
            .position(|t| t.config.name == name && t.secrets.is_some())
        else {
            self.counters.unknown_tunnel += 1;
            return;
        };
        let tunnel = &self.tunnels[index];
        // A tunnel takes its messages on its own ports only. Behind a NAT
        // the peer's address may change: its messages are authenticated,
        // so any source will do, and the latest one is where we answer.
        let expected_port = tunnel.config.encap.map_or(CONTROL_PORT, |e| e.local_port);
        let from_anywhere = tunnel.config.encap.is_some();
        if dst_port != expected_port
            || IpAddr::V4(dst) != tunnel.config.local
            || (!from_anywhere && IpAddr::V4(src) != tunnel.config.remote)
        {
            self.counters.wrong_peer += 1;
            return;
        }
        let Some(secrets) = &tunnel.secrets else { return };
        let message = match Message::open(payload, &secrets.sk_a) {
            Ok(m) => m,
            Err(e) => return self.count_refusal(e),
        };
        if message.response == message.from_initiator {
            // A request comes from the exchange's initiator, a response from its responder.
            self.counters.malformed += 1;
            return;
        }
        // Only a message that is not a replay may say where the peer is:
        // a request no older than the last, or the response to our latest.
        let tunnel = &mut self.tunnels[index];
        let fresh = match message.response {
            false => tunnel
                .peer_request
                .as_ref()
                .is_none_or(|(last, _)| message.message_id >= *last),
            true => message.message_id.wrapping_add(1) == tunnel.next_message_id,
        };
        if from_anywhere && fresh {
            tunnel.peer_at = Some((src, src_port));
        }
        if message.response {
            self.handle_response(now, index, &message);
        } else {
            self.handle_request(now, index, &message);
        }
    }

    fn count_refusal(&mut self, e: MessageError) {
        match e {
            MessageError::Truncated(_) | MessageError::BadLength => self.counters.truncated += 1,
            MessageError::Foreign | MessageError::Malformed => self.counters.malformed += 1,
            MessageError::Forged => self.counters.forged += 1,
        }
    }

    fn handle_request(&mut self, now: Duration, index: usize, message: &Message) {
        let tunnel = &self.tunnels[index];
        match &tunnel.peer_request {
            Some((last, _)) if message.message_id < *last => {
                self.counters.replayed += 1;
                return;
            }
            Some((last, answer)) if message.message_id == *last => {
                // The peer did not hear our answer: repeat it, do nothing again.
                self.counters.duplicates += 1;
                if let Some(answer) = answer.clone() {
                    let to = index;
                    self.send(to, answer);
                }
                return;
            }
            _ => {}
        }
        match message.kind {
            Kind::Rekey => self.answer_rekey(now, index, message),
            Kind::Switched => self.answer_switched(now, index, message),
        }
    }

    fn answer_rekey(&mut self, now: Duration, index: usize, message: &Message) {
        let tunnel = &mut self.tunnels[index];
        // A rekey for the generation after the one we answered proves the
        // initiator finished that one: finish it here too.
        if let Phase::Responded { generation } = tunnel.phase {
            if message.generation == generation + 1 {
                self.switch_responder(now, index);
            }
        }
        // Likewise a rekey for the generation after ours proves the
        // responder switched, even if its acknowledgement is still on the way.
        let tunnel = &mut self.tunnels[index];
        if matches!(tunnel.phase, Phase::Confirming { .. }) && message.generation == tunnel.generation + 1 {
            self.finish_initiator(now, index);
        }
        let tunnel = &mut self.tunnels[index];
        if message.generation != tunnel.generation + 1 {
            // Not recorded as seen: a retransmission may fit later.
            self.counters.out_of_step += 1;
            return;
        }
        match &tunnel.phase {
            Phase::Established => {}
            Phase::Requested { spi, .. } => {
                self.counters.collisions += 1;
                // Both asked at once: the higher address's exchange goes on.
                // For IPv4 ends, the order of their 32-bit values.
                if tunnel.config.local > tunnel.config.remote {
                    // The peer drops its request when it sees ours.
                    tunnel.peer_request = Some((message.message_id, None));
                    return;
                }
                let spi = *spi;
                tunnel.phase = Phase::Established;
                self.reserved.remove(&spi);
            }
            Phase::Confirming { .. } | Phase::Responded { .. } => {
                self.counters.out_of_step += 1;
                return;
            }
        }
        let spi = self.fresh_spi();
        let nonce = self.nonce();
        let tunnel = &mut self.tunnels[index];
        let Some(secrets) = &tunnel.secrets else { return };
        let generation = message.generation;
        let keys = secrets.rekey(tunnel.config.algorithm, &message.nonce, &nonce);
        let inbound = self.sa_config(index, SaDirection::Inbound, generation, spi, keys.first_to_second);
        let outbound = self.sa_config(
            index,
            SaDirection::Outbound,
            generation,
            message.spi,
            keys.second_to_first,
        );
        let tunnel = &mut self.tunnels[index];
        let Some(secrets) = &tunnel.secrets else { return };
        let answer = Message {
            kind: Kind::Rekey,
            response: true,
            from_initiator: false,
            message_id: message.message_id,
            tunnel: tunnel.config.name.clone(),
            generation,
            spi,
            nonce,
        }
        .seal(&secrets.sk_a);
        tunnel.peer_request = Some((message.message_id, Some(answer.clone())));
        tunnel.phase = Phase::Responded { generation };
        let to = index;
        tracing::info!(tunnel = %tunnel.config.name, generation, "rekey answered; new SAs installed");
        self.command(SaCommand::InstallSa(Box::new(inbound)));
        self.command(SaCommand::InstallSa(Box::new(outbound)));
        self.send(to, answer);
    }

    fn answer_switched(&mut self, now: Duration, index: usize, message: &Message) {
        let tunnel = &self.tunnels[index];
        let Phase::Responded { generation } = tunnel.phase else {
            self.counters.out_of_step += 1;
            return;
        };
        if message.generation != generation {
            self.counters.out_of_step += 1;
            return;
        }
        self.switch_responder(now, index);
        let tunnel = &mut self.tunnels[index];
        let Some(secrets) = &tunnel.secrets else { return };
        let answer = Message {
            kind: Kind::Switched,
            response: true,
            from_initiator: false,
            message_id: message.message_id,
            tunnel: tunnel.config.name.clone(),
            generation,
            spi: 0,
            nonce: [0; NONCE_LEN],
        }
        .seal(&secrets.sk_a);
        tunnel.peer_request = Some((message.message_id, Some(answer.clone())));
        let to = index;
        self.send(to, answer);
    }

    /// The responder moves its traffic to the generation it answered for.
    fn switch_responder(&mut self, now: Duration, index: usize) {
        let grace = self.config.rekey.grace;
        let tunnel = &mut self.tunnels[index];
        let Phase::Responded { generation } = tunnel.phase else {
            return;
        };
        let (old_out, old_in) = (
            tunnel.current(SaDirection::Outbound),
            tunnel.current(SaDirection::Inbound),
        );
        tunnel.generation = generation;
        tunnel.phase = Phase::Established;
        tunnel.rekeys += 1;
        tunnel.last_rekey = Some(now);
        tunnel.note = None;
        tunnel.retiring.push((old_out, Some(now + grace)));
        tunnel.retiring.push((old_in, Some(now + grace)));
        let repoints = tunnel.repoints();
        tracing::info!(tunnel = %tunnel.config.name, generation, "rekey complete (responder)");
        self.counters.rekeys_completed += 1;
        for repoint in repoints {
            self.command(repoint);
        }
        self.rekey_if_pending(now, index);
    }

    /// Starts the rekey a soft expiry asked for during the last exchange.
    fn rekey_if_pending(&mut self, now: Duration, index: usize) {
        let tunnel = &mut self.tunnels[index];
        let due = tunnel.soft_seen.contains(&tunnel.current(SaDirection::Outbound))
            || tunnel.soft_seen.contains(&tunnel.current(SaDirection::Inbound));
        if due && matches!(tunnel.phase, Phase::Established) && tunnel.secrets.is_some() {
            self.start_rekey(now, index);
        }
    }

    fn handle_response(&mut self, now: Duration, index: usize, message: &Message) {
        let grace = self.config.rekey.grace;
        let settings = self.config.rekey;
        let tunnel = &mut self.tunnels[index];
        match (&tunnel.phase, message.kind) {
            (Phase::Requested { id, nonce, spi, .. }, Kind::Rekey) if *id == message.message_id => {
                let generation = tunnel.generation + 1;
                if message.generation != generation {
                    self.counters.out_of_step += 1;
                    return;
                }
                let (our_nonce, our_spi) = (*nonce, *spi);
                let Some(secrets) = &tunnel.secrets else { return };
                let keys = secrets.rekey(tunnel.config.algorithm, &our_nonce, &message.nonce);
                let inbound = self.sa_config(
                    index,
                    SaDirection::Inbound,
                    generation,
                    our_spi,
                    keys.second_to_first,
                );
                let outbound = self.sa_config(
                    index,
                    SaDirection::Outbound,
                    generation,
                    message.spi,
                    keys.first_to_second,
                );
                let tunnel = &mut self.tunnels[index];
                let (old_out, old_in) = (
                    tunnel.current(SaDirection::Outbound),
                    tunnel.current(SaDirection::Inbound),
                );
                tunnel.generation = generation;
                let Some(secrets) = &tunnel.secrets else { return };
                let id = tunnel.next_message_id;
                tunnel.next_message_id = tunnel.next_message_id.wrapping_add(1);
                let wire = Message {
                    kind: Kind::Switched,
                    response: false,
                    from_initiator: true,
                    message_id: id,
                    tunnel: tunnel.config.name.clone(),
                    generation,
                    spi: 0,
                    nonce: [0; NONCE_LEN],
                }
                .seal(&secrets.sk_a);
                tunnel.phase = Phase::Confirming {
                    id,
                    wire: wire.clone(),
                    attempts: 0,
                    next_send: now + settings.retransmit,
                    old_in,
                };
                // Nothing more leaves on the old outbound SA once repointed.
                tunnel.retiring.push((old_out, Some(now + grace)));
                let repoints = tunnel.repoints();
                let to = index;
                self.command(SaCommand::InstallSa(Box::new(inbound)));
                self.command(SaCommand::InstallSa(Box::new(outbound)));
                for repoint in repoints {
                    self.command(repoint);
                }
                self.send(to, wire);
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
        let Phase::Confirming { old_in, .. } = &tunnel.phase else {
            return;
        };
        let old_in = old_in.clone();
        tunnel.retiring.push((old_in, Some(now + grace)));
        tunnel.phase = Phase::Established;
        tunnel.rekeys += 1;
        tunnel.last_rekey = Some(now);
        tunnel.note = None;
        tracing::info!(tunnel = %tunnel.config.name, generation = tunnel.generation, "rekey complete (initiator)");
        self.counters.rekeys_completed += 1;
        self.rekey_if_pending(now, index);
    }

    /// The SA of `direction` of a tunnel's generation.
    fn sa_config(
        &self,
        index: usize,
        direction: SaDirection,
        generation: u32,
        spi: u32,
        keys: crate::prf::SaKeys,
    ) -> SaConfig {
        let t = &self.tunnels[index].config;
        let selectors = match direction {
            SaDirection::Inbound => self.config.inbound_selectors(&t.sa_name(SaDirection::Inbound, 0)),
            SaDirection::Outbound => Vec::new(),
        };
        SaConfig {
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
            enc_key: keys.enc,
            auth_key: keys.auth,
            initial_seq: 0,
            admits_any: false,
            keys: crate::config::KeySource::Exchange,
            ledger_mark: None,
        }
    }

    /// Retransmits, gives up, retries and deletes retired SAs as time passes.
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
            let mut resend = None;
            let mut gave_up = false;
            match &mut tunnel.phase {
                Phase::Requested {
                    wire,
                    attempts,
                    next_send,
                    ..
                }
                | Phase::Confirming {
                    wire,
                    attempts,
                    next_send,
                    ..
                } if *next_send <= now => {
                    if *attempts >= settings.retries {
                        gave_up = true;
                    } else {
                        *attempts += 1;
                        *next_send = now + settings.retransmit * (1 << (*attempts).min(16));
                        resend = Some(wire.clone());
                    }
                }
                _ => {}
            }
            if gave_up {
                self.give_up(now, index);
            }
            let tunnel = &mut self.tunnels[index];
            let retry =
                matches!(tunnel.phase, Phase::Established) && tunnel.retry_at.is_some_and(|at| at <= now);
            for name in due {
                self.command(SaCommand::RemoveSa(name));
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

    fn give_up(&mut self, now: Duration, index: usize) {
        let settings = self.config.rekey;
        self.counters.gave_up += 1;
        let tunnel = &mut self.tunnels[index];
        let why = match std::mem::replace(&mut tunnel.phase, Phase::Established) {
            Phase::Requested { spi, .. } => {
                self.reserved.remove(&spi);
                tunnel.retry_at = Some(now + settings.retry_after);
                "the peer never answered the rekey request; the current SAs stay until their hard lifetime"
            }
            Phase::Confirming { old_in, .. } => {
                // The peer may still send on the old SA: keep it to its end.
                tunnel.retiring.push((old_in, None));
                "the peer never confirmed the switch; the old inbound SA stays until its hard lifetime"
            }
            Phase::Established | Phase::Responded { .. } => return,
        };
        tunnel.note = Some(why.into());
        tracing::warn!(
            tunnel = %tunnel.config.name,
            peer = %tunnel.config.remote,
            tries = settings.retries + 1,
            "{why}"
        );
    }

    /// Takes `new` in place of the running configuration: tunnels added
    /// start, removed ones stop, changed ones restart, unchanged ones keep
    /// their SAs, counters and rekey state. Parts that cannot change while
    /// running (interfaces, routes, engine) are refused.
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
        let policy_differs = |p: &PolicyConfig, other: &Config| {
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
        let policy_new: Vec<PolicyConfig> = new
            .policies
            .iter()
            .filter(|p| !owned(&new, &p.name) && policy_differs(p, old))
            .cloned()
            .collect();
        report.manual_changes =
            sa_gone.len() + sa_new.len() + reselected.len() + policy_gone.len() + policy_new.len();

        // Stop: policies first (traffic then meets the default discard
        // rather than a missing SA), then every SA the tunnel may have.
        for name in &stopping {
            let Some(index) = self.tunnels.iter().position(|t| &t.config.name == name) else {
                continue;
            };
            let tunnel = self.tunnels.remove(index);
            for direction in [PolicyDirection::Out, PolicyDirection::In] {
                self.command(SaCommand::RemovePolicy(tunnel.config.policy_name(direction)));
            }
            if let Phase::Requested { spi, .. } = tunnel.phase {
                self.reserved.remove(&spi);
            }
            for sa in tunnel.all_sas() {
                self.command(SaCommand::RemoveSa(sa));
            }
        }
        for name in policy_gone {
            self.command(SaCommand::RemovePolicy(name));
        }
        for name in sa_gone {
            self.command(SaCommand::RemoveSa(name));
        }
        for (sa, selectors) in reselected {
            self.command(SaCommand::SetSelectors { sa, selectors });
        }
        // Start: SAs, then the policies that name them.
        self.config = new;
        let mut sas: Vec<SaConfig> = sa_new;
        let mut policies: Vec<PolicyConfig> = Vec::new();
        for t in &starting {
            for direction in [SaDirection::Outbound, SaDirection::Inbound] {
                if let Some(sa) = self.config.sa(&t.sa_name(direction, 0)) {
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
            self.command(SaCommand::InstallSa(Box::new(sa)));
        }
        for p in policies {
            self.command(SaCommand::InsertPolicy(p));
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
        self.counters.reloads += 1;
        Ok(report)
    }

    /// Runs the plane beside one gateway (a single worker, or a test):
    /// feeds it the gateway's lifetime events and `received` control
    /// datagrams, applies its commands, and returns what to send, in
    /// order. Several workers need [`ControlPlane::take_commands`] and the
    /// ordering rule of [`Datagram::after_commands`] instead.
    pub fn service<'a>(
        &mut self,
        now: Duration,
        gateway: &mut Gateway,
        received: impl IntoIterator<Item = &'a [u8]>,
    ) -> Vec<Datagram> {
        self.follow_peers(gateway);
        while let Some(event) = gateway.poll_event() {
            let id = match event {
                SaEvent::SoftExpired(id) | SaEvent::HardExpired(id) => id,
            };
            if let Some(name) = gateway.sad().get(id).map(|sa| sa.name().to_owned()) {
                self.handle_sa_event(now, &name, event);
            }
        }
        for packet in received {
            self.handle_datagram(now, packet);
        }
        self.handle_timeout(now);
        let mut commands = Vec::new();
        self.take_commands(&mut commands);
        for command in &commands {
            if let Err(e) = command.apply(gateway, now) {
                tracing::error!("control plane: {e}");
            }
        }
        let mut datagrams = Vec::new();
        self.take_datagrams(&mut datagrams);
        datagrams
    }
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
