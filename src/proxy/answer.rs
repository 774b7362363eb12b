//! Answers floodgate writes itself: 400s, 429s, 503s and their gRPC forms,
//! each with the request id. `Answer` says why a request is answered here;
//! `Gateway::answer` writes it.

use std::borrow::Cow;

use bytes::Bytes;
use http::HeaderValue;
use log::{debug, info, warn};
use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType, Result};

use super::ctx::RequestCtx;
use super::framing::request_has_body;
use super::header_edit::{own_response, HeaderEdit};
use crate::proxy::header_name::SpelledName;
use crate::proxy::headers::{self, Header, Layer, CONTENT_TYPE};
use crate::server::state::AppState;
use floodgate_limiter::clock::{Clock, SystemClock};
use floodgate_limiter::LimiterError;
use floodgate_policy::blocklist::BlockReason;

pub(super) async fn respond(
    session: &mut Session,
    ctx: &RequestCtx,
    status: u16,
    headers: Vec<Header>,
    body: String,
) -> Result<()> {
    let preserve_case = ctx.runtime.upstream.settings().preserve_header_case;
    let header = own_response(status, headers.len() + OWN_HEADERS, preserve_case, |h| {
        write_headers(h, headers)?;
        h.insert(&CONTENT_LENGTH, HeaderValue::from(body.len()))?;
        add_request_id(h, ctx)
    })?;
    if request_has_body(session) {
        session.set_keepalive(None);
    }
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await
}

/// Headers an answer of floodgate's own carries beside those it is given:
/// Content-Length (or Content-Type) and the request id, then Date and
/// Connection, which Pingora adds as it writes the head.
const OWN_HEADERS: usize = 4;

static CONTENT_LENGTH: SpelledName = SpelledName::from_static("content-length", "Content-Length");

/// Headers floodgate built itself; their values become header values
/// without a copy.
pub(super) fn write_headers(h: &mut dyn HeaderEdit, headers: Vec<Header>) -> Result<()> {
    for (name, value) in headers {
        h.insert(name, value)?;
    }
    Ok(())
}

pub(super) fn add_request_id(h: &mut dyn HeaderEdit, ctx: &RequestCtx) -> Result<()> {
    match ctx.request_id.header() {
        Some(value) => h.insert(&ctx.runtime.upstream.settings().request_id_header, value),
        None => Ok(()),
    }
}

/// A gRPC call (`application/grpc`, `application/grpc+proto`, ...) over
/// HTTP/2: its client reads the outcome from `grpc-status` in the trailers,
/// not from the HTTP status. gRPC-Web and HTTP/1.1 (which has no trailers
/// here) get the ordinary answers.
pub(super) fn is_grpc(session: &Session) -> bool {
    session.req_header().version == http::Version::HTTP_2
        && session
            .req_header()
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| {
                let v = v.as_bytes();
                v == b"application/grpc" || v.starts_with(b"application/grpc+")
            })
}

/// The gRPC status codes floodgate answers with.
#[derive(Debug, Clone, Copy)]
pub(super) enum GrpcStatus {
    ResourceExhausted = 8,
    Unavailable = 14,
}

/// A gRPC answer with no messages: HTTP 200 and the outcome in the trailers
/// (`grpc-status`, `grpc-message`), where gRPC clients read it.
pub(super) async fn respond_grpc(
    session: &mut Session,
    ctx: &RequestCtx,
    status: GrpcStatus,
    message: &str,
    headers: Vec<Header>,
) -> Result<()> {
    // HTTP/2 writes names in lower case: no case map to keep.
    let header = own_response(200, headers.len() + OWN_HEADERS, false, |h| {
        h.insert(&CONTENT_TYPE, HeaderValue::from_static("application/grpc"))?;
        write_headers(h, headers)?;
        add_request_id(h, ctx)
    })?;
    if request_has_body(session) {
        session.set_keepalive(None);
    }
    let mut trailers = http::HeaderMap::with_capacity(2);
    trailers.insert(
        "grpc-status",
        http::HeaderValue::from(u16::from(status as u8)),
    );
    if let Ok(value) = http::HeaderValue::from_str(&grpc_message(message)) {
        trailers.insert("grpc-message", value);
    }
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_trailers(trailers).await
}

