//! Per-key state, and how an admitted change is written to it.

use super::decision::{Ledger, Update};
use super::sliding_log::LogState;

/// Per-key state of one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Token and leaky bucket: the theoretical arrival time (GCRA), and
    /// the fraction of a µs past it in picoseconds (below 10^6; 0 but for a
    /// token bucket whose interval is a fraction of a µs).
    Gcra {
        /// The theoretical arrival time, µs since the epoch: when a token
        /// bucket is full again, when a leaky bucket's next slot is free.
        tat_us: u64,
        /// Picoseconds past `tat_us`.
        tat_ps: u64,
        /// A token bucket's leases outstanding (`crate::ledger`).
        ledger: Ledger,
    },
    /// Fixed window: the window's start and its count.
    Window {
        /// The window's start, µs since the epoch.
        start_us: u64,
        /// Units admitted in it.
        count: u64,
    },
    /// Sliding window counter.
    TwoWindows {
        /// The current window's start, µs since the epoch.
        start_us: u64,
        /// Units admitted in the current window.
        current: u64,
        /// Units admitted in the window before it.
        previous: u64,
    },
    /// Calendar quota: the period's end and its count.
    Period {
        /// Where the period ends, µs since the epoch.
        end_us: u64,
        /// Units admitted in it.
        count: u64,
    },
    /// Sliding log: admitted stamps inside the window.
    Log(LogState),
}

impl State {
    /// Writes what `evaluate` decided; a no-op for a refusal or a peek.
    pub fn apply(&mut self, update: &Update) {
        match (self, update) {
            (_, Update::Unchanged) => {}
            (
                state,
                &Update::Gcra {
                    tat_us,
                    tat_ps,
                    ledger,
                },
            ) => {
                *state = State::Gcra {
                    tat_us,
                    tat_ps,
                    ledger,
                }
            }
            (state, Update::Window { start_us, count }) => {
                *state = State::Window {
                    start_us: *start_us,
                    count: *count,
                }
            }
            (state, Update::Period { end_us, count }) => {
                *state = State::Period {
                    end_us: *end_us,
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
            (State::Log(log), Update::LogRemove { stamp_us, units }) => {
                log.remove(*stamp_us, *units);
            }
            (_, Update::LogRemove { .. }) => {}
        }
    }
}
