//! The Pingora `ProxyHttp` implementation: phase hooks only, no arithmetic.
//!
//! ```text
//! (connection)     caps and head deadlines: see `connection`
//! request_filter   received (`receive`): strict framing: a Content-Length
//!                  list, CL with TE, no Host: 400 (`framing`); canonical
//!                  path (the upstream gets it too)
//!                  identify -> plan layers (`planning`) -> decided (`decide`: bans
//!                  peeked, slots taken (`slots`), the rest in one store
//!                  call, all or nothing)
//!                  refused: 429 written here (`answer`), upstream never touched
//!                  leaky bucket: wait for the slot, then go on
//! upstream_peer    round robin over [upstream].servers, each server at most
//!                  once per request (fail_to_connect decides the retry)
//! upstream_request_filter  Host for HTTP/1.0 requests that had none;
//!                  X-Forwarded-* and the request id (`forwarding`)
//! response_filter  layers charged by the response charged (`charges`): a
//!                  listed status, a reported cost (its header hidden);
//!                  rate-limit headers of the most constrained layer
//! fail_to_proxy    upstream down or slow: 502 / 504 with a JSON body, one
//!                  warn line per failed request (Pingora's own are off: they
//!                  carry query strings)
//! logging          what a request that got no response owes (`charges`),
//!                  slots given back, the verdict counted per layer, one line
//!                  per refusal (`verdict`), a refusal's strike toward a ban
//!                  (`strikes`), the access log line (`access`), metrics; the
//!                  connection's head clock starts again
//! ```

mod access;
pub mod access_log;
mod accounting;
mod answer;
mod charges;
pub mod client_headers;
mod ctx;
mod decide;
mod forwarding;
mod framing;
mod gateway;
mod header_edit;
pub mod header_name;
pub mod headers;
mod planning;
mod receive;
pub mod refusal_log;
mod request_body;
mod request_id;
mod slots;
mod strikes;
mod traced;
pub mod upstream;
mod verdict;

pub use gateway::Gateway;
