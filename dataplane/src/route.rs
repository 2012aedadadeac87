//! Interfaces and routes (longest-prefix match, one table per address
//! family): the gateway's two ports, what each interface is, and where a
//! destination's packets go next. Owns the configured table only; must not
//! resolve link-layer addresses (`neighbor`'s) or learn routes at run
//! time: the table is what the configuration gave.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use smoltcp::wire::EthernetAddress;
use spd_sad::{Ipv4Prefix, Ipv6Prefix};
use strum::{EnumString, IntoStaticStr, VariantNames};

/// The two sides of the gateway. Names (the config's interface names,
/// JSON) are the variants in lower case, for serde and strum alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[derive(EnumString, VariantNames, IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Port {
    /// The protected network: plaintext.
    Inside,
    /// The untrusted network: ESP to peers.
    Outside,
}

impl Port {
    /// A dense index, 0 for inside and 1 for outside, for the per-port
    /// arrays (`[T; 2]`) the gateway and its drivers keep.
    pub fn index(self) -> usize {
        match self {
            Port::Inside => 0,
            Port::Outside => 1,
        }
    }

    /// The published name: `inside` or `outside`, as in the configuration
    /// and the JSON reports.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

// Not derived: strum's `Display` honours a width, which would change how
// the `{:<N}` columns of `espgw check-config` print today.
impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What kind of device an interface is; its name (the config's `kind`) is
/// the variant in lower case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, strum::EnumString, strum::VariantNames)]
#[strum(serialize_all = "lowercase")]
pub enum InterfaceKind {
    /// An Ethernet device, read raw with AF_PACKET.
    #[default]
    Ethernet,
    /// A TUN device espgw creates: bare IPv4 packets, routed into it by
    /// the host itself.
    Tun,
}

/// A gateway interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Which side of the gateway it is.
    pub port: Port,
    /// Ethernet or TUN: whether frames carry a link-layer header.
    pub kind: InterfaceKind,
    /// The operating-system device (`eth0`, `veth-a`).
    pub device: String,
    /// The gateway's own IPv4 address on the interface: what its ARP
    /// replies answer for and its own ICMP messages come from.
    pub address: Ipv4Addr,
    /// The connected network.
    pub network: Ipv4Prefix,
    /// The interface's link-layer address, the source of every frame
    /// sent on it (unused on a TUN device).
    pub mac: EthernetAddress,
    /// The largest IP packet the link carries, in bytes (without the
    /// Ethernet header). A larger IPv4 packet is fragmented, or with DF
    /// answered with fragmentation-needed (RFC 1191); a larger IPv6 one
    /// with packet-too-big (RFC 8200 §5).
    pub mtu: u16,
    /// The interface's IPv6 address and its on-link prefix, if it has
    /// one: the gateway answers neighbour solicitations (RFC 4861) and
    /// echo requests for it, and carries IPv6 on the interface. Without
    /// one, IPv6 frames are counted `unsupported`.
    pub address6: Option<(Ipv6Addr, Ipv6Prefix)>,
}

/// What a route's destination is: a prefix of one address family.
pub trait Destination: Copy + fmt::Debug + PartialEq + Eq {
    /// An address of the family.
    type Addr: Copy + fmt::Debug + PartialEq + Eq;
    /// Bits of the prefix, 0 (default route) to 32 or 128.
    fn prefix_len(self) -> u8;
    /// Whether `addr` lies in the prefix.
    fn contains(self, addr: Self::Addr) -> bool;
}

impl Destination for Ipv4Prefix {
    type Addr = Ipv4Addr;
    fn prefix_len(self) -> u8 {
        Ipv4Prefix::len(self)
    }
    fn contains(self, addr: Ipv4Addr) -> bool {
        Ipv4Prefix::contains(self, addr)
    }
}

impl Destination for Ipv6Prefix {
    type Addr = Ipv6Addr;
    fn prefix_len(self) -> u8 {
        Ipv6Prefix::len(self)
    }
    fn contains(self, addr: Ipv6Addr) -> bool {
        Ipv6Prefix::contains(self, addr)
    }
}

/// A configured route; `via` is `None` for a directly connected network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<P: Destination = Ipv4Prefix> {
    /// The prefix the route covers.
    pub destination: P,
    /// The gateway (router) to send through; `None`: the destination
    /// itself is the next hop, on-link.
    pub via: Option<P::Addr>,
    /// The side the packets leave on.
    pub port: Port,
}

/// An IPv6 route.
pub type Route6 = Route<Ipv6Prefix>;

