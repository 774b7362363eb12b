//! Redis Cluster. Keys carry the identity hash as their hash tag, so the
//! layers keyed by one identity share a slot: layers are grouped by identity
//! and each group is one EVALSHA, the groups run concurrently.
//! All-or-nothing then holds within a group only: when layers keyed by
//! different identities (say per-ip and per-account) disagree, the
//! admitting group has been charged although the request is refused.
//! A group with no other of its identity in progress runs at once. One
//! whose identity already has a decision in progress goes into the store's
//! queue (`batch`), whose runs
//! decide what arrived meanwhile with one script run per slot among it (a
//! run may only touch one slot's keys): a hot key (one client, a global
//! limit) costs its master a run per batch rather than one per request.
//! Queueing every group cost the client twice the CPU per decision when keys
//! are spread (scripts/redis_shards.sh), and a queue per slot would hold a
//! task and its buffers for each of 16,384 slots.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use prometheus::Histogram;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot as HashSlot;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;
use smallvec::SmallVec;

use pingora_timeout::fast_timeout::fast_timeout;

use super::batch::{BatchQueue, RunBatch, Wanted};
use super::script::{Decided, ScriptLayer, SlotOp};
use super::scripted::{connection_error, install_tls_provider, Scripted};
use super::settings::{RedisSettings, Topology};
use super::shared_connection::Connect;
use crate::check::{Check, Enforcement, LeaseAsk, Slot, Spending};
use crate::clock::Clock;
use crate::deny_cache::open_decision;
use crate::error::LimiterError;
use crate::store::{Concurrency, Deciding, Store, Upkeep};
use crate::watch;
use floodgate_algorithm::Decision;

impl Connect for ClusterConnection {
    /// The client's one task runs every call, and each call it polls spends
    /// some of the task's tokio budget (128 units a poll): with a burst in
    /// flight the budget ran out while calls it had woken still held read
    /// permits on its connection map, a MOVED among them started a slot-map
    /// refresh, and the refresh, waiting for the write lock, was all the
    /// task polled from then on (tests/cluster_moved_burst.rs). With 16 in
    /// flight a poll spends well under the budget (that test wedged in 3 of
    /// 4 runs at 64, none of 4 at 32); a wedge that happens anyway costs
    /// one deadline, after which the connection is made anew.
    const REPLACE_WHEN_STALLED: bool = true;
    const MOST_CALLS_IN_FLIGHT: Option<usize> = Some(16);

    async fn connect(settings: &RedisSettings) -> Result<Self, LimiterError> {
        cluster_client(settings)
            .map_err(connection_error)?
            .get_async_connection()
            .await
            .map_err(connection_error)
    }
}

/// A client of the cluster `settings` name, as decisions reach it.
pub(super) fn cluster_client(
    settings: &RedisSettings,
) -> redis::RedisResult<redis::cluster::ClusterClient> {
    install_tls_provider();
    let nodes = match &settings.topology {
        Topology::Cluster(nodes) => nodes.clone(),
        Topology::Standalone(url) => vec![url.clone()],
        Topology::Sentinel(_) => Vec::new(),
    };
    // redis-rs's defaults suit a client that may wait: a first retry
    // after 1.28 s or more, and a dead node reconnected to for as long
    // as its slot map lists it. Here a decision has `timeout` in all,
    // and a killed master's slots would stay mapped to it after its
    // replica took over, every call for them failing until the breaker
    // decided beside Redis. So retries wait milliseconds, and a node
    // that refuses a few reconnects is dropped, which makes the next
    // call for its slots read the slot map again. Each retry of such a
    // call rereads it, so retries are few (`RETRIES`), and the breaker
    // keeps calls away until the cluster is whole again (`probe`).
    let timeout_ms = u64::try_from(settings.timeout.as_millis()).unwrap_or(u64::MAX);
    // A node is connected to within `node_connect_within`, not the
    // decision deadline: a cluster farther than that would never be.
    // A frozen node then takes up to that long per reconnect before it
    // is dropped; one that is down refuses at once.
    let mut builder = redis::cluster::ClusterClient::builder(nodes)
        .connection_timeout(settings.node_connect_within())
        .min_retry_wait(RETRY_WAIT_MIN_MS)
        .max_retry_wait((timeout_ms / 4).max(RETRY_WAIT_MIN_MS + 1))
        .retry_wait_formula(RETRY_WAIT_FACTOR_MS, 2)
        .max_connection_attempts(RECONNECTS_BEFORE_DROPPING_A_NODE)
        .retries(RETRIES);
    if let Some(certificates) = settings.tls_certificates() {
        builder = builder.certs(certificates);
    }
    builder.build()
}

