//! Leases: Redis off the hot path, still exact.
//!
//! A request whose leasable layers all hold a lease with room is decided
//! here, with no Redis call. Otherwise the layers without room go to the
//! shared store, which decides them as always and, beside each one it
//! charges, takes a lease of more units in the same script run
//! (`algorithm::lease_units`: large far from the limit, none near it). The
//! units count as spent in Redis from that moment, so whatever this
//! instance admits from a lease is already paid for in the shared state: no
//! instance ever admits more than the shared budget allows.
//!
//! A lease lives at most `ttl_us` (never longer than a tenth of its limit's
//! window) and never past the window or period its units are counted in.
//! A token bucket's leased tokens are a stretch of the shared bucket's
//! schedule (`Room::Tokens`), spent as the bucket would spend them: a token
//! whose time has passed unused is gone, as the bucket would have refilled
//! it anyway, or a full bucket plus a lease would admit more than the
//! bucket holds. What was not used goes back (`refund`) when
//! the lease ends, on shutdown and on reload. A crashed instance's lease is
//! simply never used: at most one lease per (limit, identity) per instance
//! is lost, until its window ends or its tokens would have refilled.
//!
//! One fetch per key at a time: requests that find the lease empty while a
//! fetch is out wait for it (within the Redis deadline) instead of sending
//! their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use smallvec::SmallVec;
use tokio::sync::{mpsc, Notify};

use super::check::{admitted, Check, LeaseAsk, Slot};
use super::deny_cache::Forget;
use super::error::LimiterError;
use super::redis::LeaseSettings;
use super::store::{Deciding, Store};
use crate::algorithm::{takes_lease, Algorithm, Decision, Kind};
use crate::clock::Clock;
use crate::identity::StateKey;
use crate::metrics::LeaseMetrics;

const SHARDS: usize = 64;

/// Units leased beside one layer of one request, as the store reported it.
struct Lease {
    /// The layer it was taken for: its algorithm (a reload that changes
    /// the numbers ends the lease), name and key (for the return).
    check: Check,
    room: Room,
    /// Where its units are counted (a refund finds them there).
    counted_at_us: u64,
    /// On this instance's clock: it is not used from then on.
    ends_at_us: u64,
    /// What the shared state had left beside the lease: for the headers.
    shared_remaining: u64,
    limit: u64,
    /// Until the shared state is whole again, from `ends_at_us`'s clock.
    reset_at_us: u64,
    /// When it was taken: a bucket's stretch never reaches back before.
    start_us: u64,
}

/// What is left of a lease.
enum Room {
    /// A window's or a period's units: spent in any order while it runs.
    Count { unused: u64 },
    /// A token bucket's tokens: the stretch of the shared bucket's schedule
    /// (`tat`, in this instance's clock) from `tat_us` to `end_us`, spent
    /// as a bucket of its own spends it. Taking a token moves `tat_us` past
    /// `max(tat_us, now)`: time passing spends the stretch too, as the
    /// shared bucket would have refilled those tokens itself.
    Tokens {
        tat_us: u64,
        end_us: u64,
        interval_us: u64,
    },
}

impl Room {
    fn unused(&self, now_us: u64) -> u64 {
        match *self {
            Room::Count { unused } => unused,
            Room::Tokens {
                tat_us,
                end_us,
                interval_us,
            } => end_us.saturating_sub(tat_us.max(now_us)) / interval_us,
        }
    }

    fn take(&mut self, cost: u64, now_us: u64) -> bool {
        match self {
            Room::Count { unused } => {
                let fits = *unused >= cost;
                if fits {
                    *unused -= cost;
                }
                fits
            }
            Room::Tokens {
                tat_us,
                end_us,
                interval_us,
            } => {
                let after = (*tat_us).max(now_us).saturating_add(cost * *interval_us);
                let fits = after <= *end_us;
                if fits {
                    *tat_us = after;
                }
                fits
            }
        }
    }

    /// Units taken back into the lease, as the shared store would take a
    /// refund: a bucket's schedule moves back, never before now nor before
    /// the stretch began.
    fn put_back(&mut self, cost: u64, now_us: u64, start_us: u64) {
        match self {
            Room::Count { unused } => *unused += cost,
            Room::Tokens {
                tat_us,
                interval_us,
                ..
            } => {
                *tat_us = tat_us
                    .saturating_sub(cost * *interval_us)
                    .max(now_us)
                    .max(start_us)
            }
        }
    }
}

