//! The connection a store's calls share: made on first use (so that it
//! lives on the proxy's own runtime), and made again once a call on it has
//! missed its deadline, where the client can wedge (`Connect::REPLACE_WHEN_STALLED`).
//!
//! redis-rs 1.8's cluster client can stop answering for good: a slot map
//! refresh, started when a burst of calls on a moved slot comes back MOVED,
//! waits for the client's own connection map, whose lock calls it stopped
//! polling still hold. Nothing on that connection is answered again, the
//! breaker's probes included, so the proxy decided beside Redis until it
//! restarted. A new client starts from a new slot map; the cost of the
//! wedge is the calls in flight when it happened.

use std::sync::RwLock;

use tokio::sync::Mutex;

use redis::aio::ConnectionLike;

use super::settings::RedisSettings;
use crate::error::LimiterError;

pub(super) struct SharedConnection<C> {
    /// The connection and its generation: a call that missed its deadline
    /// discards only the connection it ran on, not a newer one.
    current: RwLock<Option<(u64, C)>>,
    /// One connect at a time: the calls that find no connection wait for
    /// the one being made.
    connecting: Mutex<u64>,
}

impl<C: Connect> SharedConnection<C> {
    pub(super) fn new() -> Self {
        SharedConnection {
            current: RwLock::new(None),
            connecting: Mutex::new(0),
        }
    }

    /// The connection and its generation, made now if there is none.
    pub(super) async fn get(&self, settings: &RedisSettings) -> Result<(u64, C), LimiterError> {
        if let Some(current) = self.read() {
            return Ok(current);
        }
        let mut generation = self.connecting.lock().await;
        if let Some(current) = self.read() {
            return Ok(current);
        }
        let connection = C::connect(settings).await?;
        *generation += 1;
        let made = (*generation, connection);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(made.clone());
        Ok(made)
    }

    /// Forgets the connection of `generation` (not a newer one): the next
    /// call makes a new connection.
    pub(super) fn discard(&self, generation: u64) {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    /// Forgets the connection, whichever it is: the next call makes a new
    /// one (for a client whose view of the servers is known to be stale).
    pub(super) fn forget(&self) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn read(&self) -> Option<(u64, C)> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// How a store's connection is made.
pub(super) trait Connect: ConnectionLike + Clone + Send + Sync + Sized + 'static {
    /// Whether a connection on which a call missed its deadline is
    /// replaced (`SharedConnection`): for a client that can wedge.
    const REPLACE_WHEN_STALLED: bool = false;

    /// Calls in flight on the connection at once, beyond which calls wait
    /// their turn (within their deadline): for a client that wedges under
    /// many.
    const MOST_CALLS_IN_FLIGHT: Option<usize> = None;

    fn connect(
        settings: &RedisSettings,
    ) -> impl std::future::Future<Output = Result<Self, LimiterError>> + Send;
}
