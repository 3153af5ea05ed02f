//! Randomness for jitter (backoff, lock waits, retry pauses), as a port like the clock: drawn from
//! the thread's generator, which a deterministic simulation seeds ([`seed_thread`]) so that the
//! same seed replays the same delays. Unseeded threads draw from `rand`'s thread generator.
//!
//! Only timing draws go through here. Identifiers (nonces, receipts, lock tokens) stay random:
//! they are compared for equality only, so they cannot change a history's course.

use rand::{RngExt, SeedableRng};
use std::cell::RefCell;
use std::ops::RangeInclusive;

thread_local! {
    static SEEDED: RefCell<Option<rand::rngs::StdRng>> = const { RefCell::new(None) };
}

/// From now on this thread draws its jitter from a generator seeded with `seed`; `None` goes back
/// to the unseeded thread generator.
pub fn seed_thread(seed: Option<u64>) {
    SEEDED.with(|s| *s.borrow_mut() = seed.map(rand::rngs::StdRng::seed_from_u64));
}

/// A uniform draw from `range` (inclusive).
pub fn range(range: RangeInclusive<u64>) -> u64 {
    if range.start() >= range.end() {
        return *range.start();
    }
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => rng.random_range(range.clone()),
        None => rand::random_range(range.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_thread_replays_its_draws_and_ranges_hold() {
        seed_thread(Some(7));
        let a: Vec<u64> = (0..20).map(|_| range(1..=1000)).collect();
        seed_thread(Some(7));
        let b: Vec<u64> = (0..20).map(|_| range(1..=1000)).collect();
        seed_thread(None);
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (1..=1000).contains(v)));
        assert_eq!(range(5..=5), 5);
        assert!((0..=3).contains(&range(0..=3)));
    }
}
