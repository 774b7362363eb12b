//! A token bucket's lease ledger: the units leased of a bucket and not yet
//! given back or lapsed ("outstanding"), kept beside its `tat`, so that the
//! bucket never refills past `capacity - outstanding`.
//!
//! Without it a leased token is a stretch of the bucket's schedule and
//! lapses when its time passes unused (at 1,000,000 a second, 100 tokens
//! last 100 µs). With it a leased unit is a plain count, valid for the
//! lease's whole life whatever the rate, and the bound still holds:
//!
//! Let `B` be the tokens the shared bucket holds (`capacity - debt`, the
//! debt being `max(tat - now, outstanding)` in tokens) and `U` the unspent
//! units of the live leases. Every live lease's unspent units are
//! outstanding, so `B + U <= capacity`. A charge or a lease takes from `B`
//! (a lease moves them to `U`), a spend takes from `U`, a return moves
//! units from `U` to `B`, and time adds to `B` at the rate at most: `B + U`
//! never grows faster than the bucket refills. So in any interval of
//! length `t`, the fleet admits at most `capacity + rate × t`, as one
//! bucket alone would.
//!
//! Lapse without a return (an instance that died, a lost reply): the
//! script cannot know each lease's end, so leases are counted in epochs of
//! `epoch_us` (at least a lease's life): a lease taken in epoch `k` ends
//! before epoch `k + 2` begins, when its units lapse. A lapse keeps the
//! debt where it is (`tat` is moved to `max(tat, now + outstanding)`) and
//! only then forgets the units, so spent units refill from there at the
//! rate, never all at once. That is the price of the ledger: a leased unit
//! spent refills up to two epochs later than in a bucket alone (with the
//! lease's life at most a tenth of the bucket's span, `capacity ×
//! interval`, at most a fifth of the capacity is held so), an
//! under-admission, never an over-admission.
//!
//! The twin of `token_bucket_ledger_*` in `crates/limiter/lua/token_bucket.lua`.

pub use super::decision::Ledger;
use super::decision::{Evaluation, Update};
use super::token_bucket::{self, Interval};

impl Ledger {
    /// Units leased and neither returned nor lapsed, both epochs together:
    /// what the bucket may not refill into.
    pub fn outstanding(&self) -> u64 {
        self.current + self.previous
    }

    /// The ledger at `now_us` and the tat that goes with it: each epoch
    /// whose leases have all ended lapses at its end, the debt kept as it
    /// stood then.
    pub fn settled(self, interval: Interval, tat: (u64, u64), now_us: u64) -> (Self, (u64, u64)) {
        let mut ledger = self;
        let mut tat = tat;
        // At most two lapses matter: after them nothing is outstanding.
        while ledger.end_us != 0 && now_us >= ledger.end_us && ledger.outstanding() > 0 {
            let at = ledger.end_us;
            tat = held(interval, tat, ledger.outstanding(), at);
            ledger.previous = ledger.current;
            ledger.current = 0;
            ledger.end_us = at + ledger.epoch_us;
        }
        if ledger.outstanding() == 0 {
            ledger = Ledger::default();
        }
        (ledger, tat)
    }

    /// The ledger with `units` leased at `now_us` (settled), in epochs of
    /// `epoch_us`; none if it counts in shorter epochs, where a lease this
    /// long could outlive its epoch's lapse (a reload changing lease_ttl:
    /// leases resume once the older ones have lapsed).
    fn leased(self, now_us: u64, units: u64, epoch_us: u64) -> Option<Self> {
        if self.end_us == 0 {
            return Some(Ledger {
                end_us: (now_us / epoch_us + 1) * epoch_us,
                epoch_us,
                current: units,
                previous: 0,
            });
        }
        if epoch_us > self.epoch_us {
            return None;
        }
        // A settled ledger counts something, so its running epoch holds now.
        Some(Ledger {
            current: self.current + units,
            ..self
        })
    }
}

/// The tat with at least `outstanding` tokens of debt at `at_us`: the
/// refill stops short of them.
fn held(interval: Interval, tat: (u64, u64), outstanding: u64, at_us: u64) -> (u64, u64) {
    let debt = interval.debt(tat, at_us);
    let floor = outstanding * interval.units;
    if debt >= floor {
        tat
    } else {
        interval.after(at_us, floor)
    }
}

/// A request of `cost` against a bucket with a ledger, as `evaluate`
/// decides it with the refill held short of what is outstanding; the
/// ledger to write beside the update (settled).
pub fn evaluate(
    capacity: u64,
    interval: Interval,
    tat: (u64, u64),
    ledger: Ledger,
    now_us: u64,
    cost: u64,
) -> (Evaluation, Ledger) {
    let (ledger, tat) = ledger.settled(interval, tat, now_us);
    (
        evaluate_settled(capacity, interval, tat, ledger, now_us, cost),
        ledger,
    )
}

