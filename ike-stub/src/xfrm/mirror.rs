//! The mirror: XFRM's SAD and SPD as espgw holds them, and the commands
//! that keep every worker's gateway in step.
//!
//! Owns what is mirrored (SAs by destination and SPI, policies by
//! direction and index), the rules of make-before-break and of holding,
//! the sweep after a dump, and the counters. Sans-IO: fed datagrams and
//! the time, it queues [`SaCommand`]s; it never reads a socket or touches
//! a gateway.
//!
//! - An outbound SA is installed at once; the outbound policies whose
//!   template it satisfies move to it (the newest SA of a template wins,
//!   as the kernel's lookup picks it), so a rekey's new SA carries traffic
//!   before the old one is deleted.
//! - An inbound SA is installed once an inbound policy names it (by reqid,
//!   or by addresses for a template without one): espgw's inbound SAs
//!   admit only what their policies select. Until then it is held, with
//!   its keys in wiped memory.
//! - A `protect` policy whose SA has not arrived discards (held, counted)
//!   until it does; never bypasses.
//! - A refused SA or policy is logged once with what was refused and
//!   counted by reason; the policies that would use the SA stay held, so
//!   its traffic is dropped.
//! - After an overrun the driver dumps afresh: what the dump does not show
//!   is removed, what it shows unchanged is left alone (its sequence
//!   numbers and replay window go on).
//! - A dump's replies are reconciled once, at its end (or when the driver
//!   gives it up); notifications one datagram at a time.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use accel::Algorithm;
use hmac::{Hmac, KeyInit, Mac};
use netlink_packet_xfrm::{UserSaInfo, XfrmAttrs, XfrmMessage};
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;
use sha2::Sha256;
use spd_sad::{Mode, PolicyDirection, SaDirection, SaParams, Selector};
use zeroize::Zeroizing;

use super::decode::{decode_datagram, Decoded};
use super::policy::{self, PolicyKey, Template, TranslatedPolicy, Verdict};
use super::sa::{self, Classified, SaKey, IPPROTO_ESP};
use super::{feedback, Refusal, Refused};
use crate::removal::{Issued, Removal, RemovalNote};
use dataplane::command::{KeySource, PolicyAction, PolicySetup, SaCommand, SaSetup};

/// What the mirror must know about the gateway it keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorSettings {
    /// The outside interface's addresses: a state to one of them is
    /// inbound, a state from one of them outbound.
    pub local_addresses: Vec<IpAddr>,
    /// Whether a state directory keeps the sequence numbers of mirrored
    /// SAs across restarts. Without one, an outbound SA that already
    /// existed when espgw started is refused: an earlier run may have sent
    /// under its key, and starting its counter again would repeat
    /// (key, sequence number) pairs (an AEAD's nonce).
    pub durable_sequences: bool,
}

/// Which table a dump walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DumpKind {
    /// The SAD: every XFRM state.
    Sa,
    /// The SPD: every XFRM policy.
    Policy,
}

/// The mirror's counters (`espgw stats` → `xfrm`, which its readers
/// parse back into this type).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MirrorCounters {
    /// Netlink messages read.
    pub messages: u64,
    /// Messages that could not be read (counted, skipped).
    pub malformed: u64,
    /// Messages of types the mirror does not act on (ACQUIRE, NEWAE, ...).
    pub ignored: u64,
    /// SAs in the gateways now.
    pub sas_mirrored: u64,
    /// Inbound SAs waiting for a policy to give them selectors.
    pub sas_held: u64,
    /// SAs installed in the gateways (an inbound one once a policy gave
    /// it selectors).
    pub sas_installed: u64,
    /// SAs changed in place (`XFRM_MSG_UPDSA`), keeping their counters.
    pub sas_replaced: u64,
    /// SAs removed because the kernel's state is gone (deleted, expired,
    /// flushed).
    pub sas_removed: u64,
    /// Of those, the ones a rekey had replaced: their keys are gone for
    /// good, and so are their sequence ledger entries.
    pub sas_superseded: u64,
    /// Inbound SAs taken out because no policy names them any more.
    pub sas_retired: u64,
    /// States refused (once each, unless the reason changes); by reason
    /// in `refused`.
    pub sas_refused: u64,
    /// Larval states (an SPI allocated for an exchange, no keys).
    pub larval: u64,
    /// Soft expiry notifications (the daemon rekeys; nothing to do here).
    pub soft_expired: u64,
    /// Hard expiry notifications: the kernel deleted the state.
    pub hard_expired: u64,
    /// Policies in the gateways now.
    pub policies_mirrored: u64,
    /// `protect` policies discarding now because their SA is missing.
    pub policies_held: u64,
    /// Times a policy had to wait for its SA.
    pub policies_held_total: u64,
    /// Policies inserted into the gateways' SPD.
    pub policies_installed: u64,
    /// Policies removed from it because the kernel's is gone.
    pub policies_removed: u64,
    /// Times a policy was refused (it discards instead); by reason in
    /// `refused`.
    pub policies_refused: u64,
    /// Refusals (SAs and policies) by reason.
    pub refused: BTreeMap<String, u64>,
    /// Dumps completed.
    pub dumps: u64,
    /// Times the socket overran (notifications were lost) and both tables
    /// were dumped afresh.
    pub resyncs: u64,
    /// Dumps the kernel answered with an error.
    pub dump_errors: u64,
    /// Commands the gateway could not apply (the SA's traffic is dropped).
    pub apply_failed: u64,
    /// What espgw told the kernel (see [`feedback`]):
    /// SAs' counters (`XFRM_MSG_NEWAE`).
    pub newae_sent: u64,
    /// Byte or packet limits passed in espgw (`XFRM_MSG_EXPIRE`).
    pub expire_sent: u64,
    /// On-demand requests (`XFRM_MSG_ACQUIRE`): a packet met a policy
    /// whose SA is missing.
    pub acquire_sent: u64,
    /// Of those, the ones the kernel answered with an error (an SA gone
    /// meanwhile, or the privilege to ask missing).
    pub feedback_failed: u64,
}

