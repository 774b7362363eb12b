//! Leases end to end: real redis-server processes, real floodgate processes
//! sharing them, a real upstream counting what arrives. Redis stays off the
//! hot path far from a limit, decides every request near it, and no proxy
//! admits more than the shared budget, whatever happens to Redis.

mod common;

use std::time::Duration;

use common::admin_token::{TokenFile, TOKEN};
use common::redis_server::RedisServer;
use common::*;

fn on_redis(upstream: &Upstream, url: &str) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .redis(url)
        .redis_lines("timeout = \"2s\"")
        .admin()
}

/// `proxy`, once it leases: from its first subscription to operators'
/// changes on (before, every request is decided on Redis).
fn leasing(proxy: Proxy) -> Proxy {
    proxy.await_log(
        "leases from now on",
        "never listened for operators' changes",
    );
    proxy
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

/// Tokens a bucket refilling one a day counts as spent, by its state in
/// Redis ("tat[.ps] [epoch_end epoch current previous]"): its debt or its
/// ledger's units outstanding, whichever is more.
fn bucket_spent(redis: &RedisServer, key: &str) -> Option<u64> {
    const DAY_US: u64 = 86_400_000_000;
    let state: Option<String> = redis.cmd(&["GET", key]);
    let state = state?;
    let mut fields = state.split(' ');
    let tat_us: u64 = fields.next()?.split('.').next()?.parse().ok()?;
    let ledger: Vec<u64> = fields.map(str::parse).collect::<Result<_, _>>().ok()?;
    let outstanding = match ledger[..] {
        [_, _, current, previous] => current + previous,
        _ => 0,
    };
    let time: Vec<String> = redis.cmd(&["TIME"]);
    let now_us =
        time.first()?.parse::<u64>().ok()? * 1_000_000 + time.get(1)?.parse::<u64>().ok()?;
    Some(
        tat_us
            .saturating_sub(now_us)
            .div_ceil(DAY_US)
            .max(outstanding),
    )
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
    let proxy = leasing(
        on_redis(&upstream, &redis.url())
            .limit(Limit::fixed_window("global", "global", 1_000_000, "1m"))
            .start(),
    );
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

/// The script calls `instances` proxies may make for `admitted` requests
/// far from a bucket's limit, over `elapsed`: one per lease of 100 at
/// most every 50 requests (0.02), and one per instance whenever a lease's
/// life ends before it is spent, a tenth of the bucket's time to fill or
/// `lease_ttl` (1 s), whichever is shorter. How many lives pass depends on
/// how fast this machine serves the load; before the bucket's ledger a
/// fast bucket cost 0.4375 calls a request. With the life, for the figures.
fn fast_bucket_calls_bound(
    admitted: usize,
    capacity: u64,
    rate: f64,
    elapsed: Duration,
    instances: u64,
) -> (u64, Duration) {
    let life = Duration::from_secs(1).min(Duration::from_secs_f64(capacity as f64 / rate / 10.0));
    let lives = (elapsed.as_secs_f64() / life.as_secs_f64()).ceil() as u64;
    (admitted as u64 / 50 + instances * lives, life)
}

/// Issue 49: a fleet-wide bucket refilling at 1,000,000 a second. Before
/// the bucket's ledger a lease of 100 tokens covered 100 µs of its
/// schedule and lapsed unused, and about every other request went to
/// Redis (0.4375 script calls per admitted request, 0.706 in another
/// run); now a leased token lasts the lease's life, at any rate: slower,
/// and one counting in fractions of a µs (3,000 a second: 333.333334 µs).
#[test]
fn a_fast_global_bucket_costs_redis_as_little_as_a_window() {
    let mut figures = String::new();
    for rate in [1_000_000.0, 100_000.0, 100.0, 3_000.0] {
        let redis = RedisServer::start();
        let upstream = Upstream::start();
        let proxy = leasing(
            on_redis(&upstream, &redis.url())
                .limit(Limit::token_bucket("global", "global", 1_000_000, rate))
                .start(),
        );
        assert_eq!(proxy.get("/").status, 200);
        let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
        let started = std::time::Instant::now();
        let statuses = keepalive_load(&proxy, 8, 2_000);
        let elapsed = started.elapsed();
        let admitted = count_status(&statuses, 200);
        assert_eq!(
            admitted, 2_000,
            "{rate}/s: far from the limit everyone is admitted"
        );
        let calls = redis.calls("evalsha");
        let per_request = calls as f64 / admitted as f64;
        let (bound, life) = fast_bucket_calls_bound(admitted, 1_000_000, rate, elapsed, 1);
        assert!(
            calls <= bound,
            "{rate}/s: {calls} script calls for {admitted} admitted requests in {elapsed:?} ({} leases, {} units back; at most {bound}: 0.02 a request and one per lease life of {life:?})",
            proxy.metric("floodgate_redis_leases_total"),
            proxy.metric("floodgate_redis_lease_returned_units_total")
        );
        figures += &format!("8 keep-alive connections x 250 requests on one global token bucket (1,000,000 at {rate}/s) in {elapsed:.2?} (lease life {life:?}): {admitted} admitted, {calls} EVALSHA ({per_request:.4} per admitted request)\n");
    }
    record("leases_fast_bucket", &figures);
}

/// Issue 49, the fleet: three proxies on one Redis share the fleet-wide
/// bucket, 8 keep-alive connections at once spread over them. An instance
/// asks Redis once per lease of 100, or when a lease's life ends unspent:
/// at 1,000,000/s a lease lives 100 ms (see `fast_bucket_calls_bound`).
#[test]
fn three_proxies_sharing_a_fast_bucket_cost_redis_as_little_as_one() {
    const CAPACITY: u64 = 1_000_000;
    let mut figures = String::new();
    for rate in [1_000_000.0, 100_000.0, 100.0] {
        let redis = RedisServer::start();
        let upstream = Upstream::start();
        let config = on_redis(&upstream, &redis.url())
            .redis_lines("instances = 3")
            .limit(Limit::token_bucket("global", "global", CAPACITY, rate));
        let proxies: Vec<Proxy> = (0..3).map(|_| leasing(config.start())).collect();
        for proxy in &proxies {
            assert_eq!(proxy.get("/").status, 200);
        }
        let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
        let started = std::time::Instant::now();
        // 8 connections in all, 3 + 3 + 2, each with 750 requests.
        let statuses: Vec<u16> = std::thread::scope(|s| {
            let loads: Vec<_> = proxies
                .iter()
                .zip([3, 3, 2])
                .map(|(proxy, connections)| {
                    s.spawn(move || keepalive_load(proxy, connections, connections * 750))
                })
                .collect();
            loads
                .into_iter()
                .flat_map(|l| l.join().expect("a proxy's load"))
                .collect()
        });
        let elapsed = started.elapsed();
        let admitted = count_status(&statuses, 200);
        assert_eq!(
            admitted, 6_000,
            "{rate}/s: far from the limit everyone is admitted"
        );
        let calls = redis.calls("evalsha");
        let per_request = calls as f64 / admitted as f64;
        let leases: f64 = proxies
            .iter()
            .map(|p| p.metric("floodgate_redis_leases_total"))
            .sum();
        let (bound, life) = fast_bucket_calls_bound(admitted, CAPACITY, rate, elapsed, 3);
        assert!(
            calls <= bound,
            "{rate}/s: {calls} script calls for {admitted} admitted requests in {elapsed:?} ({leases} leases; at most {bound}: 0.02 a request and one per instance per lease life of {life:?})"
        );
        figures += &format!("3 proxies, 8 keep-alive connections over them x 750 requests on one global token bucket (1,000,000 at {rate}/s, instances = 3) in {elapsed:.2?} (lease life {life:?}): {admitted} admitted, {calls} EVALSHA ({per_request:.4} per admitted request), {leases} leases\n");
    }
    record("leases_fast_bucket_three_proxies", &figures);
}

/// Three proxies leasing from one bucket of 100 that refills next to
/// nothing (one token a day): 600 requests at once admit at most 100, and
/// once the leases end what they did not use is the bucket's again, so the
/// whole capacity is spent, to the unit.
#[test]
fn three_proxies_leasing_a_bucket_never_burst_past_its_capacity() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = on_redis(&upstream, &redis.url())
        .redis_lines("instances = 3")
        .limit(Limit::token_bucket("shared", "global", 100, 1.0 / 86_400.0));
    let proxies: Vec<Proxy> = (0..3).map(|_| leasing(config.start())).collect();
    let addrs: Vec<_> = proxies.iter().map(|p| p.addr).collect();
    let first = burst(&addrs, 600, "GET", "/", &[]);
    let admitted = count_status(&first, 200);
    assert!(admitted <= 100, "{admitted} admitted of a bucket of 100");
    assert_eq!(upstream.count(), admitted);
    assert!(
        proxies
            .iter()
            .any(|p| p.metric("floodgate_redis_leases_total") > 0.0),
        "no lease was taken"
    );
    // A bucket's lease lives lease_ttl (1 s) from when it was asked for;
    // its unused units then go back to the bucket, which then counts as
    // spent exactly what was admitted.
    let key = state_key(&redis, "shared");
    assert!(
        wait_until(Duration::from_secs(5), || bucket_spent(&redis, &key)
            == Some(admitted as u64)),
        "Redis's bucket spent {:?} for {admitted} admitted",
        bucket_spent(&redis, &key)
    );
    let returned: f64 = proxies
        .iter()
        .map(|p| p.metric("floodgate_redis_lease_returned_units_total"))
        .sum();
    let mut last = 0;
    for _ in 0..150 {
        if proxies[last % 3].get("/").status == 200 {
            last += 1;
        }
    }
    assert!(admitted + last <= 100, "{admitted} + {last} admitted");
    assert_eq!(
        admitted + last,
        100,
        "the whole capacity, exactly ({returned} units came back)"
    );
    record(
        "leases_bucket_exactness",
        &format!("3 proxies, token bucket of 100 (1/day): 600 at once -> {admitted} admitted; then one at a time -> {last}: {} in all\n", admitted + last),
    );
}

#[test]
fn near_the_limit_every_request_is_decided_by_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Ten instances share 10 units: a lease would take more than the
    // share of one, so none is ever taken.
    let proxy = leasing(
        on_redis(&upstream, &redis.url())
            .redis_lines("instances = 10")
            .limit(Limit::fixed_window("tight", "global", 10, "1h"))
            .start(),
    );
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
        .limit(Limit::fixed_window("shared", "global", 100, "1h"));
    let proxies: Vec<Proxy> = (0..3).map(|_| leasing(config.start())).collect();
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
    let proxy = leasing(
        ConfigBuilder::new(upstream.addr)
            .redis(&redis.url())
            .admin()
            // The proxy's clock, which the builder sets clear of an hour's end:
            // on Redis time the window could reset between the two phases.
            .redis_lines("on_failure = \"deny\"\ntimeout = \"200ms\"\nclock = \"local\"")
            .limit(Limit::fixed_window("hot", "global", 1_000, "1h"))
            .start(),
    );
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
    let proxy = leasing(
        on_redis(&upstream, &redis.url())
            .limit(
                Limit::fixed_window("per-request", "global", 100_000, "1m")
                    .line("leases = \"off\""),
            )
            .start(),
    );
    assert_eq!(proxy.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let statuses = keepalive_load(&proxy, 1, 20);
    assert_eq!(count_status(&statuses, 200), 20);
    assert_eq!(redis.calls("evalsha"), 20);
    let everywhere = leasing(
        on_redis(&upstream, &redis.url())
            .redis_lines("leases = \"off\"")
            .limit(Limit::fixed_window(
                "per-request-too",
                "global",
                100_000,
                "1m",
            ))
            .start(),
    );
    assert_eq!(everywhere.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let statuses = keepalive_load(&everywhere, 1, 20);
    assert_eq!(count_status(&statuses, 200), 20);
    assert_eq!(redis.calls("evalsha"), 20);
}

#[test]
fn a_stop_and_a_reload_give_the_unused_units_back() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config =
        on_redis(&upstream, &redis.url()).limit(Limit::fixed_window("hot", "global", 1_000, "1h"));
    let mut proxy = leasing(config.start());
    assert_eq!(proxy.get("/").status, 200);
    let key = state_key(&redis, "hot");
    assert_eq!(window_count(&redis, &key), 101, "a request and its lease");
    proxy.signal("-HUP");
    assert!(
        wait_until(Duration::from_secs(5), || window_count(&redis, &key) == 1),
        "a reload gives the lease back: {}\n{}",
        window_count(&redis, &key),
        proxy.log()
    );
    assert_eq!(proxy.get("/").status, 200);
    assert_eq!(window_count(&redis, &key), 102, "leased anew");
    proxy.signal("-TERM");
    assert!(proxy.wait_exit(Duration::from_secs(10)).is_some());
    assert_eq!(window_count(&redis, &key), 2, "a stop gives the lease back");
}

/// Three stores on one real Redis share one limit through leases, on one
/// manual clock, under random costs, bursts and pauses, with instances
/// giving their leases back (a reload), dying with their leases (never
/// given back), and operators resetting the key (the others hear of it as
/// the subscription would tell them): every admission is one the exact
/// limiter admits (reset with the key), a bucket's admissions in any
/// interval between resets stay within capacity + rate x length, and once
/// the leases are back a fixed window counts exactly what was admitted,
/// less what died in leases.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario against real processes, read in the order it happens"
)]
fn three_stores_leasing_from_one_redis_never_admit_past_the_limit() {
    use std::sync::Arc;

    use floodgate_algorithm::{Algorithm, Kind};
    use floodgate_limiter::clock::{Clock, ManualClock};
    use floodgate_limiter::redis::{InstanceCount, LeaseSettings, Topology};
    use floodgate_limiter::StateKey;
    use floodgate_limiter::{
        Check, ClockSource, Enforcement, Instances, Leased, Leasing, LimitName, MemoryStore,
        OnFailure, RedisSettings, RedisStandalone, Spending, Store,
    };

    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let settings = RedisSettings {
        topology: Topology::Standalone(redis.url()),
        timeout: Duration::from_secs(5),
        clock: ClockSource::Local,
        key_prefix: "prop".into(),
        on_failure: OnFailure::Deny,
        instances: InstanceCount::Fixed(3),
        tls_ca: None,
        leases: None,
    };
    let leases = LeaseSettings {
        max: 20,
        ttl_us: 1_000_000,
    };
    let mut worst = String::new();
    // Each limit with the longest of its short steps: a fast bucket is
    // drained by bursts a few µs apart.
    for (seed, (algorithm, short_step_us)) in [
        (Algorithm::fixed_window(60, 2_000_000), 3_000),
        (Algorithm::sliding_window(60, 2_000_000), 3_000),
        (Algorithm::token_bucket(60, 20_000), 3_000),
        (Algorithm::fixed_window(300, 500_000), 3_000),
        // 1,000,000 a second.
        (Algorithm::token_bucket(200, 1), 2),
        // 3,000 a second: 333.333334 µs, counted in fractions of a µs.
        (Algorithm::token_bucket_per_second(100, 3_000.0), 300),
    ]
    .into_iter()
    .enumerate()
    {
        let algorithm = algorithm.expect("valid numbers");
        let mut rng = Rng(0x1EA5E + seed as u64);
        let clock = Arc::new(ManualClock::new(1_800_000_000_000_000));
        let name = format!("shared-{seed}");
        let check = |cost| Check {
            limit: floodgate_limiter::LimitId(0),
            name: LimitName::new(&name),
            algorithm,
            key: StateKey {
                limit: seed as u64,
                identity: 1,
            },
            cost,
            enforcement: Enforcement::Enforce,
            spending: Spending::Charge,
            on_failure: OnFailure::Deny,
            leasing: Leasing::Allowed,
        };
        let exact = |cost| Check {
            leasing: Leasing::Never,
            ..check(cost)
        };
        let instance = || {
            Leased::new(
                RedisStandalone::new(settings.clone(), clock.clone()),
                leases,
                Instances::fixed(3),
                Duration::from_secs(5),
                clock.clone(),
            )
            // A lease's age on the test's clock, as Redis's state ages.
            .with_monotonic(clock.clone())
        };
        let mut events = Events::default();
        let (admitted, left, exact_left, oracle_units) = runtime.block_on(async {
            let mut stores: Vec<_> = (0..3).map(|_| instance()).collect();
            let reference = MemoryStore::new(16, clock.clone());
            // One exact limiter deciding every request alone: what the
            // same demand gets without leases.
            let oracle = MemoryStore::new(16, clock.clone());
            let mut oracle_units = 0;
            // Admissions (at, cost), one run of them per reset.
            let mut admitted: Vec<Vec<(u64, u64)>> = vec![Vec::new()];
            for step in 0..3_000 {
                clock.advance(match rng.below(100) {
                    0 => rng.below(700_000),
                    1..=40 => 0,
                    _ => rng.below(short_step_us),
                });
                let at = clock.now_us();
                let which = rng.below(3) as usize;
                match rng.below(300) {
                    0 => {
                        // Killed: what its leases held is never given back.
                        stores[which] = instance();
                        events.deaths.push(at);
                        continue;
                    }
                    1 => {
                        stores[which].reset(&[exact(1)]).await.expect("redis");
                        for (i, other) in stores.iter().enumerate() {
                            if i != which {
                                other.forgetter().forget(&[check(1).key]);
                            }
                        }
                        reference.reset(&[exact(1)]).await.expect("memory");
                        oracle.reset(&[exact(1)]).await.expect("memory");
                        admitted.push(Vec::new());
                        events.resets.push(at);
                        continue;
                    }
                    2 => {
                        stores[which].return_all().await;
                        events.returns += 1;
                        continue;
                    }
                    _ => {}
                }
                let cost = 1 + rng.below(3);
                if oracle.decide_at(&[exact(cost)], at)[0].allowed() {
                    oracle_units += cost;
                }
                let decided = stores[which]
                    .decide(&[check(cost)])
                    .await
                    .expect("redis answers");
                if decided[0].allowed() {
                    assert!(
                        reference.decide_at(&[exact(cost)], at)[0].allowed(),
                        "{algorithm:?} step {step}: admission of {cost} past the limit"
                    );
                    if let Some(run) = admitted.last_mut() {
                        run.push((at, cost));
                    }
                }
            }
            for store in &stores {
                store.return_all().await;
            }
            let now = clock.now_us();
            let look = Check {
                cost: 0,
                spending: Spending::Peek,
                ..check(0)
            };
            let left = stores[0]
                .peek(std::slice::from_ref(&look))
                .await
                .expect("redis")[0]
                .remaining();
            let exact_left = reference.peek_at(&[look], now)[0].remaining();
            (admitted, left, exact_left, oracle_units)
        });
        let total: u64 = admitted.iter().flatten().map(|(_, c)| c).sum();
        assert!(total > 0, "{algorithm:?}: nothing admitted");
        assert!(
            events.deaths.len() >= 2 && events.resets.len() >= 2 && events.returns >= 2,
            "{algorithm:?}: too few events to test ({events:?})"
        );
        let mut bound = String::new();
        if algorithm.kind() == Kind::TokenBucket {
            let burst = largest_burst(&admitted, algorithm.period(), algorithm.per_us());
            assert!(
                burst <= algorithm.quota() as f64,
                "{algorithm:?}: {burst} admitted beyond the refill in one interval, capacity {}",
                algorithm.quota()
            );
            // Else the run tests nothing: demand must have drained it.
            assert!(
                burst >= algorithm.quota() as f64 * 0.75,
                "{algorithm:?}: the runs came no nearer than {burst} to the capacity"
            );
            bound = format!(
                ", the most admitted in any interval beyond rate x its length {burst:.3} (capacity {})",
                algorithm.quota()
            );
        }
        // Once every lease is back, the shared state holds no more than
        // the exact limiter's.
        assert!(
            left <= exact_left,
            "{algorithm:?}: {left} left, exact {exact_left}"
        );
        // What is still missing is what leases held when others charged
        // after them (at most one lease per instance), and what died in
        // leases since the last reset.
        let last_reset = events.resets.last().copied().unwrap_or(0);
        let deaths_since = events.deaths.iter().filter(|&&t| t >= last_reset).count() as u64;
        assert!(
            exact_left - left <= (3 + deaths_since) * leases.max,
            "{algorithm:?}: {left} left, exact {exact_left}"
        );
        if algorithm.kind() == Kind::FixedWindow {
            let now = admitted
                .iter()
                .flatten()
                .map(|(t, _)| *t)
                .max()
                .unwrap_or(0);
            let window_start = now - now % algorithm.period_us();
            let died_in_window = events
                .deaths
                .iter()
                .any(|&t| t >= window_start.max(last_reset));
            if died_in_window {
                assert!(exact_left - left <= deaths_since * leases.max);
            } else {
                assert_eq!(
                    left, exact_left,
                    "{algorithm:?}: units lost or counted twice"
                );
            }
        }
        worst.push_str(&format!(
            "{algorithm:?}: {} admissions ({total} units) over 3 stores, {} deaths, {} resets, {} returns of all leases, all within the exact limit (one exact limiter deciding the same requests alone: {oracle_units} units){bound}; after the leases, {left} left against the exact {exact_left}\n",
            admitted.iter().map(Vec::len).sum::<usize>(),
            events.deaths.len(),
            events.resets.len(),
            events.returns,
        ));
    }
    record("leases_property_redis", &worst);
}

