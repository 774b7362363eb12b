//! The Pingora `ProxyHttp` implementation: phase hooks only, no arithmetic.
//!
//! ```text
//! (connection)     caps and head deadlines: see `connection`
//! request_filter   strict framing: a Content-Length list, CL with TE, no Host: 400
//!                  canonical path (the upstream gets it too)
//!                  identify -> plan layers -> one limiter call
//!                  refused: 429 written here, upstream never touched
//!                  leaky bucket: wait for the slot, then go on
//! upstream_peer    round robin over [upstream].servers, each server at most
//!                  once per request (fail_to_connect decides the retry)
//! upstream_request_filter  Host for HTTP/1.0 requests that had none
//! response_filter  rate-limit headers of the most constrained layer
//! fail_to_proxy    upstream down or slow: 502 / 504 with a JSON body, one
//!                  warn line per failed request (Pingora's own are off: they
//!                  carry query strings)
//! logging          the connection's head clock starts again
//! ```

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use log::{debug, info, warn};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::HttpModules;
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};

use crate::algorithm::Decision;
use crate::connection::HeadClock;
use crate::headers::{self, Layer};
use crate::identity::Client;
use crate::limiter::{Check, Deciding, LimiterError};
use crate::path::{self, EscapedSlashes, PathError};
use crate::policy::{Plan, RequestView};
use crate::request_id;
use crate::state::{AppState, InFlight, Runtime};

pub struct Gateway {
    state: Arc<AppState>,
}

impl Gateway {
    pub fn new(state: Arc<AppState>) -> Self {
        Gateway { state }
    }

    /// The request id a trusted proxy sent, if it is a plain one; else a new one.
    fn request_id_of(&self, session: &Session, ctx: &RequestCtx) -> String {
        let runtime = &ctx.runtime;
        let name = &runtime.upstream.settings().request_id_header;
        // A proxy that adds its own id appends it: the last one is the proxy's.
        match session
            .req_header()
            .headers
            .get_all(name)
            .iter()
            .next_back()
        {
            Some(value)
                if request_id::acceptable(value.as_bytes())
                    && runtime
                        .policy
                        .clients
                        .is_trusted(&crate::identity::normalize(peer_ip(session))) =>
            {
                String::from_utf8_lossy(value.as_bytes()).into_owned()
            }
            _ => request_id::generate(),
        }
    }

    /// X-Forwarded-For is the chain floodgate resolved (client, trusted
    /// proxies, the peer), never what an untrusted client wrote; -Proto,
    /// -Host and X-Real-IP are floodgate's word too. A client's own
    /// `Forwarded` goes upstream only from a trusted proxy.
    fn tell_the_upstream_who_asked(
        &self,
        session: &Session,
        upstream_request: &mut pingora::http::RequestHeader,
        ctx: &RequestCtx,
    ) -> Result<()> {
        let peer = crate::identity::normalize(peer_ip(session));
        let (address, via): (IpAddr, &[IpAddr]) = match &ctx.client {
            Some(c) => (c.address, &c.via),
            None => (peer, &[]),
        };
        let clients = &ctx.runtime.policy.clients;
        let trusted = clients.is_trusted(&peer);
        // What a trusted proxy said of the scheme and host stands (it saw
        // the client); anyone else's word is replaced.
        let kept = |name: &str| {
            trusted
                .then(|| upstream_request.headers.get(name).cloned())
                .flatten()
        };
        let (proto, host) = (kept("x-forwarded-proto"), kept("x-forwarded-host"));
        // Every header an application might read as the client's address
        // or scheme, in any spelling (CGI and WSGI read `_` as `-`), goes;
        // floodgate writes its own below.
        let spoofable: Vec<http::HeaderName> = upstream_request
            .headers
            .keys()
            .filter(|name| is_forwarding_header(name.as_str(), trusted, clients.forwarded_header))
            .cloned()
            .collect();
        for name in spoofable {
            upstream_request.remove_header(&name);
        }
        let mut chain = address.to_string();
        for hop in via.iter().chain((address != peer).then_some(&peer)) {
            chain.push_str(", ");
            chain.push_str(&hop.to_string());
        }
        upstream_request.insert_header("X-Forwarded-For", chain)?;
        upstream_request.insert_header("X-Real-IP", address.to_string())?;
        let proto = proto.unwrap_or_else(|| {
            let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
            http::HeaderValue::from_static(if tls { "https" } else { "http" })
        });
        upstream_request.insert_header("X-Forwarded-Proto", proto)?;
        let request = session.req_header();
        let host = host
            .or_else(|| request.headers.get(http::header::HOST).cloned())
            .or_else(|| {
                request
                    .uri
                    .authority()
                    .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok())
            });
        if let Some(host) = host {
            upstream_request.insert_header("X-Forwarded-Host", host)?;
        }
        Ok(())
    }
}

