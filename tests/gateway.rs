//! End to end: the real binary in front of a real upstream, over HTTP.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn per_ip() -> Limit {
    Limit::token_bucket("per-ip", "ip", 20, 2.0)
}

/// In front of `upstream`, with the `per-ip` token bucket.
fn per_ip_config(upstream: &Upstream) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr).limit(per_ip())
}

#[test]
fn token_bucket_burst_admits_exactly_capacity_then_refills() {
    let upstream = Upstream::start();
    let clock = TestClock::new();
    let proxy = per_ip_config(&upstream).clock(&clock).start();
    let started = Instant::now();
    let responses = burst(&[proxy.addr], 30, "GET", "/", &[]);
    let elapsed = started.elapsed();
    let admitted = count_status(&responses, 200);
    // 2 tokens a second: a burst that took longer than 0.5 s may have earned more.
    let refilled = (elapsed.as_millis() / 500) as usize;
    assert!(
        (20..=20 + refilled).contains(&admitted),
        "admitted {admitted} in {elapsed:?}"
    );
    assert_eq!(count_status(&responses, 429), 30 - admitted);
    assert_eq!(
        upstream.count(),
        admitted,
        "the upstream saw only admitted requests"
    );

    let refused = proxy.get("/");
    assert_eq!(refused.status, 429);
    let retry_ms = refused.retry_after_ms().expect("retry_after_ms in body");
    assert!(retry_ms <= 500, "{retry_ms}");
    // Refill is time passing: move the proxy's clock by what it said, then retry.
    clock.advance(Duration::from_millis(retry_ms));
    assert_eq!(proxy.get("/").status, 200);
}

#[test]
fn headers_and_429_have_exact_syntax() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(Limit::token_bucket("per-ip", "ip", 3, 0.5))
        .limit(Limit::fixed_window("per-minute", "ip", 100, "1m"))
        .start();
    let first = proxy.get("/");
    assert_eq!(first.status, 200);
    assert_eq!(first.body, "ok");
    assert_eq!(first.header("RateLimit-Limit"), Some("3"));
    assert_eq!(first.header("RateLimit-Remaining"), Some("2"));
    assert_eq!(first.header("RateLimit-Reset"), Some("2"));
    let policy = first.header("RateLimit-Policy").expect("policy");
    let t: u64 = first
        .header("RateLimit-Reset")
        .and_then(|v| v.parse().ok())
        .expect("reset");
    assert_eq!(policy, "\"per-ip\";q=3;w=6, \"per-minute\";q=100;w=60");
    assert_eq!(
        first.header("RateLimit"),
        Some(format!("\"per-ip\";r=2;t={t}").as_str())
    );

    proxy.get("/");
    proxy.get("/");
    let refused = proxy.get("/");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("Content-Type"), Some("application/json"));
    assert_eq!(refused.header("Cache-Control"), Some("no-store"));
    assert_eq!(refused.header("RateLimit-Remaining"), Some("0"));
    let prefix = "{\"error\":\"rate_limited\",\"limit\":\"per-ip\",\"retry_after_ms\":";
    assert!(refused.body.starts_with(prefix), "{}", refused.body);
    let ms = refused.retry_after_ms().expect("number");
    let request_id = refused.header("X-Request-Id").expect("request id");
    assert!(
        refused
            .body
            .ends_with(&format!(",\"request_id\":\"{request_id}\"}}")),
        "{}",
        refused.body
    );
    assert!(ms > 1000 && ms <= 2000, "{ms}");
    let retry_after: u64 = refused
        .header("Retry-After")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert_eq!(retry_after, ms.div_ceil(1000).max(1));
}

#[test]
fn header_styles_can_be_chosen() {
    let upstream = Upstream::start();
    for (style, legacy, draft) in [
        ("legacy", true, false),
        ("draft", false, true),
        ("none", false, false),
    ] {
        let proxy = per_ip_config(&upstream)
            .raw(&format!("[response]\nheaders = \"{style}\""))
            .start();
        let r = proxy.get("/");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("RateLimit-Limit").is_some(), legacy, "{style}");
        assert_eq!(r.header("RateLimit-Policy").is_some(), draft, "{style}");
        assert_eq!(r.header("RateLimit").is_some(), draft, "{style}");
    }
}

