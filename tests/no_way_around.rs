//! No way around a limit: each test is an attack that walked around a
//! configured limit before, run against the real binary in front of a real
//! upstream (and a real Redis where instances share state).

mod common;

use std::net::SocketAddr;

use common::redis_server::RedisServer;
use common::*;

/// Two POSTs to /login a minute per address.
fn login() -> Limit {
    Limit::sliding_log("login", "ip", 2, "1m").matching(r#"methods = ["POST"], paths = ["/login"]"#)
}

fn post(addr: SocketAddr, path: &str) -> Response {
    request(addr, "POST", path, &[], b"")
}

fn upstream_paths(upstream: &Upstream) -> Vec<String> {
    upstream.seen().into_iter().map(|s| s.path).collect()
}

#[test]
fn every_spelling_of_a_limited_path_is_that_path() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr).limit(login()).start();
    for _ in 0..2 {
        assert_eq!(post(proxy.addr, "/login").status, 200);
    }
    assert_eq!(post(proxy.addr, "/login").status, 429);
    for spelling in [
        "//login",
        "/%6Cogin",
        "/%6c%6f%67%69%6e",
        "/./login",
        "/x/../login",
        "/login/",
        "///x/./..//login//",
        "/%2e/login",
        "/login?next=/home",
        "http://test/login",
        "http://test//x/../%6cogin/",
    ] {
        let r = post(proxy.addr, spelling);
        assert_eq!(r.status, 429, "{spelling}: {}", r.body);
    }
    // Werkzeug routes a lower-case method as the upper-case one.
    for method in ["post", "Post"] {
        let r = request(proxy.addr, method, "/login", &[], b"");
        assert_eq!(r.status, 429, "{method}");
    }
    for (spelling, error) in [
        ("/%2e%2e/login", "bad_path"),
        ("/x/../../login", "bad_path"),
        ("/x/..%2Flogin", "escaped_slash"),
        ("/x%2f..%2f..%2flogin", "escaped_slash"),
        ("/x\\..\\login", "escaped_slash"),
        ("/x/..%5Clogin", "escaped_slash"),
        ("/log%6", "bad_path"),
        ("/log%zzin", "bad_path"),
        // Tomcat and Spring strip `;` parameters before resolving dots.
        ("/x/..;/login", "bad_path"),
        ("/;/login", "bad_path"),
        ("/;x=1/login", "bad_path"),
        // Not a path, not absolute-form: never forwarded as `/`.
        ("login", "bad_path"),
        ("mailto:a@b", "bad_path"),
        ("*", "bad_path"),
    ] {
        let r = post(proxy.addr, spelling);
        assert_eq!(r.status, 400, "{spelling}: {}", r.body);
        assert!(
            r.body.starts_with(&format!("{{\"error\":\"{error}\"")),
            "{spelling}: {}",
            r.body
        );
    }
    assert_eq!(upstream_paths(&upstream), ["/login", "/login"]);

    // What reaches the upstream is the normalised path, the query untouched.
    upstream.reset();
    for (sent, received) in [
        ("/a//b/./c/../d?q=%2f&x=..", "/a/b/d?q=%2f&x=.."),
        ("/%7Euser/caf%c3%a9/%41", "/~user/caf%C3%A9/A"),
        ("/x/..", "/"),
        ("http://test/abs/./path?y=1", "/abs/path?y=1"),
    ] {
        assert_eq!(proxy.get(sent).status, 200, "{sent}");
        assert_eq!(
            upstream.seen().last().map(|s| s.path.clone()).as_deref(),
            Some(received),
            "{sent}"
        );
    }
}

#[test]
fn matching_follows_the_routers_rules() {
    let upstream = Upstream::start();
    // Case-sensitive by default: /LOGIN is another path, and goes upstream as is.
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::fixed_window("items", "ip", 1, "1m")
                .matching(r#"methods = ["GET"], paths = ["/items/"]"#),
        )
        .start();
    assert_eq!(proxy.get("/items").status, 200);
    // HEAD runs the GET handler in common routers; the trailing slash is the same route.
    assert_eq!(proxy.send("HEAD", "/items", &[]).status, 429);
    assert_eq!(proxy.get("/items/").status, 429);
    assert_eq!(proxy.get("/ITEMS").status, 200);
    drop(proxy);

    let proxy = ConfigBuilder::new(upstream.addr)
        .server("case_insensitive_paths = true\nescaped_slashes = \"decode\"")
        .limit(login())
        .start();
    upstream.reset();
    assert_eq!(post(proxy.addr, "/Login").status, 200);
    assert_eq!(post(proxy.addr, "/LOGIN").status, 200);
    assert_eq!(post(proxy.addr, "/login").status, 429);
    assert_eq!(post(proxy.addr, "/public/..%2Flogin").status, 429);
    assert_eq!(post(proxy.addr, "/public\\..\\LOGIN").status, 429);
    // The upstream gets the case it was sent.
    assert_eq!(upstream_paths(&upstream), ["/Login", "/LOGIN"]);
}

