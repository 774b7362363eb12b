//! Redis with a way out: a deadline on every call, a circuit breaker, and the
//! per-limit `on_failure` when Redis cannot decide.
//!
//! Closed (Redis answers): every request is decided by Redis. The first
//! failure (timeout, refused or reset connection, error reply) opens the
//! breaker: from then on requests are decided at once without touching Redis,
//! and one background task probes Redis until it answers, then closes the
//! breaker. The probe runs the decision script with a write, so a Redis that
//! answers but refuses writes keeps the breaker open. Each transition is
//! logged once, and at most one open/close pair per `LOG_PAIR_EVERY`: the
//! flaps in between are counted and reported with the next pair. A request
//! never waits on a reconnect: the only Redis wait on the request path is the
//! call that fails, bounded by `[redis].timeout`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use log::{info, warn};

use super::deny_cache::DenyCache;
use super::{Limiter, LimiterError, LocalLimiter, RedisLimiter};
use crate::algorithm::Decision;
use crate::clock::Clock;
use crate::metrics::RedisMetrics;
use crate::policy::{Check, OnFailure};

/// How often an open breaker asks Redis whether it is back.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// At most one logged open/close pair per this long.
const LOG_PAIR_EVERY: Duration = Duration::from_secs(10);

/// What a fail-closed layer tells the client to wait: about one probe.
const DENY_RETRY_US: u64 = 1_000_000;

struct Inner {
    redis: RedisLimiter,
    local: Arc<LocalLimiter>,
    instances: u64,
    open: AtomicBool,
    probing: AtomicBool,
    opened_at: Mutex<Option<Instant>>,
    /// When the last logged opening was, and whether the current opening
    /// was logged (its closing is logged only if so).
    last_logged_open: Mutex<Option<Instant>>,
    open_logged: AtomicBool,
    suppressed_flaps: AtomicU64,
    metrics: RedisMetrics,
    deny_cache: DenyCache,
    clock: Arc<dyn Clock>,
}

pub struct FallbackLimiter {
    inner: Arc<Inner>,
}

impl FallbackLimiter {
    pub fn new(
        redis: RedisLimiter,
        local: Arc<LocalLimiter>,
        instances: u64,
        metrics: RedisMetrics,
        clock: Arc<dyn Clock>,
    ) -> Self {
        FallbackLimiter {
            inner: Arc::new(Inner {
                redis,
                local,
                instances,
                open: AtomicBool::new(false),
                probing: AtomicBool::new(false),
                opened_at: Mutex::new(None),
                last_logged_open: Mutex::new(None),
                open_logged: AtomicBool::new(false),
                suppressed_flaps: AtomicU64::new(0),
                metrics,
                deny_cache: DenyCache::new(100_000),
                clock,
            }),
        }
    }

    /// True while decisions are made without Redis.
    pub fn degraded(&self) -> bool {
        self.inner.open.load(Ordering::Acquire)
    }
}

