//! The five rate-limiting algorithms as pure arithmetic over an injected time.
//!
//! Each algorithm is split into `evaluate` (read the state, decide, describe the
//! change) and `apply` (write the change). The split is what lets a request's
//! layers be decided all-or-nothing: every layer is evaluated first, and the
//! changes are applied only when every enforcing layer admitted the request.
//!
//! Time is integer microseconds and every quantity an integer, so that the Lua
//! scripts (whose numbers are doubles, exact below 2^53) reproduce each decision
//! bit for bit; `config` bounds the parameters to keep products under 2^53.

pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

pub use sliding_log::LogState;

/// The largest product of two quantities any algorithm forms; Lua doubles stay
/// exact below it.
pub const MAX_EXACT: u64 = 1 << 53;

/// Which algorithm a limit uses, with its validated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Bursts up to `capacity`, refilled one token every `interval_us`.
    TokenBucket { capacity: u64, interval_us: u64 },
    /// Requests leave one every `interval_us`; up to `capacity` may wait.
    LeakyBucket { capacity: u64, interval_us: u64 },
    /// At most `limit` per aligned window.
    FixedWindow { limit: u64, window_us: u64 },
    /// Weighted estimate over the current and previous window.
    SlidingWindow { limit: u64, window_us: u64 },
    /// Exactly at most `limit` in any window of `window_us`.
    SlidingLog { limit: u64, window_us: u64 },
}

impl Algorithm {
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
        }
    }

    /// The number a client sees as its quota (`RateLimit-Limit`, `q=`).
    pub fn quota(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, .. } | Algorithm::LeakyBucket { capacity, .. } => {
                capacity
            }
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. } => limit,
        }
    }

    /// The quota's time window in microseconds (`w=`): for the buckets, the time
    /// to refill from empty.
    pub fn window_us(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket {
                capacity,
                interval_us,
            }
            | Algorithm::LeakyBucket {
                capacity,
                interval_us,
            } => capacity.saturating_mul(interval_us),
            Algorithm::FixedWindow { window_us, .. }
            | Algorithm::SlidingWindow { window_us, .. }
            | Algorithm::SlidingLog { window_us, .. } => window_us,
        }
    }

    /// This limit shared evenly by `instances` processes deciding alone: each
    /// gets its share of the quota (at least 1) and of the rate.
    pub fn divided(&self, instances: u64) -> Algorithm {
        let n = instances.max(1);
        let share = |q: u64| (q / n).max(1);
        match *self {
            Algorithm::TokenBucket {
                capacity,
                interval_us,
            } => Algorithm::TokenBucket {
                capacity: share(capacity),
                interval_us: interval_us.saturating_mul(n),
            },
            Algorithm::LeakyBucket {
                capacity,
                interval_us,
            } => Algorithm::LeakyBucket {
                capacity: share(capacity),
                interval_us: interval_us.saturating_mul(n),
            },
            Algorithm::FixedWindow { limit, window_us } => Algorithm::FixedWindow {
                limit: share(limit),
                window_us,
            },
            Algorithm::SlidingWindow { limit, window_us } => Algorithm::SlidingWindow {
                limit: share(limit),
                window_us,
            },
            Algorithm::SlidingLog { limit, window_us } => Algorithm::SlidingLog {
                limit: share(limit),
                window_us,
            },
        }
    }

    /// A fresh state for this algorithm (what a key that was never seen holds).
    pub fn fresh_state(&self) -> State {
        match self {
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => {
                State::Gcra { tat_us: 0 }
            }
            Algorithm::FixedWindow { .. } => State::Window {
                start_us: 0,
                count: 0,
            },
            Algorithm::SlidingWindow { .. } => State::TwoWindows {
                start_us: 0,
                current: 0,
                previous: 0,
            },
            Algorithm::SlidingLog { .. } => State::Log(LogState::default()),
        }
    }

    /// Decides a request of `cost` at `now_us` against `state` without changing it.
    ///
    /// A state of the wrong shape (a limit whose algorithm changed on reload) is
    /// treated as fresh.
    pub fn evaluate(&self, state: &State, now_us: u64, cost: u64) -> Evaluation {
        match (*self, state) {
            (
                Algorithm::TokenBucket {
                    capacity,
                    interval_us,
                },
                State::Gcra { tat_us },
            ) => token_bucket::evaluate(capacity, interval_us, *tat_us, now_us, cost),
            (
                Algorithm::LeakyBucket {
                    capacity,
                    interval_us,
                },
                State::Gcra { tat_us },
            ) => leaky_bucket::evaluate(capacity, interval_us, *tat_us, now_us, cost),
            (Algorithm::FixedWindow { limit, window_us }, State::Window { start_us, count }) => {
                fixed_window::evaluate(limit, window_us, *start_us, *count, now_us, cost)
            }
            (
                Algorithm::SlidingWindow { limit, window_us },
                State::TwoWindows {
                    start_us,
                    current,
                    previous,
                },
            ) => sliding_window::evaluate(
                limit, window_us, *start_us, *current, *previous, now_us, cost,
            ),
            (Algorithm::SlidingLog { limit, window_us }, State::Log(log)) => {
                sliding_log::evaluate(limit, window_us, log, now_us, cost)
            }
            _ => self.evaluate(&self.fresh_state(), now_us, cost),
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per_second = |interval_us: u64| 1_000_000.0 / interval_us as f64;
        match *self {
            Algorithm::TokenBucket {
                capacity,
                interval_us,
            } => write!(
                f,
                "token_bucket capacity={capacity} refill_rate={:.3}/s",
                per_second(interval_us)
            ),
            Algorithm::LeakyBucket {
                capacity,
                interval_us,
            } => write!(
                f,
                "leaky_bucket capacity={capacity} rate={:.3}/s",
                per_second(interval_us)
            ),
            _ => {
                let ms = self.window_us() / 1000;
                let window = match ms {
                    ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
                    ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
                    ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
                    ms => format!("{ms}ms"),
                };
                write!(f, "{} limit={} window={window}", self.name(), self.quota())
            }
        }
    }
}

