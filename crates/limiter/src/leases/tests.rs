use std::sync::Arc;

use proptest::prelude::*;

use super::take::Taken;
use super::*;
use crate::check::{Enforcement, Leasing, LimitName, OnFailure, Spending};
use crate::clock::ManualClock;
use crate::fake::{FakeStore, SEC, T0};
use crate::memory::MemoryStore;
use floodgate_algorithm::{Algorithm, Kind};

const MAX: u64 = 20;
const TTL_US: u64 = SEC;

fn leasing(algorithm: Algorithm, identity: u128, cost: u64) -> Check {
    Check {
        limit: crate::LimitId(0),
        name: LimitName::new("hot"),
        algorithm,
        key: StateKey { limit: 7, identity },
        cost,
        enforcement: Enforcement::Enforce,
        spending: Spending::Charge,
        on_failure: OnFailure::Deny,
        leasing: Leasing::Allowed,
    }
}

fn leased(store: &FakeStore, clock: &Arc<ManualClock>, instances: u64) -> Leased<FakeStore> {
    Leased::new(
        store.clone(),
        LeaseSettings {
            max: MAX,
            ttl_us: TTL_US,
        },
        crate::Instances::fixed(instances),
        Duration::from_millis(50),
        clock.clone(),
    )
    // Leases age by the test's clock alone: on a loaded machine the real
    // one would end them at moments no run repeats.
    .with_monotonic(clock.clone())
}

/// Series that belong to no registry.
fn lease_metrics() -> LeaseMetrics {
    LeaseMetrics {
        taken: prometheus::IntCounter::new("taken", "t").unwrap(),
        decisions: prometheus::IntCounter::new("decisions", "d").unwrap(),
        returned_units: prometheus::IntCounter::new("returned", "r").unwrap(),
        held: prometheus::IntGauge::new("held", "h").unwrap(),
    }
}

/// Lets the background tasks run (time is paused: a sleep moves it on at
/// once) until `done`, for at most `ticks` of the expiry task.
async fn until(ticks: usize, mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..ticks {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    done()
}

fn setup() -> (Arc<ManualClock>, FakeStore) {
    let clock = Arc::new(ManualClock::new(T0));
    let store = FakeStore::new(clock.clone());
    (clock, store)
}

/// What the shared state has left for `check` (a cost-0 look).
fn shared_remaining(store: &FakeStore, check: &Check, now_us: u64) -> u64 {
    let look = Check {
        cost: 0,
        spending: Spending::Peek,
        ..check.clone()
    };
    store.memory().peek_at(std::slice::from_ref(&look), now_us)[0].remaining()
}

#[tokio::test]
async fn far_from_the_limit_the_lease_decides_and_the_store_is_asked_once_per_lease() {
    let (_clock, store) = setup();
    let gate = leased(&store, &_clock, 1);
    let check = leasing(Algorithm::fixed_window(10_000, 60 * SEC).unwrap(), 1, 1);
    for _ in 0..=MAX {
        let decided = gate.decide(std::slice::from_ref(&check)).await.unwrap();
        assert!(decided[0].allowed());
    }
    // One call took the request and a lease of MAX; the MAX after it came
    // from the lease.
    assert_eq!(store.decisions(), 1);
    assert_eq!(shared_remaining(&store, &check, T0), 10_000 - 1 - MAX);
    let decided = gate.decide(std::slice::from_ref(&check)).await.unwrap();
    assert!(decided[0].allowed());
    assert_eq!(store.decisions(), 2, "an empty lease is fetched again");
    // What the headers say: the shared state's units and the lease's.
    assert_eq!(decided[0].remaining(), 10_000 - MAX - 2);
}

#[tokio::test]
async fn nothing_is_leased_before_operators_changes_are_heard() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1).until_listening();
    let check = leasing(Algorithm::fixed_window(10_000, 60 * SEC).unwrap(), 1, 1);
    for _ in 0..5 {
        assert!(gate.decide(std::slice::from_ref(&check)).await.unwrap()[0].allowed());
    }
    // Each decided by the store, nothing taken ahead: the subscription's
    // first forgetting would drop a lease without giving it back.
    assert_eq!(store.decisions(), 5);
    assert_eq!(shared_remaining(&store, &check, T0), 10_000 - 5);
    assert_eq!(gate.leases_held(), 0);
    let forgetter = gate.forgetter();
    forgetter.forget_all();
    forgetter.listening();
    for _ in 0..5 {
        assert!(gate.decide(std::slice::from_ref(&check)).await.unwrap()[0].allowed());
    }
    assert_eq!(store.decisions(), 6, "one call, then the lease");
    assert_eq!(gate.leases_held(), 1);
}

