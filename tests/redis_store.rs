//! The Redis store end to end: real redis-server processes, several real
//! floodgate processes sharing them, a real upstream counting what arrives.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::{RedisCluster, RedisServer};
use common::*;

/// In front of `upstream`, deciding on the Redis at `url` by its clock.
fn on_redis(upstream: &Upstream, url: &str) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .redis(url)
        .redis_lines("timeout = \"2s\"\nclock = \"redis\"")
}

/// Like `on_redis`, on the proxy's own clock, which `clock` moves.
fn on_redis_local_clock(upstream: &Upstream, url: &str, clock: &TestClock) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .redis(url)
        .redis_lines("timeout = \"2s\"\nclock = \"local\"")
        .clock(clock)
}

/// `n` GETs released together, spread round-robin over the proxies.
fn spread_burst(
    proxies: &[&Proxy],
    n: usize,
    path: &str,
    headers: &[(&str, &str)],
) -> Vec<Response> {
    let addrs: Vec<_> = proxies.iter().map(|p| p.addr).collect();
    burst(&addrs, n, "GET", path, headers)
}

fn no_5xx(responses: &[Response]) {
    let bad: Vec<u16> = responses
        .iter()
        .map(|r| r.status)
        .filter(|&s| s >= 500 || s == 0)
        .collect();
    assert!(bad.is_empty(), "failed answers: {bad:?}");
}

#[test]
fn three_proxies_share_one_token_bucket_exactly() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut figures = String::new();
    // Without leases every request is Redis's: the burst gets the bucket,
    // exactly. With them, no burst gets more, whatever follows; what a
    // lease still held when the burst ended goes back once leases end if
    // nobody charged after it, and otherwise comes back only as the bucket
    // refills: at most a lease per proxy, 16 tokens each here (99 left /
    // (2 x 3 instances)).
    for leases in ["off", "auto"] {
        let config = on_redis(&upstream, &redis.url())
            .admin()
            .redis_lines(&format!("instances = 3\nleases = \"{leases}\""))
            .raw("[clients.api_keys]\n\"shared-key\" = \"free\"\n\"other-key\" = \"free\"\n\"third-key\" = \"free\"")
            .limit(Limit::token_bucket("per-account", "api_key", 100, 1.0));
        let proxies: Vec<Proxy> = (0..3).map(|_| config.start()).collect();
        let refs: Vec<&Proxy> = proxies.iter().collect();
        for key in ["shared-key", "other-key", "third-key"] {
            let _: () = redis.cmd(&["FLUSHALL"]);
            upstream.reset();
            let started = Instant::now();
            let responses = spread_burst(&refs, 600, "/", &[("X-API-Key", key)]);
            no_5xx(&responses);
            let mut admitted = count_status(&responses, 200);
            assert_eq!(count_status(&responses, 429), 600 - admitted);
            if leases == "auto" {
                assert!(admitted <= 100, "{key}: a burst admitted {admitted}");
                assert!(
                    wait_until(Duration::from_secs(5), || proxies
                        .iter()
                        .all(|p| p.metric("floodgate_redis_leases_held") == 0.0)),
                    "{key}: leases end"
                );
                let again = spread_burst(&refs, 300, "/", &[("X-API-Key", key)]);
                no_5xx(&again);
                admitted += count_status(&again, 200);
            }
            let elapsed = started.elapsed().as_secs();
            let lost_at_most = if leases == "auto" { 3 * 16 } else { 0 };
            assert!(
                admitted + lost_at_most >= 100 && admitted as u64 <= 100 + elapsed,
                "{key}, leases {leases}: admitted {admitted} in {elapsed}s"
            );
            assert_eq!(upstream.count(), admitted, "{key}: the upstream agrees");
            figures.push_str(&format!(
                "leases {leases}, {key}: 600 requests over 3 proxies{}, {admitted} admitted in {:.2}s (bound 100 + {elapsed}), upstream saw {}\n",
                if leases == "auto" { " then 300 once leases ended" } else { "" },
                started.elapsed().as_secs_f64(),
                upstream.count()
            ));
        }
    }
    record("distributed_exactness", &figures);
}

