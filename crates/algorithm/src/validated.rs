//! An algorithm with its numbers, checked once so that the arithmetic never
//! meets a zero divisor or an inexact product.

use super::calendar::Calendar;
use super::decision::Evaluation;
use super::kind::Kind;
use super::sliding_log::LogState;
use super::state::State;
use super::{credit, fixed_window, leaky_bucket, quota, sliding_log, sliding_window, token_bucket};

/// The largest product of two quantities any algorithm forms; Lua doubles stay
/// exact below it.
pub const MAX_EXACT: u64 = 1 << 53;

/// The most units a sliding log may hold: it keeps one stamp per request.
pub const MAX_SLIDING_LOG: u64 = 100_000;

/// Why numbers do not make an algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AlgorithmError {
    #[error("must be a whole number of at least 1")]
    ZeroQuota,
    #[error("the interval or window must be at least 1µs")]
    ZeroPeriod,
    #[error("too large: the quota times its window in microseconds must stay below 2^51")]
    TooLarge,
    #[error("sliding_log keeps one stamp per request; use at most {MAX_SLIDING_LOG} (or sliding_window)")]
    LogTooLong,
    #[error("a calendar quota is made with its calendar (Algorithm::calendar_quota)")]
    NeedsCalendar,
}

/// One limit's algorithm with its numbers, valid by construction: a quota of
/// at least 1, a period of at least 1µs, and every product the arithmetic
/// forms exact in a double.
///
/// `quota` is the bucket's capacity or the window's limit; `period_us` the
/// interval between two tokens (buckets), the window's length, or a
/// calendar period's usual length (the calendar says where it really ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algorithm {
    kind: Kind,
    quota: u64,
    period_us: u64,
    calendar: Option<Calendar>,
}

impl Algorithm {
    pub fn new(kind: Kind, quota: u64, period_us: u64) -> Result<Algorithm, AlgorithmError> {
        if quota == 0 {
            return Err(AlgorithmError::ZeroQuota);
        }
        if period_us == 0 {
            return Err(AlgorithmError::ZeroPeriod);
        }
        if kind == Kind::Quota {
            return Err(AlgorithmError::NeedsCalendar);
        }
        if kind == Kind::SlidingLog && quota > MAX_SLIDING_LOG {
            return Err(AlgorithmError::LogTooLong);
        }
        // The scripts compute in doubles: every product, added to a
        // timestamp, must stay exact.
        if quota
            .checked_mul(period_us)
            .is_none_or(|p| p > MAX_EXACT / 4)
        {
            return Err(AlgorithmError::TooLarge);
        }
        Ok(Algorithm {
            kind,
            quota,
            period_us,
            calendar: None,
        })
    }

    /// At most `limit` per period of `calendar`. No product of two
    /// quantities is formed, so only the limit itself is bounded.
    pub fn calendar_quota(limit: u64, calendar: Calendar) -> Result<Algorithm, AlgorithmError> {
        if limit == 0 {
            return Err(AlgorithmError::ZeroQuota);
        }
        if limit > MAX_EXACT / 4 {
            return Err(AlgorithmError::TooLarge);
        }
        Ok(Algorithm {
            kind: Kind::Quota,
            quota: limit,
            period_us: calendar.period.nominal_us(),
            calendar: Some(calendar),
        })
    }

    /// Bursts up to `capacity`, one token back every `interval_us`.
    pub fn token_bucket(capacity: u64, interval_us: u64) -> Result<Algorithm, AlgorithmError> {
        Algorithm::new(Kind::TokenBucket, capacity, interval_us)
    }

    /// Requests leave one every `interval_us`; up to `capacity` may wait.
    pub fn leaky_bucket(capacity: u64, interval_us: u64) -> Result<Algorithm, AlgorithmError> {
        Algorithm::new(Kind::LeakyBucket, capacity, interval_us)
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

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The number a client sees as its quota (`RateLimit-Limit`, `q=`): the
    /// capacity of a bucket, the limit of a window.
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// A bucket's interval between two tokens, a window's length, or a
    /// calendar period's usual length.
    pub fn period_us(&self) -> u64 {
        self.period_us
    }

    pub fn calendar(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// The second number the Redis script takes for this algorithm at
    /// `now_us`: the period, or for a calendar quota where the current
    /// period ends (the script cannot read a zone's rules).
    pub fn script_period_at(&self, now_us: u64) -> u64 {
        match &self.calendar {
            Some(calendar) => calendar.period_end_us(now_us),
            None => self.period_us,
        }
    }

    /// The same limit without its ceiling, on the same state: a cost
    /// decided against it is charged whatever is left, so the balance may
    /// go below zero (a cost the response reports is owed, not asked for).
    /// What remains of a ceiling keeps the arithmetic exact: 2^51 units for
    /// a window or a quota, whose counts are only added; 2^51 µs of debt
    /// (71 years) for a bucket. A sliding window multiplies its counts by
    /// its window, so its ceiling would be low enough to be reached: it is
    /// not offered this (`owes_costs`).
    pub fn without_ceiling(&self) -> Algorithm {
        let quota = match self.kind {
            Kind::FixedWindow | Kind::Quota => MAX_EXACT / 4,
            _ => (MAX_EXACT / 4 / self.period_us).max(1),
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
        match credit::credited(
            self.kind,
            self.period_us,
            period_end_us,
            state,
            now_us,
            units,
        ) {
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
        match credit::refunded(
            self.kind,
            self.period_us,
            state,
            now_us,
            units,
            counted_at_us,
        ) {
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
    /// to refill from empty.
    pub fn window_us(&self) -> u64 {
        if self.kind.is_bucket() {
            self.quota * self.period_us
        } else {
            self.period_us
        }
    }

    /// This limit shared evenly by `instances` processes deciding alone: each
    /// gets its share of the quota (at least 1) and of the rate. A bucket
    /// whose quota is smaller than `instances` keeps 1 token and a rate
    /// divided as the others; only a rate already slower than one token per
    /// 2^51 / quota µs stops being divided, to keep the arithmetic exact.
    pub fn divided(&self, instances: u64) -> Algorithm {
        let n = instances.max(1);
        let quota = (self.quota / n).max(1);
        let period_us = if self.kind.is_bucket() {
            // Within what `new` accepts for this quota.
            self.period_us.saturating_mul(n).min(MAX_EXACT / 4 / quota)
        } else {
            self.period_us
        };
        Algorithm {
            quota,
            period_us,
            ..*self
        }
    }

    /// A fresh state for this algorithm (what a key that was never seen holds).
    pub fn fresh_state(&self) -> State {
        match self.kind {
            Kind::TokenBucket | Kind::LeakyBucket => State::Gcra { tat_us: 0 },
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
        let (quota, period) = (self.quota, self.period_us);
        match (self.kind, state) {
            (Kind::TokenBucket, State::Gcra { tat_us }) => {
                token_bucket::evaluate(quota, period, *tat_us, now_us, cost)
            }
            (Kind::LeakyBucket, State::Gcra { tat_us }) => {
                leaky_bucket::evaluate(quota, period, *tat_us, now_us, cost)
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
                1_000_000.0 / self.period_us as f64
            )
        } else {
            let ms = self.period_us / 1000;
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
