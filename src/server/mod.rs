//! Wires a validated `Config` into a Pingora server.

pub mod metrics;
pub mod settings;
pub mod signals;
pub mod state;
pub mod tls;
mod warmed;

pub use settings::ServerSettings;

use std::sync::Arc;
use std::time::Duration;

use pingora::apps::http_app::HttpServer;
use pingora::apps::HttpServerOptions;
use pingora::listeners::tls::TlsSettings;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;

use crate::admin::Admin;
use crate::config::{Config, Inputs};
use crate::connection::{AcceptFilter, AdminDoor, ConnectionCaps, ConnectionSettings, FrontDoor};
use crate::proxy::access_log::AccessLog;
use crate::proxy::Gateway;
use crate::server::metrics::Metrics;
use crate::server::signals::Signals;
use crate::server::state::{AppState, Runtime};
use floodgate_limiter::clock::{Clock, OffsetClock, SystemClock};
use floodgate_limiter::redis::{changes, InstanceCount, Topology};
use floodgate_limiter::{
    Fallback, Forgetter, Instances, KnownRefusals, Leased, MemoryStore, RedisCluster,
    RedisSettings, RedisStandalone, Roster, Store,
};
use floodgate_policy::identity::IdentityKeySource;
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

/// Drops idle keys of the memory store now and then, so that memory follows
/// the number of active clients rather than every client ever seen.
struct Sweeper {
    store: Arc<dyn Store>,
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

/// Moves the clock clients' overrides expire by, and drops those that
/// expired: a request reads no clock for them.
struct OverrideExpiry {
    clients: Arc<crate::clients::RunTimeClients>,
    clock: Arc<dyn Clock>,
}

/// How late an override may outlive its `expires` at most.
const OVERRIDE_TICK: Duration = Duration::from_millis(250);

impl OverrideExpiry {
    /// The overrides that expired now, dropped from the table.
    fn tick(&self) -> (Vec<floodgate_policy::overrides::OverrideKey>, u64) {
        let now_s = self.clock.now_us() / 1_000_000;
        let expired = self.clients.overrides.tick(now_s);
        let mut keys = Vec::with_capacity(expired.len());
        for (key, gone) in expired {
            log::info!(
                "run-time clients: override of {} under {} expired",
                gone.client,
                gone.limit_name
            );
            keys.push(key);
        }
        (keys, now_s)
    }
}

#[async_trait::async_trait]
impl BackgroundService for OverrideExpiry {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(OVERRIDE_TICK);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let (expired, now_s) = self.tick();
                    self.clients.expired(&expired, now_s).await;
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Samples what the status page charts.
struct StatusSampler {
    state: Arc<AppState>,
}

#[async_trait::async_trait]
impl BackgroundService for StatusSampler {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(crate::admin::status::STEP);
        // A stalled process takes its next sample a step later, not a burst
        // of samples a moment apart.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let runtime = self.state.runtime.load();
                    self.state.status.tick(self.state.store.deciding(), runtime.limits());
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Hears of the keys an operator reset or credited through another
/// instance (`limiter::redis::changes`).
struct ChangesListener {
    settings: RedisSettings,
    forgetter: Forgetter,
    /// The state decided in process while Redis was away.
    local: Arc<MemoryStore>,
}

#[async_trait::async_trait]
impl BackgroundService for ChangesListener {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let listen = changes::listen(
            self.settings.clone(),
            self.forgetter.clone(),
            self.local.clone(),
        );
        tokio::select! {
            _ = listen => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Follows the run-time clients kept in Redis (`clients::RedisClients`).
struct ClientsFollower {
    redis: Arc<crate::clients::RedisClients>,
}

#[async_trait::async_trait]
impl BackgroundService for ClientsFollower {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.redis.clone().follow() => {}
            _ = shutdown.changed() => {}
        }
    }
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

/// `instances = "auto"`: keeps this instance counted (`limiter::Roster`).
struct Counting {
    roster: Arc<Roster>,
}

#[async_trait::async_trait]
impl BackgroundService for Counting {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        self.roster
            .run(async move {
                let _ = shutdown.changed().await;
            })
            .await;
    }
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

/// Keys whose refusal by Redis is remembered, so that a refused client's
/// retries cost no Redis call until its retry time.
const KNOWN_REFUSALS: usize = 100_000;

/// `shared` behind the circuit breaker, deciding by `on_failure` (in
/// `memory` for "local") while it cannot answer.
fn with_fallback<S: Store + 'static>(shared: S, parts: &StoreParts<'_>) -> Arc<dyn Store> {
    Arc::new(Fallback::new(
        shared,
        parts.memory.clone(),
        parts.instances.clone(),
        parts.metrics.redis.clone(),
        parts.clock.clone(),
    ))
}

/// What every layer of the shared store is built with.
struct StoreParts<'a> {
    settings: &'a RedisSettings,
    memory: Arc<MemoryStore>,
    metrics: &'a Metrics,
    clock: Arc<dyn Clock>,
    instances: Instances,
}

/// The shared store and what runs beside it.
struct SharedStore {
    store: Arc<dyn Store>,
    /// Forgets remembered refusals when another instance announces an
    /// operator's change (`changes`).
    forgetter: Forgetter,
    instances: Instances,
    /// With `instances = "auto"`: this instance's place in the count.
    roster: Option<Arc<Roster>>,
}

/// The shared store, with the refusals it gave remembered and `on_failure`
/// (deciding in `memory` for "local") when it cannot answer.
fn redis_store(
    settings: &RedisSettings,
    memory: Arc<MemoryStore>,
    metrics: &Metrics,
    clock: Arc<dyn Clock>,
) -> SharedStore {
    fn wrap<S: Store + 'static>(shared: S, parts: &StoreParts<'_>) -> (Arc<dyn Store>, Forgetter) {
        let settings = parts.settings;
        let mut remembering = KnownRefusals::new(shared, KNOWN_REFUSALS, parts.clock.clone());
        if let Some(leases) = settings.leases {
            remembering = remembering.with_lease_ttl(leases.ttl_us);
        }
        let forgetter = remembering.forgetter();
        let Some(leases) = settings.leases else {
            return (with_fallback(remembering, parts), forgetter);
        };
        let leased = Leased::new(
            remembering,
            leases,
            parts.instances.clone(),
            settings.timeout,
            parts.clock.clone(),
        )
        .until_listening()
        .with_metrics(parts.metrics.redis.leases.clone());
        let forgetter = forgetter.and(leased.forgetter());
        (with_fallback(leased, parts), forgetter)
    }
    let instances = match settings.instances {
        InstanceCount::Fixed(n) => Instances::fixed(n),
        InstanceCount::Auto => Instances::counted(),
    };
    let parts = StoreParts {
        settings,
        memory,
        metrics,
        clock: clock.clone(),
        instances: instances.clone(),
    };
    let timer = metrics.redis.call_seconds.clone();
    // The roster has a connection of its own, outside the breaker: its
    // count must come from Redis or not at all.
    let (store, forgetter, roster_store): (_, _, Arc<dyn Store>) = match &settings.topology {
        Topology::Standalone(_) | Topology::Sentinel(_) => {
            let (store, forgetter) = wrap(
                RedisStandalone::new(settings.clone(), clock.clone()).with_call_timer(timer),
                &parts,
            );
            let roster = Arc::new(RedisStandalone::new(settings.clone(), clock));
            (store, forgetter, roster)
        }
        Topology::Cluster(_) => {
            let (store, forgetter) = wrap(
                RedisCluster::new(settings.clone(), clock.clone()).with_call_timer(timer),
                &parts,
            );
            let roster = Arc::new(RedisCluster::new(settings.clone(), clock));
            (store, forgetter, roster)
        }
    };
    metrics.redis.instances.set(instances.get() as i64);
    let roster = instances.is_counted().then(|| {
        Arc::new(Roster::new(
            roster_store,
            instances.clone(),
            metrics.redis.instances.clone(),
        ))
    });
    SharedStore {
        store,
        forgetter,
        instances,
        roster,
    }
}

/// File descriptors kept back from the connection cap's default: listeners,
/// Redis, logs, the admin listener.
const RESERVED_FDS: u64 = 64;

/// Raises the soft open-files limit to the hard one (a proxy holds two
/// descriptors per proxied request) and returns the limit in force.
fn raise_open_files_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                log::info!("open files limit raised from {soft} to {hard}");
                hard
            }
            Err(e) => {
                log::warn!("cannot raise the open files limit from {soft} to {hard}: {e}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            log::warn!("cannot read the open files limit: {e}");
            1024
        }
    }
}

