//! Clients as data, end to end on the real binary: API keys set, revoked
//! and imported through the admin API are served by every instance sharing
//! Redis within a second, survive restarts (Redis with persistence, or the
//! memory store's `clients_file`), keep serving while Redis is away, and bad
//! input changes nothing.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::admin_token::{TokenFile, TOKEN};
use common::load::ClientLoad;
use common::redis_server::{RedisCluster, RedisServer};
use common::{request, temp_dir, wait_until, ConfigBuilder, Limit, Proxy, Response, Upstream};
use serde_json::Value;

const SECRET: &str = "an-identity-secret-shared-by-every-instance";

/// A key no log, file or answer may ever show.
const KEY: &str = "sk_live_Zr4Qw8Pq2Lm9Xv7Tn5Jk3Hb1";

/// The tier a request is served at, read from its `RateLimit-Limit`: a
/// limit per address of 1,000 an hour, 2,000 for tier free, 3,000 for pro.
fn builder(upstream: &Upstream, token: &TokenFile) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .env("FLOODGATE_IDENTITY_SECRET", SECRET)
        .raw("[clients]\ntiers = [\"free\", \"pro\"]\n\n[clients.api_keys]\n\"file-key-0001\" = \"pro\"\n")
        .limit(
            Limit::fixed_window("per-ip", "ip", 1_000_000, "1m")
                .line("[limits.tiers.free]\nlimit = 2000000\n[limits.tiers.pro]\nlimit = 3000000"),
        )
        .raw(&token.section())
}

fn tier_served(addr: SocketAddr, key: &str) -> &'static str {
    let r = request(addr, "GET", "/", &[("X-API-Key", key)], b"");
    match r.header("ratelimit-limit") {
        Some("1000000") => "anonymous",
        Some("2000000") => "free",
        Some("3000000") => "pro",
        _ => "failed",
    }
}

fn call(admin: SocketAddr, method: &str, path: &str, body: &str) -> Response {
    let bearer = format!("Bearer {TOKEN}");
    let mut headers = vec![("Authorization", bearer.as_str())];
    if !body.is_empty() {
        headers.push(("Content-Type", "application/json"));
    }
    request(admin, method, path, &headers, body.as_bytes())
}

