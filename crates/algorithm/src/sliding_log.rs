//! Sliding log: the stamps of admitted requests within the last `window`.
//! Exact (never more than `limit` units in any window of that length) at the
//! price of state proportional to the limit. A stamp `s` counts at `now` while
//! `s > now - window`. Requests of the same microsecond share one entry, and the
//! log never holds more than `limit` units.

use std::collections::VecDeque;

use super::decision::{Evaluation, Update};

/// A sliding log's state: the stamps admitted within the window, with the
/// units at each. Its memory grows with the limit (`len`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    /// (stamp, units admitted at that stamp), oldest first.
    entries: VecDeque<(u64, u64)>,
}

impl LogState {
    fn newest_us(&self) -> Option<u64> {
        self.entries.back().map(|&(stamp, _)| stamp)
    }

    /// Units still inside the window at `now_us`, oldest first.
    fn live(&self, now_us: u64, window_us: u64) -> impl Iterator<Item = &(u64, u64)> {
        self.entries
            .iter()
            .skip_while(move |&&(stamp, _)| stamp + window_us <= now_us)
    }

    pub(crate) fn append(&mut self, now_us: u64, cost: u64, window_us: u64) {
        while let Some(&(stamp, _)) = self.entries.front() {
            if stamp + window_us <= now_us {
                self.entries.pop_front();
            } else {
                break;
            }
        }
        match self.entries.back_mut() {
            Some((stamp, units)) if *stamp == now_us => *units += cost,
            _ => self.entries.push_back((now_us, cost)),
        }
    }

    /// `units` taken off the entry at `stamp_us` (a refund); the entry goes
    /// when none is left. Whether there was such an entry.
    pub(crate) fn remove(&mut self, stamp_us: u64, units: u64) -> bool {
        let Some(at) = self
            .entries
            .iter()
            .position(|&(stamp, _)| stamp == stamp_us)
        else {
            return false;
        };
        let left = self.entries[at].1.saturating_sub(units);
        if left == 0 {
            self.entries.remove(at);
        } else {
            self.entries[at].1 = left;
        }
        true
    }

    /// Whether an entry is stamped `stamp_us`.
    pub(crate) fn has_stamp(&self, stamp_us: u64) -> bool {
        self.entries.iter().any(|&(stamp, _)| stamp == stamp_us)
    }

    /// Entries held; the memory this key costs grows with it.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no stamp is held: the key's state may then be dropped.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A request of `cost` units at `now_us` against at most `limit` units in
/// any window of `window_us`, on the stored log; the admitted units are
/// counted at their stamp.
pub fn evaluate(limit: u64, window_us: u64, log: &LogState, now_us: u64, cost: u64) -> Evaluation {
    // A clock that stepped back is held at the newest stamp: no stamp may be
    // forgotten early.
    let now_eff = now_us.max(log.newest_us().unwrap_or(0));
    let used: u64 = log.live(now_eff, window_us).map(|&(_, units)| units).sum();
    let idle_at_us = log.newest_us().map_or(now_eff, |s| s + window_us);
    let reset_after_us = idle_at_us.saturating_sub(now_us);
    if cost > limit {
        return Evaluation::oversized(
            limit,
            limit.saturating_sub(used),
            reset_after_us,
            idle_at_us,
        );
    }
    if used + cost <= limit {
        let update = if cost == 0 {
            Update::Unchanged
        } else {
            Update::LogAppend {
                now_us: now_eff,
                cost,
                window_us,
            }
        };
        let idle_at_us = if cost == 0 {
            idle_at_us
        } else {
            now_eff + window_us
        };
        return Evaluation::admitted(
            limit,
            limit - used - cost,
            idle_at_us.saturating_sub(now_us),
            update,
            idle_at_us,
        )
        .counted_at(now_eff);
    }
    // Admitted once enough of the oldest units have left the window.
    let must_leave = used + cost - limit;
    let mut left = 0;
    let mut retry_at_us = idle_at_us;
    for &(stamp, units) in log.live(now_eff, window_us) {
        left += units;
        if left >= must_leave {
            retry_at_us = stamp + window_us;
            break;
        }
    }
    Evaluation::refused(
        limit,
        limit.saturating_sub(used),
        reset_after_us,
        retry_at_us - now_us,
        idle_at_us,
    )
}
