//! The rate limit service's connections before tonic serves them, under the
//! gateway's defences: the connection caps (`ConnectionCaps`), a deadline
//! for the TLS handshake and the HTTP/2 preface, and an idle deadline once
//! a connection has no call.
//!
//! ```text
//! accept -> a place under the service's caps (per address, its total)
//!           and in the process's total          none: closed at once
//!        -> task: TLS handshake (with tls = true) and the 24-byte HTTP/2
//!           preface, both within header_timeout  late or wrong: closed
//!        -> tonic serves it; no call in flight for keepalive_timeout: the
//!           connection reads as ended, and closes
//! ```
//!
//! The process's total is the gateway's (`[server].max_connections`, by
//! default derived from the open-files limit): every listener draws on one
//! table of descriptors, so the service's connections take places in it,
//! and a flood of them cannot leave the gateway without descriptors.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

use crate::connection::{counted_as, CapReached, ConnectionCaps, Permit};
use crate::server::metrics::ConnectionMetrics;
use crate::server::state::AppState;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection may be read and written through: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// The deadlines the service's connections live by (`[server]`'s).
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    /// The TLS handshake and the HTTP/2 preface, from the accept.
    pub header_timeout: Duration,
    /// A connection without a call for this long is closed.
    pub idle_timeout: Duration,
}

/// Accepts the service's connections and lets through those that keep to
/// the caps and the deadlines.
pub(super) struct Door {
    /// The service's own caps: `[rls]`'s, else `[server]`'s numbers.
    caps: Arc<ConnectionCaps>,
    /// The process's total, which the gateway's connections count in too.
    process: Arc<ConnectionCaps>,
    state: Arc<AppState>,
    tls: Option<TlsAcceptor>,
    deadlines: Deadlines,
    metrics: ConnectionMetrics,
}

/// A connection's places under the caps, given back when it closes.
struct Places {
    _own: Permit,
    _process: Permit,
}

impl Door {
    pub(super) fn new(
        caps: Arc<ConnectionCaps>,
        process: Arc<ConnectionCaps>,
        state: Arc<AppState>,
        tls: Option<TlsAcceptor>,
        deadlines: Deadlines,
    ) -> Arc<Door> {
        let metrics = state.metrics.rls_connections.clone();
        Arc::new(Door {
            caps,
            process,
            state,
            tls,
            deadlines,
            metrics,
        })
    }

    /// Places for a connection from `group` (the address as the
    /// per-address cap counts it), or the cap it hit.
    fn admit(&self, group: Option<IpAddr>) -> Result<Places, CapReached> {
        let own = self.caps.admit(group)?;
        let process = self.process.admit_elsewhere()?;
        Ok(Places {
            _own: own,
            _process: process,
        })
    }

    /// The connections of `listener` that are in their places and sent
    /// their preface in time, in the order they did: each one is read in a
    /// task of its own, so one that dawdles delays no other.
    pub(super) fn incoming(
        self: Arc<Self>,
        listener: TcpListener,
    ) -> impl Stream<Item = std::io::Result<RlsConnection>> {
        let (done, connections) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    // The server has stopped taking connections.
                    () = done.closed() => return,
                    accepted = listener.accept() => accepted,
                };
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, most often: accepting again at
                        // once would spin.
                        log::warn!("rls: cannot accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let peer_ip = floodgate_policy::identity::normalize(peer.ip());
                let group = counted_as(&self.state, Some(peer_ip));
                let places = match self.admit(group) {
                    Ok(places) => places,
                    Err(reason) => {
                        self.metrics.refused_at_accept.inc();
                        self.caps.refused(group.or(Some(peer_ip)), reason);
                        // Dropping the stream closes it.
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let (door, done) = (self.clone(), done.clone());
                tokio::spawn(async move {
                    if let Some(connection) = door.open(tcp, peer, places).await {
                        let _ = done.send(Ok(connection)).await;
                    }
                });
            }
        });
        futures_util::stream::unfold(connections, |mut connections| async move {
            let next = connections.recv().await?;
            Some((next, connections))
        })
    }

    /// The connection once its handshake and preface are done, within
    /// `header_timeout` of the accept; none when they were not.
    async fn open(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        places: Places,
    ) -> Option<RlsConnection> {
        let until = Instant::now() + self.deadlines.header_timeout;
        let opened = tokio::time::timeout_at(until, async {
            let mut io: Box<dyn Io> = match &self.tls {
                Some(acceptor) => Box::new(acceptor.accept(tcp).await?),
                None => Box::new(tcp),
            };
            let mut preface = [0u8; PREFACE.len()];
            io.read_exact(&mut preface).await?;
            Ok::<_, std::io::Error>((io, preface))
        })
        .await;
        let (io, preface) = match opened {
            Ok(Ok(opened)) => opened,
            Ok(Err(e)) => {
                log::debug!("rls: connection from {peer} closed before its HTTP/2 preface: {e}");
                return None;
            }
            Err(_) => {
                self.metrics.header_timeouts.inc();
                log::debug!(
                    "rls: connection from {peer} closed: no {}HTTP/2 preface within header_timeout ({:?})",
                    if self.tls.is_some() { "TLS handshake and " } else { "" },
                    self.deadlines.header_timeout
                );
                return None;
            }
        };
        if &preface != PREFACE {
            log::debug!("rls: connection from {peer} closed: it does not speak HTTP/2");
            return None;
        }
        Some(RlsConnection {
            io,
            replay: preface,
            replayed: 0,
            calls: Arc::new(Calls::new()),
            idle: Box::pin(tokio::time::sleep(self.deadlines.idle_timeout)),
            idle_timeout: self.deadlines.idle_timeout,
            ended: false,
            metrics: self.metrics.clone(),
            remote: peer,
            _places: places,
        })
    }
}

