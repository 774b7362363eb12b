//! A worker listens once the shared store can decide (its connection made,
//! its script loaded), so that the first requests are decided by Redis
//! rather than by `on_failure` while a connection is made under them, and
//! a start is not logged as a Redis failure. The wait has a bound: a store
//! that does not answer by then is left to the breaker, and the proxy
//! listens anyway.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;
use tokio::sync::OnceCell;

use crate::limiter::Store;

/// Every worker waits for the same warm-up; the first to start runs it (on
/// its own runtime, where the connection then lives).
#[derive(Clone)]
pub(super) struct WarmUp {
    store: Arc<dyn Store>,
    target: Option<String>,
    done: Arc<OnceCell<()>>,
}

impl WarmUp {
    /// `target` names the store in the log; none for one that needs no
    /// warming (the memory store).
    pub(super) fn new(store: Arc<dyn Store>, target: Option<String>) -> Self {
        WarmUp {
            store,
            target,
            done: Arc::new(OnceCell::new()),
        }
    }

    async fn wait(&self) {
        self.done
            .get_or_init(|| async {
                let started = Instant::now();
                let outcome = self.store.warm().await;
                let Some(target) = &self.target else {
                    return;
                };
                match outcome {
                    Ok(()) => log::info!(
                        "Redis {target} answered in {} ms: listening, decisions on Redis from the first request",
                        started.elapsed().as_millis()
                    ),
                    Err(e) => log::warn!(
                        "Redis {target} does not answer ({e}): listening anyway; requests are decided as `on_failure` says until it does"
                    ),
                }
            })
            .await;
    }
}

/// A service that starts (binds its listeners) after the warm-up.
pub(super) struct Warmed<S> {
    service: S,
    warm_up: WarmUp,
}

impl<S> Warmed<S> {
    pub(super) fn new(service: S, warm_up: WarmUp) -> Self {
        Warmed { service, warm_up }
    }
}

#[async_trait]
impl<S: Service> Service for Warmed<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        self.warm_up.wait().await;
        self.service
            .start_service(fds, shutdown, listeners_per_fd)
            .await
    }

    fn name(&self) -> &str {
        self.service.name()
    }

    fn threads(&self) -> Option<usize> {
        self.service.threads()
    }

    fn runtime_opts_override(
        &self,
        global: &pingora::server::RuntimeOpts,
    ) -> Option<pingora::server::RuntimeOpts> {
        self.service.runtime_opts_override(global)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.service.listen_addresses()
    }
}
