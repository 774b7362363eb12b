//! What deciding one request went through, for whoever traces it: which
//! parts of the limiter answered and the Redis calls it waited on.
//!
//! Nothing is kept unless the decision runs inside [`watched`]: a store that
//! notes what it did outside it pays one task-local lookup, and a Redis call
//! outside it reads no clock.

use std::cell::RefCell;
use std::future::Future;
#[cfg(feature = "redis")]
use std::time::Instant;
use std::time::{Duration, SystemTime};

use smallvec::SmallVec;

tokio::task_local! {
    static WATCHED: RefCell<Watched>;
}

/// A part of the limiter that answers for layers of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answerer {
    /// The in-process store.
    Memory,
    /// A script run on Redis.
    Redis,
    /// A budget leased from Redis, spent in process.
    Lease,
    /// Redis is away: `on_failure` answered.
    Fallback,
    /// A refusal remembered from an earlier answer, until its retry time.
    RefusalCache,
}

impl Answerer {
    const ALL: [Answerer; 5] = [
        Answerer::Memory,
        Answerer::Redis,
        Answerer::Lease,
        Answerer::Fallback,
        Answerer::RefusalCache,
    ];

    /// Its name in a trace's `floodgate.decided_by` attribute: `"memory"`,
    /// `"redis"`, `"lease"`, `"fallback"`, `"refusal_cache"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Answerer::Memory => "memory",
            Answerer::Redis => "redis",
            Answerer::Lease => "lease",
            Answerer::Fallback => "fallback",
            Answerer::RefusalCache => "refusal_cache",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// One call on Redis that the request waited for, from its queueing to its
/// answer (a call batched with others' is the request's wait all the same).
#[derive(Debug, Clone)]
pub struct RedisCall {
    /// The Redis command: `EVALSHA` for the scripts.
    pub command: &'static str,
    /// What the script did: `decide`, `peek`, `slot acquire`...
    pub operation: &'static str,
    /// When the call was queued.
    pub started: SystemTime,
    /// From its queueing to its answer (or its failure).
    pub took: Duration,
    /// The error's text when it failed (a timeout, a refused connection).
    pub failed: Option<String>,
}

/// What one watched decision went through.
#[derive(Debug, Default)]
pub struct Watched {
    answerers: u8,
    /// The Redis calls the decision waited on, in the order they ended.
    pub redis_calls: SmallVec<[RedisCall; 2]>,
}

impl Watched {
    /// Every part that answered, in a fixed order.
    pub fn answerers(&self) -> impl Iterator<Item = Answerer> + '_ {
        Answerer::ALL
            .into_iter()
            .filter(|a| self.answerers & a.bit() != 0)
    }
}

/// Runs `decision`, keeping what it went through.
pub async fn watched<F: Future>(decision: F) -> (F::Output, Watched) {
    WATCHED
        .scope(RefCell::new(Watched::default()), async {
            let output = decision.await;
            let watched = WATCHED.with(|w| std::mem::take(&mut *w.borrow_mut()));
            (output, watched)
        })
        .await
}

/// `answerer` answered for some of the request's layers.
pub(crate) fn answered_by(answerer: Answerer) {
    let _ = WATCHED.try_with(|w| w.borrow_mut().answerers |= answerer.bit());
}

/// Whether the current task's decision is watched.
#[cfg(feature = "redis")]
fn is_watched() -> bool {
    WATCHED.try_with(|_| ()).is_ok()
}

/// A Redis call under way, for a watched decision.
#[cfg(feature = "redis")]
pub(crate) struct CallWatch {
    operation: &'static str,
    started: SystemTime,
    at: Instant,
}

#[cfg(feature = "redis")]
impl CallWatch {
    /// Starts timing a script call when the decision is watched.
    pub(crate) fn start(operation: &'static str) -> Option<CallWatch> {
        is_watched().then(|| CallWatch {
            operation,
            started: SystemTime::now(),
            at: Instant::now(),
        })
    }

    pub(crate) fn done<T, E: std::fmt::Display>(self, result: &Result<T, E>) {
        let call = RedisCall {
            command: "EVALSHA",
            operation: self.operation,
            started: self.started,
            took: self.at.elapsed(),
            failed: result.as_ref().err().map(ToString::to_string),
        };
        let _ = WATCHED.try_with(|w| w.borrow_mut().redis_calls.push(call));
    }
}

/// Times `call` as a Redis call of a watched decision.
#[cfg(feature = "redis")]
pub(crate) async fn redis_call<T, E: std::fmt::Display>(
    operation: &'static str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let watch = CallWatch::start(operation);
    let result = call.await;
    if let Some(watch) = watch {
        watch.done(&result);
    }
    // A call that failed answered nothing: the fallback, if any, says so.
    if result.is_ok() {
        answered_by(Answerer::Redis);
    }
    result
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_decision_outside_a_watch_keeps_nothing_and_inside_keeps_each_part() {
        // Outside: nothing to keep, nothing kept, no panic.
        answered_by(Answerer::Memory);
        let outside: Result<(), String> = redis_call("decide", async { Ok(()) }).await;
        assert!(outside.is_ok());

        let ((), watched) = watched(async {
            answered_by(Answerer::Lease);
            let _: Result<(), String> =
                redis_call("decide", async { Err("timed out".into()) }).await;
        })
        .await;
        let answerers: Vec<_> = watched.answerers().collect();
        assert_eq!(
            answerers,
            [Answerer::Lease],
            "a failed call answered nothing"
        );
        assert_eq!(watched.redis_calls.len(), 1);
        assert_eq!(watched.redis_calls[0].operation, "decide");
        assert_eq!(watched.redis_calls[0].failed.as_deref(), Some("timed out"));

        let ((), answered) = super::watched(async {
            let _: Result<(), String> = redis_call("peek", async { Ok(()) }).await;
        })
        .await;
        assert_eq!(answered.answerers().collect::<Vec<_>>(), [Answerer::Redis]);

        // Another watch starts empty.
        let ((), again) = super::watched(async {}).await;
        assert_eq!(again.answerers().count(), 0);
        assert!(again.redis_calls.is_empty());
    }
}
