//! Fixed window: one counter per window aligned to multiples of `window`.
//! Cheap and easy to explain, at the price of admitting up to twice the limit
//! across a window edge (the end of one window and the start of the next).

use super::decision::{Evaluation, Update};

/// A request of `cost` units at `now_us` against `limit` units per aligned
/// window of `window_us`, on the stored window (its start and count); the
/// admitted units are counted at the window's start.
pub fn evaluate(
    limit: u64,
    window_us: u64,
    stored_start_us: u64,
    stored_count: u64,
    now_us: u64,
    cost: u64,
) -> Evaluation {
    // A clock that steps backwards stays in the newest window seen, rather than
    // reopening an old one with a fresh count.
    let start_us = (now_us - now_us % window_us).max(stored_start_us);
    let count = if start_us == stored_start_us {
        stored_count
    } else {
        0
    };
    let end_us = start_us + window_us;
    let reset_after_us = end_us - now_us.min(end_us);
    if cost > limit {
        return Evaluation::oversized(limit, limit.saturating_sub(count), reset_after_us, end_us);
    }
    if count + cost <= limit {
        let update = if cost == 0 {
            Update::Unchanged
        } else {
            Update::Window {
                start_us,
                count: count + cost,
            }
        };
        Evaluation::admitted(limit, limit - count - cost, reset_after_us, update, end_us)
            .counted_at(start_us)
    } else {
        Evaluation::refused(
            limit,
            limit.saturating_sub(count),
            reset_after_us,
            reset_after_us,
            end_us,
        )
    }
}
