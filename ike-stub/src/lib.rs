//! The control plane.
//!
//! Owns configuration (TOML: interfaces, routes, neighbours, SAs, policies
//! and the `[[tunnel]]` shorthand), its validation with errors that name
//! file, line and column, and the installation of SAs (registering one
//! `accel` session per SA) and policies into a gateway. Later: lifetimes,
//! rekeying and IKE. Never touches packets.

pub mod config;
pub mod error;
mod raw;

pub use config::{Config, InstallError, PolicyAction, PolicyConfig, SaConfig};
pub use error::{ConfigError, ConfigErrorKind};
