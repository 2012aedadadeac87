//! Turns a frame with the kernel's offload state still attached (the
//! virtio-net header of an AF_PACKET socket with `PACKET_VNET_HDR`) into
//! complete packets before the gateway sees it, as a NIC would have done
//! on the way out:
//! - a partial checksum (`CHECKSUM_PARTIAL`: local senders on veth, tap,
//!   virtio) is completed, RFC 1071 over `csum_start..` to the end of the
//!   IPv4 datagram, stored at `csum_start + csum_offset`, so the inner
//!   packet is right before it is encrypted;
//! - a checksum the kernel already verified (`DATA_VALID`) is noted in
//!   the buffer (`fate::mark_checksum_verified`), so that the gateway does
//!   not verify it again (nor drop it, whatever its field holds);
//! - a TCP or UDP GSO super-packet over IPv4 or IPv6 (up to 64 KiB) is
//!   cut into `gso_size` segments as the kernel's `tcp_gso_segment` and
//!   `__udp_gso_segment` do: each with its own IPv4 total length, ID and
//!   header checksum (IPv6: payload length), TCP sequence number, flags
//!   and checksum, or UDP length and checksum. The gateway then treats every segment as a router does
//!   (DF and the tunnel MTU decide between ICMP fragmentation-needed and
//!   fragmenting after encapsulation).
//!
//! What cannot be made whole is a counted [`OffloadDrop`]. Pure: no I/O, so
//! it is tested and fuzzed on byte arrays.

use serde::Serialize;

use dataplane::buffer::{PacketBuf, PacketPool, MAX_FRAME};
use dataplane::wire::checksum::{fold, ones_sum, pseudo_header_sum, pseudo_header_sum6};
use dataplane::wire::vnet::{Gso, VnetRepr};

const ETHERNET_LEN: usize = 14;
const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
const ETHERTYPE_IPV6: [u8; 2] = [0x86, 0xdd];
const IPV6_HEADER_LEN: usize = 40;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Why a received frame was dropped before the gateway saw it. The list
/// and the names (the stats keys) are derived: a new reason is one variant
/// here, and the counters and their serialization follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::VariantArray, strum::EnumCount, strum::IntoStaticStr)]
pub enum OffloadDrop {
    /// Shorter than a virtio-net header.
    #[strum(serialize = "vnet_header_short")]
    VnetHeader,
    /// Larger than a pool buffer and not a GSO super-packet the driver can
    /// cut (a jumbo frame), or cut short by the receive buffer.
    #[strum(serialize = "frame_too_large")]
    TooLarge,
    /// A GSO type other than TCP or UDP over IPv4 or IPv6 (UFO, tunnels),
    /// a GSO frame that is not IP over Ethernet, or IPv6 whose extension
    /// headers stand between the fixed header and TCP or UDP.
    #[strum(serialize = "gso_unsupported")]
    GsoUnsupported,
    /// Headers that contradict the virtio-net header: `csum_start` or
    /// `csum_offset` outside the packet, `gso_size` 0, a truncated or
    /// fragmented IPv4 datagram, the wrong L4 protocol.
    #[strum(serialize = "offload_malformed")]
    Malformed,
    /// The pool had no buffers for the segments.
    #[strum(serialize = "gso_no_buffer")]
    NoBuffer,
}

impl OffloadDrop {
    /// Every reason, in declaration order (the order of the stats keys).
    pub const ALL: &'static [OffloadDrop] = <OffloadDrop as strum::VariantArray>::VARIANTS;

    /// The reason's stats key (`frame_too_large`, ...).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// What the driver did with received frames' offload state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadCounters {
    /// Frames whose partial L4 checksum was completed.
    pub csum_completed: u64,
    /// GSO super-packets cut into segments.
    pub gso_segmented: u64,
    /// Segments made from them.
    pub gso_segments: u64,
    /// Super-packets sent: runs of TCP segments of one flow merged on the
    /// way out ([`crate::coalesce`]).
    pub coalesced: u64,
    /// Segments merged into them.
    pub coalesced_segments: u64,
    drops: [u64; <OffloadDrop as strum::EnumCount>::COUNT],
}

impl OffloadCounters {
    /// The serialized keys that count work done, not frames dropped (the
    /// others are [`OffloadDrop`] names).
    pub const WORK_KEYS: [&'static str; 5] = [
        "csum_completed",
        "gso_segmented",
        "gso_segments",
        "tx_coalesced",
        "tx_coalesced_segments",
    ];

