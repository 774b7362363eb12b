//! The Redis store end to end: real redis-server processes, several real
//! floodgate processes sharing them, a real upstream counting what arrives.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::redis_server::{RedisCluster, RedisServer};
use common::*;

fn redis_table(url: &str, extra: &str) -> String {
    format!("[redis]\nurl = \"{url}\"\ntimeout = \"2s\"\nclock = \"redis\"\n{extra}\n")
}

/// `n` GETs released together, spread round-robin over the proxies.
fn spread_burst(
    proxies: &[&Proxy],
    n: usize,
    path: &str,
    headers: &[(&str, &str)],
) -> Vec<Response> {
    let addrs: Vec<_> = proxies.iter().map(|p| p.addr).collect();
    burst(&addrs, n, "GET", path, headers)
}

fn no_5xx(responses: &[Response]) {
    let bad: Vec<u16> = responses
        .iter()
        .map(|r| r.status)
        .filter(|&s| s >= 500 || s == 0)
        .collect();
    assert!(bad.is_empty(), "failed answers: {bad:?}");
}

#[test]
fn three_proxies_share_one_token_bucket_exactly() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = format!(
        "{}[clients.api_keys]\n\"shared-key\" = \"free\"\n\"other-key\" = \"free\"\n\"third-key\" = \"free\"\n\n[[limits]]\nname = \"per-account\"\nkey = \"api_key\"\nalgorithm = \"token_bucket\"\ncapacity = 100\nrefill_rate = 1\n",
        redis_table(&redis.url(), "instances = 3")
    );
    let proxies: Vec<Proxy> = (0..3).map(|_| Proxy::start(&upstream, &body)).collect();
    let refs: Vec<&Proxy> = proxies.iter().collect();
    let mut figures = String::new();
    for key in ["shared-key", "other-key", "third-key"] {
        upstream.reset();
        let started = Instant::now();
        let responses = spread_burst(&refs, 600, "/", &[("X-API-Key", key)]);
        let elapsed = started.elapsed().as_secs();
        no_5xx(&responses);
        let admitted = count_status(&responses, 200);
        assert!(
            admitted >= 100 && admitted as u64 <= 100 + elapsed,
            "{key}: admitted {admitted} in {elapsed}s"
        );
        assert_eq!(upstream.count(), admitted, "{key}: the upstream agrees");
        assert_eq!(count_status(&responses, 429), 600 - admitted);
        figures.push_str(&format!(
            "{key}: 600 requests over 3 proxies in {:.2}s, {admitted} admitted (bound 100 + {elapsed}), upstream saw {}\n",
            started.elapsed().as_secs_f64(),
            upstream.count()
        ));
    }
    record("distributed_exactness", &figures);
}

#[test]
fn sliding_log_shared_by_three_proxies_never_exceeds_its_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = format!(
        "{}[[limits]]\nname = \"login\"\nkey = \"global\"\nalgorithm = \"sliding_log\"\nlimit = 20\nwindow = \"2s\"\n",
        redis_table(&redis.url(), "")
    );
    let proxies: Vec<Proxy> = (0..3).map(|_| Proxy::start(&upstream, &body)).collect();
    let refs: Vec<&Proxy> = proxies.iter().collect();
    // Three waves, 0.8 s apart: the first fills the log, the second finds it
    // full, the third comes when the first wave's stamps have left.
    let mut admitted_per_wave = Vec::new();
    let started = Instant::now();
    for wave in 0..4u32 {
        let due = Duration::from_millis(800) * wave;
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            thread::sleep(wait);
        }
        let responses = spread_burst(&refs, 90, "/", &[]);
        no_5xx(&responses);
        admitted_per_wave.push(count_status(&responses, 200));
    }
    assert_eq!(admitted_per_wave[0], 20, "{admitted_per_wave:?}");
    assert_eq!(
        admitted_per_wave[1] + admitted_per_wave[2],
        0,
        "{admitted_per_wave:?}"
    );
    assert!(admitted_per_wave[3] <= 20, "{admitted_per_wave:?}");
    // Upstream arrivals trail the decisions by a little; in no window even
    // slightly shorter than 2 s did more than 20 arrive.
    let mut arrivals: Vec<Instant> = upstream.seen().iter().map(|s| s.at).collect();
    arrivals.sort();
    for (i, &from) in arrivals.iter().enumerate() {
        let within = arrivals[i..]
            .iter()
            .take_while(|&&t| t - from < Duration::from_millis(1_900))
            .count();
        assert!(within <= 20, "{within} arrivals within 1.9 s");
    }
}

