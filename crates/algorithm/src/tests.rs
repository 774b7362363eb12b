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
    prop_oneof![
        6 => (1u64..50, 1u64..5_000_000, 0usize..6)
            .prop_map(|(n, interval_us, which)| all_algorithms(n, interval_us)[which]),
        // A token bucket counting in fractions of a µs.
        1 => (1u64..50, 1_000f64..1e7).prop_map(|(n, per_second)| {
            Algorithm::token_bucket_per_second(n, per_second).expect("valid numbers")
        }),
    ]
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
                    let capacity = quota;
                    for &(to, _) in &admitted {
                        if to >= from {
                            let refill = (to - from) * alg.per_us() / alg.period();
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
    let shared = Algorithm::token_bucket(1, MAX_SCALED)
        .expect("valid numbers")
        .divided(8);
    assert!(shared.quota() * shared.period() <= MAX_SCALED);
}

const DAY: u64 = 86_400 * SEC;

/// The limits people sell, and the largest each window algorithm takes,
/// over every window from 1 s to 366 days.
#[test]
fn windows_take_every_limit_up_to_their_range() {
    let per_window = [
        (100_000, DAY),
        (10_000, 7 * DAY),
        (50_000, 7 * DAY),
        (1_000, 30 * DAY),
        (700_000, DAY / 24),
        (4_000_000_000, 30 * DAY),
    ];
    for (limit, window_us) in per_window {
        Algorithm::fixed_window(limit, window_us).expect("a fixed window");
        Algorithm::sliding_window(limit, window_us).expect("a sliding window");
        if limit <= MAX_SLIDING_LOG {
            Algorithm::sliding_log(limit, window_us).expect("a sliding log");
        }
    }
    for window_us in [SEC, 60 * SEC, DAY, 7 * DAY, 30 * DAY, 366 * DAY] {
        let most = u64::from(u32::MAX);
        Algorithm::fixed_window(most, window_us).expect("a fixed window");
        Algorithm::sliding_window(most, window_us).expect("a sliding window");
        Algorithm::sliding_log(MAX_SLIDING_LOG, window_us).expect("a sliding log");
    }
}

/// The book's ranges (the algorithm table's `range`) are the ones checked.
#[test]
fn the_table_gives_the_ranges_the_constructors_check() {
    let window = format!("`window` 1ms to {MAX_WINDOW_DAYS}d");
    let ranges = [
        (Kind::FixedWindow, grouped(MAX_COUNT)),
        (Kind::SlidingWindow, grouped(MAX_SLIDING_WINDOW)),
        (Kind::SlidingLog, grouped(MAX_SLIDING_LOG)),
    ];
    for (kind, most) in ranges {
        let range = kind.spec().range;
        assert!(
            range.contains(&format!("`limit` up to {most} per window")),
            "{range}"
        );
        assert!(range.contains(&window), "{range}");
    }
    let quota = Kind::Quota.spec().range;
    assert!(quota.contains(&grouped(MAX_COUNT)), "{quota}");
    let bucket = Kind::TokenBucket.spec().range;
    assert!(bucket.contains(&format!("{} per second", grouped(MAX_REFILL_PER_SECOND))));
    let leaky = Kind::LeakyBucket.spec().range;
    assert!(leaky.contains(&format!("{} per second", grouped(MAX_LEAK_PER_SECOND))));
    // "4,294,967,295 needs 1.91 per second; one a year, 71"
    assert!(Algorithm::token_bucket_per_second(u64::from(u32::MAX), 1.91).is_ok());
    assert!(Algorithm::token_bucket_per_second(u64::from(u32::MAX), 1.9).is_err());
    assert_eq!(grouped(0), "0");
    assert_eq!(grouped(999), "999");
    assert_eq!(grouped(1_000), "1,000");
    assert_eq!(grouped(u64::MAX), "18,446,744,073,709,551,615");
}

/// Each range, tight: its last number is taken, the next one refused, in
/// the config's own terms.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of cases, one or two lines each"
)]
fn ranges_end_exactly_where_they_say() {
    let year = 366 * DAY;
    // Windows: the count, then the window's length.
    assert!(Algorithm::fixed_window(MAX_COUNT, year).is_ok());
    assert_eq!(
        Algorithm::fixed_window(MAX_COUNT + 1, year),
        Err(AlgorithmError::TooManyPerWindow {
            most: MAX_COUNT,
            got: MAX_COUNT + 1
        })
    );
    assert!(Algorithm::sliding_window(MAX_SLIDING_WINDOW, year).is_ok());
    let too_many = Algorithm::sliding_window(MAX_SLIDING_WINDOW + 1, SEC);
    assert_eq!(
        too_many,
        Err(AlgorithmError::TooManyPerWindow {
            most: MAX_SLIDING_WINDOW,
            got: MAX_SLIDING_WINDOW + 1
        })
    );
    assert_eq!(
        too_many.map_err(|e| e.to_string()),
        Err("at most 4,294,967,295 per window (got 4,294,967,296)".to_string())
    );
    assert!(Algorithm::sliding_log(MAX_SLIDING_LOG, year).is_ok());
    assert_eq!(
        Algorithm::sliding_log(MAX_SLIDING_LOG + 1, SEC),
        Err(AlgorithmError::LogTooLong {
            got: MAX_SLIDING_LOG + 1
        })
    );
    for kind in [Kind::FixedWindow, Kind::SlidingWindow, Kind::SlidingLog] {
        assert!(Algorithm::new(kind, 1, MAX_WINDOW_US).is_ok());
        assert_eq!(
            Algorithm::new(kind, 1, MAX_WINDOW_US + 1),
            Err(AlgorithmError::WindowTooLong)
        );
    }
    // A calendar quota counts as a fixed window does.
    let month = Calendar {
        period: Period::Month,
        timezone: chrono_tz::UTC,
        week_starts: chrono::Weekday::Mon,
    };
    assert!(Algorithm::calendar_quota(MAX_COUNT, month).is_ok());
    assert_eq!(
        Algorithm::calendar_quota(MAX_COUNT + 1, month),
        Err(AlgorithmError::TooManyPerPeriod {
            most: MAX_COUNT,
            got: MAX_COUNT + 1
        })
    );
    // A token bucket's rate: 10,000,000 a second and not a bit more.
    let fastest = MAX_REFILL_PER_SECOND as f64;
    let bucket = Algorithm::token_bucket_per_second(u64::from(u32::MAX), fastest)
        .expect("the fastest bucket");
    assert_eq!((bucket.period(), bucket.per_us()), (100_000, 1_000_000));
    assert_eq!(
        Algorithm::token_bucket_per_second(1, fastest.next_up()),
        Err(AlgorithmError::RateOutOfRange {
            most: MAX_REFILL_PER_SECOND
        })
    );
    for nonsense in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(Algorithm::token_bucket_per_second(1, nonsense).is_err());
    }
    // Its capacity: an empty bucket refills within 2^51 of its units.
    let per_second = Algorithm::token_bucket_per_second(2_251_799_813, 1.0).expect("valid");
    assert_eq!((per_second.period(), per_second.per_us()), (SEC, 1));
    assert_eq!(
        Algorithm::token_bucket_per_second(2_251_799_814, 1.0),
        Err(AlgorithmError::TooLargeForRate {
            kind: Kind::TokenBucket,
            most: 2_251_799_813,
            got: 2_251_799_814
        })
    );
    // One a year (365 days): 71 tokens refill within 71 years, 72 do not.
    let yearly = 1.0 / (365.0 * 86_400.0);
    assert!(Algorithm::token_bucket_per_second(71, yearly).is_ok());
    assert!(matches!(
        Algorithm::token_bucket_per_second(72, yearly),
        Err(AlgorithmError::TooLargeForRate { most: 71, .. })
    ));
    assert_eq!(
        Algorithm::token_bucket_per_second(1, 1.0 / (72.0 * 365.25 * 86_400.0)),
        Err(AlgorithmError::RateTooSlow)
    );
    // A leaky bucket keeps whole µs: 1,000,000 a second at most.
    assert!(Algorithm::leaky_bucket_per_second(1, 1e6).is_ok());
    assert_eq!(
        Algorithm::leaky_bucket_per_second(1, 1e6_f64.next_up()),
        Err(AlgorithmError::RateOutOfRange {
            most: MAX_LEAK_PER_SECOND
        })
    );
    // No message speaks of microseconds, which no config holds.
    let errors = [
        AlgorithmError::TooManyPerWindow { most: 1, got: 2 },
        AlgorithmError::TooManyPerPeriod { most: 1, got: 2 },
        AlgorithmError::LogTooLong { got: 2 },
        AlgorithmError::WindowTooLong,
        AlgorithmError::RateOutOfRange { most: 1 },
        AlgorithmError::RateTooSlow,
        AlgorithmError::TooLargeForRate {
            kind: Kind::LeakyBucket,
            most: 1,
            got: 2,
        },
    ];
    for error in errors {
        let text = error.to_string();
        assert!(
            !text.contains("µs") && !text.contains("micro") && !text.contains("2^"),
            "{text}"
        );
    }
}

