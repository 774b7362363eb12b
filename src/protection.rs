//! Protecting a fragile upstream (`[upstream.protection]`): requests in
//! flight to it held under a limit that follows its latency
//! (`controller`), each priority class allowed a share of that limit so
//! that the lowest is refused first. Past its share a request is answered
//! 503: the server protecting itself, not the client's quota. Each
//! instance runs its own limit on what it sends.

pub mod controller;
pub mod simulation;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use crate::identity::Tier;
use crate::metrics::ProtectionMetrics;
use controller::{Controller, ControllerSettings};

/// `[upstream.protection]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtectionSettings {
    pub controller: ControllerSettings,
    /// Tiers from the highest priority down, compared by name (ids are a
    /// configuration's own); a tier not listed is below them all.
    pub priority: Vec<Tier>,
    /// The share of the limit the lowest class may not take, held for the
    /// classes above it (in steps between them).
    pub reserve: f64,
    pub retry_after: Duration,
}

impl ProtectionSettings {
    /// Requests in flight a request of `tier` may join, out of `limit`:
    /// the whole limit for the highest class, less `reserve` of it for the
    /// lowest, the classes between in even steps.
    pub fn share(&self, tier: Option<&Tier>, limit: u32) -> usize {
        let classes = self.priority.len() + 1;
        let rank = tier
            .and_then(|tier| self.priority.iter().position(|t| t.name() == tier.name()))
            .unwrap_or(classes - 1);
        let held = if classes > 1 {
            self.reserve * rank as f64 / (classes - 1) as f64
        } else {
            0.0
        };
        (f64::from(limit) * (1.0 - held)).floor() as usize
    }
}

/// The upstream's protection, kept across reloads (what it learnt and the
/// requests in flight carry over).
pub struct Protection {
    on: AtomicBool,
    settings: ArcSwapOption<ProtectionSettings>,
    controller: Mutex<Option<Controller>>,
    /// The controller's limit, read without its lock.
    limit: AtomicU32,
    in_flight: AtomicUsize,
    started: Instant,
    metrics: ProtectionMetrics,
}

/// A place among the requests in flight to the upstream, given back when
/// dropped.
pub struct Permit {
    protection: Arc<Protection>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let left = self.protection.in_flight.fetch_sub(1, Ordering::AcqRel) - 1;
        self.protection.metrics.in_flight.set(left as i64);
    }
}

/// Refused to protect the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    pub limit: u32,
    pub retry_after: Duration,
}

impl Protection {
    pub fn new(metrics: ProtectionMetrics) -> Protection {
        Protection {
            on: AtomicBool::new(false),
            settings: ArcSwapOption::empty(),
            controller: Mutex::new(None),
            limit: AtomicU32::new(0),
            in_flight: AtomicUsize::new(0),
            started: Instant::now(),
            metrics,
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The config's protection (none: off). A controller already running
    /// keeps its limit and its minimum latency.
    pub fn configure(&self, settings: Option<ProtectionSettings>) {
        let mut controller = self.controller.lock().unwrap_or_else(|e| e.into_inner());
        match &settings {
            None => *controller = None,
            Some(s) => match controller.as_mut() {
                Some(running) => running.reconfigure(s.controller),
                None => *controller = Some(Controller::new(s.controller, self.now_us())),
            },
        }
        for tier in settings.iter().flat_map(|s| &s.priority) {
            self.metrics.shed.with_label_values(&[tier.name()]);
        }
        let limit = controller.as_ref().map_or(0, Controller::limit);
        self.limit.store(limit, Ordering::Release);
        self.metrics.limit.set(i64::from(limit));
        self.on.store(settings.is_some(), Ordering::Release);
        self.settings.store(settings.map(Arc::new));
    }

    /// A place for a request of `tier`, or the refusal; `None` while off.
    pub fn admit(self: &Arc<Self>, tier: Option<&Tier>) -> Option<Result<Permit, Shed>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        let settings = self.settings.load_full()?;
        let limit = self.limit.load(Ordering::Acquire);
        let share = settings.share(tier, limit);
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= share {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            let priority = match tier {
                Some(tier) if settings.priority.iter().any(|t| t.name() == tier.name()) => {
                    tier.name()
                }
                _ => "other",
            };
            self.metrics.shed.with_label_values(&[priority]).inc();
            return Some(Err(Shed {
                limit,
                retry_after: settings.retry_after,
            }));
        }
        self.metrics.in_flight.set(before as i64 + 1);
        Some(Ok(Permit {
            protection: self.clone(),
        }))
    }

    /// What the status page shows; none while off.
    pub fn snapshot(&self) -> Option<serde_json::Value> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        use prometheus::core::Collector;
        let shed: u64 = Collector::collect(&self.metrics.shed)
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum();
        Some(serde_json::json!({
            "limit": self.limit.load(Ordering::Acquire),
            "in_flight": self.in_flight.load(Ordering::Acquire),
            "min_latency_ms": self.metrics.min_latency_seconds.get() * 1e3,
            "latency_ms": self.metrics.latency_seconds.get() * 1e3,
            "shed": shed,
        }))
    }

    /// An upstream exchange's latency, to its response head.
    pub fn sample(&self, latency: Duration) {
        let now = self.now_us();
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let mut controller = self.controller.lock().unwrap_or_else(|e| e.into_inner());
        let Some(running) = controller.as_mut() else {
            return;
        };
        if let Some(concluded) = running.sample(now, latency_us) {
            self.limit.store(concluded.limit, Ordering::Release);
            self.metrics.limit.set(i64::from(concluded.limit));
            self.metrics
                .min_latency_seconds
                .set(concluded.min_latency_us as f64 / 1e6);
            self.metrics
                .latency_seconds
                .set(concluded.median_us as f64 / 1e6);
        }
    }
}
