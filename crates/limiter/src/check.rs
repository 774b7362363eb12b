//! What the limiter is asked: one layer of one request, to decide on a store.

use std::fmt;
use std::sync::Arc;

use floodgate_algorithm::{Algorithm, Decision};

/// Where one layer's state lives: the limit and a fixed-size hash of the
/// client's identity (never the raw value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey {
    /// The limit's state id, derived from its name so that its state
    /// survives a reload that keeps the limit.
    pub limit: u64,
    /// The keyed hash of the client's identity (its key, address, token
    /// claim) under this limit.
    pub identity: u128,
}

impl StateKey {
    /// Which of `shards` maps holds this key (the identity is already a keyed
    /// hash, so no client can aim at a shard).
    pub fn shard(&self, shards: usize) -> usize {
        (self.identity as usize ^ self.limit as usize) % shards
    }
}

/// A limit's name as the config spells it: what logs, headers, metrics and
/// Redis keys call the limit. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LimitName(Arc<str>);

impl LimitName {
    /// The name, copied once; clones share it.
    pub fn new(name: &str) -> LimitName {
        LimitName(Arc::from(name))
    }

    /// The name as the config spells it.
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

impl OnFailure {
    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Local => "local",
            OnFailure::Allow => "allow",
            OnFailure::Deny => "deny",
        }
    }
}

/// Which limit of the running policy a layer belongs to: its place in
/// `Policy::limits` (and in the counters kept beside them). A layer's place
/// among one request's layers is another number (`headers::EnforcedOutcome::position`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitId(pub usize);

impl LimitId {
    /// Its place in `Policy::limits`, for indexing what is kept beside them.
    pub fn index(self) -> usize {
        self.0
    }
}

/// One layer to decide for one request.
#[derive(Debug, Clone)]
pub struct Check {
    /// The limit this layer is of.
    pub limit: LimitId,
    /// The limit's name: what refusals are logged, counted and keyed in
    /// Redis by.
    pub name: LimitName,
    /// The limit's algorithm and numbers, for this client's tier.
    pub algorithm: Algorithm,
    /// Where this client's state of the limit lives.
    pub key: StateKey,
    /// Units the request spends of the limit (1 unless the limit sets a
    /// cost); 0 decides without charging.
    pub cost: u64,
    /// Whether the layer's refusal refuses the request.
    pub enforcement: Enforcement,
    /// Whether deciding the layer charges it.
    pub spending: Spending,
    /// What decides this layer when the shared store cannot.
    pub on_failure: OnFailure,
    /// Whether the layer may be decided from a lease this instance holds.
    pub leasing: Leasing,
}

/// Whether a layer's refusal refuses the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// A refusal refuses the request.
    Enforce,
    /// Decided, logged and counted, never refusing: a shadow layer's
    /// refusal leaves the request admitted.
    Shadow,
}

/// Whether deciding a layer charges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spending {
    /// Decided and, when allowed, charged its cost.
    Charge,
    /// Decided like any layer (an enforcing one can refuse the request) and
    /// never charged: a ban looked up, a limit charged by the response
    /// checked before it.
    Peek,
}

/// Whether a layer may be decided from a lease this instance holds
/// (`Leased`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leasing {
    /// May be decided from a lease: the limit leases and its algorithm can
    /// be leased.
    Allowed,
    /// Always decided where the budget is, never from or into a lease.
    Never,
}

/// A lease asked for beside a layer's decision: at most `max` units, and
/// at most what the request leaves divided by `divisor`
/// (`algorithm::lease_units`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    /// The most units the lease may take.
    pub max: u64,
    /// What the request leaves is divided by this (twice the instances
    /// sharing the budget), so that no instance leases it all.
    pub divisor: u64,
    /// The longest the lease will be used, from when it was asked for: a
    /// token bucket's ledger counts its units until then (in epochs this
    /// long, `algorithm::ledger`), and leases none when it is 0.
    pub life_us: u64,
}

/// True when no enforcing layer refused.
pub fn admitted(checks: &[Check], decisions: &[Decision]) -> bool {
    checks
        .iter()
        .zip(decisions)
        .all(|(c, d)| c.enforcement == Enforcement::Shadow || d.allowed())
}

/// The longest lease a slot may have: about 12 days, so that an expiry
/// instant stays exact in the scripts' doubles.
pub const MAX_LEASE_US: u64 = 1 << 40;

/// Why numbers do not make a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// `max` is 0.
    #[error("a concurrency limit needs at least 1 slot")]
    NoSlots,
    /// The lease is 0 µs or longer than `MAX_LEASE_US`.
    #[error("a lease must last from 1µs to {MAX_LEASE_US}µs")]
    Lease,
}

/// One slot of a concurrency limit, held under a lease: valid by
/// construction (at least one slot, a lease the arithmetic can hold).
#[derive(Debug, Clone)]
pub struct Slot {
    name: LimitName,
    key: StateKey,
    max: u64,
    lease_us: u64,
    lease_id: u64,
    on_failure: OnFailure,
}

impl Slot {
    /// `max` slots per key; the slot is held for `lease_us` unless renewed
    /// or released; `lease_id` tells this holder from the others (random
    /// per request).
    pub fn new(
        name: LimitName,
        key: StateKey,
        max: u64,
        lease_us: u64,
        lease_id: u64,
        on_failure: OnFailure,
    ) -> Result<Slot, SlotError> {
        if max == 0 {
            return Err(SlotError::NoSlots);
        }
        if lease_us == 0 || lease_us > MAX_LEASE_US {
            return Err(SlotError::Lease);
        }
        Ok(Slot {
            name,
            key,
            max,
            lease_us,
            lease_id,
            on_failure,
        })
    }

    /// The concurrency limit's name.
    pub fn name(&self) -> &LimitName {
        &self.name
    }

    /// Where this client's slots of the limit live.
    pub fn key(&self) -> &StateKey {
        &self.key
    }

    /// Requests this client may have in flight under the limit.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// How long the slot is held, in µs, unless renewed or released.
    pub fn lease_us(&self) -> u64 {
        self.lease_us
    }

    /// Tells this holder's slot from the others' (random per request).
    pub fn lease_id(&self) -> u64 {
        self.lease_id
    }

    /// What decides when the shared store cannot.
    pub fn on_failure(&self) -> OnFailure {
        self.on_failure
    }

    /// The same lease on this instance's share of the slots (at least one)
    /// when `instances` share them without a common store.
    pub fn share(&self, instances: u64) -> Slot {
        Slot {
            max: (self.max / instances.max(1)).max(1),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_needs_a_slot_and_a_lease_the_scripts_can_hold() {
        let make = |max, lease_us| {
            let key = StateKey {
                limit: 1,
                identity: 1,
            };
            Slot::new(LimitName::new("x"), key, max, lease_us, 7, OnFailure::Deny).map(|s| s.max())
        };
        assert_eq!(make(0, 1), Err(SlotError::NoSlots));
        assert_eq!(make(1, 0), Err(SlotError::Lease));
        assert_eq!(make(1, MAX_LEASE_US + 1), Err(SlotError::Lease));
        assert_eq!(make(3, MAX_LEASE_US), Ok(3));
    }
}
