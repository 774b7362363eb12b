//! Credit: units given back to a client by an operator, as if that many
//! fewer had been spent. Only where "spent" is a number to take from: a
//! token bucket's debt, a fixed window's or a quota's count. A credit never
//! makes a budget larger than the limit (a full bucket stays full, a count
//! stops at zero): a bigger allowance is a tier's job, not a reset's.

use super::decision::Update;
use super::kind::Kind;
use super::state::State;

/// Whether `credited` can give units back to this algorithm's state.
pub fn takes_credit(kind: Kind) -> bool {
    matches!(kind, Kind::TokenBucket | Kind::FixedWindow | Kind::Quota)
}

/// The state with `units` given back at `now_us`, and the update that
/// writes it; none when nothing was spent. `period_us` is the interval of
/// a bucket or the window; `period_end_us` where a quota's running period
/// ends.
pub fn credited(
    kind: Kind,
    period_us: u64,
    period_end_us: u64,
    state: &State,
    now_us: u64,
    units: u64,
) -> Option<(State, Update)> {
    match (kind, state) {
        (Kind::TokenBucket, State::Gcra { tat_us }) if *tat_us > now_us => {
            // Back to no earlier than now: a bucket holds no more than full.
            let back_us = units.saturating_mul(period_us);
            let tat_us = tat_us.saturating_sub(back_us).max(now_us);
            Some((State::Gcra { tat_us }, Update::Gcra { tat_us }))
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
