//! The admin API end to end, on the real binary: a refused client is seen
//! with its retry time, reset (on every instance sharing Redis), credited
//! exactly; no token, a wrong one, or a page's cookie changes nothing.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::admin_token::{TokenFile, TOKEN};
use common::redis_server::{RedisCluster, RedisServer};
use common::{request, wait_until, ConfigBuilder, Limit, Proxy, Response, Upstream};
use serde_json::Value;

/// Three requests, then one every 100 s, per address; two logins an hour,
/// and three refusals in ten minutes ban the address for an hour; a
/// sliding window (which takes no credit).
fn builder(upstream: &Upstream, token: &TokenFile) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(Limit::token_bucket("per-ip", "ip", 3, 0.01))
        .limit(
            Limit::fixed_window("login", "ip", 2, "1h")
                .matching("paths = [\"/login\"]")
                .line("ban = { after = 3, within = \"10m\", duration = \"1h\" }"),
        )
        .limit(Limit::sliding_window("search", "ip", 50, "1m").matching("paths = [\"/search\"]"))
        .raw(&token.section())
}

fn call(admin: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &str) -> Response {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &str)> = Vec::new();
    if let Some(b) = &bearer {
        headers.push(("Authorization", b));
    }
    if !body.is_empty() {
        headers.push(("Content-Type", "application/json"));
    }
    request(admin, method, path, &headers, body.as_bytes())
}

/// A call without a body, with the token.
fn with_token(admin: SocketAddr, method: &str, path: &str) -> Response {
    call(admin, method, path, Some(TOKEN), "")
}

/// `POST /v1/clients/credit` with the token.
fn credit(admin: SocketAddr, body: &str) -> Response {
    call(admin, "POST", "/v1/clients/credit", Some(TOKEN), body)
}

fn json(response: &Response) -> Value {
    serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", response.status, response.body))
}

/// The entry of limit `name` in a `/v1/clients` answer.
fn entry<'a>(answer: &'a Value, name: &str) -> &'a Value {
    answer["limits"]
        .as_array()
        .and_then(|limits| limits.iter().find(|l| l["limit"] == name))
        .unwrap_or_else(|| panic!("no {name} in {answer}"))
}

