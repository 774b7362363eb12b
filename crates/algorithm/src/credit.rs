//! Credit: units given back to a client by an operator, as if that many
//! fewer had been spent. Only where "spent" is a number to take from: a
//! token bucket's debt, a fixed window's or a quota's count. A credit never
//! makes a budget larger than the limit (a full bucket stays full, a count
//! stops at zero): a bigger allowance is a tier's job, not a reset's.

use super::decision::Ledger;
use super::decision::Update;
use super::kind::Kind;
use super::ledger;
use super::state::State;
use super::token_bucket;

/// What a credit or a refund needs of an algorithm (taken by value, so
/// that this module does not depend on the one that validates them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Numbers {
    pub kind: Kind,
    /// A bucket's interval in µs, or the window.
    pub period_us: u64,
    /// A token bucket's interval in its own units.
    pub interval: token_bucket::Interval,
}

/// Whether `credited` can give units back to this algorithm's state.
pub fn takes_credit(kind: Kind) -> bool {
    matches!(kind, Kind::TokenBucket | Kind::FixedWindow | Kind::Quota)
}

/// The state with `units` given back at `now_us`, and the update that
/// writes it; none when nothing was spent. `period_end_us` is where a
/// quota's running period ends.
pub(crate) fn credited(
    algorithm: &Numbers,
    period_end_us: u64,
    state: &State,
    now_us: u64,
    units: u64,
) -> Option<(State, Update)> {
    let period_us = algorithm.period_us;
    match (algorithm.kind, state) {
        (
            Kind::TokenBucket,
            &State::Gcra {
                tat_us,
                tat_ps,
                ledger,
            },
        ) => {
            // Back to no earlier than now: a bucket holds no more than full
            // (its leases outstanding left out, which the ledger keeps).
            let (tat_us, tat_ps) =
                token_bucket::credited(algorithm.interval, (tat_us, tat_ps), now_us, units)?;
            Some(gcra(tat_us, tat_ps, ledger))
        }
        (Kind::FixedWindow, State::Window { start_us, count }) => {
            // Only the running window's count: an older one is spent anyway.
            (*start_us >= now_us - now_us % period_us && *count > 0).then(|| {
                let count = count.saturating_sub(units);
                let start_us = *start_us;
                (
                    State::Window { start_us, count },
                    Update::Window { start_us, count },
                )
            })
        }
        (Kind::Quota, State::Period { end_us, count }) => (*end_us >= period_end_us && *count > 0)
            .then(|| {
                let count = count.saturating_sub(units);
                let end_us = *end_us;
                (
                    State::Period { end_us, count },
                    Update::Period { end_us, count },
                )
            }),
        _ => None,
    }
}

/// Whether a reservation of this algorithm can be refunded (`refunded`):
/// every algorithm whose units sit somewhere a refund can find them; not a
/// leaky bucket, whose units are departure slots already handed out.
pub(crate) fn takes_refund(kind: Kind) -> bool {
    !matches!(kind, Kind::LeakyBucket)
}

/// The state with `units` of a reservation counted at `counted_at_us`
/// (`Decision::counted_at_us`) given back at `now_us`, as if they had never
/// been taken; none when they are no longer there to give back (their
/// window is over, their stamp has left the log). A bucket's reservation
/// goes back as a credit does; a bucket's lease (`counted_at_us` is then
/// its epoch's end in the ledger) off the ledger while its epoch holds it
/// (`ledger::refunded`).
pub(crate) fn refunded(
    algorithm: &Numbers,
    state: &State,
    now_us: u64,
    units: u64,
    counted_at_us: u64,
) -> Option<(State, Update)> {
    let period_us = algorithm.period_us;
    match (algorithm.kind, state) {
        // A lease's units, counted at its epoch's end: off the ledger.
        (
            Kind::TokenBucket,
            &State::Gcra {
                tat_us,
                tat_ps,
                ledger,
            },
        ) if counted_at_us != 0 => {
            let ((tat_us, tat_ps), ledger) = ledger::refunded(
                algorithm.interval,
                (tat_us, tat_ps),
                ledger,
                now_us,
                units,
                counted_at_us,
            )?;
            Some(gcra(tat_us, tat_ps, ledger))
        }
        (Kind::TokenBucket, State::Gcra { .. }) => credited(algorithm, 0, state, now_us, units),
        (Kind::FixedWindow, &State::Window { start_us, count })
            if start_us == counted_at_us && count > 0 =>
        {
            let count = count.saturating_sub(units);
            Some((
                State::Window { start_us, count },
                Update::Window { start_us, count },
            ))
        }
        (Kind::Quota, &State::Period { end_us, count }) if end_us == counted_at_us && count > 0 => {
            let count = count.saturating_sub(units);
            Some((
                State::Period { end_us, count },
                Update::Period { end_us, count },
            ))
        }
        (
            Kind::SlidingWindow,
            &State::TwoWindows {
                start_us,
                current,
                previous,
            },
        ) => {
            // Still the running window, or the one before it (which now
            // fades out as `previous`).
            let (current, previous) = if start_us == counted_at_us && current > 0 {
                (current.saturating_sub(units), previous)
            } else if start_us == counted_at_us.saturating_add(period_us) && previous > 0 {
                (current, previous.saturating_sub(units))
            } else {
                return None;
            };
            Some((
                State::TwoWindows {
                    start_us,
                    current,
                    previous,
                },
                Update::TwoWindows {
                    start_us,
                    current,
                    previous,
                },
            ))
        }
        (Kind::SlidingLog, State::Log(log)) if log.has_stamp(counted_at_us) => {
            let mut log = log.clone();
            log.remove(counted_at_us, units);
            Some((
                State::Log(log),
                Update::LogRemove {
                    stamp_us: counted_at_us,
                    units,
                },
            ))
        }
        _ => None,
    }
}

fn gcra(tat_us: u64, tat_ps: u64, ledger: Ledger) -> (State, Update) {
    (
        State::Gcra {
            tat_us,
            tat_ps,
            ledger,
        },
        Update::Gcra {
            tat_us,
            tat_ps,
            ledger,
        },
    )
}
