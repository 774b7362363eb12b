//! The store decisions are made in: the memory store alone, or Redis
//! (standalone, Sentinel or a cluster) with the refusals it gave
//! remembered, leases of its budgets, and the memory store to decide in
//! while it cannot answer.

use std::sync::Arc;

use crate::config::Config;
use crate::server::background::ChangesListener;
use crate::server::metrics::Metrics;
use floodgate_limiter::clock::Clock;
use floodgate_limiter::redis::{InstanceCount, Topology};
use floodgate_limiter::{
    Fallback, Forgetter, Instances, KnownRefusals, Leased, MemoryStore, RedisCluster,
    RedisSettings, RedisStandalone, Roster, Store,
};

/// The store decisions are made in, and what runs beside it.
pub(super) struct Stores {
    pub(super) store: Arc<dyn Store>,
    /// With Redis: hears of other instances' operators' changes.
    pub(super) changes: Option<ChangesListener>,
    /// With Redis: the instances sharing it.
    pub(super) instances: Option<Instances>,
    /// With `instances = "auto"`: this instance's place in the count.
    pub(super) roster: Option<Arc<Roster>>,
}

/// The memory store, and Redis in front of it with `[redis]`.
pub(super) fn stores(config: &Config, metrics: &Metrics, clock: Arc<dyn Clock>) -> Stores {
    let memory = Arc::new(
        MemoryStore::new(config.max_keys, clock.clone())
            .with_overflow_metric(metrics.local_overflow.clone()),
    );
    match &config.redis {
        None => Stores {
            store: memory,
            changes: None,
            instances: None,
            roster: None,
        },
        Some(settings) => {
            let shared = redis_store(settings, memory.clone(), metrics, clock);
            Stores {
                store: shared.store,
                changes: Some(ChangesListener {
                    settings: settings.clone(),
                    forgetter: shared.forgetter,
                    local: memory,
                }),
                instances: Some(shared.instances),
                roster: shared.roster,
            }
        }
    }
}

/// Keys whose refusal by Redis is remembered, so that a refused client's
/// retries cost no Redis call until its retry time.
const KNOWN_REFUSALS: usize = 100_000;

/// `shared` behind the circuit breaker, deciding by `on_failure` (in
/// `memory` for "local") while it cannot answer.
fn with_fallback<S: Store + 'static>(shared: S, parts: &StoreParts<'_>) -> Arc<dyn Store> {
    Arc::new(Fallback::new(
        shared,
        parts.memory.clone(),
        parts.instances.clone(),
        parts.metrics.redis.clone(),
        parts.clock.clone(),
    ))
}

/// What every layer of the shared store is built with.
struct StoreParts<'a> {
    settings: &'a RedisSettings,
    memory: Arc<MemoryStore>,
    metrics: &'a Metrics,
    clock: Arc<dyn Clock>,
    instances: Instances,
}

/// The shared store and what runs beside it.
struct SharedStore {
    store: Arc<dyn Store>,
    /// Forgets remembered refusals when another instance announces an
    /// operator's change (`changes`).
    forgetter: Forgetter,
    instances: Instances,
    /// With `instances = "auto"`: this instance's place in the count.
    roster: Option<Arc<Roster>>,
}

/// The shared store, with the refusals it gave remembered and `on_failure`
/// (deciding in `memory` for "local") when it cannot answer.
fn redis_store(
    settings: &RedisSettings,
    memory: Arc<MemoryStore>,
    metrics: &Metrics,
    clock: Arc<dyn Clock>,
) -> SharedStore {
    fn wrap<S: Store + 'static>(shared: S, parts: &StoreParts<'_>) -> (Arc<dyn Store>, Forgetter) {
        let settings = parts.settings;
        let mut remembering = KnownRefusals::new(shared, KNOWN_REFUSALS, parts.clock.clone());
        if let Some(leases) = settings.leases {
            remembering = remembering.with_lease_ttl(leases.ttl_us);
        }
        let forgetter = remembering.forgetter();
        let Some(leases) = settings.leases else {
            return (with_fallback(remembering, parts), forgetter);
        };
        let leased = Leased::new(
            remembering,
            leases,
            parts.instances.clone(),
            settings.timeout,
            parts.clock.clone(),
        )
        .until_listening()
        .with_metrics(parts.metrics.redis.leases.clone());
        let forgetter = forgetter.and(leased.forgetter());
        (with_fallback(leased, parts), forgetter)
    }
    let instances = match settings.instances {
        InstanceCount::Fixed(n) => Instances::fixed(n),
        InstanceCount::Auto => Instances::counted(),
    };
    let parts = StoreParts {
        settings,
        memory,
        metrics,
        clock: clock.clone(),
        instances: instances.clone(),
    };
    let timer = metrics.redis.call_seconds.clone();
    // The roster has a connection of its own, outside the breaker: its
    // count must come from Redis or not at all.
    let (store, forgetter, roster_store): (_, _, Arc<dyn Store>) = match &settings.topology {
        Topology::Standalone(_) | Topology::Sentinel(_) => {
            let (store, forgetter) = wrap(
                RedisStandalone::new(settings.clone(), clock.clone()).with_call_timer(timer),
                &parts,
            );
            let roster = Arc::new(RedisStandalone::new(settings.clone(), clock));
            (store, forgetter, roster)
        }
        Topology::Cluster(_) => {
            let (store, forgetter) = wrap(
                RedisCluster::new(settings.clone(), clock.clone()).with_call_timer(timer),
                &parts,
            );
            let roster = Arc::new(RedisCluster::new(settings.clone(), clock));
            (store, forgetter, roster)
        }
    };
    metrics.redis.instances.set(instances.get() as i64);
    let roster = instances.is_counted().then(|| {
        Arc::new(Roster::new(
            roster_store,
            instances.clone(),
            metrics.redis.instances.clone(),
        ))
    });
    SharedStore {
        store,
        forgetter,
        instances,
        roster,
    }
}
