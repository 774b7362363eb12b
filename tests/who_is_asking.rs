//! Who is asking, precisely: composite keys, cookies and query parameters,
//! a policy for requests without the key, host and header matching.

mod common;

use common::{ConfigBuilder, Limit, Proxy, Upstream};

fn get(proxy: &Proxy, path: &str, headers: &[(&str, &str)]) -> common::Response {
    proxy.send("GET", path, headers)
}

fn refused_by(r: &common::Response, limit: &str) -> bool {
    r.status == 429 && r.body.contains(&format!("\"limit\":\"{limit}\""))
}

/// `key = ["header:X-User", "route"]` on `/users/*` and `/orders`: one
/// budget per user per route pattern, not per raw path.
#[test]
fn a_composite_key_counts_per_user_per_route() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::fixed_window("per-user-route", "[\"header:X-User\", \"route\"]", 3, "1h")
                .matching("paths = [\"/users/*\", \"/orders\"]"),
        )
        .start();
    let ann = [("X-User", "ann")];
    // /users/1 and /users/2 share one budget of 3.
    for path in ["/users/1", "/users/2", "/users/3"] {
        assert_eq!(get(&proxy, path, &ann).status, 200, "{path}");
    }
    assert!(refused_by(&get(&proxy, "/users/4", &ann), "per-user-route"));
    // /orders has its own; another user has hers.
    assert_eq!(get(&proxy, "/orders", &ann).status, 200);
    assert_eq!(get(&proxy, "/users/1", &[("X-User", "bea")]).status, 200);
}

#[test]
fn cookies_and_query_parameters_key_limits_however_they_are_spelled() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::fixed_window("per-session", "cookie:session", 2, "1h")
                .matching("paths = [\"/cart\"]"),
        )
        .limit(
            Limit::fixed_window("per-user", "query:user", 2, "1h").matching("paths = [\"/feed\"]"),
        )
        .start();
    let with = |cookie: &str| get(&proxy, "/cart", &[("Cookie", cookie)]).status;
    assert_eq!(with("theme=dark; session=abc"), 200);
    assert_eq!(with("session=abc"), 200);
    assert_eq!(with("session=\"abc\"; lang=en"), 429, "quoted, one session");
    assert_eq!(with("session=%61bc"), 429, "escaped, one session");
    assert_eq!(with("session=xyz"), 200, "another session");
    // Two cookies of that name: the application may read either.
    let twice = get(&proxy, "/cart", &[("Cookie", "session=new; session=abc")]);
    assert_eq!(twice.status, 400);
    assert!(
        twice.body.contains("ambiguous_key_cookie"),
        "{}",
        twice.body
    );

    assert_eq!(get(&proxy, "/feed?user=ann+lee", &[]).status, 200);
    assert_eq!(get(&proxy, "/feed?page=2&user=ann%20lee", &[]).status, 200);
    assert_eq!(
        get(&proxy, "/feed?us%65r=ann+lee", &[]).status,
        429,
        "one user"
    );
    let twice = get(&proxy, "/feed?user=bob&user=ann+lee", &[]);
    assert_eq!(twice.status, 400);
    assert!(twice.body.contains("ambiguous_key_query"), "{}", twice.body);
}

/// Leaving the key out is no way around a limit that says what to do
/// without it.
#[test]
fn a_request_without_the_key_is_refused_or_counted_by_its_address() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::fixed_window("accounts", "header:X-Account", 2, "1h")
                .matching("paths = [\"/strict\"]")
                .line("on_missing = \"deny\""),
        )
        .limit(
            Limit::fixed_window("tenants", "header:X-Tenant", 2, "1h")
                .matching("paths = [\"/lenient\"]")
                .line("on_missing = \"ip\""),
        )
        .limit(
            Limit::fixed_window("skipped", "header:X-Team", 2, "1h")
                .matching("paths = [\"/open\"]"),
        )
        .start();
    let missing = get(&proxy, "/strict", &[]);
    assert_eq!(missing.status, 400);
    assert!(
        missing
            .body
            .starts_with("{\"error\":\"missing_key\",\"limit\":\"accounts\","),
        "{}",
        missing.body
    );
    assert_eq!(get(&proxy, "/strict", &[("X-Account", "a")]).status, 200);
    // Without the header: keyed on the address, so it runs out.
    for _ in 0..2 {
        assert_eq!(get(&proxy, "/lenient", &[]).status, 200);
    }
    assert!(refused_by(&get(&proxy, "/lenient", &[]), "tenants"));
    assert_eq!(get(&proxy, "/lenient", &[("X-Tenant", "t")]).status, 200);
    // The default, skip: the limit does not apply (`floodgate check` warns).
    for _ in 0..4 {
        assert_eq!(get(&proxy, "/open", &[]).status, 200);
    }
}