/// What befell the instances of a property run.
#[derive(Debug, Default)]
struct Events {
    deaths: Vec<u64>,
    resets: Vec<u64>,
    returns: usize,
}

/// The most a bucket admitted in any closed interval of one run (between
/// two resets) beyond what it refills in that interval's length: at most
/// its capacity, whatever the instances did. The bucket refills one token
/// per `period` units of `1 / per_us` µs.
fn largest_burst(runs: &[Vec<(u64, u64)>], period: u64, per_us: u64) -> f64 {
    let mut largest = 0.0f64;
    for run in runs {
        for (i, &(from, _)) in run.iter().enumerate() {
            let mut units = 0u64;
            for &(to, cost) in &run[i..] {
                units += cost;
                let refilled = (to - from) as f64 * per_us as f64 / period as f64;
                largest = largest.max(units as f64 - refilled);
            }
        }
    }
    largest
}

/// The metric of leases an instance holds.
fn leases_held(proxy: &Proxy) -> f64 {
    proxy.metric("floodgate_redis_leases_held")
}

/// Requests sent one at a time, on one keep-alive connection: those
/// admitted.
fn admitted_of(proxy: &Proxy, requests: usize, headers: &[(&str, &str)]) -> usize {
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    count_status(
        keepalive_gets(proxy.addr, "/", vec![headers; requests]),
        200,
    )
}

