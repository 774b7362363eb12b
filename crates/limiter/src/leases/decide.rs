//! A request decided from the leases and the store together: the layers
//! with room in their lease here, the others by the store, which leases
//! more beside them; all-or-nothing as every store's decision is.

use std::sync::Arc;

use smallvec::SmallVec;
use tokio::sync::Notify;

use super::lease::Now;
use super::lease::Return;
use super::returns::send;
use super::table::Fetching;
use super::take::{Taken, Took};
use super::Core;
use crate::check::{admitted, Check, LeaseAsk, StateKey};
use crate::deny_cache::Forget;
use crate::error::LimiterError;
use crate::store::Store;
use crate::watch::{self, Answerer};
use floodgate_algorithm::Decision;

/// What a request's layers found in their leases, in one pass.
struct Pass {
    /// Per layer, what it took from its lease, if that had room.
    local: SmallVec<[Option<Took>; 4]>,
    /// Per layer, the lease to ask for beside it.
    asks: SmallVec<[Option<LeaseAsk>; 4]>,
    /// The fetches this request sends, held until it is decided.
    fetches: SmallVec<[Fetching; 2]>,
    /// The first key with another request's fetch out.
    out: Option<(StateKey, Arc<Notify>)>,
    /// What the leases over left, to send before the fetches.
    backs: SmallVec<[Return; 1]>,
}

impl<S: Store + 'static> Core<S> {
    pub(super) async fn decide(
        self: &Arc<Self>,
        checks: &[Check],
    ) -> Result<Vec<Decision>, LimiterError> {
        if !checks.iter().any(|c| self.leasable(c)) {
            return self.checked(self.inner.decide(checks).await);
        }
        // A fetch out for one of the keys: wait for it once, then decide.
        let mut waited = false;
        loop {
            let now = self.now();
            // Before any script runs for this request: a reset after it
            // makes what the request leases worthless.
            let generation = self.table.generation();
            let Pass {
                local,
                asks,
                fetches,
                out,
                backs,
            } = self.take_layers(checks, now);
            if let (Some((key, notify)), false) = (&out, waited) {
                // Units taken meanwhile go back first: waiting holds none.
                self.untake_all(checks, &local);
                for back in backs {
                    let _ = self.returns().send((back, None));
                }
                drop(fetches);
                waited = true;
                self.wait_for(key, notify).await;
                continue;
            }
            if local.iter().all(Option::is_some) {
                if let Some(m) = &self.metrics {
                    m.decisions.inc_by(local.len() as u64);
                }
                return Ok(local.into_iter().flatten().map(|t| t.decision).collect());
            }
            let backs = backs.into_iter().map(|back| (back, None)).collect();
            send(&*self.inner, &self.table, self.metrics.as_ref(), backs).await;
            return self
                .decide_rest(checks, local, &asks, (now, generation))
                .await;
        }
    }

    /// Takes each leasable layer's units from its lease; a half-spent
    /// lease starts its top-up.
    fn take_layers(self: &Arc<Self>, checks: &[Check], now: Now) -> Pass {
        let mut pass = Pass {
            local: SmallVec::new(),
            asks: SmallVec::new(),
            fetches: SmallVec::new(),
            out: None,
            backs: SmallVec::new(),
        };
        for check in checks {
            let (decided, ask) = if self.leasable(check) {
                match self.take(check, now) {
                    Taken::Local(took, top_up) => {
                        if let Some(fetching) = top_up {
                            let core = self.clone();
                            let check = check.clone();
                            tokio::spawn(async move { core.top_up(check, fetching).await });
                        }
                        watch::answered_by(Answerer::Lease);
                        (Some(took), None)
                    }
                    Taken::Fetch(fetch, back) => {
                        pass.fetches.push(fetch);
                        pass.backs.extend(back);
                        (None, Some(self.ask(&check.algorithm)))
                    }
                    Taken::Out(notify) => {
                        pass.out.get_or_insert((check.key, notify));
                        (None, None)
                    }
                    Taken::Alone => (None, None),
                }
            } else {
                (None, None)
            };
            pass.local.push(decided);
            pass.asks.push(ask);
        }
        pass
    }

    /// Waits for `key`'s fetch `notify` to end, at most the store's
    /// deadline.
    async fn wait_for(&self, key: &StateKey, notify: &Arc<Notify>) {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // The fetch may have ended before the waiter was in place.
        let still_out = self
            .table
            .lock(key)
            .get(key)
            .and_then(|e| e.fetching.as_ref())
            .is_some_and(|n| Arc::ptr_eq(n, notify));
        if still_out {
            let _ = tokio::time::timeout(self.wait, notified).await;
        }
    }

    pub(super) async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        let keys: SmallVec<[StateKey; 4]> = checks.iter().map(|c| c.key).collect();
        self.table.forget(&keys);
        let reset = self.checked(self.inner.reset(checks).await);
        // Again: a fetch that ran while the store was resetting may have
        // leased from the state before it.
        self.table.forget(&keys);
        reset
    }

    /// A reservation taken from a lease goes back into it while the lease
    /// holds units counted in the same place; otherwise to the store.
    pub(super) async fn refund(
        &self,
        check: &Check,
        counted_at_us: u64,
    ) -> Result<(), LimiterError> {
        let now = self.now();
        {
            let mut shard = self.table.lock(&check.key);
            if let Some(lease) = shard.get_mut(&check.key).and_then(|e| e.lease.as_mut()) {
                if lease.check.algorithm == check.algorithm
                    && lease.counted_at_us == counted_at_us
                    && !lease.over(now)
                {
                    lease.unused += check.cost;
                    return Ok(());
                }
            }
        }
        self.checked(self.inner.refund(check, counted_at_us).await)
    }
}