#[tokio::test]
async fn near_the_limit_every_request_is_decided_by_the_store_and_the_limit_holds() {
    let (clock, store) = setup();
    let instances = 3;
    let gates: Vec<_> = (0..instances)
        .map(|_| leased(&store, &clock, instances))
        .collect();
    let check = leasing(Algorithm::fixed_window(30, 60 * SEC).unwrap(), 1, 1);
    let mut admitted = 0;
    for round in 0..40 {
        let gate = &gates[round % gates.len()];
        if gate.decide(std::slice::from_ref(&check)).await.unwrap()[0].allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 30, "all of the budget, and not one more");
    // The last units are never leased: below 2 × instances units left, each
    // request was the store's.
    let calls = store.decisions();
    assert!(calls > 10 && calls < 40, "{calls} store calls");
}

#[tokio::test]
async fn a_lease_never_outlives_its_window_and_what_it_did_not_use_goes_back() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    // A window that starts at T0: the lease ends at most a tenth of it on.
    let window = 5 * SEC;
    let check = leasing(Algorithm::fixed_window(1_000, window).unwrap(), 1, 1);
    gate.decide(std::slice::from_ref(&check)).await.unwrap();
    assert_eq!(shared_remaining(&store, &check, T0), 1_000 - 1 - MAX);
    gate.return_all().await;
    assert_eq!(
        shared_remaining(&store, &check, T0),
        999,
        "the unused units are back, and only those"
    );
    assert_eq!(gate.leases_held(), 0);
    // A lease taken, then its time runs out: the next request fetches anew.
    gate.decide(std::slice::from_ref(&check)).await.unwrap();
    let before = store.decisions();
    clock.advance(window / 10);
    gate.decide(std::slice::from_ref(&check)).await.unwrap();
    assert_eq!(store.decisions(), before + 1);
}

#[tokio::test]
async fn a_refused_layer_elsewhere_puts_the_units_taken_from_a_lease_back() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    let hot = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 1, 1);
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    let spent = Check {
        leasing: Leasing::Never,
        key: StateKey {
            limit: 8,
            identity: 1,
        },
        name: LimitName::new("spent"),
        ..leasing(Algorithm::fixed_window(1, 60 * SEC).unwrap(), 1, 1)
    };
    store.memory().decide_at(std::slice::from_ref(&spent), T0);
    let both = [hot.clone(), spent];
    let decided = gate.decide(&both).await.unwrap();
    assert!(!decided[1].allowed());
    gate.return_all().await;
    assert_eq!(
        shared_remaining(&store, &hot, T0),
        999,
        "the refused request took nothing from the lease"
    );
}

#[tokio::test]
async fn a_failed_store_call_takes_nothing_and_no_lease_outlives_it() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    let hot = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 1, 1);
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    let other = Check {
        leasing: Leasing::Never,
        ..leasing(Algorithm::fixed_window(5, 60 * SEC).unwrap(), 2, 1)
    };
    store.fail_with(LimiterError::Timeout(Duration::ZERO));
    assert!(gate.decide(&[hot.clone(), other]).await.is_err());
    store.recover();
    // The store's state is unknown after a failure (a restarted Redis is
    // empty): the lease is dropped, neither spent on top of it nor given
    // back into it.
    assert_eq!(gate.leases_held(), 0);
    gate.return_all().await;
    assert_eq!(shared_remaining(&store, &hot, T0), 1_000 - 1 - MAX);
    let calls = store.decisions();
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    assert_eq!(store.decisions(), calls + 1);
}

