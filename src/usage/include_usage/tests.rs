use serde_json::{json, Value};

use super::*;

fn ask(body: &str) -> Option<String> {
    ask_for_usage(body.as_bytes()).map(|b| String::from_utf8(b).expect("utf-8 in, utf-8 out"))
}

/// `body` amended into `expected`, byte for byte, and the amended one reads
/// as the original with `stream_options.include_usage` true, nothing else.
fn amends(body: &str, expected: &str) {
    assert_eq!(ask(body).as_deref(), Some(expected), "{body}");
    let mut want: Value = serde_json::from_str(body).expect("a JSON body");
    let options = &mut want["stream_options"];
    if !options.is_object() {
        *options = json!({});
    }
    options["include_usage"] = json!(true);
    let got: Value = serde_json::from_str(expected).expect("amended into JSON");
    assert_eq!(got, want, "{body}");
}

#[test]
fn a_stream_that_does_not_ask_is_asked_for_its_usage() {
    amends(
        r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#,
    );
    // Whitespace, key order, numbers and escapes stay as written.
    amends(
        "\n {\n  \"stream\" : true ,\n  \"temperature\": 1.00000000000000001,\n  \"seed\": 12345678901234567890,\n  \"messages\": [{\"role\": \"user\", \"content\": \"caf\\u00e9 \\\"}\\\" {\"}]\n }\n",
        "\n {\n  \"stream\" : true ,\n  \"temperature\": 1.00000000000000001,\n  \"seed\": 12345678901234567890,\n  \"messages\": [{\"role\": \"user\", \"content\": \"caf\\u00e9 \\\"}\\\" {\"}],\"stream_options\":{\"include_usage\":true}\n }\n",
    );
    // An escaped name is the same name to the upstream.
    amends(
        r#"{"\u0073tream":true}"#,
        r#"{"\u0073tream":true,"stream_options":{"include_usage":true}}"#,
    );
}

#[test]
fn stream_options_there_get_include_usage_added_or_set() {
    amends(
        r#"{"stream":true,"stream_options":{"continuous_usage_stats":false}}"#,
        r#"{"stream":true,"stream_options":{"continuous_usage_stats":false,"include_usage":true}}"#,
    );
    amends(
        r#"{"stream":true,"stream_options":{ }}"#,
        r#"{"stream":true,"stream_options":{"include_usage":true }}"#,
    );
    amends(
        r#"{"stream_options": {"include_usage": false}, "stream": true}"#,
        r#"{"stream_options": {"include_usage": true}, "stream": true}"#,
    );
    // Null is the API's "not given".
    amends(
        r#"{"stream":true,"stream_options":{"include_usage":null}}"#,
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
    );
    amends(
        r#"{"stream":true,"stream_options":null,"n":1}"#,
        r#"{"stream":true,"stream_options":{"include_usage":true},"n":1}"#,
    );
}

#[test]
fn what_does_not_stream_or_asks_already_is_left_alone() {
    for body in [
        r#"{"model":"gpt-4o","messages":[]}"#,
        r#"{"stream":false}"#,
        r#"{"stream":null}"#,
        r#"{"stream":"true"}"#,
        r#"{"stream":1}"#,
        r#"{}"#,
        r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{ "stream_options" : { "include_usage" : true } , "stream" : true }"#,
        // Only the top level says whether the request streams.
        r#"{"messages":[{"role":"user","content":"x","stream":true}],"metadata":{"stream":true}}"#,
        r#"{"messages":[{"role":"user","content":"{\"stream\": true}"}]}"#,
        r#"{"stream_options":{"include_usage":false},"extra":{"stream":true}}"#,
    ] {
        assert_eq!(ask(body), None, "{body}");
    }
}