/// `[server]`'s connection settings, the total cap derived from the
/// open-files limit when not given: each client connection may need an
/// upstream one too, so half of what is left after the reserve.
fn connection_settings(server: &ServerSettings) -> ConnectionSettings {
    let open_files = raise_open_files_limit();
    let derived = (open_files.saturating_sub(RESERVED_FDS) / 2).max(16);
    ConnectionSettings {
        header_timeout: server.header_timeout,
        keepalive_timeout: server.keepalive_timeout,
        max_connections: server
            .max_connections
            .unwrap_or_else(|| usize::try_from(derived).unwrap_or(usize::MAX)),
        max_connections_per_ip: server.max_connections_per_ip,
    }
}

/// HTTP/2 from clients: at most 32 streams at once per connection (each may
/// hold an upstream connection, and the caps count connections), and the
/// h2 crate's guards against streams reset as fast as they are opened.
fn h2_options() -> pingora::protocols::http::v2::server::H2Options {
    let mut options = pingora::protocols::http::v2::server::default_h2_options();
    options.max_concurrent_streams(MAX_H2_STREAMS);
    options.max_concurrent_reset_streams(MAX_H2_STREAMS as usize);
    options.max_pending_accept_reset_streams(MAX_H2_STREAMS as usize);
    options
}

