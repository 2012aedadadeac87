//! Reassembly of fragmented inbound ESP (RFC 791 §3.2, RFC 815; over
//! IPv6, RFC 8200 §4.5, for a fragment header right after the fixed
//! header, which is how a peer fragments its own ESP) before
//! decapsulation, with bounded memory: a fixed number of datagrams in
//! progress, a size limit, a timeout, and no tolerance for overlapping
//! fragments (they are how reassembly attacks work; the whole datagram is
//! dropped, as RFC 5722 requires for IPv6).
//!
//! Nobody can hold the table: a new datagram that finds it full evicts the
//! oldest in progress, and one whose source already has
//! [`MAX_PER_SOURCE`] in progress evicts that source's oldest, so a
//! source (spoofed or not) that floods first fragments only ever pushes
//! out its own, and no more than a quarter of the table is anyone's. The
//! gateway hands in fragments only from the remote ends of its SAs
//! (`Sources`): others never take a slot.
//!
//! Owns the datagrams in progress and their buffers; reads no clock (the
//! caller's `now`). Must not judge what it reassembles beyond the fragment
//! headers: the finished datagram goes back through the gateway's checks
//! and decapsulation like any other.

use std::net::IpAddr;
use std::time::Duration;

use rustc_hash::FxHashSet;
use smoltcp::wire::Ipv4Packet;
use spd_sad::IpPrefix;

use crate::buffer::{PacketBuf, PacketPool, MAX_FRAME};

/// Datagrams being reassembled at once.
pub const MAX_DATAGRAMS: usize = 64;
/// Datagrams one source address may have in progress at once.
pub const MAX_PER_SOURCE: usize = MAX_DATAGRAMS / 4;
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
    Complete {
        /// The reassembled packet: the first fragment's header (IPv6:
        /// without the fragment header) with its length rewritten (IPv4:
        /// and its fragment fields and checksum): not a fragment any more.
        datagram: PacketBuf,
        /// The buffer of the fragment that completed it.
        spent: PacketBuf,
    },
    /// Refused; the fragment's buffer comes back with the reason.
    Dropped(PacketBuf, ReassemblyError),
}

/// Why a fragment, or the datagram it belonged to, was given up. Every
/// error but `Malformed` and `NoBuffer` drops the whole datagram in
/// progress, not just the fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReassemblyError {
    /// A fragment covers bytes another already brought, a second last
    /// fragment came, or the last one ends before data already received
    /// (RFC 5722).
    #[error("fragments overlap")]
    Overlap,
    /// The datagram would not fit [`MAX_DATAGRAM`], or the fragment ends
    /// past the length the last fragment gave.
    #[error("reassembled datagram would be too large")]
    TooLarge,
    /// The datagram already has [`MAX_FRAGMENTS`] fragments.
    #[error("too many fragments in one datagram")]
    Full,
    /// The pool had no buffer to assemble a new datagram in.
    #[error("no buffer for reassembly")]
    NoBuffer,
    /// Not a fragment that parses: a bad IP header, or a length that is
    /// zero or, except in the last fragment, not a multiple of 8.
    #[error("malformed fragment")]
    Malformed,
    /// Given up for a newer datagram: the table was full.
    #[error("evicted, oldest of a full table")]
    Evicted,
    /// Given up for a newer datagram from the same source, which had
    /// [`MAX_PER_SOURCE`] in progress.
    #[error("evicted, oldest of a source with {MAX_PER_SOURCE} in progress")]
    SourceLimit,
    /// Not complete within [`REASSEMBLY_TIMEOUT`], or still in progress
    /// when the reassembler was drained.
    #[error("timed out")]
    TimedOut,
}

/// A datagram's assembly buffer given back, and why it was given up.
pub type GivenUp = (PacketBuf, ReassemblyError);

/// The datagrams in progress (at most [`MAX_DATAGRAMS`]); times are the
/// caller's `now`, the reassembler reads no clock.
#[derive(Default)]
pub struct Reassembler {
    datagrams: Vec<Datagram>,
}

