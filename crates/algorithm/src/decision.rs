//! What one limit says about one request, and the state change behind it.

/// What one limit says about one request. Built only through the
/// constructors below, so a refusal always carries the wait and an
/// admission never does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admitted {
        limit: u64,
        /// Units left after this request.
        remaining: u64,
        /// Until the quota is whole again.
        reset_after_us: u64,
        /// Leaky bucket only: how long the request waits for its slot.
        delay_us: u64,
        /// Where the admitted units are counted, for a refund to find them
        /// (`Algorithm::refund`): a window's start, a quota period's end, a
        /// sliding log's stamp; 0 for the buckets, whose units need no
        /// place.
        counted_at_us: u64,
    },
    Refused {
        limit: u64,
        /// Units left before this request.
        remaining: u64,
        reset_after_us: u64,
        /// Until the same request would be admitted.
        retry_after_us: u64,
    },
    /// The request can never be admitted: its cost exceeds the limit itself.
    NeverPassable {
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
    },
}

impl Decision {
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

    pub fn never_passable(limit: u64, remaining: u64, reset_after_us: u64) -> Decision {
        Decision::NeverPassable {
            limit,
            remaining,
            reset_after_us,
        }
    }

    pub fn allowed(&self) -> bool {
        matches!(self, Decision::Admitted { .. })
    }

    /// The request can never be admitted by this limit, however long it waits.
    pub fn cost_exceeds_limit(&self) -> bool {
        matches!(self, Decision::NeverPassable { .. })
    }

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

    /// Until the quota is whole again.
    pub fn reset_after_us(&self) -> u64 {
        match *self {
            Decision::Admitted { reset_after_us, .. }
            | Decision::Refused { reset_after_us, .. }
            | Decision::NeverPassable { reset_after_us, .. } => reset_after_us,
        }
    }

    /// Until the same request would be admitted: 0 when admitted or when
    /// waiting would not help.
    pub fn retry_after_us(&self) -> u64 {
        match *self {
            Decision::Refused { retry_after_us, .. } => retry_after_us,
            _ => 0,
        }
    }

    /// How long an admitted request waits before it is sent.
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
    pub decision: Decision,
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
    pub current: u64,
    pub previous: u64,
}

/// The change an admitted request makes to its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    Unchanged,
    Gcra {
        tat_us: u64,
        /// Picoseconds past `tat_us` (see `State::Gcra`).
        tat_ps: u64,
        /// A token bucket's leases outstanding (see `crate::ledger`).
        ledger: Ledger,
    },
    Window {
        start_us: u64,
        count: u64,
    },
    TwoWindows {
        start_us: u64,
        current: u64,
        previous: u64,
    },
    Period {
        end_us: u64,
        count: u64,
    },
    LogAppend {
        now_us: u64,
        cost: u64,
        window_us: u64,
    },
    /// Units taken off a sliding log's stamp (a refund).
    LogRemove {
        stamp_us: u64,
        units: u64,
    },
}
