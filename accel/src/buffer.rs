//! Packet buffers with headroom and tailroom, from a pool allocated once:
//! the registered memory of the offload boundary.
//!
//! A frame is received at `HEADROOM` so that encapsulation can prepend the
//! outer IPv4 header, ESP header and IV, and append padding, trailer and ICV,
//! without moving the payload. The pool recycles buffers, so the fast path
//! never allocates. A job carries its buffer to the engine by moving the
//! buffer's handle (the heap pointer), never by copying the bytes: that is
//! the `registered` buffer policy. The `per-request` policy copies into a
//! freshly allocated bounce buffer instead.

/// Bytes reserved in front of a received frame: Ethernet (14) + outer IPv4
/// with options (60) + ESP header (8) + the largest IV (16), rounded up.
pub const HEADROOM: usize = 128;
/// Bytes reserved behind the largest accepted frame: at most 255 bytes of
/// padding, pad length, next header and the largest ICV (16).
pub const TAILROOM: usize = 288;
/// The largest frame the gateway accepts (an Ethernet frame of 1500 bytes of
/// payload plus a VLAN tag and FCS would fit; jumbo frames do not).
pub const MAX_FRAME: usize = 1536 + 512;
/// Size of every pool buffer.
pub const BUFFER_SIZE: usize = HEADROOM + MAX_FRAME + TAILROOM;

/// [`PacketBuf::tag`] of a buffer no driver has tagged: a frame the gateway
/// made itself (an ARP request, a control datagram), or one read without
/// per-frame verdicts.
pub const UNTAGGED: u32 = u32::MAX;

/// One packet: a fixed buffer and the window `start..end` that holds data,
/// plus two words of metadata that travel with the packet through the
/// gateway and the engine.
///
/// `start` and `end` are `u32` so that the metadata fits in the space they
/// would otherwise take: a buffer stays 32 bytes and an engine job 128.
pub struct PacketBuf {
    storage: Box<[u8]>,
    start: u32,
    end: u32,
    /// The driver's number for the received frame this packet came from.
    tag: u32,
    /// Set by the gateway when it rewrites a received frame into one of its
    /// own (a reply or an ICMP error): what became of the frame it held.
    note: u16,
}

impl std::fmt::Debug for PacketBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketBuf")
            .field("start", &self.start)
            .field("len", &self.len())
            .field("tag", &self.tag)
            .finish()
    }
}

impl PacketBuf {
    fn new() -> Self {
        PacketBuf {
            storage: vec![0u8; BUFFER_SIZE].into_boxed_slice(),
            start: HEADROOM as u32,
            end: HEADROOM as u32,
            tag: UNTAGGED,
            note: 0,
        }
    }

    /// A placeholder with no storage (allocates nothing), for taking a
    /// buffer out of a slot.
    pub fn empty() -> Self {
        PacketBuf {
            storage: Box::new([]),
            start: 0,
            end: 0,
            tag: UNTAGGED,
            note: 0,
        }
    }

    /// A standalone buffer of `len` bytes, all of them data, with no
    /// headroom or tailroom: for engine-level requests that are not frames
    /// (the shared engine's server copies, the tenants benchmark's 4 and 8
    /// KB requests). Allocates; never on the fast path.
    pub fn with_len(len: usize) -> Self {
        PacketBuf {
            storage: vec![0u8; len].into_boxed_slice(),
            start: 0,
            end: len as u32,
            tag: UNTAGGED,
            note: 0,
        }
    }

    /// Sets the data window to `0..len` of the storage (at most its
    /// capacity), for standalone buffers reused at different lengths.
    pub fn set_window(&mut self, len: usize) {
        self.start = 0;
        self.end = len.min(self.storage.len()) as u32;
    }

    /// The bytes of storage.
    pub fn capacity(&self) -> usize {
        self.storage.len()
    }