#[test]
fn an_idle_lease_goes_back_after_lease_ttl_on_every_instance() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // The proxies' clock, which the builder keeps clear of a window's end.
    let config = on_redis(&upstream, &redis.url())
        .redis_lines("instances = 3\nclock = \"local\"\nlease_ttl = \"500ms\"")
        .limit(Limit::fixed_window("global", "global", 1_000, "10m"));
    let proxies: Vec<Proxy> = (0..3).map(|_| leasing(config.start())).collect();
    let (a, b, c) = (&proxies[0], &proxies[1], &proxies[2]);
    assert_eq!(a.get("/").status, 200);
    assert_eq!(c.get("/").status, 200);
    let key = state_key(&redis, "global");
    // A and C each hold a lease: their requests and 200 units besides.
    let held = window_count(&redis, &key);
    assert_eq!(held, 202, "two requests and two leases of 100");
    // Idle for lease_ttl, each goes back (polled: the expiry task runs every
    // few hundred milliseconds).
    let returned = wait_until(Duration::from_secs(5), || window_count(&redis, &key) == 2);
    // The users on B get everything A and C did not use.
    let on_b = admitted_of(b, 1_100, &[]);
    assert_eq!(
        on_b, 998,
        "B admitted {on_b} of 998 (leases returned: {returned}, Redis counted {held} before)"
    );
    assert!(returned);
    for proxy in [a, c] {
        assert_eq!(leases_held(proxy), 0.0);
    }
}

