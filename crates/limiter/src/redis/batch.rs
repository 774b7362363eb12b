//! Group commit: one script run in flight at a time, and every decision
//! requested meanwhile goes into the next run.
//!
//! A script call has a fixed price on both sides (Redis looks the script
//! up, sets up Lua and the reply, reads TIME; the client encodes, sends and
//! parses one command), and under load that price, paid per request, was
//! over a third of Redis's time (16 µs of CPU per request, 10 when shared).
//! Batching needs no tuning: an idle proxy sends each request alone at
//! once, a busy one sends as many per run as arrived during the last.
//! Within a run the requests are decided one after the other, each
//! all-or-nothing, exactly as separate calls in that order would be.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use crate::error::LimiterError;

/// Requests per script run at most: Redis runs nothing else while a script
/// runs, so a run is kept to well under a millisecond.
pub(super) const MAX_PER_RUN: usize = 64;

/// Whether request `i` of a batch is still waited for.
pub(super) type Wanted<'a> = &'a (dyn Fn(usize) -> bool + Sync);

/// Decides a batch of requests in one go, each request's layers together.
#[async_trait]
pub(super) trait RunBatch: Send + Sync + 'static {
    type Layer: Send + Sync + 'static;
    /// What one request gets back.
    type Decided: Send + 'static;

    /// One answer per request; none for a request `wanted` said was no
    /// longer waited for when the run was about to go out (after any wait
    /// for a connection or a turn), which is not charged.
    async fn run_batch(
        &self,
        requests: &[&[Self::Layer]],
        wanted: Wanted<'_>,
    ) -> Result<Vec<Option<Self::Decided>>, LimiterError>;
}

struct Waiting<L, D> {
    layers: Vec<L>,
    reply: oneshot::Sender<Result<D, LimiterError>>,
}

pub(super) struct BatchQueue<L, D> {
    sender: mpsc::UnboundedSender<Waiting<L, D>>,
}

impl<L: Send + Sync + 'static, D: Send + 'static> BatchQueue<L, D> {
    /// Starts the task that runs the batches, on the current runtime. It
    /// ends when the queue is dropped.
    pub(super) fn start<R: RunBatch<Layer = L, Decided = D>>(runner: Arc<R>) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run_batches(runner, receiver));
        BatchQueue { sender }
    }

    pub(super) async fn decide(&self, layers: Vec<L>) -> Result<D, LimiterError> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Waiting { layers, reply })
            .map_err(|_| LimiterError::Stopped)?;
        answer.await.map_err(|_| LimiterError::Stopped)?
    }
}

