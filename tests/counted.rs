//! Limits charged by the response's status (`count`): a reservation taken
//! when a request arrives, kept only when the upstream answers with a
//! listed status.

mod common;

use common::redis_server::RedisServer;
use common::{ConfigBuilder, Limit, Proxy, Upstream};

const WRONG: (&str, &str) = ("X-Answer-Status", "401");

/// Five failed logins per 15 minutes per address, and per account.
fn failed_logins(config: ConfigBuilder) -> Proxy {
    config
        .limit(
            Limit::sliding_log("failed-logins-ip", "ip", 5, "15m")
                .matching("methods = [\"POST\"], paths = [\"/login\"]")
                .line("count = { statuses = [401, 403] }"),
        )
        .limit(
            Limit::sliding_log("failed-logins-account", "header:X-Account", 5, "15m")
                .matching("methods = [\"POST\"], paths = [\"/login\"]")
                .line("count = { statuses = [\"4xx\"] }"),
        )
        .start()
}

fn login(proxy: &Proxy, account: &str, wrong: bool) -> u16 {
    let mut headers = vec![("X-Account", account)];
    if wrong {
        headers.push(WRONG);
    }
    proxy.send("POST", "/login", &headers).status
}

fn the_sixth_attempt_is_refused_even_with_the_right_password(proxy: &Proxy, upstream: &Upstream) {
    // Successes never count.
    for _ in 0..20 {
        assert_eq!(login(proxy, "alice", false), 200);
    }
    for attempt in 1..=5 {
        assert_eq!(
            login(proxy, "alice", true),
            401,
            "failure {attempt} reaches the app"
        );
    }
    let seen = upstream.count();
    assert_eq!(
        login(proxy, "alice", false),
        429,
        "the right password, too late"
    );
    assert_eq!(
        upstream.count(),
        seen,
        "the refused attempt never reached the app"
    );
    // The address is spent for every account it tries.
    assert_eq!(
        login(proxy, "bob", false),
        429,
        "the address is spent as well"
    );
}

#[test]
fn failed_logins_are_counted_not_logins_in_memory() {
    let upstream = Upstream::start();
    let proxy = failed_logins(ConfigBuilder::new(upstream.addr));
    the_sixth_attempt_is_refused_even_with_the_right_password(&proxy, &upstream);
}

#[test]
fn failed_logins_are_counted_not_logins_on_redis_across_proxies() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let config = ConfigBuilder::new(upstream.addr).redis(&redis.url());
    let (a, b) = (failed_logins(config.clone()), failed_logins(config));
    // Failures through either proxy count against one budget.
    for attempt in 1..=5 {
        let proxy = if attempt % 2 == 0 { &a } else { &b };
        assert_eq!(login(proxy, "carol", true), 401);
    }
    assert_eq!(login(&a, "carol", false), 429);
    assert_eq!(login(&b, "carol", false), 429);
}

#[test]
fn an_account_layer_counts_failures_from_every_address() {
    let upstream = Upstream::start();
    // Behind a trusted proxy, each request names its client.
    let proxy = ConfigBuilder::new(upstream.addr)
        .raw("[clients]\ntrusted_proxies = [\"127.0.0.1/32\"]")
        .limit(
            Limit::sliding_log("failed-logins-account", "header:X-Account", 3, "15m")
                .matching("paths = [\"/login\"]")
                .line("count = { statuses = [401] }"),
        )
        .start();
    for (i, client) in ["198.51.100.1", "198.51.100.2", "198.51.100.3"]
        .iter()
        .enumerate()
    {
        let headers = [("X-Account", "dave"), ("X-Forwarded-For", *client), WRONG];
        assert_eq!(
            proxy.send("POST", "/login", &headers).status,
            401,
            "failure {i}"
        );
    }
    let fresh = [("X-Account", "dave"), ("X-Forwarded-For", "198.51.100.9")];
    assert_eq!(proxy.send("POST", "/login", &fresh).status, 429);
    let other = [("X-Account", "erin"), ("X-Forwarded-For", "198.51.100.9")];
    assert_eq!(proxy.send("POST", "/login", &other).status, 200);
}

/// The attack: many wrong passwords at once, so that all pass the check
/// before any is charged. With one attempt at a time per account (a
/// concurrency limit), each failure is charged before the next attempt is
/// checked: exactly five reach the application, however many are sent.
#[test]
fn parallel_guesses_cannot_outrun_the_failure_count() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::sliding_log("failed-logins-account", "header:X-Account", 5, "15m")
                .matching("paths = [\"/login\"]")
                .line("count = { statuses = [401] }"),
        )
        .limit(
            Limit::concurrency("login-in-flight", "header:X-Account", 1, "30s")
                .matching("paths = [\"/login\"]"),
        )
        .start();
    let mut failures = 0;
    for _ in 0..8 {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(12));
        let attempts: Vec<_> = (0..12)
            .map(|_| {
                let (barrier, addr) = (barrier.clone(), proxy.addr);
                std::thread::spawn(move || {
                    barrier.wait();
                    let headers = [("X-Account", "mallory"), WRONG];
                    common::request(addr, "POST", "/login", &headers, b"").status
                })
            })
            .collect();
        for attempt in attempts {
            match attempt.join().expect("client thread") {
                401 => failures += 1,
                429 => {}
                other => panic!("unexpected {other}"),
            }
        }
    }
    assert_eq!(failures, 5, "wrong passwords that reached the application");
    assert_eq!(login(&proxy, "mallory", false), 429);
}

