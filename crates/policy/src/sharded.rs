//! A table the request path reads while operators change it: shards of
//! hash maps behind their own locks, so that a batch or a whole reload
//! locks one shard at a time and a request waits behind at most one
//! shard's worth of writing. Its keys are keyed hashes already (uniform,
//! not chosen by a client): they pick their shard and bucket as they are.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

const SHARDS: usize = 64;

/// The identities are already keyed SipHash outputs: hashing them again
/// buys nothing.
#[derive(Default)]
pub(crate) struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only whole integers are written; anything else is folded in.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(word);
        }
    }

    fn write_u128(&mut self, value: u128) {
        self.0 ^= (value >> 64) as u64;
    }
}

/// A key of a sharded table: which shard it lives in.
pub(crate) trait ShardKey: Hash + Eq + Copy {
    fn shard(&self) -> usize;
}

impl ShardKey for u128 {
    fn shard(&self) -> usize {
        // The low bits pick the shard, the high ones the bucket within it.
        *self as usize % SHARDS
    }
}

pub(crate) type Shard<K, V> = HashMap<K, V, BuildHasherDefault<Prehashed>>;

pub(crate) struct Sharded<K, V> {
    shards: Box<[RwLock<Shard<K, V>>]>,
    /// Entries in all shards: a request skips the probe while it is 0.
    len: AtomicUsize,
}

impl<K: ShardKey, V: Clone> Default for Sharded<K, V> {
    fn default() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            len: AtomicUsize::new(0),
        }
    }
}

impl<K: ShardKey, V: Clone> Sharded<K, V> {
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub(crate) fn read(&self, key: &K) -> RwLockReadGuard<'_, Shard<K, V>> {
        self.shards[key.shard() % SHARDS]
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self, key: &K) -> RwLockWriteGuard<'_, Shard<K, V>> {
        self.shards[key.shard() % SHARDS]
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, key: &K) -> Option<V> {
        self.read(key).get(key).cloned()
    }

    pub(crate) fn insert(&self, key: K, value: V) {
        if self.write(&key).insert(key, value).is_none() {
            self.len.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn remove(&self, key: &K) -> Option<V> {
        let removed = self.write(key).remove(key);
        if removed.is_some() {
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
        removed
    }

    /// Replaces everything with `entries`, shard by shard: each is built
    /// aside and swapped in, so a request sees a shard either before or
    /// after.
    pub(crate) fn replace_all(&self, entries: impl IntoIterator<Item = (K, V)>) {
        let mut fresh: Vec<Shard<K, V>> = (0..SHARDS).map(|_| Shard::default()).collect();
        for (key, value) in entries {
            fresh[key.shard() % SHARDS].insert(key, value);
        }
        for (shard, new) in self.shards.iter().zip(fresh) {
            let count = new.len();
            let old = {
                let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
                std::mem::replace(&mut *shard, new)
            };
            let before = old.len();
            // Dropped outside the lock: freeing a big shard takes a while.
            drop(old);
            if count >= before {
                self.len.fetch_add(count - before, Ordering::AcqRel);
            } else {
                self.len.fetch_sub(before - count, Ordering::AcqRel);
            }
        }
    }

    /// Every entry, in no order.
    pub(crate) fn entries(&self) -> Vec<(K, V)> {
        let mut all = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|e| e.into_inner());
            all.extend(shard.iter().map(|(k, v)| (*k, v.clone())));
        }
        all
    }

    /// Each entry in turn, read (the shards locked for reading, one at a
    /// time).
    pub(crate) fn each_entry(&self, mut read: impl FnMut(&K, &V)) {
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|e| e.into_inner());
            for (key, value) in shard.iter() {
                read(key, value);
            }
        }
    }

    /// Each shard in turn, to change in place: what `change` removes is
    /// counted out.
    pub(crate) fn each_shard(&self, mut change: impl FnMut(&mut Shard<K, V>)) {
        for shard in self.shards.iter() {
            let mut shard = shard.write().unwrap_or_else(|e| e.into_inner());
            let before = shard.len();
            change(&mut shard);
            let after = shard.len();
            if after < before {
                self.len.fetch_sub(before - after, Ordering::AcqRel);
            } else if after > before {
                self.len.fetch_add(after - before, Ordering::AcqRel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prehashed_key_is_its_own_hash() {
        let hash = |write: &dyn Fn(&mut Prehashed)| {
            let mut h = Prehashed::default();
            write(&mut h);
            h.finish()
        };
        // An identity's high half: its low half picks the shard.
        assert_eq!(hash(&|h| h.write_u128(0xfeed << 64 | 7)), 0xfeed);
        assert_eq!(hash(&|h| h.write_u64(0x1234)), 0x1234);
        assert_eq!(hash(&|h| h.write(&[3, 0, 0, 0, 0, 0, 0, 0, 1])), 2);
        let both = |h: &mut Prehashed| {
            h.write_u128(0b110 << 64);
            h.write_u64(0b011);
        };
        assert_eq!(hash(&both), 0b101);
        let reversed = |h: &mut Prehashed| {
            h.write_u64(0b011);
            h.write_u128(0b110 << 64);
        };
        assert_eq!(hash(&reversed), 0b101);
    }

    #[test]
    fn an_identitys_low_bits_pick_its_shard() {
        let shards: std::collections::HashSet<usize> =
            (0..SHARDS as u128).map(|i| (i << 64 | i).shard()).collect();
        assert_eq!(shards.len(), SHARDS);
        assert!(shards.iter().all(|&s| s < SHARDS));
    }

    #[test]
    fn the_count_follows_every_change_and_a_key_is_found_where_it_was_put() {
        let table: Sharded<u128, u32> = Sharded::default();
        let wide = SHARDS as u128;
        // Two keys of one shard (their low bits), one of another.
        for key in [0, wide, 1] {
            table.insert(key, 1);
        }
        assert_eq!(table.len(), 3);
        table.each_shard(|shard| {
            shard.remove(&0);
        });
        assert_eq!(table.len(), 2);
        table.each_shard(|shard| {
            if shard.contains_key(&1) {
                shard.insert(1 + wide, 1);
                shard.insert(1 + 2 * wide, 1);
            }
        });
        assert_eq!(table.len(), 4);
        assert_eq!(table.get(&(1 + wide)), Some(1));
        table.replace_all([(1, 7), (u128::MAX, 8)]);
        assert_eq!(table.len(), 2);
        assert_eq!((table.get(&1), table.get(&u128::MAX)), (Some(7), Some(8)));
        assert_eq!(table.remove(&u128::MAX), Some(8));
        assert_eq!(table.len(), 1);
    }
}
