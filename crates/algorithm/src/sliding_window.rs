//! Sliding window counter: counts for the current and the previous aligned
//! window, and the estimate `current + previous * (1 - elapsed / window)`.
//!
//! It assumes the previous window's requests were spread evenly, so it can be
//! off by up to the previous window's count times the share of it still in
//! view, in either direction; unlike the fixed window it does not admit a
//! double burst across an edge. Everything is scaled by `window` so that the
//! comparison stays in integers: `current * window + previous * (window -
//! elapsed) + cost * window <= limit * window`.

use super::decision::{Evaluation, Update};

pub fn evaluate(
    limit: u64,
    window_us: u64,
    stored_start_us: u64,
    stored_current: u64,
    stored_previous: u64,
    now_us: u64,
    cost: u64,
) -> Evaluation {
    // Never reopen an older window when the clock steps back.
    let now_eff = now_us.max(stored_start_us);
    let start_us = now_eff - now_eff % window_us;
    let (current, previous) = if start_us == stored_start_us {
        (stored_current, stored_previous)
    } else if start_us == stored_start_us + window_us {
        (0, stored_current)
    } else {
        (0, 0)
    };
    let elapsed_us = now_eff - start_us;
    let used_scaled = current * window_us + previous * (window_us - elapsed_us);
    let limit_scaled = limit * window_us;
    let end_us = start_us + window_us;
    let reset_after_us = end_us - now_us;
    let idle_at_us = end_us + window_us;
    let remaining_before = limit_scaled.saturating_sub(used_scaled) / window_us;
    if cost > limit {
        return Evaluation::oversized(limit, remaining_before, reset_after_us, idle_at_us);
    }
    let cost_scaled = cost * window_us;
    if used_scaled + cost_scaled <= limit_scaled {
        let update = if cost == 0 {
            Update::Unchanged
        } else {
            Update::TwoWindows {
                start_us,
                current: current + cost,
                previous,
            }
        };
        let remaining = (limit_scaled - used_scaled - cost_scaled) / window_us;
        return Evaluation::admitted(limit, remaining, reset_after_us, update, idle_at_us)
            .counted_at(start_us);
    }
    let retry_at_us = retry_at(limit, window_us, start_us, current, previous, cost);
    Evaluation::refused(
        limit,
        remaining_before,
        reset_after_us,
        retry_at_us - now_us,
        idle_at_us,
    )
}

/// The first instant at which the same request is admitted, if nothing else
/// arrives meanwhile.
fn retry_at(
    limit: u64,
    window_us: u64,
    start_us: u64,
    current: u64,
    previous: u64,
    cost: u64,
) -> u64 {
    // Later in this window the previous window's weight falls: admitted once
    // previous * (window - elapsed) <= (limit - cost - current) * window.
    if previous > 0 && limit >= cost + current {
        let room_scaled = (limit - cost - current) * window_us;
        let elapsed_needed = window_us - (room_scaled / previous).min(window_us);
        if elapsed_needed < window_us {
            return start_us + elapsed_needed;
        }
    }
    // In the next window, this window's count becomes the fading one.
    let next_start_us = start_us + window_us;
    if current == 0 {
        return next_start_us;
    }
    let room_scaled = (limit - cost) * window_us;
    let elapsed_needed = window_us - (room_scaled / current).min(window_us);
    next_start_us + elapsed_needed
}
