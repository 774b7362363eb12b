//! The official OpenAI and Anthropic Python SDKs (PyPI's `openai` and
//! `anthropic`, installed by the test command) as floodgate's clients, in
//! front of an upstream answering in each provider's wire format: a refusal
//! is the SDK's own rate-limit error carrying the wait (`retry-after-ms`,
//! which both SDKs read before `Retry-After`), and an SDK left to retry
//! waits it out and gets through.

mod common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{local_addr, request, wait_until, ConfigBuilder, Limit};
use serde_json::Value;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/llm/sdks.py");

/// The provider upstream, stopped by its PID when dropped.
struct ProviderUpstream {
    addr: SocketAddr,
    child: Child,
}

impl ProviderUpstream {
    fn start() -> ProviderUpstream {
        let addr = local_addr();
        let child = Command::new("python3")
            .args([SCRIPT, "upstream", &addr.port().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        let upstream = ProviderUpstream { addr, child };
        assert!(
            wait_until(Duration::from_secs(10), || upstream.answered().is_some()),
            "the provider upstream did not start"
        );
        upstream
    }

    /// Calls it answered, as it counts them.
    fn answered(&self) -> Option<u64> {
        let r = request(self.addr, "GET", "/answered", &[], b"");
        (r.status == 200)
            .then(|| r.body.trim().parse().ok())
            .flatten()
    }
}

impl Drop for ProviderUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `mode` of the script against the proxy at `addr`: what it printed.
fn sdk(mode: &str, addr: SocketAddr) -> Value {
    sdk_with(mode, addr, &[])
}

fn sdk_with(mode: &str, addr: SocketAddr, args: &[&str]) -> Value {
    let out = Command::new("timeout")
        .args(["120", "python3", SCRIPT, mode, &format!("http://{addr}")])
        .args(args)
        .output()
        .expect("timeout python3");
    assert!(
        out.status.success(),
        "{mode}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{mode}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// One call per provider's endpoint, then nothing for `refill_s` seconds.
fn one_call_each(upstream: SocketAddr, refill_s: f64) -> ConfigBuilder {
    ConfigBuilder::new(upstream)
        .limit(
            Limit::token_bucket("chat", "ip", 1, 1.0 / refill_s)
                .matching("paths = [\"/v1/chat/completions\"]"),
        )
        .limit(
            Limit::token_bucket("messages", "ip", 1, 1.0 / refill_s)
                .matching("paths = [\"/v1/messages\"]"),
        )
}

#[test]
fn each_sdk_raises_its_rate_limit_error_with_the_wait_in_milliseconds() {
    let upstream = ProviderUpstream::start();
    let proxy = one_call_each(upstream.addr, 30.0).start();
    let seen = sdk("refused", proxy.addr);
    for provider in ["openai", "anthropic"] {
        let refused = &seen[provider];
        assert_eq!(refused["raised"], "RateLimitError", "{provider}: {seen}");
        assert_eq!(refused["status"], 429, "{provider}: {seen}");
        let ms: u64 = refused["retry_after_ms"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{provider}: no retry-after-ms: {seen}"));
        // The bucket refills one in 30 s, taken a moment before.
        assert!((25_000..=30_000).contains(&ms), "{provider}: {ms} ms");
        assert_eq!(refused["retry_after"], "30", "{provider}: {seen}");
    }
    // The refused calls never reached the upstream.
    assert_eq!(upstream.answered(), Some(2));
}

#[test]
fn an_sdk_left_to_retry_waits_out_the_refusal_and_gets_through() {
    let upstream = ProviderUpstream::start();
    // One call each, refilled in 200 ms.
    let proxy = one_call_each(upstream.addr, 0.2).start();
    let seen = sdk("retried", proxy.addr);
    assert_eq!(
        seen["answers"],
        serde_json::json!(["hello", "hello", "hello", "hello"]),
        "{seen}"
    );
    assert_eq!(upstream.answered(), Some(4), "each call reached it once");
}

/// In front of `upstream` with the admin API on: `openai-tokens`, a
/// million an hour per address on chat completions, charged by their
/// OpenAI usage (`cost`, what `cost_from_response` holds).
fn openai_tokens(
    upstream: SocketAddr,
    token: &common::admin_token::TokenFile,
    cost: &str,
) -> ConfigBuilder {
    ConfigBuilder::new(upstream)
        .admin()
        .raw(&token.section())
        .limit(
            Limit::fixed_window("openai-tokens", "ip", 1_000_000, "1h")
                .matching("paths = [\"/v1/chat/completions\"]")
                .line(&format!("cost_from_response = {{ {cost} }}")),
        )
}

/// Units each limit charged the client at 127.0.0.1, by the admin API.
fn charged(proxy: &common::Proxy) -> std::collections::BTreeMap<String, u64> {
    spent(proxy.admin.expect("admin"), "ip=127.0.0.1")
}

/// Units each limit with a quota charged the client `/v1/clients?{client}`
/// names, through the admin API at `admin`.
fn spent(admin: SocketAddr, client: &str) -> std::collections::BTreeMap<String, u64> {
    let bearer = format!("Bearer {}", common::admin_token::TOKEN);
    let r = request(
        admin,
        "GET",
        &format!("/v1/clients?{client}"),
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let shown: Value = serde_json::from_str(&r.body).expect("JSON");
    shown["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .filter_map(|l| {
            let spent = l["quota"].as_u64()? - l["remaining"].as_u64()?;
            Some((l["limit"].as_str()?.to_string(), spent))
        })
        .collect()
}

#[test]
fn each_answer_is_charged_the_usage_its_provider_reported_to_the_token() {
    let upstream = ProviderUpstream::start();
    let token = common::admin_token::TokenFile::new();
    let tokens = |name: &str, path: &str, cost: &str| {
        Limit::fixed_window(name, "ip", 1_000_000, "1h")
            .matching(&format!("paths = [\"{path}\"]"))
            .line(&format!("cost_from_response = {{ {cost} }}"))
    };
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&token.section())
        .limit(tokens(
            "openai-tokens",
            "/v1/chat/completions",
            "usage = \"openai\", max = 5000, default = 1000",
        ))
        .limit(tokens(
            "openai-price",
            "/v1/chat/completions",
            "usage = \"openai\", prompt_weight = 1, completion_weight = 4, max = 50000, default = 1000",
        ))
        .limit(tokens(
            "anthropic-tokens",
            "/v1/messages",
            "usage = \"anthropic\", max = 5000, default = 1000",
        ))
        .start();
    let seen = sdk("billed", proxy.addr);
    // An answer with no body to read (a HEAD's): finished, so its default,
    // not the most a cut one owes.
    let head = request(proxy.addr, "HEAD", "/v1/chat/completions", &[], b"");
    assert_ne!(head.status, 0);
    // What the clients got is what the upstream sent.
    assert_eq!(seen["openai json"], 17, "{seen}");
    assert_eq!(seen["openai stream"], "Hello there", "{seen}");
    assert_eq!(seen["openai stream without usage"], "Hello there", "{seen}");
    assert!(
        seen["openai cut"]
            .as_str()
            .is_some_and(|e| e.starts_with("raised")),
        "{seen}"
    );
    assert_eq!(seen["anthropic json"], 5, "{seen}");
    assert_eq!(
        seen["anthropic stream"],
        serde_json::json!(["Hello", 12]),
        "{seen}"
    );
    // Each charged the usage reported, priced; the default where an answer
    // read whole had none (a stream that did not ask for it, one without,
    // one spoiled, the HEAD); the most where a stream was cut before its
    // usage.
    let expected = [
        (
            "openai-tokens",
            17 + 40 + 1_000 + 5_000 + 1_000 + 1_000 + 1_000,
        ),
        (
            "openai-price",
            (12 + 4 * 5) + (31 + 4 * 9) + 1_000 + 50_000 + 1_000 + 1_000 + 1_000,
        ),
        ("anthropic-tokens", (12 + 5) + (44 + 12)),
    ];
    let settled = wait_until(Duration::from_secs(5), || {
        let now = charged(&proxy);
        expected
            .iter()
            .all(|(name, units)| now.get(*name) == Some(units))
    });
    assert!(
        settled,
        "charged {:?}, expected {expected:?}",
        charged(&proxy)
    );
    assert_eq!(
        proxy.metric(
            "floodgate_response_cost_fallbacks_total{limit=\"openai-tokens\",reason=\"missing_or_malformed\"}"
        ),
        4.0
    );
}

/// The attack: answers that hide their usage, spoil it (negative counts)
/// or are cut before it, 60 at once. None goes free: each is charged its
/// default or, cut, its most; the proxy serves on.
#[test]
fn sixty_answers_at_once_that_hide_spoil_or_cut_their_usage_are_each_charged() {
    let upstream = ProviderUpstream::start();
    let token = common::admin_token::TokenFile::new();
    let proxy = openai_tokens(
        upstream.addr,
        &token,
        "usage = \"openai\", max = 5000, default = 700",
    )
    .start();
    let seen = sdk("flood", proxy.addr);
    assert_eq!(seen["spoiled answered"], 20, "{seen}");
    assert_eq!(seen["no-usage answered"], 20, "{seen}");
    assert_eq!(seen["cut raised APIConnectionError"], 20, "{seen}");
    let expected = 40 * 700 + 20 * 5_000;
    assert!(
        wait_until(Duration::from_secs(5), || charged(&proxy)
            .get("openai-tokens")
            == Some(&expected)),
        "charged {:?}, expected {expected}",
        charged(&proxy)
    );
    assert_eq!(upstream.answered(), Some(60));
    assert_eq!(
        proxy.metric(
            "floodgate_response_cost_fallbacks_total{limit=\"openai-tokens\",reason=\"missing_or_malformed\"}"
        ),
        40.0
    );
}

/// Two instances on one Redis: the answers each serves are charged to the
/// one shared budget, each once.
#[test]
fn two_instances_on_redis_charge_every_answers_usage_to_one_budget() {
    let redis = common::redis_server::RedisServer::start();
    let upstream = ProviderUpstream::start();
    let token = common::admin_token::TokenFile::new();
    let shared = ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&token.section())
        .redis(&redis.url())
        .redis_lines("timeout = \"2s\"\non_failure = \"deny\"\ninstances = 2")
        .limit(
            Limit::fixed_window("openai-tokens", "ip", 1_000_000, "1h")
                .matching("paths = [\"/v1/chat/completions\"]")
                .line("cost_from_response = { usage = \"openai\", max = 5000, default = 700 }"),
        );
    let a = shared.start();
    let b = shared.start();
    let (billed, flood) = std::thread::scope(|s| {
        let billed = s.spawn(|| sdk("billed", a.addr));
        let flood = s.spawn(|| sdk("flood", b.addr));
        (billed.join().expect("billed"), flood.join().expect("flood"))
    });
    assert_eq!(billed["openai json"], 17, "{billed}");
    assert_eq!(flood["cut raised APIConnectionError"], 20, "{flood}");
    // A: 17 + 40 + 3 defaults + a cut stream's max; B: 40 defaults and 20
    // cut streams' max.
    let expected = (17 + 40 + 3 * 700 + 5_000) + (40 * 700 + 20 * 5_000);
    for proxy in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(5), || charged(proxy)
                .get("openai-tokens")
                == Some(&expected)),
            "charged {:?}, expected {expected}",
            charged(proxy)
        );
    }
}

