//! The in-process store: one request's decision (two layers), on one hot key
//! and spread over 100,000 keys, from one thread and from two contending.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use floodgate_algorithm::Algorithm;
use floodgate_limiter::clock::SystemClock;
use floodgate_limiter::StateKey;
use floodgate_limiter::{Check, Enforcement, Leasing, LimitName, MemoryStore, OnFailure, Spending};

const SEC: u64 = 1_000_000;

fn checks(identity: u128) -> [Check; 2] {
    let name = LimitName::new("per-ip");
    // Generous limits: the admitted path, which writes state, is the one measured.
    let check = |limit: u64, algorithm| Check {
        limit: floodgate_limiter::LimitId(limit as usize),
        name: name.clone(),
        algorithm,
        key: StateKey { limit, identity },
        cost: 1,
        enforcement: Enforcement::Enforce,
        spending: Spending::Charge,
        on_failure: OnFailure::Local,
        leasing: Leasing::Never,
    };
    [
        check(
            0,
            Algorithm::token_bucket(1 << 30, 1).expect("valid numbers"),
        ),
        check(
            1,
            // Never refuses within a bench run (about 5 million decisions
            // a second), so every decision writes.
            Algorithm::sliding_window(1 << 25, SEC).expect("valid numbers"),
        ),
    ]
}

fn identities(n: u128) -> Vec<[Check; 2]> {
    (0..n)
        .map(|i| checks(i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)))
        .collect()
}

/// Runs `iters` decisions split over `threads` threads; the wall time of all.
fn contended(
    store: &Arc<MemoryStore>,
    keys: &Arc<Vec<[Check; 2]>>,
    threads: usize,
    iters: u64,
) -> Duration {
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, keys) = (store.clone(), keys.clone());
            s.spawn(move || {
                for i in 0..iters / threads as u64 {
                    let k = &keys[(i as usize * threads + t) % keys.len()];
                    std::hint::black_box(store.decide_now(k));
                }
            });
        }
    });
    started.elapsed()
}

fn local_limiter(c: &mut Criterion) {
    for (label, n) in [("1 key", 1u128), ("100k keys", 100_000)] {
        let store = Arc::new(MemoryStore::new(1_000_000, Arc::new(SystemClock)));
        let keys = Arc::new(identities(n));
        let mut group = c.benchmark_group(format!("local limiter, {label}"));
        group.bench_function("1 thread", |b| {
            b.iter_custom(|iters| contended(&store, &keys, 1, iters))
        });
        group.bench_function("2 threads", |b| {
            b.iter_custom(|iters| contended(&store, &keys, 2, iters))
        });
        group.finish();
    }
}

criterion_group!(benches, local_limiter);
criterion_main!(benches);