#[test]
fn the_leases_held_metric_counts_the_leases_an_instance_holds() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let proxy = leasing(
        on_redis(&upstream, &redis.url())
            .redis_lines("clock = \"local\"\nlease_ttl = \"3s\"")
            .limit(Limit::fixed_window(
                "per-client",
                "header:X-Client",
                1_000,
                "10m",
            ))
            .start(),
    );
    for client in ["one", "two"] {
        assert_eq!(proxy.send("GET", "/", &[("X-Client", client)]).status, 200);
    }
    assert!(
        wait_until(Duration::from_secs(2), || leases_held(&proxy) == 2.0),
        "leases held: {}",
        leases_held(&proxy)
    );
    assert!(
        wait_until(Duration::from_secs(10), || leases_held(&proxy) == 0.0),
        "leases held after lease_ttl: {}",
        leases_held(&proxy)
    );
}

/// One client's requests, alternating between `proxies`, until each has
/// refused in turn (a proxy with leased units left admits from them): how
/// many were admitted.
fn spend(proxies: &[&Proxy]) -> usize {
    let mut admitted = 0;
    let mut refused_in_a_row = 0;
    for turn in 0..1_000 {
        if refused_in_a_row == proxies.len() {
            break;
        }
        match proxies[turn % proxies.len()].get("/").status {
            200 => {
                admitted += 1;
                refused_in_a_row = 0;
            }
            429 => refused_in_a_row += 1,
            other => panic!("status {other}"),
        }
    }
    admitted
}