/// A mirrored SA as `espgw sa list` shows its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MirroredSaStatus {
    /// Its name in the gateways: `xfrm-r{reqid}-{in|out}-{spi}`.
    pub name: String,
    /// The request id the kernel's state and its policies share.
    pub reqid: u32,
    /// Its SPI.
    pub spi: u32,
    /// in or out.
    pub direction: &'static str,
    /// installed, held (inbound, no policy yet) or retired.
    pub state: &'static str,
}

/// A mirrored policy as `espgw xfrm show` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MirroredPolicyStatus {
    /// Its name in the gateways: `xfrm-{in|out|fwd}-{index}`, after the
    /// kernel's direction and policy index.
    pub name: String,
    /// espgw's direction, `in` or `out` (the kernel's `fwd` is `in`).
    pub direction: &'static str,
    /// The kernel's priority; lower is consulted first.
    pub priority: u32,
    /// What it selects: addresses, protocol and ports.
    pub selector: String,
    /// What the gateways' SPD holds: `protect NAME`, `bypass`, `discard`.
    pub action: String,
    /// A `protect` policy discarding until its SA arrives.
    pub held: bool,
    /// Why it discards instead of doing what it says, if it was refused.
    pub refused: Option<String>,
}

/// What tells two versions of a state apart without keeping its keys: its
/// parameters and a keyed hash of its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    params: SaParams,
    algorithm: Algorithm,
    keys: [u8; 32],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SaState {
    /// Inbound, waiting for selectors: its keys are here until then.
    Held,
    Installed,
    /// Inbound, no policy names it any more: removed from the gateways,
    /// its keys gone; a policy naming it again finds nothing.
    Retired,
}

struct MirroredSa {
    name: String,
    reqid: u32,
    spi: u32,
    direction: SaDirection,
    mode: Mode,
    saddr: IpAddr,
    daddr: IpAddr,
    /// (seconds since the epoch the kernel added it, arrival here): the
    /// newest SA of a template is the one its policies use.
    age: (u64, u64),
    shape: Shape,
    state: SaState,
    held: Option<Box<SaSetup>>,
    /// What it admits in the gateways now (inbound).
    selectors: Vec<Selector>,
    /// The dump generation that last showed it.
    seen: u64,
    /// The bytes and packets last told to the kernel.
    reported: (u64, u64),
    /// Whether the kernel was told of its soft and hard volume limits.
    expire_told: [bool; 2],
}

impl MirroredSa {
    fn kernel(&self) -> feedback::KernelSa {
        feedback::KernelSa {
            daddr: self.daddr,
            saddr: self.saddr,
            spi: self.spi,
            reqid: self.reqid,
        }
    }

    fn satisfies(&self, t: &Template) -> bool {
        t.mode == self.mode
            && (t.reqid == 0 || t.reqid == self.reqid)
            && t.spi.is_none_or(|spi| spi == self.spi)
            && t.daddr.is_none_or(|a| a == self.daddr)
            && t.saddr.is_none_or(|a| a == self.saddr)
    }
}

struct MirroredPolicy {
    translated: TranslatedPolicy,
    /// What the gateways' SPD holds for it, once inserted.
    in_spd: Option<PolicyAction>,
    /// Its SA was replaced under the same name (a new id in the SAD): the
    /// SPD's entry must be pointed again, whatever it says.
    repoint: bool,
    seen: u64,
    /// When an ACQUIRE for it was last sent.
    acquired: Option<Duration>,
}

/// A refused state, remembered so that a dump showing it again is not
/// counted again.
struct RefusedSa {
    reason: Refusal,
    seen: u64,
}

/// The XFRM mirror (see the module's documentation).
pub struct XfrmMirror {
    settings: MirrorSettings,
    sas: BTreeMap<SaKey, MirroredSa>,
    refused_sas: BTreeMap<SaKey, RefusedSa>,
    policies: BTreeMap<PolicyKey, MirroredPolicy>,
    /// Policies refused outright (no selector espgw can hold at all).
    refused_policies: BTreeMap<PolicyKey, (Refusal, u64)>,
    /// SAs to take out once the policies using them have moved, and why.
    doomed: Vec<(String, Removal)>,
    /// Removed SAs that a rekey had replaced: see [`Self::take_superseded`].
    superseded: Vec<String>,
    commands: Issued,
    counters: MirrorCounters,
    /// The dump in progress, with its generation.
    dump: Option<(DumpKind, u64)>,
    generation: u64,
    /// Until the first SA dump is done, states are ones that existed
    /// before this start.
    first_sa_dump_done: bool,
    arrivals: u64,
    fingerprint_key: Zeroizing<[u8; 32]>,
}