/// A bucket's interval: whole µs where that is exact or at most 0.1% slow
/// (as before), else a decimal fraction of a µs, never a faster rate.
#[test]
fn a_bucket_keeps_its_rate_in_the_finest_unit_its_burst_allows() {
    let cases = [
        // (capacity, per second, period, per µs)
        (10, 10.0, 100_000, 1),
        (10, 3.0, 333_334, 1),
        (10, 667.0, 1_500, 1),
        (10, 1e6, 1, 1),
        (10, 3_000.0, 333_333_334, 1_000_000),
        (10, 999_999.0, 1_000_002, 1_000_000),
        (10, 1.5e6, 666_667, 1_000_000),
        (10, 1e7, 100_000, 1_000_000),
        // A burst too long for picoseconds takes the finest unit that holds it.
        (1 << 39, 3_000.0, 3_334, 10),
    ];
    for (capacity, per_second, period, per_us) in cases {
        let bucket = Algorithm::token_bucket_per_second(capacity, per_second).expect("valid");
        assert_eq!(
            (bucket.period(), bucket.per_us()),
            (period, per_us),
            "{per_second}/s"
        );
        let rate = 1e6 * bucket.per_us() as f64 / bucket.period() as f64;
        assert!(rate <= per_second, "{per_second}/s runs at {rate}/s");
        assert!(
            rate >= per_second * (1.0 - 1e-3),
            "{per_second}/s runs at {rate}/s"
        );
    }
}

/// 10,000,000 a second is 10 tokens a µs, 1 every 0.1 µs: a request of 1
/// takes a tenth of a µs of the schedule, not a whole one.
#[test]
fn a_bucket_faster_than_a_token_a_microsecond_counts_every_token() {
    let mut key = Key::new(Algorithm::token_bucket_per_second(100, 1e7).expect("valid"));
    for left in (0..100).rev() {
        let d = key.request(T0, 1);
        assert_eq!((d.allowed(), d.remaining()), (true, left));
    }
    let d = key.request(T0, 1);
    assert_eq!((d.allowed(), d.retry_after_us()), (false, 1));
    // A µs later, 10 tokens are back.
    for _ in 0..10 {
        assert!(key.request(T0 + 1, 1).allowed());
    }
    assert!(!key.request(T0 + 1, 1).allowed());
    // At +4 µs 30 tokens are back; 25 take 2.5 µs of the schedule, which
    // keeps the half: full again 9.5 µs later.
    let d = key.request(T0 + 4, 25);
    assert_eq!((d.allowed(), d.remaining()), (true, 5));
    assert_eq!(
        key.state,
        State::Gcra {
            tat_us: T0 + 13,
            tat_ps: 500_000,
            ledger: Ledger::default(),
        }
    );
    assert_eq!(
        key.peek(T0 + 4, 0).reset_after_us(),
        10,
        "9.5 µs, rounded up"
    );
    // A credit and a refund move it back by tenths too.
    let credited = key.algorithm.credit(&key.state, T0 + 4, 3);
    assert_eq!(
        credited.update,
        Update::Gcra {
            tat_us: T0 + 13,
            tat_ps: 200_000,
            ledger: Ledger::default(),
        }
    );
}

