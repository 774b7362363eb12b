//! Redis Cluster. Keys carry the identity hash as their hash tag, so the
//! layers keyed by one identity share a slot: layers are grouped by identity
//! and each group is one EVALSHA, the groups run concurrently.
//! All-or-nothing then holds within a group only: when layers keyed by
//! different identities (say per-ip and per-account) disagree, the
//! admitting group has been charged although the request is refused.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use async_trait::async_trait;
use prometheus::Histogram;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use smallvec::SmallVec;

use super::scripted::{connection_error, install_tls_provider, Scripted, SlotOp};
use super::settings::{RedisSettings, Topology};
use super::shared_connection::Connect;
use crate::check::{Check, LeaseAsk, Slot};
use crate::clock::Clock;
use crate::deny_cache::open_decision;
use crate::error::LimiterError;
use crate::store::{Deciding, Store};
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
        // call for its slots read the slot map again. While the dead master
        // is still listed each such call rereads it (147-199 reads by three
        // proxies in a 4-5 s failover, against 15 with the defaults).
        let timeout_ms = u64::try_from(settings.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut builder = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(settings.timeout)
            .min_retry_wait(RETRY_WAIT_MIN_MS)
            .max_retry_wait((timeout_ms / 4).max(RETRY_WAIT_MIN_MS + 1))
            .retry_wait_formula(RETRY_WAIT_FACTOR_MS, 2)
            .max_connection_attempts(RECONNECTS_BEFORE_DROPPING_A_NODE);
        if let Some(certificates) = settings.tls_certificates() {
            builder = builder.certs(certificates);
        }
        let client = builder.build().map_err(connection_error)?;
        client
            .get_async_connection()
            .await
            .map_err(connection_error)
    }
}

/// A retry's wait: at least this, then doubling from the factor.
const RETRY_WAIT_MIN_MS: u64 = 5;
const RETRY_WAIT_FACTOR_MS: u64 = 5;

/// Reconnects (50, 100, 200 ms apart) to a node before it is dropped until
/// the slot map lists it again.
const RECONNECTS_BEFORE_DROPPING_A_NODE: NonZeroUsize = match NonZeroUsize::new(3) {
    Some(n) => n,
    None => unreachable!(),
};

pub struct RedisCluster {
    scripted: Scripted<ClusterConnection>,
}

impl RedisCluster {
    pub fn new(settings: RedisSettings, clock: Arc<dyn Clock>) -> Self {
        RedisCluster {
            scripted: Scripted::new(settings, clock),
        }
    }

    /// Also times every call in `histogram`.
    pub fn with_call_timer(mut self, histogram: Histogram) -> Self {
        self.scripted.call_seconds = Some(histogram);
        self
    }

    /// One script run per identity's group of layers, the groups
    /// concurrently, all within one deadline.
    async fn run_grouped(
        &self,
        checks: &[Check],
        peek: bool,
    ) -> Result<Vec<Decision>, LimiterError> {
        let mut groups: HashMap<u128, Vec<usize>> = HashMap::new();
        for (i, check) in checks.iter().enumerate() {
            groups.entry(check.key.identity).or_default().push(i);
        }
        let scripted = &self.scripted;
        let groups = &groups;
        let _timer = scripted.call_timer();
        scripted
            .within_deadline(|connection| async move {
                let calls = groups.values().map(|indices| {
                    let mut connection = connection.clone();
                    let layers = scripted.layers(indices.iter().map(|&i| &checks[i]), peek);
                    async move {
                        let mut decided = scripted.run(&mut connection, &[&layers]).await?;
                        Ok::<_, LimiterError>(decided.pop().unwrap_or_default().0)
                    }
                });
                let results = futures_util::future::join_all(calls).await;
                let mut decisions = vec![None; checks.len()];
                for (indices, result) in groups.values().zip(results) {
                    for (&i, d) in indices.iter().zip(result?) {
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
            })
            .await
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
        let layers = scripted.layers_leasing(checks, asks, false);
        let _timer = scripted.call_timer();
        scripted
            .within_deadline(|mut connection| async move {
                let mut decided = scripted.run(&mut connection, &[&layers]).await?;
                decided.pop().ok_or(LimiterError::WrongReplyLength {
                    values: 0,
                    layers: checks.len(),
                })
            })
            .await
    }

    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        let identities_differ = checks
            .iter()
            .any(|c| c.key.identity != checks[0].key.identity);
        if !identities_differ || !checks.iter().any(|c| c.peek) {
            return self.run_grouped(checks, false).await;
        }
        let (lookups, rest): (Vec<usize>, Vec<usize>) =
            (0..checks.len()).partition(|&i| checks[i].peek);
        let pick = |indices: &[usize]| -> Vec<Check> {
            indices.iter().map(|&i| checks[i].clone()).collect()
        };
        let looked = self.run_grouped(&pick(&lookups), true).await?;
        let refused = lookups
            .iter()
            .zip(&looked)
            .any(|(&i, d)| !checks[i].shadow && !d.allowed());
        let decided = if refused || rest.is_empty() {
            rest.iter().map(|&i| open_decision(&checks[i])).collect()
        } else {
            self.run_grouped(&pick(&rest), false).await?
        };
        let mut decisions = vec![None; checks.len()];
        for (&i, d) in lookups.iter().zip(looked).chain(rest.iter().zip(decided)) {
            decisions[i] = Some(d);
        }
        Ok(decisions.into_iter().flatten().collect())
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        self.run_grouped(checks, true).await
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

    async fn acquire(&self, slot: &Slot) -> Result<Decision, LimiterError> {
        Ok(self.scripted.slots(SlotOp::Acquire, slot).await?.1)
    }

    async fn renew(&self, slot: &Slot) -> Result<bool, LimiterError> {
        Ok(self.scripted.slots(SlotOp::Renew, slot).await?.0)
    }

    async fn release(&self, slot: &Slot) -> Result<bool, LimiterError> {
        Ok(self.scripted.slots(SlotOp::Release, slot).await?.0)
    }

    /// The probe script on one key, and every master the slot map lists
    /// answering: a probe of one slot alone closed the breaker while a
    /// killed master's slots still led to it.
    async fn probe(&self) -> Result<(), LimiterError> {
        self.scripted.probe().await?;
        self.scripted
            .within_deadline(|mut connection| async move {
                let routing = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                connection
                    .route_command(redis::cmd("PING"), routing)
                    .await
                    .map(drop)
                    .map_err(connection_error)
            })
            .await
    }

    fn deciding(&self) -> Deciding {
        Deciding::Redis
    }
}
