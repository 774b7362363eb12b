//! What Pingora keeps for one request between its phases.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::proxy::Session;

use super::request_id::RequestId;
use super::slots::HeldSlots;
use super::verdict::Verdict;
use crate::connection::clock::HeadClock;
use crate::connection::h2_watch::H2Stream;
use crate::server::state::{InFlight, Runtime};
use floodgate_algorithm::Decision;
use floodgate_limiter::Check;
use floodgate_policy::identity::Client;
use floodgate_policy::ChargedByResponse;

pub struct RequestCtx {
    pub(super) runtime: Arc<Runtime>,
    /// Kept from a trusted proxy or generated; every answer carries it.
    pub(super) request_id: RequestId,
    /// Who asked, once identified: the upstream is told.
    pub(super) client: Option<Client>,
    /// The connection's head deadline (see `connection`).
    pub(super) head_clock: Option<Arc<HeadClock>>,
    /// An HTTP/2 request's place under the per-address cap, for its lifetime
    /// (and past it, when its exchange was cut while the upstream worked).
    pub(super) stream_permit: Option<crate::connection::caps::StreamPermit>,
    /// Upstream servers tried so far, and where the round started.
    pub(super) tries: usize,
    pub(super) first_server: usize,
    /// For the access log and the duration metrics.
    pub(super) started: Instant,
    /// An HTTP/2 request's stream on its connection's watch.
    pub(super) h2_stream: Option<H2Stream>,
    pub(super) upstream_sent: Option<Instant>,
    pub(super) upstream_took: Option<Duration>,
    /// The concurrency slots this request holds.
    pub(super) slots: Option<HeldSlots>,
    /// Layers charged by the response, reserved: to settle once it is
    /// known.
    pub(super) reservations: Vec<Reservation>,
    /// Layers charged by what the response's body reports, read as it
    /// passes: settled once the exchange is over.
    pub(super) by_body: Vec<BodyCharge>,
    /// The upstream's body came to its end.
    pub(super) body_ended: bool,
    /// The upstream's status, once it answered.
    pub(super) upstream_status: Option<u16>,
    /// What the limits said, once decided.
    pub(super) verdict: Option<Verdict>,
    /// Rate-limit headers to add to the upstream's response.
    pub(super) rate_headers: Vec<crate::proxy::headers::Header>,
    /// The body read before the decision (`request_body`), boxed: most
    /// requests have none, and every byte of the context is copied as
    /// Pingora moves a request's future.
    pub(super) held: Option<Box<HeldBody>>,
    /// A place among the requests in flight to a protected upstream.
    pub(super) protection: Option<crate::protection::Permit>,
    /// Its spans (`[tracing]`), boxed as the held body is.
    pub(super) trace: Option<Box<crate::tracing::RequestTrace>>,

    pub(super) _in_flight: InFlight,
}

/// A body read before the decision, sent upstream in place of what Pingora
/// replays.
pub(super) struct HeldBody {
    pub(super) bytes: bytes::Bytes,
    /// Made to ask for its stream's usage (`include_usage`).
    pub(super) usage_asked: bool,
    /// Takes the usage chunk the client did not ask for out of its stream.
    pub(super) stripper: Option<crate::usage::include_usage::UsageChunkStripper>,
}

/// A layer charged by the usage its response's body reports, and the
/// reader of that body (none for an answer that reports none: not JSON nor
/// an event stream, or no success).
pub(super) struct BodyCharge {
    pub(super) reservation: Reservation,
    pub(super) reader: Option<crate::usage::UsageReader>,
}

/// A layer charged by the response, as it was reserved before the request
/// went upstream (`charges` settles it).
#[derive(Debug)]
pub(super) struct Reservation {
    /// The layer; its cost is the units reserved.
    pub(super) check: Check,
    /// How the response settles it.
    pub(super) charged_by: ChargedByResponse,
    /// What reserving said: whether the units were taken (a shadow layer
    /// that would refuse takes none) and where they are counted.
    pub(super) decision: Decision,
}

pub(super) fn peer_ip(session: &Session) -> IpAddr {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip())
}
