//! The Lua scripts against their Rust twins: the same random (time, cost)
//! sequences through a real Redis (clock = "local") and through the
//! in-process limiter must give identical decisions, peeks included.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::Rng;
use floodgate_algorithm::{
    takes_lease, Algorithm, AlgorithmError, Calendar, Decision, Period, MAX_COUNT, MAX_SCALED,
    MAX_SLIDING_LOG, MAX_WINDOW_US,
};
use floodgate_limiter::clock::ManualClock;
use floodgate_limiter::redis::{InstanceCount, Topology};
use floodgate_limiter::StateKey;
use floodgate_limiter::{
    Check, ClockSource, Enforcement, LeaseAsk, Leasing, LimitName, MemoryStore, OnFailure,
    RedisSettings, RedisStandalone, Spending, Store,
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
            limit: floodgate_limiter::LimitId(layer),
            name: LimitName::new(&format!("{name}-{layer}")),
            algorithm: *algorithm,
            key: StateKey {
                limit: layer as u64,
                identity: client,
            },
            cost,
            enforcement: if layer == 1 && rng.below(4) == 0 {
                Enforcement::Shadow
            } else {
                Enforcement::Enforce
            },
            // A layer looked up with the others (a ban, a limit charged by
            // the response): decided, never charged.
            spending: if rng.below(6) == 0 {
                Spending::Peek
            } else {
                Spending::Charge
            },
            on_failure: OnFailure::Deny,
            leasing: Leasing::Never,
        })
        .collect()
}

/// What a sequence exercised: a sequence that admits nothing (or
/// everything), or never credits, refunds or leases where it could, would
/// prove little.
#[derive(Default)]
struct Exercised {
    steps: usize,
    admitted: usize,
    credits: usize,
    refunds: usize,
    leases: usize,
}

impl Exercised {
    fn assert_enough(&self, what: &str, layer: &Algorithm) {
        let steps = self.steps;
        assert!(
            self.admitted > steps / 20 && self.admitted < steps - steps / 20,
            "{what}: admitted {} of {steps}",
            self.admitted
        );
        assert!(
            if layer.takes_credit() {
                self.credits > steps / 100
            } else {
                self.credits == 0
            },
            "{what}: {} credits gave units back",
            self.credits
        );
        assert!(
            if layer.takes_refund() {
                self.refunds > steps / 200
            } else {
                self.refunds == 0
            },
            "{what}: {} refunds gave units back",
            self.refunds
        );
        assert!(
            if takes_lease(layer.kind()) {
                self.leases > steps / 100
            } else {
                self.leases == 0
            },
            "{what}: {} leases taken",
            self.leases
        );
    }
}

/// How large a sequence's costs are.
#[derive(Clone, Copy, PartialEq)]
enum Costs {
    /// A few units: limits of up to 40.
    Few,
    /// Up to a quarter of the limit, now and then all of it or a few
    /// units: limits across their whole range.
    Shares,
}

/// The latest instant a sequence's clock reaches before it is set back (to
/// fresh clients): a year-long window jumped over thrice a step would
/// otherwise run it past the year 2255, where no double holds a µs.
const LATEST_US: u64 = 1_750_000_000_000_000 + 40 * 366 * 86_400 * 1_000_000;

/// Clients of one stretch of time; the last of them is never leased a
/// bucket's units on its ledger (`unledgered`).
const CLIENTS: u128 = 4;

/// Whether `client` takes no lease on a bucket's ledger: the client whose
/// state is read with other numbers.
fn unledgered(client: u128) -> bool {
    client % CLIENTS == CLIENTS - 1
}

