//! Transmit-side coalescing (GRO before the wire): consecutive TCP/IPv4
//! segments of one flow that leave by the same port in one batch are sent
//! as one GSO super-packet behind a virtio-net header (`gso_type` TCPV4,
//! `gso_size` the segment size, the checksum left partial), the way a
//! virtio guest hands its host a TSO frame. The kernel then moves one
//! buffer instead of dozens: the veth peer's stack takes it whole, as it
//! takes the kernel's own forwarded GRO packets, and a device without
//! TSO gets it cut again by the kernel's software GSO into the very
//! segments that were merged.
//!
//! Segments are merged under the rules of Linux's `tcp_gro_receive` and
//! `inet_gro_receive`, so that segmenting the result gives back the same
//! packets: same Ethernet header, IPv4 header without options, same TOS,
//! TTL, DF and addresses, not fragmented, IDs counting up by one unless DF
//! is set; same ports, ACK number, window and TCP options; ACK (and ECE)
//! only, PSH on the last segment only; sequence numbers contiguous; every
//! segment but the last exactly the first's payload size; at most 64 KiB.
//! Every segment's IPv4 and TCP checksums are verified first: a damaged
//! one is sent alone, as it came, so that the receiver still drops it (a
//! super-packet's checksums are computed afresh, which would launder it).
//!
//! UDP/IPv4 datagrams of one flow go out the same way as a UDP GSO
//! super-packet (`gso_type` UDP_L4, as `__udp_gso_segment` cuts it): same
//! headers and ports, IDs counting up unless DF, every datagram but the
//! last exactly the first's size. That is what carries RFC 3948 ESP
//! between two gateways (a tunnel's ESP-in-UDP datagrams are one flow, and
//! one size for one size of inner packet), and a flood of equal
//! datagrams to one inside host. A datagram with a nonzero checksum is
//! verified first, like a TCP segment; a zero one (ESP in UDP, RFC 3948
//! §2.1) has nothing to launder.
//!
//! Pure: it plans and rewrites headers in byte slices, the driver
//! ([`crate::afpacket`]) builds the scatter lists. No allocation.

use dataplane::wire::checksum::{fold, ones_sum, pseudo_header_sum};
use dataplane::wire::vnet::{Gso, VnetHeader, VnetRepr, HEADER_LEN};

const ETHERNET_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const UDP_LEN: usize = 8;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;
const TCP_ECE: u8 = 0x40;
const IPV4_DF: u8 = 0x40;
/// Largest IPv4 total length of a super-packet.
const MAX_TOTAL: usize = 65_535;

/// Most frames one plan covers (and segments one super-packet holds).
pub const MAX_FRAMES: usize = 64;

/// One message of a plan: frames `start..start + count` go out as one
/// frame; a super-packet when `count > 1`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Message {
    /// Index of its first frame in the batch that was planned.
    pub start: usize,
    /// Frames it carries, at least 1.
    pub count: usize,
    /// The virtio-net header to send before it.
    pub header: [u8; HEADER_LEN],
}

/// How a batch of frames goes out: the messages, and for each frame the
/// bytes of it that are sent (the whole first frame of a message, only
/// the payload of the frames merged behind it).
#[derive(Debug, Clone)]
pub struct Plan {
    /// The messages in sending order; only the first [`len`](Self::len)
    /// are this plan's (see [`messages`](Self::messages)).
    pub messages: [Message; MAX_FRAMES],
    /// How many messages the plan has.
    pub len: usize,
    /// For each planned frame, by its index in the batch, the byte range
    /// of it that is sent: up to the end of its IP packet (trailing
    /// Ethernet padding left out), and from the end of its headers for a
    /// frame merged behind another.
    pub spans: [(usize, usize); MAX_FRAMES],
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            messages: [Message::default(); MAX_FRAMES],
            len: 0,
            spans: [(0, 0); MAX_FRAMES],
        }
    }
}

