//! What more Cluster masters buy: `cargo run --release --example
//! redis_shards -- URL...`, the URLs of one cluster's masters
//! (scripts/redis_shards.sh makes clusters of 1, 2 and 3 masters and runs this
//! against each). Through floodgate's own cluster store it makes the same
//! decisions (token bucket, 1 and 3 layers, leases off: the case that costs
//! Redis most per request; 10,000 clients spread over the slots, far from
//! their limits, 256 at a time; then one hot client alone, whose decisions
//! share its slot's script runs) and prints one table row per case: decisions
//! a second, what the masters spent per decision in all (`INFO
//! commandstats`), the busiest master's share of it, and the CPU the client
//! process spent per decision (`/proc/self/stat`), which on a small machine
//! shares the cores with every master.

use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate_algorithm::Algorithm;
use floodgate_limiter::clock::SystemClock;
use floodgate_limiter::redis::{InstanceCount, Topology};
use floodgate_limiter::StateKey;
use floodgate_limiter::{
    Check, ClockSource, Enforcement, Leasing, LimitName, OnFailure, RedisCluster, RedisSettings,
    Spending, Store,
};

const DECISIONS: usize = 60_000;
const AT_ONCE: usize = 256;

fn layers(count: usize, client: u128) -> Vec<Check> {
    let algorithm = Algorithm::token_bucket(1 << 20, 1_000).expect("valid");
    (0..count)
        .map(|layer| Check {
            limit: floodgate_limiter::LimitId(layer),
            name: LimitName::new(&format!("layer-{layer}")),
            algorithm,
            key: StateKey {
                limit: layer as u64,
                // Spread over the hash slots: the key's hash tag is this.
                identity: client.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
            },
            cost: 1,
            enforcement: Enforcement::Enforce,
            spending: Spending::Charge,
            on_failure: OnFailure::Local,
            leasing: Leasing::Never,
        })
        .collect()
}

/// Microseconds every command but INFO and CONFIG took on one master since
/// its last CONFIG RESETSTAT.
fn spent_us(master: &mut redis::Connection) -> f64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(master)
        .unwrap_or_default();
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .filter(|l| !l.starts_with("cmdstat_info") && !l.starts_with("cmdstat_config"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix("usec="))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .sum()
}

/// This process's user + system CPU time, in clock ticks (100 a second).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which may hold spaces, in parentheses.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // utime and stime are the 14th and 15th fields; 12 and 13 after ')'.
    field(11).unwrap_or(0) + field(12).unwrap_or(0)
}

fn main() {
    let urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        eprintln!("usage: redis_shards URL... (a cluster's masters)");
        std::process::exit(2);
    }
    let mut masters: Vec<redis::Connection> = urls
        .iter()
        .map(|url| {
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .unwrap_or_else(|e| panic!("cannot reach {url}: {e}"))
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let settings = RedisSettings {
        topology: Topology::Cluster(urls.clone()),
        timeout: Duration::from_secs(2),
        clock: ClockSource::Redis,
        key_prefix: "shards".into(),
        on_failure: OnFailure::Local,
        instances: InstanceCount::Fixed(1),
        tls_ca: None,
        leases: None,
    };
    for (count, clients) in [(1, 10_000u128), (3, 10_000), (1, 1)] {
        let store: Arc<dyn Store> =
            Arc::new(RedisCluster::new(settings.clone(), Arc::new(SystemClock)));
        // The slot map read and the script loaded on every master: not counted.
        runtime.block_on(async {
            for client in 0..64 {
                store
                    .decide(&layers(count, client))
                    .await
                    .expect("warm-up decision");
            }
        });
        for master in &mut masters {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(master)
                .expect("RESETSTAT");
        }
        let ticks = cpu_ticks();
        let started = Instant::now();
        runtime.block_on(async {
            let mut tasks = Vec::new();
            for worker in 0..AT_ONCE {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    for i in (worker..DECISIONS).step_by(AT_ONCE) {
                        let client = (i as u128) % clients + 1;
                        let decided = store
                            .decide(&layers(count, client))
                            .await
                            .expect("decided on Redis");
                        assert!(decided.iter().all(|d| d.allowed()), "far from the limit");
                    }
                }));
            }
            for task in tasks {
                task.await.expect("task");
            }
        });
        let elapsed = started.elapsed().as_secs_f64();
        let client_us = (cpu_ticks() - ticks) as f64 * 10_000.0;
        let per_master: Vec<f64> = masters.iter_mut().map(spent_us).collect();
        let total: f64 = per_master.iter().sum();
        let busiest = per_master.iter().cloned().fold(0.0, f64::max);
        println!(
            "| {} | {count} | {clients} | {:.0} | {:.2} | {:.2} | {:.1} |",
            urls.len(),
            DECISIONS as f64 / elapsed,
            total / DECISIONS as f64,
            busiest / total.max(1.0),
            client_us / DECISIONS as f64,
        );
    }
}
