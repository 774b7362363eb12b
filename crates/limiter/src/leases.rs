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
//! A token bucket's lease lives `ttl_us` from when it was asked for, and
//! the bucket's ledger in Redis (`algorithm::ledger`) counts its units
//! that long: the bucket refills no further than its capacity less what
//! is outstanding, so a leased token stays valid for the lease's life
//! whatever the rate, and a full bucket plus the leases never hold more
//! than the capacity. What was not used goes back (`refund`) when the
//! lease ends, on shutdown and on reload. A crashed instance's lease is
//! simply never used: at most one lease per (limit, identity) per instance
//! is lost, until its window ends or its bucket's ledger lapses it.
//!
//! One fetch per key at a time: requests that find the lease empty while a
//! fetch is out wait for it (within the Redis deadline) instead of sending
//! their own. A lease half spent is topped up in the background (a lease
//! asked beside a request of cost 0), so that under steady load no request
//! waits for Redis at all.
//!
//! A lease's times are counted from when it was asked for, by the wall
//! clock and by a monotonic one, whichever has gone further: a clock
//! stepped back never makes an old lease young again, one stepped forward
//! ends it sooner. An operator's reset (here or heard from another
//! instance) drops every lease it concerns and starts a new generation. So
//! does anything that says the store's state may not be the one the leases
//! came from, for every lease: a failed store call of any kind (a return
//! included), and the loss of the subscription to operators' changes (a
//! restarted Redis drops it at once). A lease belongs to the generation it
//! was installed in, and its units go back only while that generation
//! lasts: a fetch or a return from before is not used, so no return lands
//! in a state that did not lease it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use smallvec::SmallVec;
use tokio::sync::{mpsc, Notify};

use super::check::{admitted, Check, LeaseAsk, Slot, StateKey};
use super::deny_cache::Forget;
use super::error::LimiterError;
use super::instances::Instances;
use super::store::{Deciding, Store};
use crate::clock::{Clock, MonotonicClock};
use crate::metrics::LeaseMetrics;
use crate::watch::{self, Answerer};
use floodgate_algorithm::{takes_lease, Algorithm, Decision, Kind};

/// `[redis].leases`: how large a lease may be and how long it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Units at most in one lease (`lease_max`).
    pub max: u64,
    /// How long a lease lives at most (`lease_ttl`); never longer than a
    /// tenth of its limit's window.
    pub ttl_us: u64,
}

impl LeaseSettings {
    pub const DEFAULT_MAX: u64 = 100;
    pub const DEFAULT_TTL_US: u64 = 1_000_000;
}

const SHARDS: usize = 64;

/// Keys with a lease (or a fetch out) at most, in all: beyond, a new key is
/// decided by the store alone, so a flood of identities costs no memory.
const MAX_KEYS: usize = 200_000;

/// Returns sent together at most.
const RETURNS_AT_ONCE: usize = 64;

/// Units leased beside one layer of one request, as the store reported it.
struct Lease {
    /// The layer it was taken for: its algorithm (a reload that changes
    /// the numbers ends the lease), name and key (for the return).
    check: Check,
    /// Units not yet used, spent in any order while the lease runs: a
    /// token bucket's too, which the bucket's ledger (`algorithm::ledger`)
    /// keeps out of its refill until the lease's life is over, whatever
    /// the rate.
    unused: u64,
    /// Units leased (with the top-ups since): half spent, it is topped up.
    units: u64,
    /// Where its units are counted (a refund finds them there).
    counted_at_us: u64,
    /// On this instance's clock: it is not used from then on.
    ends_at_us: u64,
    /// How long a window's lives past its last use (never past the
    /// window); a bucket's lives this long from when it was asked for, and
    /// no longer, since its ledger counts its units no longer.
    ttl_us: u64,
    /// What the shared state had left beside the lease: for the headers.
    shared_remaining: u64,
    limit: u64,
    /// Until the shared state is whole again, from `ends_at_us`'s clock.
    reset_at_us: u64,
    /// When it was asked for, by the wall clock and by the monotonic one.
    start_us: u64,
    started_us: u64,
    /// The table's generation it was installed in (`Table::generation`):
    /// its units go back only while it lasts.
    generation: u64,
    /// A top-up counted elsewhere (a bucket's in the next epoch of its
    /// ledger, a window's in the next window): its units cannot join
    /// these, which lapse sooner, so it waits here and takes over once
    /// these are spent or over. By then these are mostly spent, and no
    /// script call is made to give them back.
    next: Option<Box<Lease>>,
}

