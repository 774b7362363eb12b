//! Limits charged what the response says it cost (`cost_from_response`),
//! and costs that differ per limit (`[[costs]] limits = [...]`).

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::{wait_until, ConfigBuilder, Limit, Proxy, Response, Upstream};

/// 1,000 tokens per account, one back every 100 s (none comes back while
/// a test runs); a response's
/// `X-Tokens-Used` is charged, at most 1,000, 300 when it says nothing.
fn tokens() -> Limit {
    Limit::token_bucket("tokens", "header:X-Account", 1000, 0.01)
        .line("cost_from_response = { header = \"X-Tokens-Used\", max = 1000, default = 300 }")
}

fn call(proxy: &Proxy, account: &str, used: Option<&str>) -> Response {
    let reported = used.map(|u| format!("X-Tokens-Used: {u}"));
    let mut headers = vec![("X-Account", account)];
    if let Some(reported) = &reported {
        headers.push(("X-Answer-Header", reported.as_str()));
    }
    proxy.send("POST", "/v1/chat", &headers)
}

const UNREAD: &str =
    "floodgate_response_cost_fallbacks_total{limit=\"tokens\",reason=\"missing_or_malformed\"}";
const ABOVE_MAX: &str =
    "floodgate_response_cost_fallbacks_total{limit=\"tokens\",reason=\"above_max\"}";

#[test]
fn the_reported_cost_is_charged_hidden_and_owed_until_paid_back() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(tokens())
        .start();
    // Each call reserves the default (300) before it goes upstream and is
    // settled to what it reports: 1000, 600, then 200 left, which holds no
    // reservation. The bucket refills from the first charge on.
    let first_charge = Instant::now();
    for n in 1..=2 {
        let r = call(&proxy, "alice", Some("400"));
        assert_eq!(r.status, 200, "call {n}");
        assert_eq!(r.header("X-Tokens-Used"), None, "the client never sees it");
    }
    let refused = call(&proxy, "alice", Some("400"));
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(
        upstream.count(),
        2,
        "the refused call never reached the app"
    );
    // 300 again once 100 tokens have come back: 80,000 s of debt after the
    // first charge, 10,000 s beyond what the bucket's capacity covers.
    let retry_ms = refused.retry_after_ms().expect("a retry time");
    let elapsed_ms = first_charge.elapsed().as_millis() as u64 + 1;
    assert!(
        retry_ms <= 10_000_000 && retry_ms + elapsed_ms >= 10_000_000,
        "retry after {retry_ms} ms, at most {elapsed_ms} ms after the first charge"
    );
    let after = refused.header("Retry-After");
    assert!(matches!(after, Some("10000" | "9999")), "{after:?}");
    assert!(refused.body.contains("\"limit\":\"tokens\""));
    // A cost above what was reserved is owed in full: 1,000 reported on a
    // reservation of 300 leaves dave 700 in debt from 300, and nothing
    // passes until it is paid back.
    assert_eq!(call(&proxy, "dave", Some("700")).status, 200);
    assert_eq!(
        call(&proxy, "dave", Some("1000")).status,
        200,
        "300 held its reservation"
    );
    assert_eq!(call(&proxy, "dave", Some("1")).status, 429, "owing 700");

    // Missing and unreadable costs are charged the default, and counted;
    // one above `max` is charged `max`.
    for (n, used) in [None, Some("many"), Some("-3")].into_iter().enumerate() {
        assert_eq!(call(&proxy, "bob", used).status, 200, "bob's call {n}");
    }
    assert_eq!(
        call(&proxy, "bob", None).status,
        429,
        "3 x 300 leave 100, short of a reservation"
    );
    assert_eq!(proxy.metric(UNREAD), 3.0);
    assert_eq!(call(&proxy, "carol", Some("999999")).status, 200);
    assert_eq!(call(&proxy, "carol", Some("1")).status, 429, "charged max");
    assert_eq!(proxy.metric(ABOVE_MAX), 1.0);
}

