use super::*;
use crate::lease::lease_units;
use proptest::prelude::*;

/// `evaluate_leasing` with the lease rule's numbers, as the store asks.
fn leasing(
    capacity: u64,
    interval: Interval,
    tat: (u64, u64),
    ledger: Ledger,
    now_us: u64,
    cost: u64,
    (max, divisor, epoch_us): (u64, u64, u64),
) -> (Evaluation, Ledger, u64) {
    evaluate_leasing(
        capacity,
        interval,
        (tat, ledger),
        now_us,
        cost,
        epoch_us,
        |left| lease_units(left, max, divisor),
    )
}

const INSTANCES: usize = 3;

/// One instance's lease, as `crates/limiter/src/leases/lease.rs` holds it.
#[derive(Clone, Copy)]
struct Held {
    unused: u64,
    ends_at_us: u64,
    counted_at_us: u64,
}

#[derive(Debug, Clone)]
enum Step {
    Pause(u64),
    Request {
        instance: usize,
        cost: u64,
        lease: bool,
    },
    Return(usize),
    Die(usize),
}

fn steps(capacity: u64) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => prop_oneof![0u64..50, 0u64..5_000, 0u64..200_000].prop_map(Step::Pause),
        8 => (0..INSTANCES, 1..=capacity.div_ceil(3), any::<bool>())
            .prop_map(|(instance, cost, lease)| Step::Request { instance, cost, lease }),
        1 => (0..INSTANCES).prop_map(Step::Return),
        1 => (0..INSTANCES).prop_map(Step::Die),
    ];
    proptest::collection::vec(step, 1..400)
}

/// Every admission at its instant; the shared state as Redis holds it.
struct Fleet {
    capacity: u64,
    interval: Interval,
    epoch_us: u64,
    max: u64,
    tat: (u64, u64),
    ledger: Ledger,
    held: [Option<Held>; INSTANCES],
    admitted: Vec<(u64, u64)>,
}

impl Fleet {
    fn give_back(&mut self, instance: usize, now: u64) {
        if let Some(lease) = self.held[instance].take() {
            if lease.unused > 0 {
                if let Some((tat, ledger)) = refunded(
                    self.interval,
                    self.tat,
                    self.ledger,
                    now,
                    lease.unused,
                    lease.counted_at_us,
                ) {
                    self.tat = tat;
                    self.ledger = ledger;
                }
            }
        }
    }

    fn request(&mut self, instance: usize, cost: u64, lease: bool, now: u64) {
        if let Some(held) = &mut self.held[instance] {
            if now < held.ends_at_us && held.unused >= cost {
                held.unused -= cost;
                self.admitted.push((now, cost));
                return;
            }
        }
        self.give_back(instance, now);
        let ask = if lease {
            (self.max, 2 * INSTANCES as u64, self.epoch_us)
        } else {
            (0, 1, 0)
        };
        let (e, ledger, units) = leasing(
            self.capacity,
            self.interval,
            self.tat,
            self.ledger,
            now,
            cost,
            ask,
        );
        if e.decision.allowed() {
            if let Some(tat) = written_tat(&e.update) {
                self.tat = tat;
            }
            self.ledger = ledger;
            self.admitted.push((now, cost));
            if units > 0 {
                // A lease lives at most an epoch from when it was asked.
                self.held[instance] = Some(Held {
                    unused: units,
                    ends_at_us: now + self.epoch_us,
                    counted_at_us: e.decision.counted_at_us(),
                });
            }
        }
    }
}