impl Lease {
    /// The instant `now` (wall, monotonic) as this lease counts time: from
    /// when it was asked for, by whichever clock has gone further since.
    fn local(&self, now: Now) -> u64 {
        let by_wall = now.wall_us.saturating_sub(self.start_us);
        let by_monotonic = now.monotonic_us.saturating_sub(self.started_us);
        self.start_us.saturating_add(by_wall.max(by_monotonic))
    }

    fn over(&self, now: Now) -> bool {
        self.local(now) >= self.ends_at_us
    }

    /// Units that may be used at `now`.
    fn usable(&self, now: Now) -> u64 {
        let now_us = self.local(now);
        if now_us >= self.ends_at_us {
            return 0;
        }
        self.unused
    }

    /// Takes `cost`, if the lease runs and holds it. A window's lease in
    /// use lives on, up to its window's end: only an idle lease goes back.
    /// A bucket's does not: its units are on the ledger for its life only.
    fn take(&mut self, cost: u64, now: Now) -> bool {
        let now_us = self.local(now);
        if now_us >= self.ends_at_us || self.unused < cost {
            return false;
        }
        self.unused -= cost;
        if self.check.algorithm.kind() != Kind::TokenBucket {
            self.ends_at_us = self.reset_at_us.min(now_us.saturating_add(self.ttl_us));
        }
        true
    }

    /// Half of its units are spent: time to lease more. A bucket's too: a
    /// top-up in the same epoch of its ledger is counted where the lease
    /// is, so the units join it (`install`).
    fn half_spent(&self) -> bool {
        self.next.is_none() && self.unused.saturating_mul(2) < self.units
    }

    /// The next lease in this one's place, if there is one: this one,
    /// to give back what it did not use.
    fn promoted(&mut self) -> Option<Lease> {
        let next = *self.next.take()?;
        Some(std::mem::replace(self, next))
    }

    /// Units worth giving back at `now`: a token bucket's while its ledger
    /// may still count them (a return past that finds nothing), a window's
    /// while its window runs (a sliding window's also in the next, where
    /// they still weigh).
    fn returnable(&self, now: Now) -> u64 {
        let now_us = self.local(now);
        let unused = self.unused;
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
    fn decision(&self, now: Now) -> Decision {
        Decision::admitted(
            self.limit,
            self.shared_remaining + self.usable(now),
            self.reset_at_us.saturating_sub(self.local(now)),
        )
        .counted_at(self.counted_at_us)
    }
}

/// One instant, read off both clocks.
#[derive(Clone, Copy)]
struct Now {
    wall_us: u64,
    monotonic_us: u64,
}

#[derive(Default)]
struct Entry {
    lease: Option<Lease>,
    /// A fetch is out for this key: wait for it rather than send another.
    fetching: Option<Arc<Notify>>,
    /// An operator credited the key while the fetch was out: what it
    /// leases goes back at once, as the leases held then did.
    credited: bool,
}

/// A lease's units on their way back to the shared store.
struct Return {
    check: Check,
    counted_at_us: u64,
    /// The lease's: sent only if no forgetting came since.
    generation: u64,
}

struct Table {
    shards: Box<[Mutex<HashMap<StateKey, Entry>>]>,
    /// Bumped by every forgetting, before it drops anything: a fetch whose
    /// script ran before a reset or a failure installs nothing after it,
    /// and a return of units leased before it is not sent (it would take
    /// from a fresh state what the reset gave or a restart left).
    generation: AtomicU64,
    /// Whether operators' changes are heard. Until they are, nothing is
    /// leased: the first subscription forgets every lease (a reset may have
    /// been announced before it), and a lease forgotten is not given back.
    listening: AtomicBool,
}

impl Table {
    fn lock(&self, key: &StateKey) -> MutexGuard<'_, HashMap<StateKey, Entry>> {
        // Entries are replaced whole: a poisoned shard is still consistent.
        self.shards[key.shard(SHARDS)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

impl Forget for Table {
    /// An operator reset the keys: their leases are dropped, not returned
    /// (a return would take from the fresh state what the reset gave).
    fn forget(&self, keys: &[StateKey]) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        for key in keys {
            if let Some(entry) = self.lock(key).get_mut(key) {
                entry.lease = None;
            }
        }
    }

    fn forget_all(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
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

    fn listening(&self) {
        self.listening.store(true, Ordering::Release);
    }

    /// Nothing is leased until it is heard again, and nothing held is used
    /// or given back: a lost subscription is often a Redis that restarted
    /// empty, seen here before any call fails.
    fn not_listening(&self) {
        self.listening.store(false, Ordering::Release);
        self.forget_all();
    }
}

/// The lease table as operators change the state: `Table`'s forgetting,
/// and a credit's returns, which need the store.
impl<S: Store + 'static> Forget for Core<S> {
    fn forget(&self, keys: &[StateKey]) {
        self.table.forget(keys);
    }

    /// Unlike a reset, a credit leaves the state counting what was leased
    /// of it: a lease dropped would keep its unused units spent, and the
    /// credit would add fewer than its units. The leases go back instead,
    /// with no new generation (the rest of the state is as it was). Given
    /// back after the credit, they come off the count as they would have
    /// before it, unless a charge lands in between and the credit was of
    /// more than the client had used (the client then gets at most the
    /// credit's units more than a full budget).
    fn credited(&self, keys: &[StateKey]) {
        for back in self.take_back(keys) {
            let _ = self.returns().send(back);
        }
    }

    fn forget_all(&self) {
        self.table.forget_all();
    }

    fn listening(&self) {
        self.table.listening();
    }

    fn not_listening(&self) {
        self.table.not_listening();
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
                entry.credited = false;
            }
            if entry.lease.is_none() && entry.fetching.is_none() {
                shard.remove(&self.key);
            }
        }
        drop(shard);
        self.notify.notify_waiters();
    }
}

