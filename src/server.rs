//! Wires a validated `Config` into a Pingora server.

use std::sync::Arc;
use std::time::Duration;

use pingora::apps::http_app::HttpServer;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;

use crate::admin::Admin;
use crate::clock::{Clock, OffsetClock, SystemClock};
use crate::config::{Config, IdentityKeySource};
use crate::limiter::{FallbackLimiter, Limiter, LocalLimiter, RedisLimiter};
use crate::metrics::Metrics;
use crate::proxy::Gateway;
use crate::signals::Signals;
use crate::state::{AppState, Runtime};

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
        let mut tick = tokio::time::interval(Duration::from_secs(10));
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

/// A server ready to run.
pub struct Floodgate {
    server: Server,
    signals: Signals,
    pub state: Arc<AppState>,
}

impl Floodgate {
    /// Serves until a signal stops it, then exits the process.
    pub fn run(self) -> ! {
        self.server.run(RunArgs {
            shutdown_signal: Box::new(self.signals),
        });
        std::process::exit(0)
    }
}

/// Builds the server for `config`.
pub fn build(config: &Config) -> Result<Floodgate, BuildError> {
    let file = config.file.display().to_string();
    if config.redis.is_some() && config.identity_key == IdentityKeySource::Public {
        log::warn!(
            "no identity secret (FLOODGATE_IDENTITY_SECRET or [clients].identity_secret_file): identities are hashed with a public key, so clients can compute their Redis keys; give every instance the same secret"
        );
    }
    let clock = clock_from_env()?;
    let metrics = Arc::new(Metrics::new());
    let store = Arc::new(
        LocalLimiter::new(config.max_keys, clock.clone())
            .with_overflow_metric(metrics.local_overflow.clone()),
    );
    let fallback = config.redis.as_ref().map(|settings| {
        Arc::new(FallbackLimiter::new(
            RedisLimiter::new(settings.clone(), clock.clone()),
            store.clone(),
            settings.instances,
            metrics.redis.clone(),
            clock.clone(),
        ))
    });
    let limiter: Arc<dyn Limiter> = match &fallback {
        Some(f) => f.clone(),
        None => store.clone(),
    };
    let runtime = Runtime::new(config, &metrics).map_err(|source| BuildError::Upstream {
        file: file.clone(),
        source,
    })?;
    let state = Arc::new(AppState::new(
        config.clone(),
        runtime,
        limiter,
        store.clone(),
        fallback,
        metrics,
    ));

    // Draining is ours (see `signals`): Pingora stops the listeners once
    // nothing is in flight, with no further wait.
    let conf = ServerConf {
        threads: config.server.threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ca_file: config
            .upstream
            .ca_file
            .as_ref()
            .map(|f| f.display().to_string()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();

    let mut proxy =
        pingora::proxy::http_proxy_service(&server.configuration, Gateway::new(state.clone()));
    for addr in &config.server.listen {
        proxy.add_tcp(&addr.to_string());
    }
    server.add_service(proxy);
    if let Some(admin_addr) = config.server.admin_listen {
        let mut admin = Service::new(
            "admin".into(),
            HttpServer::new_app(Admin::new(state.clone())),
        );
        admin.add_tcp(&admin_addr.to_string());
        server.add_service(admin);
    }
    server.add_service(background_service("memory sweeper", Sweeper { store }));
    Ok(Floodgate {
        server,
        signals: Signals::new(state.clone(), config.server.grace_period),
        state,
    })
}