/// `steps` random requests (credits, refunds and leases among them) of
/// `layers` through Redis and through the memory store, which must decide
/// each alike.
#[expect(
    clippy::too_many_lines,
    reason = "one random sequence, each kind of step beside the others"
)]
fn compare(
    redis: &RedisServer,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    layers: [Algorithm; 2],
    rng: &mut Rng,
    steps: usize,
    costs: Costs,
) -> Exercised {
    let start_us = 1_750_000_000_000_000 + rng.below(1 << 40);
    let clock = Arc::new(ManualClock::new(start_us));
    let remote = RedisStandalone::new(settings(redis.url()), clock.clone());
    let local = MemoryStore::new(100_000, clock.clone());
    let mut seen = Exercised::default();
    // Clients of the current stretch of time; a clock set back starts
    // with new ones.
    let mut clients = 0u128;
    // Reservations taken (the first layer admitted at a cost): some are
    // given back later, part or all, where they were counted.
    let mut reserved: Vec<(Check, u64)> = Vec::new();
    let mut last: Option<Decision> = None;
    // A refused request, replayed at (or just before) its retry time: the
    // instants where decisions flip, which random steps would rarely hit.
    let mut replay: Option<(Vec<Check>, u64)> = None;
    while seen.steps < steps {
        let replaying = replay.take().filter(|_| rng.below(2) == 0);
        let by_us = match &replaying {
            Some((_, retry_us)) => retry_us - rng.below(2),
            None => step_us(rng, &layers[0], last.as_ref()),
        };
        // A step past `LATEST_US` sets the clock back instead, to clients
        // never seen: a store may have forgotten the old ones' state once
        // it was idle, which it no longer is on a clock set back.
        if clock_now(&clock).saturating_add(by_us) > LATEST_US {
            clock.set(start_us + rng.below(1 << 40));
            clients += CLIENTS;
            reserved.clear();
            last = None;
            continue;
        }
        clock.advance(by_us);
        let checks: Vec<Check> = match replaying {
            Some((checks, _)) => checks,
            None => {
                let client = clients + rng.below(CLIENTS as u64) as u128;
                let quota = layers[0].quota().min(layers[1].quota());
                let cost = match (rng.below(10), costs) {
                    (0, _) => 0,
                    (1, _) => quota + 1,
                    // All of the limit, or all but a unit or two: it
                    // fits only once the window or the bucket is about
                    // empty, and waits longest.
                    (3, Costs::Shares) => quota - rng.below(quota.min(3)),
                    (4..=9, Costs::Shares) => 1 + rng.below((quota / 4).max(1)),
                    _ => 1 + rng.below(quota.min(4)),
                };
                let count = 1 + rng.below(2) as usize;
                let mut checks = request(rng, name, &layers[..count], client, cost);
                // Now and then the first layer's state read with other
                // numbers, as a reload that changed them leaves it: counts
                // above the new limit, a bucket's tat in another unit.
                // Only a client without a bucket's ledger: its units
                // outstanding weigh by the bucket's interval, so a state
                // the memory store forgot by the writer's numbers may
                // still weigh by the reader's in Redis, kept a second at
                // least (an eviction policy, not the twins' arithmetic).
                if unledgered(client) && rng.below(5) == 0 {
                    checks[0].algorithm = reloaded(&layers);
                }
                // Now and then a cost the response reported: owed in
                // full whatever is left (the balance may go below 0).
                if layers[0].owes_costs() && rng.below(8) == 0 {
                    checks.truncate(1);
                    checks[0].algorithm = checks[0].algorithm.without_ceiling();
                    checks[0].cost = rng.below(3 * layers[0].quota() + 1);
                    checks[0].spending = Spending::Charge;
                }
                checks
            }
        };
        let step = seen.steps;
        // Now and then a peek first (the script's peek mode): the same
        // answer on both, and nothing charged on either.
        if rng.below(4) == 0 {
            let peeked = runtime
                .block_on(remote.peek(&checks))
                .unwrap_or_else(|e| panic!("{name}: redis failed at step {step}: {e}"));
            assert_eq!(
                peeked,
                local.peek_at(&checks, clock_now(&clock)),
                "{name} peek at step {step}: layers {layers:?}"
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
                    spending: Spending::Peek,
                    ..credit.clone()
                }],
                clock_now(&clock),
            )[0]
            .remaining();
            let credited = runtime
                .block_on(remote.credit(&credit))
                .unwrap_or_else(|e| panic!("{name}: redis failed at step {step}: {e}"));
            assert_eq!(
                credited,
                local.credit_at(&credit, clock_now(&clock)),
                "{name} credit of {} at step {step}: layers {layers:?}",
                credit.cost
            );
            // Only credits that gave something back prove anything.
            seen.credits += usize::from(credited.remaining() > before);
        }
        // Now and then a reservation settled for less (the script's
        // refund mode): the same state after on both.
        if !reserved.is_empty() && rng.below(3) == 0 {
            let (mut refund, counted_at) =
                reserved.swap_remove(rng.below(reserved.len() as u64) as usize);
            refund.cost = 1 + rng.below(refund.cost);
            let peek = [Check {
                cost: 0,
                spending: Spending::Peek,
                ..refund.clone()
            }];
            let before = local.peek_at(&peek, clock_now(&clock))[0].remaining();
            runtime
                .block_on(remote.refund(&refund, counted_at))
                .unwrap_or_else(|e| panic!("{name}: redis failed at step {step}: {e}"));
            local.refund_at(&refund, counted_at, clock_now(&clock));
            let after = runtime
                .block_on(remote.peek(&peek))
                .unwrap_or_else(|e| panic!("{name}: redis failed at step {step}: {e}"));
            assert_eq!(
                after,
                local.peek_at(&peek, clock_now(&clock)),
                "{name} refund of {} counted at {counted_at} at step {step}: layers {layers:?}",
                refund.cost
            );
            seen.refunds += usize::from(after[0].remaining() > before);
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
                        // A bucket's ledger counts the lease this long:
                        // none, lapsing within a step or two, or long
                        // after (the clock's steps are drawn the same way).
                        life_us: match rng.below(4) {
                            _ if unledgered(checks[0].key.identity) => 0,
                            0 => 0,
                            1 => 1 + rng.below(1_000),
                            2 => 1 + rng.below(1_000_000),
                            _ => 1 + rng.below(100_000_000),
                        },
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let (expected, leased) = local.decide_leasing_at(&checks, &asks, clock_now(&clock));
        let (got, got_leased) = runtime
            .block_on(remote.decide_leasing(&checks, &asks))
            .unwrap_or_else(|e| panic!("{name}: redis failed at step {step}: {e}"));
        assert_eq!(
            got,
            expected,
            "{name} step {step}: layers {layers:?} cost {} at {} asks {asks:?}",
            checks[0].cost,
            clock_now(&clock)
        );
        assert_eq!(
            got_leased.to_vec(),
            leased.to_vec(),
            "{name} step {step}: units leased"
        );
        if let Some(&units) = leased.first().filter(|u| **u > 0) {
            seen.leases += 1;
            // A lease's units given back is a refund where the lease
            // says they are (for a bucket, its epoch in the ledger).
            reserved.push((
                Check {
                    cost: units,
                    ..checks[0].clone()
                },
                expected[0].counted_at_us(),
            ));
        }
        let all_allowed = expected.iter().all(|d| d.allowed());
        seen.admitted += usize::from(all_allowed);
        let first = &checks[0];
        if all_allowed
            && first.spending == Spending::Charge
            && first.enforcement == Enforcement::Enforce
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
        seen.steps += 1;
    }
    seen
}

