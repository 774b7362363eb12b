use proptest::prelude::*;

use super::*;

const SEC: u64 = 1_000_000;
/// A multiple of every window the tables use, so windows start at T0.
const T0: u64 = 1_700_000_040 * SEC;

/// One key's state driven through a sequence of requests.
struct Key {
    algorithm: Algorithm,
    state: State,
}

impl Key {
    fn new(algorithm: Algorithm) -> Self {
        Key {
            algorithm,
            state: algorithm.fresh_state(),
        }
    }

    fn request(&mut self, now_us: u64, cost: u64) -> Decision {
        let e = self.algorithm.evaluate(&self.state, now_us, cost);
        if e.decision.allowed() {
            self.state.apply(&e.update);
        }
        e.decision
    }

    fn peek(&self, now_us: u64, cost: u64) -> Decision {
        self.algorithm.evaluate(&self.state, now_us, cost).decision
    }
}

fn token_bucket(capacity: u64, per_second: u64) -> Algorithm {
    Algorithm::token_bucket(capacity, SEC / per_second).expect("valid numbers")
}

/// (offset from T0 in µs, cost, expected allowed, expected remaining, expected retry µs)
type Step = (u64, u64, bool, u64, u64);

fn run_table(algorithm: Algorithm, steps: &[Step]) {
    let mut key = Key::new(algorithm);
    for (i, &(at, cost, allowed, remaining, retry)) in steps.iter().enumerate() {
        let d = key.request(T0 + at, cost);
        assert_eq!(
            (d.allowed(), d.remaining(), d.retry_after_us()),
            (allowed, remaining, retry),
            "{} step {i} at +{at}µs cost {cost}: {d:?}",
            algorithm.name()
        );
    }
}

#[test]
fn token_bucket_boundaries() {
    run_table(
        token_bucket(3, 1),
        &[
            (0, 1, true, 2, 0),
            (0, 1, true, 1, 0),
            (0, 1, true, 0, 0),
            (0, 1, false, 0, SEC),
            (SEC - 1, 1, false, 0, 1),
            (SEC, 1, true, 0, 0),
            // two tokens needed, none left: two intervals
            (SEC, 2, false, 0, 2 * SEC),
            // a long idle gap refills only up to capacity
            (100 * SEC, 0, true, 3, 0),
            (100 * SEC, 3, true, 0, 0),
        ],
    );
}

#[test]
fn leaky_bucket_schedules_slots() {
    // 2 per second, 2 may wait: the first goes at once, two wait, the fourth is refused.
    let mut key = Key::new(Algorithm::leaky_bucket(2, SEC / 2).expect("valid numbers"));
    let delays: Vec<(bool, u64)> = (0..4)
        .map(|_| {
            let d = key.request(T0, 1);
            (d.allowed(), d.delay_us())
        })
        .collect();
    assert_eq!(
        delays,
        vec![(true, 0), (true, SEC / 2), (true, SEC), (false, 0)]
    );
    let refused = key.peek(T0, 1);
    assert_eq!(refused.retry_after_us(), SEC / 2);
    assert!(!key.peek(T0 + SEC / 2 - 1, 1).allowed());
    let d = key.request(T0 + SEC / 2, 1);
    assert_eq!((d.allowed(), d.delay_us()), (true, SEC));
}

#[test]
fn fixed_window_boundaries_and_edge_burst() {
    let w = 60 * SEC;
    let alg = Algorithm::fixed_window(2, w).expect("valid numbers");
    run_table(
        alg,
        &[
            (0, 1, true, 1, 0),
            (w - 1, 1, true, 0, 0),
            (w - 1, 1, false, 0, 1),
            // the edge: a fresh window right after a full one
            (w, 1, true, 1, 0),
            (w, 1, true, 0, 0),
            (w + 5, 1, false, 0, w - 5),
        ],
    );
}

