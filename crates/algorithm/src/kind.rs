//! The one table of algorithms: config reads names and parameters from it,
//! `floodgate check` and the docs its summaries, the Redis script its codes.

/// Which algorithm a limit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `token_bucket`: a burst of `capacity`, refilled at `refill_rate`.
    TokenBucket,
    /// `sliding_window`: `limit` per `window`, the previous window weighed
    /// by its share still in view.
    SlidingWindow,
    /// `fixed_window`: `limit` per window aligned to multiples of `window`.
    FixedWindow,
    /// `sliding_log`: exactly at most `limit` in any `window`, one stamp
    /// kept per admission.
    SlidingLog,
    /// `leaky_bucket`: requests delayed to leave at `rate`, up to
    /// `capacity` waiting.
    LeakyBucket,
    /// `quota`: `limit` per calendar `period` in a time zone.
    Quota,
}

/// A number a limit's config gives its algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parameter {
    /// Whole units a bucket holds.
    Capacity,
    /// Whole units per window.
    Limit,
    /// Tokens back per second (a token bucket's period, inverted).
    RefillRate,
    /// Departures per second (a leaky bucket's period, inverted).
    Rate,
    /// A duration ("1m").
    Window,
    /// A calendar period ("day", "week", "month").
    Period,
}

impl Parameter {
    /// In the order config reports a parameter that does not apply.
    pub const ALL: [Parameter; 6] = [
        Parameter::Limit,
        Parameter::Window,
        Parameter::Period,
        Parameter::Capacity,
        Parameter::RefillRate,
        Parameter::Rate,
    ];

    /// The key the config gives it (`"refill_rate"`).
    pub fn name(self) -> &'static str {
        match self {
            Parameter::Capacity => "capacity",
            Parameter::Limit => "limit",
            Parameter::RefillRate => "refill_rate",
            Parameter::Rate => "rate",
            Parameter::Window => "window",
            Parameter::Period => "period",
        }
    }
}

/// One row of the table.
#[derive(Debug)]
pub struct Spec {
    /// The algorithm this row describes.
    pub kind: Kind,
    /// As the config spells it.
    pub name: &'static str,
    /// As the Redis script knows it (prepended to the script from here).
    pub code: u8,
    /// The parameter that gives the quota.
    pub quota: Parameter,
    /// The parameter that gives the period (a rate per second, a window or
    /// a calendar period).
    pub period: Parameter,
    /// What it guarantees: the book's algorithm table (docs/book/algorithms.md) says exactly this
    /// (a test compares them).
    pub summary: &'static str,
    /// The numbers it takes, as the book's table gives them (the ranges
    /// `Algorithm`'s constructors check; a test compares them too).
    pub range: &'static str,
}

