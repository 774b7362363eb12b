//! One access log line per request.

use std::time::Duration;

use pingora::proxy::Session;

use super::ctx::RequestCtx;
use super::verdict::Verdict;

/// One access log line: JSON, no query string, no key, no header value;
/// the client by address and a short keyed hash of its identity.
pub(super) fn access_line(
    session: &Session,
    ctx: &RequestCtx,
    status: u16,
    took: Duration,
) -> String {
    use crate::proxy::access_log::{json_string, now_rfc3339};
    use std::fmt::Write;
    let request = session.req_header();
    let mut line = String::with_capacity(320);
    line.push_str("{\"time\":");
    json_string(&mut line, &now_rfc3339());
    line.push_str(",\"request_id\":");
    json_string(&mut line, ctx.request_id.as_str());
    match &ctx.client {
        Some(client) => {
            let _ = write!(
                line,
                ",\"client\":\"{}\",\"client_label\":\"c#{:08x}\",\"tier\":",
                client.address,
                (client.ip_hash >> 96) as u32
            );
            json_string(&mut line, client.tier.name());
        }
        None => line.push_str(",\"client\":null,\"client_label\":null,\"tier\":null"),
    }
    line.push_str(",\"method\":");
    json_string(&mut line, request.method.as_str());
    line.push_str(",\"path\":");
    json_string(&mut line, request.uri.path());
    let _ = write!(
        line,
        ",\"status\":{status},\"bytes\":{},\"duration_ms\":{:.3},\"upstream_ms\":",
        session.body_bytes_sent(),
        took.as_secs_f64() * 1000.0
    );
    match ctx.upstream_took {
        Some(t) => {
            let _ = write!(line, "{:.3}", t.as_secs_f64() * 1000.0);
        }
        None => line.push_str("null"),
    }
    line.push_str(",\"limit\":");
    match ctx.verdict.as_ref().and_then(Verdict::decisive) {
        Some((name, remaining)) => {
            json_string(&mut line, name);
            let _ = write!(line, ",\"remaining\":{remaining}");
        }
        None => line.push_str("null,\"remaining\":null"),
    }
    line.push_str(",\"store\":");
    match &ctx.verdict {
        Some(verdict) => json_string(&mut line, verdict.deciding.as_str()),
        None => line.push_str("null"),
    }
    // With `[tracing]` on: the request's trace, to look up from its line.
    if let Some(trace) = &ctx.trace {
        let _ = write!(line, ",\"trace_id\":\"{}\"", trace.trace_id());
    }
    line.push('}');
    line
}
