//! Protecting a fragile upstream (`[upstream.protection]`): requests in
//! flight to it held under a limit that follows its latency
//! (`controller`), each priority class allowed a share of that limit so
//! that the lowest is refused first. Past its share a request waits in a
//! short queue when one is configured (highest priority first, bounded in
//! length and in wait), and is otherwise answered 503: the server
//! protecting itself, not the client's quota. Each instance runs its own
//! limit on what it sends.

pub mod controller;
pub mod simulation;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use crate::server::metrics::ProtectionMetrics;
use controller::{Controller, ControllerSettings};
use floodgate_policy::identity::Tier;
use floodgate_policy::{Matcher, RequestView};

/// `[upstream.protection]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtectionSettings {
    pub controller: ControllerSettings,
    /// Classes from the highest priority down; a request in none is below
    /// them all.
    pub priority: Vec<PriorityClass>,
    /// The share of the limit the lowest class may not take, held for the
    /// classes above it (in steps between them).
    pub reserve: f64,
    pub retry_after: Duration,
    /// A request past its share waits for a place, at most this long,
    /// among at most this many; none: it is refused at once.
    pub queue: Option<QueueSettings>,
}

/// A class of requests, by its tier or by a match on its head.
#[derive(Debug, Clone)]
pub enum PriorityClass {
    /// Compared by name: ids are a configuration's own.
    Tier(Tier),
    Match {
        name: Box<str>,
        matcher: Matcher,
    },
}

impl PartialEq for PriorityClass {
    fn eq(&self, other: &PriorityClass) -> bool {
        self.name() == other.name()
    }
}

impl PriorityClass {
    pub fn name(&self) -> &str {
        match self {
            PriorityClass::Tier(tier) => tier.name(),
            PriorityClass::Match { name, .. } => name,
        }
    }