/// `grpc-message` is percent-encoded: every byte outside printable ASCII,
/// and `%` itself.
pub(super) fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// 400 with `{"error":"<code>","reason":"<reason>"}`; `reason` is our own
/// text, never the client's.
pub(super) async fn bad_request(
    session: &mut Session,
    ctx: &RequestCtx,
    code: &str,
    reason: &str,
) -> Result<bool> {
    debug!("400 {code}: {reason} request_id={}", ctx.request_id);
    session.set_keepalive(None);
    let body = format!("{{\"error\":\"{code}\",\"reason\":\"{reason}\"}}");
    respond(session, ctx, 400, headers::json_headers(), body).await?;
    Ok(true)
}

/// The answer to a client `[block]` refuses: no reason given beyond that.
pub(super) async fn blocked(session: &mut Session, ctx: &RequestCtx, status: u16) -> Result<bool> {
    let body = format!(
        "{{\"error\":\"blocked\",\"request_id\":\"{}\"}}",
        ctx.request_id
    );
    session.set_keepalive(None);
    respond(session, ctx, status, headers::json_headers(), body).await?;
    Ok(true)
}

/// 400 for a request without what a limit with `on_missing = "deny"` is
/// keyed on.
pub(super) async fn missing_key(
    session: &mut Session,
    ctx: &RequestCtx,
    limit: &str,
) -> Result<bool> {
    debug!("400 missing_key for {limit} request_id={}", ctx.request_id);
    let body = format!(
        "{{\"error\":\"missing_key\",\"limit\":\"{limit}\",\"request_id\":\"{}\"}}",
        ctx.request_id
    );
    respond(session, ctx, 400, headers::json_headers(), body).await?;
    Ok(true)
}

/// What a gRPC client is told when a limit refuses it.
pub(super) fn grpc_refusal(refused: &Layer<'_>) -> String {
    if refused.banned {
        format!(
            "banned by {}; retry after {} ms",
            refused.name,
            headers::ceil_ms(refused.decision.retry_after_us())
        )
    } else if refused.decision.cost_exceeds_limit() {
        format!(
            "rate limited by {}: the cost exceeds the limit",
            refused.name
        )
    } else {
        format!(
            "rate limited by {}; retry after {} ms",
            refused.name,
            headers::ceil_ms(refused.decision.retry_after_us())
        )
    }
}

/// An address with as many HTTP/2 requests in flight as it may hold
/// connections: this one waits its turn.
pub(super) async fn too_many_in_flight(session: &mut Session, ctx: &RequestCtx) -> Result<bool> {
    debug!(
        "429 too many requests in flight request_id={}",
        ctx.request_id
    );
    let mut headers = headers::json_headers();
    headers.push((&headers::RETRY_AFTER, HeaderValue::from_static("1")));
    respond(
        session,
        ctx,
        429,
        headers,
        "{\"error\":\"too_many_requests_in_flight\"}".into(),
    )
    .await?;
    Ok(true)
}

/// Refused to protect the upstream (`[upstream.protection]`): the server's
/// own state, not the client's quota, so a 503 (gRPC: UNAVAILABLE).
pub(super) async fn shed(
    session: &mut Session,
    ctx: &RequestCtx,
    shed: crate::protection::Shed,
) -> Result<bool> {
    debug!(
        "503 upstream protected (limit {}) request_id={}",
        shed.limit, ctx.request_id
    );
    let retry_after = shed.retry_after.as_secs().max(1);
    let headers = vec![(&headers::RETRY_AFTER, HeaderValue::from(retry_after))];
    if is_grpc(session) {
        respond_grpc(
            session,
            ctx,
            GrpcStatus::Unavailable,
            "the upstream is at its limit of requests in flight",
            headers,
        )
        .await?;
        return Ok(true);
    }
    let mut headers = headers;
    headers.extend(headers::json_headers());
    respond(
        session,
        ctx,
        503,
        headers,
        format!(
            "{{\"error\":\"upstream_protected\",\"reason\":\"the upstream is at its limit of {} requests in flight\",\"retry_after\":{retry_after}}}",
            shed.limit
        ),
    )
    .await?;
    Ok(true)
}

/// A limiter that cannot decide and has no fallback (the Redis store is
/// always wrapped in one) refuses with 503 rather than guessing.
pub(super) async fn limiter_failed(
    session: &mut Session,
    ctx: &RequestCtx,
    e: LimiterError,
) -> Result<bool> {
    warn!("limiter failed: {e} request_id={}", ctx.request_id);
    let mut headers = headers::json_headers();
    headers.push((&headers::RETRY_AFTER, HeaderValue::from_static("1")));
    respond(
        session,
        ctx,
        503,
        headers,
        "{\"error\":\"limiter_unavailable\"}".into(),
    )
    .await?;
    Ok(true)
}

