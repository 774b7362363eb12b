//! Measures what one client key costs the in-process store: fills it with
//! 1,000,000 keys per algorithm and reads the resident set size from /proc.
//!
//! `cargo run --release --example memory_per_key`

use std::sync::Arc;

use floodgate::algorithm::Algorithm;
use floodgate::clock::ManualClock;
use floodgate::limiter::LocalLimiter;
use floodgate::policy::{Check, OnFailure, StateKey};

const KEYS: usize = 1_000_000;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    // Each algorithm is measured in a fresh process: freed memory stays with
    // the allocator, so a second fill in one process would read as free.
    if let Some(which) = std::env::args()
        .nth(1)
        .and_then(|a| a.parse::<usize>().ok())
    {
        measure(which);
        return;
    }
    println!("{:<16} {:>14}", "algorithm", "bytes per key");
    let me = std::env::current_exe().expect("own path");
    for which in 0..5 {
        let out = std::process::Command::new(&me)
            .arg(which.to_string())
            .output()
            .expect("run");
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
}

fn measure(which: usize) {
    let algorithms = [
        Algorithm::TokenBucket {
            capacity: 100,
            interval_us: 100_000,
        },
        Algorithm::LeakyBucket {
            capacity: 20,
            interval_us: 200_000,
        },
        Algorithm::FixedWindow {
            limit: 1000,
            window_us: 3_600_000_000,
        },
        Algorithm::SlidingWindow {
            limit: 600,
            window_us: 60_000_000,
        },
        Algorithm::SlidingLog {
            limit: 5,
            window_us: 60_000_000,
        },
    ];
    {
        let algorithm = algorithms[which];
        let clock = Arc::new(ManualClock::new(1_800_000_000_000_000));
        let before = resident_bytes();
        let store = LocalLimiter::new(KEYS, clock);
        let name: Arc<str> = Arc::from("per-ip");
        for identity in 0..KEYS as u128 {
            let check = Check {
                layer: 0,
                name: name.clone(),
                algorithm,
                key: StateKey {
                    limit: 1,
                    identity: identity.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                },
                cost: 1,
                shadow: false,
                on_failure: OnFailure::Local,
            };
            store.decide_now(std::slice::from_ref(&check));
        }
        let held = store.len();
        let after = resident_bytes();
        println!(
            "{:<16} {:>14}",
            algorithm.name(),
            (after.saturating_sub(before)) / held.max(1) as u64
        );
    }
}