#[tokio::test]
async fn a_lease_whose_fetch_ran_before_a_reset_is_not_installed_after_it() {
    let (clock, store) = setup();
    let gate = Arc::new(leased(&store, &clock, 1));
    let hot = leasing(Algorithm::fixed_window(100, 60 * SEC).unwrap(), 1, 1);
    store.hold_decisions();
    let fetch = tokio::spawn({
        let (gate, hot) = (gate.clone(), hot.clone());
        async move { gate.decide(std::slice::from_ref(&hot)).await }
    });
    while store.decisions() == 0 {
        tokio::task::yield_now().await;
    }
    // The script has run (the store charged the lease); the reset lands
    // before its reply does.
    gate.forgetter().forget(&[hot.key]);
    store.memory().forget(std::slice::from_ref(&hot));
    store.let_one_through();
    assert!(fetch.await.unwrap().unwrap()[0].allowed());
    assert_eq!(gate.leases_held(), 0, "a lease from before the reset");
    // The fresh state gives the whole limit, through the store only.
    let mut admitted = 0;
    for _ in 0..120 {
        store.let_one_through();
        if gate.decide(std::slice::from_ref(&hot)).await.unwrap()[0].allowed() {
            admitted += 1;
        }
    }
    assert!(admitted <= 100, "{admitted} admitted after the reset");
}

#[tokio::test]
async fn a_buckets_take_undone_never_frees_a_slot_taken_after_it() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    // 1,000 tokens, one back every 1 ms: a lease of MAX tokens.
    let bucket = Algorithm::token_bucket(1_000, 1_000).unwrap();
    let hot = leasing(bucket, 1, 1);
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    // A request takes 5 tokens from the lease, but another of its layers
    // refuses it; meanwhile others took tokens after it.
    let x = Check {
        cost: 5,
        ..hot.clone()
    };
    let spent = Check {
        leasing: Leasing::Never,
        key: StateKey {
            limit: 9,
            identity: 1,
        },
        name: LimitName::new("spent"),
        ..leasing(Algorithm::fixed_window(1, 60 * SEC).unwrap(), 1, 1)
    };
    store.memory().decide_at(std::slice::from_ref(&spent), T0);
    let Taken::Local(took, _) = gate.0.take(&x, gate.0.now()) else {
        panic!("the lease has room");
    };
    let mut after = 0;
    while matches!(gate.0.take(&hot, gate.0.now()), Taken::Local(..)) {
        after += 1;
    }
    gate.0.untake(&x, &took);
    assert!(
        !matches!(gate.0.take(&hot, gate.0.now()), Taken::Local(..)),
        "the undone take freed slots {after} later takes hold"
    );
}

#[tokio::test]
async fn a_clock_stepped_back_does_not_make_an_old_lease_young() {
    let (clock, store) = setup();
    let monotonic = Arc::new(ManualClock::new(0));
    let gate = leased(&store, &clock, 1).with_monotonic(monotonic.clone());
    let window = 5 * SEC;
    let hot = leasing(Algorithm::fixed_window(1_000, window).unwrap(), 1, 1);
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    // The lease lives a tenth of the window: time passes it, and the wall
    // clock is stepped back to where it was.
    monotonic.advance(window / 10);
    clock.set(T0);
    let calls = store.decisions();
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    assert_eq!(store.decisions(), calls + 1, "an over lease was used");
}

