//! A rate limit service call's trace (`[tracing]`): a server span that
//! continues the trace Envoy sends in the call's metadata, and beneath it
//! the decision's span, with the attributes the gateway's decisions carry.

use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;

use super::decide::{Answer, Ask, Failure};
use crate::tracing::{DecisionRecord, Decisive, MetadataExtractor, RequestTrace, Tracing};
use floodgate_limiter::watch::Watched;

const METHOD: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

pub(super) fn begin(tracing: &Tracing, metadata: &tonic::metadata::MetadataMap) -> RequestTrace {
    RequestTrace::start(
        tracing,
        &MetadataExtractor(metadata),
        tracing.honours_rls_parent(),
        METHOD,
        || {
            vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
                KeyValue::new("rpc.method", "ShouldRateLimit"),
            ]
        },
    )
}

/// The decision's span: the descriptors' limits, the one that refused (or
/// was closest to), and who answered.
pub(super) fn decided(
    tracing: &Tracing,
    trace: &RequestTrace,
    ask: &Ask<'_>,
    decided: &Result<Answer, Failure>,
    started: SystemTime,
    watched: &Watched,
) {
    let answer = decided.as_ref().ok();
    let shown = answer.map_or(Vec::new(), |a| {
        a.statuses
            .iter()
            .filter_map(|s| Some((s.over_limit, s.shown.as_ref()?)))
            .collect()
    });
    // The refusing limit, else the one with the least left.
    let decisive = shown
        .iter()
        .find(|(over, _)| *over)
        .or_else(|| shown.iter().min_by_key(|(_, s)| s.decision.remaining()))
        .map(|(over, s)| {
            let d = &s.decision;
            Decisive {
                name: s.name.as_str(),
                limit: d.limit(),
                remaining: d.remaining(),
                reset: Duration::from_micros(d.reset_after_us()),
                retry_after: (*over && !d.cost_exceeds_limit())
                    .then(|| Duration::from_micros(d.retry_after_us())),
            }
        });
    let record = DecisionRecord {
        started,
        layers: shown.iter().map(|(_, s)| s.name.as_str()).collect(),
        limited: answer.is_some_and(|a| a.over_limit),
        decisive,
        watched,
    };
    trace.decided_with(tracing, &record, || {
        vec![KeyValue::new(
            "ratelimit.namespace",
            crate::tracing::bounded(ask.domain),
        )]
    });
}

pub(super) fn finish(trace: RequestTrace, code: tonic::Code, error: Option<&String>) {
    trace.finish(
        0,
        None,
        || vec![KeyValue::new("rpc.grpc.status_code", code as i64)],
        error.map(|e| e as &dyn std::fmt::Display),
    );
}