/// Every algorithm, in the order config's error messages list them.
pub const ALGORITHMS: [Spec; 6] = [
    Spec {
        kind: Kind::TokenBucket,
        name: "token_bucket",
        code: 1,
        quota: Parameter::Capacity,
        period: Parameter::RefillRate,
        summary: "bursts up to `capacity`, then `refill_rate` per second on average",
        range: "`refill_rate` up to 10,000,000 per second; `capacity` up to 4,294,967,295 and beyond while an empty bucket refills within 71 years (4,294,967,295 needs 1.91 per second; one a year, 71)",
    },
    Spec {
        kind: Kind::SlidingWindow,
        name: "sliding_window",
        code: 4,
        quota: Parameter::Limit,
        period: Parameter::Window,
        summary: "estimate `current + previous × (1 − elapsed/window)` ≤ `limit`; no double burst at edges, approximate by at most the previous window's share",
        range: "`limit` up to 4,294,967,295 per window; `window` 1ms to 26062d",
    },
    Spec {
        kind: Kind::FixedWindow,
        name: "fixed_window",
        code: 3,
        quota: Parameter::Limit,
        period: Parameter::Window,
        summary: "at most `limit` per aligned window; up to 2 × `limit` across a window edge",
        range: "`limit` up to 2,251,799,813,685,248 per window; `window` 1ms to 26062d",
    },
    Spec {
        kind: Kind::SlidingLog,
        name: "sliding_log",
        code: 5,
        quota: Parameter::Limit,
        period: Parameter::Window,
        summary: "exact: at most `limit` in any `window`; keeps one stamp per admitted request, so `limit` is capped at 100000",
        range: "`limit` up to 100,000 per window; `window` 1ms to 26062d",
    },
    Spec {
        kind: Kind::LeakyBucket,
        name: "leaky_bucket",
        code: 2,
        quota: Parameter::Capacity,
        period: Parameter::Rate,
        summary: "requests leave at most `rate` per second, evenly spaced; up to `capacity` wait for their slot (the proxy holds them), beyond that 429 at once",
        range: "`rate` up to 1,000,000 per second; `capacity` while a full waiting room drains within 71 years",
    },
    Spec {
        kind: Kind::Quota,
        name: "quota",
        code: 6,
        quota: Parameter::Limit,
        period: Parameter::Period,
        summary: "at most `limit` per calendar `day`, `week` or `month` in `timezone` (default UTC; weeks start on `week_starts`, default monday); resets at local midnight of the period's first day",
        range: "`limit` up to 2,251,799,813,685,248 per period",
    },
];

/// The algorithms' names, in the table's order.
pub const ALGORITHM_NAMES: [&str; ALGORITHMS.len()] = {
    let mut names = [""; ALGORITHMS.len()];
    let mut i = 0;
    while i < ALGORITHMS.len() {
        names[i] = ALGORITHMS[i].name;
        i += 1;
    }
    names
};

impl Kind {
    /// Its row of `ALGORITHMS`.
    pub fn spec(self) -> &'static Spec {
        // The table is in the enum's order (checked by a test).
        &ALGORITHMS[self as usize]
    }

    /// As the config spells it (`"token_bucket"`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// As the Redis script knows it.
    pub fn code(self) -> u8 {
        self.spec().code
    }

    /// The algorithm a config name (one of `ALGORITHM_NAMES`) means; none
    /// for any other.
    pub fn from_name(name: &str) -> Option<Kind> {
        ALGORITHMS.iter().find(|s| s.name == name).map(|s| s.kind)
    }

    /// Whether the period is an interval between units (a bucket) rather
    /// than a window.
    pub fn is_bucket(self) -> bool {
        matches!(self.spec().period, Parameter::RefillRate | Parameter::Rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The book's row for an algorithm, as the table describes it.
    fn book_row(spec: &Spec) -> String {
        let per_second = if matches!(spec.period, Parameter::RefillRate | Parameter::Rate) {
            " (per second)"
        } else {
            ""
        };
        format!(
            "| `{}` | `{}`, `{}`{per_second} | {} | {} |",
            spec.name,
            spec.quota.name(),
            spec.period.name(),
            spec.summary,
            spec.range
        )
    }

    #[test]
    fn the_book_describes_every_algorithm_as_the_table_does() {
        let book = include_str!("../../../docs/book/algorithms.md");
        for spec in &ALGORITHMS {
            let row = book_row(spec);
            assert!(
                book.lines().any(|l| l == row),
                "docs/book/algorithms.md lacks:\n{row}"
            );
        }
    }

    #[test]
    fn the_table_is_in_the_enums_order_with_distinct_names_and_codes() {
        for (i, spec) in ALGORITHMS.iter().enumerate() {
            assert_eq!(spec.kind as usize, i, "{}", spec.name);
            assert_eq!(ALGORITHM_NAMES[i], spec.name);
            assert_eq!(spec.kind.code(), spec.code);
            assert_eq!(Kind::from_name(spec.name), Some(spec.kind));
            for other in &ALGORITHMS[i + 1..] {
                assert_ne!(spec.code, other.code);
                assert_ne!(spec.name, other.name);
            }
        }
    }
}