/// A tat further ahead than a finer bucket's arithmetic reaches (left by a
/// slower bucket before a reload, or a clock far behind): refused, its
/// waits counted exactly from the tat itself, and a credit reckoned from
/// 2^52 units ahead.
#[test]
fn a_tat_far_ahead_is_waited_for_exactly() {
    let alg = Algorithm::token_bucket_per_second(10, 1e7).expect("valid");
    let far = 100 * 366 * DAY;
    let key = Key {
        algorithm: alg,
        state: State::Gcra {
            tat_us: T0 + far,
            tat_ps: 300_000,
            ledger: Ledger::default(),
        },
    };
    for cost in [0, 1, 7, 8, 10] {
        let d = key.peek(T0, cost);
        assert!(!d.allowed());
        assert_eq!(d.reset_after_us(), far + 1);
        // Full at far + 0.3 µs, 1 µs of burst: `cost` tokens fit from
        // far - 0.7 + cost / 10 µs, the whole µs after.
        let retry = d.retry_after_us();
        assert_eq!(retry, far + u64::from(cost >= 8), "cost {cost}");
        assert!(key.peek(T0 + retry, cost).allowed());
        assert!(!key.peek(T0 + retry - 1, cost).allowed());
    }
    let e = alg.evaluate(&key.state, T0, 11);
    assert!(e.decision.cost_exceeds_limit());
    assert_eq!(e.idle_at_us, T0 + far + 1);
    let credited = alg.credit(&key.state, T0, 5);
    assert_eq!(
        credited.update,
        Update::Gcra {
            // 2^52 units down to whole µs, the tat's 0.3 µs, less 0.5 µs.
            tat_us: T0 + (1 << 52) / 1_000_000 - 1,
            tat_ps: 800_000,
            ledger: Ledger::default(),
        }
    );
}

/// A sliding window's steps: 1 µs while `limit * window_us` fits 2^51 (the
/// arithmetic of every window accepted before), and at least 2^18 steps a
/// window for every limit up to 2^32 - 1.
#[test]
fn a_sliding_window_weighs_in_steps_as_fine_as_exact_arithmetic_allows() {
    assert_eq!(sliding_window::steps(10, 60 * SEC), (1, 60 * SEC));
    assert_eq!(sliding_window::steps(100_000, DAY), (4, DAY / 4));
    let most = MAX_SLIDING_WINDOW;
    for window_us in [SEC, DAY, 30 * DAY, 366 * DAY, MAX_WINDOW_US] {
        for limit in [1, 1_000, 100_000, most] {
            let (step_us, steps) = sliding_window::steps(limit, window_us);
            assert!(limit * steps <= MAX_SCALED, "{limit} per {window_us}");
            assert!(step_us * steps >= window_us && step_us * (steps - 1) < window_us);
            assert!(
                steps == window_us || steps >= 1 << 18,
                "{limit} {window_us}"
            );
            if limit
                .checked_mul(window_us)
                .is_some_and(|p| p <= MAX_SCALED)
            {
                assert_eq!(step_us, 1);
            }
        }
    }
    // 2^19 steps of a minute (and a bit) for 4,294,967,295 in 366 days.
    assert_eq!(
        sliding_window::steps(most, 366 * DAY),
        (60_314_942, 524_288)
    );
}

/// A window at the top of its range, over a year: the estimate decays step
/// by step, and a refusal's retry time is the step where it passes.
#[test]
fn a_year_long_sliding_window_at_its_largest_limit() {
    let year = 366 * DAY;
    let most = MAX_SLIDING_WINDOW;
    let alg = Algorithm::sliding_window(most, year).expect("valid");
    let (step_us, steps) = sliding_window::steps(most, year);
    let mut key = Key::new(alg);
    let edge = T0 - T0 % year + year;
    // The window ends full.
    assert!(key.request(edge - 1, most).allowed());
    // Just past its edge the previous window still weighs fully.
    let d = key.request(edge, 1);
    assert!(!d.allowed());
    // previous * (steps - e) <= (most - 1) * steps  =>  e >= steps / most,
    // rounded up to a whole step: the first step.
    assert_eq!(d.retry_after_us(), step_us);
    assert!(!key.peek(edge + step_us - 1, 1).allowed());
    let d = key.peek(edge + step_us, 1);
    assert!(d.allowed());
    // Half-way, half the previous window is still in view (within a step).
    let half = key.peek(edge + year / 2, 0).remaining();
    let expected = most / 2;
    assert!(
        half.abs_diff(expected) <= most / steps + 1,
        "{half} vs {expected}"
    );
}

/// Whole per-window limits over windows that fit no µs-exact product,
/// against the twins' shared rules: a fixed window admits exactly its
/// limit, a sliding window no more than its µs-exact estimate would.
#[test]
fn a_day_of_a_hundred_thousand_admits_exactly_its_number() {
    for alg in [
        Algorithm::fixed_window(100_000, DAY).expect("valid"),
        Algorithm::sliding_window(100_000, DAY).expect("valid"),
        Algorithm::sliding_log(100_000, DAY).expect("valid"),
        Algorithm::fixed_window(4_000_000_000, 30 * DAY).expect("valid"),
        Algorithm::sliding_window(4_000_000_000, 30 * DAY).expect("valid"),
    ] {
        let mut key = Key::new(alg);
        let cost = alg.quota() / 40;
        let admitted = (0..60)
            .filter(|i| key.request(T0 + i, cost).allowed())
            .count();
        assert_eq!(admitted, 40, "{alg}");
    }
}

