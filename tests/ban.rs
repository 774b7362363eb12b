//! The penalty box (`ban`): a key refused `after` times within `within` is
//! refused on every route for `duration`, on one proxy or on all that share
//! a Redis; each ban is counted and logged once.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{
    at_once, raw_request, request, wait_until, ConfigBuilder, Limit, Proxy, Response, TestClock,
    Upstream,
};

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
    // the script too; and a deadline that the other tests' bursts on two
    // shared cores cannot make it miss (a decision without Redis would
    // admit a refusal).
    let config = ConfigBuilder::new(upstream.addr)
        .admin()
        .redis(&redis.url())
        .redis_lines("clock = \"local\"\ntimeout = \"2s\"")
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

/// What a burst's answers came to under the limit named `limit`: admitted,
/// refused by its rate, refused by its ban. Any other answer fails the test.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    admitted: usize,
    rate_limited: usize,
    banned: usize,
}

impl Tally {
    fn of<'a>(answers: impl IntoIterator<Item = &'a Response>, limit: &str) -> Tally {
        let banned = format!("{{\"error\":\"banned\",\"limit\":\"{limit}\",");
        let rate_limited = format!("{{\"error\":\"rate_limited\",\"limit\":\"{limit}\",");
        let mut tally = Tally::default();
        for r in answers {
            match r.status {
                200 => tally.admitted += 1,
                429 if r.body.starts_with(&banned) => {
                    // A ban's answer says how long it lasts: the whole hour.
                    let retry = r.retry_after_ms().expect("a retry time");
                    assert!(retry > 3_500_000, "{retry} ms: {}", r.body);
                    tally.banned += 1;
                }
                429 if r.body.starts_with(&rate_limited) => tally.rate_limited += 1,
                _ => panic!("{} {}", r.status, r.body),
            }
        }
        tally
    }

    fn refused(&self) -> usize {
        self.rate_limited + self.banned
    }
}

fn decisions(limit: &str, outcome: &str) -> String {
    format!("floodgate_decisions_total{{limit=\"{limit}\",outcome=\"{outcome}\"}}")
}

/// Waits until `proxy`'s metrics hold `tally`'s refusals by `limit` (each
/// refusal's strike, and the ban it completes, are in the store by then),
/// then checks that they hold exactly those: each refused request counted
/// once, as the answer it got.
fn assert_counted_once(proxy: &Proxy, limit: &str, tally: Tally) {
    let (refused, banned) = (decisions(limit, "refused"), decisions(limit, "banned"));
    let counted = || proxy.metric(&refused) + proxy.metric(&banned);
    assert!(
        wait_until(Duration::from_secs(10), || counted()
            >= tally.refused() as f64),
        "{} of {tally:?} counted",
        counted()
    );
    assert_eq!(
        (proxy.metric(&refused), proxy.metric(&banned)),
        (tally.rate_limited as f64, tally.banned as f64),
        "{tally:?}"
    );
}

/// Sixty refusals at once, every one of them a strike toward the same ban:
/// one ban, taken once, counted and logged once; each request counted once,
/// as refused or as banned, exactly as it was answered.
#[test]
fn sixty_refusals_at_once_ban_once_and_count_each_request_once() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(login())
        .start();
    let answers = at_once(60, |_| proxy.send("POST", "/login", &[]));
    let tally = Tally::of(&answers, "login");
    assert_eq!(tally.admitted, 2, "{tally:?}");
    assert_eq!(tally.refused(), 58, "{tally:?}");
    assert!(
        tally.rate_limited >= 3,
        "banned before three strikes: {tally:?}"
    );
    assert_eq!(upstream.count(), 2);
    assert_counted_once(&proxy, "login", tally);
    assert_eq!(
        proxy.metric(BANS),
        1.0,
        "55 strikes past the third, one ban"
    );
    assert_eq!(logged_bans(&proxy), 1, "{}", proxy.log());
    assert_banned_everywhere(&proxy, &upstream);
}

/// Two logins an hour per address and route, on /login and /signup; three
/// refusals within ten minutes ban the address on every route.
fn per_route_login() -> Limit {
    Limit::fixed_window("login", "[\"ip\", \"route\"]", 2, "1h")
        .matching("paths = [\"/login\", \"/signup\"]")
        .line("ban = { after = 3, within = \"10m\", duration = \"1h\" }")
}

/// Paths a banned client might try: the limit's own (as spelled, and
/// spelled otherwise), and routes it does not match.
const AROUND: [&str; 10] = [
    "/login",
    "/signup",
    "/",
    "/api/orders",
    "//login",
    "/signup/",
    "/%6Cogin?next=/",
    "/LOGIN",
    "/x/../signup",
    "/login/../api",
];

