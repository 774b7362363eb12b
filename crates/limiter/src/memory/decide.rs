//! A request decided on the shards its keys live in: each layer placed on
//! its key or, when a full shard has no room, on its limit's overflow
//! entry; all evaluated under the locks, and charged only if the request
//! is admitted.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use log::warn;
use smallvec::SmallVec;

use super::room::{could_make_room, make_room};
use super::{update, Entry, MemoryStore, Shard};
use crate::check::{admitted, Check, Enforcement, LeaseAsk, Spending};
use floodgate_algorithm::{Decision, Evaluation, State, Update};

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

/// One request's place in the store, held for its decision: the shards
/// its keys live in, locked in ascending order (so callers cannot
/// deadlock), then the overflow map if a layer found no room.
struct Placed<'a> {
    guards: SmallVec<[MutexGuard<'a, Shard>; 4]>,
    homes: SmallVec<[Home; 4]>,
    overflow: Option<MutexGuard<'a, HashMap<u64, Entry>>>,
    overflowing: usize,
}

impl MemoryStore {
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
        let mut placed = self.place(checks, now_us);
        let evaluations: SmallVec<[Evaluation; 4]> = checks
            .iter()
            .zip(&placed.homes)
            .map(|(check, home)| evaluate(check, placed.entry(check, *home), now_us))
            .collect();
        let mut decisions: Vec<Decision> = evaluations.iter().map(|e| e.decision).collect();
        let leased = if admitted(checks, &decisions) {
            placed.charge(checks, asks, &evaluations, &mut decisions, now_us)
        } else {
            SmallVec::new()
        };
        let Placed {
            guards,
            homes,
            overflow,
            overflowing,
        } = placed;
        drop(overflow);
        drop(guards);
        if overflowing > 0 {
            self.note_overflow(checks, &homes, overflowing as u64, now_us);
        }
        (decisions, leased)
    }

    /// Locks the shards of `checks`' keys and finds each its home, making
    /// room for new keys where only idle state is in the way.
    fn place(&self, checks: &[Check], now_us: u64) -> Placed<'_> {
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
                if check.spending == Spending::Peek {
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
        let overflow = (overflowing > 0).then(|| self.lock_overflow());
        Placed {
            guards,
            homes,
            overflow,
            overflowing,
        }
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
}

impl Placed<'_> {
    /// The state `check` is decided on where it lives: none is fresh.
    fn entry(&self, check: &Check, home: Home) -> Option<&Entry> {
        match home {
            Home::Shard(slot) => self.guards[slot].peek(&check.key),
            Home::Overflow => self.overflow.as_ref().and_then(|o| o.get(&check.key.limit)),
            Home::Absent => None,
        }
    }

    /// Charges an admitted request's layers, each with the lease asked
    /// beside it, if any (its decision in `decisions` is then the one after
    /// the lease); the units leased per layer, empty when none were.
    fn charge(
        &mut self,
        checks: &[Check],
        asks: &[Option<LeaseAsk>],
        evaluations: &[Evaluation],
        decisions: &mut [Decision],
        now_us: u64,
    ) -> SmallVec<[u64; 4]> {
        let mut leased: SmallVec<[u64; 4]> = SmallVec::new();
        for (i, (check, evaluation)) in checks.iter().zip(evaluations).enumerate() {
            if check.spending == Spending::Peek || !evaluation.decision.allowed() {
                continue;
            }
            let home = self.homes[i];
            let leasing;
            // A shadow layer refuses nobody: it takes no lease either.
            let ask = asks
                .get(i)
                .copied()
                .flatten()
                .filter(|_| check.enforcement == Enforcement::Enforce);
            let evaluation = match ask {
                Some(ask) => {
                    let units;
                    (leasing, units) =
                        evaluate_leasing(check, self.entry(check, home), now_us, ask);
                    if units > 0 {
                        leased.resize(checks.len(), 0);
                        leased[i] = units;
                        decisions[i] = leasing.decision;
                    }
                    &leasing
                }
                None => evaluation,
            };
            if evaluation.update != Update::Unchanged {
                self.write(check, home, evaluation, now_us);
            }
        }
        leased
    }

    /// Writes an admitted change where `check`'s state lives.
    fn write(&mut self, check: &Check, home: Home, evaluation: &Evaluation, now_us: u64) {
        match home {
            Home::Shard(slot) => store(&mut self.guards[slot], check, evaluation, now_us),
            Home::Absent => {}
            Home::Overflow => {
                if let Some(map) = self.overflow.as_mut() {
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