#[test]
fn proxies_with_disagreeing_clocks_share_one_budget_on_redis_time() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = format!(
        "{}[[limits]]\nname = \"hourly\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1h\"\n",
        redis_table(&redis.url(), "")
    );
    let ahead = Proxy::start_with(
        upstream.addr,
        &body,
        &[("FLOODGATE_CLOCK_OFFSET_MS", "3600000")],
    );
    let behind = Proxy::start_with(
        upstream.addr,
        &body,
        &[("FLOODGATE_CLOCK_OFFSET_MS", "-3600000")],
    );
    let statuses: Vec<u16> = (0..30)
        .map(|i| {
            if i % 2 == 0 {
                ahead.get("/").status
            } else {
                behind.get("/").status
            }
        })
        .collect();
    assert_eq!(count_code(&statuses, 200), 10, "{statuses:?}");
    assert_eq!(upstream.count(), 10);
}

#[test]
fn a_leaky_bucket_shared_by_two_proxies_spaces_all_arrivals() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = format!(
        "{}[[limits]]\nname = \"sms\"\nkey = \"global\"\nalgorithm = \"leaky_bucket\"\nrate = 10\ncapacity = 5\n",
        redis_table(&redis.url(), "")
    );
    let a = Proxy::start(&upstream, &body);
    let b = Proxy::start(&upstream, &body);
    let responses = spread_burst(&[&a, &b], 12, "/sms/send", &[]);
    no_5xx(&responses);
    assert_eq!(count_status(&responses, 200), 6);
    let mut arrivals: Vec<Instant> = upstream.seen().iter().map(|s| s.at).collect();
    arrivals.sort();
    for pair in arrivals.windows(2) {
        let gap = pair[1] - pair[0];
        // 100 ms apart by schedule; a few ms of forwarding jitter is scheduling.
        assert!(gap >= Duration::from_millis(90), "gap {gap:?}");
    }
}

#[test]
fn script_flush_between_requests_changes_nothing() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = format!(
        "{}[[limits]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"\n",
        redis_table(&redis.url(), "")
    );
    let proxy = Proxy::start(&upstream, &body);
    let mut statuses = Vec::new();
    for i in 0..8 {
        if i % 2 == 1 {
            let _: String = redis.cmd(&["SCRIPT", "FLUSH"]);
        }
        let r = proxy.get("/");
        statuses.push(r.status);
        if r.status == 200 {
            assert_eq!(
                r.header("RateLimit-Remaining"),
                Some((4 - i).to_string().as_str())
            );
        }
    }
    assert_eq!(statuses, vec![200, 200, 200, 200, 200, 429, 429, 429]);
}