#[test]
fn sliding_log_shared_by_three_proxies_never_exceeds_its_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // The proxies' shared clock, moved between waves instead of waited for.
    let clock = TestClock::new();
    let config = on_redis_local_clock(&upstream, &redis.url(), &clock)
        .limit(Limit::sliding_log("login", "global", 20, "20s"));
    let proxies: Vec<Proxy> = (0..3).map(|_| config.start()).collect();
    let refs: Vec<&Proxy> = proxies.iter().collect();
    // Four waves, 8 s apart on the proxies' clock: the first fills the log,
    // the second and third find it full, the fourth comes when the first
    // wave's stamps have left.
    let mut admitted_per_wave = Vec::new();
    // Each arrival at the upstream on the proxies' clock, in microseconds.
    let mut arrivals_us: Vec<u64> = Vec::new();
    let started_us = clock.now_us();
    for wave in 0..4u64 {
        let due_us = started_us + 8_000_000 * wave;
        if clock.now_us() < due_us {
            clock.set_now_us(due_us);
        }
        // The clock stands still relative to the system's during a wave.
        let (ref_at, ref_us) = (Instant::now(), clock.now_us());
        let seen_before = upstream.count();
        let responses = spread_burst(&refs, 90, "/", &[]);
        no_5xx(&responses);
        admitted_per_wave.push(count_status(&responses, 200));
        arrivals_us.extend(
            upstream.seen()[seen_before..]
                .iter()
                .map(|s| ref_us + (s.at - ref_at).as_micros() as u64),
        );
    }
    assert_eq!(admitted_per_wave[0], 20, "{admitted_per_wave:?}");
    assert_eq!(
        admitted_per_wave[1] + admitted_per_wave[2],
        0,
        "{admitted_per_wave:?}"
    );
    // On a clock that only the test moves this far, the fourth wave finds
    // every stamp of the first gone: exactly the limit again.
    assert_eq!(admitted_per_wave[3], 20, "{admitted_per_wave:?}");
    // Upstream arrivals trail the decisions by a little; in no window even
    // slightly shorter than 20 s did more than 20 arrive.
    arrivals_us.sort();
    for (i, &from) in arrivals_us.iter().enumerate() {
        let within = arrivals_us[i..]
            .iter()
            .take_while(|&&t| t - from < 19_000_000)
            .count();
        assert!(within <= 20, "{within} arrivals within 19 s");
    }
}

#[test]
fn proxies_with_disagreeing_clocks_share_one_budget_on_redis_time() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config =
        on_redis(&upstream, &redis.url()).limit(Limit::fixed_window("hourly", "ip", 10, "1h"));
    let ahead = config
        .clone()
        .env("FLOODGATE_CLOCK_OFFSET_MS", "3600000")
        .start();
    let behind = config.env("FLOODGATE_CLOCK_OFFSET_MS", "-3600000").start();
    let statuses: Vec<u16> = (0..30)
        .map(|i| {
            if i % 2 == 0 {
                ahead.get("/").status
            } else {
                behind.get("/").status
            }
        })
        .collect();
    assert_eq!(count_status(&statuses, 200), 10, "{statuses:?}");
    assert_eq!(upstream.count(), 10);
}

