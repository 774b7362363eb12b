//! API keys set at run time (the admin API), by their keyed hash only: the
//! exceptions to `[clients.api_keys]`, looked up in process on the request
//! path. The table outlives configuration generations (a reload keeps it);
//! where it is kept durable (a file, Redis) is the binary's business.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Shards of the table: a batch import or a full reload locks one at a
/// time, so a request waits behind at most one shard's worth of writing.
const SHARDS: usize = 64;

/// One run-time entry: a key's tier, or its revocation. A revocation is kept
/// (rather than the entry dropped) so that it also beats the same key in
/// the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// `None`: revoked, the key counts as no key at all.
    pub tier: Option<Arc<str>>,
    /// When it was set, in seconds since the Unix epoch.
    pub set_at: u64,
    /// What the operator called the key (a customer id), if anything.
    pub label: Option<Box<str>>,
}

/// What a key's hash comes to in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunTimeKey {
    /// Listed with this tier name.
    Tier(Arc<str>),
    Revoked,
}

/// The identities are already keyed SipHash outputs: uniform, and not
/// chosen by a client, so hashing them again buys nothing.
#[derive(Default)]
pub(crate) struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u128` is used; anything else is folded in.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(word);
        }
    }

    fn write_u128(&mut self, value: u128) {
        self.0 = (value >> 64) as u64;
    }
}

type Shard = HashMap<u128, KeyEntry, BuildHasherDefault<Identity>>;

/// The run-time API keys of this process, by keyed hash.
pub struct RunTimeKeys {
    shards: Box<[RwLock<Shard>]>,
    /// Entries in all shards: a request skips the probe while it is 0.
    len: AtomicUsize,
}

impl Default for RunTimeKeys {
    fn default() -> Self {
        RunTimeKeys {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            len: AtomicUsize::new(0),
        }
    }
}

impl std::fmt::Debug for RunTimeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunTimeKeys({} entries)", self.len())
    }
}

impl RunTimeKeys {
    fn shard(&self, hash: u128) -> &RwLock<Shard> {
        // The low bits pick the shard, the high ones the bucket within it.
        &self.shards[(hash as usize) % SHARDS]
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The request path's probe: what the key with this hash is, if the
    /// table names it.
    pub fn lookup(&self, hash: u128) -> Option<RunTimeKey> {
        let shard = self.shard(hash).read().unwrap_or_else(|e| e.into_inner());
        shard.get(&hash).map(|entry| match &entry.tier {
            Some(tier) => RunTimeKey::Tier(tier.clone()),
            None => RunTimeKey::Revoked,
        })
    }

    /// The whole entry (the admin API's answer).
    pub fn get(&self, hash: u128) -> Option<KeyEntry> {
        let shard = self.shard(hash).read().unwrap_or_else(|e| e.into_inner());
        shard.get(&hash).cloned()
    }

    /// Sets these entries (a later one of the same hash wins).
    pub fn set(&self, entries: impl IntoIterator<Item = (u128, KeyEntry)>) {
        for (hash, entry) in entries {
            let mut shard = self.shard(hash).write().unwrap_or_else(|e| e.into_inner());
            if shard.insert(hash, entry).is_none() {
                self.len.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Drops the entry of `hash`, if any (the file's entry for the key, if
    /// any, applies again).
    pub fn remove(&self, hash: u128) {
        let mut shard = self.shard(hash).write().unwrap_or_else(|e| e.into_inner());
        if shard.remove(&hash).is_some() {
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Replaces everything with `entries` (a load, or a repair after a
    /// missed change), shard by shard: each shard is built aside and
    /// swapped in, so a request sees a shard either before or after.
    pub fn replace_all(&self, entries: impl IntoIterator<Item = (u128, KeyEntry)>) {
        let mut fresh: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        for (hash, entry) in entries {
            fresh[(hash as usize) % SHARDS].insert(hash, entry);
        }
        for (shard, new) in self.shards.iter().zip(fresh) {
            let count = new.len();
            let old = {
                let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
                std::mem::replace(&mut *shard, new)
            };
            // Dropped outside the lock: freeing a big shard takes a while.
            let before = old.len();
            drop(old);
            if count >= before {
                self.len.fetch_add(count - before, Ordering::AcqRel);
            } else {
                self.len.fetch_sub(before - count, Ordering::AcqRel);
            }
        }
    }

    /// Every entry, in no order (persisting, listing).
    pub fn entries(&self) -> Vec<(u128, KeyEntry)> {
        let mut all = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|e| e.into_inner());
            all.extend(shard.iter().map(|(h, e)| (*h, e.clone())));
        }
        all
    }

    /// The hashes whose lowercase hex starts with `prefix` (at most `most`).
    pub fn find_prefix(&self, prefix: &str, most: usize) -> Vec<u128> {
        let mut found = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|e| e.into_inner());
            for hash in shard.keys() {
                if format!("{hash:032x}").starts_with(prefix) {
                    found.push(*hash);
                    if found.len() >= most {
                        return found;
                    }
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tier: Option<&str>) -> KeyEntry {
        KeyEntry {
            tier: tier.map(Arc::from),
            set_at: 1,
            label: None,
        }
    }

    #[test]
    fn set_lookup_remove_and_replace_keep_the_count() {
        let table = RunTimeKeys::default();
        assert!(table.is_empty());
        table.set([
            (1, entry(Some("pro"))),
            (2, entry(None)),
            (1, entry(Some("free"))),
        ]);
        assert_eq!(table.len(), 2);
        assert_eq!(table.lookup(1), Some(RunTimeKey::Tier(Arc::from("free"))));
        assert_eq!(table.lookup(2), Some(RunTimeKey::Revoked));
        assert_eq!(table.lookup(3), None);
        table.remove(2);
        table.remove(2);
        assert_eq!(table.len(), 1);
        table.replace_all((10..110u128).map(|h| (h << 64 | h, entry(Some("pro")))));
        assert_eq!(table.len(), 100);
        assert_eq!(table.lookup(1), None);
        assert_eq!(table.entries().len(), 100);
        table.replace_all([]);
        assert!(table.is_empty());
    }

    #[test]
    fn a_prefix_finds_the_hashes_that_start_with_it() {
        let table = RunTimeKeys::default();
        let hash = 0xabcd_ef01_0000_0000_0000_0000_0000_0001u128;
        table.set([(hash, entry(Some("pro"))), (7, entry(Some("pro")))]);
        assert_eq!(table.find_prefix("abcdef01", 2), vec![hash]);
        assert!(table.find_prefix("ffffffff", 2).is_empty());
    }
}
