//! Serving each accepted connection: the caps, the TLS handshake, HTTP/2
//! or one HTTP/1 session after another.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use log::debug;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::listeners::tls::Acceptor;
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Stream, ALPN};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::time::Instant;

use super::caps::{ConnectionCaps, ConnectionSettings};
use super::clock::HeadClock;
use super::guarded::GuardedStream;
use super::h2_watch::H2Watch;
use crate::proxy::Gateway;
use crate::server::metrics::ConnectionMetrics;
use crate::server::state::AppState;

/// What a connection speaks, found out by `FrontDoor::protocol`.
enum Protocol {
    Http1(Stream),
    /// With what was read of it already (the preface, off a TLS stream).
    Http2(Stream, Vec<u8>),
}

/// Serves each accepted connection: caps, then HTTP/1 sessions one after the
/// other under the connection's `HeadClock`.
pub(crate) struct FrontDoor {
    proxy: Arc<HttpProxy<Gateway>>,
    state: Arc<AppState>,
    caps: Arc<ConnectionCaps>,
    settings: ConnectionSettings,
    /// HTTP/2 with prior knowledge on plain connections.
    h2c: bool,
    /// The TLS listeners' handshake, done here: after the caps, under the clock.
    tls: Option<Arc<Acceptor>>,
}

impl FrontDoor {
    pub(crate) fn new(
        proxy: Arc<HttpProxy<Gateway>>,
        state: Arc<AppState>,
        caps: Arc<ConnectionCaps>,
        settings: ConnectionSettings,
        h2c: bool,
        tls: Option<Arc<Acceptor>>,
    ) -> Self {
        FrontDoor {
            proxy,
            state,
            caps,
            settings,
            h2c,
            tls,
        }
    }

    /// Which protocol the connection speaks, the HTTP/2 preface read (or
    /// peeked) in full by the clock's deadline: a client that says h2 and
    /// then nothing is as slow as a head that never comes. `None`: it sent
    /// nothing usable in time. An HTTP/2 stream comes back ready to be read
    /// from its start.
    async fn protocol(&self, mut stream: Stream, clock: &Arc<HeadClock>) -> Option<Protocol> {
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let until = clock
            .deadline()
            .map_or_else(|| Instant::now() + self.settings.header_timeout, |(u, _)| u);
        if stream.get_ssl_digest().is_some() {
            if !matches!(stream.selected_alpn_proto(), Some(ALPN::H2)) {
                // Read above TLS, where a client that goes without its
                // close_notify reads as gone, not as broken.
                let above_tls =
                    GuardedStream::replaying(stream, Vec::new(), self.caps.metrics.clone());
                return Some(Protocol::Http1(Box::new(above_tls)));
            }
            // TLS cannot be peeked: read the preface, then hand it back
            // first. The clock below TLS sees only encrypted bytes.
            let mut preface = vec![0u8; PREFACE.len()];
            let read = tokio::time::timeout_at(
                until,
                tokio::io::AsyncReadExt::read_exact(&mut stream, &mut preface),
            )
            .await;
            if !matches!(read, Ok(Ok(_))) || preface != PREFACE {
                return None;
            }
            return Some(Protocol::Http2(stream, preface));
        }
        if !self.h2c {
            return Some(Protocol::Http1(stream));
        }
        // The first 14 bytes tell an HTTP/1 request (18 bytes at the least)
        // from the preface; only a preface is then peeked whole.
        let mut start = [0u8; 14];
        match tokio::time::timeout_at(until, stream.try_peek(&mut start)).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return Some(Protocol::Http1(stream)),
            Ok(Err(_)) | Err(_) => return None,
        }
        if start[..] != PREFACE[..14] {
            return Some(Protocol::Http1(stream));
        }
        let mut whole = [0u8; PREFACE.len()];
        match tokio::time::timeout_at(until, stream.try_peek(&mut whole)).await {
            Ok(Ok(true)) if whole == PREFACE => Some(Protocol::Http2(stream, Vec::new())),
            _ => None,
        }
    }

    /// An HTTP/2 connection's watch: a client's reset is held for an answer
    /// no longer than the upstream may take to give one.
    fn h2_watch(&self, stream: &Stream) -> Arc<H2Watch> {
        let runtime = self.state.runtime.load();
        let upstream = runtime.upstream.settings();
        let servers = u32::try_from(upstream.servers.len()).unwrap_or(u32::MAX);
        let hold_limit = upstream.read_timeout
            + upstream.connect_timeout.saturating_mul(servers)
            + self.settings.header_timeout;
        H2Watch::new(
            stream.get_socket_digest(),
            self.settings.header_timeout,
            hold_limit,
        )
    }
}

fn peer_of(stream: &Stream) -> Option<IpAddr> {
    let digest = stream.get_socket_digest()?;
    let addr = digest.peer_addr()?.as_inet()?;
    Some(floodgate_policy::identity::normalize(addr.ip()))
}

