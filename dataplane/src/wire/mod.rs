//! Zero-copy views over packet bytes. Ethernet and IPv4 come from
//! `smoltcp::wire`; ESP, which smoltcp does not have, lives here in the
//! same manner; so does the flow-key extraction the SPD needs, and the
//! Internet checksum (`checksum`) the core and the drivers both compute.

pub mod checksum;
pub mod esp;
pub mod flow;
pub mod ipv4;
pub mod ipv6;
pub mod vnet;

pub use esp::{EspPacket, EspTrailer};
pub use flow::{flow_key, flow_key6, flow_key_any};

/// Whether `packet` starts with an IPv6 header (version 6); anything else
/// is taken for IPv4 and checked as such.
#[inline(always)]
pub fn is_ipv6(packet: &[u8]) -> bool {
    packet.first().is_some_and(|b| b >> 4 == 6)
}
