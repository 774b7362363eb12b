//! How many connections may be open: in all, per client address, and
//! HTTP/2 requests in flight per address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use log::warn;

use crate::server::metrics::ConnectionMetrics;
use floodgate_limiter::clock::{Clock, SystemClock};
use floodgate_limiter::log_throttle::KeyedLogThrottle;

/// `[server]` connection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionSettings {
    pub header_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
}

/// How long a refused address stays quiet in the log.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Addresses remembered for log throttling; beyond them the least recently
/// logged is forgotten (and the one line a second over all still holds).
const REFUSAL_LOG_MEMORY: usize = 10_000;

/// Open connections, in all and per client address.
pub(crate) struct ConnectionCaps {
    /// Which listener's connections the refusal log names ("" for the
    /// gateway's, whose log came first).
    listener: &'static str,
    max_total: usize,
    max_per_ip: usize,
    total: AtomicUsize,
    per_ip: Mutex<PerIp>,
    refusal_log: KeyedLogThrottle<IpAddr>,
    pub(super) metrics: ConnectionMetrics,
}

#[derive(Default)]
struct PerIp {
    open: HashMap<IpAddr, usize>,
}

/// One open connection's place under the caps, given back on drop.
pub(crate) struct Permit {
    caps: Arc<ConnectionCaps>,
    /// The address counted against the per-address cap (none for trusted
    /// proxies, which hold many clients' connections).
    counted_as: Option<IpAddr>,
    /// Whether the caps' `open` series counts it (not a place another
    /// listener's connection takes in the total: `admit_elsewhere`).
    shown: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.caps.total.fetch_sub(1, Ordering::AcqRel);
        if self.shown {
            self.caps.metrics.open.dec();
        }
        if let Some(ip) = self.counted_as {
            let mut per_ip = self.caps.lock();
            if let Some(n) = per_ip.open.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    per_ip.open.remove(&ip);
                }
            }
        }
    }
}

/// Why a connection was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CapReached {
    Total,
    PerAddress,
}

impl ConnectionCaps {
    pub(crate) fn new(settings: &ConnectionSettings, metrics: ConnectionMetrics) -> Arc<Self> {
        ConnectionCaps::of_listener("", settings, metrics)
    }

    /// Caps whose refusals the log tells apart by `listener` (e.g. "rate
    /// limit service ", written before "connection from ...").
    pub(crate) fn of_listener(
        listener: &'static str,
        settings: &ConnectionSettings,
        metrics: ConnectionMetrics,
    ) -> Arc<Self> {
        Arc::new(ConnectionCaps {
            listener,
            max_total: settings.max_connections,
            max_per_ip: settings.max_connections_per_ip,
            total: AtomicUsize::new(0),
            per_ip: Mutex::new(PerIp::default()),
            refusal_log: KeyedLogThrottle::new(
                REFUSAL_LOG_MEMORY,
                REFUSAL_LOG_INTERVAL,
                Duration::from_secs(1),
            ),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, PerIp> {
        // Counts are plain integers: a panic elsewhere leaves them usable.
        self.per_ip.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection from `address` (already grouped: an
    /// IPv6 client by its prefix), or which cap it hit. `None` counts
    /// against the total only.
    pub(crate) fn admit(self: &Arc<Self>, address: Option<IpAddr>) -> Result<Permit, CapReached> {
        // Both caps under the one lock, the address's first: a flood that its
        // own cap refuses never takes places from the total meanwhile.
        let mut per_ip = self.lock();
        if let Some(ip) = address {
            if per_ip.open.get(&ip).is_some_and(|&n| n >= self.max_per_ip) {
                return Err(CapReached::PerAddress);
            }
        }
        if self.total.load(Ordering::Acquire) >= self.max_total {
            return Err(CapReached::Total);
        }
        self.total.fetch_add(1, Ordering::AcqRel);
        if let Some(ip) = address {
            *per_ip.open.entry(ip).or_insert(0) += 1;
        }
        drop(per_ip);
        self.metrics.open.inc();
        Ok(Permit {
            caps: self.clone(),
            counted_as: address,
            shown: true,
        })
    }

    /// A place in the total alone, for a connection another listener
    /// serves and counts (the rate limit service's): every listener's
    /// connections draw on one table of descriptors, which the total is
    /// sized from. Not shown in these caps' `open` series, nor counted as
    /// a refusal here.
    #[cfg(feature = "rls")]
    pub(crate) fn admit_elsewhere(self: &Arc<Self>) -> Result<Permit, CapReached> {
        // The lock orders this against `admit`'s check of the total.
        let per_ip = self.lock();
        if self.total.load(Ordering::Acquire) >= self.max_total {
            return Err(CapReached::Total);
        }
        self.total.fetch_add(1, Ordering::AcqRel);
        drop(per_ip);
        Ok(Permit {
            caps: self.clone(),
            counted_as: None,
            shown: false,
        })
    }

    /// Whether a connection from `address` would find a place now, without
    /// taking one: the accept loop's check, before a task exists. A
    /// connection that passes still takes its place with `admit`, which
    /// stays the exact count (connections accepted at once may all pass here).
    pub(crate) fn has_room(&self, address: Option<IpAddr>) -> Result<(), CapReached> {
        if let Some(ip) = address {
            if self
                .lock()
                .open
                .get(&ip)
                .is_some_and(|&n| n >= self.max_per_ip)
            {
                return Err(CapReached::PerAddress);
            }
        }
        if self.total.load(Ordering::Acquire) >= self.max_total {
            return Err(CapReached::Total);
        }
        Ok(())
    }

    /// Counts a refusal; logs it unless this address was logged within the
    /// last minute.
    /// `group` is the address as the per-address cap counts it (an IPv6
    /// client by its prefix), so that a /64 cannot write a line per address.
    pub(crate) fn refused(&self, group: Option<IpAddr>, reason: CapReached) {
        let (label, cap) = match reason {
            CapReached::Total => ("total", self.max_total),
            CapReached::PerAddress => ("per_ip", self.max_per_ip),
        };
        self.metrics.refused.with_label_values(&[label]).inc();
        let key = group.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        if let Some(unlogged) = self.refusal_log.due(key, SystemClock.now_us()) {
            let who = group.map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
            warn!(
                "{}connection from {who} closed at once: {label} connection cap ({cap}) reached (logged once a minute per address; {unlogged} refusals since the last line not logged)",
                self.listener
            );
        }
    }
}

/// HTTP/2 requests in flight per client address (grouped as the connection
/// cap groups them): streams multiply what one connection can hold, so
/// they count against `max_connections_per_ip` on their own.
pub struct StreamCaps {
    max_per_address: usize,
    in_flight: Mutex<HashMap<IpAddr, usize>>,
}

/// One HTTP/2 request's place, given back when the request ends.
pub struct StreamPermit {
    caps: Arc<StreamCaps>,
    address: IpAddr,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut in_flight = self
            .caps
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = in_flight.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.address);
            }
        }
    }
}

impl StreamCaps {
    pub fn new(max_per_address: usize) -> Arc<Self> {
        Arc::new(StreamCaps {
            max_per_address,
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more request from `address`, or none.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Option<StreamPermit> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = in_flight.entry(address).or_insert(0);
        if *n >= self.max_per_address {
            return None;
        }
        *n += 1;
        Some(StreamPermit {
            caps: self.clone(),
            address,
        })
    }
}
