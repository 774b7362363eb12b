//! floodgate: an edge rate-limiting reverse proxy on Pingora.
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod clock;
pub mod config;
pub mod identity;
pub mod policy;