#[test]
fn a_request_refused_by_login_costs_nothing_from_per_ip() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(Limit::token_bucket("per-ip", "ip", 10, 0.01))
        .limit(
            Limit::sliding_log("login", "ip", 2, "1m")
                .matching(r#"methods = ["POST"], paths = ["/login"]"#),
        )
        .start();
    let logins: Vec<u16> = (0..5)
        .map(|_| request(proxy.addr, "POST", "/login", &[], b"user=a").status)
        .collect();
    assert_eq!(logins, vec![200, 200, 429, 429, 429]);
    let refused = request(proxy.addr, "POST", "/login", &[], b"user=a");
    assert!(
        refused.body.contains("\"limit\":\"login\""),
        "{}",
        refused.body
    );
    assert_eq!(
        refused.header("Connection"),
        Some("close"),
        "unread body: {:?}",
        refused.headers
    );
    // per-ip paid for the two admitted logins only: 8 left.
    let first = proxy.get("/");
    assert_eq!(first.header("RateLimit-Remaining"), Some("7"));
    let rest: Vec<u16> = (0..8).map(|_| proxy.get("/").status).collect();
    assert_eq!(count_status(&rest, 200), 7);
    assert_eq!(count_status(&rest, 429), 1);
    assert_eq!(upstream.count(), 2 + 8);
}

/// Two tiers of API keys, an exempt path and a costly one.
fn tiers(upstream: &Upstream) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .raw(
            r#"[clients.api_keys]
"free-key" = "free"
"pro-key" = "pro"

[exempt]
paths = ["/healthz"]

[[costs]]
match = { paths = ["/search*"] }
cost = 10"#,
        )
        .limit(Limit::token_bucket("per-ip", "ip", 100, 0.01))
        .limit(
            Limit::token_bucket("per-account", "api_key", 3, 0.01)
                .line("[limits.tiers.pro]\ncapacity = 6\nrefill_rate = 0.01"),
        )
}

#[test]
fn tiers_costs_and_exemptions() {
    let upstream = Upstream::start();
    let proxy = tiers(&upstream).start();
    let admitted = |key: &str| {
        count_status(
            (0..10).map(|_| proxy.send("GET", "/", &[("X-API-Key", key)])),
            200,
        )
    };
    assert_eq!(admitted("free-key"), 3);
    assert_eq!(admitted("pro-key"), 6);
    // An unlisted key is no key: only per-ip applies, so nothing is refused here.
    assert_eq!(admitted("made-up-key"), 10);
    // per-ip has 100 - 19 left: /search costs 10 -> 8 fit.
    let searches: Vec<u16> = (0..10).map(|_| proxy.get("/search?q=x").status).collect();
    assert_eq!(count_status(&searches, 200), 8, "{searches:?}");
    // Exempt: always forwarded, no rate headers.
    for _ in 0..5 {
        let r = proxy.get("/healthz");
        assert_eq!(r.status, 200);
        assert!(!r.has_rate_headers());
    }
    assert_eq!(proxy.get("/").status, 200);
}

#[test]
fn internal_peers_are_exempt_by_tier() {
    let upstream = Upstream::start();
    let proxy = per_ip_config(&upstream)
        .raw("[clients]\ninternal = [\"127.0.0.0/8\"]\n[exempt]\ntiers = [\"internal\"]")
        .start();
    let statuses: Vec<u16> = (0..30).map(|_| proxy.get("/").status).collect();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(upstream.count(), 30);
}

fn two_per_ip() -> Limit {
    Limit::fixed_window("per-ip", "ip", 2, "1h")
}

#[test]
fn forwarded_for_is_ignored_from_untrusted_peers() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(two_per_ip())
        .start();
    let statuses: Vec<u16> = (0..4)
        .map(|i| {
            let xff = format!("203.0.113.{i}");
            proxy.send("GET", "/", &[("X-Forwarded-For", &xff)]).status
        })
        .collect();
    assert_eq!(statuses, vec![200, 200, 429, 429]);
}

