//! `[tracing]` end to end: the real binary in front of a real upstream,
//! exporting to a real OTLP collector (opentelemetry-proto's TraceService
//! served by grpcio, `common::otlp`).

mod common;

use std::time::{Duration, Instant};

use common::otlp::{OtlpReceiver, Span};
use common::redis_server::RedisServer;
use common::{burst_with, count_status, request, temp_dir, wait_until, Proxy, Upstream};
use common::{ConfigBuilder, Limit};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const INTERNAL: i32 = 1;

fn traceparent(trace_id: &str, sampled: bool) -> String {
    format!(
        "00-{trace_id}-{PARENT_ID}-{}",
        if sampled { "01" } else { "00" }
    )
}

/// `[tracing]` to `receiver` over gRPC, with `lines` added.
fn traced(upstream: &Upstream, receiver: &OtlpReceiver, lines: &str) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr).admin().raw(&format!(
        "[tracing]\nendpoint = \"{}\"\n{lines}\n",
        receiver.grpc_endpoint()
    ))
}

fn in_trace<'a>(spans: &'a [Span], trace_id: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.trace_id == trace_id).collect()
}

fn named<'a>(spans: &[&'a Span], name: &str) -> &'a Span {
    spans
        .iter()
        .copied()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name} among {spans:#?}"))
}

fn of_kind<'a>(spans: &[&'a Span], kind: i32) -> &'a Span {
    spans
        .iter()
        .copied()
        .find(|s| s.kind == kind)
        .unwrap_or_else(|| panic!("no span of kind {kind} among {spans:#?}"))
}

