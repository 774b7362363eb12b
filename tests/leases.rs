//! Leases end to end: real redis-server processes, real floodgate processes
//! sharing them, a real upstream counting what arrives. Redis stays off the
//! hot path far from a limit, decides every request near it, and no proxy
//! admits more than the shared budget, whatever happens to Redis.

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::*;

fn on_redis(upstream: &Upstream, url: &str) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .redis(url)
        .redis_lines("timeout = \"2s\"")
        .admin()
}

/// `total` GETs over `connections` keep-alive connections at once.
fn keepalive_load(proxy: &Proxy, connections: usize, total: usize) -> Vec<u16> {
    let addr = proxy.addr;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..connections)
            .map(|_| {
                s.spawn(move || keepalive_gets(addr, "/", vec![Vec::new(); total / connections]))
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    })
}

/// The one state key of `limit` in Redis, once there is one.
fn state_key(redis: &RedisServer, limit: &str) -> String {
    let prefix = format!("floodgate:{limit}:");
    let mut found = None;
    assert!(
        wait_until(Duration::from_secs(5), || {
            found = redis.keys().into_iter().find(|k| k.starts_with(&prefix));
            found.is_some()
        }),
        "no key for {limit}: {:?}",
        redis.keys()
    );
    found.unwrap_or_default()
}

/// A fixed window's count in Redis.
fn window_count(redis: &RedisServer, key: &str) -> u64 {
    let n: Option<String> = redis.cmd(&["HGET", key, "n"]);
    n.and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[test]
fn a_hot_key_far_from_its_limit_costs_redis_almost_nothing() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let proxy = on_redis(&upstream, &redis.url())
        .limit(Limit::fixed_window("global", "global", 1_000_000, "1m"))
        .start();
    assert_eq!(proxy.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let statuses = keepalive_load(&proxy, 8, 2_000);
    let admitted = count_status(&statuses, 200);
    assert_eq!(admitted, 2_000, "far from the limit everyone is admitted");
    assert_eq!(upstream.count(), 2_001);
    let calls = redis.calls("evalsha");
    let per_request = calls as f64 / admitted as f64;
    assert!(
        per_request <= 0.02,
        "{calls} script calls for {admitted} admitted requests"
    );
    assert!(proxy.metric("floodgate_redis_lease_decisions_total") >= 1_900.0);
    record(
        "leases_hot_key",
        &format!("8 keep-alive connections x 250 requests on one global key (1,000,000/min): {admitted} admitted, {calls} EVALSHA ({per_request:.4} per admitted request)\n"),
    );
}

#[test]
fn near_the_limit_every_request_is_decided_by_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Ten instances share 10 units: a lease would take more than the
    // share of one, so none is ever taken.
    let proxy = on_redis(&upstream, &redis.url())
        .redis_lines("instances = 10")
        .limit(Limit::fixed_window("tight", "global", 10, "1m"))
        .start();
    assert_eq!(proxy.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let statuses = keepalive_load(&proxy, 1, 9);
    assert_eq!(count_status(&statuses, 200), 9);
    assert_eq!(redis.calls("evalsha"), 9, "one script call per request");
    assert_eq!(proxy.metric("floodgate_redis_leases_total"), 0.0);
    assert_eq!(proxy.get("/").status, 429);
}

#[test]
fn three_proxies_with_leases_never_pass_the_limit_and_lose_nothing_once_leases_end() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = on_redis(&upstream, &redis.url())
        .redis_lines("instances = 3")
        .limit(Limit::fixed_window("shared", "global", 100, "10m"));
    let proxies: Vec<Proxy> = (0..3).map(|_| config.start()).collect();
    let addrs: Vec<_> = proxies.iter().map(|p| p.addr).collect();
    let first = burst(&addrs, 600, "GET", "/", &[]);
    let admitted = count_status(&first, 200);
    assert!(admitted <= 100, "{admitted} admitted of a limit of 100");
    assert_eq!(upstream.count(), admitted);
    for proxy in &proxies {
        assert_eq!(
            proxy.metric("floodgate_fallback_decisions_total"),
            0.0,
            "every decision was Redis's or a lease's"
        );
    }
    assert!(
        proxies
            .iter()
            .any(|p| p.metric("floodgate_redis_leases_total") > 0.0),
        "no lease was taken"
    );
    // Every lease ends within a second; what was not used goes back, and
    // the shared count is then exactly what was admitted.
    let key = state_key(&redis, "shared");
    assert!(
        wait_until(Duration::from_secs(5), || window_count(&redis, &key)
            == admitted as u64),
        "Redis counts {} for {admitted} admitted",
        window_count(&redis, &key)
    );
    let second = burst(&addrs, 300, "GET", "/", &[]);
    let more = count_status(&second, 200);
    assert!(admitted + more <= 100, "{admitted} + {more} admitted");
    assert!(
        wait_until(Duration::from_secs(5), || window_count(&redis, &key)
            == (admitted + more) as u64),
        "leases gave back what they did not use"
    );
    // Only what a lease still held at the burst's end went unused, and it
    // came back: a last sequential pass spends the budget to the unit.
    let mut last = 0;
    for _ in 0..120 {
        if proxies[last % 3].get("/").status == 200 {
            last += 1;
        }
    }
    assert_eq!(admitted + more + last, 100, "the whole budget, exactly");
    record(
        "leases_exactness",
        &format!("3 proxies, fixed window of 100: 600 at once -> {admitted} admitted; 300 more -> {more}; then one at a time -> {last}: {} in all\n", admitted + more + last),
    );
}

