//! Units going back to the shared store: a lease over, given back (a
//! credit, shutdown, reload), or taken by a request refused elsewhere. One
//! task per store sends them, a few at a time, and ends the leases whose
//! time is over.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::lease::{returned, Lease, Now, Return};
use super::table::{Fetching, Table};
use super::Core;
use crate::check::StateKey;
use crate::clock::Clock;
use crate::deny_cache::Forget;
use crate::metrics::LeaseMetrics;
use crate::store::Store;

/// Returns sent together at most.
const RETURNS_AT_ONCE: usize = 64;

impl<S: Store + 'static> Core<S> {
    /// The queue of returns, and the task that sends them and ends expired
    /// leases: started with the first lease installed (`install`), on the
    /// proxy's runtime, so that every instance holding a lease runs it.
    pub(super) fn returns(&self) -> &mpsc::UnboundedSender<(Return, Option<Fetching>)> {
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
    pub(super) fn take_back(&self, keys: &[StateKey]) -> Vec<(Return, Option<Fetching>)> {
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
                let fetching = entry
                    .fetching
                    .is_none()
                    .then(|| Fetching::start(&self.table, *key, &mut entry.fetching));
                backs.push((back, fetching));
            } else if entry.fetching.is_none() {
                shard.remove(key);
            }
        }
        backs
    }

    pub(super) fn give_back(&self, lease: Lease, now: Now) {
        if let Some(back) = returned(lease, now) {
            let _ = self.returns().send((back, None));
        }
    }

    pub(super) async fn return_all(&self) {
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

impl<S: Store + 'static> Core<S> {
    /// Sends `backs` now, as `send` does, rather than through the queue.
    pub(super) async fn send_back(&self, backs: Vec<(Return, Option<Fetching>)>) {
        send(&*self.inner, &self.table, self.metrics.as_ref(), backs).await;
    }
}

/// Sends `backs` together (a few at a time, so that they share script
/// runs), each holding its key's fetch, if any, until it has landed. A
/// return from before a forgetting is dropped; one that fails leaves its
/// units spent until their window or refill ends them (under-admission,
/// never over) and drops every lease, as any failed call does: the next
/// call may reach a Redis that restarted empty, where the other leases'
/// units were never counted.
pub(super) async fn send<S: Store>(
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
                    let fetching = entry
                        .fetching
                        .is_none()
                        .then(|| Fetching::start(table, *key, &mut entry.fetching));
                    backs.push((back, fetching));
                }
            }
            held += usize::from(entry.lease.is_some());
            entry.lease.is_some() || entry.fetching.is_some()
        });
    }
    (backs, held)
}
