//! The Pingora `ProxyHttp` implementation: the phase hooks (see the module
//! map in `proxy`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use log::{debug, info, warn};
use pingora::http::ResponseHeader;
use pingora::modules::http::HttpModules;
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};

use super::access::access_line;
use super::answer::{
    add_request_id, bad_request, blocked, grpc_refusal, is_grpc, limiter_failed, missing_key,
    respond, respond_grpc, shed, too_many_in_flight, write_headers, GrpcStatus,
};
use super::charges;
use super::ctx::{peer_ip, HeldBody, RequestCtx};
use super::decide::{ban_refusals, decide, refused};
use super::forwarding::{
    request_id_of, strip_what_the_client_may_not_say, tell_the_upstream_who_asked, HOST,
};
use super::framing::{canonicalise_target, framing_problem, request_has_body};
use super::header_edit::{edit_request, edit_response};
use super::request_id::RequestId;
use super::strikes;
use super::traced;
use super::verdict::{Outcome, Verdict};

use super::request_body::{
    ask_for_usage_where_wanted, is_plain_event_stream, read_before_decision, BodyReadError,
};
use crate::connection::clock::HeadClock;
use crate::connection::h2_watch::{stream_header, H2Stream, STREAM_HEADER_NAME};
use crate::proxy::headers::{self, Position};
use crate::server::state::AppState;
use floodgate_limiter::clock::{Clock, SystemClock};
use floodgate_limiter::{watch, LimiterError};
use floodgate_policy::blocklist::BlockReason;
use floodgate_policy::identity::{normalize_host, Client, IdentityError};
use floodgate_policy::jwt::TokenCheck;
use floodgate_policy::{Layers, Plan, Policy, RequestView};

pub struct Gateway {
    state: Arc<AppState>,
}

/// What the limits look at in a request.
fn view_of<'a>(
    request: &'a pingora::http::RequestHeader,
    path: &'a str,
    host: Option<&'a str>,
    client: &'a Client,
) -> RequestView<'a> {
    RequestView {
        method: &request.method,
        path,
        headers: &request.headers,
        query: request.uri.query(),
        host,
        client,
        body: None,
    }
}

/// The request's class under the upstream's protection.
fn protection_rank(
    session: &Session,
    ctx: &RequestCtx,
    settings: &crate::protection::ProtectionSettings,
) -> usize {
    let Some(client) = &ctx.client else {
        return settings.rank(None);
    };
    let request = session.req_header();
    let policy = &ctx.runtime.policy;
    let path = path_as_matched(policy, request);
    let host = if settings.matches_requests() {
        host_asked(request)
    } else {
        None
    };
    settings.rank(Some(&view_of(request, &path, host.as_deref(), client)))
}

/// The request's path as limits match it (lower case where paths are
/// matched ignoring case).
fn path_as_matched<'a>(policy: &Policy, request: &'a pingora::http::RequestHeader) -> Cow<'a, str> {
    let path = request.uri.path();
    if policy.paths.case_insensitive {
        Cow::Owned(path.to_ascii_lowercase())
    } else {
        Cow::Borrowed(path)
    }
}

