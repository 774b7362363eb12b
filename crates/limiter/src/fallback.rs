//! A shared store with a way out: a circuit breaker, and the per-limit
//! `on_failure` when the store cannot decide.
//!
//! Closed (the store answers): every request is decided by the store. The
//! first failure (timeout, refused or reset connection, error reply) opens
//! the breaker: from then on requests are decided at once without touching
//! the store, and one background task probes the store until it answers,
//! then closes the breaker. The probe writes, so a store that answers but
//! refuses writes keeps the breaker open. Each transition is logged once, and
//! at most one open/close pair per `LOG_PAIR_EVERY`: the flaps in between
//! are counted and reported with the next pair. A request never waits on a
//! reconnect: the only wait on the request path is the call that fails,
//! bounded by the store's own deadline.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use log::{debug, info, warn};

use super::check::{Check, Enforcement, OnFailure, Slot};
use super::deny_cache::open_decision;
use super::error::LimiterError;
use super::instances::Instances;
use super::memory::MemoryStore;
use super::store::{Concurrency, Deciding, Store, Upkeep};
use crate::clock::Clock;
use crate::log_throttle::LogThrottle;
use crate::metrics::RedisMetrics;
use crate::watch::{self, Answerer};
use floodgate_algorithm::Decision;

/// How often an open breaker asks the store whether it is back.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// At most one logged open/close pair per this long.
const LOG_PAIR_EVERY: Duration = Duration::from_secs(10);

/// What a fail-closed layer tells the client to wait: about one probe.
const DENY_RETRY_US: u64 = 1_000_000;

struct Inner<S> {
    shared: S,
    local: Arc<MemoryStore>,
    instances: Instances,
    open: AtomicBool,
    probing: AtomicBool,
    opened_at_us: AtomicU64,
    /// Openings logged (with the flaps held back since), and whether the
    /// current one was (its closing is logged only if so).
    openings_log: LogThrottle,
    open_logged: AtomicBool,
    metrics: RedisMetrics,
    clock: Arc<dyn Clock>,
}

/// The fallback: a store that decides on `S` while it answers, and as each
/// layer's `on_failure` says while it does not (a circuit breaker between).
pub struct Fallback<S> {
    inner: Arc<Inner<S>>,
}

impl<S: Store + 'static> Fallback<S> {
    /// `shared` decides while it answers; `local` holds the in-process state
    /// of `on_failure = "local"` layers, each limit divided by `instances`.
    pub fn new(
        shared: S,
        local: Arc<MemoryStore>,
        instances: Instances,
        metrics: RedisMetrics,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Fallback {
            inner: Arc::new(Inner {
                shared,
                local,
                instances,
                open: AtomicBool::new(false),
                probing: AtomicBool::new(false),
                opened_at_us: AtomicU64::new(0),
                openings_log: LogThrottle::new(LOG_PAIR_EVERY),
                open_logged: AtomicBool::new(false),
                metrics,
                clock,
            }),
        }
    }

    /// True while decisions are made without the shared store.
    pub fn degraded(&self) -> bool {
        self.inner.open.load(Ordering::Acquire)
    }
}