impl XfrmMirror {
    /// An empty mirror for a gateway with `settings`; it learns the
    /// tables from the dumps the driver asks for.
    pub fn new(settings: MirrorSettings) -> XfrmMirror {
        let mut rng: StdRng = rand::make_rng();
        let mut key = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(&mut key[..]);
        XfrmMirror {
            settings,
            sas: BTreeMap::new(),
            refused_sas: BTreeMap::new(),
            policies: BTreeMap::new(),
            refused_policies: BTreeMap::new(),
            doomed: Vec::new(),
            superseded: Vec::new(),
            commands: Issued::default(),
            counters: MirrorCounters::default(),
            dump: None,
            generation: 0,
            first_sa_dump_done: false,
            arrivals: 0,
            fingerprint_key: key,
        }
    }

    /// The mirror's counters so far.
    pub fn counters(&self) -> &MirrorCounters {
        &self.counters
    }

    /// Moves the commands queued so far to `into`, in order.
    pub fn take_commands(&mut self, into: &mut Vec<SaCommand>) {
        self.commands.take(into);
    }

    /// [`take_commands`](Self::take_commands), each SA removal with why
    /// (for its `sa_removed` line).
    pub fn take_noted_commands(&mut self, into: &mut Vec<(SaCommand, Option<RemovalNote>)>) {
        self.commands.take_noted(into);
    }

    /// Every mirrored SA (refused ones are not SAs of the gateway).
    pub fn sas(&self) -> Vec<MirroredSaStatus> {
        self.sas
            .iter()
            .map(|(key, sa)| MirroredSaStatus {
                name: sa.name.clone(),
                reqid: sa.reqid,
                spi: key.spi,
                direction: sa.direction.into(),
                state: match sa.state {
                    SaState::Held => "held",
                    SaState::Installed => "installed",
                    SaState::Retired => "retired",
                },
            })
            .collect()
    }

    /// Every mirrored policy, with what the gateways hold for it.
    pub fn policies(&self) -> Vec<MirroredPolicyStatus> {
        self.policies
            .iter()
            .map(|(key, p)| {
                let t = &p.translated;
                let action = match &p.in_spd {
                    Some(PolicyAction::Protect(sa)) => format!("protect {sa}"),
                    Some(PolicyAction::Bypass) => "bypass".into(),
                    Some(PolicyAction::Discard) | None => "discard".into(),
                };
                MirroredPolicyStatus {
                    name: key.name(),
                    direction: t.direction.into(),
                    priority: t.priority,
                    selector: format!(
                        "{} -> {} proto {} ports {} -> {}",
                        t.selector.src,
                        t.selector.dst,
                        t.selector.protocol,
                        t.selector.src_ports,
                        t.selector.dst_ports
                    ),
                    held: matches!(t.verdict, Verdict::Protect(_))
                        && !matches!(p.in_spd, Some(PolicyAction::Protect(_))),
                    action,
                    refused: t.refused.as_ref().map(ToString::to_string),
                }
            })
            .collect()
    }

    /// The reqid of the mirrored SA called `name`, if there is one.
    pub fn reqid_of(&self, name: &str) -> Option<u32> {
        self.sas.values().find(|s| s.name == name).map(|s| s.reqid)
    }

    /// The driver is about to ask for a dump of `kind`; what the dump does
    /// not show is removed when it ends ([`Decoded::Done`]).
    pub fn begin_dump(&mut self, kind: DumpKind) {
        self.generation += 1;
        self.dump = Some((kind, self.generation));
    }

    /// The driver gave the dump in progress up (no answer, a read
    /// error): nothing is swept, and what it brought is reconciled.
    pub fn abandon_dump(&mut self) {
        if self.dump.take().is_some() {
            self.counters.dump_errors += 1;
            tracing::error!("xfrm: a dump was given up; nothing is removed until one completes");
            self.reconcile();
        }
    }

    /// The socket overran (`ENOBUFS`): notifications were lost, and the
    /// driver dumps both tables afresh.
    pub fn note_overrun(&mut self) {
        self.counters.resyncs += 1;
    }

    /// A command of this mirror's that a gateway refused: its SA is not
    /// there, and the policies naming it discard (`resolve_action`).
    pub fn note_apply_failed(&mut self, command: &SaCommand, error: &dyn std::fmt::Display) {
        self.counters.apply_failed += 1;
        crate::plane::log_refused(command, error);
    }

    /// Reads one datagram from the socket (any number of messages).
    pub fn handle_datagram(&mut self, now: Duration, datagram: &[u8]) {
        for item in decode_datagram(datagram) {
            self.counters.messages += 1;
            match item {
                Ok(decoded) => self.handle_decoded(now, decoded),
                Err(issue) => {
                    self.counters.malformed += 1;
                    tracing::warn!("xfrm: unreadable netlink message: {issue}");
                }
            }
        }
        // A dump's replies are reconciled once, at its end: a large SAD
        // comes in many datagrams, and reconciling walks every SA and
        // policy.
        if self.dump.is_none() {
            self.reconcile();
        }
    }

