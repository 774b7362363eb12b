//! `[tracing]` as the configuration gives it.

use std::time::Duration;

/// The wire the spans go out on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over gRPC (a collector's port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318, `/v1/traces`).
    Http,
}

/// Whose incoming `traceparent` continues its trace. Anyone else's request
/// starts a trace of its own, and its `traceparent` and `tracestate` are
/// not passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustParent {
    Nobody,
    /// Peers listed in `[clients].trusted_proxies`: the load balancer or
    /// CDN in front, which speaks for the trace. The default.
    TrustedProxies,
    Everyone,
}

/// `[tracing]`, validated.
#[derive(Clone, PartialEq)]
pub struct TracingSettings {
    /// Where spans are sent: for gRPC the collector's address, for HTTP the
    /// full URL (`/v1/traces` is added to one without a path).
    pub endpoint: String,
    pub protocol: Protocol,
    pub service_name: String,
    pub resource: Vec<(String, String)>,
    /// Sent with every export (a collector's API key, read from a file).
    pub headers: Vec<(String, String)>,
    /// The share of traces started here that are kept; a continued trace
    /// follows its parent's choice.
    pub sample_ratio: f64,
    /// At most this many spans are recorded in a second, whatever the
    /// clients' `sampled` flags ask.
    pub max_spans_per_second: u32,
    /// Spans waiting for export; past it they are dropped (and counted).
    pub queue: usize,
    /// Spans in one export.
    pub batch: usize,
    /// How long one export may take.
    pub timeout: Duration,
    pub trust_parent: TrustParent,
}

impl std::fmt::Debug for TracingSettings {
    /// The headers' values are the collector's secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("TracingSettings")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("service_name", &self.service_name)
            .field("resource", &self.resource)
            .field("headers", &header_names)
            .field("sample_ratio", &self.sample_ratio)
            .field("max_spans_per_second", &self.max_spans_per_second)
            .field("queue", &self.queue)
            .field("batch", &self.batch)
            .field("timeout", &self.timeout)
            .field("trust_parent", &self.trust_parent)
            .finish()
    }
}
