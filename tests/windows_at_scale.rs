//! Limits at the scale an API sells them (100,000 a day, 4,000,000,000 in
//! 30 days, a bucket of 2^32 - 1 refilling 10,000,000 a second), through
//! the real proxy on the memory store and on a real redis-server: 60
//! requests at once, each priced by `[[costs]]` to reach the limit within
//! the burst, admit exactly the limit's number. The proxies run on a test
//! clock set in the middle of a day and of a 30-day window, and moved a
//! day on rather than waited for.

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::{burst, count_status, ConfigBuilder, Limit, Proxy, TestClock, Upstream};

const DAY_US: u64 = 86_400_000_000;

/// Noon UTC on the 16th day of a 30-day window (windows are aligned to
/// the epoch): every window here has half its length to run.
const NOON_US: u64 = (694 * 30 + 15) * DAY_US + DAY_US / 2;

/// (path, limit, cost of a request, requests of 60 admitted)
const ROUTES: [(&str, &str, u64, usize); 4] = [
    // 100,000 a day, 2,500 a request: 40.
    ("/day", "day", 2_500, 40),
    // 4,000,000,000 in 30 days, 100,000,000 a request: 40.
    ("/month", "month", 100_000_000, 40),
    // 100,000 stamps a day, 2,500 a request: 40.
    ("/log", "log", 2_500, 40),
    // 2^32 - 1 tokens back at 10,000,000 a second, a fifteenth of them a
    // request: 15, and the 16th waits 28 s for its tokens.
    ("/bucket", "bucket", 286_331_153, 15),
];

fn scaled(config: ConfigBuilder, clock: &TestClock) -> ConfigBuilder {
    let mut config = config
        .clock(clock)
        .limit(
            Limit::fixed_window("day", "header:X-Account", 100_000, "1d")
                .matching(r#"paths = ["/day"]"#),
        )
        .limit(
            Limit::sliding_window("month", "header:X-Account", 4_000_000_000, "30d")
                .matching(r#"paths = ["/month"]"#),
        )
        .limit(
            Limit::sliding_log("log", "header:X-Account", 100_000, "1d")
                .matching(r#"paths = ["/log"]"#),
        )
        .limit(
            Limit::token_bucket("bucket", "header:X-Account", 4_294_967_295, 1e7)
                .matching(r#"paths = ["/bucket"]"#),
        );
    for (path, limit, cost, _) in ROUTES {
        config = config.raw(&format!(
            "[[costs]]\nmatch = {{ paths = [\"{path}\"] }}\ncost = {cost}\nlimits = [\"{limit}\"]\n"
        ));
    }
    config
}

/// 60 requests at once on each route, for `account`: each admits exactly
/// its number.
fn admits_exactly(proxy: &Proxy, account: &str, what: &str) {
    for (path, limit, _, admitted) in ROUTES {
        let answers = burst(&[proxy.addr], 60, "GET", path, &[("X-Account", account)]);
        assert_eq!(answers.len(), 60, "{what} {limit}: every request answered");
        assert_eq!(
            (count_status(&answers, 200), count_status(&answers, 429)),
            (admitted, 60 - admitted),
            "{what} {limit}"
        );
    }
}

fn exact_at_scale(proxy: &Proxy, clock: &TestClock, what: &str) {
    clock.set_now_us(NOON_US);
    admits_exactly(proxy, "acme", what);
    // The next day: the day's window and the log's are whole again; the
    // 30-day window is still spent.
    clock.advance(Duration::from_micros(DAY_US));
    let day = burst(&[proxy.addr], 60, "GET", "/day", &[("X-Account", "acme")]);
    assert_eq!(count_status(&day, 200), 40, "{what}: a new day");
    let log = burst(&[proxy.addr], 60, "GET", "/log", &[("X-Account", "acme")]);
    assert_eq!(count_status(&log, 200), 40, "{what}: the log a day on");
    let month = proxy.send("GET", "/month", &[("X-Account", "acme")]);
    assert_eq!(month.status, 429, "{what}: the month is spent");
    // Another account has its own.
    admits_exactly(proxy, "globex", what);
}

#[test]
fn limits_at_scale_admit_exactly_their_number_in_memory() {
    let upstream = Upstream::start();
    let clock = TestClock::new();
    let proxy = scaled(ConfigBuilder::new(upstream.addr), &clock).start();
    exact_at_scale(&proxy, &clock, "memory");
}

#[test]
fn limits_at_scale_admit_exactly_their_number_on_redis() {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let clock = TestClock::new();
    // Every request decided by the scripts: the subject is their
    // arithmetic, not the leases', nor an instance's own share while a
    // loaded machine keeps Redis past its timeout (a failure refuses).
    let config = scaled(ConfigBuilder::new(upstream.addr), &clock)
        .redis(&redis.url())
        .redis_lines(
            "clock = \"local\"\nleases = \"off\"\ntimeout = \"5s\"\non_failure = \"deny\"",
        );
    let proxy = config.start();
    exact_at_scale(&proxy, &clock, "redis");
    // A second proxy shares every count.
    let other = config.start();
    for (path, limit, _, _) in ROUTES {
        let r = other.send("GET", path, &[("X-Account", "globex")]);
        assert_eq!(r.status, 429, "{limit} is shared");
    }
}
