//! floodgate: an edge rate-limiting reverse proxy on Pingora.
#![forbid(unsafe_code)]
// The library's surface is what the binary, tests, benches and examples
// use; everything else is the crate's own.
#![warn(unreachable_pub)]

mod admin;
pub mod cli;
pub mod clients;
pub mod config;
mod connection;
pub mod protection;
pub mod proxy;
mod rls;
pub mod server;
mod tracing;
pub mod usage;