/// Admitted in `[x, y]` for every two admissions' instants x <= y, against
/// `capacity + rate × (y - x)`, in the bucket's units: the largest excess
/// (negative or zero when the bound holds).
fn worst_excess(admitted: &[(u64, u64)], capacity: u64, interval: Interval) -> i128 {
    let mut worst = i128::MIN;
    for (i, &(x, _)) in admitted.iter().enumerate() {
        let mut sum = 0u128;
        for &(y, cost) in &admitted[i..] {
            sum += u128::from(cost);
            let allowed = u128::from(capacity * interval.units)
                + u128::from(y - x) * u128::from(interval.per_us);
            worst = worst.max(sum as i128 * i128::from(interval.units) - allowed as i128);
        }
    }
    worst
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Three instances on a manual clock leasing from one bucket (random
    /// costs, bursts, pauses, early returns, deaths without a return):
    /// in every interval the fleet admits at most capacity + rate × length.
    #[test]
    fn leases_never_burst_past_the_bucket(
        (capacity, units, per_us) in prop_oneof![
            (1u64..300, 1u64..2_000, Just(1u64)),
            (1u64..300, 1u64..30, Just(10u64)),
        ],
        epoch_us in 1u64..20_000,
        max in 1u64..150,
        plan in (1u64..300).prop_flat_map(steps),
    ) {
        let interval = Interval { units, per_us };
        let mut fleet = Fleet {
            capacity,
            interval,
            epoch_us,
            max,
            tat: (0, 0),
            ledger: Ledger::default(),
            held: [None; INSTANCES],
            admitted: Vec::new(),
        };
        let mut now = 1_000_000;
        for step in plan {
            match step {
                Step::Pause(us) => now += us,
                Step::Request { instance, cost, lease } => {
                    fleet.request(instance, cost.min(capacity), lease, now)
                }
                Step::Return(instance) => fleet.give_back(instance, now),
                Step::Die(instance) => fleet.held[instance] = None,
            }
            // Outstanding covers every live lease's unused units.
            let unused: u64 = fleet
                .held
                .iter()
                .flatten()
                .filter(|h| now < h.ends_at_us)
                .map(|h| h.unused)
                .sum();
            let (settled, _) = fleet.ledger.settled(interval, fleet.tat, now);
            prop_assert!(unused <= settled.outstanding());
        }
        let excess = worst_excess(&fleet.admitted, capacity, interval);
        prop_assert!(excess <= 0, "{} units past the bound", excess);
    }

    /// Without a ledger (state from before it, or no lease ever taken) a
    /// request is decided as the bucket alone decides it.
    #[test]
    fn no_ledger_is_the_bucket_alone(
        capacity in 1u64..1_000,
        units in 1u64..10_000,
        tat_us in 0u64..3_000_000,
        now_us in 0u64..3_000_000,
        cost in 0u64..1_200,
    ) {
        let interval = Interval { units, per_us: 1 };
        let (e, ledger) = evaluate(capacity, interval, (tat_us, 0), Ledger::default(), now_us, cost);
        prop_assert_eq!(e, token_bucket::evaluate(capacity, interval, (tat_us, 0), now_us, cost));
        prop_assert_eq!(ledger, Ledger::default());
    }
}

/// The defect of issue 49: at 1,000,000 a second a lease of 100 lasted
/// 100 µs. With the ledger its units stay valid for the epoch, and the
/// bucket meanwhile refills no further than capacity - outstanding.
#[test]
fn a_fast_buckets_lease_lasts_and_the_refill_stops_short_of_it() {
    let interval = Interval {
        units: 1,
        per_us: 1,
    };
    let capacity = 1_000_000;
    let epoch = 1_000_000;
    let now = 5_000_000;
    let (e, ledger, units) = leasing(
        capacity,
        interval,
        (0, 0),
        Ledger::default(),
        now,
        1,
        (100, 2, epoch),
    );
    assert_eq!(units, 100);
    assert_eq!(e.decision.counted_at_us(), 6_000_000);
    let tat = written_tat(&e.update).expect("admitted");
    // 0.9 s later the schedule alone would be full again; the ledger keeps
    // the 100 leased units (and the request's own) out of it.
    let later = now + 900_000;
    let (e, _) = evaluate(capacity, interval, tat, ledger, later, 0);
    assert_eq!(e.decision.remaining(), capacity - 101);
    // Given back, the 100 are the bucket's again.
    let (tat, ledger) =
        refunded(interval, tat, ledger, later, 100, 6_000_000).expect("still counted");
    assert_eq!(ledger.outstanding(), 1);
    let (e, _) = evaluate(capacity, interval, tat, ledger, later, 0);
    assert_eq!(e.decision.remaining(), capacity - 1);
}

/// A lease never given back (its instance died) lapses two epochs after
/// it was taken at the latest, and its units come back at the rate from
/// there, not at once.
#[test]
fn a_dead_instances_lease_lapses_into_the_refill() {
    let interval = Interval {
        units: 1_000,
        per_us: 1,
    };
    let (capacity, epoch, now) = (100, 10_000, 1_000_000);
    let (e, ledger, units) = leasing(
        capacity,
        interval,
        (0, 0),
        Ledger::default(),
        now,
        1,
        (40, 2, epoch),
    );
    assert_eq!(units, 40);
    // The state is kept until the 41 have lapsed (the epoch's end and one
    // more) and refilled (41 ms), not only until the bucket's own refill.
    assert_eq!(e.idle_at_us, 1_020_000 + 41_000);
    let tat = written_tat(&e.update).expect("admitted");
    // Before the lapse (epoch end + one epoch) the 41 (the lease and the
    // request beside it) stay out whatever the refill did; right after it
    // they are debt refilling at the rate.
    let lapse = 1_020_000;
    let (e, _) = evaluate(capacity, interval, tat, ledger, lapse - 1, 0);
    assert_eq!(e.decision.remaining(), 59);
    let (e, settled) = evaluate(capacity, interval, tat, ledger, lapse, 0);
    assert_eq!(settled, Ledger::default());
    assert_eq!(e.decision.remaining(), 59);
    let (e, _) = evaluate(capacity, interval, tat, ledger, lapse + 10_000, 0);
    assert_eq!(e.decision.remaining(), 69);
}

#[test]
fn a_return_after_the_lapse_gives_nothing() {
    let interval = Interval {
        units: 10,
        per_us: 1,
    };
    let (e, ledger, _) = leasing(100, interval, (0, 0), Ledger::default(), 0, 1, (10, 2, 50));
    let tat = written_tat(&e.update).expect("admitted");
    assert!(refunded(interval, tat, ledger, 100, 10, e.decision.counted_at_us()).is_none());
    assert!(refunded(interval, tat, ledger, 60, 10, e.decision.counted_at_us()).is_some());
}

/// The worst case a lapse must keep: a lease spent whole and never given
/// back while nothing else reaches the bucket, then a burst right after the
/// lapse. Were the units forgotten at once, the spent 40 would come back
/// together with the refill held behind them: 120 admitted in 10 ms where
/// the bound is 110.
#[test]
fn a_lapse_keeps_the_debt_of_spent_units() {
    let interval = Interval {
        units: 1_000,
        per_us: 1,
    };
    let (capacity, epoch) = (100, 10_000);
    let (e, ledger, units) = leasing(
        capacity,
        interval,
        (0, 0),
        Ledger::default(),
        0,
        1,
        (40, 2, epoch),
    );
    assert_eq!(units, 40);
    let tat = written_tat(&e.update).expect("admitted");
    // All 40 spent at 9,999 µs (the lease's last instant); the lapse is at
    // 20,000 µs, where the bucket gives 59 and no more.
    let (e, _) = evaluate(capacity, interval, tat, ledger, 20_000, 60);
    assert!(!e.decision.allowed());
    let (e, _) = evaluate(capacity, interval, tat, ledger, 20_000, 59);
    assert!(e.decision.allowed());
    assert!(worst_excess(&[(0, 1), (9_999, 40), (20_000, 59)], capacity, interval) <= 0);
}

/// A ledger that counts nothing is no ledger, however its epoch reads: it
/// is dropped at once, without stepping through the epochs since its end
/// (one past the end of time here).
#[test]
fn a_ledger_counting_nothing_is_dropped_at_once() {
    let interval = Interval {
        units: 1_000,
        per_us: 1,
    };
    let empty = Ledger {
        end_us: 10,
        epoch_us: u64::MAX,
        current: 0,
        previous: 0,
    };
    assert_eq!(
        empty.settled(interval, (5, 0), 20),
        (Ledger::default(), (5, 0))
    );
}

/// A lease joins the running epoch when it lasts no longer than the
/// epoch's leases may; a longer one would outlive its lapse, and is none.
#[test]
fn a_lease_joins_a_running_epoch_as_long_or_longer() {
    let running = Ledger {
        end_us: 2_000_000,
        epoch_us: 1_000_000,
        current: 5,
        previous: 2,
    };
    let joined = Ledger {
        current: 8,
        ..running
    };
    for epoch_us in [500_000, 1_000_000] {
        assert_eq!(running.leased(1_500_000, 3, epoch_us), Some(joined));
    }
    assert_eq!(running.leased(1_500_000, 3, 1_000_001), None);
}

/// No lease beside a request when the rule gives none (too little left)
/// or the lease has no life: the request alone, its ledger as it was.
#[test]
fn no_units_or_no_life_is_no_lease() {
    let interval = Interval {
        units: 1_000,
        per_us: 1,
    };
    let alone = evaluate(100, interval, (0, 0), Ledger::default(), 0, 1);
    for rule in [(40, 1_000, 10_000), (40, 2, 0)] {
        let (e, ledger, units) = leasing(100, interval, (0, 0), Ledger::default(), 0, 1, rule);
        assert_eq!((e, ledger, units), (alone.0, alone.1, 0), "{rule:?}");
    }
}

/// A refund counted nowhere (0, a bucket's plain admission) takes nothing
/// off a ledger, even one whose epoch before the running one began at 0.
#[test]
fn a_refund_counted_nowhere_is_no_leases() {
    let interval = Interval {
        units: 10,
        per_us: 1,
    };
    let ledger = Ledger {
        end_us: 100,
        epoch_us: 100,
        current: 3,
        previous: 5,
    };
    assert_eq!(refunded(interval, (200, 0), ledger, 50, 2, 0), None);
    assert!(refunded(interval, (200, 0), ledger, 50, 2, 100).is_some());
}