#[test]
fn sliding_window_refuses_the_edge_burst_and_decays() {
    let w = 60 * SEC;
    let alg = Algorithm::sliding_window(10, w).expect("valid numbers");
    let mut key = Key::new(alg);
    for _ in 0..10 {
        assert!(key.request(T0 + w - 1, 1).allowed());
    }
    // Just after the edge the previous window still weighs almost fully.
    let d = key.request(T0 + w, 1);
    assert!(!d.allowed());
    // previous=10 must fall to 9: 10 * (w - e) <= 9 * w  =>  e >= w / 10
    assert_eq!(d.retry_after_us(), w / 10);
    assert!(!key.peek(T0 + w + w / 10 - 1, 1).allowed());
    assert!(key.peek(T0 + w + w / 10, 1).allowed());
}

#[test]
fn sliding_log_is_exact() {
    let w = 10 * SEC;
    let alg = Algorithm::sliding_log(3, w).expect("valid numbers");
    run_table(
        alg,
        &[
            (0, 1, true, 2, 0),
            (SEC, 2, true, 0, 0),
            // the first stamp leaves at exactly +10 s
            (2 * SEC, 1, false, 0, 8 * SEC),
            (w - 1, 1, false, 0, 1),
            (w, 1, true, 0, 0),
            // two units share the stamp at +1 s: both leave at +11 s
            (w, 2, false, 0, SEC),
        ],
    );
}

#[test]
fn cost_above_limit_is_refused_for_good() {
    for alg in all_algorithms(5, SEC) {
        let mut key = Key::new(alg);
        let d = key.request(T0, 6);
        assert!(
            !d.allowed() && d.cost_exceeds_limit(),
            "{}: {d:?}",
            alg.name()
        );
        let later = key.request(T0 + 1_000 * SEC, 6);
        assert!(!later.allowed() && later.cost_exceeds_limit());
        assert!(key.request(T0, 5).allowed(), "{}", alg.name());
    }
}

#[test]
fn cost_zero_peeks_without_consuming() {
    for alg in all_algorithms(2, SEC) {
        let mut key = Key::new(alg);
        for _ in 0..5 {
            let d = key.request(T0, 0);
            assert!(d.allowed(), "{}", alg.name());
            assert_eq!(d.remaining(), alg.quota(), "{}", alg.name());
        }
        assert_eq!(key.state, alg.fresh_state(), "{}", alg.name());
    }
}

fn all_algorithms(n: u64, interval_us: u64) -> [Algorithm; 6] {
    [0, 1, 2, 3, 4, 5].map(|which| one_algorithm(which, n, interval_us).expect("valid numbers"))
}

/// The `which`th algorithm with `n` units, one every `interval_us`.
fn one_algorithm(which: usize, n: u64, interval_us: u64) -> Result<Algorithm, AlgorithmError> {
    let window_us = n * interval_us;
    match which {
        0 => Algorithm::token_bucket(n, interval_us),
        1 => Algorithm::leaky_bucket(n, interval_us),
        2 => Algorithm::fixed_window(n, window_us),
        3 => Algorithm::sliding_window(n, window_us),
        4 => Algorithm::sliding_log(n, window_us),
        _ => Algorithm::calendar_quota(
            n,
            Calendar {
                period: Period::Day,
                timezone: chrono_tz::America::New_York,
                week_starts: chrono::Weekday::Mon,
            },
        ),
    }
}

fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    (1u64..50, 1u64..5_000_000, 0usize..6)
        .prop_map(|(n, interval_us, which)| all_algorithms(n, interval_us)[which])
}

/// (time step in µs, possibly backwards; cost)
fn any_steps() -> impl Strategy<Value = Vec<(i64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![
                8 => 0i64..2_000_000,
                1 => -5_000_000i64..0,
                1 => 0i64..(1i64 << 40),
            ],
            0u64..8,
        ),
        1..200,
    )
}

