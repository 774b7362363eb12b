//! The client's stream, read and written under its connection's clock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use log::debug;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::TlsRef;
use pingora::protocols::SocketDigest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, TimingDigest,
    UniqueID, UniqueIDType, ALPN,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::clock::{HeadClock, Overrun, MAX_HEAD_BYTES};
use super::h2_watch::{ClientFrames, H2Watch, ServerFrames};
use crate::server::metrics::ConnectionMetrics;

/// What a late head gets before the connection closes.
const REQUEST_TIMEOUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 33\r\n\r\n{\"error\":\"request_head_timeout\"}\n";

/// What an oversized head gets before the connection closes.
const HEAD_TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 34\r\n\r\n{\"error\":\"request_head_too_large\"}";

/// The client's stream, read under the connection's `HeadClock`.
pub(crate) struct GuardedStream {
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
    /// An HTTP/2 connection's frames, read and written through its watch.
    h2: Option<Box<Frames>>,
    metrics: ConnectionMetrics,
}

/// An HTTP/2 connection's two directions, and what was read but not yet
/// handed to the h2 server.
struct Frames {
    client: ClientFrames,
    server: ServerFrames,
    /// Read from the client, passed by the watch, not yet handed on.
    ready: Vec<u8>,
    /// Where reads from the client land before the watch sees them.
    scratch: Box<[u8]>,
    /// How much of `ready` the h2 server has been given.
    ready_given: usize,
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
    pub(crate) fn new(
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
            h2: None,
            metrics,
        }
    }

    /// An HTTP/2 connection's stream, its frames followed by `watch` (see
    /// `h2_watch`), `replay` (bytes already read from `inner`: the preface
    /// read off a TLS stream) read first.
    pub(crate) fn watching(
        inner: Stream,
        replay: Vec<u8>,
        watch: Arc<H2Watch>,
        metrics: ConnectionMetrics,
    ) -> Self {
        let mut stream = GuardedStream::replaying(inner, Vec::new(), metrics);
        let mut frames = Frames {
            client: ClientFrames::new(watch.clone()),
            server: ServerFrames::new(watch),
            ready: Vec::new(),
            scratch: vec![0u8; 16 * 1024].into_boxed_slice(),
            ready_given: 0,
        };
        frames.client.read(&replay, &mut frames.ready);
        stream.h2 = Some(Box::new(frames));
        stream
    }

    /// `inner` with `replay` read back first, under no head deadline (the
    /// stream below keeps its own clock).
    pub(crate) fn replaying(inner: Stream, replay: Vec<u8>, metrics: ConnectionMetrics) -> Self {
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
    /// An HTTP/2 connection whose client is gone writes nowhere while it
    /// finishes its exchanges: true when `bufs` were taken (and read by
    /// the watch) that way.
    fn gone_client_written(&mut self, bufs: &[std::io::IoSlice<'_>]) -> bool {
        let Some(frames) = self.h2.as_mut() else {
            return false;
        };
        if !frames.client.watch().client_gone() {
            return false;
        }
        for buf in bufs {
            frames.server.wrote(buf);
        }
        true
    }

    /// What an HTTP/2 write came to, told to the watch: the bytes written,
    /// or (a client gone) all of them, from now on written nowhere.
    fn h2_wrote(
        &mut self,
        bufs: &[std::io::IoSlice<'_>],
        poll: Poll<std::io::Result<usize>>,
    ) -> Poll<std::io::Result<usize>> {
        let Some(frames) = self.h2.as_mut() else {
            return poll;
        };
        match poll {
            Poll::Ready(Ok(mut n)) => {
                let written = n;
                for buf in bufs {
                    let take = n.min(buf.len());
                    frames.server.wrote(&buf[..take]);
                    n -= take;
                }
                Poll::Ready(Ok(written))
            }
            Poll::Ready(Err(e)) if client_gone(&e) => {
                frames.client.watch().client_left();
                for buf in bufs {
                    frames.server.wrote(buf);
                }
                Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()))
            }
            other => other,
        }
    }

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

/// Errors that mean the client is gone, as its end of file does: a reset,
/// a TLS stream closed without its close_notify or broken by a bad record
/// or an alert. Read as the end, so that a request the client abandons runs
/// to its answer as one it half-closes does (the gateway keeps the
/// exchange; writes fail then).
fn client_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | UnexpectedEof | BrokenPipe | InvalidData
    )
}

impl GuardedStream {
    /// A read on an HTTP/2 connection: what the watch lets through of the
    /// client's frames, and what it adds between them.
    fn poll_read_h2(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let Some(frames) = self.h2.as_mut() else {
                return Poll::Ready(Ok(()));
            };
            if frames.ready_given < frames.ready.len() {
                let rest = &frames.ready[frames.ready_given..];
                let n = rest.len().min(buf.remaining());
                buf.put_slice(&rest[..n]);
                frames.ready_given += n;
                if frames.ready_given == frames.ready.len() {
                    frames.ready.clear();
                    frames.ready_given = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let watch = frames.client.watch().clone();
            let between = frames.client.between_frames();
            if between && watch.has_inbound() {
                let n = watch.pending_inbound(buf.initialize_unfilled(), cx.waker());
                if n > 0 {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
            }
            if between && watch.client_gone() && watch.finished() {
                return Poll::Ready(Ok(()));
            }
            if watch.client_gone() && !between {
                // Gone halfway through a frame: nothing more can be said on
                // this connection.
                return Poll::Ready(Ok(()));
            }
            if !watch.client_gone() {
                let mut scratch = ReadBuf::new(&mut frames.scratch);
                match Pin::new(&mut *self.inner).poll_read(cx, &mut scratch) {
                    Poll::Ready(Ok(())) if !scratch.filled().is_empty() => {
                        let filled = scratch.filled().len();
                        frames
                            .client
                            .read(&frames.scratch[..filled], &mut frames.ready);
                        continue;
                    }
                    Poll::Ready(Ok(())) => {
                        watch.client_left();
                        continue;
                    }
                    Poll::Ready(Err(e)) if client_gone(&e) => {
                        watch.client_left();
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            }
            // Nothing to read: late bodies are cut, and the timer set for
            // the next deadline, a half-sent frame's among them.
            let now = Instant::now();
            let mut next = watch.tick(now, cx.waker());
            let cut = watch.take_cut();
            if !cut.is_empty() {
                self.metrics.idle_timeouts.inc_by(cut.len() as u64);
            }
            if let Some((id, until)) = self.h2.as_ref().and_then(|f| f.client.inside_frame()) {
                if until <= now || cut.contains(&id) {
                    // A frame left half sent: nothing of the watch's can go
                    // in before it ends, so the connection goes.
                    self.metrics.idle_timeouts.inc();
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "an HTTP/2 frame stayed half sent past its time",
                    )));
                }
                next = Some(next.map_or(until, |n| n.min(until)));
            }
            if between && watch.has_inbound() {
                continue;
            }
            let Some(next) = next else {
                return Poll::Pending;
            };
            self.timer.as_mut().reset(next);
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.h2.is_some() {
            return self.poll_read_h2(cx, buf);
        }
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
            Poll::Ready(Err(e)) if client_gone(&e) => Poll::Ready(Ok(())),
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
        if this.gone_client_written(std::slice::from_ref(&std::io::IoSlice::new(buf))) {
            return Poll::Ready(Ok(buf.len()));
        }
        let poll = Pin::new(&mut *this.inner).poll_write(cx, buf);
        let poll = this.after_write(cx, poll);
        this.h2_wrote(std::slice::from_ref(&std::io::IoSlice::new(buf)), poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.gone_client_written(&[]) {
            return Poll::Ready(Ok(()));
        }
        let poll = Pin::new(&mut *this.inner).poll_flush(cx);
        this.after_write(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.gone_client_written(&[]) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.gone_client_written(bufs) {
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        let poll = Pin::new(&mut *this.inner).poll_write_vectored(cx, bufs);
        let poll = this.after_write(cx, poll);
        this.h2_wrote(bufs, poll)
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
