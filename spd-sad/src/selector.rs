//! Traffic selectors (RFC 4301 §4.4.1.1): address prefixes, protocol and
//! port ranges, and the flow key they are matched against.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Errors in the textual form of a selector field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "`{0}` is not an IP prefix; write it as a.b.c.d/len or an IPv6 prefix, e.g. 192.168.1.0/24 or 2001:db8:1::/48"
    )]
    /// Not an IPv4 or IPv6 prefix.
    BadPrefix(String),
    /// Bits below the prefix length are set (a typo for the network?).
    #[error("prefix `{text}` has host bits set; did you mean {network}/{len}?")]
    HostBitsSet {
        /// The prefix as written.
        text: String,
        /// Its network address (the host bits cleared).
        network: IpAddr,
        /// Its length.
        len: u8,
    },
    /// Source and destination of different families.
    #[error(
        "the selector mixes address families ({src} -> {dst}); an IPv4 prefix and an IPv6 prefix never match one packet: write two policies"
    )]
    MixedFamilies {
        /// The source prefix.
        src: IpPrefix,
        /// The destination prefix, of the other family.
        dst: IpPrefix,
    },
    #[error("`{0}` is not a port range; write a port (`53`), a range (`1024-65535`) or `any`")]
    /// Not a port or a port range.
    BadPorts(String),
    #[error("`{0}` is not a protocol; use any, tcp, udp, icmp or a number 0-255")]
    /// Not a protocol name or number.
    BadProtocol(String),
}

/// An IPv4 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Prefix {
    addr: Ipv4Addr,
    len: u8,
}

impl Ipv4Prefix {
    /// `0.0.0.0/0`: every IPv4 address.
    pub const ANY: Ipv4Prefix = Ipv4Prefix {
        addr: Ipv4Addr::UNSPECIFIED,
        len: 0,
    };

    /// A prefix; `None` if `len > 32` or host bits are set.
    pub fn new(addr: Ipv4Addr, len: u8) -> Option<Self> {
        if len > 32 || u32::from(addr) & !Self::mask_of(len) != 0 {
            return None;
        }
        Some(Ipv4Prefix { addr, len })
    }

    /// The prefix of one address (`/32`).
    pub fn host(addr: Ipv4Addr) -> Self {
        Ipv4Prefix { addr, len: 32 }
    }

    fn mask_of(len: u8) -> u32 {
        if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        }
    }

    /// The network address.
    pub fn addr(self) -> Ipv4Addr {
        self.addr
    }

    /// The prefix length, in bits.
    pub fn len(self) -> u8 {
        self.len
    }

    /// Never: a prefix holds at least one address (for `len`'s sake).
    pub fn is_empty(self) -> bool {
        false
    }

    /// The netmask as a number (the top `len` bits set).
    pub fn mask(self) -> u32 {
        Self::mask_of(self.len)
    }

    /// Whether `addr` is inside the prefix.
    pub fn contains(self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & self.mask() == u32::from(self.addr)
    }
}

impl fmt::Display for Ipv4Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Ipv4Prefix {
    type Err = SelectorError;

    /// Accepts `a.b.c.d/len`, a bare address (a /32) or `any` (0.0.0.0/0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "any" {
            return Ok(Ipv4Prefix::ANY);
        }
        let bad = || SelectorError::BadPrefix(s.to_owned());
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, l.parse::<u8>().map_err(|_| bad())?),
            None => (s, 32),
        };
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        if len > 32 {
            return Err(bad());
        }
        Ipv4Prefix::new(addr, len).ok_or_else(|| SelectorError::HostBitsSet {
            text: s.to_owned(),
            network: IpAddr::V4(Ipv4Addr::from(u32::from(addr) & Self::mask_of(len))),
            len,
        })
    }
}

/// An IPv6 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Prefix {
    addr: Ipv6Addr,
    len: u8,
}

impl Ipv6Prefix {
    /// A prefix; `None` if `len > 128` or host bits are set.
    pub const fn new(addr: Ipv6Addr, len: u8) -> Option<Self> {
        if len > 128 || addr.to_bits() & !Self::mask_of(len) != 0 {
            return None;
        }
        Some(Ipv6Prefix { addr, len })
    }

    const fn mask_of(len: u8) -> u128 {
        if len == 0 {
            0
        } else {
            u128::MAX << (128 - len as u32)
        }
    }

    /// The network address.
    pub fn addr(self) -> Ipv6Addr {
        self.addr
    }

    /// The prefix length, in bits.
    pub fn len(self) -> u8 {
        self.len
    }

    /// Never: a prefix holds at least one address (for `len`'s sake).
    pub fn is_empty(self) -> bool {
        false
    }

    /// The netmask as a number (the top `len` bits set).
    pub fn mask(self) -> u128 {
        Self::mask_of(self.len)
    }

