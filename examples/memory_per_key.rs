//! Measures what one client key costs the in-process store: fills it with
//! 1,000,000 keys per algorithm and reads the resident set size from /proc.
//!
//! `cargo run --release --example memory_per_key`

use std::sync::Arc;

use floodgate_algorithm::Algorithm;
use floodgate_limiter::clock::ManualClock;
use floodgate_limiter::StateKey;
use floodgate_limiter::{Check, Enforcement, Leasing, LimitName, MemoryStore, OnFailure, Spending};

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
        Algorithm::token_bucket(100, 100_000).expect("valid numbers"),
        Algorithm::leaky_bucket(20, 200_000).expect("valid numbers"),
        Algorithm::fixed_window(1000, 3_600_000_000).expect("valid numbers"),
        Algorithm::sliding_window(600, 60_000_000).expect("valid numbers"),
        Algorithm::sliding_log(5, 60_000_000).expect("valid numbers"),
    ];
    {
        let algorithm = algorithms[which];
        let clock = Arc::new(ManualClock::new(1_800_000_000_000_000));
        let before = resident_bytes();
        let store = MemoryStore::new(KEYS, clock);
        let name = LimitName::new("per-ip");
        for identity in 0..KEYS as u128 {
            let check = Check {
                limit: floodgate_limiter::LimitId(0),
                name: name.clone(),
                algorithm,
                key: StateKey {
                    limit: 1,
                    identity: identity.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                },
                cost: 1,
                enforcement: Enforcement::Enforce,
                spending: Spending::Charge,
                on_failure: OnFailure::Local,
                leasing: Leasing::Never,
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