    /// Counts one frame dropped for `reason`.
    pub fn count(&mut self, reason: OffloadDrop) {
        self.drops[reason as usize] += 1;
    }

    /// Frames dropped for `reason`.
    pub fn dropped(&self, reason: OffloadDrop) -> u64 {
        self.drops[reason as usize]
    }

    /// Frames dropped for every reason together.
    pub fn drops_total(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Adds another worker's counts, counter by counter.
    pub fn add(&mut self, other: &OffloadCounters) {
        self.csum_completed += other.csum_completed;
        self.gso_segmented += other.gso_segmented;
        self.gso_segments += other.gso_segments;
        self.coalesced += other.coalesced;
        self.coalesced_segments += other.coalesced_segments;
        for (mine, theirs) in self.drops.iter_mut().zip(other.drops) {
            *mine += theirs;
        }
    }
}

impl Serialize for OffloadCounters {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(Self::WORK_KEYS.len() + OffloadDrop::ALL.len()))?;
        // Typed by the keys' count: a counter without a key does not compile.
        let work: [u64; Self::WORK_KEYS.len()] = [
            self.csum_completed,
            self.gso_segmented,
            self.gso_segments,
            self.coalesced,
            self.coalesced_segments,
        ];
        for (key, value) in Self::WORK_KEYS.iter().zip(work) {
            map.serialize_entry(key, &value)?;
        }
        for &reason in OffloadDrop::ALL {
            map.serialize_entry(reason.name(), &self.dropped(reason))?;
        }
        map.end()
    }
}

/// Reads back what [`Serialize`] wrote (a `--stats` file, the control
/// socket's `stats`): every key is a work counter or an [`OffloadDrop`]
/// name, so a renamed or unknown counter is an error, not a silent zero.
impl<'de> serde::Deserialize<'de> for OffloadCounters {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Counters;
        impl<'de> serde::de::Visitor<'de> for Counters {
            type Value = OffloadCounters;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of offload counters")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<OffloadCounters, A::Error> {
                let mut c = OffloadCounters::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let value: u64 = map.next_value()?;
                    let work = match key.as_ref() {
                        "csum_completed" => Some(&mut c.csum_completed),
                        "gso_segmented" => Some(&mut c.gso_segmented),
                        "gso_segments" => Some(&mut c.gso_segments),
                        "tx_coalesced" => Some(&mut c.coalesced),
                        "tx_coalesced_segments" => Some(&mut c.coalesced_segments),
                        _ => None,
                    };
                    if let Some(counter) = work {
                        *counter = value;
                        continue;
                    }
                    match OffloadDrop::ALL.iter().find(|r| r.name() == key.as_ref()) {
                        Some(&reason) => c.drops[reason as usize] = value,
                        None => return Err(serde::de::Error::unknown_field(&key, &[])),
                    }
                }
                Ok(c)
            }
        }
        deserializer.deserialize_map(Counters)
    }
}

/// Where the L4 checksum of `frame` ends: the end of the IP datagram if
/// the frame is IPv4 or IPv6 over Ethernet (not the Ethernet padding
/// behind it), else the end of the frame.
fn checksum_end(frame: &[u8]) -> usize {
    let total = match frame.get(12..14) {
        Some(t) if t == ETHERTYPE_IPV4 && frame.len() >= ETHERNET_LEN + 20 => {
            Some(usize::from(u16::from_be_bytes([frame[16], frame[17]]))).filter(|t| *t >= 20)
        }
        Some(t) if t == ETHERTYPE_IPV6 && frame.len() >= ETHERNET_LEN + IPV6_HEADER_LEN => {
            Some(IPV6_HEADER_LEN + usize::from(u16::from_be_bytes([frame[18], frame[19]])))
        }
        _ => None,
    };
    match total {
        Some(total) if ETHERNET_LEN + total <= frame.len() => ETHERNET_LEN + total,
        _ => frame.len(),
    }
}