/// Retries of one call: a MOVED, an ASK and a reconnect. redis-rs's 16
/// reread the slot map on each retry of a call for a dead master's slots
/// (16 reads per proxy before its first call failed and the breaker
/// opened, in tests/cluster_changes.rs).
const RETRIES: u32 = 3;

/// A retry's wait: at least this, then doubling from the factor.
const RETRY_WAIT_MIN_MS: u64 = 5;
const RETRY_WAIT_FACTOR_MS: u64 = 5;

/// Reconnects (50, 100, 200 ms apart) to a node before it is dropped until
/// the slot map lists it again.
const RECONNECTS_BEFORE_DROPPING_A_NODE: NonZeroUsize = match NonZeroUsize::new(3) {
    Some(n) => n,
    None => unreachable!(),
};

/// A decision counted on its lane while it is in progress: until it is
/// decided, or its caller gives up on it.
struct InProgress<'a> {
    count: &'a AtomicU32,
    alone: bool,
}

impl<'a> InProgress<'a> {
    fn on(count: &'a AtomicU32) -> Self {
        let alone = count.fetch_add(1, Ordering::AcqRel) == 0;
        InProgress { count, alone }
    }
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One script run for requests whose keys share a slot, within the deadline.
async fn run_on_slot(
    scripted: &Scripted<ClusterConnection>,
    requests: &[&[ScriptLayer]],
    wanted: Wanted<'_>,
) -> Result<Vec<Option<Decided>>, LimiterError> {
    scripted
        .within_deadline(|mut connection| async move {
            scripted.run_wanted(&mut connection, requests, wanted).await
        })
        .await
}

/// The queue's runs: one script run per slot among the requests, the slots
/// concurrently, each request answered by its own slot's run.
struct SlotRuns(Arc<Scripted<ClusterConnection>>);

#[async_trait]
impl RunBatch for SlotRuns {
    type Layer = ScriptLayer;
    type Decided = Result<Decided, LimiterError>;

