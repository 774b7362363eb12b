//! The leases by key, sharded, with the fetch out for each key, and the
//! generation every forgetting bumps: what an operator's change or a failed
//! call reaches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::lease::Lease;
use crate::check::StateKey;
use crate::deny_cache::Forget;

pub(super) const SHARDS: usize = 64;

/// Keys with a lease (or a fetch out) at most, in all: beyond, a new key is
/// decided by the store alone, so a flood of identities costs no memory.
pub(super) const MAX_KEYS: usize = 200_000;

#[derive(Default)]
pub(super) struct Entry {
    pub(super) lease: Option<Lease>,
    /// A fetch is out for this key: wait for it rather than send another.
    pub(super) fetching: Option<Arc<Notify>>,
    /// An operator credited the key while the fetch was out: what it
    /// leases goes back at once, as the leases held then did.
    pub(super) credited: bool,
}

pub(super) struct Table {
    pub(super) shards: Box<[Mutex<HashMap<StateKey, Entry>>]>,
    /// Bumped by every forgetting, before it drops anything: a fetch whose
    /// script ran before a reset or a failure installs nothing after it,
    /// and a return of units leased before it is not sent (it would take
    /// from a fresh state what the reset gave or a restart left).
    pub(super) generation: AtomicU64,
    /// Whether operators' changes are heard. Until they are, nothing is
    /// leased: the first subscription forgets every lease (a reset may have
    /// been announced before it), and a lease forgotten is not given back.
    pub(super) listening: AtomicBool,
}

impl Table {
    /// `listening`: whether operators' changes are heard from the start.
    pub(super) fn new(listening: bool) -> Table {
        Table {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            generation: AtomicU64::new(0),
            listening: AtomicBool::new(listening),
        }
    }

    pub(super) fn lock(&self, key: &StateKey) -> MutexGuard<'_, HashMap<StateKey, Entry>> {
        // Entries are replaced whole: a poisoned shard is still consistent.
        self.shards[key.shard(SHARDS)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn leases_held(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                    .filter(|e| e.lease.is_some())
                    .count()
            })
            .sum()
    }
}

impl Forget for Table {
    /// An operator reset the keys: their leases are dropped, not returned
    /// (a return would take from the fresh state what the reset gave).
    fn forget(&self, keys: &[StateKey]) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        for key in keys {
            if let Some(entry) = self.lock(key).get_mut(key) {
                entry.lease = None;
            }
        }
    }

    fn forget_all(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        for shard in self.shards.iter() {
            for entry in shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .values_mut()
            {
                entry.lease = None;
            }
        }
    }

    fn listening(&self) {
        self.listening.store(true, Ordering::Release);
    }

    /// Nothing is leased until it is heard again, and nothing held is used
    /// or given back: a lost subscription is often a Redis that restarted
    /// empty, seen here before any call fails.
    fn not_listening(&self) {
        self.listening.store(false, Ordering::Release);
        self.forget_all();
    }
}

/// Ends the fetch it was made for, however the request went: installed,
/// refused, failed or given up on.
pub(super) struct Fetching {
    table: Arc<Table>,
    key: StateKey,
    notify: Arc<Notify>,
}

impl Fetching {
    /// The fetch of `key`, out from now: `fetching` is its entry's.
    pub(super) fn start(
        table: &Arc<Table>,
        key: StateKey,
        fetching: &mut Option<Arc<Notify>>,
    ) -> Fetching {
        let notify = Arc::new(Notify::new());
        *fetching = Some(notify.clone());
        Fetching {
            table: table.clone(),
            key,
            notify,
        }
    }
}

impl Drop for Fetching {
    fn drop(&mut self) {
        let mut shard = self.table.lock(&self.key);
        if let Some(entry) = shard.get_mut(&self.key) {
            if entry
                .fetching
                .as_ref()
                .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
            {
                entry.fetching = None;
                entry.credited = false;
            }
            if entry.lease.is_none() && entry.fetching.is_none() {
                shard.remove(&self.key);
            }
        }
        drop(shard);
        self.notify.notify_waiters();
    }
}
