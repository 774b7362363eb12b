//! Redis misbehaving under steady load: killed, frozen with SIGSTOP,
//! restarted. Every request must still be answered, within the deadline,
//! by the configured `on_failure`, and decisions must return to Redis.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::load::Load;
use common::redis_server::RedisServer;
use common::*;

const DEADLINE_MS: u64 = 50;

/// A proxy in front of `upstream` on `redis`, with an admin listener (the
/// breaker's failures are counted there).
fn start(upstream: &Upstream, redis: &RedisServer, on_failure: &str) -> Proxy {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .redis(&redis.url())
        .redis_lines(&format!(
            "timeout = \"{DEADLINE_MS}ms\"\non_failure = \"{on_failure}\"\ninstances = 3"
        ))
        .limit(Limit::fixed_window(
            "per-client",
            "header:X-Client",
            30,
            "1h",
        ))
        .limit(
            Limit::sliding_log("login", "ip", 100, "1m")
                .line("on_failure = \"deny\"")
                .matching(r#"methods = ["POST"], paths = ["/login"]"#),
        )
        .limit(Limit::token_bucket(
            "load",
            "header:X-Load",
            1_000_000,
            1_000_000.0,
        ))
        .start()
}

/// Failed Redis calls and probes so far: an open breaker's probe adds one
/// every 250 ms while Redis cannot decide.
fn failures(proxy: &Proxy) -> f64 {
    proxy.metric("floodgate_redis_failures_total")
}

fn percentile(mut latencies: Vec<Duration>, p: f64) -> Duration {
    if latencies.is_empty() {
        return Duration::ZERO;
    }
    latencies.sort();
    let at = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
    latencies[at]
}

fn between(samples: &[(Instant, Duration, u16)], from: Instant, to: Instant) -> Vec<Duration> {
    samples
        .iter()
        .filter(|(t, _, _)| *t >= from && *t < to)
        .map(|(_, d, _)| *d)
        .collect()
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill {sig} {pid}");
}

fn statuses(proxy: &Proxy, method: &str, path: &str, client: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| request(proxy.addr, method, path, &[("X-Client", client)], b"").status)
        .collect()
}

enum Outage {
    Kill,
    Freeze,
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario against real processes, read in the order it happens"
)]
fn outage_under_load(kind: Outage, name: &str) {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let proxy = start(&upstream, &redis, "local");
    // The budget of a client already known to Redis.
    assert_eq!(
        count_status(statuses(&proxy, "GET", "/", "known", 5), 200),
        5
    );
    let load_start = Instant::now();
    let load = Load::start(proxy.addr, 4);
    assert!(
        wait_until(Duration::from_secs(10), || load.answered_since(load_start)
            >= 50),
        "the load is answered before the outage"
    );

    let outage_start = Instant::now();
    match kind {
        Outage::Kill => redis.kill(),
        Outage::Freeze => signal(redis.pid(), "-STOP"),
    }
    let warn = "deciding without it";
    assert!(
        wait_until(Duration::from_secs(5), || proxy.log().contains(warn)),
        "no switch to the fallback: {}",
        proxy.log()
    );
    let switched_after = outage_start.elapsed();
    // Headers describe the fallback's decision: this instance's share.
    let r = request(
        proxy.addr,
        "GET",
        "/",
        &[("X-Client", "header-client")],
        b"",
    );
    assert_eq!(r.header("RateLimit-Limit"), Some("10"), "{:?}", r.headers);
    assert_eq!(
        r.header("RateLimit-Remaining"),
        Some("9"),
        "{:?}",
        r.headers
    );
    // The fallback enforces limit / instances: 30 / 3 for a new client.
    let during = statuses(&proxy, "GET", "/", "outage-client", 20);
    assert_eq!(count_status(&during, 200), 10, "{during:?}");
    assert_eq!(count_status(&during, 429), 10, "{during:?}");
    // A limit with its own on_failure = "deny" fails closed meanwhile.
    let login = statuses(&proxy, "POST", "/login", "outage-client", 3);
    assert_eq!(login, vec![429, 429, 429]);
    // The outage lasts while the load is served and ten of the breaker's
    // probes fail (about 2.5 s).
    let failed_before = failures(&proxy);
    assert!(
        wait_until(Duration::from_secs(20), || load
            .answered_since(outage_start)
            >= 100
            && failures(&proxy) >= failed_before + 10.0),
        "during the outage: {} requests answered, {} probes failed",
        load.answered_since(outage_start),
        failures(&proxy) - failed_before
    );

    let outage_end = Instant::now();
    match kind {
        Outage::Kill => redis.restart(),
        Outage::Freeze => signal(redis.pid(), "-CONT"),
    }
    let back = "decisions are back on Redis";
    assert!(
        wait_until(Duration::from_secs(10), || proxy.log().contains(back)),
        "never back on Redis: {}",
        proxy.log()
    );
    let returned_after = outage_end.elapsed();
    // Decided by Redis again: the new client's key appears there.
    assert!(wait_until(Duration::from_secs(5), || {
        request(proxy.addr, "GET", "/", &[("X-Client", "after-client")], b"");
        redis.keys().iter().any(|k| k.contains("per-client"))
    }));
    let after_start = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || load.answered_since(after_start)
            >= 50),
        "the load is answered after the outage"
    );
    let samples = load.finish();

    let failed: Vec<u16> = samples.iter().map(|s| s.2).filter(|&s| s != 200).collect();
    assert!(
        failed.is_empty(),
        "load requests not answered 200: {failed:?}"
    );
    let before = between(&samples, load_start, outage_start);
    let during = between(&samples, outage_start, outage_end);
    let after = between(&samples, after_start, Instant::now());
    assert!(
        during.len() > 50,
        "too little load during the outage: {}",
        during.len()
    );
    let p99_during = percentile(during.clone(), 0.99);
    // The deadline, plus a margin for a debug build sharing two cores with
    // the load generator.
    assert!(
        p99_during < Duration::from_millis(DEADLINE_MS + 150),
        "p99 during the outage {p99_during:?}"
    );
    let log = proxy.log();
    assert_eq!(
        log.matches(warn).count(),
        1,
        "one warn line per transition:\n{log}"
    );
    assert_eq!(
        log.matches(back).count(),
        1,
        "one info line per transition:\n{log}"
    );

    let fmt = |v: &[Duration]| {
        format!(
            "p50 {:.2} ms, p99 {:.2} ms ({} requests)",
            percentile(v.to_vec(), 0.5).as_secs_f64() * 1e3,
            percentile(v.to_vec(), 0.99).as_secs_f64() * 1e3,
            v.len()
        )
    };
    record(
        name,
        &format!(
            "before: {}\nduring: {}\nafter: {}\nswitch to fallback: {:.0} ms after the outage began\nback on Redis: {:.0} ms after Redis returned\n",
            fmt(&before),
            fmt(&during),
            fmt(&after),
            switched_after.as_secs_f64() * 1e3,
            returned_after.as_secs_f64() * 1e3
        ),
    );
}