    fn takes(&self, request: &RequestView<'_>) -> bool {
        match self {
            PriorityClass::Tier(tier) => request.client.tier.name() == tier.name(),
            PriorityClass::Match { matcher, .. } => matcher.applies(request),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSettings {
    pub max: usize,
    pub timeout: Duration,
}

impl ProtectionSettings {
    /// A request's class: the first that takes it, 0 the highest;
    /// `priority.len()` for none (or a request not identified).
    pub fn rank(&self, request: Option<&RequestView<'_>>) -> usize {
        request
            .and_then(|r| self.priority.iter().position(|c| c.takes(r)))
            .unwrap_or(self.priority.len())
    }

    /// Whether a class reads more of the request than its tier.
    pub fn matches_requests(&self) -> bool {
        self.priority
            .iter()
            .any(|c| matches!(c, PriorityClass::Match { .. }))
    }

    /// Requests in flight a request of class `rank` may join, out of
    /// `limit`: the whole limit for the highest class, less `reserve` of
    /// it for the lowest, the classes between in even steps.
    pub fn share(&self, rank: usize, limit: u32) -> usize {
        let classes = self.priority.len() + 1;
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
    /// Requests waiting for a place, by class; what a released place is
    /// handed to (`queue`).
    waiting: Mutex<Vec<VecDeque<tokio::sync::oneshot::Sender<()>>>>,
    /// How many wait (some may have given up), read without the lock.
    waiting_count: AtomicUsize,
    /// Sheds since the last line, and when that was (µs on `started`): one
    /// line every 10 s at most, whatever the flood.
    shed_unlogged: AtomicUsize,
    shed_logged_us: std::sync::atomic::AtomicU64,
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
        let protection = &self.protection;
        // The place goes to the first request waiting that may take it.
        if protection.waiting_count.load(Ordering::Acquire) > 0 && protection.hand_over() {
            return;
        }
        let left = protection.in_flight.fetch_sub(1, Ordering::AcqRel) - 1;
        protection.metrics.in_flight.set(left as i64);
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
            waiting: Mutex::new(Vec::new()),
            waiting_count: AtomicUsize::new(0),
            shed_unlogged: AtomicUsize::new(0),
            shed_logged_us: std::sync::atomic::AtomicU64::new(0),
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
        for class in settings.iter().flat_map(|s| &s.priority) {
            self.metrics.shed.with_label_values(&[class.name()]);
        }
        let limit = controller.as_ref().map_or(0, Controller::limit);
        self.limit.store(limit, Ordering::Release);
        self.metrics.limit.set(i64::from(limit));
        self.on.store(settings.is_some(), Ordering::Release);
        self.settings.store(settings.map(Arc::new));
    }

    /// The settings while on.
    pub fn settings(&self) -> Option<Arc<ProtectionSettings>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.settings.load_full()
    }

    /// A place for a request of `tier`, or the refusal; `None` while off.
    /// Past its share, the request waits in the queue (when there is one)
    /// for a place to be handed to it.
    pub async fn admit(
        self: &Arc<Self>,
        settings: &ProtectionSettings,
        rank: usize,
    ) -> Option<Result<Permit, Shed>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        if self.try_take(settings, rank) {
            return Some(Ok(self.permit()));
        }
        let waited = match settings.queue {
            Some(queue) => self.wait(settings, rank, queue).await,
            None => false,
        };
        if waited {
            return Some(Ok(self.permit()));
        }
        let priority = settings
            .priority
            .get(rank)
            .map_or("other", PriorityClass::name);
        self.metrics.shed.with_label_values(&[priority]).inc();
        self.log_shed();
        Some(Err(Shed {
            limit: self.limit.load(Ordering::Acquire),
            retry_after: settings.retry_after,
        }))
    }

    /// A line for the sheds, apart from refusals by limits (which are the
    /// client's quota, and 429s): the first at once, then one every 10 s
    /// with the count since.
    fn log_shed(&self) {
        const EVERY_US: u64 = 10_000_000;
        self.shed_unlogged.fetch_add(1, Ordering::AcqRel);
        let now = self.now_us().max(1);
        let last = self.shed_logged_us.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) < EVERY_US {
            return;
        }
        if self
            .shed_logged_us
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let count = self.shed_unlogged.swap(0, Ordering::AcqRel).max(1);
            log::warn!(
                "upstream protected: {count} request(s) answered 503 since the last line (limit {}, {} in flight)",
                self.limit.load(Ordering::Acquire),
                self.in_flight.load(Ordering::Acquire)
            );
        }
    }

    fn permit(self: &Arc<Self>) -> Permit {
        Permit {
            protection: self.clone(),
        }
    }

    /// A place for class `rank`, if its share has one.
    fn try_take(&self, settings: &ProtectionSettings, rank: usize) -> bool {
        let share = settings.share(rank, self.limit.load(Ordering::Acquire));
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= share {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        self.metrics.in_flight.set(before as i64 + 1);
        true
    }

    /// Waits for a place to be handed over, at most the queue's timeout;
    /// whether one was.
    async fn wait(&self, settings: &ProtectionSettings, rank: usize, queue: QueueSettings) -> bool {
        let handed = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            // A place may have come free since the first try.
            if self.try_take(settings, rank) {
                return true;
            }
            waiting
                .iter_mut()
                .for_each(|q| q.retain(|tx| !tx.is_closed()));
            let count: usize = waiting.iter().map(VecDeque::len).sum();
            if count >= queue.max {
                return false;
            }
            if waiting.len() <= rank {
                waiting.resize_with(rank + 1, VecDeque::new);
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            waiting[rank].push_back(tx);
            self.waiting_count.store(count + 1, Ordering::Release);
            self.metrics.queued.set(count as i64 + 1);
            rx
        };
        let got = matches!(
            tokio::time::timeout(queue.timeout, handed).await,
            Ok(Ok(()))
        );
        if !got {
            // Gone from the queue's count; its sender is dropped when next
            // met (a place offered to it goes on to the next).
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            waiting
                .iter_mut()
                .for_each(|q| q.retain(|tx| !tx.is_closed()));
            let count: usize = waiting.iter().map(VecDeque::len).sum();
            self.waiting_count.store(count, Ordering::Release);
            self.metrics.queued.set(count as i64);
        }
        got
    }

    /// Hands the place a request gives back to the first waiting request,
    /// highest class first, whose share allows it; whether one took it (the
    /// count in flight then stays as it is).
    fn hand_over(&self) -> bool {
        let Some(settings) = self.settings.load_full() else {
            return false;
        };
        let limit = self.limit.load(Ordering::Acquire);
        let after_release = self.in_flight.load(Ordering::Acquire).saturating_sub(1);
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let mut handed = false;
        for (rank, queue) in waiting.iter_mut().enumerate() {
            if after_release >= settings.share(rank, limit) {
                continue;
            }
            while let Some(tx) = queue.pop_front() {
                if tx.send(()).is_ok() {
                    handed = true;
                    break;
                }
            }
            if handed {
                break;
            }
        }
        let count: usize = waiting.iter().map(VecDeque::len).sum();
        self.waiting_count.store(count, Ordering::Release);
        self.metrics.queued.set(count as i64);
        handed
    }

    /// Places the limit grew by, handed to the requests waiting.
    fn admit_waiting(&self) {
        if self.waiting_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let Some(settings) = self.settings.load_full() else {
            return;
        };
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        for (rank, queue) in waiting.iter_mut().enumerate() {
            while !queue.is_empty() && self.try_take(&settings, rank) {
                let mut taken = false;
                while let Some(tx) = queue.pop_front() {
                    if tx.send(()).is_ok() {
                        taken = true;
                        break;
                    }
                }
                if !taken {
                    // Nobody left to take it.
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        let count: usize = waiting.iter().map(VecDeque::len).sum();
        self.waiting_count.store(count, Ordering::Release);
        self.metrics.queued.set(count as i64);
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
            "queued": self.waiting_count.load(Ordering::Acquire),
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
            drop(controller);
            self.admit_waiting();
        }
    }
}
