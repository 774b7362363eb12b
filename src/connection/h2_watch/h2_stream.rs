//! A request's hold on its HTTP/2 stream: how the gateway, given the
//! header naming the stream, finds the connection's watch, and what the
//! request then tells the watch (its body's floor and deadline) and asks it
//! (whether its exchange was cut while whole). A stream is held by one
//! request at most and only from its own connection, so a client cannot
//! name another's stream and change its deadlines.

use std::sync::Arc;

use pingora::protocols::SocketDigest;
use tokio::time::Instant;

use super::naming::parse_name;
use super::stream::Stream;
use super::watch::H2Watch;

/// A request's stream on its connection's watch.
pub(crate) struct H2Stream {
    pub(super) watch: Arc<H2Watch>,
    pub(super) id: u32,
}

impl H2Stream {
    /// The stream a request's `STREAM_HEADER` value (`stream_header`) names,
    /// if it is a stream of the request's own connection (`socket`, its
    /// digest's) that no other request holds.
    pub(crate) fn named(
        value: &http::HeaderValue,
        socket: Option<&Arc<SocketDigest>>,
    ) -> Option<H2Stream> {
        let (watch, id) = parse_name(value)?;
        let watch = H2Watch::registered(watch)?;
        let same_connection = match (&watch.socket, socket) {
            (Some(own), Some(request)) => Arc::ptr_eq(own, request),
            (None, None) => true,
            _ => false,
        };
        if !same_connection {
            return None;
        }
        let stream = watch.shared().streams.get_mut(&id).map(|stream| {
            let free = !stream.claimed;
            stream.claimed = true;
            free
        });
        stream
            .is_some_and(|free| free)
            .then_some(H2Stream { watch, id })
    }

    /// Whether the stream's request is whole and its exchange was cut
    /// before the answer came (its connection torn down, or reset by the h2
    /// server for an error the client provoked): the upstream may still be
    /// working on it.
    pub(crate) fn cut_while_whole(&self) -> bool {
        self.watch
            .shared()
            .streams
            .get(&self.id)
            .is_some_and(Stream::whole_unanswered)
    }

    /// The route's body may rightly be slow and long (a client-streaming
    /// gRPC call): no floor.
    pub(crate) fn exempt_from_body_floor(&self) {
        self.watch.with_stream(self.id, |s| s.floor = false);
    }

    /// The whole body must have come by `until` (a request holding slots).
    pub(crate) fn body_deadline(&self, until: Instant) {
        self.watch.with_stream(self.id, |s| {
            s.deadline = Some(s.deadline.map_or(until, |d| d.min(until)));
        });
    }
}

impl Drop for H2Stream {
    /// The request is over: the stream is the watch's to forget once
    /// nothing more happens on it.
    fn drop(&mut self) {
        let mut shared = self.watch.shared();
        if let Some(stream) = shared.streams.get_mut(&self.id) {
            stream.claimed = false;
            if stream.held.is_none() {
                shared.streams.remove(&self.id);
            }
        }
    }
}
