//! Anti-replay window with extended sequence numbers (RFC 4303 §3.4.3 and
//! Appendix A), as a ring of 64-bit words (RFC 6479) so that advancing the
//! window clears whole words instead of shifting the bitmap.
//!
//! Checking and updating are separate: the window moves only after the ICV
//! of a packet has verified (RFC 4303 §3.4.3), so a forged packet can never
//! advance it.

/// The largest window a configuration may ask for.
pub const MAX_WINDOW: u32 = 65_536;

/// Why a sequence number was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Already received.
    #[error("sequence number {0} was already received")]
    Duplicate(u64),
    /// Left of the window.
    #[error("sequence number {0} is older than the replay window")]
    TooOld(u64),
    /// Sequence number zero is never sent (RFC 4303 §3.3.3), nor one that
    /// would lie before it once ESN high bits are inferred.
    #[error("sequence number is zero or before the start of the sequence space")]
    Invalid,
}

/// Receive-side sequence state of one SA.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// Window size W in packets; 0 disables replay checking (sequence
    /// numbers are still inferred for ESN).
    size: u32,
    esn: bool,
    /// Highest authenticated sequence number seen (T); 0 before the first.
    top: u64,
    bitmap: Box<[u64]>,
}

impl ReplayWindow {
    /// `size` is clamped to [`MAX_WINDOW`].
    pub fn new(size: u32, esn: bool) -> Self {
        let size = size.min(MAX_WINDOW);
        // One extra word so the ring can advance a word at a time (RFC 6479).
        let words = (size as usize).div_ceil(64) + 1;
        ReplayWindow {
            size,
            esn,
            top: 0,
            bitmap: vec![0u64; words].into_boxed_slice(),
        }
    }

    /// A window that resumes at `top`, for example after a restart or when
    /// a peer starts its sequence near 2^32 in tests.
    pub fn with_top(size: u32, esn: bool, top: u64) -> Self {
        let mut window = Self::new(size, esn);
        window.top = top;
        window
    }

    /// A window that resumes above `top` after a restart, with every
    /// number up to `top` counted as received: a packet accepted before
    /// the restart, replayed after it, is a duplicate (or too old), never
    /// new. (A window that [`with_top`](Self::with_top) resumes would take
    /// the numbers of the window below `top` that it never saw.)
    pub fn resumed(size: u32, esn: bool, top: u64) -> Self {
        let mut window = Self::with_top(size, esn, top);
        if top == 0 {
            return window;
        }
        window.bitmap.fill(u64::MAX);
        // The bits above `top` in its own word stand for numbers still to
        // come (the ring clears a word only when the top enters it).
        let (word, bit) = window.position(top);
        if bit < 63 {
            window.bitmap[word] &= (1u64 << (bit + 1)) - 1;
        }
        window
    }

    /// How many sequence numbers the window spans.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Whether sequence numbers are 64-bit (RFC 4303 §2.2.1, extended sequence
    /// numbers).
    pub fn esn(&self) -> bool {
        self.esn
    }