/// What a `Leased` store is: shared with its background tasks (returns,
/// expiry, top-ups).
struct Core<S> {
    inner: Arc<S>,
    table: Arc<Table>,
    settings: LeaseSettings,
    /// The instances sharing the budget: a lease is at most what is left
    /// over twice their number (`algorithm::lease_units`).
    instances: Instances,
    /// How long a request waits for another's fetch: the store's deadline.
    wait: Duration,
    clock: Arc<dyn Clock>,
    /// Never stepped: a lease's age is also measured by it.
    monotonic: Arc<dyn Clock>,
    /// Started on first use, on the proxy's runtime. A return may hold its
    /// key's fetch until it lands.
    returns: OnceLock<mpsc::UnboundedSender<(Return, Option<Fetching>)>>,
    metrics: Option<LeaseMetrics>,
}

/// A store that takes leases from `inner` and decides from them.
pub struct Leased<S>(Arc<Core<S>>);

impl<S: Store + 'static> Leased<S> {
    pub fn new(
        inner: S,
        settings: LeaseSettings,
        instances: Instances,
        wait: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Leased(Arc::new(Core {
            inner: Arc::new(inner),
            table: Arc::new(Table {
                shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
                generation: AtomicU64::new(0),
                listening: AtomicBool::new(true),
            }),
            settings,
            instances,
            wait,
            clock,
            monotonic: Arc::new(MonotonicClock::default()),
            returns: OnceLock::new(),
            metrics: None,
        }))
    }

    /// Measures leases' ages also by `monotonic` (a test's own clock).
    pub fn with_monotonic(mut self, monotonic: Arc<dyn Clock>) -> Self {
        if let Some(core) = Arc::get_mut(&mut self.0) {
            core.monotonic = monotonic;
        }
        self
    }

    /// Leases nothing until the channel of operators' changes is heard
    /// (`Forget::listening`).
    pub fn until_listening(self) -> Self {
        self.0.table.listening.store(false, Ordering::Release);
        self
    }

    /// Also counts what the leases do in `metrics`.
    pub fn with_metrics(mut self, metrics: LeaseMetrics) -> Self {
        if let Some(core) = Arc::get_mut(&mut self.0) {
            core.metrics = Some(metrics);
        }
        self
    }

    /// Hears of the keys an operator reset (their leases are dropped) or
    /// credited (their leases go back) through another instance.
    pub fn forgetter(&self) -> Arc<dyn Forget> {
        self.0.clone()
    }

    /// Leases held now.
    pub fn leases_held(&self) -> usize {
        self.0.leases_held()
    }

    /// Gives every lease back now and waits for the returns (shutdown,
    /// reload).
    pub async fn return_all(&self) {
        self.0.return_all().await;
    }
}

