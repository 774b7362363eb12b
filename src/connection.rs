//! The connection before any request exists: caps on how many connections
//! are open (in all, and per client address), and deadlines on the request
//! head and on idle keep-alive connections.
//!
//! Pingora reads a request head with a timeout per read (a client that sends
//! one byte every few seconds never trips it) and keeps an idle HTTP/1.1
//! connection forever, and it has no connection cap. So floodgate serves each
//! TCP connection itself (`FrontDoor`, a `ServerApp` around Pingora's proxy):
//!
//! ```text
//! accept -> permit (total cap, per-address cap)   none: closed at once
//!        -> stream wrapped with a HeadClock
//!        -> TLS listeners: the handshake, under the same clock (a handshake
//!           that never completes is as slow as a head that never does)
//!        -> HTTP/2 (ALPN, or the h2c preface): Pingora's HTTP/2 server
//!        -> loop: one HTTP/1 session after another (Pingora parses and proxies)
//! HeadClock: from accept, the first head must be complete within header_timeout;
//!            after a response, the next head's first byte within keepalive_timeout,
//!            then the whole head within header_timeout. A late head gets 408 and
//!            the connection is closed; an idle connection is just closed. A head
//!            larger than MAX_HEAD_BYTES gets 431. A request body must keep up an
//!            average of MIN_BODY_RATE after a grace of header_timeout.
//! ```
//!
//! The proxy tells the clock when a head has been parsed (`head_arrived`) and
//! when a response is over (`await_next_head`), through the connection's
//! user context that Pingora hands to `ProxyHttp::on_connection_reuse`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use log::{debug, warn};
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::listeners::tls::Acceptor;
use pingora::protocols::http::ServerSession;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::TlsRef;
use pingora::protocols::SocketDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, TimingDigest,
    UniqueID, UniqueIDType, ALPN,
};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::metrics::ConnectionMetrics;
use crate::proxy::Gateway;
use crate::state::AppState;

/// `[server]` connection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionSettings {
    pub header_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
}

/// How long a refused address stays quiet in the log.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Beyond this many addresses remembered for log throttling, forget them all.
const REFUSAL_LOG_MEMORY: usize = 10_000;

/// What a late head gets before the connection closes.
const REQUEST_TIMEOUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 33\r\n\r\n{\"error\":\"request_head_timeout\"}\n";

/// What an oversized head gets before the connection closes.
const HEAD_TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 31\r\n\r\n{\"error\":\"request_head_too_large\"}";

/// The largest request head read: Pingora would buffer up to a megabyte per
/// connection. 64 KiB is 8 times what browsers send with many cookies.
pub const MAX_HEAD_BYTES: u64 = 64 * 1024;

/// The slowest average a request body may arrive at, after a grace of
/// `header_timeout`: a phone on a bad link does 10 times better.
pub const MIN_BODY_RATE: u64 = 1024;

// ---------------------------------------------------------------------------
// Caps.

/// Open connections, in all and per client address.
pub struct ConnectionCaps {
    max_total: usize,
    max_per_ip: usize,
    total: AtomicUsize,
    per_ip: Mutex<PerIp>,
    metrics: ConnectionMetrics,
}

#[derive(Default)]
struct PerIp {
    open: HashMap<IpAddr, usize>,
    /// When each address was last logged as refused.
    logged: HashMap<IpAddr, Instant>,
    /// When the last refusal line was written, and how many went unlogged.
    last_line: Option<Instant>,
    unlogged: u64,
}

/// One open connection's place under the caps, given back on drop.
pub struct Permit {
    caps: Arc<ConnectionCaps>,
    /// The address counted against the per-address cap (none for trusted
    /// proxies, which hold many clients' connections).
    counted_as: Option<IpAddr>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.caps.total.fetch_sub(1, Ordering::AcqRel);
        self.caps.metrics.open.dec();
        if let Some(ip) = self.counted_as {
            let mut per_ip = self.caps.lock();
            if let Some(n) = per_ip.open.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    per_ip.open.remove(&ip);
                }
            }
        }
    }
}

/// Why a connection was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapReached {
    Total,
    PerAddress,
}

