//! Wires a validated `Config` into a Pingora server.

mod background;
mod doors;
pub mod metrics;
pub mod settings;
pub mod signals;
pub mod state;
mod stores;
pub mod tls;
mod warmed;

pub use settings::ServerSettings;

use std::sync::Arc;

use pingora::apps::http_app::HttpServer;
use pingora::listeners::tls::TlsSettings;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use pingora::services::ServiceWithDependents;

use crate::admin::Admin;
use crate::config::{Config, Inputs};
use crate::connection::{AcceptFilter, AdminDoor, ConnectionCaps, ConnectionSettings};
use crate::proxy::access_log::AccessLog;
use crate::server::metrics::Metrics;
use crate::server::signals::Signals;
use crate::server::state::{AppState, Runtime};
use background::{ClientsFollower, Counting, OverrideExpiry, StatusSampler, Sweeper};
use doors::{connection_settings, Doors};
use floodgate_limiter::clock::{Clock, OffsetClock, SystemClock};
use floodgate_policy::identity::IdentityKeySource;
use stores::{stores, Stores};
use warmed::{WarmUp, Warmed};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{file}: upstream.servers: {source}")]
    Upstream {
        file: String,
        source: std::io::Error,
    },
    #[error("FLOODGATE_CLOCK_OFFSET_MS must be a whole number of milliseconds, got {0:?}")]
    ClockOffset(String),
    #[error("FLOODGATE_CLOCK_FILE {path}: {source}")]
    ClockFile {
        path: String,
        source: floodgate_limiter::clock::ClockFileError,
    },
    #[error("{file}: server.tls: {reason}")]
    Tls { file: String, reason: String },
    #[error("{file}: log.access: {reason}")]
    AccessLog { file: String, reason: String },
    #[error("admin.clients_file: {0}")]
    ClientsFile(#[from] crate::clients::LoadError),
    #[error("{file}: tracing: {source}")]
    Tracing {
        file: String,
        source: crate::tracing::TracingError,
    },
    #[error("{file}: rls.listen: cannot listen on {listen}: {source}")]
    RlsListen {
        file: String,
        listen: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// The run-time clients, and what follows them in Redis.
type RunTimeParts = (
    Option<Arc<crate::clients::RunTimeClients>>,
    Option<Arc<crate::clients::RedisClients>>,
);

/// The run-time clients (with the admin API on): kept in Redis with
/// `[redis]` (and the task that follows it), else in process and in
/// `[admin].clients_file`, loaded now.
fn run_time_clients(config: &Config) -> Result<RunTimeParts, BuildError> {
    use crate::clients::{OverrideChecker, RunTimeClients, Tables};
    let (Some(keys), Some(overrides)) = (
        config.policy.clients.run_time.clone(),
        config.policy.overrides.clone(),
    ) else {
        return Ok((None, None));
    };
    let tables = Tables {
        keys,
        overrides,
        checker: Arc::new(arc_swap::ArcSwap::from_pointee(OverrideChecker::of(config))),
    };
    Ok(match &config.redis {
        Some(settings) => {
            let (clients, redis) = RunTimeClients::shared(tables, settings);
            (Some(Arc::new(clients)), Some(redis))
        }
        None => {
            if config.clients_file.is_none() {
                log::info!("run-time clients are kept in this process only: set [admin].clients_file to keep them across restarts");
            }
            let clients = RunTimeClients::local(tables, config.clients_file.clone())?;
            (Some(Arc::new(clients)), None)
        }
    })
}

/// The proxy's clock. `FLOODGATE_CLOCK_OFFSET_MS` shifts it, which lets tests
/// (and operators rehearsing) run instances whose clocks disagree.
/// `FLOODGATE_CLOCK_FILE` names a file holding a further offset in
/// milliseconds, read again at every reading, which lets tests move a running
/// proxy's time instead of waiting for it to pass.
fn clock_from_env() -> Result<Arc<dyn Clock>, BuildError> {
    let offset_us = match std::env::var("FLOODGATE_CLOCK_OFFSET_MS") {
        Err(_) => None,
        Ok(text) => {
            let ms: i64 = text
                .trim()
                .parse()
                .map_err(|_| BuildError::ClockOffset(text.clone()))?;
            Some(ms.saturating_mul(1000))
        }
    };
    let file = match std::env::var_os("FLOODGATE_CLOCK_FILE") {
        None => None,
        Some(path) => {
            let clock = floodgate_limiter::clock::FileOffsetClock::open(SystemClock, &path)
                .map_err(|source| BuildError::ClockFile {
                    path: path.to_string_lossy().into_owned(),
                    source,
                })?;
            log::info!(
                "clock: system time plus the milliseconds in {} (FLOODGATE_CLOCK_FILE)",
                path.to_string_lossy()
            );
            Some(clock)
        }
    };
    Ok(match (file, offset_us) {
        (None, None) => Arc::new(SystemClock),
        (None, Some(us)) => Arc::new(OffsetClock::new(SystemClock, us)),
        (Some(file), None) => Arc::new(file),
        (Some(file), Some(us)) => Arc::new(OffsetClock::new(file, us)),
    })
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

/// Builds the server for `config`, which was read with `inputs` (reloads
/// read with them too).
pub fn build(config: &Config, inputs: Inputs) -> Result<Floodgate, BuildError> {
    if config.redis.is_some() && config.identity_key == IdentityKeySource::Public {
        log::warn!(
            "no identity secret (FLOODGATE_IDENTITY_SECRET or [clients].identity_secret_file): identities are hashed with a public key, so clients can compute their Redis keys; give every instance the same secret"
        );
    }
    let clock = clock_from_env()?;
    let metrics = Arc::new(Metrics::new());
    let stores = stores(config, &metrics, clock.clone());
    let (clients, follower) = run_time_clients(config)?;
    let state = app_state(config, inputs, metrics, &stores, clients, clock.clone())?;
    let mut server = pingora_server(config);
    let connections = connection_settings(&config.server);
    log::info!(
        "connections: at most {} open, {} per client address; request heads within {:?}, idle keep-alive {:?}",
        connections.max_connections,
        connections.max_connections_per_ip,
        connections.header_timeout,
        connections.keepalive_timeout
    );
    let caps = ConnectionCaps::new(&connections, state.metrics.connections.clone());
    add_front_doors(&mut server, config, &state, &caps, connections)?;
    add_admin(&mut server, config, &state, connections);
    #[cfg(feature = "rls")]
    let rls = rate_limit_service(config, &state, &caps, &connections)?;
    #[cfg(not(feature = "rls"))]
    let rls = None;
    let roster = stores.roster.clone();
    add_background_tasks(&mut server, config, &state, stores, rls, follower, clock);
    Ok(Floodgate {
        server,
        signals: Signals::new(state.clone(), config.server.grace_period, roster),
        state,
    })
}

/// What requests are decided with: the running configuration, the store,
/// the run-time clients, the access log and the tracer.
fn app_state(
    config: &Config,
    inputs: Inputs,
    metrics: Arc<Metrics>,
    stores: &Stores,
    clients: Option<Arc<crate::clients::RunTimeClients>>,
    clock: Arc<dyn Clock>,
) -> Result<Arc<AppState>, BuildError> {
    let file = config.file.display().to_string();
    let runtime = Runtime::new(config, &metrics).map_err(|source| BuildError::Upstream {
        file: file.clone(),
        source,
    })?;
    let access_log = AccessLog::start(
        &config.access_log,
        metrics.requests.access_log_dropped.clone(),
    )
    .map_err(|e| BuildError::AccessLog {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    let tracing = config
        .tracing
        .as_ref()
        .map(|settings| crate::tracing::Tracing::start(settings, &metrics.tracing))
        .transpose()
        .map_err(|source| BuildError::Tracing { file, source })?
        .map(Arc::new);
    Ok(Arc::new(
        AppState::new(
            config.clone(),
            inputs,
            runtime,
            stores.store.clone(),
            metrics,
            access_log,
            stores.instances.clone(),
        )
        .with_clock(clock)
        .with_clients(clients)
        .with_tracing(tracing),
    ))
}

/// The Pingora server the services are added to, bootstrapped.
fn pingora_server(config: &Config) -> Server {
    // Draining is ours (see `signals`): Pingora stops the listeners once
    // nothing is in flight, with no further wait.
    // One thread for every service that does not say otherwise (the admin
    // listener, the background tasks); the proxy's workers are services of
    // their own (see `Doors`).
    let conf = ServerConf {
        threads: 1,
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
    server
}

/// Every worker's front door on the plain listeners, and with
/// `[server.tls]` on the TLS ones, each listening once the store is warm.
fn add_front_doors(
    server: &mut Server,
    config: &Config,
    state: &Arc<AppState>,
    caps: &Arc<ConnectionCaps>,
    connections: ConnectionSettings,
) -> Result<(), BuildError> {
    let accept_filter = AcceptFilter::new(caps.clone(), state.clone());
    let doors = Doors {
        server,
        state,
        caps,
        connections,
        filter: &accept_filter,
        workers: config.server.threads,
    };
    let mut fronts = Vec::new();
    for worker in 0..config.server.threads {
        fronts.push(doors.service(
            format!("floodgate {worker}"),
            worker,
            &config.server.listen,
            config.server.h2c,
            None,
        ));
    }
    if let (Some(tls), Some(resolver)) = (&config.tls, &state.certificates) {
        // The listeners accept TCP; the handshake happens in the front door,
        // after the connection caps and under the head deadline.
        let mut settings = TlsSettings::intermediate("", "").map_err(|e| BuildError::Tls {
            file: config.file.display().to_string(),
            reason: e.to_string(),
        })?;
        settings.set_cert_resolver(resolver.clone());
        if tls.http2 {
            settings.enable_h2();
        }
        let acceptor = Arc::new(settings.build());
        for worker in 0..config.server.threads {
            fronts.push(doors.service(
                format!("floodgate tls {worker}"),
                worker,
                &tls.listen,
                false,
                Some(acceptor.clone()),
            ));
        }
        log::info!(
            "TLS on {} ({}), {} certificate(s)",
            tls.listen
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            if tls.http2 {
                "h2, http/1.1"
            } else {
                "http/1.1"
            },
            tls.sources.len()
        );
    }
    let warm_up = WarmUp::new(state.clone());
    for front in fronts {
        server.add_service(Warmed::new(front, warm_up.clone()));
    }
    Ok(())
}

/// The admin listener, with `[server].admin_listen`.
fn add_admin(
    server: &mut Server,
    config: &Config,
    state: &Arc<AppState>,
    connections: ConnectionSettings,
) {
    let Some(admin_addr) = config.server.admin_listen else {
        return;
    };
    let mut admin = Service::new(
        "admin".into(),
        AdminDoor::new(
            HttpServer::new_app(Admin::new(state.clone())),
            state.metrics.admin_connections.clone(),
            connections.header_timeout,
            {
                let state = state.clone();
                Box::new(move |ip| state.runtime.load().policy.clients.address_group_of(ip))
            },
        ),
    );
    admin.add_tcp(&admin_addr.to_string());
    server.add_service(admin);
}

/// Envoy's rate limit service, with `[rls]`: its listener bound now.
#[cfg(feature = "rls")]
fn rate_limit_service(
    config: &Config,
    state: &Arc<AppState>,
    caps: &Arc<ConnectionCaps>,
    connections: &ConnectionSettings,
) -> Result<Option<Box<dyn ServiceWithDependents>>, BuildError> {
    let Some(rls) = &config.rls else {
        return Ok(None);
    };
    // Validated with the config: `tls` needs `[server.tls]`.
    let certificates = state.certificates.clone().filter(|_| rls.tls);
    let service =
        crate::rls::RlsService::bind(rls, certificates, state.clone(), caps.clone(), connections)
            .map_err(|source| BuildError::RlsListen {
            file: config.file.display().to_string(),
            listen: rls.listen,
            source,
        })?;
    let mut service = background_service("rate limit service", service);
    // As many threads as the gateway's workers: Envoy's calls are its
    // requests, one each.
    service.threads = Some(config.server.threads);
    Ok(Some(Box::new(service)))
}

/// The tasks that run beside the proxy, those the configuration calls for,
/// the rate limit service among them (a background service to Pingora).
fn add_background_tasks(
    server: &mut Server,
    config: &Config,
    state: &Arc<AppState>,
    stores: Stores,
    rls: Option<Box<dyn ServiceWithDependents>>,
    follower: Option<Arc<crate::clients::RedisClients>>,
    clock: Arc<dyn Clock>,
) {
    let Stores {
        store,
        changes,
        roster,
        ..
    } = stores;
    server.add_service(background_service("memory sweeper", Sweeper { store }));
    if config.server.admin_listen.is_some() {
        server.add_service(background_service(
            "status sampler",
            StatusSampler {
                state: state.clone(),
            },
        ));
    }
    if let Some(changes) = changes {
        server.add_service(background_service("operators' changes", changes));
    }
    if let Some(rls) = rls {
        server.add_boxed_service(rls);
    }
    if let Some(redis) = follower {
        server.add_service(background_service(
            "run-time clients",
            ClientsFollower { redis },
        ));
    }
    if let Some(clients) = &state.clients {
        let expiry = OverrideExpiry {
            clients: clients.clone(),
            clock,
        };
        // Before the first request: one that expired while the proxy was
        // down is no override from the start. (Redis's entries load after
        // this; the ticks that run then remove theirs.)
        let _ = expiry.tick();
        server.add_service(background_service("override expiry", expiry));
    }
    if let Some(roster) = roster {
        server.add_service(background_service("instance count", Counting { roster }));
    }
}