#[tokio::test]
async fn a_reset_drops_the_lease_without_giving_back_into_the_fresh_state() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    let hot = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 1, 1);
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    gate.forgetter().forget(&[hot.key]);
    store.memory().forget(std::slice::from_ref(&hot));
    // Fresh traffic in the same window, then the leases go back.
    store.memory().decide_at(std::slice::from_ref(&hot), T0);
    gate.return_all().await;
    assert_eq!(shared_remaining(&store, &hot, T0), 999);
}

#[tokio::test]
async fn a_reservation_from_a_lease_is_refunded_into_it() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    let hot = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 1, 1);
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    let reserved = gate.decide(std::slice::from_ref(&hot)).await.unwrap()[0];
    let calls = store.decisions();
    gate.refund(&hot, reserved.counted_at_us()).await.unwrap();
    assert_eq!(store.decisions(), calls);
    gate.return_all().await;
    assert_eq!(shared_remaining(&store, &hot, T0), 999);
}

/// A token bucket's leased tokens last the lease's whole life, whatever
/// the rate: the bucket's ledger keeps them out of its refill meanwhile
/// (before the ledger, half the life on, half of them had faded).
#[tokio::test]
async fn a_token_buckets_leased_tokens_last_the_leases_life() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    // 100 tokens, one back every 10 ms: a lease lives at most 100 ms.
    let bucket = Algorithm::token_bucket(100, 10_000).unwrap();
    let check = leasing(bucket, 1, 1);
    gate.decide(std::slice::from_ref(&check)).await.unwrap();
    // 99 ms on the schedule alone would hold 88; the ledger keeps the
    // request's token and the lease's MAX out of the refill.
    clock.advance(99_000);
    assert_eq!(shared_remaining(&store, &check, T0 + 99_000), 100 - MAX - 1);
    let calls = store.decisions();
    for _ in 0..MAX {
        assert!(gate.decide(std::slice::from_ref(&check)).await.unwrap()[0].allowed());
    }
    // At most the top-up that spending half the lease starts.
    assert!(
        store.decisions() <= calls + 1,
        "every leased token was used"
    );
}

#[tokio::test]
async fn requests_that_find_a_fetch_out_wait_for_it_rather_than_send_their_own() {
    let (clock, store) = setup();
    let gate = Arc::new(leased(&store, &clock, 1));
    let hot = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 1, 1);
    store.hold_decisions();
    let first = tokio::spawn({
        let (gate, hot) = (gate.clone(), hot.clone());
        async move { gate.decide(std::slice::from_ref(&hot)).await }
    });
    while store.decisions() == 0 {
        tokio::task::yield_now().await;
    }
    let waiting: Vec<_> = (0..5)
        .map(|_| {
            let (gate, hot) = (gate.clone(), hot.clone());
            tokio::spawn(async move { gate.decide(std::slice::from_ref(&hot)).await })
        })
        .collect();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    store.let_one_through();
    assert!(first.await.unwrap().unwrap()[0].allowed());
    for task in waiting {
        assert!(task.await.unwrap().unwrap()[0].allowed());
    }
    assert_eq!(store.decisions(), 1, "one fetch served them all");
}

/// Feeds `admitted` (time, cost) into a fresh exact limiter: every one
/// must pass, or the instances together admitted more than the limit.
fn conformant(algorithm: Algorithm, admitted: &[(u64, u64)]) -> Result<(), String> {
    let reference = MemoryStore::new(16, Arc::new(ManualClock::new(T0)));
    for (i, &(at, cost)) in admitted.iter().enumerate() {
        let check = Check {
            leasing: Leasing::Never,
            ..leasing(algorithm, 1, cost)
        };
        if !reference.decide_at(std::slice::from_ref(&check), at)[0].allowed() {
            return Err(format!(
                "admission {i} (cost {cost} at +{}µs) is over the limit",
                at - T0
            ));
        }
    }
    Ok(())
}