    /// Whether `addr` is inside the prefix.
    pub fn contains(self, addr: Ipv6Addr) -> bool {
        u128::from(addr) & self.mask() == u128::from(self.addr)
    }
}

impl fmt::Display for Ipv6Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Ipv6Prefix {
    type Err = SelectorError;

    /// Accepts `x::y/len` or a bare address (a /128).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || SelectorError::BadPrefix(s.to_owned());
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, l.parse::<u8>().map_err(|_| bad())?),
            None => (s, 128),
        };
        let addr: Ipv6Addr = addr.parse().map_err(|_| bad())?;
        if len > 128 {
            return Err(bad());
        }
        Ipv6Prefix::new(addr, len).ok_or_else(|| SelectorError::HostBitsSet {
            text: s.to_owned(),
            network: IpAddr::V6(Ipv6Addr::from(u128::from(addr) & Self::mask_of(len))),
            len,
        })
    }
}

/// A selector's address field: a prefix of one family, or `any`, which
/// matches every address of either family (so that `any -> any` bypass
/// or discard policies cover IPv4 and IPv6 alike, as strongSwan's
/// `0.0.0.0/0,::/0` pair does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpPrefix {
    /// Every address of either family.
    Any,
    /// An IPv4 prefix.
    V4(Ipv4Prefix),
    /// An IPv6 prefix.
    V6(Ipv6Prefix),
}

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpPrefix {
    /// The family this prefix is limited to; `None` for `any`.
    pub fn family(self) -> Option<Family> {
        match self {
            IpPrefix::Any => None,
            IpPrefix::V4(_) => Some(Family::V4),
            IpPrefix::V6(_) => Some(Family::V6),
        }
    }

    /// Prefix length; 0 for `any`.
    pub fn len(self) -> u8 {
        match self {
            IpPrefix::Any => 0,
            IpPrefix::V4(p) => p.len(),
            IpPrefix::V6(p) => p.len(),
        }
    }

    /// Never: a prefix holds at least one address (for `len`'s sake).
    pub fn is_empty(self) -> bool {
        false
    }

    /// Whether `addr` is inside the prefix (`Any` holds every address).
    pub fn contains(self, addr: IpAddr) -> bool {
        match (self, addr) {
            (IpPrefix::Any, _) => true,
            (IpPrefix::V4(p), IpAddr::V4(a)) => p.contains(a),
            (IpPrefix::V6(p), IpAddr::V6(a)) => p.contains(a),
            _ => false,
        }
    }
}

impl From<Ipv4Prefix> for IpPrefix {
    fn from(p: Ipv4Prefix) -> Self {
        IpPrefix::V4(p)
    }
}

impl From<Ipv6Prefix> for IpPrefix {
    fn from(p: Ipv6Prefix) -> Self {
        IpPrefix::V6(p)
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpPrefix::Any => f.write_str("any"),
            IpPrefix::V4(p) => p.fmt(f),
            IpPrefix::V6(p) => p.fmt(f),
        }
    }
}

impl FromStr for IpPrefix {
    type Err = SelectorError;

    /// `any`, an IPv4 prefix or address, or an IPv6 prefix or address.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "any" {
            Ok(IpPrefix::Any)
        } else if s.contains(':') {
            s.parse().map(IpPrefix::V6)
        } else {
            s.parse().map(IpPrefix::V4)
        }
    }
}

/// An inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// The lowest port of the range.
    pub first: u16,
    /// The highest port of the range (equal to `first` for one port).
    pub last: u16,
}

impl PortRange {
    /// Every port, 0 to 65535.
    pub const ANY: PortRange = PortRange {
        first: 0,
        last: u16::MAX,
    };

    /// Whether the range is every port.
    pub fn is_any(self) -> bool {
        self == Self::ANY
    }

    /// Whether `port` is inside the range.
    pub fn contains(self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_any() {
            f.write_str("any")
        } else if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl FromStr for PortRange {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "any" {
            return Ok(PortRange::ANY);
        }
        let bad = || SelectorError::BadPorts(s.to_owned());
        let (first, last) = match s.split_once('-') {
            Some((a, b)) => (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            ),
            None => {
                let p = s.trim().parse().map_err(|_| bad())?;
                (p, p)
            }
        };
        if first > last {
            return Err(bad());
        }
        Ok(PortRange { first, last })
    }
}

/// IP protocol numbers that selectors name.
pub mod proto {
    /// Internet Control Message Protocol.
    pub const ICMP: u8 = 1;
    /// Transmission Control Protocol.
    pub const TCP: u8 = 6;
    /// User Datagram Protocol.
    pub const UDP: u8 = 17;
    /// Encapsulating Security Payload (RFC 4303).
    pub const ESP: u8 = 50;
    /// Stream Control Transmission Protocol.
    pub const SCTP: u8 = 132;
}

/// The protocol part of a selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolSelector {
    /// Every protocol.
    Any,
    /// One IP protocol number (see [`proto`]).
    Number(u8),
}

