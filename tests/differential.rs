//! The Lua scripts against their Rust twins: the same random (time, cost)
//! sequences through a real Redis (clock = "local") and through the
//! in-process limiter must give identical decisions, peeks included.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::Rng;
use floodgate::algorithm::{takes_lease, Algorithm, Calendar, Decision, Period};
use floodgate::clock::ManualClock;
use floodgate::limiter::redis::{InstanceCount, Topology};
use floodgate::limiter::StateKey;
use floodgate::limiter::{
    Check, ClockSource, LeaseAsk, LimitName, MemoryStore, OnFailure, RedisSettings,
    RedisStandalone, Store,
};

fn settings(url: String) -> RedisSettings {
    RedisSettings {
        topology: Topology::Standalone(url),
        timeout: Duration::from_secs(5),
        clock: ClockSource::Local,
        key_prefix: "diff".into(),
        on_failure: OnFailure::Deny,
        instances: InstanceCount::Fixed(1),
        tls_ca: None,
        leases: None,
    }
}

fn random_algorithm(rng: &mut Rng, which: u64) -> Algorithm {
    let n = 1 + rng.below(40);
    let interval_us = 1 + rng.below(2_000_000);
    let window_us = 1_000 + rng.below(5_000_000);
    match which {
        0 => Algorithm::token_bucket(n, interval_us).expect("valid numbers"),
        1 => Algorithm::leaky_bucket(n, interval_us).expect("valid numbers"),
        2 => Algorithm::fixed_window(n, window_us).expect("valid numbers"),
        3 => Algorithm::sliding_window(n, window_us).expect("valid numbers"),
        4 => Algorithm::sliding_log(n, window_us).expect("valid numbers"),
        // A zone with DST, and days: many boundaries crossed, some of
        // them 23 or 25 hours apart.
        _ => Algorithm::calendar_quota(
            n,
            Calendar {
                period: Period::Day,
                timezone: chrono_tz::Europe::Paris,
                week_starts: chrono::Weekday::Mon,
            },
        )
        .expect("valid numbers"),
    }
}

/// Random steps, and steps that land exactly on (or next to) the instants
/// where decisions flip: the last retry and reset times, whole intervals.
fn step_us(rng: &mut Rng, algorithm: &Algorithm, last: Option<&Decision>) -> u64 {
    let scale = algorithm.window_us().max(1) / algorithm.quota().max(1);
    let nudge = |t: u64, rng: &mut Rng| match rng.below(3) {
        0 => t.saturating_sub(1),
        1 => t,
        _ => t + 1,
    };
    match (rng.below(10), last) {
        (0, _) => 0,
        (1, _) => rng.below(algorithm.window_us().saturating_mul(3).max(1)),
        (2 | 3, Some(d)) if d.retry_after_us() > 0 => nudge(d.retry_after_us(), rng),
        (4, Some(d)) => nudge(d.reset_after_us(), rng),
        (5, _) => nudge(scale * (1 + rng.below(3)), rng),
        _ => rng.below(scale.saturating_mul(2).max(2)),
    }
}

/// One request of `client` through `layers` (limit i keyed by layer i); the
/// second layer is sometimes a shadow one, and any may be a peek.
fn request(rng: &mut Rng, name: &str, layers: &[Algorithm], client: u128, cost: u64) -> Vec<Check> {
    layers
        .iter()
        .enumerate()
        .map(|(layer, algorithm)| Check {
            limit: floodgate::limiter::LimitId(layer),
            name: LimitName::new(&format!("{name}-{layer}")),
            algorithm: *algorithm,
            key: StateKey {
                limit: layer as u64,
                identity: client,
            },
            cost,
            shadow: layer == 1 && rng.below(4) == 0,
            // A layer looked up with the others (a ban, a limit charged by
            // the response): decided, never charged.
            peek: rng.below(6) == 0,
            on_failure: OnFailure::Deny,
            lease: false,
        })
        .collect()
}

