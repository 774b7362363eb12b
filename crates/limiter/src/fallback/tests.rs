use super::*;
use crate::clock::ManualClock;
use crate::fake::{check, FakeStore, T0};
use crate::metrics::RedisMetrics;

struct Rig {
    clock: Arc<ManualClock>,
    shared: FakeStore,
    fallback: Fallback<FakeStore>,
    metrics: RedisMetrics,
}

fn rig(instances: u64) -> Rig {
    rig_counting(Instances::fixed(instances))
}

fn rig_counting(instances: Instances) -> Rig {
    let clock = Arc::new(ManualClock::new(T0));
    let shared = FakeStore::new(clock.clone());
    let metrics = RedisMetrics::detached();
    let local = Arc::new(MemoryStore::new(1000, clock.clone()));
    let fallback = Fallback::new(
        shared.clone(),
        local,
        instances,
        metrics.clone(),
        clock.clone(),
    );
    Rig {
        clock,
        shared,
        fallback,
        metrics,
    }
}

fn with(mut c: Check, on_failure: OnFailure) -> Check {
    c.on_failure = on_failure;
    c
}

impl Fallback<FakeStore> {
    async fn renew_for_test(&self, slot: Slot) -> bool {
        self.renew(&slot).await.expect("renewed")
    }

    async fn release_for_test(&self, slot: Slot) -> bool {
        self.release(&slot).await.expect("released")
    }
}