/// What a failed exchange is answered: the status and the JSON body's
/// `error`; none when there is nobody to answer.
pub(super) fn failure_answer(e: &Error) -> Option<(u16, &'static str)> {
    Some(match (e.esource(), e.etype()) {
        (_, ErrorType::HTTPStatus(code)) => (*code, "bad_request"),
        (ErrorSource::Upstream, ErrorType::ReadTimedout | ErrorType::ConnectTimedout) => {
            (504, "upstream_timeout")
        }
        (ErrorSource::Upstream, _) => (502, "upstream_unavailable"),
        // The client went away or broke its stream.
        (
            ErrorSource::Downstream,
            ErrorType::WriteError
            | ErrorType::ReadError
            | ErrorType::ConnectionClosed
            | ErrorType::H2Error,
        ) => return None,
        (ErrorSource::Downstream, _) => (400, "bad_request"),
        _ => (500, "internal_error"),
    })
}

/// Why a request is answered here rather than forwarded; `Gateway::answer`
/// writes each.
pub(super) enum Answer {
    /// 400 with the error's code and our own reason.
    BadRequest {
        code: &'static str,
        reason: Cow<'static, str>,
    },
    /// An address with its HTTP/2 requests in flight all taken.
    TooManyInFlight,
    Blocked(BlockReason),
    /// A limit with `on_missing = "deny"` found nothing to key on.
    MissingKey(Box<str>),
    /// The store failed with no fallback to decide instead.
    LimiterFailed(LimiterError),
    /// A limit refused: the 429, or a gRPC status with this message.
    Refused(headers::Rejection, Option<String>),
    /// Reading the request failed: nobody to answer, or nothing to send on.
    Failed(Box<Error>),
    /// Refused to protect the upstream.
    Shed(crate::protection::Shed),
}

impl Answer {
    pub(super) fn bad_request(code: &'static str, reason: impl Into<Cow<'static, str>>) -> Answer {
        Answer::BadRequest {
            code,
            reason: reason.into(),
        }
    }
}

/// Writes the answer a phase gave: `true`, the upstream never touched.
pub(super) async fn write_answer(
    state: &AppState,
    session: &mut Session,
    ctx: &mut RequestCtx,
    answer: Answer,
) -> Result<bool> {
    match answer {
        Answer::BadRequest { code, reason } => bad_request(session, ctx, code, &reason).await,
        Answer::TooManyInFlight => too_many_in_flight(session, ctx).await,
        Answer::Blocked(reason) => answer_blocked(state, session, ctx, reason).await,
        Answer::MissingKey(limit) => missing_key(session, ctx, &limit).await,
        Answer::LimiterFailed(e) => limiter_failed(session, ctx, e).await,
        Answer::Refused(rejection, Some(grpc_message)) => {
            let headers = rejection
                .headers
                .into_iter()
                .filter(|(name, _)| **name != headers::CONTENT_TYPE)
                .collect();
            respond_grpc(
                session,
                ctx,
                GrpcStatus::ResourceExhausted,
                &grpc_message,
                headers,
            )
            .await?;
            Ok(true)
        }
        Answer::Failed(e) => Err(e),
        Answer::Shed(refusal) => shed(session, ctx, refusal).await,
        Answer::Refused(rejection, None) => {
            respond(
                session,
                ctx,
                rejection.status,
                rejection.headers,
                rejection.body,
            )
            .await?;
            Ok(true)
        }
    }
}

/// Answers a request `[block]` refuses (logged once a minute per client).
async fn answer_blocked(
    state: &AppState,
    session: &mut Session,
    ctx: &mut RequestCtx,
    reason: BlockReason,
) -> Result<bool> {
    state.metrics.blocked[reason as usize].inc();
    if let Some(client) = &ctx.client {
        if state
            .block_log
            .due(client.ip_hash, SystemClock.now_us())
            .is_some()
        {
            info!(
                "blocked ({}): {} request_id={} (once a minute per client)",
                reason.as_str(),
                client.log_label(),
                ctx.request_id
            );
        }
    }
    let status = ctx.runtime.policy.block.status;
    blocked(session, ctx, status).await
}
