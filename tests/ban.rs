//! The penalty box (`ban`): a key refused `after` times within `within` is
//! refused on every route for `duration`, on one proxy or on all that share
//! a Redis; each ban is counted and logged once.

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::{wait_until, ConfigBuilder, Limit, Proxy, TestClock, Upstream};

/// Two logins per hour per address; three refusals within ten minutes ban
/// the address for an hour.
fn login() -> Limit {
    Limit::fixed_window("login", "ip", 2, "1h")
        .matching("paths = [\"/login\"]")
        .line("ban = { after = 3, within = \"10m\", duration = \"1h\" }")
}

const BANS: &str = "floodgate_bans_total{limit=\"login\"}";
const BANNED: &str = "floodgate_decisions_total{limit=\"login\",outcome=\"banned\"}";

fn bans(proxies: &[&Proxy]) -> f64 {
    proxies.iter().map(|p| p.metric(BANS)).sum()
}

/// Refusals through `proxies` in turn until the third bans the address.
fn hammer_until_banned(proxies: &[&Proxy]) {
    for n in 0..2 {
        assert_eq!(
            proxies[n % proxies.len()]
                .send("POST", "/login", &[])
                .status,
            200
        );
    }
    for n in 0..3 {
        let proxy = proxies[n % proxies.len()];
        let r = proxy.send("POST", "/login", &[]);
        assert_eq!(r.status, 429);
        assert!(r.body.contains("\"error\":\"rate_limited\""), "{}", r.body);
    }
    // Strikes are counted once each answer is out.
    assert!(
        wait_until(Duration::from_secs(5), || bans(proxies) == 1.0),
        "one ban, counted once: {}",
        bans(proxies)
    );
}

fn logged_bans(proxy: &Proxy) -> usize {
    proxy.log().matches(" after 3 refusals within ").count()
}

/// A minute's first second, so that minute and hour windows start with
/// the test.
const MINUTE_START_US: u64 = 1_803_859_201_000_000;

fn assert_banned_everywhere(proxy: &Proxy, upstream: &Upstream) {
    assert_banned_on(proxy, upstream, &["/login", "/", "/api/orders"]);
}

fn assert_banned_on(proxy: &Proxy, upstream: &Upstream, paths: &[&str]) {
    let seen = upstream.count();
    for &path in paths {
        let r = proxy.send("GET", path, &[]);
        assert_eq!(r.status, 429, "{path}");
        assert!(
            r.body
                .starts_with("{\"error\":\"banned\",\"limit\":\"login\",\"retry_after_ms\":"),
            "{}",
            r.body
        );
        let retry = r.retry_after_ms().expect("a retry time");
        assert!((3_590_000..=3_600_000).contains(&retry), "{retry} ms");
        let after = r.header("Retry-After");
        assert!(matches!(after, Some("3600" | "3599")), "{after:?}");
    }
    assert_eq!(upstream.count(), seen, "nothing reached the app");
}

#[test]
fn three_refusals_ban_the_address_on_every_route_for_the_duration() {
    let upstream = Upstream::start();
    let clock = TestClock::new();
    clock.set_now_us(MINUTE_START_US);
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .clock(&clock)
        .limit(login())
        .start();
    hammer_until_banned(&[&proxy]);
    assert_banned_everywhere(&proxy, &upstream);
    assert!(wait_until(Duration::from_secs(5), || proxy.metric(BANNED) == 3.0));
    assert_eq!(logged_bans(&proxy), 1, "{}", proxy.log());
    // A minute before the end, still banned; at the end, free on every
    // route (the login window of an hour has passed too).
    clock.advance(Duration::from_secs(3540));
    assert_eq!(proxy.get("/").status, 429);
    clock.advance(Duration::from_secs(61));
    assert_eq!(proxy.get("/").status, 200);
    assert_eq!(proxy.send("POST", "/login", &[]).status, 200);
    assert_eq!(proxy.metric(BANS), 1.0, "still one ban");
}

#[test]
fn refusals_spread_over_time_do_not_ban() {
    let upstream = Upstream::start();
    let clock = TestClock::new();
    clock.set_now_us(MINUTE_START_US);
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .clock(&clock)
        .limit(
            Limit::fixed_window("login", "ip", 1, "1m")
                .matching("paths = [\"/login\"]")
                .line("ban = { after = 3, within = \"10m\", duration = \"1h\" }"),
        )
        .start();
    // Two refusals, then 11 minutes (past `within`), then two more: never
    // three within ten minutes.
    for round in 0..2 {
        assert_eq!(
            proxy.send("POST", "/login", &[]).status,
            200,
            "round {round}"
        );
        for _ in 0..2 {
            assert_eq!(proxy.send("POST", "/login", &[]).status, 429);
        }
        // The strikes are taken once the answers are out: all of them
        // before the clock moves on.
        let refused = "floodgate_decisions_total{limit=\"login\",outcome=\"refused\"}";
        let struck = 2.0 * (round + 1) as f64;
        assert!(wait_until(Duration::from_secs(5), || proxy.metric(refused) == struck));
        clock.advance(Duration::from_secs(11 * 60));
    }
    assert_eq!(proxy.get("/").status, 200, "not banned");
    assert_eq!(proxy.metric(BANS), 0.0);
}

