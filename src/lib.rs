//! floodgate: an edge rate-limiting reverse proxy on Pingora.
#![forbid(unsafe_code)]

pub use floodgate_algorithm as algorithm;
pub use floodgate_limiter as limiter;
pub use floodgate_limiter::{clock, log_throttle};
pub use floodgate_policy as policy;
pub use floodgate_policy::{blocklist, identity, jwt, path, request_id};

pub mod access_log;
pub mod admin;
pub mod client_headers;
pub mod clients;
pub mod config;
pub mod connection;
pub mod constant_time;
pub mod header_name;
pub mod headers;
pub mod metrics;
pub mod protection;
pub mod proxy;
pub mod refusal_log;
pub mod rls;
pub mod server;
pub mod signals;
pub mod simulate;
pub mod state;
pub mod status;
pub mod summary;
pub mod tls;
pub mod tracing;
pub mod upstream;
pub mod usage;
