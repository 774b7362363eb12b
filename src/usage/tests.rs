use std::io::Write;

use super::*;

const OPENAI_JSON: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"the \"usage\": {\"prompt_tokens\": 999} is text"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":0}}}"#;

const ANTHROPIC_JSON: &str = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":25,"cache_read_input_tokens":0,"output_tokens":7}}"#;

fn openai_stream() -> String {
    let mut s = String::new();
    for word in ["Hel", "lo"] {
        s += &format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{word}\"}}}}],\"usage\":null}}\n\n"
        );
    }
    s += "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":31,\"completion_tokens\":9,\"total_tokens\":40}}\n\n";
    s += "data: [DONE]\n\n";
    s
}

fn anthropic_stream() -> String {
    [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":44,\"output_tokens\":1}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":3}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ]
    .concat()
}

fn read(provider: Provider, framing: Framing, body: &[u8]) -> Read {
    let mut reader = UsageReader::new(provider, framing);
    reader.feed(body);
    reader.finish(true)
}

fn usage(prompt: u64, completion: u64) -> Read {
    Read {
        usage: Usage {
            prompt: Some(prompt),
            completion: Some(completion),
        },
        spoiled: false,
    }
}

#[test]
fn each_providers_answer_and_stream_read_as_they_report() {
    assert_eq!(
        read(Provider::OpenAi, Framing::Json, OPENAI_JSON.as_bytes()),
        usage(12, 5)
    );
    assert_eq!(
        read(
            Provider::Anthropic,
            Framing::Json,
            ANTHROPIC_JSON.as_bytes()
        ),
        usage(25, 7)
    );
    assert_eq!(
        read(
            Provider::OpenAi,
            Framing::EventStream,
            openai_stream().as_bytes()
        ),
        usage(31, 9)
    );
    // The start's output count is a placeholder; the deltas are
    // cumulative: the last one is the count.
    assert_eq!(
        read(
            Provider::Anthropic,
            Framing::EventStream,
            anthropic_stream().as_bytes()
        ),
        usage(44, 12)
    );
}

#[test]
fn a_body_split_anywhere_reads_the_same() {
    let cases = [
        (Provider::OpenAi, Framing::Json, OPENAI_JSON.to_string()),
        (
            Provider::Anthropic,
            Framing::Json,
            ANTHROPIC_JSON.to_string(),
        ),
        (Provider::OpenAi, Framing::EventStream, openai_stream()),
        (
            Provider::Anthropic,
            Framing::EventStream,
            anthropic_stream(),
        ),
        (
            Provider::OpenAi,
            Framing::EventStream,
            openai_stream().replace('\n', "\r\n"),
        ),
        (
            Provider::Anthropic,
            Framing::EventStream,
            anthropic_stream().replace('\n', "\r"),
        ),
    ];
    for (provider, framing, body) in cases {
        let whole = read(provider, framing, body.as_bytes());
        assert!(whole.usage.prompt.is_some(), "{body}");
        let bytes = body.as_bytes();
        for cut in 0..=bytes.len() {
            let mut reader = UsageReader::new(provider, framing);
            reader.feed(&bytes[..cut]);
            reader.feed(&bytes[cut..]);
            assert_eq!(reader.finish(true), whole, "cut at {cut} of {body}");
        }
        // Byte by byte.
        let mut reader = UsageReader::new(provider, framing);
        for b in bytes {
            reader.feed(std::slice::from_ref(b));
        }
        assert_eq!(reader.finish(true), whole);
    }
}

#[test]
fn text_that_looks_like_usage_is_text() {
    // In a string value, in an array, under another key, at another depth.
    for body in [
        r#"{"content":"\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":5}"}"#,
        r#"{"choices":[{"usage":{"prompt_tokens":5,"completion_tokens":5}}]}"#,
        r#"{"meta":{"usage":{"prompt_tokens":5,"completion_tokens":5}}}"#,
        r#"{"us\u0061ge":{"prompt_tokens":5,"completion_tokens":5}}"#,
        r#"[{"usage":{"prompt_tokens":5,"completion_tokens":5}}]"#,
    ] {
        assert_eq!(
            read(Provider::OpenAi, Framing::Json, body.as_bytes()),
            Read::default(),
            "{body}"
        );
    }
}

