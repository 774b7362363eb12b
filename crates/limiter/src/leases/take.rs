//! Taking a request's units from its key's lease, and installing the
//! units the store leased beside a request: the fetch a key has out, the
//! top-up of a lease half spent, and the units of a refused request put
//! back.

use std::sync::Arc;

use tokio::sync::Notify;

use super::lease::Return;
use super::lease::{returned, Lease, Now};
use super::table::{Fetching, MAX_KEYS, SHARDS};
use super::Core;
use crate::check::{Check, LeaseAsk};
use crate::deny_cache::Forget;
use crate::store::Store;
use floodgate_algorithm::{Algorithm, Decision, Kind};

/// Units a request took from a lease.
#[derive(Clone, Copy)]
pub(super) struct Took {
    pub(super) decision: Decision,
    /// The lease's: units taken from a lease of an older generation go
    /// back nowhere.
    pub(super) generation: u64,
}

pub(super) enum Taken {
    /// From the lease; and the fetch of a top-up, when it is half spent.
    Local(Took, Option<Fetching>),
    /// The caller fetches; first it gives back what the over lease left.
    Fetch(Fetching, Option<Return>),
    Out(Arc<Notify>),
    /// No room in the table: the store decides alone.
    Alone,
}

impl<S: Store + 'static> Core<S> {
    /// The lease to ask for beside a layer of `algorithm`.
    pub(super) fn ask(&self, algorithm: &Algorithm) -> LeaseAsk {
        LeaseAsk {
            max: self.settings.max,
            divisor: self.divisor(),
            life_us: self.ttl(algorithm),
        }
    }

    /// Read at each fetch: with `instances = "auto"` the count moves.
    fn divisor(&self) -> u64 {
        self.instances.get().saturating_mul(2)
    }

    /// `lease_ttl`, and never more than a tenth of the limit's window.
    fn ttl(&self, algorithm: &Algorithm) -> u64 {
        self.settings
            .ttl_us
            .min((algorithm.window_us() / 10).max(1))
    }

    /// How long a lease taken for `algorithm` at `sent_us` may live.
    fn ends_at(&self, algorithm: &Algorithm, sent_us: u64, window_end_us: u64) -> u64 {
        let end = sent_us.saturating_add(self.ttl(algorithm));
        match algorithm.kind() {
            Kind::TokenBucket => end,
            _ => end.min(window_end_us),
        }
    }

    /// Takes `check.cost` from its key's lease if it has room. Otherwise
    /// the lease, if any, is over, and the caller is told whether to fetch
    /// (the fetch is then this caller's, and so is the over lease's return,
    /// to send before the fetch: the store must not refuse for units on
    /// their way back) or that a fetch is out.
    pub(super) fn take(&self, check: &Check, now: Now) -> Taken {
        let mut shard = self.table.lock(&check.key);
        if !shard.contains_key(&check.key) && shard.len() >= MAX_KEYS / SHARDS {
            return Taken::Alone;
        }
        let entry = shard.entry(check.key).or_default();
        let mut spent = None;
        if let Some(lease) = &mut entry.lease {
            if lease.check.algorithm == check.algorithm {
                let mut taken = lease.take(check.cost, now);
                if !taken {
                    spent = lease.promoted();
                    taken = spent.is_some() && lease.take(check.cost, now);
                }
                if taken {
                    let took = Took {
                        decision: lease.decision(now),
                        generation: lease.generation,
                    };
                    let top_up = (lease.half_spent() && entry.fetching.is_none())
                        .then(|| Fetching::start(&self.table, check.key, &mut entry.fetching));
                    drop(shard);
                    if let Some(spent) = spent {
                        self.give_back(spent, now);
                    }
                    return Taken::Local(took, top_up);
                }
            }
        }
        if let Some(spent) = spent {
            // What the lease left before the next one took over: most
            // often nothing, and then no call.
            if let Some(back) = returned(spent, now) {
                let _ = self.returns().send((back, None));
            }
        }
        let over = entry.lease.take();
        let taken = match &entry.fetching {
            Some(notify) => Taken::Out(notify.clone()),
            None => {
                let fetching = Fetching::start(&self.table, check.key, &mut entry.fetching);
                drop(shard);
                let back = over.and_then(|lease| returned(lease, now));
                return Taken::Fetch(fetching, back);
            }
        };
        drop(shard);
        if let Some(lease) = over {
            self.give_back(lease, now);
        }
        taken
    }

    /// Units taken from a lease by a request that was then refused
    /// elsewhere: back into the lease, or, its lease gone, to the store
    /// (a bucket's to its ledger, while it still counts them).
    pub(super) fn untake(&self, check: &Check, took: &Took) {
        let mut shard = self.table.lock(&check.key);
        if let Some(lease) = shard.get_mut(&check.key).and_then(|e| e.lease.as_mut()) {
            if lease.check.algorithm == check.algorithm
                && lease.counted_at_us == took.decision.counted_at_us()
                && lease.generation == took.generation
            {
                lease.unused += check.cost;
                return;
            }
        }
        drop(shard);
        let back = Return {
            check: check.clone(),
            counted_at_us: took.decision.counted_at_us(),
            generation: took.generation,
        };
        let _ = self.returns().send((back, None));
    }

    /// Installs what the store leased beside `check` (its decision after
    /// the lease, asked for at `sent_us` in `generation`); the request's
    /// own decision. A lease from before a reset is not installed.
    pub(super) fn install(
        &self,
        check: &Check,
        after: Decision,
        units: u64,
        sent: (Now, u64),
    ) -> Decision {
        let (sent_at, generation) = sent;
        let sent_us = sent_at.wall_us;
        let now = self.now();
        let reset_at_us = sent_us.saturating_add(after.reset_after_us());
        let lease = Lease {
            check: check.clone(),
            unused: units,
            units,
            counted_at_us: after.counted_at_us(),
            ends_at_us: self.ends_at(&check.algorithm, sent_us, reset_at_us),
            ttl_us: self.ttl(&check.algorithm),
            shared_remaining: after.remaining(),
            limit: after.limit(),
            reset_at_us,
            start_us: sent_us,
            started_us: sent_at.monotonic_us,
            generation,
            next: None,
        };
        let mut lease = lease;
        let mut shard = self.table.lock(&check.key);
        if self.table.generation() != generation {
            return lease.decision(now);
        }
        let entry = shard.entry(check.key).or_default();
        if std::mem::take(&mut entry.credited) {
            drop(shard);
            let decision = lease.decision(now);
            self.give_back(lease, now);
            return decision;
        }
        // A top-up: what the lease still holds joins the new units.
        if let Some(held) = entry
            .lease
            .as_mut()
            .filter(|h| h.check.algorithm == check.algorithm)
        {
            // Counted in the same place (a bucket's: the same epoch of its
            // ledger, which counts them for the new lease's life too).
            if held.counted_at_us == lease.counted_at_us {
                lease.unused += held.unused;
                lease.units = lease.unused;
                lease.next = held.next.take();
                entry.lease = None;
            } else if !held.over(now) && held.unused > 0 {
                // Counted elsewhere: it waits for these to be spent.
                let decision = lease.decision(now);
                let waiting = held.next.replace(Box::new(lease));
                drop(shard);
                self.returns();
                if let Some(old) = waiting {
                    self.give_back(*old, now);
                }
                return decision;
            }
        }
        let decision = lease.decision(now);
        let replaced = entry.lease.replace(lease);
        drop(shard);
        // Nothing else would end the lease once idle: the expiry task must
        // run wherever a lease is held. After the first lease, a load.
        self.returns();
        if let Some(old) = replaced {
            self.give_back(old, now);
        }
        decision
    }

    /// Leases more units beside a request of cost 0 while the lease still
    /// has some: the fetch is held meanwhile, so that a request finding the
    /// lease empty waits for it rather than send its own.
    pub(super) async fn top_up(&self, check: Check, fetching: Fetching) {
        let sent = (self.now(), self.table.generation());
        let probe = Check {
            cost: 0,
            ..check.clone()
        };
        let ask = self.ask(&check.algorithm);
        match self
            .inner
            .decide_leasing(std::slice::from_ref(&probe), &[Some(ask)])
            .await
        {
            Ok((decided, leased)) => {
                let units = leased.first().copied().unwrap_or(0);
                if let (Some(after), true) = (decided.first(), units > 0) {
                    if after.allowed() {
                        if let Some(m) = &self.metrics {
                            m.taken.inc();
                        }
                        self.install(&check, *after, units, sent);
                    }
                }
            }
            Err(_) => self.table.forget_all(),
        }
        drop(fetching);
    }
}
