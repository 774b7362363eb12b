use std::sync::Arc;

use super::*;
use crate::check::{admitted, Enforcement};
use crate::clock::ManualClock;
use crate::fake::{check_of as check, SEC, T0};
use floodgate_algorithm::Algorithm;

fn bucket(capacity: u64) -> Algorithm {
    Algorithm::token_bucket(capacity, SEC).expect("valid numbers")
}

fn limiter(max_keys: usize) -> (Arc<ManualClock>, MemoryStore) {
    let clock = Arc::new(ManualClock::new(T0));
    (clock.clone(), MemoryStore::new(max_keys, clock))
}

#[test]
fn a_refusal_by_one_layer_charges_no_layer() {
    let (_, l) = limiter(1000);
    let wide = check(0, bucket(10), 1, 1);
    let narrow = check(1, bucket(2), 1, 1);
    let both = [wide.clone(), narrow.clone()];
    for _ in 0..2 {
        assert!(admitted(&both, &l.decide_now(&both)));
    }
    for _ in 0..5 {
        let d = l.decide_now(&both);
        assert!(!admitted(&both, &d));
        assert!(d[0].allowed() && !d[1].allowed());
    }
    // The wide layer was charged for the two admitted requests only.
    assert_eq!(l.decide_now(&[wide])[0].remaining(), 7);
}

#[test]
fn shadow_layers_never_refuse_and_are_charged_only_when_they_admit() {
    let (_, l) = limiter(1000);
    let mut shadow = check(0, bucket(1), 1, 1);
    shadow.enforcement = Enforcement::Shadow;
    let real = check(1, bucket(5), 1, 1);
    let both = [shadow.clone(), real];
    for i in 0..4 {
        let d = l.decide_now(&both);
        assert!(admitted(&both, &d));
        assert_eq!(d[0].allowed(), i == 0);
    }
}

#[test]
fn refused_requests_store_nothing_and_keys_are_capped() {
    let (clock, l) = limiter(128);
    let zero_left = bucket(1);
    for id in 0..10_000u128 {
        l.decide_now(&[check(0, zero_left, id, 1)]);
    }
    assert!(l.len() <= 128, "held {}", l.len());
    // Oversized requests are refused and leave nothing behind.
    let (_, empty) = limiter(128);
    empty.decide_now(&[check(0, zero_left, 1, 5)]);
    assert!(empty.is_empty());
    // Everything idles out after a full refill.
    clock.advance(2 * SEC);
    let held = l.len();
    assert!(held > 0);
    assert_eq!(l.sweep(), held);
    assert!(l.is_empty());
}

#[test]
fn idle_keys_are_swept() {
    let (clock, l) = limiter(1000);
    for id in 0..50u128 {
        l.decide_now(&[check(0, bucket(3), id, 1)]);
    }
    assert_eq!(l.len(), 50);
    clock.advance(SEC - 1);
    assert_eq!(l.sweep(), 0);
    clock.advance(1);
    assert_eq!(l.sweep(), 50);
    assert!(l.is_empty());
}

