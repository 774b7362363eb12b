//! What one limit says about one request, and the state change behind it.

/// What one limit says about one request. Built only through the
/// constructors below, so a refusal always carries the wait and an
/// admission never does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The request may go (a leaky bucket's after `delay_us`); its cost is
    /// charged once the state change is applied.
    Admitted {
        /// The quota: a bucket's capacity, a window's limit, in units.
        limit: u64,
        /// Units left after this request.
        remaining: u64,
        /// µs until the quota is whole again.
        reset_after_us: u64,
        /// Leaky bucket only: how long the request waits for its slot.
        delay_us: u64,
        /// Where the admitted units are counted, for a refund to find them
        /// (`Algorithm::refund`): a window's start, a quota period's end, a
        /// sliding log's stamp; 0 for the buckets, whose units need no
        /// place.
        counted_at_us: u64,
    },
    /// The request must wait: its cost is more than the units left now.
    /// Nothing is charged.
    Refused {
        /// The quota: a bucket's capacity, a window's limit, in units.
        limit: u64,
        /// Units left before this request.
        remaining: u64,
        /// µs until the quota is whole again.
        reset_after_us: u64,
        /// µs until the same request would be admitted.
        retry_after_us: u64,
    },
    /// The request can never be admitted: its cost exceeds the limit itself.
    NeverPassable {
        /// The quota the cost exceeds, in units.
        limit: u64,
        /// Units left now.
        remaining: u64,
        /// µs until the quota is whole again.
        reset_after_us: u64,
    },
}

impl Decision {
    /// Admitted at once, its units counted nowhere a refund looks (set
    /// that with `counted_at`).
    pub fn admitted(limit: u64, remaining: u64, reset_after_us: u64) -> Decision {
        Decision::Admitted {
            limit,
            remaining,
            reset_after_us,
            delay_us: 0,
            counted_at_us: 0,
        }
    }

    /// Admitted, to be sent after `delay_us` (a leaky bucket's slot).
    pub fn admitted_after(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        delay_us: u64,
    ) -> Decision {
        Decision::Admitted {
            limit,
            remaining,
            reset_after_us,
            delay_us,
            counted_at_us: 0,
        }
    }

    /// Refused: the same request is admitted after `retry_after_us`.
    pub fn refused(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        retry_after_us: u64,
    ) -> Decision {
        Decision::Refused {
            limit,
            remaining,
            reset_after_us,
            retry_after_us,
        }
    }

    /// Refused for good: the request costs more than `limit`, so no wait
    /// would help.
    pub fn never_passable(limit: u64, remaining: u64, reset_after_us: u64) -> Decision {
        Decision::NeverPassable {
            limit,
            remaining,
            reset_after_us,
        }
    }

    /// Whether the request is admitted (perhaps with a delay).
    pub fn allowed(&self) -> bool {
        matches!(self, Decision::Admitted { .. })
    }

    /// The request can never be admitted by this limit, however long it waits.
    pub fn cost_exceeds_limit(&self) -> bool {
        matches!(self, Decision::NeverPassable { .. })
    }

    /// The quota the request was decided against: a bucket's capacity, a
    /// window's limit, in units (`RateLimit-Limit`).
    pub fn limit(&self) -> u64 {
        match *self {
            Decision::Admitted { limit, .. }
            | Decision::Refused { limit, .. }
            | Decision::NeverPassable { limit, .. } => limit,
        }
    }

    /// Units left: after this request when admitted, before it when not.
    pub fn remaining(&self) -> u64 {
        match *self {
            Decision::Admitted { remaining, .. }
            | Decision::Refused { remaining, .. }
            | Decision::NeverPassable { remaining, .. } => remaining,
        }
    }

    /// µs until the quota is whole again.
    pub fn reset_after_us(&self) -> u64 {
        match *self {
            Decision::Admitted { reset_after_us, .. }
            | Decision::Refused { reset_after_us, .. }
            | Decision::NeverPassable { reset_after_us, .. } => reset_after_us,
        }
    }

    /// µs until the same request would be admitted: 0 when admitted or when
    /// waiting would not help.
    pub fn retry_after_us(&self) -> u64 {
        match *self {
            Decision::Refused { retry_after_us, .. } => retry_after_us,
            _ => 0,
        }
    }

    /// How long an admitted request waits before it is sent, in µs (a
    /// leaky bucket's; 0 for every other algorithm and for a refusal).
    pub fn delay_us(&self) -> u64 {
        match *self {
            Decision::Admitted { delay_us, .. } => delay_us,
            _ => 0,
        }
    }

    /// Where an admitted request's units are counted (0 when refused).
    pub fn counted_at_us(&self) -> u64 {
        match *self {
            Decision::Admitted { counted_at_us, .. } => counted_at_us,
            _ => 0,
        }
    }

    /// This decision with its units counted at `at_us` (a store's reply).
    pub fn counted_at(mut self, at_us: u64) -> Decision {
        if let Decision::Admitted { counted_at_us, .. } = &mut self {
            *counted_at_us = at_us;
        }
        self
    }
}

