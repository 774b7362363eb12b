//! floodgate: an edge rate-limiting reverse proxy on Pingora.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cli;
pub mod clients;
pub mod config;
pub mod connection;
pub mod protection;
pub mod proxy;
pub mod rls;
pub mod server;
pub mod tracing;
pub mod usage;
