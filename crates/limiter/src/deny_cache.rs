//! A store that remembers, per layer key, that the store under it refused a
//! request until some instant, so that the client's further requests are
//! refused at once until then, without asking the store.
//!
//! This gives the answer the store would give: a refusal changes no state,
//! other clients' traffic can only push the instant later, and a request
//! costing at least as much cannot pass earlier. An entry applies only to the
//! same algorithm and numbers, so a reload that changes a limit bypasses it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use smallvec::SmallVec;

use super::check::{Check, Enforcement, LeaseAsk, Leasing, Spending, StateKey};
use super::error::LimiterError;
use super::store::{Store, WrapsLimits};
use crate::clock::Clock;
use crate::watch::{self, Answerer};
use floodgate_algorithm::{Algorithm, Decision};

const SHARDS: usize = 16;

#[derive(Clone, Copy)]
struct Refusal {
    /// The store's retry time: what the remembered refusal says.
    until_us: u64,
    /// Until when it is answered without the store: the retry time, or
    /// sooner for a layer that others may hold leases on.
    trusted_until_us: u64,
    cost: u64,
    algorithm: Algorithm,
}

/// The refusal cache: a store wrapping `S` that answers a layer's known
/// refusal itself, until its retry time, without a store call.
pub struct KnownRefusals<S> {
    inner: S,
    remembered: Arc<Remembered>,
    per_shard: usize,
    clock: Arc<dyn Clock>,
    /// A refusal of a layer other instances may hold leases on is
    /// remembered no longer than a lease lives: their units may come back.
    lease_ttl_us: Option<u64>,
}

/// The refusals remembered, which another instance's reset (heard through
/// `Forgetter`) must reach too.
struct Remembered {
    shards: Vec<Mutex<HashMap<StateKey, Refusal>>>,
    /// Bumped by every reset: a refusal the store gave before a reset, whose
    /// answer arrives after it, is not remembered.
    resets: AtomicU64,
}

impl Remembered {
    fn shard(&self, key: &StateKey) -> &Mutex<HashMap<StateKey, Refusal>> {
        &self.shards[key.shard(SHARDS)]
    }
}

/// What an instance holds of keys that an operator may change through
/// another instance: remembered refusals, leases.
pub trait Forget: Send + Sync {
    /// An operator reset the keys' state: drop what is held of them.
    fn forget(&self, keys: &[StateKey]);

    /// An operator gave units back to the keys' state (which, unlike a
    /// reset, keeps what it counted): forgetting is enough for what holds
    /// nothing of that state.
    fn credited(&self, keys: &[StateKey]) {
        self.forget(keys);
    }

    /// Everything: what was announced while nobody listened is unknown.
    fn forget_all(&self);

    /// Operators' changes are heard from now on (after the `forget_all` of
    /// a new subscription).
    fn listening(&self) {}

    /// The subscription to operators' changes is lost: they are not heard
    /// until `listening` again.
    fn not_listening(&self) {}
}

impl Forget for Remembered {
    fn forget(&self, keys: &[StateKey]) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        for key in keys {
            if let Ok(mut shard) = self.shard(key).lock() {
                shard.remove(key);
            }
        }
    }

    fn forget_all(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        for shard in &self.shards {
            if let Ok(mut shard) = shard.lock() {
                shard.clear();
            }
        }
    }
}

/// Forgets what the stores hold of keys from outside them: when another
/// instance announces that an operator changed a key's state.
#[derive(Clone)]
pub struct Forgetter(Vec<Arc<dyn Forget>>);

impl Forgetter {
    /// Also forgets in `other`.
    pub fn and(mut self, other: Arc<dyn Forget>) -> Forgetter {
        self.0.push(other);
        self
    }

    /// An operator reset the keys' state: every store drops what it holds
    /// of them.
    pub fn forget(&self, keys: &[StateKey]) {
        for held in &self.0 {
            held.forget(keys);
        }
    }