/// A decision plus the state change it implies and when the state goes stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation {
    /// What the limit says about the request.
    pub decision: Decision,
    /// The change to write to the state when every layer admits the
    /// request (`State::apply`); `Unchanged` for a refusal.
    pub update: Update,
    /// From this instant on, the (updated) state is indistinguishable from a
    /// fresh one and may be dropped.
    pub idle_at_us: u64,
}

impl Evaluation {
    /// The admitted units are counted at `at_us` (see `counted_at_us`).
    pub(super) fn counted_at(mut self, at_us: u64) -> Self {
        self.decision = self.decision.counted_at(at_us);
        self
    }

    pub(super) fn refused(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        retry_after_us: u64,
        idle_at_us: u64,
    ) -> Self {
        Evaluation {
            decision: Decision::refused(limit, remaining, reset_after_us, retry_after_us),
            update: Update::Unchanged,
            idle_at_us,
        }
    }

    pub(super) fn oversized(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        idle_at_us: u64,
    ) -> Self {
        Evaluation {
            decision: Decision::never_passable(limit, remaining, reset_after_us),
            update: Update::Unchanged,
            idle_at_us,
        }
    }

    pub(super) fn admitted(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        update: Update,
        idle_at_us: u64,
    ) -> Self {
        Evaluation {
            decision: Decision::admitted(limit, remaining, reset_after_us),
            update,
            idle_at_us,
        }
    }

    /// Admitted now, sent after `delay_us`.
    pub(super) fn scheduled(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        delay_us: u64,
        update: Update,
        idle_at_us: u64,
    ) -> Self {
        Evaluation {
            decision: Decision::admitted_after(limit, remaining, reset_after_us, delay_us),
            update,
            idle_at_us,
        }
    }
}

/// Outstanding leased units, in two epochs: the running one (ending at
/// `end_us`) and the one before it. A missing ledger (state from before it)
/// is `Ledger::default()`: nothing outstanding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Where the running epoch ends; 0 for none. It is also where a lease
    /// taken in it is counted (`Decision::counted_at_us`), for its return.
    pub end_us: u64,
    /// An epoch's length: at least the life of every lease it counts.
    pub epoch_us: u64,
    /// Units leased in the running epoch and not yet returned.
    pub current: u64,
    /// Units leased in the epoch before and not yet returned; they lapse
    /// at the running epoch's end.
    pub previous: u64,
}

/// The change an admitted request makes to its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// Nothing to write: a refusal, a peek or a cost of 0.
    Unchanged,
    /// A bucket's new theoretical arrival time (see `State::Gcra`).
    Gcra {
        /// The new tat, in µs since the epoch.
        tat_us: u64,
        /// Picoseconds past `tat_us` (see `State::Gcra`).
        tat_ps: u64,
        /// A token bucket's leases outstanding (see `crate::ledger`).
        ledger: Ledger,
    },
    /// A fixed window's count, replaced whole.
    Window {
        /// The running window's start, µs since the epoch.
        start_us: u64,
        /// Units counted in it, this request's included.
        count: u64,
    },
    /// A sliding window's two counts, replaced whole.
    TwoWindows {
        /// The current window's start, µs since the epoch.
        start_us: u64,
        /// Units counted in the current window.
        current: u64,
        /// Units counted in the window before it.
        previous: u64,
    },
    /// A calendar quota's count, replaced whole.
    Period {
        /// Where the running period ends, µs since the epoch.
        end_us: u64,
        /// Units counted in it, this request's included.
        count: u64,
    },
    /// A stamp added to a sliding log (stamps older than the window are
    /// dropped as it is written).
    LogAppend {
        /// The stamp, µs since the epoch.
        now_us: u64,
        /// Units admitted at it.
        cost: u64,
        /// The log's window in µs, which says what has left it.
        window_us: u64,
    },
    /// Units taken off a sliding log's stamp (a refund).
    LogRemove {
        /// The stamp they were admitted at (`Decision::counted_at_us`).
        stamp_us: u64,
        /// Units to take off it.
        units: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of decision reads back the numbers it was made with, and
    /// zero for those it has none of.
    #[test]
    fn each_decision_reads_back_its_numbers() {
        let decisions = [
            Decision::admitted(10, 4, 300).counted_at(60),
            Decision::admitted_after(10, 4, 300, 20),
            Decision::refused(10, 4, 300, 50).counted_at(60),
            Decision::never_passable(10, 4, 300).counted_at(60),
        ];
        // allowed, cost_exceeds_limit, retry, delay, counted at
        let expected = [
            (true, false, 0, 0, 60),
            (true, false, 0, 20, 0),
            (false, false, 50, 0, 0),
            (false, true, 0, 0, 0),
        ];
        for (d, (allowed, oversized, retry, delay, counted)) in decisions.iter().zip(expected) {
            assert_eq!((d.limit(), d.remaining(), d.reset_after_us()), (10, 4, 300));
            assert_eq!(
                (d.allowed(), d.cost_exceeds_limit(), d.retry_after_us()),
                (allowed, oversized, retry),
                "{d:?}"
            );
            assert_eq!((d.delay_us(), d.counted_at_us()), (delay, counted), "{d:?}");
        }
    }
}
