//! Each group of series floodgate exports, in the shape the part that
//! reports it holds them (requests, tokens, a listener's connections, the
//! rate limit service, protection, tracing, Redis, reloads, client
//! changes), built and registered once.

use floodgate_limiter::metrics::{LeaseMetrics, RedisMetrics};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// What every request reports when it ends.
#[derive(Clone)]
pub struct RequestMetrics {
    /// By status class: 1xx .. 5xx, or `none` when no answer was sent.
    pub by_class: [IntCounter; 6],
    pub duration: Histogram,
    pub upstream_duration: Histogram,
    pub access_log_dropped: IntCounter,
    /// Requests sent upstream on a new connection, and on a pooled one.
    pub upstream_connected: IntCounter,
    pub upstream_reused: IntCounter,
}

impl RequestMetrics {
    pub fn finished(&self, status: u16) -> &IntCounter {
        let class = usize::from(status / 100);
        &self.by_class[if (1..=5).contains(&class) { class } else { 0 }]
    }
}

/// What became of requests' tokens (`[clients.jwt]`).
#[derive(Clone)]
pub struct TokenMetrics {
    /// Signatures checked and found good.
    pub verified: IntCounter,
    /// Answered from the tokens verified before.
    pub remembered: IntCounter,
    /// By `jwt::Rejection`, in its order.
    pub rejected: [IntCounter; floodgate_policy::jwt::Rejection::ALL.len()],
}

impl TokenMetrics {
    pub fn count(&self, token: &floodgate_policy::jwt::TokenCheck) {
        use floodgate_policy::jwt::TokenCheck;
        match token {
            TokenCheck::Absent => {}
            TokenCheck::Remembered(_) => self.remembered.inc(),
            TokenCheck::Verified(_) => self.verified.inc(),
            TokenCheck::Rejected(why) => self.rejected[*why as usize].inc(),
        }
    }
}

/// What the connection layer reports.
#[derive(Clone)]
pub struct ConnectionMetrics {
    pub open: IntGauge,
    /// By cap: `total`, `per_ip`.
    pub refused: IntCounterVec,
    /// Of those, the ones closed in the accept loop: no task, no TLS
    /// handshake, no buffer.
    pub refused_at_accept: IntCounter,
    pub header_timeouts: IntCounter,
    pub idle_timeouts: IntCounter,
}

/// What the rate limit service (`[rls]`) reports, beside the decisions
/// its limits count like any other.
#[derive(Clone)]
pub struct RlsMetrics {
    /// `ShouldRateLimit` calls by answer: `ok`, `over_limit`, and the
    /// gRPC errors `invalid_argument`, `unavailable`.
    pub ok: IntCounter,
    pub over_limit: IntCounter,
    pub invalid_argument: IntCounter,
    pub unavailable: IntCounter,
    /// Refused for want of `[rls].token_file`'s token.
    pub unauthenticated: IntCounter,
    /// Descriptors no limit matched (answered OK, as envoyproxy/ratelimit
    /// does), by why: no limit on the `domain`, or none on the descriptor.
    pub unknown_domain: IntCounter,
    pub unknown_descriptor: IntCounter,
    pub duration: Histogram,
}

/// `[upstream.protection]`: the adaptive limit and what it shed.
#[derive(Clone)]
pub struct ProtectionMetrics {
    pub limit: IntGauge,
    pub in_flight: IntGauge,
    pub queued: IntGauge,
    pub min_latency_seconds: prometheus::Gauge,
    pub latency_seconds: prometheus::Gauge,
    /// By priority (the tier's name, or "other").
    pub shed: IntCounterVec,
}

/// The series of one listener's connections, names under `prefix`.
pub(super) fn connection_metrics(
    registry: &Registry,
    prefix: &str,
    what: &str,
    head_late: &str,
) -> ConnectionMetrics {
    let metrics = ConnectionMetrics {
        open: registered(
            registry,
            IntGauge::new(
                format!("{prefix}_connections_open"),
                format!("{what} connections open now"),
            ),
        ),
        refused: registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_connections_refused_total"),
                    format!("{what} connections closed at once, by the cap they hit (total, per_ip)"),
                ),
                &["cap"],
            ),
        ),
        refused_at_accept: registered(
            registry,
            IntCounter::new(
                format!("{prefix}_connections_refused_at_accept_total"),
                format!("{what} connections closed in the accept loop, before a task or a buffer existed (also counted in {prefix}_connections_refused_total)"),
            ),
        ),
        header_timeouts: registered(
            registry,
            IntCounter::new(
                format!("{prefix}_header_timeouts_total"),
                format!("{what} connections {head_late}"),
            ),
        ),
        idle_timeouts: registered(
            registry,
            IntCounter::new(
                format!("{prefix}_idle_timeouts_total"),
                format!("{what} connections closed for silence: keep-alive idle past keepalive_timeout, or a body too slow"),
            ),
        ),
    };
    for cap in ["total", "per_ip"] {
        metrics.refused.with_label_values(&[cap]);
    }
    metrics
}

