//! An algorithm with its numbers, checked once so that the arithmetic never
//! meets a zero divisor or an inexact product (see `ranges`).

use super::algorithm_error::AlgorithmError;
use super::calendar::Calendar;
use super::decision::Evaluation;
use super::decision::Ledger;
use super::kind::Kind;
use super::ranges::*;
use super::sliding_log::LogState;
use super::state::State;
use super::{
    credit, fixed_window, leaky_bucket, ledger, quota, sliding_log, sliding_window, token_bucket,
};

/// An interval in µs rounded up to a whole µs, or why it cannot be one.
fn whole_us(us: f64) -> Result<u64, AlgorithmError> {
    let whole = us.ceil();
    if whole > MAX_SCALED as f64 {
        return Err(AlgorithmError::RateTooSlow);
    }
    // Below 2^51 and whole: the cast is exact.
    Ok((whole as u64).max(1))
}

/// One limit's algorithm with its numbers, valid by construction: a quota of
/// at least 1, a period of at least one unit, and every value the
/// arithmetic forms exact in a double.
///
/// `quota` is the bucket's capacity or the window's limit; `period` the
/// interval between two tokens (buckets), the window's length, or a
/// calendar period's usual length (the calendar says where it really
/// ends), in units of `1 / per_us` µs. `per_us` is 1 but for a token bucket
/// whose interval is no whole number of µs: then a power of ten up to 10^6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algorithm {
    kind: Kind,
    quota: u64,
    period: u64,
    per_us: u64,
    calendar: Option<Calendar>,
}

/// Checks `quota` and `period` (in units of `1 / per_us` µs) for `kind`.
fn check(kind: Kind, quota: u64, period: u64, per_us: u64) -> Result<(), AlgorithmError> {
    if quota == 0 {
        return Err(AlgorithmError::ZeroQuota);
    }
    if period == 0 {
        return Err(AlgorithmError::ZeroPeriod);
    }
    // A token bucket's interval is at least 1/10^7 s (0.1 µs).
    if period.saturating_mul(MAX_REFILL_PER_SECOND) < 1_000_000 * per_us {
        return Err(AlgorithmError::RateOutOfRange {
            most: MAX_REFILL_PER_SECOND,
        });
    }
    let most = match kind {
        Kind::Quota => return Err(AlgorithmError::NeedsCalendar),
        // A bucket's arithmetic spans its whole burst, in its units.
        Kind::TokenBucket | Kind::LeakyBucket => {
            let most = MAX_SCALED / period;
            if most == 0 {
                return Err(AlgorithmError::RateTooSlow);
            }
            if quota > most {
                return Err(AlgorithmError::TooLargeForRate {
                    kind,
                    most,
                    got: quota,
                });
            }
            return Ok(());
        }
        Kind::FixedWindow => MAX_COUNT,
        Kind::SlidingWindow => MAX_SLIDING_WINDOW,
        Kind::SlidingLog => {
            if quota > MAX_SLIDING_LOG {
                return Err(AlgorithmError::LogTooLong { got: quota });
            }
            MAX_SLIDING_LOG
        }
    };
    if quota > most {
        return Err(AlgorithmError::TooManyPerWindow { most, got: quota });
    }
    if period > MAX_WINDOW_US {
        return Err(AlgorithmError::WindowTooLong);
    }
    Ok(())
}

impl Algorithm {
    /// `kind` with `quota` (a bucket's capacity, a window's limit) and
    /// `period_us` (a bucket's interval between two units, a window's
    /// length) in whole µs. Errs when the numbers are out of the ranges
    /// `kind` takes, and for a calendar quota (`calendar_quota`).
    pub fn new(kind: Kind, quota: u64, period_us: u64) -> Result<Algorithm, AlgorithmError> {
        check(kind, quota, period_us, 1)?;
        Ok(Algorithm {
            kind,
            quota,
            period: period_us,
            per_us: 1,
            calendar: None,
        })
    }

    /// At most `limit` per period of `calendar`. No product of two
    /// quantities is formed, so only the limit itself is bounded.
    pub fn calendar_quota(limit: u64, calendar: Calendar) -> Result<Algorithm, AlgorithmError> {
        if limit == 0 {
            return Err(AlgorithmError::ZeroQuota);
        }
        if limit > MAX_COUNT {
            return Err(AlgorithmError::TooManyPerPeriod {
                most: MAX_COUNT,
                got: limit,
            });
        }
        Ok(Algorithm {
            kind: Kind::Quota,
            quota: limit,
            period: calendar.period.nominal_us(),
            per_us: 1,
            calendar: Some(calendar),
        })
    }