/// Hanging up is no way around the count: an attempt whose client resets
/// the connection once it is in runs to its answer, and a 401 counts; one
/// whose client goes before its body is in (the attempt can never be
/// answered) counts as a failure.
#[test]
fn hanging_up_is_no_way_around_the_count() {
    use std::io::Write;
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(
            Limit::sliding_log("failed-logins", "ip", 2, "15m")
                .matching("paths = [\"/hold/login\", \"/login\"]")
                .line("count = { statuses = [401] }"),
        )
        .start();
    let reset = |client: std::net::TcpStream| {
        socket2::SockRef::from(&client)
            .set_linger(Some(std::time::Duration::ZERO))
            .expect("linger");
        drop(client);
    };
    let mut whole = std::net::TcpStream::connect(proxy.addr).expect("connect");
    whole
        .write_all(b"POST /hold/login HTTP/1.1\r\nHost: test\r\nX-Answer-Status: 401\r\nContent-Length: 0\r\n\r\n")
        .expect("send");
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || upstream.holding() == 1
    ));
    reset(whole);
    let mut half = std::net::TcpStream::connect(proxy.addr).expect("connect");
    half.write_all(b"POST /login HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\npass")
        .expect("send");
    let given_up = "floodgate_requests_total{status_class=\"none\"}";
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || upstream.heads() == 2
    ));
    reset(half);
    assert!(common::wait_until(
        std::time::Duration::from_secs(5),
        || proxy.metric(given_up) >= 1.0
    ));
    // Both attempts hold their failures: the limit is spent.
    assert_eq!(proxy.send("POST", "/login", &[]).status, 429);
    upstream.release();
    assert!(common::wait_until(
        std::time::Duration::from_secs(5),
        || proxy.metric("floodgate_requests_total{status_class=\"4xx\"}") >= 2.0
    ));
    assert_eq!(
        proxy.send("POST", "/login", &[]).status,
        429,
        "the 401 counted"
    );
}

/// Five failed logins per 15 minutes per address; the attempts under
/// `/hold` wait at the application until the test lets them go.
fn five_failures(config: ConfigBuilder) -> ConfigBuilder {
    config.admin().limit(
        Limit::sliding_log("failed-logins", "ip", 5, "15m")
            .matching("paths = [\"/hold/login\"]")
            .line("count = { statuses = [401, 403] }"),
    )
}

/// 60 wrong passwords at once through `proxies`, all in flight together:
/// each reserves its failure before it goes upstream, so five reach the
/// application and the rest are refused at once, however they overlap.
fn sixty_at_once(proxies: &[&Proxy], upstream: &Upstream) {
    let addrs: Vec<std::net::SocketAddr> = proxies.iter().map(|p| p.addr).collect();
    let attempts =
        std::thread::spawn(move || common::burst(&addrs, 60, "POST", "/hold/login", &[WRONG]));
    let refused = |p: &&Proxy| {
        p.metric("floodgate_decisions_total{limit=\"failed-logins\",outcome=\"refused\"}")
    };
    let settled = common::wait_until(std::time::Duration::from_secs(20), || {
        proxies.iter().map(refused).sum::<f64>() + upstream.holding() as f64 >= 60.0
    });
    let held = upstream.most_held();
    upstream.release();
    let answers = attempts.join().expect("attempts");
    assert!(
        settled,
        "{} refused, {} held",
        proxies.iter().map(refused).sum::<f64>(),
        upstream.holding()
    );
    assert_eq!(held, 5, "attempts in flight at the application at once");
    assert_eq!(
        common::count_status(&answers, 401),
        5,
        "failures that reached it"
    );
    assert_eq!(common::count_status(&answers, 429), 55);
    assert_eq!(upstream.count(), 5);
}

#[test]
fn sixty_concurrent_failures_cannot_pass_a_limit_of_five() {
    let upstream = Upstream::start();
    let proxy = five_failures(ConfigBuilder::new(upstream.addr)).start();
    sixty_at_once(&[&proxy], &upstream);
    assert_eq!(proxy.send("POST", "/hold/login", &[]).status, 429, "spent");
}

#[test]
fn sixty_concurrent_failures_across_proxies_on_redis_cannot_pass_five() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    // A deadline a loaded machine cannot miss: a first call past the default
    // 50 ms let each proxy's fallback admit its own five beside Redis.
    let config = five_failures(
        ConfigBuilder::new(upstream.addr)
            .redis(&redis.url())
            .redis_lines("timeout = \"2s\""),
    );
    let (a, b) = (config.start(), config.start());
    sixty_at_once(&[&a, &b], &upstream);
    for p in [&a, &b] {
        assert_eq!(p.metric("floodgate_fallback_decisions_total"), 0.0);
    }
}

/// A success gives its reservation back: successes at once never spend
/// the failures' budget, and the attempts after them still count.
#[test]
fn concurrent_successes_give_their_reservations_back() {
    let upstream = Upstream::start();
    let proxy = five_failures(ConfigBuilder::new(upstream.addr)).start();
    let addrs = vec![proxy.addr];
    let logins = std::thread::spawn(move || common::burst(&addrs, 5, "POST", "/hold/login", &[]));
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || upstream.holding() == 5
    ));
    // While they are in flight, their reservations hold the budget.
    assert_eq!(proxy.send("POST", "/hold/login", &[]).status, 429);
    upstream.release();
    let answers = logins.join().expect("logins");
    assert_eq!(common::count_status(&answers, 200), 5);
    // Given back: five failures still fit, and no sixth.
    for attempt in 1..=5 {
        let r = proxy.send("POST", "/hold/login", &[WRONG]);
        assert_eq!(r.status, 401, "failure {attempt}");
    }
    assert_eq!(proxy.send("POST", "/hold/login", &[]).status, 429);
}
