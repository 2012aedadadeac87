//! Messages the gateway itself sends: ARP replies and requests (RFC 826),
//! ICMP echo replies, time-exceeded and fragmentation-needed errors
//! (RFC 792, RFC 1191, RFC 1812 §4.3.2), and the control plane's UDP
//! datagrams. Replies and errors are written into the buffer of the packet
//! that caused them. ICMP errors pass a token bucket first
//! ([`RateLimiter`]), so that a flood cannot turn the gateway into a
//! reflector (RFC 1812 §4.3.2.8).
//!
//! Owns no state but the rate limiter's buckets, and reads no clock (the
//! caller's `now`). Must not decide whether an address is ours, route, or
//! keep the neighbour table (`neighbor`'s): the gateway decides, and sends
//! what these write.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use smoltcp::wire::{
    ArpHardware, ArpOperation, ArpPacket, EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress,
    IpProtocol, Ipv4Packet, UdpPacket,
};

use crate::buffer::PacketBuf;
use crate::wire::ipv4;

/// ICMP types espgw sends or must not answer (RFC 792).
pub(crate) mod kind {
    /// Echo reply: the answer to a ping of the gateway's own address.
    pub(crate) const ECHO_REPLY: u8 = 0;
    /// Destination unreachable; espgw sends it only with [`FRAG_NEEDED`].
    pub(crate) const DEST_UNREACHABLE: u8 = 3;
    /// Echo request: answered when addressed to the gateway.
    pub(crate) const ECHO_REQUEST: u8 = 8;
    /// Time exceeded (code 0: TTL exceeded in transit), for a packet the
    /// gateway would forward with its TTL run out.
    pub(crate) const TIME_EXCEEDED: u8 = 11;
    /// Code of destination-unreachable: fragmentation needed and DF set.
    pub(crate) const FRAG_NEEDED: u8 = 4;
}

/// Bytes of an ARP packet for Ethernet/IPv4.
const ARP_LEN: usize = 28;

/// A checked ARP request or reply for IPv4 over Ethernet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arp {
    /// Request or reply (any other operation code passes through here as
    /// smoltcp's `Unknown`: the caller decides).
    pub(crate) operation: ArpOperation,
    /// The sender's hardware address: what the neighbour table learns.
    pub(crate) sender_mac: EthernetAddress,
    /// The sender's protocol address; 0.0.0.0 in an ARP probe (RFC 5227).
    pub(crate) sender_ip: Ipv4Addr,
    /// The address asked about (request) or answered to (reply).
    pub(crate) target_ip: Ipv4Addr,
}

/// Parses the ARP packet after the Ethernet header.
pub(crate) fn parse_arp(payload: &[u8]) -> Option<Arp> {
    let p = ArpPacket::new_checked(payload).ok()?;
    if p.hardware_type() != ArpHardware::Ethernet
        || p.protocol_type() != EthernetProtocol::Ipv4
        || p.hardware_len() != 6
        || p.protocol_len() != 4
    {
        return None;
    }
    let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    Some(Arp {
        operation: p.operation(),
        sender_mac: EthernetAddress::from_bytes(p.source_hardware_addr()),
        sender_ip: ip(p.source_protocol_addr()),
        target_ip: ip(p.target_protocol_addr()),
    })
}

fn write_arp(
    out: &mut [u8],
    operation: ArpOperation,
    sender: (EthernetAddress, Ipv4Addr),
    target: (EthernetAddress, Ipv4Addr),
) {
    let mut p = ArpPacket::new_unchecked(out);
    p.set_hardware_type(ArpHardware::Ethernet);
    p.set_protocol_type(EthernetProtocol::Ipv4);
    p.set_hardware_len(6);
    p.set_protocol_len(4);
    p.set_operation(operation);
    p.set_source_hardware_addr(sender.0.as_bytes());
    p.set_source_protocol_addr(&sender.1.octets());
    p.set_target_hardware_addr(target.0.as_bytes());
    p.set_target_protocol_addr(&target.1.octets());
}

/// Writes an Ethernet header into the first 14 bytes of `out`.
pub(crate) fn write_ethernet(
    out: &mut [u8],
    dst: EthernetAddress,
    src: EthernetAddress,
    ethertype: EthernetProtocol,
) {
    let mut f = EthernetFrame::new_unchecked(out);
    f.set_dst_addr(dst);
    f.set_src_addr(src);
    f.set_ethertype(ethertype);
}