fn algorithms() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (5u64..200, 1u64..50_000).prop_map(|(c, i)| Algorithm::token_bucket(c, i).unwrap()),
        (5u64..300, 100_000u64..3_000_000)
            .prop_map(|(l, w)| Algorithm::fixed_window(l, w).unwrap()),
        (5u64..300, 100_000u64..3_000_000)
            .prop_map(|(l, w)| Algorithm::sliding_window(l, w).unwrap()),
    ]
}

/// Mostly bursts, now and then a pause long enough to fill a bucket or
/// end a window: where a lease held across a refill would overrun.
fn gaps() -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0u64..2_000, 1 => 0u64..600_000]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Three instances share one limit through leases, under random
    /// arrivals and costs on one clock: what they admit together is always
    /// what the exact limiter admits, and once every lease is back, the
    /// shared state counts exactly what was admitted in the running window.
    #[test]
    fn instances_sharing_a_limit_by_leases_never_admit_past_it(
        algorithm in algorithms(),
        steps in proptest::collection::vec((0usize..3, gaps(), 1u64..4), 1..400),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (clock, store) = setup();
            let gates: Vec<_> = (0..3).map(|_| leased(&store, &clock, 3)).collect();
            let mut admitted = Vec::new();
            for (instance, step, cost) in steps {
                clock.advance(step);
                let check = leasing(algorithm, 1, cost);
                let decided = gates[instance].decide(std::slice::from_ref(&check)).await.unwrap();
                if decided[0].allowed() {
                    admitted.push((clock.now_us(), cost));
                }
                // Drive the returns of leases that ran out.
                tokio::task::yield_now().await;
            }
            prop_assert_eq!(conformant(algorithm, &admitted), Ok(()));
            for gate in &gates {
                gate.return_all().await;
            }
            let now = clock.now_us();
            if algorithm.kind() == Kind::FixedWindow {
                let window = algorithm.period_us();
                let start = now - now % window;
                let in_window: u64 = admitted.iter().filter(|(t, _)| *t >= start).map(|(_, c)| c).sum();
                let check = leasing(algorithm, 1, 1);
                prop_assert_eq!(
                    shared_remaining(&store, &check, now),
                    algorithm.quota().saturating_sub(in_window),
                    "units lost or counted twice on return"
                );
            }
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn a_half_spent_lease_is_topped_up_before_it_runs_dry() {
    let (clock, store) = setup();
    let metrics = lease_metrics();
    let gate = leased(&store, &clock, 1).with_metrics(metrics.clone());
    let hot = leasing(Algorithm::fixed_window(1_000_000, 60 * SEC).unwrap(), 1, 1);
    for _ in 0..200 {
        assert!(gate.decide(std::slice::from_ref(&hot)).await.unwrap()[0].allowed());
        // The top-up's own call runs between requests, as on a busy proxy.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }
    // Only the first request went to the store; each top-up was a call of
    // its own, beside no request.
    assert_eq!(metrics.decisions.get(), 199);
    assert!(
        metrics.taken.get() >= 200 / MAX,
        "{} leases",
        metrics.taken.get()
    );
    assert_eq!(store.decisions() as u64, metrics.taken.get());
    gate.return_all().await;
    assert_eq!(shared_remaining(&store, &hot, T0), 1_000_000 - 200);
}

/// A bucket's top-up that lands in its ledger's next epoch cannot join the
/// lease (whose units lapse an epoch sooner): it waits beside it and takes
/// over once the lease is spent, so no call gives back the lease's
/// leftovers at each epoch, and every request after the first is a lease's.
#[tokio::test]
async fn a_buckets_top_up_in_its_next_epoch_takes_over_once_the_lease_is_spent() {
    let (clock, store) = setup();
    let metrics = lease_metrics();
    let gate = leased(&store, &clock, 1).with_metrics(metrics.clone());
    // One token a second: leftovers are worth a return (the bucket would
    // not refill them within a lease's life, 1 s, as its epochs).
    let hot = leasing(Algorithm::token_bucket(10_000, SEC).unwrap(), 1, 1);
    for _ in 0..600 {
        assert!(gate.decide(std::slice::from_ref(&hot)).await.unwrap()[0].allowed());
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        // 600 requests over 6 s: six epochs crossed, each lease spent
        // well within its life.
        clock.advance(10_000);
    }
    assert_eq!(metrics.decisions.get(), 599);
    assert_eq!(metrics.returned_units.get(), 0, "no leftovers sent back");
    assert_eq!(store.decisions() as u64, metrics.taken.get());
}

#[tokio::test(start_paused = true)]
async fn an_idle_lease_goes_back_by_itself_once_idle_for_lease_ttl() {
    let (clock, store) = setup();
    let metrics = lease_metrics();
    let gate = leased(&store, &clock, 1).with_metrics(metrics.clone());
    let hot = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 1, 1);
    // A lease taken on the only path a quiet instance takes: one request
    // decided by the store, nothing after it.
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    assert_eq!(shared_remaining(&store, &hot, T0), 1_000 - 1 - MAX);
    assert!(
        until(4, || metrics.held.get() == 1).await,
        "held: {}",
        metrics.held.get()
    );
    // Not before it has been idle for lease_ttl.
    clock.advance(TTL_US - 1);
    until(4, || false).await;
    assert_eq!(gate.leases_held(), 1);
    clock.advance(1);
    assert!(
        until(4, || shared_remaining(&store, &hot, clock.now_us()) == 999).await,
        "the lease's {MAX} units never came back"
    );
    assert_eq!(gate.leases_held(), 0);
    assert!(until(4, || metrics.held.get() == 0).await);
    assert_eq!(metrics.returned_units.get(), MAX);
}

#[tokio::test(start_paused = true)]
async fn a_credit_gives_every_lease_of_the_key_back_and_adds_exactly_its_units() {
    let (clock, store) = setup();
    let (a, b) = (leased(&store, &clock, 2), leased(&store, &clock, 2));
    let hot = leasing(Algorithm::fixed_window(100, 60 * SEC).unwrap(), 1, 1);
    // The client uses 10 of 100, on both: each holds a lease.
    for turn in 0..10 {
        let gate = [&a, &b][turn % 2];
        assert!(gate.decide(std::slice::from_ref(&hot)).await.unwrap()[0].allowed());
    }
    assert_eq!((a.leases_held(), b.leases_held()), (1, 1));
    assert!(shared_remaining(&store, &hot, T0) < 90);
    // B's operator credits 10: B's lease goes back before the credit, A's
    // when A hears of it (B hears of it too, and holds nothing then).
    let credit = Check {
        cost: 10,
        ..hot.clone()
    };
    b.credit(&credit).await.unwrap();
    for gate in [&a, &b] {
        gate.forgetter().credited(&[hot.key]);
    }
    assert!(
        until(4, || shared_remaining(&store, &hot, T0) == 100).await,
        "{} left: the leases' units stayed spent",
        shared_remaining(&store, &hot, T0)
    );
    assert_eq!((a.leases_held(), b.leases_held()), (0, 0));
    let mut admitted = 0;
    for turn in 0..150 {
        let gate = [&a, &b][turn % 2];
        if gate.decide(std::slice::from_ref(&hot)).await.unwrap()[0].allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 100, "90 left and 10 credited");
}

#[tokio::test(start_paused = true)]
async fn a_lease_fetched_across_a_credit_goes_back_rather_than_be_spent() {
    let (clock, store) = setup();
    let metrics = lease_metrics();
    let gate = Arc::new(leased(&store, &clock, 1).with_metrics(metrics.clone()));
    let hot = leasing(Algorithm::fixed_window(100, 60 * SEC).unwrap(), 1, 1);
    store.hold_decisions();
    let fetch = tokio::spawn({
        let (gate, hot) = (gate.clone(), hot.clone());
        async move { gate.decide(std::slice::from_ref(&hot)).await }
    });
    while store.decisions() == 0 {
        tokio::task::yield_now().await;
    }
    // The script has run (1 used, MAX leased); a credit of more than the
    // client used lands before its reply and empties the count: the
    // lease's units would be spent on top of a full budget.
    let credit = Check {
        cost: 50,
        ..hot.clone()
    };
    store.memory().credit(&credit).await.unwrap();
    gate.forgetter().credited(&[hot.key]);
    for _ in 0..1_000 {
        store.let_one_through();
    }
    assert!(fetch.await.unwrap().unwrap()[0].allowed());
    assert_eq!(gate.leases_held(), 0, "a lease from before the credit");
    assert!(until(4, || metrics.returned_units.get() == MAX).await);
    let mut admitted = 0;
    for _ in 0..150 {
        if gate.decide(std::slice::from_ref(&hot)).await.unwrap()[0].allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 100, "a full budget, and not a lease more");
}

#[tokio::test(start_paused = true)]
async fn a_failed_return_drops_every_lease_so_none_is_spent_or_given_back_on_a_fresh_state() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    let window = Algorithm::fixed_window(1_000, 60 * SEC).unwrap();
    let (x, z) = (leasing(window, 1, 1), leasing(window, 2, 1));
    gate.decide(std::slice::from_ref(&x)).await.unwrap();
    clock.advance(TTL_US / 2);
    gate.decide(std::slice::from_ref(&z)).await.unwrap();
    assert_eq!(gate.leases_held(), 2);
    // Redis restarts empty, and the first call after it fails: X's
    // return, once X has been idle for lease_ttl (Z is younger).
    store.memory().forget(&[x.clone(), z.clone()]);
    store.fail_with(LimiterError::Timeout(Duration::ZERO));
    clock.advance(TTL_US / 2);
    assert!(
        until(4, || gate.leases_held() == 0).await,
        "Z's lease outlived the failed return"
    );
    store.recover();
    // Z's traffic elsewhere in the new state; Z's old lease comes back
    // nowhere, and Z's next request is the store's.
    let elsewhere = Check {
        leasing: Leasing::Never,
        ..z.clone()
    };
    store
        .memory()
        .decide_at(std::slice::from_ref(&elsewhere), clock.now_us());
    clock.advance(TTL_US);
    until(4, || false).await;
    assert_eq!(shared_remaining(&store, &z, clock.now_us()), 999);
    let calls = store.decisions();
    gate.decide(std::slice::from_ref(&z)).await.unwrap();
    assert_eq!(store.decisions(), calls + 1);
}