fn strings(span: &Span, key: &str) -> Vec<String> {
    span.attr(key)
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The spans of `trace_id` once `n` of them arrived.
fn spans_of(receiver: &OtlpReceiver, trace_id: &str, n: usize) -> Vec<Span> {
    let arrived = wait_until(Duration::from_secs(10), || {
        in_trace(&receiver.spans(), trace_id).len() >= n
    });
    let spans = receiver.spans();
    assert!(arrived, "{n} spans of {trace_id} never came: {spans:#?}");
    spans
        .into_iter()
        .filter(|s| s.trace_id == trace_id)
        .collect()
}

#[test]
fn a_continued_trace_gets_server_decision_and_upstream_spans_and_the_upstream_hangs_from_ours() {
    let upstream = Upstream::start();
    let receiver = OtlpReceiver::start();
    let secret = temp_dir().join("otlp-key");
    std::fs::write(&secret, "k-123\n").expect("secret");
    let proxy = traced(
        &upstream,
        &receiver,
        &format!(
            "trust_parent = \"all\"\nservice_name = \"edge-gw\"\nresource = {{ \"deployment.environment.name\" = \"test\" }}\nheaders = {{ \"x-api-key\" = {{ file = \"{}\" }} }}",
            secret.display()
        ),
    )
    .limit(Limit::fixed_window("per-ip", "ip", 100, "1m").matching("paths = [\"/api/*\"]"))
    .start();
    let parent = traceparent(TRACE_ID, true);
    let answer = request(
        proxy.addr,
        "GET",
        "/api//orders?token=secret",
        &[("traceparent", &parent), ("tracestate", "vendor=1")],
        b"",
    );
    assert_eq!(answer.status, 200, "{}", proxy.log());

    let spans = spans_of(&receiver, TRACE_ID, 3);
    let spans: Vec<&Span> = spans.iter().collect();
    let server = of_kind(&spans, SERVER);
    assert_eq!(
        server.parent_span_id, PARENT_ID,
        "the caller's span is the parent"
    );
    assert_eq!(server.name, "GET /api/*");
    assert_eq!(server.attr_str("http.request.method"), Some("GET"));
    assert_eq!(server.attr_str("http.route"), Some("/api/*"));
    assert_eq!(
        server.attr_str("url.path"),
        Some("/api/orders"),
        "canonical, as limits matched it, and no query string"
    );
    assert_eq!(server.attr_i64("http.response.status_code"), Some(200));
    assert_eq!(server.attr_str("client.address"), Some("127.0.0.1"));
    assert_eq!(
        server.attr_str("floodgate.request_id"),
        answer.header("x-request-id"),
        "the request's id, as its answer carries it"
    );
    assert_eq!(
        server.resource.get("service.name").and_then(|v| v.as_str()),
        Some("edge-gw")
    );
    assert_eq!(
        server
            .resource
            .get("deployment.environment.name")
            .and_then(|v| v.as_str()),
        Some("test")
    );
    assert_eq!(
        server.headers.get("x-api-key").map(String::as_str),
        Some("k-123")
    );

    let decision = named(&spans, "ratelimit.decision");
    assert_eq!(decision.kind, INTERNAL);
    assert_eq!(decision.parent_span_id, server.span_id);
    assert_eq!(
        decision.attr("ratelimit.limited").and_then(|v| v.as_bool()),
        Some(false)
    );
    assert_eq!(decision.attr_str("ratelimit.limit_name"), Some("per-ip"));
    assert_eq!(
        decision.attr_i64("ratelimit.most_restrictive.limit"),
        Some(100)
    );
    assert_eq!(
        decision.attr_i64("ratelimit.most_restrictive.remaining"),
        Some(99)
    );
    assert_eq!(decision.attr_i64("ratelimit.num_counters"), Some(1));
    assert_eq!(strings(decision, "floodgate.decided_by"), ["memory"]);
    assert_eq!(strings(decision, "floodgate.limits"), ["per-ip"]);

    let exchange = of_kind(&spans, CLIENT);
    assert_eq!(exchange.parent_span_id, server.span_id);
    assert_eq!(exchange.attr_i64("http.response.status_code"), Some(200));
    assert_eq!(exchange.attr_str("server.address"), Some("127.0.0.1"));
    assert!(
        exchange.start_ns >= decision.end_ns,
        "the exchange follows the decision"
    );
    assert!(server.start_ns <= decision.start_ns && exchange.end_ns <= server.end_ns);

    let seen = upstream.seen();
    let header = |name: &str| {
        seen[0]
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("traceparent"),
        Some(format!("00-{TRACE_ID}-{}-01", exchange.span_id)),
        "the upstream's parent is floodgate's upstream span"
    );
    assert_eq!(
        header("tracestate").as_deref(),
        Some("vendor=1"),
        "a trusted caller's state goes on"
    );
}

#[test]
fn a_refusal_says_which_limit_and_when_to_retry_and_its_429_and_log_line_name_the_trace() {
    let upstream = Upstream::start();
    let receiver = OtlpReceiver::start();
    let access = temp_dir().join("access.log");
    let proxy = traced(&upstream, &receiver, "trust_parent = \"all\"")
        .raw(&format!("[log]\naccess = \"{}\"", access.display()))
        .limit(Limit::fixed_window("login", "ip", 1, "1m"))
        .start();
    assert_eq!(request(proxy.addr, "GET", "/", &[], b"").status, 200);
    let parent = traceparent(TRACE_ID, true);
    let refused = request(proxy.addr, "GET", "/", &[("traceparent", &parent)], b"");
    assert_eq!(refused.status, 429);
    assert!(
        refused
            .body
            .contains(&format!("\"trace_id\":\"{TRACE_ID}\"")),
        "{}",
        refused.body
    );

    let spans = spans_of(&receiver, TRACE_ID, 2);
    let spans: Vec<&Span> = spans.iter().collect();
    let decision = named(&spans, "ratelimit.decision");
    assert_eq!(
        decision.attr("ratelimit.limited").and_then(|v| v.as_bool()),
        Some(true)
    );
    assert_eq!(decision.attr_str("ratelimit.limit_name"), Some("login"));
    assert_eq!(
        decision.attr_i64("ratelimit.most_restrictive.remaining"),
        Some(0)
    );
    let retry = decision
        .attr("ratelimit.retry_after_secs")
        .and_then(|v| v.as_f64())
        .expect("when to retry");
    let said_ms = refused.retry_after_ms().expect("the body's retry_after_ms") as f64;
    assert!(
        retry > 0.0 && (retry * 1000.0 - said_ms).abs() <= 1.0,
        "{retry} s vs {said_ms} ms"
    );
    assert_eq!(
        of_kind(&spans, SERVER).attr_i64("http.response.status_code"),
        Some(429)
    );
    assert!(
        spans.iter().all(|s| s.kind != CLIENT),
        "no upstream exchange"
    );

    let logged = wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(&access).is_ok_and(|l| l.contains(TRACE_ID))
    });
    assert!(logged, "the access log line names the trace");
}

