//! The IKE relay's driver: carries the IKE daemon's datagrams between the
//! gateway's outside interface and the keying namespace, where the daemon
//! runs.
//!
//! espgw owns the wire: ESP never reaches a kernel, so the kernel of the
//! keying namespace never encrypts or decrypts anything, while the daemon
//! there still talks to its peers. The relay is a TUN device that espgw
//! creates in the keying namespace (from the thread that opens the XFRM
//! sockets there, before privileges are dropped), with the gateway's
//! outside address on it and a default route through it: for the daemon
//! the outside address is local, and every peer lies beyond the TUN.
//!
//! - From the outside: UDP to the IKE port and IKE behind the non-ESP
//!   marker on the NAT-T port reach worker 0 as control datagrams (the
//!   gateway's classification), and are written into the TUN as the IPv4
//!   or IPv6 packets they came as, the peer's address and port intact (the
//!   daemon needs them for NAT detection).
//! - From the daemon: what the TUN gives is sent out of the outside
//!   interface by the gateway (`Gateway::send_datagram`, the normal route
//!   and ARP), if `ike_stub::xfrm::relay::from_daemon` lets it: UDP from
//!   the outside address and the daemon's ports, not a fragment.
//!
//! Over IPv6 the same, when the outside interface has an `address6`: the
//! TUN holds it as a /128 (without duplicate address detection, which
//! would keep the daemon from binding it for a second or two) with the
//! default IPv6 route.
//!
//! Owns the TUN and the relay's counters; the decisions are
//! `ike_stub::xfrm::relay`'s. Must not touch ESP or the gateway's state.

use std::net::IpAddr;

use anyhow::{anyhow, bail, Context, Result};
use drivers::tun::Tun;
use ike_stub::xfrm::relay::{self, Outside, Relay, RelayPorts};
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags, AddressMessage},
    link::{LinkFlags, LinkMessage},
    route::{RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType},
    AddressFamily, RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use serde::{Deserialize, Serialize};

/// The relay's TUN device, in the keying namespace.
pub const DEFAULT_DEVICE: &str = "espgw-ike";

/// What the relay did (`espgw stats` → `ike_relay`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayCounters {
    /// Datagrams from peers written to the daemon.
    pub to_daemon: u64,
    /// Datagrams from the daemon sent to peers.
    pub from_daemon: u64,
    /// From the outside, on a daemon port but not IKE (too short, a zero
    /// SPI): dropped.
    pub to_daemon_malformed: u64,
    /// Writes into the TUN that failed (its queue full, the namespace
    /// gone).
    pub to_daemon_failed: u64,
    /// Packets from the keying namespace that were not the daemon's IKE,
    /// by reason (see `ike_stub::xfrm::relay::Held`).
    pub from_daemon_held: std::collections::BTreeMap<String, u64>,
    /// The daemon's datagrams the gateway could not send (no route, too
    /// large).
    pub from_daemon_failed: u64,
}

/// The relay: its TUN in the keying namespace and what it counted.
pub struct IkeRelay {
    tun: Tun,
    device: String,
    outside: Outside,
    ports: RelayPorts,
    counters: RelayCounters,
    buffer: Vec<u8>,
}

/// The most the relay reads per call: IKE is a handful of datagrams a
/// second, and worker 0 reads between batches.
const READ_PER_CALL: usize = 32;