/// The µs-exact sliding estimate, in 128 bits: whether it admits.
fn exact_estimate_admits(
    limit: u64,
    window_us: u64,
    state: &State,
    now_us: u64,
    cost: u64,
) -> bool {
    let State::TwoWindows {
        start_us,
        current,
        previous,
    } = *state
    else {
        return cost <= limit;
    };
    let now_eff = now_us.max(start_us);
    let start = now_eff - now_eff % window_us;
    let (current, previous) = if start == start_us {
        (current, previous)
    } else if start == start_us + window_us {
        (0, current)
    } else {
        (0, 0)
    };
    let (current, previous) = (current.min(limit) as u128, previous.min(limit) as u128);
    let (w, elapsed) = (window_us as u128, (now_eff - start) as u128);
    current * w + previous * (w - elapsed) + cost as u128 * w <= limit as u128 * w
}

fn large_window() -> impl Strategy<Value = Algorithm> {
    (
        prop_oneof![
            Just(MAX_SLIDING_WINDOW),
            Just(4_000_000_000u64),
            100_000u64..=MAX_SLIDING_WINDOW,
        ],
        prop_oneof![Just(366 * DAY), Just(30 * DAY), Just(DAY), SEC..=366 * DAY],
        0usize..3,
    )
        .prop_map(|(limit, window_us, which)| {
            match which {
                0 => Algorithm::fixed_window(limit, window_us),
                1 => Algorithm::sliding_window(limit, window_us),
                _ => Algorithm::sliding_log(MAX_SLIDING_LOG, window_us),
            }
            .expect("valid numbers")
        })
}

/// Token buckets across their range: up to 2^32 - 1 tokens, from one a
/// year to 10,000,000 a second, in whole µs or in fractions of one.
fn large_bucket() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (
            1u64..=u64::from(u32::MAX),
            prop_oneof![Just(1e7), 2.0f64..1e7, 1_000f64..1e7],
        ),
        (1u64..=71, Just(1.0 / (365.0 * 86_400.0))),
        (1u64..1_000, 1e-4f64..10.0),
    ]
    .prop_filter_map("refills within 71 years", |(capacity, rate)| {
        Algorithm::token_bucket_per_second(capacity, rate).ok()
    })
}

/// (time step in µs, a share of the quota a request costs)
fn large_steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![
                4 => 0u64..1_000,
                3 => 0u64..DAY,
                2 => 0u64..40 * DAY,
            ],
            prop_oneof![Just(0u64), 1u64..4, 4u64..=1_000],
        ),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// At the top of their range (a year-long window at its largest
    /// limit, a bucket of 2^32 - 1 refilling 10,000,000 a second), a
    /// refused request is admitted exactly `retry_after` later and not a
    /// µs sooner, no window admits beyond its limit, and a sliding window
    /// never admits what its µs-exact estimate would refuse.
    #[test]
    fn the_largest_limits_stay_exact(
        alg in prop_oneof![large_window(), large_bucket()],
        steps in large_steps(),
    ) {
        let mut key = Key::new(alg);
        let mut now = T0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (step, share) in steps {
            now += step;
            // 0, a few units, or a share of the quota up to all of it.
            let cost = if share < 4 { share } else { (alg.quota() as u128 * share as u128 / 1_000) as u64 };
            if alg.kind() == Kind::SlidingWindow {
                let exact = exact_estimate_admits(alg.quota(), alg.period_us(), &key.state, now, cost);
                let stepped = key.peek(now, cost).allowed();
                prop_assert!(exact || !stepped, "{} admitted past its estimate at {}", alg, now);
            }
            let d = key.request(now, cost);
            prop_assert!(d.remaining() <= alg.quota());
            if d.allowed() {
                admitted.push((now, cost));
            } else if !d.cost_exceeds_limit() {
                prop_assert!(d.retry_after_us() > 0);
                prop_assert!(key.peek(now + d.retry_after_us(), cost).allowed(),
                    "{} not admitted at retry time: {:?}", alg, d);
                prop_assert!(!key.peek(now + d.retry_after_us() - 1, cost).allowed(),
                    "{} admitted before retry time: {:?}", alg, d);
            }
        }
        for &(from, _) in &admitted {
            let (quota, window_us) = (alg.quota(), alg.period_us());
            match alg.kind() {
                Kind::FixedWindow | Kind::SlidingWindow => {
                    let start = from - from % window_us;
                    prop_assert!(admitted_between(&admitted, start, start + window_us - 1) <= quota);
                }
                Kind::SlidingLog => {
                    prop_assert!(admitted_between(&admitted, from, from + window_us - 1) <= quota);
                }
                _ => {
                    for &(to, _) in &admitted {
                        if to >= from {
                            let refill = u128::from(to - from) * u128::from(alg.per_us()) / u128::from(alg.period());
                            prop_assert!(u128::from(admitted_between(&admitted, from, to)) <= u128::from(quota) + refill);
                        }
                    }
                }
            }
        }
    }
}

/// Requests of the same µs share one stamp, their units added up; the log
/// holds one entry per µs, which is what a key's memory grows with.
#[test]
fn a_sliding_log_keeps_one_entry_per_microsecond() {
    let w = 10 * SEC;
    let mut key = Key::new(Algorithm::sliding_log(10, w).expect("valid numbers"));
    let entries = |key: &Key| match &key.state {
        State::Log(log) => (log.len(), log.is_empty()),
        other => panic!("not a log: {other:?}"),
    };
    assert_eq!(entries(&key), (0, true));
    assert_eq!(key.request(T0, 1).remaining(), 9);
    assert_eq!(key.request(T0, 2).remaining(), 7);
    assert_eq!(entries(&key), (1, false));
    // Both requests' units, 3, are in the one entry.
    assert_eq!(key.peek(T0, 0).remaining(), 7);
    assert_eq!(key.request(T0 + 1, 3).remaining(), 4);
    assert_eq!(entries(&key), (2, false));
    // The first µs's 3 units leave together, a window after it.
    assert_eq!(key.peek(T0 + w, 0).remaining(), 7);
}