#[test]
fn limits_match_hosts_and_header_values() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::fixed_window("api-host", "ip", 1, "1h")
                .matching("hosts = [\"api.example.com\"]"),
        )
        .limit(
            Limit::fixed_window("tenant-hosts", "host", 1, "1h")
                .matching("hosts = [\"*.tenants.example.com\"]"),
        )
        .limit(
            Limit::fixed_window("mobile", "ip", 1, "1h")
                .matching("headers = { \"X-Client\" = \"mobile*\" }"),
        )
        .start();
    let host = |h: &str| get(&proxy, "/", &[("Host", h)]);
    assert_eq!(host("API.example.com:8080").status, 200);
    assert!(
        refused_by(&host("api.example.com"), "api-host"),
        "port and case aside"
    );
    assert_eq!(host("www.example.com").status, 200, "not that host");
    // One budget per tenant host; the bare domain is not a subdomain.
    assert_eq!(host("a.tenants.example.com").status, 200);
    assert!(refused_by(&host("a.tenants.example.com."), "tenant-hosts"));
    assert_eq!(host("b.tenants.example.com").status, 200);
    assert_eq!(host("tenants.example.com").status, 200);
    assert_eq!(host("tenants.example.com").status, 200);
    // Header globs.
    let client = |c: &str| get(&proxy, "/", &[("Host", "x"), ("X-Client", c)]);
    assert_eq!(client("mobile-ios/2.1").status, 200);
    assert!(refused_by(&client("mobile-android/9"), "mobile"));
    assert_eq!(client("web/1.0").status, 200);
    // No host named (HTTP/1.0 without Host): host limits apply.
    let hostless = common::raw_request(proxy.addr, b"GET / HTTP/1.0\r\n\r\n");
    assert!(refused_by(&hostless, "api-host"), "{}", hostless.body);
}

/// `[block]`: by address and by API key (known or not), answered before
/// anything else, counted, logged once a minute per client, and changed by
/// a reload.
#[test]
fn blocked_clients_never_reach_the_limits_or_the_upstream() {
    let upstream = Upstream::start();
    let config = |block: &str| {
        ConfigBuilder::new(upstream.addr)
            .admin()
            .raw("[clients]\ntrusted_proxies = [\"127.0.0.1/32\"]\n")
            .limit(Limit::fixed_window("per-ip", "ip", 100, "1h"))
            .raw(block)
    };
    let first = config(
        "[block]\ncidrs = [\"203.0.113.0/24\"]\napi_keys = [\"stolen-key\"]\nstatus = 451\n",
    );
    let proxy = first.start();
    let from = |ip: &str, key: Option<&str>| {
        let mut headers = vec![("X-Forwarded-For", ip)];
        if let Some(key) = key {
            headers.push(("X-API-Key", key));
        }
        get(&proxy, "/", &headers)
    };
    for _ in 0..5 {
        let r = from("203.0.113.7", None);
        assert_eq!(r.status, 451);
        assert!(r.body.starts_with("{\"error\":\"blocked\""), "{}", r.body);
    }
    assert_eq!(from("198.51.100.1", Some("stolen-key")).status, 451);
    assert_eq!(from("198.51.100.1", None).status, 200);
    assert_eq!(upstream.count(), 1, "nothing blocked reached the upstream");
    let metric = |reason: &str| {
        proxy.metric(&format!(
            "floodgate_blocked_requests_total{{reason=\"{reason}\"}}"
        ))
    };
    assert_eq!((metric("address"), metric("api_key")), (5.0, 1.0));
    assert_eq!(
        proxy.log().matches("blocked (address)").count(),
        1,
        "{}",
        proxy.log()
    );
    assert!(!proxy.log().contains("stolen-key"), "keys are never logged");
    // A reload lifts the address block and blocks another.
    config("[block]\ncidrs = [\"198.51.100.0/24\"]\n")
        .listen(proxy.addr)
        .admin_at(proxy.admin.expect("admin"))
        .write_to(&proxy.config_path);
    proxy.signal("-HUP");
    assert!(common::wait_until(
        std::time::Duration::from_secs(5),
        || proxy.log().contains("reloaded")
    ));
    assert_eq!(from("203.0.113.7", None).status, 200);
    assert_eq!(from("198.51.100.1", None).status, 403, "the default status");
}
