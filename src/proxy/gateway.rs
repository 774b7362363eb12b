//! The Pingora `ProxyHttp` implementation: the phase hooks alone (see the
//! module map in `proxy`). What `request_filter`'s phases do lives beside
//! what they touch: `receive`, `planning`, `decide`, `answer`; after the
//! exchange, `charges` settles and `verdict` counts.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use log::{debug, warn};
use pingora::http::ResponseHeader;
use pingora::modules::http::HttpModules;
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};

use super::access::access_line;
use super::accounting::count;
use super::answer::{add_request_id, write_answer, write_headers, Answer, ExchangeFailure};
use super::charges::{self, settle_finished};
use super::ctx::{peer_ip, RequestCtx};
use super::decide::decide_request;
use super::forwarding::{strip_what_the_client_may_not_say, tell_the_upstream_who_asked, HOST};
use super::header_edit::{edit_request, edit_response};
use super::planning::{plan_request, protection_rank};
use super::receive::receive;
use super::request_body::is_plain_event_stream;
use super::request_id::RequestId;
use super::traced;
use crate::connection::clock::HeadClock;
use crate::server::state::AppState;
use floodgate_limiter::watch;

pub struct Gateway {
    state: Arc<AppState>,
}

impl Gateway {
    pub fn new(state: Arc<AppState>) -> Self {
        Gateway { state }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    /// Each request's context, under the running configuration as it is
    /// when the request starts: a reload mid-request changes nothing for it.
    fn new_ctx(&self) -> Self::CTX {
        RequestCtx {
            runtime: self.state.runtime.load_full(),
            request_id: RequestId::none(),
            client: None,
            head_clock: None,
            stream_permit: None,
            tries: 0,
            first_server: 0,
            started: Instant::now(),
            h2_stream: None,
            upstream_sent: None,
            upstream_took: None,
            slots: None,
            reservations: Vec::new(),
            by_body: Vec::new(),
            body_ended: false,
            upstream_status: None,
            verdict: None,
            rate_headers: Vec::new(),
            held: None,
            protection: None,
            trace: None,
            _in_flight: self.state.request_started(),
        }
    }

    /// No downstream modules: Pingora's default is a response compression
    /// module that stays disabled but is still built and consulted on every
    /// request.
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    /// The connection's context: its `HeadClock`. The head has been parsed.
    fn on_connection_reuse(
        &self,
        _session: &mut Session,
        ctx: &mut Self::CTX,
        connection: Box<dyn std::any::Any + Send + Sync>,
    ) {
        if let Ok(clock) = connection.downcast::<Arc<HeadClock>>() {
            clock.head_arrived();
            ctx.head_clock = Some(*clock);
        }
    }

    /// The head is in, the body not yet read. Rejects what is malformed
    /// (400), blocked (403) or over a limit (429, 503 for a limiter that
    /// cannot decide) and answers it here: `true`, the upstream never
    /// touched. Otherwise `false`, with the verdict, the slots and the
    /// reservations in `ctx` for the later phases, and a leaky bucket's
    /// wait already waited.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        traced::begin(&self.state, session, ctx);
        let decided = async {
            receive(&self.state, session, ctx)?;
            let Some((layers, earlier)) = plan_request(&self.state, session, ctx).await? else {
                return Ok(0);
            };
            if !traced::sampled(ctx) {
                return decide_request(&self.state, session, ctx, layers, earlier).await;
            }
            // Boxed: only a recorded request keeps what its decision went
            // through.
            let started = SystemTime::now();
            let (decided, watched) = Box::pin(watch::watched(decide_request(
                &self.state,
                session,
                ctx,
                layers,
                earlier,
            )))
            .await;
            traced::decided(&self.state, ctx, started, &watched);
            decided
        }
        .await;
        let answer = match decided {
            Ok(delay_us) => {
                if delay_us > 0 {
                    let since = SystemTime::now();
                    tokio::time::sleep(Duration::from_micros(delay_us)).await;
                    traced::waited(&self.state, ctx, since);
                }
                // Admitted by every limit (a leaky bucket's wait over): a
                // place at the upstream, if it is protected.
                let Some(settings) = self.state.protection.settings() else {
                    return Ok(false);
                };
                let rank = protection_rank(session, ctx, &settings);
                // Boxed, as the body's read, for its queue's wait.
                match Box::pin(self.state.protection.admit(&settings, rank)).await {
                    None => return Ok(false),
                    Some(Ok(permit)) => {
                        ctx.protection = Some(permit);
                        return Ok(false);
                    }
                    Some(Err(refusal)) => Answer::Shed(refusal),
                }
            }
            Err(answer) => answer,
        };
        write_answer(&self.state, session, ctx, answer).await
    }