/// A refund finds its units by their stamp: none once the stamp is gone
/// (or never was), and the log is left as it is.
#[test]
fn a_sliding_log_refunds_only_a_stamp_it_holds() {
    let w = 10 * SEC;
    let alg = Algorithm::sliding_log(10, w).expect("valid numbers");
    let mut key = Key::new(alg);
    let d = key.request(T0, 4);
    assert_eq!(d.counted_at_us(), T0);
    let unknown = alg.refund(&key.state, T0 + 1, 4, T0 + 1);
    assert_eq!(unknown.update, Update::Unchanged);
    assert_eq!(unknown.decision.remaining(), 6);
    let known = alg.refund(&key.state, T0 + 1, 3, T0);
    assert_eq!(
        known.update,
        Update::LogRemove {
            stamp_us: T0,
            units: 3
        }
    );
    assert_eq!(known.decision.remaining(), 9);
}

/// A sliding window's reset is the end of the running window, whatever
/// the estimate says.
#[test]
fn a_sliding_window_resets_when_its_window_ends() {
    let w = 60 * SEC;
    let mut key = Key::new(Algorithm::sliding_window(10, w).expect("valid numbers"));
    let d = key.request(T0 + 5 * SEC, 10);
    assert_eq!((d.allowed(), d.reset_after_us()), (true, 55 * SEC));
    let d = key.request(T0 + 20 * SEC, 1);
    assert_eq!(
        (d.allowed(), d.reset_after_us(), d.retry_after_us()),
        (false, 40 * SEC, 40 * SEC + 6 * SEC)
    );
}

/// A window cut into coarse steps that do not divide it (4 µs steps over
/// 3 * 2^20 + 1 µs): the last step is cut short at the window's end, and
/// a request that waits out the whole previous window is admitted there,
/// not where the last step would have ended.
#[test]
fn a_sliding_window_retry_stops_at_its_end_not_its_last_steps() {
    let limit = 1 << 31;
    let w = 3 * (1 << 20) + 1;
    assert_eq!(sliding_window::steps(limit, w), (4, 786_433));
    let mut key = Key::new(Algorithm::sliding_window(limit, w).expect("valid numbers"));
    let start = T0 - T0 % w + w;
    assert!(key.request(start, limit).allowed());
    let d = key.request(start + w, limit);
    assert_eq!((d.allowed(), d.retry_after_us()), (false, w));
    assert!(!key.peek(start + 2 * w - 1, limit).allowed());
    assert!(key.peek(start + 2 * w, limit).allowed());
}

/// A refused token bucket resets when its tat is reached, not a µs later.
#[test]
fn a_refused_token_bucket_resets_at_its_tat() {
    let mut key = Key::new(token_bucket(2, 1));
    assert!(key.request(T0, 2).allowed());
    let d = key.request(T0 + SEC / 2, 1);
    assert_eq!(
        (d.allowed(), d.reset_after_us(), d.retry_after_us()),
        (false, 3 * SEC / 2, SEC / 2)
    );
    let e = key.algorithm.evaluate(&key.state, T0 + SEC / 2, 3);
    assert!(e.decision.cost_exceeds_limit());
    assert_eq!(
        (e.decision.reset_after_us(), e.idle_at_us),
        (3 * SEC / 2, T0 + 2 * SEC)
    );
}

/// A tat a fraction of a µs past now (a finer bucket's, before a reload
/// to whole µs) is a unit of debt: the full bucket's last token is not
/// there yet, and is a µs later.
#[test]
fn a_tat_a_fraction_ahead_is_a_unit_of_debt() {
    let ahead = State::Gcra {
        tat_us: T0,
        tat_ps: 1,
        ledger: Ledger::default(),
    };
    for alg in [
        Algorithm::token_bucket(1, 10).expect("valid numbers"),
        Algorithm::token_bucket_per_second(3, 3_000.0).expect("valid numbers"),
    ] {
        let key = Key {
            algorithm: alg,
            state: ahead.clone(),
        };
        let all = alg.quota();
        let d = key.peek(T0, all);
        assert_eq!(
            (d.allowed(), d.remaining(), d.retry_after_us()),
            (false, all - 1, 1),
            "{alg}"
        );
        assert!(key.peek(T0 + 1, all).allowed(), "{alg}");
    }
}

fn month() -> Calendar {
    Calendar {
        period: Period::Month,
        timezone: chrono_tz::UTC,
        week_starts: chrono::Weekday::Mon,
    }
}

/// Every refusal in the config's own words, and the number of the limit's
/// config it is about (the one config names in its error).
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of cases, one or two lines each"
)]
fn each_refusal_says_what_is_wrong_and_with_which_number() {
    let tb = Kind::TokenBucket;
    let lb = Kind::LeakyBucket;
    let cases = [
        (
            tb,
            Algorithm::token_bucket(0, SEC),
            "must be a whole number of at least 1",
            Parameter::Capacity,
        ),
        (
            tb,
            Algorithm::token_bucket(1, 0),
            "must be at least 1ms",
            Parameter::RefillRate,
        ),
        (
            tb,
            Algorithm::token_bucket_per_second(1, 0.0),
            "must be more than 0 and at most 10,000,000 per second",
            Parameter::RefillRate,
        ),
        (
            tb,
            Algorithm::token_bucket_per_second(1, f64::MIN_POSITIVE),
            "too slow: one unit would take more than 71 years",
            Parameter::RefillRate,
        ),
        (
            tb,
            Algorithm::token_bucket_per_second(2_251_799_814, 1.0),
            "at most 2,251,799,813 at this refill_rate (got 2,251,799,814): \
             an empty bucket must refill within 71 years",
            Parameter::Capacity,
        ),
        (
            lb,
            Algorithm::leaky_bucket(0, SEC),
            "must be a whole number of at least 1",
            Parameter::Capacity,
        ),
        (
            lb,
            Algorithm::leaky_bucket_per_second(1, 0.0),
            "must be more than 0 and at most 1,000,000 per second",
            Parameter::Rate,
        ),
        (
            lb,
            Algorithm::leaky_bucket_per_second(1, f64::MIN_POSITIVE),
            "too slow: one unit would take more than 71 years",
            Parameter::Rate,
        ),
        (
            lb,
            Algorithm::leaky_bucket_per_second(2_251_799_814, 1.0),
            "at most 2,251,799,813 at this rate (got 2,251,799,814): \
             a full waiting room must drain within 71 years",
            Parameter::Capacity,
        ),
        (
            Kind::FixedWindow,
            Algorithm::fixed_window(MAX_COUNT + 1, SEC),
            "at most 2,251,799,813,685,248 per window (got 2,251,799,813,685,249)",
            Parameter::Limit,
        ),
        (
            Kind::FixedWindow,
            Algorithm::fixed_window(1, 0),
            "must be at least 1ms",
            Parameter::Window,
        ),
        (
            Kind::SlidingWindow,
            Algorithm::sliding_window(1, MAX_WINDOW_US + 1),
            "must be at most 26062d (71 years)",
            Parameter::Window,
        ),
        (
            Kind::SlidingLog,
            Algorithm::sliding_log(MAX_SLIDING_LOG + 1, SEC),
            "sliding_log keeps one stamp per request: at most 100,000 per window \
             (got 100,001); use sliding_window for more",
            Parameter::Limit,
        ),
        (
            Kind::Quota,
            Algorithm::calendar_quota(0, month()),
            "must be a whole number of at least 1",
            Parameter::Limit,
        ),
        (
            Kind::Quota,
            Algorithm::calendar_quota(MAX_COUNT + 1, month()),
            "at most 2,251,799,813,685,248 per period (got 2,251,799,813,685,249)",
            Parameter::Limit,
        ),
        (
            Kind::Quota,
            Algorithm::new(Kind::Quota, 1, DAY),
            "a calendar quota is made with its calendar (Algorithm::calendar_quota)",
            Parameter::Limit,
        ),
    ];
    for (kind, result, message, parameter) in cases {
        let error = result.expect_err(message);
        assert_eq!(
            (error.to_string().as_str(), error.parameter(kind)),
            (message, parameter)
        );
    }
}

