//! What the limiter is asked: one layer of one request, to decide on a store.

use std::fmt;
use std::sync::Arc;

use crate::algorithm::{Algorithm, Decision};
use crate::identity::StateKey;

/// A limit's name as the config spells it: what logs, headers, metrics and
/// Redis keys call the limit. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LimitName(Arc<str>);

impl LimitName {
    pub fn new(name: &str) -> LimitName {
        LimitName(Arc::from(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LimitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so that widths in format strings apply.
        f.pad(&self.0)
    }
}

/// What to do with a decision when the shared store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Decide in process, each limit divided by the number of instances.
    Local,
    /// Fail open.
    Allow,
    /// Fail closed.
    Deny,
}

/// One layer to decide for one request.
#[derive(Debug, Clone)]
pub struct Check {
    /// Index of the limit in the running policy.
    pub layer: usize,
    pub name: LimitName,
    pub algorithm: Algorithm,
    pub key: StateKey,
    pub cost: u64,
    pub shadow: bool,
    /// What decides this layer when the shared store cannot.
    pub on_failure: OnFailure,
}

/// True when no enforcing layer refused.
pub fn admitted(checks: &[Check], decisions: &[Decision]) -> bool {
    checks
        .iter()
        .zip(decisions)
        .all(|(c, d)| c.shadow || d.allowed())
}

/// One slot of a concurrency limit, held under lease `lease_id`.
#[derive(Debug, Clone)]
pub struct Slot {
    pub name: LimitName,
    pub key: StateKey,
    /// Slots per key; at least 1.
    pub max: u64,
    /// How long the slot is held unless renewed or released.
    pub lease_us: u64,
    /// Tells this holder's lease from the others' (random per request).
    pub lease_id: u64,
    /// What decides when the shared store cannot.
    pub on_failure: OnFailure,
}
