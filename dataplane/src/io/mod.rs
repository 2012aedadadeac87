//! Drivers: they move frames between the outside world and the sans-IO
//! [`Gateway`](crate::Gateway) and nothing else.

#[cfg(target_os = "linux")]
pub mod afpacket;
pub mod coalesce;
#[cfg(target_os = "linux")]
pub mod device;
pub mod offload;
pub mod pcap;
#[cfg(target_os = "linux")]
pub mod ring;
#[cfg(target_os = "linux")]
pub mod run;
pub mod steer;
#[cfg(target_os = "linux")]
pub mod tun;