/// A rate that is no positive number is out of range, not too slow.
#[test]
fn a_rate_that_is_no_positive_number_is_out_of_range() {
    for nonsense in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(
            Algorithm::token_bucket_per_second(1, nonsense),
            Err(AlgorithmError::RateOutOfRange {
                most: MAX_REFILL_PER_SECOND
            }),
            "{nonsense}"
        );
        assert_eq!(
            Algorithm::leaky_bucket_per_second(1, nonsense),
            Err(AlgorithmError::RateOutOfRange {
                most: MAX_LEAK_PER_SECOND
            }),
            "{nonsense}"
        );
    }
}

/// The slowest rate either bucket takes: one unit every 2^51 µs (71
/// years); one every 2^51 + 1 µs is too slow.
#[test]
fn the_slowest_rate_is_one_unit_in_2_51_microseconds() {
    let slowest = 1e6 / MAX_SCALED as f64;
    let too_slow = 1e6 / (MAX_SCALED + 1) as f64;
    let token = Algorithm::token_bucket_per_second(1, slowest).expect("the slowest bucket");
    assert_eq!((token.period(), token.per_us()), (MAX_SCALED, 1));
    let leaky = Algorithm::leaky_bucket_per_second(1, slowest).expect("the slowest bucket");
    assert_eq!((leaky.period(), leaky.per_us()), (MAX_SCALED, 1));
    assert_eq!(
        Algorithm::token_bucket_per_second(1, too_slow),
        Err(AlgorithmError::RateTooSlow)
    );
    assert_eq!(
        Algorithm::leaky_bucket_per_second(1, too_slow),
        Err(AlgorithmError::RateTooSlow)
    );
}

/// A leaky bucket's departures are whole µs apart, the interval rounded
/// up: never faster than its rate.
#[test]
fn a_leaky_bucket_spaces_departures_in_whole_microseconds_rounded_up() {
    for (per_second, interval_us) in [(1.0, SEC), (3.0, 333_334), (7.0, 142_858), (1e6, 1)] {
        let alg = Algorithm::leaky_bucket_per_second(10, per_second).expect("valid");
        assert_eq!(
            (alg.period(), alg.per_us(), alg.period_us()),
            (interval_us, 1, interval_us),
            "{per_second}/s"
        );
    }
}

/// One of each algorithm, in the table's order.
fn one_of_each() -> [Algorithm; 6] {
    [
        Algorithm::token_bucket(10, 1_000).expect("valid"),
        Algorithm::sliding_window(10, 60 * SEC).expect("valid"),
        Algorithm::fixed_window(10, 60 * SEC).expect("valid"),
        Algorithm::sliding_log(10, 60 * SEC).expect("valid"),
        Algorithm::leaky_bucket(10, 1_000).expect("valid"),
        Algorithm::calendar_quota(10, month()).expect("valid"),
    ]
}

/// What each algorithm is and offers: its name, its calendar, and whether
/// a cost can be owed to it, units credited or a reservation refunded.
#[test]
fn each_algorithm_says_what_it_offers() {
    let offers: Vec<_> = one_of_each()
        .iter()
        .map(|a| {
            (
                a.name(),
                a.calendar().copied(),
                a.owes_costs(),
                a.takes_credit(),
                a.takes_refund(),
            )
        })
        .collect();
    assert_eq!(
        offers,
        [
            ("token_bucket", None, true, true, true),
            ("sliding_window", None, false, false, true),
            ("fixed_window", None, true, true, true),
            ("sliding_log", None, false, false, true),
            ("leaky_bucket", None, false, false, false),
            ("quota", Some(month()), true, true, true),
        ]
    );
}

/// Without its ceiling a window or a quota counts up to 2^51, a bucket's
/// debt spans up to 2^51 of its units (at least one token's worth); the
/// rest of the limit is as it was.
#[test]
fn a_limit_without_its_ceiling_counts_up_to_2_51() {
    let quotas: Vec<_> = one_of_each()
        .iter()
        .filter(|a| a.owes_costs())
        .map(|a| {
            let owed = a.without_ceiling();
            assert_eq!(
                (owed.kind(), owed.period(), owed.per_us(), owed.calendar()),
                (a.kind(), a.period(), a.per_us(), a.calendar()),
            );
            owed.quota()
        })
        .collect();
    assert_eq!(quotas, [MAX_SCALED / 1_000, MAX_COUNT, MAX_COUNT]);
    let slowest = Algorithm::token_bucket(1, MAX_SCALED).expect("valid");
    assert_eq!(slowest.without_ceiling().quota(), 1);
}

