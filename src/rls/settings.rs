//! `[rls]`, validated.

use std::net::SocketAddr;

/// The largest call decoded by default. Envoy's calls are a few hundred
/// bytes; a descriptor value read from a request header is bounded by
/// Envoy's `max_request_headers_kb` (60 KiB by default), so a call of the
/// largest head Envoy accepts still fits. A call over it is refused as
/// soon as its 5-byte prefix says so, and none is buffered past it.
pub(crate) const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The range `[rls].max_message_bytes` may take: below 1 KiB an address
/// and a path might not fit; above 4 MiB (gRPC's own default limit) one
/// call's buffer outweighs hundreds of Envoy's.
pub(crate) const MESSAGE_BYTES_RANGE: std::ops::RangeInclusive<usize> = 1024..=4 * 1024 * 1024;

/// Where the rate limit service listens: gRPC over cleartext HTTP/2
/// (h2c), as Envoy's `ratelimit` cluster speaks it inside a mesh, or over
/// TLS with the certificates of `[server.tls]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsSettings {
    pub listen: SocketAddr,
    pub tls: bool,
    /// The largest call decoded (`[rls].max_message_bytes`).
    pub max_message_bytes: usize,
    /// The service's own connection caps; `[server]`'s where not set.
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: Option<usize>,
}