#[test]
fn an_untrusted_callers_trace_context_is_not_continued_nor_passed_on() {
    let upstream = Upstream::start();
    let receiver = OtlpReceiver::start();
    // The default: only trusted proxies' context, and none are listed.
    let proxy = traced(&upstream, &receiver, "").start();
    let parent = traceparent(TRACE_ID, true);
    let bad = [
        parent.as_str(),
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-XYZ92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "garbage 00 zz",
    ];
    for (i, value) in bad.iter().enumerate() {
        let answer = request(
            proxy.addr,
            "GET",
            &format!("/{i}"),
            &[("traceparent", value), ("tracestate", "evil=1")],
            b"",
        );
        assert_eq!(answer.status, 200, "{value}: {}", proxy.log());
    }
    // A method of the client's invention names no span; a path of 48 KiB
    // (once encoded) is cut to 256 bytes in one.
    let invented = request(proxy.addr, "PURGE-EVERYTHING-NOW", "/m", &[], b"");
    assert_eq!(invented.status, 200);
    let long = format!("/{}", "é".repeat(8_000));
    assert_eq!(request(proxy.addr, "GET", &long, &[], b"").status, 200);
    let arrived = wait_until(Duration::from_secs(10), || {
        receiver.spans().iter().filter(|s| s.kind == SERVER).count() > bad.len() + 1
    });
    assert!(arrived, "{:#?}", receiver.spans());
    let spans = receiver.spans();
    let other = spans
        .iter()
        .find(|s| s.kind == SERVER && s.attr_str("url.path") == Some("/m"))
        .expect("the invented method's span");
    assert_eq!(other.name, "HTTP");
    assert_eq!(other.attr_str("http.request.method"), Some("_OTHER"));
    assert_eq!(
        other.attr_str("http.request.method_original"),
        Some("PURGE-EVERYTHING-NOW")
    );
    // The path as limits matched it: percent-encoded, then cut.
    let cut = spans
        .iter()
        .filter_map(|s| s.attr_str("url.path"))
        .find(|p| p.starts_with("/%C3%A9"))
        .expect("the long path's span");
    assert_eq!(cut.len(), 256);
    for server in spans.iter().filter(|s| s.kind == SERVER) {
        assert_ne!(server.trace_id, TRACE_ID, "a trace of its own");
        assert_eq!(server.parent_span_id, "", "no parent");
    }
    for seen in upstream.seen() {
        let header = |name: &str| {
            seen.headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        let ours = header("traceparent");
        assert_eq!(ours.len(), 1, "{ours:?}");
        assert!(!ours[0].contains(TRACE_ID), "{ours:?}");
        assert!(
            spans.iter().any(|s| ours[0].contains(&s.span_id)),
            "{ours:?}"
        );
        assert!(
            header("tracestate").is_empty(),
            "the caller's state is not passed on: {:?}",
            seen.headers
        );
    }
}

#[test]
fn by_default_a_trusted_proxys_trace_is_continued() {
    let upstream = Upstream::start();
    let receiver = OtlpReceiver::start();
    let proxy = traced(&upstream, &receiver, "")
        .raw("[clients]\ntrusted_proxies = [\"127.0.0.1/32\"]")
        .start();
    let parent = traceparent(TRACE_ID, true);
    let headers = [
        ("traceparent", parent.as_str()),
        ("x-forwarded-for", "203.0.113.9"),
    ];
    assert_eq!(request(proxy.addr, "GET", "/", &headers, b"").status, 200);
    let spans = spans_of(&receiver, TRACE_ID, 2);
    let spans: Vec<&Span> = spans.iter().collect();
    let server = of_kind(&spans, SERVER);
    assert_eq!(server.parent_span_id, PARENT_ID);
    assert_eq!(
        server.attr_str("client.address"),
        Some("203.0.113.9"),
        "as resolved"
    );
    assert_eq!(server.attr_str("network.peer.address"), Some("127.0.0.1"));
}

#[test]
fn ratio_zero_exports_nothing_yet_tells_the_upstream_its_place() {
    let upstream = Upstream::start();
    let receiver = OtlpReceiver::start();
    let proxy = traced(
        &upstream,
        &receiver,
        "sample_ratio = 0.0\ntrust_parent = \"all\"",
    )
    .start();
    for i in 0..50 {
        assert_eq!(
            request(proxy.addr, "GET", &format!("/{i}"), &[], b"").status,
            200
        );
    }
    for seen in upstream.seen() {
        let parent = seen
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("traceparent"))
            .map(|(_, v)| v.clone())
            .expect("a traceparent");
        assert!(
            parent.starts_with("00-") && parent.ends_with("-00"),
            "{parent}: not sampled"
        );
    }
    // A caller's sampled trace still is: once its spans are in, anything
    // sent before them would have been too.
    let parent = traceparent(TRACE_ID, true);
    assert_eq!(
        request(proxy.addr, "GET", "/last", &[("traceparent", &parent)], b"").status,
        200
    );
    spans_of(&receiver, TRACE_ID, 2);
    let others: Vec<Span> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id != TRACE_ID)
        .collect();
    assert!(others.is_empty(), "{others:#?}");
    assert_eq!(
        proxy.metric(r#"floodgate_tracing_spans_total{outcome="over_cap"}"#),
        0.0
    );
}

