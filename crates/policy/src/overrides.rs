//! Per-client numbers set at run time (the admin API's `/v1/overrides`):
//! one client's own numbers under one limit, in place of its tier's, until
//! removed or until they expire. Looked up in process on the request path,
//! by the limit's state id and the client's identity under it; the table
//! outlives configuration generations, and where it is kept durable is the
//! binary's business.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::sharded::{ShardKey, Sharded};
use crate::Rule;

/// Which state an override applies to: a limit's (its id survives reloads
/// that keep its name) for one client identity under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverrideKey {
    /// The limit's state id, which survives reloads that keep its name.
    pub limit: u64,
    /// The client's identity under the limit's key: the keyed hash its
    /// state is kept under.
    pub identity: u128,
}

impl Hash for OverrideKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The identity is a keyed hash already; the limit tells apart one
        // client's overrides under two limits.
        state.write_u128(self.identity);
        state.write_u64(self.limit);
    }
}

impl ShardKey for OverrideKey {
    fn shard(&self) -> usize {
        self.identity as usize ^ self.limit as usize
    }
}

/// One client's numbers under one limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The limit's name, as the operator gave it.
    pub limit_name: Arc<str>,
    /// The rule the numbers make under the running configuration, checked
    /// as the file's own numbers are; or why they make none (a reload
    /// removed the limit or changed its algorithm): kept, in force again
    /// if a later configuration takes them.
    pub rule: Result<Rule, Box<str>>,
    /// The numbers as the operator gave them (a JSON object), kept to be
    /// listed and checked again against a reloaded configuration.
    pub numbers: Box<str>,
    /// Gone by itself from this second on (seconds since the Unix epoch).
    pub expires_at_s: Option<u64>,
    /// When it was set, in seconds since the Unix epoch.
    pub set_at_s: u64,
    /// How the operator named the client (`ip=203.0.113.7`, `key#1a2b3c4d`,
    /// `header x-account`): never a key in full.
    pub client: Box<str>,
    /// What the operator called it (a ticket, a customer id), if anything.
    pub label: Option<Box<str>>,
}

impl Override {
    /// Whether the override is gone at `now_s` (seconds since the Unix epoch).
    pub fn expired(&self, now_s: u64) -> bool {
        self.expires_at_s.is_some_and(|at| at <= now_s)
    }
}

/// The overrides of this process.
#[derive(Default)]
pub struct RunTimeOverrides {
    table: Sharded<OverrideKey, Override>,
    /// The time expiries are read against, in seconds since the Unix epoch,
    /// moved on by the binary's clock (`tick`): a request reads no clock
    /// for this.
    now_s: AtomicU64,
}

impl std::fmt::Debug for RunTimeOverrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunTimeOverrides({} entries)", self.len())
    }
}

impl RunTimeOverrides {
    /// How many overrides the table holds, expired ones not yet dropped
    /// by `tick` included.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the table holds none (then requests never probe it).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The time expiries are read against from now on; the entries that
    /// expired by then are dropped (and returned: the binary removes them
    /// from where it keeps them).
    pub fn tick(&self, now_s: u64) -> Vec<(OverrideKey, Override)> {
        self.now_s.store(now_s, Ordering::Release);
        let mut expired = Vec::new();
        let mut any = false;
        // Read first: the shards are locked for writing only when some
        // entry expired.
        self.table.each_entry(|_, o| any |= o.expired(now_s));
        if !any {
            return expired;
        }
        self.table.each_shard(|shard| {
            if !shard.values().any(|o| o.expired(now_s)) {
                return;
            }
            let keys: Vec<OverrideKey> = shard
                .iter()
                .filter(|(_, o)| o.expired(now_s))
                .map(|(k, _)| *k)
                .collect();
            for key in keys {
                if let Some(gone) = shard.remove(&key) {
                    expired.push((key, gone));
                }
            }
        });
        expired
    }

    /// The time expiries are read against.
    pub fn now_s(&self) -> u64 {
        self.now_s.load(Ordering::Acquire)
    }

    /// The request path's probe: the client's own numbers under the limit,
    /// if it has some in force.
    pub fn rule(&self, limit: u64, identity: u128) -> Option<Rule> {
        let key = OverrideKey { limit, identity };
        let shard = self.table.read(&key);
        let found = shard.get(&key)?;
        let rule = found.rule.as_ref().ok()?;
        (!found.expired(self.now_s())).then_some(*rule)
    }

    /// The whole entry, expired or not (the admin API's answer).
    pub fn get(&self, key: &OverrideKey) -> Option<Override> {
        self.table.get(key)
    }

    /// Sets these entries (a later one of the same key wins); an entry of
    /// `None` removes the key's.
    pub fn set(&self, entries: impl IntoIterator<Item = (OverrideKey, Option<Override>)>) {
        for (key, entry) in entries {
            match entry {
                Some(entry) => self.table.insert(key, entry),
                None => {
                    self.table.remove(&key);
                }
            }
        }
    }