/// `evaluate` of a settled ledger and its tat.
fn evaluate_settled(
    capacity: u64,
    interval: Interval,
    tat: (u64, u64),
    ledger: Ledger,
    now_us: u64,
    cost: u64,
) -> Evaluation {
    let tat = held(interval, tat, ledger.outstanding(), now_us);
    with_ledger(
        interval,
        token_bucket::evaluate(capacity, interval, tat, now_us, cost),
        ledger,
    )
}

/// `e` writing `ledger` beside its tat, and kept until the bucket is full
/// again: a state forgotten before would be a full bucket beside leases
/// still spent. Its last epoch lapses at `end_us + epoch_us`, keeping the
/// debt of what is outstanding then (at most what is now), refilled after.
fn with_ledger(interval: Interval, mut e: Evaluation, ledger: Ledger) -> Evaluation {
    if let Update::Gcra {
        ledger: written, ..
    } = &mut e.update
    {
        *written = ledger;
    }
    if ledger.outstanding() > 0 {
        let lapsed_us = ledger.end_us + ledger.epoch_us;
        let refilled_us = interval.us(ledger.outstanding() * interval.units);
        e.idle_at_us = e.idle_at_us.max(lapsed_us + refilled_us);
    }
    e
}

/// A request of `cost` that, admitted, leases beside it `units_for(what
/// it leaves)` units (`lease_units`), counted in epochs of `epoch_us`: the
/// evaluation (of cost plus lease), the ledger after, the units leased.
/// The lease is counted at the ledger's `end_us`.
pub fn evaluate_leasing(
    capacity: u64,
    interval: Interval,
    (tat, ledger): ((u64, u64), Ledger),
    now_us: u64,
    cost: u64,
    epoch_us: u64,
    units_for: impl FnOnce(u64) -> u64,
) -> (Evaluation, Ledger, u64) {
    let (settled, tat) = ledger.settled(interval, tat, now_us);
    let alone = evaluate_settled(capacity, interval, tat, settled, now_us, cost);
    if !alone.decision.allowed() || epoch_us == 0 {
        return (alone, settled, 0);
    }
    let units = units_for(alone.decision.remaining());
    let Some(after) = (units > 0)
        // The request's own units go on the ledger too: a refund of it
        // (counted where the lease is) then takes from the ledger what
        // was put there, never a lease's units.
        .then(|| settled.leased(now_us, cost + units, epoch_us))
        .flatten()
    else {
        return (alone, settled, 0);
    };
    let leasing = evaluate_settled(capacity, interval, tat, settled, now_us, cost + units);
    if !leasing.decision.allowed() {
        // Unreachable by the arithmetic (the units fit what is left).
        return (alone, settled, 0);
    }
    let mut leasing = with_ledger(interval, leasing, after);
    leasing.decision = leasing.decision.counted_at(after.end_us);
    (leasing, after, units)
}

/// `units` of a lease counted at `counted_at_us` given back at `now_us`:
/// off the ledger and back into the bucket, as many as its epoch still
/// holds; none once it has lapsed (its units refill at the rate then).
/// The new tat and ledger, or none for no change.
pub fn refunded(
    interval: Interval,
    tat: (u64, u64),
    ledger: Ledger,
    now_us: u64,
    units: u64,
    counted_at_us: u64,
) -> Option<((u64, u64), Ledger)> {
    let (mut ledger, tat) = ledger.settled(interval, tat, now_us);
    if ledger.end_us == 0 || counted_at_us == 0 {
        return None;
    }
    // The debt as the refill sees it loses exactly the units given back:
    // the held floor and the tat both move by them.
    let at = held(interval, tat, ledger.outstanding(), now_us);
    let slot = if counted_at_us == ledger.end_us {
        &mut ledger.current
    } else if counted_at_us + ledger.epoch_us == ledger.end_us {
        &mut ledger.previous
    } else {
        return None;
    };
    let back = units.min(*slot);
    if back == 0 {
        return None;
    }
    *slot -= back;
    let tat = token_bucket::credited(interval, at, now_us, back).unwrap_or(at);
    let (ledger, tat) = ledger.settled(interval, tat, now_us);
    Some((tat, ledger))
}

/// The tat an update writes, for the callers that keep it apart.
pub fn written_tat(update: &Update) -> Option<(u64, u64)> {
    match *update {
        Update::Gcra { tat_us, tat_ps, .. } => Some((tat_us, tat_ps)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
