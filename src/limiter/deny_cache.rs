//! Remembers, per layer key, that Redis refused a request until some instant,
//! so that the client's further requests are refused locally until then,
//! without a Redis call.
//!
//! This gives the answer Redis would give: a refusal changes no state, other
//! clients' traffic can only push the instant later, and a request costing at
//! least as much cannot pass earlier. An entry applies only to the same
//! algorithm and numbers, so a reload that changes a limit bypasses it.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::algorithm::{Algorithm, Decision};
use crate::policy::{Check, StateKey};

const SHARDS: usize = 16;

#[derive(Clone, Copy)]
struct Refusal {
    until_us: u64,
    cost: u64,
    algorithm: Algorithm,
}

pub struct DenyCache {
    shards: Vec<Mutex<HashMap<StateKey, Refusal>>>,
    per_shard: usize,
}

impl DenyCache {
    /// Holds at most about `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: (capacity / SHARDS).max(1),
        }
    }

    fn shard(&self, key: &StateKey) -> &Mutex<HashMap<StateKey, Refusal>> {
        &self.shards[key.shard(SHARDS)]
    }

    /// The refusal Redis would give `check` at `now_us`, if one is known.
    pub fn refusal(&self, check: &Check, now_us: u64) -> Option<Decision> {
        if check.shadow {
            return None;
        }
        let shard = self.shard(&check.key).lock().ok()?;
        let known = shard.get(&check.key)?;
        let applies = known.until_us > now_us
            && check.cost >= known.cost
            && known.algorithm == check.algorithm;
        applies.then(|| {
            let wait_us = known.until_us - now_us;
            Decision {
                allowed: false,
                cost_exceeds_limit: false,
                limit: check.algorithm.quota(),
                remaining: 0,
                reset_after_us: wait_us,
                retry_after_us: wait_us,
                delay_us: 0,
            }
        })
    }

    /// Records Redis's refusals among `decisions`.
    pub fn remember(&self, checks: &[Check], decisions: &[Decision], now_us: u64) {
        for (check, d) in checks.iter().zip(decisions) {
            if check.shadow || d.allowed || d.cost_exceeds_limit || d.retry_after_us == 0 {
                continue;
            }
            let Ok(mut shard) = self.shard(&check.key).lock() else {
                continue;
            };
            if shard.len() >= self.per_shard {
                shard.retain(|_, r| r.until_us > now_us);
                if shard.len() >= self.per_shard {
                    // Still full of live refusals: forgetting them only costs
                    // Redis calls, never a wrong answer.
                    shard.clear();
                }
            }
            shard.insert(
                check.key,
                Refusal {
                    until_us: now_us + d.retry_after_us,
                    cost: check.cost,
                    algorithm: check.algorithm,
                },
            );
        }
    }
}
