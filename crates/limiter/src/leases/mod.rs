//! Leases: Redis off the hot path, still exact.
//!
//! A request whose leasable layers all hold a lease with room is decided
//! here, with no Redis call. Otherwise the layers without room go to the
//! shared store, which decides them as always and, beside each one it
//! charges, takes a lease of more units in the same script run
//! (`algorithm::lease_units`: large far from the limit, none near it). The
//! units count as spent in Redis from that moment, so whatever this
//! instance admits from a lease is already paid for in the shared state: no
//! instance ever admits more than the shared budget allows.
//!
//! A lease lives at most `ttl_us` (never longer than a tenth of its limit's
//! window) and never past the window or period its units are counted in.
//! A token bucket's lease lives `ttl_us` from when it was asked for, and
//! the bucket's ledger in Redis (`algorithm::ledger`) counts its units
//! that long: the bucket refills no further than its capacity less what
//! is outstanding, so a leased token stays valid for the lease's life
//! whatever the rate, and a full bucket plus the leases never hold more
//! than the capacity. What was not used goes back (`refund`) when the
//! lease ends, on shutdown and on reload. A crashed instance's lease is
//! simply never used: at most one lease per (limit, identity) per instance
//! is lost, until its window ends or its bucket's ledger lapses it.
//!
//! One fetch per key at a time: requests that find the lease empty while a
//! fetch is out wait for it (within the Redis deadline) instead of sending
//! their own. A lease half spent is topped up in the background (a lease
//! asked beside a request of cost 0), so that under steady load no request
//! waits for Redis at all.
//!
//! A lease's times are counted from when it was asked for, by the wall
//! clock and by a monotonic one, whichever has gone further: a clock
//! stepped back never makes an old lease young again, one stepped forward
//! ends it sooner. An operator's reset (here or heard from another
//! instance) drops every lease it concerns and starts a new generation. So
//! does anything that says the store's state may not be the one the leases
//! came from, for every lease: a failed store call of any kind (a return
//! included), and the loss of the subscription to operators' changes (a
//! restarted Redis drops it at once). A lease belongs to the generation it
//! was installed in, and its units go back only while that generation
//! lasts: a fetch or a return from before is not used, so no return lands
//! in a state that did not lease it.
//!
//! The parts: one lease and its clocks (`lease`); the table of leases
//! by key, with the fetch out for each (`table`); taking units from a
//! lease, and installing the ones the store leased (`take`); units going
//! back (`returns`); and a request decided from the leases and the store
//! together (`decide`).

mod decide;
mod lease;
mod returns;
mod table;
mod take;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::check::{Check, Enforcement, Leasing, Slot, Spending, StateKey};
use super::deny_cache::Forget;
use super::error::LimiterError;
use super::instances::Instances;
use super::store::{Concurrency, Deciding, Store, Upkeep};
use crate::clock::{Clock, MonotonicClock};
use crate::metrics::LeaseMetrics;
use floodgate_algorithm::{takes_lease, Decision};
use lease::Now;
use lease::Return;
use table::{Fetching, Table};

/// `[redis].leases`: how large a lease may be and how long it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Units at most in one lease (`lease_max`).
    pub max: u64,
    /// How long a lease lives at most (`lease_ttl`); never longer than a
    /// tenth of its limit's window.
    pub ttl_us: u64,
}

impl LeaseSettings {
    /// `lease_max` when the config leaves it out: 100 units.
    pub const DEFAULT_MAX: u64 = 100;
    /// `lease_ttl` when the config leaves it out: 1 s, in µs.
    pub const DEFAULT_TTL_US: u64 = 1_000_000;
}

/// What a `Leased` store is: shared with its background tasks (returns,
/// expiry, top-ups).
struct Core<S> {
    inner: Arc<S>,
    table: Arc<Table>,
    settings: LeaseSettings,
    /// The instances sharing the budget: a lease is at most what is left
    /// over twice their number (`algorithm::lease_units`).
    instances: Instances,
    /// How long a request waits for another's fetch: the store's deadline.
    wait: Duration,
    clock: Arc<dyn Clock>,
    /// Never stepped: a lease's age is also measured by it.
    monotonic: Arc<dyn Clock>,
    /// Started on first use, on the proxy's runtime. A return may hold its
    /// key's fetch until it lands.
    returns: OnceLock<mpsc::UnboundedSender<(Return, Option<Fetching>)>>,
    metrics: Option<LeaseMetrics>,
}

/// A store that takes leases from `inner` and decides from them.
pub struct Leased<S>(Arc<Core<S>>);

