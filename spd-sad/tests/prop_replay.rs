//! Property test: the anti-replay window (RFC 4303 §3.4.3, Appendix A;
//! RFC 6479 ring) against a naive model that keeps every accepted sequence
//! number in a set.
//!
//! The model infers the high 32 bits of an ESN differently from the code:
//! Appendix A2.2 amounts to "the sequence number is the one value with these
//! low 32 bits in the 2^32 numbers starting at the window's left edge
//! T - W + 1", which the model computes directly (with 128-bit arithmetic,
//! so a left edge below zero or a value past 2^64 simply shows up as out of
//! range, i.e. `Invalid`).
//!
//! `PROPTEST_CASES` raises the number of cases (default 256).

use std::collections::BTreeSet;

use proptest::prelude::*;
use spd_sad::{ReplayError, ReplayWindow};

const TWO_32: u64 = 1 << 32;

#[derive(Debug, Clone)]
struct Model {
    size: u32,
    esn: bool,
    top: u64,
    accepted: BTreeSet<u64>,
}

impl Model {
    /// RFC 4303 Appendix A2.2: the full sequence number for `low`, or
    /// `None` when it would lie before 0 or past 2^64 - 1.
    fn infer(&self, low: u32) -> Option<u64> {
        if !self.esn {
            return Some(u64::from(low));
        }
        // A window of 0 disables replay checks, but the inference still
        // needs a window to reach back with: the code uses one packet.
        let w = i128::from(self.size.max(1));
        let left_edge = i128::from(self.top) - w + 1;
        let offset = (i128::from(low) - left_edge).rem_euclid(1 << 32);
        let seq = left_edge + offset;
        u64::try_from(seq).ok()
    }

    fn verdict(&self, seq: u64) -> Result<(), ReplayError> {
        if seq == 0 {
            return Err(ReplayError::Invalid);
        }
        if self.size == 0 || seq > self.top {
            return Ok(());
        }
        if self.top - seq >= u64::from(self.size) {
            return Err(ReplayError::TooOld(seq));
        }
        if self.accepted.contains(&seq) {
            return Err(ReplayError::Duplicate(seq));
        }
        Ok(())
    }

    fn check(&self, low: u32) -> Result<u64, ReplayError> {
        let seq = self.infer(low).ok_or(ReplayError::Invalid)?;
        self.verdict(seq).map(|()| seq)
    }

    fn accept(&mut self, seq: u64) {
        if self.size > 0 {
            // Every number is accepted at most once.
            assert!(self.accepted.insert(seq), "{seq} accepted twice");
        }
        self.top = self.top.max(seq);
    }

    /// Received numbers inside the window, newest first.
    fn in_window(&self) -> Vec<u64> {
        if self.size == 0 {
            return Vec::new();
        }
        let lowest = self.top.saturating_sub(u64::from(self.size) - 1).max(1);
        self.accepted.range(lowest..=self.top).rev().copied().collect()
    }
}

/// One arrival. `authentic: false` is a forged packet: checked, its ICV
/// fails, and the window must not move.
#[derive(Debug, Clone)]
enum Op {
    /// Low 32 bits of the current top plus `delta` (wrapping).
    Near { delta: i64, authentic: bool },
    /// Low bits of an earlier arrival again (duplicates, late copies).
    Again {
        index: prop::sample::Index,
        authentic: bool,
    },
    /// Any low 32 bits.
    Any { low: u32, authentic: bool },
    /// `check_full` on a full 64-bit number near the top, state unchanged.
    Full { delta: i64 },
}

fn window_size() -> impl Strategy<Value = u32> {
    prop_oneof![
        1 => Just(0u32),
        3 => (0u32..=16).prop_map(|k| 1 << k),
        3 => 1u32..=200,
        2 => (1u32..=1024).prop_flat_map(|w| prop_oneof![Just(w * 64 - 1), Just(w * 64 + 1)]),
        3 => 1u32..=65_536,
    ]
}

fn start_top(esn: bool) -> BoxedStrategy<u64> {
    let max = if esn { u64::MAX } else { u64::from(u32::MAX) };
    let near =
        move |centre: u64| (-70_000i64..=70_000).prop_map(move |d| centre.saturating_add_signed(d).min(max));
    let mut choices = vec![
        Just(0u64).boxed(),
        (0u64..1000).boxed(),
        near(u64::from(u32::MAX)).boxed(),
        (0..=max).boxed(),
    ];
    if esn {
        choices.push(near(TWO_32).boxed());
        choices.push(near(5 * TWO_32).boxed());
        // The last subspace: high bits u32::MAX, where inference must not
        // wrap past 2^64.
        choices.push(near(u64::MAX).boxed());
    }
    proptest::strategy::Union::new(choices).boxed()
}

