//! Changing a request's or a response's headers on their way through,
//! written once for Pingora's header types and for a plain header map.
//!
//! Pingora's `insert_header` parses the name again on every call (a heap
//! copy for a name it does not know) and, for HTTP/1.1, stores it twice: in
//! the header map and in a case map that keeps each name's spelling. That
//! was about 1,900 instructions a header, most of what forwarding a request
//! cost above a bare Pingora proxy. Unless `[upstream].preserve_header_case`
//! is set, floodgate takes the header map out of Pingora's header, edits it
//! with names built once ([`SpelledName`]) and puts it back without the case
//! map: HTTP/1.1 then writes names in lower case (but for a dozen Pingora
//! title-cases: Host, Content-Type, Date, ...), as Envoy and HAProxy do and
//! as HTTP/2 writes every name.
//! With it set, every edit goes through Pingora's API and every name keeps
//! its spelling.

use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::{Error, ErrorType, Result};

use crate::proxy::header_name::SpelledName;

pub(super) trait HeaderEdit {
    fn map(&self) -> &HeaderMap;
    /// Replaces every value of `name`.
    fn insert(&mut self, name: &SpelledName, value: HeaderValue) -> Result<()>;
    fn append(&mut self, name: &SpelledName, value: HeaderValue) -> Result<()>;
    fn remove(&mut self, name: &HeaderName);
}

fn too_many_headers<T>(_: T) -> Box<Error> {
    Error::explain(ErrorType::InvalidHTTPHeader, "too many headers")
}

impl HeaderEdit for HeaderMap {
    fn map(&self) -> &HeaderMap {
        self
    }

    fn insert(&mut self, name: &SpelledName, value: HeaderValue) -> Result<()> {
        self.try_insert(name.name().clone(), value)
            .map_err(too_many_headers)?;
        Ok(())
    }

    fn append(&mut self, name: &SpelledName, value: HeaderValue) -> Result<()> {
        self.try_append(name.name().clone(), value)
            .map_err(too_many_headers)?;
        Ok(())
    }

    fn remove(&mut self, name: &HeaderName) {
        HeaderMap::remove(self, name);
    }
}

/// Pingora's own header types: every edit through its API, which keeps the
/// spelling of each name.
macro_rules! through_pingora {
    ($header:ty) => {
        impl HeaderEdit for $header {
            fn map(&self) -> &HeaderMap {
                &self.headers
            }

            fn insert(&mut self, name: &SpelledName, value: HeaderValue) -> Result<()> {
                self.insert_header(name.spelling_bytes(), value)
            }

            fn append(&mut self, name: &SpelledName, value: HeaderValue) -> Result<()> {
                self.append_header(name.spelling_bytes(), value)?;
                Ok(())
            }

            fn remove(&mut self, name: &HeaderName) {
                self.remove_header(name);
            }
        }
    };
}

through_pingora!(RequestHeader);
through_pingora!(ResponseHeader);

/// Runs `edit` on the request's headers: through Pingora's API when
/// `preserve_case`, else on its header map, the case map dropped, with
/// `room` for that many more headers made at once. (The map Pingora parsed
/// is sized to the headers it holds: each header added past that grew it
/// again, twice on a plain request.)
pub(super) fn edit_request<R>(
    request: &mut RequestHeader,
    preserve_case: bool,
    room: usize,
    edit: impl FnOnce(&mut dyn HeaderEdit) -> R,
) -> R {
    if preserve_case {
        return edit(request);
    }
    // A target the URI does not reproduce (absolute-form, CONNECT, bytes
    // that are not UTF-8) is kept aside and set again: the plain parts have
    // nowhere to hold it.
    let outside_uri = target_outside_uri(request);
    let end_stream = request.send_end_stream();
    let mut parts: http::request::Parts = std::mem::replace(request, empty_request()).into();
    // Too many headers to make room for: the inserts themselves say so.
    let _ = parts.headers.try_reserve(room);
    let result = edit(&mut parts.headers);
    *request = RequestHeader::from(parts);
    if let Some(target) = outside_uri {
        // It was a valid target a moment ago.
        let _ = request.set_raw_path(&target);
    }
    if let Some(end_stream) = end_stream {
        request.set_send_end_stream(end_stream);
    }
    result
}

