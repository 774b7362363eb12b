//! Per-client overrides end to end on the real binary: one client's own
//! numbers under one limit, set through the admin API, move that client's
//! 429 point and no one else's, keep its running state, show in the
//! headers and in `/v1/clients`, expire by themselves, reach every
//! instance sharing Redis within a second, survive restarts, and bad input
//! changes nothing.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::admin_token::{TokenFile, TOKEN};
use common::load::ClientLoad;
use common::redis_server::RedisServer;
use common::{
    burst, count_status, request, temp_dir, wait_until, ConfigBuilder, Limit, Proxy, Response,
    TestClock, Upstream,
};
use serde_json::Value;

const SECRET: &str = "an-identity-secret-shared-by-every-instance";

/// Two limits keyed on the account header: a window of 5 an hour and a
/// bucket of 5 that refills about never; and one per address.
fn builder(upstream: &Upstream, token: &TokenFile) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .env("FLOODGATE_IDENTITY_SECRET", SECRET)
        .limit(
            Limit::fixed_window("per-account", "header:x-account", 5, "1h")
                .matching("paths = [\"/w\"]"),
        )
        .limit(
            Limit::token_bucket("account-bucket", "header:x-account", 5, 1.0 / 86_400.0)
                .matching("paths = [\"/b\"]"),
        )
        .raw(&token.section())
}

fn call(admin: SocketAddr, method: &str, path: &str, body: &str) -> Response {
    let bearer = format!("Bearer {TOKEN}");
    let mut headers = vec![("Authorization", bearer.as_str())];
    if !body.is_empty() {
        headers.push(("Content-Type", "application/json"));
    }
    request(admin, method, path, &headers, body.as_bytes())
}

fn json(r: &Response) -> Value {
    serde_json::from_str(&r.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", r.status, r.body))
}

fn admin(proxy: &Proxy) -> SocketAddr {
    proxy.admin.expect("admin listener")
}

fn put_override(proxy: &Proxy, body: &str) -> Response {
    call(admin(proxy), "PUT", "/v1/overrides", body)
}

/// 60 requests at once from `account` to `path`: how many were admitted.
fn admitted_at_once(addrs: &[SocketAddr], path: &str, account: &str) -> usize {
    let answers = burst(addrs, 60, "GET", path, &[("X-Account", account)]);
    assert_eq!(answers.len(), 60);
    count_status(&answers, 200)
}

fn admitted_one_by_one(addr: SocketAddr, path: &str, account: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| request(addr, "GET", path, &[("X-Account", account)], b"").status == 200)
        .count()
}

fn quota_seen(addr: SocketAddr, path: &str, account: &str) -> Option<String> {
    request(addr, "GET", path, &[("X-Account", account)], b"")
        .header("ratelimit-limit")
        .map(str::to_string)
}

/// The time `s` seconds from now, as `expires` takes it.
fn rfc3339_in(s: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    chrono::DateTime::from_timestamp((now + s) as i64, 0)
        .expect("a time")
        .to_rfc3339()
}

fn listed(proxy: &Proxy, query: &str) -> Value {
    let r = call(admin(proxy), "GET", &format!("/v1/overrides{query}"), "");
    assert_eq!(r.status, 200, "{}", r.body);
    json(&r)
}