    /// One parsed message; the commands follow at the next
    /// [`Self::handle_datagram`] or [`Self::flush`]. `now` is not needed
    /// by the translation today (an SA's lifetime counts from when a
    /// gateway installs it, at the time the command is applied); it is
    /// taken so that the driver's clock is the only one, as elsewhere.
    pub fn handle_decoded(&mut self, _now: Duration, decoded: Decoded) {
        match decoded {
            Decoded::Xfrm(message) => self.handle_message(*message),
            Decoded::Done => self.end_dump(),
            Decoded::Error(0) | Decoded::Noop => {}
            Decoded::Error(code) => {
                if let Some((kind, _)) = self.dump.take() {
                    self.counters.dump_errors += 1;
                    tracing::error!(
                        "xfrm: the kernel refused the {kind:?} dump (error {code}); nothing is removed until one succeeds"
                    );
                }
            }
            Decoded::Other(_) => self.counters.ignored += 1,
        }
    }

    /// Queues the commands that bring the gateways in step after
    /// [`Self::handle_decoded`] calls.
    pub fn flush(&mut self) {
        self.reconcile();
    }

    fn handle_message(&mut self, message: XfrmMessage) {
        match message {
            XfrmMessage::AddSa(mut m) | XfrmMessage::UpdateSa(mut m) => {
                self.handle_state(&m.user_sa_info, &m.nlas);
                sa::wipe_keys(&mut m.nlas);
            }
            XfrmMessage::DeleteSa(mut m) => {
                // The kernel's notification carries the SA's algorithms,
                // keys included.
                sa::wipe_keys(&mut m.nlas);
                if m.user_sa_id.proto == IPPROTO_ESP {
                    if let Some(daddr) = sa::address(m.user_sa_id.family, &m.user_sa_id.daddr) {
                        self.forget_state(SaKey {
                            daddr,
                            spi: m.user_sa_id.spi,
                        });
                    }
                }
            }
            XfrmMessage::Expire(m) => {
                let hard = m.expire.hard != 0;
                if hard {
                    self.counters.hard_expired += 1;
                } else {
                    self.counters.soft_expired += 1;
                }
                let state = &m.expire.state;
                let key = sa::address(state.family, &state.id.daddr).map(|daddr| SaKey {
                    daddr,
                    spi: state.id.spi,
                });
                if state.id.proto == IPPROTO_ESP {
                    // The kernel's word, for a limit of time it counted or
                    // one of volume espgw told it of (`volume_expired`):
                    // the one line of the event.
                    let name = key.and_then(|k| self.sas.get(&k)).map(|s| s.name.clone());
                    let limit = if hard { "hard" } else { "soft" };
                    tracing::info!(
                        event = "sa_expired",
                        sa = name,
                        spi = %format_args!("{:#010x}", state.id.spi),
                        reqid = state.reqid,
                        limit,
                        "{limit} lifetime reached (the keying namespace's kernel): its daemon {}",
                        if hard { "deletes it" } else { "rekeys it" }
                    );
                }
                if let (true, Some(key)) = (hard, key) {
                    self.forget_state(key);
                }
            }
            XfrmMessage::FlushSa(m) => {
                // 0 and IPSEC_PROTO_ANY (255) flush every protocol.
                if matches!(m.protocol, 0 | IPPROTO_ESP | 255) {
                    let keys: Vec<SaKey> = self.sas.keys().copied().collect();
                    for key in keys {
                        self.forget_state(key);
                    }
                    self.refused_sas.clear();
                }
            }
            XfrmMessage::AddPolicy(m) | XfrmMessage::UpdatePolicy(m) => {
                self.handle_policy(&m.user_policy_info, &m.nlas);
            }
            XfrmMessage::DeletePolicy(m) => {
                // The notification carries the whole policy; a request
                // by selector alone names it by direction and selector.
                let info = m.nlas.iter().find_map(|a| match a {
                    XfrmAttrs::PolicyInfo(p) => Some(p),
                    _ => None,
                });
                let key = match info {
                    Some(p) => PolicyKey {
                        dir: p.direction,
                        index: p.index,
                    },
                    None => PolicyKey {
                        dir: m.user_policy_id.direction,
                        index: m.user_policy_id.index,
                    },
                };
                let key = if key.index == 0 {
                    self.find_policy_by_selector(&m.user_policy_id.selector, m.user_policy_id.direction)
                } else {
                    Some(key)
                };
                if let Some(key) = key {
                    self.forget_policy(key);
                }
            }
            XfrmMessage::FlushPolicy(_) => {
                let keys: Vec<PolicyKey> = self.policies.keys().copied().collect();
                for key in keys {
                    self.forget_policy(key);
                }
                self.refused_policies.clear();
            }
            _ => self.counters.ignored += 1,
        }
    }

    /// The mirrored policy of direction `dir` with this selector.
    fn find_policy_by_selector(&self, sel: &netlink_packet_xfrm::Selector, dir: u8) -> Option<PolicyKey> {
        let (selector, _) = policy::selector(sel).ok()?;
        self.policies
            .iter()
            .find(|(k, p)| k.dir == dir && p.translated.selector == selector)
            .map(|(k, _)| *k)
    }

    /// The generation of the dump in progress (or of the last one): what a
    /// message read now marks as seen.
    fn current_generation(&self) -> u64 {
        self.generation
    }

