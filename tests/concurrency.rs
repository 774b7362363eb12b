//! Concurrency limits end to end: the real binary in front of an upstream
//! that holds requests and counts how many it holds at once.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{count_status, wait_until, Response, TestClock, Upstream};
use common::{ConfigBuilder, Limit};

/// `n` requests for `path` at once, each on its own connection; their
/// answers, once all have one.
fn at_once(
    proxy_addr: std::net::SocketAddr,
    path: &str,
    n: usize,
) -> Vec<thread::JoinHandle<Response>> {
    let barrier = Arc::new(std::sync::Barrier::new(n));
    (0..n)
        .map(|_| {
            let (barrier, path) = (barrier.clone(), path.to_string());
            thread::spawn(move || {
                barrier.wait();
                common::request(proxy_addr, "GET", &path, &[], b"")
            })
        })
        .collect()
}

fn answers(handles: Vec<thread::JoinHandle<Response>>) -> Vec<Response> {
    handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect()
}

#[test]
fn thirty_at_once_on_one_key_never_put_more_than_three_in_flight() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(Limit::concurrency("in-flight", "ip", 3, "60s"))
        .start();
    let handles = at_once(proxy.addr, "/hold/report", 30);
    // The refused are answered at once, while three are held upstream.
    assert!(wait_until(Duration::from_secs(10), || {
        upstream.holding() == 3 && handles.iter().filter(|h| h.is_finished()).count() == 27
    }));
    upstream.release();
    let answers = answers(handles);
    assert_eq!(upstream.most_held(), 3, "never more than max in flight");
    assert_eq!(count_status(&answers, 200), 3);
    assert_eq!(count_status(&answers, 429), 27);
    let refused = answers.iter().find(|r| r.status == 429).expect("a 429");
    assert!(
        refused.body.contains("\"limit\":\"in-flight\""),
        "{}",
        refused.body
    );
    assert_eq!(refused.header("RateLimit-Limit"), Some("3"));
    assert_eq!(refused.header("RateLimit-Remaining"), Some("0"));
    assert_eq!(
        refused.header("Retry-After"),
        Some("1"),
        "try again shortly"
    );
    // Every slot came back with its response. An admitted request's headers
    // advertise rates, and this route has none.
    let after: Vec<Response> = (0..4).map(|_| proxy.get("/after")).collect();
    assert_eq!(count_status(&after, 200), 4);
    assert_eq!(after[0].header("RateLimit-Limit"), None);
}

#[test]
fn a_slot_is_renewed_while_its_request_lasts() {
    let upstream = Upstream::start();
    // A lease far shorter than the request: without renewal the slot
    // would come back while the first request is still held.
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(Limit::concurrency("one-at-a-time", "ip", 1, "300ms"))
        .start();
    let first = at_once(proxy.addr, "/hold/long", 1);
    assert!(wait_until(Duration::from_secs(10), || upstream.holding() == 1));
    // Over four leases' time, every other request is refused.
    let started = std::time::Instant::now();
    let mut refused = 0;
    while started.elapsed() < Duration::from_millis(1200) {
        assert_eq!(
            proxy.get("/other").status,
            429,
            "after {:?}",
            started.elapsed()
        );
        refused += 1;
        thread::sleep(Duration::from_millis(50));
    }
    assert!(refused >= 10);
    upstream.release();
    assert_eq!(answers(first)[0].status, 200);
    assert!(wait_until(Duration::from_secs(5), || proxy
        .get("/other")
        .status
        == 200));
}

#[test]
fn two_proxies_on_one_redis_share_the_slots() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let config = ConfigBuilder::new(upstream.addr)
        .redis(&redis.url())
        .limit(Limit::concurrency("in-flight", "global", 3, "60s"));
    let (a, b) = (config.start(), config.start());
    let held = at_once(a.addr, "/hold/a", 3);
    assert!(wait_until(Duration::from_secs(10), || upstream.holding() == 3));
    let from_b = b.get("/b");
    assert_eq!(
        from_b.status, 429,
        "the three slots are held through the other proxy"
    );
    upstream.release();
    assert_eq!(count_status(answers(held), 200), 3);
    assert_eq!(b.get("/b").status, 200);
    assert_eq!(upstream.most_held(), 3);
}

#[test]
fn the_slots_of_a_proxy_killed_while_holding_them_return_after_the_lease() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let clock = TestClock::new();
    let config = ConfigBuilder::new(upstream.addr)
        .redis(&redis.url())
        .redis_lines("clock = \"local\"")
        .clock(&clock)
        .limit(Limit::concurrency("in-flight", "global", 2, "10s"));
    let mut doomed = config.start();
    let survivor = config.start();
    let held = at_once(doomed.addr, "/hold/doomed", 2);
    assert!(wait_until(Duration::from_secs(10), || upstream.holding() == 2));
    doomed.signal("-KILL");
    assert!(doomed.wait_exit(Duration::from_secs(5)).is_some());
    // Nobody releases them: still held until their lease ends.
    assert_eq!(survivor.get("/now").status, 429);
    clock.advance(Duration::from_millis(9_900));
    assert_eq!(survivor.get("/almost").status, 429);
    clock.advance(Duration::from_millis(200));
    assert_eq!(survivor.get("/later").status, 200);
    upstream.release();
    drop(answers(held));
}