/// A connection's calls: how many are in flight, and when the last one
/// began or ended.
#[derive(Debug)]
pub(super) struct Calls {
    in_flight: AtomicUsize,
    /// Milliseconds from `opened` to the last call's start or end.
    last_ms: AtomicU64,
    opened: Instant,
}

impl Calls {
    fn new() -> Calls {
        Calls {
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            opened: Instant::now(),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Release);
    }

    /// A call begins; it ends when what this returns is dropped.
    pub(super) fn begin(self: &Arc<Self>) -> CallInFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        CallInFlight(self.clone())
    }

    /// Since when the connection has had no call; none while one is in
    /// flight.
    fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.opened + Duration::from_millis(self.last_ms.load(Ordering::Acquire)))
    }
}

/// One call in flight on its connection, for as long as it lives.
#[derive(Debug)]
pub(super) struct CallInFlight(Arc<Calls>);

impl Drop for CallInFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What each request of a connection carries in its extensions (tonic
/// puts it there from `Connected`): where the connection's calls are
/// counted.
#[derive(Debug, Clone)]
pub(super) struct ConnectionInfo {
    pub remote: SocketAddr,
    pub calls: Arc<Calls>,
}

/// A connection let through: its preface given back first, and read as
/// ended once it has had no call for the idle timeout.
pub(super) struct RlsConnection {
    io: Box<dyn Io>,
    replay: [u8; PREFACE.len()],
    replayed: usize,
    calls: Arc<Calls>,
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    /// Set once idle: every read from then on ends.
    ended: bool,
    metrics: ConnectionMetrics,
    remote: SocketAddr,
    _places: Places,
}

impl RlsConnection {
    /// Whether the connection has had no call for the idle timeout; else
    /// the timer is set for when it might have.
    fn idle_over(&mut self, cx: &mut Context<'_>) -> bool {
        while self.idle.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            match self.calls.idle_since() {
                Some(since) if now >= since + self.idle_timeout => return true,
                Some(since) => self.idle.as_mut().reset(since + self.idle_timeout),
                None => self.idle.as_mut().reset(now + self.idle_timeout),
            }
        }
        false
    }
}

impl Connected for RlsConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            remote: self.remote,
            calls: self.calls.clone(),
        }
    }
}

impl AsyncRead for RlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(Ok(()));
        }
        // Before the read: a peer that keeps sending (pings, settings)
        // without calls is no less idle.
        if this.idle_over(cx) {
            this.ended = true;
            this.metrics.idle_timeouts.inc();
            log::debug!(
                "rls: connection from {} closed: no call for {:?}",
                this.remote,
                this.idle_timeout
            );
            // An end of stream: the HTTP/2 server finishes the connection.
            return Poll::Ready(Ok(()));
        }
        if this.replayed < this.replay.len() {
            let rest = &this.replay[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for RlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::ConnectionSettings;
    use crate::server::metrics::Metrics;

    /// A connection let through, over one end of an in-memory pipe.
    fn connection(idle_timeout: Duration) -> (RlsConnection, tokio::io::DuplexStream) {
        let metrics = Metrics::new();
        let settings = ConnectionSettings {
            header_timeout: Duration::from_secs(1),
            keepalive_timeout: idle_timeout,
            max_connections: 4,
            max_connections_per_ip: 2,
        };
        let caps = ConnectionCaps::new(&settings, metrics.rls_connections.clone());
        let process = ConnectionCaps::new(&settings, metrics.connections.clone());
        let places = Places {
            _own: caps.admit(None).expect("room"),
            _process: process.admit_elsewhere().expect("room"),
        };
        let (ours, theirs) = tokio::io::duplex(1024);
        let connection = RlsConnection {
            io: Box::new(ours),
            replay: *PREFACE,
            replayed: 0,
            calls: Arc::new(Calls::new()),
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
            idle_timeout,
            ended: false,
            metrics: metrics.rls_connections.clone(),
            remote: SocketAddr::from(([127, 0, 0, 1], 1)),
            _places: places,
        };
        (connection, theirs)
    }

    #[tokio::test(start_paused = true)]
    async fn the_preface_is_read_first_and_a_connection_without_calls_ends() {
        use tokio::io::AsyncWriteExt;
        let (mut connection, mut peer) = connection(Duration::from_secs(60));
        let mut preface = [0u8; PREFACE.len()];
        connection.read_exact(&mut preface).await.expect("replayed");
        assert_eq!(&preface, PREFACE);
        // What the peer sends keeps no connection: only calls do.
        peer.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        connection.read_exact(&mut buf).await.expect("read");
        let started = Instant::now();
        let mut rest = Vec::new();
        connection.read_to_end(&mut rest).await.expect("ends");
        assert!(rest.is_empty());
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert_eq!(connection.metrics.idle_timeouts.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_in_flight_keeps_the_connection_and_its_end_restarts_the_clock() {
        let (mut connection, _peer) = connection(Duration::from_secs(60));
        let mut preface = [0u8; PREFACE.len()];
        connection.read_exact(&mut preface).await.expect("replayed");
        let started = Instant::now();
        let call = connection.calls.begin();
        let calls = connection.calls.clone();
        let reader = tokio::spawn(async move {
            let mut rest = Vec::new();
            connection
                .read_to_end(&mut rest)
                .await
                .map(|_| Instant::now())
        });
        // Longer than the idle timeout with the call in flight, then it ends.
        tokio::time::sleep(Duration::from_secs(150)).await;
        assert!(!reader.is_finished());
        drop(call);
        assert!(calls.idle_since().is_some());
        let ended = reader.await.expect("task").expect("ends");
        assert_eq!(ended - started, Duration::from_secs(210));
    }
}