    /// Bursts up to `capacity`, one token back every `interval_us`.
    pub fn token_bucket(capacity: u64, interval_us: u64) -> Result<Algorithm, AlgorithmError> {
        Algorithm::new(Kind::TokenBucket, capacity, interval_us)
    }

    /// Bursts up to `capacity`, `per_second` tokens back a second, from one
    /// in 71 years to `MAX_REFILL_PER_SECOND`.
    ///
    /// The interval between two tokens is kept in whole µs when that is
    /// exact, or when the bucket refills at most 1,000 a second (rounded up
    /// to the µs as before, it is at most 0.1% slow). Otherwise in the
    /// finest of 1/10 .. 1/10^6 µs that still spans the whole burst in at
    /// most `MAX_SCALED` units: 10,000,000 a second is then 0.1 µs exactly,
    /// and 3,000 a second 333.333334 µs. The interval is rounded up to its
    /// unit, so a bucket never refills faster than it says.
    pub fn token_bucket_per_second(
        capacity: u64,
        per_second: f64,
    ) -> Result<Algorithm, AlgorithmError> {
        let kind = Kind::TokenBucket;
        if !(per_second > 0.0 && per_second <= MAX_REFILL_PER_SECOND as f64) {
            return Err(AlgorithmError::RateOutOfRange {
                most: MAX_REFILL_PER_SECOND,
            });
        }
        let us = 1e6 / per_second;
        if us.fract() != 0.0 && per_second > 1_000.0 {
            for decimals in (1..=6).rev() {
                let per_us = 10u64.pow(decimals);
                // At most 10^12 / 10^-7 < 2^63: the cast is exact.
                let period = (1e6 * per_us as f64 / per_second).ceil() as u64;
                if capacity
                    .checked_mul(period)
                    .is_some_and(|b| b <= MAX_SCALED)
                {
                    check(kind, capacity, period, per_us)?;
                    return Ok(Algorithm {
                        kind,
                        quota: capacity,
                        period,
                        per_us,
                        calendar: None,
                    });
                }
            }
        }
        Algorithm::new(kind, capacity, whole_us(us)?)
    }

    /// Requests leave one every `interval_us`; up to `capacity` may wait.
    pub fn leaky_bucket(capacity: u64, interval_us: u64) -> Result<Algorithm, AlgorithmError> {
        Algorithm::new(Kind::LeakyBucket, capacity, interval_us)
    }

    /// Requests leave `per_second` a second, at most
    /// `MAX_LEAK_PER_SECOND`: their slots are whole µs apart, the interval
    /// rounded up so that they never leave faster than that.
    pub fn leaky_bucket_per_second(
        capacity: u64,
        per_second: f64,
    ) -> Result<Algorithm, AlgorithmError> {
        if !(per_second > 0.0 && per_second <= MAX_LEAK_PER_SECOND as f64) {
            return Err(AlgorithmError::RateOutOfRange {
                most: MAX_LEAK_PER_SECOND,
            });
        }
        Algorithm::leaky_bucket(capacity, whole_us(1e6 / per_second)?)
    }

    /// At most `limit` per aligned window.
    pub fn fixed_window(limit: u64, window_us: u64) -> Result<Algorithm, AlgorithmError> {
        Algorithm::new(Kind::FixedWindow, limit, window_us)
    }

    /// Weighted estimate over the current and previous window.
    pub fn sliding_window(limit: u64, window_us: u64) -> Result<Algorithm, AlgorithmError> {
        Algorithm::new(Kind::SlidingWindow, limit, window_us)
    }

    /// Exactly at most `limit` in any window of `window_us`.
    pub fn sliding_log(limit: u64, window_us: u64) -> Result<Algorithm, AlgorithmError> {
        Algorithm::new(Kind::SlidingLog, limit, window_us)
    }

    /// Which algorithm it is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The algorithm's name as the config spells it (`"token_bucket"`).
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The number a client sees as its quota (`RateLimit-Limit`, `q=`): the
    /// capacity of a bucket, the limit of a window.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// A bucket's interval between two tokens, a window's length, or a
    /// calendar period's usual length, in whole µs (a bucket's interval
    /// that is a fraction of a µs rounded up: never a faster rate).
    pub fn period_us(&self) -> u64 {
        self.period.div_ceil(self.per_us)
    }