#[test]
fn one_evalsha_per_request_and_keys_hold_no_user_input_and_expire() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = format!(
        "{}[clients]\ntrusted_proxies = [\"127.0.0.1/32\"]\n[clients.api_keys]\n\"secret-key-123\" = \"free\"\n\n[[limits]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 50\nrefill_rate = 100\n\n[[limits]]\nname = \"per-account\"\nkey = \"api_key\"\nalgorithm = \"sliding_window\"\nlimit = 50\nwindow = \"1s\"\n\n[[limits]]\nname = \"by-tenant\"\nkey = \"header:X-Tenant\"\nalgorithm = \"sliding_log\"\nlimit = 50\nwindow = \"1s\"\n",
        redis_table(&redis.url(), "key_prefix = \"fg\"")
    );
    let proxy = Proxy::start(&upstream, &body);
    // Warm up: the first call loads the script.
    assert_eq!(proxy.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let headers = [
        ("X-API-Key", "secret-key-123"),
        ("X-Tenant", "tenant {evil}:*"),
        ("X-Forwarded-For", "203.0.113.77"),
    ];
    for _ in 0..20 {
        assert_eq!(proxy.send("GET", "/", &headers).status, 200);
    }
    assert_eq!(redis.calls("evalsha"), 20);
    assert_eq!(redis.calls("eval") + redis.calls("script|load"), 0);

    let keys = redis.keys();
    // One key per layer of the client, plus maybe the warm-up's (short-lived).
    for name in ["fg:per-ip:", "fg:per-account:", "fg:by-tenant:"] {
        assert!(
            keys.iter().any(|k| k.starts_with(name)),
            "{name} missing: {keys:?}"
        );
    }
    assert!(keys.len() <= 4, "{keys:?}");
    for key in &keys {
        for raw in ["secret", "evil", "203.0.113", "127.0.0.1"] {
            assert!(!key.contains(raw), "{key} holds user input");
        }
        let (prefix, tag) = key.rsplit_once(':').expect("key shape");
        assert!(prefix.starts_with("fg:"), "{key}");
        assert!(
            tag.len() == 34 && tag.starts_with('{') && tag.ends_with('}'),
            "{key}"
        );
    }
    // Every key expires once its state is as good as fresh (here within 1 s,
    // the shortest TTL the scripts set).
    assert!(
        wait_until(Duration::from_secs(5), || redis.keys().is_empty()),
        "keys left: {:?}",
        redis.keys()
    );
}

#[test]
fn limits_hold_across_a_real_cluster_and_clients_spread_over_slots() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let body = format!(
        "[redis]\ncluster = [{}]\ntimeout = \"2s\"\n\n[[limits]]\nname = \"per-client\"\nkey = \"header:X-Client\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"\n\n[[limits]]\nname = \"per-client-burst\"\nkey = \"header:X-Client\"\nalgorithm = \"token_bucket\"\ncapacity = 100\nrefill_rate = 1\n\n[[limits]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"sliding_window\"\nlimit = 1000\nwindow = \"1h\"\n",
        urls.join(", ")
    );
    let a = Proxy::start(&upstream, &body);
    let b = Proxy::start(&upstream, &body);
    for client in 0..12 {
        let id = format!("client-{client}");
        let statuses: Vec<u16> = (0..8)
            .map(|i| {
                let p = if i % 2 == 0 { &a } else { &b };
                p.send("GET", "/", &[("X-Client", &id)]).status
            })
            .collect();
        assert_eq!(
            statuses,
            vec![200, 200, 200, 200, 200, 429, 429, 429],
            "{id}"
        );
    }
    let per_node: Vec<usize> = cluster.keys_per_node().iter().map(|k| k.len()).collect();
    assert_eq!(per_node.iter().sum::<usize>(), 12 * 2 + 1, "{per_node:?}");
    assert!(
        per_node.iter().filter(|&&n| n > 0).count() >= 2,
        "one slot for all: {per_node:?}"
    );
    // One client's layers share its slot: both its keys sit on one node.
    for keys in cluster.keys_per_node() {
        for key in keys.iter().filter(|k| k.contains("per-client:")) {
            let tag = key.rsplit_once(':').map(|(_, t)| t).unwrap_or_default();
            assert!(
                keys.iter()
                    .any(|k| k.contains("per-client-burst:") && k.ends_with(tag)),
                "{key}"
            );
        }
    }
}

