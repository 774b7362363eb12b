//! API keys set at run time (the admin API), by their keyed hash only: the
//! exceptions to `[clients.api_keys]`, looked up in process on the request
//! path. The table outlives configuration generations (a reload keeps it);
//! where it is kept durable (a file, Redis) is the binary's business.

use std::sync::Arc;

use crate::sharded::Sharded;

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
    /// Revoked: the key counts as no key, whatever `[clients.api_keys]` says.
    Revoked,
}

/// The run-time API keys of this process, by keyed hash.
#[derive(Default)]
pub struct RunTimeKeys {
    table: Sharded<u128, KeyEntry>,
}

impl std::fmt::Debug for RunTimeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunTimeKeys({} entries)", self.len())
    }
}

impl RunTimeKeys {
    /// How many keys the table lists, revoked ones included.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the table lists no key (then requests never probe it).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The request path's probe: what the key with this hash is, if the
    /// table names it.
    pub fn lookup(&self, hash: u128) -> Option<RunTimeKey> {
        self.table
            .read(&hash)
            .get(&hash)
            .map(|entry| match &entry.tier {
                Some(tier) => RunTimeKey::Tier(tier.clone()),
                None => RunTimeKey::Revoked,
            })
    }

    /// The whole entry (the admin API's answer).
    pub fn get(&self, hash: u128) -> Option<KeyEntry> {
        self.table.get(&hash)
    }

    /// Sets these entries (a later one of the same hash wins).
    pub fn set(&self, entries: impl IntoIterator<Item = (u128, KeyEntry)>) {
        for (hash, entry) in entries {
            self.table.insert(hash, entry);
        }
    }

    /// Drops the entry of `hash`, if any (the file's entry for the key, if
    /// any, applies again).
    pub fn remove(&self, hash: u128) {
        self.table.remove(&hash);
    }

    /// Replaces everything with `entries` (a load, or a repair after a
    /// missed change): a request sees each shard either before or after.
    pub fn replace_all(&self, entries: impl IntoIterator<Item = (u128, KeyEntry)>) {
        self.table.replace_all(entries);
    }

    /// Every entry, in no order (persisting, listing).
    pub fn entries(&self) -> Vec<(u128, KeyEntry)> {
        self.table.entries()
    }

    /// The hashes whose lowercase hex starts with `prefix` (at most `most`).
    pub fn find_prefix(&self, prefix: &str, most: usize) -> Vec<u128> {
        let mut found = Vec::new();
        self.table.each_entry(|hash, _| {
            if found.len() < most && format!("{hash:032x}").starts_with(prefix) {
                found.push(*hash);
            }
        });
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

    #[test]
    fn a_prefix_finds_no_more_than_asked_and_an_entry_is_read_whole() {
        let table = RunTimeKeys::default();
        assert!(table.get(1).is_none());
        let hashes = (1..=3u128).map(|i| 0xab << 120 | i);
        table.set(hashes.map(|h| (h, entry(Some("pro")))));
        assert_eq!(table.find_prefix("ab", 2).len(), 2);
        assert_eq!(table.find_prefix("ab", 5).len(), 3);
        assert_eq!(table.get(0xab << 120 | 2), Some(entry(Some("pro"))));
        assert_eq!(format!("{table:?}"), "RunTimeKeys(3 entries)");
    }
}
