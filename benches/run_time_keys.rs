//! The request path's lookup of an API key among a million set at run time
//! (`ClientRules::identify`: hash the key, probe the in-process table),
//! beside the same request with no run-time table (the admin API off) and
//! with an empty one. Before the runs it prints what one entry costs: the
//! process's resident memory before and after the million are loaded.

use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use floodgate::config::{Config, Inputs};
use floodgate_policy::identity::{KeyEntry, RunTimeKeys};
use http::{HeaderMap, HeaderValue};

const KEYS: u64 = 1_000_000;

fn config(with_table: Option<Arc<RunTimeKeys>>) -> Config {
    let text = "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:3\"\n\
                [upstream]\nservers = [\"127.0.0.1:2\"]\n\
                [clients]\ntiers = [\"free\", \"pro\"]\n\
                [clients.api_keys]\n\"file-key\" = \"pro\"\n\
                [admin]\ntoken_file = \"/token\"\n";
    let mut inputs = Inputs::default()
        .with_identity_secret("a bench secret of enough bytes")
        .with_files([("/token".into(), b"bench-admin-token-0123456789".to_vec())]);
    if let Some(table) = with_table {
        inputs = inputs.with_run_time_keys(table);
    }
    Config::parse(Path::new("bench.toml"), text, &inputs).expect("config")
}

fn lookup(c: &mut Criterion) {
    let table = Arc::new(RunTimeKeys::default());
    let full = config(Some(table.clone()));
    let rules = &full.policy.clients;
    let tier: Arc<str> = Arc::from("pro");
    let before = resident_bytes();
    table.replace_all((0..KEYS).map(|i| {
        (
            rules.api_key_hash(format!("run-time-key-{i:07}").as_bytes()),
            KeyEntry {
                tier: Some(tier.clone()),
                set_at: 1_700_000_000,
                label: None,
            },
        )
    }));
    assert_eq!(table.len(), KEYS as usize);
    if let (Some(before), Some(after)) = (before, resident_bytes()) {
        println!(
            "run-time keys: {} entries (no label) hold {} MB resident: {} bytes per entry",
            KEYS,
            after.saturating_sub(before) / 1_000_000,
            after.saturating_sub(before) / KEYS
        );
    }
    let none = config(None);
    let empty = config(Some(Arc::new(RunTimeKeys::default())));
    let peer: IpAddr = "203.0.113.9".parse().expect("ip");
    let with_key = |key: &str| {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_str(key).expect("value"));
        headers
    };
    let among_million = with_key("run-time-key-0765432");
    let unknown = with_key("not-a-key-at-all");
    let file_key = with_key("file-key");
    let mut group = c.benchmark_group("identify");
    group.bench_function("run-time key among 1,000,000", |b| {
        b.iter(|| {
            black_box(
                rules
                    .identify(peer, black_box(&among_million))
                    .expect("client"),
            )
        })
    });
    group.bench_function("unknown key, 1,000,000 run-time keys", |b| {
        b.iter(|| black_box(rules.identify(peer, black_box(&unknown)).expect("client")))
    });
    group.bench_function("file key, no run-time table", |b| {
        b.iter(|| {
            black_box(
                none.policy
                    .clients
                    .identify(peer, black_box(&file_key))
                    .expect("client"),
            )
        })
    });
    group.bench_function("file key, empty run-time table", |b| {
        b.iter(|| {
            black_box(
                empty
                    .policy
                    .clients
                    .identify(peer, black_box(&file_key))
                    .expect("client"),
            )
        })
    });
    group.bench_function("no key, 1,000,000 run-time keys", |b| {
        let headers = HeaderMap::new();
        b.iter(|| black_box(rules.identify(peer, black_box(&headers)).expect("client")))
    });
    group.finish();
}

/// The process's resident memory (Linux), in bytes.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

criterion_group!(benches, lookup);
criterion_main!(benches);