#[test]
fn a_ban_on_redis_is_shared_by_proxies() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    // The proxies' clock (an hour window that cannot end mid-test) for
    // the script too.
    let config = ConfigBuilder::new(upstream.addr)
        .admin()
        .redis(&redis.url())
        .redis_lines("clock = \"local\"")
        .limit(login())
        .limit(
            Limit::concurrency("reports-in-flight", "ip", 4, "60s")
                .matching("paths = [\"/reports\"]"),
        );
    let (a, b) = (config.start(), config.start());
    // Looking a ban up costs no Redis call of its own: one script run per
    // request, on a route the banning limit does not match as on its own.
    assert_eq!(a.get("/").status, 200, "the script loaded");
    let before = redis.calls("evalsha");
    for path in ["/", "/login", "/api/orders"] {
        assert_eq!(a.send("POST", path, &[]).status, 200);
    }
    assert_eq!(redis.calls("evalsha"), before + 3);
    redis.cmd::<()>(&["FLUSHALL"]);
    // Refusals through both proxies add up to one ban.
    hammer_until_banned(&[&a, &b]);
    assert_banned_everywhere(&a, &upstream);
    assert_banned_everywhere(&b, &upstream);
    assert_eq!(
        logged_bans(&a) + logged_bans(&b),
        1,
        "the ban is logged once"
    );
    // A banned key takes no slot: one lookup, no slot taken and given back.
    let before = redis.calls("evalsha");
    let r = a.get("/reports");
    assert!(r.body.starts_with("{\"error\":\"banned\""), "{}", r.body);
    assert_eq!(redis.calls("evalsha"), before + 1);
}

/// Without Redis, a limit that fails closed refuses its own route, and no
/// other: a ban that cannot be looked up is no ban, and refusals decided
/// without the shared store strike nobody.
#[test]
fn without_redis_no_route_is_banned() {
    let upstream = Upstream::start();
    let mut redis = RedisServer::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .redis(&redis.url())
        .redis_lines("timeout = \"100ms\"")
        .limit(login().line("on_failure = \"deny\""))
        .start();
    assert_eq!(proxy.get("/").status, 200);
    redis.kill();
    for _ in 0..5 {
        let r = proxy.send("POST", "/login", &[]);
        assert_eq!(r.status, 429);
        assert!(r.body.contains("\"error\":\"rate_limited\""), "{}", r.body);
    }
    for path in ["/", "/api/orders"] {
        let r = proxy.get(path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    assert_eq!(proxy.metric(BANNED), 0.0);
}

/// A ban on a value the client sends could be aimed at whoever else sends
/// it (`floodgate check` refuses it unless the limit says
/// `ban_on_client_keys`); compared ignoring case, as the application
/// compares it, a value in another case is the same tenant, its budget
/// and its ban.
#[test]
fn a_ban_on_a_client_chosen_value_is_said_knowingly_and_holds_in_any_case() {
    let upstream = Upstream::start();
    let tenant = |extra: &str| {
        Limit::fixed_window("per-tenant", "header:X-Tenant", 2, "1h")
            .line("ban = { after = 2, within = \"10m\", duration = \"1h\" }")
            .line(extra)
    };
    let refused = ConfigBuilder::new(upstream.addr).limit(tenant("shadow = false"));
    let out = std::process::Command::new(common::binary())
        .args(["check", &refused.write().display().to_string()])
        .output()
        .expect("floodgate check");
    assert!(
        !out.status.success(),
        "a ban on header:X-Tenant was accepted"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ban_on_client_keys = true"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(tenant(
            "ban_on_client_keys = true\ncase_insensitive_values = true",
        ))
        .start();
    let as_tenant = |value: &str| proxy.send("GET", "/", &[("X-Tenant", value)]).status;
    assert_eq!([as_tenant("acme"), as_tenant("Acme")], [200, 200]);
    assert_eq!(as_tenant("ACME"), 429, "another case is the same tenant");
    assert_eq!(as_tenant("aCmE"), 429);
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("floodgate_bans_total{limit=\"per-tenant\"}")
        == 1.0));
    assert_eq!(as_tenant("AcMe"), 429, "the ban holds in any case");
    assert_eq!(as_tenant("globex"), 200, "another tenant is untouched");
}

/// A limit keyed per address and route bans the address, not the route:
/// refused three times on one route, it is refused on the limit's other
/// route and off them all.
#[test]
fn a_ban_struck_on_one_route_of_a_route_keyed_limit_holds_on_every_route() {
    let upstream = Upstream::start();
    let clock = TestClock::new();
    clock.set_now_us(MINUTE_START_US);
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .clock(&clock)
        .limit(
            Limit::fixed_window("login", "[\"ip\", \"route\"]", 2, "1h")
                .matching("paths = [\"/login\", \"/signup\"]")
                .line("ban = { after = 3, within = \"10m\", duration = \"1h\" }"),
        )
        .start();
    hammer_until_banned(&[&proxy]);
    assert_banned_on(&proxy, &upstream, &["/signup", "/", "/login"]);
}