    /// An operator gave units back to the keys' state: every store drops
    /// what the credit makes stale.
    pub fn credited(&self, keys: &[StateKey]) {
        for held in &self.0 {
            held.credited(keys);
        }
    }

    /// Everything: what was announced while nobody listened is unknown.
    pub fn forget_all(&self) {
        for held in &self.0 {
            held.forget_all();
        }
    }

    /// Operators' changes are heard from now on (after the `forget_all`
    /// of a new subscription).
    pub fn listening(&self) {
        for held in &self.0 {
            held.listening();
        }
    }

    /// The subscription to operators' changes is lost: until `listening`
    /// again, what a store holds may be stale.
    pub fn not_listening(&self) {
        for held in &self.0 {
            held.not_listening();
        }
    }
}

impl<S: Store> KnownRefusals<S> {
    /// Holds at most about `capacity` keys.
    pub fn new(inner: S, capacity: usize, clock: Arc<dyn Clock>) -> Self {
        KnownRefusals {
            inner,
            remembered: Arc::new(Remembered {
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                resets: AtomicU64::new(0),
            }),
            per_shard: (capacity / SHARDS).max(1),
            clock,
            lease_ttl_us: None,
        }
    }

    /// Remembers refusals of leasing layers at most `ttl_us`.
    pub fn with_lease_ttl(mut self, ttl_us: u64) -> Self {
        self.lease_ttl_us = Some(ttl_us);
        self
    }

    fn shard(&self, key: &StateKey) -> &Mutex<HashMap<StateKey, Refusal>> {
        self.remembered.shard(key)
    }

    /// What reaches this cache's refusals when another instance announces
    /// an operator's change (join others with `Forgetter::and`).
    pub fn forgetter(&self) -> Forgetter {
        Forgetter(vec![self.remembered.clone()])
    }

    /// The refusal the store would give `check` at `now_us`, if one is known.
    fn refusal(&self, check: &Check, now_us: u64) -> Option<Decision> {
        if check.enforcement == Enforcement::Shadow {
            return None;
        }
        let shard = self.shard(&check.key).lock().ok()?;
        let known = shard.get(&check.key)?;
        let applies = known.trusted_until_us > now_us
            && known.until_us > now_us
            && check.cost >= known.cost
            && known.algorithm == check.algorithm;
        applies.then(|| {
            let wait_us = known.until_us - now_us;
            Decision::refused(check.algorithm.quota(), 0, wait_us, wait_us)
        })
    }

    /// Decisions for a request one of whose layers the store is known to
    /// refuse still: that layer refuses, the others are reported as open
    /// (nothing is charged, as the store would charge nothing). A lookup
    /// (`peek`) of the same limit ahead of it that is not known (the ban of
    /// the limit that keeps refusing) is asked of the store: the caller puts
    /// first what it reports first, and that refusal is what leads to it.
    fn known_refusal(&self, checks: &[Check], now_us: u64) -> Option<Vec<Decision>> {
        // Most requests have no known refusal: look before building anything.
        let (at, refusal) = checks
            .iter()
            .enumerate()
            .find_map(|(i, c)| Some((i, self.refusal(c, now_us)?)))?;
        let limit = checks[at].limit;
        if checks[..at].iter().any(|c| {
            c.spending == Spending::Peek
                && c.enforcement == Enforcement::Enforce
                && c.limit == limit
        }) {
            return None;
        }
        Some(
            checks
                .iter()
                .enumerate()
                .map(|(i, c)| match i.cmp(&at) {
                    std::cmp::Ordering::Less => open_decision(c),
                    std::cmp::Ordering::Equal => refusal,
                    std::cmp::Ordering::Greater => {
                        self.refusal(c, now_us).unwrap_or_else(|| open_decision(c))
                    }
                })
                .collect(),
        )
    }

