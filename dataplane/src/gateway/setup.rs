//! What a gateway is built from, apart from SAs and policies: its ports,
//! routes, framing and limits. Plain data, read by the front and the
//! stages when they are built; owns no state and touches nothing.

use std::net::IpAddr;
use std::time::Duration;

use accel::Style;
use smoltcp::wire::EthernetAddress;

use crate::icmp;
use crate::neighbor::NeighborLimits;
use crate::route::{Interface, Route, Route6};

/// What the frames of a driver look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// Ethernet frames (AF_PACKET devices, Ethernet captures).
    Ethernet,
    /// Bare IPv4 packets (TUN devices, raw-IP captures).
    RawIp,
}

/// fe80::/10 (RFC 4291 §2.5.6).
pub(super) const LINK_LOCAL: spd_sad::Ipv6Prefix =
    match spd_sad::Ipv6Prefix::new(std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10) {
        Some(p) => p,
        None => panic!("fe80::/10 is a prefix"),
    };

/// The UDP port of the control plane's exchange: IKE's (RFC 7296 §2).
pub const CONTROL_PORT: u16 = 500;

/// Everything the gateway is built from, apart from SAs and policies.
#[derive(Debug, Clone)]
pub struct GatewaySetup {
    /// The protected side.
    pub inside: Interface,
    /// The side the peers are on.
    pub outside: Interface,
    /// IPv4 routes besides the connected networks.
    pub routes: Vec<Route>,
    /// IPv6 routes besides the connected networks of `address6`.
    pub routes6: Vec<Route6>,
    /// Static neighbours of either family.
    pub neighbors: Vec<(IpAddr, EthernetAddress)>,
    /// The framing of the outside port, and of the inside one unless
    /// `inside_link` says otherwise.
    pub link: LinkLayer,
    /// TTL of the outer header of tunnel-mode packets.
    pub outer_ttl: u8,
    /// How often to send NAT keepalives (RFC 3948 §2.3) to each
    /// UDP-encapsulated peer; `None`: never. Only the gateway that answers
    /// ARP (worker 0) sends them.
    pub nat_keepalive: Option<Duration>,
    /// How packets' crypto is handed to the engine.
    pub style: Style,
    /// Resolve next hops by ARP. Off for offline work (captures), where a
    /// next hop without a static entry gets the zero MAC.
    pub resolve_neighbors: bool,
    /// Answer ARP requests for our addresses. With several workers, every
    /// worker learns from ARP but only one answers.
    pub answer_arp: bool,
    /// The inside port's framing when it differs from `link` (a TUN device
    /// carries bare IPv4 while the outside is Ethernet).
    pub inside_link: Option<LinkLayer>,
    /// UDP port on which datagrams to our outside address go to the
    /// control plane (as [`crate::Verdict::Control`]), ahead of the SPD: key
    /// exchange traffic is always let through (RFC 4301 §5.1, IKE bypass).
    /// `None`: such datagrams are ordinary local traffic.
    pub control_port: Option<u16>,
    /// Drop unicast frames for other MAC addresses (`other_host`). On for
    /// live interfaces, whose sockets are promiscuous because the gateway's
    /// MAC need not be the device's; off for captures, which hold what the
    /// user wants processed.
    pub only_own_mac: bool,
    /// Bounds of the neighbour table (ARP floods).
    pub neighbor_limits: NeighborLimits,
    /// Token buckets for the ICMP errors the gateway sends.
    pub icmp_limits: icmp::IcmpLimits,
}