fn delta() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => -300i64..=300,
        4 => -140_000i64..=140_000,
        1 => (1i64 << 31) - 2..=(1i64 << 31) + 2,
        1 => -(1i64 << 31) - 2..=-(1i64 << 31) + 2,
        1 => any::<i64>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let authentic = prop::bool::weighted(0.85);
    prop_oneof![
        6 => (delta(), authentic).prop_map(|(delta, authentic)| Op::Near { delta, authentic }),
        3 => (any::<prop::sample::Index>(), authentic)
            .prop_map(|(index, authentic)| Op::Again { index, authentic }),
        1 => (any::<u32>(), authentic).prop_map(|(low, authentic)| Op::Any { low, authentic }),
        1 => delta().prop_map(|delta| Op::Full { delta }),
    ]
}

fn scenario() -> impl Strategy<Value = (u32, bool, u64, Vec<Op>)> {
    (window_size(), any::<bool>()).prop_flat_map(|(size, esn)| {
        (
            Just(size),
            Just(esn),
            start_top(esn),
            prop::collection::vec(op(), 1..200),
        )
    })
}

fn run(size: u32, esn: bool, top: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut window = if top == 0 {
        ReplayWindow::new(size, esn)
    } else {
        ReplayWindow::with_top(size, esn, top)
    };
    let mut model = Model {
        size,
        esn,
        top,
        accepted: BTreeSet::new(),
    };
    let mut sent: Vec<u32> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let (low, authentic) = match *op {
            Op::Near { delta, authentic } => ((model.top as u32).wrapping_add(delta as u32), authentic),
            Op::Again { index, authentic } if !sent.is_empty() => (sent[index.index(sent.len())], authentic),
            Op::Again { .. } => continue,
            Op::Any { low, authentic } => (low, authentic),
            Op::Full { delta } => {
                let seq = model.top.wrapping_add_signed(delta);
                prop_assert_eq!(
                    window.check_full(seq),
                    model.verdict(seq),
                    "step {}: check_full({}) with top {}",
                    step,
                    seq,
                    model.top
                );
                continue;
            }
        };
        sent.push(low);
        let expected = model.check(low);
        let got = window.check(low);
        prop_assert_eq!(
            got,
            expected,
            "step {}: check({}) with top {} ({:?})",
            step,
            low,
            model.top,
            op
        );
        if let (Ok(seq), true) = (got, authentic) {
            window.update(seq);
            model.accept(seq);
        }
        prop_assert_eq!(window.top(), model.top, "step {}", step);
    }
    let received: Vec<u64> = window.received_in_window().collect();
    prop_assert_eq!(received, model.in_window());
    Ok(())
}

proptest! {
    #[test]
    fn replay_window_agrees_with_a_naive_model((size, esn, top, ops) in scenario()) {
        run(size, esn, top, &ops)?;
    }
}

/// Every number in a shuffled stretch around the start is accepted exactly
/// once, whatever the order, as long as it stays inside the window.
#[test]
fn a_permutation_inside_the_window_is_accepted_once_each() {
    proptest!(|(size in 1u32..=300, esn: bool, base in prop_oneof![Just(0u64), Just(TWO_32 - 150), Just(u64::from(u32::MAX))], order: u64)| {
        let base = if esn { base } else { base.min(u64::from(u32::MAX) - u64::from(size)) };
        let mut window = ReplayWindow::with_top(size, esn, base);
        // The newest first, then the rest in a shuffled order.
        let top = base + u64::from(size);
        let mut rest: Vec<u64> = (base + 1..top).collect();
        let mut state = order | 1;
        for i in (1..rest.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            rest.swap(i, (state % (i as u64 + 1)) as usize);
        }
        for seq in std::iter::once(top).chain(rest.iter().copied()) {
            let got = window.check(seq as u32);
            prop_assert_eq!(got, Ok(seq));
            window.update(seq);
        }
        for seq in base + 1..=top {
            prop_assert_eq!(window.check(seq as u32), Err(ReplayError::Duplicate(seq)));
        }
    });
}
