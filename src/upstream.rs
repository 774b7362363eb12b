//! The upstream servers, resolved once and taken round-robin.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use pingora::prelude::HttpPeer;

use crate::config::UpstreamSettings;

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

    /// The next server in turn, with the configured timeouts.
    pub fn pick(&self) -> HttpPeer {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.addrs.len();
        let mut peer = HttpPeer::new(self.addrs[i], self.settings.tls, self.settings.sni.clone());
        peer.options.connection_timeout = Some(self.settings.connect_timeout);
        peer.options.total_connection_timeout = Some(self.settings.connect_timeout);
        peer.options.read_timeout = Some(self.settings.read_timeout);
        peer
    }
}
