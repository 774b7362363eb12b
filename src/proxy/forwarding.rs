//! What the upstream is told about the request: the request id, and who
//! asked (X-Forwarded-For and friends, written by floodgate alone).

use std::net::IpAddr;

use pingora::proxy::Session;
use pingora::Result;

use super::ctx::{peer_ip, RequestCtx};
use super::header_edit::HeaderEdit;
use super::request_id::RequestId;
use crate::proxy::header_name::SpelledName;
use floodgate_policy::request_id;

/// The request id a trusted proxy sent, if it is a plain one; else a new one.
pub(super) fn request_id_of(session: &Session, ctx: &RequestCtx) -> RequestId {
    let runtime = &ctx.runtime;
    let name = runtime.upstream.settings().request_id_header.name();
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
                    .is_trusted(&floodgate_policy::identity::normalize(peer_ip(session))) =>
        {
            RequestId::kept(value.clone())
        }
        _ => RequestId::new(request_id::generate()),
    }
}

/// Takes out of the upstream's request what only floodgate or a trusted
/// proxy may say: the listed client-address, scheme, host, URL and method
/// headers (`client_headers`), in any spelling, and `Forwarded` unless a
/// trusted proxy writes it; and the status page's cookie, which opens the
/// admin API to whoever reads it.
pub(super) fn strip_what_the_client_may_not_say(
    upstream_request: &mut dyn HeaderEdit,
    trusted: bool,
    ctx: &RequestCtx,
) {
    let settings = ctx.runtime.upstream.settings();
    let configured = ctx.runtime.policy.clients.forwarded_header;
    let strips = |name: &http::HeaderName| {
        if is_forwarded(name.as_str()) {
            return !(trusted
                && configured == floodgate_policy::identity::ForwardedHeader::Forwarded);
        }
        !trusted && settings.client_headers.strips(name.as_str().as_bytes())
    };
    // Most requests carry none: nothing is collected for them.
    if upstream_request.map().keys().any(strips) {
        let spoofed: Vec<http::HeaderName> = upstream_request
            .map()
            .keys()
            .filter(|name| strips(name))
            .cloned()
            .collect();
        for name in spoofed {
            upstream_request.remove(&name);
        }
    }
    if ctx.runtime.admin_token.is_some() {
        strip_admin_cookie(upstream_request);
    }
}

/// The request's cookies without the status page's.
fn strip_admin_cookie(upstream_request: &mut dyn HeaderEdit) {
    let name = crate::admin::auth::COOKIE_NAME;
    let carries = |value: &http::HeaderValue| {
        cookie_pairs(value.as_bytes()).any(|pair| is_admin_pair(pair, name))
    };
    if !upstream_request
        .map()
        .get_all(http::header::COOKIE)
        .iter()
        .any(carries)
    {
        return;
    }
    let kept: Vec<http::HeaderValue> = upstream_request
        .map()
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|value| {
            let pairs: Vec<&[u8]> = cookie_pairs(value.as_bytes())
                .filter(|pair| !is_admin_pair(pair, name))
                .collect();
            (!pairs.is_empty())
                .then(|| http::HeaderValue::from_bytes(&pairs.join(&b"; "[..])).ok())
                .flatten()
        })
        .collect();
    upstream_request.remove(&http::header::COOKIE);
    for value in kept {
        let _ = upstream_request.append(&COOKIE, value);
    }
}

fn cookie_pairs(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b';')
        .map(|pair| pair.trim_ascii())
        .filter(|pair| !pair.is_empty())
}

fn is_admin_pair(pair: &[u8], name: &str) -> bool {
    pair.split(|&b| b == b'=')
        .next()
        .is_some_and(|n| n.trim_ascii() == name.as_bytes())
}

/// X-Forwarded-For is the chain floodgate resolved (client, trusted
/// proxies, the peer), never what an untrusted client wrote; -Proto,
/// -Host and X-Real-IP are floodgate's word too, unless a trusted proxy
/// said the scheme and host (it saw the client). What the client may not
/// say is gone already (`strip_what_the_client_may_not_say`).
pub(super) fn tell_the_upstream_who_asked(
    session: &Session,
    upstream_request: &mut dyn HeaderEdit,
    ctx: &RequestCtx,
    peer: IpAddr,
) -> Result<()> {
    let (address, via): (IpAddr, &[IpAddr]) = match &ctx.client {
        Some(c) => (c.address, &c.via),
        None => (peer, &[]),
    };
    let mut real_ip = String::with_capacity(15);
    push_ip(&mut real_ip, address);
    let mut chain = real_ip.clone();
    for hop in via.iter().chain((address != peer).then_some(&peer)) {
        chain.push_str(", ");
        push_ip(&mut chain, *hop);
    }
    upstream_request.insert(&X_FORWARDED_FOR, address_value(chain)?)?;
    upstream_request.insert(&X_REAL_IP, address_value(real_ip)?)?;
    if !upstream_request
        .map()
        .contains_key(X_FORWARDED_PROTO.name())
    {
        let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        let scheme = http::HeaderValue::from_static(if tls { "https" } else { "http" });
        upstream_request.insert(&X_FORWARDED_PROTO, scheme)?;
    }
    if !upstream_request.map().contains_key(X_FORWARDED_HOST.name()) {
        let request = session.req_header();
        let host = request
            .headers
            .get(http::header::HOST)
            .cloned()
            .or_else(|| {
                request
                    .uri
                    .authority()
                    .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok())
            });
        if let Some(host) = host {
            upstream_request.insert(&X_FORWARDED_HOST, host)?;
        }
    }
    Ok(())
}

static X_FORWARDED_FOR: SpelledName =
    SpelledName::from_static("x-forwarded-for", "X-Forwarded-For");
static X_REAL_IP: SpelledName = SpelledName::from_static("x-real-ip", "X-Real-IP");
static X_FORWARDED_PROTO: SpelledName =
    SpelledName::from_static("x-forwarded-proto", "X-Forwarded-Proto");
static X_FORWARDED_HOST: SpelledName =
    SpelledName::from_static("x-forwarded-host", "X-Forwarded-Host");
pub(super) static HOST: SpelledName = SpelledName::from_static("host", "Host");
static COOKIE: SpelledName = SpelledName::from_static("cookie", "Cookie");

/// Addresses are digits, dots, colons and commas: always a header value.
fn address_value(text: String) -> Result<http::HeaderValue> {
    http::HeaderValue::try_from(text).map_err(|_| {
        pingora::Error::explain(
            pingora::ErrorType::InternalError,
            "address is no header value",
        )
    })
}

/// `ip` as text; an IPv4 address without the formatting machinery, which
/// cost as much as the header it went into.
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(digits.format(octet));
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write;
            let _ = write!(out, "{v6}");
        }
    }
}

/// `Forwarded`, in any spelling.
fn is_forwarded(name: &str) -> bool {
    name.len() == 9
        && name
            .bytes()
            .zip(b"forwarded".iter())
            .all(|(x, &y)| x.to_ascii_lowercase() == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_its_spelling_in_lower_case() {
        crate::proxy::header_name::assert_lower_case_of_spelling(&[
            &X_FORWARDED_FOR,
            &X_REAL_IP,
            &X_FORWARDED_PROTO,
            &X_FORWARDED_HOST,
            &COOKIE,
            &HOST,
        ]);
    }

    #[test]
    fn addresses_are_written_as_the_standard_library_writes_them() {
        for text in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.30.255",
            "255.255.255.255",
            "::1",
            "2001:db8::8:1",
        ] {
            let ip: IpAddr = text.parse().expect("an address");
            let mut out = String::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string());
        }
    }
}