#[test]
fn a_leaky_bucket_shared_by_two_proxies_spaces_all_arrivals() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Four a second: the burst must arrive within one leak (250 ms) for
    // exactly six to be admitted, which a loaded 2-core machine does, where
    // it did not always within 100 ms.
    let config =
        on_redis(&upstream, &redis.url()).limit(Limit::leaky_bucket("sms", "global", 4.0, 5));
    let a = config.start();
    let b = config.start();
    let responses = spread_burst(&[&a, &b], 12, "/sms/send", &[]);
    no_5xx(&responses);
    assert_eq!(count_status(&responses, 200), 6);
    let mut arrivals: Vec<Instant> = upstream.seen().iter().map(|s| s.at).collect();
    arrivals.sort();
    assert_eq!(arrivals.len(), 6);
    for pair in arrivals.windows(2) {
        let gap = pair[1] - pair[0];
        // 250 ms apart as they leave the proxies; on a loaded 2-core machine
        // the way to the upstream adds some tens of ms of jitter to one
        // arrival (unspaced, all six would come within a few ms).
        assert!(gap >= Duration::from_millis(200), "gap {gap:?}");
    }
    // Jitter cannot add up: five intervals of 250 ms, end to end.
    assert!(
        arrivals[5] - arrivals[0] >= Duration::from_millis(1_200),
        "{:?}",
        arrivals[5] - arrivals[0]
    );
}

#[test]
fn script_flush_between_requests_changes_nothing() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Leases off: every request runs the script, which is what a flush
    // must not disturb (and a lease's remaining count is the instance's
    // view, which a return in between may move).
    let proxy = on_redis(&upstream, &redis.url())
        .redis_lines("leases = \"off\"")
        .limit(Limit::fixed_window("per-ip", "ip", 5, "1h"))
        .start();
    let mut statuses = Vec::new();
    for i in 0..8 {
        if i % 2 == 1 {
            let _: String = redis.cmd(&["SCRIPT", "FLUSH"]);
        }
        let r = proxy.get("/");
        statuses.push(r.status);
        if r.status == 200 {
            assert_eq!(
                r.header("RateLimit-Remaining"),
                Some((4 - i).to_string().as_str())
            );
        }
    }
    assert_eq!(statuses, vec![200, 200, 200, 200, 200, 429, 429, 429]);
}

#[test]
fn one_evalsha_per_request_and_keys_hold_no_user_input_and_expire() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Leases off: what is counted is the call each request makes without
    // them (tests/leases.rs counts them with).
    let proxy = on_redis(&upstream, &redis.url())
        .redis_lines("key_prefix = \"fg\"\nleases = \"off\"")
        .raw("[clients]\ntrusted_proxies = [\"127.0.0.1/32\"]\n[clients.api_keys]\n\"secret-key-123\" = \"free\"")
        .limit(Limit::token_bucket("per-ip", "ip", 50, 100.0))
        .limit(Limit::sliding_window("per-account", "api_key", 50, "1s"))
        .limit(Limit::sliding_log("by-tenant", "header:X-Tenant", 50, "1s"))
        .start();
    // Warm up: the first call loads the script.
    assert_eq!(proxy.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let headers = [
        ("X-API-Key", "secret-key-123"),
        ("X-Tenant", "tenant {evil}:*"),
        ("X-Forwarded-For", "203.0.113.77"),
    ];
    for _ in 0..20 {
        assert_eq!(proxy.send("GET", "/", &headers).status, 200);
    }
    assert_eq!(redis.calls("evalsha"), 20);
    assert_eq!(redis.calls("eval") + redis.calls("script|load"), 0);

    let keys = redis.keys();
    // One key per layer of the client, plus maybe the warm-up's (short-lived).
    for name in ["fg:per-ip:", "fg:per-account:", "fg:by-tenant:"] {
        assert!(
            keys.iter().any(|k| k.starts_with(name)),
            "{name} missing: {keys:?}"
        );
    }
    assert!(keys.len() <= 4, "{keys:?}");
    for key in &keys {
        for raw in ["secret", "evil", "203.0.113", "127.0.0.1"] {
            assert!(!key.contains(raw), "{key} holds user input");
        }
        let (prefix, tag) = key.rsplit_once(':').expect("key shape");
        assert!(prefix.starts_with("fg:"), "{key}");
        assert!(
            tag.len() == 34 && tag.starts_with('{') && tag.ends_with('}'),
            "{key}"
        );
    }
    // Every key expires once its state is as good as fresh (here within 1 s,
    // the shortest TTL the scripts set).
    assert!(
        wait_until(Duration::from_secs(5), || redis.keys().is_empty()),
        "keys left: {:?}",
        redis.keys()
    );
}