#[test]
fn forwarded_for_is_honoured_from_trusted_peers_and_ipv6_aggregated() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .raw("[clients]\ntrusted_proxies = [\"127.0.0.1/32\"]\nipv6_prefix = 64")
        .limit(two_per_ip())
        .start();
    let status = |xff: &str| proxy.send("GET", "/", &[("X-Forwarded-For", xff)]).status;
    // Distinct clients behind the trusted proxy each get their own budget.
    for i in 0..4 {
        let xff = format!("198.51.100.{i}, 127.0.0.1");
        assert_eq!(status(&xff), 200, "{xff}");
    }
    // Two addresses in one /64 share a budget; the next /64 has its own.
    assert_eq!(status("2001:db8:1:2::1"), 200);
    assert_eq!(status("2001:db8:1:2:ffff::9"), 200);
    assert_eq!(status("2001:db8:1:2::abcd"), 429);
    assert_eq!(status("2001:db8:1:3::1"), 200);
    // An IPv4-mapped address is its IPv4 client. (Forwarded is read only
    // where it is the configured header: tests/no_way_around.rs.)
    assert_eq!(status("192.0.2.60"), 200);
    assert_eq!(status("::ffff:192.0.2.60"), 200);
    assert_eq!(status("192.0.2.60"), 429);
}

#[test]
fn fixed_window_admits_a_double_burst_at_the_edge_sliding_algorithms_do_not() {
    let upstream = Upstream::start();
    let clock = TestClock::new();
    let window_us = 20_000_000;
    let proxies: Vec<(&str, Proxy)> = [
        ("fixed_window", Limit::fixed_window("edge", "ip", 5, "20s")),
        (
            "sliding_window",
            Limit::sliding_window("edge", "ip", 5, "20s"),
        ),
        ("sliding_log", Limit::sliding_log("edge", "ip", 5, "20s")),
    ]
    .into_iter()
    .map(|(a, limit)| {
        let proxy = ConfigBuilder::new(upstream.addr)
            .limit(limit)
            .clock(&clock)
            .start();
        (a, proxy)
    })
    .collect();
    // Windows are aligned to multiples of 20 s of the proxies' time: move it
    // to 10 s before an edge, burst, move it to just past the edge, burst again.
    let edge_us = (clock.now_us() / window_us + 2) * window_us;
    clock.set_now_us(edge_us - window_us / 2);
    let before: Vec<usize> = proxies
        .iter()
        .map(|(_, p)| count_status(burst(&[p.addr], 5, "GET", "/", &[]), 200))
        .collect();
    assert!(
        clock.now_us() < edge_us,
        "the first bursts overran the window edge"
    );
    clock.set_now_us(edge_us + 20_000);
    let after: Vec<usize> = proxies
        .iter()
        .map(|(_, p)| count_status(burst(&[p.addr], 5, "GET", "/", &[]), 200))
        .collect();
    // The second bursts came early in the new window: before 8 s into it,
    // the previous window still weighs more than 60 % for sliding_window.
    let into_window_us = clock.now_us() - edge_us;
    assert!(
        into_window_us < 8_000_000,
        "the second bursts took {into_window_us} us"
    );
    assert_eq!(before, vec![5, 5, 5]);
    assert_eq!(after[0], 5, "fixed_window: a fresh window at the edge");
    // Previous window weighing > 60 %: 5 x 0.6 + 2 > 5, so at most one more.
    assert!(after[1] <= 1, "sliding_window admitted {}", after[1]);
    assert_eq!(after[2], 0, "sliding_log is exact");
}