#[test]
fn an_operators_credit_adds_exactly_its_units_to_a_client_whose_budget_is_leased() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    // Leases that outlive the test: only the credit may end them.
    let config = on_redis(&upstream, &redis.url())
        .redis_lines("instances = 2\nclock = \"local\"\nlease_ttl = \"30s\"")
        .env(
            "FLOODGATE_IDENTITY_SECRET",
            "a-secret-shared-by-both-instances",
        )
        .raw(&token.section())
        .limit(Limit::fixed_window("per-ip", "ip", 100, "1h"));
    let a = leasing(config.start());
    let b = leasing(config.start());
    // The client uses 10 of its 100, on both instances: each leases.
    for turn in 0..10 {
        assert_eq!([&a, &b][turn % 2].get("/").status, 200);
    }
    for proxy in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(5), || leases_held(proxy) == 1.0),
            "a lease on each instance"
        );
    }
    let key = state_key(&redis, "per-ip");
    let counted = window_count(&redis, &key);
    let admin = b.admin.expect("admin listener");
    let bearer = format!("Bearer {TOKEN}");
    let credited = request(
        admin,
        "POST",
        "/v1/clients/credit",
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
        ],
        br#"{"ip": "127.0.0.1", "limit": "per-ip", "units": 10}"#,
    );
    assert_eq!(credited.status, 200, "{}", credited.body);
    // 90 left, and 10 credited: 100, on either instance.
    let after = spend(&[&a, &b]);
    assert_eq!(
        after, 100,
        "{after} admitted after a credit of 10 to a client that used 10 of 100 (Redis counted {counted} before the credit)"
    );
    assert_eq!(
        window_count(&redis, &key),
        100,
        "the whole budget, counted once"
    );
}