/// Completes a partial checksum in place: the ones' complement sum from
/// `start` to the end of the packet (the field already holds the
/// pseudo-header sum the stack left there), stored at `start + offset`.
/// A result of 0 is written as 0xffff, as the kernel's
/// `skb_checksum_help` does (CSUM_MANGLED_0): for UDP, 0 would mean "no
/// checksum" (RFC 768), and for TCP the two are the same value.
pub fn complete_checksum(frame: &mut [u8], start: u16, offset: u16) -> Result<(), OffloadDrop> {
    let end = checksum_end(frame);
    let start = usize::from(start);
    let at = start + usize::from(offset);
    if at + 2 > end {
        return Err(OffloadDrop::Malformed);
    }
    let sum = fold(ones_sum(&frame[start..end], 0));
    let sum = if sum == 0 { 0xffff } else { sum };
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

/// A received frame as two pieces: what fitted the pool buffer, and the
/// rest (a GSO super-packet's tail), read into the driver's scratch.
struct Pieces<'a> {
    head: &'a [u8],
    tail: &'a [u8],
}

impl Pieces<'_> {
    fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Copies `dst.len()` bytes from offset `from`; the caller checked that
    /// they exist.
    fn copy_to(&self, from: usize, dst: &mut [u8]) {
        let mut done = 0;
        if from < self.head.len() {
            let n = (self.head.len() - from).min(dst.len());
            dst[..n].copy_from_slice(&self.head[from..from + n]);
            done = n;
        }
        if done < dst.len() {
            let t = from + done - self.head.len();
            let rest = dst.len() - done;
            dst[done..].copy_from_slice(&self.tail[t..t + rest]);
        }
    }
}

/// Makes complete packets of one received frame: `buf` holds its first
/// bytes (up to [`MAX_FRAME`]), `tail` whatever did not fit, `header` the
/// virtio-net header read before it. Complete packets are appended to
/// `out`; `buf` is either among them or returned to `pool`.
pub fn prepare(
    header: &[u8],
    mut buf: PacketBuf,
    tail: &[u8],
    pool: &mut PacketPool,
    out: &mut Vec<PacketBuf>,
    counters: &mut OffloadCounters,
) {
    let repr = match VnetRepr::parse_bytes(header) {
        Ok(repr) => repr,
        Err(_) => {
            counters.count(OffloadDrop::VnetHeader);
            pool.free(buf);
            return;
        }
    };
    let result = match repr.gso {
        Gso::None if !tail.is_empty() => Err(OffloadDrop::TooLarge),
        Gso::None => match repr.partial_csum {
            // Verified by the kernel (a NIC's receive offload): the gateway
            // need not check the UDP checksum of ESP in UDP again.
            None if repr.data_valid => {
                dataplane::fate::mark_checksum_verified(&mut buf);
                Ok(false)
            }
            None => Ok(false),
            Some((start, offset)) => complete_checksum(buf.data_mut(), start, offset).map(|()| true),
        },
        Gso::TcpV4 | Gso::TcpV6 | Gso::UdpL4 => {
            let pieces = Pieces {
                head: buf.data(),
                tail,
            };
            let result = segment(&pieces, repr, pool, out, counters);
            pool.free(buf);
            if let Err(e) = result {
                counters.count(e);
            }
            return;
        }
        Gso::Ufo | Gso::Other(_) => Err(OffloadDrop::GsoUnsupported),
    };
    match result {
        Ok(completed) => {
            counters.csum_completed += u64::from(completed);
            out.push(buf);
        }
        Err(e) => {
            counters.count(e);
            pool.free(buf);
        }
    }
}