async fn run_batches<R: RunBatch>(
    runner: Arc<R>,
    mut queue: mpsc::UnboundedReceiver<Waiting<R::Layer, R::Decided>>,
) {
    let mut batch = Vec::with_capacity(MAX_PER_RUN);
    while queue.recv_many(&mut batch, MAX_PER_RUN).await > 0 {
        // A request that gave up (its deadline passed) is not charged:
        // those gone by now are left out, and the runner asks again once
        // it is ready to send (`wanted`).
        batch.retain(|waiting: &Waiting<R::Layer, R::Decided>| !waiting.reply.is_closed());
        if !batch.is_empty() {
            let requests: Vec<&[R::Layer]> = batch
                .iter()
                .map(|waiting| waiting.layers.as_slice())
                .collect();
            let wanted = |i: usize| batch.get(i).is_some_and(|w| !w.reply.is_closed());
            match runner.run_batch(&requests, &wanted).await {
                Ok(decisions) => {
                    for (waiting, decisions) in batch.drain(..).zip(decisions) {
                        if let Some(decisions) = decisions {
                            let _ = waiting.reply.send(Ok(decisions));
                        }
                    }
                }
                Err(error) => {
                    for waiting in batch.drain(..) {
                        let _ = waiting.reply.send(Err(error.clone()));
                    }
                }
            }
        }
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::Semaphore;

    use super::*;
    use floodgate_algorithm::Decision;

    /// Answers each request with one decision per layer whose `remaining`
    /// is the layer's value, records the size of each run, and runs only
    /// when given a permit, so a test decides what arrives during a run.
    struct Recorder {
        /// Runs started (each waits for a permit).
        entered: std::sync::atomic::AtomicUsize,
        runs: Mutex<Vec<Vec<u64>>>,
        permits: Semaphore,
        fail: bool,
    }

    #[async_trait]
    impl RunBatch for Recorder {
        type Layer = u64;
        type Decided = Vec<Decision>;

        /// Asks `wanted` once its permit is given, as a store does once
        /// its connection and turn are.
        async fn run_batch(
            &self,
            requests: &[&[u64]],
            wanted: Wanted<'_>,
        ) -> Result<Vec<Option<Vec<Decision>>>, LimiterError> {
            self.entered
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| LimiterError::Stopped)?;
            permit.forget();
            let firsts = (0..requests.len())
                .filter(|&i| wanted(i))
                .map(|i| requests[i][0])
                .collect();
            self.runs.lock().expect("runs").push(firsts);
            if self.fail {
                return Err(LimiterError::Timeout(std::time::Duration::ZERO));
            }
            Ok(requests
                .iter()
                .enumerate()
                .map(|(i, layers)| {
                    wanted(i).then(|| {
                        layers
                            .iter()
                            .map(|&v| Decision::admitted(100, v, 0))
                            .collect()
                    })
                })
                .collect())
        }
    }

    fn recorder(fail: bool) -> Arc<Recorder> {
        Arc::new(Recorder {
            entered: std::sync::atomic::AtomicUsize::new(0),
            runs: Mutex::new(Vec::new()),
            permits: Semaphore::new(0),
            fail,
        })
    }

    async fn until_entered(recorder: &Recorder, runs: usize) {
        while recorder.entered.load(std::sync::atomic::Ordering::SeqCst) < runs {
            tokio::task::yield_now().await;
        }
    }

    async fn until_runs(recorder: &Recorder, runs: usize) {
        while recorder.runs.lock().expect("runs").len() < runs {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_arriving_during_a_run_share_the_next_one_in_order() {
        let runner = recorder(false);
        let queue = Arc::new(BatchQueue::start(runner.clone()));
        let first = tokio::spawn({
            let queue = queue.clone();
            async move { queue.decide(vec![1]).await }
        });
        // The first request is taken alone; three arrive while it runs.
        until_entered(&runner, 1).await;
        let later: Vec<_> = (2..=4)
            .map(|v| {
                let queue = queue.clone();
                tokio::spawn(async move { queue.decide(vec![v, v * 10]).await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        runner.permits.add_permits(2);
        let first = first.await.expect("task").expect("decided");
        assert_eq!(first[0].remaining(), 1);
        for (v, task) in (2..=4).zip(later) {
            let decided = task.await.expect("task").expect("decided");
            let remaining: Vec<u64> = decided.iter().map(Decision::remaining).collect();
            assert_eq!(
                remaining,
                vec![v, v * 10],
                "each request gets its own decisions"
            );
        }
        until_runs(&runner, 2).await;
        assert_eq!(
            *runner.runs.lock().expect("runs"),
            vec![vec![1], vec![2, 3, 4]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_run_fails_every_request_in_it() {
        let runner = recorder(true);
        let queue = Arc::new(BatchQueue::start(runner.clone()));
        runner.permits.add_permits(1);
        let both = futures_util::future::join(queue.decide(vec![1]), queue.decide(vec![2])).await;
        assert!(matches!(both.0, Err(LimiterError::Timeout(_))));
        assert!(matches!(both.1, Err(LimiterError::Timeout(_))));
        assert_eq!(runner.runs.lock().expect("runs").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_gave_up_before_its_run_is_not_run() {
        let runner = recorder(false);
        let queue = Arc::new(BatchQueue::start(runner.clone()));
        let first = tokio::spawn({
            let queue = queue.clone();
            async move { queue.decide(vec![1]).await }
        });
        until_entered(&runner, 1).await;
        // Gives up at once: its deadline passed while the first ran.
        let gave_up =
            tokio::time::timeout(std::time::Duration::from_millis(1), queue.decide(vec![2])).await;
        assert!(gave_up.is_err());
        let kept = tokio::spawn({
            let queue = queue.clone();
            async move { queue.decide(vec![3]).await }
        });
        tokio::task::yield_now().await;
        runner.permits.add_permits(2);
        first.await.expect("task").expect("decided");
        kept.await.expect("task").expect("decided");
        assert_eq!(*runner.runs.lock().expect("runs"), vec![vec![1], vec![3]]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_gave_up_while_its_run_waited_is_not_run() {
        let runner = recorder(false);
        let queue = Arc::new(BatchQueue::start(runner.clone()));
        let gives_up = tokio::spawn({
            let queue = queue.clone();
            async move {
                tokio::time::timeout(std::time::Duration::from_millis(1), queue.decide(vec![1]))
                    .await
            }
        });
        // Its run has begun (waiting for a connection, say) when it gives up.
        until_entered(&runner, 1).await;
        assert!(gives_up.await.expect("task").is_err(), "gave up");
        runner.permits.add_permits(2);
        let kept = queue.decide(vec![2]).await.expect("decided");
        assert_eq!(kept[0].remaining(), 2);
        assert_eq!(
            *runner.runs.lock().expect("runs"),
            vec![vec![], vec![2]],
            "the first run went out without the request whose caller had gone"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_takes_at_most_max_per_run_requests() {
        let runner = recorder(false);
        let queue = Arc::new(BatchQueue::start(runner.clone()));
        runner.permits.add_permits(3);
        let all = futures_util::future::join_all(
            (0..(MAX_PER_RUN as u64 + 1)).map(|v| queue.decide(vec![v])),
        )
        .await;
        assert!(all.iter().all(Result::is_ok));
        let runs = runner.runs.lock().expect("runs");
        assert!(runs.iter().all(|r| r.len() <= MAX_PER_RUN), "{runs:?}");
        assert_eq!(runs.iter().map(Vec::len).sum::<usize>(), MAX_PER_RUN + 1);
    }
}