/// 10,000 tokens an hour, each stream reserving its own worst case: its
/// prompt's estimate and the 1,000 tokens it allows its answer.
fn reserved_from_the_request(
    upstream: SocketAddr,
    token: &common::admin_token::TokenFile,
) -> ConfigBuilder {
    ConfigBuilder::new(upstream)
        .admin()
        .raw(&token.section())
        .limit(
            Limit::fixed_window("stream-tokens", "ip", 10_000, "1h")
                .matching("paths = [\"/v1/chat/completions\"]")
                .line("cost_from_response = { usage = \"openai\", max = 4000, default = 100, reserve = \"request\" }"),
        )
}

/// What a burst of streams through the SDK came to: answered, refused,
/// tokens reported; each refusal carried its wait.
fn streams_at_once(addr: SocketAddr, n: usize) -> (u64, u64) {
    let seen = sdk_with("streams", addr, &[&n.to_string()]);
    let answered = seen["answered"].as_u64().expect("answered");
    let refused = seen["refused"].as_u64().expect("refused");
    assert_eq!(answered + refused, n as u64, "{seen}");
    assert_eq!(seen["refusals_with_a_wait"], refused, "{seen}");
    let tokens = seen["tokens"].as_u64().expect("tokens");
    // Each answered stream reported its worst case: 20 + 1,000.
    assert_eq!(tokens, answered * 1_020, "{seen}");
    (answered, tokens)
}

