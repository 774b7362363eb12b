//! One Redis node (at a fixed address, or the master Sentinel names). All layers of a request go in one EVALSHA,
//! all-or-nothing, and requests that arrive while a run is in flight share
//! the next one (`batch`): Redis pays one script call for many decisions.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use pingora_timeout::fast_timeout::fast_timeout;
use prometheus::Histogram;
use redis::aio::{ConnectionLike, ConnectionManager};
use smallvec::SmallVec;

use super::batch::{BatchQueue, RunBatch};
use super::script::{Decided, ScriptLayer, SlotOp};
use super::scripted::{connection_error, install_tls_provider, Scripted};
use super::sentinel::SentinelMaster;
use super::settings::{RedisSettings, Topology};
use super::shared_connection::Connect;
use crate::check::{Check, LeaseAsk, Slot, Spending};
use crate::clock::Clock;
use crate::error::LimiterError;
use crate::store::{Concurrency, Deciding, Store, Upkeep};
use crate::watch;
use floodgate_algorithm::Decision;

impl Connect for ConnectionManager {
    async fn connect(settings: &RedisSettings) -> Result<Self, LimiterError> {
        install_tls_provider();
        let url = match &settings.topology {
            Topology::Standalone(url) => url.as_str(),
            Topology::Cluster(nodes) => nodes.first().map_or("", String::as_str),
            Topology::Sentinel(_) => "",
        };
        let client = settings.client(url).map_err(connection_error)?;
        ConnectionManager::new_with_config(client, settings.manager_config())
            .await
            .map_err(connection_error)
    }
}

/// The one node: at a fixed address, or the master the sentinels name.
#[derive(Clone)]
pub(super) enum NodeConnection {
    Fixed(ConnectionManager),
    Sentinel(SentinelMaster),
}

impl Connect for NodeConnection {
    async fn connect(settings: &RedisSettings) -> Result<Self, LimiterError> {
        match &settings.topology {
            Topology::Sentinel(sentinel) => SentinelMaster::connect(settings, sentinel)
                .await
                .map(NodeConnection::Sentinel),
            _ => ConnectionManager::connect(settings)
                .await
                .map(NodeConnection::Fixed),
        }
    }
}

impl ConnectionLike for NodeConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            NodeConnection::Fixed(c) => c.req_packed_command(cmd),
            NodeConnection::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            NodeConnection::Fixed(c) => c.req_packed_commands(pipeline, offset, count),
            NodeConnection::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            NodeConnection::Fixed(c) => c.get_db(),
            NodeConnection::Sentinel(c) => c.get_db(),
        }
    }
}

/// The Redis store on one node (or the master the sentinels name):
/// concurrent decisions share script runs.
pub struct RedisStandalone {
    scripted: Arc<Scripted<NodeConnection>>,
    /// Started on first use, on the proxy's runtime.
    queue: OnceLock<BatchQueue<ScriptLayer, Decided>>,
}

impl RedisStandalone {
    /// A store on the node `settings` name, deciding at `clock`'s time
    /// when `settings.clock` is local. Connects before the proxy listens
    /// (`Store::warm`) or on first use, not here.
    pub fn new(settings: RedisSettings, clock: Arc<dyn Clock>) -> Self {
        RedisStandalone {
            scripted: Arc::new(Scripted::new(settings, clock)),
            queue: OnceLock::new(),
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

    /// Decides several requests in one script run, in the order given, as if
    /// each had been decided alone one after the other.
    pub async fn decide_together(
        &self,
        requests: &[&[Check]],
    ) -> Result<Vec<Vec<Decision>>, LimiterError> {
        let layers: Vec<Vec<ScriptLayer>> = requests
            .iter()
            .map(|checks| self.scripted.layers(*checks, Spending::Charge))
            .collect();
        let borrowed: Vec<&[ScriptLayer]> = layers.iter().map(Vec::as_slice).collect();
        let decided = self.scripted.run_batch(&borrowed, &|_| true).await?;
        decided
            .into_iter()
            .map(|d| d.map(|(decisions, _)| decisions))
            .collect::<Option<Vec<_>>>()
            .ok_or(LimiterError::WrongReplyLength {
                values: 0,
                layers: requests.len(),
            })
    }

    async fn queued(
        &self,
        operation: &'static str,
        layers: Vec<ScriptLayer>,
    ) -> Result<Decided, LimiterError> {
        let _timer = self.scripted.call_timer();
        let queue = self
            .queue
            .get_or_init(|| BatchQueue::start(self.scripted.clone()));
        // The request's own deadline covers the wait for a place in a run
        // as well as the run.
        let deadline = self.scripted.settings.timeout;
        let call = async {
            fast_timeout(deadline, queue.decide(layers))
                .await
                .map_err(|_| LimiterError::Timeout(deadline))?
        };
        watch::redis_call(operation, call).await
    }
}

#[async_trait]
impl Store for RedisStandalone {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        Ok(self
            .queued("decide", self.scripted.layers(checks, Spending::Charge))
            .await?
            .0)
    }

    async fn decide_leasing(
        &self,
        checks: &[Check],
        asks: &[Option<LeaseAsk>],
    ) -> Result<(Vec<Decision>, SmallVec<[u64; 4]>), LimiterError> {
        self.queued(
            "decide",
            self.scripted.layers_leasing(checks, asks, Spending::Charge),
        )
        .await
    }

    async fn peek(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        Ok(self
            .queued("peek", self.scripted.layers(checks, Spending::Peek))
            .await?
            .0)
    }

    async fn reset(&self, checks: &[Check]) -> Result<(), LimiterError> {
        self.scripted.delete(checks).await
    }

    async fn credit(&self, check: &Check) -> Result<Decision, LimiterError> {
        self.scripted.credit(check).await
    }

    /// In the next script run with the decisions: a busy instance's
    /// returns of leases and settled reservations cost no call of their own.
    async fn refund(&self, check: &Check, counted_at_us: u64) -> Result<(), LimiterError> {
        self.queued("refund", self.scripted.refund_layers(check, counted_at_us))
            .await
            .map(drop)
    }
}

#[async_trait]
impl Concurrency for RedisStandalone {
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
impl Upkeep for RedisStandalone {
    async fn probe(&self) -> Result<(), LimiterError> {
        self.scripted.probe().await
    }

    async fn warm(&self) -> Result<(), LimiterError> {
        self.scripted.warm().await
    }

    fn deciding(&self) -> Deciding {
        Deciding::Redis
    }
}