/// The sources whose fragments the gateway reassembles: the remote ends
/// of its SAs, where their peers are now (a NAT's address once an
/// authenticated packet showed it), and for transport-mode inbound SAs,
/// which keep the hosts' addresses, the sources their selectors admit.
/// Built from the SAD when it changed (the caller's `stamp` says so), so
/// that a fragment costs one hash lookup, not a walk over the SAs.
#[derive(Debug, Default)]
pub(crate) struct Sources {
    addresses: FxHashSet<IpAddr>,
    prefixes: Vec<IpPrefix>,
    stamp: Option<(u64, usize, u64)>,
}

impl Sources {
    /// Whether the set was built from what `stamp` names.
    pub(crate) fn is_current(&self, stamp: (u64, usize, u64)) -> bool {
        self.stamp == Some(stamp)
    }

    /// Builds the set afresh (reusing its memory).
    pub(crate) fn rebuild(
        &mut self,
        stamp: (u64, usize, u64),
        addresses: impl IntoIterator<Item = IpAddr>,
        prefixes: impl IntoIterator<Item = IpPrefix>,
    ) {
        self.addresses.clear();
        self.addresses.extend(addresses);
        self.prefixes.clear();
        self.prefixes.extend(prefixes);
        self.prefixes.dedup();
        self.stamp = Some(stamp);
    }

    /// Whether fragments from `src` are taken.
    pub(crate) fn admits(&self, src: IpAddr) -> bool {
        self.addresses.contains(&src) || self.prefixes.iter().any(|p| p.contains(src))
    }
}

impl Reassembler {
    /// Datagrams in progress.
    pub fn in_progress(&self) -> usize {
        self.datagrams.len()
    }

    /// Datagrams from `src` in progress.
    pub fn in_progress_from(&self, src: IpAddr) -> usize {
        self.datagrams.iter().filter(|d| d.key.src == src).count()
    }

