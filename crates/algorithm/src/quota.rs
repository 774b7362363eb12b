//! Calendar quota: at most `limit` per day, week or month of a time zone.
//! A fixed window whose edges are calendar boundaries, so the window is
//! known by its end, which the caller computes (`calendar`): the Redis
//! script cannot read a zone's rules, so it is handed the end too.

use super::decision::{Evaluation, Update};

/// `period_end_us`: where the period containing `now_us` ends, by the
/// caller's calendar.
pub fn evaluate(
    limit: u64,
    period_end_us: u64,
    stored_end_us: u64,
    stored_count: u64,
    now_us: u64,
    cost: u64,
) -> Evaluation {
    // A caller whose clock is behind another's stays in the newest period
    // seen rather than reopening an old one with a fresh count.
    let end_us = period_end_us.max(stored_end_us);
    let count = if end_us == stored_end_us {
        stored_count
    } else {
        0
    };
    let reset_after_us = end_us - now_us.min(end_us);
    if cost > limit {
        return Evaluation::oversized(limit, limit.saturating_sub(count), reset_after_us, end_us);
    }
    if count + cost <= limit {
        let update = if cost == 0 {
            Update::Unchanged
        } else {
            Update::Period {
                end_us,
                count: count + cost,
            }
        };
        Evaluation::admitted(limit, limit - count - cost, reset_after_us, update, end_us)
            .counted_at(end_us)
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
