//! The request path with clients' overrides: `Policy::plan` for a request
//! whose key is among 1,000,000 run-time keys, with 100,000 overrides
//! loaded (the request's own client overridden, or not), beside the same
//! request and config with the admin API off (no tables at all) and with
//! empty tables. Before the runs it prints what one override costs: the
//! process's resident memory before and after the 100,000 are loaded.

use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use floodgate::config::{Config, Inputs};
use floodgate_algorithm::Algorithm;
use floodgate_policy::identity::{KeyEntry, KnownPart, RunTimeKeys};
use floodgate_policy::overrides::{Override, OverrideKey, RunTimeOverrides};
use floodgate_policy::{Plan, Policy, RequestView, Rule};
use http::{HeaderMap, HeaderValue, Method};

const KEYS: u64 = 1_000_000;
const OVERRIDES: u64 = 100_000;

/// A limit per key and one per address; the admin API on when tables are
/// given.
fn config(tables: Option<(Arc<RunTimeKeys>, Arc<RunTimeOverrides>)>) -> Config {
    let admin = if tables.is_some() {
        "[admin]\ntoken_file = \"/token\"\n"
    } else {
        ""
    };
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:3\"\n\
         [upstream]\nservers = [\"127.0.0.1:2\"]\n\
         [clients]\ntiers = [\"free\", \"pro\"]\n\
         [clients.api_keys]\n\"file-key\" = \"pro\"\n{admin}\
         [[limits]]\nname = \"per-account\"\nkey = \"api_key\"\nalgorithm = \"token_bucket\"\ncapacity = 100\nrefill_rate = 10\n\
         [[limits]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nwindow = \"1m\"\n"
    );
    let mut inputs = Inputs::default()
        .with_identity_secret("a bench secret of enough bytes")
        .with_files([("/token".into(), b"bench-admin-token-0123456789".to_vec())]);
    if let Some((keys, overrides)) = tables {
        inputs = inputs
            .with_run_time_keys(keys)
            .with_run_time_overrides(overrides);
    }
    Config::parse(Path::new("bench.toml"), &text, &inputs).expect("config")
}

/// The run-time key of client `i`.
fn key_of(i: u64) -> String {
    format!("run-time-key-{i:07}")
}

/// A million run-time keys, every tenth overridden under the per-key
/// limit; prints what the overrides hold in memory.
fn fill(keys: &RunTimeKeys, overrides: &RunTimeOverrides, policy: &Policy) {
    let rules = &policy.clients;
    let tier: Arc<str> = Arc::from("pro");
    keys.replace_all((0..KEYS).map(|i| {
        (
            rules.api_key_hash(key_of(i).as_bytes()),
            KeyEntry {
                tier: Some(tier.clone()),
                set_at: 1_700_000_000,
                label: None,
            },
        )
    }));
    let limit = &policy.limits[0];
    let rule = Rule::Rate(Algorithm::token_bucket(5_000, 10_000).expect("numbers"));
    let before = resident_bytes();
    // Every tenth key overridden under the per-key limit.
    overrides.replace_all((0..OVERRIDES).map(|i| {
        let hash = rules.api_key_hash(key_of(i * 10).as_bytes());
        let identity = rules
            .identity_for(&limit.key, &KnownPart::ApiKeyHash(hash), false)
            .expect("keyed on the key");
        (
            OverrideKey {
                limit: limit.id,
                identity,
            },
            Override {
                limit_name: Arc::from("per-account"),
                rule: Ok(rule),
                numbers: "{\"capacity\":5000,\"refill_rate\":100}".into(),
                expires_at_s: None,
                set_at_s: 1_700_000_000,
                client: "key#00000000".into(),
                label: None,
            },
        )
    }));
    assert_eq!(overrides.len(), OVERRIDES as usize);
    if let (Some(before), Some(after)) = (before, resident_bytes()) {
        println!(
            "overrides: {} entries (no label) hold {} MB resident: {} bytes per entry",
            OVERRIDES,
            after.saturating_sub(before) / 1_000_000,
            after.saturating_sub(before) / OVERRIDES
        );
    }
}

fn plan(c: &mut Criterion) {
    let keys = Arc::new(RunTimeKeys::default());
    let overrides = Arc::new(RunTimeOverrides::default());
    let full = config(Some((keys.clone(), overrides.clone())));
    fill(&keys, &overrides, &full.policy);
    let off = config(None);
    let empty = config(Some((Arc::default(), Arc::default())));
    let peer: IpAddr = "203.0.113.9".parse().expect("ip");
    let headers_with = |key: &str| {
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_str(key).expect("value"));
        headers
    };
    let overridden = headers_with(&key_of(765_430));
    let not_overridden = headers_with(&key_of(765_431));
    let file_key = headers_with("file-key");
    let method = Method::GET;
    let mut group = c.benchmark_group("plan");
    let mut case = |name: &str, config: &Config, headers: &HeaderMap, overridden: Option<bool>| {
        let client = config
            .policy
            .clients
            .identify(peer, headers)
            .expect("client");
        let view = RequestView {
            method: &method,
            path: "/",
            headers,
            query: None,
            host: None,
            client: &client,
            body: None,
        };
        // The case is what it says: its per-key layer has the numbers.
        let Ok(Plan::Check(layers)) = config.policy.plan(&view) else {
            panic!("{name}: no layers");
        };
        if let Some(overridden) = overridden {
            assert_eq!(
                layers.checks[0].algorithm.quota() == 5_000,
                overridden,
                "{name}"
            );
        }
        group.bench_function(name, |b| {
            b.iter(|| black_box(config.policy.plan(black_box(&view)).expect("plan")))
        });
    };
    case("admin API off: no tables", &off, &file_key, Some(false));
    case("empty tables", &empty, &file_key, Some(false));
    case(
        "key among 1,000,000, 100,000 overrides, not its own",
        &full,
        &not_overridden,
        Some(false),
    );
    case(
        "key among 1,000,000, 100,000 overrides, its own",
        &full,
        &overridden,
        Some(true),
    );
    group.finish();
}

/// The process's resident memory (Linux), in bytes.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

criterion_group!(benches, plan);
criterion_main!(benches);