/// Where a packet goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop<A = Ipv4Addr> {
    /// The side the packet leaves on.
    pub port: Port,
    /// The address whose link-layer address the frame goes to: the
    /// route's `via`, or the packet's destination for a connected network.
    pub address: A,
}

/// One family's routes, ordered longest prefix first.
#[derive(Debug, Clone)]
pub(crate) struct Routes<P: Destination> {
    routes: Vec<Route<P>>,
}

impl<P: Destination> Default for Routes<P> {
    fn default() -> Self {
        Routes { routes: Vec::new() }
    }
}

impl<P: Destination> Routes<P> {
    /// Inserts `route` after every route at least as long, so that among
    /// equal prefixes the first added wins.
    pub(crate) fn add(&mut self, route: Route<P>) {
        let at = self
            .routes
            .partition_point(|r| r.destination.prefix_len() >= route.destination.prefix_len());
        self.routes.insert(at, route);
    }

    /// The longest-prefix match for `dst`, if any route covers it.
    pub(crate) fn lookup(&self, dst: P::Addr) -> Option<NextHop<P::Addr>> {
        self.routes
            .iter()
            .find(|r| r.destination.contains(dst))
            .map(|r| NextHop {
                port: r.port,
                address: r.via.unwrap_or(dst),
            })
    }

    /// The routes, longest prefix first.
    pub(crate) fn routes(&self) -> &[Route<P>] {
        &self.routes
    }
}

/// The gateway's routes: IPv4, and IPv6 for interfaces with an `address6`.
#[derive(Debug, Clone, Default)]
pub struct RoutingTable {
    v4: Routes<Ipv4Prefix>,
    v6: Routes<Ipv6Prefix>,
}

impl RoutingTable {
    /// An empty table: every lookup fails until routes are added.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds an IPv4 route (see [`Routes::add`] for ties).
    pub(crate) fn add(&mut self, route: Route) {
        self.v4.add(route);
    }

    /// Adds an IPv6 route.
    pub(crate) fn add6(&mut self, route: Route6) {
        self.v6.add(route);
    }

    /// Where a packet for `dst` goes next: the longest matching IPv4
    /// prefix; `None` when no route covers it.
    pub fn lookup(&self, dst: Ipv4Addr) -> Option<NextHop> {
        self.v4.lookup(dst)
    }

    /// [`lookup`](Self::lookup) for IPv6.
    pub fn lookup6(&self, dst: Ipv6Addr) -> Option<NextHop<Ipv6Addr>> {
        self.v6.lookup(dst)
    }

    /// The IPv4 routes, longest prefix first.
    pub fn routes(&self) -> &[Route] {
        self.v4.routes()
    }

    /// The IPv6 routes, longest prefix first.
    pub fn routes6(&self) -> &[Route6] {
        self.v6.routes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are config values and JSON text: deriving them must not
    /// rename one, and serde must agree with strum.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        use strum::VariantNames;
        assert_eq!(Port::VARIANTS, ["inside", "outside"]);
        for (port, name) in [(Port::Inside, "inside"), (Port::Outside, "outside")] {
            assert_eq!(port.to_string(), name);
            assert_eq!(name.parse::<Port>(), Ok(port));
            assert_eq!(serde_json::to_value(port).unwrap(), name);
        }
        assert_eq!(InterfaceKind::VARIANTS, ["ethernet", "tun"]);
        assert_eq!("tun".parse::<InterfaceKind>(), Ok(InterfaceKind::Tun));
    }

    #[test]
    fn longest_prefix_wins() {
        let mut table = RoutingTable::new();
        table.add(Route {
            destination: "0.0.0.0/0".parse().unwrap(),
            via: Some("10.0.0.254".parse().unwrap()),
            port: Port::Outside,
        });
        table.add(Route {
            destination: "192.168.1.0/24".parse().unwrap(),
            via: None,
            port: Port::Inside,
        });
        table.add(Route {
            destination: "192.168.0.0/16".parse().unwrap(),
            via: Some("10.0.0.2".parse().unwrap()),
            port: Port::Outside,
        });
        let hop = table.lookup("192.168.1.9".parse().unwrap()).unwrap();
        assert_eq!(
            (hop.port, hop.address),
            (Port::Inside, "192.168.1.9".parse().unwrap())
        );
        let hop = table.lookup("192.168.7.9".parse().unwrap()).unwrap();
        assert_eq!(hop.address, "10.0.0.2".parse::<Ipv4Addr>().unwrap());
        let hop = table.lookup("8.8.8.8".parse().unwrap()).unwrap();
        assert_eq!(hop.address, "10.0.0.254".parse::<Ipv4Addr>().unwrap());
        assert!(RoutingTable::new().lookup("8.8.8.8".parse().unwrap()).is_none());
    }
}