pub(super) fn reload_counters(registry: &Registry) -> IntCounterVec {
    let reloads = counters(
        registry,
        "floodgate_config_reloads_total",
        "Configuration reloads on SIGHUP, by result (ok, failed)",
        &["result"],
    );
    // Both outcomes exist from the start, so an alert on "failed" sees 0.
    for result in ["ok", "failed"] {
        reloads.with_label_values(&[result]);
    }
    reloads
}

pub(super) fn client_change_counters(registry: &Registry) -> IntCounterVec {
    let client_changes = counters(registry, "floodgate_client_changes_total", "Changes to run-time clients made through this instance's admin API, by what (api_key_set, api_key_revoked, api_keys_imported, override_set, override_removed)", &["what"]);
    for what in [
        "api_key_set",
        "api_key_revoked",
        "api_keys_imported",
        "override_set",
        "override_removed",
    ] {
        client_changes.with_label_values(&[what]);
    }
    client_changes
}

/// A counter by `labels`, registered.
pub(super) fn counters(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

pub(super) fn token_metrics(registry: &Registry) -> TokenMetrics {
    let tokens_total = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "floodgate_jwt_tokens_total",
                    "Bearer tokens seen, by result: verified (signature checked now), remembered (verified before), or why one was refused (expired, bad_signature, wrong_algorithm, wrong_issuer, wrong_audience, unknown_key, ...): a refused token counts as no token",
                ),
                &["result"],
            ),
        );
    TokenMetrics {
        verified: tokens_total.with_label_values(&["verified"]),
        remembered: tokens_total.with_label_values(&["remembered"]),
        rejected: floodgate_policy::jwt::Rejection::ALL
            .map(|why| tokens_total.with_label_values(&[why.as_str()])),
    }
}

pub(super) fn redis_metrics(registry: &Registry) -> RedisMetrics {
    let call_seconds = registered(
        registry,
        Histogram::with_opts(
            HistogramOpts::new(
                "floodgate_redis_call_duration_seconds",
                "Time of each limiter call to Redis",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            ]),
        ),
    );
    let failures = registered(
        registry,
        IntCounter::new(
            "floodgate_redis_failures_total",
            "Redis calls and probes that failed (timeout, connection, error reply)",
        ),
    );
    let fallback_decisions = registered(
        registry,
        IntCounter::new(
            "floodgate_fallback_decisions_total",
            "Requests decided without Redis, by on_failure",
        ),
    );
    let leases = LeaseMetrics {
        taken: registered(
            registry,
            IntCounter::new(
                "floodgate_redis_leases_total",
                "Leases of a limit's shared budget taken beside a Redis decision",
            ),
        ),
        decisions: registered(
            registry,
            IntCounter::new(
                "floodgate_redis_lease_decisions_total",
                "Layers decided from a lease, with no Redis call",
            ),
        ),
        returned_units: registered(
            registry,
            IntCounter::new(
                "floodgate_redis_lease_returned_units_total",
                "Leased units given back to Redis unused",
            ),
        ),
        held: registered(
            registry,
            IntGauge::new(
                "floodgate_redis_leases_held",
                "Leases of a limit's shared budget this instance holds",
            ),
        ),
    };
    let instances = registered(
        registry,
        IntGauge::new(
            "floodgate_redis_instances",
            "Instances sharing Redis: [redis].instances, or the live count with \"auto\"",
        ),
    );
    RedisMetrics {
        call_seconds,
        failures,
        fallback_decisions,
        leases,
        instances,
    }
}