#[test]
fn limits_hold_across_a_real_cluster_and_clients_spread_over_slots() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let config = ConfigBuilder::new(upstream.addr)
        .redis_cluster(&cluster.urls())
        .redis_lines("timeout = \"2s\"")
        .limit(Limit::fixed_window(
            "per-client",
            "header:X-Client",
            5,
            "1h",
        ))
        .limit(Limit::token_bucket(
            "per-client-burst",
            "header:X-Client",
            100,
            1.0,
        ))
        .limit(Limit::sliding_window("per-ip", "ip", 1000, "1h"));
    let a = config.start();
    let b = config.start();
    for client in 0..12 {
        let id = format!("client-{client}");
        let statuses: Vec<u16> = (0..8)
            .map(|i| {
                let p = if i % 2 == 0 { &a } else { &b };
                p.send("GET", "/", &[("X-Client", &id)]).status
            })
            .collect();
        assert_eq!(
            statuses,
            vec![200, 200, 200, 200, 200, 429, 429, 429],
            "{id}"
        );
    }
    let per_node: Vec<usize> = cluster.keys_per_node().iter().map(|k| k.len()).collect();
    assert_eq!(per_node.iter().sum::<usize>(), 12 * 2 + 1, "{per_node:?}");
    assert!(
        per_node.iter().filter(|&&n| n > 0).count() >= 2,
        "one slot for all: {per_node:?}"
    );
    // One client's layers share its slot: both its keys sit on one node.
    for keys in cluster.keys_per_node() {
        for key in keys.iter().filter(|k| k.contains("per-client:")) {
            let tag = key.rsplit_once(':').map(|(_, t)| t).unwrap_or_default();
            assert!(
                keys.iter()
                    .any(|k| k.contains("per-client-burst:") && k.ends_with(tag)),
                "{key}"
            );
        }
    }
}

#[test]
fn a_client_redis_refused_is_refused_locally_until_its_retry_time() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // One token every 10 s of the proxy's clock, which only the test moves
    // that far: no refill comes while the 22 requests are made.
    let clock = TestClock::new();
    // Leases off: a lease's return would be a call of its own, whenever
    // the lease ends; what is counted here is the refusals remembered.
    let proxy = on_redis_local_clock(&upstream, &redis.url(), &clock)
        .redis_lines("leases = \"off\"")
        .limit(Limit::token_bucket("per-ip", "ip", 3, 0.1))
        .start();
    assert_eq!(proxy.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let statuses: Vec<u16> = (0..22).map(|_| proxy.get("/").status).collect();
    assert_eq!(count_status(&statuses, 200), 2, "{statuses:?}");
    // Two admitted, one refused by Redis; the other 19 never reached it.
    assert_eq!(redis.calls("evalsha"), 3);
    // And the local answer is Redis's: a retry at the advertised time passes.
    let refused = proxy.get("/");
    assert_eq!(refused.status, 429);
    let ms = refused.retry_after_ms().expect("retry_after_ms");
    clock.advance(Duration::from_millis(ms));
    assert_eq!(proxy.get("/").status, 200);
    assert_eq!(redis.calls("evalsha"), 4, "the retry was decided by Redis");
}