impl<S: Store + 'static> Inner<S> {
    fn trip(self: &Arc<Self>, error: &LimiterError) {
        self.metrics.failures.inc();
        if !self.open.swap(true, Ordering::AcqRel) {
            let now_us = self.clock.now_us();
            self.opened_at_us.store(now_us, Ordering::Release);
            let due = self.openings_log.due(now_us);
            self.open_logged.store(due.is_some(), Ordering::Release);
            if let Some(flaps) = due {
                let flaps = if flaps > 0 {
                    format!(" ({flaps} more failures and recoveries since the last report were not logged)")
                } else {
                    String::new()
                };
                warn!(
                    "Redis failed ({error}): deciding without it (on_failure; local limits divided by {}{}) until it answers again{flaps}",
                    self.instances.get(),
                    if self.instances.is_counted() { ", the instances last counted" } else { "" }
                );
            } else {
                debug!("Redis failed again ({error}): deciding without it until it answers");
            }
        }
        if !self.probing.swap(true, Ordering::AcqRel) {
            let inner = self.clone();
            tokio::spawn(async move { inner.probe_until_back().await });
        }
    }

    async fn probe_until_back(self: Arc<Self>) {
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            // Loads the script too, so the first request after a restart
            // finds it there.
            match self.shared.probe().await {
                Ok(()) => break,
                Err(error) => {
                    debug!("Redis probe failed: {error}");
                    self.metrics.failures.inc();
                }
            }
        }
        let down_us = self
            .clock
            .now_us()
            .saturating_sub(self.opened_at_us.load(Ordering::Acquire));
        // Probing ends before the breaker closes: a failure in between then
        // finds no probe running and starts one. (The other order let such a
        // failure reopen the breaker with nobody left to close it.)
        self.probing.store(false, Ordering::Release);
        self.open.store(false, Ordering::Release);
        if self.open_logged.load(Ordering::Acquire) {
            info!(
                "Redis answers again after {:.1}s: decisions are back on Redis",
                down_us as f64 / 1e6
            );
        }
    }

    /// A slot of this instance's share of the limit's slots (at least one).
    fn local_slot(&self, slot: &Slot) -> Slot {
        slot.share(self.instances.get())
    }

    /// The `on_failure = "local"` layers, each with this instance's share of
    /// its limit.
    fn local_share(&self, checks: &[Check]) -> Vec<Check> {
        let instances = self.instances.get();
        checks
            .iter()
            .filter(|c| c.on_failure == OnFailure::Local)
            .map(|c| Check {
                algorithm: c.algorithm.divided(instances),
                ..c.clone()
            })
            .collect()
    }

    /// Decides without the shared store, layer by layer as `on_failure`
    /// says, still all-or-nothing: a layer that fails closed charges nothing
    /// locally.
    fn decide_without_shared(&self, checks: &[Check]) -> Vec<Decision> {
        self.metrics.fallback_decisions.inc();
        watch::answered_by(Answerer::Fallback);
        let closed = checks
            .iter()
            .any(|c| c.enforcement == Enforcement::Enforce && c.on_failure == OnFailure::Deny);
        let local_checks = self.local_share(checks);
        let local_decisions = if closed {
            // Nothing is charged when the request is refused anyway.
            local_checks
                .iter()
                .map(|c| {
                    c.algorithm
                        .evaluate(&c.algorithm.fresh_state(), 0, 0)
                        .decision
                })
                .collect()
        } else {
            self.local.decide_now(&local_checks)
        };
        by_on_failure(checks, local_decisions)
    }
}

/// Each layer's answer as its `on_failure` says, given the local decisions
/// of the `local` layers, in order.
fn by_on_failure(checks: &[Check], local: Vec<Decision>) -> Vec<Decision> {
    let mut local = local.into_iter();
    checks
        .iter()
        .map(|c| match c.on_failure {
            OnFailure::Local => local.next().unwrap_or_else(|| open_decision(c)),
            OnFailure::Allow => open_decision(c),
            OnFailure::Deny => {
                Decision::refused(c.algorithm.quota(), 0, DENY_RETRY_US, DENY_RETRY_US)
            }
        })
        .collect()
}

