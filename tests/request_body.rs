//! Limits that read the request's body, end to end on the real binary: a
//! key and a match on a top-level JSON field (`body:model`), the body read
//! before the decision within `max_body` and sent upstream byte for byte,
//! and bodies made to mislead the reading.

mod common;

use std::thread;

use common::*;

/// Three requests an hour per address and model, and two an hour per
/// address for the gpt-4o class (a match on the body).
fn per_model(upstream: &Upstream) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr).raw(
        r#"
[[limits]]
name = "per-model"
key = ["ip", "body:model"]
algorithm = "fixed_window"
limit = 3
window = "1h"
match = { paths = ["/v1/*"] }

[[limits]]
name = "gpt-4o-class"
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "1h"
match = { paths = ["/v1/*"], body = { model = ["gpt-4o*", "o1-*"] } }
"#,
    )
}

fn chat(model: &str, filler: usize) -> Vec<u8> {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"{}"}}],"max_tokens":16}}"#,
        "a".repeat(filler)
    )
    .into_bytes()
}

fn post(proxy: &Proxy, body: &[u8]) -> Response {
    request(
        proxy.addr,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body,
    )
}

#[test]
fn a_model_named_in_the_body_keys_and_matches_sixty_requests_at_once() {
    let upstream = Upstream::start();
    let proxy = per_model(&upstream).start();
    let bodies: Vec<Vec<u8>> = (0..60)
        .map(|i| {
            chat(
                if i % 2 == 0 {
                    "gpt-4o-mini"
                } else {
                    "claude-3-5-haiku"
                },
                i,
            )
        })
        .collect();
    let proxy = &proxy;
    let answers: Vec<(bool, Response)> = thread::scope(|s| {
        let handles: Vec<_> = bodies
            .iter()
            .enumerate()
            .map(|(i, body)| s.spawn(move || (i % 2 == 0, post(proxy, body))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let admitted = |gpt: bool| {
        answers
            .iter()
            .filter(|(g, r)| *g == gpt && r.status == 200)
            .count()
    };
    // gpt-4o-mini: its class's 2 of its model's 3; claude: its model's 3.
    assert_eq!(admitted(true), 2);
    assert_eq!(admitted(false), 3);
    assert!(answers
        .iter()
        .all(|(_, r)| r.status == 200 || r.status == 429));
    // Each admitted body reached the upstream as it was sent.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 5);
    for request in &seen {
        assert!(
            bodies.contains(&request.body),
            "{:?}",
            String::from_utf8_lossy(&request.body)
        );
    }
}

#[test]
fn bodies_reach_the_upstream_byte_for_byte_whether_read_or_not() {
    let upstream = Upstream::start();
    let proxy = per_model(&upstream).server("max_body = 1048576").start();
    // Around Pingora's 64 KiB replay, and up to and past max_body.
    for (i, filler) in [
        0, 1_000, 65_400, 65_536, 70_000, 300_000, 1_048_000, 1_048_576,
    ]
    .into_iter()
    .enumerate()
    {
        let body = chat(&format!("model-{i}"), filler);
        let r = post(&proxy, &body);
        assert_eq!(r.status, 200, "{} bytes: {}", body.len(), r.body);
        let last = upstream.seen().pop().expect("forwarded");
        assert_eq!(last.body.len(), body.len());
        assert!(last.body == body, "{} bytes changed on the way", body.len());
    }
    // Past max_body the body is not read: the model is missing and the
    // limit skips it (every request is admitted), the body still whole.
    let over = chat("model-over", 1_100_000);
    for _ in 0..5 {
        assert_eq!(post(&proxy, &over).status, 200);
    }
    assert!(upstream.seen().iter().rev().take(5).all(|s| s.body == over));
    // A chunked body has no length to bound it: not read, sent as it came.
    let chunked = chat("model-chunked", 100);
    let mut raw = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for piece in chunked.chunks(37) {
        raw.extend(format!("{:x}\r\n", piece.len()).as_bytes());
        raw.extend(piece);
        raw.extend(b"\r\n");
    }
    raw.extend(b"0\r\n\r\n");
    for _ in 0..4 {
        assert_eq!(raw_request(proxy.addr, &raw).status, 200);
    }
    assert!(upstream
        .seen()
        .iter()
        .rev()
        .take(4)
        .all(|s| s.body == chunked));
}

#[test]
fn bodies_made_to_mislead_the_reading_buy_nothing() {
    let upstream = Upstream::start();
    let proxy = per_model(&upstream).start();
    // The model named twice: the application may read either. Refused
    // whole, never forwarded.
    let twice = br#"{"model":"claude-3-5-haiku","max_tokens":1,"model":"gpt-4o"}"#;
    let escaped = br#"{"model":"claude-3-5-haiku","m\u006fdel":"gpt-4o"}"#;
    for body in [&twice[..], &escaped[..]] {
        let r = post(&proxy, body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("ambiguous_body"), "{}", r.body);
    }
    assert_eq!(upstream.count(), 0);
    // One model however its text is escaped: one budget.
    let plain = br#"{"model":"gpt-4o"}"#;
    let spelled = br#"{"model":"gpt\u002d4\u006f"}"#;
    let admitted = [&plain[..], &spelled[..], &plain[..], &spelled[..]]
        .iter()
        .filter(|b| post(&proxy, b).status == 200)
        .count();
    assert_eq!(admitted, 2, "gpt-4o's class allows 2");
    // 10 MB naming gpt-4o: past max_body, not read (nor held); it goes
    // upstream whole and no class matches it.
    let huge = chat("gpt-4o", 10_000_000);
    for _ in 0..3 {
        assert_eq!(post(&proxy, &huge).status, 200);
    }
    assert!(upstream.seen().iter().rev().take(3).all(|s| s.body == huge));
    // A model inside a message, or a body that is no JSON, names none:
    // the per-model limit skips it and no class matches.
    let nested = br#"{"messages":[{"model":"gpt-4o"}]}"#;
    let not_json = b"model=gpt-4o";
    for body in [&nested[..], &not_json[..]] {
        for _ in 0..4 {
            assert_eq!(post(&proxy, body).status, 200);
        }
    }
}

#[test]
fn over_http2_a_body_read_before_the_decision_is_sent_whole() {
    let upstream = Upstream::start();
    let proxy = per_model(&upstream).server("h2c = true").start();
    let dir = temp_dir();
    for (i, filler) in [10, 70_000, 900_000].into_iter().enumerate() {
        let body = chat(&format!("h2-model-{i}"), filler);
        let file = dir.join(format!("body-{i}.json"));
        std::fs::write(&file, &body).expect("write body");
        let statuses: Vec<String> = (0..4)
            .map(|_| {
                let out = std::process::Command::new("curl")
                    .args([
                        "-s",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code} %{http_version}",
                    ])
                    .arg("--http2-prior-knowledge")
                    .args(["-H", "Content-Type: application/json", "--data-binary"])
                    .arg(format!("@{}", file.display()))
                    .arg(format!("http://{}/v1/chat/completions", proxy.addr))
                    .output()
                    .expect("curl");
                String::from_utf8_lossy(&out.stdout).into_owned()
            })
            .collect();
        // Three per model: the fourth is refused, over HTTP/2.
        assert_eq!(
            statuses,
            ["200 2", "200 2", "200 2", "429 2"],
            "{} bytes",
            body.len()
        );
        let seen = upstream.seen();
        assert!(
            seen.iter().rev().take(3).all(|s| s.body == body),
            "{} bytes changed on the way",
            body.len()
        );
    }
}

#[test]
fn a_body_made_unreadable_is_no_way_around_a_match_that_denies() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .server("max_body = 65536")
        .raw(
            r#"
[[limits]]
name = "gpt-4o-class"
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "1h"
on_missing = "deny"
match = { paths = ["/v1/*"], body = { model = ["gpt-4o*"] } }
"#,
        )
        .start();
    // Padded past max_body, or chunked, or not JSON: refused, never sent.
    let padded = chat("gpt-4o", 70_000);
    let mut chunked = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    let small = chat("gpt-4o", 10);
    chunked.extend(format!("{:x}\r\n", small.len()).as_bytes());
    chunked.extend(&small);
    chunked.extend(b"\r\n0\r\n\r\n");
    let refused: Vec<Response> = thread::scope(|s| {
        let mut handles = Vec::new();
        for i in 0..60 {
            let (padded, chunked, proxy) = (&padded, &chunked, &proxy);
            handles.push(s.spawn(move || match i % 3 {
                0 => post(proxy, padded),
                1 => raw_request(proxy.addr, chunked),
                _ => post(proxy, b"model=gpt-4o"),
            }));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for r in &refused {
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(r.body.contains("missing_key"), "{}", r.body);
    }
    assert_eq!(upstream.count(), 0);
    // A readable body of another model is no match; gpt-4o's counts.
    assert_eq!(post(&proxy, &chat("claude-3-5-haiku", 10)).status, 200);
    let admitted = (0..4)
        .filter(|_| post(&proxy, &small).status == 200)
        .count();
    assert_eq!(admitted, 2);
}