    /// Records the store's refusals among `decisions`.
    fn remember(&self, checks: &[Check], decisions: &[Decision], now_us: u64) {
        for (check, d) in checks.iter().zip(decisions) {
            if check.enforcement == Enforcement::Shadow || d.retry_after_us() == 0 {
                continue;
            }
            let Ok(mut shard) = self.shard(&check.key).lock() else {
                continue;
            };
            if shard.len() >= self.per_shard {
                shard.retain(|_, r| r.trusted_until_us > now_us);
                if shard.len() >= self.per_shard {
                    // Still full of live refusals: forgetting them only costs
                    // store calls, never a wrong answer.
                    shard.clear();
                }
            }
            let trusted_us = match self.lease_ttl_us {
                Some(ttl_us) if check.leasing == Leasing::Allowed => d.retry_after_us().min(ttl_us),
                _ => d.retry_after_us(),
            };
            shard.insert(
                check.key,
                Refusal {
                    until_us: now_us + d.retry_after_us(),
                    trusted_until_us: now_us + trusted_us,
                    cost: check.cost,
                    algorithm: check.algorithm,
                },
            );
        }
    }

    fn forget(&self, checks: &[Check]) {
        let keys: SmallVec<[StateKey; 4]> = checks.iter().map(|c| c.key).collect();
        self.remembered.forget(&keys);
    }
}

/// Admitted, nothing known about the quota's use.
pub(super) fn open_decision(check: &Check) -> Decision {
    let quota = check.algorithm.quota();
    Decision::admitted(quota, quota.saturating_sub(check.cost), 0)
}

