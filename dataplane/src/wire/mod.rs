//! Zero-copy views over packet bytes. Ethernet, IPv4 and IPv6 come from
//! `smoltcp::wire`; here are the checked ways to take them (`ipv4`,
//! `ipv6`, which also walks IPv6 extension headers), ESP, which smoltcp
//! does not have, in the same manner (`esp`), the virtio-net header of
//! AF_PACKET (`vnet`), the flow-key extraction the SPD needs (`flow`), and
//! the Internet checksum the core and the drivers both compute
//! (`checksum`).
//!
//! Parses and views only: owns no state and allocates nothing. Must not
//! decide what becomes of a packet (the gateway's) or build whole packets
//! (`icmp`, `icmp6` and `esp` at the crate root do).

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
