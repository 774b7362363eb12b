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
//! accept -> over a cap already? (AcceptFilter, in Pingora's accept loop) closed at once
//!        -> permit (total cap, per-address cap)   none: closed at once
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

mod accept;
pub(crate) mod caps;
pub(crate) mod clock;
mod door;
mod guarded;
pub(crate) mod h2_watch;
mod hpack_bounds;

pub(crate) use accept::AcceptFilter;
// The rate limit service's listener counts its connections in these caps too.
#[cfg(feature = "rls")]
pub(crate) use accept::counted_as;
#[cfg(feature = "rls")]
pub(crate) use caps::{CapReached, Permit};
pub(crate) use caps::{ConnectionCaps, ConnectionSettings};
pub(crate) use door::{AdminDoor, FrontDoor};
