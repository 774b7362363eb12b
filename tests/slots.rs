//! Concurrency slots on every store: crates/limiter/lua/slots.lua against its Rust twin
//! (`algorithm::Slots` in the memory store) over random acquire, renew and
//! release sequences on the same manual clock; and the same contract held
//! by the memory store, one redis-server and a real three-node cluster.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::{RedisCluster as LocalCluster, RedisServer};
use common::Rng;
use floodgate_algorithm::Decision;
use floodgate_limiter::clock::ManualClock;
use floodgate_limiter::redis::{InstanceCount, Topology};
use floodgate_limiter::StateKey;
use floodgate_limiter::{
    ClockSource, Concurrency, LimitName, MemoryStore, OnFailure, RedisCluster, RedisSettings,
    RedisStandalone, Slot, Store,
};

const SEC: u64 = 1_000_000;
const T0: u64 = 1_800_000_000 * SEC;

fn settings(topology: Topology) -> RedisSettings {
    RedisSettings {
        topology,
        timeout: Duration::from_secs(5),
        clock: ClockSource::Local,
        key_prefix: "slots".into(),
        on_failure: OnFailure::Deny,
        instances: InstanceCount::Fixed(1),
        tls_ca: None,
        leases: None,
    }
}

fn slot(identity: u128, max: u64, lease_us: u64, lease_id: u64) -> Slot {
    let key = StateKey { limit: 9, identity };
    Slot::new(
        LimitName::new("in-flight"),
        key,
        max,
        lease_us,
        lease_id,
        OnFailure::Deny,
    )
    .expect("a valid slot")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[derive(Debug, PartialEq)]
enum Answer {
    Acquired(Decision),
    Renewed(bool),
    Released(bool),
}

#[test]
fn the_slots_script_matches_its_rust_twin() {
    let redis = RedisServer::start();
    let runtime = runtime();
    let mut rng = Rng(0x5107);
    let clock = Arc::new(ManualClock::new(T0 + rng.below(1 << 30)));
    let remote = RedisStandalone::new(settings(Topology::Standalone(redis.url())), clock.clone());
    let local = MemoryStore::new(1000, clock.clone());
    let mut taken: Vec<(u128, u64)> = Vec::new();
    let (mut admitted, mut refused, mut lost) = (0, 0, 0);
    for step in 0..6_000u64 {
        // Steps mostly short against 1-3 s leases, now and then past them.
        clock.advance(match rng.below(10) {
            0 => 3 * SEC,
            1 => 0,
            _ => rng.below(SEC / 4),
        });
        let identity = u128::from(rng.below(3));
        let max = 1 + rng.below(4);
        let lease_us = SEC + rng.below(2 * SEC);
        let (call, target) = match (rng.below(3), taken.is_empty()) {
            (0, false) | (1, false) => {
                let (identity, id) = taken[rng.below(taken.len() as u64) as usize];
                (rng.below(2), slot(identity, max, lease_us, id))
            }
            // Now and then an acquisition retried under a lease id already
            // taken (a retry after a lost reply).
            (2, false) if rng.below(8) == 0 => {
                let (identity, id) = taken[rng.below(taken.len() as u64) as usize];
                (2, slot(identity, max, lease_us, id))
            }
            _ => (2, slot(identity, max, lease_us, step)),
        };
        let ask = |store: &dyn Store| {
            runtime.block_on(async {
                match call {
                    0 => Answer::Renewed(store.renew(&target).await.expect("renew")),
                    1 => Answer::Released(store.release(&target).await.expect("release")),
                    _ => Answer::Acquired(store.acquire(&target).await.expect("acquire")),
                }
            })
        };
        let expected = ask(&local);
        let got = ask(&remote);
        assert_eq!(got, expected, "step {step}: {target:?}");
        match expected {
            Answer::Acquired(d) if d.allowed() => {
                admitted += 1;
                taken.push((target.key().identity, target.lease_id()));
            }
            Answer::Acquired(_) => refused += 1,
            Answer::Renewed(false) => lost += 1,
            _ => {}
        }
    }
    // Every branch was compared many times.
    assert!(
        admitted > 500 && refused > 200 && lost > 100,
        "{admitted} {refused} {lost}"
    );
}

/// The contract, against one store.
async fn holds_the_contract(store: &dyn Store, clock: &ManualClock) {
    let lease = 10 * SEC;
    for id in 1..=3 {
        let d = store
            .acquire(&slot(1, 3, lease, id))
            .await
            .expect("acquire");
        assert!(d.allowed());
        assert_eq!(d.remaining(), 3 - id);
    }
    let full = store.acquire(&slot(1, 3, lease, 4)).await.expect("acquire");
    assert!(!full.allowed());
    assert_eq!(
        full.retry_after_us(),
        lease,
        "until the first lease would end"
    );
    // Another key has its own slots.
    assert!(store
        .acquire(&slot(2, 3, lease, 5))
        .await
        .expect("acquire")
        .allowed());
    // A release frees one at once, once.
    assert!(store.release(&slot(1, 3, lease, 2)).await.expect("release"));
    assert!(!store.release(&slot(1, 3, lease, 2)).await.expect("release"));
    assert!(store
        .acquire(&slot(1, 3, lease, 6))
        .await
        .expect("acquire")
        .allowed());
    // Leases not renewed come back after their length; a renewed one stays.
    clock.advance(lease - 1);
    assert!(store.renew(&slot(1, 3, lease, 1)).await.expect("renew"));
    clock.advance(1);
    assert!(
        !store.renew(&slot(1, 3, lease, 3)).await.expect("renew"),
        "expired"
    );
    let after = store.acquire(&slot(1, 3, lease, 7)).await.expect("acquire");
    assert!(after.allowed());
    assert_eq!(
        after.remaining(),
        1,
        "lease 1 renewed and 7 held; 3 and 6 ended with their leases"
    );
}

#[test]
fn the_memory_store_holds_slots() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(1000, clock.clone());
    runtime().block_on(holds_the_contract(&store, &clock));
}

#[test]
fn a_redis_server_holds_slots_that_outlive_the_process_that_took_them() {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisStandalone::new(settings(Topology::Standalone(redis.url())), clock.clone());
    // One runtime: a store's connection lives on the runtime that made it.
    let runtime = runtime();
    runtime.block_on(holds_the_contract(&store, &clock));
    // A second store (another instance) shares the slots the first holds.
    let other = RedisStandalone::new(settings(Topology::Standalone(redis.url())), clock.clone());
    let acquire = |store: &RedisStandalone, id| {
        runtime
            .block_on(store.acquire(&slot(1, 3, 10 * SEC, id)))
            .expect("acquire")
    };
    assert!(acquire(&store, 8).allowed(), "the third slot");
    assert!(!acquire(&other, 9).allowed(), "all three held by the first");
    assert!(runtime
        .block_on(store.release(&slot(1, 3, 10 * SEC, 8)))
        .expect("release"));
    assert!(
        acquire(&other, 9).allowed(),
        "freed by the first, taken by the second"
    );
}

#[test]
fn a_redis_cluster_holds_slots() {
    let cluster = LocalCluster::start();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisCluster::new(settings(Topology::Cluster(cluster.urls())), clock.clone());
    runtime().block_on(holds_the_contract(&store, &clock));
}