/// Lets the probe task run until the breaker closes, on paused time.
async fn until_closed(fallback: &Fallback<FakeStore>) {
    while fallback.degraded() {
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_timeout_opens_the_breaker_and_the_store_is_not_asked_while_open() {
    let rig = rig(1);
    let layer = [check(0, 10, 1, 1)];
    assert!(rig.fallback.decide(&layer).await.expect("decided")[0].allowed());
    assert_eq!(rig.fallback.deciding(), Deciding::Redis);
    rig.shared
        .fail_with(LimiterError::Timeout(Duration::from_millis(50)));
    let decided = rig
        .fallback
        .decide(&layer)
        .await
        .expect("decided by on_failure");
    assert!(decided[0].allowed(), "on_failure = local admits");
    assert_eq!(rig.fallback.deciding(), Deciding::Fallback);
    let asked = rig.shared.decisions();
    for _ in 0..5 {
        rig.fallback.decide(&layer).await.expect("decided");
    }
    assert_eq!(rig.shared.decisions(), asked, "an open breaker asks nobody");
    assert_eq!(rig.metrics.fallback_decisions.get(), 6);
}

/// A reservation is given back where it was taken: while the shared
/// store is away, to this instance's share (for a layer decided
/// locally); on the shared store once it is back.
#[tokio::test(start_paused = true)]
async fn a_refund_goes_where_the_reservation_was_taken() {
    let rig = rig(1);
    let reserve = [check(0, 3, 7, 3)];
    let peek = [check(0, 3, 7, 0)];
    let remaining = |d: Vec<Decision>| d[0].remaining();
    rig.shared.fail_with(LimiterError::Timeout(Duration::ZERO));
    let taken = rig.fallback.decide(&reserve).await.expect("decided")[0];
    assert_eq!(taken.remaining(), 0, "reserved locally");
    rig.fallback
        .refund(&reserve[0], taken.counted_at_us())
        .await
        .expect("refunded");
    let local = rig.fallback.decide(&peek).await.expect("peeked");
    assert_eq!(remaining(local), 3, "given back to the local share");
    // A layer that fails open took nothing, and gets nothing back.
    let open = [with(check(1, 3, 7, 3), OnFailure::Allow)];
    let admitted = rig.fallback.decide(&open).await.expect("decided")[0];
    rig.fallback
        .refund(&open[0], admitted.counted_at_us())
        .await
        .expect("nothing to give back");
    rig.clock.advance(5_000_000);
    rig.shared.recover();
    until_closed(&rig.fallback).await;
    let taken = rig.fallback.decide(&reserve).await.expect("decided")[0];
    rig.fallback
        .refund(&reserve[0], taken.counted_at_us())
        .await
        .expect("refunded");
    let shared = rig.shared.decide(&peek).await.expect("peeked");
    assert_eq!(remaining(shared), 3, "given back on the shared store");
}

#[cfg(feature = "redis")]
#[tokio::test(start_paused = true)]
async fn an_error_reply_opens_it_too() {
    let rig = rig(1);
    let reply = redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
        "READONLY",
    ));
    rig.shared
        .fail_with(LimiterError::Rejected(Arc::new(reply)));
    rig.fallback
        .decide(&[check(0, 10, 1, 1)])
        .await
        .expect("decided");
    assert!(rig.fallback.degraded());
    assert_eq!(rig.metrics.failures.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_probe_closes_the_breaker_once_the_store_answers() {
    let rig = rig(1);
    rig.shared.fail_with(LimiterError::Timeout(Duration::ZERO));
    rig.fallback
        .decide(&[check(0, 10, 1, 1)])
        .await
        .expect("decided");
    // Failing probes keep it open.
    tokio::time::sleep(PROBE_EVERY * 4).await;
    assert!(rig.fallback.degraded());
    assert!(rig.shared.probes() >= 3, "{} probes", rig.shared.probes());
    rig.clock.advance(5_000_000);
    rig.shared.recover();
    until_closed(&rig.fallback).await;
    assert_eq!(rig.fallback.deciding(), Deciding::Redis);
    let asked = rig.shared.decisions();
    rig.fallback
        .decide(&[check(0, 10, 1, 1)])
        .await
        .expect("decided");
    assert_eq!(
        rig.shared.decisions(),
        asked + 1,
        "back on the shared store"
    );
}

#[tokio::test(start_paused = true)]
async fn the_local_share_follows_the_live_count_of_instances() {
    let live = Instances::counted();
    let rig = rig_counting(live.clone());
    rig.shared.fail_with(LimiterError::Timeout(Duration::ZERO));
    let admitted = |key: u128| {
        let fallback = &rig.fallback;
        async move {
            let layer = [with(check(0, 12, key, 1), OnFailure::Local)];
            let mut admitted = 0;
            for _ in 0..20 {
                if fallback.decide(&layer).await.expect("decided")[0].allowed() {
                    admitted += 1;
                }
            }
            admitted
        }
    };
    assert_eq!(admitted(0).await, 12, "alone until counted");
    live.set(3);
    assert_eq!(admitted(1).await, 4, "a third of 12 once three are counted");
    live.set(2);
    assert_eq!(admitted(2).await, 6, "a half once one has stopped");
}

#[tokio::test(start_paused = true)]
async fn each_layer_fails_as_its_on_failure_says() {
    let rig = rig(2);
    rig.shared.fail_with(LimiterError::Timeout(Duration::ZERO));
    // local: the limit divided by the instances (4 of 8 here).
    let local = [with(check(0, 8, 1, 1), OnFailure::Local)];
    let mut admitted = 0;
    for _ in 0..10 {
        if rig.fallback.decide(&local).await.expect("decided")[0].allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 4);
    // allow: admitted whatever; deny: refused, retry about one probe.
    let open = [with(check(1, 1, 1, 5), OnFailure::Allow)];
    assert!(rig.fallback.decide(&open).await.expect("decided")[0].allowed());
    let closed = [
        with(check(2, 8, 1, 1), OnFailure::Local),
        with(check(3, 8, 1, 1), OnFailure::Deny),
    ];
    let d = rig.fallback.decide(&closed).await.expect("decided");
    assert!(d[0].allowed() && !d[1].allowed());
    assert_eq!(d[1].retry_after_us(), DENY_RETRY_US);
    // The refused request charged nothing locally.
    let peeked = rig.fallback.peek(&closed[..1]).await.expect("peeked");
    assert_eq!(
        peeked[0].remaining(),
        3,
        "4 per instance, this request's 1 not charged"
    );
}

#[tokio::test(start_paused = true)]
async fn slots_without_the_shared_store_follow_on_failure() {
    let rig = rig(2);
    let slot = |id, on_failure| {
        let key = crate::StateKey {
            limit: 1,
            identity: 1,
        };
        let name = crate::LimitName::new("in-flight");
        Slot::new(name, key, 4, 60_000_000, id, on_failure).expect("a valid slot")
    };
    assert!(rig
        .fallback
        .acquire(&slot(1, OnFailure::Local))
        .await
        .expect("acquired")
        .allowed());
    rig.shared.fail_with(LimiterError::Timeout(Duration::ZERO));
    // This instance's share of 4 slots over 2 instances: 2, taken locally.
    let mut local = Vec::new();
    for id in 2..5 {
        let decided = rig.fallback.acquire(&slot(id, OnFailure::Local)).await;
        local.push(decided.expect("decided").allowed());
    }
    assert_eq!(local, vec![true, true, false]);
    assert!(rig
        .fallback
        .release(&slot(2, OnFailure::Local))
        .await
        .expect("released"));
    assert!(!rig
        .fallback
        .acquire(&slot(9, OnFailure::Deny))
        .await
        .expect("decided")
        .allowed());
    assert!(rig
        .fallback
        .acquire(&slot(9, OnFailure::Allow))
        .await
        .expect("decided")
        .allowed());
    // The lease taken on the shared store is not known locally.
    let renew = |id, on_failure| rig.fallback.renew_for_test(slot(id, on_failure));
    assert!(!renew(1, OnFailure::Local).await);
    // A local lease and an allowed one are held while the store is away.
    assert!(renew(3, OnFailure::Local).await);
    assert!(renew(9, OnFailure::Allow).await);
    // Back on the shared store: the local lease is still renewed where it
    // was taken, and the shared one is released there.
    rig.shared.recover();
    until_closed(&rig.fallback).await;
    assert!(renew(3, OnFailure::Local).await);
    let release = |id| rig.fallback.release_for_test(slot(id, OnFailure::Local));
    assert!(release(1).await, "the shared lease");
    assert!(release(3).await, "the local lease");
}
