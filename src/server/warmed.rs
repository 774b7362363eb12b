//! A proxy worker listens once the shared store can decide (its connection
//! made, its scripts loaded), so that the first requests are decided by
//! Redis rather than by `on_failure` while a connection is made under them,
//! and a start is not logged as a Redis failure. The wait has a bound (the
//! store's own, `Store::warm`): a store that is not ready by then is left
//! to the breaker, and the proxy listens anyway. `/readyz` says "starting"
//! until then.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::Service;
use tokio::sync::OnceCell;

use crate::server::state::AppState;

/// How long the start waits for the run-time clients to load from Redis.
const CLIENTS_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Every worker waits for the same warm-up; the first to start runs it (on
/// its own runtime, where the connection's tasks then run).
#[derive(Clone)]
pub(super) struct WarmUp {
    state: Arc<AppState>,
    done: Arc<OnceCell<()>>,
}

impl WarmUp {
    pub(super) fn new(state: Arc<AppState>) -> Self {
        WarmUp {
            state,
            done: Arc::new(OnceCell::new()),
        }
    }

    async fn wait(&self) {
        self.done
            .get_or_init(|| async {
                let started = Instant::now();
                let outcome = self.state.store.warm().await;
                // None for a store that needs no warming (memory).
                if let Some(target) = self.state.store_target() {
                    match outcome {
                        Ok(()) => log::info!(
                            "Redis {target} ready in {} ms: listening, decisions on Redis from the first request",
                            started.elapsed().as_millis()
                        ),
                        Err(e) => log::warn!(
                            "Redis {target} not ready ({e}): listening anyway; requests are decided as `on_failure` says until it is"
                        ),
                    }
                }
                // The run-time API keys too: a request must not meet a
                // revoked key as the file has it, nor miss a new one.
                if let Some(clients) = &self.state.clients {
                    let started = Instant::now();
                    match clients.warm(CLIENTS_WITHIN).await {
                        Ok(()) => {}
                        Err(e) => log::warn!(
                            "run-time clients not loaded ({e}): listening anyway with none; they apply once Redis answers ({} ms)",
                            started.elapsed().as_millis()
                        ),
                    }
                }
                self.state.warmed();
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