#[test]
fn redis_killed_and_restarted_under_load() {
    outage_under_load(Outage::Kill, "redis_killed");
}

#[test]
fn redis_frozen_with_sigstop_under_load() {
    outage_under_load(Outage::Freeze, "redis_frozen");
}

#[test]
fn on_failure_allow_fails_open_and_deny_fails_closed() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let open = start(&upstream, &redis, "allow");
    let closed = start(&upstream, &redis, "deny");
    redis.kill();
    // Fail open: even past the limit of 30 everything goes through.
    let through_open = statuses(&open, "GET", "/", "c", 40);
    assert_eq!(count_status(&through_open, 200), 40);
    // But a limit with its own on_failure = "deny" still refuses.
    assert_eq!(statuses(&open, "POST", "/login", "c", 2), vec![429, 429]);
    // Fail closed: limited requests are refused, with a retry hint.
    let refused = request(closed.addr, "GET", "/", &[("X-Client", "c")], b"");
    assert_eq!(refused.status, 429);
    assert!(
        refused.body.contains("\"limit\":\"per-client\""),
        "{}",
        refused.body
    );
    assert_eq!(refused.header("Retry-After"), Some("1"));
    // A request no limit applies to is not refused by a down Redis.
    assert_eq!(closed.get("/").status, 200);
}