impl<S: Store + 'static> Core<S> {
    /// `answer`, after dropping every lease if it is a failure: the
    /// store's state is unknown then (a restart may have emptied it, a
    /// failover lost its last writes), and no lease taken from it may be
    /// spent or given back on top of what it says next. A branch per call.
    fn checked<T>(&self, answer: Result<T, LimiterError>) -> Result<T, LimiterError> {
        if answer.is_err() {
            self.table.forget_all();
        }
        answer
    }

    /// Read at each fetch: with `instances = "auto"` the count moves.
    fn divisor(&self) -> u64 {
        self.instances.get().saturating_mul(2)
    }

    fn now(&self) -> Now {
        Now {
            wall_us: self.clock.now_us(),
            monotonic_us: self.monotonic.now_us(),
        }
    }

    fn leases_held(&self) -> usize {
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
    fn leasable(&self, check: &Check) -> bool {
        self.table.listening.load(Ordering::Acquire)
            && check.lease
            && !check.peek
            && !check.shadow
            && check.cost > 0
            && takes_lease(check.algorithm.kind())
    }

    /// The queue of returns, and the task that sends them and ends expired
    /// leases: started with the first lease installed (`install`), on the
    /// proxy's runtime, so that every instance holding a lease runs it.
    fn returns(&self) -> &mpsc::UnboundedSender<(Return, Option<Fetching>)> {
        self.returns.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(send_returns(
                self.inner.clone(),
                self.table.clone(),
                (self.clock.clone(), self.monotonic.clone()),
                self.settings.ttl_us,
                self.metrics.clone(),
                receiver,
            ));
            sender
        })
    }

    /// The leases of `keys` taken out to be given back, each holding its
    /// key's fetch until it lands (a request for the key meanwhile waits
    /// rather than be charged before the units are back). A fetch already
    /// out is marked: what it leases goes back too (`Entry::credited`).
    fn take_back(&self, keys: &[StateKey]) -> Vec<(Return, Option<Fetching>)> {
        let now = self.now();
        let mut backs = Vec::new();
        for key in keys {
            let mut shard = self.table.lock(key);
            let Some(entry) = shard.get_mut(key) else {
                continue;
            };
            entry.credited |= entry.fetching.is_some();
            let mut lease = entry.lease.take();
            if let Some(next) = lease.as_mut().and_then(|l| l.next.take()) {
                backs.extend(returned(*next, now).map(|back| (back, None)));
            }
            let back = lease.and_then(|l| returned(l, now));
            if let Some(back) = back {
                let fetching = entry.fetching.is_none().then(|| {
                    let notify = Arc::new(Notify::new());
                    entry.fetching = Some(notify.clone());
                    Fetching {
                        table: self.table.clone(),
                        key: *key,
                        notify,
                    }
                });
                backs.push((back, fetching));
            } else if entry.fetching.is_none() {
                shard.remove(key);
            }
        }
        backs
    }

    fn give_back(&self, lease: Lease, now: Now) {
        if let Some(back) = returned(lease, now) {
            let _ = self.returns().send((back, None));
        }
    }

    /// How long a lease taken for `algorithm` at `sent_us` may live.
    fn ends_at(&self, algorithm: &Algorithm, sent_us: u64, window_end_us: u64) -> u64 {
        let end = sent_us.saturating_add(self.ttl(algorithm));
        match algorithm.kind() {
            Kind::TokenBucket => end,
            _ => end.min(window_end_us),
        }
    }

    /// The lease to ask for beside a layer of `algorithm`.
    fn ask(&self, algorithm: &Algorithm) -> LeaseAsk {
        LeaseAsk {
            max: self.settings.max,
            divisor: self.divisor(),
            life_us: self.ttl(algorithm),
        }
    }

    /// `lease_ttl`, and never more than a tenth of the limit's window.
    fn ttl(&self, algorithm: &Algorithm) -> u64 {
        self.settings
            .ttl_us
            .min((algorithm.window_us() / 10).max(1))
    }

    /// Takes `check.cost` from its key's lease if it has room. Otherwise
    /// the lease, if any, is over, and the caller is told whether to fetch
    /// (the fetch is then this caller's, and so is the over lease's return,
    /// to send before the fetch: the store must not refuse for units on
    /// their way back) or that a fetch is out.
    fn take(&self, check: &Check, now: Now) -> Taken {
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
                    let top_up = (lease.half_spent() && entry.fetching.is_none()).then(|| {
                        let notify = Arc::new(Notify::new());
                        entry.fetching = Some(notify.clone());
                        Fetching {
                            table: self.table.clone(),
                            key: check.key,
                            notify,
                        }
                    });
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
                let notify = Arc::new(Notify::new());
                entry.fetching = Some(notify.clone());
                let fetching = Fetching {
                    table: self.table.clone(),
                    key: check.key,
                    notify,
                };
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
    fn untake(&self, check: &Check, took: &Took) {
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
    fn install(&self, check: &Check, after: Decision, units: u64, sent: (Now, u64)) -> Decision {
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
    async fn top_up(&self, check: Check, fetching: Fetching) {
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

    async fn return_all(&self) {
        let now = self.now();
        let mut backs = Vec::new();
        for shard in self.table.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for entry in shard.values_mut() {
                let mut lease = entry.lease.take();
                if let Some(next) = lease.as_mut().and_then(|l| l.next.take()) {
                    backs.extend(returned(*next, now).map(|back| (back, None)));
                }
                backs.extend(
                    lease
                        .and_then(|l| returned(l, now))
                        .map(|back| (back, None)),
                );
            }
            shard.retain(|_, e| e.fetching.is_some());
        }
        send(&*self.inner, &self.table, self.metrics.as_ref(), backs).await;
    }
}

/// The return of a lease's unused units at `now`, if worth sending:
/// not a bucket's that the bucket refills within a lease's life anyway
/// (100 tokens at 1,000,000 a second: 100 µs): a call for them would cost
/// more than they are worth, and its ledger lets them go within two lives.
fn returned(lease: Lease, now: Now) -> Option<Return> {
    let units = lease.returnable(now);
    let refilled_us = units.saturating_mul(lease.check.algorithm.period_us());
    if units == 0
        || (lease.check.algorithm.kind() == Kind::TokenBucket && refilled_us <= lease.ttl_us)
    {
        return None;
    }
    Some(Return {
        check: Check {
            cost: units,
            ..lease.check
        },
        counted_at_us: lease.counted_at_us,
        generation: lease.generation,
    })
}

/// Sends `backs` together (a few at a time, so that they share script
/// runs), each holding its key's fetch, if any, until it has landed. A
/// return from before a forgetting is dropped; one that fails leaves its
/// units spent until their window or refill ends them (under-admission,
/// never over) and drops every lease, as any failed call does: the next
/// call may reach a Redis that restarted empty, where the other leases'
/// units were never counted.
async fn send<S: Store>(
    inner: &S,
    table: &Table,
    metrics: Option<&LeaseMetrics>,
    backs: Vec<(Return, Option<Fetching>)>,
) {
    let mut backs = backs.into_iter().peekable();
    while backs.peek().is_some() {
        let batch: Vec<_> = backs.by_ref().take(RETURNS_AT_ONCE).collect();
        let sent = batch.iter().map(|(back, _)| async move {
            if back.generation != table.generation() {
                return;
            }
            match inner.refund(&back.check, back.counted_at_us).await {
                Ok(()) => {
                    if let Some(m) = metrics {
                        m.returned_units.inc_by(back.check.cost);
                    }
                }
                Err(_) => table.forget_all(),
            }
        });
        futures_util::future::join_all(sent).await;
    }
}

/// Units a request took from a lease.
#[derive(Clone, Copy)]
struct Took {
    decision: Decision,
    /// The lease's: units taken from a lease of an older generation go
    /// back nowhere.
    generation: u64,
}

enum Taken {
    /// From the lease; and the fetch of a top-up, when it is half spent.
    Local(Took, Option<Fetching>),
    /// The caller fetches; first it gives back what the over lease left.
    Fetch(Fetching, Option<Return>),
    Out(Arc<Notify>),
    /// No room in the table: the store decides alone.
    Alone,
}

/// Sends returns as they come, and every tick ends the leases whose time
/// is over and sends what they did not use.
async fn send_returns<S: Store + 'static>(
    inner: Arc<S>,
    table: Arc<Table>,
    clocks: (Arc<dyn Clock>, Arc<dyn Clock>),
    ttl_us: u64,
    metrics: Option<LeaseMetrics>,
    mut queue: mpsc::UnboundedReceiver<(Return, Option<Fetching>)>,
) {
    let mut tick = tokio::time::interval(Duration::from_micros(ttl_us.clamp(1_000, 250_000)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut queued = Vec::new();
    loop {
        let backs = tokio::select! {
            got = queue.recv_many(&mut queued, RETURNS_AT_ONCE) => {
                if got == 0 {
                    return;
                }
                std::mem::take(&mut queued)
            }
            _ = tick.tick() => {
                let now = Now {
                    wall_us: clocks.0.now_us(),
                    monotonic_us: clocks.1.now_us(),
                };
                let (backs, held) = expired(&table, now);
                if let Some(m) = &metrics {
                    m.held.set(i64::try_from(held).unwrap_or(i64::MAX));
                }
                backs
            }
        };
        // Each expired lease's return holds its key's fetch (if it could
        // take it) until it lands: a request for the key meanwhile waits
        // rather than be refused for units on their way back.
        send(&*inner, &table, metrics.as_ref(), backs).await;
    }
}

/// Ends the leases over at `now`; what they give back, and how many
/// leases are left.
fn expired(table: &Arc<Table>, now: Now) -> (Vec<(Return, Option<Fetching>)>, usize) {
    let mut backs = Vec::new();
    let mut held = 0;
    for shard in table.shards.iter() {
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        shard.retain(|key, entry| {
            // Over: the next lease, if any, takes its place (and may be
            // over too).
            while entry.lease.as_ref().is_some_and(|l| l.over(now)) {
                let mut over = entry.lease.take();
                entry.lease = over.as_mut().and_then(|l| l.next.take()).map(|next| *next);
                if let Some(back) = over.and_then(|l| returned(l, now)) {
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

/// Every call to the store below goes through `Core::checked`: whatever
/// fails, every lease is dropped.
#[async_trait]
impl<S: Store + 'static> Store for Leased<S> {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.0.decide(checks).await
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.0.checked(self.0.inner.peek(checks).await)
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.0.reset(checks).await
    }

    /// This instance's lease of the key goes back first, and lands before
    /// the credit (which gives back no more than the bucket or the window
    /// holds then). The other instances give theirs back when they hear of
    /// the credit.
    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        let backs = self.0.take_back(std::slice::from_ref(&check.key));
        send(
            &*self.0.inner,
            &self.0.table,
            self.0.metrics.as_ref(),
            backs,
        )
        .await;
        self.0.checked(self.0.inner.credit(check).await)
    }

    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        self.0.refund(check, counted_at_us).await
    }

    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        self.0.checked(self.0.inner.acquire(slot).await)
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.0.checked(self.0.inner.renew(slot).await)
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        self.0.checked(self.0.inner.release(slot).await)
    }

    async fn probe(&self) -> Result<(), LimiterError> {
        self.0.checked(self.0.inner.probe().await)
    }

    async fn warm(&self) -> Result<(), LimiterError> {
        self.0.checked(self.0.inner.warm().await)
    }

    fn deciding(&self) -> Deciding {
        self.0.inner.deciding()
    }

    async fn return_leases(&self) {
        self.0.return_all().await;
    }
}

impl<S: Store + 'static> Core<S> {
    async fn decide(self: &Arc<Self>, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
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
            let mut local: SmallVec<[Option<Took>; 4]> = SmallVec::new();
            let mut asks: SmallVec<[Option<LeaseAsk>; 4]> = SmallVec::new();
            let mut fetches: SmallVec<[Fetching; 2]> = SmallVec::new();
            let mut out: Option<(StateKey, Arc<Notify>)> = None;
            let mut backs: SmallVec<[Return; 1]> = SmallVec::new();
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
                            fetches.push(fetch);
                            backs.extend(back);
                            (None, Some(self.ask(&check.algorithm)))
                        }
                        Taken::Out(notify) => {
                            out.get_or_insert((check.key, notify));
                            (None, None)
                        }
                        Taken::Alone => (None, None),
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
                    let _ = self.returns().send((back, None));
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
                return Ok(local.into_iter().flatten().map(|t| t.decision).collect());
            }
            let backs = backs.into_iter().map(|back| (back, None)).collect();
            send(&*self.inner, &self.table, self.metrics.as_ref(), backs).await;
            return self
                .decide_rest(checks, local, &asks, (now, generation))
                .await;
        }
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
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
    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
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

#[cfg(test)]
#[path = "leases_tests.rs"]
mod tests;