#[async_trait]
impl<S: Store + 'static> Store for Fallback<S> {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        if self.degraded() {
            return Ok(self.inner.decide_without_shared(checks));
        }
        match self.inner.shared.decide(checks).await {
            Ok(decisions) => Ok(decisions),
            Err(e) => {
                self.inner.trip(&e);
                Ok(self.inner.decide_without_shared(checks))
            }
        }
    }

    /// What `decide` would answer: the shared store's word while it
    /// answers, else `on_failure`'s, charging nothing either way.
    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        if !self.degraded() {
            match self.inner.shared.peek(checks).await {
                Ok(decisions) => return Ok(decisions),
                Err(e) => self.inner.trip(&e),
            }
        }
        watch::answered_by(Answerer::Fallback);
        let local = self.inner.local_share(checks);
        let now_us = self.inner.clock.now_us();
        let local = self.inner.local.peek_at(&local, now_us);
        Ok(by_on_failure(checks, local))
    }

    /// Resets both: the shared state, and what was decided locally while
    /// the shared store was away. A shared store that cannot be told is an
    /// error (the state there stands); it is asked even while the breaker
    /// is open, since an operator's reset is worth the wait. Its failure
    /// does not trip the breaker: an operator's call, given a longer
    /// deadline than a request's, is no measure of the store's health.
    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.inner.local.forget(checks);
        self.inner.shared.reset(checks).await
    }

    /// Credited on the shared store, asked even while the breaker is open
    /// (as a reset is, and as a reset's, its failure trips nothing); what
    /// was decided locally while it was away is left as it is, and ends
    /// with the outage.
    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        self.inner.shared.credit(check).await
    }

    /// Where the reservation was taken: on the shared store while it
    /// answers; on this instance's share while it is away, for the layers
    /// decided locally then (`on_failure = "local"`; the others took
    /// nothing). The caller gives a reservation back only to the store that
    /// was deciding when it was taken.
    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        if !self.degraded() {
            return self.inner.shared.refund(check, counted_at_us).await;
        }
        if let [local] = self
            .inner
            .local_share(std::slice::from_ref(check))
            .as_slice()
        {
            self.inner.local.refund(local, counted_at_us).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl<S: Store + 'static> Concurrency for Fallback<S> {
    /// Without the shared store, a slot is taken as its `on_failure` says:
    /// locally from this instance's share of the slots, or admitted, or
    /// refused.
    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        if !self.degraded() {
            match self.inner.shared.acquire(slot).await {
                Ok(decision) => return Ok(decision),
                Err(e) => self.inner.trip(&e),
            }
        }
        self.inner.metrics.fallback_decisions.inc();
        Ok(match slot.on_failure() {
            OnFailure::Local => self.inner.local.acquire_now(&self.inner.local_slot(slot)),
            OnFailure::Allow => Decision::admitted(slot.max(), slot.max() - 1, 0),
            OnFailure::Deny => Decision::refused(slot.max(), 0, DENY_RETRY_US, DENY_RETRY_US),
        })
    }

    /// A lease is renewed where it was taken: a local one (taken while the
    /// shared store was away) stays local after the store is back; one
    /// granted by `on_failure = "allow"` was never counted and stays held
    /// while the store is away. A shared lease the store cannot be asked
    /// about says false, and ends at its expiry there.
    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        if self.inner.local.renew_now(&self.inner.local_slot(slot)) {
            return Ok(true);
        }
        if !self.degraded() {
            match self.inner.shared.renew(slot).await {
                Ok(held) => return Ok(held),
                Err(e) => self.inner.trip(&e),
            }
        }
        Ok(slot.on_failure() == OnFailure::Allow)
    }

    /// Released wherever it may be held: locally, and on the shared store
    /// (an acquisition that timed out may have been run there all the same).
    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        let local = self.inner.local.release_now(&self.inner.local_slot(slot));
        if self.degraded() {
            return Ok(local);
        }
        match self.inner.shared.release(slot).await {
            Ok(shared) => Ok(local || shared),
            Err(e) => {
                self.inner.trip(&e);
                Ok(local)
            }
        }
    }
}

#[async_trait]
impl<S: Store + 'static> Upkeep for Fallback<S> {
    async fn probe(&self) -> Result<(), LimiterError> {
        self.inner.shared.probe().await
    }

    async fn warm(&self) -> Result<(), LimiterError> {
        self.inner.shared.warm().await
    }

    async fn return_leases(&self) {
        if !self.degraded() {
            self.inner.shared.return_leases().await;
        }
    }

    fn deciding(&self) -> Deciding {
        if self.degraded() {
            Deciding::Fallback
        } else {
            self.inner.shared.deciding()
        }
    }

    fn keys_held(&self) -> usize {
        self.inner.local.len()
    }

    fn sweep(&self) -> usize {
        self.inner.local.sweep()
    }
}

#[cfg(test)]
mod tests;
