//! Interfaces and routes (longest-prefix match, one table per address
//! family).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use smoltcp::wire::EthernetAddress;
use spd_sad::{Ipv4Prefix, Ipv6Prefix};
use strum::{EnumString, IntoStaticStr, VariantNames};

/// The two sides of the gateway. Names (the config's interface names,
/// JSON) are the variants in lower case, for serde and strum alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
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
    pub fn index(self) -> usize {
        match self {
            Port::Inside => 0,
            Port::Outside => 1,
        }
    }

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
    pub port: Port,
    pub kind: InterfaceKind,
    /// The operating-system device (`eth0`, `veth-a`).
    pub device: String,
    pub address: Ipv4Addr,
    /// The connected network.
    pub network: Ipv4Prefix,
    pub mac: EthernetAddress,
    pub mtu: u16,
    /// The interface's IPv6 address and its on-link prefix, if it has
    /// one: the gateway answers neighbour solicitations (RFC 4861) and
    /// echo requests for it, and carries IPv6 on the interface. Without
    /// one, IPv6 frames are counted `unsupported`.
    pub address6: Option<(Ipv6Addr, Ipv6Prefix)>,
}

/// What a route's destination is: a prefix of one address family.
pub trait Destination: Copy + fmt::Debug + PartialEq + Eq {
    type Addr: Copy + fmt::Debug + PartialEq + Eq;
    fn prefix_len(self) -> u8;
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
    pub destination: P,
    pub via: Option<P::Addr>,
    pub port: Port,
}

/// An IPv6 route.
pub type Route6 = Route<Ipv6Prefix>;

/// Where a packet goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop<A = Ipv4Addr> {
    pub port: Port,
    pub address: A,
}

/// One family's routes, ordered longest prefix first.
#[derive(Debug, Clone)]
pub struct Routes<P: Destination> {
    routes: Vec<Route<P>>,
}

impl<P: Destination> Default for Routes<P> {
    fn default() -> Self {
        Routes { routes: Vec::new() }
    }
}

impl<P: Destination> Routes<P> {
    pub fn add(&mut self, route: Route<P>) {
        let at = self
            .routes
            .partition_point(|r| r.destination.prefix_len() >= route.destination.prefix_len());
        self.routes.insert(at, route);
    }

    pub fn lookup(&self, dst: P::Addr) -> Option<NextHop<P::Addr>> {
        self.routes
            .iter()
            .find(|r| r.destination.contains(dst))
            .map(|r| NextHop {
                port: r.port,
                address: r.via.unwrap_or(dst),
            })
    }

    pub fn routes(&self) -> &[Route<P>] {
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
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, route: Route) {
        self.v4.add(route);
    }

    pub fn add6(&mut self, route: Route6) {
        self.v6.add(route);
    }

    pub fn lookup(&self, dst: Ipv4Addr) -> Option<NextHop> {
        self.v4.lookup(dst)
    }

    pub fn lookup6(&self, dst: Ipv6Addr) -> Option<NextHop<Ipv6Addr>> {
        self.v6.lookup(dst)
    }

    pub fn routes(&self) -> &[Route] {
        self.v4.routes()
    }

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