impl<S: Store + 'static> Core<S> {
    /// The layers not decided from a lease go to the store, with a lease
    /// asked beside those that had none; the request is admitted only if
    /// they all are, and the units taken from leases go back if not.
    async fn decide_rest(
        &self,
        checks: &[Check],
        local: SmallVec<[Option<Took>; 4]>,
        asks: &[Option<LeaseAsk>],
        sent: (Now, u64),
    ) -> Result<Vec<Decision>, LimiterError> {
        let rest: Vec<Check> = checks
            .iter()
            .zip(&local)
            .filter(|(_, d)| d.is_none())
            .map(|(c, _)| c.clone())
            .collect();
        let rest_asks: SmallVec<[Option<LeaseAsk>; 4]> = asks
            .iter()
            .zip(&local)
            .filter(|(_, d)| d.is_none())
            .map(|(a, _)| *a)
            .collect();
        let decided = self.inner.decide_leasing(&rest, &rest_asks).await;
        let (remote, leased) = match decided {
            Ok(decided) => decided,
            Err(e) => {
                self.untake_all(checks, &local);
                // The store's state is unknown now (a restart may have
                // emptied it, a failover lost its last writes): no lease
                // taken from it is spent on top of what it says next.
                self.table.forget_all();
                return Err(e);
            }
        };
        let mut remote = remote.into_iter();
        let mut position = 0;
        let mut decisions = Vec::with_capacity(checks.len());
        for (check, from_lease) in checks.iter().zip(&local) {
            match from_lease {
                Some(took) => decisions.push(took.decision),
                None => {
                    let Some(d) = remote.next() else {
                        self.untake_all(checks, &local);
                        return Err(LimiterError::WrongReplyLength {
                            values: position,
                            layers: rest.len(),
                        });
                    };
                    let units = leased.get(position).copied().unwrap_or(0);
                    position += 1;
                    decisions.push(if units > 0 && d.allowed() {
                        if let Some(m) = &self.metrics {
                            m.taken.inc();
                        }
                        self.install(check, d, units, sent)
                    } else {
                        d
                    });
                }
            }
        }
        if !admitted(checks, &decisions) {
            self.untake_all(checks, &local);
        } else if let Some(m) = &self.metrics {
            m.decisions
                .inc_by(local.iter().filter(|d| d.is_some()).count() as u64);
        }
        Ok(decisions)
    }

    fn untake_all(&self, checks: &[Check], local: &[Option<Took>]) {
        for (check, took) in checks.iter().zip(local) {
            if let Some(took) = took {
                self.untake(check, took);
            }
        }
    }
}
