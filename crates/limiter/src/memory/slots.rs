//! The concurrency limits' slots, held in process: a key is here only
//! while a lease on it is held (or until its expiry is noticed).

use super::{MemoryStore, SHARDS};
use crate::check::Slot;
use floodgate_algorithm::{Decision, Slots};

impl MemoryStore {
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

    /// Takes one of `slot`'s slots for its lease id at the clock's time
    /// (`Slots::acquire`): refused with the wait until one frees when all
    /// are held. Never fails: nothing is called out.
    pub fn acquire_now(&self, slot: &Slot) -> Decision {
        self.with_slots(slot, |slots, now_us| {
            slots.acquire(slot.lease_id(), slot.max(), slot.lease_us(), now_us)
        })
    }

    /// Extends the lease's slot to `slot.lease_us()` from now; false when
    /// it is no longer held (expired or released).
    pub fn renew_now(&self, slot: &Slot) -> bool {
        self.with_slots(slot, |slots, now_us| {
            slots.renew(slot.lease_id(), slot.lease_us(), now_us)
        })
    }

    /// Gives the lease's slot back; false when it was not held.
    pub fn release_now(&self, slot: &Slot) -> bool {
        self.with_slots(slot, |slots, now_us| slots.release(slot.lease_id(), now_us))
    }

    /// Drops the keys whose leases have all ended.
    pub(super) fn sweep_slots(&self, now_us: u64) {
        for shard in self.slots.iter() {
            shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .retain(|_, slots| slots.held(now_us) > 0);
        }
    }
}
