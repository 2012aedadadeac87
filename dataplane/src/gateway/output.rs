//! What the stages hand back: a frame's verdict for the driver, where a
//! packet goes next for the front, an ICMP error a stage asks for, and the
//! sink that counts every output as it is pushed. Vocabulary only: the
//! stages and the front share it, and it imports none of them.

use std::net::Ipv4Addr;

use crate::buffer::PacketBuf;
use crate::route::Port;
use crate::stats::{DropReason, Stats};

/// The fate of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Transmit the (rewritten) buffer on this port.
    Forward(Port),
    /// Consumed by the gateway (addressed to it, or an ESP dummy packet).
    Consumed,
    /// A datagram for the control plane (UDP to [`crate::GatewaySetup::control_port`]
    /// on one of our addresses): the buffer holds the IPv4 packet. The
    /// driver hands it over, then frees it; drivers without a control
    /// plane just free it.
    Control,
    /// Dropped, for this reason (counted under it).
    Drop(DropReason),
}

/// A frame handed back to the driver.
pub type Output = (PacketBuf, Verdict);

/// Where a packet goes once the gateway is done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Look up the route and transmit.
    Route,
    /// Addressed to the gateway: consumed.
    Consume,
    /// For the control plane.
    Control,
    /// A reply the gateway wrote, framed already: transmit it on this port.
    Reply(Port),
    /// A packet the gateway wrote (an echo reply, an ICMP or ICMPv6
    /// error), bare IP: it takes the outbound SPD.
    Local,
    /// The packet dies here, and an ICMP or ICMPv6 error about it is due
    /// (if the rules and rate limits allow one): written in its place by
    /// the front, which then sends it as `Local`.
    Error(IcmpError),
}

/// An ICMP or ICMPv6 error a stage asks for in place of a packet that
/// dies, for `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IcmpError {
    /// Type, code and the rest of the header (an MTU, a pointer).
    pub(super) message: (u8, u8, u32),
    /// The source of an ICMP (IPv4) error; `None`: ICMPv6, from our
    /// address toward the packet's source.
    pub(super) from: Option<Ipv4Addr>,
    pub(super) reason: DropReason,
}

impl IcmpError {
    #[inline]
    pub(super) fn v4(message: (u8, u8, u32), from: Ipv4Addr, reason: DropReason) -> IcmpError {
        IcmpError {
            message,
            from: Some(from),
            reason,
        }
    }

    #[inline]
    pub(super) fn v6(message: (u8, u8, u32), reason: DropReason) -> IcmpError {
        IcmpError {
            message,
            from: None,
            reason,
        }
    }
}

/// Where stages put the frames they are done with: each is counted as it
/// goes (transmitted or dropped, under its reason), so that every output
/// is counted once, here.
pub(super) struct Sink<'a> {
    out: &'a mut Vec<Output>,
    stats: &'a mut Stats,
}

impl<'a> Sink<'a> {
    #[inline]
    pub(super) fn new(out: &'a mut Vec<Output>, stats: &'a mut Stats) -> Self {
        Sink { out, stats }
    }

    /// Transmit on `port`.
    #[inline]
    pub(super) fn send(&mut self, buf: PacketBuf, port: Port) {
        self.stats.tx_packets += 1;
        self.out.push((buf, Verdict::Forward(port)));
    }

    /// Dropped for `reason`.
    #[inline]
    pub(super) fn drop(&mut self, buf: PacketBuf, reason: DropReason) {
        self.stats.drops.count(reason);
        self.out.push((buf, Verdict::Drop(reason)));
    }

    /// Consumed by the gateway (already counted where it was delivered).
    #[inline]
    pub(super) fn consumed(&mut self, buf: PacketBuf) {
        self.out.push((buf, Verdict::Consumed));
    }

    /// The other counters.
    #[inline]
    pub(super) fn stats(&mut self) -> &mut Stats {
        self.stats
    }
}