#[test]
fn what_is_not_a_json_object_or_is_ambiguous_is_left_alone() {
    for body in [
        // Not an object.
        r#"[{"stream":true}]"#,
        r#""{\"stream\":true}""#,
        "true",
        "null",
        "1",
        "",
        "   ",
        // Not JSON.
        r#"{"stream":true"#,
        r#"{"stream":true}}"#,
        r#"{"stream":true,}"#,
        r#"{"stream":true} x"#,
        r#"{"stream":tru}"#,
        r#"{stream:true}"#,
        "\u{feff}{\"stream\":true}",
        "{\"stream\":true,\"x\":\"\\q\"}",
        // A name twice: which one counts is the upstream's guess.
        r#"{"stream":true,"stream":false}"#,
        r#"{"stream":true,"stream":true}"#,
        r#"{"\u0073tream":true,"stream":false}"#,
        r#"{"stream":true,"stream_options":{},"stream_options":{}}"#,
        r#"{"stream":true,"stream_options":{"include_usage":false,"include_usage":false}}"#,
        // Of a type the upstream refuses anyway.
        r#"{"stream":true,"stream_options":[]}"#,
        r#"{"stream":true,"stream_options":"include_usage"}"#,
        r#"{"stream":true,"stream_options":true}"#,
        r#"{"stream":true,"stream_options":{"include_usage":"false"}}"#,
        r#"{"stream":true,"stream_options":{"include_usage":0}}"#,
    ] {
        assert_eq!(ask(body), None, "{body:?}");
    }
}

const USAGE_CHUNK: &str = r#"{"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1,"model":"gpt-4o","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0}}}"#;

fn delta(content: &str, finish: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1,"model":"gpt-4o","system_fingerprint":"fp_1","choices":[{{"index":0,"delta":{{"content":{content}}},"logprobs":null,"finish_reason":{finish}}}],"usage":null}}"#
    )
}