impl Plan {
    /// The plan's messages, in sending order.
    pub fn messages(&self) -> &[Message] {
        &self.messages[..self.len]
    }

    /// Super-packets in the plan and the segments they hold.
    pub fn merged(&self) -> (u64, u64) {
        self.messages()
            .iter()
            .filter(|m| m.count > 1)
            .fold((0, 0), |(p, s), m| (p + 1, s + m.count as u64))
    }
}

/// The IPv4 packet of `frame` and its total length, if it is what both
/// merges take: IPv4 over Ethernet without options, of `protocol`, not
/// fragmented, at least `min_total` bytes, with a right header checksum.
fn whole_ipv4(frame: &[u8], protocol: u8, min_total: usize) -> Option<(&[u8], usize)> {
    let ip = frame.get(ETHERNET_LEN..)?;
    if frame[12..14] != [0x08, 0x00] || ip.len() < IPV4_LEN || ip[0] != 0x45 || ip[9] != protocol {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff;
    if fragment != 0 || total > ip.len() || total < min_total || fold(ones_sum(&ip[..IPV4_LEN], 0)) != 0 {
        return None;
    }
    Some((ip, total))
}

/// Gives the first frame's IPv4 header the super-packet's total length,
/// and the checksum that goes with it.
fn set_total_len(frame: &mut [u8], total: usize) {
    let ip = ETHERNET_LEN;
    frame[ip + 2..ip + 4].copy_from_slice(&(total as u16).to_be_bytes());
    frame[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
    let header_sum = fold(ones_sum(&frame[ip..ip + IPV4_LEN], 0));
    frame[ip + 10..ip + 12].copy_from_slice(&header_sum.to_be_bytes());
}

/// What of a TCP/IPv4 segment decides whether it can be merged.
#[derive(Debug, Clone, Copy)]
struct Segment {
    /// Ethernet + IPv4 + TCP header bytes.
    header_len: usize,
    /// Ethernet + IPv4 total length: where the segment ends in its frame.
    end: usize,
    payload: usize,
    seq: u32,
    id: u16,
    flags: u8,
    df: bool,
}

impl Segment {
    /// A merge candidate: TCP/IPv4 over Ethernet without IP options, not
    /// fragmented, ACK (and ECE) with or without PSH, some payload, and a
    /// right checksum.
    fn parse(frame: &[u8]) -> Option<Segment> {
        let (ip, total) = whole_ipv4(frame, PROTO_TCP, IPV4_LEN + 20)?;
        let tcp = &ip[IPV4_LEN..total];
        let tcp_header = usize::from(tcp[12] >> 4) * 4;
        if tcp_header < 20 || tcp_header >= tcp.len() {
            return None;
        }
        let flags = tcp[13];
        if flags & !(TCP_ECE | TCP_PSH) != TCP_ACK {
            return None;
        }
        if fold(ones_sum(tcp, pseudo_header_sum(ip, PROTO_TCP, tcp.len()))) != 0 {
            return None;
        }
        Some(Segment {
            header_len: ETHERNET_LEN + IPV4_LEN + tcp_header,
            end: ETHERNET_LEN + total,
            payload: tcp.len() - tcp_header,
            seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
            id: u16::from_be_bytes([ip[4], ip[5]]),
            flags,
            df: ip[6] & IPV4_DF != 0,
        })
    }
}

/// What of a UDP/IPv4 datagram decides whether it can be merged.
#[derive(Debug, Clone, Copy)]
struct Datagram {
    /// Ethernet + IPv4 total length: where the datagram ends in its frame.
    end: usize,
    payload: usize,
    id: u16,
    df: bool,
}

impl Datagram {
    /// A merge candidate: UDP/IPv4 over Ethernet without IP options, not
    /// fragmented, some payload, lengths that agree, a right checksum (or
    /// none).
    fn parse(frame: &[u8]) -> Option<Datagram> {
        let (ip, total) = whole_ipv4(frame, PROTO_UDP, IPV4_LEN + UDP_LEN + 1)?;
        let udp = &ip[IPV4_LEN..total];
        if usize::from(u16::from_be_bytes([udp[4], udp[5]])) != udp.len() {
            return None;
        }
        if udp[6..8] != [0, 0] && fold(ones_sum(udp, pseudo_header_sum(ip, PROTO_UDP, udp.len()))) != 0 {
            return None;
        }
        Some(Datagram {
            end: ETHERNET_LEN + total,
            payload: udp.len() - UDP_LEN,
            id: u16::from_be_bytes([ip[4], ip[5]]),
            df: ip[6] & IPV4_DF != 0,
        })
    }
}

/// Whether `next` may follow `first` in one super-packet as far as the
/// headers of any flow go, and all a UDP super-packet asks: Ethernet
/// header; IPv4 TOS, flags, TTL, protocol, addresses; ports (the first
/// four bytes of TCP and UDP alike).
fn same_flow_headers(first: &[u8], next: &[u8]) -> bool {
    let ip = ETHERNET_LEN;
    let l4 = ETHERNET_LEN + IPV4_LEN;
    first[..ip + 2] == next[..ip + 2]
        && first[ip + 6] & 0xe0 == next[ip + 6] & 0xe0
        && first[ip + 8..ip + 10] == next[ip + 8..ip + 10]
        && first[ip + 12..ip + 20] == next[ip + 12..ip + 20]
        && first[l4..l4 + 4] == next[l4..l4 + 4]
}

/// Whether `next` may follow `first` in one TCP super-packet, header-wise:
/// the bytes that must be equal are those of [`same_flow_headers`] and
/// the TCP ACK number, data offset, window, urgent pointer and options.
fn same_tcp_headers(first: &[u8], next: &[u8], header_len: usize) -> bool {
    let tcp = ETHERNET_LEN + IPV4_LEN;
    same_flow_headers(first, next)
        && first[tcp + 8..tcp + 13] == next[tcp + 8..tcp + 13]
        && first[tcp + 14..tcp + 16] == next[tcp + 14..tcp + 16]
        && first[tcp + 18..header_len] == next[tcp + 18..header_len]
}

/// Plans how `frames` (at most [`MAX_FRAMES`]) go out, and rewrites the
/// headers of each super-packet's first frame: IPv4 total length and
/// header checksum, PSH if the last segment had it, and the TCP checksum
/// field holding the pseudo-header sum for the kernel to complete. UDP is
/// merged only when `udp` (the kernel takes UDP GSO from the socket).
pub fn plan(frames: &mut [&mut [u8]], plan: &mut Plan, udp: bool) {
    plan.len = 0;
    let n = frames.len().min(MAX_FRAMES);
    let mut i = 0;
    while i < n {
        let alone = Message {
            start: i,
            count: 1,
            header: [0; HEADER_LEN],
        };
        plan.spans[i] = (0, frames[i].len());
        let Some(first) = Segment::parse(frames[i]) else {
            let message = match Datagram::parse(frames[i]) {
                Some(first) if udp => plan_udp(frames, plan, i, n, first),
                _ => alone,
            };
            plan.messages[plan.len] = message;
            plan.len += 1;
            i += message.count;
            continue;
        };
        plan.spans[i] = (0, first.end);
        let mut last = first;
        let mut count = 1;
        let mut total = first.end - ETHERNET_LEN;
        while i + count < n && last.payload == first.payload && last.flags & TCP_PSH == 0 {
            let j = i + count;
            let Some(next) = Segment::parse(frames[j]) else {
                break;
            };
            let fits = next.header_len == first.header_len
                && next.payload <= first.payload
                && next.seq == last.seq.wrapping_add(last.payload as u32)
                && next.flags & !TCP_PSH == first.flags
                && next.df == first.df
                && (first.df || next.id == first.id.wrapping_add(count as u16))
                && total + next.payload <= MAX_TOTAL
                && same_tcp_headers(frames[i], frames[j], first.header_len);
            if !fits {
                break;
            }
            plan.spans[j] = (first.header_len, next.end);
            total += next.payload;
            last = next;
            count += 1;
        }
        let mut message = Message { count, ..alone };
        if count > 1 {
            rewrite_first(frames[i], &first, total, last.flags & TCP_PSH);
            message.header = super_packet_header(Gso::TcpV4, 16, first.payload, first.header_len);
        }
        plan.messages[plan.len] = message;
        plan.len += 1;
        i += count;
    }
}

/// The message of UDP datagrams starting at frame `i`, whose first is
/// `first`: as many as may follow it, with the first frame's headers made
/// those of the super-packet.
fn plan_udp(frames: &mut [&mut [u8]], plan: &mut Plan, i: usize, n: usize, first: Datagram) -> Message {
    plan.spans[i] = (0, first.end);
    let header_len = ETHERNET_LEN + IPV4_LEN + UDP_LEN;
    let mut last = first;
    let mut count = 1;
    let mut total = first.end - ETHERNET_LEN;
    // Only the last datagram may be shorter (then it ends the run).
    while i + count < n && last.payload == first.payload {
        let j = i + count;
        let Some(next) = Datagram::parse(frames[j]) else {
            break;
        };
        let fits = next.payload <= first.payload
            && next.df == first.df
            && (first.df || next.id == first.id.wrapping_add(count as u16))
            && total + next.payload <= MAX_TOTAL
            && same_flow_headers(frames[i], frames[j]);
        if !fits {
            break;
        }
        plan.spans[j] = (header_len, next.end);
        total += next.payload;
        last = next;
        count += 1;
    }
    let mut message = Message {
        start: i,
        count,
        header: [0; HEADER_LEN],
    };
    if count > 1 {
        let frame = &mut *frames[i];
        let ip = ETHERNET_LEN;
        let udp = ETHERNET_LEN + IPV4_LEN;
        set_total_len(frame, total);
        let udp_len = total - IPV4_LEN;
        frame[udp + 4..udp + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        // The partial-checksum convention, as for TCP; `__udp_gso_segment`
        // swaps the super-packet's length in this sum for each datagram's.
        let pseudo_sum = !fold(pseudo_header_sum(&frame[ip..], PROTO_UDP, udp_len));
        frame[udp + 6..udp + 8].copy_from_slice(&pseudo_sum.to_be_bytes());
        message.header = super_packet_header(Gso::UdpL4, 6, first.payload, header_len);
    }
    message
}

/// The virtio-net header of an IPv4 super-packet: `gso` segments of
/// `gso_size` payload bytes after `hdr_len` bytes of headers, with the L4
/// checksum (`csum_offset` bytes into the L4 header) left partial for the
/// kernel to complete.
fn super_packet_header(gso: Gso, csum_offset: u16, gso_size: usize, hdr_len: usize) -> [u8; HEADER_LEN] {
    let repr = VnetRepr {
        partial_csum: Some(((ETHERNET_LEN + IPV4_LEN) as u16, csum_offset)),
        data_valid: false,
        gso,
        gso_ecn: false,
        gso_size: gso_size as u16,
        hdr_len: hdr_len as u16,
    };
    let mut header = [0; HEADER_LEN];
    repr.emit(&mut VnetHeader::new_unchecked(&mut header[..]));
    header
}

/// The first frame's headers made those of the whole super-packet.
fn rewrite_first(frame: &mut [u8], first: &Segment, total: usize, psh: u8) {
    let ip = ETHERNET_LEN;
    let tcp = ETHERNET_LEN + IPV4_LEN;
    set_total_len(frame, total);
    frame[tcp + 13] = first.flags | psh;
    // The partial-checksum convention: the folded pseudo-header sum, not
    // complemented; the kernel (or the device) adds the rest.
    let pseudo_sum = !fold(pseudo_header_sum(&frame[ip..], PROTO_TCP, total - IPV4_LEN));
    frame[tcp + 16..tcp + 18].copy_from_slice(&pseudo_sum.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload;
    use dataplane::wire::vnet::{VnetRepr, HEADER_LEN};

    const MSS: usize = 1448;

    /// A TCP/IPv4 segment with timestamps, right checksums, `payload`
    /// bytes counting from `seq`.
    fn segment(seq: u32, id: u16, payload: usize, flags: u8) -> Vec<u8> {
        let tcp_header = 32;
        let total = IPV4_LEN + tcp_header + payload;
        let mut f = vec![0u8; ETHERNET_LEN + total];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = ETHERNET_LEN;
        f[ip] = 0x45;
        f[ip + 2..ip + 4].copy_from_slice(&(total as u16).to_be_bytes());
        f[ip + 4..ip + 6].copy_from_slice(&id.to_be_bytes());
        f[ip + 6] = IPV4_DF;
        f[ip + 8] = 63;
        f[ip + 9] = PROTO_TCP;
        f[ip + 12..ip + 16].copy_from_slice(&[192, 168, 1, 10]);
        f[ip + 16..ip + 20].copy_from_slice(&[192, 168, 2, 20]);
        let t = ip + IPV4_LEN;
        f[t..t + 2].copy_from_slice(&5201u16.to_be_bytes());
        f[t + 2..t + 4].copy_from_slice(&40000u16.to_be_bytes());
        f[t + 4..t + 8].copy_from_slice(&seq.to_be_bytes());
        f[t + 8..t + 12].copy_from_slice(&77u32.to_be_bytes());
        f[t + 12] = ((tcp_header / 4) as u8) << 4;
        f[t + 13] = flags;
        f[t + 14..t + 16].copy_from_slice(&502u16.to_be_bytes());
        // NOP NOP timestamps.
        f[t + 20..t + 24].copy_from_slice(&[1, 1, 8, 10]);
        f[t + 24..t + 28].copy_from_slice(&1234u32.to_be_bytes());
        for (k, b) in f[t + tcp_header..].iter_mut().enumerate() {
            *b = (seq as usize + k) as u8;
        }
        fix(&mut f);
        f
    }

    fn fix(f: &mut [u8]) {
        let ip = ETHERNET_LEN;
        f[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
        let s = fold(ones_sum(&f[ip..ip + IPV4_LEN], 0));
        f[ip + 10..ip + 12].copy_from_slice(&s.to_be_bytes());
        let t = ip + IPV4_LEN;
        f[t + 16..t + 18].copy_from_slice(&[0, 0]);
        let mut pseudo = [0u8; 12];
        pseudo[..8].copy_from_slice(&f[ip + 12..ip + 20]);
        pseudo[9] = PROTO_TCP;
        pseudo[10..12].copy_from_slice(&((f.len() - t) as u16).to_be_bytes());
        let s = fold(ones_sum(&f[t..], ones_sum(&pseudo, 0)));
        f[t + 16..t + 18].copy_from_slice(&s.to_be_bytes());
    }

    fn run(frames: &mut [Vec<u8>]) -> Plan {
        let mut refs: Vec<&mut [u8]> = frames.iter_mut().map(|f| &mut f[..]).collect();
        let mut p = Plan::default();
        plan(&mut refs, &mut p, true);
        p
    }

    /// What the receiver of message `m` gets: the bytes sent, put back
    /// together, then cut by the kernel's rules (the driver's own GSO
    /// segmentation, [`offload::prepare`], stands in for the kernel's).
    fn resegment(frames: &[Vec<u8>], p: &Plan, m: &Message) -> Vec<Vec<u8>> {
        let mut bytes = Vec::new();
        let range = m.start..m.start + m.count;
        for (frame, &(from, to)) in frames[range.clone()].iter().zip(&p.spans[range]) {
            bytes.extend_from_slice(&frame[from..to]);
        }
        if m.count == 1 {
            return vec![bytes];
        }
        let mut pool = dataplane::buffer::PacketPool::new(128);
        let mut buf = pool.alloc().expect("a buffer");
        buf.reset();
        let head = bytes.len().min(dataplane::buffer::MAX_FRAME);
        buf.append(head).expect("room").copy_from_slice(&bytes[..head]);
        let mut out = Vec::new();
        let mut counters = offload::OffloadCounters::default();
        offload::prepare(&m.header, buf, &bytes[head..], &mut pool, &mut out, &mut counters);
        assert_eq!(
            counters.drops_total(),
            0,
            "the kernel would refuse it: {counters:?}"
        );
        let segments = out.iter().map(|b| b.data().to_vec()).collect();
        for b in out {
            pool.free(b);
        }
        segments
    }

    #[test]
    fn a_run_of_one_flow_becomes_one_super_packet_that_cuts_back_into_it() {
        let mut frames: Vec<Vec<u8>> = (0..5)
            .map(|k| {
                let (payload, flags) = if k == 4 {
                    (300, TCP_ACK | TCP_PSH)
                } else {
                    (MSS, TCP_ACK)
                };
                // The kernel's GSO counts the IDs up, DF or not.
                segment(1000 + (k * MSS) as u32, 9 + k as u16, payload, flags)
            })
            .collect();
        let originals = frames.clone();
        let p = run(&mut frames);
        assert_eq!(p.messages().len(), 1);
        let m = p.messages()[0];
        assert_eq!((m.start, m.count), (0, 5));
        let repr = VnetRepr::parse_bytes(&m.header).expect("header");
        assert_eq!(repr.gso, Gso::TcpV4);
        assert_eq!(repr.gso_size as usize, MSS);
        assert_eq!(repr.hdr_len, 66);
        assert_eq!(repr.partial_csum, Some((34, 16)));
        assert_eq!(p.merged(), (1, 5));
        let back = resegment(&frames, &p, &m);
        assert_eq!(
            back, originals,
            "segmenting the super-packet gives back the segments"
        );
    }

    #[test]
    fn a_damaged_segment_is_sent_alone_as_it_came() {
        let mut frames: Vec<Vec<u8>> = (0..4)
            .map(|k| segment(1000 + (k * MSS) as u32, 9, MSS, TCP_ACK))
            .collect();
        let last = frames[2].len() - 1;
        frames[2][last] ^= 0x01;
        let damaged = frames[2].clone();
        let p = run(&mut frames);
        let counts: Vec<_> = p.messages().iter().map(|m| (m.start, m.count)).collect();
        assert_eq!(counts, vec![(0, 2), (2, 1), (3, 1)]);
        assert_eq!(frames[2], damaged);
        assert_eq!(p.messages()[1].header, [0; HEADER_LEN]);
        // The same for a damaged IPv4 header checksum (found by the
        // tx_coalesce fuzz target: it was merged and so repaired).
        let mut frames: Vec<Vec<u8>> = (0..3)
            .map(|k| segment(1000 + (k * MSS) as u32, 9, MSS, TCP_ACK))
            .collect();
        frames[1][ETHERNET_LEN + 10] ^= 0x40;
        let counts: Vec<_> = run(&mut frames).messages().iter().map(|m| m.count).collect();
        assert_eq!(counts, vec![1, 1, 1]);
    }

    #[test]
    fn gaps_other_flows_short_segments_and_flags_end_a_super_packet() {
        let other_flow = {
            let mut f = segment(1000 + 2 * MSS as u32, 9, MSS, TCP_ACK);
            f[ETHERNET_LEN + IPV4_LEN + 3] ^= 1;
            fix(&mut f);
            f
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("a sequence gap", segment(1001 + 2 * MSS as u32, 9, MSS, TCP_ACK)),
            ("another flow", other_flow),
            ("FIN", segment(1000 + 2 * MSS as u32, 9, MSS, TCP_ACK | 0x01)),
            (
                "a bigger segment",
                segment(1000 + 2 * MSS as u32, 9, MSS + 1, TCP_ACK),
            ),
            ("another TTL", {
                let mut f = segment(1000 + 2 * MSS as u32, 9, MSS, TCP_ACK);
                f[ETHERNET_LEN + 8] = 62;
                fix(&mut f);
                f
            }),
            ("other options", {
                let mut f = segment(1000 + 2 * MSS as u32, 9, MSS, TCP_ACK);
                f[ETHERNET_LEN + IPV4_LEN + 27] ^= 1;
                fix(&mut f);
                f
            }),
        ];
        for (what, third) in cases {
            let mut frames = vec![
                segment(1000, 9, MSS, TCP_ACK),
                segment(1000 + MSS as u32, 9, MSS, TCP_ACK),
                third,
            ];
            let p = run(&mut frames);
            let counts: Vec<_> = p.messages().iter().map(|m| m.count).collect();
            assert_eq!(counts, vec![2, 1], "{what}");
        }
        // A shorter segment or PSH takes nothing behind it.
        let mut frames = vec![
            segment(1000, 9, MSS, TCP_ACK),
            segment(1000 + MSS as u32, 9, 100, TCP_ACK),
            segment(1100 + MSS as u32, 9, 100, TCP_ACK),
        ];
        let counts: Vec<_> = run(&mut frames).messages().iter().map(|m| m.count).collect();
        assert_eq!(counts, vec![2, 1]);
        let mut frames = vec![
            segment(1000, 9, MSS, TCP_ACK | TCP_PSH),
            segment(1000 + MSS as u32, 9, MSS, TCP_ACK),
        ];
        assert_eq!(run(&mut frames).len, 2);
    }

    #[test]
    fn without_df_the_ids_must_count_up() {
        let no_df = |seq: u32, id: u16| {
            let mut f = segment(seq, id, MSS, TCP_ACK);
            f[ETHERNET_LEN + 6] = 0;
            fix(&mut f);
            f
        };
        let mut frames = vec![
            no_df(1000, 7),
            no_df(1000 + MSS as u32, 8),
            no_df(1000 + 2 * MSS as u32, 8),
        ];
        let counts: Vec<_> = run(&mut frames).messages().iter().map(|m| m.count).collect();
        assert_eq!(counts, vec![2, 1]);
    }

    #[test]
    fn a_super_packet_stays_within_64_kib() {
        let mut frames: Vec<Vec<u8>> = (0..50)
            .map(|k| segment(1000 + (k * MSS) as u32, 9, MSS, TCP_ACK))
            .collect();
        let p = run(&mut frames);
        for m in p.messages() {
            let bytes: usize = (m.start..m.start + m.count)
                .map(|k| p.spans[k].1 - p.spans[k].0)
                .sum();
            assert!(bytes - ETHERNET_LEN <= MAX_TOTAL, "{bytes}");
        }
        assert_eq!(p.messages()[0].count, 45);
        assert_eq!(p.messages().iter().map(|m| m.count).sum::<usize>(), 50);
    }

    #[test]
    fn what_is_not_tcp_goes_out_alone_and_whole() {
        let mut udp = segment(1000, 9, 100, TCP_ACK);
        udp[ETHERNET_LEN + 9] = 17;
        let mut frames = vec![udp.clone(), vec![0u8; 3], udp];
        let p = run(&mut frames);
        assert_eq!(p.len, 3);
        assert_eq!(p.spans[1], (0, 3));
    }

    /// A UDP/IPv4 datagram of `payload` bytes from 4500 to 4500, with
    /// checksum zero (ESP in UDP) unless `checksum`.
    fn datagram(id: u16, payload: usize, df: bool, checksum: bool) -> Vec<u8> {
        let total = IPV4_LEN + UDP_LEN + payload;
        let mut f = vec![0u8; ETHERNET_LEN + total];
        f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = ETHERNET_LEN;
        f[ip] = 0x45;
        f[ip + 2..ip + 4].copy_from_slice(&(total as u16).to_be_bytes());
        f[ip + 4..ip + 6].copy_from_slice(&id.to_be_bytes());
        f[ip + 6] = if df { IPV4_DF } else { 0 };
        f[ip + 8] = 64;
        f[ip + 9] = PROTO_UDP;
        f[ip + 12..ip + 20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        let s = fold(ones_sum(&f[ip..ip + IPV4_LEN], 0));
        f[ip + 10..ip + 12].copy_from_slice(&s.to_be_bytes());
        let u = ip + IPV4_LEN;
        f[u..u + 4].copy_from_slice(&[0x11, 0x94, 0x11, 0x94]);
        f[u + 4..u + 6].copy_from_slice(&((UDP_LEN + payload) as u16).to_be_bytes());
        for (k, b) in f[u + UDP_LEN..].iter_mut().enumerate() {
            *b = (usize::from(id) * 7 + k) as u8;
        }
        if checksum {
            let sum = fold(ones_sum(
                &f[u..],
                pseudo_header_sum(&f[ip..], PROTO_UDP, UDP_LEN + payload),
            ));
            f[u + 6..u + 8].copy_from_slice(&sum.to_be_bytes());
        }
        f
    }

    /// `frame` with its UDP checksum zeroed, after checking that it is right.
    fn without_udp_checksum(frame: &[u8]) -> Vec<u8> {
        let ip = ETHERNET_LEN;
        let u = ip + IPV4_LEN;
        let udp_len = frame.len() - u;
        assert_eq!(
            fold(ones_sum(
                &frame[u..],
                pseudo_header_sum(&frame[ip..], PROTO_UDP, udp_len)
            )),
            0
        );
        let mut f = frame.to_vec();
        f[u + 6..u + 8].copy_from_slice(&[0, 0]);
        f
    }

    #[test]
    fn esp_in_udp_datagrams_become_one_udp_super_packet_that_cuts_back_into_them() {
        let original: Vec<Vec<u8>> = (0..6)
            .map(|k| datagram(100 + k, if k == 5 { 700 } else { 1444 }, true, false))
            .collect();
        let mut frames = original.clone();
        let p = run(&mut frames);
        assert_eq!(p.len, 1);
        let m = p.messages()[0];
        assert_eq!(m.count, 6);
        let repr = VnetRepr::parse(&VnetHeader::new_checked(&m.header[..]).expect("header"));
        assert_eq!(repr.gso, Gso::UdpL4);
        assert_eq!(repr.gso_size, 1444);
        assert_eq!(repr.hdr_len as usize, ETHERNET_LEN + IPV4_LEN + UDP_LEN);
        let back = resegment(&frames, &p, &m);
        assert_eq!(back.len(), 6);
        for (got, want) in back.iter().zip(&original) {
            // The kernel fills in each datagram's checksum; the rest is as sent.
            assert_eq!(without_udp_checksum(got), *want);
        }
    }

    #[test]
    fn udp_runs_end_at_a_damaged_or_different_datagram() {
        let mut bad = datagram(3, 1000, false, true);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let mut other_port = datagram(4, 1000, false, false);
        other_port[ETHERNET_LEN + IPV4_LEN + 1] = 0x95;
        let mut frames = vec![
            datagram(1, 1000, false, true),
            datagram(2, 1000, false, true),
            bad,
            datagram(4, 1000, false, false),
            other_port,
            // Without DF the IDs must count up: 9 does not follow 5.
            datagram(5, 1000, false, false),
            datagram(9, 1000, false, false),
            // A shorter datagram ends a run; a longer one cannot follow.
            datagram(10, 500, false, false),
            datagram(11, 1000, false, false),
        ];
        let p = run(&mut frames);
        let counts: Vec<usize> = p.messages().iter().map(|m| m.count).collect();
        assert_eq!(counts, [2, 1, 1, 1, 1, 2, 1]);
        assert_eq!(
            p.messages()[1].header,
            [0; HEADER_LEN],
            "the damaged one goes alone"
        );
    }
}