fn admin(proxy: &Proxy) -> SocketAddr {
    proxy.admin.expect("admin listener")
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario against real processes, read in the order it happens"
)]
fn a_refused_client_is_seen_reset_and_credited_and_nobody_else_can() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = builder(&upstream, &token).start();
    let at = admin(&proxy);
    for _ in 0..3 {
        assert_eq!(proxy.get("/").status, 200);
    }
    assert_eq!(proxy.get("/").status, 429);

    // Seen, with its retry time (one token per 100 s).
    let seen = with_token(at, "GET", "/v1/clients?ip=127.0.0.1");
    assert_eq!(seen.status, 200, "{}", seen.body);
    let seen = json(&seen);
    assert_eq!(seen["store"], "memory");
    assert_eq!(seen["tier"], "anonymous");
    let per_ip = entry(&seen, "per-ip");
    assert_eq!(per_ip["remaining"], 0);
    assert_eq!(per_ip["allowed"], false);
    let retry = per_ip["retry_after_s"].as_f64().expect("retry time");
    assert!(retry > 90.0 && retry <= 100.0, "{per_ip}");
    assert_eq!(entry(&seen, "login")["ban"]["banned"], false);

    // The status page's login: a cookie that is not the token, good for
    // reading; a wrong token gets the form again.
    let form = |token: &str| {
        let body = format!("token={token}");
        request(
            at,
            "POST",
            "/login",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            body.as_bytes(),
        )
    };
    assert_eq!(form("nope-nope-nope-nope").status, 401);
    let login = form(TOKEN);
    assert_eq!(login.status, 303, "{}", login.body);
    let cookie = login
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_string();
    assert!(
        cookie.starts_with("floodgate_admin=") && !cookie.contains(TOKEN),
        "{cookie}"
    );
    let read = request(at, "GET", "/v1/limits", &[("Cookie", &cookie)], b"");
    assert_eq!(read.status, 200, "{}", read.body);
    let page = request(at, "GET", "/", &[("Cookie", &cookie)], b"");
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("/status.js"),
        "the status page: {}",
        page.body
    );
    let token_as_cookie = format!("floodgate_admin={TOKEN}");
    assert_eq!(
        request(
            at,
            "GET",
            "/v1/limits",
            &[("Cookie", &token_as_cookie)],
            b""
        )
        .status,
        401
    );

    // Without the token, with a wrong one, or with the page's cookie: 401
    // or 403, and the client stays refused.
    let wrong = "test-admin-token-0123456780";
    for (token, cookie, status) in [
        (None, None, 401),
        (Some(wrong), None, 401),
        (None, Some(token_as_cookie.clone()), 401),
        (None, Some(cookie.clone()), 403),
    ] {
        let mut headers = Vec::new();
        let bearer = token.map(|t| format!("Bearer {t}"));
        if let Some(b) = &bearer {
            headers.push(("Authorization", b.as_str()));
        }
        if let Some(c) = &cookie {
            headers.push(("Cookie", c.as_str()));
        }
        let r = request(at, "DELETE", "/v1/clients?ip=127.0.0.1", &headers, b"");
        assert_eq!(r.status, status, "{token:?} {cookie:?}: {}", r.body);
        assert!(json(&r)["reason"].is_string(), "{}", r.body);
        let r = request(
            at,
            "POST",
            "/v1/clients/credit",
            &headers,
            br#"{"ip": "127.0.0.1", "limit": "per-ip", "units": 3}"#,
        );
        assert_eq!(r.status, status, "{}", r.body);
    }
    assert_eq!(call(at, "GET", "/v1/limits", None, "").status, 401);
    assert_eq!(proxy.get("/").status, 429, "unchanged by refused calls");

    // A made-up limit: 404, nothing reset.
    let r = with_token(at, "DELETE", "/v1/clients?ip=127.0.0.1&limit=nope");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(json(&r)["error"], "unknown_limit");
    let r = with_token(at, "GET", "/v1/clients?ip=127.0.0.1&limit=nope");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(proxy.get("/").status, 429);

    // A credit adds exactly its units.
    let r = credit(at, r#"{"ip": "127.0.0.1", "limit": "per-ip", "units": 2}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    let credited = json(&r);
    assert_eq!(credited["remaining_before"], 0);
    assert_eq!(credited["remaining"], 2);
    assert_eq!(proxy.get("/").status, 200);
    assert_eq!(proxy.get("/").status, 200);
    assert_eq!(proxy.get("/").status, 429);

    // What cannot be credited says why.
    let r = credit(at, r#"{"ip": "127.0.0.1", "limit": "search", "units": 1}"#);
    assert_eq!(r.status, 409, "{}", r.body);
    for body in [
        r#"{"ip": "127.0.0.1", "limit": "per-ip", "units": 0}"#,
        r#"{"ip": "127.0.0.1", "limit": "per-ip", "units": 4}"#,
        r#"{"ip": "127.0.0.1", "units": 1}"#,
        r#"{"limit": "per-ip", "units": 1}"#,
        r#"{"ip": "not an address", "limit": "per-ip", "units": 1}"#,
        "not json",
    ] {
        let r = credit(at, body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(json(&r)["reason"].is_string());
    }
    assert_eq!(proxy.get("/").status, 429);

    // Reset: admitted at once, and logged with what changed.
    let r = with_token(at, "DELETE", "/v1/clients?ip=127.0.0.1&limit=per-ip");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["reset"], serde_json::json!(["per-ip"]));
    assert_eq!(proxy.get("/").status, 200);
    let seen = json(&with_token(
        at,
        "GET",
        "/v1/clients?ip=127.0.0.1&limit=per-ip",
    ));
    assert_eq!(entry(&seen, "per-ip")["remaining"], 2);
    assert!(
        proxy
            .log()
            .contains("admin: reset ip=127.0.0.1 (anonymous) under [\"per-ip\"] on \"memory\""),
        "{}",
        proxy.log()
    );
    assert!(proxy
        .log()
        .contains("admin: credited ip=127.0.0.1 (anonymous) 2 units under \"per-ip\""));

    // The running limits, with their numbers.
    let limits = json(&with_token(at, "GET", "/v1/limits"));
    let names: Vec<&str> = limits["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(names, ["per-ip", "login", "search"]);
    assert_eq!(limits["limits"][0]["quota"], 3);
}

#[test]
fn a_ban_is_seen_and_lifted() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = builder(&upstream, &token).start();
    let at = admin(&proxy);
    let login = |proxy: &Proxy| proxy.send("POST", "/login", &[]).status;
    assert_eq!([login(&proxy), login(&proxy)], [200, 200]);
    for _ in 0..3 {
        assert_eq!(login(&proxy), 429);
    }
    assert!(wait_until(Duration::from_secs(5), || {
        proxy.metric("floodgate_bans_total{limit=\"login\"}") == 1.0
    }));
    assert_eq!(proxy.get("/anything").status, 429, "banned on every route");
    let seen = json(&with_token(
        at,
        "GET",
        "/v1/clients?ip=127.0.0.1&limit=login",
    ));
    let ban = &entry(&seen, "login")["ban"];
    assert_eq!(ban["banned"], true, "{seen}");
    let left = ban["retry_after_s"].as_f64().expect("ban time");
    assert!(left > 3500.0 && left <= 3600.0, "{ban}");

    let r = with_token(at, "DELETE", "/v1/clients?ip=127.0.0.1&limit=login");
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = json(&with_token(
        at,
        "GET",
        "/v1/clients?ip=127.0.0.1&limit=login",
    ));
    assert_eq!(entry(&seen, "login")["ban"]["banned"], false, "{seen}");
    assert_eq!(entry(&seen, "login")["remaining"], 2, "{seen}");
    assert_eq!(login(&proxy), 200);
}

#[test]
fn without_a_token_the_api_is_off_and_says_so_while_the_probes_stay_open() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(Limit::token_bucket("per-ip", "ip", 3, 0.01))
        .start();
    let at = admin(&proxy);
    let r = with_token(at, "GET", "/v1/clients?ip=127.0.0.1");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(json(&r)["error"], "admin_api_off");
    assert_eq!(proxy.admin_get("/metrics").status, 200);
    assert_eq!(proxy.admin_get("/healthz").status, 200);
    assert_eq!(proxy.admin_get("/readyz").status, 200);
    assert_eq!(proxy.admin_get("/").status, 404);
}