#[test]
fn exposed_costs_reach_the_client() {
    let upstream = Upstream::start();
    let proxy =
        ConfigBuilder::new(upstream.addr)
            .limit(Limit::fixed_window("tokens", "ip", 100, "1h").line(
                "cost_from_response = { header = \"X-Tokens-Used\", max = 100, expose = true }",
            ))
            .start();
    let r = call(&proxy, "alice", Some("60"));
    assert_eq!(r.header("X-Tokens-Used"), Some("60"));
    assert_eq!(r.header("RateLimit-Remaining"), Some("99"), "peeked at 1");
    assert_eq!(call(&proxy, "alice", Some("60")).status, 200);
    assert_eq!(call(&proxy, "alice", Some("60")).status, 429);
}

/// Two proxies on one Redis owe against one balance.
#[test]
fn a_balance_on_redis_is_shared_by_proxies() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let config = ConfigBuilder::new(upstream.addr)
        .redis(&redis.url())
        .limit(tokens());
    let (a, b) = (config.start(), config.start());
    assert_eq!(call(&a, "alice", Some("700")).status, 200);
    assert_eq!(call(&b, "alice", Some("400")).status, 200, "300 left");
    assert_eq!(call(&a, "alice", Some("1")).status, 429, "owing 100");
    assert_eq!(call(&b, "alice", Some("1")).status, 429, "owing 100");
    assert_eq!(upstream.count(), 2);
}

/// A client that hangs up while the application works cannot dodge the
/// bill: a call that is in runs to its answer and is charged what it
/// reports; one cut off before its body is in is charged the most a
/// response may report (the application may have started on it).
#[test]
fn hanging_up_is_no_way_around_the_bill() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(tokens())
        .start();
    let reset = |client: std::net::TcpStream| {
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .expect("linger");
        drop(client);
    };
    let mut whole = std::net::TcpStream::connect(proxy.addr).expect("connect");
    whole
        .write_all(b"POST /hold/chat HTTP/1.1\r\nHost: test\r\nX-Account: mallory\r\nX-Answer-Header: X-Tokens-Used: 700\r\nContent-Length: 0\r\n\r\n")
        .expect("send");
    assert!(wait_until(Duration::from_secs(10), || upstream.holding() == 1));
    reset(whole);
    upstream.release();
    let answered = "floodgate_requests_total{status_class=\"2xx\"}";
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric(answered)
        >= 1.0));
    // Charged 700: 300 left, one reservation of 300 fits.
    let mut half = std::net::TcpStream::connect(proxy.addr).expect("connect");
    half.write_all(b"POST /v1/chat HTTP/1.1\r\nHost: test\r\nX-Account: mallory\r\nContent-Length: 100\r\n\r\nhello")
        .expect("send");
    assert!(wait_until(Duration::from_secs(10), || upstream.heads() == 2));
    reset(half);
    let given_up = "floodgate_requests_total{status_class=\"none\"}";
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric(given_up)
        >= 1.0));
    let r = call(&proxy, "mallory", Some("1"));
    assert_eq!(r.status, 429, "charged 1000 for the call it cut off");
}

/// `[[costs]]` naming a limit prices that limit alone: a search costs 10
/// from the quota and 1 from the per-address limit.
#[test]
fn a_cost_can_apply_to_one_limit_only() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(Limit::fixed_window("quota", "header:X-Account", 35, "1h"))
        .limit(Limit::fixed_window("per-ip", "ip", 12, "1h"))
        .raw("[[costs]]\nmatch = { paths = [\"/search\"] }\ncost = 10\nlimits = [\"quota\"]\n")
        .start();
    let search = || proxy.send("GET", "/search", &[("X-Account", "alice")]);
    // Were per-ip charged 10, the second search would pass 12.
    for n in 1..=3 {
        assert_eq!(search().status, 200, "search {n}");
    }
    let refused = search();
    assert_eq!(refused.status, 429);
    assert!(
        refused.body.contains("\"limit\":\"quota\""),
        "{}",
        refused.body
    );
    // 5 left in the quota at 1 each; per-ip has used 3 + 5 of its 12.
    for n in 1..=5 {
        let r = proxy.send("GET", "/other", &[("X-Account", "alice")]);
        assert_eq!(r.status, 200, "other {n}");
    }
    let refused = proxy.send("GET", "/other", &[("X-Account", "alice")]);
    assert!(
        refused.body.contains("\"limit\":\"quota\""),
        "{}",
        refused.body
    );
}