/// Rewrites the request in `buf` (a whole Ethernet frame) into our reply.
pub(crate) fn arp_reply_in_place(buf: &mut PacketBuf, request: &Arp, our_mac: EthernetAddress) -> bool {
    if !buf.truncate(14 + ARP_LEN) {
        return false;
    }
    let data = buf.data_mut();
    write_ethernet(
        &mut data[..14],
        request.sender_mac,
        our_mac,
        EthernetProtocol::Arp,
    );
    write_arp(
        &mut data[14..],
        ArpOperation::Reply,
        (our_mac, request.target_ip),
        (request.sender_mac, request.sender_ip),
    );
    true
}

/// Fills `buf` with a broadcast request for `target`.
pub(crate) fn arp_request(buf: &mut PacketBuf, our: (EthernetAddress, Ipv4Addr), target: Ipv4Addr) -> bool {
    buf.reset();
    let Some(frame) = buf.append(14 + ARP_LEN) else {
        return false;
    };
    write_ethernet(
        &mut frame[..14],
        EthernetAddress::BROADCAST,
        our.0,
        EthernetProtocol::Arp,
    );
    write_arp(
        &mut frame[14..],
        ArpOperation::Request,
        our,
        (EthernetAddress([0; 6]), target),
    );
    true
}

/// Turns the echo request in `buf` (an IPv4 packet) into its reply.
pub fn echo_reply_in_place(buf: &mut PacketBuf) -> bool {
    let data = buf.data_mut();
    let Ok(header_len) = ipv4::header_len(data) else {
        return false;
    };
    let Some(icmp) = data.get_mut(header_len..) else {
        return false;
    };
    if icmp.len() < 8 || icmp[0] != kind::ECHO_REQUEST {
        return false;
    }
    icmp[0] = kind::ECHO_REPLY;
    icmp[2..4].copy_from_slice(&[0, 0]);
    let sum = checksum(icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let Ok(mut ip) = ipv4::view_mut(data) else {
        return false;
    };
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    ip.set_src_addr(dst);
    ip.set_dst_addr(src);
    ip.set_hop_limit(64);
    ip.fill_checksum();
    true
}

/// Writes an IPv4/UDP datagram carrying `payload` into the empty `buf`;
/// false if it does not fit.
pub(crate) fn udp_datagram(
    buf: &mut PacketBuf,
    (from, src_port): (Ipv4Addr, u16),
    (to, dst_port): (Ipv4Addr, u16),
    ident: u16,
    payload: &[u8],
) -> bool {
    const HEADERS: usize = 20 + 8;
    let total = HEADERS + payload.len();
    let Ok(total_len) = u16::try_from(total) else {
        return false;
    };
    let Some(data) = buf.append(total) else {
        return false;
    };
    data[HEADERS..].copy_from_slice(payload);
    {
        let mut udp = UdpPacket::new_unchecked(&mut data[20..]);
        udp.set_src_port(src_port);
        udp.set_dst_port(dst_port);
        udp.set_len(total_len - 20);
        udp.fill_checksum(&IpAddress::Ipv4(from), &IpAddress::Ipv4(to));
    }
    let mut ip = Ipv4Packet::new_unchecked(&mut data[..]);
    ip.set_version(4);
    ip.set_header_len(20);
    ip.set_dscp(0);
    ip.set_ecn(0);
    ip.set_total_len(total_len);
    ip.set_ident(ident);
    ip.clear_flags();
    ip.set_frag_offset(0);
    ip.set_hop_limit(64);
    ip.set_next_header(IpProtocol::Udp);
    ip.set_src_addr(from);
    ip.set_dst_addr(to);
    ip.fill_checksum();
    true
}

/// The Internet checksum (RFC 1071) of `data`.
fn checksum(data: &[u8]) -> u16 {
    !smoltcp::wire::checksum::data(data)
}

/// Whether an ICMP error may be sent about this IPv4 packet (RFC 1812
/// §4.3.2.7): not about ICMP errors, non-first fragments, or packets from
/// unspecified, broadcast or multicast sources.
pub(crate) fn may_answer_with_error(packet: &[u8]) -> bool {
    let Ok(ip) = Ipv4Packet::new_checked(packet) else {
        return false;
    };
    let src = ip.src_addr();
    if src.is_unspecified() || src.is_broadcast() || src.is_multicast() || ip.frag_offset() != 0 {
        return false;
    }
    if ip.next_header() == IpProtocol::Icmp {
        let header_len = usize::from(ip.header_len());
        if let Some(&icmp_type) = packet.get(header_len) {
            return icmp_type == kind::ECHO_REQUEST || icmp_type == kind::ECHO_REPLY;
        }
        return false;
    }
    true
}

/// Rewrites the IPv4 packet in `buf` into an ICMP error about it, sent from
/// `from` back to its source: the original header and 8 bytes of its
/// payload follow the ICMP header (RFC 792). `rest` is the second word
/// (the next-hop MTU for fragmentation-needed, RFC 1191).
pub(crate) fn error_in_place(
    buf: &mut PacketBuf,
    icmp_type: u8,
    code: u8,
    rest: u32,
    from: Ipv4Addr,
) -> bool {
    let (quoted, to) = {
        let data = buf.data();
        let Ok(ip) = ipv4::view(data) else {
            return false;
        };
        let header_len = usize::from(ip.header_len());
        ((header_len + 8).min(data.len()), ip.src_addr())
    };
    if !buf.truncate(quoted) || buf.prepend(8).is_none() || buf.prepend(20).is_none() {
        return false;
    }
    let total = buf.len();
    let data = buf.data_mut();
    {
        let icmp = &mut data[20..];
        icmp[0] = icmp_type;
        icmp[1] = code;
        icmp[2..4].copy_from_slice(&[0, 0]);
        icmp[4..8].copy_from_slice(&rest.to_be_bytes());
        let sum = checksum(icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    let mut ip = Ipv4Packet::new_unchecked(&mut data[..]);
    ip.set_version(4);
    ip.set_header_len(20);
    ip.set_dscp(0);
    ip.set_ecn(0);
    ip.set_total_len(total as u16);
    ip.set_ident(0);
    ip.clear_flags();
    ip.set_frag_offset(0);
    ip.set_hop_limit(64);
    ip.set_next_header(IpProtocol::Icmp);
    ip.set_src_addr(from);
    ip.set_dst_addr(to);
    ip.fill_checksum();
    true
}

/// Limits on the ICMP errors the gateway sends (time exceeded,
/// fragmentation needed), as Linux has them: one bucket for the whole
/// gateway (`icmp_msgs_per_sec`, `icmp_msgs_burst`) and one per
/// destination, the source of the offending packet (`icmp_ratelimit`, with
/// the burst of its `XRLIM_BURST_FACTOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpLimits {
    /// Errors per second from the whole gateway.
    pub per_second: u32,
    /// How many of those may go at once.
    pub burst: u32,
    /// One error per source this often; zero: no per-source limit.
    pub per_source_interval: Duration,
    /// How many a source may get at once.
    pub per_source_burst: u32,
    /// Sources tracked at once.
    pub sources: usize,
}

impl Default for IcmpLimits {
    fn default() -> Self {
        IcmpLimits {
            per_second: 1000,
            burst: 50,
            per_source_interval: Duration::from_millis(1000),
            per_source_burst: 6,
            sources: 1024,
        }
    }
}

/// A token bucket kept in nanoseconds of credit, so that refilling from the
/// caller's `now` is exact integer arithmetic: a message costs `cost`, the
/// bucket holds at most `capacity` and gains one nanosecond per nanosecond.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    credit: u64,
    last: Duration,
}

impl Bucket {
    fn full(capacity: u64, now: Duration) -> Bucket {
        Bucket {
            credit: capacity,
            last: now,
        }
    }

    fn refill(&mut self, capacity: u64, now: Duration) {
        let elapsed = u64::try_from(now.saturating_sub(self.last).as_nanos()).unwrap_or(u64::MAX);
        self.credit = self.credit.saturating_add(elapsed).min(capacity);
        self.last = self.last.max(now);
    }
}

/// The ICMP error token buckets. The core never reads a clock: buckets
/// refill from the `now` the driver passes in.
#[derive(Debug)]
pub struct RateLimiter {
    limits: IcmpLimits,
    cost: u64,
    capacity: u64,
    global: Bucket,
    source_cost: u64,
    source_capacity: u64,
    sources: HashMap<IpAddr, Bucket>,
}

impl Default for RateLimiter {
    fn default() -> Self {
        RateLimiter::new(IcmpLimits::default())
    }
}

impl RateLimiter {
    /// Both buckets start full. A zero rate or burst counts as one; a zero
    /// `per_source_interval` turns the per-source buckets off.
    pub fn new(limits: IcmpLimits) -> Self {
        let cost = 1_000_000_000 / u64::from(limits.per_second.max(1));
        let capacity = cost * u64::from(limits.burst.max(1));
        let source_cost = u64::try_from(limits.per_source_interval.as_nanos()).unwrap_or(u64::MAX);
        let source_capacity = source_cost.saturating_mul(u64::from(limits.per_source_burst.max(1)));
        RateLimiter {
            limits,
            cost,
            capacity,
            global: Bucket::full(capacity, Duration::ZERO),
            source_cost,
            source_capacity,
            sources: HashMap::default(),
        }
    }

    /// The limits it was made with.
    pub fn limits(&self) -> IcmpLimits {
        self.limits
    }

    /// Whether an error may go to `to` at `now`; if so, its tokens are
    /// taken from both buckets. The gateway's bucket is asked first, so a
    /// flood that it stops never reaches the per-source table.
    pub fn allow(&mut self, to: impl Into<IpAddr>, now: Duration) -> bool {
        let to = to.into();
        self.global.refill(self.capacity, now);
        if self.global.credit < self.cost {
            return false;
        }
        if self.source_cost > 0 {
            if !self.sources.contains_key(&to) && self.sources.len() >= self.limits.sources.max(1) {
                self.make_room(now);
            }
            let capacity = self.source_capacity;
            let bucket = self
                .sources
                .entry(to)
                .or_insert_with(|| Bucket::full(capacity, now));
            bucket.refill(capacity, now);
            if bucket.credit < self.source_cost {
                return false;
            }
            bucket.credit -= self.source_cost;
        }
        self.global.credit -= self.cost;
        true
    }

    /// Forgets sources whose buckets have filled up again (nothing is lost:
    /// a new bucket starts full), or else the one heard from longest ago.
    /// Runs at most once per error the gateway's bucket lets through.
    fn make_room(&mut self, now: Duration) {
        let capacity = self.source_capacity;
        self.sources.retain(|_, b| {
            let mut b = *b;
            b.refill(capacity, now);
            b.credit < capacity
        });
        if self.sources.len() >= self.limits.sources.max(1) {
            let oldest = self.sources.iter().min_by_key(|(_, b)| b.last).map(|(a, _)| *a);
            if let Some(addr) = oldest {
                self.sources.remove(&addr);
            }
        }
    }

    /// Sources tracked now.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn sent(limiter: &mut RateLimiter, to: Ipv4Addr, now: Duration, tries: usize) -> usize {
        (0..tries).filter(|_| limiter.allow(to, now)).count()
    }

    /// The gateway's bucket: a burst, then `per_second`, never more than
    /// the burst banked, refilled only by the `now` passed in.
    #[test]
    fn the_gateway_bucket_allows_its_burst_then_its_rate() {
        let mut limiter = RateLimiter::new(IcmpLimits {
            per_second: 100,
            burst: 10,
            per_source_interval: Duration::ZERO,
            ..IcmpLimits::default()
        });
        let to = Ipv4Addr::new(192, 168, 1, 10);
        assert_eq!(sent(&mut limiter, to, ms(0), 1000), 10);
        assert_eq!(sent(&mut limiter, to, ms(0), 1000), 0, "time did not move");
        assert_eq!(sent(&mut limiter, to, ms(55), 1000), 5, "5.5 tokens in 55 ms");
        assert_eq!(
            sent(&mut limiter, to, ms(60), 1000),
            1,
            "the half token left and 0.5 more"
        );
        assert_eq!(
            sent(&mut limiter, to, ms(10_000), 1000),
            10,
            "never more than the burst"
        );
        assert_eq!(
            limiter.sources(),
            0,
            "no per-source state without a per-source limit"
        );
    }

    #[test]
    fn each_source_has_its_own_bucket_and_the_table_stays_bounded() {
        let mut limiter = RateLimiter::new(IcmpLimits {
            per_second: 1_000_000,
            burst: 1_000_000,
            per_source_interval: ms(1000),
            per_source_burst: 6,
            sources: 4,
        });
        let a = Ipv4Addr::new(192, 168, 1, 10);
        let b = Ipv4Addr::new(192, 168, 1, 11);
        assert_eq!(sent(&mut limiter, a, ms(0), 100), 6);
        assert_eq!(sent(&mut limiter, b, ms(0), 100), 6);
        assert_eq!(sent(&mut limiter, a, ms(2500), 100), 2);
        assert_eq!(sent(&mut limiter, a, ms(3000), 100), 1);
        // Many sources: the table keeps at most 4.
        for i in 0..100u8 {
            limiter.allow(Ipv4Addr::new(10, 1, 0, i), ms(3000));
            assert!(limiter.sources() <= 4);
        }
        // A forgotten source starts again from a full bucket.
        assert_eq!(sent(&mut limiter, b, ms(3000), 100), 6);
    }
}