/// Subscribers to the changes channel on one node.
fn subscribers(node: &RedisServer) -> i64 {
    let reply: Vec<redis::Value> = node.cmd(&["PUBSUB", "NUMSUB", "floodgate:changes"]);
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        _ => 0,
    }
}

#[test]
fn a_reset_and_a_credit_reach_every_instance_sharing_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let shared = builder(&upstream, &token).redis(&redis.url());
    reset_and_credit_reach_both(shared, &[&redis]);
}

#[test]
fn a_reset_and_a_credit_reach_every_instance_sharing_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let shared = builder(&upstream, &token)
        .redis_cluster(&cluster.urls())
        .redis_lines("timeout = \"2s\"");
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    reset_and_credit_reach_both(shared, &nodes);
}

/// Two instances on `shared`'s store: a client refused on both (each
/// remembering the refusal) is admitted on both once reset through one,
/// and a credit through the other gives exactly its units to both.
fn reset_and_credit_reach_both(shared: ConfigBuilder, nodes: &[&RedisServer]) {
    let subscribed = || nodes.iter().map(|n| subscribers(n)).sum::<i64>();
    let script_runs = || nodes.iter().map(|n| n.calls("evalsha")).sum::<u64>();
    // Two instances, and the config says so: a lease is then never more
    // than a share of what is left.
    let shared = shared
        .env(
            "FLOODGATE_IDENTITY_SECRET",
            "a-secret-shared-by-both-instances",
        )
        .redis_lines("instances = 2");
    let a = shared.start();
    let b = shared.start();
    // Both listen for operators' changes before any is made.
    assert!(wait_until(Duration::from_secs(10), || subscribed() >= 2));
    for _ in 0..3 {
        assert_eq!(a.get("/").status, 200);
    }
    // Each instance now remembers the refusal for its retry time (100 s),
    // and refuses again without asking Redis.
    for proxy in [&a, &b] {
        assert_eq!(proxy.get("/").status, 429);
    }
    let runs = script_runs();
    for proxy in [&a, &b, &a, &b] {
        assert_eq!(proxy.get("/").status, 429);
    }
    assert_eq!(script_runs(), runs, "refusals remembered");
    let seen = json(&with_token(admin(&b), "GET", "/v1/clients?ip=127.0.0.1"));
    assert_eq!(seen["store"], "redis");
    assert_eq!(entry(&seen, "per-ip")["remaining"], 0);
    let retry = entry(&seen, "per-ip")["retry_after_s"]
        .as_f64()
        .expect("retry time");
    assert!(retry > 90.0 && retry <= 100.0, "{seen}");

    let r = with_token(admin(&a), "DELETE", "/v1/clients?ip=127.0.0.1");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["store"], "redis");
    // B hears of it within the time a message takes, not the 100 s its
    // remembered refusal had left.
    assert!(
        wait_until(Duration::from_secs(3), || b.get("/").status == 200),
        "B still refuses after the reset: {}",
        b.log()
    );
    assert_eq!([a.get("/").status, a.get("/").status], [200, 200]);
    assert_eq!(a.get("/").status, 429, "one budget of 3, shared");
    assert_eq!(b.get("/").status, 429);

    // A credit through B: exactly one more, on either instance.
    let r = credit(
        admin(&b),
        r#"{"ip": "127.0.0.1", "limit": "per-ip", "units": 1}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        wait_until(Duration::from_secs(3), || a.get("/").status == 200),
        "A still refuses after the credit"
    );
    assert_eq!(b.get("/").status, 429);
    assert_eq!(a.get("/").status, 429);
}