impl<S: Store + 'static> Leased<S> {
    /// Leases from `inner` as `settings` say, each lease sized by the
    /// `instances` sharing the budget; a request waits at most `wait` (the
    /// store's deadline) for a lease another request is fetching.
    pub fn new(
        inner: S,
        settings: LeaseSettings,
        instances: Instances,
        wait: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Leased(Arc::new(Core {
            inner: Arc::new(inner),
            table: Arc::new(Table::new(true)),
            settings,
            instances,
            wait,
            clock,
            monotonic: Arc::new(MonotonicClock::default()),
            returns: OnceLock::new(),
            metrics: None,
        }))
    }

    /// Measures leases' ages also by `monotonic` (a test's own clock).
    pub fn with_monotonic(mut self, monotonic: Arc<dyn Clock>) -> Self {
        if let Some(core) = Arc::get_mut(&mut self.0) {
            core.monotonic = monotonic;
        }
        self
    }

    /// Leases nothing until the channel of operators' changes is heard
    /// (`Forget::listening`).
    pub fn until_listening(self) -> Self {
        self.0.table.listening.store(false, Ordering::Release);
        self
    }

    /// Also counts what the leases do in `metrics`.
    pub fn with_metrics(mut self, metrics: LeaseMetrics) -> Self {
        if let Some(core) = Arc::get_mut(&mut self.0) {
            core.metrics = Some(metrics);
        }
        self
    }

    /// Hears of the keys an operator reset (their leases are dropped) or
    /// credited (their leases go back) through another instance.
    pub fn forgetter(&self) -> Arc<dyn Forget> {
        self.0.clone()
    }

    /// Leases held now.
    pub fn leases_held(&self) -> usize {
        self.0.table.leases_held()
    }

    /// Gives every lease back now and waits for the returns (shutdown,
    /// reload).
    pub async fn return_all(&self) {
        self.0.return_all().await;
    }
}

impl<S: Store + 'static> Core<S> {
    /// `answer`, after dropping every lease if it is a failure: the
    /// store's state is unknown then (a restart may have emptied it, a
    /// failover lost its last writes), and no lease taken from it may be
    /// spent or given back on top of what it says next. A branch per call.
    fn checked<T>(&self, answer: Result<T, LimiterError>) -> Result<T, LimiterError> {
        if answer.is_err() {
            self.table.forget_all();
        }
        answer
    }

    fn now(&self) -> Now {
        Now {
            wall_us: self.clock.now_us(),
            monotonic_us: self.monotonic.now_us(),
        }
    }

    /// Whether `check` may be decided from a lease.
    fn leasable(&self, check: &Check) -> bool {
        self.table.listening.load(Ordering::Acquire)
            && check.leasing == Leasing::Allowed
            && check.spending == Spending::Charge
            && check.enforcement == Enforcement::Enforce
            && check.cost > 0
            && takes_lease(check.algorithm.kind())
    }
}

/// The lease table as operators change the state: `Table`'s forgetting,
/// and a credit's returns, which need the store.
impl<S: Store + 'static> Forget for Core<S> {
    fn forget(&self, keys: &[StateKey]) {
        self.table.forget(keys);
    }

    /// Unlike a reset, a credit leaves the state counting what was leased
    /// of it: a lease dropped would keep its unused units spent, and the
    /// credit would add fewer than its units. The leases go back instead,
    /// with no new generation (the rest of the state is as it was). Given
    /// back after the credit, they come off the count as they would have
    /// before it, unless a charge lands in between and the credit was of
    /// more than the client had used (the client then gets at most the
    /// credit's units more than a full budget).
    fn credited(&self, keys: &[StateKey]) {
        for back in self.take_back(keys) {
            let _ = self.returns().send(back);
        }
    }

    fn forget_all(&self) {
        self.table.forget_all();
    }

    fn listening(&self) {
        self.table.listening();
    }

    fn not_listening(&self) {
        self.table.not_listening();
    }
}

/// Every call to the store below goes through `Core::checked`: whatever
/// fails, every lease is dropped.
#[async_trait]
impl<S: Store + 'static> Store for Leased<S> {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.0.decide(checks).await
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.0.checked(self.0.inner.peek(checks).await)
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.0.reset(checks).await
    }

    /// This instance's lease of the key goes back first, and lands before
    /// the credit (which gives back no more than the bucket or the window
    /// holds then). The other instances give theirs back when they hear of
    /// the credit.
    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        let backs = self.0.take_back(std::slice::from_ref(&check.key));
        self.0.send_back(backs).await;
        self.0.checked(self.0.inner.credit(check).await)
    }

    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        self.0.refund(check, counted_at_us).await
    }
}

/// Leases nothing of the slots: a failed call drops every lease all the
/// same, as any failed call below does.
#[async_trait]
impl<S: Store + 'static> Concurrency for Leased<S> {
    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        self.0.checked(self.0.inner.acquire(slot).await)
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.0.checked(self.0.inner.renew(slot).await)
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.0.checked(self.0.inner.release(slot).await)
    }
}

/// Calls below checked, as every one is; the leases held go back whole.
#[async_trait]
impl<S: Store + 'static> Upkeep for Leased<S> {
    async fn probe(&self) -> Result<(), LimiterError> {
        self.0.checked(self.0.inner.probe().await)
    }

    async fn warm(&self) -> Result<(), LimiterError> {
        self.0.checked(self.0.inner.warm().await)
    }

    fn deciding(&self) -> Deciding {
        self.0.inner.deciding()
    }

    async fn return_leases(&self) {
        self.0.return_all().await;
    }
}

#[cfg(test)]
mod tests;