/// The first layer as a reload may leave it: a bucket with the second
/// layer's numbers; a window or a quota with the second layer's limit over
/// its own window or calendar. (A window's length changed on reload is
/// read differently by the stores, each its own way: the memory store
/// forgets a state idle by the numbers that wrote it, Redis keeps it until
/// its TTL; neither is a twin's arithmetic.)
fn reloaded(layers: &[Algorithm; 2]) -> Algorithm {
    let [first, second] = layers;
    let reloaded = match first.calendar() {
        _ if first.kind().is_bucket() => return *second,
        Some(calendar) => Algorithm::calendar_quota(second.quota(), *calendar),
        None => Algorithm::new(first.kind(), second.quota(), first.period_us()),
    };
    reloaded.expect("numbers of the same kind")
}

const NAMES: [&str; 6] = [
    "token_bucket",
    "leaky_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "quota",
];

#[test]
fn lua_scripts_match_their_rust_twins() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for (which, name) in NAMES.iter().enumerate() {
        let mut rng = Rng(0xF100D + which as u64);
        // Two layers of the same kind with different numbers, on a few clients,
        // so that all-or-nothing and separate keys are compared too.
        let layers = [
            random_algorithm(&mut rng, which as u64),
            random_algorithm(&mut rng, which as u64),
        ];
        let seen = compare(&redis, &runtime, name, layers, &mut rng, 10_000, Costs::Few);
        seen.assert_enough(name, &layers[0]);
    }
}

const SEC: u64 = 1_000_000;
const DAY: u64 = 86_400 * SEC;

