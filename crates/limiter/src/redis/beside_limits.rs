//! Redis for what is kept there beside the limit state (the admin API's
//! run-time clients): one connection whatever the topology, the node to
//! subscribe on, and whether keys must share a slot.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::cluster::cluster_client;
use super::scripted::install_tls_provider;
use super::sentinel::{find_master, master_client};
use super::settings::{RedisSettings, Topology};

/// A connection to the node that takes writes, or to a whole cluster
/// (calls routed by their first key).
pub enum TopologyConnection {
    /// To the one node (standalone) or the master the sentinels name.
    Node(MultiplexedConnection),
    /// To a cluster, each call routed to the node serving its key's slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for TopologyConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            TopologyConnection::Node(c) => c.req_packed_command(cmd),
            TopologyConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            TopologyConnection::Node(c) => c.req_packed_commands(pipeline, offset, count),
            TopologyConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            TopologyConnection::Node(c) => c.get_db(),
            TopologyConnection::Cluster(c) => c.get_db(),
        }
    }
}

/// A connection for reads and writes: the standalone node, the master the
/// sentinels name now, or the cluster.
pub async fn topology_connection(
    settings: &RedisSettings,
) -> redis::RedisResult<TopologyConnection> {
    install_tls_provider();
    match &settings.topology {
        Topology::Cluster(_) => Ok(TopologyConnection::Cluster(
            cluster_client(settings)?.get_async_connection().await?,
        )),
        Topology::Standalone(url) => Ok(TopologyConnection::Node(
            subscriber(settings, url)
                .await?
                .get_multiplexed_async_connection()
                .await?,
        )),
        Topology::Sentinel(_) => Ok(TopologyConnection::Node(
            subscriber(settings, "")
                .await?
                .get_multiplexed_async_connection()
                .await?,
        )),
    }
}

/// The node to subscribe on at the `attempt`th try: the standalone node,
/// the master the sentinels name now, or the cluster's seeds in turn (a
/// cluster's classic pub/sub reaches every node, so any one is enough).
pub async fn subscription_node(
    settings: &RedisSettings,
    attempt: usize,
) -> redis::RedisResult<redis::Client> {
    install_tls_provider();
    match &settings.topology {
        Topology::Standalone(url) => subscriber(settings, url).await,
        Topology::Sentinel(_) => subscriber(settings, "").await,
        Topology::Cluster(nodes) => match nodes.get(attempt % nodes.len().max(1)) {
            Some(url) => subscriber(settings, url).await,
            None => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a cluster of no nodes",
            ))),
        },
    }
}

/// `name` under `prefix`, with the hash tag a cluster needs for keys one
/// script touches together (`{prefix:group}:name`); elsewhere as ever
/// (`prefix:group:name`), so data kept before stays where it was.
pub fn grouped_key(settings: &RedisSettings, group: &str, name: &str) -> String {
    let prefix = &settings.key_prefix;
    match settings.topology {
        Topology::Cluster(_) => format!("{{{prefix}:{group}}}:{name}"),
        _ => format!("{prefix}:{group}:{name}"),
    }
}

/// The node to subscribe on: the one at `url`, or the master the
/// sentinels name now (a failover ends the old subscription).
async fn subscriber(settings: &RedisSettings, url: &str) -> redis::RedisResult<redis::Client> {
    match &settings.topology {
        Topology::Sentinel(sentinel) => {
            let (host, port) = find_master(settings, sentinel).await?;
            master_client(settings, sentinel, &host, port)
        }
        _ => settings.client(url),
    }
}
