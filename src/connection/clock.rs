//! When the next request head, or the rest of a body, must have arrived.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// The largest request head read: Pingora would buffer up to a megabyte per
/// connection. 64 KiB is 8 times what browsers send with many cookies.
pub(crate) const MAX_HEAD_BYTES: u64 = 64 * 1024;

/// The slowest average a request body may arrive at, after a grace of
/// `header_timeout`: a phone on a bad link does 10 times better.
pub(crate) const MIN_BODY_RATE: u64 = 1024;

/// When the next request head must have arrived on one connection.
pub(crate) struct HeadClock {
    header_timeout: Duration,
    pub(super) keepalive_timeout: Duration,
    state: Mutex<ClockState>,
}

#[derive(Debug, Clone, Copy)]
enum ClockState {
    /// Between requests: the next head's first byte is due by then.
    Idle { until: Instant },
    /// A head is arriving: it must be complete by then, and stay small.
    Head { until: Instant, bytes: u64 },
    /// The request body is arriving: at MIN_BODY_RATE on average after a
    /// grace of header_timeout, and all of it by `by` when that is set (a
    /// request holding a concurrency slot).
    Body {
        since: Instant,
        bytes: u64,
        by: Option<Instant>,
    },
    /// Head and body are in; the upstream's timeouts apply until the
    /// response is over.
    InRequest,
}

/// What a read in the current state ran into.
pub(super) enum Overrun {
    /// The deadline passed while waiting for a head (408) or a body.
    Late { head: bool },
    /// The head grew past MAX_HEAD_BYTES (431).
    HeadTooLarge,
}

impl fmt::Debug for HeadClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HeadClock({:?})", self.state())
    }
}

impl HeadClock {
    /// The clock of a connection accepted now: its first head is due within
    /// `header_timeout`, counted from the accept (a connection that sends
    /// nothing is as slow as one that trickles).
    pub(crate) fn new(header_timeout: Duration, keepalive_timeout: Duration) -> Arc<Self> {
        Arc::new(HeadClock {
            header_timeout,
            keepalive_timeout,
            state: Mutex::new(ClockState::Head {
                until: Instant::now() + header_timeout,
                bytes: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn state(&self) -> ClockState {
        *self.lock()
    }

    /// A whole head was parsed.
    pub(crate) fn head_arrived(&self) {
        *self.lock() = ClockState::InRequest;
    }

    /// The request has a body to come: it must keep up MIN_BODY_RATE.
    pub(crate) fn body_expected(&self) {
        *self.lock() = ClockState::Body {
            since: Instant::now(),
            bytes: 0,
            by: None,
        };
    }

    /// The body still to come must be in by `until` (a request that holds
    /// a slot: no body floor lets it keep one for hours).
    pub(crate) fn body_due_by(&self, until: Instant) {
        if let ClockState::Body { by, .. } = &mut *self.lock() {
            *by = Some(by.map_or(until, |b| b.min(until)));
        }
    }

    /// The whole body is in.
    pub(crate) fn body_arrived(&self) {
        let mut state = self.lock();
        if let ClockState::Body { .. } = *state {
            *state = ClockState::InRequest;
        }
    }

    /// A response is over: the connection idles until the next head starts.
    pub(crate) fn await_next_head(&self) {
        *self.lock() = ClockState::Idle {
            until: Instant::now() + self.keepalive_timeout,
        };
    }

    /// `n` bytes arrived: an idle connection starts its next head; a head
    /// or a body counts them. Whether the head has grown too large.
    pub(super) fn bytes_arrived(&self, n: u64) -> Option<Overrun> {
        let mut state = self.lock();
        match &mut *state {
            ClockState::Idle { .. } => {
                *state = ClockState::Head {
                    until: Instant::now() + self.header_timeout,
                    bytes: n,
                };
            }
            ClockState::Head { bytes, .. } | ClockState::Body { bytes, .. } => *bytes += n,
            ClockState::InRequest => {}
        }
        match *state {
            ClockState::Head { bytes, .. } if bytes > MAX_HEAD_BYTES => Some(Overrun::HeadTooLarge),
            _ => None,
        }
    }

    /// When a read that is still waiting must give up, and what that means.
    pub(super) fn deadline(&self) -> Option<(Instant, bool)> {
        match self.state() {
            ClockState::InRequest => None,
            ClockState::Idle { until } => Some((until, false)),
            ClockState::Head { until, .. } => Some((until, true)),
            ClockState::Body { since, bytes, by } => {
                let floor =
                    since + self.header_timeout + Duration::from_secs(bytes / MIN_BODY_RATE);
                Some((by.map_or(floor, |by| by.min(floor)), false))
            }
        }
    }
}
