//! The tasks that run beside the proxy, each a Pingora background service:
//! the memory store's sweep, the status page's samples, operators' changes
//! heard from other instances, the run-time clients followed in Redis,
//! overrides' expiry, and this instance kept counted.

use std::sync::Arc;
use std::time::Duration;

use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::server::state::AppState;
use floodgate_limiter::clock::Clock;
use floodgate_limiter::redis::changes;
use floodgate_limiter::{Forgetter, MemoryStore, RedisSettings, Roster, Store};

/// Drops idle keys of the memory store now and then, so that memory follows
/// the number of active clients rather than every client ever seen.
pub(super) struct Sweeper {
    pub(super) store: Arc<dyn Store>,
}

#[async_trait::async_trait]
impl BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        loop {
            tokio::select! {
                _ = tick.tick() => { self.store.sweep(); }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Moves the clock clients' overrides expire by, and drops those that
/// expired: a request reads no clock for them.
pub(super) struct OverrideExpiry {
    pub(super) clients: Arc<crate::clients::RunTimeClients>,
    pub(super) clock: Arc<dyn Clock>,
}

/// How late an override may outlive its `expires` at most.
const OVERRIDE_TICK: Duration = Duration::from_millis(250);

impl OverrideExpiry {
    /// The overrides that expired now, dropped from the table.
    pub(super) fn tick(&self) -> (Vec<floodgate_policy::overrides::OverrideKey>, u64) {
        let now_s = self.clock.now_us() / 1_000_000;
        let expired = self.clients.overrides.tick(now_s);
        let mut keys = Vec::with_capacity(expired.len());
        for (key, gone) in expired {
            log::info!(
                "run-time clients: override of {} under {} expired",
                gone.client,
                gone.limit_name
            );
            keys.push(key);
        }
        (keys, now_s)
    }
}

#[async_trait::async_trait]
impl BackgroundService for OverrideExpiry {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(OVERRIDE_TICK);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let (expired, now_s) = self.tick();
                    self.clients.expired(&expired, now_s).await;
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Samples what the status page charts.
pub(super) struct StatusSampler {
    pub(super) state: Arc<AppState>,
}

#[async_trait::async_trait]
impl BackgroundService for StatusSampler {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(crate::admin::status::STEP);
        // A stalled process takes its next sample a step later, not a burst
        // of samples a moment apart.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let runtime = self.state.runtime.load();
                    self.state.status.tick(self.state.store.deciding(), runtime.limits());
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Hears of the keys an operator reset or credited through another
/// instance (`limiter::redis::changes`).
pub(super) struct ChangesListener {
    pub(super) settings: RedisSettings,
    pub(super) forgetter: Forgetter,
    /// The state decided in process while Redis was away.
    pub(super) local: Arc<MemoryStore>,
}

#[async_trait::async_trait]
impl BackgroundService for ChangesListener {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let listen = changes::listen(
            self.settings.clone(),
            self.forgetter.clone(),
            self.local.clone(),
        );
        tokio::select! {
            _ = listen => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Follows the run-time clients kept in Redis (`clients::RedisClients`).
pub(super) struct ClientsFollower {
    pub(super) redis: Arc<crate::clients::RedisClients>,
}

#[async_trait::async_trait]
impl BackgroundService for ClientsFollower {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.redis.clone().follow() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// `instances = "auto"`: keeps this instance counted (`limiter::Roster`).
pub(super) struct Counting {
    pub(super) roster: Arc<Roster>,
}

#[async_trait::async_trait]
impl BackgroundService for Counting {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        self.roster
            .run(async move {
                let _ = shutdown.changed().await;
            })
            .await;
    }
}