#[test]
fn redis_killed_mid_lease_admits_at_most_what_was_leased_and_counts_nothing_twice() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .redis(&redis.url())
        .admin()
        .redis_lines("on_failure = \"deny\"\ntimeout = \"200ms\"")
        .limit(Limit::fixed_window("hot", "global", 1_000, "10m"))
        .start();
    assert_eq!(proxy.get("/").status, 200);
    let leased = proxy.metric("floodgate_redis_leases_total");
    assert_eq!(leased, 1.0);
    let key = state_key(&redis, "hot");
    // 1 request and a lease of 100 (the most one lease takes).
    assert_eq!(window_count(&redis, &key), 101);
    redis.kill();
    let during = keepalive_load(&proxy, 1, 300);
    let admitted = count_status(&during, 200);
    assert!(
        admitted <= 100,
        "{admitted} admitted with Redis down: more than the lease held"
    );
    assert_eq!(
        count_status(&during, 429) + admitted,
        300,
        "on_failure = \"deny\" answers the rest"
    );
    redis.restart();
    assert!(
        wait_until(Duration::from_secs(10), || proxy
            .admin_get("/readyz")
            .body
            .starts_with("ready")),
        "decisions back on Redis"
    );
    // Listening again for operators' changes: what was announced while
    // nobody listened is unknown, so the leases held then were dropped.
    assert!(
        wait_until(Duration::from_secs(10), || proxy
            .log()
            .contains("listening again for operators' changes")),
        "the changes channel is heard again"
    );
    // A Redis that lost its state starts the window afresh: a returned
    // lease must not add to it, nor a dead one be spent against it.
    upstream.reset();
    let after = keepalive_load(&proxy, 4, 1_200);
    assert_eq!(count_status(&after, 200), 1_000);
    assert_eq!(upstream.count(), 1_000);
}

#[test]
fn a_limit_can_decide_every_request_on_redis_and_leases_can_be_off() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let proxy = on_redis(&upstream, &redis.url())
        .limit(Limit::fixed_window("per-request", "global", 100_000, "1m").line("leases = \"off\""))
        .start();
    assert_eq!(proxy.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let statuses = keepalive_load(&proxy, 1, 20);
    assert_eq!(count_status(&statuses, 200), 20);
    assert_eq!(redis.calls("evalsha"), 20);
    let everywhere = on_redis(&upstream, &redis.url())
        .redis_lines("leases = \"off\"")
        .limit(Limit::fixed_window(
            "per-request-too",
            "global",
            100_000,
            "1m",
        ))
        .start();
    assert_eq!(everywhere.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let statuses = keepalive_load(&everywhere, 1, 20);
    assert_eq!(count_status(&statuses, 200), 20);
    assert_eq!(redis.calls("evalsha"), 20);
}
