//! `[redis].instances = "auto"`: the instances count themselves. Each holds
//! one slot of a concurrency limit in the shared store (the slots script
//! and its twin, `algorithm::concurrency`), renewed every `ANNOUNCE_EVERY`
//! under a lease of `LIVE_FOR`; the slots held are the instances alive. An
//! instance that stops gives its slot back; one that dies loses it when the
//! lease ends. The count read at each renewal is what the fallback divides
//! limits by and leases are sized by.
//!
//! While Redis does not answer, the last count stays: the instances that
//! were alive are the best guess of who shares the budget then.

use std::sync::Arc;
use std::time::Duration;

use log::{info, warn};
use prometheus::IntGauge;

use super::check::{OnFailure, Slot, StateKey};
use super::error::LimiterError;
use super::instances::Instances;
use super::store::Store;
use crate::LimitName;

/// How often an instance renews its slot and reads the count.
pub(crate) const ANNOUNCE_EVERY: Duration = Duration::from_secs(2);

/// How long a slot outlives its last renewal: an instance that died is
/// counted this long at most.
pub(crate) const LIVE_FOR: Duration = Duration::from_secs(6);

/// More than any deployment runs: the slots never run out.
const MOST_INSTANCES: u64 = 1 << 20;

/// The slot's key: a name no limit can take (limit names are validated
/// words), `{prefix}:slots:floodgate instances:{0…0}` in Redis.
const ROSTER_NAME: &str = "floodgate instances";

/// This instance's place in the count of live instances
/// (`[redis].instances = "auto"`): a slot it renews, and the count it reads.
pub struct Roster {
    store: Arc<dyn Store>,
    instances: Instances,
    slot: Slot,
    gauge: IntGauge,
}

impl Roster {
    /// Counts into `instances` through `store` (the shared store itself,
    /// not behind the fallback: a count decided locally would be 1).
    pub fn new(store: Arc<dyn Store>, instances: Instances, gauge: IntGauge) -> Roster {
        let slot = Slot::new(
            LimitName::new(ROSTER_NAME),
            StateKey {
                limit: 0,
                identity: 0,
            },
            MOST_INSTANCES,
            LIVE_FOR.as_micros() as u64,
            instance_id(),
            OnFailure::Deny,
        )
        .expect("constant slot numbers are valid");
        gauge.set(instances.get() as i64);
        Roster {
            store,
            instances,
            slot,
            gauge,
        }
    }

    /// Renews this instance's slot and reads how many are held.
    pub async fn announce(&self) -> Result<u64, LimiterError> {
        let held = self.store.acquire(&self.slot).await?;
        // The slots left after this one's: the rest are the live instances.
        let live = MOST_INSTANCES.saturating_sub(held.remaining());
        let before = self.instances.set(live);
        if before != live {
            info!("instances sharing Redis: {live} (were {before}); the fallback's share and leases follow");
        }
        self.gauge.set(self.instances.get() as i64);
        Ok(live)
    }

    /// Gives the slot back: the others count one fewer at their next renewal.
    pub async fn leave(&self) {
        if let Err(e) = self.store.release(&self.slot).await {
            warn!(
                "could not take this instance off the count ({e}): the others count it for at most {LIVE_FOR:?} more"
            );
        }
    }

    /// Announces every `ANNOUNCE_EVERY` until `stop` resolves.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) {
        let mut every = tokio::time::interval(ANNOUNCE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = every.tick() => match self.announce().await {
                    Ok(_) if failing => {
                        info!("counting the instances sharing Redis again");
                        failing = false;
                    }
                    Ok(_) => {}
                    Err(e) if !failing => {
                        warn!("cannot count the instances sharing Redis ({e}): keeping the last count, {}", self.instances.get());
                        failing = true;
                    }
                    Err(_) => {}
                },
                _ = &mut stop => return,
            }
        }
    }
}

/// Tells this instance's slot from the others': random, or failing that
/// the process id and the time (distinct across live processes of a host).
fn instance_id() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 40)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::fake::T0;
    use crate::MemoryStore;

    fn roster(store: &Arc<MemoryStore>, instances: &Instances) -> Roster {
        Roster::new(
            store.clone(),
            instances.clone(),
            IntGauge::new("instances", "test").expect("gauge"),
        )
    }

    #[tokio::test]
    async fn the_count_follows_instances_that_start_stop_and_die() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = Arc::new(MemoryStore::new(100, clock.clone()));
        let seen: Vec<Instances> = (0..3).map(|_| Instances::counted()).collect();
        let rosters: Vec<Roster> = seen.iter().map(|i| roster(&store, i)).collect();
        for r in &rosters {
            r.announce().await.expect("announced");
        }
        // Each renewal reads the count: the first to renew again sees all three.
        assert_eq!(rosters[0].announce().await.expect("announced"), 3);
        assert_eq!(seen[0].get(), 3);
        rosters[1].leave().await;
        assert_eq!(rosters[0].announce().await.expect("announced"), 2);
        // The third dies: it is counted until its lease ends.
        clock.advance(LIVE_FOR.as_micros() as u64 - 1);
        assert_eq!(rosters[0].announce().await.expect("announced"), 2);
        clock.advance(1);
        assert_eq!(rosters[0].announce().await.expect("announced"), 1);
        assert_eq!(seen[0].get(), 1);
    }
}
