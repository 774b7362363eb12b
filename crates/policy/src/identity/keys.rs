//! What a limit's key reads from a request: the sources a key may name
//! (`ip`, `header:`, `cookie:`, `query:`, `host`, `route`, `jwt:`, and
//! composites of them), and the parsing of cookies, query strings and hosts
//! they need.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName};

use super::error::IdentityError;
use crate::body::BodyFields;
use crate::jwt::ClaimPath;

/// What identifies the client for one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The client's address (`ip`), IPv6 grouped by `ipv6_prefix`.
    Ip,
    /// The client's listed API key (`api_key`); an unlisted key is no key.
    ApiKey,
    /// A header's value as sent (`header:<Name>`); two values are a 400.
    Header(HeaderName),
    /// Everyone at once (`global`): one budget for all requests.
    Global,
    /// A cookie's value (`cookie:<name>`).
    Cookie(Box<str>),
    /// A query parameter's value, percent-decoded (`query:<name>`).
    Query(Box<str>),
    /// The host asked for, without port, lower case.
    Host,
    /// The path pattern of the limit that matched (in a composite key):
    /// /users/1 and /users/2 are one route under `/users/*`.
    Route,
    /// A claim of the verified token (`jwt:sub`, `jwt:org.id`).
    Jwt(ClaimPath),
    /// The value of one entry of a rate limit service descriptor
    /// (`descriptor:<key>`).
    Entry(Box<str>),
    /// A top-level field of the request's JSON body (`body:<field>`).
    Body(Box<str>),
    /// Every entry of the descriptor, keys and values (`descriptor`): each
    /// combination its own budget, as envoyproxy/ratelimit keys them.
    Descriptor,
    /// Several of the above, all of which must be present.
    Composite(Vec<KeySource>),
}

impl KeySource {
    /// The key as the configuration spells it (`ip`, `header:x-tenant`,
    /// `[jwt:sub, route]`), for logs, metrics and `floodgate check`.
    pub fn describe(&self) -> String {
        match self {
            KeySource::Ip => "ip".into(),
            KeySource::ApiKey => "api_key".into(),
            KeySource::Header(h) => format!("header:{h}"),
            KeySource::Global => "global".into(),
            KeySource::Cookie(name) => format!("cookie:{name}"),
            KeySource::Query(name) => format!("query:{name}"),
            KeySource::Host => "host".into(),
            KeySource::Route => "route".into(),
            KeySource::Jwt(path) => format!("jwt:{}", path.describe()),
            KeySource::Entry(key) => format!("descriptor:{key}"),
            KeySource::Body(field) => format!("body:{field}"),
            KeySource::Descriptor => "descriptor".into(),
            KeySource::Composite(parts) => {
                let parts: Vec<String> = parts.iter().map(KeySource::describe).collect();
                format!("[{}]", parts.join(", "))
            }
        }
    }

    /// Whether a client may leave this key out (a composite: any part).
    pub fn omittable(&self) -> bool {
        self.any_part(|part| {
            matches!(
                part,
                KeySource::Header(_)
                    | KeySource::Cookie(_)
                    | KeySource::Query(_)
                    | KeySource::ApiKey
                    | KeySource::Jwt(_)
                    | KeySource::Body(_)
            )
        })
    }

    /// Whether the key tells one client from another (a composite: some
    /// part does); `global`, `host` and `route` are everyone's.
    pub fn per_client(&self) -> bool {
        self.any_part(|part| {
            !matches!(part, KeySource::Global | KeySource::Host | KeySource::Route)
        })
    }

    /// Whether some part of the key says who the client is in a way the
    /// client cannot choose for someone else: its address, a listed API
    /// key (a secret), a verified claim. Header, cookie and query values
    /// are anyone's to send.
    pub fn unforgeable(&self) -> bool {
        self.any_part(|part| matches!(part, KeySource::Ip | KeySource::ApiKey | KeySource::Jwt(_)))
    }

    /// Whether the key reads a rate limit service descriptor (some part of
    /// it does; then every part does, as validation has it).
    pub fn reads_descriptor(&self) -> bool {
        self.any_part(|p| matches!(p, KeySource::Entry(_) | KeySource::Descriptor))
    }