#[test]
fn what_cannot_be_answered_says_why() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw("[clients.api_keys]\n\"pro-key-0123\" = \"pro\"\n")
        .limit(
            Limit::token_bucket("per-tenant", "header:X-Tenant", 5, 1.0)
                .line("[limits.tiers.pro]\ncapacity = 50\nrefill_rate = 10"),
        )
        .raw(&token.section())
        .start();
    let at = admin(&proxy);
    let get = |path: &str| with_token(at, "GET", path);
    // The tier decides the numbers, and a header does not say it.
    let r = get("/v1/clients?header=X-Tenant:acme");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        json(&r)["reason"]
            .as_str()
            .is_some_and(|m| m.contains("tier=")),
        "{}",
        r.body
    );
    let r = get("/v1/clients?header=X-Tenant:%20acme&tier=pro");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(entry(&json(&r), "per-tenant")["quota"], 50);
    // Nothing is keyed on an address here.
    let r = get("/v1/clients?ip=192.0.2.1");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(json(&r)["error"], "no_limit_applies");
    for path in [
        "/v1/clients",
        "/v1/clients?ip=192.0.2.1&header=X-Tenant:acme",
        "/v1/clients?tier=nope&header=X-Tenant:acme",
        "/v1/clients?colour=blue",
    ] {
        let r = get(path);
        assert_eq!(r.status, 400, "{path}: {}", r.body);
    }
    let r = with_token(at, "PUT", "/v1/clients?ip=192.0.2.1");
    assert_eq!(r.status, 405, "{}", r.body);
    assert_eq!(r.header("allow"), Some("GET, DELETE"));
    let r = with_token(at, "GET", "/v1/clients/credit");
    assert_eq!(r.status, 405, "{}", r.body);
    assert_eq!(r.header("allow"), Some("POST"));
    let r = with_token(at, "GET", "/v1/client");
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(json(&r)["error"], "not_found");
    assert!(
        json(&r)["reason"]
            .as_str()
            .is_some_and(|m| m.contains("/v1/clients/credit") && m.contains("/v1/status")),
        "{}",
        r.body
    );
    let big = format!("{{\"ip\": \"{}\"}}", "1".repeat(20_000));
    let r = credit(at, &big);
    assert_eq!(r.status, 413, "{}", r.body);
    // Guessing tokens floods no log.
    for _ in 0..50 {
        assert_eq!(
            call(at, "GET", "/v1/limits", Some("guess-guess-guess-guess"), "").status,
            401
        );
    }
    let lines = proxy.log().matches("refused: no valid token").count();
    assert!((1..10).contains(&lines), "{lines} lines");
    // An API key is never logged in full.
    let r = get("/v1/clients?api_key=pro-key-0123");
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(
        proxy.log().contains("admin: GET /v1/clients key#"),
        "{}",
        proxy.log()
    );
    assert!(!proxy.log().contains("pro-key-0123"), "{}", proxy.log());
}

