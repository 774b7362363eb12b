//! Wires a validated `Config` into a Pingora server.

use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::server::ShutdownWatch;
use pingora::services::background::{background_service, BackgroundService};

use crate::clock::{Clock, OffsetClock, SystemClock};
use crate::config::Config;
use crate::limiter::{FailureStats, FallbackLimiter, Limiter, LocalLimiter, RedisLimiter};
use crate::proxy::{Gateway, Runtime};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{file}: upstream.servers: {source}")]
    Upstream {
        file: String,
        source: std::io::Error,
    },
    #[error("FLOODGATE_CLOCK_OFFSET_MS must be a whole number of milliseconds, got {0:?}")]
    ClockOffset(String),
}

/// Drops idle keys of the memory store now and then, so that memory follows
/// the number of active clients rather than every client ever seen.
struct Sweeper {
    store: Arc<LocalLimiter>,
}

#[async_trait::async_trait]
impl BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
        loop {
            tokio::select! {
                _ = tick.tick() => { self.store.sweep(); }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// The proxy's clock. `FLOODGATE_CLOCK_OFFSET_MS` shifts it, which lets tests
/// (and operators rehearsing) run instances whose clocks disagree.
fn clock_from_env() -> Result<Arc<dyn Clock>, BuildError> {
    match std::env::var("FLOODGATE_CLOCK_OFFSET_MS") {
        Err(_) => Ok(Arc::new(SystemClock)),
        Ok(text) => {
            let ms: i64 = text
                .trim()
                .parse()
                .map_err(|_| BuildError::ClockOffset(text.clone()))?;
            Ok(Arc::new(OffsetClock::new(
                SystemClock,
                ms.saturating_mul(1000),
            )))
        }
    }
}

/// Builds the server for `config`; `run_forever` it to serve.
pub fn build(config: &Config) -> Result<Server, BuildError> {
    let file = config.file.display().to_string();
    let clock = clock_from_env()?;
    let store = Arc::new(LocalLimiter::new(config.max_keys, clock.clone()));
    let limiter: Arc<dyn Limiter> = match &config.redis {
        Some(settings) => Arc::new(FallbackLimiter::new(
            RedisLimiter::new(settings.clone(), clock),
            store.clone(),
            settings.instances,
            Arc::new(FailureStats::default()),
        )),
        None => store.clone(),
    };
    let runtime = Runtime::new(config, limiter).map_err(|source| BuildError::Upstream {
        file: file.clone(),
        source,
    })?;

    let grace = config.server.grace_period.as_secs().max(1);
    let conf = ServerConf {
        threads: config.server.threads,
        grace_period_seconds: Some(grace),
        graceful_shutdown_timeout_seconds: Some(grace),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();

    let gateway = Gateway::new(Arc::new(ArcSwap::from_pointee(runtime)));
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, gateway);
    for addr in &config.server.listen {
        proxy.add_tcp(&addr.to_string());
    }
    server.add_service(proxy);
    server.add_service(background_service("memory sweeper", Sweeper { store }));
    Ok(server)
}
