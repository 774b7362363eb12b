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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use log::warn;
use lru::LruCache;
use prometheus::IntCounter;
use smallvec::SmallVec;

use super::check::{admitted, Check, LeaseAsk, Slot, StateKey};
use super::error::LimiterError;
use super::store::{Deciding, Store};
use crate::clock::Clock;
use crate::log_throttle::LogThrottle;
use crate::watch::{self, Answerer};
use floodgate_algorithm::{Decision, Evaluation, Slots, State, Update};

const SHARDS: usize = 64;

/// How far from the least recently used end a full shard is searched for
/// idle state to drop: bounded, so one insertion stays cheap; the sweeper
/// clears the rest.
const IDLE_SCAN: usize = 16;

/// At most one overflow warning per this long.
const OVERFLOW_LOG_INTERVAL: Duration = Duration::from_secs(60);

struct Entry {
    state: State,
    idle_at_us: u64,
}

type Shard = LruCache<StateKey, Entry>;

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

/// Where one check's state lives for this decision.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Home {
    /// Its own key, in the locked shard of this index.
    Shard(usize),
    /// Its limit's shared overflow entry.
    Overflow,
    /// Not held, and a lookup (`peek`): read as fresh. It reserves no room,
    /// and a lookup never reads the overflow entry, which newcomers share:
    /// a ban taken there must not shut out every newcomer.
    Absent,
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

    /// `decide_at`, and beside each layer with an ask in `asks` (by
    /// position; missing asks are none) that the request charges, a lease
    /// taken in the same step (`Algorithm::evaluate_leasing`): that layer's
    /// decision is then the one after the lease, and its units leased are
    /// in the second vector. The twin of the script's lease mode.
    pub fn decide_leasing_at(
        &self,
        checks: &[Check],
        asks: &[Option<LeaseAsk>],
        now_us: u64,
    ) -> (Vec<Decision>, SmallVec<[u64; 4]>) {
        // A request has a handful of layers: all of this stays on the stack.
        let shard_of_check: SmallVec<[usize; 4]> = checks
            .iter()
            .map(|c| c.key.shard(self.shards.len()))
            .collect();
        let mut shard_ids = shard_of_check.clone();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 4]> =
            shard_ids.iter().map(|&i| self.lock(i)).collect();
        // New keys each locked shard must make room for.
        let mut pending: SmallVec<[usize; 4]> = SmallVec::from_elem(0, shard_ids.len());
        let homes: SmallVec<[Home; 4]> = checks
            .iter()
            .zip(&shard_of_check)
            .map(|(check, shard)| {
                let slot = shard_ids.binary_search(shard).unwrap_or_default();
                let guard = &mut guards[slot];
                if guard.contains(&check.key) {
                    return Home::Shard(slot);
                }
                if check.peek {
                    return Home::Absent;
                }
                if make_room(guard, pending[slot] + 1, now_us, checks) {
                    pending[slot] += 1;
                    Home::Shard(slot)
                } else {
                    Home::Overflow
                }
            })
            .collect();
        let overflowing = homes.iter().filter(|h| **h == Home::Overflow).count();
        let mut overflow = (overflowing > 0).then(|| self.lock_overflow());

        let evaluations: SmallVec<[Evaluation; 4]> = checks
            .iter()
            .zip(&homes)
            .map(|(check, home)| {
                let entry = match home {
                    Home::Shard(slot) => guards[*slot].peek(&check.key),
                    Home::Overflow => overflow.as_ref().and_then(|o| o.get(&check.key.limit)),
                    Home::Absent => None,
                };
                evaluate(check, entry, now_us)
            })
            .collect();
        let mut decisions: Vec<Decision> = evaluations.iter().map(|e| e.decision).collect();
        let mut leased: SmallVec<[u64; 4]> = SmallVec::new();
        if admitted(checks, &decisions) {
            for (i, ((check, home), evaluation)) in
                checks.iter().zip(&homes).zip(&evaluations).enumerate()
            {
                if check.peek || !evaluation.decision.allowed() {
                    continue;
                }
                let leasing;
                // A shadow layer refuses nobody: it takes no lease either.
                let ask = asks.get(i).copied().flatten().filter(|_| !check.shadow);
                let evaluation = match ask {
                    Some(ask) => {
                        let entry = match home {
                            Home::Shard(slot) => guards[*slot].peek(&check.key),
                            Home::Overflow => {
                                overflow.as_ref().and_then(|o| o.get(&check.key.limit))
                            }
                            Home::Absent => None,
                        };
                        let units;
                        (leasing, units) = evaluate_leasing(check, entry, now_us, ask);
                        if units > 0 {
                            leased.resize(checks.len(), 0);
                            leased[i] = units;
                            decisions[i] = leasing.decision;
                        }
                        &leasing
                    }
                    None => evaluation,
                };
                if evaluation.update == Update::Unchanged {
                    continue;
                }
                match home {
                    Home::Shard(slot) => store(&mut guards[*slot], check, evaluation, now_us),
                    Home::Absent => {}
                    Home::Overflow => {
                        if let Some(map) = overflow.as_mut() {
                            let entry = map.entry(check.key.limit).or_insert_with(|| Entry {
                                state: check.algorithm.fresh_state(),
                                idle_at_us: 0,
                            });
                            update(entry, check, evaluation, now_us);
                        }
                    }
                }
            }
        }
        drop(overflow);
        drop(guards);
        if overflowing > 0 {
            self.note_overflow(checks, &homes, overflowing as u64, now_us);
        }
        (decisions, leased)
    }

    /// What `decide_at` would answer, changing nothing: a key without room
    /// is read from its limit's overflow bucket, as it would be decided.
    pub fn peek_at(&self, checks: &[Check], now_us: u64) -> Vec<Decision> {
        // New keys this request would already have placed, per shard: a
        // later one needs room beside them, as in `decide_at`.
        let mut placed: SmallVec<[(usize, usize); 4]> = SmallVec::new();
        checks
            .iter()
            .map(|check| {
                let evaluate = |entry| evaluate(check, entry, now_us).decision;
                let index = check.key.shard(self.shards.len());
                let shard = self.lock(index);
                if shard.contains(&check.key) {
                    return evaluate(shard.peek(&check.key));
                }
                let before = placed
                    .iter()
                    .find(|(i, _)| *i == index)
                    .map_or(0, |(_, n)| *n);
                if could_make_room(&shard, before + 1, now_us, checks) {
                    match placed.iter_mut().find(|(i, _)| *i == index) {
                        Some((_, n)) => *n += 1,
                        None => placed.push((index, 1)),
                    }
                    evaluate(None)
                } else {
                    drop(shard);
                    evaluate(self.lock_overflow().get(&check.key.limit))
                }
            })
            .collect()
    }

    /// Forgets the state of these checks' keys. An identity decided on its
    /// limit's overflow bucket (no room for its own key) shares that bucket
    /// with other newcomers; it is not reset for one of them.
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
                peek: true,
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

    /// Counts overflow decisions and says so in the log at most once a minute.
    fn note_overflow(&self, checks: &[Check], homes: &[Home], count: u64, now_us: u64) {
        let total = self.overflow_decisions.fetch_add(count, Ordering::Relaxed) + count;
        if let Some(metric) = &self.overflow_metric {
            metric.inc_by(count);
        }
        if self.overflow_log.due(now_us).is_some() {
            let limits: Vec<&str> = checks
                .iter()
                .zip(homes)
                .filter(|(_, h)| **h == Home::Overflow)
                .map(|(c, _)| c.name.as_str())
                .collect();
            warn!(
                "memory store full of live state ([memory].max_keys): new clients share the overflow bucket of {} ({total} overflow decisions so far)",
                limits.join(", ")
            );
        }
    }

    /// Runs `change` on `slot`'s leases at the clock's time, dropping the
    /// key once no lease is left.
    fn with_slots<T>(&self, slot: &Slot, change: impl FnOnce(&mut Slots, u64) -> T) -> T {
        let now_us = self.clock.now_us();
        let mut shard = self.slots[slot.key().shard(SHARDS)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let slots = shard.entry(*slot.key()).or_default();
        let result = change(slots, now_us);
        if slots.held(now_us) == 0 {
            shard.remove(slot.key());
        }
        result
    }

    pub fn acquire_now(&self, slot: &Slot) -> Decision {
        self.with_slots(slot, |slots, now_us| {
            slots.acquire(slot.lease_id(), slot.max(), slot.lease_us(), now_us)
        })
    }

    pub fn renew_now(&self, slot: &Slot) -> bool {
        self.with_slots(slot, |slots, now_us| {
            slots.renew(slot.lease_id(), slot.lease_us(), now_us)
        })
    }

    pub fn release_now(&self, slot: &Slot) -> bool {
        self.with_slots(slot, |slots, now_us| slots.release(slot.lease_id(), now_us))
    }

    /// Drops every idle key; returns how many went.
    pub fn sweep(&self) -> usize {
        let now_us = self.clock.now_us();
        for shard in self.slots.iter() {
            shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .retain(|_, slots| slots.held(now_us) > 0);
        }
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

/// Whether `shard` can take `needed` more keys, dropping idle state (and
/// only idle state) near its least recently used end to make the room. Keys
/// of the request being decided stay: one of them may be idle now and
/// written in a moment.
fn make_room(shard: &mut Shard, needed: usize, now_us: u64, request: &[Check]) -> bool {
    let cap = shard.cap().get();
    if shard.len() + needed <= cap {
        return true;
    }
    let idle: SmallVec<[StateKey; 4]> = shard
        .iter()
        .rev()
        .take(IDLE_SCAN)
        .filter(|(k, e)| e.idle_at_us <= now_us && !request.iter().any(|c| c.key == **k))
        .map(|(k, _)| *k)
        .take(shard.len() + needed - cap)
        .collect();
    for key in &idle {
        shard.pop(key);
    }
    shard.len() + needed <= cap
}

/// Whether `make_room` would find room for `needed` more keys, without
/// dropping anything: as many idle keys (not the request's) within reach of
/// its scan, which moves deeper by each key it drops.
fn could_make_room(shard: &Shard, needed: usize, now_us: u64, request: &[Check]) -> bool {
    let cap = shard.cap().get();
    if shard.len() + needed <= cap {
        return true;
    }
    let short = shard.len() + needed - cap;
    shard
        .iter()
        .rev()
        .take(IDLE_SCAN + short - 1)
        .filter(|(k, e)| e.idle_at_us <= now_us && !request.iter().any(|c| c.key == **k))
        .count()
        >= short
}

/// `decide` on the state held in `entry`; idle or absent state is fresh.
fn with_state<T>(
    check: &Check,
    entry: Option<&Entry>,
    now_us: u64,
    decide: impl FnOnce(&State) -> T,
) -> T {
    match entry {
        Some(entry) if entry.idle_at_us > now_us => decide(&entry.state),
        _ => decide(&check.algorithm.fresh_state()),
    }
}

/// `check` against the state held in `entry`.
fn evaluate(check: &Check, entry: Option<&Entry>, now_us: u64) -> Evaluation {
    with_state(check, entry, now_us, |state| {
        check.algorithm.evaluate(state, now_us, check.cost)
    })
}

/// `check` and the lease `ask`ed beside it against the state in `entry`.
fn evaluate_leasing(
    check: &Check,
    entry: Option<&Entry>,
    now_us: u64,
    ask: LeaseAsk,
) -> (Evaluation, u64) {
    with_state(check, entry, now_us, |state| {
        check.algorithm.evaluate_leasing(
            state,
            now_us,
            check.cost,
            (ask.max, ask.divisor, ask.life_us),
        )
    })
}

fn update(entry: &mut Entry, check: &Check, evaluation: &Evaluation, now_us: u64) {
    if entry.idle_at_us <= now_us {
        entry.state = check.algorithm.fresh_state();
    }
    entry.state.apply(&evaluation.update);
    entry.idle_at_us = evaluation.idle_at_us;
}

/// Writes an admitted change; room for a new key was made when it was
/// evaluated, so `push` never displaces a live key.
fn store(shard: &mut Shard, check: &Check, evaluation: &Evaluation, now_us: u64) {
    if let Some(entry) = shard.get_mut(&check.key) {
        update(entry, check, evaluation, now_us);
        return;
    }
    if shard.len() >= shard.cap().get() {
        // Room was made when the request was evaluated; should it be gone,
        // dropping this update beats displacing somebody's live state.
        debug_assert!(false, "no room reserved for a new key");
        return;
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

    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        Ok(self.acquire_now(slot))
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        Ok(self.renew_now(slot))
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        Ok(self.release_now(slot))
    }

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
#[path = "memory_tests.rs"]
mod tests;