#[test]
fn a_flood_of_sampled_requests_stays_under_the_span_cap() {
    let upstream = Upstream::start();
    let receiver = OtlpReceiver::start();
    let cap = 20;
    let proxy = traced(
        &upstream,
        &receiver,
        &format!("trust_parent = \"all\"\nmax_spans_per_second = {cap}"),
    )
    .start();
    let started = Instant::now();
    let mut answered = 0;
    for round in 0..5 {
        let answers = burst_with(&[proxy.addr], 60, "GET", "/", |i| {
            let trace_id = format!("{:032x}", 0x1000 + round * 60 + i);
            vec![("traceparent".into(), traceparent(&trace_id, true))]
        });
        answered += count_status(&answers, 200);
    }
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(answered, 300);
    let over_cap = r#"floodgate_tracing_spans_total{outcome="over_cap"}"#;
    let exported = r#"floodgate_tracing_spans_total{outcome="exported"}"#;
    assert!(proxy.metric(over_cap) > 0.0);
    // Everything recorded has been exported.
    let settled = wait_until(Duration::from_secs(10), || {
        let sent = proxy.metric(exported);
        sent > 0.0 && receiver.spans().len() as f64 == sent
    });
    assert!(
        settled,
        "{} received, {} exported",
        receiver.spans().len(),
        proxy.metric(exported)
    );
    // The rate over the flood, and a second's worth at once.
    let allowed = (f64::from(cap) * (seconds + 1.0)).ceil() as usize;
    let received = receiver.spans().len();
    assert!(
        received <= allowed,
        "{received} spans in {seconds:.2} s, cap {cap}/s"
    );
    assert!(
        received < 300,
        "a request records several spans: the cap cut them"
    );
    // Whole traces: a recorded request has its server and upstream spans.
    let spans = receiver.spans();
    for server in spans.iter().filter(|s| s.kind == SERVER) {
        let exchange = spans
            .iter()
            .find(|s| s.kind == CLIENT && s.parent_span_id == server.span_id);
        assert!(exchange.is_some(), "{server:#?} without its upstream span");
    }
}

/// `n` requests from 60 threads, each request's time.
fn timed_requests(proxy: &Proxy, n: usize) -> (usize, Vec<Duration>) {
    let per_thread = n / 60;
    let handles: Vec<_> = (0..60)
        .map(|t| {
            let addr = proxy.addr;
            std::thread::spawn(move || {
                let mut times = Vec::new();
                let mut ok = 0;
                for i in 0..per_thread {
                    let parent = traceparent(&format!("{:032x}", 0x9000 + t * 1000 + i), true);
                    let started = Instant::now();
                    let answer = request(addr, "GET", "/", &[("traceparent", &parent)], b"");
                    times.push(started.elapsed());
                    ok += usize::from(answer.status == 200);
                }
                (ok, times)
            })
        })
        .collect();
    let mut ok = 0;
    let mut times = Vec::new();
    for h in handles {
        let (o, t) = h.join().expect("a request thread");
        ok += o;
        times.extend(t);
    }
    times.sort();
    (ok, times)
}