/// The bound: 40 streams at once against one budget never charge
/// past it (a fixed reservation let all 40 through: 40,800 of 10,000), and
/// the budget is charged exactly the usage reported.
#[test]
fn forty_streams_at_once_reserved_from_their_requests_never_pass_the_budget() {
    let upstream = ProviderUpstream::start();
    let token = common::admin_token::TokenFile::new();
    let proxy = reserved_from_the_request(upstream.addr, &token).start();
    let (answered, tokens) = streams_at_once(proxy.addr, 40);
    assert!(answered >= 5, "{answered} answered");
    assert!(tokens <= 10_000, "{tokens} tokens charged of 10,000");
    assert!(
        wait_until(Duration::from_secs(5), || charged(&proxy)
            .get("stream-tokens")
            == Some(&tokens)),
        "charged {:?}, reported {tokens}",
        charged(&proxy)
    );
}

#[test]
fn forty_streams_over_two_instances_on_redis_never_pass_the_budget() {
    let redis = common::redis_server::RedisServer::start();
    let upstream = ProviderUpstream::start();
    let token = common::admin_token::TokenFile::new();
    let shared = reserved_from_the_request(upstream.addr, &token)
        .redis(&redis.url())
        .redis_lines("timeout = \"2s\"\non_failure = \"deny\"\ninstances = 2");
    let a = shared.start();
    let b = shared.start();
    let ((answered_a, tokens_a), (answered_b, tokens_b)) = std::thread::scope(|s| {
        let on_a = s.spawn(|| streams_at_once(a.addr, 20));
        let on_b = s.spawn(|| streams_at_once(b.addr, 20));
        (on_a.join().expect("a"), on_b.join().expect("b"))
    });
    let tokens = tokens_a + tokens_b;
    assert!(
        answered_a + answered_b >= 5,
        "{answered_a} + {answered_b} answered"
    );
    assert!(tokens <= 10_000, "{tokens} tokens charged of 10,000");
    for proxy in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(5), || charged(proxy)
                .get("stream-tokens")
                == Some(&tokens)),
            "charged {:?}, reported {tokens}",
            charged(proxy)
        );
    }
}