impl ProtocolSelector {
    /// Whether packets of `protocol` match.
    pub fn matches(self, protocol: u8) -> bool {
        match self {
            ProtocolSelector::Any => true,
            ProtocolSelector::Number(n) => n == protocol,
        }
    }
}

impl fmt::Display for ProtocolSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolSelector::Any => f.write_str("any"),
            ProtocolSelector::Number(proto::TCP) => f.write_str("tcp"),
            ProtocolSelector::Number(proto::UDP) => f.write_str("udp"),
            ProtocolSelector::Number(proto::ICMP) => f.write_str("icmp"),
            ProtocolSelector::Number(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for ProtocolSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "any" => ProtocolSelector::Any,
            "tcp" => ProtocolSelector::Number(proto::TCP),
            "udp" => ProtocolSelector::Number(proto::UDP),
            "icmp" => ProtocolSelector::Number(proto::ICMP),
            "sctp" => ProtocolSelector::Number(proto::SCTP),
            other => ProtocolSelector::Number(
                other
                    .parse()
                    .map_err(|_| SelectorError::BadProtocol(other.to_owned()))?,
            ),
        })
    }
}

/// The fields of a packet that selectors look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// The inner source address.
    pub src: IpAddr,
    /// The inner destination address.
    pub dst: IpAddr,
    /// The upper-layer protocol (for IPv6, the next header after the
    /// extension headers).
    pub protocol: u8,
    /// Ports for TCP, UDP and SCTP first fragments; `None` otherwise
    /// (RFC 4301 §4.4.1.1 OPAQUE), in which case only `any` ports match.
    pub ports: Option<(u16, u16)>,
}

/// A traffic selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Selector {
    /// Where the traffic comes from.
    pub src: IpPrefix,
    /// Where the traffic goes.
    pub dst: IpPrefix,
    /// Which upper-layer protocol.
    pub protocol: ProtocolSelector,
    /// Which source ports (TCP, UDP and SCTP only).
    pub src_ports: PortRange,
    /// Which destination ports (TCP, UDP and SCTP only).
    pub dst_ports: PortRange,
}

impl Selector {
    /// Matches every packet.
    pub const ANY: Selector = Selector {
        src: IpPrefix::Any,
        dst: IpPrefix::Any,
        protocol: ProtocolSelector::Any,
        src_ports: PortRange::ANY,
        dst_ports: PortRange::ANY,
    };

