//! The series the limiter reports through. They are built and registered by
//! the binary's registry (`floodgate::server::metrics`); the limiter only counts.

use prometheus::{Histogram, IntCounter, IntGauge};

/// What the Redis store reports.
#[derive(Clone)]
pub struct RedisMetrics {
    /// Each call to Redis, in seconds
    /// (`floodgate_redis_call_duration_seconds`).
    pub call_seconds: Histogram,
    /// Calls and probes that failed: a timeout, a lost connection, an error
    /// reply (`floodgate_redis_failures_total`).
    pub failures: IntCounter,
    /// Requests decided without Redis, as `on_failure` says
    /// (`floodgate_fallback_decisions_total`).
    pub fallback_decisions: IntCounter,
    /// What the leases of the shared budget do.
    pub leases: LeaseMetrics,
    /// The instances sharing Redis, as the fallback's share divides by.
    pub instances: IntGauge,
}

/// What leases of the shared budget do (`limiter::Leased`).
#[derive(Clone)]
pub struct LeaseMetrics {
    /// Leases taken beside a decision.
    pub taken: IntCounter,
    /// Requests decided from a lease, with no Redis call.
    pub decisions: IntCounter,
    /// Units given back unused.
    pub returned_units: IntCounter,
    /// Leases held now (updated every few hundred milliseconds).
    pub held: IntGauge,
}

#[cfg(test)]
impl RedisMetrics {
    /// Series that belong to no registry, for a store under test.
    pub(crate) fn detached() -> RedisMetrics {
        let counter = |name: &str| IntCounter::new(name, name).expect("a valid name");
        let gauge = |name: &str| IntGauge::new(name, name).expect("a valid name");
        RedisMetrics {
            call_seconds: Histogram::with_opts(prometheus::HistogramOpts::new("calls", "calls"))
                .expect("a valid name"),
            failures: counter("failures"),
            fallback_decisions: counter("fallback_decisions"),
            leases: LeaseMetrics {
                taken: counter("taken"),
                decisions: counter("decisions"),
                returned_units: counter("returned_units"),
                held: gauge("held"),
            },
            instances: gauge("instances"),
        }
    }
}