/// Streams one HTTP/2 connection may have open at once.
const MAX_H2_STREAMS: u32 = 32;

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
    let file = config.file.display().to_string();
    if config.redis.is_some() && config.identity_key == IdentityKeySource::Public {
        log::warn!(
            "no identity secret (FLOODGATE_IDENTITY_SECRET or [clients].identity_secret_file): identities are hashed with a public key, so clients can compute their Redis keys; give every instance the same secret"
        );
    }
    let clock = clock_from_env()?;
    let refusal_clock = clock.clone();
    let state_clock = clock.clone();
    let metrics = Arc::new(Metrics::new());
    let memory = Arc::new(
        MemoryStore::new(config.max_keys, clock.clone())
            .with_overflow_metric(metrics.local_overflow.clone()),
    );
    let (store, changes, instances, roster) = match &config.redis {
        None => (memory as Arc<dyn Store>, None, None, None),
        Some(settings) => {
            let shared = redis_store(settings, memory.clone(), &metrics, clock);
            (
                shared.store,
                Some((settings.clone(), shared.forgetter, memory)),
                Some(shared.instances),
                shared.roster,
            )
        }
    };
    let (clients, follower) = run_time_clients(config)?;
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
        .map_err(|source| BuildError::Tracing {
            file: file.clone(),
            source,
        })?
        .map(Arc::new);
    let state = Arc::new(
        AppState::new(
            config.clone(),
            inputs,
            runtime,
            store.clone(),
            metrics,
            access_log,
            instances,
        )
        .with_clock(refusal_clock)
        .with_clients(clients)
        .with_tracing(tracing),
    );

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

    let connections = connection_settings(&config.server);
    log::info!(
        "connections: at most {} open, {} per client address; request heads within {:?}, idle keep-alive {:?}",
        connections.max_connections,
        connections.max_connections_per_ip,
        connections.header_timeout,
        connections.keepalive_timeout
    );
    let caps = ConnectionCaps::new(&connections, state.metrics.connections.clone());
    let accept_filter = AcceptFilter::new(caps.clone(), state.clone());
    let doors = Doors {
        server: &server,
        state: &state,
        caps: &caps,
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
            file: file.clone(),
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
    if let Some(admin_addr) = config.server.admin_listen {
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
    server.add_service(background_service("memory sweeper", Sweeper { store }));
    if config.server.admin_listen.is_some() {
        server.add_service(background_service(
            "status sampler",
            StatusSampler {
                state: state.clone(),
            },
        ));
    }
    if let Some((settings, forgetter, local)) = changes {
        server.add_service(background_service(
            "operators' changes",
            ChangesListener {
                settings,
                forgetter,
                local,
            },
        ));
    }
    #[cfg(feature = "rls")]
    if let Some(rls) = &config.rls {
        // Validated with the config: `tls` needs `[server.tls]`.
        let certificates = state.certificates.clone().filter(|_| rls.tls);
        let service = crate::rls::RlsService::bind(
            rls,
            certificates,
            state.clone(),
            caps.clone(),
            &connections,
        )
        .map_err(|source| BuildError::RlsListen {
            file: file.clone(),
            listen: rls.listen,
            source,
        })?;
        let mut service = background_service("rate limit service", service);
        // As many threads as the gateway's workers: Envoy's calls are its
        // requests, one each.
        service.threads = Some(config.server.threads);
        server.add_service(service);
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
            clock: state_clock,
        };
        // Before the first request: one that expired while the proxy was
        // down is no override from the start. (Redis's entries load after
        // this; the ticks that run then remove theirs.)
        let _ = expiry.tick();
        server.add_service(background_service("override expiry", expiry));
    }
    if let Some(roster) = &roster {
        server.add_service(background_service(
            "instance count",
            Counting {
                roster: roster.clone(),
            },
        ));
    }
    Ok(Floodgate {
        server,
        signals: Signals::new(state.clone(), config.server.grace_period, roster),
        state,
    })
}