/// An interim answer (100 Continue, 103 Early Hints) before the final one
/// is no outcome: the final answer's cost and status are charged.
#[test]
fn an_interim_answer_charges_nothing_the_final_one_does() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(tokens())
        .limit(Limit::fixed_window("failures", "ip", 1, "1h").line("count = { statuses = [401] }"))
        .start();
    let interim = |account: &str, code: &str, used: &str, status: &str| {
        let used = format!("X-Tokens-Used: {used}");
        proxy.send(
            "POST",
            "/v1/chat",
            &[
                ("X-Account", account),
                ("X-Answer-Interim", code),
                ("X-Answer-Header", used.as_str()),
                ("X-Answer-Status", status),
            ],
        )
    };
    let r = interim("alice", "100", "1000", "200");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("X-Tokens-Used"),
        None,
        "hidden in the final answer"
    );
    assert_eq!(
        proxy.metric(UNREAD),
        0.0,
        "the 100 was not read as a response"
    );
    let spent = call(&proxy, "alice", Some("1"));
    assert!(
        spent.body.contains("\"limit\":\"tokens\""),
        "{}",
        spent.body
    );
    assert_eq!(interim("carol", "103", "1", "401").status, 401);
    let counted = call(&proxy, "dave", Some("1"));
    assert!(
        counted.body.contains("\"limit\":\"failures\""),
        "{}",
        counted.body
    );
}

/// 40 calls at once against a monthly budget of 1,000, each reserving 500
/// before it goes upstream and reporting 500: two are admitted, the rest
/// refused at once, and the budget is never overrun, however many run.
#[test]
fn concurrent_calls_cannot_overrun_a_budget_they_reserve() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(
            Limit::quota("budget", "header:X-Account", 1000, "month").line(
                "cost_from_response = { header = \"X-Tokens-Used\", max = 2000, default = 500 }",
            ),
        )
        .start();
    let addrs = vec![proxy.addr];
    let headers = [
        ("X-Account", "alice"),
        ("X-Answer-Header", "X-Tokens-Used: 500"),
    ];
    let calls =
        std::thread::spawn(move || common::burst(&addrs, 40, "POST", "/hold/generate", &headers));
    let refused = "floodgate_decisions_total{limit=\"budget\",outcome=\"refused\"}";
    let settled = wait_until(Duration::from_secs(20), || {
        proxy.metric(refused) + upstream.holding() as f64 >= 40.0
    });
    let held = upstream.most_held();
    upstream.release();
    let answers = calls.join().expect("calls");
    assert!(settled);
    assert_eq!(held, 2, "calls at the application at once");
    assert_eq!(common::count_status(&answers, 200), 2);
    assert_eq!(common::count_status(&answers, 429), 38);
    // Spent exactly: nothing more passes, a smaller reservation neither.
    let r = proxy.send("POST", "/hold/generate", &[("X-Account", "alice")]);
    assert_eq!(r.status, 429);
    // A call that reports less than it reserved gets the rest back: six
    // calls of 100 fit (500 is reserved before each), the seventh finds
    // 400, short of its reservation.
    let frugal = [
        ("X-Account", "bob"),
        ("X-Answer-Header", "X-Tokens-Used: 100"),
    ];
    for n in 1..=6 {
        assert_eq!(
            proxy.send("POST", "/hold/generate", &frugal).status,
            200,
            "call {n}"
        );
    }
    assert_eq!(proxy.send("POST", "/hold/generate", &frugal).status, 429);
}

/// A cost said twice (two header lines, or a list in one) is charged at
/// the larger: an upstream cannot be made to undercharge by repeating it
/// lower.
#[test]
fn a_cost_said_twice_is_charged_the_larger() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(
            Limit::fixed_window("tokens", "ip", 16, "1h")
                .line("cost_from_response = { header = \"X-Tokens-Used\", max = 100 }"),
        )
        .start();
    let twice = [
        ("X-Answer-Header", "X-Tokens-Used: 7"),
        ("X-Answer-Header", "X-Tokens-Used: 9"),
    ];
    let r = proxy.send("POST", "/v1/chat", &twice);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("X-Tokens-Used"), None);
    assert_eq!(call(&proxy, "-", Some("3, 7")).status, 200, "9 + 7 of 16");
    assert_eq!(
        call(&proxy, "-", Some("1")).status,
        429,
        "spent: 9 and 7 were charged"
    );
}
