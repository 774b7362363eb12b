//! The upstream servers, resolved once and taken round-robin.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::proxy::header_name::SpelledName;
use pingora::prelude::HttpPeer;

use crate::proxy::client_headers::ClientHeaders;

/// `[upstream]`: where requests go and how.
#[derive(Debug, Clone)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent switches, one key of [upstream] each"
)]
pub struct UpstreamSettings {
    pub servers: Vec<String>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub tls: bool,
    pub sni: String,
    /// PEM file of the CA(s) to trust for the upstream's TLS (default: the
    /// system's roots).
    pub ca_file: Option<PathBuf>,
    /// X-Forwarded-For (the resolved chain), -Proto, -Host and X-Real-IP.
    pub forwarded_headers: bool,
    /// Spelled as the config spells it, for `preserve_header_case`.
    pub request_id_header: SpelledName,
    /// Header names written as they were spelled (Pingora's case map), at
    /// the price of a parse and a second map entry per header floodgate
    /// writes; else lower case (a dozen, like Host, title-cased by Pingora).
    pub preserve_header_case: bool,
    /// Host sent upstream instead of the client's.
    pub host: Option<http::HeaderValue>,
    /// HTTP/2 to the upstream (h2c on plain connections): gRPC needs it.
    pub http2: bool,
    pub websocket_idle_timeout: Duration,
    /// Headers only floodgate or a trusted proxy may send upstream.
    pub client_headers: ClientHeaders,
    /// Paths of gRPC calls, whose client streams may rightly be slow and
    /// long: no body floor there (`[upstream].grpc_paths`).
    pub grpc_paths: Vec<floodgate_policy::PathPattern>,
}

pub struct Upstreams {
    addrs: Vec<SocketAddr>,
    next: AtomicUsize,
    settings: UpstreamSettings,
}

impl Upstreams {
    pub fn resolve(settings: &UpstreamSettings) -> std::io::Result<Upstreams> {
        use std::net::ToSocketAddrs;
        let mut addrs = Vec::new();
        for server in &settings.servers {
            addrs.extend(server.to_socket_addrs()?);
        }
        if addrs.is_empty() {
            return Err(std::io::Error::other("no upstream address resolved"));
        }
        Ok(Upstreams {
            addrs,
            next: AtomicUsize::new(0),
            settings: settings.clone(),
        })
    }

    pub fn settings(&self) -> &UpstreamSettings {
        &self.settings
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Where a request starts its round: the next server in turn.
    pub fn next_start(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.addrs.len()
    }

    /// Server `i` (modulo the count), with the configured timeouts.
    pub fn peer(&self, i: usize) -> HttpPeer {
        let addr = self.addrs[i % self.addrs.len()];
        let mut peer = HttpPeer::new(addr, self.settings.tls, self.settings.sni.clone());
        peer.options.connection_timeout = Some(self.settings.connect_timeout);
        peer.options.total_connection_timeout = Some(self.settings.connect_timeout);
        peer.options.read_timeout = Some(self.settings.read_timeout);
        if self.settings.http2 {
            // h2 only: by ALPN over TLS, with prior knowledge (h2c) in the clear.
            peer.options.alpn = pingora::protocols::ALPN::H2;
        }
        peer
    }

    /// Server `i`'s address as a Host value, for requests that came without one.
    pub fn host(&self, i: usize) -> String {
        self.addrs[i % self.addrs.len()].to_string()
    }
}