    /// Heap bytes of the bitmap (for an SA's memory figure).
    pub fn bitmap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.bitmap)
    }

    /// Highest sequence number accepted so far.
    pub fn top(&self) -> u64 {
        self.top
    }

    fn bits(&self) -> u64 {
        self.bitmap.len() as u64 * 64
    }

    /// Reconstructs the full 64-bit sequence number from the 32 low bits on
    /// the wire (RFC 4303 Appendix A2.2) and checks it against the window,
    /// without changing any state.
    pub fn check(&self, seq_low: u32) -> Result<u64, ReplayError> {
        let seq = self.infer(seq_low)?;
        self.check_full(seq).map(|()| seq)
    }

    /// Checks a full 64-bit sequence number (already inferred) against the
    /// window, without changing any state.
    pub fn check_full(&self, seq: u64) -> Result<(), ReplayError> {
        if seq == 0 {
            return Err(ReplayError::Invalid);
        }
        if self.size == 0 || seq > self.top {
            return Ok(());
        }
        if self.top - seq >= u64::from(self.size) {
            return Err(ReplayError::TooOld(seq));
        }
        if self.bit(seq) {
            return Err(ReplayError::Duplicate(seq));
        }
        Ok(())
    }

    fn infer(&self, seq_low: u32) -> Result<u64, ReplayError> {
        self.infer_at(seq_low, self.top)
    }

    /// The inference of [`check`](Self::check) as it would be with the
    /// window's top at `top`, for asking whether packets in flight could
    /// change it.
    pub fn infer_at(&self, seq_low: u32, top: u64) -> Result<u64, ReplayError> {
        if !self.esn {
            return Ok(u64::from(seq_low));
        }
        // Without a window the inference still needs some reach backwards;
        // one packet's worth keeps reordering from being read as a wrap.
        let w = u64::from(self.size.max(1));
        let tl = top & 0xffff_ffff;
        let th = top >> 32;
        let sl = u64::from(seq_low);
        let high = if tl >= w - 1 {
            // Case A: the window lies within one 2^32 subspace.
            if sl >= tl + 1 - w {
                th
            } else {
                th + 1
            }
        } else {
            // Case B: the window spans two subspaces.
            let floor = (tl + (1 << 32) + 1 - w) & 0xffff_ffff;
            if sl >= floor {
                th.checked_sub(1).ok_or(ReplayError::Invalid)?
            } else {
                th
            }
        };
        if high > u64::from(u32::MAX) {
            return Err(ReplayError::Invalid);
        }
        Ok(high << 32 | sl)
    }

    /// Records `seq` (as returned by [`check`](Self::check)) once its packet
    /// has been authenticated.
    pub fn update(&mut self, seq: u64) {
        if self.size == 0 {
            self.top = self.top.max(seq);
            return;
        }
        if seq > self.top {
            let old_word = self.top / 64;
            let new_word = seq / 64;
            let words = self.bitmap.len() as u64;
            if new_word - old_word >= words {
                self.bitmap.fill(0);
            } else {
                for w in old_word + 1..=new_word {
                    self.bitmap[(w % words) as usize] = 0;
                }
            }
            self.top = seq;
        } else if self.top - seq >= u64::from(self.size) {
            return;
        }
        let (word, bit) = self.position(seq);
        self.bitmap[word] |= 1 << bit;
    }

    fn position(&self, seq: u64) -> (usize, u32) {
        let index = seq % self.bits();
        ((index / 64) as usize, (index % 64) as u32)
    }

    fn bit(&self, seq: u64) -> bool {
        let (word, bit) = self.position(seq);
        self.bitmap[word] & (1 << bit) != 0
    }

    /// This window at another size, for an SA whose successor keeps its
    /// keys and so its sequence state: the same top, the numbers seen still
    /// seen, and every number the old window no longer tells about (below
    /// its bottom, or all of them without a window) counted as seen too, so
    /// that nothing accepted before is accepted again.
    pub fn resized(&self, size: u32) -> ReplayWindow {
        let mut window = ReplayWindow::new(size, self.esn);
        if self.top == 0 {
            return window;
        }
        let lowest = self
            .top
            .saturating_sub(u64::from(window.size).saturating_sub(1))
            .max(1);
        for seq in lowest..=self.top {
            let seen =
                seq == self.top || self.size == 0 || self.top - seq >= u64::from(self.size) || self.bit(seq);
            if seen {
                window.update(seq);
            }
        }
        window
    }

    /// Sequence numbers within the window that have been received, newest
    /// first, for `sa show`.
    pub fn received_in_window(&self) -> impl Iterator<Item = u64> + '_ {
        let lowest = self
            .top
            .saturating_sub(u64::from(self.size).saturating_sub(1))
            .max(1);
        (lowest..=self.top)
            .rev()
            .filter(move |&s| self.size > 0 && self.bit(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resized_window_refuses_whatever_the_old_one_had_seen_or_forgotten() {
        let mut old = ReplayWindow::new(64, false);
        for seq in [1u64, 2, 3, 70, 72, 100] {
            old.update(seq);
        }
        // (A window of 0 turns the check off: nothing to keep.)
        for size in [32u32, 64, 128, 1024] {
            let new = old.resized(size);
            assert_eq!(new.top(), 100);
            for seq in 1..=100u64 {
                let before = old.check_full(seq).is_ok();
                let after = new.check_full(seq).is_ok();
                assert!(
                    !after || before,
                    "size {size}: {seq} refused before, accepted after"
                );
            }
            // Numbers the old window had not seen and the new one holds stay open.
            if size >= 64 {
                assert!(new.check_full(99).is_ok(), "size {size}");
            }
            assert!(new.check_full(101).is_ok());
        }
        assert_eq!(ReplayWindow::new(64, true).resized(128).top(), 0);
    }

    fn accept(w: &mut ReplayWindow, low: u32) -> Result<u64, ReplayError> {
        let seq = w.check(low)?;
        w.update(seq);
        Ok(seq)
    }

    #[test]
    fn accepts_in_order_and_refuses_duplicates() {
        let mut w = ReplayWindow::new(64, false);
        assert_eq!(w.check(0), Err(ReplayError::Invalid));
        for s in 1..=1000 {
            assert_eq!(accept(&mut w, s), Ok(u64::from(s)));
            assert_eq!(w.check(s), Err(ReplayError::Duplicate(u64::from(s))));
        }
        assert_eq!(w.check(1000 - 64), Err(ReplayError::TooOld(936)));
        assert_eq!(w.check(1000 - 63), Err(ReplayError::Duplicate(937)));
    }

    #[test]
    fn accepts_reordered_within_window_once() {
        let mut w = ReplayWindow::new(128, false);
        accept(&mut w, 200).unwrap();
        for s in (73..200).rev() {
            assert_eq!(accept(&mut w, s), Ok(u64::from(s)), "seq {s}");
        }
        assert_eq!(w.check(72), Err(ReplayError::TooOld(72)));
        for s in 73..=200 {
            assert_eq!(w.check(s), Err(ReplayError::Duplicate(u64::from(s))));
        }
    }

    #[test]
    fn check_alone_does_not_move_the_window() {
        let mut w = ReplayWindow::new(64, false);
        accept(&mut w, 10).unwrap();
        assert_eq!(w.check(5000), Ok(5000));
        assert_eq!(w.top(), 10);
        assert_eq!(accept(&mut w, 9), Ok(9));
    }

    #[test]
    fn large_jump_clears_the_whole_ring() {
        let mut w = ReplayWindow::new(4096, false);
        for s in 1..=4096 {
            accept(&mut w, s).unwrap();
        }
        accept(&mut w, 1_000_000).unwrap();
        // Everything left of the new window is too old; everything inside it
        // but the top is fresh.
        assert_eq!(w.check(1_000_000 - 4095), Ok(1_000_000 - 4095));
        assert_eq!(
            w.check(1_000_000 - 4096),
            Err(ReplayError::TooOld(1_000_000 - 4096))
        );
    }

    #[test]
    fn esn_wraps_across_two_to_the_32() {
        let mut w = ReplayWindow::with_top(64, true, u64::from(u32::MAX) - 10);
        for s in (u32::MAX - 9)..=u32::MAX {
            assert_eq!(accept(&mut w, s), Ok(u64::from(s)));
        }
        // Low bits wrap to 0, 1, 2...: the high half becomes 1.
        assert_eq!(w.check(0), Ok(1 << 32));
        assert_eq!(accept(&mut w, 1), Ok((1 << 32) | 1));
        assert_eq!(accept(&mut w, 0), Ok(1 << 32));
        // A late packet from just before the wrap is still recognised (case B).
        assert_eq!(w.check(u32::MAX - 20), Ok(u64::from(u32::MAX - 20)));
        assert_eq!(
            w.check(u32::MAX),
            Err(ReplayError::Duplicate(u64::from(u32::MAX)))
        );
        // Far behind the window, a low value is read as the next subspace
        // (Appendix A2.2); the wrong high bits then fail the ICV.
        assert_eq!(w.check(u32::MAX - 100), Ok((1 << 32) | u64::from(u32::MAX - 100)));
    }

    #[test]
    fn esn_case_b_at_the_very_start_is_invalid() {
        let w = ReplayWindow::new(64, true);
        // T = 0: a low value near 2^32 would mean a sequence before 0.
        assert_eq!(w.check(u32::MAX), Err(ReplayError::Invalid));
        assert_eq!(w.check(1), Ok(1));
    }

    /// The property `SecurityAssociation::inference_settled` rests on: for
    /// a fixed low half, the inferred sequence number never decreases as
    /// the top moves up, so two tops that agree bound everything between.
    #[test]
    fn esn_inference_is_monotonic_in_the_top() {
        for size in [1u32, 64, 1024] {
            let w = ReplayWindow::new(size, true);
            let base = u64::from(u32::MAX) - 3000;
            for low in [0u32, 1, 5, 100, u32::MAX - 2000, u32::MAX - 10, u32::MAX] {
                let mut last = None;
                for top in (base..base + 6000).step_by(7) {
                    let seq = w.infer_at(low, top).ok();
                    if let (Some(prev), Some(now)) = (last, seq) {
                        assert!(
                            now >= prev,
                            "size {size} low {low:#x} top {top:#x}: {now:#x} < {prev:#x}"
                        );
                    }
                    if seq.is_some() {
                        last = seq;
                    }
                }
            }
        }
    }

    #[test]
    fn window_disabled_accepts_repeats_but_infers_esn() {
        let mut w = ReplayWindow::new(0, false);
        assert_eq!(accept(&mut w, 5), Ok(5));
        assert_eq!(accept(&mut w, 5), Ok(5));
        let mut e = ReplayWindow::with_top(0, true, u64::from(u32::MAX));
        assert_eq!(accept(&mut e, 3), Ok((1 << 32) | 3));
    }

    /// Exhaustive against a naive model: every order of a small sequence
    /// space, each number accepted exactly once and never when too old.
    #[test]
    fn agrees_with_a_naive_model_on_random_streams() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for size in [1u32, 32, 64, 100, 128, 4096] {
            let mut w = ReplayWindow::new(size, false);
            let mut seen = std::collections::HashSet::new();
            let mut top = 0u64;
            for _ in 0..20_000 {
                let seq = (next() % 3000 + 1) as u32;
                let s = u64::from(seq);
                let expected = if s > top {
                    Ok(s)
                } else if top - s >= u64::from(size) {
                    Err(ReplayError::TooOld(s))
                } else if seen.contains(&s) {
                    Err(ReplayError::Duplicate(s))
                } else {
                    Ok(s)
                };
                let got = accept(&mut w, seq);
                assert_eq!(got, expected, "size {size} seq {seq} top {top}");
                if got.is_ok() {
                    seen.insert(s);
                    top = top.max(s);
                }
            }
        }
    }

    /// After a restart the window counts every number up to where it
    /// resumed as received, whatever the window's size and where the top
    /// falls in its word; numbers above it arrive in any order.
    #[test]
    fn a_resumed_window_refuses_everything_up_to_its_top() {
        for size in [1u32, 32, 64, 100, 1024] {
            for top in [1u64, 62, 63, 64, 65, 127, 1000, (1 << 32) + 5] {
                let esn = top > u64::from(u32::MAX);
                let mut w = ReplayWindow::resumed(size, esn, top);
                for back in 0..u64::from(size).min(top) {
                    let seq = top - back;
                    assert!(
                        w.check_full(seq).is_err(),
                        "size {size} top {top}: {seq} taken again"
                    );
                }
                // Ahead of the top, out of order, each once, as a fresh
                // window would take them.
                let mut highest = top;
                for seq in [top + 3, top + 1, top + 2, top + 70, top + 69] {
                    let fits = seq > highest || highest - seq < u64::from(size);
                    assert_eq!(w.check_full(seq).is_ok(), fits, "size {size} top {top}: {seq}");
                    if fits {
                        w.update(seq);
                        highest = highest.max(seq);
                        assert_eq!(w.check_full(seq), Err(ReplayError::Duplicate(seq)));
                    }
                }
            }
        }
        // A window that starts from nothing is a new one.
        let w = ReplayWindow::resumed(64, false, 0);
        assert_eq!(w.check_full(1), Ok(()));
    }
}
