//! What a request must look like before anything is decided: one framing,
//! a target that is a path, in its canonical spelling.

use std::borrow::Cow;

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::proxy::Session;

use floodgate_policy::path::{self, EscapedSlashes, PathError};

/// A body the client is still sending would be left unread by an early
/// answer, so the connection cannot be reused after it.
pub(super) fn request_has_body(session: &Session) -> bool {
    let headers = &session.req_header().headers;
    headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// Rewrites the request target to its canonical path, the query kept as it
/// came: what the limits match is what the upstream receives.
pub(super) fn canonicalise_target(
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
pub(super) fn framing_problem(session: &Session) -> Option<(&'static str, &'static str)> {
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
pub(super) fn is_absolute_form(target: &[u8]) -> bool {
    let scheme_of = |prefix: &[u8]| {
        target.len() > prefix.len() && target[..prefix.len()].eq_ignore_ascii_case(prefix)
    };
    scheme_of(b"http://") || scheme_of(b"https://")
}