/// A limit shared by `n` instances: each takes its share of the quota (at
/// least 1) and, a bucket, of the rate; a window keeps its length.
#[test]
fn a_limit_divided_among_instances() {
    let bucket = Algorithm::token_bucket(10, 1_000).expect("valid");
    let window = Algorithm::fixed_window(10, 60 * SEC).expect("valid");
    let shares = |alg: Algorithm, n: u64| {
        let share = alg.divided(n);
        assert_eq!(
            (share.kind(), share.per_us(), share.calendar()),
            (alg.kind(), alg.per_us(), alg.calendar())
        );
        (share.quota(), share.period())
    };
    assert_eq!(shares(bucket, 3), (3, 3_000));
    assert_eq!(shares(bucket, 0), (10, 1_000));
    assert_eq!(shares(window, 3), (3, 60 * SEC));
    assert_eq!(shares(window, 20), (1, 60 * SEC));
    // Fewer tokens than instances: one token each, at the rate divided as
    // the others' is.
    let small = Algorithm::token_bucket(2, 1_000).expect("valid");
    assert_eq!(shares(small, 4), (1, 4_000));
    // ... unless that rate would be slower than a token in 2^51 µs.
    let slow = Algorithm::token_bucket(2, MAX_SCALED / 2).expect("valid");
    assert_eq!(shares(slow, 4), (1, MAX_SCALED));
    // A large bucket's share is held within what its own quota allows
    // (2^51 / 10,000 units), which its divided rate is well within.
    let large = Algorithm::token_bucket(20_000, 1_000).expect("valid");
    assert_eq!(shares(large, 2), (10_000, 2_000));
}

/// The quota's window (`w=`): a window's length, a quota's usual period,
/// a bucket's time to refill from empty (or to drain when full), rounded
/// up to the µs.
#[test]
fn the_window_a_client_is_told() {
    let windows: Vec<_> = one_of_each().iter().map(Algorithm::window_us).collect();
    assert_eq!(
        windows,
        [10_000, 60 * SEC, 60 * SEC, 60 * SEC, 10_000, 30 * DAY]
    );
    // 3 tokens at 3,000 a second: 1 ms, and the rounding up of a
    // 333.333334 µs interval.
    let fine = Algorithm::token_bucket_per_second(3, 3_000.0).expect("valid");
    assert_eq!(fine.window_us(), 1_001);
}

/// A leaky bucket reading a token bucket's tat (a reload that changed the
/// algorithm): a fraction of a µs is a µs more of its schedule.
#[test]
fn a_leaky_bucket_rounds_a_fraction_of_its_schedule_up() {
    let alg = Algorithm::leaky_bucket(2, 10).expect("valid");
    for (tat_ps, next_us) in [(0, T0 + 5), (300_000, T0 + 6)] {
        let state = State::Gcra {
            tat_us: T0 + 5,
            tat_ps,
            ledger: Ledger::default(),
        };
        let e = alg.evaluate(&state, T0, 1);
        assert_eq!(e.decision.delay_us(), next_us - T0, "{tat_ps} ps");
        assert_eq!(
            e.update,
            Update::Gcra {
                tat_us: next_us + 10,
                tat_ps: 0,
                ledger: Ledger::default(),
            }
        );
    }
}

/// How `floodgate check` and the logs show a limit: a bucket's rate per
/// second, a window in its largest whole unit, a quota's calendar.
#[test]
fn each_algorithm_displays_its_numbers_as_config_writes_them() {
    let shown = [
        (
            Algorithm::token_bucket(10, 100_000),
            "token_bucket capacity=10 refill_rate=10.000/s",
        ),
        (
            Algorithm::token_bucket_per_second(3, 3_000.0),
            "token_bucket capacity=3 refill_rate=3000.000/s",
        ),
        (
            Algorithm::leaky_bucket_per_second(5, 3.0),
            "leaky_bucket capacity=5 rate=3.000/s",
        ),
        (
            Algorithm::fixed_window(100, 3_600 * SEC),
            "fixed_window limit=100 window=1h",
        ),
        (
            Algorithm::sliding_window(100, 90 * 60 * SEC),
            "sliding_window limit=100 window=90m",
        ),
        (
            Algorithm::sliding_log(100, 61 * SEC),
            "sliding_log limit=100 window=61s",
        ),
        (
            Algorithm::fixed_window(100, 1_500_000),
            "fixed_window limit=100 window=1500ms",
        ),
        (
            Algorithm::calendar_quota(1_000, month()),
            "quota limit=1000 period=month timezone=UTC",
        ),
    ];
    for (alg, text) in shown {
        assert_eq!(alg.expect(text).to_string(), text);
    }
}

/// A credit gives back the running window's or period's count only, down
/// to zero, and nothing where nothing is counted (cost-0 decisions write
/// nothing, so any update there is the credit's).
#[test]
fn a_credit_lowers_the_running_count_and_no_other() {
    let window = Algorithm::fixed_window(10, 60 * SEC).expect("valid numbers");
    let mut key = Key::new(window);
    assert!(key.request(T0 + SEC, 4).allowed());
    let now = T0 + 2 * SEC;
    let credited = window.credit(&key.state, now, 3);
    assert_eq!(
        credited.update,
        Update::Window {
            start_us: T0,
            count: 1
        }
    );
    assert_eq!(credited.decision.remaining(), 9);
    let all = window.credit(&key.state, now, 100);
    assert_eq!(
        all.update,
        Update::Window {
            start_us: T0,
            count: 0
        }
    );
    // The next window's count is another: the old one is spent anyway.
    let next = T0 + 60 * SEC + 1;
    assert_eq!(window.credit(&key.state, next, 3).update, Update::Unchanged);
    let zero = State::Window {
        start_us: T0,
        count: 0,
    };
    assert_eq!(window.credit(&zero, now, 3).update, Update::Unchanged);
    // The window before, however short: a second's window a second on.
    let second = Algorithm::fixed_window(10, SEC).expect("valid numbers");
    let mut key = Key::new(second);
    assert!(key.request(T0, 4).allowed());
    assert_eq!(
        second.credit(&key.state, T0 + SEC, 3).update,
        Update::Unchanged
    );

    let day = Calendar {
        period: Period::Day,
        timezone: chrono_tz::UTC,
        week_starts: chrono::Weekday::Mon,
    };
    let quota = Algorithm::calendar_quota(10, day).expect("valid numbers");
    let end = day.period_end_us(now);
    let mut key = Key::new(quota);
    assert!(key.request(now, 4).allowed());
    let credited = quota.credit(&key.state, now + SEC, 3);
    assert_eq!(
        credited.update,
        Update::Period {
            end_us: end,
            count: 1
        }
    );
    assert_eq!(credited.decision.remaining(), 9);
    // The next day's count is another.
    assert_eq!(quota.credit(&key.state, end, 3).update, Update::Unchanged);
    let zero = State::Period {
        end_us: end,
        count: 0,
    };
    assert_eq!(quota.credit(&zero, now, 3).update, Update::Unchanged);
}