#[async_trait]
impl ServerApp for FrontDoor {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let peer = peer_of(&stream);
        let counted_as = super::accept::counted_as(&self.state, peer);
        let _permit = match self.caps.admit(counted_as) {
            Ok(permit) => permit,
            Err(reason) => {
                self.caps.refused(counted_as.or(peer), reason);
                // Dropping the stream closes it.
                return None;
            }
        };
        // The clock runs from the accept: a TLS handshake or an h2c preface
        // that dawdles spends the same time as a head.
        let clock = HeadClock::new(
            self.settings.header_timeout,
            self.settings.keepalive_timeout,
        );
        let guarded = GuardedStream::new(
            stream,
            clock.clone(),
            self.caps.metrics.clone(),
            self.tls.is_none(),
        );
        let stream: Stream = match &self.tls {
            Some(acceptor) => match acceptor.tls_handshake(guarded).await {
                Ok(tls) => Box::new(tls),
                Err(e) => {
                    debug!("TLS handshake failed: {e}");
                    return None;
                }
            },
            None => Box::new(guarded),
        };
        let mut stream = match self.protocol(stream, &clock).await? {
            // Streams are requests of their own: Pingora's HTTP/2 server runs
            // them (idle connections close after keepalive_timeout).
            Protocol::Http2(stream, preface) => {
                clock.head_arrived();
                let watch = self.h2_watch(&stream);
                let watched =
                    GuardedStream::watching(stream, preface, watch, self.caps.metrics.clone());
                return ServerApp::process_new(&self.proxy, Box::new(watched), shutdown).await;
            }
            Protocol::Http1(stream) => stream,
        };
        let mut persisted = None;
        loop {
            let mut session = ServerSession::new_http1(stream);
            let next_head = persisted.is_some();
            if let Some(settings) = persisted {
                pingora::apps::HttpPersistentSettings::apply_to_session(settings, &mut session);
            }
            // After the persisted settings. No keep-alive timer of Pingora's
            // (0: none; it cost a timer registration per request): the
            // clock's deadlines end idle and slow connections, and every
            // head after the first is read under the idle deadline set here.
            if *shutdown.borrow() {
                session.set_keepalive(None);
            } else {
                session.set_keepalive(Some(0));
            }
            if next_head {
                clock.await_next_head();
            }
            // After the persisted settings, which carry no context of ours.
            session.set_connection_user_context(Some(Box::new(clock.clone())));
            let reused = self.proxy.process_new_http(session, shutdown).await?;
            (stream, persisted) = reused.consume();
        }
    }

    async fn cleanup(&self) {
        self.proxy.http_cleanup().await
    }
}

/// Serves the admin listener: its own small connection cap, and a lifetime
/// per connection, so that idle or slow clients there can neither hold the
/// process's descriptors nor stay for ever (admin answers take milliseconds).
pub(crate) struct AdminDoor<A> {
    app: Arc<A>,
    caps: Arc<ConnectionCaps>,
    lifetime: Duration,
    /// The group an address is capped in: the gateway's own grouping
    /// (IPv6 by `[clients].ipv6_prefix`), as the configuration now says.
    group: AddressGroup,
}

/// The group a peer address is counted in.
pub(super) type AddressGroup = Box<dyn Fn(IpAddr) -> IpAddr + Send + Sync>;

/// Admin connections open at once, out of the descriptors the proxy keeps
/// back from its own cap.
pub(crate) const ADMIN_CONNECTIONS: usize = 32;

/// Admin connections one address may hold: a browser on the status page,
/// a scraper and a health check fit, and one address holding them all
/// leaves three quarters of the listener to everyone else (an
/// orchestrator's probe above all).
pub(super) const ADMIN_CONNECTIONS_PER_ADDRESS: usize = 8;

impl<A> AdminDoor<A> {
    pub(crate) fn new(
        app: A,
        metrics: ConnectionMetrics,
        lifetime: Duration,
        group: AddressGroup,
    ) -> Self {
        let settings = ConnectionSettings {
            header_timeout: lifetime,
            keepalive_timeout: lifetime,
            max_connections: ADMIN_CONNECTIONS,
            max_connections_per_ip: ADMIN_CONNECTIONS_PER_ADDRESS,
        };
        AdminDoor {
            app: Arc::new(app),
            caps: ConnectionCaps::new(&settings, metrics),
            lifetime,
            group,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for AdminDoor<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // An IPv6 network's addresses are one client's, as the gateway
        // groups them.
        let peer = peer_of(&stream).map(|ip| (self.group)(ip));
        let _permit = match self.caps.admit(peer) {
            Ok(permit) => permit,
            Err(reason) => {
                self.caps.refused(peer, reason);
                return None;
            }
        };
        // Dropping the connection's future closes it.
        let _ = tokio::time::timeout(self.lifetime, self.app.process_new(stream, shutdown)).await;
        None
    }

    async fn cleanup(&self) {
        self.app.cleanup().await
    }
}
