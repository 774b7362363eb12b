//! Who is asking and which layers their request meets: the request's view
//! for the limits, the `[block]` and token checks on the way, the body read
//! where a limit wants it, and `Policy::plan`'s answer.

use std::borrow::Cow;

use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};

use super::answer::Answer;
use super::ctx::{peer_ip, HeldBody, RequestCtx};
use super::decide::{ban_refusals, refused};
use super::request_body::{ask_for_usage_where_wanted, read_before_decision, BodyReadError};
use super::verdict::Outcome;
use crate::server::state::AppState;
use floodgate_policy::identity::{normalize_host, Client, IdentityError};
use floodgate_policy::jwt::TokenCheck;
use floodgate_policy::{Layers, Plan, Policy, RequestView};

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
pub(super) fn protection_rank(
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

/// What the request's token comes to: remembered, refused before, or
/// checked now. A signature is checked only after the cheaper refusal:
/// an address that a limit bans gets the ban (`Err`, its refusals)
/// without one.
async fn token_of(
    state: &AppState,
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
        if let Ok(decisions) = state.store.peek(&bans).await {
            let banned = ban_refusals(policy, bans.into_iter().zip(decisions));
            if !banned.is_empty() {
                return Err(banned);
            }
        }
    }
    Ok(jwt.verify_fresh(token, client.ip, now_s))
}

/// Who is asking and which layers their request meets (none: it goes
/// straight on), with the refusals already found on the way (a ban
/// looked up before a token's signature is checked).
pub(super) async fn plan_request(
    state: &AppState,
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
        match token_of(state, policy, client, &request.headers).await {
            Ok(token) => {
                state.metrics.tokens.count(&token);
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
        return as_planned(state, policy.plan(&view), earlier);
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
    as_planned(state, planned, earlier)
}

/// What `Policy::plan` said, as the request goes on or is answered.
fn as_planned(
    state: &AppState,
    planned: Result<Plan, IdentityError>,
    earlier: Vec<Outcome>,
) -> Result<Option<(Layers, Vec<Outcome>)>, Answer> {
    match planned {
        Ok(Plan::Exempt) => {
            state.metrics.exempt.inc();
            Ok(None)
        }
        Ok(Plan::Check(layers)) if layers.is_empty() => Ok(None),
        Ok(Plan::Check(layers)) => Ok(Some((layers, earlier))),
        Err(IdentityError::MissingKey(limit)) => Err(Answer::MissingKey(limit)),
        Err(e) => Err(Answer::bad_request(e.code(), e.to_string())),
    }
}