    /// Empties the buffer, restores the default headroom and clears the
    /// metadata.
    pub fn reset(&mut self) {
        let headroom = HEADROOM.min(self.storage.len()) as u32;
        self.start = headroom;
        self.end = headroom;
        self.tag = UNTAGGED;
        self.note = 0;
    }

    /// The received frame this packet came from, as the driver numbered it
    /// ([`UNTAGGED`] if none did). Kept through every rewrite in place, the
    /// engine and the neighbour queue, so that a driver can tie each output
    /// to its input without a table of its own.
    #[inline]
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// Sets the driver's number of the received frame ([`tag`](Self::tag)).
    #[inline]
    pub fn set_tag(&mut self, tag: u32) {
        self.tag = tag;
    }

    /// The gateway's note on this buffer; 0 while it holds the frame it was
    /// given (see `dataplane::fate`).
    #[inline]
    pub fn note(&self) -> u16 {
        self.note
    }

    /// Sets the gateway's note ([`note`](Self::note)).
    #[inline]
    pub fn set_note(&mut self, note: u16) {
        self.note = note;
    }

    /// Replaces the contents with `frame`; `false` if it is larger than
    /// [`MAX_FRAME`].
    pub fn fill(&mut self, frame: &[u8]) -> bool {
        if frame.len() > MAX_FRAME {
            return false;
        }
        self.reset();
        self.end = self.start + frame.len() as u32;
        self.storage[self.start as usize..self.end as usize].copy_from_slice(frame);
        true
    }

    /// The data window: the packet's bytes, from its current start to its end.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.storage[self.start as usize..self.end as usize]
    }

    /// The data window, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start as usize..self.end as usize]
    }

    /// Bytes of data in the window.
    #[inline]
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Whether the window holds no data.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Bytes free in front of the data, for [`prepend`](Self::prepend).
    #[inline]
    pub fn headroom(&self) -> usize {
        self.start as usize
    }

    /// Bytes free behind the data, for [`append`](Self::append).
    #[inline]
    pub fn tailroom(&self) -> usize {
        self.storage.len() - self.end as usize
    }

    /// Grows the data `n` bytes to the front; the new bytes are returned
    /// for the caller to fill. `None` if the headroom is too small.
    #[inline]
    pub fn prepend(&mut self, n: usize) -> Option<&mut [u8]> {
        let start = (self.start as usize).checked_sub(n)?;
        self.start = start as u32;
        Some(&mut self.storage[start..start + n])
    }

    /// Grows the data `n` bytes at the back. `None` if the tailroom is too small.
    #[inline]
    pub fn append(&mut self, n: usize) -> Option<&mut [u8]> {
        if self.tailroom() < n {
            return None;
        }
        let end = self.end as usize;
        self.end = (end + n) as u32;
        Some(&mut self.storage[end..end + n])
    }

    /// Drops `n` bytes from the front; `false` (and no change) if shorter.
    #[inline]
    pub fn trim_front(&mut self, n: usize) -> bool {
        if n > self.len() {
            return false;
        }
        self.start += n as u32;
        true
    }

    /// Keeps only the first `len` bytes; `false` (and no change) if shorter.
    #[inline]
    pub fn truncate(&mut self, len: usize) -> bool {
        if len > self.len() {
            return false;
        }
        self.end = self.start + len as u32;
        true
    }

    /// Moves the first `len` bytes of data `by` bytes towards the front,
    /// growing the data at the front (used to open a gap behind an IP
    /// header for transport mode). `false` if the headroom is too small.
    pub fn open_gap_after(&mut self, len: usize, by: usize) -> bool {
        if len > self.len() || self.headroom() < by {
            return false;
        }
        let from = self.start as usize;
        self.storage.copy_within(from..from + len, from - by);
        self.start -= by as u32;
        true
    }

    /// The inverse of [`open_gap_after`](Self::open_gap_after): moves the
    /// first `len` bytes `by` bytes towards the back, over a gap.
    pub fn close_gap_after(&mut self, len: usize, by: usize) -> bool {
        if len + by > self.len() {
            return false;
        }
        let from = self.start as usize;
        self.storage.copy_within(from..from + len, from + by);
        self.start += by as u32;
        true
    }
}

