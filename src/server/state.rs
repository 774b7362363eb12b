//! What the process serves with: the current configuration generation
//! (swapped whole on reload) and the state that outlives generations (the
//! stores, the metrics, the drain).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use log::{error, info, warn};

use crate::admin::auth::AdminToken;
use crate::admin::status::Status;
use crate::config::{Config, Inputs};
use crate::proxy::access_log::AccessLog;
use crate::proxy::headers::HeaderStyle;
use crate::proxy::upstream::Upstreams;
use crate::rls::RlsTokens;
use crate::server::metrics::{LayerCounters, Metrics};
use crate::server::tls::CertResolver;
use floodgate_limiter::{Deciding, Instances, LimitId, Store};
use floodgate_policy::{Limit, Policy};

/// One configuration generation. A request keeps the generation it started
/// with, so a reload never changes the rules under a request in flight.
pub struct Runtime {
    pub policy: Arc<Policy>,
    pub headers: HeaderStyle,
    pub upstream: Upstreams,
    /// The series of `policy.limits[i]` at `counters[i]`: built from that
    /// list here and read only through `counters` and `limits`, so that the
    /// two cannot fall out of step.
    counters: Vec<LayerCounters>,
    /// `[admin].token_file`'s token (a reload rotates it).
    pub admin_token: Option<AdminToken>,
    /// `[rls].token_file`'s tokens (a reload rotates them).
    pub rls_tokens: Option<RlsTokens>,
    /// How each limit reads a client's numbers set at run time.
    pub override_rules: crate::config::overrides::OverrideRules,
}

impl Runtime {
    pub fn new(config: &Config, metrics: &Metrics) -> std::io::Result<Runtime> {
        Ok(Runtime {
            policy: config.policy.clone(),
            headers: config.headers,
            upstream: Upstreams::resolve(&config.upstream)?,
            counters: config
                .policy
                .limits
                .iter()
                .map(|l| metrics.layer(l.name.as_str()))
                .collect(),
            admin_token: config.admin_token.clone(),
            rls_tokens: config.rls_tokens.clone(),
            override_rules: config.override_rules.clone(),
        })
    }

    /// The series of one limit of this generation's policy.
    pub fn counters(&self, limit: LimitId) -> &LayerCounters {
        &self.counters[limit.index()]
    }

    /// Every limit of this generation, with its series.
    pub fn limits(&self) -> impl Iterator<Item = (&Limit, &LayerCounters)> {
        self.policy.limits.iter().zip(&self.counters)
    }
}

/// Process-wide state shared by the proxy, the admin endpoints and the
/// signal handling.
pub struct AppState {
    pub runtime: ArcSwap<Runtime>,
    /// Where limit state lives and decisions are made (see `limiter`).
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    /// `[log].access`, when on.
    pub access_log: Option<AccessLog>,
    /// HTTP/2 requests in flight per client address.
    pub streams: Arc<crate::connection::caps::StreamCaps>,
    /// When each blocked client was last logged (kept across reloads).
    /// Once a minute per blocked client: one that keeps knocking must not
    /// fill the log.
    pub block_log: floodgate_limiter::log_throttle::KeyedLogThrottle<u128>,
    /// When each client was last logged as refused by each limit (kept
    /// across reloads): a client refused at full speed must not fill the
    /// disk, nor cost a line's formatting per refusal.
    pub refusal_log: crate::proxy::refusal_log::RefusalLog,
    /// `[server].header_timeout`: also the grace before a body's pace counts.
    pub header_timeout: std::time::Duration,
    /// `[server].slot_body_timeout`.
    pub slot_body_timeout: std::time::Duration,
    /// How many instances share Redis (none with the memory store).
    pub instances: Option<Instances>,
    /// What the TLS listeners serve; swapped on reload.
    pub certificates: Option<Arc<CertResolver>>,
    pub config_path: PathBuf,
    /// The recent past the status page shows.
    pub status: Status,
    /// `[upstream.protection]`, kept across reloads.
    pub protection: Arc<crate::protection::Protection>,
    /// The API keys set at run time and where they are kept; none while
    /// the admin API is off.
    pub clients: Option<Arc<crate::clients::RunTimeClients>>,
    /// `[tracing]`, when on (it cannot change on reload).
    pub tracing: Option<Arc<crate::tracing::Tracing>>,
    /// The environment the process started with, and the disk: what a
    /// reload reads the file and the files it names with.
    inputs: Inputs,
    /// The configuration the process started with: what the sections a
    /// reload cannot change (listeners, stores) still run as, however many
    /// reloads came since.
    started_with: Config,
    in_flight: Arc<AtomicUsize>,
    draining: AtomicBool,
    /// Until the workers listen: they wait for the store to warm up.
    warming: AtomicBool,
}

