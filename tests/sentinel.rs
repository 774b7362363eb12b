//! `[redis].sentinel`: two real proxies under steady load on a real
//! Sentinel group (a master, its replica, three sentinels). The master is
//! killed and its replica promoted; later the old master, back as a
//! replica, is promoted again by a manual failover that demotes the live
//! master under the proxies (READONLY). Every request must be answered as
//! `on_failure` says, decisions must come back to Redis within seconds of
//! each promotion, the breaker must open at most once per failover, and
//! the log must not fill with READONLY. Sentinels that require a password
//! of their own are asked with `sentinel_password_file`, through a
//! promotion too.

mod common;

use std::time::{Duration, Instant};

use common::load::Load;
use common::redis_server::{
    RedisServer, SentinelGroup, SENTINELS_OWN_PASSWORD, SENTINEL_MASTER, SENTINEL_PASSWORD,
};
use common::*;

fn spend(proxy: &Proxy, client: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| request(proxy.addr, "GET", "/", &[("X-Client", client)], b"").status == 200)
        .count()
}

/// Waits until both proxies' logs hold `line` `times` times; how long.
fn await_both(proxies: &[&Proxy], line: &str, times: usize, what: &str) -> Duration {
    let started = Instant::now();
    assert!(
        wait_until(Duration::from_secs(20), || proxies.iter().all(|p| p
            .log()
            .matches(line)
            .count()
            >= times)),
        "{what}: {}",
        proxies[0].log()
    );
    started.elapsed()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario against real processes, read in the order it happens"
)]
fn two_proxies_follow_the_master_through_a_kill_and_a_manual_failover() {
    let mut group = SentinelGroup::start();
    let upstream = Upstream::start();
    let dir = temp_dir();
    let password_file = dir.join("redis.password");
    std::fs::write(&password_file, format!("{SENTINEL_PASSWORD}\n")).expect("password file");
    let nodes: Vec<String> = group
        .sentinel_nodes()
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect();
    let builder = ConfigBuilder::new(upstream.addr)
        .admin()
        .redis_lines(&format!(
            "sentinel = {{ master = \"{SENTINEL_MASTER}\", nodes = [{}], password_file = \"{}\" }}\ntimeout = \"50ms\"\non_failure = \"local\"\ninstances = 2\nleases = \"off\"",
            nodes.join(", "),
            password_file.display()
        ))
        .limit(Limit::fixed_window(
            "per-client",
            "header:X-Client",
            30,
            "1h",
        ))
        .limit(Limit::token_bucket(
            "load",
            "header:X-Load",
            1_000_000,
            1_000_000.0,
        ));
    let a = builder.start();
    let b = builder.start();
    let proxies = [&a, &b];
    // Decided by the master: the client's count is there.
    assert_eq!(spend(&a, "before", 10), 10);
    assert_eq!(spend(&b, "before", 10), 10);
    let found = format!(
        "master \"{SENTINEL_MASTER}\" is 127.0.0.1:{}",
        group.nodes[0].port
    );
    assert!(a.log().contains(&found), "{}", a.log());

    let load_a = Load::start(a.addr, 2);
    let load_b = Load::start(b.addr, 2);
    let started = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || load_a.answered_since(started)
            > 20
            && load_b.answered_since(started) > 20),
        "the load is answered before the failover"
    );

    // The last writes before the kill: replication is asynchronous, so
    // these are what a failover may lose.
    let last = spend(&a, "last-writes", 10);
    let killed_at = Instant::now();
    group.nodes[0].kill();
    assert!(
        wait_until(Duration::from_secs(30), || group.nodes[1].role()
            == "master"),
        "the replica was never promoted"
    );
    let promoted_after = killed_at.elapsed();
    let promoted_at = Instant::now();
    let moved = "moved from";
    let followed_after = await_both(&proxies, moved, 1, "never followed the promotion");
    // Back on Redis: the new master holds what the proxies decide.
    assert!(
        wait_until(Duration::from_secs(10), || {
            spend(&b, "after-kill", 1);
            group.nodes[1]
                .keys()
                .iter()
                .any(|k| k.contains("per-client"))
                && proxies.iter().all(|p| {
                    !p.log().contains("deciding without it")
                        || p.log().contains("decisions are back on Redis")
                })
        }),
        "decisions never came back to Redis: {}",
        a.log()
    );
    let back_after_promotion = promoted_at.elapsed();
    // What the last writes left: 30 - 10 if none was lost.
    let kept_before = 30 - spend(&a, "before", 30);
    let left_after_last = spend(&a, "last-writes", 30);
    let lost_in_failover = (last + left_after_last).saturating_sub(30);

    // The old master comes back empty; the sentinels make it a replica of
    // the new one. Then a manual failover demotes the live master while the
    // proxies hold connections to it.
    group.nodes[0].restart();
    group.await_settled(1, 0);
    let switched_at = Instant::now();
    let ok: Option<String> = group.sentinels[0].query(&["SENTINEL", "FAILOVER", SENTINEL_MASTER]);
    assert_eq!(ok.as_deref(), Some("OK"), "manual failover refused");
    assert!(
        wait_until(Duration::from_secs(30), || group.nodes[0].role()
            == "master"
            && group.nodes[1].role() == "slave"),
        "the manual failover never ended"
    );
    let roles_swapped_after = switched_at.elapsed();
    await_both(&proxies, moved, 2, "never followed the manual failover");
    let second_followed_after = switched_at.elapsed();
    assert!(
        wait_until(Duration::from_secs(10), || {
            spend(&a, "after-switch", 1);
            // A replica is sent a script's effects, never the script: a
            // script run there was a decision made there.
            group.nodes[0].calls("evalsha") > 0
        }),
        "decisions never came back to the demoted master's successor: {}",
        a.log()
    );
    let after_start = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || load_a
            .answered_since(after_start)
            > 20
            && load_b.answered_since(after_start) > 20),
        "the load is answered after both failovers"
    );
    let samples: Vec<_> = load_a.finish().into_iter().chain(load_b.finish()).collect();

    let failed: Vec<u16> = samples.iter().map(|s| s.2).filter(|&s| s != 200).collect();
    assert!(
        failed.is_empty(),
        "load requests not answered 200: {failed:?}"
    );
    let mut openings = Vec::new();
    for proxy in proxies {
        let log = proxy.log();
        let opened = log.matches("deciding without it").count();
        assert!(
            opened <= 2,
            "the breaker opened {opened} times in two failovers:\n{log}"
        );
        let readonly = log.matches("READONLY").count();
        assert!(readonly <= 2, "{readonly} READONLY lines:\n{log}");
        openings.push(opened);
    }
    assert_eq!(
        kept_before, 20,
        "the writes long before the kill survive it"
    );
    record(
        "sentinel_failover",
        &format!(
            "killed master: replica promoted after {:.1} s (down-after 1 s); both proxies on the new master {:.2} s after the promotion, deciding on Redis {:.2} s after it\n\
             manual failover: roles swapped {:.2} s after SENTINEL FAILOVER, both proxies on the new master after {:.2} s\n\
             load: {} requests, {} not 200; breaker openings per proxy {:?}\n\
             last writes before the kill: {last} admitted, {lost_in_failover} of them lost with the old master\n",
            promoted_after.as_secs_f64(),
            followed_after.as_secs_f64(),
            back_after_promotion.as_secs_f64(),
            roles_swapped_after.as_secs_f64(),
            second_followed_after.as_secs_f64(),
            samples.len(),
            failed.len(),
            openings,
        ),
    );
    remove_test_dir(&dir);
}

