//! A tenant's shared region seen through raw pointers: the ring indices as
//! atomics, entries and data copied in and out. Both sides use it; neither
//! ever forms a Rust reference to bytes the other process may be writing
//! (a hostile tenant could change them under the server), so every access
//! is a copy or an atomic.

use std::sync::atomic::{AtomicU32, Ordering};

use super::sys::Mapping;
use super::wire::{layout, COMPLETION_LEN, REQUEST_LEN};

/// The region of one tenant; see [`layout`].
#[derive(Debug)]
pub(crate) struct Rings {
    map: Mapping,
    entries: u32,
    slot_size: u32,
    req: usize,
    comp: usize,
    data: usize,
}

impl Rings {
    /// Wraps a mapping of at least `layout::offsets(entries, slot_size).3`
    /// bytes; `None` if it is shorter or `entries` is not a power of two.
    pub(crate) fn new(map: Mapping, entries: u32, slot_size: u32) -> Option<Rings> {
        if !entries.is_power_of_two() {
            return None;
        }
        let (req, comp, data, total) = layout::offsets(entries as usize, slot_size as usize);
        if map.len() < total {
            return None;
        }
        Some(Rings {
            map,
            entries,
            slot_size,
            req,
            comp,
            data,
        })
    }

    /// Entries in each ring (a power of two).
    pub(crate) fn entries(&self) -> u32 {
        self.entries
    }

    /// Bytes of the data area.
    pub(crate) fn data_len(&self) -> usize {
        self.entries as usize * self.slot_size as usize
    }

    fn atomic(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at.is_multiple_of(64) && at < layout::HEADER);
        // SAFETY: `at` is a 64-byte aligned offset inside the header of a
        // page-aligned mapping that lives as long as `self`; AtomicU32 has
        // the size and alignment of u32, and the other side only ever
        // touches these words atomically.
        unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU32>() }
    }

    /// Reads the header word at `at` (a [`layout`] offset), acquiring what
    /// the other side published before it.
    pub(crate) fn load(&self, at: usize) -> u32 {
        self.atomic(at).load(Ordering::Acquire)
    }

    /// Writes the header word at `at`, releasing what this side wrote before.
    pub(crate) fn store(&self, at: usize, value: u32) {
        self.atomic(at).store(value, Ordering::Release);
    }

    /// Publishes a flag and then reads a ring index, with a full fence
    /// between (the sleeping-flag handshake: either the other side sees
    /// the flag and rings, or this side sees its index move).
    pub(crate) fn flag_then_load(&self, flag: usize, value: u32, at: usize) -> u32 {
        self.atomic(flag).store(value, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.atomic(at).load(Ordering::SeqCst)
    }

    /// Publishes an index and then reads the other side's sleeping flag.
    pub(crate) fn store_then_flag(&self, at: usize, value: u32, flag: usize) -> bool {
        self.atomic(at).store(value, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.atomic(flag).load(Ordering::SeqCst) != 0
    }

    /// Copies out request entry `index` (free-running; taken modulo the ring).
    pub(crate) fn read_request(&self, index: u32, out: &mut [u8; REQUEST_LEN]) {
        let at = self.req + (index & (self.entries - 1)) as usize * REQUEST_LEN;
        // SAFETY: `at..at + 64` lies in the request ring inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(at), out.as_mut_ptr(), REQUEST_LEN) };
    }

    /// Copies in request entry `index` (free-running; taken modulo the ring).
    pub(crate) fn write_request(&self, index: u32, entry: &[u8; REQUEST_LEN]) {
        let at = self.req + (index & (self.entries - 1)) as usize * REQUEST_LEN;
        // SAFETY: as in `read_request`.
        unsafe { std::ptr::copy_nonoverlapping(entry.as_ptr(), self.map.as_ptr().add(at), REQUEST_LEN) };
    }

    /// Copies out completion entry `index` (free-running; taken modulo the ring).
    pub(crate) fn read_completion(&self, index: u32, out: &mut [u8; COMPLETION_LEN]) {
        let at = self.comp + (index & (self.entries - 1)) as usize * COMPLETION_LEN;
        // SAFETY: `at..at + 16` lies in the completion ring.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(at), out.as_mut_ptr(), COMPLETION_LEN) };
    }

    /// Copies in completion entry `index` (free-running; taken modulo the ring).
    pub(crate) fn write_completion(&self, index: u32, entry: &[u8; COMPLETION_LEN]) {
        let at = self.comp + (index & (self.entries - 1)) as usize * COMPLETION_LEN;
        // SAFETY: as in `read_completion`.
        unsafe { std::ptr::copy_nonoverlapping(entry.as_ptr(), self.map.as_ptr().add(at), COMPLETION_LEN) };
    }

    /// Whether `offset..offset + len` lies inside the data area (in u64, so
    /// that no hostile pair wraps round).
    pub(crate) fn data_fits(&self, offset: u32, len: u32) -> bool {
        offset as u64 + len as u64 <= self.data_len() as u64
    }

    /// Copies `dst.len()` bytes from the data area at `offset`. The caller
    /// has checked [`data_fits`](Self::data_fits).
    pub(crate) fn read_data(&self, offset: u32, dst: &mut [u8]) {
        assert!(self.data_fits(offset, dst.len() as u32) && dst.len() <= u32::MAX as usize);
        // SAFETY: the range lies in the data area (checked just above).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(self.data + offset as usize),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
    }

    /// Copies `src` into the data area at `offset`.
    pub(crate) fn write_data(&self, offset: u32, src: &[u8]) {
        assert!(self.data_fits(offset, src.len() as u32) && src.len() <= u32::MAX as usize);
        // SAFETY: as in `read_data`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.map.as_ptr().add(self.data + offset as usize),
                src.len(),
            )
        };
    }
}
