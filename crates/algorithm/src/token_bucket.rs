//! Token bucket, kept as GCRA: instead of a token count and a last-refill time,
//! the state is one instant, `tat`, the time at which the bucket will be full
//! again. Tokens available at `now` are `capacity - (tat - now) / interval`.
//! One integer of state, lazy refill, and an exact retry time.

use super::decision::{Evaluation, Update};

/// `capacity` tokens, one token back every `interval_us`.
pub fn evaluate(
    capacity: u64,
    interval_us: u64,
    tat_us: u64,
    now_us: u64,
    cost: u64,
) -> Evaluation {
    let burst_us = capacity * interval_us;
    // A bucket whose tat lies in the past is full: refill is capped there.
    let start_us = tat_us.max(now_us);
    let debt_us = start_us - now_us;
    if cost > capacity {
        let remaining = burst_us.saturating_sub(debt_us) / interval_us;
        return Evaluation::oversized(capacity, remaining, debt_us, start_us);
    }
    let after_us = start_us + cost * interval_us;
    let needed_us = after_us - now_us;
    if needed_us <= burst_us {
        let update = if cost == 0 {
            Update::Unchanged
        } else {
            Update::Gcra { tat_us: after_us }
        };
        let remaining = (burst_us - needed_us) / interval_us;
        Evaluation::admitted(capacity, remaining, needed_us, update, after_us)
    } else {
        // A clock that stepped backwards can leave debt beyond the burst;
        // `saturating_sub` keeps the count at zero instead of wrapping.
        let remaining = burst_us.saturating_sub(debt_us) / interval_us;
        Evaluation::refused(capacity, remaining, debt_us, needed_us - burst_us, start_us)
    }
}
