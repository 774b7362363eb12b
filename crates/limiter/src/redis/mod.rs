//! Limit state in Redis: every decision is one atomic Lua script run (by
//! SHA), so any number of proxies share one budget without a
//! read-check-write race.
//!
//! Two stores share this module's script, keys and reply format:
//! `RedisStandalone` (one node; concurrent decisions share script runs) and
//! `RedisCluster` (layers grouped by identity, one run per group).

mod batch;
pub mod beside_limits;
pub mod change_message;
pub mod changes;
mod cluster;
mod script;
mod scripted;
mod sentinel;
mod settings;
mod shared_connection;
mod standalone;

pub use cluster::RedisCluster;
pub use script::script_source;
pub use settings::{ClockSource, InstanceCount, RedisSettings, SentinelSettings, Topology};
// Leases are not Redis's alone (any store can be leased from), but are
// configured under [redis].
pub use crate::leases::LeaseSettings;
pub use standalone::RedisStandalone;
