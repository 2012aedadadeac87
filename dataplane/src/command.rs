//! What a gateway is told to change in its SAD and SPD, as data: the SAs
//! and policies it installs ([`SaSetup`], [`PolicySetup`]), the commands a
//! keying source emits for every worker's gateway ([`SaCommand`]), the form
//! in which the workers after the first apply them ([`WorkerCommand`]), and
//! why a gateway refused one ([`ApplyError`]).
//!
//! The gateway's front applies them (`Gateway::apply`, `apply_first`,
//! `apply_worker`); whoever decides what the SAD and SPD hold (a
//! configuration file, an exchange with the peer, the kernel's XFRM SAD)
//! only builds them, and never holds a gateway. Plain data: owns no state,
//! touches no gateway, and must not import the gateway's front or stages.
//! Keys live in key memory ([`SecretBytes`], wiped when dropped) and no
//! `Debug` here prints them.

use accel::{Algorithm, RegisterError, SecretBytes, SessionError};
use spd_sad::{PolicyDirection, SaParams, SadError, SecurityAssociation, Selector};

use crate::esp::SaCrypto;

/// Where an SA's keys came from. The gateway installs every SA alike; a
/// driver that keeps a ledger of sequence numbers keeps one for keys that
/// outlive a restart, and its logs name the `reqid` of a mirrored SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// A configuration file: the same keys at every start, so the SA's
    /// counter and replay window must go on where they stopped (a ledger
    /// of sequence numbers kept in a state directory).
    File,
    /// An exchange with the peer: fresh keys from both ends' nonces every
    /// time.
    Exchange,
    /// The kernel's XFRM SAD of a keying namespace, where an IKE daemon
    /// (or `ip xfrm state add`) put it, under this `reqid`. The daemon may
    /// keep an SA across the gateway's restarts, so its sequence numbers
    /// are kept like those of static keys.
    Xfrm {
        /// The request id the kernel's SA and its policies share, as
        /// `ip xfrm state` shows it.
        reqid: u32,
    },
}

/// An SA as a gateway installs it: one engine session for its keys, and
/// where its sequence numbers start.
#[derive(Clone, PartialEq, Eq)]
pub struct SaSetup {
    /// Inbound SAs carry their selectors (an inbound SA without any is
    /// refused by the SAD).
    pub params: SaParams,
    /// The ESP transform; it fixes the lengths `enc_key` and `auth_key`
    /// must have.
    pub algorithm: Algorithm,
    /// The encryption key (for an AEAD, the AES key followed by its
    /// 4-byte salt), in key memory: wiped when the setup is dropped, never
    /// printed. Both keys' lengths are checked when the SA is installed.
    pub enc_key: SecretBytes,
    /// The integrity key (HMAC); empty for an AEAD, whose encryption key
    /// authenticates too, and for NULL.
    pub auth_key: SecretBytes,
    /// Sequence state to start from, like XFRM's `oseq`/`seq`: outbound,
    /// the last number sent (the first packet gets one more); inbound, the
    /// highest number already seen. Zero for a new SA; tests of 2^32
    /// crossings start near the boundary.
    pub initial_seq: u64,
    /// Where the keys came from.
    pub key_source: KeySource,
    /// Set by a driver that keeps a ledger of sequence numbers, never by a
    /// keying source: the highest number this SA's keys may have been used
    /// with before. The SA resumes above it and uses no number beyond its
    /// durable ceiling (see [`SecurityAssociation::resume_above`]).
    pub ledger_mark: Option<u64>,
}

impl std::fmt::Debug for SaSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaSetup")
            .field("params", &self.params)
            .field("algorithm", &self.algorithm)
            .field("initial_seq", &self.initial_seq)
            .field("key_source", &self.key_source)
            .field("ledger_mark", &self.ledger_mark)
            .field("keys", &"<redacted>")
            .finish()
    }
}

/// What a policy does; its SA is named until the gateway resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyAction {
    /// Protect with the SA of this name; a gateway without it discards.
    Protect(String),
    /// Forward in the clear, without ESP.
    Bypass,
    /// Drop what the policy selects.
    Discard,
}

/// A policy as a gateway inserts it into its SPD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySetup {
    /// Unique in the SPD; how later commands, logs and `espgw` name it.
    pub name: String,
    /// Whether it applies to traffic leaving or arriving.
    pub direction: PolicyDirection,
    /// Lower is consulted first; equal priorities keep insertion order.
    pub priority: u32,
    /// The packets it applies to.
    pub selector: Selector,
    /// What happens to them.
    pub action: PolicyAction,
}

