//! The Prometheus registry and every series floodgate exports.
//!
//! Hot-path counters are resolved to their series once per configuration
//! (`LayerCounters`), so a request increments an atomic and never looks a
//! label up.

mod groups;

use floodgate_algorithm::Decision;
pub use floodgate_limiter::metrics::{LeaseMetrics, RedisMetrics};
use floodgate_limiter::Enforcement;
use groups::{
    client_change_counters, connection_metrics, counters, protection_metrics, redis_metrics,
    registered, reload_counters, request_metrics, rls_metrics, token_metrics, tracing_metrics,
};
pub use groups::{ConnectionMetrics, ProtectionMetrics, RequestMetrics, RlsMetrics, TokenMetrics};
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Registry, TextEncoder};

/// The series of one limit.
#[derive(Clone)]
pub struct LayerCounters {
    pub admitted: IntCounter,
    pub refused: IntCounter,
    pub shadow_refused: IntCounter,
    /// Admitted, leaving less than a tenth of the quota.
    pub near_limit: IntCounter,
    /// Requests refused because this limit banned their key.
    pub banned: IntCounter,
    /// Bans this limit imposed (each counted once, by the instance that
    /// imposed it).
    pub bans: IntCounter,
    /// Responses whose cost header was missing or unreadable (charged the
    /// default), and above `max` (charged `max`).
    pub cost_unread: IntCounter,
    pub cost_above_max: IntCounter,
}

impl LayerCounters {
    /// One layer's decision on a request: refused (or a shadow limit's
    /// would-be refusal), or admitted, and near the limit when it leaves
    /// less than a tenth of it. A layer that admitted a request another
    /// refused counts nothing: nothing was charged. The proxy and the rate
    /// limit service count alike.
    pub fn count(&self, enforcement: Enforcement, decision: &Decision, request_refused: bool) {
        match (enforcement, decision.allowed(), request_refused) {
            (Enforcement::Shadow, false, _) => self.shadow_refused.inc(),
            (Enforcement::Enforce, false, _) => self.refused.inc(),
            (_, true, false) => {
                self.admitted.inc();
                if decision.remaining().saturating_mul(10) < decision.limit() {
                    self.near_limit.inc();
                }
            }
            (_, true, true) => {}
        }
    }
}

pub struct Metrics {
    registry: Registry,
    decisions: IntCounterVec,
    bans: IntCounterVec,
    response_costs: IntCounterVec,
    pub exempt: IntCounter,
    /// Requests refused by `[block]`, by `BlockReason` (in its order).
    pub blocked: [IntCounter; 3],
    pub tokens: TokenMetrics,
    pub redis: RedisMetrics,
    pub fallback_active: IntGauge,
    pub local_keys: IntGauge,
    pub local_overflow: IntCounter,
    pub connections: ConnectionMetrics,
    pub admin_connections: ConnectionMetrics,
    /// The rate limit service's listener (`[rls]`).
    pub rls_connections: ConnectionMetrics,
    pub requests: RequestMetrics,
    pub rls: RlsMetrics,
    reloads: IntCounterVec,
    /// Changes to run-time clients through the admin API, by what changed.
    pub client_changes: IntCounterVec,
    /// API keys set (or revoked) at run time, held in this process.
    pub run_time_keys: IntGauge,
    pub protection: ProtectionMetrics,
    /// `[tracing]`: what became of the spans.
    pub tracing: crate::tracing::TracingMetrics,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let decisions = counters(&registry, "floodgate_decisions_total", "Requests decided, by limit and outcome (admitted, refused, shadow_refused, banned: refused while the limit bans the key; near_limit: admitted leaving less than 10% of the quota, also counted as admitted)", &["limit", "outcome"]);
        let bans = counters(
            &registry,
            "floodgate_bans_total",
            "Keys banned by a limit's `ban` (each ban once, by the instance that imposed it)",
            &["limit"],
        );
        let response_costs = counters(&registry, "floodgate_response_cost_fallbacks_total", "Responses whose cost (a header, or an LLM usage in the body) could not be charged as written, by reason (missing_or_malformed: charged `default`; above_max: charged `max`)", &["limit", "reason"]);
        let blocked_total = counters(
            &registry,
            "floodgate_blocked_requests_total",
            "Requests refused by [block], by what matched (address, api_key, jwt_subject)",
            &["reason"],
        );
        let blocked = floodgate_policy::blocklist::BlockReason::ALL
            .map(|reason| blocked_total.with_label_values(&[reason.as_str()]));
        let tokens = token_metrics(&registry);
        let exempt = registered(
            &registry,
            IntCounter::new(
                "floodgate_exempt_requests_total",
                "Requests forwarded without any limit (exempt path or tier)",
            ),
        );
        let redis = redis_metrics(&registry);
        let fallback_active = registered(
            &registry,
            IntGauge::new(
                "floodgate_fallback_active",
                "1 while decisions are made without Redis",
            ),
        );
        let local_keys = registered(
            &registry,
            IntGauge::new(
                "floodgate_local_keys",
                "Client keys held by the in-process store",
            ),
        );
        let local_overflow = registered(
            &registry,
            IntCounter::new(
                "floodgate_local_overflow_decisions_total",
                "Decisions made against a limit's shared overflow bucket because the memory store was full of live state",
            ),
        );
        const HEAD_LATE: &str =
            "closed with 408 (head not complete within header_timeout) or 431 (head too large)";
        let connections = connection_metrics(&registry, "floodgate", "Client", HEAD_LATE);
        let admin_connections =
            connection_metrics(&registry, "floodgate_admin", "Admin listener", HEAD_LATE);
        let rls_connections = connection_metrics(
            &registry,
            "floodgate_rls",
            "Rate limit service",
            "closed because their TLS handshake and HTTP/2 preface were not done within header_timeout",
        );
        let requests = request_metrics(&registry);
        let rls = rls_metrics(&registry);
        let protection = protection_metrics(&registry);
        let tracing = tracing_metrics(&registry);
        let reloads = reload_counters(&registry);
        let client_changes = client_change_counters(&registry);
        let run_time_keys = registered(
            &registry,
            IntGauge::new(
                "floodgate_run_time_keys",
                "API keys set or revoked at run time, held in this process",
            ),
        );
        Metrics {
            tracing,
            protection,
            client_changes,
            run_time_keys,
            registry,
            decisions,
            bans,
            response_costs,
            blocked,
            tokens,
            exempt,
            redis,
            fallback_active,
            local_keys,
            local_overflow,
            connections,
            admin_connections,
            rls_connections,
            requests,
            rls,
            reloads,
        }
    }

    pub fn layer(&self, limit: &str) -> LayerCounters {
        LayerCounters {
            admitted: self.decisions.with_label_values(&[limit, "admitted"]),
            refused: self.decisions.with_label_values(&[limit, "refused"]),
            shadow_refused: self.decisions.with_label_values(&[limit, "shadow_refused"]),
            near_limit: self.decisions.with_label_values(&[limit, "near_limit"]),
            banned: self.decisions.with_label_values(&[limit, "banned"]),
            bans: self.bans.with_label_values(&[limit]),
            cost_unread: self
                .response_costs
                .with_label_values(&[limit, "missing_or_malformed"]),
            cost_above_max: self.response_costs.with_label_values(&[limit, "above_max"]),
        }
    }

    pub fn reload(&self, ok: bool) {
        self.reloads
            .with_label_values(&[if ok { "ok" } else { "failed" }])
            .inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            log::warn!("cannot encode metrics: {e}");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