#[test]
fn a_password_in_the_url_and_rediss_with_a_private_ca() {
    let upstream = Upstream::start();
    let limit = || Limit::fixed_window("per-ip", "ip", 2, "1h");

    let locked = RedisServer::start_with_password("s3cret");
    assert!(locked.url().contains(":s3cret@"));
    let proxy = on_redis(&upstream, &locked.url()).limit(limit()).start();
    let statuses: Vec<u16> = (0..3).map(|_| proxy.get("/").status).collect();
    assert_eq!(statuses, vec![200, 200, 429]);
    assert_eq!(
        locked.keys().len(),
        1,
        "decided by the password-protected Redis"
    );

    let tls = RedisServer::start_tls();
    let ca = tls.tls_ca.clone().expect("ca");
    assert!(tls.url().starts_with("rediss://"));
    let proxy = on_redis(&upstream, &tls.url())
        .redis_lines(&format!("tls_ca_file = \"{}\"", ca.display()))
        .limit(limit())
        .start();
    let statuses: Vec<u16> = (0..3).map(|_| proxy.get("/").status).collect();
    assert_eq!(statuses, vec![200, 200, 429]);
    assert_eq!(tls.keys().len(), 1, "decided by the TLS Redis");
    assert!(
        !proxy.log().contains("deciding without it"),
        "{}",
        proxy.log()
    );
}

/// What a test that drives a store directly gives it: a refusal when Redis
/// fails, no leases.
fn driven(topology: floodgate_limiter::redis::Topology) -> floodgate_limiter::RedisSettings {
    floodgate_limiter::RedisSettings {
        topology,
        timeout: Duration::from_secs(5),
        clock: floodgate_limiter::ClockSource::Redis,
        key_prefix: "together".into(),
        on_failure: floodgate_limiter::OnFailure::Deny,
        instances: floodgate_limiter::redis::InstanceCount::Fixed(1),
        tls_ca: None,
        leases: None,
    }
}

/// `identity`'s one layer: `capacity` requests an hour.
fn per_client(identity: u128, capacity: u64) -> floodgate_limiter::Check {
    floodgate_limiter::Check {
        limit: floodgate_limiter::LimitId(0),
        name: floodgate_limiter::LimitName::new("per-client"),
        algorithm: floodgate_algorithm::Algorithm::fixed_window(capacity, 3_600_000_000)
            .expect("valid numbers"),
        key: floodgate_limiter::StateKey { limit: 0, identity },
        cost: 1,
        enforcement: floodgate_limiter::Enforcement::Enforce,
        spending: floodgate_limiter::Spending::Charge,
        on_failure: floodgate_limiter::OnFailure::Deny,
        leasing: floodgate_limiter::Leasing::Never,
    }
}

/// Decisions requested together share one script run: 50 requests waiting
/// at once cost Redis one EVALSHA (two on the very first call, which loads
/// the script), and the budget is still exact.
#[test]
fn concurrent_decisions_share_one_script_run() {
    use std::sync::Arc;

    use floodgate_limiter::clock::SystemClock;
    use floodgate_limiter::redis::Topology;
    use floodgate_limiter::{RedisStandalone, Store};

    let redis = RedisServer::start();
    let limiter = RedisStandalone::new(
        driven(Topology::Standalone(redis.url())),
        Arc::new(SystemClock),
    );
    let requests = vec![vec![per_client(7, 20)]; 50];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    // On one thread, all 50 are queued before the batch task first runs.
    let decided = runtime.block_on(futures_util::future::join_all(
        requests.iter().map(|checks| limiter.decide(checks)),
    ));
    let admitted = decided
        .iter()
        .filter(|d| d.as_ref().expect("decided")[0].allowed())
        .count();
    assert_eq!(admitted, 20);
    let remaining: Vec<u64> = decided
        .iter()
        .take(20)
        .map(|d| d.as_ref().expect("decided")[0].remaining())
        .collect();
    assert_eq!(remaining, (0..20).rev().collect::<Vec<u64>>());
    assert!(redis.calls("evalsha") <= 2, "{}", redis.calls("evalsha"));
}

