//! What a decision from a lease costs in process, beside the same decision
//! made by the in-process store itself: the price of the lease table
//! (a shard lock, a lookup, a take) that replaces a Redis call.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use floodgate_algorithm::Algorithm;
use floodgate_limiter::clock::SystemClock;
use floodgate_limiter::redis::LeaseSettings;
use floodgate_limiter::StateKey;
use floodgate_limiter::{
    Check, Enforcement, Instances, Leased, Leasing, LimitName, MemoryStore, OnFailure, Spending,
    Store,
};

fn check(algorithm: Algorithm) -> Check {
    Check {
        limit: floodgate_limiter::LimitId(0),
        name: LimitName::new("global"),
        algorithm,
        key: StateKey {
            limit: 1,
            identity: 7,
        },
        cost: 1,
        enforcement: Enforcement::Enforce,
        spending: Spending::Charge,
        on_failure: OnFailure::Local,
        leasing: Leasing::Allowed,
    }
}

fn leases(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("lease");
    for (name, algorithm) in [
        (
            "fixed_window",
            Algorithm::fixed_window(1 << 24, 60_000_000).expect("valid numbers"),
        ),
        (
            "token_bucket",
            Algorithm::token_bucket(1 << 30, 1).expect("valid numbers"),
        ),
    ] {
        let request = [check(algorithm)];
        let memory = Arc::new(MemoryStore::new(1024, Arc::new(SystemClock)));
        group.bench_function(format!("{name}/store decides"), |b| {
            b.iter(|| runtime.block_on(memory.decide(&request)))
        });
        // Leases as large as they come, living long: nearly every decision
        // is the lease's, as on a hot key far from its limit.
        let leased = Leased::new(
            MemoryStore::new(1024, Arc::new(SystemClock)),
            LeaseSettings {
                max: 1 << 20,
                ttl_us: 60_000_000,
            },
            Instances::fixed(1),
            Duration::from_millis(50),
            Arc::new(SystemClock),
        );
        group.bench_function(format!("{name}/from the lease"), |b| {
            b.iter(|| runtime.block_on(leased.decide(&request)))
        });
    }
    group.finish();
}

criterion_group!(benches, leases);
criterion_main!(benches);
