//! Interfaces, IPv4 routes (longest-prefix match) and neighbours.

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
    /// echo requests for it. IPv6 transit traffic is not carried yet.
    pub address6: Option<(Ipv6Addr, Ipv6Prefix)>,
}

/// A configured route; `via` is `None` for a directly connected network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub destination: Ipv4Prefix,
    pub via: Option<Ipv4Addr>,
    pub port: Port,
}

/// Where a packet goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop {
    pub port: Port,
    pub address: Ipv4Addr,
}

/// Routes ordered longest prefix first.
#[derive(Debug, Clone, Default)]
pub struct RoutingTable {
    routes: Vec<Route>,
}

impl RoutingTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, route: Route) {
        let at = self
            .routes
            .partition_point(|r| r.destination.len() >= route.destination.len());
        self.routes.insert(at, route);
    }

    pub fn lookup(&self, dst: Ipv4Addr) -> Option<NextHop> {
        self.routes
            .iter()
            .find(|r| r.destination.contains(dst))
            .map(|r| NextHop {
                port: r.port,
                address: r.via.unwrap_or(dst),
            })
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
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
