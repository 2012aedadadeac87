//! Reassembly of fragmented inbound ESP (RFC 791 §3.2, RFC 815; over
//! IPv6, RFC 8200 §4.5, for a fragment header right after the fixed
//! header, which is how a peer fragments its own ESP) before
//! decapsulation, with bounded memory: a fixed number of datagrams in
//! progress, a size limit, a timeout, and no tolerance for overlapping
//! fragments (they are how reassembly attacks work; the whole datagram is
//! dropped, as RFC 5722 requires for IPv6).

use std::net::IpAddr;
use std::time::Duration;

use smoltcp::wire::Ipv4Packet;

use crate::buffer::{PacketBuf, PacketPool, MAX_FRAME};

/// Datagrams being reassembled at once.
pub const MAX_DATAGRAMS: usize = 64;
/// Fragments one datagram may have.
pub const MAX_FRAGMENTS: usize = 16;
/// How long the fragments of a datagram are kept waiting (RFC 791 suggests 15 s).
pub const REASSEMBLY_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest reassembled IPv4 packet (it must fit one buffer, with Ethernet).
pub const MAX_DATAGRAM: usize = MAX_FRAME - 14;
/// Room for the largest IPv4 header in front of the payload being built.
const HEADER_ROOM: usize = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    src: IpAddr,
    dst: IpAddr,
    id: u32,
    protocol: u8,
}

/// What a fragment says of itself.
struct Piece {
    key: Key,
    /// Bytes in front of the fragment's data (IPv6: the fragment header too).
    data_at: usize,
    /// The header the datagram keeps (IPv6: without the fragment header).
    header_len: usize,
    offset: usize,
    payload_len: usize,
    last: bool,
}

impl Piece {
    fn of(data: &[u8]) -> Option<Piece> {
        if crate::wire::is_ipv6(data) {
            let ip = crate::wire::ipv6::view(data).ok()?;
            // The fragment header right after the fixed header.
            let header = data.get(40..48).filter(|_| data[6] == 44)?;
            let field = u16::from_be_bytes([header[2], header[3]]);
            let payload_len = ip.total_len().checked_sub(48)?;
            return Some(Piece {
                key: Key {
                    src: ip.src_addr().into(),
                    dst: ip.dst_addr().into(),
                    id: u32::from_be_bytes([header[4], header[5], header[6], header[7]]),
                    protocol: header[0],
                },
                data_at: 48,
                header_len: 40,
                offset: usize::from(field >> 3) * 8,
                payload_len,
                last: field & 1 == 0,
            });
        }
        let ip = Ipv4Packet::new_checked(data).ok()?;
        let header_len = usize::from(ip.header_len());
        Some(Piece {
            key: Key {
                src: ip.src_addr().into(),
                dst: ip.dst_addr().into(),
                id: u32::from(ip.ident()),
                protocol: u8::from(ip.next_header()),
            },
            data_at: header_len,
            header_len,
            offset: usize::from(ip.frag_offset()),
            payload_len: usize::from(ip.total_len()).checked_sub(header_len)?,
            last: !ip.more_frags(),
        })
    }
}

struct Datagram {
    key: Key,
    /// The IPv4 packet being built: header, then payload at its offsets.
    buf: PacketBuf,
    /// Payload byte ranges received, [start, end).
    ranges: [(u16, u16); MAX_FRAGMENTS],
    count: usize,
    /// Payload length, known once the last fragment arrived.
    total: Option<usize>,
    header_len: usize,
    have_first: bool,
    since: Duration,
}