#[test]
fn leaky_bucket_spaces_requests_and_refuses_overflow_at_once() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::leaky_bucket("sms-gateway", "global", 10.0, 5).matching(r#"paths = ["/sms/*"]"#),
        )
        .start();
    let started = Instant::now();
    let handles: Vec<_> = (0..10)
        .map(|_| {
            let addr = proxy.addr;
            std::thread::spawn(move || {
                let t = Instant::now();
                let r = request(addr, "POST", "/sms/send", &[], b"hi");
                (r.status, t.elapsed())
            })
        })
        .collect();
    let results: Vec<(u16, Duration)> = handles.into_iter().filter_map(|h| h.join().ok()).collect();
    let admitted = count_status(results.iter().map(|(s, _)| s), 200);
    assert_eq!(admitted, 6, "one at once and five waiting: {results:?}");
    for (status, took) in &results {
        if *status == 429 {
            assert!(
                *took < Duration::from_millis(300),
                "overflow refused at once, took {took:?}"
            );
        }
    }
    let mut arrivals: Vec<Instant> = upstream.seen().iter().map(|s| s.at).collect();
    arrivals.sort();
    assert_eq!(arrivals.len(), 6);
    // The k-th leaves the proxy k × 100 ms after the first was decided,
    // which was after `started`; the way to the upstream can only add to
    // that (on a loaded machine, tens of ms to any one of them), so only
    // lower bounds hold. Unspaced, all six would come within a few ms.
    for (k, at) in arrivals.iter().enumerate() {
        let due = Duration::from_millis(100 * k as u64).saturating_sub(Duration::from_millis(1));
        assert!(
            *at - started >= due,
            "arrival {k} came {:?} after the start, before its {due:?}",
            *at - started
        );
    }
    assert!(started.elapsed() >= Duration::from_millis(500));
}

#[test]
fn shadow_limits_log_but_never_refuse() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::sliding_window("new-endpoint", "ip", 2, "1m")
                .line("shadow = true")
                .matching(r#"paths = ["/v2/*"]"#),
        )
        .start();
    let statuses: Vec<u16> = (0..5).map(|_| proxy.get("/v2/items").status).collect();
    assert_eq!(statuses, vec![200; 5]);
    assert_eq!(upstream.count(), 5);
    // Three would have been refused: one line for the client and limit.
    assert!(
        wait_until(Duration::from_secs(5), || {
            proxy.log().matches("shadow limit would refuse").count() == 1
        }),
        "{}",
        proxy.log()
    );
    assert!(proxy.log().contains("limit=new-endpoint"));
}

#[test]
fn rejections_are_logged_once_with_identity_limit_and_retry_but_never_the_key() {
    let upstream = Upstream::start();
    let proxy = tiers(&upstream).start();
    let secret = "free-key";
    for _ in 0..5 {
        proxy.send("GET", "/", &[("X-API-Key", secret)]);
    }
    // Two refusals, one line for the client and limit.
    assert!(wait_until(Duration::from_secs(5), || proxy
        .log()
        .matches("rate limited:")
        .count()
        == 1));
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("rate limited:"))
        .expect("a rejection line");
    assert!(line.contains("ip=127.0.0.1"), "{line}");
    assert!(line.contains("key#"), "{line}");
    assert!(line.contains("tier=free"), "{line}");
    assert!(line.contains("limit=per-account"), "{line}");
    assert!(line.contains("retry_after_ms="), "{line}");
    assert!(!log.contains(secret), "the key leaked into the log");
}