    async fn run_batch(
        &self,
        requests: &[&[ScriptLayer]],
        wanted: Wanted<'_>,
    ) -> Result<Vec<Option<Self::Decided>>, LimiterError> {
        let mut by_slot: HashMap<Option<HashSlot>, Vec<usize>> = HashMap::new();
        for (i, layers) in requests.iter().enumerate() {
            by_slot.entry(slot_of(layers)).or_default().push(i);
        }
        let scripted = &self.0;
        let runs = by_slot.values().map(|indices| {
            let group: Vec<&[ScriptLayer]> = indices.iter().map(|&i| requests[i]).collect();
            let wanted_in_group = move |j: usize| indices.get(j).is_some_and(|&i| wanted(i));
            async move { run_on_slot(scripted, &group, &wanted_in_group).await }
        });
        let results = futures_util::future::join_all(runs).await;
        let mut answers: Vec<Option<Self::Decided>> = requests.iter().map(|_| None).collect();
        for (indices, result) in by_slot.values().zip(results) {
            match result {
                Ok(decided) => {
                    for (&i, d) in indices.iter().zip(decided) {
                        answers[i] = d.map(Ok);
                    }
                }
                // The requests no longer waited for get it too, unread.
                Err(e) => {
                    for &i in indices {
                        answers[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        Ok(answers)
    }
}

/// Counters of decisions in progress, each shared by the identities whose
/// hash falls on it.
const LANES: usize = 16_384;

/// A request's slot: its layers are keyed by one identity (`run_grouped`),
/// so they share one (redis-rs's rule, the one it routes a call by).
fn slot_of(layers: &[ScriptLayer]) -> Option<HashSlot> {
    layers.first().map(|l| HashSlot::for_key(l.key()))
}

/// The Redis Cluster store: a request's layers grouped by identity (each
/// group's keys share a hash slot), one script run per group.
pub struct RedisCluster {
    scripted: Arc<Scripted<ClusterConnection>>,
    /// Decisions whose slot had another in progress, run together by slot;
    /// started on first use, on the proxy's runtime.
    queue: OnceLock<BatchQueue<ScriptLayer, Result<Decided, LimiterError>>>,
    /// Decisions in progress per lane of identities: one alone runs at once,
    /// the others go through the queue.
    deciding: Box<[AtomicU32]>,
    /// The cluster's epoch when the connection was last made anew by the
    /// probe, and when (µs).
    last_remap: Mutex<Option<(u64, u64)>>,
}

/// While the client misses a master and the cluster's epoch stays put, the
/// probe makes the connection anew no more often than this.
const REMAP_AT_LEAST_EVERY: Duration = Duration::from_secs(2);

impl RedisCluster {
    /// A store on the cluster `settings` name, deciding at `clock`'s time
    /// when `settings.clock` is local. Connects before the proxy listens
    /// (`Store::warm`) or on first use, not here.
    pub fn new(settings: RedisSettings, clock: Arc<dyn Clock>) -> Self {
        RedisCluster {
            scripted: Arc::new(Scripted::new(settings, clock)),
            queue: OnceLock::new(),
            deciding: (0..LANES).map(|_| AtomicU32::new(0)).collect(),
            last_remap: Mutex::new(None),
        }
    }

    /// Makes the connection anew (one slot-map read) when the cluster's
    /// epoch moved since the last time, or that was long ago.
    fn remap_if_stale(&self, epoch: Option<u64>) {
        let now_us = self.scripted.clock.now_us();
        let mut last = self.last_remap.lock().unwrap_or_else(|p| p.into_inner());
        let moved = match (epoch, *last) {
            (Some(epoch), Some((seen, _))) => epoch != seen,
            _ => true,
        };
        let long_ago = last.is_none_or(|(_, at_us)| {
            now_us.saturating_sub(at_us) >= REMAP_AT_LEAST_EVERY.as_micros() as u64
        });
        if moved || long_ago {
            *last = Some((epoch.unwrap_or(0), now_us));
            self.scripted.connection.forget();
        }
    }

    /// Also times every call in `histogram`.
    pub fn with_call_timer(mut self, histogram: Histogram) -> Self {
        // Before the first call nothing else holds the script state.
        if let Some(scripted) = Arc::get_mut(&mut self.scripted) {
            scripted.call_seconds = Some(histogram);
        }
        self
    }

    /// Decides one identity's layers: at once when nothing else of the
    /// identity's is being decided, else in the next run of the queue.
    async fn on_slot(
        &self,
        identity: u128,
        layers: Vec<ScriptLayer>,
    ) -> Result<Decided, LimiterError> {
        let lane = (identity % LANES as u128) as usize;
        let deciding = InProgress::on(&self.deciding[lane]);
        if deciding.alone {
            // Run by the caller itself: cancelled with it, not charged
            // unless sent.
            let mut decided = run_on_slot(&self.scripted, &[&layers], &|_| true).await?;
            return decided
                .pop()
                .flatten()
                .ok_or(LimiterError::WrongReplyLength {
                    values: 0,
                    layers: layers.len(),
                });
        }
        let queue = self
            .queue
            .get_or_init(|| BatchQueue::start(Arc::new(SlotRuns(self.scripted.clone()))));
        queue.decide(layers).await?
    }

    /// One script run per identity's group of layers, the groups
    /// concurrently, all within one deadline.
    async fn run_grouped(
        &self,
        checks: &[Check],
        spending: Spending,
    ) -> Result<Vec<Decision>, LimiterError> {
        let mut groups: HashMap<u128, Vec<usize>> = HashMap::new();
        for (i, check) in checks.iter().enumerate() {
            groups.entry(check.key.identity).or_default().push(i);
        }
        let scripted = &self.scripted;
        let _timer = scripted.call_timer();
        // The request's own deadline covers the wait for a place in a run
        // as well as the run.
        let deadline = scripted.settings.timeout;
        let calls = groups.iter().map(|(&identity, indices)| {
            let layers = scripted.layers(indices.iter().map(|&i| &checks[i]), spending);
            self.on_slot(identity, layers)
        });
        let call = async {
            fast_timeout(deadline, futures_util::future::join_all(calls))
                .await
                .map_err(|_| LimiterError::Timeout(deadline))
        };
        let operation = match spending {
            Spending::Peek => "peek",
            Spending::Charge => "decide",
        };
        let results = watch::redis_call(operation, call).await?;
        let mut decisions = vec![None; checks.len()];
        for (indices, result) in groups.values().zip(results) {
            for (&i, d) in indices.iter().zip(result?.0) {
                decisions[i] = Some(d);
            }
        }
        decisions
            .into_iter()
            .map(|d| {
                d.ok_or(LimiterError::WrongReplyLength {
                    values: 0,
                    layers: 1,
                })
            })
            .collect()
    }
}

#[async_trait]
impl Store for RedisCluster {
    /// Each identity's layers are decided all-or-nothing in one script
    /// run; across identities, a refusing lookup (a ban on the address)
    /// must still keep the others' layers (the account's) uncharged, so
    /// when a request has lookups on more than one identity they run
    /// first, and the rest only when no enforcing one refused.
    /// Leases only when every layer is keyed by the same identity: one
    /// script run, all-or-nothing, as on a single node.
    async fn decide_leasing(
        &self,
        checks: &[Check],
        asks: &[Option<LeaseAsk>],
    ) -> Result<(Vec<Decision>, SmallVec<[u64; 4]>), LimiterError> {
        let one_identity = checks
            .iter()
            .all(|c| c.key.identity == checks[0].key.identity);
        if !one_identity || checks.is_empty() {
            return Ok((self.decide(checks).await?, SmallVec::new()));
        }
        let scripted = &self.scripted;
        let layers = scripted.layers_leasing(checks, asks, Spending::Charge);
        let _timer = scripted.call_timer();
        let call = scripted.within_deadline(|mut connection| async move {
            let mut decided = scripted.run(&mut connection, &[&layers]).await?;
            decided.pop().ok_or(LimiterError::WrongReplyLength {
                values: 0,
                layers: checks.len(),
            })
        });
        watch::redis_call("decide", call).await
    }

    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        let identities_differ = checks
            .iter()
            .any(|c| c.key.identity != checks[0].key.identity);
        if !identities_differ || !checks.iter().any(|c| c.spending == Spending::Peek) {
            return self.run_grouped(checks, Spending::Charge).await;
        }
        let (lookups, rest): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| checks[i].spending == Spending::Peek);
        let pick = |indices: &[usize]| -> Vec<Check> {
            indices.iter().map(|&i| checks[i].clone()).collect()
        };
        let looked = self.run_grouped(&pick(&lookups), Spending::Peek).await?;
        let refused = lookups
            .iter()
            .zip(&looked)
            .any(|(&i, d)| checks[i].enforcement == Enforcement::Enforce && !d.allowed());
        let decided = if refused || rest.is_empty() {
            rest.iter().map(|&i| open_decision(&checks[i])).collect()
        } else {
            self.run_grouped(&pick(&rest), Spending::Charge).await?
        };
        let mut decisions = vec![None; checks.len()];
        for (&i, d) in lookups.iter().zip(looked).chain(rest.iter().zip(decided)) {
            decisions[i] = Some(d);
        }
        Ok(decisions.into_iter().flatten().collect())
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.run_grouped(checks, Spending::Peek).await
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.scripted.delete(checks).await
    }

    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        self.scripted.credit(check).await
    }

    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        self.scripted.refund(check, counted_at_us).await
    }
}

#[async_trait]
impl Concurrency for RedisCluster {
    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        Ok(self.scripted.slots(SlotOp::Acquire, slot).await?.1)
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        Ok(self.scripted.slots(SlotOp::Renew, slot).await?.0)
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        Ok(self.scripted.slots(SlotOp::Release, slot).await?.0)
    }
}

#[async_trait]
impl Upkeep for RedisCluster {
    async fn warm(&self) -> Result<(), LimiterError> {
        self.scripted.warm().await
    }