    fn refuse_sa(&mut self, key: SaKey, reqid: u32, refused: Refused) {
        let seen = self.current_generation();
        let already = self
            .refused_sas
            .insert(
                key,
                RefusedSa {
                    reason: refused.reason,
                    seen,
                },
            )
            .is_some_and(|r| r.reason == refused.reason);
        if !already {
            self.counters.sas_refused += 1;
            *self
                .counters
                .refused
                .entry(refused.reason.name().to_owned())
                .or_default() += 1;
            tracing::warn!(
                event = "sa_refused",
                spi = %format_args!("{:#010x}", key.spi),
                dst = %key.daddr,
                reqid,
                reason = refused.reason.name(),
                "xfrm: SA {key} (reqid {reqid}) refused, the traffic of its policies is dropped: {refused}"
            );
        }
    }

    fn handle_state(&mut self, info: &UserSaInfo, attrs: &[XfrmAttrs]) {
        let Some(daddr) = sa::address(info.family, &info.id.daddr) else {
            self.counters.malformed += 1;
            return;
        };
        let key = SaKey {
            daddr,
            spi: info.id.spi,
        };
        match sa::classify(info, attrs) {
            Err(refused) => {
                self.forget_state(key);
                self.refuse_sa(key, info.reqid, refused);
                return;
            }
            Ok(Classified::Larval) => {
                self.counters.larval += 1;
                return;
            }
            Ok(Classified::Keyed) => {}
        }
        // Another state's name (the same SPI to another address) makes
        // this one's longer; its own name is its own.
        let taken = self
            .sas
            .iter()
            .filter(|(k, _)| **k != key)
            .map(|(_, s)| s.name.clone())
            .collect::<Vec<_>>();
        let translated = sa::translate(
            info,
            attrs,
            &self.settings.local_addresses,
            |key, reqid, direction| {
                let base = format!("xfrm-r{reqid}-{direction}-{:08x}", key.spi);
                if taken.contains(&base) {
                    format!("{base}@{}", key.daddr)
                } else {
                    base
                }
            },
        );
        let translated = match translated {
            Ok(t) => t,
            Err(refused) => {
                self.forget_state(key);
                self.refuse_sa(key, info.reqid, refused);
                return;
            }
        };
        // A state whose ends changed over (its source is ours now, or no
        // longer) is another SA: the old one goes.
        if self
            .sas
            .get(&key)
            .is_some_and(|old| old.direction != translated.params.direction)
        {
            self.forget_state(key);
        }
        let exists = self.sas.contains_key(&key);
        if !exists
            && !self.first_sa_dump_done
            && !self.settings.durable_sequences
            && translated.params.direction == SaDirection::Outbound
        {
            self.refuse_sa(
                key,
                info.reqid,
                Refused::new(
                    Refusal::PreExisting,
                    "the outbound SA existed before espgw started and there is no state directory to tell which \
                     sequence numbers an earlier run sent under its key; rekey it (`swanctl --rekey`, \
                     `ipsec whack --rekey-child`) or give espgw a state directory",
                ),
            );
            return;
        }
        self.refused_sas.remove(&key);
        let seen = self.current_generation();
        let shape = Shape {
            params: translated.params.clone(),
            algorithm: translated.algorithm,
            keys: self.fingerprint(&translated),
        };
        let config = SaSetup {
            params: translated.params.clone(),
            algorithm: translated.algorithm,
            enc_key: accel::SecretBytes::new(&translated.enc_key),
            auth_key: accel::SecretBytes::new(&translated.auth_key),
            initial_seq: translated.initial_seq,
            key_source: KeySource::Xfrm {
                reqid: translated.reqid,
            },
            ledger_mark: None,
        };
        if let Some(old) = self.sas.get_mut(&key) {
            old.seen = seen;
            if old.shape == shape {
                return;
            }
            let same_keys = old.shape.keys == shape.keys
                && old.shape.algorithm == shape.algorithm
                && old.shape.params.direction == shape.params.direction
                && old.shape.params.esn == shape.params.esn;
            let old_name = old.name.clone();
            let mut config = config;
            // The name stays: policies point at it.
            config.params.name = old_name.clone();
            old.shape = Shape {
                params: config.params.clone(),
                ..shape
            };
            old.reqid = translated.reqid;
            old.mode = translated.params.mode;
            // The gateways' SA is a new one, with limits of its own.
            old.expire_told = [false; 2];
            old.saddr = translated.saddr;
            match old.state {
                SaState::Installed => {
                    // The gateways' SA is a new one (a new id): the
                    // policies pointing at the name are pointed again.
                    for p in self.policies.values_mut() {
                        if p.in_spd == Some(PolicyAction::Protect(old_name.clone())) {
                            p.repoint = true;
                        }
                    }
                    config.params.selectors = old.selectors.clone();
                    if same_keys {
                        // UPDSA: lifetimes, encapsulation ports; the
                        // counter and replay window go on.
                        self.counters.sas_replaced += 1;
                        self.commands.push(SaCommand::ReplaceSa {
                            old: old_name,
                            new: Box::new(config),
                        });
                    } else {
                        // The same SPI with other keys: a new SA.
                        self.counters.sas_installed += 1;
                        self.commands.remove_sa(old_name, Removal::XfrmReplaced, None);
                        self.commands.push(SaCommand::InstallSa(Box::new(config)));
                    }
                }
                SaState::Held | SaState::Retired => {
                    old.state = SaState::Held;
                    old.held = Some(Box::new(config));
                }
            }
            return;
        }
        self.arrivals += 1;
        let mut mirrored = MirroredSa {
            name: translated.params.name.clone(),
            reqid: translated.reqid,
            spi: key.spi,
            direction: translated.params.direction,
            mode: translated.params.mode,
            saddr: translated.saddr,
            daddr,
            age: (translated.added, self.arrivals),
            shape,
            state: SaState::Held,
            held: None,
            selectors: Vec::new(),
            seen,
            reported: (0, 0),
            expire_told: [false; 2],
        };
        match translated.params.direction {
            SaDirection::Outbound => {
                mirrored.state = SaState::Installed;
                self.counters.sas_installed += 1;
                self.commands.push(SaCommand::InstallSa(Box::new(config)));
            }
            // Installed by `reconcile` once a policy gives it selectors.
            SaDirection::Inbound => mirrored.held = Some(Box::new(config)),
        }
        self.sas.insert(key, mirrored);
    }

