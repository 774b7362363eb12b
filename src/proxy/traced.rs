//! A request's trace (`[tracing]`) through the phases: begun with its head,
//! its decision recorded, its upstream exchange told where it hangs, ended
//! with its status. Every function here returns at once when tracing is off.

use std::time::SystemTime;

use opentelemetry::KeyValue;
use pingora::proxy::Session;

use super::ctx::{peer_ip, RequestCtx};
use super::verdict::Verdict;
use crate::server::state::AppState;
use crate::tracing::{bounded, DecisionRecord, Decisive, HeaderExtractor, RequestTrace, Tracing};
use floodgate_limiter::watch::Watched;

/// The server span, from the head on; the caller's trace continued when
/// `[tracing].trust_parent` honours this peer.
pub(super) fn begin(state: &AppState, session: &Session, ctx: &mut RequestCtx) {
    let Some(tracing) = &state.tracing else {
        return;
    };
    let peer = floodgate_policy::identity::normalize(peer_ip(session));
    let trusted = ctx.runtime.policy.clients.is_trusted(&peer);
    let request = session.req_header();
    let method = known_method(&request.method);
    let trace = RequestTrace::start(
        tracing,
        &HeaderExtractor(&request.headers),
        tracing.honours_parent_of(trusted),
        method.unwrap_or("HTTP"),
        || {
            let mut attributes = vec![
                KeyValue::new("http.request.method", method.unwrap_or("_OTHER")),
                KeyValue::new(
                    "network.protocol.version",
                    protocol_version(request.version),
                ),
                KeyValue::new("network.peer.address", peer.to_string()),
            ];
            if method.is_none() {
                attributes.push(KeyValue::new(
                    "http.request.method_original",
                    request.method.as_str().chars().take(32).collect::<String>(),
                ));
            }
            attributes
        },
    );
    ctx.trace = Some(Box::new(trace));
}

/// The method as the semantic conventions name it: one of HTTP's own, or
/// none (`_OTHER`, a span named `HTTP`), so that a client inventing methods
/// cannot make a span name of each.
fn known_method(method: &http::Method) -> Option<&'static str> {
    use http::Method;
    Some(match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => return None,
    })
}

fn protocol_version(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2",
        _ => "1.1",
    }
}

/// Whether the request's spans are recorded: only then is its decision
/// watched.
pub(super) fn sampled(ctx: &RequestCtx) -> bool {
    ctx.trace.as_ref().is_some_and(|t| t.sampled())
}

/// The decision's span, from what the verdict says and what the store went
/// through.
pub(super) fn decided(state: &AppState, ctx: &RequestCtx, started: SystemTime, watched: &Watched) {
    let (Some(tracing), Some(trace)) = (&state.tracing, &ctx.trace) else {
        return;
    };
    trace.decided(tracing, &record(ctx.verdict.as_ref(), started, watched));
}

fn record<'a>(
    verdict: Option<&'a Verdict>,
    started: SystemTime,
    watched: &'a Watched,
) -> DecisionRecord<'a> {
    let Some(verdict) = verdict else {
        return DecisionRecord {
            started,
            layers: Vec::new(),
            limited: false,
            decisive: None,
            watched,
        };
    };
    let decisive = verdict.decisive_outcome().map(|o| {
        let d = &o.decision;
        Decisive {
            name: o.name.as_str(),
            limit: d.limit(),
            remaining: d.remaining(),
            reset: std::time::Duration::from_micros(d.reset_after_us()),
            retry_after: (!d.allowed() && !d.cost_exceeds_limit())
                .then(|| std::time::Duration::from_micros(d.retry_after_us())),
        }
    });
    DecisionRecord {
        started,
        layers: verdict.outcomes.iter().map(|o| o.name.as_str()).collect(),
        limited: verdict.refused(),
        decisive,
        watched,
    }
}

/// A leaky bucket's wait, over.
pub(super) fn waited(state: &AppState, ctx: &RequestCtx, since: SystemTime) {
    if let (Some(tracing), Some(trace)) = (&state.tracing, &ctx.trace) {
        trace.waited(tracing, since);
    }
}

/// The upstream exchange's span begins; the upstream is sent its
/// `traceparent` (and `tracestate`), whatever the client wrote in them.
pub(super) fn upstream_started(
    tracing: &Tracing,
    ctx: &mut RequestCtx,
    upstream_request: &mut pingora::http::RequestHeader,
    server: &str,
) -> pingora::Result<()> {
    let Some(trace) = ctx.trace.as_mut() else {
        return Ok(());
    };
    let method = known_method(&upstream_request.method);
    let headers = trace.upstream_started(tracing, method.unwrap_or("HTTP"), || {
        let (address, port) = match server.rsplit_once(':') {
            Some((host, port)) => (host, port.parse::<i64>().ok()),
            None => (server, None),
        };
        let mut attributes = vec![
            KeyValue::new("http.request.method", method.unwrap_or("_OTHER")),
            KeyValue::new(
                "server.address",
                address.trim_matches(['[', ']']).to_owned(),
            ),
            KeyValue::new("url.path", bounded(upstream_request.uri.path())),
        ];
        if let Some(port) = port {
            attributes.push(KeyValue::new("server.port", port));
        }
        attributes
    });
    upstream_request.remove_header("traceparent");
    upstream_request.remove_header("tracestate");
    for (name, value) in headers {
        upstream_request.insert_header(name, value)?;
    }
    Ok(())
}

/// The request is over: the spans end.
pub(super) fn finish(
    ctx: &mut RequestCtx,
    path: &str,
    status: u16,
    error: Option<&pingora::Error>,
) {
    let Some(trace) = ctx.trace.take() else {
        return;
    };
    let route = ctx
        .verdict
        .as_ref()
        .and_then(Verdict::decisive_outcome)
        .and_then(|o| ctx.runtime.policy.limits.get(o.limit.index()))
        .and_then(|limit| limit.matcher.paths().iter().find(|p| p.matches(path)))
        .map(|p| p.as_str().to_owned());
    let client = ctx.client.as_ref().map(|c| c.address.to_string());
    let request_id = ctx.request_id.as_str().to_owned();
    trace.finish(
        status,
        route.as_deref(),
        || {
            // The path as limits matched it and the upstream received it:
            // canonical by now.
            let mut attributes = vec![
                KeyValue::new("floodgate.request_id", request_id),
                KeyValue::new("url.path", bounded(path)),
            ];
            attributes.extend(client.map(|a| KeyValue::new("client.address", a)));
            attributes
        },
        error.map(|e| e as &dyn std::fmt::Display),
    );
}

/// `,"trace_id":"<hex>"` into a refusal's JSON body, before its last brace.
pub(super) fn into_refusal_body(trace: Option<&RequestTrace>, body: &mut String) {
    if let (Some(trace), true) = (trace, body.ends_with('}')) {
        body.insert_str(
            body.len() - 1,
            &format!(",\"trace_id\":\"{}\"", trace.trace_id()),
        );
    }
}
