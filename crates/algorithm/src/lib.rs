//! The rate-limiting algorithms as pure arithmetic over an injected time,
//! and the slots of concurrency limits.
//!
//! Each algorithm is split into `evaluate` (read the state, decide, describe the
//! change) and `apply` (write the change). The split is what lets a request's
//! layers be decided all-or-nothing: every layer is evaluated first, and the
//! changes are applied only when every enforcing layer admitted the request.
//!
//! Time is integer microseconds (a token bucket's may be a decimal fraction
//! of one) and every quantity an integer, so that the Lua scripts (whose
//! numbers are doubles, exact below 2^53) reproduce each decision bit for
//! bit; an `Algorithm` cannot be built with numbers that break this.
//!
//! This crate depends on no other part of floodgate, and Cargo holds it to
//! that: its manifest names none.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

mod algorithm_error;
pub mod calendar;
pub mod concurrency;
mod credit;
mod decision;
pub mod fixed_window;
mod kind;
pub mod leaky_bucket;
mod lease;
pub mod ledger;
pub mod quota;
mod ranges;
pub mod sliding_log;
pub mod sliding_window;
mod state;
pub mod token_bucket;
mod validated;

pub use algorithm_error::{grouped, AlgorithmError};
pub use calendar::{Calendar, Period};
pub use concurrency::Slots;
pub use credit::takes_credit;
pub use decision::{Decision, Evaluation, Update};
pub use kind::{Kind, Parameter, Spec, ALGORITHMS, ALGORITHM_NAMES};
pub use lease::{lease_units, takes_lease};
pub use ledger::Ledger;
pub use ranges::{
    MAX_COUNT, MAX_EXACT, MAX_LEAK_PER_SECOND, MAX_REFILL_PER_SECOND, MAX_SCALED, MAX_SLIDING_LOG,
    MAX_SLIDING_WINDOW, MAX_WINDOW_DAYS, MAX_WINDOW_US,
};
pub use sliding_log::LogState;
pub use state::State;
pub use validated::Algorithm;

#[cfg(test)]
mod tests;