impl Inner {
    fn trip(self: &Arc<Self>, error: &LimiterError) {
        self.metrics.failures.inc();
        if !self.open.swap(true, Ordering::AcqRel) {
            let now = Instant::now();
            if let Ok(mut at) = self.opened_at.lock() {
                *at = Some(now);
            }
            let log = self.last_logged_open.lock().is_ok_and(|mut last| {
                let due = last.is_none_or(|t| now.duration_since(t) >= LOG_PAIR_EVERY);
                if due {
                    *last = Some(now);
                }
                due
            });
            self.open_logged.store(log, Ordering::Release);
            if log {
                let flaps = self.suppressed_flaps.swap(0, Ordering::AcqRel);
                let flaps = if flaps > 0 {
                    format!(" ({flaps} more failures and recoveries since the last report were not logged)")
                } else {
                    String::new()
                };
                warn!(
                    "Redis failed ({error}): deciding without it (on_failure; local limits divided by {}) until it answers again{flaps}",
                    self.instances
                );
            } else {
                self.suppressed_flaps.fetch_add(1, Ordering::AcqRel);
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
            match self.redis.probe().await {
                Ok(()) => break,
                Err(_) => {
                    self.metrics.failures.inc();
                }
            }
        }
        let down_for = self
            .opened_at
            .lock()
            .ok()
            .and_then(|mut at| at.take())
            .map_or(Duration::ZERO, |t| t.elapsed());
        self.open.store(false, Ordering::Release);
        self.probing.store(false, Ordering::Release);
        if self.open_logged.load(Ordering::Acquire) {
            info!(
                "Redis answers again after {:.1}s: decisions are back on Redis",
                down_for.as_secs_f64()
            );
        }
    }

    /// Decides without Redis, layer by layer as `on_failure` says, still
    /// all-or-nothing: a layer that fails closed charges nothing locally.
    fn decide_without_redis(&self, checks: &[Check]) -> Vec<Decision> {
        self.metrics.fallback_decisions.inc();
        let closed = checks
            .iter()
            .any(|c| !c.shadow && c.on_failure == OnFailure::Deny);
        let local_checks: Vec<Check> = checks
            .iter()
            .filter(|c| c.on_failure == OnFailure::Local)
            .map(|c| Check {
                algorithm: c.algorithm.divided(self.instances),
                ..c.clone()
            })
            .collect();
        let mut local_decisions = if closed {
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
        }
        .into_iter();
        checks
            .iter()
            .map(|c| match c.on_failure {
                OnFailure::Local => local_decisions.next().unwrap_or_else(|| open_decision(c)),
                OnFailure::Allow => open_decision(c),
                OnFailure::Deny => Decision {
                    allowed: false,
                    cost_exceeds_limit: false,
                    limit: c.algorithm.quota(),
                    remaining: 0,
                    reset_after_us: DENY_RETRY_US,
                    retry_after_us: DENY_RETRY_US,
                    delay_us: 0,
                },
            })
            .collect()
    }
}

impl Inner {
    /// Decisions for a request one of whose layers Redis is known to refuse
    /// still: that layer refuses, the others are reported unchanged (nothing
    /// is charged, as Redis would charge nothing).
    fn known_refusal(&self, checks: &[Check], now_us: u64) -> Option<Vec<Decision>> {
        // Most requests have no known refusal: look before building anything.
        let (at, refusal) = checks
            .iter()
            .enumerate()
            .find_map(|(i, c)| Some((i, self.deny_cache.refusal(c, now_us)?)))?;
        Some(
            checks
                .iter()
                .enumerate()
                .map(|(i, c)| match i.cmp(&at) {
                    std::cmp::Ordering::Less => open_decision(c),
                    std::cmp::Ordering::Equal => refusal,
                    std::cmp::Ordering::Greater => self
                        .deny_cache
                        .refusal(c, now_us)
                        .unwrap_or_else(|| open_decision(c)),
                })
                .collect(),
        )
    }
}

/// Fail open: admitted, nothing known about the quota's use.
fn open_decision(check: &Check) -> Decision {
    Decision {
        allowed: true,
        cost_exceeds_limit: false,
        limit: check.algorithm.quota(),
        remaining: check.algorithm.quota().saturating_sub(check.cost),
        reset_after_us: 0,
        retry_after_us: 0,
        delay_us: 0,
    }
}

#[async_trait]
impl Limiter for FallbackLimiter {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        if self.degraded() {
            return Ok(self.inner.decide_without_redis(checks));
        }
        let now_us = self.inner.clock.now_us();
        if let Some(known) = self.inner.known_refusal(checks, now_us) {
            return Ok(known);
        }
        let timer = self.inner.metrics.call_seconds.start_timer();
        let result = self.inner.redis.decide(checks).await;
        timer.observe_duration();
        match result {
            Ok(decisions) => {
                self.inner.deny_cache.remember(checks, &decisions, now_us);
                Ok(decisions)
            }
            Err(e) => {
                self.inner.trip(&e);
                Ok(self.inner.decide_without_redis(checks))
            }
        }
    }

    fn keys_held(&self) -> usize {
        self.inner.local.len()
    }
}
