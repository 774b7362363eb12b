//! Operating floodgate: metrics, hot reload, graceful shutdown.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// With an admin listener, a grace period of `grace`, `/healthz` exempt
/// and `limit` requests an hour per address.
fn start(upstream: &Upstream, grace: &str, limit: u64) -> Proxy {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .grace(grace)
        .raw("[exempt]\npaths = [\"/healthz\"]")
        .limit(Limit::fixed_window("per-ip", "ip", limit, "1h"))
        .start()
}

fn rewrite_limit(proxy: &Proxy, from: u64, to: &str) {
    let text = std::fs::read_to_string(&proxy.config_path).expect("config");
    let changed = text.replace(&format!("limit = {from}\n"), &format!("limit = {to}\n"));
    assert_ne!(text, changed);
    std::fs::write(&proxy.config_path, changed).expect("write config");
}

#[test]
fn metrics_follow_admitted_refused_and_exempt_requests() {
    let upstream = Upstream::start();
    let proxy = start(&upstream, "1s", 3);
    assert_eq!(proxy.admin_get("/healthz").status, 200);
    let ready = proxy.admin_get("/readyz");
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));
    for _ in 0..5 {
        proxy.get("/");
    }
    for _ in 0..2 {
        proxy.get("/healthz");
    }
    let admitted = "floodgate_decisions_total{limit=\"per-ip\",outcome=\"admitted\"}";
    let refused = "floodgate_decisions_total{limit=\"per-ip\",outcome=\"refused\"}";
    assert_eq!(proxy.metric(admitted), 3.0);
    assert_eq!(proxy.metric(refused), 2.0);
    assert_eq!(proxy.metric("floodgate_exempt_requests_total"), 2.0);
    assert_eq!(proxy.metric("floodgate_local_keys"), 1.0);
    assert_eq!(proxy.metric("floodgate_fallback_active"), 0.0);
    let scrape = proxy.admin_get("/metrics");
    assert_eq!(
        scrape.header("Content-Type"),
        Some("text/plain; version=0.0.4")
    );
    assert!(scrape
        .body
        .contains("# TYPE floodgate_redis_call_duration_seconds histogram"));
    assert_eq!(proxy.admin_get("/nope").status, 404);
    std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/target/measurements")).ok();
    std::fs::write(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/measurements/scrape.txt"
        ),
        &scrape.body,
    )
    .ok();
}

#[test]
fn sighup_reload_applies_to_new_requests_and_spares_the_one_in_flight() {
    let upstream = Upstream::start();
    let mut proxy = start(&upstream, "1s", 2);
    // A request admitted under the old limit, held in flight across the reload.
    let addr = proxy.addr;
    let slow = thread::spawn(move || request(addr, "GET", "/hold", &[], b""));
    assert!(wait_until(Duration::from_secs(5), || upstream.count() == 1));
    assert_eq!(proxy.get("/").status, 200);
    assert_eq!(proxy.get("/").status, 429, "old limit of 2 in force");

    rewrite_limit(&proxy, 2, "5");
    proxy.signal("-HUP");
    assert!(
        wait_until(Duration::from_secs(5), || proxy.log().contains("reloaded")),
        "{}",
        proxy.log()
    );
    let after: Vec<u16> = (0..4).map(|_| proxy.get("/").status).collect();
    assert_eq!(
        after,
        vec![200, 200, 200, 429],
        "the state carries over; the limit is now 5"
    );
    assert!(!slow.is_finished(), "the held request spans the reload");
    upstream.release();
    let slow = slow.join().expect("slow request");
    assert_eq!(slow.status, 200, "the request in flight finished");
    assert_eq!(
        slow.header("RateLimit-Limit"),
        Some("2"),
        "under the config it started with"
    );
    assert!(proxy.is_running());
    assert_eq!(
        proxy.metric("floodgate_config_reloads_total{result=\"ok\"}"),
        1.0
    );
}

