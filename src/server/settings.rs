//! `[server]` as the process uses it.

use std::net::SocketAddr;
use std::time::Duration;

/// `[server]`: the listeners, the worker threads and the connection limits.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub listen: Vec<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    pub threads: usize,
    pub grace_period: Duration,
    pub header_timeout: Duration,
    pub keepalive_timeout: Duration,
    /// None: derived from the open-files limit at start.
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: usize,
    /// HTTP/2 with prior knowledge on the plain listeners.
    pub h2c: bool,
    /// How long a request holding a concurrency slot may take to send its
    /// whole body, from its head.
    pub slot_body_timeout: Duration,
}