    /// HTTP/1 bodies are paced by the connection's clock, HTTP/2 ones by
    /// their connection's watch (`connection::h2_watch`), from the head on.
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        // Pingora replays the tail of a body read before the decision; the
        // whole of it goes in its place (each try upstream).
        if let (Some(held), Some(_)) = (&ctx.held, body.as_ref()) {
            *body = Some(held.bytes.clone());
        }
        if end_of_stream {
            if let Some(clock) = &ctx.head_clock {
                clock.body_arrived();
            }
        }
        Ok(())
    }

    /// The server to try: round robin over `[upstream].servers`, a retry
    /// moving on to the next, each at most once per request.
    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        let upstreams = &ctx.runtime.upstream;
        if ctx.tries == 0 {
            ctx.first_server = upstreams.next_start();
        }
        let mut peer = upstreams.peer(ctx.first_server + ctx.tries);
        if session.is_upgrade_req() {
            // A WebSocket lives as long as it carries traffic: silence, not
            // age, ends it, on either side.
            let idle = upstreams.settings().websocket_idle_timeout;
            peer.options.read_timeout = Some(idle);
            session.set_read_timeout(Some(idle));
        }
        ctx.tries += 1;
        Ok(Box::new(peer))
    }

    /// A connection to the upstream is ready: counted as reused or new.
    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        reused: bool,
        _peer: &HttpPeer,
        _fd: std::os::unix::io::RawFd,
        _digest: Option<&pingora::protocols::Digest>,
        _ctx: &mut Self::CTX,
    ) -> Result<()> {
        let requests = &self.state.metrics.requests;
        if reused {
            requests.upstream_reused.inc();
        } else {
            requests.upstream_connected.inc();
        }
        Ok(())
    }

    /// What the upstream is sent: the client's say removed where only
    /// floodgate or a trusted proxy may speak, then who asked, the request
    /// id, and a Host for a request that had none.
    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut pingora::http::RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let settings = ctx.runtime.upstream.settings();
        let peer = floodgate_policy::identity::normalize(peer_ip(session));
        let trusted = ctx.runtime.policy.clients.is_trusted(&peer);
        let http_1_0 = session.req_header().version == http::Version::HTTP_10;
        // Who asked (four headers), the request id, a Host.
        let room = if settings.forwarded_headers { 6 } else { 2 };
        edit_request(upstream_request, settings.preserve_header_case, room, |h| {
            strip_what_the_client_may_not_say(h, trusted, ctx);
            if settings.forwarded_headers {
                tell_the_upstream_who_asked(session, h, ctx, peer)?;
            }
            if let Some(host) = &settings.host {
                h.insert(&HOST, host.clone())?;
            } else if http_1_0 && !h.map().contains_key(http::header::HOST) {
                // HTTP/1.0 allows no Host; the upstream (spoken to in HTTP/1.1) gets one.
                let server = ctx.first_server + ctx.tries.saturating_sub(1);
                let host = http::HeaderValue::try_from(ctx.runtime.upstream.host(server))
                    .map_err(|_| Error::explain(ErrorType::InternalError, "address is no host"))?;
                h.insert(&HOST, host)?;
            }
            add_request_id(h, ctx)
        })?;
        if let Some(tracing) = &self.state.tracing {
            let server = ctx.first_server + ctx.tries.saturating_sub(1);
            let address = ctx.runtime.upstream.host(server).to_string();
            traced::upstream_started(tracing, ctx, upstream_request, &address)?;
        }
        if let Some(held) = ctx.held.as_ref().filter(|h| h.usage_asked) {
            // The body grew; and the stream must come uncompressed for its
            // usage chunk to be taken out.
            upstream_request.insert_header(http::header::CONTENT_LENGTH, held.bytes.len())?;
            upstream_request.remove_header(&http::header::ACCEPT_ENCODING);
        }
        ctx.upstream_sent = Some(Instant::now());
        Ok(())
    }

    /// The upstream's final head is in (an interim one only loses its cost
    /// header): the layers charged by the response are charged before the
    /// client sees the status, and the rate-limit headers and the request
    /// id are added.
    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let status = upstream_response.status;
        // An interim answer (100 Continue, 103 Early Hints) is no outcome:
        // what is charged, and the headers, wait for the final one. (A 101
        // is final: the connection is the WebSocket's from then on.)
        if status.is_informational() && status != http::StatusCode::SWITCHING_PROTOCOLS {
            charges::hide_costs(ctx, upstream_response);
            return Ok(());
        }
        ctx.upstream_took = ctx.upstream_sent.map(|sent| sent.elapsed());
        ctx.upstream_status = Some(status.as_u16());
        if let Some(trace) = &ctx.trace {
            trace.upstream_answered(status.as_u16());
        }
        if let (Some(_), Some(took)) = (&ctx.protection, ctx.upstream_took) {
            self.state.protection.sample(took);
        }
        // Charged before the client sees the status: a client that learns
        // the outcome and then holds the stream open is counted all the same.
        charges::charge_by_response(self.state.store.as_ref(), ctx, upstream_response).await;
        if status == http::StatusCode::SWITCHING_PROTOCOLS {
            if let Some(slots) = &mut ctx.slots {
                slots.upgraded();
            }
        }
        if let Some(held) = ctx.held.as_mut().filter(|h| h.usage_asked) {
            if status.is_success() && is_plain_event_stream(upstream_response) {
                held.stripper = Some(Default::default());
                // What the client gets is shorter than what the upstream sent.
                upstream_response.remove_header(&http::header::CONTENT_LENGTH);
            }
        }
        let headers = std::mem::take(&mut ctx.rate_headers);
        let preserve_case = ctx.runtime.upstream.settings().preserve_header_case;
        // And the request id; then Pingora's Date and Connection on the way out.
        edit_response(upstream_response, preserve_case, headers.len() + 3, |h| {
            write_headers(h, headers)?;
            add_request_id(h, ctx)
        })
    }

    /// The upstream's body as it passes: read by the layers charged by its
    /// usage, never held back or changed. A branch per chunk without them.
    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        if !ctx.by_body.is_empty() {
            charges::read_body(ctx, body.as_deref(), end_of_stream);
        }
        Ok(None)
    }

    /// The usage chunk the client did not ask for, taken out of its stream.
    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        if let Some(stripper) = ctx.held.as_mut().and_then(|h| h.stripper.as_mut()) {
            let mut out = Vec::with_capacity(body.as_ref().map_or(0, |b| b.len()));
            if let Some(chunk) = body.as_deref() {
                stripper.feed(chunk, &mut out);
            }
            if end_of_stream {
                stripper.finish(&mut out);
            }
            *body = Some(out.into());
        }
        Ok(None)
    }

    /// A failure after the request was sent is retried only where Pingora
    /// would (an idempotent request on a pooled connection that turned out
    /// stale), and never beyond one more round of the servers.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Self::CTX,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("peer {peer}"));
        let idempotent = session.req_header().method.is_idempotent()
            && !session.as_ref().retry_buffer_truncated();
        if idempotent && client_reused && ctx.tries <= ctx.runtime.upstream.len() {
            e.retry.decide_reuse(client_reused);
        } else {
            e.set_retry(false);
        }
        e
    }

    /// Nothing reached this server: whether the next may take the request.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Self::CTX,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // Nothing reached that server, so the next one may take the request;
        // each server once, so the wait is bounded by servers x connect_timeout.
        e.set_retry(ctx.tries < ctx.runtime.upstream.len());
        e
    }

    /// The exchange failed: the client is answered 502 or 504 when the
    /// upstream failed (a JSON body, one warn line), 400 when its own
    /// stream was malformed, nothing when it has gone or the answer had
    /// begun.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
    ) -> FailToProxy {
        let failure = ExchangeFailure::of(e);
        if matches!(e.esource(), ErrorSource::Upstream) {
            let request = session.req_header();
            warn!(
                "upstream failed: {} {} -> {} after {} attempt(s): {}",
                request.method,
                request.uri.path(),
                failure.map_or(0, |f| f.status),
                ctx.tries,
                e.etype().as_str()
            );
        }
        // After the answer began (an upgraded connection, a response cut
        // off), nothing more can be said on this connection.
        let failure = failure.filter(|_| session.response_written().is_none());
        let status = failure.map_or(0, |f| f.status);
        if let Some(failure) = failure {
            let answer = Answer::ExchangeFailed(failure);
            if let Err(write_error) = write_answer(&self.state, session, ctx, answer).await {
                // The client is gone: its doing, and one line per request.
                debug!("could not send the {status} answer: {write_error}");
            }
        }
        FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        }
    }

    /// Pingora's summary carries the query string; ours does not.
    fn request_summary(&self, session: &Session, _ctx: &Self::CTX) -> String {
        let request = session.req_header();
        format!("{} {}", request.method, request.uri.path())
    }

    /// `fail_to_proxy` logs one line per failed request instead.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Self::CTX, _error: &Error) -> bool {
        true
    }

    /// Pingora's warn line per failed exchange carries the query string:
    /// `fail_to_proxy` writes ours.
    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        _ctx: &Self::CTX,
        _error: &Error,
        _context: pingora::proxy::ProxyWarnLogContext,
    ) -> bool {
        true
    }

    /// The response is over, on every path: what the request reserved is
    /// settled, it is counted, the access log has its line, and the
    /// connection idles until the next head.
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX) {
        if let Some(clock) = &ctx.head_clock {
            clock.await_next_head();
        }
        settle_finished(&self.state, ctx, e).await;
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let took = ctx.started.elapsed();
        count(&self.state, ctx, status, took).await;
        if let Some(log) = &self.state.access_log {
            log.write(access_line(session, ctx, status, took));
        }
        if ctx.trace.is_some() {
            traced::finish(ctx, session.req_header().uri.path(), status, e);
        }
    }
}