/// An answer as OpenAI streams it with `include_usage` on, event by event
/// (`true`: the usage chunk), each line ended with `eol`.
fn openai_events(eol: &str) -> Vec<(String, bool)> {
    let event = |data: &str| format!("data: {data}{eol}{eol}");
    vec![
        (event(&delta(r#""""#, "null")), false),
        (format!(": ping{eol}{eol}"), false),
        (event(&delta(r#""Hello""#, "null")), false),
        (
            event(&delta(r#""\"choices\": [] \"usage\"""#, "null")),
            false,
        ),
        (event(&delta("null", r#""stop""#)), false),
        (event(USAGE_CHUNK), true),
        (event("[DONE]"), false),
    ]
}

fn whole(events: &[(String, bool)]) -> String {
    events.iter().map(|(e, _)| e.as_str()).collect()
}

fn without_usage(events: &[(String, bool)]) -> String {
    events
        .iter()
        .filter(|(_, usage)| !usage)
        .map(|(e, _)| e.as_str())
        .collect()
}

fn strip(chunks: &[&[u8]]) -> Vec<u8> {
    let mut stripper = UsageChunkStripper::new();
    let mut out = Vec::new();
    for chunk in chunks {
        stripper.feed(chunk, &mut out);
    }
    stripper.finish(&mut out);
    out
}

fn stripped(input: &str) -> String {
    String::from_utf8(strip(&[input.as_bytes()])).expect("utf-8 in, utf-8 out")
}

#[test]
fn the_usage_chunk_alone_is_taken_out_of_a_stream_split_anywhere() {
    for eol in ["\n", "\r\n", "\r"] {
        let events = openai_events(eol);
        let (input, want) = (whole(&events), without_usage(&events));
        assert_ne!(input, want);
        let input = input.as_bytes();
        for at in 0..=input.len() {
            let (a, b) = input.split_at(at);
            assert_eq!(strip(&[a, b]), want.as_bytes(), "{eol:?} split at {at}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(strip(&bytes), want.as_bytes(), "{eol:?} byte by byte");
    }
}

#[test]
fn an_event_is_sent_once_its_blank_line_is_seen() {
    let mut stripper = UsageChunkStripper::new();
    let mut out = Vec::new();
    let first = format!("data: {}\r\n\r", delta(r#""Hi""#, "null"));
    stripper.feed(first.as_bytes(), &mut out);
    assert_eq!(out, first.as_bytes());
    // The LF of that last CRLF follows the event out, at once.
    stripper.feed(b"\ndata: {\"id\"", &mut out);
    assert_eq!(out, format!("{first}\n").as_bytes());
    // The usage chunk's CRLF goes with it.
    out.clear();
    stripper.feed(
        format!(":\"x\"}}\r\n\r\ndata: {USAGE_CHUNK}\r\n\r").as_bytes(),
        &mut out,
    );
    assert_eq!(out, b"data: {\"id\":\"x\"}\r\n\r\n");
    stripper.feed(b"\ndata: [DONE]\r\n\r\n", &mut out);
    stripper.finish(&mut out);
    assert_eq!(out, b"data: {\"id\":\"x\"}\r\n\r\ndata: [DONE]\r\n\r\n");
}

#[test]
fn only_a_chunk_with_no_choices_and_a_usage_object_is_taken() {
    for kept in [
        // Usage on a chunk with choices (some compatible servers).
        r#"{"choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":9}}"#,
        // Azure's first chunk: no choices, no usage.
        r#"{"id":"","choices":[],"created":0,"model":"","prompt_filter_results":[]}"#,
        r#"{"choices":[],"usage":null}"#,
        r#"{"choices":[],"usage":[]}"#,
        r#"{"choices":[],"usage":1}"#,
        r#"{"usage":{"prompt_tokens":9}}"#,
        r#"{"choices":null,"usage":{"prompt_tokens":9}}"#,
        r#"{"choices":[],"choices":[],"usage":{"prompt_tokens":9}}"#,
        r#"[{"choices":[],"usage":{"prompt_tokens":9}}]"#,
        r#"{"choices":[],"usage":{"prompt_tokens":9}"#,
        r#"{"text":"{\"choices\":[],\"usage\":{\"prompt_tokens\":9}}"}"#,
        "[DONE]",
    ] {
        let input = format!("data: {kept}\n\n");
        assert_eq!(stripped(&input), input, "{kept}");
    }
    for taken in [
        r#"{"choices":[],"usage":{}}"#,
        r#" { "choices" : [ ] , "usage" : { "total_tokens" : 21 } } "#,
        r#"{"usage":{"total_tokens":21},"choices":[]}"#,
    ] {
        let input = format!("data: {taken}\n\ndata: [DONE]\n\n");
        assert_eq!(stripped(&input), "data: [DONE]\n\n", "{taken}");
    }
}

#[test]
fn events_of_several_lines_are_read_whole() {
    // Data lines join with a line feed; the other fields are not data.
    let usage =
        "id: 7\ndata: {\"choices\": [],\ndata:\"usage\":\ndata\ndata: {\"total_tokens\": 21}}\n\n";
    assert_eq!(stripped(usage), "");
    let split = "data: {\"choices\": [],\n: \"usage\": {}}\ndata: \"usage\": null}\n\n";
    assert_eq!(stripped(split), split);
    // A field named otherwise is no data line.
    let other = "dat: {\"choices\":[],\"usage\":{}}\ndatas: 1\n\n";
    assert_eq!(stripped(other), other);
}

#[test]
fn a_stream_cut_short_is_sent_as_it_came_less_the_usage_chunk() {
    let cut = format!("data: {}\n\ndata: {{\"cho", delta(r#""x""#, "null"));
    assert_eq!(stripped(&cut), cut);
    let last = format!("data: {}\n", delta(r#""x""#, "null"));
    assert_eq!(stripped(&last), last);
    assert_eq!(stripped(&format!("data: {USAGE_CHUNK}\n")), "");
    assert_eq!(stripped(&format!("data: {USAGE_CHUNK}")), "");
    assert_eq!(stripped("\n\n\r\n\r\r"), "\n\n\r\n\r\r");
}

#[test]
fn an_event_over_the_cap_passes_unread_as_it_arrives() {
    let padding = "x".repeat(MAX_HELD_EVENT);
    // Over the cap, even the usage chunk is not read.
    let huge_usage = format!(
        "data: {{\"choices\":[],\"pad\":\"{padding}\",\"usage\":{{\"total_tokens\":1}}}}\n\n"
    );
    let huge = format!("data: {}\n\n", delta(&format!("\"{padding}\""), "null"));
    let input = format!("{huge}{huge_usage}data: {USAGE_CHUNK}\n\n{huge}data: [DONE]\n\n");
    let want = format!("{huge}{huge_usage}{huge}data: [DONE]\n\n");
    for size in [1 << 16, 7919, MAX_HELD_EVENT + 1, input.len()] {
        let mut stripper = UsageChunkStripper::new();
        let mut out = Vec::new();
        for chunk in input.as_bytes().chunks(size) {
            stripper.feed(chunk, &mut out);
            // Never more than one capped event held back.
            assert!(stripper.held.len() <= MAX_HELD_EVENT);
        }
        stripper.finish(&mut out);
        assert!(out == want.as_bytes(), "chunks of {size}");
    }
    // The part past the cap goes out with the chunk it came in.
    let mut stripper = UsageChunkStripper::new();
    let mut out = Vec::new();
    stripper.feed(&huge.as_bytes()[..MAX_HELD_EVENT + 10], &mut out);
    assert_eq!(out.len(), MAX_HELD_EVENT + 10);
}