#[test]
fn sentinels_with_a_password_of_their_own_are_asked_with_it() {
    let mut group = SentinelGroup::start_guarded();
    let upstream = Upstream::start();
    let dir = temp_dir();
    let master_password = dir.join("redis.password");
    std::fs::write(&master_password, format!("{SENTINEL_PASSWORD}\n")).expect("password file");
    let sentinels_password = dir.join("sentinels.password");
    std::fs::write(&sentinels_password, SENTINELS_OWN_PASSWORD).expect("password file");
    assert_eq!(
        group.sentinels[0].query_without_password::<String>(&["PING"]),
        None,
        "the sentinels must refuse a client without their password"
    );
    let nodes: Vec<String> = group
        .sentinel_nodes()
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect();
    let proxy = |sentinel_password: &str| {
        ConfigBuilder::new(upstream.addr)
            .redis_lines(&format!(
                "sentinel = {{ master = \"{SENTINEL_MASTER}\", nodes = [{}], password_file = \"{}\"{sentinel_password} }}\ntimeout = \"50ms\"\non_failure = \"local\"\ninstances = 2\nleases = \"off\"",
                nodes.join(", "),
                master_password.display()
            ))
            .limit(Limit::fixed_window("per-client", "header:X-Client", 5, "1h"))
            .start()
    };
    let on_redis = |node: &RedisServer| node.keys().iter().any(|k| k.contains("per-client"));

    // Without the sentinels' password no master is found: the proxy
    // decides locally, says why, and writes nothing to the master.
    let without = proxy("");
    assert!(
        wait_until(Duration::from_secs(10), || without.log().contains("NOAUTH")),
        "the refusal is not logged: {}",
        without.log()
    );
    assert!(spend(&without, "unguarded", 10) > 0);
    assert!(
        !on_redis(&group.nodes[0]),
        "a proxy without the password reached the master"
    );
    drop(without);

    let with = proxy(&format!(
        ", sentinel_password_file = \"{}\"",
        sentinels_password.display()
    ));
    let found = format!(
        "master \"{SENTINEL_MASTER}\" is 127.0.0.1:{}",
        group.nodes[0].port
    );
    assert_eq!(spend(&with, "guarded", 10), 5, "decided on the master");
    assert!(with.log().contains(&found), "{}", with.log());
    assert!(on_redis(&group.nodes[0]));

    // The search after a promotion asks with it too.
    group.nodes[0].kill();
    assert!(
        wait_until(Duration::from_secs(30), || group.nodes[1].role()
            == "master"),
        "the replica was never promoted"
    );
    await_both(&[&with], "moved from", 1, "never followed the promotion");
    assert!(
        wait_until(Duration::from_secs(10), || {
            spend(&with, "after-promotion", 1);
            on_redis(&group.nodes[1])
        }),
        "decisions never came back to Redis: {}",
        with.log()
    );
    remove_test_dir(&dir);
}

