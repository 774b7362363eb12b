//! `[upstream]`: where requests go, with which timeouts and headers.

use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::file::UpstreamSection;
use super::{at, duration, Inputs, Invalid};
use crate::proxy::client_headers::{self, ClientHeaders};
use crate::proxy::header_name::SpelledName;
use crate::proxy::upstream::UpstreamSettings;
use floodgate_policy::PathPattern;

pub(super) fn validate_upstream(
    u: &UpstreamSection,
    inputs: &Inputs,
) -> Result<UpstreamSettings, Invalid> {
    check_servers(u)?;
    let (connect_timeout, read_timeout) = timeouts(u)?;
    let sni = sni(u);
    check_ca_file(u, inputs)?;
    let request_id_header = request_id_header(u)?;
    let host = host(u)?;
    let websocket_idle_timeout = duration(
        &u.websocket_idle_timeout,
        Duration::from_secs(3600),
        &[&"upstream", &"websocket_idle_timeout"],
    )?;
    let client_headers = client_headers(u)?;
    Ok(UpstreamSettings {
        servers: u.servers.clone(),
        connect_timeout,
        read_timeout,
        tls: u.tls,
        sni,
        ca_file: u.ca_file.clone(),
        forwarded_headers: u.forwarded_headers.unwrap_or(true),
        request_id_header,
        preserve_header_case: u.preserve_header_case,
        host,
        http2: u.http2,
        websocket_idle_timeout,
        client_headers,
        // Compiled with the other path patterns (`compile_grpc_paths`).
        grpc_paths: Vec::new(),
    })
}

/// `servers`: at least one, each a `host:port`.
fn check_servers(u: &UpstreamSection) -> Result<(), Invalid> {
    if u.servers.is_empty() {
        return Err(at(&[&"upstream", &"servers"], "needs at least one server"));
    }
    for (i, s) in u.servers.iter().enumerate() {
        let port_ok = s
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(at(
                &[&"upstream", &"servers", &i],
                format!("\"{s}\" is not host:port (e.g. \"127.0.0.1:8000\")"),
            ));
        }
    }
    Ok(())
}

/// `connect_timeout` and `read_timeout`, in that order.
fn timeouts(u: &UpstreamSection) -> Result<(Duration, Duration), Invalid> {
    let connect_timeout = duration(
        &u.connect_timeout,
        Duration::from_secs(1),
        &[&"upstream", &"connect_timeout"],
    )?;
    let read_timeout = duration(
        &u.read_timeout,
        Duration::from_secs(30),
        &[&"upstream", &"read_timeout"],
    )?;
    for (key, d) in [
        ("connect_timeout", connect_timeout),
        ("read_timeout", read_timeout),
    ] {
        if d.is_zero() {
            return Err(at(&[&"upstream", &key], "must be longer than 0"));
        }
    }
    Ok((connect_timeout, read_timeout))
}

/// `sni`, else the first server's host: the name its certificate is
/// likeliest to carry.
fn sni(u: &UpstreamSection) -> String {
    match &u.sni {
        Some(s) => s.clone(),
        None => u.servers[0]
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
            .unwrap_or_default(),
    }
}

fn check_ca_file(u: &UpstreamSection, inputs: &Inputs) -> Result<(), Invalid> {
    if let Some(file) = &u.ca_file {
        if !u.tls {
            return Err(at(
                &[&"upstream", &"ca_file"],
                "applies only with tls = true",
            ));
        }
        if let Err(e) = inputs.check(file) {
            return Err(at(
                &[&"upstream", &"ca_file"],
                format!("cannot read {}: {e}", file.display()),
            ));
        }
    }
    Ok(())
}

fn request_id_header(u: &UpstreamSection) -> Result<SpelledName, Invalid> {
    let spelling = u
        .request_id_header
        .clone()
        .unwrap_or_else(|| "X-Request-Id".into());
    let request_id_header = SpelledName::new(&spelling).map_err(|_| {
        at(
            &[&"upstream", &"request_id_header"],
            format!("\"{spelling}\" is not a valid header name"),
        )
    })?;
    // Headers that frame the request or say who the client is cannot carry an id.
    let reserved = |name: &str| {
        FRAMING.contains(&name) || ["x-forwarded-for", "x-real-ip", "forwarded"].contains(&name)
    };
    if reserved(request_id_header.name().as_str()) {
        return Err(at(
            &[&"upstream", &"request_id_header"],
            format!("\"{spelling}\" already means something else; name a header of its own, e.g. \"X-Request-Id\""),
        ));
    }
    Ok(request_id_header)
}

fn host(u: &UpstreamSection) -> Result<Option<HeaderValue>, Invalid> {
    u.host
        .as_deref()
        .map(|h| {
            HeaderValue::from_str(h)
                .ok()
                .filter(|_| !h.is_empty() && !h.contains(char::is_whitespace))
                .ok_or_else(|| at(&[&"upstream", &"host"], format!("\"{h}\" is not a host")))
        })
        .transpose()
}

/// `grpc_paths`, compiled as every path pattern is.
pub(super) fn compile_grpc_paths(
    u: &UpstreamSection,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Vec<PathPattern>, Invalid> {
    u.grpc_paths
        .iter()
        .enumerate()
        .map(|(i, p)| compile_pattern(p).map_err(|m| at(&[&"upstream", &"grpc_paths", &i], m)))
        .collect()
}

/// The headers that frame a request: the upstream cannot do without them,
/// and they mean nothing else.
const FRAMING: [&str; 7] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "expect",
];

/// `strip_headers` and `keep_headers`: valid names; nothing that frames
/// the request stripped; only listed names kept (a name that is not on the
/// list is kept anyway, so naming one is a mistake worth hearing of).
fn client_headers(u: &UpstreamSection) -> Result<ClientHeaders, Invalid> {
    for (i, name) in u.strip_headers.iter().enumerate() {
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(at(
                &[&"upstream", &"strip_headers", &i],
                format!("\"{name}\" is not a valid header name"),
            ));
        }
        if FRAMING.contains(&client_headers::canonical(name).as_str()) {
            return Err(at(
                &[&"upstream", &"strip_headers", &i],
                format!("\"{name}\" frames the request; the upstream cannot do without it"),
            ));
        }
    }
    for (i, name) in u.keep_headers.iter().enumerate() {
        if !client_headers::is_listed(name) {
            return Err(at(
                &[&"upstream", &"keep_headers", &i],
                format!("\"{name}\" is not a header floodgate removes, so there is nothing to keep (see the list in docs/book/edge.md)"),
            ));
        }
    }
    Ok(ClientHeaders::new(&u.strip_headers, &u.keep_headers))
}