#[test]
fn concurrent_callers_never_exceed_the_bucket() {
    let (_, l) = limiter(1000);
    let l = Arc::new(l);
    let admitted_total: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                s.spawn(move || {
                    let checks = [check(0, bucket(100), 7, 1), check(1, bucket(1000), 7, 1)];
                    (0..200)
                        .filter(|_| admitted(&checks, &l.decide_now(&checks)))
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    assert_eq!(admitted_total, 100);
    let d = l.decide_now(&[check(1, bucket(1000), 7, 0)]);
    assert_eq!(d[0].remaining(), 900);
}

#[test]
fn a_flood_of_new_identities_never_resets_a_live_limit() {
    let (clock, l) = limiter(128);
    let login = Algorithm::sliding_log(5, 60 * SEC).expect("valid numbers");
    let victim = [check(0, login, 7, 1)];
    for _ in 0..5 {
        assert!(l.decide_now(&victim)[0].allowed());
    }
    assert!(!l.decide_now(&victim)[0].allowed());
    // Tenants whose buckets stay live for a long time fill every shard.
    let slow = Algorithm::token_bucket(50, 1000 * SEC).expect("valid numbers");
    let mut flood_admitted = 0;
    for id in 0..20_000u128 {
        let tenant = [check(1, slow, 1_000_000 + id, 1)];
        flood_admitted += usize::from(l.decide_now(&tenant)[0].allowed());
        clock.advance(1_000);
    }
    assert!(l.len() <= 128, "held {}", l.len());
    assert!(!l.decide_now(&victim)[0].allowed(), "still refused");
    // The flood had its own keys (one request each) and one shared bucket.
    assert!(flood_admitted <= 127 + 50, "{flood_admitted}");
    assert!(l.overflow_decisions() >= 20_000 - 128);
    // Once the victim's window has passed, its state is idle and its room
    // goes to whoever needs it; the victim starts afresh.
    clock.advance(60 * SEC);
    assert!(l.decide_now(&victim)[0].allowed());
}

#[test]
fn room_held_by_idle_state_is_reused_before_overflowing() {
    let (clock, l) = limiter(64);
    for id in 0..64u128 {
        l.decide_now(&[check(0, bucket(1), id, 1)]);
    }
    // A token comes back after a second: every key is then idle, and the
    // next identities fare exactly as in an empty store.
    clock.advance(SEC);
    let (_, empty) = limiter(64);
    let before = l.overflow_decisions();
    for id in 1000..1064u128 {
        let next = [check(0, bucket(1), id, 1)];
        assert!(l.decide_now(&next)[0].allowed());
        empty.decide_now(&next);
    }
    assert_eq!(l.overflow_decisions() - before, empty.overflow_decisions());
    assert_eq!(l.len(), empty.len());
}

#[test]
fn room_for_one_layer_is_never_taken_from_another_layer_of_the_same_request() {
    // Two keys per shard; identities chosen so that all keys share shard 0.
    let (clock, l) = limiter(128);
    let in_shard_0 = |layer: usize, algorithm| check(layer, algorithm, layer as u128 + 100, 1);
    let short = Algorithm::fixed_window(100, SEC).expect("valid numbers");
    let long = Algorithm::fixed_window(2, 3600 * SEC).expect("valid numbers");
    let (a, victim, b) = (
        in_shard_0(0, short),
        in_shard_0(1, long),
        in_shard_0(2, long),
    );
    assert!([&a, &victim, &b].iter().all(|c| c.key.shard(64) == 0));
    assert!(l.decide_now(std::slice::from_ref(&a))[0].allowed());
    for allowed in [true, true, false] {
        assert_eq!(
            l.decide_now(std::slice::from_ref(&victim))[0].allowed(),
            allowed
        );
    }
    // a is idle (present, as good as fresh); the shard is full. A request
    // with a and b: b may not take a's place and so push the victim out.
    clock.advance(2 * SEC);
    assert!(admitted(&[a.clone(), b.clone()], &l.decide_now(&[a, b])));
    assert!(!l.decide_now(std::slice::from_ref(&victim))[0].allowed());
    assert!(l.len() <= 128);
}

#[test]
fn a_peek_answers_as_the_decision_would_and_changes_nothing() {
    // One key per shard. Limits 1 and 65 for identity 2 both land in shard
    // 3, empty: the first takes its one place, the second goes to limit 65's
    // overflow bucket, which a newcomer of shard 5 has already spent.
    let (_, l) = limiter(64);
    let key = |limit, identity| StateKey { limit, identity };
    let in_shard_5 = |identity| Check {
        key: key(65, identity),
        ..check(1, bucket(1), identity, 1)
    };
    assert!(
        l.decide_now(&[in_shard_5(68)])[0].allowed(),
        "takes shard 5"
    );
    assert!(
        l.decide_now(&[in_shard_5(4)])[0].allowed(),
        "spends the overflow"
    );
    let both = [
        Check {
            key: key(1, 2),
            ..check(0, bucket(5), 2, 1)
        },
        Check {
            key: key(65, 2),
            ..check(1, bucket(1), 2, 1)
        },
    ];
    let peeked = l.peek_at(&both, T0);
    assert_eq!(peeked, l.peek_at(&both, T0), "a peek changes nothing");
    assert!(peeked[0].allowed() && !peeked[1].allowed(), "{peeked:?}");
    assert_eq!(peeked, l.decide_now(&both));
}

#[test]
fn a_lookup_without_room_reads_fresh_never_the_shared_overflow() {
    // One key per shard: limit 65's identity 68 takes shard 5, identity 4
    // finds no room and takes the overflow bucket's one token (a ban taken
    // on the bucket newcomers share).
    let (_, l) = limiter(64);
    let in_shard_5 = |identity| Check {
        key: StateKey {
            limit: 65,
            identity,
        },
        ..check(1, bucket(1), identity, 1)
    };
    assert!(l.decide_now(&[in_shard_5(68)])[0].allowed());
    assert!(
        l.decide_now(&[in_shard_5(4)])[0].allowed(),
        "on the overflow"
    );
    // Another newcomer's lookup is not answered by that shared token.
    let lookup = Check {
        spending: Spending::Peek,
        ..in_shard_5(132)
    };
    let looked = l.decide_now(std::slice::from_ref(&lookup));
    assert!(looked[0].allowed(), "read fresh: {looked:?}");
    assert_eq!(
        l.decide_now(std::slice::from_ref(&lookup)),
        looked,
        "nothing charged"
    );
    assert!(
        !l.decide_now(&[in_shard_5(132)])[0].allowed(),
        "a decision still shares it"
    );
}

#[test]
fn a_credit_gives_back_to_a_key_of_its_own_and_claims_nothing_for_the_overflow() {
    // One key per shard: identity 68 takes shard 5 for limit 65; identity
    // 4, of the same shard, lands on limit 65's overflow bucket.
    let (clock, l) = limiter(64);
    let in_shard_5 = |identity, cost| Check {
        key: StateKey {
            limit: 65,
            identity,
        },
        ..check(1, bucket(3), identity, cost)
    };
    for _ in 0..3 {
        assert!(l.decide_now(&[in_shard_5(68, 1)])[0].allowed());
        assert!(l.decide_now(&[in_shard_5(4, 1)])[0].allowed());
    }
    assert!(!l.decide_now(&[in_shard_5(68, 1)])[0].allowed());
    let now = clock.now_us();
    assert_eq!(l.credit_at(&in_shard_5(68, 2), now).remaining(), 2);
    assert!(l.decide_now(&[in_shard_5(68, 1)])[0].allowed());
    assert!(l.decide_now(&[in_shard_5(68, 1)])[0].allowed());
    assert!(!l.decide_now(&[in_shard_5(68, 1)])[0].allowed());
    // The overflow is shared by newcomers: no one of them is credited, and
    // the answer says so.
    assert_eq!(l.credit_at(&in_shard_5(4, 2), now).remaining(), 0);
    assert!(!l.decide_now(&[in_shard_5(4, 1)])[0].allowed());
    // A key never seen is full already.
    assert_eq!(l.credit_at(&check(0, bucket(3), 9, 2), now).remaining(), 3);
}