const METHODS: [&str; 4] = ["GET", "POST", "PUT", "DELETE"];

/// Sixty at once from a client banned by a route-keyed limit, spread over
/// the limit's paths, other spellings of them, other routes and methods:
/// every one refused as banned, each counted once, none reaching the
/// upstream.
#[test]
fn sixty_at_once_around_a_route_keyed_ban_are_all_refused() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(per_route_login())
        .start();
    // Struck on both routes at once: two admitted on each (or fewer on one
    // where a ban struck on the other came first), the rest refused.
    let answers = at_once(60, |i| {
        proxy.send("POST", ["/login", "/signup"][i % 2], &[])
    });
    let struck = Tally::of(&answers, "login");
    assert!((2..=4).contains(&struck.admitted), "{struck:?}");
    assert_eq!(upstream.count(), struck.admitted);
    assert_counted_once(&proxy, "login", struck);
    // One ban as the config says, however the refusals were spread over
    // the routes (its strikes are kept on the key without the route),
    // counted and logged once.
    let bans = proxy.metric(BANS);
    assert_eq!(bans, 1.0);
    assert_eq!(logged_bans(&proxy), 1, "{}", proxy.log());
    // The attempts around the ban.
    let answers = at_once(60, |i| {
        proxy.send(METHODS[i % METHODS.len()], AROUND[i % AROUND.len()], &[])
    });
    let around = Tally::of(&answers, "login");
    assert_eq!(around.banned, 60, "{around:?}");
    let nothing_more = "nothing more reached the app";
    assert_eq!(upstream.count(), struck.admitted, "{nothing_more}");
    let total = Tally {
        banned: struck.banned + 60,
        ..struck
    };
    assert_counted_once(&proxy, "login", total);
    assert_eq!(
        proxy.metric(BANS),
        bans,
        "no ban struck by a banned request"
    );
}

/// `ban = { after = 3 }` on a limit keyed `["ip", "route"]`: its third
/// refusal of a client bans it, whichever of the limit's routes they were
/// on, as after three on one route (strikes taken per route banned only
/// after (after - 1) x routes + 1 of them, here the fifth).
#[test]
fn a_route_keyed_limits_refusals_on_its_routes_ban_after_as_many_as_it_says() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(per_route_login())
        .start();
    for path in ["/login", "/signup", "/login", "/signup"] {
        assert_eq!(proxy.send("POST", path, &[]).status, 200, "{path}");
    }
    for (n, path) in ["/login", "/signup", "/login"].into_iter().enumerate() {
        let r = proxy.send("POST", path, &[]);
        assert_eq!(Tally::of([&r], "login").rate_limited, 1, "{path}");
        let refused = decisions("login", "refused");
        assert!(wait_until(Duration::from_secs(5), || proxy
            .metric(&refused)
            == (n + 1) as f64));
    }
    let r = proxy.send("POST", "/signup", &[]);
    assert_eq!(
        Tally::of([&r], "login").banned,
        1,
        "three refusals by the limit: {}",
        r.body
    );
    assert_eq!(proxy.metric(BANS), 1.0);
}

/// At most two chat requests an hour per API key for the gpt-4 models (a
/// match on the body, a body that goes unread counted by the address);
/// three refusals within ten minutes ban the key, or the address.
fn gpt4(upstream: &Upstream) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .server("max_body = 65536")
        .raw("[clients.api_keys]\n\"k-one\" = \"pro\"\n\"k-two\" = \"pro\"")
        .limit(
            Limit::fixed_window("gpt-4", "api_key", 2, "1h")
                .matching("paths = [\"/v1/*\"], body = { model = [\"gpt-4*\"] }")
                .line("on_missing = \"ip\"")
                .line("ban = { after = 3, within = \"10m\", duration = \"1h\" }"),
        )
}

fn chat(model: &str, filler: usize) -> Vec<u8> {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a".repeat(filler)
    )
    .into_bytes()
}

