//! Calendar quotas (`algorithm = "quota"`): the reset is the calendar
//! boundary in the limit's zone, crossed here on the proxies' test clock.

mod common;

use common::redis_server::RedisServer;
use common::{ConfigBuilder, Limit, Proxy, TestClock, Upstream};

fn us(rfc3339: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .expect("a test instant")
        .timestamp_micros() as u64
}

const DAY_S: u64 = 86_400;

/// 3 calls per month in New York.
fn monthly() -> Limit {
    Limit::quota("monthly", "header:X-Account", 3, "month").line("timezone = \"America/New_York\"")
}

fn call(proxy: &Proxy) -> common::Response {
    proxy.send("GET", "/v1/report", &[("X-Account", "acme")])
}

/// `RateLimit-Reset` in whole seconds, rounded up: `expected` or, when the
/// clock crossed a second while the request was on its way, one less.
fn assert_reset(response: &common::Response, expected: u64, what: &str) {
    let reset: u64 = response
        .header("RateLimit-Reset")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{what}: no RateLimit-Reset in {:?}", response.headers));
    assert!(
        reset == expected || reset + 1 == expected,
        "{what}: reset in {reset} s, expected {expected}"
    );
}

fn months_have_their_real_length(proxy: &Proxy, clock: &TestClock) {
    // 30 s before February, New York time: the January quota runs out.
    clock.set_now_us(us("2027-01-31T23:59:30-05:00"));
    for n in 1..=3 {
        let r = call(proxy);
        assert_eq!(r.status, 200, "January call {n}");
        assert_reset(&r, 30, "January");
    }
    let refused = call(proxy);
    assert_eq!(refused.status, 429);
    let retry = refused.retry_after_ms().expect("a retry time");
    assert!((29_000..=30_000).contains(&retry), "retry after {retry} ms");
    // February (28 days in 2027) has a fresh quota.
    clock.set_now_us(us("2027-02-01T00:00:00-05:00"));
    let r = call(proxy);
    assert_eq!(r.status, 200, "a new month");
    assert_eq!(r.header("RateLimit-Remaining"), Some("2"));
    assert_reset(&r, 28 * DAY_S, "February");
    // March: 31 days, one of them 23 hours long (DST began on the 14th).
    clock.set_now_us(us("2027-03-01T00:00:00-05:00"));
    let r = call(proxy);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("RateLimit-Remaining"), Some("2"), "March is fresh");
    assert_reset(&r, 31 * DAY_S - 3600, "March");
    // Still March at 23:59 on the 31st, New York time, though April in UTC.
    clock.set_now_us(us("2027-03-31T23:59:00-04:00"));
    for _ in 0..2 {
        assert_eq!(call(proxy).status, 200);
    }
    let refused = call(proxy);
    assert_eq!(
        refused.status, 429,
        "March's quota, spent in its last minute"
    );
    let retry = refused.retry_after_ms().expect("a retry time");
    assert!((50_000..=60_000).contains(&retry), "retry after {retry} ms");
}

#[test]
fn a_monthly_quota_resets_at_the_zones_month_boundary_in_memory() {
    let upstream = Upstream::start();
    let clock = TestClock::new();
    let proxy = ConfigBuilder::new(upstream.addr)
        .clock(&clock)
        .limit(monthly())
        .start();
    months_have_their_real_length(&proxy, &clock);
}

#[test]
fn a_monthly_quota_resets_at_the_zones_month_boundary_on_redis() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let clock = TestClock::new();
    let config = ConfigBuilder::new(upstream.addr)
        .clock(&clock)
        .redis(&redis.url())
        // Every call decided on Redis: the subject is the calendar. (With
        // leases, a lease's return still on its way when a slow machine
        // lets the lease idle out can refuse the quota's last call.)
        .redis_lines("clock = \"local\"\nleases = \"off\"")
        .limit(monthly());
    let proxy = config.start();
    months_have_their_real_length(&proxy, &clock);
    // A second proxy shares the count.
    let other = config.start();
    assert_eq!(call(&other).status, 429, "the quota is shared");
}

#[test]
fn a_weekly_quota_starts_on_the_configured_day() {
    let upstream = Upstream::start();
    let clock = TestClock::new();
    let proxy = ConfigBuilder::new(upstream.addr)
        .clock(&clock)
        .limit(
            Limit::quota("weekly", "header:X-Account", 1, "week").line("week_starts = \"sunday\""),
        )
        .start();
    // Saturday 2027-03-06, noon UTC: the week ends at Sunday midnight.
    clock.set_now_us(us("2027-03-06T12:00:00Z"));
    let r = call(&proxy);
    assert_eq!(r.status, 200);
    assert_reset(&r, 12 * 3600, "Saturday noon");
    assert_eq!(call(&proxy).status, 429);
    clock.set_now_us(us("2027-03-07T00:00:00Z"));
    assert_eq!(call(&proxy).status, 200, "Sunday starts the week");
}