/// A decision whose caller gave up while its run waited for the connection
/// (Redis frozen with SIGSTOP: the connect hangs) is left out when the
/// connection is made at last: the caller was answered by `on_failure`, and
/// Redis must not charge it as well.
#[test]
fn a_caller_that_gave_up_while_its_run_waited_for_the_connection_is_not_charged() {
    use std::sync::Arc;

    use floodgate_limiter::clock::SystemClock;
    use floodgate_limiter::redis::Topology;
    use floodgate_limiter::{RedisStandalone, Store};

    let redis = RedisServer::start();
    let limiter = RedisStandalone::new(
        driven(Topology::Standalone(redis.url())),
        Arc::new(SystemClock),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let signal = |sig: &str| {
        let sent = std::process::Command::new("kill")
            .args([sig, &redis.pid().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success(), "kill {sig}");
    };
    signal("-STOP");
    let gave_up = runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(200),
            limiter.decide(&[per_client(1, 5)]),
        )
        .await
    });
    assert!(gave_up.is_err(), "decided by a frozen Redis");
    signal("-CONT");
    let decided = runtime
        .block_on(limiter.decide(&[per_client(2, 5)]))
        .expect("decided once Redis answers");
    assert_eq!(decided[0].remaining(), 4);
    assert_eq!(
        redis.keys(),
        vec![format!("together:per-client:{{{:032x}}}", 2u128)],
        "only the decision still waited for was charged"
    );
}

/// On a cluster too, decisions requested together share a script run when
/// their keys share a slot: 50 requests of one client cost its master two
/// runs (the first request's, alone, and one for the 49 that came while it
/// ran) and stay exact; 300 clients, three requests each,
/// decided at once, spread over every master, each get exactly their
/// budget, and no run mixes slots (Redis would refuse it: CROSSSLOT).
#[test]
fn cluster_decisions_requested_together_share_a_run_per_slot() {
    use std::sync::Arc;

    use floodgate_limiter::clock::SystemClock;
    use floodgate_limiter::redis::Topology;
    use floodgate_limiter::{Check, RedisCluster as ClusterStore, Store};

    let cluster = RedisCluster::start();
    let limiter = ClusterStore::new(
        driven(Topology::Cluster(cluster.urls())),
        Arc::new(SystemClock),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let script_runs = || -> u64 {
        cluster
            .nodes
            .iter()
            .map(|n| n.calls("evalsha") + n.calls("eval"))
            .sum()
    };
    // The slot map read and the script loaded on every master: not counted.
    for identity in 0..64 {
        runtime
            .block_on(limiter.decide(&[per_client(identity, 20)]))
            .expect("warm-up decision");
    }
    for node in &cluster.nodes {
        let _: String = node.cmd(&["CONFIG", "RESETSTAT"]);
    }

    let one_client = vec![vec![per_client(1 << 100, 20)]; 50];
    // On one thread, all 50 are queued before the batch task first runs.
    let decided = runtime.block_on(futures_util::future::join_all(
        one_client.iter().map(|checks| limiter.decide(checks)),
    ));
    let admitted = decided
        .iter()
        .filter(|d| d.as_ref().expect("decided")[0].allowed())
        .count();
    assert_eq!(admitted, 20);
    assert!(script_runs() <= 2, "{} runs", script_runs());

    let clients: Vec<Vec<Check>> = (0..300u128)
        .flat_map(|c| std::iter::repeat_n(vec![per_client(1_000 + c * 7_919, 2)], 3))
        .collect();
    let before = script_runs();
    let decided = runtime.block_on(futures_util::future::join_all(
        clients.iter().map(|checks| limiter.decide(checks)),
    ));
    for (i, chunk) in decided.chunks(3).enumerate() {
        let allowed = chunk
            .iter()
            .filter(|d| d.as_ref().expect("decided without CROSSSLOT")[0].allowed())
            .count();
        assert_eq!(allowed, 2, "client {i}");
    }
    let runs = script_runs() - before;
    // One run for each client's first request, alone on its slot, and one
    // per slot for the two that came while it was in progress.
    assert!(runs <= 650, "{runs} runs for 900 decisions");
    let per_node: Vec<usize> = cluster.keys_per_node().iter().map(|k| k.len()).collect();
    assert!(
        per_node.iter().all(|&n| n > 50),
        "spread over every master: {per_node:?}"
    );
}
