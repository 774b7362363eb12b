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
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[cfg(feature = "redis")]
    #[error("cannot reach Redis: {0}")]
    Connection(#[source] Arc<::redis::RedisError>),
    #[cfg(feature = "redis")]
    #[error("Redis answered with an error: {0}")]
    Rejected(#[source] Arc<::redis::RedisError>),
    #[cfg(feature = "redis")]
    #[error("the Redis Cluster is not whole: {0}")]
    ClusterNotWhole(Box<str>),
    #[error("the script's reply does not parse: {0:?}")]
    UnparsableReply(Box<str>),
    #[error("the script answered {values} values for {layers} layers")]
    WrongReplyLength { values: usize, layers: usize },
    #[error("the Redis batch task has stopped")]
    Stopped,
}