    /// The breaker closes only on a whole cluster that this client sees
    /// whole: the probe script answers on one key, `CLUSTER INFO` on a
    /// master says every slot has a live master, and every master in the
    /// client's slot map answers PING, as many as the cluster has.
    ///
    /// A probe of one slot alone, or a PING of the masters the client is
    /// connected to, passed while a killed master's slots still led to
    /// it (the client drops a node that refuses reconnects): the breaker
    /// closed, every call for those slots reread the slot map and failed,
    /// and it opened again, three times per proxy and about 50 slot-map
    /// reads each in tests/cluster_changes.rs. Neither `CLUSTER INFO` nor
    /// PING reads the slot map. Once the cluster has changed (its epoch
    /// moved: a replica took over) while the client still misses a
    /// master, its map is stale: the connection is made anew, one read.
    /// A master that comes back without a failover moves no epoch, so the
    /// client is also made anew at most every `REMAP_AT_LEAST_EVERY`.
    async fn probe(&self) -> Result<(), LimiterError> {
        self.scripted.probe().await?;
        let (answered, info) = self
            .scripted
            .within_deadline(|mut connection| async move {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let pings = connection
                    .route_command(redis::cmd("PING"), routing)
                    .await
                    .map_err(connection_error)?;
                let mut info = redis::cmd("CLUSTER");
                info.arg("INFO");
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
                let info = connection
                    .route_command(info, routing)
                    .await
                    .map_err(connection_error)?;
                let info: String = redis::from_redis_value(info)
                    .map_err(|e| LimiterError::UnparsableReply(e.to_string().into()))?;
                Ok((pongs(&pings), info))
            })
            .await?;
        if let Some(why) = not_whole(&info) {
            return Err(LimiterError::ClusterNotWhole(why.into()));
        }
        let masters = field(&info, "cluster_size").and_then(|n| n.parse::<usize>().ok());
        if masters.is_some_and(|masters| answered >= masters) {
            return Ok(());
        }
        let epoch = field(&info, "cluster_current_epoch").and_then(|e| e.parse::<u64>().ok());
        self.remap_if_stale(epoch);
        Err(LimiterError::ClusterNotWhole(
            format!(
                "{answered} of {} masters answer this client",
                masters.map_or("?".to_string(), |m| m.to_string())
            )
            .into(),
        ))
    }