fn p99(times: &[Duration]) -> Duration {
    times[times.len() * 99 / 100]
}

#[test]
fn a_dead_or_stalled_collector_delays_no_request_and_the_dropped_spans_are_counted() {
    let upstream = Upstream::start();
    let mut receiver = OtlpReceiver::start();
    let proxy = traced(
        &upstream,
        &receiver,
        "trust_parent = \"all\"\nqueue = 64\nbatch = 16\ntimeout = \"3s\"",
    )
    .start();
    let (ok, alive) = timed_requests(&proxy, 1_020);
    assert_eq!(ok, 1_020);
    receiver.kill();
    let (ok, dead) = timed_requests(&proxy, 1_020);
    assert_eq!(ok, 1_020, "{}", proxy.log());
    let dropped = || {
        proxy.metric(r#"floodgate_tracing_spans_total{outcome="export_failed"}"#)
            + proxy.metric(r#"floodgate_tracing_spans_total{outcome="queue_full"}"#)
    };
    assert!(
        wait_until(Duration::from_secs(10), || dropped() > 0.0),
        "the dropped spans are counted"
    );
    common::record(
        "tracing_dead_collector",
        &format!(
            "p99 of 1,020 requests (60 at once), collector alive {:?}, killed {:?}\n",
            p99(&alive),
            p99(&dead)
        ),
    );

    // A collector that takes 4 s to answer each export: the queue fills
    // and spans are dropped; no request waits for it.
    let slow = OtlpReceiver::start_with(false, 4_000);
    let upstream = Upstream::start();
    let proxy = traced(
        &upstream,
        &slow,
        "trust_parent = \"all\"\nqueue = 64\nbatch = 16\ntimeout = \"5s\"",
    )
    .start();
    let (ok, times) = timed_requests(&proxy, 1_020);
    assert_eq!(ok, 1_020);
    let slowest = times.last().copied().unwrap_or_default();
    assert!(
        slowest < Duration::from_secs(3),
        "a request waited for the collector: {slowest:?}"
    );
    assert!(proxy.metric(r#"floodgate_tracing_spans_total{outcome="queue_full"}"#) > 0.0);
}

#[test]
fn a_redis_decision_has_its_redis_call_as_a_client_span() {
    let upstream = Upstream::start();
    let receiver = OtlpReceiver::start();
    let redis = RedisServer::start();
    let proxy = traced(&upstream, &receiver, "trust_parent = \"all\"")
        .redis(&redis.url())
        .limit(Limit::sliding_window("per-ip", "ip", 50, "1m"))
        .start();
    let parent = traceparent(TRACE_ID, true);
    assert_eq!(
        request(proxy.addr, "GET", "/", &[("traceparent", &parent)], b"").status,
        200
    );
    let spans = spans_of(&receiver, TRACE_ID, 4);
    let spans: Vec<&Span> = spans.iter().collect();
    let decision = named(&spans, "ratelimit.decision");
    assert_eq!(strings(decision, "floodgate.decided_by"), ["redis"]);
    let call = named(&spans, "EVALSHA decide");
    assert_eq!(call.kind, CLIENT);
    assert_eq!(call.parent_span_id, decision.span_id);
    assert_eq!(call.attr_str("db.system.name"), Some("redis"));
    assert_eq!(call.attr_str("db.operation.name"), Some("EVALSHA"));
    assert!(decision.start_ns <= call.start_ns && call.end_ns <= decision.end_ns);
}

#[test]
fn spans_go_out_over_otlp_http_too() {
    let upstream = Upstream::start();
    let receiver = OtlpReceiver::start_with(true, 0);
    let proxy = ConfigBuilder::new(upstream.addr)
        .raw(&format!(
            "[tracing]\nendpoint = \"{}\"\nprotocol = \"http\"\ntrust_parent = \"all\"\n",
            receiver.http_endpoint()
        ))
        .start();
    let parent = traceparent(TRACE_ID, true);
    assert_eq!(
        request(proxy.addr, "GET", "/", &[("traceparent", &parent)], b"").status,
        200
    );
    let spans = spans_of(&receiver, TRACE_ID, 2);
    assert!(spans.iter().all(|s| s.via == "http"), "{spans:#?}");
}
