//! In-process limit state: the whole store without Redis, the fallback with it.
//!
//! Keys live in sharded LRU maps. A key is inserted only when a request it
//! admits changes its state, so a flood of refused or unique identities cannot
//! grow memory past `max_keys`; beyond it the least recently used key goes
//! first. State that has gone idle (indistinguishable from fresh) is treated
//! as absent at once and dropped by `sweep` or when its slot is reused.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use lru::LruCache;
use smallvec::SmallVec;

use super::{admitted, Limiter, LimiterError};
use crate::algorithm::{Decision, Evaluation, State, Update};
use crate::clock::Clock;
use crate::policy::{Check, StateKey};

const SHARDS: usize = 64;

struct Entry {
    state: State,
    idle_at_us: u64,
}

type Shard = LruCache<StateKey, Entry>;

pub struct LocalLimiter {
    shards: Box<[Mutex<Shard>]>,
    clock: Arc<dyn Clock>,
}

impl LocalLimiter {
    /// Holds at most `max_keys` keys (rounded down to a multiple of the shard
    /// count, at least one per shard).
    pub fn new(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        let shard_count = SHARDS.min(max_keys.max(1));
        let per_shard = std::num::NonZeroUsize::new((max_keys / shard_count).max(1))
            .unwrap_or(std::num::NonZeroUsize::MIN);
        let shards = (0..shard_count)
            .map(|_| Mutex::new(LruCache::new(per_shard)))
            .collect();
        LocalLimiter { shards, clock }
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
    /// involved are locked in ascending order (so callers cannot deadlock)
    /// for the evaluation and the update together.
    pub fn decide_at(&self, checks: &[Check], now_us: u64) -> Vec<Decision> {
        // A request has a handful of layers: all of this stays on the stack.
        let shard_of_check: SmallVec<[usize; 4]> = checks
            .iter()
            .map(|c| c.key.shard(self.shards.len()))
            .collect();
        let mut shard_ids = shard_of_check.clone();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        // Index of each check's shard among the locked ones.
        let slots: SmallVec<[usize; 4]> = shard_of_check
            .iter()
            .map(|shard| shard_ids.binary_search(shard).unwrap_or_default())
            .collect();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 4]> =
            shard_ids.iter().map(|&i| self.lock(i)).collect();

        let evaluations: SmallVec<[Evaluation; 4]> = checks
            .iter()
            .zip(&slots)
            .map(|(check, &slot)| {
                let fresh;
                let state = match guards[slot].peek(&check.key) {
                    Some(entry) if entry.idle_at_us > now_us => &entry.state,
                    _ => {
                        fresh = check.algorithm.fresh_state();
                        &fresh
                    }
                };
                check.algorithm.evaluate(state, now_us, check.cost)
            })
            .collect();
        let decisions: Vec<Decision> = evaluations.iter().map(|e| e.decision).collect();
        if admitted(checks, &decisions) {
            for ((check, &slot), evaluation) in checks.iter().zip(&slots).zip(&evaluations) {
                if evaluation.decision.allowed && evaluation.update != Update::Unchanged {
                    store(&mut guards[slot], check, evaluation, now_us);
                }
            }
        }
        decisions
    }

    /// Drops every idle key; returns how many went.
    pub fn sweep(&self) -> usize {
        let now_us = self.clock.now_us();
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

    pub fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn store(shard: &mut Shard, check: &Check, evaluation: &Evaluation, now_us: u64) {
    if let Some(entry) = shard.get_mut(&check.key) {
        if entry.idle_at_us <= now_us {
            entry.state = check.algorithm.fresh_state();
        }
        entry.state.apply(&evaluation.update);
        entry.idle_at_us = evaluation.idle_at_us;
        return;
    }
    // Reuse room held by idle keys before evicting a live one.
    while shard.len() >= shard.cap().get() {
        match shard.peek_lru() {
            Some((_, e)) if e.idle_at_us <= now_us => {
                shard.pop_lru();
            }
            _ => break,
        }
    }
    let mut state = check.algorithm.fresh_state();
    state.apply(&evaluation.update);
    shard.push(
        check.key,
        Entry {
            state,
            idle_at_us: evaluation.idle_at_us,
        },
    );
}

#[async_trait]
impl Limiter for LocalLimiter {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        Ok(self.decide_now(checks))
    }

    fn keys_held(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