    /// A keyed hash of the SA's keys: tells a new key under an old SPI
    /// from a change of lifetime, without keeping the keys.
    fn fingerprint(&self, t: &sa::TranslatedSa) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.fingerprint_key[..])
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(t.algorithm.keyword().as_bytes());
        mac.update(&(t.enc_key.len() as u64).to_be_bytes());
        mac.update(&t.enc_key);
        mac.update(&t.auth_key);
        mac.finalize().into_bytes().into()
    }

    /// The state is gone from the kernel (deleted, expired, flushed).
    fn forget_state(&mut self, key: SaKey) {
        self.refused_sas.remove(&key);
        if let Some(sa) = self.sas.remove(&key) {
            self.counters.sas_removed += 1;
            if sa.state == SaState::Installed {
                // A rekey installs the new SA of a reqid and direction,
                // with new keys, before the daemon deletes the old one.
                let replaced = sa.reqid != 0
                    && self.sas.values().any(|o| {
                        o.reqid == sa.reqid
                            && o.direction == sa.direction
                            && o.state == SaState::Installed
                            && o.shape.keys != sa.shape.keys
                    });
                let why = if replaced {
                    self.counters.sas_superseded += 1;
                    self.superseded.push(sa.name.clone());
                    Removal::XfrmRekeyed
                } else {
                    Removal::XfrmDeleted
                };
                self.doomed.push((sa.name, why));
            }
        }
    }

    /// Moves to `into` the names of the SAs removed since the last call
    /// that a rekey had replaced (another SA of their reqid and direction,
    /// with other keys, was installed when the kernel deleted them): keys
    /// an IKE daemon never installs again, whose sequence ledger entries
    /// can go. An SA deleted with no successor (a teardown, or a manual
    /// `ip xfrm state delete`, whose keys may be added again) is not
    /// listed. Take them before applying the commands queued with them.
    pub fn take_superseded(&mut self, into: &mut Vec<String>) {
        into.append(&mut self.superseded);
    }

    fn handle_policy(&mut self, info: &netlink_packet_xfrm::UserPolicyInfo, attrs: &[XfrmAttrs]) {
        let key = PolicyKey {
            dir: info.direction,
            index: info.index,
        };
        let seen = self.current_generation();
        let translated = match policy::translate(info, attrs) {
            Ok(Some(t)) => t,
            Ok(None) => {
                self.counters.ignored += 1;
                return;
            }
            Err(refused) => {
                // A dump showing it again is not another refusal.
                let again = self
                    .refused_policies
                    .get(&key)
                    .is_some_and(|(r, _)| *r == refused.reason);
                self.forget_policy(key);
                self.refused_policies.insert(key, (refused.reason, seen));
                if !again {
                    self.count_policy_refusal(key, &refused, "nothing is installed for it");
                }
                return;
            }
        };
        self.refused_policies.remove(&key);
        if let Some(refused) = &translated.refused {
            let before = self
                .policies
                .get(&key)
                .and_then(|p| p.translated.refused.as_ref());
            if before.map(|r| r.reason) != Some(refused.reason) {
                let refused = refused.clone();
                self.count_policy_refusal(key, &refused, "it discards its traffic instead");
            }
        }
        match self.policies.get_mut(&key) {
            Some(old) if old.translated == translated => old.seen = seen,
            Some(old) => {
                let moved = old.translated.selector != translated.selector
                    || old.translated.priority != translated.priority
                    || old.translated.direction != translated.direction;
                if moved && old.in_spd.is_some() {
                    self.commands.push(SaCommand::RemovePolicy(key.name()));
                    old.in_spd = None;
                }
                old.translated = translated;
                old.seen = seen;
            }
            None => {
                self.policies.insert(
                    key,
                    MirroredPolicy {
                        translated,
                        in_spd: None,
                        repoint: false,
                        seen,
                        acquired: None,
                    },
                );
            }
        }
    }

    fn count_policy_refusal(&mut self, key: PolicyKey, refused: &Refused, what: &str) {
        self.counters.policies_refused += 1;
        *self
            .counters
            .refused
            .entry(refused.reason.name().to_owned())
            .or_default() += 1;
        tracing::warn!(
            event = "policy_refused",
            policy = %key.name(),
            reason = refused.reason.name(),
            "xfrm: policy {} refused, {what}: {refused}",
            key.name()
        );
    }

    fn forget_policy(&mut self, key: PolicyKey) {
        self.refused_policies.remove(&key);
        if let Some(p) = self.policies.remove(&key) {
            if p.in_spd.is_some() {
                self.counters.policies_removed += 1;
                self.commands.push(SaCommand::RemovePolicy(key.name()));
            }
        }
    }

    fn end_dump(&mut self) {
        let Some((kind, generation)) = self.dump.take() else {
            return;
        };
        self.counters.dumps += 1;
        match kind {
            DumpKind::Sa => {
                let gone: Vec<SaKey> = self
                    .sas
                    .iter()
                    .filter(|(_, s)| s.seen < generation)
                    .map(|(k, _)| *k)
                    .collect();
                for key in gone {
                    self.forget_state(key);
                }
                self.refused_sas.retain(|_, r| r.seen >= generation);
                self.first_sa_dump_done = true;
            }
            DumpKind::Policy => {
                let gone: Vec<PolicyKey> = self
                    .policies
                    .iter()
                    .filter(|(_, p)| p.seen < generation)
                    .map(|(k, _)| *k)
                    .collect();
                for key in gone {
                    self.forget_policy(key);
                }
                self.refused_policies.retain(|_, (_, seen)| *seen >= generation);
            }
        }
    }

    /// The newest installed SA of `direction` satisfying `template`.
    fn sa_for(&self, direction: SaDirection, template: &Template) -> Option<&MirroredSa> {
        self.sas
            .values()
            .filter(|s| s.state == SaState::Installed && s.direction == direction && s.satisfies(template))
            .max_by_key(|s| s.age)
    }

    /// Brings the gateways in step: inbound SAs get the selectors of the
    /// policies naming them (held ones are installed), every policy points
    /// at its SA (or discards while it has none), and only then are
    /// deleted SAs removed, so that no policy points at a missing SA.
    fn reconcile(&mut self) {
        // Inbound selectors.
        let inbound: Vec<(SaKey, Vec<Selector>)> = self
            .sas
            .iter()
            .filter(|(_, s)| s.direction == SaDirection::Inbound)
            .map(|(k, s)| {
                let mut selectors: Vec<Selector> = Vec::new();
                for p in self.policies.values() {
                    if let (PolicyDirection::In, Verdict::Protect(t)) =
                        (p.translated.direction, p.translated.verdict)
                    {
                        if s.satisfies(&t) && !selectors.contains(&p.translated.selector) {
                            selectors.push(p.translated.selector);
                        }
                    }
                }
                (*k, selectors)
            })
            .collect();
        for (key, selectors) in inbound {
            let Some(sa) = self.sas.get_mut(&key) else {
                continue;
            };
            match sa.state {
                SaState::Held if !selectors.is_empty() => {
                    if let Some(mut config) = sa.held.take() {
                        config.params.selectors = selectors.clone();
                        sa.selectors = selectors;
                        sa.state = SaState::Installed;
                        self.counters.sas_installed += 1;
                        self.commands.push(SaCommand::InstallSa(config));
                    }
                }
                SaState::Installed if selectors.is_empty() => {
                    // The SAD holds no inbound SA without selectors.
                    sa.state = SaState::Retired;
                    sa.selectors.clear();
                    self.counters.sas_retired += 1;
                    // Its removal is the event (`sa_removed`, logged where
                    // the command is applied).
                    tracing::debug!(
                        "xfrm: inbound SA {} is named by no policy any more and is taken out",
                        sa.name
                    );
                    self.doomed.push((sa.name.clone(), Removal::XfrmUnselected));
                }
                SaState::Installed if selectors != sa.selectors => {
                    sa.selectors = selectors.clone();
                    self.commands.push(SaCommand::SetSelectors {
                        sa: sa.name.clone(),
                        selectors,
                    });
                }
                _ => {}
            }
        }
        // Policies. Removed SAs are out of `sas` already, and retired
        // ones are not `Installed`, so nothing below points at them.
        let mut changes = Vec::new();
        let mut held = 0;
        for (key, p) in &self.policies {
            let action = match p.translated.verdict {
                Verdict::Bypass => PolicyAction::Bypass,
                Verdict::Discard => PolicyAction::Discard,
                Verdict::Protect(t) => {
                    let direction = match p.translated.direction {
                        PolicyDirection::Out => SaDirection::Outbound,
                        PolicyDirection::In => SaDirection::Inbound,
                    };
                    match self.sa_for(direction, &t) {
                        Some(sa) => PolicyAction::Protect(sa.name.clone()),
                        None => {
                            held += 1;
                            PolicyAction::Discard
                        }
                    }
                }
            };
            if p.in_spd.as_ref() != Some(&action) || p.repoint {
                changes.push((*key, action));
            }
        }
        for (key, action) in changes {
            let Some(p) = self.policies.get_mut(&key) else {
                continue;
            };
            p.repoint = false;
            let waits =
                matches!(p.translated.verdict, Verdict::Protect(_)) && action == PolicyAction::Discard;
            let waited = p
                .in_spd
                .as_ref()
                .is_some_and(|a| matches!(a, PolicyAction::Protect(_)));
            if waits && (p.in_spd.is_none() || waited) {
                self.counters.policies_held_total += 1;
            }
            match p.in_spd.replace(action.clone()) {
                None => {
                    self.counters.policies_installed += 1;
                    self.commands.push(SaCommand::InsertPolicy(PolicySetup {
                        name: key.name(),
                        direction: p.translated.direction,
                        priority: p.translated.priority,
                        selector: p.translated.selector,
                        action,
                    }));
                }
                Some(_) => self.commands.push(SaCommand::SetPolicyAction {
                    policy: key.name(),
                    action,
                }),
            }
        }
        for (name, why) in std::mem::take(&mut self.doomed) {
            self.commands.remove_sa(name, why, None);
        }
        self.counters.policies_held = held;
        self.counters.policies_mirrored =
            self.policies.values().filter(|p| p.in_spd.is_some()).count() as u64;
        self.counters.sas_mirrored = self
            .sas
            .values()
            .filter(|s| s.state == SaState::Installed)
            .count() as u64;
        self.counters.sas_held = self.sas.values().filter(|s| s.state == SaState::Held).count() as u64;
    }
}

