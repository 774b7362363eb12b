//! floodgate: an edge rate-limiting reverse proxy on Pingora.
#![forbid(unsafe_code)]

pub use floodgate_algorithm as algorithm;
pub use floodgate_limiter as limiter;
pub use floodgate_limiter::{clock, log_throttle};
pub use floodgate_policy as policy;
pub use floodgate_policy::{blocklist, identity, jwt, path, request_id};

pub mod admin;
pub mod clients;
pub mod config;
pub mod connection;
pub mod protection;
pub mod proxy;
pub mod rls;
pub mod server;
pub mod simulate;
pub mod summary;
pub mod tracing;
pub mod usage;
