//! A burst of concurrent requests on slots that moved to another master
//! while the proxy's slot map still names the old one: every call is
//! answered MOVED at once, and the client refreshes its slot map while the
//! rest of the burst is in flight. redis-rs 1.8's cluster client wedged
//! there for good (the refresh waits for the client's connection map,
//! whose lock calls it no longer polls hold): every later call went
//! unanswered and the proxy stayed on its fallback. floodgate keeps at
//! most 16 calls in flight on a cluster connection, and replaces one on
//! which a call missed its deadline.
//!
//! One client's burst is one hot key, whose decisions share script runs
//! (a handful of calls); a burst spread over many clients on many moved
//! slots puts far more than 16 calls in flight at once.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::RedisCluster;
use common::*;

/// The cluster node holding `client`'s key for the `per-client` limit, and
/// the key, once a request has made it.
fn key_of(cluster: &RedisCluster, before: &[Vec<String>]) -> (usize, String) {
    let now = cluster.keys_per_node();
    now.iter()
        .zip(before)
        .enumerate()
        .find_map(|(i, (keys, old))| {
            keys.iter()
                .find(|k| k.contains(":per-client:") && !old.contains(k))
                .map(|k| (i, k.clone()))
        })
        .expect("the client's key on some node")
}

/// Moves `slot` (emptied first) from `from` to `to`, as every node sees it.
fn move_slot(cluster: &RedisCluster, slot: &str, to: usize) {
    let target = cluster.node_id(to);
    for node in &cluster.nodes {
        let _: String = node.cmd(&["CLUSTER", "SETSLOT", slot, "NODE", &target]);
    }
}

fn proxy_on(cluster: &RedisCluster, upstream: &Upstream) -> Proxy {
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .redis_cluster(&cluster.urls())
        .redis_lines("timeout = \"1s\"\non_failure = \"local\"\ninstances = 1\nleases = \"off\"")
        .limit(Limit::fixed_window(
            "per-client",
            "header:X-Client",
            100_000,
            "1h",
        ))
        .start();
    assert!(
        wait_until(Duration::from_secs(15), || {
            request(proxy.addr, "GET", "/", &[("X-Client", "warm-up")], b"");
            proxy.metric("floodgate_fallback_active") == 0.0
        }),
        "the proxy never decided on the cluster"
    );
    proxy
}

/// Until a call on a moved slot is answered by Redis within its deadline,
/// not by the fallback; how long that took.
fn back_on_redis(proxy: &Proxy, client: &str, what: &str) -> Duration {
    let since = Instant::now();
    let back = wait_until(Duration::from_secs(10), || {
        let failures = proxy.metric("floodgate_redis_failures_total");
        request(proxy.addr, "GET", "/", &[("X-Client", client)], b"");
        proxy.metric("floodgate_fallback_active") == 0.0
            && proxy.metric("floodgate_redis_failures_total") == failures
    });
    assert!(
        back,
        "{what}: still deciding beside Redis {:?} after the burst",
        since.elapsed()
    );
    since.elapsed()
}

#[test]
fn a_burst_on_a_moved_slot_leaves_the_proxy_deciding_on_redis() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let proxy = proxy_on(&cluster, &upstream);

    let mut stalls = Vec::new();
    for round in 0..4 {
        let client = format!("mover-{round}");
        let before = cluster.keys_per_node();
        let first = request(proxy.addr, "GET", "/", &[("X-Client", &client)], b"");
        assert_eq!(first.status, 200, "{}", first.body);
        let (owner, key) = key_of(&cluster, &before);
        let slot: i64 = cluster.nodes[owner].cmd(&["CLUSTER", "KEYSLOT", &key]);
        let _: i64 = cluster.nodes[owner].cmd(&["DEL", &key]);
        move_slot(&cluster, &slot.to_string(), (owner + 1) % 3);

        let failures_before = proxy.metric("floodgate_redis_failures_total");
        let answers = burst(&[proxy.addr], 250, "GET", "/", &[("X-Client", &client)]);
        assert_eq!(count_status(&answers, 200), 250, "every request admitted");
        let missed = proxy.metric("floodgate_redis_failures_total") - failures_before;
        assert_eq!(
            missed, 0.0,
            "round {round}: calls on moved slot {slot} missed their deadline, and the fallback decided them"
        );

        let took = back_on_redis(&proxy, &client, &format!("round {round}, slot {slot}"));
        stalls.push((missed, took));
    }
    record(
        "cluster_moved_burst",
        &format!(
            "250 requests at once on a just-moved slot, 4 rounds: (calls that missed the 1 s deadline, time until deciding on Redis again) {stalls:?}\n"
        ),
    );
}

