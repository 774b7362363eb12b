//! `[redis].instances = "auto"`: real proxies on one real Redis count
//! themselves, and the fallback's local share follows the count as
//! instances die and stop.

mod common;

use std::time::{Duration, Instant};

use common::admin_token::{TokenFile, TOKEN};
use common::redis_server::RedisServer;
use common::*;

fn counted(proxy: &Proxy) -> f64 {
    proxy.metric("floodgate_redis_instances")
}

fn await_count(proxies: &[&Proxy], count: f64, within: Duration, what: &str) -> Duration {
    let started = Instant::now();
    assert!(
        wait_until(within, || proxies.iter().all(|p| counted(p) == count)),
        "{what}: counts {:?}, wanted {count}\n{}",
        proxies.iter().map(|p| counted(p)).collect::<Vec<_>>(),
        proxies.first().map(|p| p.log()).unwrap_or_default()
    );
    started.elapsed()
}

#[test]
fn the_live_count_follows_instances_that_start_die_and_stop() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let builder = ConfigBuilder::new(upstream.addr)
        .admin()
        .redis(&redis.url())
        .redis_lines("instances = \"auto\"\non_failure = \"local\"\ntimeout = \"50ms\"")
        .limit(Limit::fixed_window(
            "per-client",
            "header:X-Client",
            30,
            "1h",
        ))
        .raw(&token.section());
    let mut proxies: Vec<Proxy> = (0..3).map(|_| builder.start()).collect();
    let all: Vec<&Proxy> = proxies.iter().collect();
    await_count(&all, 3.0, Duration::from_secs(10), "three started");
    let status = request(
        proxies[2].admin.expect("admin listener"),
        "GET",
        "/v1/status",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        b"",
    );
    let status: serde_json::Value = serde_json::from_str(&status.body).expect("status JSON");
    assert_eq!(status["store"]["instances"]["count"], 3, "{status}");
    assert_eq!(status["store"]["instances"]["source"], "auto", "{status}");

    // One dies: the others count it until its slot's lease (6 s) ends, and
    // one renewal (2 s) later see two.
    proxies[0].signal("-KILL");
    let died_at = Instant::now();
    let rest: Vec<&Proxy> = proxies[1..].iter().collect();
    await_count(&rest, 2.0, Duration::from_secs(15), "one died");
    let forgotten_after = died_at.elapsed();
    assert!(
        forgotten_after >= Duration::from_secs(3),
        "a dead instance is counted until its lease ends, not dropped at once ({forgotten_after:?})"
    );

    // Redis away: the fallback gives each of the two live instances half.
    redis.kill();
    let during: Vec<u16> = (0..20)
        .map(|_| request(proxies[2].addr, "GET", "/", &[("X-Client", "outage")], b"").status)
        .collect();
    assert_eq!(count_status(&during, 200), 15, "{during:?}");
    assert_eq!(count_status(&during, 429), 5, "{during:?}");
    redis.restart();
    let back = "decisions are back on Redis";
    assert!(
        wait_until(Duration::from_secs(10), || {
            request(proxies[2].addr, "GET", "/", &[("X-Client", "probe")], b"");
            proxies[2].log().contains(back)
        }),
        "{}",
        proxies[2].log()
    );
    // The restarted Redis lost the slots: both announce again, and once
    // each has renewed after the other, both count two.
    let roster = format!("floodgate:slots:floodgate instances:{{{}}}", "0".repeat(32));
    assert!(
        wait_until(Duration::from_secs(10), || redis
            .cmd::<u64>(&["ZCARD", &roster])
            == 2
            && rest.iter().all(|p| counted(p) == 2.0)),
        "not recounted after the restart: {}",
        proxies[2].log()
    );

    // One stops: it leaves the count itself, the last sees one at its
    // next renewal, well before a lease would have ended.
    proxies[1].signal("-TERM");
    assert!(proxies[1].wait_exit(Duration::from_secs(10)).is_some());
    let stopped_at = Instant::now();
    let last: Vec<&Proxy> = proxies[2..].iter().collect();
    await_count(&last, 1.0, Duration::from_secs(5), "one stopped");
    let left_after = stopped_at.elapsed();
    assert!(
        left_after < Duration::from_secs(4),
        "a stopped instance leaves the count at once ({left_after:?})"
    );
    record(
        "instances_auto",
        &format!(
            "killed instance dropped from the count after {:.1} s (lease 6 s, renewal 2 s)\nstopped instance dropped after {:.1} s\n",
            forgotten_after.as_secs_f64(),
            left_after.as_secs_f64()
        ),
    );
    drop(proxies.remove(0));
}