#[test]
fn lua_scripts_match_their_rust_twins() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let names = [
        "token_bucket",
        "leaky_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "quota",
    ];
    for (which, name) in names.iter().enumerate() {
        let mut rng = Rng(0xF100D + which as u64);
        let clock = Arc::new(ManualClock::new(1_750_000_000_000_000 + rng.below(1 << 40)));
        let remote = RedisStandalone::new(settings(redis.url()), clock.clone());
        let local = MemoryStore::new(100_000, clock.clone());
        // Two layers of the same kind with different numbers, on a few clients,
        // so that all-or-nothing and separate keys are compared too.
        let layers = [
            random_algorithm(&mut rng, which as u64),
            random_algorithm(&mut rng, which as u64),
        ];
        let mut steps = 0;
        let mut admitted = 0;
        let mut credits = 0;
        let mut refunds = 0;
        let mut leases = 0;
        // Reservations taken (the first layer admitted at a cost): some are
        // given back later, part or all, where they were counted.
        let mut reserved: Vec<(Check, u64)> = Vec::new();
        let mut last: Option<Decision> = None;
        // A refused request, replayed at (or just before) its retry time: the
        // instants where decisions flip, which random steps would rarely hit.
        let mut replay: Option<(Vec<Check>, u64)> = None;
        while steps < 10_000 {
            let checks: Vec<Check> = match replay.take().filter(|_| rng.below(2) == 0) {
                Some((checks, retry_us)) => {
                    clock.advance(retry_us - rng.below(2));
                    checks
                }
                None => {
                    clock.advance(step_us(&mut rng, &layers[0], last.as_ref()));
                    let client = rng.below(3) as u128;
                    let quota = layers[0].quota().min(layers[1].quota());
                    let cost = match rng.below(10) {
                        0 => 0,
                        1 => quota + 1,
                        _ => 1 + rng.below(quota.min(4)),
                    };
                    let count = 1 + rng.below(2) as usize;
                    let mut checks = request(&mut rng, name, &layers[..count], client, cost);
                    // Now and then a cost the response reported: owed in
                    // full whatever is left (the balance may go below 0).
                    if layers[0].owes_costs() && rng.below(8) == 0 {
                        checks.truncate(1);
                        checks[0].algorithm = checks[0].algorithm.without_ceiling();
                        checks[0].cost = rng.below(3 * layers[0].quota() + 1);
                        checks[0].peek = false;
                    }
                    checks
                }
            };
            // Now and then a peek first (the script's peek mode): the same
            // answer on both, and nothing charged on either.
            if rng.below(4) == 0 {
                let peeked = runtime
                    .block_on(remote.peek(&checks))
                    .unwrap_or_else(|e| panic!("{name}: redis failed at step {steps}: {e}"));
                assert_eq!(
                    peeked,
                    local.peek_at(&checks, clock_now(&clock)),
                    "{name} peek at step {steps}"
                );
            }
            // Now and then an operator's credit on the first layer (the
            // script's credit mode): the same state after on both, which the
            // decision below and the later ones compare.
            if rng.below(12) == 0 {
                let mut credit = checks[0].clone();
                credit.algorithm = layers[0];
                credit.cost = 1 + rng.below(layers[0].quota() + 2);
                let before = local.peek_at(
                    &[Check {
                        cost: 0,
                        peek: true,
                        ..credit.clone()
                    }],
                    clock_now(&clock),
                )[0]
                .remaining();
                let credited = runtime
                    .block_on(remote.credit(&credit))
                    .unwrap_or_else(|e| panic!("{name}: redis failed at step {steps}: {e}"));
                assert_eq!(
                    credited,
                    local.credit_at(&credit, clock_now(&clock)),
                    "{name} credit of {} at step {steps}",
                    credit.cost
                );
                // Only credits that gave something back prove anything.
                credits += usize::from(credited.remaining() > before);
            }
            // Now and then a reservation settled for less (the script's
            // refund mode): the same state after on both.
            if !reserved.is_empty() && rng.below(3) == 0 {
                let (mut refund, counted_at) =
                    reserved.swap_remove(rng.below(reserved.len() as u64) as usize);
                refund.cost = 1 + rng.below(refund.cost);
                let peek = [Check {
                    cost: 0,
                    peek: true,
                    ..refund.clone()
                }];
                let before = local.peek_at(&peek, clock_now(&clock))[0].remaining();
                runtime
                    .block_on(remote.refund(&refund, counted_at))
                    .unwrap_or_else(|e| panic!("{name}: redis failed at step {steps}: {e}"));
                local.refund_at(&refund, counted_at, clock_now(&clock));
                let after = runtime
                    .block_on(remote.peek(&peek))
                    .unwrap_or_else(|e| panic!("{name}: redis failed at step {steps}: {e}"));
                assert_eq!(
                    after,
                    local.peek_at(&peek, clock_now(&clock)),
                    "{name} refund of {} counted at {counted_at} at step {steps}",
                    refund.cost
                );
                refunds += usize::from(after[0].remaining() > before);
            }
            // Now and then leases asked beside the layers (the script's
            // lease mode): the same decisions and the same units leased.
            let asks: Vec<Option<LeaseAsk>> = if rng.below(3) == 0 {
                checks
                    .iter()
                    .map(|_| {
                        (rng.below(4) != 0).then(|| LeaseAsk {
                            max: 1 + rng.below(20),
                            divisor: 1 + rng.below(6),
                        })
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let (expected, leased) = local.decide_leasing_at(&checks, &asks, clock_now(&clock));
            let (got, got_leased) = runtime
                .block_on(remote.decide_leasing(&checks, &asks))
                .unwrap_or_else(|e| panic!("{name}: redis failed at step {steps}: {e}"));
            assert_eq!(
                got,
                expected,
                "{name} step {steps}: layers {layers:?} cost {} at {} asks {asks:?}",
                checks[0].cost,
                clock_now(&clock)
            );
            assert_eq!(
                got_leased.to_vec(),
                leased.to_vec(),
                "{name} step {steps}: units leased"
            );
            if let Some(&units) = leased.first().filter(|u| **u > 0) {
                leases += 1;
                // A lease's units given back is a refund where the lease
                // says they are (for a bucket, where its tokens end).
                reserved.push((
                    Check {
                        cost: units,
                        ..checks[0].clone()
                    },
                    expected[0].counted_at_us(),
                ));
            }
            let all_allowed = expected.iter().all(|d| d.allowed());
            admitted += usize::from(all_allowed);
            let first = &checks[0];
            if all_allowed
                && !first.peek
                && !first.shadow
                && first.cost > 0
                && first.cost <= first.algorithm.quota()
            {
                reserved.push((first.clone(), expected[0].counted_at_us()));
                if reserved.len() > 8 {
                    reserved.remove(0);
                }
            }
            let retry_us = expected
                .iter()
                .map(|d| d.retry_after_us())
                .max()
                .unwrap_or(0);
            if !all_allowed && retry_us > 0 {
                replay = Some((checks, retry_us));
            }
            last = expected.first().copied();
            steps += 1;
        }
        // A sequence that admits nothing (or everything) would prove little.
        assert!(
            admitted > 500 && admitted < 9_500,
            "{name}: admitted {admitted} of {steps}"
        );
        assert!(
            if layers[0].takes_credit() {
                credits > 100
            } else {
                credits == 0
            },
            "{name}: {credits} credits gave units back"
        );
        assert!(
            if layers[0].takes_refund() {
                refunds > 50
            } else {
                refunds == 0
            },
            "{name}: {refunds} refunds gave units back"
        );
        assert!(
            if takes_lease(layers[0].kind()) {
                leases > 100
            } else {
                leases == 0
            },
            "{name}: {leases} leases taken"
        );
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    use floodgate::clock::Clock;
    clock.now_us()
}

/// Requests that share one script run (what a busy proxy sends) are decided
/// exactly as the same requests one after the other, in order, at one
/// instant: several of them on the same client, so a later one sees what an
/// earlier one in the same run charged.
#[test]
fn requests_sharing_a_script_run_decide_as_if_one_after_another() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for which in 0..6u64 {
        let mut rng = Rng(0xBA7C4 + which);
        let clock = Arc::new(ManualClock::new(1_750_000_000_000_000 + rng.below(1 << 40)));
        let remote = RedisStandalone::new(settings(redis.url()), clock.clone());
        let local = MemoryStore::new(100_000, clock.clone());
        let layers = [
            random_algorithm(&mut rng, which),
            random_algorithm(&mut rng, which),
        ];
        let mut admitted = 0;
        let mut refused = 0;
        for run in 0..300 {
            clock.advance(step_us(&mut rng, &layers[0], None));
            let requests: Vec<Vec<Check>> = (0..1 + rng.below(20))
                .map(|_| {
                    let client = rng.below(3) as u128;
                    let count = 1 + rng.below(2) as usize;
                    let cost = rng.below(3);
                    request(
                        &mut rng,
                        &format!("batch-{which}"),
                        &layers[..count],
                        client,
                        cost,
                    )
                })
                .collect();
            let expected: Vec<Vec<Decision>> = requests
                .iter()
                .map(|checks| local.decide_now(checks))
                .collect();
            let borrowed: Vec<&[Check]> = requests.iter().map(Vec::as_slice).collect();
            let got = runtime
                .block_on(remote.decide_together(&borrowed))
                .unwrap_or_else(|e| panic!("algorithm {which}: redis failed in run {run}: {e}"));
            assert_eq!(
                got, expected,
                "algorithm {which} run {run}: layers {layers:?}"
            );
            for decisions in &expected {
                if decisions[0].allowed() {
                    admitted += 1;
                } else {
                    refused += 1;
                }
            }
        }
        assert!(
            admitted > 100 && refused > 100,
            "algorithm {which}: admitted {admitted}, refused {refused}"
        );
    }
}
