//! The `Limiter` interface: decide all layers of one request at once.

mod batch;
mod deny_cache;
pub mod fallback;
pub mod local;
pub mod redis;

use std::time::Duration;

use async_trait::async_trait;

use crate::algorithm::Decision;
use crate::policy::Check;

pub use self::redis::RedisLimiter;
pub use fallback::FallbackLimiter;
pub use local::LocalLimiter;

/// Why a limiter could not decide. The request is then decided by the
/// configured `on_failure`, never left waiting.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimiterError {
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store answered with an error: {0}")]
    Store(String),
}

/// Decides the layers of one request.
///
/// Contract: returns one decision per check, in order, and applies them
/// all-or-nothing: if any enforcing (non-shadow) check refuses, no layer is
/// charged. Shadow checks never refuse the request; one that would have
/// refused is not charged, one that admits is charged with the rest.
#[async_trait]
pub trait Limiter: Send + Sync {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError>;

    /// Keys whose state this process holds (0 for a remote store).
    fn keys_held(&self) -> usize {
        0
    }
}

/// True when no enforcing layer refused.
pub fn admitted(checks: &[Check], decisions: &[Decision]) -> bool {
    checks
        .iter()
        .zip(decisions)
        .all(|(c, d)| c.shadow || d.allowed)
}