/// A fixed set of buffers, allocated up front. The default pool is empty.
#[derive(Default)]
pub struct PacketPool {
    free: Vec<PacketBuf>,
    capacity: usize,
}

impl PacketPool {
    /// A pool of `capacity` buffers of [`BUFFER_SIZE`] bytes each, all allocated now.
    pub fn new(capacity: usize) -> Self {
        PacketPool {
            free: (0..capacity).map(|_| PacketBuf::new()).collect(),
            capacity,
        }
    }

    /// A buffer, or `None` when every buffer is in use.
    pub fn alloc(&mut self) -> Option<PacketBuf> {
        let mut buf = self.free.pop()?;
        buf.reset();
        Some(buf)
    }

    /// Gives a buffer back. It must be one of this pool's, returned once.
    pub fn free(&mut self, buf: PacketBuf) {
        debug_assert!(
            self.free.len() < self.capacity,
            "buffer returned twice or from another pool"
        );
        self.free.push(buf);
    }

    /// How many buffers the pool owns, free or not.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Buffers free now.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Buffers handed out and not yet given back.
    pub fn in_use(&self) -> usize {
        self.capacity - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepend_append_and_trim_stay_in_bounds() {
        let mut pool = PacketPool::new(2);
        let mut buf = pool.alloc().unwrap();
        assert!(buf.fill(&[1, 2, 3, 4]));
        assert_eq!(buf.headroom(), HEADROOM);
        buf.prepend(2).unwrap().copy_from_slice(&[9, 9]);
        buf.append(1).unwrap()[0] = 7;
        assert_eq!(buf.data(), &[9, 9, 1, 2, 3, 4, 7]);
        assert!(buf.prepend(HEADROOM).is_none());
        assert!(buf.append(buf.tailroom() + 1).is_none());
        assert!(buf.trim_front(2));
        assert!(buf.truncate(4));
        assert_eq!(buf.data(), &[1, 2, 3, 4]);
        assert!(!buf.trim_front(5));
        assert!(!buf.truncate(5));
        assert!(!buf.fill(&vec![0; MAX_FRAME + 1]));
        assert_eq!(pool.in_use(), 1);
        pool.free(buf);
        assert_eq!(pool.available(), 2);
    }

    /// The metadata rides along with every rewrite and is cleared when the
    /// buffer is reused; it costs no space (jobs carry buffers by value).
    #[test]
    fn tags_survive_rewrites_and_not_reuse() {
        assert_eq!(std::mem::size_of::<PacketBuf>(), 32);
        let mut pool = PacketPool::new(1);
        let mut buf = pool.alloc().unwrap();
        assert_eq!((buf.tag(), buf.note()), (UNTAGGED, 0));
        assert!(buf.fill(&[1, 2, 3, 4]));
        buf.set_tag(7);
        buf.set_note(3);
        buf.prepend(2).unwrap();
        assert!(buf.trim_front(3));
        assert!(buf.truncate(1));
        assert_eq!((buf.tag(), buf.note()), (7, 3));
        pool.free(buf);
        let buf = pool.alloc().unwrap();
        assert_eq!((buf.tag(), buf.note()), (UNTAGGED, 0));
        pool.free(buf);
    }

    #[test]
    fn gaps_open_and_close_behind_a_header() {
        let mut pool = PacketPool::new(1);
        let mut buf = pool.alloc().unwrap();
        buf.fill(&[1, 2, 3, 10, 11]);
        assert!(buf.open_gap_after(3, 2));
        buf.data_mut()[3..5].copy_from_slice(&[0xaa, 0xbb]);
        assert_eq!(buf.data(), &[1, 2, 3, 0xaa, 0xbb, 10, 11]);
        assert!(buf.close_gap_after(3, 2));
        assert_eq!(buf.data(), &[1, 2, 3, 10, 11]);
        assert!(!buf.close_gap_after(4, 2));
    }
}
