//! Sliding window counter: counts for the current and the previous aligned
//! window, and the estimate `current + previous * (1 - elapsed / window)`.
//!
//! It assumes the previous window's requests were spread evenly, so it can be
//! off by up to the previous window's count times the share of it still in
//! view, in either direction; unlike the fixed window it does not admit a
//! double burst across an edge.
//!
//! The share still in view is measured in whole steps: the window is cut
//! into `steps` steps of `step_us` (`steps`), `elapsed` counts the steps
//! begun, and everything is scaled by `steps` so that the comparison stays
//! in integers: `current * steps + previous * (steps - elapsed) + cost *
//! steps <= limit * steps`. A step is 1 µs whenever `limit * window_us` is
//! at most 2^51, which every window accepted before steps was (its
//! decisions are unchanged); beyond that a step is as short as keeps
//! `limit * steps` within 2^51, so that the Lua twin computes the same in
//! doubles: 100,000 a day weighs in steps of 4 µs, 4,294,967,295 in 366
//! days in steps of a minute (at least 2^18 steps a window for every limit
//! up to 2^32 - 1). Counting a begun step as elapsed never weighs the
//! previous window less than the µs-exact estimate would, so a coarser
//! step never admits what that estimate refuses.

use super::decision::{Evaluation, Update};
use super::ranges::MAX_SCALED;

/// How the window is cut: (`step_us`, `steps`), with `steps` the fewest
/// steps of `step_us` that cover `window_us` and `limit * steps` at most
/// `MAX_SCALED`.
pub fn steps(limit: u64, window_us: u64) -> (u64, u64) {
    // The common case, without the divisions below.
    if limit
        .checked_mul(window_us)
        .is_some_and(|scaled| scaled <= MAX_SCALED)
    {
        return (1, window_us);
    }
    let most = (MAX_SCALED / limit.max(1)).max(1);
    let step_us = window_us.div_ceil(most);
    (step_us, window_us.div_ceil(step_us))
}

/// A request of `cost` units at `now_us` against `limit` units per
/// `window_us`, weighed over the stored current window (its start and
/// count) and the previous one's count; the admitted units are counted
/// at the current window's start.
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
    // A count above the limit (left by a reload that lowered it) weighs
    // as the limit: the window is full either way, and the scaled sums
    // stay within 3 * 2^51.
    let (current, previous) = (current.min(limit), previous.min(limit));
    let (step_us, steps) = steps(limit, window_us);
    let elapsed = match step_us {
        1 => now_eff - start_us,
        _ => (now_eff - start_us) / step_us,
    };
    let used_scaled = current * steps + previous * (steps - elapsed);
    let limit_scaled = limit * steps;
    let end_us = start_us + window_us;
    let reset_after_us = end_us - now_us;
    let idle_at_us = end_us + window_us;
    let remaining_before = limit_scaled.saturating_sub(used_scaled) / steps;
    if cost > limit {
        return Evaluation::oversized(limit, remaining_before, reset_after_us, idle_at_us);
    }
    let cost_scaled = cost * steps;
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
        let remaining = (limit_scaled - used_scaled - cost_scaled) / steps;
        return Evaluation::admitted(limit, remaining, reset_after_us, update, idle_at_us)
            .counted_at(start_us);
    }
    let window = Window {
        start_us,
        window_us,
        step_us,
        steps,
    };
    let retry_at_us = window.retry_at(limit, current, previous, cost);
    Evaluation::refused(
        limit,
        remaining_before,
        reset_after_us,
        retry_at_us - now_us,
        idle_at_us,
    )
}

/// The running window and how it is cut.
struct Window {
    start_us: u64,
    window_us: u64,
    step_us: u64,
    steps: u64,
}

impl Window {
    /// The first instant at which the same request is admitted, if nothing
    /// else arrives meanwhile.
    fn retry_at(&self, limit: u64, current: u64, previous: u64, cost: u64) -> u64 {
        let steps = self.steps;
        // Later in this window the previous window's weight falls: admitted
        // once previous * (steps - elapsed) <= (limit - cost - current) * steps.
        if previous > 0 && limit >= cost + current {
            let room_scaled = (limit - cost - current) * steps;
            let elapsed_needed = steps - (room_scaled / previous).min(steps);
            if elapsed_needed < steps {
                // Within the window: (steps - 1) steps start before its end.
                return self.start_us + elapsed_needed * self.step_us;
            }
        }
        // In the next window, this window's count becomes the fading one;
        // if no step of it is light enough, the one after starts empty.
        let next_start_us = self.start_us + self.window_us;
        if current == 0 {
            return next_start_us;
        }
        let room_scaled = (limit - cost) * steps;
        let elapsed_needed = steps - (room_scaled / current).min(steps);
        next_start_us + (elapsed_needed * self.step_us).min(self.window_us)
    }
}