/// Redis that answers but refuses writes: out of memory under `noeviction`,
/// then a read-only replica, each for 20 of the breaker's probes (about 5 s)
/// under steady load. The breaker's probe writes, so it stays open until
/// writes succeed: one open/close pair per outage in the log (before: 40
/// flaps in 10 s), every request decided by on_failure, and decisions back
/// on Redis afterwards.
#[test]
fn a_redis_that_refuses_writes_keeps_the_breaker_open() {
    let warn = "Redis failed";
    let back = "Redis answers again";
    let dead_port = free_port().to_string();
    let outages: [(&str, Vec<&str>, Vec<&str>); 2] = [
        (
            "out of memory",
            vec!["CONFIG", "SET", "maxmemory", "1"],
            vec!["CONFIG", "SET", "maxmemory", "0"],
        ),
        (
            "read-only replica",
            vec!["REPLICAOF", "127.0.0.1", &dead_port],
            vec!["REPLICAOF", "NO", "ONE"],
        ),
    ];
    let mut report = String::new();
    for (name, break_it, mend_it) in &outages {
        let redis = RedisServer::start();
        let upstream = Upstream::start();
        let proxy = start(&upstream, &redis, "local");
        assert_eq!(statuses(&proxy, "GET", "/", "before", 1), [200]);
        let load = Load::start(proxy.addr, 2);
        let _: String = redis.cmd(break_it);
        assert!(
            wait_until(Duration::from_secs(5), || proxy.log().contains(warn)),
            "{name}: the breaker opened: {}",
            proxy.log()
        );
        // The outage lasts, under steady load, while 20 of the breaker's
        // probes fail (about 5 s; each one a chance to close it wrongly).
        let failed_before = failures(&proxy);
        assert!(
            wait_until(Duration::from_secs(30), || failures(&proxy)
                >= failed_before + 20.0),
            "{name}: the probes go on failing: {}",
            failures(&proxy) - failed_before
        );
        let log = proxy.log();
        assert_eq!(log.matches(warn).count(), 1, "{name}: one opening: {log}");
        assert_eq!(
            log.matches(back).count(),
            0,
            "{name}: no closing while writes fail: {log}"
        );
        let evalsha_before = redis.calls("evalsha");
        let _: String = redis.cmd(mend_it);
        assert!(
            wait_until(Duration::from_secs(10), || proxy.log().contains(back)),
            "{name}: back on Redis: {}",
            proxy.log()
        );
        assert!(
            wait_until(Duration::from_secs(5), || redis.calls("evalsha")
                > evalsha_before + 5),
            "{name}: decisions go to Redis again"
        );
        let samples = load.finish();
        let statuses: Vec<u16> = samples.iter().map(|(_, _, s)| *s).collect();
        assert!(statuses.iter().all(|&s| s == 200), "{name}: {statuses:?}");
        let log = proxy.log();
        assert_eq!(
            (log.matches(warn).count(), log.matches(back).count()),
            (1, 1),
            "{name}"
        );
        report.push_str(&format!(
            "{name}: {} requests over 20 failed probes (about 5 s), all 200; the breaker opened once and closed once\n",
            statuses.len()
        ));
    }
    record("redis_refusing_writes", &report);
}

/// A Redis farther than a decision's deadline takes to connect to (80 ms
/// round trips: a TLS handshake and the client's setup, 160 ms or more,
/// against a 100 ms deadline that each decision's one round trip meets) is
/// still connected to: the connect is not cut short with the call that
/// wanted it. Redis is out of reach when the proxy starts, so the
/// connection is made under traffic, not before listening.
#[test]
fn a_redis_slower_to_connect_to_than_the_deadline_is_connected_to() {
    let upstream = Upstream::start();
    let redis = RedisServer::start_tls();
    let ca = redis.tls_ca.clone().expect("ca");
    let far = free_port();
    let proxy = ConfigBuilder::new(upstream.addr)
        .redis(&format!("rediss://127.0.0.1:{far}/0"))
        .redis_lines(&format!(
            "tls_ca_file = \"{}\"\ntimeout = \"100ms\"\non_failure = \"local\"\nleases = \"off\"",
            ca.display()
        ))
        .limit(Limit::fixed_window(
            "per-client",
            "header:X-Client",
            1000,
            "1h",
        ))
        .start();
    assert!(
        proxy.log().contains("not ready"),
        "the failed warm-up is not logged: {}",
        proxy.log()
    );
    let _link = common::distant::DistantLink::start(far, redis.port, Duration::from_millis(40));
    assert!(
        wait_until(Duration::from_secs(20), || {
            statuses(&proxy, "GET", "/", "far", 1);
            redis.keys().iter().any(|k| k.contains("per-client"))
        }),
        "never decided on Redis: {}",
        proxy.log()
    );
}

/// A Redis that does not answer at start (frozen: it accepts the TCP
/// connection and says nothing) holds the workers' listeners back for the
/// warm-up's bound, with `/readyz` saying why, and then the proxy listens
/// and decides by `on_failure` until Redis answers.
#[test]
fn a_frozen_redis_at_start_holds_the_listeners_back_and_readyz_says_starting() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    signal(redis.pid(), "-STOP");
    let admin = local_addr();
    let watcher = std::thread::spawn(move || {
        let mut first = None;
        wait_until(Duration::from_secs(10), || {
            if std::net::TcpStream::connect(admin).is_ok() {
                let answer = request(admin, "GET", "/readyz", &[], b"");
                first = Some((answer.status, answer.body));
            }
            first.is_some()
        });
        first
    });
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin_at(admin)
        .redis(&redis.url())
        .redis_lines("timeout = \"50ms\"\non_failure = \"local\"\nleases = \"off\"")
        .limit(Limit::fixed_window(
            "per-client",
            "header:X-Client",
            1000,
            "1h",
        ))
        .start();
    let (status, body) = watcher
        .join()
        .expect("watcher")
        .expect("the admin listener answered while the workers waited");
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("starting"), "{body}");
    assert!(proxy.log().contains("not ready"), "{}", proxy.log());
    assert_eq!(statuses(&proxy, "GET", "/", "frozen", 3), vec![200; 3]);
    assert_ne!(proxy.admin_get("/readyz").status, 503);
    signal(redis.pid(), "-CONT");
    assert!(
        wait_until(Duration::from_secs(20), || {
            statuses(&proxy, "GET", "/", "thawed", 1);
            redis.keys().iter().any(|k| k.contains("per-client"))
        }),
        "never decided on Redis once it answered: {}",
        proxy.log()
    );
}
