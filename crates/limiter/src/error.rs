//! Why a store could not answer.

#[cfg(feature = "redis")]
use std::sync::Arc;
use std::time::Duration;

/// Why a store could not answer. A request is then decided by the
/// configured `on_failure`, never left waiting. Not exhaustive: the Redis
/// variants come and go with the `redis` feature, which another crate in a
/// build may turn on.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// The store did not answer within its deadline (the deadline; zero
    /// when the client library's own timeout fired).
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Redis cannot be reached: refused, dropped or broken connection.
    #[cfg(feature = "redis")]
    #[error("cannot reach Redis: {0}")]
    Connection(#[source] Arc<::redis::RedisError>),
    /// Redis answered with an error reply (out of memory, read-only
    /// replica, a script error).
    #[cfg(feature = "redis")]
    #[error("Redis answered with an error: {0}")]
    Rejected(#[source] Arc<::redis::RedisError>),
    /// A Redis Cluster has slots unserved or masters not answering (what
    /// `CLUSTER INFO` says is wrong).
    #[cfg(feature = "redis")]
    #[error("the Redis Cluster is not whole: {0}")]
    ClusterNotWhole(Box<str>),
    /// A reply is not what the script or command returns (the reply, as
    /// read).
    #[error("the script's reply does not parse: {0:?}")]
    UnparsableReply(Box<str>),
    /// The script answered a different number of values than the layers
    /// asked.
    #[error("the script answered {values} values for {layers} layers")]
    WrongReplyLength {
        /// Values the reply held.
        values: usize,
        /// Layers the request asked about.
        layers: usize,
    },
    /// The task that batches requests into script runs has stopped (the
    /// store is shutting down).
    #[error("the Redis batch task has stopped")]
    Stopped,
}
