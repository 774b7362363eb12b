//! What the upstream is told about the request: the request id, and who
//! asked (X-Forwarded-For and friends, written by floodgate alone).

use std::net::IpAddr;

use pingora::proxy::Session;
use pingora::Result;

use super::ctx::{peer_ip, RequestCtx};
use crate::request_id;

/// The request id a trusted proxy sent, if it is a plain one; else a new one.
pub(super) fn request_id_of(session: &Session, ctx: &RequestCtx) -> String {
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
pub(super) fn tell_the_upstream_who_asked(
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

/// Headers that claim the client's address, scheme or host: floodgate's to
/// write. `Forwarded` stays only from a trusted proxy that writes it (the
/// configured forwarding header). Names compare with `_` read as `-`.
pub(super) fn is_forwarding_header(
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
