//! Engines: where descriptors are executed.

use std::fmt;
use std::str::FromStr;

use crate::descriptor::Descriptor;
use crate::session::Session;

/// The engines espgw can put behind the boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// Inline software in the caller's thread.
    #[default]
    Soft,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Soft => "soft",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An engine name that is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine `{0}`; expected `soft`")]
pub struct UnknownEngine(pub String);

impl FromStr for EngineKind {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "soft" => Ok(EngineKind::Soft),
            other => Err(UnknownEngine(other.to_owned())),
        }
    }
}

/// Executes descriptors. `process` completes the descriptor before it
/// returns (its status is no longer `Pending`).
pub trait Engine: Send {
    fn kind(&self) -> EngineKind;

    fn process(&mut self, session: &Session, desc: &mut Descriptor, buf: &mut [u8]);
}

/// Inline software: the descriptor is executed in the caller's thread.
#[derive(Debug, Default)]
pub struct SoftEngine;

impl Engine for SoftEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Soft
    }

    fn process(&mut self, session: &Session, desc: &mut Descriptor, buf: &mut [u8]) {
        crate::soft::process(session, desc, buf);
    }
}