/// `include_usage`: a stream that did not ask for its usage is made to
/// (and is charged it, 40, not the default), and its client gets exactly
/// the stream it would have got without floodgate: the same chunks through
/// the SDK, the same bytes through urllib.
#[test]
fn a_stream_made_to_report_its_usage_reaches_its_client_as_it_asked() {
    let upstream = ProviderUpstream::start();
    let token = common::admin_token::TokenFile::new();
    let proxy = openai_tokens(
        upstream.addr,
        &token,
        "usage = \"openai\", max = 5000, default = 700, include_usage = true",
    )
    .start();
    let seen = sdk_with(
        "unasked",
        proxy.addr,
        &[&format!("http://{}", upstream.addr)],
    );
    let direct = &seen["direct"];
    assert_eq!(direct.as_array().map(Vec::len), Some(3), "{seen}");
    for through in seen["through"].as_array().expect("through") {
        assert_eq!(through, direct, "{seen}");
    }
    assert_eq!(seen["raw_through"], seen["raw_direct"], "{seen}");
    // Three streams, each charged the usage it was made to report.
    assert!(
        wait_until(Duration::from_secs(5), || charged(&proxy)
            .get("openai-tokens")
            == Some(&(3 * 40))),
        "charged {:?}",
        charged(&proxy)
    );
}

