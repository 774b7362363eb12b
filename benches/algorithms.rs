//! One decision of each algorithm on a warm state, and header formatting.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use floodgate::algorithm::{Algorithm, Decision};
use floodgate::config::HeaderStyle;
use floodgate::headers::{self, Layer};

const SEC: u64 = 1_000_000;

fn algorithms() -> [Algorithm; 5] {
    [
        Algorithm::TokenBucket {
            capacity: 100,
            interval_us: SEC / 10,
        },
        Algorithm::LeakyBucket {
            capacity: 20,
            interval_us: SEC / 5,
        },
        Algorithm::FixedWindow {
            limit: 1000,
            window_us: 3600 * SEC,
        },
        Algorithm::SlidingWindow {
            limit: 600,
            window_us: 60 * SEC,
        },
        Algorithm::SlidingLog {
            limit: 100,
            window_us: 60 * SEC,
        },
    ]
}

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    for algorithm in algorithms() {
        group.bench_function(algorithm.name(), |b| {
            let mut state = algorithm.fresh_state();
            let mut now = 1_800_000_000 * SEC;
            b.iter(|| {
                // Time moves so that about half the requests are admitted:
                // both paths are measured, and a sliding log stays full.
                now += algorithm.window_us() / algorithm.quota() / 2;
                let e = algorithm.evaluate(&state, black_box(now), 1);
                if e.decision.allowed {
                    state.apply(&e.update);
                }
                e.decision
            })
        });
    }
    group.finish();
}

fn header_formatting(c: &mut Criterion) {
    let decision = Decision {
        allowed: true,
        cost_exceeds_limit: false,
        limit: 200,
        remaining: 42,
        reset_after_us: 6_500_000,
        retry_after_us: 0,
        delay_us: 0,
    };
    let layers = [
        Layer {
            name: "per-ip",
            algorithm: algorithms()[0],
            decision,
        },
        Layer {
            name: "per-account",
            algorithm: algorithms()[3],
            decision: Decision {
                remaining: 90,
                ..decision
            },
        },
    ];
    let mut group = c.benchmark_group("headers");
    for (name, style) in [
        ("legacy", HeaderStyle::Legacy),
        ("draft", HeaderStyle::Draft),
        ("both", HeaderStyle::Both),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let shown = headers::most_constrained(black_box(&layers));
                shown.map(|s| headers::rate_limit_headers(style, &layers, s))
            })
        });
    }
    let refused = Layer {
        decision: Decision {
            allowed: false,
            remaining: 0,
            retry_after_us: 1_234_567,
            ..decision
        },
        ..layers[0]
    };
    group.bench_function("429", |b| {
        b.iter(|| {
            headers::rejection(
                HeaderStyle::Both,
                black_box(&[refused]),
                &refused,
                "5f0e8c2a9d41b7e6000000000000002a",
            )
        })
    });
    group.finish();
}

criterion_group!(benches, decide, header_formatting);
criterion_main!(benches);
