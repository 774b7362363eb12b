//! floodgate: an edge rate-limiting reverse proxy on Pingora.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod algorithm;
pub mod blocklist;
pub mod client_headers;
pub mod clock;
pub mod config;
pub mod connection;
pub mod header_name;
pub mod headers;
pub mod identity;
pub mod jwt;
pub mod limiter;
pub mod log_throttle;
pub mod metrics;
pub mod path;
pub mod policy;
pub mod proxy;
pub mod request_id;
pub mod server;
pub mod signals;
pub mod simulate;
pub mod state;
pub mod status;
pub mod summary;
pub mod tls;
pub mod upstream;
