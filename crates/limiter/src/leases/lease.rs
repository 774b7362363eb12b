//! One lease: the units leased beside a layer, how long they may be used
//! by either clock, and what goes back of them when it ends.

use crate::check::Check;
use floodgate_algorithm::{Decision, Kind};

/// Units leased beside one layer of one request, as the store reported it.
pub(super) struct Lease {
    /// The layer it was taken for: its algorithm (a reload that changes
    /// the numbers ends the lease), name and key (for the return).
    pub(super) check: Check,
    /// Units not yet used, spent in any order while the lease runs: a
    /// token bucket's too, which the bucket's ledger (`algorithm::ledger`)
    /// keeps out of its refill until the lease's life is over, whatever
    /// the rate.
    pub(super) unused: u64,
    /// Units leased (with the top-ups since): half spent, it is topped up.
    pub(super) units: u64,
    /// Where its units are counted (a refund finds them there).
    pub(super) counted_at_us: u64,
    /// On this instance's clock: it is not used from then on.
    pub(super) ends_at_us: u64,
    /// How long a window's lives past its last use (never past the
    /// window); a bucket's lives this long from when it was asked for, and
    /// no longer, since its ledger counts its units no longer.
    pub(super) ttl_us: u64,
    /// What the shared state had left beside the lease: for the headers.
    pub(super) shared_remaining: u64,
    pub(super) limit: u64,
    /// Until the shared state is whole again, from `ends_at_us`'s clock.
    pub(super) reset_at_us: u64,
    /// When it was asked for, by the wall clock and by the monotonic one.
    pub(super) start_us: u64,
    pub(super) started_us: u64,
    /// The table's generation it was installed in (`Table::generation`):
    /// its units go back only while it lasts.
    pub(super) generation: u64,
    /// A top-up counted elsewhere (a bucket's in the next epoch of its
    /// ledger, a window's in the next window): its units cannot join
    /// these, which lapse sooner, so it waits here and takes over once
    /// these are spent or over. By then these are mostly spent, and no
    /// script call is made to give them back.
    pub(super) next: Option<Box<Lease>>,
}

impl Lease {
    /// The instant `now` (wall, monotonic) as this lease counts time: from
    /// when it was asked for, by whichever clock has gone further since.
    pub(super) fn local(&self, now: Now) -> u64 {
        let by_wall = now.wall_us.saturating_sub(self.start_us);
        let by_monotonic = now.monotonic_us.saturating_sub(self.started_us);
        self.start_us.saturating_add(by_wall.max(by_monotonic))
    }

    pub(super) fn over(&self, now: Now) -> bool {
        self.local(now) >= self.ends_at_us
    }

    /// Units that may be used at `now`.
    pub(super) fn usable(&self, now: Now) -> u64 {
        let now_us = self.local(now);
        if now_us >= self.ends_at_us {
            return 0;
        }
        self.unused
    }

    /// Takes `cost`, if the lease runs and holds it. A window's lease in
    /// use lives on, up to its window's end: only an idle lease goes back.
    /// A bucket's does not: its units are on the ledger for its life only.
    pub(super) fn take(&mut self, cost: u64, now: Now) -> bool {
        let now_us = self.local(now);
        if now_us >= self.ends_at_us || self.unused < cost {
            return false;
        }
        self.unused -= cost;
        if self.check.algorithm.kind() != Kind::TokenBucket {
            self.ends_at_us = self.reset_at_us.min(now_us.saturating_add(self.ttl_us));
        }
        true
    }

    /// Half of its units are spent: time to lease more. A bucket's too: a
    /// top-up in the same epoch of its ledger is counted where the lease
    /// is, so the units join it (`install`).
    pub(super) fn half_spent(&self) -> bool {
        self.next.is_none() && self.unused.saturating_mul(2) < self.units
    }

    /// The next lease in this one's place, if there is one: this one,
    /// to give back what it did not use.
    pub(super) fn promoted(&mut self) -> Option<Lease> {
        let next = *self.next.take()?;
        Some(std::mem::replace(self, next))
    }

    /// Units worth giving back at `now`: a token bucket's while its ledger
    /// may still count them (a return past that finds nothing), a window's
    /// while its window runs (a sliding window's also in the next, where
    /// they still weigh).
    pub(super) fn returnable(&self, now: Now) -> u64 {
        let now_us = self.local(now);
        let unused = self.unused;
        match self.check.algorithm.kind() {
            Kind::TokenBucket => unused,
            Kind::SlidingWindow => {
                let window = self.check.algorithm.period_us();
                if now_us < self.reset_at_us.saturating_add(window) {
                    unused
                } else {
                    0
                }
            }
            _ if now_us < self.reset_at_us => unused,
            _ => 0,
        }
    }

    /// The decision for a request of `cost` admitted from the lease.
    pub(super) fn decision(&self, now: Now) -> Decision {
        Decision::admitted(
            self.limit,
            self.shared_remaining + self.usable(now),
            self.reset_at_us.saturating_sub(self.local(now)),
        )
        .counted_at(self.counted_at_us)
    }
}

/// One instant, read off both clocks.
#[derive(Clone, Copy)]
pub(super) struct Now {
    pub(super) wall_us: u64,
    pub(super) monotonic_us: u64,
}

/// The return of a lease's unused units at `now`, if worth sending:
/// not a bucket's that the bucket refills within a lease's life anyway
/// (100 tokens at 1,000,000 a second: 100 µs): a call for them would cost
/// more than they are worth, and its ledger lets them go within two lives.
pub(super) fn returned(lease: Lease, now: Now) -> Option<Return> {
    let units = lease.returnable(now);
    let refilled_us = units.saturating_mul(lease.check.algorithm.period_us());
    if units == 0
        || (lease.check.algorithm.kind() == Kind::TokenBucket && refilled_us <= lease.ttl_us)
    {
        return None;
    }
    Some(Return {
        check: Check {
            cost: units,
            ..lease.check
        },
        counted_at_us: lease.counted_at_us,
        generation: lease.generation,
    })
}

/// A lease's units on their way back to the shared store.
pub(super) struct Return {
    pub(super) check: Check,
    pub(super) counted_at_us: u64,
    /// The lease's: sent only if no forgetting came since.
    pub(super) generation: u64,
}