#[test]
fn after_a_redis_restart_no_lease_from_before_it_is_spent_or_given_back() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    // The proxy's time is the test's: a lease is made old at once. Half an
    // hour into an hour, clear of the window's end.
    let clock = TestClock::new();
    let now = now_us();
    let hour = 3_600_000_000;
    clock.set_now_us(now - now % hour + hour / 2);
    let proxy = leasing(
        on_redis(&upstream, &redis.url())
            .clock(&clock)
            // Nothing decided beside Redis counts: a refusal while it is
            // away is not an admission.
            .redis_lines("clock = \"local\"\non_failure = \"deny\"\nlease_ttl = \"5s\"")
            .limit(Limit::fixed_window(
                "per-client",
                "header:X-Client",
                100,
                "1h",
            ))
            .start(),
    );
    let x = [("X-Client", "x")];
    let z = [("X-Client", "z")];
    // Two clients, each with a lease of 49 from this Redis, Z's younger.
    assert_eq!(proxy.send("GET", "/", &x).status, 200);
    clock.advance(Duration::from_secs(3));
    assert_eq!(proxy.send("GET", "/", &z).status, 200);
    assert_eq!(redis.keys().len(), 2);
    // Redis restarts empty, and X's lease is over: its return may be the
    // first call after the restart, which fails, and X's request then goes
    // on to the new Redis. The subscription to operators' changes ends at
    // the restart too; either must end Z's lease.
    redis.restart();
    clock.advance(Duration::from_secs(3));
    let _ = proxy.send("GET", "/", &x);
    assert!(
        wait_until(Duration::from_secs(5), || proxy
            .admin_get("/readyz")
            .body
            .starts_with("ready")),
        "decisions back on Redis"
    );
    // The new Redis has never seen Z: it gives Z its 100, and nothing Z
    // was leased from the old one may be spent on top.
    let after = admitted_of(&proxy, 150, &z);
    assert_eq!(
        after, 100,
        "Z admitted {after} of a limit of 100 after the restart"
    );
}
