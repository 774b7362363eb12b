//! Who is asking, and which limits their request meets.
//!
//! `identity` reads a request's client (its address behind trusted proxies,
//! its key from a header, cookie, query, host, route or verified JWT claim,
//! its tier); `blocklist` refuses addresses and keys outright; `Policy`
//! compiles the configured limits and plans a request's layers, with their
//! numbers (tier overrides applied) and cost. Nothing here speaks HTTP to a
//! client or touches a store: the proxy hands the plan to the limiter.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod blocklist;
pub mod body;
mod descriptors;
mod glob;
pub mod identity;
pub mod jwt;
pub mod overrides;
pub mod path;
pub mod request_id;
mod sharded;

mod charged_by_response;
mod limit;
mod matcher;
mod policy;

pub use charged_by_response::*;
pub use limit::*;
pub use matcher::*;
pub use policy::*;