    /// Replaces everything with `entries` (a load, a repair after a missed
    /// change): a request sees each shard either before or after.
    pub fn replace_all(&self, entries: impl IntoIterator<Item = (OverrideKey, Override)>) {
        self.table.replace_all(entries);
    }

    /// Every entry's rule read again (a reload), in place: an entry set or
    /// removed meanwhile is neither lost nor brought back.
    pub fn recheck_all(&self, rule_of: impl Fn(&Override) -> Result<Rule, Box<str>>) {
        self.table.each_shard(|shard| {
            for entry in shard.values_mut() {
                entry.rule = rule_of(entry);
            }
        });
    }

    /// Every entry, in no order (persisting, listing).
    pub fn entries(&self) -> Vec<(OverrideKey, Override)> {
        self.table.entries()
    }
}

#[cfg(test)]
mod tests {
    use floodgate_algorithm::Algorithm;

    use super::*;

    fn entry(capacity: u64, expires_at_s: Option<u64>) -> Override {
        Override {
            limit_name: Arc::from("per-account"),
            rule: Ok(Rule::Rate(
                Algorithm::token_bucket(capacity, 1_000).unwrap(),
            )),
            numbers: format!("{{\"capacity\":{capacity},\"refill_rate\":1000}}").into(),
            expires_at_s,
            set_at_s: 1,
            client: "ip=203.0.113.7".into(),
            label: None,
        }
    }

    fn key(limit: u64, identity: u128) -> OverrideKey {
        OverrideKey { limit, identity }
    }

    #[test]
    fn an_override_is_the_clients_under_its_limit_only() {
        let table = RunTimeOverrides::default();
        table.set([(key(1, 7), Some(entry(50, None)))]);
        assert_eq!(
            table.rule(1, 7),
            Some(Rule::Rate(Algorithm::token_bucket(50, 1_000).unwrap()))
        );
        assert_eq!(table.rule(2, 7), None, "another limit");
        assert_eq!(table.rule(1, 8), None, "another client");
        table.set([(key(1, 7), None), (key(1, 7), None)]);
        assert!(table.is_empty());
    }

    #[test]
    fn an_expired_override_is_no_override_and_the_tick_drops_it() {
        let table = RunTimeOverrides::default();
        table.tick(99);
        table.set([
            (key(1, 7), Some(entry(50, Some(100)))),
            (key(1, 8), Some(entry(60, None))),
        ]);
        assert!(table.rule(1, 7).is_some(), "in force until its second");
        table.tick(100);
        assert_eq!(table.rule(1, 7), None);
        assert_eq!(table.len(), 1);
        assert!(table.rule(1, 8).is_some());
        // Expired while set: looked past at once, dropped by the next tick.
        table.set([(key(2, 7), Some(entry(50, Some(50))))]);
        assert_eq!(table.rule(2, 7), None);
        let dropped = table.tick(100);
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].0, key(2, 7));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn replace_all_keeps_the_count() {
        let table = RunTimeOverrides::default();
        table.set([(key(1, 1), Some(entry(5, None)))]);
        table.replace_all((0..100u128).map(|i| (key(3, i << 64 | i), entry(5, None))));
        assert_eq!(table.len(), 100);
        assert_eq!(table.rule(1, 1), None);
        assert_eq!(table.entries().len(), 100);
        table.replace_all([]);
        assert!(table.is_empty());
    }

    #[test]
    fn overrides_spread_over_the_shards_by_identity_and_limit() {
        let shards = |keys: &mut dyn Iterator<Item = OverrideKey>| {
            keys.map(|k| k.shard())
                .collect::<std::collections::HashSet<_>>()
                .len()
        };
        assert_eq!(shards(&mut (0..64u128).map(|i| key(1, i))), 64);
        assert_eq!(shards(&mut (0..64u64).map(|l| key(l, 1))), 64);
    }

    #[test]
    fn an_entry_is_read_whole_and_rechecked_in_place() {
        let table = RunTimeOverrides::default();
        assert!(table.get(&key(1, 7)).is_none());
        table.set([(key(1, 7), Some(entry(50, Some(100))))]);
        assert!(!table.is_empty());
        assert_eq!(format!("{table:?}"), "RunTimeOverrides(1 entries)");
        assert_eq!(table.get(&key(1, 7)), Some(entry(50, Some(100))));
        table.recheck_all(|o| Err(format!("{} is gone", o.limit_name).into()));
        let rechecked = table.get(&key(1, 7)).unwrap();
        assert_eq!(rechecked.rule, Err("per-account is gone".into()));
        assert_eq!(table.rule(1, 7), None, "kept, but in force no more");
    }

    #[test]
    fn one_clients_overrides_under_two_limits_hash_apart() {
        use std::hash::BuildHasher;
        let table = std::hash::BuildHasherDefault::<crate::sharded::Prehashed>::default();
        let identity = 0xabcd << 64 | 7;
        let hash = |key: OverrideKey| table.hash_one(key);
        assert_ne!(hash(key(1, identity)), hash(key(2, identity)));
        assert_ne!(hash(key(1, identity)), hash(key(1, identity + (1 << 64))));
    }
}