/// A client refused at full speed (60 connections at once, 1,200
/// refusals) writes one line per limit every 10 s, each counting the
/// refusals it did not log; the metric counts every one. (Every refusal was
/// a line before: 370,755 lines in 6 s for one client at full speed.)
#[test]
fn a_client_refused_at_full_speed_writes_one_line_per_limit_and_interval() {
    const REFUSED: &str = "floodgate_decisions_total{limit=\"per-ip\",outcome=\"refused\"}";
    let upstream = Upstream::start();
    let clock = TestClock::new();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .clock(&clock)
        .limit(Limit::fixed_window("per-ip", "ip", 1, "1h"))
        .start();
    assert_eq!(proxy.get("/").status, 200);
    let mut refused = 0;
    for _ in 0..20 {
        refused += count_status(burst(&[proxy.addr], 60, "GET", "/", &[]), 429);
    }
    assert_eq!(refused, 1200);
    assert_eq!(proxy.metric(REFUSED), 1200.0);
    let lines = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("rate limited:"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(lines(&proxy.log()).len(), 1, "{}", proxy.log());
    assert!(lines(&proxy.log())[0].ends_with("unlogged_since_last=0"));
    // The interval passes on the proxy's clock: the next refusal's line
    // counts the 1,199 before it that went unlogged.
    clock.advance(Duration::from_secs(10));
    assert_eq!(proxy.get("/").status, 429);
    assert!(wait_until(Duration::from_secs(5), || lines(&proxy.log())
        .len()
        == 2));
    let second = &lines(&proxy.log())[1];
    assert!(second.ends_with("unlogged_since_last=1199"), "{second}");
    assert_eq!(proxy.metric(REFUSED), 1201.0);
}

#[test]
fn upstream_down_gives_a_quick_502_with_json() {
    let proxy = ConfigBuilder::new(local_addr()).limit(per_ip()).start();
    let started = Instant::now();
    let r = proxy.get("/");
    assert_eq!(r.status, 502);
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    assert_eq!(r.body, "{\"error\":\"upstream_unavailable\"}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_cost_above_the_limit_is_refused_with_its_reason() {
    let upstream = Upstream::start();
    let proxy = per_ip_config(&upstream)
        .raw("[[costs]]\nmatch = { paths = [\"/bulk\"] }\ncost = 50")
        .start();
    let r = proxy.get("/bulk");
    assert_eq!(r.status, 429);
    let request_id = r.header("X-Request-Id").expect("request id");
    assert_eq!(
        r.body,
        format!("{{\"error\":\"cost_exceeds_limit\",\"limit\":\"per-ip\",\"cost_limit\":20,\"request_id\":\"{request_id}\"}}")
    );
    assert!(r.header("Retry-After").is_none());
    assert_eq!(proxy.get("/").status, 200);
    assert_eq!(upstream.count(), 1);
}

#[test]
fn bad_input_never_gets_a_5xx_or_a_crash() {
    let upstream = Upstream::start();
    let mut proxy = tiers(&upstream)
        .limit(Limit::fixed_window(
            "by-tenant",
            "header:X-Tenant",
            1000,
            "1m",
        ))
        .start();
    let huge = "a".repeat(200_000);
    let mut cases: Vec<Vec<u8>> = vec![
        format!("GET / HTTP/1.1\r\nHost: t\r\nX-API-Key: {huge}\r\n\r\n").into_bytes(),
        format!("GET / HTTP/1.1\r\nHost: t\r\nX-Tenant: {huge}\r\n\r\n").into_bytes(),
        format!("GET / HTTP/1.1\r\nHost: t\r\n{}\r\n", (0..500).map(|i| format!("X-H{i}: v\r\n")).collect::<String>()).into_bytes(),
        b"GET / HTTP/1.1\r\nHost: t\r\nX-API-Key: \xff\xfe\x80key\r\nX-Tenant: \xc3\x28{}\r\n\r\n".to_vec(),
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: \xff, ::::, 999.1.1.1\r\nForwarded: for=\"[zz\r\n\r\n".to_vec(),
        b"GET /\xff\xfe HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
        b"BREW / HTTP/1.1\r\nHost: t\r\n\r\n".to_vec(),
        b"GET / HTTP/9.9\r\n\r\n".to_vec(),
        b"\x00\x01\x02 garbage\r\n\r\n".to_vec(),
    ];
    cases.push(format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "p".repeat(100_000)).into_bytes());
    for (i, raw) in cases.iter().enumerate() {
        let r = raw_request(proxy.addr, raw);
        assert!(r.status < 500, "case {i}: status {} {}", r.status, r.body);
        assert!(proxy.is_running(), "case {i} killed the proxy");
    }
    assert_eq!(proxy.get("/").status, 200);
}

#[test]
fn https_to_the_upstream_verifies_its_certificate() {
    let upstream = TlsUpstream::start();
    let config = |tls: bool, ca: Option<&std::path::Path>| {
        let mut config = ConfigBuilder::new(upstream.addr).limit(per_ip());
        if tls {
            config = config.upstream("tls = true\nsni = \"localhost\"");
        }
        if let Some(ca) = ca {
            config = config.upstream(&format!("ca_file = \"{}\"", ca.display()));
        }
        config
    };

    // Plain HTTP to a TLS server gets no usable answer: a 502, not a hang.
    let plain = config(false, None).start();
    assert_eq!(plain.get("/").status, 502);
    drop(plain);

    let proxy = config(true, Some(&upstream.ca)).start();
    let r = proxy.get("/");
    assert_eq!(r.status, 200, "{}", proxy.log());
    assert!(
        r.body.contains("s_server"),
        "the upstream's page: {}",
        r.body
    );
    assert_eq!(r.header("RateLimit-Limit"), Some("20"));
    drop(proxy);

    // A certificate from a CA nobody trusts is refused: 502, not a silent pass.
    let untrusting = config(true, None).start();
    assert_eq!(untrusting.get("/").status, 502);
}

#[test]
fn requests_go_round_robin_and_a_dead_server_is_skipped() {
    let first = Upstream::start();
    let second = Upstream::start();
    let dead = local_addr();
    let proxy = ConfigBuilder::new(first.addr)
        .servers(&[first.addr, second.addr, dead])
        .limit(per_ip())
        .start();
    let statuses: Vec<u16> = (0..12).map(|_| proxy.get("/").status).collect();
    assert_eq!(
        statuses,
        vec![200; 12],
        "a refused connection moves on to the next server"
    );
    // The dead server's turns went to the next live one.
    assert_eq!(first.count() + second.count(), 12);
    assert!(
        first.count() >= 4 && second.count() >= 4,
        "{} / {}",
        first.count(),
        second.count()
    );
}

#[test]
fn a_slow_upstream_gets_a_504_after_read_timeout() {
    let upstream = Upstream::start();
    let proxy = per_ip_config(&upstream).read_timeout("300ms").start();
    let started = Instant::now();
    // Held until the upstream is dropped: it never answers in time.
    let r = proxy.get("/hold");
    assert_eq!(r.status, 504);
    assert_eq!(r.body, "{\"error\":\"upstream_timeout\"}");
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "{:?}",
        started.elapsed()
    );
}

