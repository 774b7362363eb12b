//! The adaptive limit on requests in flight to the upstream: a gradient on
//! the upstream's minimum latency, as Envoy's adaptive concurrency filter
//! and Netflix's Gradient2 move theirs.
//!
//! Every `window`, the latencies measured in it (the upstream exchange, up
//! to its response head) give the limit a gradient: `tolerance` times the
//! minimum latency known, over the window's median (as Envoy's p50: a few
//! slow exchanges, or a moment the proxy's own CPU was busy, do not move
//! it), held to [0.5, 2].
//! The limit becomes `limit × gradient + 1`. While in-flight requests are
//! served at once the average is the minimum, the gradient `tolerance`, and
//! the limit grows; once the upstream queues them, each request in flight
//! past its capacity N adds its share to the wait, and the limit settles
//! where `tolerance × N / limit × limit + 1 = limit`: about
//! `tolerance × N + 1` in flight, at about `tolerance` times the minimum
//! latency.
//!
//! A minimum latency only falls by itself. So every `probe_interval` the
//! limit drops to `min` for one window, and what that window measures,
//! uncongested, becomes the minimum: an upstream that got slower (a deploy,
//! a cold cache) is followed, not throttled for ever. The limit before the
//! probe comes back after it.
//!
//! Time is the caller's (µs on any clock), so that tests drive it.

/// The controller's numbers (`[upstream.protection]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerSettings {
    pub min: u32,
    pub max: u32,
    pub initial: u32,
    /// How much above its minimum latency the upstream may answer before
    /// the limit shrinks.
    pub tolerance: f64,
    pub window_us: u64,
    pub probe_interval_us: u64,
}

#[derive(Debug, Clone)]
pub struct Controller {
    settings: ControllerSettings,
    limit: f64,
    min_latency_us: Option<u64>,
    window: Window,
    /// The limit to come back to, while a probe measures the minimum.
    probing: Option<f64>,
    next_probe_us: u64,
}

/// Latencies kept per window for its median: past this many, every other
/// one kept is dropped and every other one to come skipped (the median of
/// a window that busy moves little).
const KEPT_PER_WINDOW: usize = 1024;

#[derive(Debug, Clone)]
struct Window {
    started_us: u64,
    count: u64,
    min_us: u64,
    kept: Vec<u64>,
    /// Every `stride`th latency is kept.
    stride: u64,
}

impl Window {
    fn new(started_us: u64, kept: Vec<u64>) -> Window {
        Window {
            started_us,
            count: 0,
            min_us: u64::MAX,
            kept,
            stride: 1,
        }
    }

    fn add(&mut self, latency_us: u64) {
        self.count += 1;
        self.min_us = self.min_us.min(latency_us.max(1));
        if !self.count.is_multiple_of(self.stride) {
            return;
        }
        if self.kept.len() == KEPT_PER_WINDOW {
            let mut odd = false;
            self.kept.retain(|_| {
                odd = !odd;
                odd
            });
            self.stride *= 2;
            if !self.count.is_multiple_of(self.stride) {
                return;
            }
        }
        self.kept.push(latency_us);
    }

    fn median(&mut self) -> u64 {
        let middle = self.kept.len() / 2;
        self.kept.select_nth_unstable(middle).1.to_owned()
    }
}

/// What a window concluded, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Concluded {
    pub limit: u32,
    pub min_latency_us: u64,
    pub median_us: u64,
}

impl Controller {
    pub fn new(settings: ControllerSettings, now_us: u64) -> Controller {
        Controller {
            settings,
            limit: f64::from(settings.initial),
            min_latency_us: None,
            window: Window::new(now_us, Vec::with_capacity(KEPT_PER_WINDOW)),
            probing: None,
            next_probe_us: now_us.saturating_add(settings.probe_interval_us),
        }
    }

    /// Requests in flight allowed now.
    pub fn limit(&self) -> u32 {
        // Within [min, max] by construction; the cast keeps it there.
        self.limit as u32
    }

    pub fn min_latency_us(&self) -> Option<u64> {
        self.min_latency_us
    }

    /// New numbers on reload: the limit and the minimum measured so far
    /// carry over, held to the new bounds.
    pub fn reconfigure(&mut self, settings: ControllerSettings) {
        self.settings = settings;
        self.limit = self
            .limit
            .clamp(f64::from(settings.min), f64::from(settings.max));
        if let Some(before) = &mut self.probing {
            *before = before.clamp(f64::from(settings.min), f64::from(settings.max));
        }
    }

    /// One upstream exchange's latency, ended at `now_us`; the window is
    /// concluded when it is due.
    pub fn sample(&mut self, now_us: u64, latency_us: u64) -> Option<Concluded> {
        let concluded = self.tick(now_us);
        self.window.add(latency_us);
        concluded
    }

    /// Concludes the window if its time is up (a window without samples
    /// changes nothing: no traffic says nothing about the upstream).
    pub fn tick(&mut self, now_us: u64) -> Option<Concluded> {
        if now_us
            < self
                .window
                .started_us
                .saturating_add(self.settings.window_us)
        {
            return None;
        }
        let reused = Vec::with_capacity(KEPT_PER_WINDOW);
        let mut window = std::mem::replace(&mut self.window, Window::new(now_us, reused));
        if window.kept.is_empty() {
            return None;
        }
        let (min, max) = (f64::from(self.settings.min), f64::from(self.settings.max));
        let median_us = window.median();
        if let Some(before) = self.probing.take() {
            // Measured uncongested: the minimum, whatever it was before.
            self.min_latency_us = Some(window.min_us);
            self.limit = before;
            self.next_probe_us = now_us.saturating_add(self.settings.probe_interval_us);
        } else {
            let min_latency = self
                .min_latency_us
                .map_or(window.min_us, |m| m.min(window.min_us));
            self.min_latency_us = Some(min_latency);
            let gradient = (self.settings.tolerance * min_latency as f64 / median_us.max(1) as f64)
                .clamp(0.5, 2.0);
            self.limit = (self.limit * gradient + 1.0).clamp(min, max);
            if now_us >= self.next_probe_us {
                self.probing = Some(self.limit);
                self.limit = min;
            }
        }
        Some(Concluded {
            limit: self.limit(),
            min_latency_us: self.min_latency_us.unwrap_or(0),
            median_us,
        })
    }
}

#[cfg(test)]
mod tests;