/// Refusals are all it remembers: slots and upkeep are the store's below.
impl<S: Store> WrapsLimits for KnownRefusals<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: Store> Store for KnownRefusals<S> {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        let now_us = self.clock.now_us();
        if let Some(known) = self.known_refusal(checks, now_us) {
            watch::answered_by(Answerer::RefusalCache);
            return Ok(known);
        }
        let resets = self.remembered.resets.load(Ordering::Acquire);
        let decisions = self.inner.decide(checks).await?;
        if self.remembered.resets.load(Ordering::Acquire) == resets {
            self.remember(checks, &decisions, now_us);
        }
        Ok(decisions)
    }

    async fn decide_leasing(
        &self,
        checks: &[Check],
        asks: &[Option<LeaseAsk>],
    ) -> Result<(Vec<Decision>, SmallVec<[u64; 4]>), LimiterError> {
        let now_us = self.clock.now_us();
        if let Some(known) = self.known_refusal(checks, now_us) {
            watch::answered_by(Answerer::RefusalCache);
            return Ok((known, SmallVec::new()));
        }
        let resets = self.remembered.resets.load(Ordering::Acquire);
        let decided = self.inner.decide_leasing(checks, asks).await?;
        if self.remembered.resets.load(Ordering::Acquire) == resets {
            self.remember(checks, &decided.0, now_us);
        }
        Ok(decided)
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.inner.peek(checks).await
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.forget(checks);
        let reset = self.inner.reset(checks).await;
        // Forgotten again: a refusal remembered while the store was resetting
        // may describe the state before it.
        self.forget(checks);
        reset
    }

    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        let checks = std::slice::from_ref(check);
        self.forget(checks);
        let credited = self.inner.credit(check).await;
        self.forget(checks);
        credited
    }

    /// A refund frees budget: what was remembered of the key is stale.
    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        let refunded = self.inner.refund(check, counted_at_us).await;
        self.forget(std::slice::from_ref(check));
        refunded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::fake::{check, FakeStore, SEC, T0};

    fn cached(capacity: usize) -> (Arc<ManualClock>, FakeStore, KnownRefusals<FakeStore>) {
        let clock = Arc::new(ManualClock::new(T0));
        let store = FakeStore::new(clock.clone());
        let cache = KnownRefusals::new(store.clone(), capacity, clock.clone());
        (clock, store, cache)
    }

    #[tokio::test]
    async fn a_refused_client_is_refused_without_the_store_until_its_retry_time() {
        let (clock, store, cache) = cached(1000);
        let login = [check(0, 2, 7, 1)];
        for _ in 0..2 {
            assert!(cache.decide(&login).await.expect("decided")[0].allowed());
        }
        let refused = cache.decide(&login).await.expect("decided")[0];
        assert!(!refused.allowed());
        let calls = store.decisions();
        // Half way to the retry time: refused, with the wait shrunk, by the cache.
        clock.advance(refused.retry_after_us() / 2);
        let again = cache.decide(&login).await.expect("decided")[0];
        assert!(!again.allowed());
        assert_eq!(
            again.retry_after_us(),
            refused.retry_after_us() - refused.retry_after_us() / 2
        );
        assert_eq!(store.decisions(), calls, "the store was not asked");
        // At the retry time the entry has expired: the store decides, and admits.
        clock.set(T0 + refused.retry_after_us());
        assert!(cache.decide(&login).await.expect("decided")[0].allowed());
        assert_eq!(store.decisions(), calls + 1);
    }

    #[tokio::test]
    async fn a_refusal_of_a_leasing_layer_is_trusted_only_as_long_as_a_lease_lives() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = FakeStore::new(clock.clone());
        let cache = KnownRefusals::new(store.clone(), 1000, clock.clone()).with_lease_ttl(SEC);
        // One token back every second; 100 s to wait once both are spent.
        let login = [Check {
            leasing: Leasing::Allowed,
            algorithm: Algorithm::token_bucket(2, 100 * SEC).expect("valid numbers"),
            ..check(0, 2, 7, 1)
        }];
        for _ in 0..2 {
            assert!(cache.decide(&login).await.expect("decided")[0].allowed());
        }
        let refused = cache.decide(&login).await.expect("decided")[0];
        assert!(refused.retry_after_us() > 90 * SEC);
        let calls = store.decisions();
        clock.advance(SEC / 2);
        let again = cache.decide(&login).await.expect("decided")[0];
        assert_eq!(
            store.decisions(),
            calls,
            "within a lease's life, remembered"
        );
        assert_eq!(
            again.retry_after_us(),
            refused.retry_after_us() - SEC / 2,
            "and what it says is the store's retry time"
        );
        // Past a lease's life another instance's lease may have come back:
        // the store is asked.
        clock.advance(SEC);
        assert!(!cache.decide(&login).await.expect("decided")[0].allowed());
        assert_eq!(store.decisions(), calls + 1);
    }

    #[tokio::test]
    async fn a_cheaper_request_or_a_changed_limit_asks_the_store() {
        let (_, store, cache) = cached(1000);
        let costly = [check(0, 4, 7, 3)];
        cache.decide(&costly).await.expect("decided");
        assert!(!cache.decide(&costly).await.expect("decided")[0].allowed());
        let calls = store.decisions();
        // Cost 1 may still pass: the store is asked.
        assert!(cache.decide(&[check(0, 4, 7, 1)]).await.expect("decided")[0].allowed());
        assert_eq!(store.decisions(), calls + 1);
        // The same key under other numbers (a reload): asked too.
        cache.decide(&[check(0, 5, 7, 3)]).await.expect("decided");
        assert_eq!(store.decisions(), calls + 2);
    }

    /// A limit's ban looked up ahead of the limit's remembered refusal: the
    /// store is asked, so that a ban imposed meanwhile (by another
    /// instance) is what the client is told; once known, the cache answers.
    #[tokio::test]
    async fn an_unknown_lookup_ahead_of_a_known_refusal_asks_the_store() {
        let (_, store, cache) = cached(1000);
        let login = check(1, 1, 7, 1);
        cache
            .decide(std::slice::from_ref(&login))
            .await
            .expect("decided");
        assert!(!cache
            .decide(std::slice::from_ref(&login))
            .await
            .expect("decided")[0]
            .allowed());
        // Someone else takes the ban's one token: the key is banned.
        // The login limit's own ban: the same layer, its own key.
        let ban = Check {
            key: StateKey {
                limit: 500,
                identity: 7,
            },
            ..check(1, 1, 7, 1)
        };
        store
            .decide(std::slice::from_ref(&ban))
            .await
            .expect("banned");
        let lookup = Check {
            spending: Spending::Peek,
            ..ban
        };
        let request = [lookup.clone(), login.clone()];
        let calls = store.decisions();
        let answer = cache.decide(&request).await.expect("decided");
        assert!(!answer[0].allowed(), "the ban, from the store");
        assert_eq!(store.decisions(), calls + 1);
        let again = cache.decide(&request).await.expect("decided");
        assert!(!again[0].allowed());
        assert_eq!(store.decisions(), calls + 1, "now known: not asked");
        // An unknown lookup behind the known refusal, or another limit's
        // ahead of it, changes nothing: not asked.
        let other = |layer| Check {
            limit: crate::LimitId(layer),
            key: StateKey {
                limit: 900 + layer as u64,
                identity: 7,
            },
            ..lookup.clone()
        };
        cache
            .decide(&[login.clone(), other(5)])
            .await
            .expect("decided");
        cache.decide(&[other(6), login]).await.expect("decided");
        assert_eq!(store.decisions(), calls + 1);
    }

    #[tokio::test]
    async fn a_reset_forgets_the_refusal() {
        let (_, _, cache) = cached(1000);
        let login = [check(0, 1, 7, 1)];
        cache.decide(&login).await.expect("decided");
        assert!(!cache.decide(&login).await.expect("decided")[0].allowed());
        cache.reset(&login).await.expect("reset");
        assert!(cache.decide(&login).await.expect("decided")[0].allowed());
    }

    #[tokio::test]
    async fn a_refusal_answered_after_a_reset_is_not_remembered() {
        let (_, store, cache) = cached(1000);
        let cache = Arc::new(cache);
        let login = [check(0, 1, 7, 1)];
        cache.decide(&login).await.expect("decided");
        // A refused decision is on its way back from the store...
        store.hold_decisions();
        let in_flight = tokio::spawn({
            let cache = cache.clone();
            let login = login.clone();
            async move { cache.decide(&login).await }
        });
        while store.decisions() < 2 {
            tokio::task::yield_now().await;
        }
        // ...when the client is reset: the reset wins.
        let reset = tokio::spawn({
            let cache = cache.clone();
            let login = login.clone();
            async move { cache.reset(&login).await }
        });
        tokio::task::yield_now().await;
        store.let_one_through();
        let refused = in_flight.await.expect("task").expect("decided");
        assert!(!refused[0].allowed());
        reset.await.expect("task").expect("reset");
        let calls = store.decisions();
        store.let_one_through();
        assert!(cache.decide(&login).await.expect("decided")[0].allowed());
        assert_eq!(
            store.decisions(),
            calls + 1,
            "asked the store, not the stale refusal"
        );
    }

    #[tokio::test]
    async fn a_full_cache_forgets_rather_than_answers_wrongly() {
        let (clock, store, cache) = cached(SHARDS);
        // One refusal per identity, far more identities than room.
        for identity in 0..200u128 {
            let one = [check(0, 1, identity, 1)];
            cache.decide(&one).await.expect("decided");
            assert!(!cache.decide(&one).await.expect("decided")[0].allowed());
        }
        let held: usize = cache
            .remembered
            .shards
            .iter()
            .map(|s| s.lock().expect("shard").len())
            .sum();
        assert!(held <= SHARDS, "{held} entries");
        // After the window every identity is admitted again, cached or not.
        clock.advance(SEC);
        let calls = store.decisions();
        for identity in 0..200u128 {
            assert!(cache
                .decide(&[check(0, 1, identity, 1)])
                .await
                .expect("decided")[0]
                .allowed());
        }
        assert_eq!(store.decisions(), calls + 200);
    }
}