/// `examples/llm-gateway.toml` as shipped (its addresses swapped for the
/// test's, an admin token added to read the budgets) in front of an
/// OpenAI-compatible upstream that knows nothing of it: the stream that did
/// not ask for usage is charged its usage, and only the gpt-4o call counts
/// against gpt-4o's spend, at gpt-4o's prices.
#[test]
fn the_llm_gateway_example_bills_each_model_at_its_price() {
    let redis = common::redis_server::RedisServer::start();
    let upstream = ProviderUpstream::start();
    let token = common::admin_token::TokenFile::new();
    let (listen, admin) = (local_addr(), local_addr());
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/llm-gateway.toml"
    ))
    .expect("example");
    let swapped = [
        (
            "listen = \"0.0.0.0:8080\"",
            format!("listen = \"{listen}\""),
        ),
        (
            "admin_listen = \"127.0.0.1:9091\"",
            format!("admin_listen = \"{admin}\""),
        ),
        (
            "servers = [\"127.0.0.1:8000\"]",
            format!("servers = [\"{}\"]", upstream.addr),
        ),
        (
            "url = \"redis://127.0.0.1:6379/0\"",
            format!("url = \"{}\"", redis.url()),
        ),
    ];
    let mut text = example.clone();
    for (shipped, test) in &swapped {
        assert!(
            text.contains(shipped),
            "the example no longer has {shipped}"
        );
        text = text.replace(shipped, test);
    }
    text.push_str(&token.section());
    let proxy = common::Proxy::start_text(&text, listen, Some(admin));
    let seen = sdk("example", proxy.addr);
    assert_eq!(seen["stream"], "Hello there", "{seen}");
    assert_eq!(seen["json"], 17, "{seen}");
    let spent = || spent(admin, "api_key=demo-free-key");
    // The month's tokens: the stream's 31 + 9 (asked for on its behalf)
    // and the JSON call's 12 + 5. gpt-4o's spend: the stream only, at 250
    // and 1,000 a token.
    let expected = [
        ("tokens-per-month", 57),
        ("gpt-4o-spend", 31 * 250 + 9 * 1_000),
    ];
    assert!(
        wait_until(Duration::from_secs(5), || {
            let spent = spent();
            expected
                .iter()
                .all(|(limit, n)| spent.get(*limit) == Some(n))
                && spent.get("o1-spend").is_none_or(|n| *n == 0)
        }),
        "spent {:?}",
        spent()
    );
}

/// A key on the request's model (`body:model`): each model its own budget,
/// through the SDK.
#[test]
fn each_model_named_in_the_request_has_a_budget_of_its_own() {
    let upstream = ProviderUpstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .raw("[[limits]]\nname = \"per-model\"\nkey = [\"ip\", \"body:model\"]\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1h\"\nmatch = { paths = [\"/v1/chat/completions\"] }\n")
        .start();
    let seen = sdk("per_model", proxy.addr);
    let expected = serde_json::json!(["answered", "answered", "refused"]);
    assert_eq!(seen["gpt-4o"], expected, "{seen}");
    assert_eq!(seen["gpt-4o-mini"], expected, "{seen}");
    assert_eq!(upstream.answered(), Some(4));
}
