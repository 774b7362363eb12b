//! floodgate as Envoy's rate limit service, end to end: the real binary
//! with `[rls]`, asked over gRPC by the client envoy-types generates (and
//! by Python's grpcio, with stubs compiled from the protos the crate
//! ships), on the memory store and on a real redis-server.

mod common;

use std::process::Command;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit::Unit, Code};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

/// A proxy serving the rate limit service on a port of its own, and a
/// client connected to it.
struct Rls {
    proxy: Proxy,
    addr: std::net::SocketAddr,
    runtime: tokio::runtime::Runtime,
    client: RateLimitServiceClient<Channel>,
}

fn start(config: ConfigBuilder) -> Rls {
    let addr = local_addr();
    let proxy = config.raw(&format!("[rls]\nlisten = \"{addr}\"\n")).start();
    connect(proxy, addr)
}

fn wait_for_listener(proxy: &Proxy, addr: std::net::SocketAddr) {
    assert!(
        wait_until(Duration::from_secs(10), || std::net::TcpStream::connect(
            addr
        )
        .is_ok()),
        "the rate limit service never listened: {}",
        proxy.log()
    );
}

fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn connect(proxy: Proxy, addr: std::net::SocketAddr) -> Rls {
    wait_for_listener(&proxy, addr);
    let runtime = client_runtime();
    let client = runtime
        .block_on(RateLimitServiceClient::connect(format!("http://{addr}")))
        .expect("connect to the rate limit service");
    Rls {
        proxy,
        addr,
        runtime,
        client,
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|&(key, value)| Entry {
                key: key.into(),
                value: value.into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn call(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: hits,
    }
}

impl Rls {
    fn ask(&mut self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        let mut request = tonic::Request::new(request);
        // Envoy's filter gives a call 20 ms by default; a test on a loaded
        // machine gets more, but a call that hangs still fails.
        request.set_timeout(Duration::from_secs(3));
        let client = &mut self.client;
        self.runtime
            .block_on(client.should_rate_limit(request))
            .map(tonic::Response::into_inner)
    }

    fn answer(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.ask(request).expect("an answer")
    }
}

fn per_address(capacity: u64) -> Limit {
    Limit::fixed_window("per_address", "descriptor:remote_address", capacity, "1h")
        .matching(r#"domain = "edge", descriptors = [["remote_address"]]"#)
}

fn code(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).expect("a known code")
}

fn status_codes(response: &RateLimitResponse) -> Vec<Code> {
    response
        .statuses
        .iter()
        .map(|s| Code::try_from(s.code).expect("a known code"))
        .collect()
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[test]
fn a_limit_on_remote_address_answers_ok_three_times_then_over_limit() {
    let upstream = Upstream::start();
    let mut rls = start(
        ConfigBuilder::new(upstream.addr)
            .admin()
            .limit(per_address(3)),
    );
    let client = || {
        call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
            0,
        )
    };
    for remaining in [2, 1, 0] {
        let answer = rls.answer(client());
        assert_eq!(code(&answer), Code::Ok, "{answer:?}");
        let status = &answer.statuses[0];
        assert_eq!(status.limit_remaining, remaining, "{answer:?}");
        let limit = status.current_limit.as_ref().expect("the limit is named");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("per_address", 3, Unit::Hour as i32)
        );
        assert!(header(&answer, "RateLimit-Policy").is_some(), "{answer:?}");
    }
    let refused = rls.answer(client());
    assert_eq!(code(&refused), Code::OverLimit, "{refused:?}");
    assert_eq!(status_codes(&refused), vec![Code::OverLimit]);
    let status = &refused.statuses[0];
    assert_eq!(status.limit_remaining, 0);
    let reset = status.duration_until_reset.expect("duration_until_reset");
    assert!(
        reset.seconds > 0 && reset.seconds <= 3600,
        "a window of an hour resets within it: {reset:?}"
    );
    let retry: u64 = header(&refused, "Retry-After")
        .expect("Retry-After offered")
        .parse()
        .expect("seconds");
    assert!(retry > 0 && retry <= 3600, "{retry}");
    // Another address has its own budget.
    let other = rls.answer(call(
        "edge",
        vec![descriptor(&[("remote_address", "10.0.0.2")])],
        0,
    ));
    assert_eq!(code(&other), Code::Ok);
    assert_eq!(other.statuses[0].limit_remaining, 2);
    // Counted as the gateway's layers are, and logged once, by address.
    assert_eq!(
        rls.proxy
            .metric(r#"floodgate_decisions_total{limit="per_address",outcome="refused"}"#),
        1.0
    );
    assert_eq!(
        rls.proxy
            .metric(r#"floodgate_decisions_total{limit="per_address",outcome="admitted"}"#),
        4.0
    );
    assert_eq!(
        rls.proxy
            .metric(r#"floodgate_rls_requests_total{code="over_limit"}"#),
        1.0
    );
    rls.proxy.await_log(
        "rate limited: rls domain=edge descriptor=[remote_address=10.0.0.1] limit=per_address retry_after_ms=",
        "the refusal is logged with the address and the limit",
    );
}

#[test]
fn one_refused_descriptor_charges_none_of_the_others() {
    let upstream = Upstream::start();
    let mut rls = start(
        ConfigBuilder::new(upstream.addr)
            .limit(per_address(10))
            .limit(
                Limit::fixed_window("login", "descriptor:path", 1, "1h")
                    .matching(r#"domain = "edge", descriptors = [["path", "/login"]]"#),
            ),
    );
    let both = || {
        call(
            "edge",
            vec![
                descriptor(&[("remote_address", "10.0.0.1")]),
                descriptor(&[("path", "/login")]),
            ],
            0,
        )
    };
    let first = rls.answer(both());
    assert_eq!(code(&first), Code::Ok, "{first:?}");
    let second = rls.answer(both());
    assert_eq!(code(&second), Code::OverLimit, "{second:?}");
    assert_eq!(status_codes(&second), vec![Code::Ok, Code::OverLimit]);
    // The address paid for the first call only: 10 - 1, and this one.
    let alone = rls.answer(call(
        "edge",
        vec![descriptor(&[("remote_address", "10.0.0.1")])],
        0,
    ));
    assert_eq!(alone.statuses[0].limit_remaining, 8, "{alone:?}");
}

#[test]
fn hits_addend_is_the_cost_and_a_descriptor_may_set_its_own() {
    let upstream = Upstream::start();
    let mut rls = start(ConfigBuilder::new(upstream.addr).limit(per_address(25)));
    let ten = || {
        call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
            10,
        )
    };
    let answers: Vec<(Code, u32)> = (0..3)
        .map(|_| {
            let a = rls.answer(ten());
            (code(&a), a.statuses[0].limit_remaining)
        })
        .collect();
    assert_eq!(
        answers,
        vec![(Code::Ok, 15), (Code::Ok, 5), (Code::OverLimit, 5)],
        "10 of 25, twice, then 10 more than the 5 left"
    );
    // The descriptor's own hits_addend wins over the call's; 0 looks
    // without charging.
    let mut own = descriptor(&[("remote_address", "10.0.0.1")]);
    own.hits_addend = Some(UInt64Value { value: 5 });
    let five = rls.answer(call("edge", vec![own.clone()], 10));
    assert_eq!(
        (code(&five), five.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
    own.hits_addend = Some(UInt64Value { value: 0 });
    let look = rls.answer(call("edge", vec![own], 10));
    assert_eq!(
        (code(&look), look.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
}

#[test]
fn one_descriptor_twice_in_a_call_is_charged_twice() {
    // Two checks of one state in one decision would each see it before the
    // other's charge: a way to pass twice for the price of once.
    let upstream = Upstream::start();
    let mut rls = start(ConfigBuilder::new(upstream.addr).limit(per_address(3)));
    let twice = || {
        call(
            "edge",
            vec![
                descriptor(&[("remote_address", "10.0.0.1")]),
                descriptor(&[("remote_address", "10.0.0.1")]),
            ],
            0,
        )
    };
    let first = rls.answer(twice());
    assert_eq!(code(&first), Code::Ok);
    assert_eq!(first.statuses[0].limit_remaining, 1, "{first:?}");
    let second = rls.answer(twice());
    assert_eq!(code(&second), Code::OverLimit, "{second:?}");
    assert_eq!(
        status_codes(&second),
        vec![Code::OverLimit, Code::OverLimit]
    );
}

#[test]
fn unknown_domains_and_descriptors_answer_ok_and_are_counted() {
    let upstream = Upstream::start();
    let mut rls = start(
        ConfigBuilder::new(upstream.addr)
            .admin()
            .limit(per_address(1))
            .limit(
                Limit::fixed_window("would_refuse", "global", 1, "1h")
                    .line("shadow = true")
                    .matching(r#"domain = "edge", descriptors = [["generic_key", "api"]]"#),
            ),
    );
    let unknown_domain = rls.answer(call(
        "elsewhere",
        vec![descriptor(&[("remote_address", "10.0.0.1")])],
        0,
    ));
    assert_eq!(code(&unknown_domain), Code::Ok);
    assert!(unknown_domain.statuses[0].current_limit.is_none());
    // Another shape of descriptor is another limit, even with the same
    // first entry.
    let unknown_descriptor = rls.answer(call(
        "edge",
        vec![descriptor(&[
            ("remote_address", "10.0.0.1"),
            ("path", "/x"),
        ])],
        0,
    ));
    assert_eq!(code(&unknown_descriptor), Code::Ok);
    assert_eq!(
        rls.proxy
            .metric(r#"floodgate_rls_unmatched_descriptors_total{reason="domain"}"#),
        1.0
    );
    assert_eq!(
        rls.proxy
            .metric(r#"floodgate_rls_unmatched_descriptors_total{reason="descriptor"}"#),
        1.0
    );
    // A shadow limit answers OK past its quota, and counts what it would
    // have refused.
    let api = || call("edge", vec![descriptor(&[("generic_key", "api")])], 0);
    for _ in 0..3 {
        assert_eq!(code(&rls.answer(api())), Code::Ok);
    }
    assert_eq!(
        rls.proxy
            .metric(r#"floodgate_decisions_total{limit="would_refuse",outcome="shadow_refused"}"#),
        2.0
    );
    rls.proxy.await_log(
        "shadow limit would refuse: rls domain=edge descriptor=[generic_key=api] limit=would_refuse",
        "a shadow refusal is logged",
    );
}

/// The resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn malformed_calls_get_a_grpc_error_or_ok_and_memory_stays_bounded() {
    let upstream = Upstream::start();
    let mut rls = start(ConfigBuilder::new(upstream.addr).limit(per_address(5)));
    let empty_domain = rls
        .ask(call("", vec![descriptor(&[("remote_address", "1")])], 0))
        .expect_err("an empty domain is an error");
    assert_eq!(empty_domain.code(), tonic::Code::InvalidArgument);
    let none = rls
        .ask(call("edge", Vec::new(), 0))
        .expect_err("no descriptor is an error");
    assert_eq!(none.code(), tonic::Code::InvalidArgument);
    let thousand = (0..1000)
        .map(|i| descriptor(&[("remote_address", &i.to_string())]))
        .collect();
    let many = rls
        .ask(call("edge", thousand, 0))
        .expect_err("1,000 descriptors are refused");
    assert_eq!(many.code(), tonic::Code::InvalidArgument, "{many:?}");
    // A value of 60,000 bytes, under the message limit (64 KiB, above
    // Envoy's 60 KiB of request headers): decided like any other (a value
    // an attacker makes long is no way around its limit).
    let before = rss_kib(rls.proxy.pid());
    let long = "a".repeat(60_000);
    let mut codes = Vec::new();
    for _ in 0..20 {
        codes.push(code(&rls.answer(call(
            "edge",
            vec![descriptor(&[("remote_address", &long)])],
            0,
        ))));
    }
    assert_eq!(
        codes.iter().filter(|c| **c == Code::Ok).count(),
        5,
        "{codes:?}"
    );
    assert_eq!(codes.iter().filter(|c| **c == Code::OverLimit).count(), 15);
    // Past the message limit: refused before it is decoded.
    for size in [70_000, 2_000_000] {
        let huge = rls
            .ask(call(
                "edge",
                vec![descriptor(&[("remote_address", &"b".repeat(size))])],
                0,
            ))
            .expect_err("a call over the message limit is refused");
        assert_eq!(huge.code(), tonic::Code::OutOfRange, "{huge:?}");
    }
    let after = rss_kib(rls.proxy.pid());
    assert!(
        after < before + 64 * 1024,
        "20 calls of 60 kB must not stay in memory: {before} KiB, then {after} KiB"
    );
    // And the service still answers.
    let fine = rls.answer(call(
        "edge",
        vec![descriptor(&[("remote_address", "2")])],
        0,
    ));
    assert_eq!(code(&fine), Code::Ok);
    assert!(rls.proxy.is_running());
}

#[test]
fn max_message_bytes_sets_the_largest_call() {
    let upstream = Upstream::start();
    let addr = local_addr();
    let mut rls = connect(
        ConfigBuilder::new(upstream.addr)
            .limit(per_address(5))
            .raw(&format!(
                "[rls]\nlisten = \"{addr}\"\nmax_message_bytes = 4096\n"
            ))
            .start(),
        addr,
    );
    let of = |size: usize| {
        call(
            "edge",
            vec![descriptor(&[("remote_address", &"c".repeat(size))])],
            0,
        )
    };
    assert_eq!(code(&rls.answer(of(3_000))), Code::Ok);
    let refused = rls.ask(of(5_000)).expect_err("over 4096 bytes");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
}

#[test]
fn a_burst_of_calls_on_a_new_connection_is_answered_whole() {
    // Sent before the server's SETTINGS arrive: streams past its limit are
    // refused, and past 20 refusals the connection is lost.
    let upstream = Upstream::start();
    let rls = start(ConfigBuilder::new(upstream.addr).limit(per_address(1000)));
    let codes = rls.runtime.block_on(async {
        let client = RateLimitServiceClient::connect(format!("http://{}", rls.addr))
            .await
            .expect("connect");
        let calls = (0..100).map(|i| {
            let mut client = client.clone();
            async move {
                let address = format!("10.0.1.{i}");
                let answer = client
                    .should_rate_limit(call(
                        "edge",
                        vec![descriptor(&[("remote_address", &address)])],
                        0,
                    ))
                    .await;
                answer.map(|a| code(a.get_ref())).map_err(|e| e.code())
            }
        });
        futures_util::future::join_all(calls).await
    });
    let answered = codes.iter().filter(|c| **c == Ok(Code::Ok)).count();
    assert_eq!(answered, 100, "{codes:?}");
}

/// 60 calls in flight at once on one client's bucket of 10, half through
/// each of two instances on one Redis: the race that a read, check and
/// write would lose. Returns (admitted, refused).
fn sixty_concurrent_calls_on_two_instances(bucket: Limit) -> (usize, usize) {
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    // Time stands still, so no refill can blur the count; and a loaded
    // machine's slow Redis call is waited for, not decided in process.
    let clock = TestClock::new();
    let config = ConfigBuilder::new(upstream.addr)
        .redis(&redis.url())
        .redis_lines("timeout = \"2s\"")
        .clock(&clock)
        .env(
            "FLOODGATE_IDENTITY_SECRET",
            "rls-shared-secret-for-the-test",
        )
        .limit(bucket.matching(r#"domain = "edge", descriptors = [["remote_address"]]"#));
    let a = start(config.clone());
    let b = start(config);
    let client = || {
        call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.9")])],
            0,
        )
    };
    let runtime = client_runtime();
    let codes = runtime.block_on(async {
        let connect = |addr: std::net::SocketAddr| async move {
            RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect to the rate limit service")
        };
        let (on_a, on_b) = (connect(a.addr).await, connect(b.addr).await);
        let calls = (0..60).map(|i| {
            let mut instance = if i % 2 == 0 {
                on_a.clone()
            } else {
                on_b.clone()
            };
            async move {
                let answer = instance.should_rate_limit(client()).await;
                code(answer.expect("an answer").get_ref())
            }
        });
        futures_util::future::join_all(calls).await
    });
    let admitted = codes.iter().filter(|c| **c == Code::Ok).count();
    let refused = codes.iter().filter(|c| **c == Code::OverLimit).count();
    (admitted, refused)
}

#[test]
fn two_instances_on_one_redis_share_one_budget_exactly() {
    let bucket = || Limit::token_bucket("per_address", "descriptor:remote_address", 10, 1.0);
    assert_eq!(
        sixty_concurrent_calls_on_two_instances(bucket().line("leases = \"off\"")),
        (10, 50),
        "every decision in Redis: 10 admitted across both instances, no more, no fewer"
    );
    // With leases (the default), a refusal may come while the other
    // instance's lease still holds tokens (docs/book/redis.md, Leases), but
    // nothing leased is ever admitted twice.
    let (admitted, refused) = sixty_concurrent_calls_on_two_instances(bucket());
    assert!(
        admitted <= 10 && admitted + refused == 60,
        "with leases: {admitted} admitted, {refused} refused"
    );
}

#[test]
fn with_redis_away_answers_follow_on_failure_and_none_hangs() {
    let upstream = Upstream::start();
    let mut redis = RedisServer::start();
    let mut rls = start(
        ConfigBuilder::new(upstream.addr)
            .redis(&redis.url())
            .redis_lines("timeout = \"50ms\"\non_failure = \"allow\"")
            .limit(per_address(100))
            .limit(
                Limit::fixed_window("login", "descriptor:path", 100, "1h")
                    .line("on_failure = \"deny\"")
                    .matching(r#"domain = "edge", descriptors = [["path", "/login"]]"#),
            ),
    );
    let address = || {
        call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
            0,
        )
    };
    let login = || call("edge", vec![descriptor(&[("path", "/login")])], 0);
    assert_eq!(code(&rls.answer(address())), Code::Ok);
    assert_eq!(code(&rls.answer(login())), Code::Ok);
    redis.kill();
    // The first call after the kill may be the one that finds Redis gone.
    assert!(
        wait_until(Duration::from_secs(10), || rls
            .ask(login())
            .is_err_and(|e| e.code() == tonic::Code::Unavailable)),
        "a limit that fails closed answers UNAVAILABLE once Redis is away: {}",
        rls.proxy.log()
    );
    for _ in 0..10 {
        // "allow": answered, OK.
        assert_eq!(code(&rls.answer(address())), Code::Ok);
        // "deny": UNAVAILABLE, so that Envoy's own failure_mode_deny
        // decides; never a hang past the call's deadline.
        let denied = rls.ask(login()).expect_err("fails closed");
        assert_eq!(denied.code(), tonic::Code::Unavailable, "{denied:?}");
    }
    redis.restart();
    assert!(
        wait_until(Duration::from_secs(20), || rls
            .ask(login())
            .is_ok_and(|a| code(&a) == Code::Ok)),
        "decisions come back to Redis: {}",
        rls.proxy.log()
    );
}

#[test]
fn a_reload_changes_the_limits_the_service_answers_with() {
    let upstream = Upstream::start();
    let addr = local_addr();
    let rls_section = format!("[rls]\nlisten = \"{addr}\"\n");
    let config = ConfigBuilder::new(upstream.addr).raw(&rls_section);
    let mut rls = connect(config.clone().limit(per_address(1)).start(), addr);
    let client = || {
        call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
            0,
        )
    };
    assert_eq!(code(&rls.answer(client())), Code::Ok);
    assert_eq!(code(&rls.answer(client())), Code::OverLimit);
    config
        .limit(per_address(5))
        .listen(rls.proxy.addr)
        .write_to(&rls.proxy.config_path);
    rls.proxy.signal("-HUP");
    rls.proxy.await_log("reloaded", "the reload is applied");
    let after = rls.answer(client());
    assert_eq!(code(&after), Code::Ok, "{after:?}");
    let limit = after.statuses[0].current_limit.as_ref().expect("named");
    assert_eq!(limit.requests_per_unit, 5);
}

#[test]
fn the_admin_api_shows_and_resets_a_descriptor_client() {
    let upstream = Upstream::start();
    let token = admin_token::TokenFile::new();
    let mut rls = start(
        ConfigBuilder::new(upstream.addr)
            .admin()
            .raw(&token.section())
            .limit(per_address(2)),
    );
    let client = || {
        call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.7")])],
            0,
        )
    };
    rls.answer(client());
    rls.answer(client());
    assert_eq!(code(&rls.answer(client())), Code::OverLimit);
    let admin = rls.proxy.admin.expect("admin");
    let auth = format!("Bearer {}", admin_token::TOKEN);
    let shown = request(
        admin,
        "GET",
        "/v1/clients?descriptor=remote_address:10.0.0.7",
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(shown.status, 200, "{}", shown.body);
    let shown: serde_json::Value = serde_json::from_str(&shown.body).expect("JSON");
    let limits = shown["limits"].as_array().expect("limits");
    assert_eq!(limits.len(), 1, "{shown}");
    assert_eq!(limits[0]["limit"], "per_address");
    assert_eq!(limits[0]["remaining"], 0);
    let reset = request(
        admin,
        "DELETE",
        "/v1/clients?descriptor=remote_address:10.0.0.7",
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_eq!(code(&rls.answer(client())), Code::Ok);
}

/// Where cargo keeps the envoy-types this build uses: its protos.
fn envoy_protos() -> std::path::PathBuf {
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc names its host");
    // For this platform only: the others' packages may not be downloaded.
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata is JSON");
    let manifest = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("envoy-types is a dependency");
    std::path::Path::new(manifest)
        .parent()
        .expect("the crate's directory")
        .join("proto")
}

/// `n` calls by Python's grpcio (over TLS trusting `ca`, when given; with
/// `token` as a bearer token, when given): one line per answer.
fn grpcio_calls(
    addr: std::net::SocketAddr,
    n: u32,
    ca: Option<&std::path::Path>,
    token: Option<&str>,
) -> Vec<String> {
    grpcio_calls_in_trace(addr, n, ca, token, None)
}

/// `grpcio_calls`, each call carrying `traceparent` when given.
fn grpcio_calls_in_trace(
    addr: std::net::SocketAddr,
    n: u32,
    ca: Option<&std::path::Path>,
    token: Option<&str>,
    traceparent: Option<&str>,
) -> Vec<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/rls_client.py");
    let out_dir = temp_dir();
    let mut python = Command::new("python3");
    python
        .arg(script)
        .arg(envoy_protos())
        .arg(&out_dir)
        .arg(addr.to_string())
        .arg(n.to_string());
    if let Some(ca) = ca {
        python.arg(ca);
    }
    match token {
        Some(token) => python.env("RLS_TOKEN", token),
        None => python.env_remove("RLS_TOKEN"),
    };
    match traceparent {
        Some(traceparent) => python.env("RLS_TRACEPARENT", traceparent),
        None => python.env_remove("RLS_TRACEPARENT"),
    };
    let output = python.output().expect("python3");
    remove_test_dir(&out_dir);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.lines().map(str::to_string).collect()
}

const FIVE_CALLS_ON_THREE: [&str; 5] = [
    "OK remaining=2 limit=per_address/3/HOUR",
    "OK remaining=1 limit=per_address/3/HOUR",
    "OK remaining=0 limit=per_address/3/HOUR",
    "OVER_LIMIT remaining=0 limit=per_address/3/HOUR",
    "OVER_LIMIT remaining=0 limit=per_address/3/HOUR",
];

/// Envoy's trace continues through the service: a server span whose parent
/// is the caller's, and beneath it the decision, refused at the fourth call.
#[test]
fn a_call_in_envoys_trace_gets_its_server_and_decision_spans() {
    let upstream = Upstream::start();
    let receiver = common::otlp::OtlpReceiver::start();
    let rls = start(
        ConfigBuilder::new(upstream.addr)
            .raw(&format!(
                "[tracing]\nendpoint = \"{}\"\n",
                receiver.grpc_endpoint()
            ))
            .limit(per_address(3)),
    );
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let parent = format!("00-{trace_id}-b7ad6b7169203331-01");
    let answers = grpcio_calls_in_trace(rls.addr, 4, None, None, Some(&parent));
    assert_eq!(answers, FIVE_CALLS_ON_THREE[..4]);
    let arrived = wait_until(Duration::from_secs(10), || {
        receiver
            .spans()
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .count()
            >= 8
    });
    let spans = receiver.spans();
    assert!(arrived, "{spans:#?}");
    let servers: Vec<_> = spans.iter().filter(|s| s.kind == 2).collect();
    assert_eq!(servers.len(), 4);
    for server in &servers {
        assert_eq!(server.parent_span_id, "b7ad6b7169203331");
        assert_eq!(
            server.name,
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        );
        assert_eq!(server.attr_str("rpc.system"), Some("grpc"));
    }
    let mut decisions: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "ratelimit.decision")
        .collect();
    decisions.sort_by_key(|s| s.start_ns);
    assert_eq!(decisions.len(), 4);
    let limited: Vec<_> = decisions
        .iter()
        .map(|d| d.attr("ratelimit.limited").and_then(|v| v.as_bool()))
        .collect();
    assert_eq!(limited, [Some(false), Some(false), Some(false), Some(true)]);
    let refused = decisions[3];
    assert!(servers.iter().any(|s| s.span_id == refused.parent_span_id));
    assert_eq!(
        refused.attr_str("ratelimit.limit_name"),
        Some("per_address")
    );
    assert_eq!(refused.attr_str("ratelimit.namespace"), Some("edge"));
    assert!(refused
        .attr("ratelimit.retry_after_secs")
        .and_then(|v| v.as_f64())
        .is_some_and(|s| s > 0.0));
}

#[test]
fn python_grpcio_with_stubs_compiled_from_the_shipped_protos_is_answered() {
    let upstream = Upstream::start();
    let rls = start(ConfigBuilder::new(upstream.addr).limit(per_address(3)));
    assert_eq!(grpcio_calls(rls.addr, 5, None, None), FIVE_CALLS_ON_THREE);
}

/// A caller refused call after call writes one line per descriptor and
/// limit every 10 s, the metric counting each refusal (every refusal was a
/// line before: 57 here).
#[test]
fn refusals_are_logged_once_per_descriptor_and_limit_and_interval() {
    let upstream = Upstream::start();
    let rls = start(
        ConfigBuilder::new(upstream.addr)
            .admin()
            .limit(per_address(3)),
    );
    let answers = grpcio_calls(rls.addr, 60, None, None);
    let refused = answers
        .iter()
        .filter(|a| a.starts_with("OVER_LIMIT"))
        .count();
    assert_eq!(refused, 57, "{answers:?}");
    assert_eq!(
        rls.proxy
            .metric(r#"floodgate_decisions_total{limit="per_address",outcome="refused"}"#),
        57.0
    );
    rls.proxy.await_log(
        "limit=per_address retry_after_ms=",
        "the first refusal is logged",
    );
    let log = rls.proxy.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("rate limited: rls"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].ends_with("unlogged_since_last=0"), "{}", lines[0]);
}

#[test]
fn over_tls_with_the_servers_certificates_while_handshakes_stall() {
    let upstream = Upstream::start();
    let dir = temp_dir();
    make_certificates(&dir);
    let (rls, gateway_tls) = (local_addr(), local_addr());
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(per_address(3))
        .raw(&format!(
            "[server.tls]\nlisten = \"{gateway_tls}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            dir.join("server.crt").display(),
            dir.join("server.key").display()
        ))
        .raw(&format!("[rls]\nlisten = \"{rls}\"\ntls = true\n"))
        .start();
    wait_for_listener(&proxy, rls);
    // Connections that never send a ClientHello: each handshake waits in
    // a task of its own, so none of them delays the client that does.
    let stalled: Vec<_> = (0..50)
        .filter_map(|_| std::net::TcpStream::connect(rls).ok())
        .collect();
    assert_eq!(stalled.len(), 50);
    assert_eq!(
        grpcio_calls(rls, 5, Some(&dir.join("ca.crt")), None),
        FIVE_CALLS_ON_THREE
    );
    // Cleartext HTTP/2 is not served on a TLS listener.
    let runtime = client_runtime();
    let cleartext = runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{rls}"))
            .await
            .map_err(|e| e.to_string())?;
        let mut request = tonic::Request::new(call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.2")])],
            0,
        ));
        request.set_timeout(Duration::from_secs(3));
        client
            .should_rate_limit(request)
            .await
            .map_err(|e| e.to_string())
    });
    assert!(cleartext.is_err(), "h2c answered on the TLS listener");
    drop(stalled);
    drop(proxy);
    remove_test_dir(&dir);
}

// ---------------------------------------------------------------------------
// The listener under attack: what no gRPC client would send.

/// The path of `ShouldRateLimit`, as gRPC writes it.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The grpc-status a call over raw HTTP/2 was answered with: in its only
/// header block, or in its trailers.
async fn grpc_status(response: h2::client::ResponseFuture) -> Result<Option<u32>, h2::Error> {
    let parse = |map: &http::HeaderMap| {
        map.get("grpc-status")
            .and_then(|s| s.to_str().ok())
            .and_then(|s| s.parse().ok())
    };
    let response = response.await?;
    if let Some(code) = parse(response.headers()) {
        return Ok(Some(code));
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok(body.trailers().await?.as_ref().and_then(parse))
}

/// What a connection of half-sent calls came to.
struct HalfSent {
    /// Each call's grpc-status, in order.
    codes: Vec<Option<u32>>,
    /// The streams the server let the connection have open at once.
    max_streams: usize,
}

/// `calls` calls on one HTTP/2 connection, each sending the 5-byte prefix
/// of a message it says is `declared` bytes long, and nothing more.
async fn half_sent_calls(
    addr: std::net::SocketAddr,
    calls: usize,
    declared: u32,
) -> Result<HalfSent, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (sender, connection) = h2::client::handshake(tcp)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut sender = sender.ready().await.map_err(|e| e.to_string())?;
    let mut pending = Vec::new();
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&declared.to_be_bytes());
    for _ in 0..calls {
        sender = sender.ready().await.map_err(|e| e.to_string())?;
        let request = http::Request::post(format!("http://{addr}{SHOULD_RATE_LIMIT}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .map_err(|e| e.to_string())?;
        let (response, mut stream) = sender
            .send_request(request, false)
            .map_err(|e| e.to_string())?;
        stream
            .send_data(bytes::Bytes::from(prefix.clone()), false)
            .map_err(|e| e.to_string())?;
        // The stream stays open: the rest of the message never comes.
        pending.push((response, stream));
    }
    let mut codes = Vec::new();
    let mut open = Vec::new();
    for (response, stream) in pending {
        codes.push(grpc_status(response).await.map_err(|e| e.to_string())?);
        open.push(stream);
    }
    Ok(HalfSent {
        codes,
        max_streams: sender.current_max_send_streams(),
    })
}

#[test]
fn half_sent_calls_are_refused_at_once_and_hold_no_memory() {
    let upstream = Upstream::start();
    let mut rls = start(ConfigBuilder::new(upstream.addr).limit(per_address(5)));
    let pid = rls.proxy.pid();
    let addr = rls.addr;
    // Warm: the first calls allocate what every call reuses.
    assert_eq!(
        code(&rls.answer(call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
            0
        ))),
        Code::Ok
    );
    let before = rss_kib(pid);
    // 60 connections at once, 17 calls each: 1,020 calls, each saying a
    // message of 1 MiB follows, each 5 bytes of it sent.
    let attack = std::thread::spawn(move || {
        client_runtime().block_on(async move {
            let connections = (0..60).map(|_| half_sent_calls(addr, 17, 1 << 20));
            tokio::time::timeout(
                Duration::from_secs(30),
                futures_util::future::join_all(connections),
            )
            .await
        })
    });
    let mut peak = before;
    while !attack.is_finished() {
        peak = peak.max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(5));
    }
    peak = peak.max(rss_kib(pid));
    let connections = attack
        .join()
        .expect("the attack's thread")
        .expect("every call answered in 30 s");
    let mut codes = std::collections::BTreeMap::new();
    let mut max_streams = 0;
    for connection in connections {
        let connection = connection.expect("a connection of half-sent calls");
        max_streams = max_streams.max(connection.max_streams);
        for c in connection.codes {
            *codes.entry(c).or_insert(0) += 1;
        }
    }
    record(
        "rls_half_sent_calls",
        &format!(
            "1,020 calls of 1 MiB declared, 5 bytes sent, on 60 connections: RSS {before} KiB before, peak {peak} KiB; grpc-status {codes:?}; {max_streams} streams per connection\n"
        ),
    );
    // RESOURCE_EXHAUSTED (8) or OUT_OF_RANGE (11): refused on the prefix,
    // not when the call's deadline ends it.
    let refused =
        codes.get(&Some(8)).copied().unwrap_or(0) + codes.get(&Some(11)).copied().unwrap_or(0);
    assert_eq!(refused, 1020, "grpc-status of the calls: {codes:?}");
    assert!(
        peak < before + 32 * 1024,
        "1,020 half-sent calls took RSS from {before} KiB to {peak} KiB"
    );
    assert!(
        (1..=100).contains(&max_streams),
        "{max_streams} streams per connection"
    );
    // And real calls are answered as before.
    assert_eq!(
        code(&rls.answer(call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
            0
        ))),
        Code::Ok
    );
    assert!(rls.proxy.is_running());
}

/// Whether `stream` was closed by the server: EOF or a reset, read
/// without waiting so that many are polled in turn.
fn closed_by_server(stream: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    let _ = stream.set_nonblocking(true);
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            // What the server says before it closes (its SETTINGS).
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Polls `held` until at most `left` of them are open (or `limit`
/// passes); how many are still open.
fn open_after(held: &mut [(std::net::TcpStream, bool)], left: usize, limit: Duration) -> usize {
    let count = |held: &mut [(std::net::TcpStream, bool)]| {
        for (stream, closed) in held.iter_mut() {
            if !*closed {
                *closed = closed_by_server(stream);
            }
        }
        held.iter().filter(|(_, closed)| !closed).count()
    };
    wait_until(limit, || count(held) <= left);
    count(held)
}

/// `n` TCP connections to `addr` made at once, from 60 threads.
fn connect_many(addr: std::net::SocketAddr, n: usize) -> Vec<std::net::TcpStream> {
    connect_many_sending(addr, n, &[])
}

/// `n` TCP connections to `addr` made at once, from 60 threads, each
/// sending `first` as soon as it connects: its bytes are in before the
/// server's deadline from the accept can pass, however loaded the machine.
fn connect_many_sending(
    addr: std::net::SocketAddr,
    n: usize,
    first: &[u8],
) -> Vec<std::net::TcpStream> {
    use std::io::Write;
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..60)
            .map(|t| {
                s.spawn(move || {
                    (0..n)
                        .skip(t)
                        .step_by(60)
                        .filter_map(|_| {
                            let mut stream =
                                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                                    .ok()?;
                            if !first.is_empty() {
                                stream.write_all(first).ok()?;
                            }
                            Some(stream)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a connecting thread"))
            .collect()
    })
}

/// HTTP/2's connection preface, and an empty SETTINGS frame.
const PREFACE_AND_SETTINGS: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[test]
fn connections_without_a_preface_and_idle_ones_are_closed_in_time() {
    let upstream = Upstream::start();
    let rls = start(
        ConfigBuilder::new(upstream.addr)
            .admin()
            .server("header_timeout = \"1s\"\nkeepalive_timeout = \"2s\"")
            .limit(per_address(1000)),
    );
    // 60 that send the preface and their settings and then nothing, 60
    // that send half the preface, 60 that send nothing. The idle ones
    // send at once: a preface late past `header_timeout` would be a
    // header timeout, not an idle one.
    let mut idle = connect_many_sending(rls.addr, 60, PREFACE_AND_SETTINGS);
    let mut half = connect_many_sending(rls.addr, 60, &PREFACE_AND_SETTINGS[..12]);
    let mut silent = connect_many(rls.addr, 60);
    let mut held: Vec<(std::net::TcpStream, bool)> = silent
        .drain(..)
        .chain(half.drain(..))
        .map(|s| (s, false))
        .collect();
    assert_eq!(held.len(), 120);
    // Meanwhile a connection in use is not idle: a call on it every turn.
    let runtime = client_runtime();
    let mut active = runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(rls.addr)
            .await
            .expect("connect");
        let (sender, connection) = h2::client::handshake(tcp).await.expect("handshake");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        sender
    });
    let whole_call = || {
        let message = prost::Message::encode_to_vec(&call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.3")])],
            0,
        ));
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        bytes::Bytes::from(framed)
    };
    let call_on = |sender: &mut h2::client::SendRequest<bytes::Bytes>| {
        runtime.block_on(async {
            let mut ready = sender.clone().ready().await.map_err(|e| e.to_string())?;
            let request = http::Request::post(format!("http://{}{SHOULD_RATE_LIMIT}", rls.addr))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .map_err(|e| e.to_string())?;
            let (response, mut stream) = ready
                .send_request(request, false)
                .map_err(|e| e.to_string())?;
            stream
                .send_data(whole_call(), true)
                .map_err(|e| e.to_string())?;
            tokio::time::timeout(Duration::from_secs(3), grpc_status(response))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        })
    };
    assert_eq!(call_on(&mut active), Ok(Some(0)));
    let mut calls_made = 0;
    let count_idle = |idle: &mut Vec<std::net::TcpStream>| {
        idle.iter_mut()
            .map(|s| usize::from(!closed_by_server(s)))
            .sum::<usize>()
    };
    let mut idle_open = idle.len();
    let quiet = wait_until(Duration::from_secs(10), || {
        calls_made += 1;
        assert_eq!(
            call_on(&mut active),
            Ok(Some(0)),
            "a connection in use is kept: {}",
            rls.proxy.log()
        );
        idle_open = count_idle(&mut idle);
        open_after(&mut held, 0, Duration::ZERO) == 0 && idle_open == 0
    });
    let unpreface = open_after(&mut held, 0, Duration::ZERO);
    record(
        "rls_idle_connections",
        &format!(
            "header_timeout 1s, keepalive_timeout 2s, polled for 10 s at most: of 120 connections without a whole preface {unpreface} open; of 60 idle after their preface {idle_open} open; one connection with a call every turn ({calls_made} calls) kept\n"
        ),
    );
    assert!(
        quiet,
        "{unpreface} of 120 connections without a preface, {idle_open} of 60 idle ones still open after 10 s"
    );
    assert!(rls.proxy.metric("floodgate_rls_header_timeouts_total") >= 120.0);
    assert!(rls.proxy.metric("floodgate_rls_idle_timeouts_total") >= 60.0);
    // The connection in use was never closed under its calls.
    assert_eq!(call_on(&mut active), Ok(Some(0)));
}

/// A proxy serving the rate limit service with `rls_lines` in `[rls]`,
/// once it listens and holds no connection (its own probe gone).
fn serve(config: ConfigBuilder, rls_lines: &str) -> (Proxy, std::net::SocketAddr) {
    let addr = local_addr();
    let proxy = config
        .raw(&format!("[rls]\nlisten = \"{addr}\"\n{rls_lines}\n"))
        .start();
    wait_for_listener(&proxy, addr);
    wait_until(Duration::from_secs(5), || {
        proxy.metric("floodgate_rls_connections_open") == 0.0
    });
    (proxy, addr)
}

/// How many of `n` connections made at once to `addr` stay open (the
/// others are closed at once by a cap), polled until `expected` are.
fn held_of(addr: std::net::SocketAddr, n: usize, expected: usize) -> usize {
    let mut held: Vec<(std::net::TcpStream, bool)> = connect_many(addr, n)
        .into_iter()
        .map(|s| (s, false))
        .collect();
    assert_eq!(held.len(), n, "every connection accepted");
    open_after(&mut held, expected, Duration::from_secs(5))
}

#[test]
fn the_gateways_connection_caps_apply_to_the_service_unless_it_sets_its_own() {
    let upstream = Upstream::start();
    let config = || {
        ConfigBuilder::new(upstream.addr)
            .admin()
            .server("header_timeout = \"30s\"\nmax_connections_per_ip = 5")
            .limit(per_address(10))
    };
    // [server]'s caps, by default.
    let (proxy, addr) = serve(config(), "");
    let held = held_of(addr, 60, 5);
    record(
        "rls_connection_caps",
        &format!("[server].max_connections_per_ip = 5: {held} of 60 connections at once held\n"),
    );
    assert_eq!(
        held, 5,
        "[server].max_connections_per_ip = 5: {held} of 60 held"
    );
    assert!(
        proxy.metric("floodgate_rls_connections_refused_total{cap=\"per_ip\"}") >= 55.0,
        "{}",
        proxy.admin_get("/metrics").body
    );
    drop(proxy);
    // [rls]'s own.
    let (proxy, addr) = serve(config(), "max_connections_per_ip = 12");
    assert_eq!(
        held_of(addr, 60, 12),
        12,
        "[rls].max_connections_per_ip = 12"
    );
    drop(proxy);
    let (proxy, addr) = serve(config(), "max_connections_per_ip = 40\nmax_connections = 8");
    assert_eq!(held_of(addr, 60, 8), 8, "[rls].max_connections = 8");
    assert!(proxy.metric("floodgate_rls_connections_refused_total{cap=\"total\"}") >= 52.0);
}

/// How many of `n` GETs on fresh connections the gateway answers, each
/// given a few seconds.
fn gateway_answers(addr: std::net::SocketAddr, n: usize) -> usize {
    use std::io::{Read, Write};
    (0..n)
        .filter(|_| {
            let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            else {
                return false;
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
            if s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .is_err()
            {
                return false;
            }
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
            answer.starts_with(b"HTTP/1.1 200")
        })
        .count()
}

#[test]
fn a_flood_of_idle_connections_to_the_service_leaves_the_gateway_its_descriptors() {
    let upstream = Upstream::start();
    let addr = local_addr();
    // 200 descriptors; the caps of [server] (20 per address) apply to the
    // service.
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .server("header_timeout = \"30s\"\nmax_connections_per_ip = 20")
        .limit(per_address(10))
        .raw(&format!("[rls]\nlisten = \"{addr}\"\n"))
        .start_wrapped(&["prlimit", "--nofile=200:200"]);
    wait_for_listener(&proxy, addr);
    let held = connect_many(addr, 240);
    let answered = gateway_answers(proxy.addr, 5);
    let log = proxy.log();
    let exhausted = log.contains("Too many open files");
    record(
        "rls_fd_flood",
        &format!(
            "nofile 200, 240 idle connections opened to the rate limit service and kept by the client: the gateway answered {answered} of 5; \"Too many open files\" in the log: {exhausted}\n"
        ),
    );
    assert_eq!(answered, 5, "the gateway answered {answered} of 5: {log}");
    assert!(!exhausted, "{log}");
    drop(held);
}

/// How many calls the service admits of one per address, each a
/// descriptor of `rest` and then `remote_address`.
fn admitted(rls: &mut Rls, addresses: &[String], rest: &[(&str, &str)]) -> usize {
    addresses
        .iter()
        .filter(|address| {
            let mut entries = rest.to_vec();
            entries.push(("remote_address", address.as_str()));
            code(&rls.answer(call("edge", vec![descriptor(&entries)], 0))) == Code::Ok
        })
        .count()
}

#[test]
fn remote_address_is_read_as_an_address_and_grouped_as_the_gateway_groups_clients() {
    let upstream = Upstream::start();
    let token = admin_token::TokenFile::new();
    let mut rls = start(
        ConfigBuilder::new(upstream.addr)
            .admin()
            .raw(&token.section())
            .limit(per_address(5))
            .limit(
                Limit::fixed_window("login", "descriptor", 2, "1h").matching(
                    r#"domain = "edge", descriptors = [["generic_key", "login"], ["remote_address"]]"#,
                ),
            ),
    );
    // 200 addresses of one /64 ([clients].ipv6_prefix, 64 by default).
    let network: Vec<String> = (0..200u32)
        .map(|i| {
            format!(
                "2001:db8:1:2:{:x}:{:x}:{:x}:{:x}",
                i * 7919 % 65536,
                i,
                i ^ 0x55,
                i + 1
            )
        })
        .collect();
    let of_network = admitted(&mut rls, &network, &[]);
    // Five spellings of one IPv6 address and five of one IPv4 address, each
    // asked twice.
    let v6 = [
        "2001:db8:5::1",
        "2001:DB8:5::1",
        "2001:db8:5:0::1",
        "2001:0db8:0005:0000:0000:0000:0000:0001",
        "2001:db8:5:0:0:0:0:1",
    ];
    let v4 = [
        "192.0.2.7",
        "::ffff:192.0.2.7",
        "::FFFF:C000:207",
        "0:0:0:0:0:ffff:192.0.2.7",
        "::ffff:c000:0207",
    ];
    let twice = |spellings: &[&str]| -> Vec<String> {
        spellings
            .iter()
            .chain(spellings)
            .map(|s| s.to_string())
            .collect()
    };
    let of_v6 = admitted(&mut rls, &twice(&v6), &[]);
    let of_v4 = admitted(&mut rls, &twice(&v4), &[]);
    // A limit keyed on the whole descriptor reads the address the same way.
    let logins = admitted(&mut rls, &twice(&v4[..3]), &[("generic_key", "login")]);
    // A value that is no address keeps a budget of its own, by its text.
    let text = |s: &str| vec![s.to_string(); 6];
    let of_text = admitted(&mut rls, &text("pipe:/run/envoy.sock"), &[]);
    let of_other_text = admitted(&mut rls, &text("Pipe:/run/envoy.sock"), &[]);
    record(
        "rls_remote_address",
        &format!(
            "limit 5 per remote_address: 200 addresses of one /64 admitted {of_network}; 5 spellings of one IPv6 address x2 admitted {of_v6}; 5 spellings of one IPv4 address x2 admitted {of_v4}; key \"descriptor\" (limit 2), 3 spellings x2 admitted {logins}\n"
        ),
    );
    assert_eq!(
        of_network, 5,
        "200 addresses of one /64 got {of_network} calls"
    );
    assert_eq!(of_v6, 5, "five spellings of one IPv6 address got {of_v6}");
    assert_eq!(of_v4, 5, "five spellings of one IPv4 address got {of_v4}");
    assert_eq!(logins, 2, "key = \"descriptor\": {logins}");
    assert_eq!((of_text, of_other_text), (5, 5));
    // The refusal log names the network, as the gateway's does.
    rls.proxy.await_log(
        "descriptor=[remote_address=2001:db8:1:2::/64] limit=per_address",
        "a refusal names the /64",
    );
    // The admin API finds the network's state by any of its addresses.
    let admin = rls.proxy.admin.expect("admin");
    let auth = format!("Bearer {}", admin_token::TOKEN);
    let shown = request(
        admin,
        "GET",
        "/v1/clients?descriptor=remote_address:2001:db8:1:2:ffff::9",
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(shown.status, 200, "{}", shown.body);
    let shown: serde_json::Value = serde_json::from_str(&shown.body).expect("JSON");
    let per_address = shown["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .find(|l| l["limit"] == "per_address")
        .cloned()
        .unwrap_or_default();
    assert_eq!(per_address["remaining"], 0, "{shown}");
}

/// A token file for `[rls].token_file`, in a directory of its own.
struct RlsToken(std::path::PathBuf);

impl RlsToken {
    fn new(token: &str) -> RlsToken {
        let path = temp_dir().join("rls.token");
        std::fs::write(&path, format!("{token}\n")).expect("token file");
        RlsToken(path)
    }
}

impl Drop for RlsToken {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            remove_test_dir(dir);
        }
    }
}

const RLS_TOKEN: &str = "rls-token-6f1c2a9b8e7d4c3b";

#[test]
fn with_a_token_file_only_callers_showing_the_token_are_answered_and_charged() {
    let upstream = Upstream::start();
    let file = RlsToken::new(RLS_TOKEN);
    let addr = local_addr();
    let config = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(per_address(3))
        .raw(&format!(
            "[rls]\nlisten = \"{addr}\"\ntoken_file = \"{}\"\n",
            file.0.display()
        ));
    let mut rls = connect(config.start(), addr);
    let asked = || {
        call(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
            0,
        )
    };
    // 60 connections at once, each with a call without the token and one
    // with a wrong one.
    let wrong = [
        "Bearer rls-token-6f1c2a9b8e7d4c3c".to_string(),
        "Bearer rls-token-6f1c2a9b8e7d4c3".to_string(),
        format!("Bearer {RLS_TOKEN}0"),
        format!("Basic {RLS_TOKEN}"),
        RLS_TOKEN.to_string(),
        format!("Bearer: {RLS_TOKEN}"),
    ];
    let codes = rls.runtime.block_on(async {
        let connections = (0..60).map(|i| {
            let wrong = wrong[i % wrong.len()].clone();
            async move {
                let client = RateLimitServiceClient::connect(format!("http://{addr}"))
                    .await
                    .map_err(|e| e.to_string())?;
                let calls = [None, Some(wrong)].map(|shown| {
                    let mut client = client.clone();
                    async move {
                        let mut request = tonic::Request::new(asked());
                        if let Some(shown) = shown {
                            request
                                .metadata_mut()
                                .insert("authorization", shown.parse().expect("ASCII"));
                        }
                        match client.should_rate_limit(request).await {
                            Ok(answer) => format!("{:?}", code(answer.get_ref())),
                            Err(status) => format!("{:?}", status.code()),
                        }
                    }
                });
                Ok::<_, String>(futures_util::future::join_all(calls).await)
            }
        });
        futures_util::future::join_all(connections).await
    });
    let codes: Vec<String> = codes
        .into_iter()
        .flat_map(|c| c.expect("a connection"))
        .collect();
    let unauthenticated = codes.iter().filter(|c| *c == "Unauthenticated").count();
    // Python's grpcio, without the token, then with it: the budget of 3 is
    // whole, so none of the refused calls was charged.
    let without = grpcio_calls(addr, 2, None, None);
    let with = grpcio_calls(addr, 5, None, Some(RLS_TOKEN));
    record(
        "rls_token",
        &format!(
            "token_file set: of 120 calls without the token or with a wrong one, {unauthenticated} UNAUTHENTICATED; grpcio without it: {without:?}; with it: {with:?}\n"
        ),
    );
    assert_eq!(unauthenticated, 120, "{codes:?}");
    assert_eq!(without, ["ERROR UNAUTHENTICATED", "ERROR UNAUTHENTICATED"]);
    assert_eq!(with, FIVE_CALLS_ON_THREE);
    assert!(
        rls.proxy
            .metric(r#"floodgate_rls_requests_total{code="unauthenticated"}"#)
            >= 122.0
    );
    // The scheme's name is case-insensitive.
    let mut lower = tonic::Request::new(call(
        "edge",
        vec![descriptor(&[("remote_address", "10.0.0.2")])],
        0,
    ));
    lower.metadata_mut().insert(
        "authorization",
        format!("bearer {RLS_TOKEN}").parse().expect("ASCII"),
    );
    let client = &mut rls.client;
    let answer = rls.runtime.block_on(client.should_rate_limit(lower));
    assert_eq!(answer.map(|a| code(a.get_ref())).ok(), Some(Code::Ok));
    // A reload rotates the token: the old one is refused from then on.
    std::fs::write(&file.0, "rls-token-rotated-0123456789\n").expect("token file");
    rls.proxy.signal("-HUP");
    rls.proxy.await_log("reloaded", "the reload is applied");
    assert_eq!(
        grpcio_calls(addr, 1, None, Some(RLS_TOKEN)),
        ["ERROR UNAUTHENTICATED"]
    );
    assert_eq!(
        grpcio_calls(addr, 1, None, Some("rls-token-rotated-0123456789")),
        ["OVER_LIMIT remaining=0 limit=per_address/3/HOUR"]
    );
    // No token is ever written to the log.
    let log = rls.proxy.log();
    assert!(!log.contains("rls-token-"), "{log}");
}