impl Lease {
    /// Units that may be used at `now_us`.
    fn usable(&self, now_us: u64) -> u64 {
        if now_us >= self.ends_at_us {
            return 0;
        }
        self.room.unused(now_us)
    }

    fn take(&mut self, cost: u64, now_us: u64) -> bool {
        now_us < self.ends_at_us && self.room.take(cost, now_us)
    }

    fn put_back(&mut self, cost: u64, now_us: u64) {
        self.room.put_back(cost, now_us, self.start_us);
    }

    /// Units worth giving back at `now_us`: a token bucket's whose time has
    /// not passed, a window's while its window runs (a sliding window's
    /// also in the next, where they still weigh).
    fn returnable(&self, now_us: u64) -> u64 {
        let unused = self.room.unused(now_us);
        match self.check.algorithm.kind() {
            Kind::TokenBucket => unused,
            Kind::SlidingWindow => {
                let window = self.check.algorithm.period_us();
                if now_us < self.reset_at_us.saturating_add(window) {
                    unused
                } else {
                    0
                }
            }
            _ if now_us < self.reset_at_us => unused,
            _ => 0,
        }
    }

    /// The decision for a request of `cost` admitted from the lease.
    fn decision(&self, now_us: u64) -> Decision {
        Decision::admitted(
            self.limit,
            self.shared_remaining + self.usable(now_us),
            self.reset_at_us.saturating_sub(now_us),
        )
        .counted_at(self.counted_at_us)
    }
}

#[derive(Default)]
struct Entry {
    lease: Option<Lease>,
    /// A fetch is out for this key: wait for it rather than send another.
    fetching: Option<Arc<Notify>>,
}

/// A lease's units on their way back to the shared store.
struct Return {
    check: Check,
    counted_at_us: u64,
}

struct Table {
    shards: Box<[Mutex<HashMap<StateKey, Entry>>]>,
}

impl Table {
    fn lock(&self, key: &StateKey) -> MutexGuard<'_, HashMap<StateKey, Entry>> {
        // Entries are replaced whole: a poisoned shard is still consistent.
        self.shards[key.shard(SHARDS)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Forget for Table {
    /// An operator reset the keys: their leases are dropped, not returned
    /// (a return would take from the fresh state what the reset gave).
    fn forget(&self, keys: &[StateKey]) {
        for key in keys {
            if let Some(entry) = self.lock(key).get_mut(key) {
                entry.lease = None;
            }
        }
    }

    fn forget_all(&self) {
        for shard in self.shards.iter() {
            for entry in shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .values_mut()
            {
                entry.lease = None;
            }
        }
    }
}

/// Ends the fetch it was made for, however the request went: installed,
/// refused, failed or given up on.
struct Fetching {
    table: Arc<Table>,
    key: StateKey,
    notify: Arc<Notify>,
}

impl Drop for Fetching {
    fn drop(&mut self) {
        let mut shard = self.table.lock(&self.key);
        if let Some(entry) = shard.get_mut(&self.key) {
            if entry
                .fetching
                .as_ref()
                .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
            {
                entry.fetching = None;
            }
            if entry.lease.is_none() && entry.fetching.is_none() {
                shard.remove(&self.key);
            }
        }
        drop(shard);
        self.notify.notify_waiters();
    }
}

/// A store that takes leases from `inner` and decides from them.
pub struct Leased<S> {
    inner: Arc<S>,
    table: Arc<Table>,
    settings: LeaseSettings,
    /// Twice the instances sharing the budget (`algorithm::lease_units`).
    divisor: u64,
    /// How long a request waits for another's fetch: the store's deadline.
    wait: Duration,
    clock: Arc<dyn Clock>,
    /// Started on first use, on the proxy's runtime.
    returns: OnceLock<mpsc::UnboundedSender<Return>>,
    metrics: Option<LeaseMetrics>,
}

impl<S: Store + 'static> Leased<S> {
    pub fn new(
        inner: S,
        settings: LeaseSettings,
        instances: u64,
        wait: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Leased {
            inner: Arc::new(inner),
            table: Arc::new(Table {
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            }),
            settings,
            divisor: instances.max(1).saturating_mul(2),
            wait,
            clock,
            returns: OnceLock::new(),
            metrics: None,
        }
    }

    /// Also counts what the leases do in `metrics`.
    pub fn with_metrics(mut self, metrics: LeaseMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Forgets the leases of keys another instance's operator reset.
    pub fn forgetter(&self) -> Arc<dyn Forget> {
        self.table.clone()
    }

    /// Leases held now (for tests and the status page).
    pub fn leases_held(&self) -> usize {
        self.table
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                    .filter(|e| e.lease.is_some())
                    .count()
            })
            .sum()
    }

