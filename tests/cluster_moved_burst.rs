//! A burst of concurrent requests on a slot that moved to another master
//! while the proxy's slot map still names the old one: every call is
//! answered MOVED at once, and the client refreshes its slot map while the
//! rest of the burst is in flight. redis-rs 1.8's cluster client wedged
//! there for good (the refresh waits for the client's connection map,
//! whose lock calls it no longer polls hold): every later call went
//! unanswered and the proxy stayed on its fallback. floodgate keeps at
//! most 16 calls in flight on a cluster connection, and replaces one on
//! which a call missed its deadline.

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

#[test]
fn a_burst_on_a_moved_slot_leaves_the_proxy_deciding_on_redis() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
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

        // Deciding on Redis again: one more call on the moved slot is
        // answered by Redis within its deadline, not by the fallback.
        let since = Instant::now();
        let back = wait_until(Duration::from_secs(10), || {
            let failures = proxy.metric("floodgate_redis_failures_total");
            request(proxy.addr, "GET", "/", &[("X-Client", &client)], b"");
            proxy.metric("floodgate_fallback_active") == 0.0
                && proxy.metric("floodgate_redis_failures_total") == failures
        });
        assert!(
            back,
            "round {round}: still deciding beside Redis {:?} after a burst on moved slot {slot} ({missed} calls had missed their deadline)",
            since.elapsed()
        );
        stalls.push((missed, since.elapsed()));
    }
    record(
        "cluster_moved_burst",
        &format!(
            "250 requests at once on a just-moved slot, 4 rounds: (calls that missed the 1 s deadline, time until deciding on Redis again) {stalls:?}\n"
        ),
    );
}
