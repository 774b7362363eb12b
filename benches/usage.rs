//! What reading an LLM answer's usage costs per megabyte of body: an
//! OpenAI stream of 1 MiB (chunks of ~120 bytes, as a model streams
//! tokens), a JSON answer of 1 MiB, and the same stream gzip-compressed,
//! fed to `UsageReader` in 16 KiB reads as the proxy receives them. A limit
//! without `usage` reads nothing: its body filter is one branch per read.

use std::hint::black_box;
use std::io::Write;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use floodgate::usage::{Framing, Provider, UsageReader};

const MIB: usize = 1 << 20;

fn openai_stream() -> Vec<u8> {
    let mut body = String::with_capacity(MIB + 512);
    let mut i = 0;
    while body.len() < MIB {
        body += &format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"token {i}\"}}}}],\"usage\":null}}\n\n"
        );
        i += 1;
    }
    body += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":31,\"completion_tokens\":9000}}\n\ndata: [DONE]\n\n";
    body.into_bytes()
}

fn openai_json() -> Vec<u8> {
    let text = "lorem ipsum \\\"quoted\\\" ".repeat(MIB / 24);
    format!(
        "{{\"id\":\"chatcmpl-1\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{text}\"}}}}],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":5}}}}"
    )
    .into_bytes()
}

fn read_all(framing: Framing, encoding: Option<&[u8]>, body: &[u8]) -> u64 {
    let content_type: &[u8] = match framing {
        Framing::Json => b"application/json",
        Framing::EventStream => b"text/event-stream",
    };
    let mut reader =
        UsageReader::for_response(Provider::OpenAi, Some(content_type), encoding).expect("read");
    for chunk in body.chunks(16 * 1024) {
        reader.feed(black_box(chunk));
    }
    reader.finish(true).usage.completion.unwrap_or(0)
}

fn usage(c: &mut Criterion) {
    let stream = openai_stream();
    let json = openai_json();
    let gzipped = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&stream).expect("gzip");
        e.finish().expect("gzip")
    };
    assert_eq!(read_all(Framing::EventStream, None, &stream), 9000);
    assert_eq!(read_all(Framing::Json, None, &json), 5);
    assert_eq!(
        read_all(Framing::EventStream, Some(b"gzip"), &gzipped),
        9000
    );
    let mut group = c.benchmark_group("usage per MiB");
    group.throughput(Throughput::Bytes(stream.len() as u64));
    group.bench_function("openai stream", |b| {
        b.iter(|| read_all(Framing::EventStream, None, &stream))
    });
    group.throughput(Throughput::Bytes(json.len() as u64));
    group.bench_function("openai json", |b| {
        b.iter(|| read_all(Framing::Json, None, &json))
    });
    group.throughput(Throughput::Bytes(stream.len() as u64));
    group.bench_function("openai stream, gzip", |b| {
        b.iter(|| read_all(Framing::EventStream, Some(b"gzip"), &gzipped))
    });
    group.finish();
}

criterion_group!(benches, usage);
criterion_main!(benches);
