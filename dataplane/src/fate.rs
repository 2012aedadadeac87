//! Per-frame fates in the buffer: what became of a received frame that the
//! gateway rewrote into one of its own, and the driver's note that the
//! kernel verified a frame's checksum.
//!
//! The core hands back buffers, not frames, and not always at once: an
//! engine may complete a packet calls later, a packet may wait for ARP or
//! for the packets ahead of it on its SA, one frame may leave as several
//! fragments, and reassembly turns several frames into one datagram. So
//! the tie between an output and its input travels with the packet: the
//! driver numbers each frame in its buffer's tag ([`PacketBuf::tag`]), and
//! the core keeps the tag through everything it does to the packet in
//! place, copies it to the fragments it splits off, and gives a reassembled
//! datagram the tag of the fragment that completed it (or, if the datagram
//! is given up, of the fragment that started it). Where the core rewrites a
//! received frame into one of its own (an ARP or echo reply, an ICMP
//! error), it notes in the buffer what became of the frame itself
//! ([`PacketBuf::note`]). Tagging costs two words already in the buffer and
//! nothing on the fast path. A driver that reports a verdict per frame
//! folds the outputs into their frames (the `drivers` crate's `frame_log`).
//!
//! Owns the notes' encoding; must not look at what a frame holds.

use crate::buffer::PacketBuf;
use crate::stats::DropReason;

/// What became of one received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Transmitted (possibly rewritten: encapsulated, decapsulated, routed).
    Forwarded,
    /// Taken by the gateway: addressed to it, answered by it, a dummy
    /// packet, a fragment absorbed by reassembly, control traffic.
    Consumed,
    /// Discarded, for this reason (counted under it in [`Stats`](crate::Stats)).
    Dropped(DropReason),
}

impl Fate {
    /// The verdict's name in a per-frame log: `forwarded`, `consumed` or
    /// `dropped` (the reason is logged beside it).
    pub fn name(self) -> &'static str {
        match self {
            Fate::Forwarded => "forwarded",
            Fate::Consumed => "consumed",
            Fate::Dropped(_) => "dropped",
        }
    }

    /// How strongly this fate speaks for the frame when several outputs do.
    pub fn weight(self) -> u8 {
        match self {
            Fate::Consumed => 0,
            Fate::Forwarded => 1,
            Fate::Dropped(_) => 2,
        }
    }
}

const NOTE_CONSUMED: u16 = 1;
const NOTE_DROPPED: u16 = 2;
/// A driver's note on a frame it hands in, not a fate: the kernel
/// verified its L4 checksum. No drop reason's note reaches it.
const NOTE_CHECKSUM_VERIFIED: u16 = u16::MAX;

/// Notes in a received frame's buffer, before the driver hands it in,
/// that the kernel already verified its TCP or UDP checksum (the
/// virtio-net header's `DATA_VALID`, `CHECKSUM_UNNECESSARY`), so that
/// the core need not verify it again. The core takes the note off as it
/// classifies the frame (`take_checksum_verified`): it never reaches an
/// output, where notes say what became of frames.
pub fn mark_checksum_verified(buf: &mut PacketBuf) {
    buf.set_note(NOTE_CHECKSUM_VERIFIED);
}

/// Whether the driver noted that the kernel verified the frame's L4
/// checksum; the note is taken off either way.
pub(crate) fn take_checksum_verified(buf: &mut PacketBuf) -> bool {
    let verified = buf.note() == NOTE_CHECKSUM_VERIFIED;
    if verified {
        buf.set_note(0);
    }
    verified
}

/// Notes in `buf` that the frame it held was `fate` and that the buffer now
/// holds a frame the gateway made in its place.
pub(crate) fn mark_replaced(buf: &mut PacketBuf, fate: Fate) {
    let note = match fate {
        Fate::Forwarded => 0,
        Fate::Consumed => NOTE_CONSUMED,
        Fate::Dropped(reason) => NOTE_DROPPED + reason.index() as u16,
    };
    buf.set_note(note);
}

/// The fate of the frame `buf` held, if the gateway replaced it with one of
/// its own.
pub fn replaced(buf: &PacketBuf) -> Option<Fate> {
    match buf.note() {
        0 => None,
        NOTE_CONSUMED => Some(Fate::Consumed),
        n => DropReason::ALL
            .get(usize::from(n - NOTE_DROPPED))
            .map(|r| Fate::Dropped(*r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip_for_every_fate() {
        let mut pool = crate::buffer::PacketPool::new(1);
        let mut buf = pool.alloc().expect("a buffer");
        assert_eq!(replaced(&buf), None);
        for fate in [Fate::Consumed]
            .into_iter()
            .chain(DropReason::ALL.iter().copied().map(Fate::Dropped))
        {
            mark_replaced(&mut buf, fate);
            assert_eq!(replaced(&buf), Some(fate));
        }
        pool.free(buf);
    }
}