    /// Whether `check` may be decided from a lease.
    fn leasable(check: &Check) -> bool {
        check.lease
            && !check.peek
            && !check.shadow
            && check.cost > 0
            && takes_lease(check.algorithm.kind())
    }

    /// The queue of returns, and the task that sends them and ends expired
    /// leases.
    fn returns(&self) -> &mpsc::UnboundedSender<Return> {
        self.returns.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(send_returns(
                self.inner.clone(),
                self.table.clone(),
                self.clock.clone(),
                self.settings.ttl_us,
                self.metrics.clone(),
                receiver,
            ));
            sender
        })
    }

    fn give_back(&self, lease: Lease, now_us: u64) {
        if let Some(back) = returned(lease, now_us) {
            let _ = self.returns().send(back);
        }
    }

    /// How long a lease taken for `algorithm` at `sent_us` may live.
    fn ends_at(&self, algorithm: &Algorithm, sent_us: u64, window_end_us: u64) -> u64 {
        let ttl = self
            .settings
            .ttl_us
            .min((algorithm.window_us() / 10).max(1));
        let end = sent_us.saturating_add(ttl);
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
    fn take(&self, check: &Check, now_us: u64) -> Taken {
        let mut shard = self.table.lock(&check.key);
        let entry = shard.entry(check.key).or_default();
        if let Some(lease) = &mut entry.lease {
            if lease.check.algorithm == check.algorithm && lease.take(check.cost, now_us) {
                return Taken::Local(lease.decision(now_us));
            }
        }
        let over = entry.lease.take();
        let taken = match &entry.fetching {
            Some(notify) => Taken::Out(notify.clone()),
            None => {
                let notify = Arc::new(Notify::new());
                entry.fetching = Some(notify.clone());
                let fetching = Fetching {
                    table: self.table.clone(),
                    key: check.key,
                    notify,
                };
                drop(shard);
                let back = over.and_then(|lease| returned(lease, now_us));
                return Taken::Fetch(fetching, back);
            }
        };
        drop(shard);
        if let Some(lease) = over {
            self.give_back(lease, now_us);
        }
        taken
    }

    /// Units taken from a lease by a request that was then refused
    /// elsewhere: back into the lease, or to the store if it is gone.
    fn untake(&self, check: &Check, decision: &Decision) {
        let mut shard = self.table.lock(&check.key);
        if let Some(lease) = shard.get_mut(&check.key).and_then(|e| e.lease.as_mut()) {
            if lease.check.algorithm == check.algorithm
                && lease.counted_at_us == decision.counted_at_us()
            {
                lease.put_back(check.cost, self.clock.now_us());
                return;
            }
        }
        drop(shard);
        let _ = self.returns().send(Return {
            check: check.clone(),
            counted_at_us: decision.counted_at_us(),
        });
    }

    /// Installs what the store leased beside `check` (its decision after
    /// the lease, sent at `sent_us`); the request's own decision.
    fn install(&self, check: &Check, after: Decision, units: u64, sent_us: u64) -> Decision {
        let now_us = self.clock.now_us();
        let reset_at_us = sent_us.saturating_add(after.reset_after_us());
        let room = match check.algorithm.kind() {
            // The shared bucket is full again at `reset_at_us`; the lease's
            // tokens are the last `units` of the schedule before it.
            Kind::TokenBucket => {
                let interval_us = check.algorithm.period_us().max(1);
                Room::Tokens {
                    tat_us: reset_at_us.saturating_sub(units * interval_us),
                    end_us: reset_at_us,
                    interval_us,
                }
            }
            _ => Room::Count { unused: units },
        };
        let lease = Lease {
            check: check.clone(),
            room,
            counted_at_us: after.counted_at_us(),
            ends_at_us: self.ends_at(&check.algorithm, sent_us, reset_at_us),
            shared_remaining: after.remaining(),
            limit: after.limit(),
            reset_at_us,
            start_us: sent_us,
        };
        let decision = lease.decision(now_us);
        let mut shard = self.table.lock(&check.key);
        let replaced = shard.entry(check.key).or_default().lease.replace(lease);
        drop(shard);
        if let Some(old) = replaced {
            self.give_back(old, now_us);
        }
        decision
    }

    /// Gives every lease back now and waits for the returns (shutdown,
    /// reload).
    pub async fn return_all(&self) {
        let now_us = self.clock.now_us();
        let mut backs = Vec::new();
        for shard in self.table.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for entry in shard.values_mut() {
                if let Some(back) = entry.lease.take().and_then(|l| returned(l, now_us)) {
                    backs.push(back);
                }
            }
            shard.retain(|_, e| e.fetching.is_some());
        }
        let inner = &self.inner;
        futures_util::future::join_all(
            backs
                .iter()
                .map(|back| inner.refund(&back.check, back.counted_at_us)),
        )
        .await;
    }
}

