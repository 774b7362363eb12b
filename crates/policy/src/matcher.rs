//! Which requests a limit meets: its `match` on method, path, host,
//! headers and body fields, or on the rate limit service's descriptors.

use http::{HeaderName, Method};

use crate::identity::normalize_host;
use crate::{DescriptorPattern, PathPattern, RequestView};

/// A host pattern: a name, or `*.` and a domain for its subdomains (not the
/// domain itself). Lower case, no port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern(String);

impl HostPattern {
    /// A pattern as `match.hosts` writes it, normalised as hosts are: lower
    /// case, without port or final dot.
    pub fn new(pattern: &str) -> HostPattern {
        HostPattern(normalize_host(pattern))
    }

    /// `host` as `normalize_host` gives it.
    pub fn matches(&self, host: &str) -> bool {
        match self.0.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => self.0 == host,
        }
    }

    /// The pattern as it is matched: `api.example.com`, `*.example.com`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `match = { methods, paths, hosts, headers }`; an empty list matches all.
/// A limit on GET also limits HEAD, which routers answer with the GET handler;
/// methods match ignoring case. A header matches when any of its values
/// matches its glob (`*` for any run of characters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    /// The methods the limit meets, compared ignoring case (GET also meets
    /// HEAD); empty for every method.
    pub methods: Vec<Method>,
    /// Path patterns, matched against the normalised path; empty for every path.
    pub paths: Vec<PathPattern>,
    /// Host patterns; empty for every host. A request that names no host
    /// meets them all.
    pub hosts: Vec<HostPattern>,
    /// Headers the request must carry, each with some value the glob matches.
    pub headers: Vec<(HeaderName, PathPattern)>,
    /// Top-level fields of the JSON body, each matching one of its
    /// patterns (`body = { model = ["gpt-4o*"] }`).
    pub body: Vec<(Box<str>, Vec<PathPattern>)>,
}

impl Matcher {
    /// Whether the request is one this matcher applies to.
    pub fn applies(&self, request: &RequestView<'_>) -> bool {
        self.applies_but_for_body(request)
            && self.body.iter().all(|(field, globs)| {
                request
                    .body
                    .and_then(|body| body.text(field))
                    .is_some_and(|value| globs.iter().any(|g| g.matches_exactly(value)))
            })
    }

    /// Whether the request is one this matcher applies to, as far as its
    /// head tells: whether its body is worth reading.
    pub fn applies_but_for_body(&self, request: &RequestView<'_>) -> bool {
        self.matches(request.method, request.path)
            // A request that names no host may be for any: host limits
            // apply to it (an HTTP/1.0 request without Host is no way
            // around them).
            && (self.hosts.is_empty()
                || request
                    .host
                    .is_none_or(|h| self.hosts.iter().any(|p| p.matches(h))))
            && self.headers.iter().all(|(name, glob)| {
                request
                    .headers
                    .get_all(name)
                    .iter()
                    .any(|v| v.to_str().is_ok_and(|v| glob.matches_exactly(v)))
            })
    }

    /// The path pattern a matching path matched ("" when any path does):
    /// what a `route` key names.
    pub fn route(&self, path: &str) -> &str {
        self.paths
            .iter()
            .find(|p| p.matches(path))
            .map_or("", |p| p.as_str())
    }

    /// Method and path only.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        // Methods are case-sensitive in HTTP, but some frameworks (Werkzeug)
        // route `post` as POST.
        let listed = |m: &str| {
            self.methods
                .iter()
                .any(|l| l.as_str().eq_ignore_ascii_case(m))
        };
        let method_matches = self.methods.is_empty()
            || listed(method.as_str())
            || (method.as_str().eq_ignore_ascii_case("HEAD") && listed("GET"));
        method_matches && (self.paths.is_empty() || self.paths.iter().any(|p| p.matches(path)))
    }

    /// Whether some request could match both (approximate: a path pattern is
    /// tested against the other's text).
    pub fn may_overlap(&self, other: &Matcher) -> bool {
        let methods = self.methods.is_empty()
            || other.methods.is_empty()
            || self.methods.iter().any(|m| other.methods.contains(m));
        let paths = self.paths.is_empty()
            || other.paths.is_empty()
            || self.paths.iter().any(|a| {
                other
                    .paths
                    .iter()
                    .any(|b| a.matches(b.as_str()) || b.matches(a.as_str()))
            });
        methods && paths
    }

    /// The match as `floodgate check` and the logs show it:
    /// `POST /login host api.example.com`, or `all requests`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.methods.is_empty() {
            let m: Vec<&str> = self.methods.iter().map(|m| m.as_str()).collect();
            parts.push(m.join("|"));
        }
        if !self.paths.is_empty() {
            let p: Vec<&str> = self.paths.iter().map(|p| p.as_str()).collect();
            parts.push(p.join(" "));
        }
        if !self.hosts.is_empty() {
            let h: Vec<&str> = self.hosts.iter().map(|h| h.as_str()).collect();
            parts.push(format!("host {}", h.join(" ")));
        }
        for (name, glob) in &self.headers {
            parts.push(format!("with {name}: {}", glob.as_str()));
        }
        for (field, globs) in &self.body {
            let g: Vec<&str> = globs.iter().map(|g| g.as_str()).collect();
            parts.push(format!("with body {field}: {}", g.join("|")));
        }
        if parts.is_empty() {
            "all requests".into()
        } else {
            parts.join(" ")
        }
    }
}