impl IkeRelay {
    /// Creates TUN `device` in the calling thread's network namespace, puts
    /// the `outside` addresses on it and routes everything through it.
    /// Needs `CAP_NET_ADMIN` there; run it from the thread that entered
    /// the keying namespace.
    pub fn open(device: &str, outside: Outside) -> Result<IkeRelay> {
        let tun =
            Tun::open(device).with_context(|| format!("creating the IKE relay's TUN device `{device}`"))?;
        let name = std::ffi::CString::new(device).map_err(|_| anyhow!("a device name with a NUL byte"))?;
        // SAFETY: if_nametoindex reads a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("finding `{device}`'s index"));
        }
        configure(index, outside).with_context(|| {
            format!("configuring the IKE relay's device `{device}` (up, the outside addresses, the default routes)")
        })?;
        match outside.v6 {
            Some(v6) => tracing::info!(
                "ike relay: `{device}` carries the daemon's IKE as {} and {v6}",
                outside.v4
            ),
            None => tracing::info!("ike relay: `{device}` carries the daemon's IKE as {}", outside.v4),
        }
        Ok(IkeRelay {
            tun,
            device: device.to_owned(),
            outside,
            ports: RelayPorts::default(),
            counters: RelayCounters::default(),
            buffer: vec![0u8; dataplane::buffer::MAX_FRAME],
        })
    }

    pub fn counters(&self) -> &RelayCounters {
        &self.counters
    }

    /// Whether a control datagram (an IPv4 or IPv6 packet from the
    /// outside) is one the relay takes: UDP to a daemon port of an outside
    /// address.
    pub fn takes(&self, packet: &[u8]) -> bool {
        relay::udp_endpoints(packet).is_ok_and(|udp| {
            let (dst, port) = udp.to;
            self.outside.is(dst) && (port == self.ports.ike || port == self.ports.nat_t)
        })
    }

    /// Writes a datagram from a peer into the keying namespace, as it came,
    /// if it is the daemon's.
    pub fn pass_to_daemon(&mut self, packet: &[u8]) {
        let Ok(udp) = relay::udp_endpoints(packet) else {
            self.counters.to_daemon_malformed += 1;
            return;
        };
        match relay::classify(self.ports, udp.to.1, udp.payload) {
            Relay::Ike | Relay::IkeNatT => match self.tun.send(with_checksums(packet, &mut self.buffer)) {
                Ok(()) => self.counters.to_daemon += 1,
                Err(e) => {
                    self.counters.to_daemon_failed += 1;
                    tracing::debug!("ike relay: a datagram not written to `{}`: {e}", self.device);
                }
            },
            // The gateway consumes keepalives and decrypts ESP itself; a
            // datagram of another port is not the relay's.
            Relay::Keepalive | Relay::Esp | Relay::NotIke | Relay::Malformed => {
                self.counters.to_daemon_malformed += 1;
            }
        }
    }

    /// Reads what the daemon sent and hands each datagram that may leave
    /// to `send` (ports, peer, payload), which reports whether it went.
    pub fn pass_from_daemon(&mut self, mut send: impl FnMut((u16, u16), IpAddr, &[u8]) -> bool) {
        for _ in 0..READ_PER_CALL {
            // SAFETY: a read into a buffer we own, of its length.
            let got = unsafe {
                libc::read(
                    self.tun.as_raw_fd(),
                    self.buffer.as_mut_ptr().cast(),
                    self.buffer.len(),
                )
            };
            let Ok(len) = usize::try_from(got) else {
                // EAGAIN: nothing more. Another error is counted on the
                // next datagram that fails; the TUN stays.
                return;
            };
            if len == 0 {
                return;
            }
            match relay::from_daemon(self.ports, self.outside, &self.buffer[..len]) {
                Ok(out) => {
                    if send(out.ports, out.to, out.payload) {
                        self.counters.from_daemon += 1;
                    } else {
                        self.counters.from_daemon_failed += 1;
                    }
                }
                Err(held) => {
                    let reason: &'static str = held.into();
                    *self
                        .counters
                        .from_daemon_held
                        .entry(reason.to_owned())
                        .or_default() += 1;
                }
            }
        }
    }
}

/// `packet` copied into `buffer` with its IPv4 and UDP checksums (IPv6:
/// its UDP checksum) filled in: a peer on a veth (or a NIC with checksum offload) hands its
/// datagrams over unfinished, and the keying namespace's kernel would drop
/// them. The daemon authenticates what it reads; a datagram damaged on the
/// wire fails there.
fn with_checksums<'b>(packet: &[u8], buffer: &'b mut [u8]) -> &'b [u8] {
    use smoltcp::wire::{IpAddress, Ipv4Packet, Ipv6Packet, UdpPacket};
    let len = packet.len().min(buffer.len());
    buffer[..len].copy_from_slice(&packet[..len]);
    if let Ok(mut ip) = Ipv4Packet::new_checked(&mut buffer[..len]) {
        if ip.version() == 4 {
            ip.fill_checksum();
            let (src, dst) = (IpAddress::Ipv4(ip.src_addr()), IpAddress::Ipv4(ip.dst_addr()));
            if let Ok(mut udp) = UdpPacket::new_checked(ip.payload_mut()) {
                udp.fill_checksum(&src, &dst);
            }
            return &buffer[..len];
        }
    }
    // IPv6 as the relay takes it: UDP straight after the fixed header.
    if let Ok(mut ip) = Ipv6Packet::new_checked(&mut buffer[..len]) {
        if ip.version() == 6 {
            let (src, dst) = (IpAddress::Ipv6(ip.src_addr()), IpAddress::Ipv6(ip.dst_addr()));
            if let Ok(mut udp) = UdpPacket::new_checked(ip.payload_mut()) {
                udp.fill_checksum(&src, &dst);
            }
        }
    }
    &buffer[..len]
}

