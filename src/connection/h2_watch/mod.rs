//! An HTTP/2 connection's streams as its frames tell them, read below the
//! h2 server: which requests are whole, which are answered, how fast a
//! body comes.
//!
//! A client that resets a stream (or closes the connection) once its
//! request is whole does not stop the upstream's work on it. So the reset
//! (or the close) is held back until the stream is answered: the exchange
//! with the upstream runs to its end, the request keeps its place under the
//! per-address cap and its concurrency slots until then, and a client
//! cannot put more work in flight at the upstream by cancelling. A body
//! that does not come in time is cut: at the body floor (`MIN_BODY_RATE`
//! after a grace of `header_timeout`, counted from the stream's head)
//! unless the route is exempt, and at the deadline of a request that holds
//! a slot. A cut is a PRIORITY frame making the stream depend on itself,
//! given to the h2 server as if the client had sent it: a stream error the
//! h2 server answers itself, resetting the stream towards the client and
//! discarding its late frames, so the connection's other streams go on.
//!
//! Requests learn their stream: the first header block of each stream gets
//! one more header, `floodgate-h2-stream: <watch>:<stream>`, appended as a
//! CONTINUATION frame (a literal the HPACK decoder reads without touching
//! its table), which the gateway reads and removes (`H2Stream::named`).
//! The watch's own frames go in only between two of the client's; a
//! client that keeps a frame half sent longer than its length at the body
//! floor allows loses the connection.
//!
//! The parts, each depending only on those above it: `wire` (the frame
//! layout), `naming` (the header naming a stream), `stream` (one stream's
//! state), `watch` (a connection's streams), `h2_stream` (a request's hold
//! on its stream), and the two readers, `client` (the client's bytes, read
//! before the h2 server reads them) and `server` (what it writes back).

mod client;
mod h2_stream;
mod naming;
mod server;
mod stream;
mod watch;
mod wire;

pub(super) use client::ClientFrames;
pub(crate) use h2_stream::H2Stream;
pub(crate) use naming::{stream_header, STREAM_HEADER_NAME};
pub(super) use server::ServerFrames;
pub(crate) use watch::H2Watch;

#[cfg(test)]
mod tests;
