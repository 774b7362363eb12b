//! A request's body read before its decision, for the limits that read it
//! (`body:` keys and matches, a reservation from an LLM request's own
//! `max_tokens`), then sent upstream as it came.
//!
//! Pingora sends a body read in `request_filter` upstream only through its
//! retry buffer, which holds at most 64 KiB. So the read turns that buffer
//! on only for the body's last 64 KiB (the length is known: a body is read
//! here only when it declares one, up to `max_body`); Pingora then hands
//! that tail to `request_body_filter` as the whole body, and the filter
//! puts the whole body held here in its place (`held`). A body of unknown
//! length (chunked, or an HTTP/2 request without `content-length`) or
//! beyond `max_body` is not read: the limits find no fields in it.

use bytes::{Bytes, BytesMut};
use pingora::proxy::Session;

use crate::usage::include_usage::ask_for_usage;
use floodgate_policy::body::{BodyError, BodyFields};
use floodgate_policy::{ChargedByResponse, Layers};

/// Pingora's retry buffer (`BODY_BUF_LIMIT` in pingora-core).
const REPLAYED_AT_MOST: usize = 64 * 1024;

/// A body read before the decision.
pub(super) struct ReadBody {
    /// The fields asked for; none for a body that is not one JSON object.
    pub fields: Option<BodyFields>,
    /// The body, to send upstream in its place.
    pub held: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum BodyReadError {
    /// The client sent two values for a field a limit reads.
    #[error("{0}")]
    Ambiguous(BodyError),
    /// Reading failed: the client went away, or was too slow.
    #[error("reading the request body: {0}")]
    Read(Box<pingora::Error>),
    /// The body's last part never reached the retry buffer, so it could not
    /// be sent upstream.
    #[error("the request body could not be held for the upstream")]
    NotReplayable,
}

/// The body of `session`'s request, when it declares a length of at most
/// `max_body`; none when it has none to read, or is not to be read.
pub(super) async fn read_before_decision(
    session: &mut Session,
    max_body: usize,
    wanted: &[Box<str>],
) -> Result<Option<ReadBody>, BodyReadError> {
    if session.as_mut().is_body_empty() {
        return Ok(None);
    }
    let header = session.req_header();
    if header.headers.contains_key(http::header::TRANSFER_ENCODING) {
        return Ok(None);
    }
    let Some(length) = header
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&length| length <= max_body)
    else {
        return Ok(None);
    };
    let mut body = BytesMut::with_capacity(length);
    loop {
        if length.saturating_sub(body.len()) <= REPLAYED_AT_MOST {
            session.as_mut().enable_retry_buffering();
        }
        match session.read_request_body().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => return Err(BodyReadError::Read(e)),
        }
    }
    if session.as_ref().get_retry_buffer().is_none() {
        return Err(BodyReadError::NotReplayable);
    }
    let held = body.freeze();
    let fields = match BodyFields::read(&held, wanted) {
        Ok(fields) => Some(fields),
        Err(e @ BodyError::Ambiguous(_)) => return Err(BodyReadError::Ambiguous(e)),
        Err(BodyError::NotJson) => None,
    };
    Ok(Some(ReadBody { fields, held }))
}

/// The held body made to ask for its stream's usage, when a layer being
/// decided wants it (`include_usage`) and the client did not ask.
pub(super) fn ask_for_usage_where_wanted(layers: &Layers, held: &Bytes) -> Option<Bytes> {
    let wanted = layers
        .reservations
        .iter()
        .any(|(_, charged_by)| matches!(charged_by, ChargedByResponse::Cost(c) if c.include_usage));
    if !wanted {
        return None;
    }
    ask_for_usage(held).map(Bytes::from)
}

/// An answer the stripper can read: an event stream, not compressed.
pub(super) fn is_plain_event_stream(response: &pingora::http::ResponseHeader) -> bool {
    let header = |name| {
        response
            .headers
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
    };
    header(http::header::CONTENT_TYPE).is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
    }) && header(http::header::CONTENT_ENCODING).is_none_or(|e| e.eq_ignore_ascii_case("identity"))
}