#[test]
fn patterns_are_normalised_like_paths() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::fixed_window("home", "ip", 1, "1m")
                .matching(r#"paths = ["/%7euser/./caf%c3%a9//*"]"#),
        )
        .start();
    assert_eq!(proxy.get("/~user/caf%C3%A9/x").status, 200);
    assert_eq!(proxy.get("/%7Euser/caf\u{e9}/y").status, 429);
    assert_eq!(proxy.get("/~user//caf%c3%a9/./z").status, 429);
}

#[test]
fn escaped_slashes_can_be_kept() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .server("escaped_slashes = \"keep\"")
        .limit(login())
        .start();
    assert_eq!(proxy.get("/files/a%2fb/..%5c").status, 200);
    assert_eq!(upstream_paths(&upstream), ["/files/a%2Fb/..%5C"]);
}

#[test]
fn a_flood_of_made_up_identities_never_frees_an_exhausted_client() {
    let upstream = Upstream::start();
    let max_keys = 256;
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&format!("[memory]\nmax_keys = {max_keys}"))
        .limit(
            Limit::sliding_log("login", "ip", 5, "1m")
                .matching(r#"methods = ["POST"], paths = ["/login"]"#),
        )
        .limit(Limit::token_bucket(
            "per-tenant",
            "header:X-Tenant",
            50,
            0.01,
        ))
        .start();
    for _ in 0..5 {
        assert_eq!(post(proxy.addr, "/login").status, 200);
    }
    assert_eq!(post(proxy.addr, "/login").status, 429);

    let flood = 20_000;
    let threads = 4;
    let addr = proxy.addr;
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let requests = (0..flood / threads)
                        .map(|i| vec![("X-Tenant".to_string(), format!("tenant-{t}-{i}"))])
                        .collect();
                    keepalive_gets(addr, "/tenant-data", requests)
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    assert_eq!(statuses.len(), flood);
    assert!(statuses.iter().all(|&s| s == 200 || s == 429), "no errors");
    let admitted = count_status(&statuses, 200);

    let victim = post(proxy.addr, "/login");
    assert_eq!(victim.status, 429, "the exhausted client is still refused");
    let keys = proxy.metric("floodgate_local_keys");
    assert!(keys <= max_keys as f64, "held {keys} keys");
    let overflowed = proxy.metric("floodgate_local_overflow_decisions_total");
    assert!(overflowed >= (flood - max_keys) as f64, "{overflowed}");
    // The flood competed with itself: its own keys (one request each) and
    // the overflow bucket's capacity.
    assert!(admitted <= max_keys + 50 + 1, "admitted {admitted}");
    assert!(proxy.log().contains("memory store full of live state"));
    record(
        "flood_of_identities",
        &format!(
            "{flood} made-up tenants, max_keys {max_keys}: {admitted} admitted, {overflowed} overflow decisions, {keys} keys held, victim still 429\n"
        ),
    );
}

#[test]
fn instances_share_state_only_when_they_share_the_secret() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = ConfigBuilder::new(upstream.addr)
        .redis(&redis.url())
        .redis_lines("clock = \"local\"")
        .limit(Limit::fixed_window("per-ip", "ip", 3, "1m"));
    let secret = (
        "FLOODGATE_IDENTITY_SECRET",
        "0123456789abcdef0123456789abcdef",
    );
    let other = (
        "FLOODGATE_IDENTITY_SECRET",
        "fedcba9876543210fedcba9876543210",
    );
    let a = config.clone().env(secret.0, secret.1).start();
    let b = config.clone().env(secret.0, secret.1).start();
    let c = config.clone().env(other.0, other.1).start();
    for p in [&a, &b, &a] {
        assert_eq!(p.get("/").status, 200);
    }
    assert_eq!(b.get("/").status, 429, "a and b share one budget");
    assert_eq!(redis.keys().len(), 1);
    assert_eq!(c.get("/").status, 200, "c hashes the same client elsewhere");
    let keys = redis.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_ne!(keys[0], keys[1]);
    // Without a secret, a Redis store warns that its keys are computable.
    let d = config.start();
    assert!(d.log().contains("no identity secret"), "{}", d.log());
}

/// Behind a trusted proxy on 127.0.0.0/8 whose peers are internal (exempt);
/// `header_line` chooses the forwarding header (empty: the default).
fn trusted_proxy(upstream: &Upstream, header_line: &str) -> Proxy {
    ConfigBuilder::new(upstream.addr)
        .raw(&format!(
            "[clients]\ntrusted_proxies = [\"127.0.0.0/8\"]\ninternal = [\"127.0.0.0/8\"]\n{header_line}\n\n[exempt]\ntiers = [\"internal\"]"
        ))
        .limit(Limit::fixed_window("per-ip", "ip", 2, "1m"))
        .start()
}