    fn deciding(&self) -> Deciding {
        Deciding::Redis
    }
}

/// What `CLUSTER INFO` says is missing: a state other than ok, or slots
/// whose master is failing or suspected of it (a master killed a moment ago
/// is suspected first, then failed until its replica takes its slots).
/// None when every slot has a live master.
fn not_whole(cluster_info: &str) -> Option<String> {
    let field = |name: &str| field(cluster_info, name);
    if field("cluster_state") != Some("ok") {
        return Some(format!(
            "cluster_state is {}",
            field("cluster_state").unwrap_or("missing")
        ));
    }
    ["cluster_slots_fail", "cluster_slots_pfail"]
        .into_iter()
        .find_map(|name| match field(name) {
            Some("0") => None,
            Some(n) => Some(format!("{name} is {n}")),
            None => Some(format!("{name} is missing")),
        })
}

/// A field of `CLUSTER INFO`'s "name:value" lines.
fn field<'a>(cluster_info: &'a str, name: &str) -> Option<&'a str> {
    cluster_info
        .lines()
        .filter_map(|line| line.trim_end().split_once(':'))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The masters that answered PONG to a PING sent to each (one entry per
/// master the client's slot map lists and it has a connection to).
fn pongs(replies: &Value) -> usize {
    let pong = |v: &Value| match v {
        Value::SimpleString(s) => s == "PONG",
        Value::BulkString(b) => b == b"PONG",
        _ => false,
    };
    match replies {
        Value::Map(per_master) => per_master.iter().filter(|(_, v)| pong(v)).count(),
        single => usize::from(pong(single)),
    }
}

#[cfg(test)]
mod tests;
