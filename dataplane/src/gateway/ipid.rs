//! Outer IPv4 identifications (RFC 791, RFC 6864): unique per source,
//! destination and protocol for as long as a datagram may be in flight.
//! With several workers sending for the same tunnel, each takes its IDs
//! from its own residue class, so two workers' fragments never share an ID
//! (the peer's reassembly would drop them as overlapping).

/// The IDs one worker gives out: `first`, `first + step`, … up to 65535,
/// then `first` again. Worker `k` of `n` has `first = k + 1` and
/// `step = n`: the classes are disjoint, and one worker alone counts
/// 1, 2, … 65535 as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpIds {
    next: u16,
    first: u16,
    step: u16,
}

impl IpIds {
    /// Worker `worker` of `workers` (at most 64, as `espgw run` allows).
    pub(crate) fn new(worker: usize, workers: usize) -> IpIds {
        let step = workers.clamp(1, 1 << 15) as u16;
        let first = (worker % usize::from(step)) as u16 + 1;
        IpIds {
            next: first,
            first,
            step,
        }
    }

    pub(crate) fn take(&mut self) -> u16 {
        let id = self.next;
        self.next = id.checked_add(self.step).unwrap_or(self.first);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn one_worker_counts_from_one() {
        let mut ids = IpIds::new(0, 1);
        assert_eq!((ids.take(), ids.take(), ids.take()), (1, 2, 3));
        for _ in 3..65535 {
            ids.take();
        }
        // 65535 given out: back to 1, never 0.
        assert_eq!(ids.take(), 1);
    }

    #[test]
    fn workers_never_share_an_id_even_across_the_wrap() {
        for workers in [2usize, 3, 7, 64] {
            let mut seen: Vec<HashSet<u16>> = Vec::new();
            for worker in 0..workers {
                let mut ids = IpIds::new(worker, workers);
                // Three times round the 16-bit space.
                let taken: HashSet<u16> = (0..3 * 65536 / workers).map(|_| ids.take()).collect();
                assert!(taken
                    .iter()
                    .all(|id| usize::from(*id) % workers == (worker + 1) % workers));
                assert!(!taken.contains(&0));
                seen.push(taken);
            }
            for (a, ids_a) in seen.iter().enumerate() {
                for ids_b in &seen[a + 1..] {
                    assert!(ids_a.is_disjoint(ids_b), "{workers} workers");
                }
            }
            // Together they use every ID but 0.
            let all: usize = seen.iter().map(HashSet::len).sum();
            assert_eq!(all, 65535, "{workers} workers");
        }
    }
}