/// Units admitted in [from, to], for checking bounds afterwards.
fn admitted_between(log: &[(u64, u64)], from: u64, to: u64) -> u64 {
    log.iter()
        .filter(|&&(t, _)| t >= from && t <= to)
        .map(|&(_, c)| c)
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// A refused request is admitted exactly `retry_after` later and not a
    /// microsecond sooner, whatever came before.
    #[test]
    fn retry_after_is_exact(alg in any_algorithm(), steps in any_steps()) {
        let mut key = Key::new(alg);
        let mut now = T0;
        for (step, cost) in steps {
            now = now.saturating_add_signed(step);
            let d = key.request(now, cost);
            if !d.allowed() && !d.cost_exceeds_limit() {
                prop_assert!(d.retry_after_us() > 0);
                prop_assert!(key.peek(now + d.retry_after_us(), cost).allowed(),
                    "{} not admitted at retry time: {:?}", alg.name(), d);
                prop_assert!(!key.peek(now + d.retry_after_us() - 1, cost).allowed(),
                    "{} admitted before retry time: {:?}", alg.name(), d);
            }
            prop_assert!(d.remaining() <= alg.quota());
        }
    }

    /// A reservation given back is as if it had never been taken: a key that
    /// reserves and later refunds decides every other request exactly as a
    /// key that never reserved. (A bucket's refund is exact at the
    /// reservation's instant; later, tokens that would have come back while
    /// the bucket was full are not made up.)
    #[test]
    fn a_refund_undoes_its_reservation(alg in any_algorithm(), steps in prop::collection::vec((0u64..2_000_000, 0u64..6, 0u8..4), 1..200)) {
        prop_assume!(alg.takes_refund());
        let bucket = alg.kind() == Kind::TokenBucket;
        let (mut reserving, mut plain) = (Key::new(alg), Key::new(alg));
        let mut pending: Vec<(u64, u64)> = Vec::new();
        let mut now = T0;
        for (step, cost, what) in steps {
            now += step;
            match what {
                // A reservation, on one key only; a bucket's given back at once.
                0 => {
                    let d = reserving.request(now, cost);
                    if d.allowed() && cost > 0 {
                        pending.push((cost, d.counted_at_us()));
                    }
                    if bucket {
                        for (units, at) in pending.drain(..) {
                            let e = alg.refund(&reserving.state, now, units, at);
                            reserving.state.apply(&e.update);
                        }
                    }
                }
                1 if !pending.is_empty() => {
                    let (units, at) = pending.remove(0);
                    let e = alg.refund(&reserving.state, now, units, at);
                    reserving.state.apply(&e.update);
                }
                _ => {}
            }
            if pending.is_empty() {
                prop_assert_eq!(
                    reserving.peek(now, cost),
                    plain.peek(now, cost),
                    "{} at {}", alg.name(), now
                );
                if what >= 2 {
                    prop_assert_eq!(reserving.request(now, cost), plain.request(now, cost));
                }
            }
        }
    }

    /// Over any forward-moving sequence no algorithm admits beyond its bound.
    #[test]
    fn never_admits_beyond_the_bound(alg in any_algorithm(), steps in prop::collection::vec((0u64..3_000_000, 0u64..8), 1..300)) {
        let mut key = Key::new(alg);
        let mut now = T0;
        let mut admitted = Vec::new();
        for (step, cost) in steps {
            now += step;
            if key.request(now, cost).allowed() {
                admitted.push((now, cost));
            }
        }
        for &(from, _) in &admitted {
            let (quota, period_us) = (alg.quota(), alg.period_us());
            match alg.kind() {
                Kind::TokenBucket => {
                    let (capacity, interval_us) = (quota, period_us);
                    for &(to, _) in &admitted {
                        if to >= from {
                            let refill = (to - from) / interval_us;
                            prop_assert!(admitted_between(&admitted, from, to) <= capacity + refill);
                        }
                    }
                }
                Kind::LeakyBucket => {
                    let (capacity, interval_us) = (quota, period_us);
                    for &(to, _) in &admitted {
                        if to >= from {
                            let drained = (to - from) / interval_us;
                            // one leaves at once, `capacity` more wait
                            prop_assert!(admitted_between(&admitted, from, to) <= capacity + 1 + drained + 7);
                        }
                    }
                }
                Kind::SlidingLog => {
                    let (limit, window_us) = (quota, period_us);
                    prop_assert!(admitted_between(&admitted, from, from + window_us - 1) <= limit);
                }
                Kind::FixedWindow | Kind::SlidingWindow => {
                    let (limit, window_us) = (quota, period_us);
                    let start = from - from % window_us;
                    prop_assert!(admitted_between(&admitted, start, start + window_us - 1) <= limit);
                }
                Kind::Quota => {
                    let end = alg.script_period_at(from);
                    prop_assert!(admitted_between(&admitted, from, end - 1) <= quota);
                }
            }
        }
    }

    /// Long idle gaps, huge parameters and clocks that jump backwards never
    /// panic (debug builds trap on overflow) nor leave state the next request
    /// cannot use.
    #[test]
    fn survives_extremes(n in 1u64..1_000_000, interval_us in 1u64..1_000_000_000, which in 0usize..5, steps in any_steps(), start in 0u64..(1u64 << 52)) {
        // The largest numbers an algorithm can be built with.
        let n = if which == 4 { n.min(MAX_SLIDING_LOG) } else { n };
        let alg = one_algorithm(which, n, interval_us)
            .or_else(|_| one_algorithm(which, n, 1))
            .expect("valid numbers");
        let mut key = Key::new(alg);
        let mut now = start;
        for (step, cost) in steps {
            now = now.saturating_add_signed(step).min(1u64 << 52);
            let d = key.request(now, cost.min(n));
            prop_assert!(d.remaining() <= alg.quota());
        }
    }
}

