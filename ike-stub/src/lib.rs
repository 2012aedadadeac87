//! The control plane.
//!
//! Owns configuration (TOML: interfaces, routes, neighbours, SAs, policies
//! and the `[[tunnel]]` shorthand), its validation with errors that name
//! file, line and column, and the commands that install its SAs and
//! policies; and the control plane (`plane`): rekeying tunnels with a peer
//! over UDP 500 (`message`, keys from `prf`), retiring replaced SAs, and
//! reloads; and the sequence ledger of SAs with static keys (`ledger`:
//! fingerprints, the file's format, how far ahead each ceiling goes); and
//! the `xfrm` keying source (`xfrm`: the kernel's XFRM SAD and SPD of a
//! keying namespace, as an IKE daemon wrote them, translated into SAs and
//! policies). It decides what the SAD and SPD hold, and says so in the
//! gateway's own commands ([`dataplane::command::SaCommand`]), which the
//! driver applies: it never holds a gateway, never touches data packets
//! and never does I/O.

#![warn(missing_docs, unreachable_pub)]

#[cfg(any(test, feature = "testing"))]
pub mod builder;
pub mod config;
pub mod error;
pub mod ledger;
pub mod message;
pub mod plane;
pub mod prf;
mod raw;
pub mod removal;
pub mod request;
pub mod xfrm;

pub use config::{
    Config, DeviceLoss, FloodLimits, KeySource, Keying, LinkOverrides, PolicyAction, PolicySetup,
    RekeySettings, SaConfig, TunnelConfig,
};
pub use error::{ConfigError, ConfigErrorKind};
pub use plane::{ControlCounters, ControlPlane, Datagram, ReloadError, ReloadReport, TunnelStatus};
pub use removal::{Removal, RemovalNote};
pub use request::{ControlRequest, RequestError};
