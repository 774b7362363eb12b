//! The proxy's listening side: one front door per worker on each address
//! (plain or TLS), and the connection settings they enforce, their cap
//! derived from the open-files limit.

use std::sync::Arc;

use pingora::apps::HttpServerOptions;
use pingora::server::Server;
use pingora::services::listening::Service;

use crate::connection::{AcceptFilter, ConnectionCaps, ConnectionSettings, FrontDoor};
use crate::proxy::Gateway;
use crate::server::settings::ServerSettings;
use crate::server::state::AppState;

/// File descriptors kept back from the connection cap's default: listeners,
/// Redis, logs, the admin listener.
const RESERVED_FDS: u64 = 64;

/// Raises the soft open-files limit to the hard one (a proxy holds two
/// descriptors per proxied request) and returns the limit in force.
fn raise_open_files_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                log::info!("open files limit raised from {soft} to {hard}");
                hard
            }
            Err(e) => {
                log::warn!("cannot raise the open files limit from {soft} to {hard}: {e}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            log::warn!("cannot read the open files limit: {e}");
            1024
        }
    }
}

/// `[server]`'s connection settings, the total cap derived from the
/// open-files limit when not given: each client connection may need an
/// upstream one too, so half of what is left after the reserve.
pub(super) fn connection_settings(server: &ServerSettings) -> ConnectionSettings {
    let open_files = raise_open_files_limit();
    let derived = (open_files.saturating_sub(RESERVED_FDS) / 2).max(16);
    ConnectionSettings {
        header_timeout: server.header_timeout,
        keepalive_timeout: server.keepalive_timeout,
        max_connections: server
            .max_connections
            .unwrap_or_else(|| usize::try_from(derived).unwrap_or(usize::MAX)),
        max_connections_per_ip: server.max_connections_per_ip,
    }
}

/// HTTP/2 from clients: at most 32 streams at once per connection (each may
/// hold an upstream connection, and the caps count connections), and the
/// h2 crate's guards against streams reset as fast as they are opened.
fn h2_options() -> pingora::protocols::http::v2::server::H2Options {
    let mut options = pingora::protocols::http::v2::server::default_h2_options();
    options.max_concurrent_streams(MAX_H2_STREAMS);
    options.max_concurrent_reset_streams(MAX_H2_STREAMS as usize);
    options.max_pending_accept_reset_streams(MAX_H2_STREAMS as usize);
    options
}

/// Streams one HTTP/2 connection may have open at once.
const MAX_H2_STREAMS: u32 = 32;

/// What every worker's front door is built from.
///
/// A worker is a Pingora service of its own, with one thread, its own
/// accept loop on the shared listening socket and its own upstream
/// connection pool, as nginx runs a worker per process: with one
/// multi-threaded runtime instead, connections, their timers and the pool's
/// idle watches wake each other across threads, and Pingora's pool loses
/// races for idle connections to their watches (a bare Pingora proxy spent
/// 32 µs of CPU per request on two threads against 25 µs on one; as two
/// one-thread services, 25 µs).
pub(super) struct Doors<'a> {
    pub(super) server: &'a Server,
    pub(super) state: &'a Arc<AppState>,
    pub(super) caps: &'a Arc<ConnectionCaps>,
    pub(super) connections: ConnectionSettings,
    pub(super) filter: &'a Arc<AcceptFilter>,
    pub(super) workers: usize,
}

impl Doors<'_> {
    pub(super) fn service(
        &self,
        name: String,
        worker: usize,
        listen: &[std::net::SocketAddr],
        h2c: bool,
        tls: Option<Arc<pingora::listeners::tls::Acceptor>>,
    ) -> Service<FrontDoor> {
        let mut proxy = pingora::proxy::http_proxy(
            &self.server.configuration,
            Gateway::new(self.state.clone()),
        );
        let mut options = HttpServerOptions::default();
        options.h2c = h2c;
        options.h2_idle_timeout = Some(self.connections.keepalive_timeout);
        proxy.server_options = Some(options);
        proxy.h2_options = Some(h2_options());
        let mut front = Service::new(
            name,
            FrontDoor::new(
                Arc::new(proxy),
                self.state.clone(),
                self.caps.clone(),
                self.connections,
                h2c,
                tls,
            ),
        );
        front.threads = Some(1);
        front.set_connection_filter(self.filter.clone());
        for addr in listen {
            if self.workers == 1 {
                front.add_tcp(&addr.to_string());
            } else {
                front.add_tcp_with_settings(&worker_spelling(addr, worker), reuse_port());
            }
        }
        front
    }
}

/// Each worker binds a socket of its own (SO_REUSEPORT: the kernel spreads
/// new connections over them, as nginx's `reuseport`). Pingora keys the
/// sockets it keeps by the address as written and would hand every worker
/// the one descriptor (closed once per worker at exit), so worker `n` writes
/// the port with `n` leading zeros: the same address, a key of its own.
fn worker_spelling(addr: &std::net::SocketAddr, worker: usize) -> String {
    format!(
        "{}:{}{}",
        match addr {
            std::net::SocketAddr::V4(a) => a.ip().to_string(),
            std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
        },
        "0".repeat(worker),
        addr.port()
    )
}

fn reuse_port() -> pingora::listeners::TcpSocketOptions {
    let mut options = pingora::listeners::TcpSocketOptions::default();
    options.so_reuseport = Some(true);
    options
}