/// Counts a request as in flight for as long as it lives.
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AppState {
    /// The clock the refusal lines are spaced on: the proxy's own (a test
    /// moves it rather than wait).
    pub fn with_clock(mut self, clock: Arc<dyn floodgate_limiter::clock::Clock>) -> AppState {
        self.refusal_log = crate::proxy::refusal_log::RefusalLog::new(clock);
        self
    }

    /// `[tracing]`'s tracer, when on.
    pub fn with_tracing(mut self, tracing: Option<Arc<crate::tracing::Tracing>>) -> AppState {
        self.tracing = tracing;
        self
    }

    /// The run-time clients the admin API changes.
    pub fn with_clients(
        mut self,
        clients: Option<Arc<crate::clients::RunTimeClients>>,
    ) -> AppState {
        self.clients = clients;
        self
    }

    pub fn new(
        config: Config,
        inputs: Inputs,
        runtime: Runtime,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        access_log: Option<AccessLog>,
        instances: Option<Instances>,
    ) -> AppState {
        let protection = Arc::new(crate::protection::Protection::new(
            metrics.protection.clone(),
        ));
        protection.configure(config.protection.clone());
        AppState {
            protection,
            status: Status::new(store.deciding()),
            runtime: ArcSwap::from_pointee(runtime),
            store,
            metrics,
            access_log,
            streams: crate::connection::caps::StreamCaps::new(config.server.max_connections_per_ip),
            block_log: floodgate_limiter::log_throttle::KeyedLogThrottle::new(
                10_000,
                std::time::Duration::from_secs(60),
                std::time::Duration::ZERO,
            ),
            refusal_log: crate::proxy::refusal_log::RefusalLog::new(Arc::new(
                floodgate_limiter::clock::SystemClock,
            )),
            header_timeout: config.server.header_timeout,
            slot_body_timeout: config.server.slot_body_timeout,
            instances,
            certificates: config
                .tls
                .as_ref()
                .map(|t| CertResolver::new(t.certs.clone())),
            config_path: config.file.clone(),
            clients: None,
            tracing: None,
            inputs,
            started_with: config,
            in_flight: Arc::new(AtomicUsize::new(0)),
            draining: AtomicBool::new(false),
            warming: AtomicBool::new(true),
        }
    }

    pub fn request_started(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.in_flight.clone())
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The store is warm (or was given up on) and the workers listen.
    pub fn warmed(&self) {
        self.warming.store(false, Ordering::Release);
    }

    pub fn degraded(&self) -> bool {
        self.store.deciding() == Deciding::Fallback
    }

    /// Re-reads the config file and swaps in what it says. An invalid file
    /// changes nothing: the reason is logged and counted. The access log file
    /// is reopened either way (log rotation).
    pub fn reload(&self) -> bool {
        if let Some(log) = &self.access_log {
            log.reopen();
        }
        let path = &self.config_path;
        let result = Config::load(path, &self.inputs)
            .map_err(|e| e.to_string())
            .and_then(|config| {
                let runtime = Runtime::new(&config, &self.metrics)
                    .map_err(|e| format!("{}: upstream.servers: {e}", path.display()))?;
                Ok((config, runtime))
            });
        match result {
            Ok((config, runtime)) => {
                let restart_only = self.started_with.restart_only_changes(&config);
                if !restart_only.is_empty() {
                    warn!(
                        "reload: changes to {} take effect only after a restart",
                        restart_only.join(", ")
                    );
                }
                if let (Some(resolver), Some(tls)) = (&self.certificates, &config.tls) {
                    resolver.replace(tls.certs.clone());
                }
                self.runtime.store(Arc::new(runtime));
                self.protection.configure(config.protection.clone());
                if let Some(clients) = &self.clients {
                    clients.reconfigured(crate::clients::OverrideChecker::of(&config));
                }
                self.metrics.reload(true);
                self.status.reloaded(true, None);
                info!("reloaded {}", path.display());
                true
            }
            Err(reason) => {
                self.metrics.reload(false);
                self.status.reloaded(false, Some(reason.clone()));
                error!("reload refused, the previous configuration keeps serving: {reason}");
                false
            }
        }
    }

    /// `/readyz`: status and a one-line reason.
    pub fn readiness(&self) -> (u16, &'static str) {
        if self.draining() {
            (503, "draining: shutting down\n")
        } else if self.warming.load(Ordering::Acquire) {
            (503, "starting: connecting to Redis before listening\n")
        } else if self.degraded() {
            (200, "degraded: Redis unavailable, deciding by on_failure\n")
        } else {
            (200, "ready\n")
        }
    }

    /// Where the shared store is, for the status page, password hidden;
    /// none for the memory store.
    pub fn store_target(&self) -> Option<String> {
        self.started_with
            .redis
            .as_ref()
            .map(|redis| redis.redacted_target())
    }

    /// Values read at scrape time.
    pub fn refresh_gauges(&self) {
        self.metrics.fallback_active.set(i64::from(self.degraded()));
        self.metrics
            .local_keys
            .set(i64::try_from(self.store.keys_held()).unwrap_or(i64::MAX));
        if let Some(clients) = &self.clients {
            self.metrics
                .run_time_keys
                .set(i64::try_from(clients.keys.len()).unwrap_or(i64::MAX));
        }
    }
}
