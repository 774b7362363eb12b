//! The connection a store's calls share: made before the proxy listens
//! (`Store::warm`) or by the first call that finds none, on the runtime of
//! the proxy worker that asked, and made again once a call on it has missed
//! its deadline, where the client can wedge (`Connect::REPLACE_WHEN_STALLED`).
//!
//! The connect runs as a task of its own, not inside the call that wanted
//! it: a call gives up at its decision deadline, and a connect cut short
//! with it would be started over by the next call and cut short again, so a
//! Redis farther than the deadline (a TLS handshake and AUTH across a
//! network) would never be connected to. The calls wait for the one connect
//! in progress as long as their deadline lets them; the connect has its own
//! (`CONNECT_WITHIN`).
//!
//! redis-rs 1.8's cluster client can stop answering for good: a slot map
//! refresh, started when a burst of calls on a moved slot comes back MOVED,
//! waits for the client's own connection map, whose lock calls it stopped
//! polling still hold. Nothing on that connection is answered again, the
//! breaker's probes included, so the proxy decided beside Redis until it
//! restarted. A new client starts from a new slot map; the cost of the
//! wedge is the calls in flight when it happened.

use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::ConnectionLike;

use super::settings::RedisSettings;
use crate::error::LimiterError;

/// The longest a connect may take, the search for a Sentinel master
/// included, before it counts as failed and the next call starts another.
/// Under the 5 s a Pingora process that hands its listeners to a new one
/// keeps accepting: a new one that warms up (`Store::warm`) still listens
/// within it.
pub(super) const CONNECT_WITHIN: Duration = Duration::from_secs(4);

/// A connect in progress, or its outcome until a call takes it.
type Connecting<C> = Shared<BoxFuture<'static, Result<(u64, C), LimiterError>>>;

struct Connects<C> {
    /// The generation the last connect started was given.
    generation: u64,
    in_progress: Option<Connecting<C>>,
}

pub(super) struct SharedConnection<C> {
    /// The connection and its generation: a call that missed its deadline
    /// discards only the connection it ran on, not a newer one.
    current: RwLock<Option<(u64, C)>>,
    connects: Mutex<Connects<C>>,
}

impl<C: Connect> SharedConnection<C> {
    pub(super) fn new() -> Self {
        SharedConnection {
            current: RwLock::new(None),
            connects: Mutex::new(Connects {
                generation: 0,
                in_progress: None,
            }),
        }
    }

    /// The connection and its generation; when there is none, the connect
    /// in progress (started now if none is, or if the last one failed).
    pub(super) async fn get(&self, settings: &RedisSettings) -> Result<(u64, C), LimiterError> {
        if let Some(current) = self.read() {
            return Ok(current);
        }
        let connecting = {
            let mut connects = self.connects();
            if let Some(current) = self.read() {
                return Ok(current);
            }
            // A finished connect is seen here though no call polled it to
            // its end (every caller had given up): a failed one is not
            // handed to another caller, a made one is taken at once.
            let failed = connects
                .in_progress
                .as_ref()
                .is_some_and(|c| matches!(c.clone().now_or_never(), Some(Err(_))));
            match &connects.in_progress {
                Some(connecting) if !failed => connecting.clone(),
                _ => {
                    connects.generation += 1;
                    let connecting = start_connect::<C>(settings, connects.generation);
                    connects.in_progress = Some(connecting.clone());
                    connecting
                }
            }
        };
        let outcome = connecting.clone().await;
        if let Ok(made) = &outcome {
            // The first call back keeps the connection for the others.
            let mut connects = self.connects();
            if connects
                .in_progress
                .as_ref()
                .is_some_and(|c| c.ptr_eq(&connecting))
            {
                connects.in_progress = None;
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(made.clone());
            }
        }
        outcome
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

    /// The lock guards plain values, whole after a panic too.
    fn connects(&self) -> MutexGuard<'_, Connects<C>> {
        self.connects.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connect on the current runtime (the proxy's: the connection's own
/// tasks run where its calls are made), which no caller's deadline cancels.
fn start_connect<C: Connect>(settings: &RedisSettings, generation: u64) -> Connecting<C> {
    let settings = settings.clone();
    let task = tokio::spawn(async move {
        match tokio::time::timeout(CONNECT_WITHIN, C::connect(&settings)).await {
            Ok(connected) => connected.map(|connection| (generation, connection)),
            Err(_) => Err(LimiterError::Timeout(CONNECT_WITHIN)),
        }
    });
    task.map(|joined| joined.unwrap_or(Err(LimiterError::Stopped)))
        .boxed()
        .shared()
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