/// Feedback to the kernel (see [`feedback`]): the mirror knows the
/// kernel's names for what it mirrored and decides what to say; the driver
/// sends the bytes and reports back what failed.
impl XfrmMirror {
    /// Appends to `out` a NEWAE for every SA in the gateways whose use
    /// changed since it was last told: `usage` gives an SA's bytes,
    /// packets and time since its last packet (by name, from the gateway's
    /// shared counters); `epoch_now` is the wall clock in seconds.
    pub fn report_usage(
        &mut self,
        usage: impl Fn(&str) -> Option<(u64, u64, Duration)>,
        epoch_now: u64,
        out: &mut Vec<u8>,
    ) {
        let mut sequence = self.counters.newae_sent;
        for sa in self.sas.values_mut().filter(|s| s.state == SaState::Installed) {
            let Some((bytes, packets, idle)) = usage(&sa.name) else {
                continue;
            };
            if (bytes, packets) == sa.reported {
                continue;
            }
            sa.reported = (bytes, packets);
            let use_time = if packets == 0 {
                0
            } else {
                epoch_now.saturating_sub(idle.as_secs())
            };
            sequence += 1;
            feedback::new_ae(
                &sa.kernel(),
                &feedback::Usage {
                    bytes,
                    packets,
                    add_time: sa.age.0,
                    use_time,
                },
                sequence as u32,
                out,
            );
        }
        self.counters.newae_sent = sequence;
    }