/// A change to every worker's SAD or SPD.
#[derive(Debug, Clone)]
pub enum SaCommand {
    /// Install an SA (inbound selectors already filled in).
    InstallSa(Box<SaSetup>),
    /// Delete an SA; its keys are zeroized with its last session.
    RemoveSa(String),
    /// Replace SA `old` by `new`, which has the same keys: `new` takes
    /// over its sequence counter and replay window.
    ReplaceSa {
        /// The name of the SA to replace; if there is none, `new` starts
        /// from its own sequence state.
        old: String,
        /// The SA installed in its place.
        new: Box<SaSetup>,
    },
    /// Insert a policy into the SPD; a `protect` naming an SA the gateway
    /// lacks discards.
    InsertPolicy(PolicySetup),
    /// Remove the policy of this name; nothing happens if there is none.
    RemovePolicy(String),
    /// Point a `protect` policy at another SA (the switch of a rekey).
    Repoint {
        /// The policy's name; refused with [`ApplyError::NoPolicy`] if
        /// there is none.
        policy: String,
        /// The SA it protects with from now on.
        sa: String,
    },
    /// Set what policy `policy` does (the `xfrm` keying source: a policy
    /// that discards until its SA arrives, then protects with it).
    SetPolicyAction {
        /// The policy's name; refused with [`ApplyError::NoPolicy`] if
        /// there is none.
        policy: String,
        /// What it does from now on.
        action: PolicyAction,
    },
    /// Take UDP on this port (a tunnel keyed by an exchange over its
    /// encapsulation port, before it has SAs).
    OpenEncapsulationPort(u16),
    /// Change what may arrive through an inbound SA, keeping its sequence
    /// state (a reload that changed only the policies naming it).
    SetSelectors {
        /// The inbound SA's name; refused with [`ApplyError::NoSa`] if
        /// there is none.
        sa: String,
        /// Its selectors from now on, in place of the old ones.
        selectors: Vec<Selector>,
    },
}

impl SaCommand {
    /// The SA this command installs, if it installs one.
    pub fn installs(&self) -> Option<&SaSetup> {
        match self {
            SaCommand::InstallSa(sa) | SaCommand::ReplaceSa { new: sa, .. } => Some(sa),
            _ => None,
        }
    }

    /// [`installs`](Self::installs), to change before it is applied (a
    /// driver's ledger mark).
    pub fn installs_mut(&mut self) -> Option<&mut SaSetup> {
        match self {
            SaCommand::InstallSa(sa) | SaCommand::ReplaceSa { new: sa, .. } => Some(sa),
            _ => None,
        }
    }
}

/// A command as every worker but the first applies it: a new SA arrives
/// as a fork of the first worker's, so that all copies share one sequence
/// counter and one lifetime usage (see [`SecurityAssociation::fork`]).
pub enum WorkerCommand {
    /// Install this fork of the first worker's new SA.
    Adopt(Box<SecurityAssociation<SaCrypto>>),
    /// Adopt an SA that replaces SA `old` of this worker (a
    /// [`SaCommand::ReplaceSa`]): the outbound counter is shared already,
    /// the replay window is this worker's own.
    AdoptReplacing {
        /// The fork of the first worker's new SA.
        sa: Box<SecurityAssociation<SaCrypto>>,
        /// The name of the SA it replaces.
        old: String,
    },
    /// Apply this command as the first worker did: it installs no SA, or
    /// the first worker has none to fork.
    Apply(SaCommand),
}

impl std::fmt::Debug for WorkerCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerCommand::Adopt(sa) => write!(f, "Adopt({})", sa.name()),
            WorkerCommand::AdoptReplacing { sa, old } => write!(f, "AdoptReplacing({} for {old})", sa.name()),
            WorkerCommand::Apply(c) => write!(f, "Apply({c:?})"),
        }
    }
}

/// Why an SA could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    // The cause is in the message, not also chained as a source: `{:#}`
    // printers (anyhow) would print it twice.
    /// The keys do not fit the algorithm (a wrong length).
    #[error("SA `{sa}`: {reason}")]
    Session {
        /// The SA's name.
        sa: String,
        /// Which key is wrong, and how.
        reason: SessionError,
    },
    /// The SAD refused the SA (its name or inbound SPI in use, a reserved
    /// SPI, no room, an inbound SA without selectors) or its new selectors.
    #[error(transparent)]
    Sad(#[from] SadError),
    /// The engine refused the SA's session.
    #[error("SA `{sa}`: {reason}")]
    Engine {
        /// The SA's name.
        sa: String,
        /// Why the engine refused it.
        reason: RegisterError,
    },
    /// The gateway refused the SA's shape (its mode or outer addresses):
    /// the front's `InstallSaError`, boxed because this module may not
    /// name the front (downcast to get it back).
    #[error(transparent)]
    Refused(Box<dyn std::error::Error + Send + Sync>),
}

/// Why a command could not be applied to a gateway.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// An SA the command installs, or its new selectors, was refused.
    #[error(transparent)]
    Install(#[from] InstallError),
    /// A `Repoint` or `SetPolicyAction` named a policy the SPD lacks.
    #[error("no policy `{0}` to repoint")]
    NoPolicy(String),
    /// A `SetSelectors` named an SA the SAD lacks.
    #[error("no SA `{0}` to change the selectors of")]
    NoSa(String),
}
