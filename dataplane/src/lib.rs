//! The packet path.
//!
//! Owns packet buffers and their pool, wire views, ESP encapsulation and
//! decapsulation (split into prepare/finish around the `accel` boundary),
//! the sans-IO [`Gateway`] that classifies, protects, verifies and routes a
//! batch of frames. Owns the setup types of SAs and policies and the
//! commands that change a gateway's SAD and SPD (`command`), which the
//! gateway applies: keying sources only build them. Must not do
//! cryptography itself (that is `accel`'s), parse configuration or decide
//! what the SAD and SPD hold (that is `ike-stub`'s), open devices, sockets
//! or files, read the clock, sleep or wait: the drivers (the `drivers`
//! crate) move frames in and out, pass `now` in and decide how to wait
//! (`drivers::drive`).
//!
//! Invariants: every received frame gets exactly one verdict and is counted
//! once (`Stats::balanced`); malformed input is a counted drop, never a
//! panic; nothing on the per-packet path allocates or logs.

#![warn(missing_docs, unreachable_pub)]

pub mod command;
pub mod esp;
pub mod fate;
pub mod gateway;
pub mod icmp;
pub mod icmp6;
pub mod nat;
pub mod neighbor;
pub mod reassembly;
pub mod route;
pub mod stats;
pub mod wire;

pub use accel::buffer::{self, PacketBuf, PacketPool};
pub use gateway::{
    DatagramError, Gateway, GatewaySetup, InstallSaError, LinkLayer, Output, SaCrypto, Verdict, CONTROL_PORT,
};
pub use route::{Interface, InterfaceKind, Port, Route, Route6};
pub use smoltcp::wire::EthernetAddress;
pub use stats::{DropReason, Stats};
