//! How many instances share one budget. The fallback gives each instance its
//! share of a limit and leases are sized by it, so a count that is wrong
//! makes the local share wrong by the same factor: either the number the
//! operator keeps true, or the live count the instances announce in Redis
//! (`redis::roster`), which moves as instances start and stop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A handle on the count: cheap to clone, read on every fallback decision.
#[derive(Clone, Debug)]
pub struct Instances {
    count: Arc<AtomicU64>,
    counted: bool,
}

impl Instances {
    /// `[redis].instances = n`.
    pub fn fixed(n: u64) -> Self {
        Instances {
            count: Arc::new(AtomicU64::new(n.max(1))),
            counted: false,
        }
    }

    /// `[redis].instances = "auto"`: alone until the first count is read.
    pub fn counted() -> Self {
        Instances {
            count: Arc::new(AtomicU64::new(1)),
            counted: true,
        }
    }

    /// The instances sharing the budget now (at least 1).
    pub fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// True when the count is read from Redis rather than configured.
    pub fn is_counted(&self) -> bool {
        self.counted
    }

    /// The count read from Redis (never below 1: this instance is one);
    /// returns the count it replaces.
    pub fn set(&self, live: u64) -> u64 {
        self.count.swap(live.max(1), Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_is_shared_by_its_clones_and_never_below_one() {
        let instances = Instances::counted();
        let seen_by_fallback = instances.clone();
        assert_eq!(seen_by_fallback.get(), 1);
        assert_eq!(instances.set(3), 1);
        assert_eq!(seen_by_fallback.get(), 3);
        instances.set(0);
        assert_eq!(seen_by_fallback.get(), 1);
        assert!(!Instances::fixed(0).is_counted());
        assert_eq!(Instances::fixed(0).get(), 1);
    }
}
