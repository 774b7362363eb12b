//! Answers floodgate writes itself: 400s, 429s, 503s and their gRPC forms,
//! each with the request id. An `Answer` says why a request is answered
//! here and owns what it is answered with (its status, headers and body);
//! `write_answer` logs, counts and writes any of them.

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
use crate::proxy::headers::{self, EnforcedOutcome, Header, CONTENT_TYPE};
use crate::server::state::AppState;
use floodgate_limiter::clock::{Clock, SystemClock};
use floodgate_limiter::LimiterError;
use floodgate_policy::blocklist::BlockReason;

async fn respond(
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
enum GrpcStatus {
    ResourceExhausted = 8,
    Unavailable = 14,
}

/// A gRPC answer with no messages: HTTP 200 and the outcome in the trailers
/// (`grpc-status`, `grpc-message`), where gRPC clients read it.
async fn respond_grpc(
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
fn grpc_message(text: &str) -> String {
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

/// What a gRPC client is told when a limit refuses it.
pub(super) fn grpc_refusal(refused: &EnforcedOutcome<'_>) -> String {
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

/// How the exchange failed, as the client is told: the status and the
/// JSON body's `error`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ExchangeFailure {
    pub(super) status: u16,
    error: &'static str,
}

impl ExchangeFailure {
    /// What a failed exchange is answered; none when there is nobody to
    /// answer.
    pub(super) fn of(e: &Error) -> Option<ExchangeFailure> {
        let (status, error) = match (e.esource(), e.etype()) {
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
        };
        Some(ExchangeFailure { status, error })
    }
}

/// Why a request is answered here rather than forwarded. Each owns what it
/// is answered with (`Answer::reply`); `write_answer` writes any of them.
pub(super) enum Answer {
    /// 400 with the error's code and our own reason, never the client's
    /// text.
    BadRequest {
        code: &'static str,
        reason: Cow<'static, str>,
    },
    /// An address with as many HTTP/2 requests in flight as it may hold
    /// connections: this one waits its turn.
    TooManyInFlight,
    /// A client `[block]` refuses: no reason given beyond that.
    Blocked(BlockReason),
    /// A limit with `on_missing = "deny"` found nothing to key on.
    MissingKey(Box<str>),
    /// The store failed with no fallback to decide instead (the Redis
    /// store is always wrapped in one): refused rather than guessed.
    LimiterFailed(LimiterError),
    /// A limit refused: the 429, or a gRPC status with this message.
    Refused(headers::Rejection, Option<String>),
    /// Refused to protect the upstream (`[upstream.protection]`): the
    /// server's own state, not the client's quota, so a 503 (gRPC:
    /// UNAVAILABLE).
    Shed(crate::protection::Shed),
    /// The exchange failed after the request was let through.
    ExchangeFailed(ExchangeFailure),
    /// Reading the request failed: nobody to answer, or nothing to send on.
    Failed(Box<Error>),
}

/// An answer as it goes on the wire.
enum Reply {
    /// A status, headers and a JSON body.
    Http {
        status: u16,
        headers: Vec<Header>,
        body: String,
    },
    /// A gRPC call's: HTTP 200, no messages, the outcome in the trailers.
    Grpc {
        status: GrpcStatus,
        message: String,
        headers: Vec<Header>,
    },
}

impl Answer {
    pub(super) fn bad_request(code: &'static str, reason: impl Into<Cow<'static, str>>) -> Answer {
        Answer::BadRequest {
            code,
            reason: reason.into(),
        }
    }

    /// Whether the connection ends with this answer: a client that sent
    /// what cannot be read, or that is blocked, gets no next request on it.
    fn closes(&self) -> bool {
        matches!(
            self,
            Answer::BadRequest { .. } | Answer::Blocked(_) | Answer::ExchangeFailed(_)
        )
    }

    /// What it is answered with: its status, headers and body, or for a
    /// gRPC call (`grpc`) the status its client reads, where it has one. A
    /// failed read has nothing to answer: its error goes back to Pingora.
    fn reply(self, ctx: &RequestCtx, grpc: bool) -> Result<Reply> {
        let request_id = &ctx.request_id;
        Ok(match self {
            Answer::BadRequest { code, reason } => Reply::json(
                400,
                format!("{{\"error\":\"{code}\",\"reason\":\"{reason}\"}}"),
            ),
            Answer::TooManyInFlight => Reply::json_retry(
                429,
                "{\"error\":\"too_many_requests_in_flight\"}".into(),
            ),
            Answer::Blocked(_) => Reply::json(
                ctx.runtime.policy.block.status,
                format!("{{\"error\":\"blocked\",\"request_id\":\"{request_id}\"}}"),
            ),
            Answer::MissingKey(limit) => Reply::json(
                400,
                format!(
                    "{{\"error\":\"missing_key\",\"limit\":\"{limit}\",\"request_id\":\"{request_id}\"}}"
                ),
            ),
            Answer::LimiterFailed(_) => {
                Reply::json_retry(503, "{\"error\":\"limiter_unavailable\"}".into())
            }
            Answer::Refused(rejection, Some(message)) => Reply::Grpc {
                status: GrpcStatus::ResourceExhausted,
                message,
                headers: rejection
                    .headers
                    .into_iter()
                    .filter(|(name, _)| **name != headers::CONTENT_TYPE)
                    .collect(),
            },
            Answer::Refused(rejection, None) => Reply::Http {
                status: rejection.status,
                headers: rejection.headers,
                body: rejection.body,
            },
            Answer::Shed(shed) => {
                let retry_after = shed.retry_after.as_secs().max(1);
                let mut headers = vec![(&headers::RETRY_AFTER, HeaderValue::from(retry_after))];
                if grpc {
                    return Ok(Reply::Grpc {
                        status: GrpcStatus::Unavailable,
                        message: "the upstream is at its limit of requests in flight".into(),
                        headers,
                    });
                }
                headers.extend(headers::json_headers());
                let body = format!(
                    "{{\"error\":\"upstream_protected\",\"reason\":\"the upstream is at its limit of {} requests in flight\",\"retry_after\":{retry_after}}}",
                    shed.limit
                );
                Reply::Http {
                    status: 503,
                    headers,
                    body,
                }
            }
            Answer::ExchangeFailed(ExchangeFailure { status, error }) => {
                if grpc && status >= 500 {
                    Reply::Grpc {
                        status: GrpcStatus::Unavailable,
                        message: format!(
                            "the service behind the gateway is unavailable ({error})"
                        ),
                        headers: Vec::new(),
                    }
                } else {
                    Reply::json(status, format!("{{\"error\":\"{error}\"}}"))
                }
            }
            Answer::Failed(e) => return Err(e),
        })
    }

    /// Its line in the log, and its count.
    fn record(&self, state: &AppState, ctx: &RequestCtx) {
        let request_id = &ctx.request_id;
        match self {
            Answer::BadRequest { code, reason } => {
                debug!("400 {code}: {reason} request_id={request_id}");
            }
            Answer::TooManyInFlight => {
                debug!("429 too many requests in flight request_id={request_id}");
            }
            Answer::Blocked(reason) => blocked(state, ctx, *reason),
            Answer::MissingKey(limit) => {
                debug!("400 missing_key for {limit} request_id={request_id}");
            }
            Answer::LimiterFailed(e) => warn!("limiter failed: {e} request_id={request_id}"),
            Answer::Shed(shed) => debug!(
                "503 upstream protected (limit {}) request_id={request_id}",
                shed.limit
            ),
            // Counted and logged where they are decided.
            Answer::Refused(..) | Answer::ExchangeFailed(_) | Answer::Failed(_) => {}
        }
    }
}

impl Reply {
    fn json(status: u16, body: String) -> Reply {
        Reply::Http {
            status,
            headers: headers::json_headers(),
            body,
        }
    }

    /// A JSON answer the client may retry in a second.
    fn json_retry(status: u16, body: String) -> Reply {
        let mut headers = headers::json_headers();
        headers.push((&headers::RETRY_AFTER, HeaderValue::from_static("1")));
        Reply::Http {
            status,
            headers,
            body,
        }
    }
}

/// Writes the answer a phase gave: `true`, the upstream never touched.
pub(super) async fn write_answer(
    state: &AppState,
    session: &mut Session,
    ctx: &RequestCtx,
    answer: Answer,
) -> Result<bool> {
    answer.record(state, ctx);
    if answer.closes() {
        session.set_keepalive(None);
    }
    let grpc = is_grpc(session);
    match answer.reply(ctx, grpc)? {
        Reply::Http {
            status,
            headers,
            body,
        } => respond(session, ctx, status, headers, body).await?,
        Reply::Grpc {
            status,
            message,
            headers,
        } => respond_grpc(session, ctx, status, &message, headers).await?,
    }
    Ok(true)
}

/// Counts a request `[block]` refuses, and logs it once a minute per
/// client.
fn blocked(state: &AppState, ctx: &RequestCtx, reason: BlockReason) {
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
}
