//! Traffic selectors (RFC 4301 §4.4.1.1): address prefixes, protocol and
//! port ranges, and the flow key they are matched against.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Errors in the textual form of a selector field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("`{0}` is not an IPv4 prefix; write it as a.b.c.d/len, e.g. 192.168.1.0/24")]
    BadPrefix(String),
    #[error("prefix `{text}` has host bits set; did you mean {network}/{len}?")]
    HostBitsSet {
        text: String,
        network: Ipv4Addr,
        len: u8,
    },
    #[error("`{0}` is not a port range; write a port (`53`), a range (`1024-65535`) or `any`")]
    BadPorts(String),
    #[error("`{0}` is not a protocol; use any, tcp, udp, icmp or a number 0-255")]
    BadProtocol(String),
}

/// An IPv4 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Prefix {
    addr: Ipv4Addr,
    len: u8,
}

impl Ipv4Prefix {
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

    pub fn addr(self) -> Ipv4Addr {
        self.addr
    }

    pub fn len(self) -> u8 {
        self.len
    }

    pub fn is_empty(self) -> bool {
        false
    }

    pub fn mask(self) -> u32 {
        Self::mask_of(self.len)
    }

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
            network: Ipv4Addr::from(u32::from(addr) & Self::mask_of(len)),
            len,
        })
    }
}

/// An inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub const ANY: PortRange = PortRange {
        first: 0,
        last: u16::MAX,
    };

    pub fn is_any(self) -> bool {
        self == Self::ANY
    }

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
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ESP: u8 = 50;
    pub const SCTP: u8 = 132;
}

/// The protocol part of a selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolSelector {
    Any,
    Number(u8),
}

impl ProtocolSelector {
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
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    /// Ports for TCP, UDP and SCTP first fragments; `None` otherwise
    /// (RFC 4301 §4.4.1.1 OPAQUE), in which case only `any` ports match.
    pub ports: Option<(u16, u16)>,
}

/// A traffic selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Selector {
    pub src: Ipv4Prefix,
    pub dst: Ipv4Prefix,
    pub protocol: ProtocolSelector,
    pub src_ports: PortRange,
    pub dst_ports: PortRange,
}

impl Selector {
    pub const ANY: Selector = Selector {
        src: Ipv4Prefix::ANY,
        dst: Ipv4Prefix::ANY,
        protocol: ProtocolSelector::Any,
        src_ports: PortRange::ANY,
        dst_ports: PortRange::ANY,
    };

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
}