#[tokio::test]
async fn any_failed_call_drops_every_lease() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    let hot = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 1, 1);
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    store.fail_with(LimiterError::Timeout(Duration::ZERO));
    assert!(gate.probe().await.is_err());
    store.recover();
    assert_eq!(gate.leases_held(), 0, "a failed probe");
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    store.fail_with(LimiterError::Timeout(Duration::ZERO));
    let other = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 2, 1);
    assert!(gate.refund(&other, T0).await.is_err());
    store.recover();
    assert_eq!(gate.leases_held(), 0, "a failed refund");
}

#[tokio::test]
async fn a_lost_subscription_drops_every_lease_and_nothing_is_leased_until_it_is_back() {
    let (clock, store) = setup();
    let gate = leased(&store, &clock, 1);
    let hot = leasing(Algorithm::fixed_window(1_000, 60 * SEC).unwrap(), 1, 1);
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    let forgetter = gate.forgetter();
    forgetter.not_listening();
    assert_eq!(gate.leases_held(), 0);
    let calls = store.decisions();
    for _ in 0..3 {
        gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    }
    assert_eq!(store.decisions(), calls + 3, "each the store's");
    assert_eq!(gate.leases_held(), 0);
    forgetter.forget_all();
    forgetter.listening();
    gate.decide(std::slice::from_ref(&hot)).await.unwrap();
    assert_eq!(gate.leases_held(), 1);
}
