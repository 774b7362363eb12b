//! The interface every store implements, and the wrappers too, by role:
//! limit state (`Store`), concurrency slots (`Concurrency`) and the
//! store's upkeep (`Upkeep`). A wrapper implements the roles it changes;
//! one that changes only limit state (`WrapsLimits`) passes the other two
//! on to the store it wraps.

use async_trait::async_trait;

use smallvec::SmallVec;

use super::check::{Check, LeaseAsk, Slot};
use super::error::LimiterError;
use floodgate_algorithm::Decision;

/// Which store makes the decisions right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deciding {
    /// The memory store: no Redis is configured.
    Memory,
    /// Redis answers and decides.
    Redis,
    /// Redis is configured but away: `on_failure` decides.
    Fallback,
}

impl Deciding {
    /// Its name in the admin API's answers: `"memory"`, `"redis"`,
    /// `"fallback"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Deciding::Memory => "memory",
            Deciding::Redis => "redis",
            Deciding::Fallback => "fallback",
        }
    }
}

/// Limit state, wherever it lives: requests decided on it, and an
/// operator's or a response's changes to it. Every store is also its
/// slots (`Concurrency`) and its upkeep (`Upkeep`), so that the proxy
/// holds one `Arc<dyn Store>` and calls them all.
///
/// Contract for `decide`: one decision per check, in order, applied
/// all-or-nothing: if any enforcing (non-shadow) check refuses, no layer is
/// charged. Shadow checks never refuse the request; one that would have
/// refused is not charged, one that admits is charged with the rest. A
/// `peek` check is decided with the others and never charged.
#[async_trait]
pub trait Store: Concurrency + Upkeep {
    /// Decides and charges a request's layers.
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError>;

    /// `decide`, and beside each layer with an ask in `asks` (by position;
    /// missing asks are none) that the request charges, a lease of units
    /// taken in the same atomic step (`algorithm::lease_units`): that
    /// layer's decision is the one after the lease, and its units leased
    /// are in the second vector (empty when none were). A store that takes
    /// no leases decides alone.
    async fn decide_leasing(
        &self,
        checks: &[Check],
        asks: &[Option<LeaseAsk>],
    ) -> Result<(Vec<Decision>, SmallVec<[u64; 4]>), LimiterError> {
        let _ = asks;
        Ok((self.decide(checks).await?, SmallVec::new()))
    }

    /// What `decide` would answer now, charging nothing: a request checked
    /// before its cost is known, or one identity's state read (cost 0).
    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError>;

    /// Forgets these layers' state: the identity starts afresh.
    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError>;

    /// Gives `check.cost` units back to the layer (`Algorithm::credit`);
    /// answers what a request of cost 0 would see after.
    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError>;

    /// Gives back `check.cost` units of a reservation, where its decision
    /// said they were counted (`Decision::counted_at_us`), as if they had
    /// never been taken: a limit charged by the response settles what it
    /// reserved. Nothing when they are there no longer (their window is
    /// over).
    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError>;
}

/// Concurrency limits: each key's `max` slots, each held under a lease.
#[async_trait]
pub trait Concurrency: Send + Sync {
    /// Takes one of the key's `max` slots under the slot's lease; refused
    /// with the time until a held lease ends when all are taken.
    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError>;

    /// Extends a held lease by its length from now; false when it has
    /// expired (its slot may be another's).
    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError>;

    /// Gives the slot back; false when the lease was no longer held.
    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError>;
}

/// The store as the process keeps it: whether it can decide and who does,
/// readied before the first request, and what it holds for this process
/// (leased budget, in-process keys).
#[async_trait]
pub trait Upkeep: Send + Sync {
    /// Whether the store can decide: a write, so that a store that answers
    /// but cannot write fails it.
    async fn probe(&self) -> Result<(), LimiterError>;

    /// Which store decides right now; the fallback's answer changes as
    /// its breaker opens and closes.
    fn deciding(&self) -> Deciding;

    /// Makes what the first decision needs (a connection, a loaded script)
    /// before there is one to make: called before the proxy listens.
    async fn warm(&self) -> Result<(), LimiterError> {
        Ok(())
    }

    /// Gives back whatever budget this instance holds leased (shutdown,
    /// reload), and waits for it to be taken back.
    async fn return_leases(&self) {}

    /// Keys whose state this process holds (0 for a remote store).
    fn keys_held(&self) -> usize {
        0
    }

    /// Drops in-process state that has gone idle; returns how many keys went.
    fn sweep(&self) -> usize {
        0
    }
}

/// A store built on `inner` that changes only limit state (its `Store`):
/// its slots and its upkeep are `inner`'s, passed on as they are.
pub trait WrapsLimits: Send + Sync {
    /// The store wrapped.
    type Inner: Store;

    /// The store wrapped, whose slots and upkeep are this one's.
    fn inner(&self) -> &Self::Inner;
}

#[async_trait]
impl<W: WrapsLimits> Concurrency for W {
    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        self.inner().acquire(slot).await
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.inner().renew(slot).await
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.inner().release(slot).await
    }
}

#[async_trait]
impl<W: WrapsLimits> Upkeep for W {
    async fn probe(&self) -> Result<(), LimiterError> {
        self.inner().probe().await
    }

    fn deciding(&self) -> Deciding {
        self.inner().deciding()
    }

    async fn warm(&self) -> Result<(), LimiterError> {
        self.inner().warm().await
    }

    async fn return_leases(&self) {
        self.inner().return_leases().await;
    }

    fn keys_held(&self) -> usize {
        self.inner().keys_held()
    }

    fn sweep(&self) -> usize {
        self.inner().sweep()
    }
}