#[test]
fn leaky_bucket_departures_are_spaced() {
    let interval_us = SEC / 5;
    let mut key = Key::new(Algorithm::leaky_bucket(20, interval_us).expect("valid numbers"));
    let mut departures: Vec<u64> = (0..30)
        .filter_map(|i| {
            let now = T0 + i * 1_000;
            let d = key.request(now, 1);
            d.allowed().then_some(now + d.delay_us())
        })
        .collect();
    assert_eq!(departures.len(), 21);
    departures.sort_unstable();
    for pair in departures.windows(2) {
        assert!(pair[1] - pair[0] >= interval_us, "{pair:?}");
    }
}

#[test]
fn idle_state_is_indistinguishable_from_fresh() {
    for alg in all_algorithms(4, SEC / 3) {
        let mut key = Key::new(alg);
        let mut idle_at = T0;
        for i in 0..4 {
            let e = alg.evaluate(&key.state, T0 + i, 1);
            if e.decision.allowed() {
                key.state.apply(&e.update);
            }
            idle_at = idle_at.max(e.idle_at_us);
        }
        let fresh = Key::new(alg);
        for cost in 0..=4 {
            assert_eq!(
                key.peek(idle_at, cost),
                fresh.peek(idle_at, cost),
                "{} cost {cost}",
                alg.name()
            );
        }
    }
}

#[test]
fn numbers_that_would_break_the_arithmetic_build_no_algorithm() {
    assert_eq!(
        Algorithm::token_bucket(10, 0),
        Err(AlgorithmError::ZeroPeriod)
    );
    assert_eq!(
        Algorithm::fixed_window(0, SEC),
        Err(AlgorithmError::ZeroQuota)
    );
    assert_eq!(
        Algorithm::sliding_window(1 << 30, 1 << 30),
        Err(AlgorithmError::TooLarge)
    );
    assert_eq!(
        Algorithm::sliding_log(MAX_SLIDING_LOG + 1, SEC),
        Err(AlgorithmError::LogTooLong)
    );
    let shared = Algorithm::token_bucket(1, MAX_EXACT / 4)
        .expect("valid numbers")
        .divided(8);
    assert!(shared.quota() * shared.period_us() <= MAX_EXACT / 4);
}