fn with_headers(addr: SocketAddr, headers: &[&[u8]]) -> Response {
    let mut raw = b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n".to_vec();
    for h in headers {
        raw.extend_from_slice(h);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    raw_request(addr, &raw)
}

fn statuses(addr: SocketAddr, n: usize, headers: &[&[u8]]) -> Vec<u16> {
    (0..n).map(|_| with_headers(addr, headers).status).collect()
}

#[test]
fn a_trusted_proxys_chain_is_read_entry_by_entry() {
    let upstream = Upstream::start();
    let proxy = trusted_proxy(&upstream, "");
    // Before: one odd byte made the whole line unreadable and the proxy (an
    // internal, exempt peer) the client.
    assert_eq!(
        statuses(proxy.addr, 3, &[b"X-Forwarded-For: \x80x, 198.51.100.11"]),
        [200, 200, 429]
    );
    assert_eq!(
        statuses(proxy.addr, 3, &[b"X-Forwarded-For: , 198.51.100.12,, "]),
        [200, 200, 429]
    );
    // Two lines are one list: the client is the rightmost untrusted entry.
    assert_eq!(
        statuses(
            proxy.addr,
            3,
            &[
                b"X-Forwarded-For: 6.6.6.6",
                b"X-Forwarded-For: 198.51.100.13, 127.0.0.9"
            ]
        ),
        [200, 200, 429]
    );
    // An entry the walk reaches that is not an address: 400, never the proxy.
    for value in [
        &b"X-Forwarded-For: 198.51.100.14, bogus"[..],
        b"X-Forwarded-For: 198.51.100.14, \xff\xfe",
    ] {
        let r = with_headers(proxy.addr, &[value]);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(value));
        assert!(r.body.contains("bad_forwarded_header"), "{}", r.body);
    }
    // Forwarded is not read when X-Forwarded-For is the configured header.
    assert_eq!(
        statuses(proxy.addr, 2, &[b"Forwarded: for=198.51.100.15"]),
        [200, 200],
        "the peer itself: internal, exempt"
    );
    assert_eq!(upstream.count(), 2 + 2 + 2 + 2);
}

#[test]
fn behind_a_forwarded_proxy_a_clients_own_x_forwarded_for_is_ignored() {
    let upstream = Upstream::start();
    let proxy = trusted_proxy(&upstream, "forwarded_header = \"forwarded\"");
    let got: Vec<u16> = (0..3)
        .map(|i| {
            let spoof = format!("X-Forwarded-For: 203.0.113.{i}");
            with_headers(
                proxy.addr,
                &[
                    spoof.as_bytes(),
                    b"Forwarded: for=198.51.100.20;proto=https",
                ],
            )
            .status
        })
        .collect();
    assert_eq!(got, [200, 200, 429], "one client, one bucket");
    assert_eq!(
        statuses(
            proxy.addr,
            3,
            &[b"Forwarded: for=\"[2001:db8::1]:4711\", for=127.0.0.5"]
        ),
        [200, 200, 429]
    );
    let r = with_headers(proxy.addr, &[b"Forwarded: for=unknown"]);
    assert_eq!(r.status, 400);
    // A quote the client leaves open must not swallow the element the
    // trusted proxy appended to the same line (nginx's
    // "$http_forwarded, for=$remote_addr"): refused, never the client's pick.
    for _ in 0..3 {
        let r = with_headers(
            proxy.addr,
            &[b"Forwarded: for=10.0.0.1;x=\", for=198.51.100.21"],
        );
        assert_eq!(r.status, 400, "{}", r.body);
    }
    let r = with_headers(proxy.addr, &[b"Forwarded: for=10.0.0.1;for=198.51.100.22"]);
    assert_eq!(r.status, 400, "two for= in one element");
}

#[test]
fn one_api_key_per_request() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .raw("[clients.api_keys]\n\"k1\" = \"free\"")
        .limit(Limit::fixed_window("per-account", "api_key", 1, "1m"))
        .limit(Limit::fixed_window(
            "per-tenant",
            "header:X-Tenant",
            100,
            "1m",
        ))
        .start();
    assert_eq!(with_headers(proxy.addr, &[b"X-API-Key: k1"]).status, 200);
    assert_eq!(with_headers(proxy.addr, &[b"X-API-Key: k1"]).status, 429);
    // Before: the first value decided (an unknown key: no account limit) and
    // both went upstream.
    let r = with_headers(proxy.addr, &[b"X-API-Key: junk", b"X-API-Key: k1"]);
    assert_eq!(r.status, 400);
    assert!(
        r.body.starts_with("{\"error\":\"ambiguous_api_key\""),
        "{}",
        r.body
    );
    let r = with_headers(proxy.addr, &[b"X-Tenant: a", b"X-Tenant: b"]);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("ambiguous_key_header"), "{}", r.body);
    assert_eq!(upstream.count(), 1);
}