#[test]
fn a_burst_spread_over_many_moved_slots_leaves_the_proxy_deciding_on_redis() {
    const CLIENTS: usize = 64;
    const PER_CLIENT: usize = 4;
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let proxy = proxy_on(&cluster, &upstream);
    let client = |i: usize| format!("spread-{i}");

    // Each client's key made, then its slot emptied and moved to the next
    // master: the proxy's slot map now names the wrong master for all.
    let before = cluster.keys_per_node();
    for i in 0..CLIENTS {
        let made = request(proxy.addr, "GET", "/", &[("X-Client", &client(i))], b"");
        assert_eq!(made.status, 200, "{}", made.body);
    }
    let mut moved = std::collections::BTreeMap::new();
    for (owner, (keys, old)) in cluster.keys_per_node().iter().zip(&before).enumerate() {
        for key in keys
            .iter()
            .filter(|k| k.contains(":per-client:") && !old.contains(k))
        {
            let slot: i64 = cluster.nodes[owner].cmd(&["CLUSTER", "KEYSLOT", key]);
            let _: i64 = cluster.nodes[owner].cmd(&["DEL", key]);
            moved.insert(slot, owner);
        }
    }
    assert!(
        moved.len() > 16 * 2,
        "{} slots for {CLIENTS} clients: too few to put more than 16 calls in flight",
        moved.len()
    );
    for (slot, owner) in &moved {
        move_slot(&cluster, &slot.to_string(), (owner + 1) % 3);
    }

    let failures_before = proxy.metric("floodgate_redis_failures_total");
    let answers = burst_with(&[proxy.addr], CLIENTS * PER_CLIENT, "GET", "/", |i| {
        vec![("X-Client".to_string(), client(i % CLIENTS))]
    });
    assert_eq!(
        count_status(&answers, 200),
        CLIENTS * PER_CLIENT,
        "every request admitted"
    );
    let missed = proxy.metric("floodgate_redis_failures_total") - failures_before;
    assert_eq!(
        missed,
        0.0,
        "calls on {} moved slots missed their deadline, and the fallback decided them",
        moved.len()
    );
    let took = back_on_redis(&proxy, &client(0), "spread burst");
    // Every moved slot's key was made again by the burst, on the master
    // the slot moved to: decided there, not beside Redis.
    let remade: Vec<(i64, usize)> = cluster
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(at, node)| {
            node.keys()
                .into_iter()
                .filter(|k| k.contains(":per-client:"))
                .map(move |k| (node.cmd::<i64>(&["CLUSTER", "KEYSLOT", &k]), at))
        })
        .collect();
    for (slot, owner) in &moved {
        assert!(
            remade.contains(&(*slot, (owner + 1) % 3)),
            "slot {slot}: no key on the master it moved to"
        );
    }
    record(
        "cluster_moved_burst_spread",
        &format!(
            "{} requests at once from {CLIENTS} clients on {} just-moved slots: {missed} calls missed the 1 s deadline; deciding on Redis again after {took:?}\n",
            CLIENTS * PER_CLIENT,
            moved.len()
        ),
    );
}
