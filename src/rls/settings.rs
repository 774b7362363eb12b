//! `[rls]`, validated.

use std::net::SocketAddr;

/// Where the rate limit service listens: gRPC over cleartext HTTP/2
/// (h2c), as Envoy's `ratelimit` cluster speaks it inside a mesh, or over
/// TLS with the certificates of `[server.tls]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsSettings {
    pub listen: SocketAddr,
    pub tls: bool,
}