#[test]
fn counts_that_are_no_counts_spoil_the_read_and_count_nothing() {
    for value in [
        "-5",
        "1.5",
        "1e3",
        "\"12\"",
        "true",
        "{}",
        "[1]",
        "99999999999999999999999",
        "1000000000001",
    ] {
        let body = format!(r#"{{"usage":{{"prompt_tokens":{value},"completion_tokens":5}}}}"#);
        let got = read(Provider::OpenAi, Framing::Json, body.as_bytes());
        assert!(got.spoiled, "{value}");
        assert_eq!(got.usage.prompt, None, "{value}");
    }
    // The largest count read.
    let body = r#"{"usage":{"prompt_tokens":1000000000000,"completion_tokens":0}}"#;
    assert_eq!(
        read(Provider::OpenAi, Framing::Json, body.as_bytes()),
        usage(1_000_000_000_000, 0)
    );
}

#[test]
fn a_broken_document_counts_nothing_of_what_it_said() {
    for body in [
        r#"{"usage":{"prompt_tokens":12,"completion_tokens":5}"#,
        r#"{"usage":{"prompt_tokens":12,"completion_tokens":5}}}"#,
        r#"{"usage":{"prompt_tokens":12,"completion_tokens":5}} trailing"#,
        r#"{"usage" {"prompt_tokens":12}}"#,
        r#"{"usage":{"prompt_tokens":12,,"completion_tokens":5}}"#,
        "",
        "not json",
    ] {
        assert_eq!(
            read(Provider::OpenAi, Framing::Json, body.as_bytes()).usage,
            Usage::default(),
            "{body}"
        );
    }
    // Nested past the bound: not read (the scan's own tests check that no
    // memory is spent on it).
    let deep = format!(
        "{}{}",
        "{\"a\":".repeat(10_000),
        "{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}"
    );
    let mut reader = UsageReader::new(Provider::OpenAi, Framing::Json);
    reader.feed(deep.as_bytes());
    assert_eq!(reader.finish(true).usage, Usage::default());
}

#[test]
fn a_malformed_stream_keeps_what_whole_events_said() {
    // A broken event between good ones; an event cut by the end of the
    // stream; fields other than data; data lines joined.
    let body = concat!(
        ": a comment\n",
        "data: {\"usage\":{\"prompt_tokens\":7,\n",
        "data: \"completion_tokens\":2}}\n\n",
        "data: {\"usage\":{\"prompt_tokens\":100,\"completion_tokens\n\n",
        "id: 5\nretry: 10\nevent: x\n\n",
        "data:{\"usage\":{\"completion_tokens\":3}}\n\n",
        "data: {\"usage\":{\"prompt_tokens\":9000",
    );
    let mut reader = UsageReader::new(Provider::OpenAi, Framing::EventStream);
    reader.feed(body.as_bytes());
    assert_eq!(
        reader.finish(false),
        usage(7, 3),
        "cut: the last event never ended"
    );
    let mut reader = UsageReader::new(Provider::OpenAi, Framing::EventStream);
    reader.feed(body.as_bytes());
    assert_eq!(
        reader.finish(true).usage.prompt,
        Some(7),
        "an unfinished document is no document, even at the end"
    );
}

#[test]
fn the_head_decides_what_is_read_and_compressed_bodies_are_read_through() {
    let openai = Provider::OpenAi;
    assert!(UsageReader::for_response(openai, Some(b"text/html"), None).is_none());
    assert!(UsageReader::for_response(openai, None, None).is_none());
    let json = Some(&b"application/json; charset=utf-8"[..]);
    let stream = Some(&b"Text/Event-Stream"[..]);
    for (encoding, compressed) in [
        ("gzip", {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(OPENAI_JSON.as_bytes()).unwrap();
            e.finish().unwrap()
        }),
        ("deflate", {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(OPENAI_JSON.as_bytes()).unwrap();
            e.finish().unwrap()
        }),
    ] {
        for cut in [1, 7, compressed.len() / 2] {
            let mut reader =
                UsageReader::for_response(openai, json, Some(encoding.as_bytes())).unwrap();
            reader.feed(&compressed[..cut]);
            reader.feed(&compressed[cut..]);
            assert_eq!(reader.finish(true), usage(12, 5), "{encoding} cut at {cut}");
        }
    }
    let mut reader = UsageReader::for_response(openai, stream, None).unwrap();
    reader.feed(openai_stream().as_bytes());
    assert_eq!(reader.finish(true), usage(31, 9));
    // Encodings not read, and a body that is not what it says it is.
    let mut reader = UsageReader::for_response(openai, json, Some(b"br")).unwrap();
    reader.feed(OPENAI_JSON.as_bytes());
    assert!(reader.finish(true).spoiled);
    let mut reader = UsageReader::for_response(openai, json, Some(b"gzip")).unwrap();
    reader.feed(OPENAI_JSON.as_bytes());
    assert!(reader.finish(true).spoiled);
}

#[test]
fn a_compressed_body_that_grows_without_end_is_given_up() {
    // 80 MiB of spaces, compressed to about 80 kB.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let spaces = vec![b' '; 1 << 20];
    for _ in 0..80 {
        e.write_all(&spaces).unwrap();
    }
    let bomb = e.finish().unwrap();
    let mut reader =
        UsageReader::for_response(Provider::OpenAi, Some(b"application/json"), Some(b"gzip"))
            .unwrap();
    for chunk in bomb.chunks(16 * 1024) {
        reader.feed(chunk);
    }
    assert!(reader.seen <= MAX_DECOMPRESSED + (2 << 20));
    assert!(reader.finish(true).spoiled);
}
