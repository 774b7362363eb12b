//! Headers an application may believe about who asked, how and for what:
//! the client's address, the scheme, the host, a rewritten URL or method.
//! Only floodgate, or a proxy it trusts, may send them upstream; anyone
//! else's are removed, so the application never runs something other than
//! what floodgate limited (`X-Original-URL: /admin` on a request limited as
//! `/`) or believes an address floodgate did not key on.

/// The documented list, lower case. Names compare with `_` read as `-`,
/// since CGI, WSGI and Rack turn both into the same variable.
pub const LISTED: [&str; 49] = [
    // The client's address.
    "x-forwarded-for",
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "client-ip",
    "cf-connecting-ip",
    "cf-connecting-ipv6",
    "fastly-client-ip",
    "akamai-client-ip",
    "x-original-forwarded-for",
    "forwarded-for",
    "x-forwarded",
    "x-remote-ip",
    "x-remote-addr",
    "remote-addr",
    "x-originating-ip",
    "x-proxyuser-ip",
    "x-envoy-external-address",
    "x-envoy-internal",
    "x-azure-clientip",
    "x-azure-socketip",
    "x-appengine-user-ip",
    "x-forwarded-client-cert",
    "x-client-cert",
    // The scheme.
    "x-forwarded-proto",
    "x-forwarded-protocol",
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-url-scheme",
    "x-scheme",
    "front-end-https",
    "cloudfront-forwarded-proto",
    // The host and port.
    "x-forwarded-host",
    "x-forwarded-server",
    "x-forwarded-port",
    "x-host",
    "x-original-host",
    // A URL other than the request's.
    "x-original-url",
    "x-rewrite-url",
    "x-original-uri",
    "x-forwarded-uri",
    "x-forwarded-path",
    "x-forwarded-prefix",
    "x-envoy-original-path",
    // A method other than the request's.
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-original-method",
];

/// The names removed from an untrusted client's request: the list, with
/// the operator's additions (`[upstream].strip_headers`) and without the
/// names it keeps (`[upstream].keep_headers`). `Forwarded` is the
/// forwarding code's own to judge (it stays from a trusted proxy that
/// writes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHeaders {
    /// Names by length: a header is compared only with names as long as it,
    /// so the usual headers (`accept`, `user-agent`) meet one comparison or
    /// none.
    by_len: Vec<Vec<Box<[u8]>>>,
}

impl Default for ClientHeaders {
    fn default() -> Self {
        ClientHeaders::new(&[], &[])
    }
}

impl ClientHeaders {
    /// `strip` and `keep` in lower case, `_` read as `-`.
    pub fn new(strip: &[String], keep: &[String]) -> ClientHeaders {
        let mut by_len: Vec<Vec<Box<[u8]>>> = Vec::new();
        let names = LISTED
            .iter()
            .map(|n| n.to_string())
            .chain(strip.iter().map(|n| canonical(n)));
        for name in names {
            if keep.iter().any(|k| canonical(k) == name) {
                continue;
            }
            let len = name.len();
            if by_len.len() <= len {
                by_len.resize(len + 1, Vec::new());
            }
            if !by_len[len].iter().any(|n| **n == *name.as_bytes()) {
                by_len[len].push(name.into_bytes().into_boxed_slice());
            }
        }
        ClientHeaders { by_len }
    }

    /// Whether an untrusted client's header of this name is removed.
    /// `name` as a header map holds it (lower case).
    pub fn strips(&self, name: &[u8]) -> bool {
        let Some(candidates) = self.by_len.get(name.len()) else {
            return false;
        };
        candidates.iter().any(|listed| {
            listed.iter().zip(name).all(|(&l, &n)| {
                let n = if n == b'_' {
                    b'-'
                } else {
                    n.to_ascii_lowercase()
                };
                l == n
            })
        })
    }
}

/// A header name as the list holds it.
pub fn canonical(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', "-")
}

/// Whether `name` is on the documented list (what `keep_headers` may name).
pub fn is_listed(name: &str) -> bool {
    let name = canonical(name);
    LISTED.contains(&name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_any_spelling_and_what_the_operator_adds_or_keeps() {
        let headers = ClientHeaders::default();
        for name in LISTED {
            assert!(headers.strips(name.as_bytes()), "{name}");
        }
        assert!(headers.strips(b"x_original_url"));
        assert!(headers.strips(b"cf_connecting_ip"));
        for usual in ["accept", "user-agent", "cookie", "x-request-id", "host"] {
            assert!(!headers.strips(usual.as_bytes()), "{usual}");
        }
        let tuned =
            ClientHeaders::new(&["X-Debug-User".into()], &["X-HTTP-Method-Override".into()]);
        assert!(tuned.strips(b"x-debug-user"));
        assert!(tuned.strips(b"x_debug_user"));
        assert!(!tuned.strips(b"x-http-method-override"));
        assert!(tuned.strips(b"x-original-url"));
        assert!(is_listed("X-Original-URL"));
        assert!(!is_listed("X-Debug-User"));
    }
}
