//! A load generator for the rate limit service: `cargo run --release
//! --example rls_load -- ADDR SECONDS STREAMS KEYS` makes ShouldRateLimit
//! calls to ADDR for SECONDS, STREAMS at a time on one HTTP/2 connection
//! (as Envoy multiplexes its calls), each for one of KEYS remote addresses,
//! and prints calls/s, the answers and the latency percentiles on one line.
//! scripts/rls_bench.sh runs it beside a release floodgate and adds the
//! service's CPU per decision.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

fn argument<T: std::str::FromStr>(args: &[String], at: usize, what: &str) -> T {
    args.get(at)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| {
            eprintln!("usage: rls_load ADDR SECONDS STREAMS KEYS ({what} is missing or wrong)");
            std::process::exit(2)
        })
}

#[derive(Default)]
struct Tally {
    ok: u64,
    over_limit: u64,
    errors: u64,
    latencies_us: Vec<u64>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr: String = argument(&args, 1, "ADDR");
    let seconds: u64 = argument(&args, 2, "SECONDS");
    let streams: usize = argument(&args, 3, "STREAMS");
    let keys: u64 = argument(&args, 4, "KEYS");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let tally = runtime.block_on(async move {
        let client = RateLimitServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap_or_else(|e| {
                eprintln!("cannot connect to {addr}: {e}");
                std::process::exit(1)
            });
        let until = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for stream in 0..streams {
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut n = stream as u64;
                while Instant::now() < until {
                    n = n.wrapping_add(streams as u64);
                    let address = format!(
                        "10.{}.{}.{}",
                        (n % keys) >> 16 & 255,
                        (n % keys) >> 8 & 255,
                        (n % keys) & 255
                    );
                    let request = RateLimitRequest {
                        domain: "edge".into(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "remote_address".into(),
                                value: address,
                            }],
                            ..RateLimitDescriptor::default()
                        }],
                        hits_addend: 0,
                    };
                    let started = Instant::now();
                    let answer = client.should_rate_limit(request).await;
                    tally
                        .latencies_us
                        .push(started.elapsed().as_micros() as u64);
                    match answer.map(|a| a.into_inner().overall_code) {
                        Ok(code) if code == Code::Ok as i32 => tally.ok += 1,
                        Ok(_) => tally.over_limit += 1,
                        Err(_) => tally.errors += 1,
                    }
                }
                tally
            }));
        }
        let mut all = Tally::default();
        for task in tasks {
            if let Ok(t) = task.await {
                all.ok += t.ok;
                all.over_limit += t.over_limit;
                all.errors += t.errors;
                all.latencies_us.extend(t.latencies_us);
            }
        }
        all
    });
    let mut latencies = tally.latencies_us;
    latencies.sort_unstable();
    let at = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let calls = latencies.len() as u64;
    println!(
        "calls={calls} calls_per_s={:.0} ok={} over_limit={} errors={} p50_us={} p99_us={} max_us={}",
        calls as f64 / seconds.max(1) as f64,
        tally.ok,
        tally.over_limit,
        tally.errors,
        at(0.50),
        at(0.99),
        latencies.last().copied().unwrap_or(0)
    );
}
