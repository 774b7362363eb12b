//! What a decision costs Redis: `cargo run --release --example
//! redis_capacity -- redis://127.0.0.1:6379` (scripts/redis_capacity.sh starts
//! a Redis of its own). For each algorithm, for 1 and 3 layers, with leases
//! off and on, it makes the same decisions through floodgate's own stores
//! (64 at a time, 1,000 clients far from their limits) and reads what Redis
//! spent from `INFO commandstats`: microseconds of Redis CPU and script
//! calls per decision. The sizing rule in docs/book/redis.md comes from this table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate_algorithm::Algorithm;
use floodgate_limiter::clock::SystemClock;
use floodgate_limiter::redis::{InstanceCount, LeaseSettings, Topology};
use floodgate_limiter::StateKey;
use floodgate_limiter::{
    Check, ClockSource, Enforcement, Instances, Leased, Leasing, LimitName, OnFailure,
    RedisSettings, RedisStandalone, Spending, Store,
};

const DECISIONS: usize = 20_000;
const AT_ONCE: usize = 64;
const CLIENTS: u128 = 1_000;

fn layers(algorithm: Algorithm, count: usize, client: u128, lease: bool) -> Vec<Check> {
    (0..count)
        .map(|layer| Check {
            limit: floodgate_limiter::LimitId(layer),
            name: LimitName::new(&format!("layer-{layer}")),
            algorithm,
            key: StateKey {
                limit: layer as u64,
                identity: client,
            },
            cost: 1,
            enforcement: Enforcement::Enforce,
            spending: Spending::Charge,
            on_failure: OnFailure::Local,
            leasing: if lease {
                Leasing::Allowed
            } else {
                Leasing::Never
            },
        })
        .collect()
}

/// (usec, calls) of every command since the last CONFIG RESETSTAT.
fn spent(redis: &mut redis::Connection) -> (f64, u64) {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(redis)
        .unwrap_or_default();
    let mut usec = 0.0;
    let mut calls = 0;
    for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
        let field = |name: &str| {
            line.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        if line.starts_with("cmdstat_evalsha") || line.starts_with("cmdstat_eval:") {
            calls += field("calls=") as u64;
        }
        if !line.starts_with("cmdstat_info") && !line.starts_with("cmdstat_config") {
            usec += field("usec=");
        }
    }
    (usec, calls)
}

/// The store under measure: the standalone Redis store, leasing or not.
fn store_at(url: &str, leasing: bool) -> Arc<dyn Store> {
    let settings = |leases: bool| RedisSettings {
        topology: Topology::Standalone(url.to_owned()),
        timeout: Duration::from_secs(2),
        clock: ClockSource::Redis,
        key_prefix: "capacity".into(),
        on_failure: OnFailure::Local,
        instances: InstanceCount::Fixed(1),
        tls_ca: None,
        leases: leases.then_some(LeaseSettings {
            max: LeaseSettings::DEFAULT_MAX,
            ttl_us: LeaseSettings::DEFAULT_TTL_US,
        }),
    };
    let clock = Arc::new(SystemClock);
    let plain = RedisStandalone::new(settings(leasing), clock.clone());
    if leasing {
        Arc::new(Leased::new(
            plain,
            settings(true).leases.expect("leases"),
            Instances::fixed(1),
            Duration::from_secs(2),
            clock,
        ))
    } else {
        Arc::new(plain)
    }
}

/// Each algorithm at numbers no client of the run comes near.
fn algorithms() -> [(&'static str, Algorithm); 5] {
    let minute = 60_000_000;
    [
        (
            "token_bucket",
            Algorithm::token_bucket(1 << 20, 1_000).expect("valid"),
        ),
        (
            "fixed_window",
            Algorithm::fixed_window(1 << 20, minute).expect("valid"),
        ),
        (
            "sliding_window",
            Algorithm::sliding_window(1 << 20, minute).expect("valid"),
        ),
        (
            "sliding_log",
            Algorithm::sliding_log(1_000, minute).expect("valid"),
        ),
        (
            "leaky_bucket",
            Algorithm::leaky_bucket(1 << 20, 1).expect("valid"),
        ),
    ]
}

/// `DECISIONS` decisions of `count` layers each, `AT_ONCE` in flight.
fn drive(
    runtime: &tokio::runtime::Runtime,
    store: &Arc<dyn Store>,
    algorithm: Algorithm,
    count: usize,
    leasing: bool,
) {
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for worker in 0..AT_ONCE {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in (worker..DECISIONS).step_by(AT_ONCE) {
                    let client = (i as u128) % CLIENTS + 1;
                    let decided = store
                        .decide(&layers(algorithm, count, client, leasing))
                        .await
                        .expect("decided");
                    assert!(decided.iter().all(|d| d.allowed()), "far from the limit");
                }
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
    });
}

fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let mut admin = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("cannot reach {url}: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("| algorithm | layers | leases | Redis µs per decision | script calls per decision | decisions/s one Redis core could make |");
    println!("|---|---|---|---|---|---|");
    for (name, algorithm) in algorithms() {
        for count in [1, 3] {
            for leasing in [false, true] {
                let leasable = !matches!(name, "sliding_log" | "leaky_bucket");
                if leasing && !leasable {
                    continue;
                }
                let _: () = redis::cmd("FLUSHALL").query(&mut admin).expect("FLUSHALL");
                let store = store_at(&url, leasing);
                // The script loaded, the connection made: not counted.
                runtime
                    .block_on(store.decide(&layers(algorithm, count, 0, leasing)))
                    .expect("warm-up decision");
                let _: () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query(&mut admin)
                    .expect("RESETSTAT");
                let started = Instant::now();
                drive(&runtime, &store, algorithm, count, leasing);
                let elapsed = started.elapsed();
                let (usec, calls) = spent(&mut admin);
                let per = usec / DECISIONS as f64;
                println!(
                    "| {name} | {count} | {} | {per:.2} | {:.3} | {:.0} |",
                    if leasing { "on" } else { "off" },
                    calls as f64 / DECISIONS as f64,
                    1e6 / per.max(0.001),
                );
                eprintln!(
                    "  ({name}, {count} layers, leases {leasing}: {DECISIONS} in {elapsed:?})"
                );
            }
        }
    }
}
