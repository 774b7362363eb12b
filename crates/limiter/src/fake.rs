//! A store for unit tests of the wrappers: decides in memory on the manual
//! clock, and fails on demand the way Redis fails.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use smallvec::SmallVec;

use super::check::{
    Check, Enforcement, LeaseAsk, Leasing, LimitName, OnFailure, Slot, Spending, StateKey,
};
use super::error::LimiterError;
use super::memory::MemoryStore;
use super::store::{Concurrency, Deciding, Store, Upkeep};
use crate::clock::Clock;
use floodgate_algorithm::{Algorithm, Decision};

pub(crate) const SEC: u64 = 1_000_000;
pub(crate) const T0: u64 = 1_800_000_000 * SEC;

/// A token bucket of `capacity`, one token back per second.
pub(crate) fn check(layer: usize, capacity: u64, identity: u128, cost: u64) -> Check {
    let bucket = Algorithm::token_bucket(capacity, SEC).expect("valid numbers");
    check_of(layer, bucket, identity, cost)
}

/// Layer `layer` of `algorithm` on `identity`, enforcing, decided in full.
pub(crate) fn check_of(layer: usize, algorithm: Algorithm, identity: u128, cost: u64) -> Check {
    Check {
        limit: crate::LimitId(layer),
        name: LimitName::new(&format!("layer-{layer}")),
        algorithm,
        key: StateKey {
            limit: layer as u64 + 100,
            identity,
        },
        cost,
        enforcement: Enforcement::Enforce,
        spending: Spending::Charge,
        on_failure: OnFailure::Local,
        leasing: Leasing::Never,
    }
}

/// A handle: clones share one store, so a test keeps one while a wrapper
/// owns another.
#[derive(Clone)]
pub struct FakeStore(Arc<Shared>);

pub struct Shared {
    memory: MemoryStore,
    failure: Mutex<Option<LimiterError>>,
    decisions: AtomicUsize,
    probes: AtomicUsize,
    /// While set, each `decide` waits for a permit before it answers.
    held: std::sync::atomic::AtomicBool,
    permits: tokio::sync::Semaphore,
}

impl std::ops::Deref for FakeStore {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl FakeStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        FakeStore(Arc::new(Shared {
            memory: MemoryStore::new(10_000, clock),
            failure: Mutex::new(None),
            decisions: AtomicUsize::new(0),
            probes: AtomicUsize::new(0),
            held: std::sync::atomic::AtomicBool::new(false),
            permits: tokio::sync::Semaphore::new(0),
        }))
    }
}

impl Shared {
    /// From now on each decision waits for `let_one_through`.
    pub fn hold_decisions(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    pub fn let_one_through(&self) {
        self.permits.add_permits(1);
    }

    /// Every call fails with `error` until `recover`.
    pub fn fail_with(&self, error: LimiterError) {
        *self.failure.lock().expect("failure") = Some(error);
    }

    pub fn recover(&self) {
        *self.failure.lock().expect("failure") = None;
    }

    /// Calls to `decide`, failed ones included.
    pub fn decisions(&self) -> usize {
        self.decisions.load(Ordering::SeqCst)
    }

    /// The state underneath, to read what a wrapper left there.
    pub fn memory(&self) -> &MemoryStore {
        &self.memory
    }

    pub fn probes(&self) -> usize {
        self.probes.load(Ordering::SeqCst)
    }

    /// What a decision waits for before it answers: a permit while
    /// decisions are held, then the failure set, if any.
    async fn answer(&self) -> Result<(), LimiterError> {
        if self.held.load(Ordering::SeqCst) {
            self.permits
                .acquire()
                .await
                .map_err(|_| LimiterError::Stopped)?
                .forget();
        }
        self.failure()
    }

    fn failure(&self) -> Result<(), LimiterError> {
        match self.failure.lock().expect("failure").clone() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Store for FakeStore {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.decisions.fetch_add(1, Ordering::SeqCst);
        let decided = self.memory.decide(checks).await;
        self.answer().await?;
        decided
    }

    async fn decide_leasing(
        &self,
        checks: &[Check],
        asks: &[Option<LeaseAsk>],
    ) -> Result<(Vec<Decision>, SmallVec<[u64; 4]>), LimiterError> {
        self.decisions.fetch_add(1, Ordering::SeqCst);
        // Decided before the answer, as `decide` is: a held or failed
        // answer is a reply on its way, or lost, after the script ran.
        let decided = self.memory.decide_leasing(checks, asks).await;
        self.answer().await?;
        decided
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.failure()?;
        self.memory.peek(checks).await
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.failure()?;
        self.memory.reset(checks).await
    }

    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        self.failure()?;
        self.memory.credit(check).await
    }

    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        self.failure()?;
        self.memory.refund(check, counted_at_us).await
    }
}

#[async_trait]
impl Concurrency for FakeStore {
    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        self.failure()?;
        self.memory.acquire(slot).await
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.failure()?;
        self.memory.renew(slot).await
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.failure()?;
        self.memory.release(slot).await
    }
}

#[async_trait]
impl Upkeep for FakeStore {
    async fn probe(&self) -> Result<(), LimiterError> {
        self.probes.fetch_add(1, Ordering::SeqCst);
        self.failure()
    }

    fn deciding(&self) -> Deciding {
        Deciding::Redis
    }
}
