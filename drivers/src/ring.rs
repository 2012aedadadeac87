//! A `PACKET_MMAP` receive ring (`TPACKET_V2`) for an AF_PACKET socket:
//! the kernel copies each frame, with its virtio-net header, into a slot
//! of memory shared with espgw and flips the slot's status; espgw copies it
//! into a pool buffer and hands the slot back. No system call and no
//! socket buffer per frame, which is what `recvmmsg` costs (the clone,
//! the queue, the copy out and the free).
//!
//! `TPACKET_V2` rather than V3: a V3 block is handed over only when full or
//! when its timer (milliseconds) fires, and at an ordinary load that timer
//! is what a packet waits for (docs/results.md, "Packet I/O"); a V2 slot is
//! the user's as soon as the frame is in it.
//!
//! A frame too large for a slot (a GSO super-packet) is still delivered
//! whole: `PACKET_COPY_THRESH` makes the kernel queue it on the socket as
//! well and mark its slot `TP_STATUS_COPY`, and the driver reads it from
//! there (see [`crate::afpacket`]).
//!
//! This module owns the mapping and the slot protocol, nothing else.

use std::io;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Bytes of one slot: a 1518-byte frame with the slot's header and the
/// virtio-net header before it fits (`tp_mac` is 76 with them).
pub const SLOT_SIZE: usize = 2048;
/// Slots per ring (16 MiB): room for a burst while the worker is
/// descheduled, more than the `recvmmsg` path's 8 MiB socket buffer holds
/// (about 3,300 full-size frames); `tests/workers_netns.rs` saw 2,048 and
/// 4,096 slots overflow under its fragment flood on a busy host.
pub const SLOTS: usize = 8192;
/// Slots of a side socket's ring (ARP: a few frames a second, bursts of
/// a neighbour table's size), one block: 1 MiB.
pub const SIDE_SLOTS: usize = BLOCK_SIZE / SLOT_SIZE;
const BLOCK_SIZE: usize = 1 << 20;

/// One slot as the kernel filled it.
pub struct Slot<'a> {
    /// `TP_STATUS_COPY`: the frame did not fit and waits whole on the
    /// socket's queue.
    pub copied: bool,
    /// The frame was longer than what the slot holds (and not queued).
    pub cut: bool,
    /// The virtio-net header before the frame.
    pub header: &'a [u8],
    /// The frame's bytes in the slot, from its Ethernet header (empty if
    /// the slot's header was not what the kernel writes).
    pub frame: &'a [u8],
}

/// The mapped ring of one socket and where its reader stands in it;
/// unmapped when dropped.
pub struct RxRing {
    base: NonNull<u8>,
    len: usize,
    slots: usize,
    /// The next slot to look at; only the worker that owns the socket
    /// reads the ring, and it stores this once per batch.
    head: AtomicUsize,
}

// SAFETY: the mapping is plain shared memory; slots are handed between
// the kernel and one reader by their status word (acquire/release).
unsafe impl Send for RxRing {}
// SAFETY: as above; `&RxRing` is only read from by the worker owning the
// socket (the other threads reach the socket for options only).
unsafe impl Sync for RxRing {}

/// A `SOL_PACKET` option on the ring's socket.
fn set<T>(fd: &OwnedFd, name: libc::c_int, value: &T) -> io::Result<()> {
    crate::sockopt::set_option(fd, libc::SOL_PACKET, name, value)
}

impl RxRing {
    /// Sets up a ring of `slots` slots (a multiple of [`SIDE_SLOTS`]) on
    /// `fd` (before it is bound, after `PACKET_VNET_HDR`, which cannot
    /// change once a ring exists).
    pub fn setup(fd: &OwnedFd, slots: usize) -> io::Result<RxRing> {
        let slots = slots.max(SIDE_SLOTS).next_multiple_of(SIDE_SLOTS);
        set(
            fd,
            libc::PACKET_VERSION,
            &(libc::tpacket_versions::TPACKET_V2 as libc::c_int),
        )?;
        // Any non-zero value: frames too large for a slot go to the queue too.
        set(fd, libc::PACKET_COPY_THRESH, &(1 as libc::c_int))?;
        let request = libc::tpacket_req {
            tp_block_size: BLOCK_SIZE as u32,
            tp_block_nr: (slots * SLOT_SIZE / BLOCK_SIZE) as u32,
            tp_frame_size: SLOT_SIZE as u32,
            tp_frame_nr: slots as u32,
        };
        set(fd, libc::PACKET_RX_RING, &request)?;
        let len = slots * SLOT_SIZE;
        // The socket's ring, of the size the kernel was just asked for.
        let base = accel::os::map_shared(fd, len)?;
        Ok(RxRing {
            base,
            len,
            slots,
            head: AtomicUsize::new(0),
        })
    }

    /// The index of the next slot to read. It only counts up (the slot is
    /// the index modulo the ring's size).
    pub fn head(&self) -> usize {
        self.head.load(Ordering::Relaxed)
    }

    /// Stores where the next batch starts reading, once the slots before
    /// it are [`release`](Self::release)d.
    pub fn set_head(&self, head: usize) {
        self.head.store(head, Ordering::Relaxed);
    }

    fn status(&self, index: usize) -> &AtomicU32 {
        let offset = (index % self.slots) * SLOT_SIZE;
        // SAFETY: the slot's first word (tp_status) is inside the mapping,
        // 4-byte aligned, and the kernel writes it atomically.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// Slot `index`, if the kernel has handed it over.
    pub fn slot(&self, index: usize) -> Option<Slot<'_>> {
        let status = self.status(index).load(Ordering::Acquire);
        if status & libc::TP_STATUS_USER == 0 {
            return None;
        }
        let offset = (index % self.slots) * SLOT_SIZE;
        // SAFETY: the slot lies inside the mapping and is ours until
        // `release`; after the acquire above the kernel's writes are seen.
        let bytes = unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), SLOT_SIZE) };
        let word = |at: usize| u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let len = word(4) as usize;
        let snaplen = word(8) as usize;
        let mac = usize::from(u16::from_ne_bytes([bytes[12], bytes[13]]));
        let header_len = dataplane::wire::vnet::HEADER_LEN;
        let copied = status & libc::TP_STATUS_COPY != 0;
        if mac < header_len || mac + snaplen > SLOT_SIZE {
            // Not what the kernel writes; treat as a frame cut short.
            return Some(Slot {
                copied,
                cut: true,
                header: &[],
                frame: &[],
            });
        }
        Some(Slot {
            copied,
            cut: len > snaplen,
            header: &bytes[mac - header_len..mac],
            frame: &bytes[mac..mac + snaplen],
        })
    }

    /// Hands slot `index` back to the kernel.
    pub fn release(&self, index: usize) {
        self.status(index)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
    }
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `setup`, of that length, no longer
        // borrowed (slots borrow `&self`).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