    /// Whether some part of the key (the key itself, or one of a
    /// composite's, which holds no composite) is such.
    pub fn any_part(&self, is: impl Fn(&KeySource) -> bool) -> bool {
        match self {
            KeySource::Composite(parts) => parts.iter().any(is),
            one => is(one),
        }
    }
}

/// What of a request a key may read, beyond the identified client.
#[derive(Debug, Clone, Copy)]
pub struct KeyInputs<'a> {
    /// The request's headers, which `header:` and `cookie:` keys read.
    pub headers: &'a HeaderMap,
    /// The raw query string, if any.
    pub query: Option<&'a str>,
    /// The host asked for, if any and not empty, normalised
    /// (`normalize_host`).
    pub host: Option<&'a str>,
    /// The matching path pattern of the limit being keyed ("" when it
    /// matches every path).
    pub route: &'a str,
    /// Header, cookie and query values read ignoring case
    /// (`case_insensitive_values`).
    pub fold_case: bool,
    /// The body's fields, when some limit reads them and the body was read.
    pub body: Option<&'a BodyFields>,
}

/// One thing a client is known by, as an operator names it.
#[derive(Debug, Clone, Copy)]
pub enum KnownPart<'a> {
    /// A client address, grouped as `ip` keys group it.
    Ip(IpAddr),
    /// An API key in the clear, as a client would send it.
    ApiKey(&'a [u8]),
    /// An API key known by its keyed hash only (a key set at run time).
    ApiKeyHash(u128),
    /// A header's name and value, for `header:` keys.
    Header(&'a HeaderName, &'a [u8]),
    /// A cookie's name and value, for `cookie:` keys.
    Cookie(&'a str, &'a [u8]),
    /// A query parameter's name and value, for `query:` keys.
    Query(&'a str, &'a [u8]),
    /// A token claim's path and value, for `jwt:` keys.
    Claim(&'a ClaimPath, &'a [u8]),
    /// A rate limit service descriptor's entry: its key and value.
    Entry(&'a str, &'a [u8]),
}

/// A host as limits compare it: lower case, without port or final dot.
pub fn normalize_host(host: &str) -> String {
    let host = match host.rsplit_once(':') {
        // Not an IPv6 literal's colon: a port.
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// The value of cookie `name` among the request's `Cookie` headers, as
/// frameworks read it: one pair of surrounding quotes dropped and
/// percent-escapes decoded (`"abc"`, `%61bc` and `abc` are one session).
/// Two cookies of that name (however spelled) are ambiguous: the
/// application may read either.
pub(super) fn cookie(headers: &HeaderMap, name: &str) -> Result<Option<Vec<u8>>, IdentityError> {
    let mut found = None;
    for header in headers.get_all(http::header::COOKIE) {
        for pair in header.as_bytes().split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            let (key, value) = match pair.iter().position(|&b| b == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => continue,
            };
            if percent_decode(key.trim_ascii(), false) != name.as_bytes() {
                continue;
            }
            if found.is_some() {
                return Err(IdentityError::AmbiguousKeyCookie(name.into()));
            }
            let value = value.trim_ascii();
            let value = match value {
                [b'"', inner @ .., b'"'] => inner,
                _ => value,
            };
            found = Some(percent_decode(value, false));
        }
    }
    Ok(found)
}

/// The value of query parameter `name`, percent-decoded (and `+` read as
/// a space), as applications read it: `user=a%62` and `user=ab` are one
/// value, and a parameter spelled twice (`user`, `us%65r`) is ambiguous.
pub(super) fn query_parameter(
    query: Option<&str>,
    name: &str,
) -> Result<Option<Vec<u8>>, IdentityError> {
    let mut found = None;
    for pair in query.unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decode(key) != name.as_bytes() {
            continue;
        }
        if found.is_some() {
            return Err(IdentityError::AmbiguousKeyQuery(name.into()));
        }
        found = Some(form_decode(value));
    }
    Ok(found)
}

/// `application/x-www-form-urlencoded` decoding; an escape that is not one
/// stays as written.
pub fn form_decode(text: &str) -> Vec<u8> {
    percent_decode(text.as_bytes(), true)
}

/// Percent-escapes decoded (and `+` as a space when `plus_is_space`); an
/// escape that is not one stays as written.
fn percent_decode(bytes: &[u8], plus_is_space: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    out
}