/// As [`edit_request`], for a response; a reason phrase of the upstream's
/// own is kept.
pub(super) fn edit_response<R>(
    response: &mut ResponseHeader,
    preserve_case: bool,
    room: usize,
    edit: impl FnOnce(&mut dyn HeaderEdit) -> R,
) -> R {
    if preserve_case {
        return edit(response);
    }
    let reason = response
        .get_reason_phrase()
        .filter(|reason| Some(*reason) != response.status.canonical_reason())
        .map(str::to_owned);
    let mut parts: http::response::Parts = std::mem::replace(response, empty_response()).into();
    let _ = parts.headers.try_reserve(room);
    let result = edit(&mut parts.headers);
    *response = ResponseHeader::from(parts);
    if reason.is_some() {
        let _ = response.set_reason_phrase(reason.as_deref());
    }
    result
}

fn target_outside_uri(request: &RequestHeader) -> Option<Vec<u8>> {
    let raw = request.raw_path();
    let uri = &request.uri;
    let from_uri = uri
        .path_and_query()
        .map(|p| p.as_str().as_bytes())
        .or_else(|| uri.authority().map(|a| a.as_str().as_bytes()))
        .unwrap_or_default();
    (raw != from_uri || !request.raw_path_is_utf8()).then(|| raw.to_vec())
}

/// Placeholders while the parts are out: neither allocates.
fn empty_request() -> RequestHeader {
    RequestHeader::from(http::Request::new(()).into_parts().0)
}

fn empty_response() -> ResponseHeader {
    ResponseHeader::from(http::Response::new(()).into_parts().0)
}

/// A response floodgate writes itself: its headers go straight into the
/// map (or, when `preserve_case`, through Pingora's API with the spelling
/// floodgate gives them).
pub(super) fn own_response(
    status: u16,
    capacity: usize,
    preserve_case: bool,
    write: impl FnOnce(&mut dyn HeaderEdit) -> Result<()>,
) -> Result<ResponseHeader> {
    if preserve_case {
        let mut response = ResponseHeader::build(status, Some(capacity))?;
        write(&mut response)?;
        return Ok(response);
    }
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = http::StatusCode::from_u16(status)
        .map_err(|_| Error::explain(ErrorType::InternalError, "invalid status"))?;
    parts.headers.reserve(capacity);
    write(&mut parts.headers)?;
    Ok(ResponseHeader::from(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    static X_ONE: SpelledName = SpelledName::from_static("x-one", "X-One");

    fn wire(request: &RequestHeader) -> String {
        let mut out = Vec::new();
        request.header_to_h1_wire(&mut out);
        String::from_utf8(out).expect("ascii")
    }

    fn client_request(target: &[u8]) -> RequestHeader {
        let mut request = RequestHeader::build("GET", target, None).expect("a request");
        request
            .insert_header("X-Client-Spelled", "1")
            .expect("a header");
        request
    }

    #[test]
    fn without_case_the_edit_lands_and_names_are_written_in_lower_case() {
        let mut request = client_request(b"/a?b=c");
        edit_request(&mut request, false, 1, |h| {
            h.insert(&X_ONE, HeaderValue::from_static("1"))
        })
        .expect("inserted");
        assert!(!request.has_case());
        assert_eq!(wire(&request), "x-client-spelled: 1\r\nx-one: 1\r\n");
        assert_eq!(request.raw_path(), b"/a?b=c");
    }

    #[test]
    fn preserving_case_keeps_every_spelling() {
        let mut request = client_request(b"/");
        edit_request(&mut request, true, 1, |h| {
            h.insert(&X_ONE, HeaderValue::from_static("1"))
        })
        .expect("inserted");
        assert_eq!(wire(&request), "X-Client-Spelled: 1\r\nX-One: 1\r\n");
    }

    #[test]
    fn a_target_the_uri_cannot_hold_survives_the_edit() {
        for target in [&b"http://api.example/a?b"[..], b"/caf\xe9"] {
            let mut request = client_request(target);
            let before = request.raw_path().to_vec();
            edit_request(&mut request, false, 1, |h| {
                h.remove(&HeaderName::from_static("x-one"))
            });
            assert_eq!(request.raw_path(), before.as_slice());
            assert_eq!(
                request.raw_path_is_utf8(),
                std::str::from_utf8(target).is_ok()
            );
        }
    }

    #[test]
    fn a_response_keeps_its_own_reason_phrase_and_its_status() {
        let mut response = ResponseHeader::build(299, None).expect("a response");
        response.set_reason_phrase(Some("Fine")).expect("a reason");
        edit_response(&mut response, false, 1, |h| {
            h.insert(&X_ONE, HeaderValue::from_static("1"))
        })
        .expect("inserted");
        assert_eq!(response.status.as_u16(), 299);
        assert_eq!(response.get_reason_phrase(), Some("Fine"));
        assert_eq!(
            response.headers.get("x-one").map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
    }
}
