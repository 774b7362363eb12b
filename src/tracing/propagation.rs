//! The W3C trace context read from what a caller sent: an HTTP request's
//! headers, or a gRPC call's metadata. A header that does not parse is no
//! context (the propagator's rule): the request goes on as a new trace.

use opentelemetry::propagation::Extractor;

/// An HTTP request's headers, for the propagator.
pub(crate) struct HeaderExtractor<'a>(pub &'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A gRPC call's metadata (the rate limit service's callers).
#[cfg(feature = "rls")]
pub(crate) struct MetadataExtractor<'a>(pub &'a tonic::metadata::MetadataMap);

#[cfg(feature = "rls")]
impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The trace context as headers to send on: `traceparent`, and
/// `tracestate` when there is one.
#[derive(Default)]
pub(super) struct Headers(pub(super) Vec<(&'static str, String)>);

impl opentelemetry::propagation::Injector for Headers {
    fn set(&mut self, key: &str, value: String) {
        let name = match key {
            "traceparent" => "traceparent",
            // An empty state is no state: the header is left out.
            "tracestate" if !value.is_empty() => "tracestate",
            _ => return,
        };
        self.0.push((name, value));
    }
}
