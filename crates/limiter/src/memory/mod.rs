//! In-process limit state: the whole store without Redis, the fallback with it.
//!
//! Keys live in sharded LRU maps, at most `max_keys` in all. A key is
//! inserted only when a request it admits changes its state. State that has
//! gone idle (indistinguishable from fresh) is treated as absent at once and
//! dropped by `sweep` or when its room is needed.
//!
//! Eviction never resets a live limit: only idle state is ever dropped. When
//! a shard is full of live state, a new identity does not displace anyone:
//! it is decided against its limit's one shared overflow bucket (the limit's
//! own numbers), so a flood of made-up identities competes only with itself
//! and with other newcomers while the flood lasts. Memory is bounded by
//! `max_keys` entries plus one overflow entry per limit.
//!
//! The parts: a request decided on the shards it touches (`decide`), the
//! room a new key finds (`room`), and the concurrency limits' slots
//! (`slots`).

mod decide;
mod room;
mod slots;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use lru::LruCache;
use prometheus::IntCounter;
use smallvec::SmallVec;

use super::check::{Check, LeaseAsk, Slot, Spending, StateKey};
use super::error::LimiterError;
use super::store::{Concurrency, Deciding, Store, Upkeep};
use crate::clock::Clock;
use crate::log_throttle::LogThrottle;
use crate::watch::{self, Answerer};
use floodgate_algorithm::{Decision, Evaluation, Slots, State};

const SHARDS: usize = 64;

/// At most one overflow warning per this long.
const OVERFLOW_LOG_INTERVAL: Duration = Duration::from_secs(60);

struct Entry {
    state: State,
    idle_at_us: u64,
}

type Shard = LruCache<StateKey, Entry>;

/// The memory store: limit state and slots in this process, at most
/// `max_keys` keys, decided without a call out.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// One entry per limit id, for identities that found no room. Locked
    /// after the shards, never before.
    overflow: Mutex<HashMap<u64, Entry>>,
    overflow_decisions: AtomicU64,
    overflow_log: LogThrottle,
    /// Exported as `floodgate_local_overflow_decisions_total`.
    overflow_metric: Option<IntCounter>,
    /// Concurrency limits' leases. A key is here only while a lease on it
    /// is held (or until its expiry is noticed), so this follows the
    /// requests in flight, not the clients ever seen.
    slots: Box<[Mutex<HashMap<StateKey, Slots>>]>,
    clock: Arc<dyn Clock>,
}

impl MemoryStore {
    /// Holds at most `max_keys` keys (rounded down to a multiple of the shard
    /// count, at least one per shard).
    pub fn new(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        let shard_count = SHARDS.min(max_keys.max(1));
        let per_shard = std::num::NonZeroUsize::new((max_keys / shard_count).max(1))
            .unwrap_or(std::num::NonZeroUsize::MIN);
        let shards = (0..shard_count)
            .map(|_| Mutex::new(LruCache::new(per_shard)))
            .collect();
        MemoryStore {
            shards,
            overflow: Mutex::new(HashMap::new()),
            overflow_decisions: AtomicU64::new(0),
            overflow_log: LogThrottle::new(OVERFLOW_LOG_INTERVAL),
            overflow_metric: None,
            slots: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            clock,
        }
    }

    /// Also counts overflow decisions in `metric`.
    pub fn with_overflow_metric(mut self, metric: IntCounter) -> Self {
        self.overflow_metric = Some(metric);
        self
    }

    /// Decisions made against an overflow bucket since start.
    pub fn overflow_decisions(&self) -> u64 {
        self.overflow_decisions.load(Ordering::Relaxed)
    }