#[test]
fn an_override_moves_one_clients_limit_keeps_what_it_spent_and_no_one_else_gains() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = builder(&upstream, &token).start();
    let addrs = [proxy.addr];

    // The window: acct-a spends 4 of 5; its limit becomes 8, and the 4 it
    // spent stay spent: 4 more of 60 at once.
    assert_eq!(admitted_one_by_one(proxy.addr, "/w", "acct-a", 4), 4);
    let r = put_override(
        &proxy,
        r#"{"limit": "per-account", "header": "X-Account:acct-a", "numbers": {"limit": 8, "window": "1h"}, "label": "launch week"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let set = json(&r);
    assert_eq!(set["in_force"], true);
    assert_eq!(set["label"], "launch week");
    assert_eq!(set["numbers"]["limit"], 8);
    assert_eq!(set["kept_in"], "memory");
    assert_eq!(admitted_at_once(&addrs, "/w", "acct-a"), 4);
    // Its refusals say the numbers in force.
    let refused = request(proxy.addr, "GET", "/w", &[("X-Account", "acct-a")], b"");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("ratelimit-limit"), Some("8"));
    // Everyone else keeps the file's numbers: another account, the same
    // account spelled otherwise (values are compared exactly), and the
    // same account under the other limit.
    assert_eq!(admitted_at_once(&addrs, "/w", "acct-b"), 5);
    assert_eq!(admitted_at_once(&addrs, "/w", "ACCT-A"), 5);
    assert_eq!(quota_seen(proxy.addr, "/b", "acct-a").as_deref(), Some("5"));

    // The bucket: acct-c spends 3 of 5; its capacity becomes 10: what it
    // spent stays spent, 7 more.
    assert_eq!(admitted_one_by_one(proxy.addr, "/b", "acct-c", 3), 3);
    let r = put_override(
        &proxy,
        r#"{"limit": "account-bucket", "header": "X-Account:acct-c", "capacity": 10, "refill_rate": 0.0000115740}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(admitted_at_once(&addrs, "/b", "acct-c"), 7);
    // Lowered below what it spent: nothing until it refills.
    let r = put_override(
        &proxy,
        r#"{"limit": "account-bucket", "header": "X-Account:acct-c", "capacity": 2, "refill_rate": 0.0000115740}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(admitted_at_once(&addrs, "/b", "acct-c"), 0);

    // /v1/clients reads the numbers in force, and says whose they are.
    let r = call(
        admin(&proxy),
        "GET",
        "/v1/clients?header=X-Account:acct-a&limit=per-account",
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let shown = &json(&r)["limits"][0];
    assert_eq!(shown["quota"], 8, "{shown}");
    assert_eq!(shown["remaining"], 0, "{shown}");
    assert_eq!(shown["override"]["label"], "launch week", "{shown}");

    // Listed, by limit and by client; removed, the file's numbers are back
    // (the 8 it spent are over the 5).
    assert_eq!(listed(&proxy, "")["total"], 2);
    assert_eq!(listed(&proxy, "?limit=per-account")["total"], 1);
    let one = listed(&proxy, "?limit=account-bucket&header=X-Account:acct-c");
    assert_eq!(one["overrides"][0]["numbers"]["capacity"], 2);
    let r = call(
        admin(&proxy),
        "DELETE",
        "/v1/overrides?limit=per-account&header=X-Account:acct-a",
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(quota_seen(proxy.addr, "/w", "acct-a").as_deref(), Some("5"));
    let r = call(
        admin(&proxy),
        "DELETE",
        "/v1/overrides?limit=per-account&header=X-Account:acct-a",
        "",
    );
    assert_eq!(r.status, 404, "{}", r.body);
    let log = proxy.log();
    assert!(
        log.contains("override_set header x-account under per-account"),
        "{log}"
    );
    assert!(log.contains("override_removed"), "{log}");
    assert_eq!(
        proxy.metric("floodgate_client_changes_total{what=\"override_set\"}"),
        3.0
    );
    assert_eq!(
        proxy.metric("floodgate_client_changes_total{what=\"override_removed\"}"),
        1.0
    );
}

#[test]
fn bad_overrides_are_refused_naming_the_field_and_change_nothing() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = builder(&upstream, &token)
        .limit(Limit::sliding_log("log", "header:x-account", 10, "1m").matching("paths = [\"/l\"]"))
        .start();
    let cases: [(&str, u16, &str); 14] = [
        (
            r#"{"limit": "nope", "header": "X-Account:a", "capacity": 5, "refill_rate": 1}"#,
            404,
            "no limit named \"nope\"",
        ),
        (
            r#"{"limit": "per-account", "header": "X-Account:a", "numbers": {"limit": 8, "window": "1h", "max": 3}}"#,
            400,
            "numbers.max: `max` does not apply to fixed_window",
        ),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "capacity": 5, "refill_rate": 1, "colour": "red"}"#,
            400,
            "numbers.colour: unknown field",
        ),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "capacity": 0, "refill_rate": 1}"#,
            400,
            "numbers.capacity: must be a whole number of at least 1 (got 0)",
        ),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "capacity": 5, "refill_rate": 20000000}"#,
            400,
            "numbers.refill_rate:",
        ),
        (
            r#"{"limit": "log", "header": "X-Account:a", "numbers": {"limit": 100001, "window": "1m"}}"#,
            400,
            "numbers.limit: ",
        ),
        (
            r#"{"limit": "per-account", "header": "X-Account:a", "window": "1h"}"#,
            400,
            "numbers.limit: fixed_window needs `limit` (at the top, \"limit\" names the limit",
        ),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "capacity": "5", "refill_rate": 1}"#,
            400,
            "numbers.capacity: a number is expected",
        ),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "capacity": 5}"#,
            400,
            "numbers.refill_rate: token_bucket needs `refill_rate`",
        ),
        (
            r#"{"limit": "account-bucket", "api_key": "has a space", "capacity": 5, "refill_rate": 1}"#,
            404,
            "no such key",
        ),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "ip": "203.0.113.7", "capacity": 5, "refill_rate": 1}"#,
            400,
            "name the client by exactly one of",
        ),
        (
            r#"{"limit": "account-bucket", "ip": "203.0.113.7", "capacity": 5, "refill_rate": 1}"#,
            400,
            "is keyed on header:x-account, not on ip=203.0.113.7",
        ),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "capacity": 5, "refill_rate": 1, "expires": "2020-01-01T00:00:00Z"}"#,
            400,
            "expires: is past",
        ),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "capacity": 5, "refill_rate": 1, "expires": "next week"}"#,
            400,
            "expires: not an RFC 3339 time",
        ),
    ];
    let reason = |r: &Response| json(r)["reason"].as_str().unwrap_or("").to_string();
    for (body, status, says) in cases {
        let r = put_override(&proxy, body);
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(reason(&r).contains(says), "{body}: {}", r.body);
    }
    for (body, says) in [
        ("not json", "body: not JSON"),
        ("[1, 2]", "body: a JSON object is expected"),
        (
            r#"{"limit": "account-bucket", "header": "X-Account:a", "numbers": {"capacity": 5, "refill_rate": 1}, "capacity": 6}"#,
            "not both",
        ),
    ] {
        let r = put_override(&proxy, body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(reason(&r).contains(says), "{body}: {}", r.body);
    }
    assert_eq!(listed(&proxy, "")["total"], 0, "nothing was set");
    assert_eq!(quota_seen(proxy.addr, "/b", "a").as_deref(), Some("5"));
    let r = call(admin(&proxy), "GET", "/v1/overrides?colour=red", "");
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn an_override_lapses_at_its_expiry_on_the_proxys_clock() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let clock = TestClock::new();
    let proxy = builder(&upstream, &token).clock(&clock).start();
    let in_a_minute = rfc3339_in(60);
    let r = put_override(
        &proxy,
        &format!(
            r#"{{"limit": "account-bucket", "header": "X-Account:acct-a", "capacity": 9, "refill_rate": 1, "expires": "{in_a_minute}"}}"#
        ),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(quota_seen(proxy.addr, "/b", "acct-a").as_deref(), Some("9"));
    clock.advance(Duration::from_secs(61));
    assert!(
        wait_until(Duration::from_secs(2), || quota_seen(
            proxy.addr, "/b", "acct-a"
        )
        .as_deref()
            == Some("5")),
        "still {:?}",
        quota_seen(proxy.addr, "/b", "acct-a")
    );
    assert_eq!(listed(&proxy, "")["total"], 0);
    assert!(proxy.log().contains("expired"), "{}", proxy.log());
}

#[test]
fn the_memory_store_keeps_overrides_across_a_reload_and_a_restart() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let dir = temp_dir();
    let file = dir.join("clients.json");
    let memory =
        builder(&upstream, &token).raw(&format!("clients_file = \"{}\"\n", file.display()));
    let proxy = memory.start();
    let r = put_override(
        &proxy,
        r#"{"limit": "per-account", "header": "X-Account:acct-a", "numbers": {"limit": 8, "window": "1h"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["kept_in"], "file");
    proxy.signal("-HUP");
    proxy.await_log("reloaded", "no reload");
    assert_eq!(quota_seen(proxy.addr, "/w", "acct-a").as_deref(), Some("8"));
    drop(proxy);

    let proxy = memory.start();
    assert_eq!(quota_seen(proxy.addr, "/w", "acct-a").as_deref(), Some("8"));
    assert!(proxy
        .log()
        .contains("0 API key entries and 1 overrides loaded from"));
    // A reload whose limit reads other numbers (a bucket now) keeps the
    // override out of force, and one that reads them again brings it back.
    let path = proxy.config_path.clone();
    let original = std::fs::read_to_string(&path).expect("config");
    let changed = original.replacen(
        "name = \"per-account\"\nkey = \"header:x-account\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"",
        "name = \"per-account\"\nkey = \"header:x-account\"\nalgorithm = \"token_bucket\"\ncapacity = 6\nrefill_rate = 1",
        1,
    );
    assert_ne!(changed, original, "the limit's table: {original}");
    std::fs::write(&path, changed).expect("write");
    proxy.signal("-HUP");
    proxy.await_log("reloaded", "no reload");
    assert_eq!(quota_seen(proxy.addr, "/w", "acct-a").as_deref(), Some("6"));
    let kept = listed(&proxy, "");
    assert_eq!(kept["total"], 1);
    assert_eq!(kept["overrides"][0]["in_force"], false);
    assert!(
        kept["overrides"][0]["not_in_force_because"]
            .as_str()
            .is_some_and(|w| w.contains("does not apply to token_bucket")),
        "{kept}"
    );
    std::fs::write(&path, original).expect("write");
    proxy.signal("-HUP");
    assert!(wait_until(Duration::from_secs(5), || quota_seen(
        proxy.addr, "/w", "acct-a"
    )
    .as_deref()
        == Some("8")));
    drop(proxy);
    common::remove_test_dir(&dir);
}

/// How long until `addr` shows `account` the quota `quota` on `path`, or
/// none within 1 s (polled, never slept for).
fn seen_within_a_second(
    addr: SocketAddr,
    path: &str,
    account: &str,
    quota: &str,
) -> Option<Duration> {
    let from = Instant::now();
    wait_until(Duration::from_secs(1), || {
        quota_seen(addr, path, account).as_deref() == Some(quota)
    })
    .then(|| from.elapsed())
}

#[test]
fn an_override_set_on_one_instance_moves_the_429_point_on_the_other_and_outlives_restarts() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let shared = builder(&upstream, &token)
        .redis(&redis.url())
        .redis_lines("leases = \"off\"\ntimeout = \"2s\"\non_failure = \"deny\"");
    let a = shared.start();
    let b = shared.start();
    let r = put_override(
        &b,
        r#"{"limit": "per-account", "header": "X-Account:acct-a", "numbers": {"limit": 12, "window": "1h"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["kept_in"], "redis");
    // Polled until A shows it: each poll admitted before (at 5) or after
    // (at 12) is spent from the same window.
    let mut spent = 0;
    let seen = wait_until(Duration::from_secs(1), || {
        let r = request(a.addr, "GET", "/w", &[("X-Account", "acct-a")], b"");
        spent += usize::from(r.status == 200);
        r.header("ratelimit-limit") == Some("12")
    });
    assert!(seen, "A: {}", a.log());
    // 60 at once over both: the rest of 12.
    assert_eq!(
        admitted_at_once(&[a.addr, b.addr], "/w", "acct-a"),
        12 - spent
    );
    assert_eq!(admitted_at_once(&[a.addr, b.addr], "/w", "acct-b"), 5);

    // Every proxy and then Redis restarted: still there.
    drop(a);
    drop(b);
    redis.restart();
    let a = shared.start();
    assert_eq!(quota_seen(a.addr, "/w", "acct-a").as_deref(), Some("12"));
    let r = call(
        admin(&a),
        "DELETE",
        "/v1/overrides?limit=per-account&header=X-Account:acct-a",
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let b = shared.start();
    assert_eq!(quota_seen(b.addr, "/w", "acct-a").as_deref(), Some("5"));
    let r = put_override(
        &a,
        r#"{"limit": "account-bucket", "header": "X-Account:acct-z", "capacity": 7, "refill_rate": 1}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(seen_within_a_second(b.addr, "/b", "acct-z", "7").is_some());
    let r = call(
        admin(&a),
        "DELETE",
        "/v1/overrides?limit=account-bucket&header=X-Account:acct-z",
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(seen_within_a_second(b.addr, "/b", "acct-z", "5").is_some());
}

#[test]
fn sixty_concurrent_override_changes_under_load_fail_no_request_and_the_last_write_wins() {
    use std::sync::Arc;
    use std::thread;

    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let shared = ConfigBuilder::new(upstream.addr)
        .admin()
        .env("FLOODGATE_IDENTITY_SECRET", SECRET)
        .limit(Limit::fixed_window(
            "per-account",
            "header:x-account",
            1_000_000,
            "1h",
        ))
        .raw(&token.section())
        .redis(&redis.url());
    let a = shared.start();
    let b = shared.start();
    let accounts: Vec<String> = (0..60).map(|i| format!("account-{i:02}")).collect();

    // 64 connections' worth of requests from those accounts.
    let load = ClientLoad::start(&[a.addr, b.addr], 64, "X-Account", &accounts);
    assert!(wait_until(Duration::from_secs(10), || load.sent() > 200));

    // Sixty changers at once, each owning an account, writing three times
    // through alternating instances: 2,000,000, 3,000,000, then either of
    // them or a removal (the file's 1,000,000 again).
    let last = |i: usize| match i % 3 {
        0 => Some(2_000_000),
        1 => Some(3_000_000),
        _ => None,
    };
    let admins = [admin(&a), admin(&b)];
    let barrier = Arc::new(std::sync::Barrier::new(accounts.len()));
    let changers: Vec<_> = accounts
        .iter()
        .enumerate()
        .map(|(i, account)| {
            let (account, barrier) = (account.clone(), barrier.clone());
            let writes = [Some(2_000_000), Some(3_000_000), last(i)];
            thread::spawn(move || {
                barrier.wait();
                let mut statuses = Vec::new();
                for (n, write) in writes.iter().enumerate() {
                    let at = admins[(i + n) % 2];
                    let send = || match write {
                        Some(limit) => call(
                            at,
                            "PUT",
                            "/v1/overrides",
                            &format!(
                                r#"{{"limit": "per-account", "header": "X-Account:{account}", "numbers": {{"limit": {limit}, "window": "1h"}}}}"#
                            ),
                        ),
                        None => call(
                            at,
                            "DELETE",
                            &format!("/v1/overrides?limit=per-account&header=X-Account:{account}"),
                            "",
                        ),
                    };
                    // The admin listener takes 8 connections per address:
                    // the others are closed unread, and sent again.
                    let mut r = send();
                    for _ in 0..500 {
                        if r.status != 0 {
                            break;
                        }
                        thread::sleep(Duration::from_millis(5));
                        r = send();
                    }
                    statuses.push(r.status);
                }
                statuses
            })
        })
        .collect();
    for changer in changers {
        assert_eq!(changer.join().expect("changer"), vec![200, 200, 200]);
    }
    for proxy in [&a, &b] {
        for (i, account) in accounts.iter().enumerate() {
            let expected = last(i).unwrap_or(1_000_000).to_string();
            assert!(
                seen_within_a_second(proxy.addr, "/", account, &expected).is_some(),
                "{account} on {}: {:?} not {expected}",
                proxy.addr,
                quota_seen(proxy.addr, "/", account)
            );
        }
    }
    let (sent, failed) = load.finish();
    assert!(sent > 500, "{sent}");
    assert_eq!(failed, 0, "of {sent}");
    assert_eq!(listed(&a, "")["total"], 40);
    assert_eq!(listed(&b, "")["total"], 40);
}

#[test]
fn an_override_expires_on_every_instance_and_leaves_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let clock = TestClock::new();
    let shared = builder(&upstream, &token).redis(&redis.url()).clock(&clock);
    let a = shared.start();
    let b = shared.start();
    for (account, expires) in [("acct-a", rfc3339_in(60)), ("acct-b", rfc3339_in(3_600))] {
        let r = put_override(
            &a,
            &format!(
                r#"{{"limit": "account-bucket", "header": "X-Account:{account}", "capacity": 9, "refill_rate": 1, "expires": "{expires}"}}"#
            ),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert!(seen_within_a_second(b.addr, "/b", "acct-a", "9").is_some());
    let fields = || -> u64 { redis.cmd(&["HLEN", "floodgate:clients:overrides"]) };
    assert_eq!(fields(), 2);
    clock.advance(Duration::from_secs(61));
    for proxy in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(2), || quota_seen(
                proxy.addr, "/b", "acct-a"
            )
            .as_deref()
                == Some("5")),
            "{:?}",
            quota_seen(proxy.addr, "/b", "acct-a")
        );
        assert_eq!(quota_seen(proxy.addr, "/b", "acct-b").as_deref(), Some("9"));
    }
    assert!(
        wait_until(Duration::from_secs(2), || fields() == 1),
        "{} fields",
        fields()
    );
    // A new instance does not bring it back.
    let c = shared.start();
    assert_eq!(quota_seen(c.addr, "/b", "acct-a").as_deref(), Some("5"));
    assert_eq!(quota_seen(c.addr, "/b", "acct-b").as_deref(), Some("9"));
}

/// A concurrency limit's own number for one client: its slots, and no one
/// else's.
#[test]
fn an_override_of_a_concurrency_limit_sets_the_clients_slots() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .env("FLOODGATE_IDENTITY_SECRET", SECRET)
        .limit(Limit::concurrency(
            "in-flight",
            "header:x-account",
            2,
            "60s",
        ))
        .raw(&token.section())
        .start();
    let r = put_override(
        &proxy,
        r#"{"limit": "in-flight", "header": "X-Account:acct-a", "max": 5}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Both at once (the upstream's gate opens once): 12 of each.
    let handles: Vec<_> = ["acct-a", "acct-b"]
        .iter()
        .flat_map(|account| std::iter::repeat_n(*account, 12))
        .map(|account| {
            let addr = proxy.addr;
            let account = account.to_string();
            std::thread::spawn(move || {
                let r = request(addr, "GET", "/hold/report", &[("X-Account", &account)], b"");
                (account, r)
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(10), || upstream.holding() == 5 + 2
            && handles.iter().filter(|h| h.is_finished()).count() == 24 - 7),
        "{} held",
        upstream.holding()
    );
    upstream.release();
    let answers: Vec<(String, Response)> = handles
        .into_iter()
        .map(|h| h.join().expect("client"))
        .collect();
    for (account, slots) in [("acct-a", 5), ("acct-b", 2)] {
        let own: Vec<&Response> = answers
            .iter()
            .filter(|(a, _)| a == account)
            .map(|(_, r)| r)
            .collect();
        assert_eq!(count_status(own.iter().copied(), 200), slots, "{account}");
        let refused = own.iter().find(|r| r.status == 429).expect("a 429");
        assert_eq!(
            refused.header("RateLimit-Limit"),
            Some(slots.to_string().as_str()),
            "{account}"
        );
    }
    assert_eq!(upstream.most_held(), 7);
}