/// A refund lowers the count its units were counted in, and only while
/// that window or period runs: another's count is not its to lower.
#[test]
fn a_refund_lowers_only_the_count_its_units_are_in() {
    let window = Algorithm::fixed_window(10, 60 * SEC).expect("valid numbers");
    let mut key = Key::new(window);
    let reserved = key.request(T0 + SEC, 4);
    assert_eq!(reserved.counted_at_us(), T0);
    let refunded = window.refund(&key.state, T0 + 2 * SEC, 4, T0);
    assert_eq!(
        refunded.update,
        Update::Window {
            start_us: T0,
            count: 0
        }
    );
    let next = T0 + 60 * SEC;
    assert!(key.request(next, 5).allowed());
    assert_eq!(
        window.refund(&key.state, next + 1, 4, T0).update,
        Update::Unchanged
    );

    let day = Calendar {
        period: Period::Day,
        timezone: chrono_tz::UTC,
        week_starts: chrono::Weekday::Mon,
    };
    let quota = Algorithm::calendar_quota(10, day).expect("valid numbers");
    let end = day.period_end_us(T0);
    let mut key = Key::new(quota);
    assert_eq!(key.request(T0, 4).counted_at_us(), end);
    let refunded = quota.refund(&key.state, T0 + SEC, 4, end);
    assert_eq!(
        refunded.update,
        Update::Period {
            end_us: end,
            count: 0
        }
    );
    assert!(key.request(end, 5).allowed());
    assert_eq!(
        quota.refund(&key.state, end + 1, 4, end).update,
        Update::Unchanged
    );
}

/// A token bucket's lease, given back through `refund`, leaves the
/// ledger: the bucket has the leased units again at once.
#[test]
fn a_refunded_lease_is_the_buckets_again() {
    let bucket = Algorithm::token_bucket(1_000, 1_000).expect("valid numbers");
    let key = Key::new(bucket);
    let (e, units) = bucket.evaluate_leasing(&key.state, T0, 1, (100, 2, SEC));
    assert_eq!(units, 100);
    let counted_at = e.decision.counted_at_us();
    assert_ne!(counted_at, 0, "a lease is counted at its epoch's end");
    let mut state = key.state.clone();
    state.apply(&e.update);
    let later = T0 + 900_000;
    assert_eq!(
        bucket.evaluate(&state, later, 0).decision.remaining(),
        1_000 - 101
    );
    let refunded = bucket.refund(&state, later, 100, counted_at);
    state.apply(&refunded.update);
    assert_eq!(
        bucket.evaluate(&state, later, 0).decision.remaining(),
        1_000 - 1
    );
}

/// A sliding window's refund: from the running window's count, or from
/// the previous one's while it still weighs; nothing from a count of zero
/// or a window gone by.
#[test]
fn a_sliding_windows_refund_finds_its_window() {
    let alg = Algorithm::sliding_window(10, 60 * SEC).expect("valid numbers");
    let two = |start_us, current, previous| Update::TwoWindows {
        start_us,
        current,
        previous,
    };
    let mut key = Key::new(alg);
    assert_eq!(key.request(T0 + SEC, 4).counted_at_us(), T0);
    assert_eq!(
        alg.refund(&key.state, T0 + 2 * SEC, 3, T0).update,
        two(T0, 1, 0)
    );
    let next = T0 + 60 * SEC;
    assert!(key.request(next, 5).allowed());
    assert_eq!(
        alg.refund(&key.state, next + 1, 3, T0).update,
        two(next, 5, 1)
    );
    assert_eq!(
        alg.refund(&key.state, next + 1, 3, next).update,
        two(next, 2, 4)
    );
    let gone = T0 + 120 * SEC;
    assert!(key.request(gone, 1).allowed());
    assert_eq!(
        alg.refund(&key.state, gone + 1, 3, T0).update,
        Update::Unchanged
    );
    let zeros = State::TwoWindows {
        start_us: next,
        current: 0,
        previous: 0,
    };
    for counted_at in [T0, next] {
        assert_eq!(
            alg.refund(&zeros, next + 1, 3, counted_at).update,
            Update::Unchanged
        );
    }
    // A fixed window's or a quota's count of zero: nothing to give back.
    let window = Algorithm::fixed_window(10, 60 * SEC).expect("valid numbers");
    let zero = State::Window {
        start_us: T0,
        count: 0,
    };
    assert_eq!(
        window.refund(&zero, T0 + 1, 3, T0).update,
        Update::Unchanged
    );
    let day = Calendar {
        period: Period::Day,
        timezone: chrono_tz::UTC,
        week_starts: chrono::Weekday::Mon,
    };
    let quota = Algorithm::calendar_quota(10, day).expect("valid numbers");
    let end = day.period_end_us(T0);
    let zero = State::Period {
        end_us: end,
        count: 0,
    };
    assert_eq!(
        quota.refund(&zero, T0 + 1, 3, end).update,
        Update::Unchanged
    );
}
