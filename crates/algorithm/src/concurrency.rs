//! Concurrency: at most `max` requests in flight per key. Each admitted
//! request holds a slot under a lease that ends when the request releases it
//! or, failing that, when the lease expires unless renewed, so slots held by
//! a process that died come back after one lease.
//!
//! The Redis twin is crates/limiter/lua/slots.lua: a sorted set of lease ids scored by
//! their expiry. A lease expires at its expiry instant (`expires_us <= now`).

use super::decision::Decision;

/// The leases of one key: (lease id, expiry), in no particular order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slots {
    leases: Vec<(u64, u64)>,
}

impl Slots {
    fn prune(&mut self, now_us: u64) {
        self.leases.retain(|&(_, expires_us)| expires_us > now_us);
    }

    /// Until the earliest live lease ends, from `now_us` (0 with none).
    fn until_one_frees(&self, now_us: u64) -> u64 {
        self.leases
            .iter()
            .map(|&(_, expires_us)| expires_us - now_us)
            .min()
            .unwrap_or(0)
    }

    /// Takes a slot for lease `id` until `now_us + lease_us`, when fewer
    /// than `max` are held. Refused, the retry time is when the earliest
    /// lease would expire: a slot frees then at the latest, unless renewed.
    /// A lease id already holding a slot keeps that one slot, renewed: an
    /// acquisition retried after a lost reply never takes two.
    pub fn acquire(&mut self, id: u64, max: u64, lease_us: u64, now_us: u64) -> Decision {
        self.prune(now_us);
        let held = self.leases.len() as u64;
        if let Some((_, expires_us)) = self.leases.iter_mut().find(|(lease, _)| *lease == id) {
            *expires_us = now_us + lease_us;
            return Decision::admitted(max, max.saturating_sub(held), self.until_one_frees(now_us));
        }
        if held >= max {
            let wait_us = self.until_one_frees(now_us);
            return Decision::refused(max, 0, wait_us, wait_us);
        }
        self.leases.push((id, now_us + lease_us));
        Decision::admitted(max, max - held - 1, self.until_one_frees(now_us))
    }

    /// Extends lease `id` to `now_us + lease_us`; false when it has already
    /// expired or was never taken (its slot may be someone else's now).
    pub fn renew(&mut self, id: u64, lease_us: u64, now_us: u64) -> bool {
        self.prune(now_us);
        match self.leases.iter_mut().find(|(lease, _)| *lease == id) {
            Some((_, expires_us)) => {
                *expires_us = now_us + lease_us;
                true
            }
            None => false,
        }
    }

    /// Gives lease `id`'s slot back; true when it was held.
    pub fn release(&mut self, id: u64, now_us: u64) -> bool {
        self.prune(now_us);
        let before = self.leases.len();
        self.leases.retain(|&(lease, _)| lease != id);
        self.leases.len() < before
    }

    /// Slots held at `now_us`.
    pub fn held(&self, now_us: u64) -> u64 {
        self.leases.iter().filter(|&&(_, e)| e > now_us).count() as u64
    }

    /// Whether no lease is kept, live or expired (not yet pruned): the key's
    /// state may then be dropped.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000;
    const T0: u64 = 1_800_000_000 * SEC;

    #[test]
    fn at_most_max_held_and_a_release_frees_one() {
        let mut slots = Slots::default();
        for (id, remaining) in [(1, 2), (2, 1), (3, 0)] {
            let d = slots.acquire(id, 3, 60 * SEC, T0);
            assert!(d.allowed());
            assert_eq!(d.remaining(), remaining);
        }
        let refused = slots.acquire(4, 3, 60 * SEC, T0 + SEC);
        assert!(!refused.allowed());
        assert_eq!(
            refused.retry_after_us(),
            59 * SEC,
            "the earliest lease's end"
        );
        assert!(slots.release(2, T0 + SEC));
        assert_eq!(slots.held(T0 + SEC), 2, "the other two kept");
        assert!(!slots.release(2, T0 + SEC), "released once");
        assert!(slots.acquire(4, 3, 60 * SEC, T0 + SEC).allowed());
    }

    #[test]
    fn a_lease_not_renewed_comes_back_at_its_expiry_and_not_before() {
        let mut slots = Slots::default();
        assert!(slots.is_empty());
        assert!(slots.acquire(1, 1, 10 * SEC, T0).allowed());
        assert!(!slots.acquire(2, 1, 10 * SEC, T0 + 10 * SEC - 1).allowed());
        assert!(slots.acquire(2, 1, 10 * SEC, T0 + 10 * SEC).allowed());
        assert!(!slots.is_empty());
        assert!(!slots.renew(1, 10 * SEC, T0 + 10 * SEC), "lease 1 is gone");
    }

    #[test]
    fn acquiring_again_with_the_same_lease_keeps_one_slot() {
        let mut slots = Slots::default();
        assert_eq!(slots.acquire(7, 2, 10 * SEC, T0).remaining(), 1);
        let again = slots.acquire(7, 2, 10 * SEC, T0 + SEC);
        assert!(again.allowed());
        assert_eq!(again.remaining(), 1, "still one slot");
        assert!(slots.acquire(8, 2, 10 * SEC, T0 + SEC).allowed());
        assert!(slots.release(7, T0 + SEC));
        assert_eq!(slots.held(T0 + SEC), 1);
        // Renewed by the second acquisition: held past the first's expiry.
        let mut once = Slots::default();
        once.acquire(1, 1, 10 * SEC, T0);
        once.acquire(1, 1, 10 * SEC, T0 + 5 * SEC);
        assert_eq!(once.held(T0 + 12 * SEC), 1);
    }

    #[test]
    fn a_renewed_lease_keeps_its_slot() {
        let mut slots = Slots::default();
        assert!(slots.acquire(1, 1, 10 * SEC, T0).allowed());
        assert!(slots.renew(1, 10 * SEC, T0 + 9 * SEC));
        assert!(!slots.acquire(2, 1, 10 * SEC, T0 + 15 * SEC).allowed());
        assert_eq!(slots.held(T0 + 15 * SEC), 1);
        assert_eq!(slots.held(T0 + 19 * SEC), 0);
    }
}
