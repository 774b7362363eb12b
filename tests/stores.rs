//! The store contract, held by every store on real parts: the memory store,
//! one redis-server and a three-node Redis Cluster answer the same calls
//! alike. A peek charges nothing; a reset gives the identity its whole
//! budget back and leaves others alone; a decision is all-or-nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::{RedisCluster as LocalCluster, RedisServer};
use floodgate_algorithm::{Algorithm, Decision};
use floodgate_limiter::clock::ManualClock;
use floodgate_limiter::redis::{InstanceCount, Topology};
use floodgate_limiter::StateKey;
use floodgate_limiter::{
    Check, ClockSource, Enforcement, Leasing, LimitName, MemoryStore, OnFailure, RedisCluster,
    RedisSettings, RedisStandalone, Spending, Store,
};

const SEC: u64 = 1_000_000;
const T0: u64 = 1_800_000_000 * SEC;

fn check(name: &str, limit: u64, identity: u128, cost: u64) -> Check {
    Check {
        limit: floodgate_limiter::LimitId(0),
        name: LimitName::new(name),
        algorithm: Algorithm::fixed_window(limit, 3_600 * SEC).expect("valid numbers"),
        key: StateKey {
            limit: name.len() as u64,
            identity,
        },
        cost,
        enforcement: Enforcement::Enforce,
        spending: Spending::Charge,
        on_failure: OnFailure::Deny,
        leasing: Leasing::Never,
    }
}

fn settings(topology: Topology) -> RedisSettings {
    RedisSettings {
        topology,
        timeout: Duration::from_secs(5),
        // The test's clock, so that every store sees the same instant.
        clock: ClockSource::Local,
        key_prefix: "contract".into(),
        on_failure: OnFailure::Deny,
        instances: InstanceCount::Fixed(1),
        tls_ca: None,
        leases: None,
    }
}

fn remaining(decisions: &[Decision]) -> Vec<u64> {
    decisions.iter().map(Decision::remaining).collect()
}

/// The contract, against one store.
async fn holds_the_contract(store: &dyn Store) {
    let mine = check("per-ip", 5, 1, 1);
    let other = check("per-ip", 5, 2, 1);
    let account = check("per-account", 2, 1, 1);

    // A peek, even repeated, charges nothing.
    for _ in 0..3 {
        let peeked = store.peek(std::slice::from_ref(&mine)).await.expect("peek");
        assert_eq!(remaining(&peeked), vec![4], "{:?}", store.deciding());
    }
    // Two layers, all-or-nothing: the account layer refuses the third
    // request, and per-ip is not charged for it.
    let both = [mine.clone(), account.clone()];
    for left in [(4, 1), (3, 0)] {
        let d = store.decide(&both).await.expect("decide");
        assert!(d.iter().all(Decision::allowed));
        assert_eq!((d[0].remaining(), d[1].remaining()), left);
    }
    let refused = store.decide(&both).await.expect("decide");
    assert!(refused[0].allowed() && !refused[1].allowed());
    assert!(refused[1].retry_after_us() > 0);
    let peeked = store.peek(std::slice::from_ref(&mine)).await.expect("peek");
    assert_eq!(remaining(&peeked), vec![2], "per-ip was charged twice only");
    // A peek of cost 0 reads the state.
    let read = store
        .peek(&[check("per-account", 2, 1, 0)])
        .await
        .expect("peek");
    assert_eq!(remaining(&read), vec![0]);

    // Another identity is untouched by all of this, and by the reset below.
    store
        .decide(std::slice::from_ref(&other))
        .await
        .expect("decide");
    store.reset(&both).await.expect("reset");
    let fresh = store.peek(&both).await.expect("peek");
    assert_eq!(remaining(&fresh), vec![4, 1], "the whole budget is back");
    let kept = store.peek(&[other]).await.expect("peek");
    assert_eq!(
        remaining(&kept),
        vec![3],
        "the other identity kept its state"
    );

    // A lookup that refuses on one identity (a ban on the address) keeps
    // a layer of another identity (the account) from being charged: the
    // decision is all-or-nothing across identities too.
    let spent = check("ban", 1, 9, 1);
    store
        .decide(std::slice::from_ref(&spent))
        .await
        .expect("decide");
    let lookup = Check {
        spending: Spending::Peek,
        ..spent
    };
    let victim = check("per-account", 2, 10, 1);
    for _ in 0..3 {
        let d = store
            .decide(&[lookup.clone(), victim.clone()])
            .await
            .expect("decide");
        assert!(!d[0].allowed(), "banned");
    }
    let untouched = store
        .peek(std::slice::from_ref(&victim))
        .await
        .expect("peek");
    assert_eq!(
        remaining(&untouched),
        vec![1],
        "the account was not charged"
    );

    store.probe().await.expect("probe");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn the_memory_store_holds_the_contract() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(1000, clock);
    runtime().block_on(holds_the_contract(&store));
}

#[test]
fn a_redis_server_holds_the_contract() {
    let redis = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisStandalone::new(settings(Topology::Standalone(redis.url())), clock);
    runtime().block_on(holds_the_contract(&store));
    assert!(
        redis
            .keys()
            .iter()
            .any(|k| k.starts_with("contract:per-ip:")),
        "{:?}",
        redis.keys()
    );
}

#[test]
fn a_redis_cluster_holds_the_contract() {
    let cluster = LocalCluster::start();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisCluster::new(settings(Topology::Cluster(cluster.urls())), clock);
    runtime().block_on(holds_the_contract(&store));
    let keys: usize = cluster.keys_per_node().iter().map(Vec::len).sum();
    assert!(keys > 0, "state lives on the cluster");
}