    fn lock_overflow(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.overflow
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        // A panic while holding a shard cannot leave an entry half-written
        // (entries are replaced whole), so a poisoned lock is still usable.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Decides at the clock's current time.
    pub fn decide_now(&self, checks: &[Check]) -> Vec<Decision> {
        self.decide_at(checks, self.clock.now_us())
    }

    /// Decides all checks atomically with respect to other callers: the shards
    /// involved are locked in ascending order (so callers cannot deadlock),
    /// then the overflow map if needed, for the evaluation and the update
    /// together.
    pub fn decide_at(&self, checks: &[Check], now_us: u64) -> Vec<Decision> {
        self.decide_leasing_at(checks, &[], now_us).0
    }

    /// Gives `check.cost` units back to the key's state, if it has any
    /// live; the key as a request of cost 0 sees it after. A key without
    /// state of its own is left as it is: fresh, or deciding on its
    /// limit's shared overflow entry, which is no one client's to credit.
    pub fn credit_at(&self, check: &Check, now_us: u64) -> Decision {
        let mut shard = self.lock(check.key.shard(self.shards.len()));
        let Some(entry) = shard.get_mut(&check.key) else {
            drop(shard);
            let as_is = Check {
                cost: 0,
                spending: Spending::Peek,
                ..check.clone()
            };
            return self.peek_at(std::slice::from_ref(&as_is), now_us)[0];
        };
        let fresh;
        let state = if entry.idle_at_us > now_us {
            &entry.state
        } else {
            fresh = check.algorithm.fresh_state();
            &fresh
        };
        let credited = check.algorithm.credit(state, now_us, check.cost);
        update(entry, check, &credited, now_us);
        credited.decision
    }

    /// `check.cost` units of a reservation counted at `counted_at_us` given
    /// back at `now_us` (see `Store::refund`).
    pub fn refund_at(&self, check: &Check, counted_at_us: u64, now_us: u64) {
        let mut shard = self.lock(check.key.shard(self.shards.len()));
        let Some(entry) = shard.get_mut(&check.key) else {
            // Gone idle: nothing of the reservation is left to give back.
            return;
        };
        if entry.idle_at_us <= now_us {
            return;
        }
        let refunded = check
            .algorithm
            .refund(&entry.state, now_us, check.cost, counted_at_us);
        update(entry, check, &refunded, now_us);
    }

    /// Forgets the state of these checks' keys. An identity decided on its
    /// limit's overflow bucket (no room for its own key) shares that bucket
    /// with other newcomers; it is not reset for one of them.
    pub fn forget(&self, checks: &[Check]) {
        for check in checks {
            self.forget_key(&check.key);
        }
    }

    /// Drops one key's state (an operator's reset heard from another
    /// instance).
    pub fn forget_key(&self, key: &StateKey) {
        self.lock(key.shard(self.shards.len())).pop(key);
    }

    /// Drops every idle key; returns how many went.
    pub fn sweep(&self) -> usize {
        let now_us = self.clock.now_us();
        self.sweep_slots(now_us);
        (0..self.shards.len())
            .map(|i| {
                let mut shard = self.lock(i);
                let idle: Vec<StateKey> = shard
                    .iter()
                    .filter(|(_, e)| e.idle_at_us <= now_us)
                    .map(|(k, _)| *k)
                    .collect();
                for key in &idle {
                    shard.pop(key);
                }
                idle.len()
            })
            .sum()
    }

    /// Keys held in the shards, idle ones not yet swept included (the
    /// overflow entries and the slots left out); locks every shard in turn.
    pub fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).len()).sum()
    }

    /// Whether the shards hold no key (as `len`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn update(entry: &mut Entry, check: &Check, evaluation: &Evaluation, now_us: u64) {
    if entry.idle_at_us <= now_us {
        entry.state = check.algorithm.fresh_state();
    }
    entry.state.apply(&evaluation.update);
    entry.idle_at_us = evaluation.idle_at_us;
}

#[async_trait]
impl Store for MemoryStore {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        watch::answered_by(Answerer::Memory);
        Ok(self.decide_now(checks))
    }

    async fn decide_leasing(
        &self,
        checks: &[Check],
        asks: &[Option<LeaseAsk>],
    ) -> Result<(Vec<Decision>, SmallVec<[u64; 4]>), LimiterError> {
        watch::answered_by(Answerer::Memory);
        Ok(self.decide_leasing_at(checks, asks, self.clock.now_us()))
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        watch::answered_by(Answerer::Memory);
        Ok(self.peek_at(checks, self.clock.now_us()))
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.forget(checks);
        Ok(())
    }

    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        Ok(self.credit_at(check, self.clock.now_us()))
    }

    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        self.refund_at(check, counted_at_us, self.clock.now_us());
        Ok(())
    }
}

#[async_trait]
impl Concurrency for MemoryStore {
    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        Ok(self.acquire_now(slot))
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        Ok(self.renew_now(slot))
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        Ok(self.release_now(slot))
    }
}

#[async_trait]
impl Upkeep for MemoryStore {
    async fn probe(&self) -> Result<(), LimiterError> {
        Ok(())
    }

    fn deciding(&self) -> Deciding {
        Deciding::Memory
    }

    fn keys_held(&self) -> usize {
        self.len()
    }

    fn sweep(&self) -> usize {
        MemoryStore::sweep(self)
    }
}

#[cfg(test)]
mod tests;