/// What became of a fragment.
pub enum Reassembled {
    /// Not complete yet; the fragment's bytes were copied and its buffer
    /// can go back.
    Held(PacketBuf),
    /// The whole datagram, and the last fragment's buffer to give back.
    Complete { datagram: PacketBuf, spent: PacketBuf },
    /// Refused; the fragment's buffer comes back with the reason.
    Dropped(PacketBuf, ReassemblyError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReassemblyError {
    #[error("fragments overlap")]
    Overlap,
    #[error("reassembled datagram would be too large")]
    TooLarge,
    #[error("too many datagrams or fragments in progress")]
    Full,
    #[error("no buffer for reassembly")]
    NoBuffer,
    #[error("malformed fragment")]
    Malformed,
}

#[derive(Default)]
pub struct Reassembler {
    datagrams: Vec<Datagram>,
}

impl Reassembler {
    pub fn in_progress(&self) -> usize {
        self.datagrams.len()
    }

    /// Adds the fragment in `frag` (an IPv4 packet with MF or an offset).
    /// A datagram dropped along the way hands its assembly buffer to `spent`.
    pub fn insert(
        &mut self,
        frag: PacketBuf,
        now: Duration,
        pool: &mut PacketPool,
        spent: &mut Vec<PacketBuf>,
    ) -> Reassembled {
        let Some(piece) = Piece::of(frag.data()) else {
            return Reassembled::Dropped(frag, ReassemblyError::Malformed);
        };
        let Piece {
            key,
            data_at,
            header_len,
            offset,
            payload_len,
            last,
        } = piece;
        let end = offset + payload_len;
        // Every fragment but the last carries a multiple of 8 bytes.
        if (!last && payload_len % 8 != 0) || payload_len == 0 {
            return Reassembled::Dropped(frag, ReassemblyError::Malformed);
        }
        let index = match self.datagrams.iter().position(|d| d.key == key) {
            Some(i) => i,
            None => {
                if self.datagrams.len() >= MAX_DATAGRAMS {
                    return Reassembled::Dropped(frag, ReassemblyError::Full);
                }
                let Some(mut buf) = pool.alloc() else {
                    return Reassembled::Dropped(frag, ReassemblyError::NoBuffer);
                };
                buf.reset();
                // Given up, the datagram is the fragment's that started it.
                buf.set_tag(frag.tag());
                self.datagrams.push(Datagram {
                    key,
                    buf,
                    ranges: [(0, 0); MAX_FRAGMENTS],
                    count: 0,
                    total: None,
                    header_len,
                    have_first: false,
                    since: now,
                });
                self.datagrams.len() - 1
            }
        };
        let d = &mut self.datagrams[index];
        let failure = if HEADER_ROOM + end > MAX_DATAGRAM || d.total.is_some_and(|t| end > t) {
            Some(ReassemblyError::TooLarge)
        } else if d.count >= MAX_FRAGMENTS {
            Some(ReassemblyError::Full)
        } else if d.ranges[..d.count]
            .iter()
            .any(|&(s, e)| offset < usize::from(e) && usize::from(s) < end)
            || (last && d.ranges[..d.count].iter().any(|&(_, e)| usize::from(e) > end))
            || (last && d.total.is_some())
        {
            Some(ReassemblyError::Overlap)
        } else {
            None
        };
        if let Some(error) = failure {
            let dead = self.datagrams.swap_remove(index);
            spent.push(dead.buf);
            return Reassembled::Dropped(frag, error);
        }
        // The payload goes at a fixed place behind room for the largest
        // header; the first fragment's header is copied just before it.
        let data = frag.data();
        let needed = HEADER_ROOM + end;
        if d.buf.len() < needed && d.buf.append(needed - d.buf.len()).is_none() {
            let dead = self.datagrams.swap_remove(index);
            spent.push(dead.buf);
            return Reassembled::Dropped(frag, ReassemblyError::TooLarge);
        }
        if offset == 0 {
            d.header_len = header_len;
            d.have_first = true;
            d.buf.data_mut()[HEADER_ROOM - header_len..HEADER_ROOM].copy_from_slice(&data[..header_len]);
        }
        d.buf.data_mut()[HEADER_ROOM + offset..HEADER_ROOM + end]
            .copy_from_slice(&data[data_at..data_at + payload_len]);
        d.ranges[d.count] = (offset as u16, end as u16);
        d.count += 1;
        if last {
            d.total = Some(end);
        }
        let covered: usize = d.ranges[..d.count].iter().map(|&(s, e)| usize::from(e - s)).sum();
        match d.total {
            Some(total) if d.have_first && covered == total => {
                let done = self.datagrams.swap_remove(index);
                let mut datagram = done.buf;
                // Complete, it is the fragment's that completed it.
                datagram.set_tag(frag.tag());
                datagram.truncate(HEADER_ROOM + total);
                datagram.trim_front(HEADER_ROOM - done.header_len);
                let length = datagram.len() as u16;
                // The first fragment's header, checked when it came; its
                // total length is rewritten here. (Were it no header, the
                // datagram would go on unchanged and the gateway's check of
                // it refuse it.)
                if done.key.src.is_ipv6() {
                    // Without the fragment header: what it named follows.
                    let data = datagram.data_mut();
                    data[6] = done.key.protocol;
                    data[4..6].copy_from_slice(&(length - 40).to_be_bytes());
                } else if let Ok(mut ip) = crate::wire::ipv4::header_mut(datagram.data_mut()) {
                    ip.set_total_len(length);
                    ip.set_more_frags(false);
                    ip.set_frag_offset(0);
                    ip.fill_checksum();
                }
                Reassembled::Complete {
                    datagram,
                    spent: frag,
                }
            }
            _ => Reassembled::Held(frag),
        }
    }

    /// Drops datagrams older than [`REASSEMBLY_TIMEOUT`]; their buffers go
    /// to `expired`.
    pub fn expire(&mut self, now: Duration, expired: &mut Vec<PacketBuf>) {
        let mut i = 0;
        while i < self.datagrams.len() {
            if now.saturating_sub(self.datagrams[i].since) >= REASSEMBLY_TIMEOUT {
                expired.push(self.datagrams.swap_remove(i).buf);
            } else {
                i += 1;
            }
        }
    }

    /// When the oldest datagram in progress times out.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.datagrams.iter().map(|d| d.since + REASSEMBLY_TIMEOUT).min()
    }

    /// Gives back every buffer (shutdown).
    pub fn drain(&mut self, out: &mut Vec<PacketBuf>) {
        out.extend(self.datagrams.drain(..).map(|d| d.buf));
    }
}