/// Header names reach the upstream and the client in lower case (the few
/// Pingora title-cases, such as Host and Content-Type, aside), as Envoy and
/// HAProxy write them, unless
/// `[upstream].preserve_header_case` keeps every spelling; the values are
/// the same either way, on a forwarded answer and on a 429.
#[test]
fn header_names_are_written_in_lower_case_unless_their_case_is_preserved() {
    let upstream = Upstream::start();
    for preserve in [false, true] {
        upstream.reset();
        let mut builder =
            ConfigBuilder::new(upstream.addr).limit(Limit::fixed_window("two", "ip", 2, "1h"));
        if preserve {
            builder = builder.upstream("preserve_header_case = true");
        }
        let proxy = builder.start();
        let asked = [
            ("X-Client-Thing", "1"),
            ("X-Answer-Header", "X-Upstream-Thing: 2"),
        ];
        let r = request(proxy.addr, "GET", "/", &asked, b"");
        assert_eq!(r.status, 200, "{}", r.body);
        let seen = upstream.seen();
        let seen = seen.last().expect("forwarded");
        let sent = |name: &str| {
            seen.names_as_sent
                .iter()
                .find(|n| n.eq_ignore_ascii_case(name))
                .cloned()
                .unwrap_or_default()
        };
        let named = |r: &Response, name: &str| {
            r.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(n, _)| n.clone())
                .unwrap_or_default()
        };
        let spelled = |spelling: &str| {
            if preserve {
                spelling.to_string()
            } else {
                spelling.to_ascii_lowercase()
            }
        };
        assert_eq!(sent("host"), "Host", "preserve={preserve}");
        for name in [
            "X-Client-Thing",
            "X-Forwarded-For",
            "X-Real-IP",
            "X-Request-Id",
        ] {
            assert_eq!(sent(name), spelled(name), "preserve={preserve}");
        }
        assert_eq!(
            seen.headers
                .iter()
                .find(|(n, _)| n == "x-forwarded-for")
                .map(|(_, v)| v.as_str()),
            Some("127.0.0.1")
        );
        for name in ["X-Upstream-Thing", "RateLimit-Remaining", "X-Request-Id"] {
            assert_eq!(named(&r, name), spelled(name), "preserve={preserve}");
        }
        assert_eq!(named(&r, "content-type"), "Content-Type");
        assert_eq!(r.header("X-Upstream-Thing"), Some("2"));
        assert_eq!(r.header("RateLimit-Remaining"), Some("1"));

        assert_eq!(proxy.get("/").status, 200);
        let refused = proxy.get("/");
        assert_eq!(refused.status, 429);
        for name in ["Retry-After", "RateLimit-Policy", "X-Request-Id"] {
            assert_eq!(named(&refused, name), spelled(name), "preserve={preserve}");
        }
        assert!(refused.header("Retry-After").is_some());
    }
}