/// An algorithm of kind `which` from anywhere in its range: `variant` 0 and
/// 1 are its extremes (its largest numbers over its longest and shortest
/// windows, its fastest and slowest rates), 2 a random draw.
fn ranged_algorithm(rng: &mut Rng, which: u64, variant: u64) -> [Algorithm; 2] {
    let window = |rng: &mut Rng| SEC + rng.below(366 * DAY);
    let year = 1.0 / (365.0 * 86_400.0);
    let most = u64::from(u32::MAX);
    // A bucket of up to `capacity` at `rate`: as large as refills within
    // the range (71 years).
    let bucket = |capacity: u64, rate: f64| match Algorithm::token_bucket_per_second(capacity, rate)
    {
        Err(AlgorithmError::TooLargeForRate { most, .. }) => {
            Algorithm::token_bucket_per_second(most, rate)
        }
        other => other,
    };
    let pair = match (which, variant) {
        (0, 0) => [bucket(most, 1e7), bucket(most, 2.0)],
        (0, 1) => [bucket(71, year), bucket(most, 1_500_000.5)],
        (0, _) => {
            let fast =
                1_000.0 + rng.below(10_000_000 - 1_000) as f64 + rng.below(1_000) as f64 / 1e3;
            let slow = 1.0 / (1 + rng.below(365 * 86_400)) as f64;
            [
                bucket(1 + rng.below(most), fast),
                bucket(1 + rng.below(most), slow),
            ]
        }
        (1, 0) => [
            Algorithm::leaky_bucket_per_second(most, 1e6),
            Algorithm::leaky_bucket_per_second(2_251_799_813, 1.0),
        ],
        (1, _) => {
            let interval_us = 1 + rng.below(10 * SEC);
            let capacity = (MAX_SCALED / interval_us).min(1 + rng.below(most));
            [
                Algorithm::leaky_bucket(capacity, interval_us),
                Algorithm::leaky_bucket(1 + rng.below(capacity), interval_us),
            ]
        }
        (2, 0) => [
            Algorithm::fixed_window(MAX_COUNT, 366 * DAY),
            Algorithm::fixed_window(most, SEC),
        ],
        (2, 1) => [
            Algorithm::fixed_window(MAX_COUNT, MAX_WINDOW_US),
            Algorithm::fixed_window(100_000, DAY),
        ],
        (2, _) => [
            Algorithm::fixed_window(1 + rng.below(MAX_COUNT), window(rng)),
            Algorithm::fixed_window(1 + rng.below(most), window(rng)),
        ],
        (3, 0) => [
            Algorithm::sliding_window(most, 366 * DAY),
            Algorithm::sliding_window(most, SEC),
        ],
        (3, 1) => [
            Algorithm::sliding_window(4_000_000_000, 30 * DAY),
            Algorithm::sliding_window(most, MAX_WINDOW_US),
        ],
        (3, _) => [
            Algorithm::sliding_window(1 + rng.below(most), window(rng)),
            Algorithm::sliding_window(100_000 + rng.below(most - 100_000), window(rng)),
        ],
        (4, 0) => [
            Algorithm::sliding_log(MAX_SLIDING_LOG, 366 * DAY),
            Algorithm::sliding_log(MAX_SLIDING_LOG, SEC),
        ],
        (4, 1) => [
            Algorithm::sliding_log(MAX_SLIDING_LOG, MAX_WINDOW_US),
            Algorithm::sliding_log(50_000, 7 * DAY),
        ],
        (4, _) => [
            Algorithm::sliding_log(1 + rng.below(MAX_SLIDING_LOG), window(rng)),
            Algorithm::sliding_log(1 + rng.below(MAX_SLIDING_LOG), window(rng)),
        ],
        (_, variant) => {
            let calendar = |period| Calendar {
                period,
                timezone: chrono_tz::Europe::Paris,
                week_starts: chrono::Weekday::Mon,
            };
            let limit = if variant == 0 {
                MAX_COUNT
            } else {
                1 + rng.below(MAX_COUNT)
            };
            [
                Algorithm::calendar_quota(limit, calendar(Period::Month)),
                Algorithm::calendar_quota(most, calendar(Period::Day)),
            ]
        }
    };
    pair.map(|a| a.expect("numbers within the range"))
}

/// The twins agree over each algorithm's whole range, extremes included: a
/// year-long window at its largest limit, a bucket of 2^32 - 1 refilling
/// 10,000,000 a second, one refilling once a year; costs up to a quarter
/// of the limit, so that the largest limits are reached too.
#[test]
fn lua_scripts_match_their_rust_twins_across_their_whole_range() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for (which, name) in NAMES.iter().enumerate() {
        for variant in 0..3 {
            let mut rng = Rng(0x5CA1E + 16 * which as u64 + variant);
            let layers = ranged_algorithm(&mut rng, which as u64, variant);
            let label = format!("{name}-range-{variant}");
            let seen = compare(
                &redis,
                &runtime,
                &label,
                layers,
                &mut rng,
                2_500,
                Costs::Shares,
            );
            seen.assert_enough(&format!("{label} {layers:?}"), &layers[0]);
        }
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    use floodgate_limiter::clock::Clock;
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
