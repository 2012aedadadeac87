//! The drivers: everything that moves frames between the outside world
//! and the sans-IO [`Gateway`](dataplane::Gateway), and everything that
//! waits.
//!
//! Owns the sockets and devices (AF_PACKET with its receive ring and
//! fanout programs, TUN, pcap files), making the kernel's offloaded
//! packets whole on the way in and merging segments on the way out, the
//! live worker loop, the clock (the gateway is handed `now`; it never
//! reads one) and waiting for the engine (`drive`). Must not classify,
//! encrypt, decrypt or keep per-flow or per-SA state: that is the core's
//! (`dataplane`) and the engine's (`accel`); a driver reaches them only
//! through the gateway's public API.

#![warn(missing_docs, unreachable_pub)]

#[cfg(target_os = "linux")]
pub mod afpacket;
pub mod coalesce;
#[cfg(target_os = "linux")]
pub mod device;
pub mod drive;
pub mod frame_log;
pub mod offload;
pub mod pcap;
#[cfg(target_os = "linux")]
pub mod reopen;
#[cfg(target_os = "linux")]
pub mod ring;
#[cfg(target_os = "linux")]
pub mod run;
#[cfg(target_os = "linux")]
mod sockopt;
pub mod steer;
#[cfg(target_os = "linux")]
pub mod tun;
