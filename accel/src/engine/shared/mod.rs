//! The shared engine: one engine in a server process (`espgw engine
//! serve`), many tenants, each with its own rings, sessions and data area
//! (the third study of `docs/STUDIES.md`: a shared-memory ring per
//! guest, eventfd doorbells, one back-end thread pipelining every guest's
//! requests, and the back end enforcing key isolation itself).
//!
//! - [`wire`]: the protocol (control messages, ring entries, region layout),
//!   sans-IO and total over hostile input;
//! - `rings`: a tenant's shared region through raw pointers and atomics;
//! - [`server`]: the back end, which owns the engine and every key;
//! - [`tenant`]: [`SharedEngine`], the [`Engine`](crate::Engine) a gateway
//!   uses to reach it (`engine = "shared"` in `[accel]`);
//! - `sys`: the system calls (memfd, mmap, eventfd, `SCM_RIGHTS`);
//! - `hostile`: a tenant that misbehaves on purpose, for the tests and the
//!   benchmark (hidden; never used by the gateway or the server).
//!
//! Must not know packets: like every engine it sees descriptors and bytes.

use std::path::PathBuf;

#[doc(hidden)]
pub mod hostile;
pub(crate) mod rings;
pub mod server;
mod sys;
pub mod tenant;
pub mod wire;

pub use server::{
    spawn, spawn_with_engine, Access, BudgetError, FdBudget, FdLimits, ServeError, Server, ServerConfig,
    ServerHandle,
};
pub use tenant::{query_stats, AttachError, SharedEngine};
pub use wire::{StatsReply, Transport, UnknownTransport};

/// Where a tenant finds the server, and what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSpec {
    /// The server's control socket.
    pub socket: PathBuf,
    /// How descriptors and data travel: shared-memory rings or the socket.
    pub transport: Transport,
    /// Ring entries (rounded up to a power of two): the most requests this
    /// tenant has in flight.
    pub entries: u32,
    /// Bytes of one data slot: the largest request (a job's regions).
    pub slot_size: u32,
    /// How long a job may wait for the server, on the caller's clock (the
    /// `now` given to the engine), before it comes back with `Timeout` and
    /// the engine declares itself unavailable: [`DEFAULT_DEADLINE`].
    pub deadline: std::time::Duration,
}

/// A job's deadline by default: four times the gateway's own job timeout
/// (250 ms, after which it has already dropped the packet), and hundreds
/// of times what a served job takes (microseconds; milliseconds behind a
/// loaded `sec` model), so that only a server that stopped serving meets it.
pub const DEFAULT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);

impl Default for SharedSpec {
    fn default() -> Self {
        SharedSpec {
            socket: PathBuf::from("/run/espgw/engine.sock"),
            transport: Transport::Shm,
            entries: 256,
            // A pool buffer's data at most (a frame and its ESP growth).
            slot_size: crate::buffer::BUFFER_SIZE as u32,
            deadline: DEFAULT_DEADLINE,
        }
    }
}
