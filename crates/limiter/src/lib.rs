//! Limit state and the decisions made on it, behind one interface.
//!
//! `Store` is what every store implements: the memory store, Redis
//! standalone and Redis Cluster. It is limit state; a store is also its
//! concurrency slots (`Concurrency`) and its upkeep (`Upkeep`). The
//! known-refusals cache, the leases and the fallback (circuit breaker plus
//! `on_failure`) are stores too, each wrapping another and implementing the
//! roles it changes (`WrapsLimits` passes the others on), so the proxy holds
//! one `Arc<dyn Store>` whatever the configuration:
//!
//! ```text
//! memory:  MemoryStore
//! redis:   Fallback<Leased<KnownRefusals<RedisStandalone | RedisCluster>>> (+ a MemoryStore for on_failure = "local")
//!          (without `Leased` when `[redis].leases = "off"`)
//! ```
//!
//! # Deciding a request in your own service
//!
//! The crate needs no proxy: a Rust service builds a `Check` per limit its
//! request meets and asks a store. The same calls work on every store, so
//! the memory store below can become Redis (`RedisStandalone::new`)
//! without touching the code that decides. Redis is the `redis` feature, on
//! by default; without it the crate is the memory store and the wrappers.
//!
//! ```
//! use std::sync::Arc;
//!
//! use floodgate_algorithm::Algorithm;
//! use floodgate_limiter::clock::ManualClock;
//! use floodgate_limiter::{
//!     Check, Enforcement, Leasing, LimitId, LimitName, MemoryStore, OnFailure, Spending, StateKey,
//!     Store,
//! };
//!
//! const SEC: u64 = 1_000_000;
//!
//! /// One layer: `limit` of the policy, for the client whose key hashes to
//! /// `client`. (floodgate's own identity hashing is keyed with a secret, so
//! /// that no client can choose a key that lands on another's state.)
//! fn layer(limit: usize, algorithm: Algorithm, client: u128) -> Check {
//!     Check {
//!         limit: LimitId(limit),
//!         name: LimitName::new(if limit == 0 { "per-client" } else { "everyone" }),
//!         algorithm,
//!         key: StateKey { limit: limit as u64, identity: client },
//!         cost: 1,
//!         enforcement: Enforcement::Enforce,
//!         spending: Spending::Charge,
//!         on_failure: OnFailure::Local,
//!         leasing: Leasing::Never,
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let clock = Arc::new(ManualClock::new(1_700_000_000 * SEC));
//! let store = MemoryStore::new(100_000, clock.clone());
//! // 3 a second per client, and 4 in any second for all clients together.
//! let per_client = Algorithm::token_bucket(3, SEC / 3).unwrap();
//! let everyone = Algorithm::sliding_window(4, SEC).unwrap();
//! let request = |client| vec![layer(0, per_client.clone(), client), layer(1, everyone.clone(), 0)];
//!
//! let admitted = |decisions: Vec<floodgate_algorithm::Decision>| decisions.iter().all(|d| d.allowed());
//! for _ in 0..3 {
//!     assert!(admitted(store.decide(&request(7)).await.unwrap()));
//! }
//! // Client 7's own limit refuses its fourth request, and then charges no
//! // layer: the shared limit still has room for client 8.
//! let refused = store.decide(&request(7)).await.unwrap();
//! assert!(!refused[0].allowed());
//! assert!(refused[0].reset_after_us() > 0, "it says when to come back");
//! assert!(admitted(store.decide(&request(8)).await.unwrap()));
//! // Now everyone's limit is full, for client 8 as for anyone.
//! assert!(!admitted(store.decide(&request(8)).await.unwrap()));
//! // The sliding window weighs the second before in full at its edge: two
//! // seconds on, both limits have room again.
//! clock.advance(2 * SEC);
//! assert!(admitted(store.decide(&request(7)).await.unwrap()));
//! # });
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

pub mod clock;
pub mod log_throttle;
pub mod metrics;

mod check;
mod deny_cache;
mod error;
mod fallback;
mod instances;
mod leases;
mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
mod roster;
mod store;
pub mod watch;

#[cfg(test)]
mod fake;

pub use check::{
    admitted, Check, Enforcement, LeaseAsk, Leasing, LimitId, LimitName, OnFailure, Slot,
    SlotError, Spending, StateKey, MAX_LEASE_US,
};
pub use deny_cache::{Forget, Forgetter, KnownRefusals};
pub use error::LimiterError;
pub use fallback::Fallback;
pub use instances::Instances;
pub use leases::{LeaseSettings, Leased};
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{ClockSource, RedisCluster, RedisSettings, RedisStandalone};
#[cfg(feature = "redis")]
pub use roster::Roster;
pub use store::{Concurrency, Deciding, Store, Upkeep, WrapsLimits};