#[test]
fn a_group_that_speaks_tls_only_is_followed_over_tls_with_its_ca() {
    let certificates = temp_dir();
    make_certificates(&certificates);
    let mut group = SentinelGroup::start_tls(&certificates);
    let upstream = Upstream::start();
    let dir = temp_dir();
    let password_file = dir.join("redis.password");
    std::fs::write(&password_file, SENTINEL_PASSWORD).expect("password file");
    let nodes: Vec<String> = group
        .sentinel_nodes()
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect();
    let proxy = |tls: &str| {
        ConfigBuilder::new(upstream.addr)
            .redis_lines(&format!(
                "sentinel = {{ master = \"{SENTINEL_MASTER}\", nodes = [{}], password_file = \"{}\"{tls} }}\ntimeout = \"50ms\"\non_failure = \"local\"\nleases = \"off\"",
                nodes.join(", "),
                password_file.display()
            ))
            .limit(Limit::fixed_window("per-client", "header:X-Client", 5, "1h"))
            .start()
    };
    let on_redis = |node: &RedisServer| node.keys().iter().any(|k| k.contains("per-client"));

    // Plain text to a TLS port, and TLS with a CA the proxy was not told to
    // trust (the system's roots do not know the test CA): no master is
    // found, the proxy decides locally and writes nothing to the master.
    for (tls, refusal) in [("", "Connection reset"), (", tls = true", "UnknownIssuer")] {
        let refused = proxy(tls);
        assert!(
            wait_until(Duration::from_secs(10), || {
                spend(&refused, "untrusted", 1);
                refused.log().contains(refusal)
            }),
            "{tls}: the refusal is not logged: {}",
            refused.log()
        );
        assert!(
            !on_redis(&group.nodes[0]),
            "{tls}: a proxy reached the master without TLS it trusts: {}",
            refused.log()
        );
    }

    let ca = certificates.join("ca.crt");
    let trusted = ConfigBuilder::new(upstream.addr)
        .redis_lines(&format!(
            "sentinel = {{ master = \"{SENTINEL_MASTER}\", nodes = [{}], password_file = \"{}\", tls = true }}\ntls_ca_file = \"{}\"\ntimeout = \"50ms\"\non_failure = \"local\"\nleases = \"off\"",
            nodes.join(", "),
            password_file.display(),
            ca.display()
        ))
        .limit(Limit::fixed_window("per-client", "header:X-Client", 5, "1h"))
        .start();
    assert_eq!(spend(&trusted, "over-tls", 10), 5, "decided on the master");
    assert!(on_redis(&group.nodes[0]), "{}", trusted.log());

    // A promotion is heard (the `+switch-master` subscription is TLS too)
    // and followed to the new master over TLS.
    group.nodes[0].kill();
    assert!(
        wait_until(Duration::from_secs(30), || group.nodes[1].role()
            == "master"),
        "the replica was never promoted"
    );
    await_both(&[&trusted], "moved from", 1, "never followed the promotion");
    assert!(
        wait_until(Duration::from_secs(10), || {
            spend(&trusted, "after-promotion", 1);
            // A replica is sent a script's effects, never the script.
            group.nodes[1].calls("evalsha") > 0
        }),
        "decisions never came back to Redis: {}",
        trusted.log()
    );
    remove_test_dir(&dir);
    remove_test_dir(&certificates);
}