impl ConnectionCaps {
    pub fn new(settings: &ConnectionSettings, metrics: ConnectionMetrics) -> Arc<Self> {
        Arc::new(ConnectionCaps {
            max_total: settings.max_connections,
            max_per_ip: settings.max_connections_per_ip,
            total: AtomicUsize::new(0),
            per_ip: Mutex::new(PerIp::default()),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, PerIp> {
        // Counts are plain integers: a panic elsewhere leaves them usable.
        self.per_ip.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection from `address` (already grouped: an
    /// IPv6 client by its prefix), or which cap it hit. `None` counts
    /// against the total only.
    pub fn admit(self: &Arc<Self>, address: Option<IpAddr>) -> Result<Permit, CapReached> {
        // Both caps under the one lock, the address's first: a flood that its
        // own cap refuses never takes places from the total meanwhile.
        let mut per_ip = self.lock();
        if let Some(ip) = address {
            if per_ip.open.get(&ip).is_some_and(|&n| n >= self.max_per_ip) {
                return Err(CapReached::PerAddress);
            }
        }
        if self.total.load(Ordering::Acquire) >= self.max_total {
            return Err(CapReached::Total);
        }
        self.total.fetch_add(1, Ordering::AcqRel);
        if let Some(ip) = address {
            *per_ip.open.entry(ip).or_insert(0) += 1;
        }
        drop(per_ip);
        self.metrics.open.inc();
        Ok(Permit {
            caps: self.clone(),
            counted_as: address,
        })
    }

    /// Counts a refusal; logs it unless this address was logged within the
    /// last minute.
    /// `group` is the address as the per-address cap counts it (an IPv6
    /// client by its prefix), so that a /64 cannot write a line per address.
    fn refused(&self, group: Option<IpAddr>, reason: CapReached) {
        let (label, cap) = match reason {
            CapReached::Total => ("total", self.max_total),
            CapReached::PerAddress => ("per_ip", self.max_per_ip),
        };
        self.metrics.refused.with_label_values(&[label]).inc();
        let now = Instant::now();
        let due = {
            let mut per_ip = self.lock();
            if per_ip.logged.len() >= REFUSAL_LOG_MEMORY {
                // Forget only what is a minute old; while the memory is full
                // of fresh addresses, new ones are not logged at all.
                per_ip
                    .logged
                    .retain(|_, at| now.duration_since(*at) < REFUSAL_LOG_INTERVAL);
            }
            let key = group.unwrap_or(IpAddr::from([0, 0, 0, 0]));
            let fresh = per_ip
                .logged
                .get(&key)
                .is_none_or(|at| now.duration_since(*at) >= REFUSAL_LOG_INTERVAL);
            let room = per_ip.logged.len() < REFUSAL_LOG_MEMORY || per_ip.logged.contains_key(&key);
            // And at most one such line a second over all addresses.
            let quiet = per_ip
                .last_line
                .is_some_and(|at| now.duration_since(at) < Duration::from_secs(1));
            if fresh && room && !quiet {
                per_ip.logged.insert(key, now);
                per_ip.last_line = Some(now);
                Some(std::mem::take(&mut per_ip.unlogged))
            } else {
                per_ip.unlogged += 1;
                None
            }
        };
        if let Some(unlogged) = due {
            let who = group.map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
            warn!(
                "connection from {who} closed at once: {label} connection cap ({cap}) reached (logged once a minute per address; {unlogged} refusals since the last line not logged)"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Deadlines.

/// When the next request head must have arrived on one connection.
pub struct HeadClock {
    header_timeout: Duration,
    keepalive_timeout: Duration,
    state: Mutex<ClockState>,
}

#[derive(Debug, Clone, Copy)]
enum ClockState {
    /// Between requests: the next head's first byte is due by then.
    Idle { until: Instant },
    /// A head is arriving: it must be complete by then, and stay small.
    Head { until: Instant, bytes: u64 },
    /// The request body is arriving: at MIN_BODY_RATE on average after a
    /// grace of header_timeout.
    Body { since: Instant, bytes: u64 },
    /// Head and body are in; the upstream's timeouts apply until the
    /// response is over.
    InRequest,
}

/// What a read in the current state ran into.
enum Overrun {
    /// The deadline passed while waiting for a head (408) or a body.
    Late { head: bool },
    /// The head grew past MAX_HEAD_BYTES (431).
    HeadTooLarge,
}

impl fmt::Debug for HeadClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HeadClock({:?})", self.state())
    }
}

impl HeadClock {
    /// The clock of a connection accepted now: its first head is due within
    /// `header_timeout`, counted from the accept (a connection that sends
    /// nothing is as slow as one that trickles).
    pub fn new(header_timeout: Duration, keepalive_timeout: Duration) -> Arc<Self> {
        Arc::new(HeadClock {
            header_timeout,
            keepalive_timeout,
            state: Mutex::new(ClockState::Head {
                until: Instant::now() + header_timeout,
                bytes: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn state(&self) -> ClockState {
        *self.lock()
    }

    /// A whole head was parsed.
    pub fn head_arrived(&self) {
        *self.lock() = ClockState::InRequest;
    }

    /// The request has a body to come: it must keep up MIN_BODY_RATE.
    pub fn body_expected(&self) {
        *self.lock() = ClockState::Body {
            since: Instant::now(),
            bytes: 0,
        };
    }

    /// The whole body is in.
    pub fn body_arrived(&self) {
        let mut state = self.lock();
        if let ClockState::Body { .. } = *state {
            *state = ClockState::InRequest;
        }
    }

    /// A response is over: the connection idles until the next head starts.
    pub fn await_next_head(&self) {
        *self.lock() = ClockState::Idle {
            until: Instant::now() + self.keepalive_timeout,
        };
    }

    /// `n` bytes arrived: an idle connection starts its next head; a head
    /// or a body counts them. Whether the head has grown too large.
    fn bytes_arrived(&self, n: u64) -> Option<Overrun> {
        let mut state = self.lock();
        match &mut *state {
            ClockState::Idle { .. } => {
                *state = ClockState::Head {
                    until: Instant::now() + self.header_timeout,
                    bytes: n,
                };
            }
            ClockState::Head { bytes, .. } | ClockState::Body { bytes, .. } => *bytes += n,
            ClockState::InRequest => {}
        }
        match *state {
            ClockState::Head { bytes, .. } if bytes > MAX_HEAD_BYTES => Some(Overrun::HeadTooLarge),
            _ => None,
        }
    }

    /// When a read that is still waiting must give up, and what that means.
    fn deadline(&self) -> Option<(Instant, bool)> {
        match self.state() {
            ClockState::InRequest => None,
            ClockState::Idle { until } => Some((until, false)),
            ClockState::Head { until, .. } => Some((until, true)),
            ClockState::Body { since, bytes } => Some((
                since + self.header_timeout + Duration::from_secs(bytes / MIN_BODY_RATE),
                false,
            )),
        }
    }
}

/// The client's stream, read under the connection's `HeadClock`.
pub struct GuardedStream {
    inner: Stream,
    clock: Arc<HeadClock>,
    timer: Pin<Box<Sleep>>,
    /// Set once the deadline passed: reads end the connection from then on.
    expired: bool,
    /// Whether a 408/431 may be written as bytes: not under TLS, where the
    /// clock watches the encrypted stream.
    plaintext: bool,
    /// Armed while a write waits for the client to read: it may wait
    /// `keepalive_timeout`, then the connection goes. Made only when a write
    /// first blocks (most connections never need it).
    write_timer: Option<Pin<Box<Sleep>>>,
    /// Bytes already read from `inner` that reads give back first (the
    /// HTTP/2 preface read off a TLS stream).
    replay: Vec<u8>,
    /// Whether a blocked write counts against `keepalive_timeout` here (not
    /// above TLS, where the stream below already counts it).
    guards_writes: bool,
    metrics: ConnectionMetrics,
}

impl fmt::Debug for GuardedStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedStream")
            .field("inner", &self.inner)
            .field("clock", &self.clock)
            .finish()
    }
}

impl GuardedStream {
    pub fn new(
        inner: Stream,
        clock: Arc<HeadClock>,
        metrics: ConnectionMetrics,
        plaintext: bool,
    ) -> Self {
        GuardedStream {
            inner,
            clock,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            expired: false,
            plaintext,
            write_timer: None,
            replay: Vec::new(),
            guards_writes: true,
            metrics,
        }
    }

    /// `inner` with `replay` read back first, under no head deadline (the
    /// stream below keeps its own clock).
    pub fn replaying(inner: Stream, replay: Vec<u8>, metrics: ConnectionMetrics) -> Self {
        let clock = HeadClock::new(Duration::ZERO, Duration::ZERO);
        clock.head_arrived();
        let mut stream = GuardedStream::new(inner, clock, metrics, false);
        stream.replay = replay;
        stream.guards_writes = false;
        stream
    }

    /// Ends the stream, telling the client why where a head was due.
    fn expire(&mut self, cx: &mut Context<'_>, why: Overrun) {
        self.expired = true;
        let answer = match why {
            Overrun::Late { head: true } => {
                self.metrics.header_timeouts.inc();
                debug!("request head not complete in time: 408, closing");
                Some(REQUEST_TIMEOUT)
            }
            Overrun::HeadTooLarge => {
                self.metrics.header_timeouts.inc();
                debug!("request head larger than {MAX_HEAD_BYTES} bytes: 431, closing");
                Some(HEAD_TOO_LARGE)
            }
            Overrun::Late { head: false } => {
                self.metrics.idle_timeouts.inc();
                None
            }
        };
        if let Some(answer) = answer.filter(|_| self.plaintext) {
            // Small enough for any socket buffer; if it does not fit at
            // once, the connection closes without it.
            let _ = Pin::new(&mut *self.inner).poll_write(cx, answer);
            let _ = Pin::new(&mut *self.inner).poll_flush(cx);
        }
    }
}

impl GuardedStream {
    /// What a write (or flush) came to: a blocked one counts towards the
    /// write deadline, any other outcome clears it.
    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match poll {
            Poll::Pending => match self.write_deadline_passed(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            ready => {
                self.write_timer = None;
                ready
            }
        }
    }

    /// A write is waiting for the client to read: fine for a while; a client
    /// that stops reading (or pipelines without ever reading) is let go
    /// after `keepalive_timeout`. The error, once that time has passed.
    fn write_deadline_passed(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        if !self.guards_writes {
            return None;
        }
        let limit = self.clock.keepalive_timeout;
        let timer = self
            .write_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        timer.as_mut().poll(cx).is_ready().then(|| {
            self.metrics.idle_timeouts.inc();
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing for keepalive_timeout",
            )
        })
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.expired {
            // End of stream: Pingora closes the connection.
            return Poll::Ready(Ok(()));
        }
        if !self.replay.is_empty() {
            let n = self.replay.len().min(buf.remaining());
            buf.put_slice(&self.replay[..n]);
            self.replay.drain(..n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut *this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = (buf.filled().len() - before) as u64;
                if read > 0 {
                    if let Some(overrun) = this.clock.bytes_arrived(read) {
                        this.expire(cx, overrun);
                        buf.set_filled(before);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let Some((until, head)) = this.clock.deadline() else {
                    return Poll::Pending;
                };
                // Re-arming a timer costs a trip to the runtime's timer
                // wheel; deadlines move later with every request, so the
                // timer is moved only when the deadline came earlier, and a
                // timer that fires before the deadline is re-armed then.
                if until < this.timer.deadline() || this.timer.is_elapsed() {
                    this.timer.as_mut().reset(until);
                }
                loop {
                    match this.timer.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(()) if Instant::now() >= until => {
                            this.expire(cx, Overrun::Late { head });
                            return Poll::Ready(Ok(()));
                        }
                        Poll::Ready(()) => this.timer.as_mut().reset(until),
                    }
                }
            }
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut *this.inner).poll_write(cx, buf);
        this.after_write(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut *this.inner).poll_flush(cx);
        this.after_write(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut *this.inner).poll_write_vectored(cx, bufs);
        this.after_write(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

// The rest of Pingora's stream interface passes straight through.

#[async_trait]
impl Shutdown for GuardedStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for GuardedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for GuardedStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for GuardedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for GuardedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for GuardedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for GuardedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

// ---------------------------------------------------------------------------
// The front door.

/// What a connection speaks, found out by `FrontDoor::protocol`.
enum Protocol {
    Http1(Stream),
    Http2(Stream),
}

/// Serves each accepted connection: caps, then HTTP/1 sessions one after the
/// other under the connection's `HeadClock`.
pub struct FrontDoor {
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
    pub fn new(
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
                return Some(Protocol::Http1(stream));
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
            let replayed = GuardedStream::replaying(stream, preface, self.caps.metrics.clone());
            return Some(Protocol::Http2(Box::new(replayed)));
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
            Ok(Ok(true)) if whole == PREFACE => Some(Protocol::Http2(stream)),
            _ => None,
        }
    }

    /// Pingora's own per-read keep-alive timeout, kept out of the way of the
    /// clock's deadlines (it would close silently where a 408 is due).
    fn backstop_secs(&self) -> u64 {
        self.settings
            .header_timeout
            .max(self.settings.keepalive_timeout)
            .as_secs()
            + 1
    }
}

fn peer_of(stream: &Stream) -> Option<IpAddr> {
    let digest = stream.get_socket_digest()?;
    let addr = digest.peer_addr()?.as_inet()?;
    Some(crate::identity::normalize(addr.ip()))
}

#[async_trait]
impl ServerApp for FrontDoor {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let peer = peer_of(&stream);
        let counted_as = peer.and_then(|ip| {
            let runtime = self.state.runtime.load();
            runtime.policy.clients.connection_group(ip)
        });
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
            Protocol::Http2(stream) => {
                clock.head_arrived();
                return ServerApp::process_new(&self.proxy, stream, shutdown).await;
            }
            Protocol::Http1(stream) => stream,
        };
        let mut persisted = None;
        loop {
            let mut session = ServerSession::new_http1(stream);
            if let Some(settings) = persisted {
                pingora::apps::HttpPersistentSettings::apply_to_session(settings, &mut session);
            }
            // After the persisted settings, which say "forever" for HTTP/1.1.
            if *shutdown.borrow() {
                session.set_keepalive(None);
            } else {
                session.set_keepalive(Some(self.backstop_secs()));
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
pub struct AdminDoor<A> {
    app: Arc<A>,
    caps: Arc<ConnectionCaps>,
    lifetime: Duration,
}

/// Admin connections open at once, out of the descriptors the proxy keeps
/// back from its own cap.
pub const ADMIN_CONNECTIONS: usize = 32;

impl<A> AdminDoor<A> {
    pub fn new(app: A, metrics: ConnectionMetrics, lifetime: Duration) -> Self {
        let settings = ConnectionSettings {
            header_timeout: lifetime,
            keepalive_timeout: lifetime,
            max_connections: ADMIN_CONNECTIONS,
            max_connections_per_ip: ADMIN_CONNECTIONS,
        };
        AdminDoor {
            app: Arc::new(app),
            caps: ConnectionCaps::new(&settings, metrics),
            lifetime,
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
        let peer = peer_of(&stream);
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

/// HTTP/2 requests in flight per client address (grouped as the connection
/// cap groups them): streams multiply what one connection can hold, so
/// they count against `max_connections_per_ip` on their own.
pub struct StreamCaps {
    max_per_address: usize,
    in_flight: Mutex<HashMap<IpAddr, usize>>,
}

/// One HTTP/2 request's place, given back when the request ends.
pub struct StreamPermit {
    caps: Arc<StreamCaps>,
    address: IpAddr,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut in_flight = self
            .caps
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = in_flight.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.address);
            }
        }
    }
}

impl StreamCaps {
    pub fn new(max_per_address: usize) -> Arc<Self> {
        Arc::new(StreamCaps {
            max_per_address,
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more request from `address`, or none.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Option<StreamPermit> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = in_flight.entry(address).or_insert(0);
        if *n >= self.max_per_address {
            return None;
        }
        *n += 1;
        Some(StreamPermit {
            caps: self.clone(),
            address,
        })
    }
}
