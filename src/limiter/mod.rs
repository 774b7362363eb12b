//! Limit state and the decisions made on it, behind one interface.
//!
//! `Store` is what every store implements: the memory store, Redis
//! standalone and Redis Cluster. The known-refusals cache and the fallback
//! (circuit breaker plus `on_failure`) are stores too, each wrapping another,
//! so the proxy holds one `Arc<dyn Store>` whatever the configuration:
//!
//! ```text
//! memory:  MemoryStore
//! redis:   Fallback<Leased<KnownRefusals<RedisStandalone | RedisCluster>>> (+ a MemoryStore for on_failure = "local")
//!          (without `Leased` when `[redis].leases = "off"`)
//! ```

mod check;
mod deny_cache;
mod error;
mod fallback;
mod instances;
mod leases;
mod memory;
pub mod redis;
mod roster;
mod store;

#[cfg(test)]
mod fake;

pub use check::{
    admitted, Check, LeaseAsk, LimitId, LimitName, OnFailure, Slot, SlotError, StateKey,
    MAX_LEASE_US,
};
pub use deny_cache::{Forget, Forgetter, KnownRefusals};
pub use error::LimiterError;
pub use fallback::Fallback;
pub use instances::Instances;
pub use leases::Leased;
pub use memory::MemoryStore;
pub use redis::{ClockSource, RedisCluster, RedisSettings, RedisStandalone};
pub use roster::Roster;
pub use store::{Deciding, Store};
