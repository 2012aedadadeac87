//! The look-aside offload boundary.
//!
//! Owns every cryptographic primitive espgw uses: algorithms and their wire
//! parameters, sessions (an SA's expanded keys, registered once), the
//! descriptors that carry one packet's crypto across the boundary, and the
//! engines behind it. Knows nothing of policies, SAs' sequence state or
//! packet headers beyond the regions a descriptor names; must not do I/O on
//! the packet path or log per packet.
//!
//! Invariants: a descriptor's regions are validated before any engine
//! indexes a buffer; an inbound packet is never decrypted unless its ICV
//! verified (AEADs check inside the primitive); keys never appear in `Debug`.

pub mod algorithm;
pub mod descriptor;
pub mod engine;
pub mod session;
pub mod soft;
mod wiped;

pub use algorithm::{Algorithm, CipherKind, IntegrityKind, UnknownAlgorithm};
pub use descriptor::{Descriptor, DescriptorError, DescriptorKind, Direction, Region, Status};
pub use engine::{Engine, EngineKind, SoftEngine};
pub use session::{Session, SessionError, SessionId};