/// A chat request with `key` (none when empty), its body as the `i`th of
/// five ways to send it: read (of the model limited, or of another), padded
/// past max_body, chunked, or no JSON.
fn chat_request(addr: SocketAddr, key: &str, i: usize) -> Response {
    let mut headers = vec![("Content-Type", "application/json")];
    if !key.is_empty() {
        headers.push(("X-API-Key", key));
    }
    let post = |body: &[u8]| request(addr, "POST", "/v1/chat/completions", &headers, body);
    match i % 5 {
        0 => post(&chat("gpt-4o", 10)),
        1 => post(&chat("claude-3-5-haiku", 10)),
        2 => post(&chat("gpt-4o", 70_000)),
        3 => {
            let body = chat("gpt-4o", 10);
            let mut raw = "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n\
                           Connection: close\r\nTransfer-Encoding: chunked\r\n"
                .to_string();
            for (name, value) in &headers {
                raw.push_str(&format!("{name}: {value}\r\n"));
            }
            let mut raw = format!("{raw}\r\n{:x}\r\n", body.len()).into_bytes();
            raw.extend(&body);
            raw.extend(b"\r\n0\r\n\r\n");
            raw_request(addr, &raw)
        }
        _ => post(b"model=gpt-4o"),
    }
}

/// A key and an address banned at once, sixty at once: the key where its
/// bodies were read, the address where bodies went unread (counted by it).
/// Then sixty at once with the key or without, their bodies read or padded,
/// chunked or no JSON, on the limit's route and off it: all refused, none
/// sent, each counted once though a request with the key and a body unread
/// is looked up (and banned) both by the key and by the address.
#[test]
fn sixty_at_once_with_unreadable_bodies_are_no_way_around_a_keys_or_an_addresss_ban() {
    let upstream = Upstream::start();
    let proxy = gpt4(&upstream).start();
    let answers = at_once(60, |i| match i % 2 {
        0 => chat_request(proxy.addr, "k-one", 0),
        _ => chat_request(proxy.addr, "", 2 + i % 3),
    });
    let struck = Tally::of(&answers, "gpt-4");
    assert_eq!((struck.admitted, struck.refused()), (4, 56), "{struck:?}");
    assert_eq!(upstream.count(), 4);
    assert_counted_once(&proxy, "gpt-4", struck);
    let bans = "floodgate_bans_total{limit=\"gpt-4\"}";
    assert_eq!(proxy.metric(bans), 2.0, "the key's and the address's");
    let answers = at_once(60, |i| match (i % 3, i / 3) {
        (0, j) => chat_request(proxy.addr, "k-one", j),
        (1, j) => chat_request(proxy.addr, "", j),
        (_, j) => proxy.send(
            METHODS[j % METHODS.len()],
            AROUND[j % AROUND.len()],
            if j % 2 == 0 {
                &[("X-API-Key", "k-one")]
            } else {
                &[]
            },
        ),
    });
    let around = Tally::of(&answers, "gpt-4");
    assert_eq!(around.banned, 60, "{around:?}");
    assert_eq!(upstream.count(), 4, "nothing more reached the app");
    let total = Tally {
        banned: struck.banned + 60,
        ..struck
    };
    assert_counted_once(&proxy, "gpt-4", total);
    assert_eq!(proxy.metric(bans), 2.0);
    // The bans are the key's and the address's: another key, its body
    // read, is served from the same address.
    assert_eq!(chat_request(proxy.addr, "k-two", 0).status, 200);
}

/// Sixty refusals at once through two proxies sharing a Redis: one ban
/// between them, logged once; then sixty at once through both, on every
/// route, all refused.
#[test]
fn sixty_at_once_through_two_proxies_ban_once_and_are_all_refused() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let config = ConfigBuilder::new(upstream.addr)
        .admin()
        .redis(&redis.url())
        // A deadline that a burst on two shared cores cannot miss: every
        // decision is Redis's, as the test says.
        .redis_lines("clock = \"local\"\ntimeout = \"2s\"\ninstances = 2")
        .limit(login());
    let (a, b) = (config.start(), config.start());
    let proxies = [&a, &b];
    let answers = at_once(60, |i| proxies[i % 2].send("POST", "/login", &[]));
    let all = Tally::of(&answers, "login");
    assert_eq!((all.admitted, all.refused()), (2, 58), "{all:?}");
    for (n, proxy) in proxies.iter().enumerate() {
        let own = Tally::of(answers.iter().skip(n).step_by(2), "login");
        assert_counted_once(proxy, "login", own);
    }
    assert_eq!(bans(&proxies), 1.0, "one ban between them");
    assert_eq!(logged_bans(&a) + logged_bans(&b), 1);
    let answers = at_once(60, |i| {
        proxies[i % 2].send(METHODS[i % METHODS.len()], AROUND[i % AROUND.len()], &[])
    });
    assert_eq!(Tally::of(&answers, "login").banned, 60);
    assert_eq!(upstream.count(), 2, "nothing more reached the app");
    for proxy in proxies {
        assert_eq!(proxy.metric("floodgate_fallback_decisions_total"), 0.0);
    }
}