fn json(r: &Response) -> Value {
    serde_json::from_str(&r.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", r.status, r.body))
}

fn admin(proxy: &Proxy) -> SocketAddr {
    proxy.admin.expect("admin listener")
}

fn put(proxy: &Proxy, key: &str, tier: &str) -> Response {
    call(
        admin(proxy),
        "PUT",
        "/v1/api_keys",
        &format!(r#"{{"key": "{key}", "tier": "{tier}", "label": "customer-42"}}"#),
    )
}

/// Polls (never sleeps for a fixed time) until `addr` serves `key` at
/// `tier`; how long that took, or none within 1 s.
fn served_within_a_second(addr: SocketAddr, key: &str, tier: &str) -> Option<Duration> {
    let from = Instant::now();
    wait_until(Duration::from_secs(1), || tier_served(addr, key) == tier).then(|| from.elapsed())
}

fn assert_never_shown(proxy: &Proxy) {
    assert!(
        !proxy.log().contains(KEY),
        "the key in the log: {}",
        proxy.log()
    );
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario against real processes, read in the order it happens"
)]
fn a_key_set_on_one_instance_is_served_by_the_other_within_a_second_and_revoked_the_same_way() {
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let shared = builder(&upstream, &token).redis(&redis.url());
    let a = shared.start();
    let b = shared.start();
    assert_eq!(tier_served(b.addr, KEY), "anonymous");

    let r = put(&a, KEY, "pro");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(KEY), "{}", r.body);
    let hash = json(&r)["key_hash"].as_str().expect("key_hash").to_string();
    assert_eq!(hash.len(), 32);
    assert_eq!(json(&r)["kept_in"], "redis");
    // Served on A as soon as A answered, on B within a second.
    assert_eq!(tier_served(a.addr, KEY), "pro");
    assert!(
        served_within_a_second(b.addr, KEY, "pro").is_some(),
        "B: {}",
        b.log()
    );

    let seen = call(
        admin(&b),
        "GET",
        &format!("/v1/api_keys?key_hash={hash}"),
        "",
    );
    assert_eq!(seen.status, 200, "{}", seen.body);
    let seen = json(&seen);
    assert_eq!(seen["tier"], "pro");
    assert_eq!(seen["label"], "customer-42");
    assert_eq!(seen["source"], "run_time");
    assert!(
        seen["set_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{seen}"
    );
    // By the start of the hash, as logs print it.
    let short = format!("/v1/api_keys?key_hash=key%23{}", &hash[..8]);
    assert_eq!(json(&call(admin(&b), "GET", &short, ""))["tier"], "pro");
    // /v1/clients knows it by its hash too, at its tier.
    let client = call(
        admin(&b),
        "GET",
        &format!("/v1/clients?key_hash={}", &hash[..8]),
        "",
    );
    assert_eq!(client.status, 404, "keyed on ip only: {}", client.body);

    // Changed on B, served so on A.
    assert_eq!(put(&b, KEY, "free").status, 200);
    assert!(served_within_a_second(a.addr, KEY, "free").is_some());

    // Revoked on A: no key on B within a second, the file's key too.
    let r = call(admin(&a), "DELETE", &format!("/v1/api_keys?key={KEY}"), "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["revoked"], true);
    assert!(served_within_a_second(b.addr, KEY, "anonymous").is_some());
    assert_eq!(tier_served(b.addr, "file-key-0001"), "pro");
    let r = call(admin(&a), "DELETE", "/v1/api_keys?key=file-key-0001", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(served_within_a_second(b.addr, "file-key-0001", "anonymous").is_some());

    // Every change one line, by the key's label; the key itself nowhere.
    let label = format!("key#{}", &hash[..8]);
    assert!(
        a.log()
            .contains(&format!("api_key_set {label} tier pro (was unset)")),
        "{}",
        a.log()
    );
    assert!(a.log().contains(&format!("api_key_revoked {label}")));
    assert_eq!(
        a.metric("floodgate_client_changes_total{what=\"api_key_set\"}"),
        1.0
    );
    assert_eq!(
        a.metric("floodgate_client_changes_total{what=\"api_key_revoked\"}"),
        2.0
    );
    for proxy in [&a, &b] {
        assert_never_shown(proxy);
    }
    let stored: Vec<String> = redis.cmd(&["HKEYS", "floodgate:clients:api_keys"]);
    assert_eq!(stored.len(), 2);
    assert!(stored.contains(&hash));

    // Every proxy, then Redis, restarted: nothing lost.
    assert_eq!(put(&a, KEY, "pro").status, 200);
    drop((a, b));
    let mut redis = redis;
    redis.restart();
    let a = shared.start();
    let b = shared.start();
    for proxy in [&a, &b] {
        assert_eq!(tier_served(proxy.addr, KEY), "pro", "{}", proxy.log());
        assert_eq!(tier_served(proxy.addr, "file-key-0001"), "anonymous");
    }

    // Redis away: what was known keeps serving, a change is refused whole.
    redis.kill();
    let r = put(&a, "another-key-0002", "pro");
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(tier_served(a.addr, KEY), "pro");
    assert_eq!(tier_served(a.addr, "another-key-0002"), "anonymous");
    redis.restart();
    assert!(
        wait_until(Duration::from_secs(10), || put(
            &a,
            "another-key-0002",
            "pro"
        )
        .status
            == 200),
        "{}",
        a.log()
    );
    assert!(served_within_a_second(b.addr, "another-key-0002", "pro").is_some());
}

#[test]
fn on_a_cluster_keys_and_overrides_are_shared_and_outlive_their_masters_failover() {
    let mut cluster = RedisCluster::start_with_replicas(1);
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let shared = builder(&upstream, &token).redis_cluster(&cluster.urls());
    let a = shared.start();
    let b = shared.start();

    let r = put(&a, KEY, "pro");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["kept_in"], "redis");
    assert_eq!(tier_served(a.addr, KEY), "pro");
    assert!(
        served_within_a_second(b.addr, KEY, "pro").is_some(),
        "B: {}",
        b.log()
    );
    // One hash tag: the table, its version (and its overrides) on one master.
    let tagged = [
        "{floodgate:clients}:api_keys",
        "{floodgate:clients}:version",
    ];
    let holders: Vec<usize> = (0..3)
        .filter(|&i| {
            let keys = cluster.nodes[i].keys();
            tagged.iter().all(|k| keys.iter().any(|held| held == k))
        })
        .collect();
    assert_eq!(holders.len(), 1, "{:?}", cluster.keys_per_node());
    let victim = holders[0];

    // That master dies; its replica takes over.
    let heir = (3..cluster.nodes.len())
        .find(|&i| {
            let replication: String = cluster.nodes[i].cmd(&["INFO", "replication"]);
            replication.contains(&format!("master_port:{}", cluster.nodes[victim].port))
        })
        .expect("the master's replica");
    let survivors: Vec<usize> = (0..cluster.nodes.len()).filter(|&i| i != victim).collect();
    cluster.nodes[victim].kill();
    assert!(
        wait_until(Duration::from_secs(30), || cluster.nodes[heir].role()
            == "master"
            && survivors.iter().all(|&i| cluster.serves_all_slots(i))),
        "no replica was promoted"
    );
    // What was known kept serving, and changes go on once the slot's new
    // master answers.
    assert_eq!(tier_served(b.addr, KEY), "pro");
    assert!(
        wait_until(Duration::from_secs(20), || put(
            &b,
            "another-key-0002",
            "free"
        )
        .status
            == 200),
        "{}",
        b.log()
    );
    assert!(
        served_within_a_second(a.addr, "another-key-0002", "free").is_some(),
        "A: {}",
        a.log()
    );

    // Revoked on A: no key on B within a second.
    let r = call(admin(&a), "DELETE", &format!("/v1/api_keys?key={KEY}"), "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(served_within_a_second(b.addr, KEY, "anonymous").is_some());

    // An override raised on B moves A's limit within a second.
    let r = call(
        admin(&b),
        "PUT",
        "/v1/overrides",
        r#"{"limit": "per-ip", "ip": "127.0.0.1", "numbers": {"limit": 4000000, "window": "1m"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let limit_on_a = || {
        request(a.addr, "GET", "/", &[], b"")
            .header("ratelimit-limit")
            .map(str::to_string)
    };
    assert!(
        wait_until(Duration::from_secs(1), || limit_on_a().as_deref()
            == Some("4000000")),
        "{:?}",
        limit_on_a()
    );

    let kept: Vec<String> = cluster.nodes[heir].cmd(&["HKEYS", "{floodgate:clients}:api_keys"]);
    assert_eq!(kept.len(), 2);
    let overrides: Vec<String> =
        cluster.nodes[heir].cmd(&["HKEYS", "{floodgate:clients}:overrides"]);
    assert_eq!(overrides.len(), 1);
    for proxy in [&a, &b] {
        assert_never_shown(proxy);
    }
}

#[test]
fn a_missed_announcement_is_repaired_by_the_version() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let a = builder(&upstream, &token).redis(&redis.url()).start();
    // A change written to Redis the way the script writes it, but never
    // announced: A must find it by the version alone.
    let entry = r#"{"tier":"pro","set_at":1700000000}"#;
    let r = put(&a, "first-key-0001", "free");
    assert_eq!(r.status, 200, "{}", r.body);
    let hash_of_first = json(&r)["key_hash"].as_str().expect("hash").to_string();
    let _: i64 = redis.cmd(&["HSET", "floodgate:clients:api_keys", &hash_of_first, entry]);
    let _: i64 = redis.cmd(&["INCR", "floodgate:clients:version"]);
    assert!(
        wait_until(Duration::from_secs(5), || tier_served(
            a.addr,
            "first-key-0001"
        ) == "pro"),
        "{}",
        a.log()
    );
    assert!(a.log().contains("a change was missed"));
}

#[test]
fn the_memory_store_keeps_its_keys_in_its_file_across_a_reload_and_a_restart() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let dir = temp_dir();
    let file = dir.join("clients.json");
    let memory =
        builder(&upstream, &token).raw(&format!("clients_file = \"{}\"\n", file.display()));
    let proxy = memory.start();
    assert_eq!(put(&proxy, KEY, "pro").status, 200);
    let r = call(
        admin(&proxy),
        "DELETE",
        "/v1/api_keys?key=file-key-0001",
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["kept_in"], "file");
    let text = std::fs::read_to_string(&file).expect("the file is written");
    assert!(
        !text.contains(KEY) && !text.contains("file-key-0001"),
        "{text}"
    );

    proxy.signal("-HUP");
    proxy.await_log("reloaded", "no reload");
    assert_eq!(tier_served(proxy.addr, KEY), "pro");
    drop(proxy);

    let proxy = memory.start();
    assert_eq!(tier_served(proxy.addr, KEY), "pro", "{}", proxy.log());
    assert_eq!(tier_served(proxy.addr, "file-key-0001"), "anonymous");
    assert!(proxy
        .log()
        .contains("2 API key entries and 0 overrides loaded from"));
    assert_never_shown(&proxy);
    drop(proxy);
    common::remove_test_dir(&dir);
}

#[test]
fn bad_input_is_refused_naming_the_field_and_changes_nothing() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = builder(&upstream, &token).start();
    let at = admin(&proxy);
    let long_key = "k".repeat(257);
    let long_label = "l".repeat(129);
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("PUT", "/v1/api_keys", r#"{"key": "good-key-0001", "tier": "gold"}"#.into(), 400, "tier: no tier \"gold\""),
        ("PUT", "/v1/api_keys", r#"{"key": "good-key-0001", "tier": "anonymous"}"#.into(), 400, "tier: tier \"anonymous\""),
        ("PUT", "/v1/api_keys", r#"{"key": "good-key-0001"}"#.into(), 400, "tier: a tier is required"),
        ("PUT", "/v1/api_keys", r#"{"key": "has a space", "tier": "pro"}"#.into(), 400, "key: a key holds visible ASCII"),
        ("PUT", "/v1/api_keys", r#"{"key": "", "tier": "pro"}"#.into(), 400, "key: a key holds 1 to 256"),
        ("PUT", "/v1/api_keys", format!(r#"{{"key": "{long_key}", "tier": "pro"}}"#), 400, "key: a key holds 1 to 256"),
        ("PUT", "/v1/api_keys", r#"{"key": 12, "tier": "pro"}"#.into(), 400, "key: a string is expected"),
        ("PUT", "/v1/api_keys", r#"{"tier": "pro"}"#.into(), 400, "key: is required"),
        ("PUT", "/v1/api_keys", r#"{"key": "good-key-0001", "tier": "pro", "capacity": 5}"#.into(), 400, "capacity: unknown field"),
        ("PUT", "/v1/api_keys", format!(r#"{{"key": "good-key-0001", "tier": "pro", "label": "{long_label}"}}"#), 400, "label: a label is a string"),
        ("PUT", "/v1/api_keys", "{not json".into(), 400, "body: not JSON"),
        ("PUT", "/v1/api_keys", "[1]".into(), 400, "body: a JSON object"),
        ("POST", "/v1/api_keys/import", r#"{"keys": [{"key": "good-key-0001", "tier": "pro"}, {"key": "good-key-0002", "tier": "pro"}, {"key": "good-key-0003", "tier": "platinum"}]}"#.into(), 400, "keys[2].tier: no tier \"platinum\""),
        ("POST", "/v1/api_keys/import", r#"{"keys": [{"key": "good-key-0001", "tier": "pro"}, {"key": "good-key-0001", "tier": "free"}]}"#.into(), 400, "keys[1].key: the same key as keys[0]"),
        ("POST", "/v1/api_keys/import", r#"{"keys": []}"#.into(), 400, "keys: 1 to 10000 keys"),
        ("POST", "/v1/api_keys/import", r#"{"kees": []}"#.into(), 400, "kees: unknown field"),
        ("DELETE", "/v1/api_keys", String::new(), 400, "key_hash: name the key"),
        ("DELETE", "/v1/api_keys?key_hash=xyz", String::new(), 400, "key_hash: 32 hex digits"),
        ("DELETE", "/v1/api_keys?key=a%20b", String::new(), 400, "key: a key holds visible ASCII"),
        ("DELETE", "/v1/api_keys?key=good-key-0001&tier=pro", String::new(), 400, "tier: unknown parameter"),
        ("GET", "/v1/api_keys?key=good-key-0001", String::new(), 404, "no such key"),
        ("POST", "/v1/api_keys", String::new(), 405, "POST is not served"),
    ];
    for (method, path, body, status, reason) in &cases {
        let r = call(at, method, path, body);
        assert_eq!(r.status, *status, "{method} {path} {body}: {}", r.body);
        let answer = json(&r);
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|t| t.contains(reason)),
            "{method} {path} {body}: {answer}"
        );
    }
    // Ten thousand and one: too many, and nothing of them taken.
    let many: Vec<String> = (0..10_001)
        .map(|i| format!(r#"{{"key": "bulk-{i:05}", "tier": "free"}}"#))
        .collect();
    let r = call(
        at,
        "POST",
        "/v1/api_keys/import",
        &format!(r#"{{"keys": [{}]}}"#, many.join(",")),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body
            .contains("keys: 1 to 10000 keys per import, not 10001"),
        "{}",
        r.body
    );

    for key in ["good-key-0001", "good-key-0002", "bulk-00000"] {
        assert_eq!(tier_served(proxy.addr, key), "anonymous", "{key}");
    }
    for what in ["api_key_set", "api_key_revoked", "api_keys_imported"] {
        assert_eq!(
            proxy.metric(&format!(
                "floodgate_client_changes_total{{what=\"{what}\"}}"
            )),
            0.0
        );
    }
    assert_eq!(proxy.metric("floodgate_run_time_keys"), 0.0);

    // The same ten thousand, less one: all of them at once.
    let r = call(
        at,
        "POST",
        "/v1/api_keys/import",
        &format!(r#"{{"keys": [{}]}}"#, many[..10_000].join(",")),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["imported"], 10_000);
    assert_eq!(tier_served(proxy.addr, "bulk-09999"), "free");
    assert_eq!(proxy.metric("floodgate_run_time_keys"), 10_000.0);
}

/// The tier a key ends at after a thread's writes: the last one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Write {
    Tier(&'static str),
    Revoke,
}

#[test]
fn sixty_concurrent_changes_under_load_fail_no_request_and_the_last_write_wins() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let shared = builder(&upstream, &token).redis(&redis.url());
    let a = shared.start();
    let b = shared.start();
    let keys: Vec<String> = (0..60).map(|i| format!("concurrent-key-{i:02}")).collect();

    // 64 connections' worth of requests, with and without those keys.
    let load = ClientLoad::start(&[a.addr, b.addr], 64, "X-API-Key", &keys);
    assert!(wait_until(Duration::from_secs(10), || load.sent() > 200));

    // Sixty changers at once, each owning a key, writing three times
    // through alternating instances; the last write is the one that counts.
    let plan = |i: usize| -> [Write; 3] {
        let last = match i % 3 {
            0 => Write::Tier("pro"),
            1 => Write::Tier("free"),
            _ => Write::Revoke,
        };
        [Write::Tier("free"), Write::Tier("pro"), last]
    };
    let admins = [admin(&a), admin(&b)];
    let barrier = Arc::new(std::sync::Barrier::new(keys.len()));
    let changers: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let (key, barrier) = (key.clone(), barrier.clone());
            let writes = plan(i);
            thread::spawn(move || {
                barrier.wait();
                let mut statuses = Vec::new();
                for (n, write) in writes.iter().enumerate() {
                    let at = admins[(i + n) % 2];
                    let send = || match write {
                        Write::Tier(tier) => call(
                            at,
                            "PUT",
                            "/v1/api_keys",
                            &format!(r#"{{"key": "{key}", "tier": "{tier}"}}"#),
                        ),
                        Write::Revoke => call(at, "DELETE", &format!("/v1/api_keys?key={key}"), ""),
                    };
                    // The admin listener takes 8 connections per address:
                    // the others are closed unread, and sent again.
                    let mut r = send();
                    for _ in 0..500 {
                        if r.status != 0 {
                            break;
                        }
                        thread::sleep(Duration::from_millis(5));
                        r = send();
                    }
                    statuses.push(r.status);
                }
                statuses
            })
        })
        .collect();
    for changer in changers {
        assert_eq!(changer.join().expect("changer"), vec![200, 200, 200]);
    }
    let expected = |i: usize| match plan(i)[2] {
        Write::Tier(tier) => tier,
        Write::Revoke => "anonymous",
    };
    for proxy in [&a, &b] {
        for (i, key) in keys.iter().enumerate() {
            assert!(
                served_within_a_second(proxy.addr, key, expected(i)).is_some(),
                "{key} on {}: {} not {}",
                proxy.addr,
                tier_served(proxy.addr, key),
                expected(i)
            );
        }
    }
    let (sent, failed) = load.finish();
    assert!(sent > 500, "{sent}");
    assert_eq!(failed, 0, "of {sent}");
    assert_eq!(a.metric("floodgate_run_time_keys"), 60.0);
    assert_eq!(b.metric("floodgate_run_time_keys"), 60.0);
}

#[test]
fn the_example_script_onboards_upgrades_and_revokes_a_customer() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = builder(&upstream, &token)
        .limit(Limit::token_bucket("per-account", "api_key", 100, 10.0))
        .start();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/clients.sh");
    let out = std::process::Command::new("sh")
        .arg(&script)
        .env("ADMIN", format!("http://{}", admin(&proxy)))
        .env("TOKEN_FILE", &token.0)
        .env("KEY", KEY)
        .output()
        .expect("sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for step in [
        "\"tier\": \"free\"",
        "\"tier\": \"pro\"",
        "\"label\": \"launch week\"",
        "\"quota\": 5000",
        "\"removed\"",
        "\"revoked\": true",
    ] {
        assert!(stdout.contains(step), "{step}: {stdout}");
    }
    assert!(!stdout.contains(KEY), "{stdout}");
    assert_eq!(tier_served(proxy.addr, KEY), "anonymous");
    assert_eq!(
        proxy.metric("floodgate_client_changes_total{what=\"api_key_set\"}"),
        2.0
    );
    assert_eq!(
        proxy.metric("floodgate_client_changes_total{what=\"override_set\"}"),
        1.0
    );
    assert_never_shown(&proxy);
}