    /// The period in its own units, `1 / per_us()` µs: exact where
    /// `period_us` rounds.
    pub fn period(&self) -> u64 {
        self.period
    }

    /// How many of the period's units make a µs: 1, or for a token bucket
    /// whose interval is no whole number of µs a power of ten up to 10^6.
    pub fn per_us(&self) -> u64 {
        self.per_us
    }

    fn credit_numbers(&self) -> credit::Numbers {
        credit::Numbers {
            kind: self.kind,
            period_us: self.period_us(),
            interval: self.interval(),
        }
    }

    /// A token bucket's interval between two tokens, in its own units.
    pub(crate) fn interval(&self) -> token_bucket::Interval {
        token_bucket::Interval {
            units: self.period,
            per_us: self.per_us,
        }
    }

    /// A calendar quota's calendar; none for every other algorithm.
    pub fn calendar(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// The second number the Redis script takes for this algorithm at
    /// `now_us`, in units of `1 / per_us()` µs: the period, or for a
    /// calendar quota where the current period ends (the script cannot
    /// read a zone's rules).
    pub fn script_period_at(&self, now_us: u64) -> u64 {
        match &self.calendar {
            Some(calendar) => calendar.period_end_us(now_us),
            None => self.period,
        }
    }

    /// The same limit without its ceiling, on the same state: a cost
    /// decided against it is charged whatever is left, so the balance may
    /// go below zero (a cost the response reports is owed, not asked for).
    /// What remains of a ceiling keeps the arithmetic exact: 2^51 units for
    /// a window or a quota, whose counts are only added; 2^51 units of its
    /// time of debt for a bucket (71 years of whole µs). A sliding window
    /// weighs its counts, so its ceiling would be low enough to be reached:
    /// it is not offered this (`owes_costs`).
    pub fn without_ceiling(&self) -> Algorithm {
        let quota = match self.kind {
            Kind::FixedWindow | Kind::Quota => MAX_COUNT,
            _ => (MAX_SCALED / self.period).max(1),
        };
        Algorithm { quota, ..*self }
    }

    /// Whether a cost can be owed to it (`without_ceiling`): a bucket's
    /// debt and a window's count can be; not a log of stamps, a schedule
    /// of departures, or a sliding window's weighted counts.
    pub fn owes_costs(&self) -> bool {
        matches!(
            self.kind,
            Kind::TokenBucket | Kind::FixedWindow | Kind::Quota
        )
    }

    /// Whether an operator can give units back (`credit`): a token
    /// bucket, a fixed window or a quota.
    pub fn takes_credit(&self) -> bool {
        credit::takes_credit(self.kind)
    }

    /// `units` given back at `now_us` (see `credit`): the state's decision
    /// at cost 0 afterwards, and the update that writes it.
    pub fn credit(&self, state: &State, now_us: u64, units: u64) -> Evaluation {
        let period_end_us = self.script_period_at(now_us);
        match credit::credited(&self.credit_numbers(), period_end_us, state, now_us, units) {
            Some((state, update)) => Evaluation {
                update,
                ..self.evaluate(&state, now_us, 0)
            },
            None => self.evaluate(state, now_us, 0),
        }
    }

    /// `units` of a reservation counted at `counted_at_us` given back at
    /// `now_us` (see `credit::refunded`): the state's decision at cost 0
    /// afterwards, and the update that writes it.
    pub fn refund(&self, state: &State, now_us: u64, units: u64, counted_at_us: u64) -> Evaluation {
        match credit::refunded(&self.credit_numbers(), state, now_us, units, counted_at_us) {
            Some((state, update)) => Evaluation {
                update,
                ..self.evaluate(&state, now_us, 0)
            },
            None => self.evaluate(state, now_us, 0),
        }
    }

    /// Whether a reservation can be refunded (`refund`): not a leaky
    /// bucket's.
    pub fn takes_refund(&self) -> bool {
        credit::takes_refund(self.kind)
    }

    /// The quota's time window in microseconds (`w=`): for the buckets, the time
    /// to refill from empty (rounded up to the µs).
    pub fn window_us(&self) -> u64 {
        if self.kind.is_bucket() {
            (self.quota * self.period).div_ceil(self.per_us)
        } else {
            self.period
        }
    }

    /// This limit shared evenly by `instances` processes deciding alone: each
    /// gets its share of the quota (at least 1) and of the rate. A bucket
    /// whose quota is smaller than `instances` keeps 1 token and a rate
    /// divided as the others; only a rate already slower than one token per
    /// 2^51 / quota units stops being divided, to keep the arithmetic exact.
    pub fn divided(&self, instances: u64) -> Algorithm {
        let n = instances.max(1);
        let quota = (self.quota / n).max(1);
        let period = if self.kind.is_bucket() {
            // Within what `new` accepts for this quota.
            self.period.saturating_mul(n).min(MAX_SCALED / quota)
        } else {
            self.period
        };
        Algorithm {
            quota,
            period,
            ..*self
        }
    }

    /// A fresh state for this algorithm (what a key that was never seen holds).
    pub fn fresh_state(&self) -> State {
        match self.kind {
            Kind::TokenBucket | Kind::LeakyBucket => State::Gcra {
                tat_us: 0,
                tat_ps: 0,
                ledger: Ledger::default(),
            },
            Kind::FixedWindow => State::Window {
                start_us: 0,
                count: 0,
            },
            Kind::SlidingWindow => State::TwoWindows {
                start_us: 0,
                current: 0,
                previous: 0,
            },
            Kind::SlidingLog => State::Log(LogState::default()),
            Kind::Quota => State::Period {
                end_us: 0,
                count: 0,
            },
        }
    }

    /// Decides a request of `cost` at `now_us` against `state` without changing it.
    ///
    /// A state of the wrong shape (a limit whose algorithm changed on reload) is
    /// treated as fresh.
    pub fn evaluate(&self, state: &State, now_us: u64, cost: u64) -> Evaluation {
        let (quota, period) = (self.quota, self.period);
        match (self.kind, state) {
            (
                Kind::TokenBucket,
                &State::Gcra {
                    tat_us,
                    tat_ps,
                    ledger,
                },
            ) => {
                ledger::evaluate(
                    quota,
                    self.interval(),
                    (tat_us, tat_ps),
                    ledger,
                    now_us,
                    cost,
                )
                .0
            }
            // A bucket's schedule in whole µs: a fraction (left by a token
            // bucket before a reload) is a µs more.
            (Kind::LeakyBucket, &State::Gcra { tat_us, tat_ps, .. }) => {
                leaky_bucket::evaluate(quota, period, tat_us + u64::from(tat_ps > 0), now_us, cost)
            }
            (Kind::FixedWindow, State::Window { start_us, count }) => {
                fixed_window::evaluate(quota, period, *start_us, *count, now_us, cost)
            }
            (
                Kind::SlidingWindow,
                State::TwoWindows {
                    start_us,
                    current,
                    previous,
                },
            ) => sliding_window::evaluate(
                quota, period, *start_us, *current, *previous, now_us, cost,
            ),
            (Kind::SlidingLog, State::Log(log)) => {
                sliding_log::evaluate(quota, period, log, now_us, cost)
            }
            (Kind::Quota, State::Period { end_us, count }) => quota::evaluate(
                quota,
                self.script_period_at(now_us),
                *end_us,
                *count,
                now_us,
                cost,
            ),
            _ => self.evaluate(&self.fresh_state(), now_us, cost),
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let spec = self.kind.spec();
        if let Some(calendar) = &self.calendar {
            return write!(
                f,
                "{} {}={} {}={} timezone={}",
                spec.name,
                spec.quota.name(),
                self.quota,
                spec.period.name(),
                calendar.period.name(),
                calendar.timezone.name()
            );
        }
        if self.kind.is_bucket() {
            write!(
                f,
                "{} {}={} {}={:.3}/s",
                spec.name,
                spec.quota.name(),
                self.quota,
                spec.period.name(),
                1_000_000.0 * self.per_us as f64 / self.period as f64
            )
        } else {
            let ms = self.period / 1000;
            let window = match ms {
                ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
                ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
                ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
                ms => format!("{ms}ms"),
            };
            write!(
                f,
                "{} {}={} {}={window}",
                spec.name,
                spec.quota.name(),
                self.quota,
                spec.period.name()
            )
        }
    }
}
