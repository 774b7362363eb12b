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
    let out = Command::new("timeout")
        .args(["120", "python3", SCRIPT, mode, &format!("http://{addr}")])
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