pub struct RequestCtx {
    runtime: Arc<Runtime>,
    /// Kept from a trusted proxy or generated; every answer carries it.
    request_id: String,
    /// Who asked, once identified: the upstream is told.
    client: Option<Client>,
    /// The connection's head deadline (see `connection`).
    head_clock: Option<Arc<HeadClock>>,
    /// An HTTP/2 request's place under the per-address cap, for its lifetime.
    _stream_permit: Option<crate::connection::StreamPermit>,
    /// Upstream servers tried so far, and where the round started.
    tries: usize,
    first_server: usize,
    /// For the access log and the duration metrics.
    started: Instant,
    /// Body bytes received so far (HTTP/2: its pace is checked here).
    body_bytes: u64,
    upstream_sent: Option<Instant>,
    upstream_took: Option<Duration>,
    /// What the limits said, once decided.
    verdict: Option<Verdict>,
    /// Rate-limit headers to add to the upstream's response.
    rate_headers: Vec<(&'static str, String)>,
    _in_flight: InFlight,
}

fn peer_ip(session: &Session) -> IpAddr {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip())
}

/// A body the client is still sending would be left unread by an early
/// answer, so the connection cannot be reused after it.
fn request_has_body(session: &Session) -> bool {
    let headers = &session.req_header().headers;
    headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

async fn respond(
    session: &mut Session,
    ctx: &RequestCtx,
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
) -> Result<()> {
    let mut header = ResponseHeader::build(status, Some(headers.len() + 2))?;
    // Owned values become header values without a copy.
    for (name, value) in headers {
        header.insert_header(name, value)?;
    }
    header.insert_header("Content-Length", body.len().to_string())?;
    add_request_id(&mut header, ctx)?;
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

fn add_request_id(header: &mut ResponseHeader, ctx: &RequestCtx) -> Result<()> {
    if !ctx.request_id.is_empty() {
        let name = ctx
            .runtime
            .upstream
            .settings()
            .request_id_header_spelling
            .clone();
        header.insert_header(name, ctx.request_id.as_str())?;
    }
    Ok(())
}

/// A gRPC call (`application/grpc`, `application/grpc+proto`, ...) over
/// HTTP/2: its client reads the outcome from `grpc-status` in the trailers,
/// not from the HTTP status. gRPC-Web and HTTP/1.1 (which has no trailers
/// here) get the ordinary answers.
fn is_grpc(session: &Session) -> bool {
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
    headers: Vec<(&'static str, String)>,
) -> Result<()> {
    let mut header = ResponseHeader::build(200, Some(headers.len() + 2))?;
    header.insert_header("Content-Type", "application/grpc")?;
    for (name, value) in headers {
        header.insert_header(name, value)?;
    }
    add_request_id(&mut header, ctx)?;
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

/// Rewrites the request target to its canonical path, the query kept as it
/// came: what the limits match is what the upstream receives.
fn canonicalise_target(
    request: &mut RequestHeader,
    escaped: EscapedSlashes,
) -> Result<(), PathError> {
    let raw = request.raw_path();
    let origin_form = raw.first() == Some(&b'/');
    let (path, query) = if origin_form {
        match raw.iter().position(|&b| b == b'?') {
            Some(at) => (&raw[..at], Some(&raw[at + 1..])),
            None => (raw, None),
        }
    } else if raw == b"*" && request.method == http::Method::OPTIONS {
        // `OPTIONS *`: the server itself, no path to speak of.
        return Ok(());
    } else if !is_absolute_form(raw) {
        return Err(PathError::NotAbsolute);
    } else {
        // Absolute-form: the URI holds the path component alone.
        let uri = &request.uri;
        (uri.path().as_bytes(), uri.query().map(str::as_bytes))
    };
    let canonical = path::normalize(path, escaped)?;
    if origin_form && matches!(canonical, Cow::Borrowed(_)) {
        return Ok(());
    }
    let mut target = canonical.into_owned().into_bytes();
    if let Some(query) = query {
        target.push(b'?');
        target.extend_from_slice(query);
    }
    let uri = http::Uri::from_maybe_shared(Bytes::from(target)).map_err(|_| PathError::BadQuery)?;
    request.set_uri(uri);
    Ok(())
}

/// What makes a request's framing ambiguous, if anything: a list of
/// Content-Length values (even equal ones), Content-Length beside
/// Transfer-Encoding, or an HTTP/1.1 request without Host. Such a request is
/// never forwarded: a server behind may frame it differently.
fn framing_problem(session: &Session) -> Option<(&'static str, &'static str)> {
    let request = session.req_header();
    let headers = &request.headers;
    let lengths = headers.get_all(http::header::CONTENT_LENGTH);
    if lengths.iter().count() > 1 || lengths.iter().any(|v| v.as_bytes().contains(&b',')) {
        return Some(("bad_content_length", "more than one Content-Length value"));
    }
    // Pingora drops Content-Length when Transfer-Encoding is present; the
    // raw head still shows it.
    if headers.contains_key(http::header::TRANSFER_ENCODING)
        && session.as_http1().is_some_and(|h1| {
            h1.get_headers_raw_bytes()
                .split(|&b| b == b'\n')
                .any(|line| line.len() > 15 && line[..15].eq_ignore_ascii_case(b"content-length:"))
        })
    {
        return Some((
            "conflicting_framing",
            "both Content-Length and Transfer-Encoding",
        ));
    }
    if request.version == http::Version::HTTP_11 && !headers.contains_key(http::header::HOST) {
        return Some(("missing_host", "an HTTP/1.1 request needs a Host header"));
    }
    None
}

/// `http://host/path` or `https://...`: the only other form a request
/// target may take here (authority-form is CONNECT's, which is not proxied).
fn is_absolute_form(target: &[u8]) -> bool {
    let scheme_of = |prefix: &[u8]| {
        target.len() > prefix.len() && target[..prefix.len()].eq_ignore_ascii_case(prefix)
    };
    scheme_of(b"http://") || scheme_of(b"https://")
}

/// 400 with `{"error":"<code>","reason":"<reason>"}`; `reason` is our own
/// text, never the client's.
async fn bad_request(
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

/// What the limits said of one request: kept until the logging phase,
/// which counts it and logs refusals once the answer is out.
struct Verdict {
    checks: Vec<Check>,
    decisions: Vec<Decision>,
    deciding: Deciding,
    /// The check whose state the answer reported (the refusing one on a
    /// refusal), and whether the request was refused.
    decisive: Option<usize>,
    refused: bool,
}

impl Verdict {
    fn new(checks: Vec<Check>, decisions: Vec<Decision>, deciding: Deciding) -> Verdict {
        Verdict {
            checks,
            decisions,
            deciding,
            decisive: None,
            refused: false,
        }
    }

    /// The enforcing layers (shadow ones never show) with their decisions.
    fn enforced(&self) -> Vec<Layer<'_>> {
        self.checks
            .iter()
            .zip(&self.decisions)
            .enumerate()
            .filter(|(_, (c, _))| !c.shadow)
            .map(|(layer, (c, d))| Layer {
                layer,
                name: c.name.as_str(),
                algorithm: c.algorithm,
                decision: *d,
            })
            .collect()
    }

    /// The decisive limit's name and what it had left, for the access log.
    fn decisive(&self) -> Option<(&str, u64)> {
        let i = self.decisive?;
        Some((self.checks[i].name.as_str(), self.decisions[i].remaining()))
    }

    /// Counts each layer's outcome; logs a refusal, and what a shadow limit
    /// would have refused, one line each.
    fn account(&self, runtime: &Runtime, client: Option<&Client>, request_id: &str) {
        let label = client.map_or_else(String::new, Client::log_label);
        for (check, decision) in self.checks.iter().zip(&self.decisions) {
            let counters = &runtime.counters[check.layer];
            match (check.shadow, decision.allowed(), self.refused) {
                (true, false, _) => counters.shadow_refused.inc(),
                (false, false, _) => counters.refused.inc(),
                (_, true, false) => {
                    counters.admitted.inc();
                    if decision.remaining().saturating_mul(10) < decision.limit() {
                        counters.near_limit.inc();
                    }
                }
                // Admitted by this layer, refused by another: not charged.
                (_, true, true) => {}
            }
            if check.shadow && !decision.allowed() {
                info!(
                    "shadow limit would refuse: {label} limit={} retry_after_ms={}",
                    check.name,
                    headers::ceil_ms(decision.retry_after_us())
                );
            }
        }
        if let Some(i) = self.decisive.filter(|_| self.refused) {
            let decision = &self.decisions[i];
            info!(
                "rate limited: {label} limit={} retry_after_ms={}{} request_id={request_id}",
                self.checks[i].name,
                headers::ceil_ms(decision.retry_after_us()),
                if decision.cost_exceeds_limit() {
                    " (cost exceeds the limit)"
                } else {
                    ""
                },
            );
        }
    }
}

/// What a gRPC client is told when a limit refuses it.
fn grpc_refusal(refused: &Layer<'_>) -> String {
    if refused.decision.cost_exceeds_limit() {
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

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

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

    /// The response is over, on every path: metrics, the access log line,
    /// and the connection idles until the next head.
    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut Self::CTX) {
        if let Some(clock) = &ctx.head_clock {
            clock.await_next_head();
        }
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let took = ctx.started.elapsed();
        let requests = &self.state.metrics.requests;
        requests.finished(status).inc();
        requests.duration.observe(took.as_secs_f64());
        if let Some(upstream) = ctx.upstream_took {
            requests.upstream_duration.observe(upstream.as_secs_f64());
        }
        if let Some(verdict) = &ctx.verdict {
            verdict.account(&ctx.runtime, ctx.client.as_ref(), &ctx.request_id);
        }
        if let Some(log) = &self.state.access_log {
            log.write(access_line(session, ctx, status, took));
        }
    }

    fn new_ctx(&self) -> Self::CTX {
        RequestCtx {
            runtime: self.state.runtime.load_full(),
            request_id: String::new(),
            client: None,
            head_clock: None,
            _stream_permit: None,
            tries: 0,
            first_server: 0,
            started: Instant::now(),
            body_bytes: 0,
            upstream_sent: None,
            upstream_took: None,
            verdict: None,
            rate_headers: Vec::new(),
            _in_flight: self.state.request_started(),
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        // Requests that arrive before the previous answer are kept and
        // answered in order, each decided on its own.
        session.set_pipelining_enabled(true);
        ctx.request_id = self.request_id_of(session, ctx);
        if let Some((code, reason)) = framing_problem(session) {
            return bad_request(session, ctx, code, reason).await;
        }
        if session.req_header().version == http::Version::HTTP_2 {
            let peer = peer_ip(session);
            if let Some(group) = ctx.runtime.policy.clients.connection_group(peer) {
                match self.state.streams.admit(group) {
                    Some(permit) => ctx._stream_permit = Some(permit),
                    None => return too_many_in_flight(session, ctx).await,
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
        let runtime = ctx.runtime.clone();
        let policy = &runtime.policy;
        if let Err(e) = canonicalise_target(session.req_header_mut(), policy.paths.escaped_slashes)
        {
            return bad_request(session, ctx, e.code(), &e.to_string()).await;
        }
        let request = session.req_header();
        let client = match policy.clients.identify(peer_ip(session), &request.headers) {
            Ok(client) => ctx.client.insert(client),
            Err(e) => return bad_request(session, ctx, e.code(), &e.to_string()).await,
        };
        let path = request.uri.path();
        let path = if policy.paths.case_insensitive {
            Cow::Owned(path.to_ascii_lowercase())
        } else {
            Cow::Borrowed(path)
        };
        let view = RequestView {
            method: &request.method,
            path: &path,
            headers: &request.headers,
            client,
        };
        let checks = match policy.plan(&view) {
            Ok(Plan::Exempt) => {
                self.state.metrics.exempt.inc();
                return Ok(false);
            }
            Ok(Plan::Check(checks)) if checks.is_empty() => return Ok(false),
            Ok(Plan::Check(checks)) => checks,
            Err(e) => return bad_request(session, ctx, e.code(), &e.to_string()).await,
        };
        let decisions = match self.state.store.decide(&checks).await {
            Ok(d) => d,
            Err(e) => return limiter_failed(session, ctx, e).await,
        };
        let verdict =
            ctx.verdict
                .insert(Verdict::new(checks, decisions, self.state.store.deciding()));
        let enforced = verdict.enforced();
        let (decisive, refusal) = match headers::refusing(&enforced) {
            Some(refused) => {
                let r = headers::rejection(runtime.headers, &enforced, refused, &ctx.request_id);
                let grpc_message = is_grpc(session).then(|| grpc_refusal(refused));
                (Some(refused.layer), Some((r, grpc_message)))
            }
            None => {
                let shown = headers::most_constrained(&enforced);
                if let Some(shown) = shown {
                    ctx.rate_headers =
                        headers::rate_limit_headers(runtime.headers, &enforced, shown);
                }
                (shown.map(|l| l.layer), None)
            }
        };
        verdict.decisive = decisive;
        verdict.refused = refusal.is_some();
        let delay_us = verdict.decisions.iter().map(Decision::delay_us).max();
        match refusal {
            Some((r, Some(grpc_message))) => {
                let headers = r
                    .headers
                    .into_iter()
                    .filter(|(name, _)| *name != "Content-Type")
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
            Some((r, None)) => {
                respond(session, ctx, r.status, r.headers, r.body).await?;
                Ok(true)
            }
            None => {
                if let Some(delay_us) = delay_us.filter(|d| *d > 0) {
                    tokio::time::sleep(Duration::from_micros(delay_us)).await;
                }
                Ok(false)
            }
        }
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if end_of_stream {
            if let Some(clock) = &ctx.head_clock {
                clock.body_arrived();
            }
        }
        // HTTP/1 bodies are paced by the connection's clock; an HTTP/2
        // stream's body is held to the same floor here, as its data comes.
        // Not a gRPC stream's: a client-streaming call may rightly send a
        // message a minute for an hour.
        if session.req_header().version == http::Version::HTTP_2
            && !end_of_stream
            && !is_grpc(session)
        {
            ctx.body_bytes += body.as_ref().map_or(0, |b| b.len() as u64);
            let allowed = self.state.header_timeout
                + Duration::from_secs(ctx.body_bytes / crate::connection::MIN_BODY_RATE);
            if ctx.started.elapsed() > allowed {
                self.state.metrics.connections.idle_timeouts.inc();
                return Error::e_explain(
                    ErrorType::ReadTimedout,
                    "the request body came slower than 1 KiB/s",
                );
            }
        }
        Ok(())
    }

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

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut pingora::http::RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let settings = ctx.runtime.upstream.settings();
        if settings.forwarded_headers {
            self.tell_the_upstream_who_asked(session, upstream_request, ctx)?;
        }
        if let Some(host) = &settings.host {
            upstream_request.insert_header(http::header::HOST, host.clone())?;
        } else if !upstream_request.headers.contains_key(http::header::HOST)
            && session.req_header().version == http::Version::HTTP_10
        {
            // HTTP/1.0 allows no Host; the upstream (spoken to in HTTP/1.1) gets one.
            let server = ctx.first_server + ctx.tries.saturating_sub(1);
            upstream_request
                .insert_header(http::header::HOST, ctx.runtime.upstream.host(server))?;
        }
        if !ctx.request_id.is_empty() {
            upstream_request.insert_header(
                settings.request_id_header_spelling.clone(),
                ctx.request_id.as_str(),
            )?;
        }
        ctx.upstream_sent = Some(Instant::now());
        Ok(())
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

    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        _ctx: &Self::CTX,
        _error: &Error,
        _context: pingora::proxy::ProxyWarnLogContext,
    ) -> bool {
        true
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

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        ctx.upstream_took = ctx.upstream_sent.map(|sent| sent.elapsed());
        for (name, value) in ctx.rate_headers.drain(..) {
            upstream_response.insert_header(name, value)?;
        }
        add_request_id(upstream_response, ctx)?;
        Ok(())
    }

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

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
    ) -> FailToProxy {
        let (status, error) = match (e.esource(), e.etype()) {
            (_, ErrorType::HTTPStatus(code)) => (*code, "bad_request"),
            (ErrorSource::Upstream, ErrorType::ReadTimedout | ErrorType::ConnectTimedout) => {
                (504, "upstream_timeout")
            }
            (ErrorSource::Upstream, _) => (502, "upstream_unavailable"),
            // The client went away or broke its stream: nobody to answer.
            (
                ErrorSource::Downstream,
                ErrorType::WriteError
                | ErrorType::ReadError
                | ErrorType::ConnectionClosed
                | ErrorType::H2Error,
            ) => (0, ""),
            (ErrorSource::Downstream, _) => (400, "bad_request"),
            _ => (500, "internal_error"),
        };
        if matches!(e.esource(), ErrorSource::Upstream) {
            let request = session.req_header();
            warn!(
                "upstream failed: {} {} -> {status} after {} attempt(s): {}",
                request.method,
                request.uri.path(),
                ctx.tries,
                e.etype().as_str()
            );
        }
        // After the answer began (an upgraded connection, a response cut
        // off), nothing more can be said on this connection.
        let status = if session.response_written().is_some() {
            0
        } else {
            status
        };
        if status > 0 {
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
}

/// Headers that claim the client's address, scheme or host: floodgate's to
/// write. `Forwarded` stays only from a trusted proxy that writes it (the
/// configured forwarding header). Names compare with `_` read as `-`.
fn is_forwarding_header(
    name: &str,
    trusted: bool,
    configured: crate::identity::ForwardedHeader,
) -> bool {
    const OWNED: [&str; 11] = [
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-forwarded-port",
        "x-forwarded-ssl",
        "x-forwarded-scheme",
        "x-forwarded-server",
        "x-real-ip",
        "true-client-ip",
        "x-client-ip",
        "x-cluster-client-ip",
    ];
    let same = |a: &str, b: &str| {
        a.len() == b.len()
            && a.bytes().zip(b.bytes()).all(|(x, y)| {
                let x = if x == b'_' {
                    b'-'
                } else {
                    x.to_ascii_lowercase()
                };
                x == y
            })
    };
    if same(name, "forwarded") {
        return !(trusted && configured == crate::identity::ForwardedHeader::Forwarded);
    }
    OWNED.iter().any(|owned| same(name, owned))
}

/// One access log line: JSON, no query string, no key, no header value;
/// the client by address and a short keyed hash of its identity.
fn access_line(session: &Session, ctx: &RequestCtx, status: u16, took: Duration) -> String {
    use crate::access_log::{json_string, now_rfc3339};
    use std::fmt::Write;
    let request = session.req_header();
    let mut line = String::with_capacity(320);
    line.push_str("{\"time\":");
    json_string(&mut line, &now_rfc3339());
    line.push_str(",\"request_id\":");
    json_string(&mut line, &ctx.request_id);
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
    line.push('}');
    line
}

/// An address with as many HTTP/2 requests in flight as it may hold
/// connections: this one waits its turn.
async fn too_many_in_flight(session: &mut Session, ctx: &RequestCtx) -> Result<bool> {
    debug!(
        "429 too many requests in flight request_id={}",
        ctx.request_id
    );
    let mut headers = headers::json_headers();
    headers.push(("Retry-After", "1".to_string()));
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

/// A limiter that cannot decide and has no fallback (the Redis store is
/// always wrapped in one) refuses with 503 rather than guessing.
async fn limiter_failed(session: &mut Session, ctx: &RequestCtx, e: LimiterError) -> Result<bool> {
    warn!("limiter failed: {e} request_id={}", ctx.request_id);
    let mut headers = headers::json_headers();
    headers.push(("Retry-After", "1".to_string()));
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