    /// The families this selector can match: one, or both when both
    /// addresses are `any`. Refuses a selector whose two prefixes are of
    /// different families, which could match nothing.
    pub fn families(&self) -> Result<&'static [Family], SelectorError> {
        match (self.src.family(), self.dst.family()) {
            (None, None) => Ok(&[Family::V4, Family::V6]),
            (Some(Family::V4), None | Some(Family::V4)) | (None, Some(Family::V4)) => Ok(&[Family::V4]),
            (Some(Family::V6), None | Some(Family::V6)) | (None, Some(Family::V6)) => Ok(&[Family::V6]),
            _ => Err(SelectorError::MixedFamilies {
                src: self.src,
                dst: self.dst,
            }),
        }
    }

    /// Whether `flow` matches every field of the selector.
    pub fn matches(&self, flow: &FlowKey) -> bool {
        if !(self.src.contains(flow.src)
            && self.dst.contains(flow.dst)
            && self.protocol.matches(flow.protocol))
        {
            return false;
        }
        match flow.ports {
            Some((sp, dp)) => self.src_ports.contains(sp) && self.dst_ports.contains(dp),
            None => self.src_ports.is_any() && self.dst_ports.is_any(),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} proto {}", self.src, self.dst, self.protocol)?;
        if !self.src_ports.is_any() || !self.dst_ports.is_any() {
            write!(f, " ports {} -> {}", self.src_ports, self.dst_ports)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(src: &str, dst: &str, protocol: u8, ports: Option<(u16, u16)>) -> FlowKey {
        FlowKey {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol,
            ports,
        }
    }

    #[test]
    fn prefixes_parse_and_match() {
        let p: Ipv4Prefix = "192.168.1.0/24".parse().unwrap();
        assert!(p.contains("192.168.1.77".parse().unwrap()));
        assert!(!p.contains("192.168.2.1".parse().unwrap()));
        assert_eq!("any".parse::<Ipv4Prefix>().unwrap(), Ipv4Prefix::ANY);
        assert_eq!("10.0.0.1".parse::<Ipv4Prefix>().unwrap().len(), 32);
        let err = "192.168.1.5/24".parse::<Ipv4Prefix>().unwrap_err();
        assert!(err.to_string().contains("192.168.1.0/24"), "{err}");
        assert!("192.168.1.0/33".parse::<Ipv4Prefix>().is_err());
        assert!("nonsense".parse::<Ipv4Prefix>().is_err());
        assert!(Ipv4Prefix::ANY.contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn ports_and_protocols_parse() {
        assert_eq!(
            "53".parse::<PortRange>().unwrap(),
            PortRange { first: 53, last: 53 }
        );
        assert_eq!(
            "1024-2048".parse::<PortRange>().unwrap(),
            PortRange {
                first: 1024,
                last: 2048
            }
        );
        assert!("2048-1024".parse::<PortRange>().is_err());
        assert!("70000".parse::<PortRange>().is_err());
        assert_eq!(
            "udp".parse::<ProtocolSelector>().unwrap(),
            ProtocolSelector::Number(17)
        );
        assert_eq!(
            "47".parse::<ProtocolSelector>().unwrap(),
            ProtocolSelector::Number(47)
        );
        assert!("gre!".parse::<ProtocolSelector>().is_err());
    }

    #[test]
    fn selector_matching_respects_every_field() {
        let sel = Selector {
            src: "10.1.0.0/16".parse().unwrap(),
            dst: "10.2.0.0/16".parse().unwrap(),
            protocol: ProtocolSelector::Number(proto::UDP),
            src_ports: PortRange::ANY,
            dst_ports: "53".parse().unwrap(),
        };
        assert!(sel.matches(&flow("10.1.2.3", "10.2.0.9", proto::UDP, Some((4000, 53)))));
        assert!(!sel.matches(&flow("10.1.2.3", "10.2.0.9", proto::UDP, Some((4000, 54)))));
        assert!(!sel.matches(&flow("10.1.2.3", "10.2.0.9", proto::TCP, Some((4000, 53)))));
        assert!(!sel.matches(&flow("10.3.2.3", "10.2.0.9", proto::UDP, Some((4000, 53)))));
        // A non-first fragment carries no ports: only an any-port selector matches it.
        assert!(!sel.matches(&flow("10.1.2.3", "10.2.0.9", proto::UDP, None)));
        assert!(Selector::ANY.matches(&flow("1.2.3.4", "5.6.7.8", proto::ICMP, None)));
    }

    #[test]
    fn ipv6_prefixes_parse_match_and_keep_to_their_family() {
        let p: IpPrefix = "2001:db8:1::/48".parse().unwrap();
        assert!(p.contains("2001:db8:1:ff::9".parse().unwrap()));
        assert!(!p.contains("2001:db8:2::1".parse().unwrap()));
        assert!(!p.contains("10.0.0.1".parse().unwrap()));
        assert_eq!("2001:db8::1".parse::<IpPrefix>().unwrap().len(), 128);
        let err = "2001:db8::1/64".parse::<IpPrefix>().unwrap_err();
        assert!(err.to_string().contains("2001:db8::/64"), "{err}");
        assert!("2001:db8::/129".parse::<IpPrefix>().is_err());
        let v4_all: IpPrefix = "0.0.0.0/0".parse().unwrap();
        assert!(v4_all.contains("8.8.8.8".parse().unwrap()));
        assert!(!v4_all.contains("::1".parse().unwrap()));
        let v6_all: IpPrefix = "::/0".parse().unwrap();
        assert!(!v6_all.contains("8.8.8.8".parse().unwrap()));
        assert!(IpPrefix::Any.contains("::1".parse().unwrap()));
        assert!(IpPrefix::Any.contains("8.8.8.8".parse().unwrap()));
        assert_eq!(p.to_string(), "2001:db8:1::/48");
    }

    #[test]
    fn a_selector_matches_one_family_or_both_when_all_any() {
        let v6 = Selector {
            src: "2001:db8:1::/48".parse().unwrap(),
            dst: IpPrefix::Any,
            ..Selector::ANY
        };
        assert_eq!(v6.families().unwrap(), &[Family::V6]);
        assert!(v6.matches(&flow("2001:db8:1::5", "2001:db8:2::5", proto::TCP, Some((1, 2)))));
        assert!(!v6.matches(&flow("10.0.0.1", "10.0.0.2", proto::TCP, Some((1, 2)))));
        assert_eq!(Selector::ANY.families().unwrap(), &[Family::V4, Family::V6]);
        let mixed = Selector {
            src: "10.0.0.0/8".parse().unwrap(),
            dst: "2001:db8::/32".parse().unwrap(),
            ..Selector::ANY
        };
        let err = mixed.families().unwrap_err();
        assert!(err.to_string().contains("write two policies"), "{err}");
    }
}
