//! One request's spans: the server span from its head to its last byte,
//! the decision's span and its Redis calls' beneath it, a leaky bucket's
//! wait, and the upstream exchange's client span, whose id the upstream
//! receives as its parent.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use floodgate_limiter::watch::Watched;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, TraceId, Tracer as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};

use super::propagation::Headers;
use super::tracer::Tracing;

/// What the decision came to, for its span.
pub(crate) struct DecisionRecord<'a> {
    pub started: SystemTime,
    /// The limits decided, by name.
    pub layers: Vec<&'a str>,
    /// Whether an enforcing limit refused.
    pub limited: bool,
    /// The limit the answer is about: the refusing one, or the closest to
    /// refusing.
    pub decisive: Option<Decisive<'a>>,
    /// Who answered, and the Redis calls waited on.
    pub watched: &'a Watched,
}

/// The decisive limit's numbers.
pub(crate) struct Decisive<'a> {
    pub name: &'a str,
    pub limit: u64,
    pub remaining: u64,
    pub reset: Duration,
    /// When a refused client may try again (none when admitted, or when a
    /// retry cannot help: a cost over the limit).
    pub retry_after: Option<Duration>,
}

/// At most `MAX_ATTRIBUTE_BYTES` of a text a client wrote (a path may be
/// 64 KiB): a span stays small, and an export within a collector's limit.
pub(crate) fn bounded(text: &str) -> String {
    let mut end = text.len().min(MAX_ATTRIBUTE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

const MAX_ATTRIBUTE_BYTES: usize = 256;

/// A request's trace, from its head on.
pub(crate) struct RequestTrace {
    server: Context,
    upstream: Option<Context>,
    /// For the span's final name, once its route is known (kept only when
    /// the span is recorded).
    method: Option<&'static str>,
}

impl RequestTrace {
    /// The server span named `name` (an HTTP request's method, a gRPC
    /// call's method), continuing the caller's trace when `honour_parent`.
    pub(crate) fn start(
        tracing: &Tracing,
        carrier: &dyn Extractor,
        honour_parent: bool,
        name: &'static str,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> RequestTrace {
        let parent = if honour_parent {
            tracing.propagator.extract(carrier)
        } else {
            Context::new()
        };
        let span = tracing
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(&tracing.tracer, &parent);
        let server = parent.with_span(span);
        let recording = server.span().is_recording();
        if recording {
            server.span().set_attributes(attributes());
        }
        RequestTrace {
            server,
            upstream: None,
            method: recording.then_some(name),
        }
    }

    /// Whether this request's spans are kept (and so worth describing).
    pub(crate) fn sampled(&self) -> bool {
        self.server.span().span_context().is_sampled()
    }

    pub(crate) fn trace_id(&self) -> TraceId {
        self.server.span().span_context().trace_id()
    }

    /// The decision's span and its Redis calls', after the fact.
    pub(crate) fn decided(&self, tracing: &Tracing, record: &DecisionRecord<'_>) {
        record_decision(tracing, &self.server, record, Vec::new);
    }

    /// `decided`, with attributes of the caller's own.
    #[cfg(feature = "rls")]
    pub(crate) fn decided_with(
        &self,
        tracing: &Tracing,
        record: &DecisionRecord<'_>,
        more: impl FnOnce() -> Vec<KeyValue>,
    ) {
        record_decision(tracing, &self.server, record, more);
    }

    /// A leaky bucket's wait, `since` until now.
    pub(crate) fn waited(&self, tracing: &Tracing, since: SystemTime) {
        if !self.sampled() {
            return;
        }
        let mut span = tracing
            .tracer
            .span_builder("ratelimit.wait")
            .with_kind(SpanKind::Internal)
            .with_start_time(since)
            .start_with_context(&tracing.tracer, &self.server);
        opentelemetry::trace::Span::end(&mut span);
    }

    /// The upstream exchange begins (again, on a retry): its span, and the
    /// headers that tell the upstream its parent.
    pub(crate) fn upstream_started(
        &mut self,
        tracing: &Tracing,
        method: &'static str,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Vec<(&'static str, String)> {
        if let Some(earlier) = self.upstream.take() {
            earlier
                .span()
                .set_status(Status::error("tried again on another server"));
            earlier.span().end();
        }
        let mut headers = Headers::default();
        if self.sampled() {
            let span = tracing
                .tracer
                .span_builder(method)
                .with_kind(SpanKind::Client)
                .with_attributes(attributes())
                .start_with_context(&tracing.tracer, &self.server);
            let upstream = self.server.with_span(span);
            tracing.propagator.inject_context(&upstream, &mut headers);
            self.upstream = Some(upstream);
        } else {
            // Not kept: the upstream still hangs from this request's ids.
            tracing
                .propagator
                .inject_context(&self.server, &mut headers);
        }
        headers.0
    }

    /// The upstream's answer's status.
    pub(crate) fn upstream_answered(&self, status: u16) {
        if let Some(upstream) = &self.upstream {
            upstream.span().set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            if status >= 500 {
                upstream.span().set_status(Status::error(""));
            }
        }
    }

    /// The request is over: its status, what it was (a route, its client),
    /// and any error that ended it.
    pub(crate) fn finish(
        self,
        status: u16,
        route: Option<&str>,
        attributes: impl FnOnce() -> Vec<KeyValue>,
        error: Option<&dyn std::fmt::Display>,
    ) {
        if let Some(upstream) = &self.upstream {
            if let Some(e) = error {
                upstream.span().set_status(Status::error(e.to_string()));
            }
            upstream.span().end();
        }
        let server = self.server.span();
        if server.is_recording() {
            server.set_attributes(attributes());
            if status != 0 {
                server.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
            }
            if let Some(route) = route {
                server.set_attribute(KeyValue::new("http.route", route.to_owned()));
                if let Some(method) = &self.method {
                    server.update_name(format!("{method} {route}"));
                }
            }
            // A server span is an error for the server's own failures only
            // (a 4xx is the client's).
            if status >= 500 || (status == 0 && error.is_some()) {
                let description = error.map_or(Cow::Borrowed(""), |e| Cow::Owned(e.to_string()));
                server.set_status(Status::error(description));
            }
        }
        server.end();
    }
}

/// `ratelimit.decision`, a child of `parent`, from `record.started` to now,
/// with its Redis calls beneath it.
/// An attribute's list of texts.
fn strings<S: Into<StringValue>>(texts: impl Iterator<Item = S>) -> Value {
    Value::Array(Array::String(texts.map(Into::into).collect()))
}

fn record_decision(
    tracing: &Tracing,
    parent: &Context,
    record: &DecisionRecord<'_>,
    more: impl FnOnce() -> Vec<KeyValue>,
) {
    if !parent.span().span_context().is_sampled() {
        return;
    }
    let mut attributes = vec![
        KeyValue::new("ratelimit.limited", record.limited),
        KeyValue::new("ratelimit.num_counters", record.layers.len() as i64),
        KeyValue::new(
            "floodgate.limits",
            strings(record.layers.iter().map(|name| name.to_string())),
        ),
        KeyValue::new(
            "floodgate.decided_by",
            strings(record.watched.answerers().map(|a| a.as_str())),
        ),
    ];
    if let Some(d) = &record.decisive {
        attributes.extend([
            KeyValue::new("ratelimit.limit_name", d.name.to_owned()),
            KeyValue::new("ratelimit.most_restrictive.limit", d.limit as i64),
            KeyValue::new("ratelimit.most_restrictive.remaining", d.remaining as i64),
            KeyValue::new(
                "ratelimit.most_restrictive.reset_secs",
                d.reset.as_secs_f64(),
            ),
        ]);
        if let Some(retry) = d.retry_after {
            attributes.push(KeyValue::new(
                "ratelimit.retry_after_secs",
                retry.as_secs_f64(),
            ));
        }
    }
    attributes.extend(more());
    let span = tracing
        .tracer
        .span_builder("ratelimit.decision")
        .with_kind(SpanKind::Internal)
        .with_start_time(record.started)
        .with_attributes(attributes)
        .start_with_context(&tracing.tracer, parent);
    let decision = parent.with_span(span);
    for call in &record.watched.redis_calls {
        let mut attributes = vec![
            KeyValue::new("db.system.name", "redis"),
            KeyValue::new("db.operation.name", call.command),
            KeyValue::new("floodgate.redis.script", call.operation),
        ];
        if let Some(failed) = &call.failed {
            attributes.push(KeyValue::new("error.type", failed.clone()));
        }
        let mut span = tracing
            .tracer
            .span_builder(format!("{} {}", call.command, call.operation))
            .with_kind(SpanKind::Client)
            .with_start_time(call.started)
            .with_attributes(attributes)
            .start_with_context(&tracing.tracer, &decision);
        if call.failed.is_some() {
            opentelemetry::trace::Span::set_status(&mut span, Status::error("the call failed"));
        }
        opentelemetry::trace::Span::end_with_timestamp(&mut span, call.started + call.took);
    }
    decision.span().end();
}

#[cfg(test)]
mod tests {
    use super::bounded;

    #[test]
    fn a_long_text_is_cut_on_a_character_boundary_and_a_short_one_kept() {
        assert_eq!(bounded("/login"), "/login");
        let ascii = "a".repeat(300);
        assert_eq!(bounded(&ascii).len(), 256);
        // One byte, then two-byte characters: byte 256 falls inside one.
        let text = format!("a{}", "é".repeat(200));
        let cut = bounded(&text);
        assert_eq!(cut.len(), 255);
        assert!(text.starts_with(&cut));
    }
}
