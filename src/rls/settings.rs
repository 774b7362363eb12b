//! `[rls]`, validated.

use std::net::SocketAddr;

/// Where the rate limit service listens: gRPC over cleartext HTTP/2
/// (h2c), as Envoy's `ratelimit` cluster speaks it inside a mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsSettings {
    pub listen: SocketAddr,
}