/// Per-key state of one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Token and leaky bucket: the theoretical arrival time (GCRA).
    Gcra { tat_us: u64 },
    /// Fixed window: the window's start and its count.
    Window { start_us: u64, count: u64 },
    /// Sliding window counter.
    TwoWindows {
        start_us: u64,
        current: u64,
        previous: u64,
    },
    /// Sliding log: admitted stamps inside the window.
    Log(LogState),
}

impl State {
    /// Writes what `evaluate` decided; a no-op for a refusal or a peek.
    pub fn apply(&mut self, update: &Update) {
        match (self, update) {
            (_, Update::Unchanged) => {}
            (state, Update::Gcra { tat_us }) => *state = State::Gcra { tat_us: *tat_us },
            (state, Update::Window { start_us, count }) => {
                *state = State::Window {
                    start_us: *start_us,
                    count: *count,
                }
            }
            (
                state,
                Update::TwoWindows {
                    start_us,
                    current,
                    previous,
                },
            ) => {
                *state = State::TwoWindows {
                    start_us: *start_us,
                    current: *current,
                    previous: *previous,
                }
            }
            (
                State::Log(log),
                Update::LogAppend {
                    now_us,
                    cost,
                    window_us,
                },
            ) => log.append(*now_us, *cost, *window_us),
            (
                state,
                Update::LogAppend {
                    now_us,
                    cost,
                    window_us,
                },
            ) => {
                let mut log = LogState::default();
                log.append(*now_us, *cost, *window_us);
                *state = State::Log(log);
            }
        }
    }
}

/// The change an admitted request makes to its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    Unchanged,
    Gcra {
        tat_us: u64,
    },
    Window {
        start_us: u64,
        count: u64,
    },
    TwoWindows {
        start_us: u64,
        current: u64,
        previous: u64,
    },
    LogAppend {
        now_us: u64,
        cost: u64,
        window_us: u64,
    },
}

/// What one limit says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The request can never be admitted: its cost exceeds the limit itself.
    pub cost_exceeds_limit: bool,
    pub limit: u64,
    /// Units left after this request (before it, when refused).
    pub remaining: u64,
    /// Until the quota is whole again.
    pub reset_after_us: u64,
    /// Until the same request would be admitted; 0 when allowed.
    pub retry_after_us: u64,
    /// Leaky bucket only: how long the admitted request waits for its slot.
    pub delay_us: u64,
}

/// A decision plus the state change it implies and when the state goes stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation {
    pub decision: Decision,
    pub update: Update,
    /// From this instant on, the (updated) state is indistinguishable from a
    /// fresh one and may be dropped.
    pub idle_at_us: u64,
}

impl Evaluation {
    fn refused(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        retry_after_us: u64,
        idle_at_us: u64,
    ) -> Self {
        Evaluation {
            decision: Decision {
                allowed: false,
                cost_exceeds_limit: false,
                limit,
                remaining,
                reset_after_us,
                retry_after_us,
                delay_us: 0,
            },
            update: Update::Unchanged,
            idle_at_us,
        }
    }

    fn oversized(limit: u64, remaining: u64, reset_after_us: u64, idle_at_us: u64) -> Self {
        let mut e = Self::refused(limit, remaining, reset_after_us, 0, idle_at_us);
        e.decision.cost_exceeds_limit = true;
        e
    }

    fn admitted(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        update: Update,
        idle_at_us: u64,
    ) -> Self {
        Evaluation {
            decision: Decision {
                allowed: true,
                cost_exceeds_limit: false,
                limit,
                remaining,
                reset_after_us,
                retry_after_us: 0,
                delay_us: 0,
            },
            update,
            idle_at_us,
        }
    }
}

#[cfg(test)]
mod tests;