pub(super) fn request_metrics(registry: &Registry) -> RequestMetrics {
    let requests_total = registered(
        registry,
        IntCounterVec::new(
            Opts::new(
                "floodgate_requests_total",
                "Requests answered, by status class (1xx .. 5xx; none: no answer was sent)",
            ),
            &["status_class"],
        ),
    );
    let latency_buckets = vec![
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let upstream_connections = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "floodgate_upstream_connections_total",
                    "Requests sent upstream, by whether they went on a pooled keep-alive connection (reused=\"true\") or on a new one (reused=\"false\"): new ones rising with the request rate mean the upstream or the pool closes connections",
                ),
                &["reused"],
            ),
        );
    RequestMetrics {
        by_class: ["none", "1xx", "2xx", "3xx", "4xx", "5xx"]
            .map(|class| requests_total.with_label_values(&[class])),
        duration: registered(
            registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "floodgate_request_duration_seconds",
                    "From the request head to the end of the answer",
                )
                .buckets(latency_buckets.clone()),
            ),
        ),
        upstream_duration: registered(
            registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "floodgate_upstream_duration_seconds",
                    "From sending a request upstream to its response head",
                )
                .buckets(latency_buckets),
            ),
        ),
        access_log_dropped: registered(
            registry,
            IntCounter::new(
                "floodgate_access_log_dropped_total",
                "Access log lines dropped because the writer's queue was full",
            ),
        ),
        upstream_connected: upstream_connections.with_label_values(&["false"]),
        upstream_reused: upstream_connections.with_label_values(&["true"]),
    }
}

pub(super) fn rls_metrics(registry: &Registry) -> RlsMetrics {
    let rls_calls = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "floodgate_rls_requests_total",
                    "Envoy rate limit service calls, by answer (ok, over_limit; the gRPC errors invalid_argument, unavailable, unauthenticated)",
                ),
                &["code"],
            ),
        );
    let rls_unmatched = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "floodgate_rls_unmatched_descriptors_total",
                    "Descriptors no limit matched, answered OK: by reason (domain: no limit on the request's domain; descriptor: none on that descriptor)",
                ),
                &["reason"],
            ),
        );
    RlsMetrics {
        ok: rls_calls.with_label_values(&["ok"]),
        over_limit: rls_calls.with_label_values(&["over_limit"]),
        invalid_argument: rls_calls.with_label_values(&["invalid_argument"]),
        unavailable: rls_calls.with_label_values(&["unavailable"]),
        unauthenticated: rls_calls.with_label_values(&["unauthenticated"]),
        unknown_domain: rls_unmatched.with_label_values(&["domain"]),
        unknown_descriptor: rls_unmatched.with_label_values(&["descriptor"]),
        duration: registered(
            registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "floodgate_rls_duration_seconds",
                    "From a ShouldRateLimit call decoded to its answer",
                )
                .buckets(vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    1.0,
                ]),
            ),
        ),
    }
}

pub(super) fn protection_metrics(registry: &Registry) -> ProtectionMetrics {
    let gauge = |name: &str, help: &str| registered(registry, IntGauge::new(name, help));
    let seconds = |name: &str, help: &str| registered(registry, prometheus::Gauge::new(name, help));
    let protection = ProtectionMetrics {
            limit: gauge(
                "floodgate_protection_limit",
                "Requests in flight the upstream's adaptive limit allows now ([upstream.protection]; this instance's own)",
            ),
            in_flight: gauge(
                "floodgate_protection_in_flight",
                "Requests in flight to the upstream under its adaptive limit",
            ),
            queued: gauge(
                "floodgate_protection_queued",
                "Requests waiting for a place under the upstream's adaptive limit",
            ),
            min_latency_seconds: seconds(
                "floodgate_protection_min_latency_seconds",
                "The upstream's minimum latency as the adaptive limit measured it (to its response head)",
            ),
            latency_seconds: seconds(
                "floodgate_protection_latency_seconds",
                "The upstream's median latency over the adaptive limit's last window",
            ),
            shed: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "floodgate_protection_shed_total",
                        "Requests answered 503 to protect the upstream, by priority (their tier)",
                    ),
                    &["priority"],
                ),
            ),
        };
    // Present from the start, so that a rate on it reads 0, not nothing.
    protection.shed.with_label_values(&["other"]);
    protection
}

pub(super) fn tracing_metrics(registry: &Registry) -> crate::tracing::TracingMetrics {
    let tracing = crate::tracing::TracingMetrics {
            spans: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "floodgate_tracing_spans_total",
                        "Spans by what became of them ([tracing]): exported, export_failed (the collector refused or timed out), queue_full (dropped: the collector is slower than the spans come), over_cap (not recorded: past max_spans_per_second)",
                    ),
                    &["outcome"],
                ),
            ),
        };
    for outcome in ["exported", "export_failed", "queue_full", "over_cap"] {
        tracing.spans.with_label_values(&[outcome]);
    }
    tracing
}

/// A metric built from constant definitions, registered once: its only
/// failures are programming errors (a bad or duplicate name).
pub(super) fn registered<C>(registry: &Registry, metric: prometheus::Result<C>) -> C
where
    C: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.expect("valid metric definition");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}