    /// Gives up the oldest datagram in progress that `which` selects.
    fn evict_oldest(
        &mut self,
        which: impl Fn(&Datagram) -> bool,
        why: ReassemblyError,
        spent: &mut Vec<GivenUp>,
    ) {
        let oldest = self
            .datagrams
            .iter()
            .enumerate()
            .filter(|(_, d)| which(d))
            .min_by_key(|(_, d)| d.since)
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            spent.push((self.datagrams.swap_remove(i).buf, why));
        }
    }

    /// Adds the fragment in `frag` (an IPv4 packet with MF or an offset,
    /// or an IPv6 one with a fragment header right after the fixed one).
    /// A datagram dropped along the way hands its assembly buffer to
    /// `spent`, with the reason.
    pub fn insert(
        &mut self,
        frag: PacketBuf,
        now: Duration,
        pool: &mut PacketPool,
        spent: &mut Vec<GivenUp>,
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
                // Room for the new datagram: its source's oldest gives way
                // when the source has its share, else the table's oldest.
                if self.in_progress_from(key.src) >= MAX_PER_SOURCE {
                    self.evict_oldest(|d| d.key.src == key.src, ReassemblyError::SourceLimit, spent);
                } else if self.datagrams.len() >= MAX_DATAGRAMS {
                    self.evict_oldest(|_| true, ReassemblyError::Evicted, spent);
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
            spent.push((dead.buf, error));
            return Reassembled::Dropped(frag, error);
        }
        // The payload goes at a fixed place behind room for the largest
        // header; the first fragment's header is copied just before it.
        let data = frag.data();
        let needed = HEADER_ROOM + end;
        if d.buf.len() < needed && d.buf.append(needed - d.buf.len()).is_none() {
            let dead = self.datagrams.swap_remove(index);
            spent.push((dead.buf, ReassemblyError::TooLarge));
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
    pub fn expire(&mut self, now: Duration, expired: &mut Vec<GivenUp>) {
        let mut i = 0;
        while i < self.datagrams.len() {
            if now.saturating_sub(self.datagrams[i].since) >= REASSEMBLY_TIMEOUT {
                expired.push((self.datagrams.swap_remove(i).buf, ReassemblyError::TimedOut));
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
    pub fn drain(&mut self, out: &mut Vec<GivenUp>) {
        out.extend(
            self.datagrams
                .drain(..)
                .map(|d| (d.buf, ReassemblyError::TimedOut)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first fragment (MF set, 16 bytes of payload) from `src`.
    fn first_fragment(pool: &mut PacketPool, src: [u8; 4], ident: u16) -> PacketBuf {
        let mut p = vec![0u8; 36];
        {
            let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
            ip.set_version(4);
            ip.set_header_len(20);
            ip.set_total_len(36);
            ip.set_ident(ident);
            ip.set_more_frags(true);
            ip.set_hop_limit(64);
            ip.set_next_header(smoltcp::wire::IpProtocol::IpSecEsp);
            ip.set_src_addr(src.into());
            ip.set_dst_addr([10, 0, 0, 2].into());
            ip.fill_checksum();
        }
        let mut buf = pool.alloc().expect("a buffer");
        assert!(buf.fill(&p));
        buf
    }

    /// A full table makes room by giving up its oldest datagram; a source
    /// at its share gives up its own oldest; nobody is refused a slot.
    #[test]
    fn the_oldest_gives_way_and_each_source_keeps_to_its_share() {
        let mut pool = PacketPool::new(2 * MAX_DATAGRAMS);
        let mut r = Reassembler::default();
        let mut spent = Vec::new();
        let ms = Duration::from_millis;
        // Four sources fill the table, each to its share, oldest first.
        for (i, src) in (1..=4u8).enumerate() {
            for n in 0..MAX_PER_SOURCE {
                let frag = first_fragment(&mut pool, [192, 0, 2, src], n as u16);
                let at = ms((i * MAX_PER_SOURCE + n) as u64);
                match r.insert(frag, at, &mut pool, &mut spent) {
                    Reassembled::Held(frag) => pool.free(frag),
                    _ => panic!("held"),
                }
            }
        }
        assert_eq!(r.in_progress(), MAX_DATAGRAMS);
        assert!(spent.is_empty());
        // A fifth source: the table's oldest (source 1's first) gives way.
        let frag = first_fragment(&mut pool, [192, 0, 2, 5], 0);
        let Reassembled::Held(frag) = r.insert(frag, ms(100), &mut pool, &mut spent) else {
            panic!("held");
        };
        pool.free(frag);
        assert_eq!(r.in_progress(), MAX_DATAGRAMS);
        assert_eq!(spent.len(), 1);
        assert_eq!(spent[0].1, ReassemblyError::Evicted);
        assert_eq!(r.in_progress_from([192, 0, 2, 1].into()), MAX_PER_SOURCE - 1);
        // Source 2, at its share: its own oldest gives way, nobody else's.
        let frag = first_fragment(&mut pool, [192, 0, 2, 2], 999);
        let Reassembled::Held(frag) = r.insert(frag, ms(101), &mut pool, &mut spent) else {
            panic!("held");
        };
        pool.free(frag);
        assert_eq!(spent[1].1, ReassemblyError::SourceLimit);
        assert_eq!(r.in_progress_from([192, 0, 2, 2].into()), MAX_PER_SOURCE);
        assert_eq!(r.in_progress_from([192, 0, 2, 5].into()), 1);
        for (buf, _) in spent.drain(..) {
            pool.free(buf);
        }
        r.drain(&mut spent);
        for (buf, why) in spent.drain(..) {
            assert_eq!(why, ReassemblyError::TimedOut);
            pool.free(buf);
        }
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn sources_are_the_peers_and_transport_selectors() {
        let mut s = Sources::default();
        let stamp = (1, 2, 3);
        assert!(!s.is_current(stamp));
        let prefix = spd_sad::Ipv4Prefix::new([192, 168, 5, 0].into(), 24).unwrap();
        s.rebuild(stamp, [IpAddr::from([10, 0, 0, 1])], [prefix.into()]);
        assert!(s.is_current(stamp));
        assert!(s.admits([10, 0, 0, 1].into()));
        assert!(s.admits([192, 168, 5, 77].into()));
        assert!(!s.admits([10, 0, 0, 9].into()));
        s.rebuild((1, 2, 4), [], []);
        assert!(!s.admits([10, 0, 0, 1].into()));
    }
}