/// The host asked for, normalised, if any.
fn host_asked(request: &pingora::http::RequestHeader) -> Option<String> {
    request
        .uri
        .host()
        .or_else(|| {
            request
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .map(normalize_host)
        .filter(|h| !h.is_empty())
}

impl Gateway {
    pub fn new(state: Arc<AppState>) -> Self {
        Gateway { state }
    }

    /// Answers a request `[block]` refuses (logged once a minute per client).
    async fn block(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        reason: BlockReason,
    ) -> Result<bool> {
        self.state.metrics.blocked[reason as usize].inc();
        if let Some(client) = &ctx.client {
            if self
                .state
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

    /// What the request's token comes to: remembered, refused before, or
    /// checked now. A signature is checked only after the cheaper refusal:
    /// an address that a limit bans gets the ban (`Err`, its refusals)
    /// without one.
    async fn token_of(
        &self,
        policy: &Policy,
        client: &Client,
        headers: &http::HeaderMap,
    ) -> std::result::Result<TokenCheck, Vec<Outcome>> {
        let Some(jwt) = &policy.clients.jwt else {
            return Ok(TokenCheck::Absent);
        };
        let token = match jwt.token_in(headers) {
            Ok(Some(token)) => token,
            Ok(None) => return Ok(TokenCheck::Absent),
            Err(why) => return Ok(TokenCheck::Rejected(why)),
        };
        let now_s = floodgate_policy::jwt::unix_now_s();
        if let Some(known) = jwt.known(token, now_s) {
            return Ok(known);
        }
        let bans = policy.address_bans(client);
        if !bans.is_empty() {
            // A store that cannot answer knows no ban: bans never fail closed.
            if let Ok(decisions) = self.state.store.peek(&bans).await {
                let banned = ban_refusals(policy, bans.into_iter().zip(decisions));
                if !banned.is_empty() {
                    return Err(banned);
                }
            }
        }
        Ok(jwt.verify_fresh(token, client.ip, now_s))
    }
}

/// What a failed exchange is answered: the status and the JSON body's
/// `error`; none when there is nobody to answer.
fn failure_answer(e: &Error) -> Option<(u16, &'static str)> {
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
enum Answer {
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
    fn bad_request(code: &'static str, reason: impl Into<Cow<'static, str>>) -> Answer {
        Answer::BadRequest {
            code,
            reason: reason.into(),
        }
    }
}

/// The phases of `request_filter`, in its order. Each reads what it needs
/// of the session and the request's context, and either hands on to the
/// next or says how the request is answered.
impl Gateway {
    /// The request as it arrived: its id, its framing and target, its place
    /// among its address's HTTP/2 requests, the clock its body runs on.
    fn receive(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<(), Answer> {
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
                match self.state.streams.admit(group) {
                    Some(permit) => ctx.stream_permit = Some(permit),
                    None => return Err(Answer::TooManyInFlight),
                }
            }
        }
        if self.state.draining() {
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

    /// Who is asking and which layers their request meets (none: it goes
    /// straight on), with the refusals already found on the way (a ban
    /// looked up before a token's signature is checked).
    async fn plan(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Option<(Layers, Vec<Outcome>)>, Answer> {
        let runtime = ctx.runtime.clone();
        let policy = &runtime.policy;
        let request = session.req_header();
        let client = match policy.clients.identify(peer_ip(session), &request.headers) {
            Ok(client) => ctx.client.insert(client),
            Err(e) => return Err(Answer::bad_request(e.code(), e.to_string())),
        };
        // The cheapest refusals first: a blocked address or key, then (only
        // where a signature would be checked) a banned address.
        if !policy.block.is_empty() {
            if let Some(reason) = policy
                .block
                .blocks(client, &policy.clients, &request.headers)
            {
                return Err(Answer::Blocked(reason));
            }
        }
        let path = path_as_matched(policy, request);
        if let Some(stream) = &ctx.h2_stream {
            let grpc = &runtime.upstream.settings().grpc_paths;
            if grpc.iter().any(|p| p.matches(&path)) {
                stream.exempt_from_body_floor();
            }
        }
        let host = if policy.reads_host {
            host_asked(request)
        } else {
            None
        };
        let mut earlier = Vec::new();
        if policy.needs_token(&view_of(request, &path, host.as_deref(), client)) {
            match self.token_of(policy, client, &request.headers).await {
                Ok(token) => {
                    self.state.metrics.tokens.count(&token);
                    policy.clients.apply_token(client, token);
                }
                Err(banned) => earlier = banned,
            }
            if let Some(reason) = policy.block.blocks_subject(client) {
                return Err(Answer::Blocked(reason));
            }
        }
        if refused(&earlier) {
            // Banned by its address: nothing more to work out.
            return Ok(Some((Layers::default(), earlier)));
        }
        let view = view_of(request, &path, host.as_deref(), client);
        if !policy.reads_body(&view) {
            return self.planned(policy.plan(&view), earlier);
        }
        // The body is read before the decision: the head's borrows let go.
        let path = path.into_owned();
        // Boxed: its state would otherwise make every request's future
        // larger, and Pingora moves that future byte by byte.
        let read = Box::pin(read_before_decision(
            session,
            policy.max_body,
            &policy.body_fields,
        ))
        .await
        .map_err(|e| match e {
            BodyReadError::Ambiguous(e) => Answer::bad_request("ambiguous_body", e.to_string()),
            BodyReadError::Read(e) => Answer::Failed(e),
            e @ BodyReadError::NotReplayable => {
                Answer::Failed(Error::explain(ErrorType::InternalError, e.to_string()))
            }
        })?;
        let mut view = view_of(session.req_header(), &path, host.as_deref(), client);
        view.body = read.as_ref().and_then(|r| r.fields.as_ref());
        let planned = policy.plan(&view);
        ctx.held = read.map(|r| {
            let mut held = HeldBody {
                bytes: r.held,
                usage_asked: false,
                stripper: None,
            };
            if let Ok(Plan::Check(layers)) = &planned {
                if let Some(asking) = ask_for_usage_where_wanted(layers, &held.bytes) {
                    held.bytes = asking;
                    held.usage_asked = true;
                }
            }
            Box::new(held)
        });
        self.planned(planned, earlier)
    }

    /// What `Policy::plan` said, as the request goes on or is answered.
    fn planned(
        &self,
        planned: Result<Plan, IdentityError>,
        earlier: Vec<Outcome>,
    ) -> Result<Option<(Layers, Vec<Outcome>)>, Answer> {
        match planned {
            Ok(Plan::Exempt) => {
                self.state.metrics.exempt.inc();
                Ok(None)
            }
            Ok(Plan::Check(layers)) if layers.is_empty() => Ok(None),
            Ok(Plan::Check(layers)) => Ok(Some((layers, earlier))),
            Err(IdentityError::MissingKey(limit)) => Err(Answer::MissingKey(limit)),
            Err(e) => Err(Answer::bad_request(e.code(), e.to_string())),
        }
    }

    /// The decision on the planned layers (`decide`), kept in the context
    /// for the phases after, and the headers it gives: the refusal, or the
    /// wait (µs) before an admitted request goes on.
    async fn decide(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        layers: Layers,
        earlier: Vec<Outcome>,
    ) -> Result<u64, Answer> {
        let runtime = ctx.runtime.clone();
        let decided = decide(&runtime.policy, &self.state.store, layers, earlier)
            .await
            .map_err(Answer::LimiterFailed)?;
        if let Some(taken_at) = decided.slots_taken_at {
            // A client that stops reading (an HTTP/2 window kept shut), or
            // sends its body by the drop, must not hold its slots for long.
            session
                .as_mut()
                .set_write_timeout(Some(self.state.header_timeout));
            let body_by = taken_at + self.state.slot_body_timeout;
            if let Some(clock) = &ctx.head_clock {
                clock.body_due_by(body_by);
            }
            if let Some(stream) = &ctx.h2_stream {
                stream.body_deadline(body_by);
            }
        }
        ctx.slots = decided.slots;
        ctx.counted = decided.reservations;
        let verdict = ctx
            .verdict
            .insert(Verdict::new(decided.outcomes, self.state.store.deciding()));
        let enforced = verdict.enforced(false);
        if let Some(refused) = headers::refusing(&enforced) {
            let mut rejection =
                headers::rejection(runtime.headers, &enforced, refused, ctx.request_id.as_str());
            traced::into_refusal_body(ctx.trace.as_deref(), &mut rejection.body);
            let grpc_message = is_grpc(session).then(|| grpc_refusal(refused));
            verdict.decisive = Some(refused.position);
            verdict.refused = true;
            return Err(Answer::Refused(rejection, grpc_message));
        }
        // An admitted request's headers advertise its rates only: a slot's
        // state (free now, a lease) is no budget to pace by. Most requests
        // hold no slot: their layers are the rates.
        let rates = if verdict.outcomes.iter().any(|o| o.concurrency) {
            verdict.enforced(true)
        } else {
            enforced
        };
        let shown = headers::most_constrained(&rates);
        if let Some(shown) = shown {
            ctx.rate_headers = headers::rate_limit_headers(runtime.headers, &rates, shown);
        }
        verdict.decisive = shown.map(|l| l.position);
        Ok(verdict.delay_us())
    }

    /// What a finished request holds is given back or charged: the
    /// reservations of limits charged by the response, its slots.
    async fn settle(&self, ctx: &mut RequestCtx, e: Option<&Error>) {
        // A request that reached the upstream but whose client hung up
        // before the answer is counted as if its status were listed:
        // otherwise hanging up at once would dodge the count. Settled
        // before the slots go, so that the next request a concurrency
        // limit lets in sees it.
        let client_left_mid_request = ctx.upstream_sent.is_some()
            && ctx.upstream_status.is_none()
            && e.is_some_and(|e| matches!(e.esource(), ErrorSource::Downstream));
        if !ctx.by_body.is_empty() {
            charges::charge_by_body(self.state.store.as_ref(), ctx, e.is_none()).await;
        }
        if !ctx.counted.is_empty() {
            let upstream_timed_out = e.is_some_and(|e| {
                matches!(e.esource(), ErrorSource::Upstream)
                    && matches!(e.etype(), ErrorType::ReadTimedout)
            });
            charges::charge_unanswered(
                self.state.store.as_ref(),
                ctx,
                ctx.upstream_sent.is_some(),
                client_left_mid_request,
                upstream_timed_out,
            )
            .await;
        }
        // Over: the upstream answered, or floodgate gave up on it (a body
        // that never came whole, the upstream's read timeout). A client
        // that left once its request was whole was kept until then; a whole
        // request whose exchange was cut all the same (its HTTP/2 connection
        // torn down by the h2 server's own defences, say against a client
        // opening more streams than it may) leaves the upstream working on
        // it, so its place and its slots stay taken for as long as the
        // upstream may work: its read timeout, counted from the request.
        let cut_whole = || {
            ctx.h2_stream
                .as_ref()
                .is_some_and(H2Stream::cut_while_whole)
        };
        if client_left_mid_request && cut_whole() {
            let sent = ctx.upstream_sent.unwrap_or(ctx.started);
            let until = sent + ctx.runtime.upstream.settings().read_timeout;
            let (permit, slots) = (ctx.stream_permit.take(), ctx.slots.take());
            tokio::spawn(async move {
                tokio::time::sleep_until(until.into()).await;
                drop(permit);
                if let Some(mut slots) = slots {
                    slots.release().await;
                }
            });
        } else if let Some(mut slots) = ctx.slots.take() {
            slots.release().await;
        }
    }

    /// The request in the metrics, its strike toward a ban, its verdict
    /// logged and on the status page's board.
    async fn count(&self, ctx: &RequestCtx, status: u16, took: Duration) {
        let requests = &self.state.metrics.requests;
        requests.finished(status).inc();
        requests.duration.observe(took.as_secs_f64());
        if let Some(upstream) = ctx.upstream_took {
            requests.upstream_duration.observe(upstream.as_secs_f64());
        }
        // Struck before it is counted: once a refusal shows in the metrics,
        // its strike is in the store.
        strikes::strike(self.state.store.as_ref(), ctx).await;
        if let Some(verdict) = &ctx.verdict {
            verdict.account(
                &ctx.runtime,
                &self.state.refusal_log,
                ctx.client.as_ref(),
                ctx.request_id.as_str(),
            );
            // The status page's board, kept only where there is a page.
            let refusing = verdict
                .decisive
                .and_then(|Position(i)| verdict.outcomes.get(i));
            if let (Some(o), Some(client), true, true) = (
                refusing,
                &ctx.client,
                verdict.refused,
                ctx.runtime.admin_token.is_some(),
            ) {
                self.state.status.refused(client, &o.name);
            }
        }
    }

    /// Writes the answer a phase gave: `true`, the upstream never touched.
    async fn answer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        answer: Answer,
    ) -> Result<bool> {
        match answer {
            Answer::BadRequest { code, reason } => bad_request(session, ctx, code, &reason).await,
            Answer::TooManyInFlight => too_many_in_flight(session, ctx).await,
            Answer::Blocked(reason) => self.block(session, ctx, reason).await,
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
            counted: Vec::new(),
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
            self.receive(session, ctx)?;
            let Some((layers, earlier)) = self.plan(session, ctx).await? else {
                return Ok(0);
            };
            if !traced::sampled(ctx) {
                return self.decide(session, ctx, layers, earlier).await;
            }
            // Boxed: only a recorded request keeps what its decision went
            // through.
            let started = SystemTime::now();
            let (decided, watched) =
                Box::pin(watch::watched(self.decide(session, ctx, layers, earlier))).await;
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
        self.answer(session, ctx, answer).await
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
        let answer = failure_answer(e);
        if matches!(e.esource(), ErrorSource::Upstream) {
            let request = session.req_header();
            warn!(
                "upstream failed: {} {} -> {} after {} attempt(s): {}",
                request.method,
                request.uri.path(),
                answer.map_or(0, |(status, _)| status),
                ctx.tries,
                e.etype().as_str()
            );
        }
        // After the answer began (an upgraded connection, a response cut
        // off), nothing more can be said on this connection.
        let answer = answer.filter(|_| session.response_written().is_none());
        let status = answer.map_or(0, |(status, _)| status);
        if let Some((status, error)) = answer {
            session.set_keepalive(None);
            let written = if is_grpc(session) && status >= 500 {
                let message = format!("the service behind the gateway is unavailable ({error})");
                respond_grpc(session, ctx, GrpcStatus::Unavailable, &message, Vec::new()).await
            } else {
                let body = format!("{{\"error\":\"{error}\"}}");
                respond(session, ctx, status, headers::json_headers(), body).await
            };
            if let Err(write_error) = written {
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
        self.settle(ctx, e).await;
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let took = ctx.started.elapsed();
        self.count(ctx, status, took).await;
        if let Some(log) = &self.state.access_log {
            log.write(access_line(session, ctx, status, took));
        }
        if ctx.trace.is_some() {
            traced::finish(ctx, session.req_header().uri.path(), status, e);
        }
    }
}
