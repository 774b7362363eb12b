//! One decision of each algorithm on a warm state, and header formatting.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use floodgate::proxy::headers::HeaderStyle;
use floodgate::proxy::headers::{self, EnforcedOutcome, Position};
use floodgate_algorithm::{Algorithm, Calendar, Decision, Period};

const SEC: u64 = 1_000_000;

fn algorithms() -> [Algorithm; 6] {
    [
        Algorithm::token_bucket(100, SEC / 10).expect("valid numbers"),
        Algorithm::leaky_bucket(20, SEC / 5).expect("valid numbers"),
        Algorithm::fixed_window(1000, 3600 * SEC).expect("valid numbers"),
        Algorithm::sliding_window(600, 60 * SEC).expect("valid numbers"),
        Algorithm::sliding_log(100, 60 * SEC).expect("valid numbers"),
        // Reads the zone's rules on every decision.
        Algorithm::calendar_quota(
            100_000,
            Calendar {
                period: Period::Month,
                timezone: chrono_tz::Europe::Paris,
                week_starts: chrono::Weekday::Mon,
            },
        )
        .expect("valid numbers"),
    ]
}

/// Limits at the top of their range: a sliding window whose previous
/// count weighs in steps longer than a µs, a token bucket counting in
/// tenths of a µs.
fn at_scale() -> [(&'static str, Algorithm); 3] {
    [
        (
            "sliding_window 100,000/day",
            Algorithm::sliding_window(100_000, 86_400 * SEC).expect("valid numbers"),
        ),
        (
            "sliding_window 2^32-1/366d",
            Algorithm::sliding_window(u64::from(u32::MAX), 366 * 86_400 * SEC)
                .expect("valid numbers"),
        ),
        (
            "token_bucket 2^32-1 at 10,000,000/s",
            Algorithm::token_bucket_per_second(u64::from(u32::MAX), 1e7).expect("valid numbers"),
        ),
    ]
}

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    let named = algorithms().map(|a| (a.name(), a));
    for (name, algorithm) in named.into_iter().chain(at_scale()) {
        group.bench_function(name, |b| {
            let mut state = algorithm.fresh_state();
            let mut now = 1_800_000_000 * SEC;
            b.iter(|| {
                // Time moves so that about half the requests are admitted:
                // both paths are measured, and a sliding log stays full.
                now += (algorithm.window_us() / algorithm.quota() / 2).max(1);
                let e = algorithm.evaluate(&state, black_box(now), 1);
                if e.decision.allowed() {
                    state.apply(&e.update);
                }
                e.decision
            })
        });
    }
    group.finish();
}

fn header_formatting(c: &mut Criterion) {
    let decision = Decision::admitted(200, 42, 6_500_000);
    let layers = [
        EnforcedOutcome {
            position: Position(0),
            name: "per-ip",
            quota: algorithms()[0].quota(),
            window_us: algorithms()[0].window_us(),
            decision,
            banned: false,
        },
        EnforcedOutcome {
            position: Position(1),
            name: "per-account",
            quota: algorithms()[3].quota(),
            window_us: algorithms()[3].window_us(),
            decision: Decision::admitted(200, 90, 6_500_000),
            banned: false,
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
    let refused = EnforcedOutcome {
        decision: Decision::refused(200, 0, 6_500_000, 1_234_567),
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
