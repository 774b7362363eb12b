//! Token bucket, kept as GCRA: instead of a token count and a last-refill time,
//! the state is one instant, `tat`, the time at which the bucket will be full
//! again. Tokens available at `now` are `capacity - (tat - now) / interval`.
//! One instant of state, lazy refill, and an exact retry time.
//!
//! Time is counted in units of `1 / per_us` µs: whole µs for most buckets,
//! a decimal fraction of a µs (down to 10^-6) for one whose interval is no
//! whole number of µs (10,000,000 a second: 0.1 µs). The arithmetic runs on
//! the debt, `tat - now` in those units, which the burst bounds (at most
//! 2^51 units, `Algorithm::token_bucket_per_second`), rather than on
//! instants, which in units finer than a µs would not fit a double. The
//! state keeps the instant in whole µs and the rest of it in picoseconds,
//! so that a bucket whose unit changes on reload reads it all the same.

use super::decision::{Evaluation, Ledger, Update};

/// Picoseconds in a µs: the unit of a tat's fraction, whatever the bucket's.
pub const PS_PER_US: u64 = 1_000_000;

/// The most debt a state's charges and credits are reckoned from, in a
/// bucket's units: a tat further ahead (a clock far behind another, a
/// reload to a finer unit) is refused as it is, but a credit first brings
/// it to this far, so that every sum stays exact in a double. Its waits are
/// counted in whole µs from the tat itself, which is exact however far.
const MAX_DEBT: u64 = 1 << 52;

/// One token every `units` of `1 / per_us` µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// The interval's length, in units of `1 / per_us` µs.
    pub units: u64,
    /// 1, or a power of ten up to `PS_PER_US`.
    pub per_us: u64,
}

impl Interval {
    /// Units from `now_us` until the instant `tat` (whole µs, picoseconds),
    /// 0 when it is past.
    pub(crate) fn debt(&self, (tat_us, tat_ps): (u64, u64), now_us: u64) -> u64 {
        // Without a branch on where the tat lies (a bucket near empty is
        // past and ahead in turns, which a branch mispredicts).
        let ahead_us = tat_us.saturating_sub(now_us);
        let fraction = if tat_us >= now_us {
            self.units_of_ps(tat_ps)
        } else {
            0
        };
        ahead_us.min(self.whole_us(MAX_DEBT)) * self.per_us + fraction
    }

    /// A tat's picoseconds in units, rounded up: a fraction finer than the
    /// unit (from a finer bucket before a reload) is a unit more, never
    /// more tokens than the state allows.
    fn units_of_ps(&self, tat_ps: u64) -> u64 {
        // Whole µs, the common case, need no division: a few of them cost
        // a decision as much as all the rest.
        if self.per_us == 1 {
            return u64::from(tat_ps > 0);
        }
        tat_ps.div_ceil(PS_PER_US / self.per_us)
    }

    /// The instant `units` past `now_us`, in whole µs and picoseconds.
    pub(crate) fn after(&self, now_us: u64, units: u64) -> (u64, u64) {
        if self.per_us == 1 {
            return (now_us + units, 0);
        }
        (
            now_us + units / self.per_us,
            units % self.per_us * (PS_PER_US / self.per_us),
        )
    }

    /// `units` in whole µs, rounded up: the first whole µs by which they
    /// have passed.
    pub(crate) fn us(&self, units: u64) -> u64 {
        if self.per_us == 1 {
            return units;
        }
        units.div_ceil(self.per_us)
    }

    /// `units` in whole µs, rounded down.
    fn whole_us(&self, units: u64) -> u64 {
        if self.per_us == 1 {
            return units;
        }
        units / self.per_us
    }

    /// Whole µs from `now_us` until the instant `tat` has passed: 0 when it
    /// has.
    fn wait_us(&self, (tat_us, tat_ps): (u64, u64), now_us: u64) -> u64 {
        tat_us.saturating_sub(now_us) + u64::from(tat_us >= now_us && tat_ps > 0)
    }

    /// Whole µs from `now_us` until the debt to the instant `tat` is at
    /// most `room` units: the first x with `debt - x * per_us <= room`,
    /// reckoned from the whole µs to the tat so that it is exact however
    /// far ahead the tat is.
    fn wait_for_room_us(&self, (tat_us, tat_ps): (u64, u64), now_us: u64, room: u64) -> u64 {
        if tat_us < now_us || (tat_us == now_us && tat_ps == 0) {
            return 0;
        }
        let rem = self.units_of_ps(tat_ps);
        if room >= rem {
            (tat_us - now_us).saturating_sub(self.whole_us(room - rem))
        } else {
            tat_us - now_us + 1
        }
    }
}

/// `capacity` tokens, one token back every `interval`; the state's `tat`.
pub fn evaluate(
    capacity: u64,
    interval: Interval,
    tat: (u64, u64),
    now_us: u64,
    cost: u64,
) -> Evaluation {
    let burst = capacity * interval.units;
    // A bucket whose tat lies in the past is full: refill is capped there.
    let debt = interval.debt(tat, now_us);
    let wait_us = interval.wait_us(tat, now_us);
    if cost > capacity {
        let remaining = burst.saturating_sub(debt) / interval.units;
        return Evaluation::oversized(capacity, remaining, wait_us, now_us + wait_us);
    }
    let after = debt + cost * interval.units;
    if after <= burst {
        let update = if cost == 0 {
            Update::Unchanged
        } else {
            let (tat_us, tat_ps) = interval.after(now_us, after);
            Update::Gcra {
                tat_us,
                tat_ps,
                ledger: Ledger::default(),
            }
        };
        let remaining = (burst - after) / interval.units;
        let full_us = interval.us(after);
        Evaluation::admitted(capacity, remaining, full_us, update, now_us + full_us)
    } else {
        // A clock that stepped backwards can leave debt beyond the burst;
        // `saturating_sub` keeps the count at zero instead of wrapping.
        let remaining = burst.saturating_sub(debt) / interval.units;
        let room = burst - cost * interval.units;
        Evaluation::refused(
            capacity,
            remaining,
            wait_us,
            interval.wait_for_room_us(tat, now_us, room),
            now_us + wait_us,
        )
    }
}

/// `units` tokens given back at `now_us`: the tat moved back by their
/// intervals, to no earlier than now (a bucket holds no more than full);
/// none when the bucket is full already.
pub(crate) fn credited(
    interval: Interval,
    tat: (u64, u64),
    now_us: u64,
    units: u64,
) -> Option<(u64, u64)> {
    let debt = interval.debt(tat, now_us);
    if debt == 0 {
        return None;
    }
    let left = debt.saturating_sub(units.saturating_mul(interval.units));
    Some(interval.after(now_us, left))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tat already passed leaves no wait whatever the room: the early
    /// return `evaluate` never reaches (it refuses only a bucket in debt).
    #[test]
    fn no_wait_for_room_behind_a_tat_passed() {
        for per_us in [1, 10] {
            let interval = Interval { units: 10, per_us };
            for tat in [(5, 0), (5, 500_000), (10, 0)] {
                assert_eq!(interval.wait_for_room_us(tat, 10, 0), 0, "{tat:?}");
            }
            assert_eq!(interval.wait_for_room_us((10, 500_000), 10, 0), 1);
        }
    }
}