#[test]
fn the_status_shows_which_store_decides_and_since_when() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = builder(&upstream, &token).redis(&redis.url()).start();
    let at = admin(&proxy);
    let store = || json(&with_token(at, "GET", "/v1/status"))["store"].clone();
    let before = store();
    assert_eq!(before["deciding"], "redis", "{before}");
    assert_eq!(before["instances"]["count"], 1, "{before}");
    assert_eq!(before["instances"]["source"], "config", "{before}");
    assert_eq!(before["target"], redis.url().as_str(), "{before}");

    redis.kill();
    // The first request that finds Redis gone opens the breaker.
    assert!(
        wait_until(Duration::from_secs(10), || {
            proxy.get("/");
            store()["deciding"] == "fallback"
        }),
        "{}",
        proxy.log()
    );
    let away = store();
    assert!(away["since"].as_u64() >= before["since"].as_u64(), "{away}");
    // Asked while Redis is away, the client's state is on_failure's word.
    let seen = json(&with_token(at, "GET", "/v1/clients?ip=127.0.0.1"));
    assert_eq!(seen["store"], "fallback", "{seen}");
    let r = with_token(at, "DELETE", "/v1/clients?ip=127.0.0.1");
    assert_eq!(
        r.status, 503,
        "a reset Redis cannot take says so: {}",
        r.body
    );
    assert_eq!(json(&r)["error"], "store_unavailable");

    redis.restart();
    assert!(
        wait_until(Duration::from_secs(10), || store()["deciding"] == "redis"),
        "{}",
        proxy.log()
    );
}

/// The status page's cookie, which a browser sends to the proxy's port too,
/// never reaches the upstream: it reads the admin API for 12 hours.
#[test]
fn the_status_pages_cookie_stops_at_the_proxy() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = builder(&upstream, &token).start();
    let at = admin(&proxy);
    let login = request(
        at,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("token={TOKEN}").as_bytes(),
    );
    let session = login
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_string();
    let read = request(at, "GET", "/v1/limits", &[("Cookie", &session)], b"");
    assert_eq!(read.status, 200, "the cookie opens the API: {}", read.body);
    let alone = proxy.send("GET", "/", &[("Cookie", &session)]);
    assert_eq!(alone.status, 200);
    let mixed = format!("theme=dark; {session}; cart=42");
    assert_eq!(proxy.send("GET", "/", &[("Cookie", &mixed)]).status, 200);
    let seen = upstream.seen();
    let cookies: Vec<Vec<&str>> = seen
        .iter()
        .map(|s| {
            s.headers
                .iter()
                .filter(|(k, _)| k == "cookie")
                .map(|(_, v)| v.as_str())
                .collect()
        })
        .collect();
    assert_eq!(
        cookies,
        vec![Vec::<&str>::new(), vec!["theme=dark; cart=42"]],
        "what the upstream got"
    );
}