/// Sends one rtnetlink request and waits for its acknowledgement.
fn request(socket: &Socket, message: RouteNetlinkMessage, flags: u16, sequence: u32) -> Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = sequence;
    let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    m.finalize();
    let mut bytes = vec![0u8; m.buffer_len()];
    m.serialize(&mut bytes);
    socket.send(&bytes, 0).context("sending to rtnetlink")?;
    let mut reply = Vec::with_capacity(8192);
    socket.recv(&mut reply, 0).context("reading rtnetlink's answer")?;
    let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply)
        .map_err(|e| anyhow!("an rtnetlink answer that does not parse: {e}"))?;
    match answer.payload {
        NetlinkPayload::Error(e) => match e.code {
            None => Ok(()),
            Some(code) => Err(std::io::Error::from_raw_os_error(-code.get()).into()),
        },
        other => bail!("rtnetlink answered {other:?} instead of an acknowledgement"),
    }
}

/// The device up, the outside addresses on it (IPv4 as a /32; IPv6 as a
/// /128 without duplicate address detection: the daemon binds it at once,
/// and no other node is on this link), and the default route of each
/// family through it.
fn configure(index: u32, outside: Outside) -> Result<()> {
    let mut socket = Socket::new(NETLINK_ROUTE).context("opening an rtnetlink socket")?;
    socket.bind_auto().context("binding the rtnetlink socket")?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;

    let mut link = LinkMessage::default();
    link.header.index = index;
    link.header.flags = LinkFlags::Up;
    link.header.change_mask = LinkFlags::Up;
    request(&socket, RouteNetlinkMessage::SetLink(link), 0, 1).context("bringing it up")?;

    let v4 = (
        AddressFamily::Inet,
        32,
        vec![
            AddressAttribute::Local(outside.v4.into()),
            AddressAttribute::Address(outside.v4.into()),
        ],
        RouteScope::Link,
    );
    let v6 = outside.v6.map(|v6| {
        (
            AddressFamily::Inet6,
            128,
            vec![
                AddressAttribute::Address(v6.into()),
                AddressAttribute::Flags(AddressFlags::Nodad),
            ],
            RouteScope::Universe,
        )
    });
    let mut sequence = 1;
    for (family, prefix_len, attributes, scope) in std::iter::once(v4).chain(v6) {
        let mut address = AddressMessage::default();
        address.header.family = family;
        address.header.prefix_len = prefix_len;
        address.header.index = index;
        address.attributes = attributes;
        sequence += 1;
        request(
            &socket,
            RouteNetlinkMessage::NewAddress(address),
            NLM_F_CREATE | NLM_F_REPLACE,
            sequence,
        )
        .with_context(|| format!("adding the {family:?} address"))?;

        let mut route = RouteMessage::default();
        route.header.address_family = family;
        route.header.table = RouteHeader::RT_TABLE_MAIN;
        route.header.protocol = RouteProtocol::Static;
        route.header.scope = scope;
        route.header.kind = RouteType::Unicast;
        route.attributes = vec![RouteAttribute::Oif(index)];
        sequence += 1;
        request(
            &socket,
            RouteNetlinkMessage::NewRoute(route),
            NLM_F_CREATE | NLM_F_REPLACE,
            sequence,
        )
        .with_context(|| format!("adding the {family:?} default route"))?;
    }
    Ok(())
}
