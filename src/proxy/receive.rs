//! The request as it arrives: its id, its framing and target, its place
//! among its address's HTTP/2 requests, the clock its body runs on.

use pingora::proxy::Session;
use pingora::Result;

use super::answer::Answer;
use super::ctx::{peer_ip, RequestCtx};
use super::forwarding::request_id_of;
use super::framing::{canonicalise_target, framing_problem, request_has_body};
use crate::connection::h2_watch::{stream_header, H2Stream, STREAM_HEADER_NAME};
use crate::server::state::AppState;

/// The request as it arrived: its id, its framing and target, its place
/// among its address's HTTP/2 requests, the clock its body runs on.
pub(super) fn receive(
    state: &AppState,
    session: &mut Session,
    ctx: &mut RequestCtx,
) -> Result<(), Answer> {
    // Requests that arrive before the previous answer are kept and
    // answered in order, each decided on its own.
    session.set_pipelining_enabled(true);
    ctx.request_id = request_id_of(session, ctx);
    let h2 = session.req_header().version == http::Version::HTTP_2;
    // The header naming an HTTP/2 request's stream is the watch's word
    // to this request alone: read, then gone before anything else looks.
    if let Some(named) = stream_header(&session.req_header().headers) {
        if h2 {
            let socket = session.digest().and_then(|d| d.socket_digest.as_ref());
            ctx.h2_stream = H2Stream::named(named, socket);
        }
        session.req_header_mut().remove_header(&STREAM_HEADER_NAME);
    }
    if h2 && ctx.h2_stream.is_none() {
        // Every stream's first block is named by its connection's
        // watch: a request without a stream of its own would escape
        // every cap and deadline that hangs on one.
        return Err(Answer::bad_request(
            "unnamed_stream",
            "the HTTP/2 request is not tied to a stream of its connection",
        ));
    }
    if !h2 {
        // A client that closes its side once the request is in does not
        // end the upstream's work: the exchange runs to its answer (and
        // keeps the request's place under the caps and its slots).
        session.as_mut().set_abort_on_close(false);
    }
    if let Some((code, reason)) = framing_problem(session) {
        return Err(Answer::bad_request(code, reason));
    }
    if h2 {
        let peer = peer_ip(session);
        if let Some(group) = ctx.runtime.policy.clients.connection_group(peer) {
            match state.streams.admit(group) {
                Some(permit) => ctx.stream_permit = Some(permit),
                None => return Err(Answer::TooManyInFlight),
            }
        }
    }
    if state.draining() {
        // Shutting down: finish this request, then let the client go elsewhere.
        session.set_keepalive(None);
    }
    if let Some(clock) = &ctx.head_clock {
        if request_has_body(session) {
            clock.body_expected();
        }
    }
    let escaped_slashes = ctx.runtime.policy.paths.escaped_slashes;
    canonicalise_target(session.req_header_mut(), escaped_slashes)
        .map_err(|e| Answer::bad_request(e.code(), e.to_string()))
}