/// The return of a lease's unused units at `now_us`, if worth sending.
fn returned(lease: Lease, now_us: u64) -> Option<Return> {
    let units = lease.returnable(now_us);
    if units == 0 {
        return None;
    }
    Some(Return {
        check: Check {
            cost: units,
            ..lease.check
        },
        counted_at_us: lease.counted_at_us,
    })
}

enum Taken {
    Local(Decision),
    /// The caller fetches; first it gives back what the over lease left.
    Fetch(Fetching, Option<Return>),
    Out(Arc<Notify>),
}

/// Sends returns as they come, and every tick ends the leases whose time
/// is over and sends what they did not use.
async fn send_returns<S: Store + 'static>(
    inner: Arc<S>,
    table: Arc<Table>,
    clock: Arc<dyn Clock>,
    ttl_us: u64,
    metrics: Option<LeaseMetrics>,
    mut queue: mpsc::UnboundedReceiver<Return>,
) {
    let mut tick = tokio::time::interval(Duration::from_micros(ttl_us.clamp(1_000, 250_000)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let backs = tokio::select! {
            back = queue.recv() => match back {
                Some(back) => vec![(back, None)],
                None => return,
            },
            _ = tick.tick() => {
                let (backs, held) = expired(&table, clock.now_us());
                if let Some(m) = &metrics {
                    m.held.set(i64::try_from(held).unwrap_or(i64::MAX));
                }
                backs
            }
        };
        // Each return holds its key's fetch (if it could take it) until it
        // lands: a request for the key meanwhile waits rather than be
        // refused for units on their way back.
        for (back, _fetching) in backs {
            // A failed return leaves its units spent until their window or
            // refill ends them: under-admission, never over.
            if inner.refund(&back.check, back.counted_at_us).await.is_ok() {
                if let Some(m) = &metrics {
                    m.returned_units.inc_by(back.check.cost);
                }
            }
        }
    }
}

/// Ends the leases over at `now_us`; what they give back, and how many
/// leases are left.
fn expired(table: &Arc<Table>, now_us: u64) -> (Vec<(Return, Option<Fetching>)>, usize) {
    let mut backs = Vec::new();
    let mut held = 0;
    for shard in table.shards.iter() {
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        shard.retain(|key, entry| {
            if entry.lease.as_ref().is_some_and(|l| l.ends_at_us <= now_us) {
                if let Some(back) = entry.lease.take().and_then(|l| returned(l, now_us)) {
                    let fetching = entry.fetching.is_none().then(|| {
                        let notify = Arc::new(Notify::new());
                        entry.fetching = Some(notify.clone());
                        Fetching {
                            table: table.clone(),
                            key: *key,
                            notify,
                        }
                    });
                    backs.push((back, fetching));
                }
            }
            held += usize::from(entry.lease.is_some());
            entry.lease.is_some() || entry.fetching.is_some()
        });
    }
    (backs, held)
}

#[async_trait]
impl<S: Store + 'static> Store for Leased<S> {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        if !checks.iter().any(Self::leasable) {
            return self.inner.decide(checks).await;
        }
        // A fetch out for one of the keys: wait for it once, then decide.
        let mut waited = false;
        loop {
            let now_us = self.clock.now_us();
            let mut local: SmallVec<[Option<Decision>; 4]> = SmallVec::new();
            let mut asks: SmallVec<[Option<LeaseAsk>; 4]> = SmallVec::new();
            let mut fetches: SmallVec<[Fetching; 2]> = SmallVec::new();
            let mut out: Option<(StateKey, Arc<Notify>)> = None;
            let mut backs: SmallVec<[Return; 1]> = SmallVec::new();
            for check in checks {
                let (decided, ask) = if Self::leasable(check) {
                    match self.take(check, now_us) {
                        Taken::Local(d) => (Some(d), None),
                        Taken::Fetch(fetch, back) => {
                            fetches.push(fetch);
                            backs.extend(back);
                            let ask = LeaseAsk {
                                max: self.settings.max,
                                divisor: self.divisor,
                            };
                            (None, Some(ask))
                        }
                        Taken::Out(notify) => {
                            out.get_or_insert((check.key, notify));
                            (None, None)
                        }
                    }
                } else {
                    (None, None)
                };
                local.push(decided);
                asks.push(ask);
            }
            if let (Some((key, notify)), false) = (&out, waited) {
                // Units taken meanwhile go back first: waiting holds none.
                self.untake_all(checks, &local);
                for back in backs {
                    let _ = self.returns().send(back);
                }
                drop(fetches);
                waited = true;
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
                continue;
            }
            if local.iter().all(Option::is_some) {
                if let Some(m) = &self.metrics {
                    m.decisions.inc_by(local.len() as u64);
                }
                return Ok(local.into_iter().flatten().collect());
            }
            for back in &backs {
                // A return that fails leaves its units spent until their
                // window or refill ends them: under-admission, never over.
                if self
                    .inner
                    .refund(&back.check, back.counted_at_us)
                    .await
                    .is_ok()
                {
                    if let Some(m) = &self.metrics {
                        m.returned_units.inc_by(back.check.cost);
                    }
                }
            }
            return self.decide_rest(checks, local, &asks, now_us).await;
        }
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.inner.peek(checks).await
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        let keys: SmallVec<[StateKey; 4]> = checks.iter().map(|c| c.key).collect();
        self.table.forget(&keys);
        self.inner.reset(checks).await
    }

    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        self.inner.credit(check).await
    }

    /// A reservation taken from a lease goes back into it while the lease
    /// holds units counted in the same place; otherwise to the store.
    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        let now_us = self.clock.now_us();
        {
            let mut shard = self.table.lock(&check.key);
            if let Some(lease) = shard.get_mut(&check.key).and_then(|e| e.lease.as_mut()) {
                // Only a count: a bucket's units from elsewhere have no
                // place in the lease's stretch of the schedule.
                if lease.check.algorithm == check.algorithm
                    && lease.counted_at_us == counted_at_us
                    && now_us < lease.ends_at_us
                    && matches!(lease.room, Room::Count { .. })
                {
                    lease.put_back(check.cost, now_us);
                    return Ok(());
                }
            }
        }
        self.inner.refund(check, counted_at_us).await
    }

    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        self.inner.acquire(slot).await
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.inner.renew(slot).await
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.inner.release(slot).await
    }

    async fn probe(&self) -> Result<(), LimiterError> {
        self.inner.probe().await
    }

    fn deciding(&self) -> Deciding {
        self.inner.deciding()
    }

    async fn return_leases(&self) {
        self.return_all().await;
    }
}

impl<S: Store + 'static> Leased<S> {
    /// The layers not decided from a lease go to the store, with a lease
    /// asked beside those that had none; the request is admitted only if
    /// they all are, and the units taken from leases go back if not.
    async fn decide_rest(
        &self,
        checks: &[Check],
        local: SmallVec<[Option<Decision>; 4]>,
        asks: &[Option<LeaseAsk>],
        sent_us: u64,
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
                return Err(e);
            }
        };
        let mut remote = remote.into_iter();
        let mut position = 0;
        let mut decisions = Vec::with_capacity(checks.len());
        for (check, from_lease) in checks.iter().zip(&local) {
            match from_lease {
                Some(d) => decisions.push(*d),
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
                        self.install(check, d, units, sent_us)
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

    fn untake_all(&self, checks: &[Check], local: &[Option<Decision>]) {
        for (check, decided) in checks.iter().zip(local) {
            if let Some(d) = decided {
                self.untake(check, d);
            }
        }
    }
}

#[cfg(test)]
#[path = "leases_tests.rs"]
mod tests;
