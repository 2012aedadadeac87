//! Builds the engine a configuration names. Knows every engine's settings;
//! must not hold engine state of its own.

use super::sec::{SecConfig, SecEngine, ThreadedSecEngine};
use super::{Engine, EngineKind, SoftEngine};
use crate::job::BufferPolicy;

/// Everything needed to build an engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineSpec {
    /// Which engine to build.
    pub kind: EngineKind,
    /// How jobs' buffers reach the engine (the `sec` engine's too).
    pub buffers: BufferPolicy,
    /// Settings of the `sec` engine (its buffer policy is `buffers`); with
    /// `sec.threads` the threaded variant is built instead of the model.
    pub sec: SecConfig,
    /// How the `afalg` engine talks to the kernel.
    #[cfg(target_os = "linux")]
    pub afalg_io: super::afalg::AfalgIo,
    /// Where the `shared` engine's server is.
    #[cfg(target_os = "linux")]
    pub shared: super::shared::SharedSpec,
}

/// Why an engine could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The kernel crypto API is not reachable from here.
    #[error("the afalg engine is unavailable: {0}")]
    AfalgUnavailable(String),
    /// The threaded `sec` engine could not start its channel workers.
    #[error("the threaded sec engine could not start: {0}")]
    SecThreads(String),
    /// The shared engine's server could not be reached or refused us.
    #[error("the shared engine is unavailable: {0}")]
    SharedUnavailable(String),
}

/// Builds the engine `spec` describes.
pub fn build_engine(spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
    Ok(match spec.kind {
        EngineKind::Soft => Box::new(SoftEngine::new(spec.buffers)),
        EngineKind::Sec => {
            let config = SecConfig {
                buffers: spec.buffers,
                ..spec.sec.clone()
            };
            if config.threads {
                Box::new(ThreadedSecEngine::new(config).map_err(|e| EngineError::SecThreads(e.to_string()))?)
            } else {
                Box::new(SecEngine::new(config))
            }
        }
        #[cfg(target_os = "linux")]
        EngineKind::Afalg => Box::new(
            super::afalg::AfalgEngine::new(spec.buffers, spec.afalg_io)
                .map_err(|e| EngineError::AfalgUnavailable(e.to_string()))?,
        ),
        #[cfg(target_os = "linux")]
        EngineKind::Shared => Box::new(
            super::shared::SharedEngine::attach(&spec.shared)
                .map_err(|e| EngineError::SharedUnavailable(e.to_string()))?,
        ),
        #[cfg(not(target_os = "linux"))]
        EngineKind::Shared => {
            return Err(EngineError::SharedUnavailable(
                "the shared engine needs Linux (memfd, eventfd)".into(),
            ));
        }
        #[cfg(not(target_os = "linux"))]
        EngineKind::Afalg => {
            return Err(EngineError::AfalgUnavailable(
                "AF_ALG exists only on Linux".into(),
            ));
        }
    })
}
