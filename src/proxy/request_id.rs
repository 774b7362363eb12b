//! The request's id, held as the header value it is sent as: made once per
//! request, then shared by the upstream's request, the client's answer, the
//! logs and the 429 body.

use std::fmt;

use http::HeaderValue;

/// Plain characters only (`request_id::acceptable`, or generated hex): a
/// header value, a log word and a JSON string as it is.
#[derive(Clone)]
pub(super) struct RequestId(Option<HeaderValue>);

impl RequestId {
    /// Before the head is read: nothing to send.
    pub(super) const fn none() -> RequestId {
        RequestId(None)
    }

    pub(super) fn new(id: String) -> RequestId {
        RequestId(HeaderValue::try_from(id).ok().map(never_indexed))
    }

    /// A trusted proxy's id, checked plain (`request_id::acceptable`).
    pub(super) fn kept(value: HeaderValue) -> RequestId {
        RequestId(Some(never_indexed(value)))
    }

    /// The value to send, if there is an id.
    pub(super) fn header(&self) -> Option<HeaderValue> {
        self.0.clone()
    }

    pub(super) fn as_str(&self) -> &str {
        self.0
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value new on every answer, marked for HTTP/2 to send as never indexed
/// (HTTP/1.1 ignores the mark). HPACK would otherwise store each one in the
/// connection's 4 KiB table, never to use it again, evicting values that do
/// repeat; and it compares each new value with every stored one of its
/// name: about fifty request ids, a memcmp each, on every response. (What
/// is left of a limit changes as often, but marking it cost more than it
/// saved: its name, not in the table then, is written out in full.)
fn never_indexed(mut value: HeaderValue) -> HeaderValue {
    value.set_sensitive(true);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_back_as_it_was_made_and_is_sent_never_indexed() {
        let id = RequestId::new("0123abcd-ef".to_string());
        assert_eq!(id.as_str(), "0123abcd-ef");
        assert_eq!(id.to_string(), "0123abcd-ef");
        let value = id.header().expect("a value");
        assert_eq!(value.as_bytes(), b"0123abcd-ef");
        assert!(value.is_sensitive());
        assert!(RequestId::none().header().is_none());
        assert_eq!(RequestId::none().as_str(), "");
    }
}