    /// SA `name` passed a byte or packet limit in the gateways: appends
    /// the EXPIRE that makes the daemon rekey (soft) or delete (hard), if
    /// it is a mirrored SA. Time limits are the kernel's own, which fires
    /// them itself: the caller passes only volume expiries. Every worker's
    /// copy of the SA reports its own: the kernel is told once per limit
    /// (its EXPIRE notification back is what the log shows).
    pub fn volume_expired(&mut self, name: &str, hard: bool, out: &mut Vec<u8>) -> bool {
        let Some(sa) = self
            .sas
            .values_mut()
            .find(|s| s.name == name && s.state == SaState::Installed)
        else {
            return false;
        };
        let told = &mut sa.expire_told[usize::from(hard)];
        if *told {
            return true;
        }
        *told = true;
        let kernel = sa.kernel();
        self.counters.expire_sent += 1;
        feedback::expire(&kernel, hard, self.counters.expire_sent as u32, out);
        tracing::debug!(
            "xfrm: SA {name} passed its {} volume limit: told the kernel (EXPIRE)",
            if hard { "hard" } else { "soft" }
        );
        true
    }

    /// A packet of `flow` met outbound policy `policy` (the gateway's
    /// name) and was discarded: if it is a mirrored `protect` policy held
    /// for want of an SA (the daemon's trap), appends the ACQUIRE that
    /// asks the daemon for one, at most once per policy every
    /// [`ACQUIRE_INTERVAL`].
    pub fn trapped(
        &mut self,
        now: Duration,
        policy: &str,
        flow: &spd_sad::FlowKey,
        out: &mut Vec<u8>,
    ) -> bool {
        let Some(p) = self.policies.values_mut().find(|p| {
            p.translated.direction == PolicyDirection::Out
                && matches!(p.translated.verdict, Verdict::Protect(_))
                && p.in_spd == Some(PolicyAction::Discard)
                && p.translated.key.name() == policy
        }) else {
            return false;
        };
        if p.acquired
            .is_some_and(|at| now.saturating_sub(at) < ACQUIRE_INTERVAL)
        {
            return false;
        }
        p.acquired = Some(now);
        self.counters.acquire_sent += 1;
        feedback::acquire(
            &p.translated.kernel,
            &p.translated.templates,
            flow,
            self.counters.acquire_sent as u32,
            out,
        );
        // At most once a second per policy, under traffic: counted
        // (`acquire_sent`), not an event of the log.
        tracing::debug!(
            "xfrm: a packet met {policy}, which has no SA yet: asked the daemon for one (ACQUIRE)"
        );
        true
    }

    /// The kernel refused `n` of the feedback messages.
    pub fn note_feedback_failed(&mut self, n: u64) {
        self.counters.feedback_failed += n;
    }
}

/// How often a held policy's traffic may ask for an SA again.
pub const ACQUIRE_INTERVAL: Duration = Duration::from_secs(1);
