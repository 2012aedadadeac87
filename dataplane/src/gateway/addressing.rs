//! The gateway's addressing: its two interfaces, how each is framed and
//! the routes of both families. Fixed for a gateway's life (the setup
//! gives it, nothing learns it), so the front owns it and lends it, read
//! only, to every stage that needs to know whether an address is ours,
//! what a port's MAC is or which port a destination leaves by: the SPD's
//! pattern, rather than stages asking egress.
//!
//! A leaf: it calls no stage and changes nothing. Next hops' link-layer
//! addresses are egress's (the neighbour table), not this.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::setup::{GatewaySetup, LinkLayer};
use crate::route::{Interface, NextHop, Port, Route, Route6, RoutingTable};

/// Interfaces, framing and routes.
pub(super) struct Addressing {
    interfaces: [Interface; 2],
    link: LinkLayer,
    /// The inside port's framing when it differs from `link`.
    inside_link: Option<LinkLayer>,
    routes: RoutingTable,
    /// Answer ARP and neighbour solicitations for our addresses.
    answer_arp: bool,
}

impl Addressing {
    pub(super) fn new(setup: &GatewaySetup) -> Addressing {
        let mut routes = RoutingTable::new();
        for iface in [&setup.inside, &setup.outside] {
            routes.add(Route {
                destination: iface.network,
                via: None,
                port: iface.port,
            });
            if let Some((_, network6)) = iface.address6 {
                routes.add6(Route6 {
                    destination: network6,
                    via: None,
                    port: iface.port,
                });
            }
        }
        for route in &setup.routes {
            routes.add(*route);
        }
        for route in &setup.routes6 {
            routes.add6(*route);
        }
        Addressing {
            interfaces: [setup.inside.clone(), setup.outside.clone()],
            link: setup.link,
            inside_link: setup.inside_link,
            routes,
            answer_arp: setup.answer_arp,
        }
    }

    #[inline]
    pub(super) fn interface(&self, port: Port) -> &Interface {
        &self.interfaces[port.index()]
    }

    #[inline]
    pub(super) fn routes(&self) -> &RoutingTable {
        &self.routes
    }

    /// The framing of the outside port (and of the inside one unless it
    /// has its own).
    #[inline]
    pub(super) fn link(&self) -> LinkLayer {
        self.link
    }

    /// The framing of one port.
    #[inline]
    pub(super) fn link_of(&self, port: Port) -> LinkLayer {
        match port {
            Port::Inside => self.inside_link.unwrap_or(self.link),
            Port::Outside => self.link,
        }
    }

    /// Whether this gateway answers ARP and neighbour solicitations.
    #[inline]
    pub(super) fn answers_neighbors(&self) -> bool {
        self.answer_arp
    }

    /// Whether `addr` is one of the gateway's own addresses.
    #[inline]
    pub(super) fn is_local(&self, addr: IpAddr) -> bool {
        self.interfaces.iter().any(|i| match addr {
            IpAddr::V4(v4) => i.address == v4,
            IpAddr::V6(v6) => i.address6.is_some_and(|(a, _)| a == v6),
        })
    }

    /// The next hop toward an IPv4 destination.
    #[inline]
    pub(super) fn hop(&self, dst: Ipv4Addr) -> Option<NextHop> {
        self.routes.lookup(dst)
    }

    /// The next hop toward an IPv6 destination.
    #[inline]
    pub(super) fn hop6(&self, dst: Ipv6Addr) -> Option<NextHop<Ipv6Addr>> {
        self.routes.lookup6(dst)
    }

    /// Our address (IPv4 or IPv6) on the interface a packet to `to` leaves
    /// by: what the control plane's datagrams are sent from.
    #[inline]
    pub(super) fn source_toward(&self, to: IpAddr) -> Option<IpAddr> {
        match to {
            IpAddr::V4(to) => {
                let hop = self.routes.lookup(to)?;
                Some(self.interface(hop.port).address.into())
            }
            IpAddr::V6(to) => {
                let hop = self.routes.lookup6(to)?;
                self.interface(hop.port).address6.map(|(a, _)| a.into())
            }
        }
    }

    /// The port a packet to `dst` leaves by, if any route has it.
    #[inline]
    pub(super) fn port_toward(&self, dst: IpAddr) -> Option<Port> {
        match dst {
            IpAddr::V4(dst) => self.routes.lookup(dst).map(|hop| hop.port),
            IpAddr::V6(dst) => self.routes.lookup6(dst).map(|hop| hop.port),
        }
    }

    /// The source of an ICMP error to `to`: our inside address when
    /// `tunnelled(inside, to)` says an outbound `protect` policy covers it
    /// (the error then goes through that tunnel, as a strongSwan host's
    /// does with the inside `src` it gives its tunnel routes), else our
    /// address on the interface that `to` is routed out of (the inside
    /// one without a route).
    pub(super) fn address_toward(
        &self,
        to: Ipv4Addr,
        tunnelled: impl FnOnce(IpAddr, IpAddr) -> bool,
    ) -> Ipv4Addr {
        let inside = self.interface(Port::Inside).address;
        let port = self.routes.lookup(to).map_or(Port::Inside, |hop| hop.port);
        if port == Port::Inside || tunnelled(inside.into(), to.into()) {
            return inside;
        }
        self.interface(port).address
    }

    /// [`address_toward`](Self::address_toward) for IPv6: our IPv6 address
    /// on the interface that `to` is routed out of, the inside one for a
    /// destination behind a tunnel (no IPv6 route, or a `protect` policy
    /// from it to `to`).
    pub(super) fn address6_toward(
        &self,
        to: Ipv6Addr,
        tunnelled: impl FnOnce(IpAddr, IpAddr) -> bool,
    ) -> Option<Ipv6Addr> {
        let inside = self.interface(Port::Inside).address6.map(|(a, _)| a);
        let port = self.routes.lookup6(to).map_or(Port::Inside, |hop| hop.port);
        if let Some(inside) = inside {
            if port == Port::Inside || tunnelled(inside.into(), to.into()) {
                return Some(inside);
            }
        }
        self.interface(port).address6.map(|(a, _)| a)
    }
}