/// What a limit meets: HTTP requests (`match = { methods, paths, ... }`),
/// or the rate limit service's descriptors (`match = { domain,
/// descriptors }`), which no HTTP request meets. Never both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitMatch {
    /// HTTP requests, as the matcher says.
    Http(Matcher),
    /// Calls of the rate limit service with this domain and descriptors.
    Descriptors(DescriptorPattern),
}

impl Default for LimitMatch {
    /// Every HTTP request.
    fn default() -> LimitMatch {
        LimitMatch::Http(Matcher::default())
    }
}

/// No body fields: what a match on descriptors reads of a body.
const NO_FIELDS: &[(Box<str>, Vec<PathPattern>)] = &[];

impl LimitMatch {
    /// The HTTP matcher, for a limit on HTTP requests.
    pub fn http(&self) -> Option<&Matcher> {
        match self {
            LimitMatch::Http(matcher) => Some(matcher),
            LimitMatch::Descriptors(_) => None,
        }
    }

    /// The descriptor pattern, for a limit of the rate limit service.
    pub fn descriptors(&self) -> Option<&DescriptorPattern> {
        match self {
            LimitMatch::Descriptors(pattern) => Some(pattern),
            LimitMatch::Http(_) => None,
        }
    }

    /// The path patterns a limit on HTTP requests names (none otherwise).
    pub fn paths(&self) -> &[PathPattern] {
        self.http().map_or(&[], |m| &m.paths)
    }

    /// The body fields a limit on HTTP requests matches (none otherwise).
    pub fn body(&self) -> &[(Box<str>, Vec<PathPattern>)] {
        self.http().map_or(NO_FIELDS, |m| &m.body)
    }

    /// Whether the limit names hosts.
    pub fn names_hosts(&self) -> bool {
        self.http().is_some_and(|m| !m.hosts.is_empty())
    }

    /// Whether the request is one the limit meets.
    pub fn applies(&self, request: &RequestView<'_>) -> bool {
        self.http().is_some_and(|m| m.applies(request))
    }

    /// Whether the request is one the limit meets, as far as its head tells.
    pub fn applies_but_for_body(&self, request: &RequestView<'_>) -> bool {
        self.http().is_some_and(|m| m.applies_but_for_body(request))
    }

    /// The path pattern a matching path matched ("" when any path does, or
    /// for descriptors): what a `route` key names.
    pub fn route(&self, path: &str) -> &str {
        self.http().map_or("", |m| m.route(path))
    }

    /// Whether some request (or call of the service) could meet both.
    pub fn may_overlap(&self, other: &LimitMatch) -> bool {
        match (self, other) {
            (LimitMatch::Http(a), LimitMatch::Http(b)) => a.may_overlap(b),
            (LimitMatch::Descriptors(a), LimitMatch::Descriptors(b)) => a.domain == b.domain,
            _ => false,
        }
    }

    /// The match as `floodgate check` and the logs show it.
    pub fn describe(&self) -> String {
        match self {
            LimitMatch::Http(matcher) => matcher.describe(),
            LimitMatch::Descriptors(pattern) => pattern.describe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Client, Tiers};
    use crate::EntryPattern;
    use http::HeaderMap;
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn a_limit_on_http_requests_names_its_paths_and_one_on_descriptors_none() {
        let http = LimitMatch::Http(Matcher {
            paths: vec![PathPattern::new("/login"), PathPattern::new("/api/*")],
            ..Matcher::default()
        });
        let names: Vec<&str> = http.paths().iter().map(PathPattern::as_str).collect();
        assert_eq!(names, ["/login", "/api/*"]);
        assert!(LimitMatch::default().paths().is_empty());
        let descriptors = LimitMatch::Descriptors(DescriptorPattern {
            domain: "edge".into(),
            entries: vec![EntryPattern {
                key: "path".into(),
                value: Some(PathPattern::glob("/login")),
            }],
        });
        assert!(descriptors.paths().is_empty());
    }

    #[test]
    fn only_a_limit_on_http_requests_applies_to_one_as_far_as_its_head_tells() {
        let address = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
        let client = Client {
            address,
            via: Default::default(),
            ip: address,
            ip_prefix: 32,
            ip_hash: 0,
            api_key: None,
            tier: Tiers::default().anonymous(),
            subject_hash: None,
            token: None,
        };
        let headers = HeaderMap::new();
        let request = |method| RequestView {
            method,
            path: "/login",
            headers: &headers,
            query: None,
            host: None,
            client: &client,
            body: None,
        };
        let post_login = LimitMatch::Http(Matcher {
            methods: vec![Method::POST],
            paths: vec![PathPattern::new("/login")],
            ..Matcher::default()
        });
        assert!(post_login.applies_but_for_body(&request(&Method::POST)));
        assert!(!post_login.applies_but_for_body(&request(&Method::GET)));
        let descriptors = LimitMatch::Descriptors(DescriptorPattern {
            domain: "edge".into(),
            entries: Vec::new(),
        });
        assert!(!descriptors.applies_but_for_body(&request(&Method::POST)));
    }
}