/// Cuts a TCP or UDP super-packet over IPv4 or IPv6 into `gso_size`
/// segments.
fn segment(
    frame: &Pieces<'_>,
    repr: VnetRepr,
    pool: &mut PacketPool,
    out: &mut Vec<PacketBuf>,
    counters: &mut OffloadCounters,
) -> Result<(), OffloadDrop> {
    let head = frame.head;
    let want = match repr.gso {
        Gso::TcpV4 | Gso::TcpV6 => PROTO_TCP,
        _ => PROTO_UDP,
    };
    let ethertype = head.get(12..14);
    let ipv6 = ethertype == Some(&ETHERTYPE_IPV6[..]);
    let fits_v4 = ethertype == Some(&ETHERTYPE_IPV4[..]) && repr.gso != Gso::TcpV6;
    let fits_v6 = ipv6 && repr.gso != Gso::TcpV4;
    if !(fits_v4 && head.len() >= ETHERNET_LEN + 20
        || fits_v6 && head.len() >= ETHERNET_LEN + IPV6_HEADER_LEN)
    {
        return Err(OffloadDrop::GsoUnsupported);
    }
    let ip = &head[ETHERNET_LEN..];
    // IPv6: TCP or UDP right after the fixed header (what the stack
    // builds); extension headers would need the walk and are refused.
    let (ihl, total, fragment, protocol) = if ipv6 {
        if ip[6] != want {
            return Err(OffloadDrop::GsoUnsupported);
        }
        let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
        (IPV6_HEADER_LEN, IPV6_HEADER_LEN + payload, 0, ip[6])
    } else {
        (
            usize::from(ip[0] & 0x0f) * 4,
            usize::from(u16::from_be_bytes([ip[2], ip[3]])),
            u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff,
            ip[9],
        )
    };
    let version = if ipv6 { 6 } else { 4 };
    if ip[0] >> 4 != version || ihl < 20 || protocol != want || fragment != 0 {
        return Err(OffloadDrop::Malformed);
    }
    let l4 = ETHERNET_LEN + ihl;
    let l4_len = match protocol {
        PROTO_TCP => head.get(l4 + 12).map(|b| usize::from(b >> 4) * 4),
        _ => Some(8),
    };
    let Some(l4_len) = l4_len.filter(|n| *n >= 8) else {
        return Err(OffloadDrop::Malformed);
    };
    let headers = l4 + l4_len;
    if (protocol == PROTO_TCP && l4_len < 20)
        || headers > head.len()
        || ETHERNET_LEN + total < headers
        || ETHERNET_LEN + total > frame.len()
    {
        return Err(OffloadDrop::Malformed);
    }
    let mss = usize::from(repr.gso_size);
    if mss == 0 {
        return Err(OffloadDrop::Malformed);
    }
    if headers + mss > MAX_FRAME {
        return Err(OffloadDrop::TooLarge);
    }
    let payload = ETHERNET_LEN + total - headers;
    let count = payload.div_ceil(mss).max(1);
    if pool.available() < count {
        return Err(OffloadDrop::NoBuffer);
    }
    let id = u16::from_be_bytes([ip[4], ip[5]]);
    let seq = u32::from_be_bytes([head[l4 + 4], head[l4 + 5], head[l4 + 6], head[l4 + 7]]);
    let pseudo_sum = match ipv6 {
        true => pseudo_header_sum6(ip, protocol, 0),
        false => pseudo_header_sum(ip, protocol, 0),
    };
    for i in 0..count {
        let Some(mut seg) = pool.alloc() else {
            return Err(OffloadDrop::NoBuffer);
        };
        let offset = i * mss;
        let chunk = mss.min(payload - offset);
        let Some(bytes) = seg.append(headers + chunk) else {
            pool.free(seg);
            return Err(OffloadDrop::TooLarge);
        };
        bytes[..headers].copy_from_slice(&head[..headers]);
        frame.copy_to(headers + offset, &mut bytes[headers..]);
        let ip_len = (headers + chunk - ETHERNET_LEN) as u16;
        let seg_ip = &mut bytes[ETHERNET_LEN..l4];
        if ipv6 {
            // No ID and no header checksum: the payload length only.
            seg_ip[4..6].copy_from_slice(&(ip_len - IPV6_HEADER_LEN as u16).to_be_bytes());
        } else {
            seg_ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
            seg_ip[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
            seg_ip[10..12].copy_from_slice(&[0, 0]);
            let ip_sum = fold(ones_sum(seg_ip, 0));
            seg_ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());
        }
        let l4_total = (l4_len + chunk) as u16;
        let check_at = if protocol == PROTO_TCP {
            let tcp = &mut bytes[l4..];
            tcp[4..8].copy_from_slice(&seq.wrapping_add(offset as u32).to_be_bytes());
            // tcp_gso_segment: FIN and PSH only on the last segment, CWR
            // only on the first.
            if i + 1 < count {
                tcp[13] &= !(TCP_FIN | TCP_PSH);
            }
            if i > 0 {
                tcp[13] &= !TCP_CWR;
            }
            l4 + 16
        } else {
            bytes[l4 + 4..l4 + 6].copy_from_slice(&l4_total.to_be_bytes());
            l4 + 6
        };
        bytes[check_at..check_at + 2].copy_from_slice(&[0, 0]);
        let sum = fold(ones_sum(&bytes[l4..], pseudo_sum + u64::from(l4_total)));
        let sum = if sum == 0 && protocol == PROTO_UDP {
            0xffff
        } else {
            sum
        };
        bytes[check_at..check_at + 2].copy_from_slice(&sum.to_be_bytes());
        out.push(seg);
    }
    counters.gso_segmented += 1;
    counters.gso_segments += count as u64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is published reads back the same, and a key that is not a
    /// counter is refused.
    #[test]
    fn the_offload_counters_read_back_what_they_publish() {
        let mut c = OffloadCounters {
            csum_completed: 1,
            gso_segmented: 2,
            gso_segments: 3,
            coalesced: 4,
            coalesced_segments: 5,
            ..OffloadCounters::default()
        };
        for (i, &reason) in OffloadDrop::ALL.iter().enumerate() {
            for _ in 0..=i {
                c.count(reason);
            }
        }
        let json = serde_json::to_value(c).unwrap();
        assert_eq!(serde_json::from_value::<OffloadCounters>(json).unwrap(), c);
        let err = serde_json::from_value::<OffloadCounters>(serde_json::json!({"renamed": 1})).unwrap_err();
        assert!(err.to_string().contains("renamed"), "{err}");
    }

    /// Every counter is published once, under the name the stats have
    /// always used (the demo, the soak and `espgw stats` read them).
    #[test]
    fn the_offload_counters_publish_every_key_once() {
        let json = serde_json::to_value(OffloadCounters::default()).unwrap();
        let mut keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut expected = [
            "csum_completed",
            "gso_segmented",
            "gso_segments",
            "tx_coalesced",
            "tx_coalesced_segments",
            "vnet_header_short",
            "frame_too_large",
            "gso_unsupported",
            "offload_malformed",
            "gso_no_buffer",
        ];
        expected.sort_unstable();
        assert_eq!(keys, expected);
        let mut counters = OffloadCounters::default();
        for (i, &reason) in OffloadDrop::ALL.iter().enumerate() {
            for _ in 0..=i {
                counters.count(reason);
            }
        }
        for (i, &reason) in OffloadDrop::ALL.iter().enumerate() {
            assert_eq!(counters.dropped(reason), i as u64 + 1, "{}", reason.name());
        }
    }
    use dataplane::wire::vnet::{VnetHeader, HEADER_LEN};

    /// Verifies an IPv4 header checksum and the TCP/UDP checksum of a
    /// whole Ethernet frame, as a receiver would.
    fn checksums_ok(frame: &[u8]) -> bool {
        let ip = &frame[ETHERNET_LEN..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        if fold(ones_sum(&ip[..ihl], 0)) != 0 {
            return false;
        }
        let l4 = &ip[ihl..total];
        let mut pseudo = [0u8; 12];
        pseudo[..8].copy_from_slice(&ip[12..20]);
        pseudo[9] = ip[9];
        pseudo[10..12].copy_from_slice(&(l4.len() as u16).to_be_bytes());
        fold(ones_sum(l4, ones_sum(&pseudo, 0))) == 0
    }

    /// An Ethernet + IPv4 + L4 frame with `payload` bytes of data, as a
    /// local sender leaves it with checksum offload: the L4 checksum
    /// field holds the folded, uncomplemented pseudo-header sum.
    fn partial_frame(protocol: u8, payload: usize, flags: u8) -> Vec<u8> {
        let l4_len = if protocol == PROTO_TCP { 32 } else { 8 };
        let total = 20 + l4_len + payload;
        let mut f = vec![0u8; ETHERNET_LEN + total];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 1, 1]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 1, 10]);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4);
        let ip = &mut f[ETHERNET_LEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = protocol;
        ip[12..16].copy_from_slice(&[192, 168, 1, 10]);
        ip[16..20].copy_from_slice(&[192, 168, 2, 20]);
        let s = fold(ones_sum(&ip[..20], 0));
        ip[10..12].copy_from_slice(&s.to_be_bytes());
        let mut pseudo = [0u8; 12];
        pseudo[..8].copy_from_slice(&[192, 168, 1, 10, 192, 168, 2, 20]);
        pseudo[9] = protocol;
        pseudo[10..12].copy_from_slice(&((l4_len + payload) as u16).to_be_bytes());
        let pseudo_sum = ones_sum(&pseudo, 0);
        partial_l4(&mut f[ETHERNET_LEN + 20..], protocol, flags, (7, 3), pseudo_sum);
        f
    }

    /// The L4 part of a partial frame, `l4` from its header on: ports
    /// 40000 to 5201, TCP `flags` or the UDP length, a payload whose byte
    /// `i` is `i * pattern.0 + pattern.1`, and the checksum field seeded
    /// with the pseudo-header sum `pseudo_sum`, as offload leaves it.
    fn partial_l4(l4: &mut [u8], protocol: u8, flags: u8, pattern: (usize, usize), pseudo_sum: u64) {
        let header_len = if protocol == PROTO_TCP { 32 } else { 8 };
        l4[..2].copy_from_slice(&40000u16.to_be_bytes());
        l4[2..4].copy_from_slice(&5201u16.to_be_bytes());
        if protocol == PROTO_TCP {
            l4[4..8].copy_from_slice(&0xfffff000u32.to_be_bytes());
            l4[12] = 8 << 4;
            l4[13] = flags;
        } else {
            let udp_len = l4.len() as u16;
            l4[4..6].copy_from_slice(&udp_len.to_be_bytes());
        }
        for (i, b) in l4[header_len..].iter_mut().enumerate() {
            *b = (i * pattern.0 + pattern.1) as u8;
        }
        let seeded = !fold(pseudo_sum);
        let at = if protocol == PROTO_TCP { 16 } else { 6 };
        l4[at..at + 2].copy_from_slice(&seeded.to_be_bytes());
    }

    fn header(flags: u8, gso: u8, gso_size: u16, start: u16, offset: u16) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        let mut h = VnetHeader::new_unchecked(&mut b[..]);
        h.set_flags(flags);
        h.set_gso_type_raw(gso);
        h.set_gso_size(gso_size);
        h.set_csum_start(start);
        h.set_csum_offset(offset);
        b
    }

    /// Splits a frame as the driver receives it: the first MAX_FRAME
    /// bytes into a pool buffer, the rest as the tail.
    fn run(frame: &[u8], hdr: &[u8], pool: &mut PacketPool) -> (Vec<PacketBuf>, OffloadCounters) {
        let mut buf = pool.alloc().expect("a buffer");
        let split = frame.len().min(MAX_FRAME);
        assert!(buf.fill(&frame[..split]));
        let mut out = Vec::new();
        let mut counters = OffloadCounters::default();
        prepare(hdr, buf, &frame[split..], pool, &mut out, &mut counters);
        (out, counters)
    }

    #[test]
    fn completes_partial_tcp_and_udp_checksums() {
        let mut pool = PacketPool::new(4);
        for (protocol, offset, payload) in [(PROTO_TCP, 16, 100), (PROTO_UDP, 6, 1), (PROTO_UDP, 6, 1400)] {
            let frame = partial_frame(protocol, payload, 0x18);
            assert!(!checksums_ok(&frame));
            let (out, counters) = run(&frame, &header(1, 0, 0, 34, offset), &mut pool);
            assert_eq!(out.len(), 1);
            assert!(checksums_ok(out[0].data()), "protocol {protocol}");
            // Only the checksum field changed.
            let at = 34 + usize::from(offset);
            assert_eq!(out[0].data()[..at], frame[..at]);
            assert_eq!(out[0].data()[at + 2..], frame[at + 2..]);
            assert_eq!(counters.csum_completed, 1);
            out.into_iter().for_each(|b| pool.free(b));
        }
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn ethernet_padding_is_not_summed() {
        let mut pool = PacketPool::new(2);
        let mut frame = partial_frame(PROTO_UDP, 2, 0);
        frame.extend_from_slice(&[0xee; 16]);
        let (out, _) = run(&frame, &header(1, 0, 0, 34, 6), &mut pool);
        assert!(checksums_ok(out[0].data()));
    }

    #[test]
    fn complete_frames_pass_untouched() {
        let mut pool = PacketPool::new(2);
        let frame = partial_frame(PROTO_UDP, 10, 0);
        let (out, counters) = run(&frame, &[0u8; HEADER_LEN], &mut pool);
        assert_eq!(out[0].data(), &frame[..]);
        assert_eq!(counters, OffloadCounters::default());
    }

    #[test]
    fn segments_a_tcp_super_packet() {
        let mut pool = PacketPool::new(64);
        let mss = 1448;
        let payload = 3 * mss + 100;
        // CWR, PSH, ACK, FIN set on the super-packet.
        let frame = partial_frame(PROTO_TCP, payload, TCP_CWR | 0x18 | TCP_FIN);
        let (out, counters) = run(&frame, &header(1, 1, mss as u16, 34, 16), &mut pool);
        assert_eq!(out.len(), 4);
        assert_eq!((counters.gso_segmented, counters.gso_segments), (1, 4));
        let mut joined = Vec::new();
        for (i, seg) in out.iter().enumerate() {
            let d = seg.data();
            assert!(checksums_ok(d), "segment {i}");
            let chunk = if i < 3 { mss } else { 100 };
            assert_eq!(d.len(), 14 + 20 + 32 + chunk);
            assert_eq!(u16::from_be_bytes([d[16], d[17]]) as usize, 20 + 32 + chunk);
            assert_eq!(u16::from_be_bytes([d[18], d[19]]), 0x1234 + i as u16);
            let seq = u32::from_be_bytes([d[38], d[39], d[40], d[41]]);
            assert_eq!(seq, 0xfffff000u32.wrapping_add((i * mss) as u32));
            let flags = d[47];
            assert_eq!(flags & TCP_CWR != 0, i == 0);
            assert_eq!(flags & (TCP_FIN | TCP_PSH) != 0, i == 3);
            assert!(flags & 0x10 != 0, "ACK stays");
            joined.extend_from_slice(&d[66..]);
        }
        assert_eq!(joined, frame[66..]);
        out.into_iter().for_each(|b| pool.free(b));
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn segments_a_udp_super_packet() {
        let mut pool = PacketPool::new(64);
        let size = 1000;
        let frame = partial_frame(PROTO_UDP, 5 * size + 1, 0);
        let (out, counters) = run(&frame, &header(1, 5, size as u16, 34, 6), &mut pool);
        assert_eq!(out.len(), 6);
        assert_eq!(counters.gso_segments, 6);
        for (i, seg) in out.iter().enumerate() {
            let d = seg.data();
            assert!(checksums_ok(d), "datagram {i}");
            let chunk = if i < 5 { size } else { 1 };
            assert_eq!(u16::from_be_bytes([d[38], d[39]]) as usize, 8 + chunk);
            assert_eq!(d[42..], frame[42 + i * size..42 + i * size + chunk]);
        }
        out.into_iter().for_each(|b| pool.free(b));
    }

    /// An Ethernet + IPv6 + L4 frame as a local sender leaves it with
    /// checksum offload (the L4 checksum field seeded with the pseudo-header
    /// sum), and a receiver's check of such a frame once whole.
    fn partial_frame6(protocol: u8, payload: usize, flags: u8) -> Vec<u8> {
        let l4_len = if protocol == PROTO_TCP { 32 } else { 8 };
        let mut f = vec![0u8; ETHERNET_LEN + IPV6_HEADER_LEN + l4_len + payload];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6);
        let ip = &mut f[ETHERNET_LEN..];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&((l4_len + payload) as u16).to_be_bytes());
        ip[6] = protocol;
        ip[7] = 64;
        ip[8..10].copy_from_slice(&[0x20, 0x01]);
        ip[23] = 0x10;
        ip[24..26].copy_from_slice(&[0x20, 0x01]);
        ip[39] = 0x20;
        let pseudo_sum = pseudo_header_sum6(&f[ETHERNET_LEN..], protocol, l4_len + payload);
        partial_l4(
            &mut f[ETHERNET_LEN + IPV6_HEADER_LEN..],
            protocol,
            flags,
            (5, 1),
            pseudo_sum,
        );
        f
    }

    fn checksums_ok6(frame: &[u8]) -> bool {
        let ip = &frame[ETHERNET_LEN..];
        let end = IPV6_HEADER_LEN + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
        let l4 = &ip[IPV6_HEADER_LEN..end];
        fold(ones_sum(l4, pseudo_header_sum6(ip, ip[6], l4.len()))) == 0
    }

    #[test]
    fn completes_and_segments_over_ipv6() {
        let mut pool = PacketPool::new(64);
        let l4 = (ETHERNET_LEN + IPV6_HEADER_LEN) as u16;
        // A partial checksum, with Ethernet padding after a small datagram.
        let mut small = partial_frame6(PROTO_UDP, 1, 0);
        small.extend_from_slice(&[0xee; 8]);
        let (out, counters) = run(&small, &header(1, 0, 0, l4, 6), &mut pool);
        assert!(checksums_ok6(out[0].data()));
        assert_eq!(counters.csum_completed, 1);
        out.into_iter().for_each(|b| pool.free(b));
        // TCPv6 GSO (gso_type 4): payload lengths, sequence numbers,
        // flags and checksums per segment.
        let mss = 1428;
        let frame = partial_frame6(PROTO_TCP, 2 * mss + 7, TCP_CWR | 0x18 | TCP_FIN);
        let (out, counters) = run(&frame, &header(1, 4, mss as u16, l4, 16), &mut pool);
        assert_eq!((out.len(), counters.gso_segments), (3, 3));
        let mut joined = Vec::new();
        for (i, seg) in out.iter().enumerate() {
            let d = seg.data();
            assert!(checksums_ok6(d), "segment {i}");
            let chunk = if i < 2 { mss } else { 7 };
            assert_eq!(usize::from(u16::from_be_bytes([d[18], d[19]])), 32 + chunk);
            let seq = u32::from_be_bytes([d[58], d[59], d[60], d[61]]);
            assert_eq!(seq, 0xfffff000u32.wrapping_add((i * mss) as u32));
            assert_eq!(d[67] & TCP_CWR != 0, i == 0);
            assert_eq!(d[67] & (TCP_FIN | TCP_PSH) != 0, i == 2);
            joined.extend_from_slice(&d[86..]);
        }
        assert_eq!(joined, frame[86..]);
        out.into_iter().for_each(|b| pool.free(b));
        // UDP GSO over IPv6 (gso_type 5).
        let frame = partial_frame6(PROTO_UDP, 3 * 1000, 0);
        let (out, _) = run(&frame, &header(1, 5, 1000, l4, 6), &mut pool);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|seg| checksums_ok6(seg.data())));
        out.into_iter().for_each(|b| pool.free(b));
        // TCPv4 GSO on an IPv6 frame, and an extension header before TCP.
        let (out, c) = run(
            &partial_frame6(PROTO_TCP, 3000, 0x10),
            &header(1, 1, 1000, l4, 16),
            &mut pool,
        );
        assert!(out.is_empty() && c.dropped(OffloadDrop::GsoUnsupported) == 1);
        let mut hop_by_hop = partial_frame6(PROTO_TCP, 3000, 0x10);
        hop_by_hop[ETHERNET_LEN + 6] = 0;
        let (out, c) = run(&hop_by_hop, &header(1, 4, 1000, l4, 16), &mut pool);
        assert!(out.is_empty() && c.dropped(OffloadDrop::GsoUnsupported) == 1);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn counts_what_it_cannot_handle() {
        let mut pool = PacketPool::new(8);
        let tcp = partial_frame(PROTO_TCP, 3000, 0x10);
        let cases: [(&[u8], [u8; HEADER_LEN], OffloadDrop); 6] = [
            (&tcp, header(1, 4, 1448, 34, 16), OffloadDrop::GsoUnsupported),
            (&tcp, header(1, 0, 0, 34, 16), OffloadDrop::TooLarge),
            (&tcp, header(1, 1, 0, 34, 16), OffloadDrop::Malformed),
            (&tcp, header(1, 5, 1448, 34, 6), OffloadDrop::Malformed),
            (&tcp[..200], header(1, 0, 0, 34, 200), OffloadDrop::Malformed),
            (&tcp, header(1, 1, 2000, 34, 16), OffloadDrop::TooLarge),
        ];
        for (frame, hdr, reason) in cases {
            let (out, counters) = run(frame, &hdr, &mut pool);
            assert!(out.is_empty(), "{reason:?}");
            assert_eq!(counters.dropped(reason), 1, "{reason:?}");
            assert_eq!(counters.drops_total(), 1);
        }
        let (out, counters) = run(&tcp, &[1, 1, 0], &mut pool);
        assert!(out.is_empty());
        assert_eq!(counters.dropped(OffloadDrop::VnetHeader), 1);
        // Too few buffers for the segments: none are taken.
        let mut small = PacketPool::new(2);
        let (out, counters) = run(&tcp, &header(1, 1, 500, 34, 16), &mut small);
        assert!(out.is_empty());
        assert_eq!(counters.dropped(OffloadDrop::NoBuffer), 1);
        assert_eq!(small.in_use(), 0);
        assert_eq!(pool.in_use(), 0);
    }
}