#[test]
fn a_client_redis_refused_is_refused_locally_until_its_retry_time() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = format!(
        "{}[[limits]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 3\nrefill_rate = 2\n",
        redis_table(&redis.url(), "")
    );
    let proxy = Proxy::start(&upstream, &body);
    assert_eq!(proxy.get("/").status, 200);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let statuses: Vec<u16> = (0..22).map(|_| proxy.get("/").status).collect();
    assert_eq!(count_code(&statuses, 200), 2, "{statuses:?}");
    // Two admitted, one refused by Redis; the other 19 never reached it.
    assert_eq!(redis.calls("evalsha"), 3);
    // And the local answer is Redis's: a retry at the advertised time passes.
    let refused = proxy.get("/");
    assert_eq!(refused.status, 429);
    let ms = refused.retry_after_ms().expect("retry_after_ms");
    thread::sleep(Duration::from_millis(ms));
    assert_eq!(proxy.get("/").status, 200);
}

#[test]
fn a_password_in_the_url_and_rediss_with_a_private_ca() {
    let upstream = Upstream::start();
    let limit = "[[limits]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1h\"\n";

    let locked = RedisServer::start_with_password("s3cret");
    assert!(locked.url().contains(":s3cret@"));
    let proxy = Proxy::start(
        &upstream,
        &format!("{}{limit}", redis_table(&locked.url(), "")),
    );
    let statuses: Vec<u16> = (0..3).map(|_| proxy.get("/").status).collect();
    assert_eq!(statuses, vec![200, 200, 429]);
    assert_eq!(
        locked.keys().len(),
        1,
        "decided by the password-protected Redis"
    );

    let tls = RedisServer::start_tls();
    let ca = tls.tls_ca.clone().expect("ca");
    assert!(tls.url().starts_with("rediss://"));
    let extra = format!("tls_ca_file = \"{}\"", ca.display());
    let proxy = Proxy::start(
        &upstream,
        &format!("{}{limit}", redis_table(&tls.url(), &extra)),
    );
    let statuses: Vec<u16> = (0..3).map(|_| proxy.get("/").status).collect();
    assert_eq!(statuses, vec![200, 200, 429]);
    assert_eq!(tls.keys().len(), 1, "decided by the TLS Redis");
    assert!(
        !proxy.log().contains("deciding without it"),
        "{}",
        proxy.log()
    );
}

/// Decisions requested together share one script run: 50 requests waiting
/// at once cost Redis one EVALSHA (two on the very first call, which loads
/// the script), and the budget is still exact.
#[test]
fn concurrent_decisions_share_one_script_run() {
    use std::sync::Arc;

    use floodgate::algorithm::Algorithm;
    use floodgate::clock::SystemClock;
    use floodgate::identity::StateKey;
    use floodgate::limiter::redis::Topology;
    use floodgate::limiter::{
        Check, ClockSource, LimitName, OnFailure, RedisSettings, RedisStandalone, Store,
    };

    let redis = RedisServer::start();
    let limiter = RedisStandalone::new(
        RedisSettings {
            topology: Topology::Standalone(redis.url()),
            timeout: Duration::from_secs(5),
            clock: ClockSource::Redis,
            key_prefix: "together".into(),
            on_failure: OnFailure::Deny,
            instances: 1,
            tls_ca: None,
        },
        Arc::new(SystemClock),
    );
    let check = Check {
        layer: 0,
        name: LimitName::new("per-client"),
        algorithm: Algorithm::fixed_window(20, 3_600_000_000).expect("valid numbers"),
        key: StateKey {
            limit: 0,
            identity: 7,
        },
        cost: 1,
        shadow: false,
        on_failure: OnFailure::Deny,
    };
    let requests = vec![vec![check]; 50];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    // On one thread, all 50 are queued before the batch task first runs.
    let decided = runtime.block_on(futures_util::future::join_all(
        requests.iter().map(|checks| limiter.decide(checks)),
    ));
    let admitted = decided
        .iter()
        .filter(|d| d.as_ref().expect("decided")[0].allowed())
        .count();
    assert_eq!(admitted, 20);
    let remaining: Vec<u64> = decided
        .iter()
        .take(20)
        .map(|d| d.as_ref().expect("decided")[0].remaining())
        .collect();
    assert_eq!(remaining, (0..20).rev().collect::<Vec<u64>>());
    assert!(redis.calls("evalsha") <= 2, "{}", redis.calls("evalsha"));
}
