//! Why numbers do not make an algorithm, in the config's own terms.

use super::kind::{Kind, Parameter};
use super::ranges::{MAX_SLIDING_LOG, MAX_WINDOW_DAYS};

/// Why numbers do not make an algorithm. Each says what is wrong in the
/// config's own terms (per window, per second, days): the microseconds
/// the arithmetic counts in are no concern of the person who wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AlgorithmError {
    /// The quota (a capacity or a limit) is 0.
    #[error("must be a whole number of at least 1")]
    ZeroQuota,
    /// The period (an interval or a window) is 0.
    #[error("must be at least 1ms")]
    ZeroPeriod,
    /// A window's limit is past what its arithmetic keeps exact.
    #[error("at most {} per window (got {})", grouped(*most), grouped(*got))]
    TooManyPerWindow {
        /// The largest limit this algorithm takes per window.
        most: u64,
        /// The limit given.
        got: u64,
    },
    /// A calendar quota's limit is past what its arithmetic keeps exact.
    #[error("at most {} per period (got {})", grouped(*most), grouped(*got))]
    TooManyPerPeriod {
        /// The largest limit a calendar quota takes (`MAX_COUNT`).
        most: u64,
        /// The limit given.
        got: u64,
    },
    /// A sliding log's limit is past `MAX_SLIDING_LOG`, the stamps one
    /// key may keep.
    #[error("sliding_log keeps one stamp per request: at most {} per window (got {}); use sliding_window for more", grouped(MAX_SLIDING_LOG), grouped(*got))]
    LogTooLong {
        /// The limit given.
        got: u64,
    },
    /// A window is longer than `MAX_WINDOW_DAYS`.
    #[error("must be at most {MAX_WINDOW_DAYS}d (71 years)")]
    WindowTooLong,
    /// A bucket's rate is not a positive number up to `most` a second.
    #[error("must be more than 0 and at most {} per second", grouped(*most))]
    RateOutOfRange {
        /// The fastest rate this algorithm takes, per second.
        most: u64,
    },
    /// A bucket's interval between two units is more than 71 years.
    #[error("too slow: one unit would take more than 71 years")]
    RateTooSlow,
    /// A bucket's capacity is more than its rate refills (or drains)
    /// within 71 years.
    #[error("at most {} at this {} (got {}): {} within 71 years", grouped(*most), rate_name(*kind), grouped(*got), span_name(*kind))]
    TooLargeForRate {
        /// The bucket: token or leaky.
        kind: Kind,
        /// The largest capacity its rate allows.
        most: u64,
        /// The capacity given.
        got: u64,
    },
    /// `Algorithm::new` was asked for a calendar quota, which needs its
    /// calendar.
    #[error("a calendar quota is made with its calendar (Algorithm::calendar_quota)")]
    NeedsCalendar,
}

impl AlgorithmError {
    /// The number of a `kind` limit's config this error is about: its
    /// quota (`limit`, `capacity`) or its period (`window`, a rate).
    pub fn parameter(&self, kind: Kind) -> Parameter {
        let spec = kind.spec();
        match self {
            AlgorithmError::ZeroPeriod
            | AlgorithmError::WindowTooLong
            | AlgorithmError::RateOutOfRange { .. }
            | AlgorithmError::RateTooSlow => spec.period,
            _ => spec.quota,
        }
    }
}

fn rate_name(kind: Kind) -> &'static str {
    kind.spec().period.name()
}

/// What a bucket's capacity and rate make last.
fn span_name(kind: Kind) -> &'static str {
    match kind {
        Kind::LeakyBucket => "a full waiting room must drain",
        _ => "an empty bucket must refill",
    }
}

/// `n` with its thousands grouped by commas, as people write large limits.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
