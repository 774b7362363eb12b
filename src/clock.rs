//! Time as the limiter sees it: whole microseconds since the Unix epoch.
//!
//! Microseconds keep every stamp below 2^53, so the same values survive a trip
//! through Lua's doubles unchanged, which the Redis scripts rely on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of "now" for the algorithms; injected so tests control time.
pub trait Clock: Send + Sync {
    fn now_us(&self) -> u64;
}

/// Wall-clock time. Limit state is shared across processes (and Redis), so a
/// monotonic clock local to one process would not do; the algorithms tolerate
/// steps backwards instead.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_us: AtomicU64,
}

impl ManualClock {
    pub fn new(start_us: u64) -> Self {
        Self {
            now_us: AtomicU64::new(start_us),
        }
    }

    pub fn set(&self, now_us: u64) {
        self.now_us.store(now_us, Ordering::SeqCst);
    }

    pub fn advance(&self, by_us: u64) {
        self.now_us.fetch_add(by_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }
}

/// Adds a fixed offset to another clock; lets tests give two proxies clocks that
/// disagree.
#[derive(Debug)]
pub struct OffsetClock<C> {
    inner: C,
    offset_us: i64,
}

impl<C: Clock> OffsetClock<C> {
    pub fn new(inner: C, offset_us: i64) -> Self {
        Self { inner, offset_us }
    }
}

impl<C: Clock> Clock for OffsetClock<C> {
    fn now_us(&self) -> u64 {
        self.inner.now_us().saturating_add_signed(self.offset_us)
    }
}