#[test]
fn an_invalid_reload_keeps_the_old_config_and_the_process() {
    let upstream = Upstream::start();
    let mut proxy = start(&upstream, "1s", 3);
    rewrite_limit(&proxy, 3, "0");
    proxy.signal("-HUP");
    assert!(wait_until(Duration::from_secs(5), || proxy
        .log()
        .contains("reload refused")));
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("reload refused"))
        .unwrap_or_default();
    assert!(
        line.contains("limits[0].limit: must be a whole number of at least 1"),
        "{line}"
    );
    assert!(proxy.is_running());
    let statuses: Vec<u16> = (0..4).map(|_| proxy.get("/").status).collect();
    assert_eq!(
        statuses,
        vec![200, 200, 200, 429],
        "the old limit of 3 still serves"
    );
    assert_eq!(
        proxy.metric("floodgate_config_reloads_total{result=\"failed\"}"),
        1.0
    );
    // A second SIGHUP does not kill it either.
    proxy.signal("-HUP");
    assert!(wait_until(Duration::from_secs(5), || proxy
        .log()
        .matches("reload refused")
        .count()
        == 2));
    assert!(proxy.is_running());
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_then_exits_within_the_grace_period() {
    let upstream = Upstream::start();
    let mut proxy = start(&upstream, "4s", 100);
    let addr = proxy.addr;
    let slow = thread::spawn(move || {
        let r = request(addr, "GET", "/hold", &[], b"");
        (r.status, Instant::now())
    });
    assert!(wait_until(Duration::from_secs(5), || upstream.count() == 1));
    let term_at = Instant::now();
    proxy.signal("-TERM");
    assert!(wait_until(Duration::from_secs(2), || proxy
        .admin_get("/readyz")
        .status
        == 503));
    // Draining: still running for the request in flight, which ends now.
    assert!(proxy.is_running(), "exited with a request in flight");
    upstream.release();
    let status = proxy.wait_exit(Duration::from_secs(10)).expect("exited");
    let exited_after = term_at.elapsed();
    let (slow_status, finished_at) = slow.join().expect("slow request");
    assert_eq!(slow_status, 200, "the request in flight was not cut");
    assert!(status.success(), "{status}");
    assert!(finished_at <= Instant::now());
    assert!(
        exited_after < Duration::from_secs(4),
        "exit took {exited_after:?}, beyond the grace period"
    );
    assert!(proxy.log().contains("drained in"), "{}", proxy.log());
}

#[test]
fn sigterm_gives_up_on_a_request_slower_than_the_grace_period() {
    let upstream = Upstream::start();
    let mut proxy = start(&upstream, "1s", 100);
    let addr = proxy.addr;
    // Held until the upstream is dropped: longer than any grace period.
    let slow = thread::spawn(move || request(addr, "GET", "/hold", &[], b"").status);
    assert!(wait_until(Duration::from_secs(5), || upstream.count() == 1));
    let term_at = Instant::now();
    proxy.signal("-TERM");
    proxy.wait_exit(Duration::from_secs(10)).expect("exited");
    let exited_after = term_at.elapsed();
    assert!(
        exited_after < Duration::from_millis(3_500),
        "exit took {exited_after:?}"
    );
    assert!(proxy
        .log()
        .contains("grace period over with 1 request(s) still in flight"));
    assert_ne!(slow.join().unwrap_or(0), 200);
}

#[test]
fn every_reload_says_a_restart_is_due_while_one_is() {
    let upstream = Upstream::start();
    let proxy = start(&upstream, "1s", 3);
    let text = std::fs::read_to_string(&proxy.config_path).expect("config");
    // A listener setting: only a restart applies it.
    let changed = text.replace("threads = 2", "threads = 1");
    assert_ne!(text, changed);
    std::fs::write(&proxy.config_path, changed).expect("write");
    let warning = "changes to [server] take effect only after a restart";
    for reloads in 1..=2 {
        proxy.signal("-HUP");
        assert!(
            wait_until(Duration::from_secs(5), || proxy
                .log()
                .matches(warning)
                .count()
                == reloads),
            "reload {reloads}: {}",
            proxy.log()
        );
    }
}