/// What every worker's front door is built from.
///
/// A worker is a Pingora service of its own, with one thread, its own
/// accept loop on the shared listening socket and its own upstream
/// connection pool, as nginx runs a worker per process: with one
/// multi-threaded runtime instead, connections, their timers and the pool's
/// idle watches wake each other across threads, and Pingora's pool loses
/// races for idle connections to their watches (a bare Pingora proxy spent
/// 32 µs of CPU per request on two threads against 25 µs on one; as two
/// one-thread services, 25 µs).
struct Doors<'a> {
    server: &'a Server,
    state: &'a Arc<AppState>,
    caps: &'a Arc<ConnectionCaps>,
    connections: ConnectionSettings,
    filter: &'a Arc<AcceptFilter>,
    workers: usize,
}

impl Doors<'_> {
    fn service(
        &self,
        name: String,
        worker: usize,
        listen: &[std::net::SocketAddr],
        h2c: bool,
        tls: Option<Arc<pingora::listeners::tls::Acceptor>>,
    ) -> Service<FrontDoor> {
        let mut proxy = pingora::proxy::http_proxy(
            &self.server.configuration,
            Gateway::new(self.state.clone()),
        );
        let mut options = HttpServerOptions::default();
        options.h2c = h2c;
        options.h2_idle_timeout = Some(self.connections.keepalive_timeout);
        proxy.server_options = Some(options);
        proxy.h2_options = Some(h2_options());
        let mut front = Service::new(
            name,
            FrontDoor::new(
                Arc::new(proxy),
                self.state.clone(),
                self.caps.clone(),
                self.connections,
                h2c,
                tls,
            ),
        );
        front.threads = Some(1);
        front.set_connection_filter(self.filter.clone());
        for addr in listen {
            if self.workers == 1 {
                front.add_tcp(&addr.to_string());
            } else {
                front.add_tcp_with_settings(&worker_spelling(addr, worker), reuse_port());
            }
        }
        front
    }
}

/// Each worker binds a socket of its own (SO_REUSEPORT: the kernel spreads
/// new connections over them, as nginx's `reuseport`). Pingora keys the
/// sockets it keeps by the address as written and would hand every worker
/// the one descriptor (closed once per worker at exit), so worker `n` writes
/// the port with `n` leading zeros: the same address, a key of its own.
fn worker_spelling(addr: &std::net::SocketAddr, worker: usize) -> String {
    format!(
        "{}:{}{}",
        match addr {
            std::net::SocketAddr::V4(a) => a.ip().to_string(),
            std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
        },
        "0".repeat(worker),
        addr.port()
    )
}

fn reuse_port() -> pingora::listeners::TcpSocketOptions {
    let mut options = pingora::listeners::TcpSocketOptions::default();
    options.so_reuseport = Some(true);
    options
}
