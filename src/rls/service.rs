//! The gRPC service: tonic's server, beside Pingora's listeners as a
//! background service of the same process. gRPC's framing, status codes,
//! deadlines and message limits are tonic's; no protobuf is written by
//! hand (the types are envoy-types'). Over TLS, the handshake is rustls'
//! with the gateway's own certificate resolver.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::decide::{self, Ask, Descriptor, Failure, Shown};
use super::door::{ConnectionInfo, Deadlines, Door};
use super::settings::RlsSettings;
use super::traced;
use crate::connection::{ConnectionCaps, ConnectionSettings};
use crate::server::state::AppState;
use crate::server::tls::CertResolver;
use floodgate_limiter::clock::{Clock, SystemClock};
use floodgate_limiter::log_throttle::LogThrottle;
use floodgate_limiter::watch;
use floodgate_policy::MAX_ENTRIES;

/// The most descriptors one call may carry: Envoy sends one per
/// `rate_limits` action that applies, a handful.
pub(crate) const MAX_DESCRIPTORS: usize = 64;

/// Calls at once on one connection, and streams Envoy may open on it:
/// HTTP/2's advice (RFC 9113, 6.5.2: no fewer than 100). A client may open
/// streams before our SETTINGS reach it; those past the limit are refused,
/// and past 20 refusals the h2 server ends the connection (its guard
/// against rapid resets), so a lower limit cost a new connection's burst
/// of calls. Envoy opens another connection when its calls need more. A
/// connection of calls that never finish holds at most this many messages
/// of `[rls].max_message_bytes`, each for the call timeout at most.
const STREAMS_PER_CONNECTION: u32 = 100;

/// A call gets no answer after this, whatever its own deadline says
/// (Envoy's filter gives 20 ms by default).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The service, on the process's state (the generation in force at each
/// call: a reload changes the limits it serves).
#[derive(Clone)]
struct Limiter {
    state: Arc<AppState>,
}

fn invalid(state: &AppState, why: String) -> Status {
    state.metrics.rls.invalid_argument.inc();
    Status::invalid_argument(why)
}

/// A call checked for what Envoy's API requires (a domain, a descriptor)
/// and for size.
fn ask_of<'a>(state: &AppState, call: &'a RateLimitRequest) -> Result<Ask<'a>, Status> {
    if call.domain.is_empty() {
        return Err(invalid(state, "the domain is empty".into()));
    }
    if call.descriptors.is_empty() {
        return Err(invalid(state, "the call has no descriptor".into()));
    }
    if call.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid(
            state,
            format!(
                "{} descriptors: at most {MAX_DESCRIPTORS} are decided in one call",
                call.descriptors.len()
            ),
        ));
    }
    let mut descriptors = Vec::with_capacity(call.descriptors.len());
    for (k, d) in call.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(invalid(
                state,
                format!(
                    "descriptor {k} has {} entries: at most {MAX_ENTRIES}",
                    d.entries.len()
                ),
            ));
        }
        descriptors.push(Descriptor {
            entries: d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect(),
            cost: decide::cost_of(d.hits_addend.map(|h| h.value), call.hits_addend),
        });
    }
    Ok(Ask {
        domain: &call.domain,
        descriptors,
    })
}

/// The unit of time nearest a limit's window (on a log scale), and the
/// quota expressed per that unit: what Envoy's `current_limit` can say.
pub(crate) fn per_unit(quota: u64, window_us: u64) -> (Unit, u32) {
    const UNITS: [(Unit, f64); 5] = [
        (Unit::Second, 1e6),
        (Unit::Minute, 60e6),
        (Unit::Hour, 3_600e6),
        (Unit::Day, 86_400e6),
        (Unit::Year, 365.0 * 86_400e6),
    ];
    let window = window_us.max(1) as f64;
    let (unit, unit_us) = UNITS
        .iter()
        .copied()
        .min_by(|a, b| {
            let distance = |u: f64| (window / u).ln().abs();
            distance(a.1).total_cmp(&distance(b.1))
        })
        .unwrap_or((Unit::Second, 1e6));
    let per = (quota as f64 * unit_us / window).round().max(1.0);
    (unit, per.min(f64::from(u32::MAX)) as u32)
}

fn duration(us: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(us / 1_000_000).unwrap_or(i64::MAX),
        nanos: ((us % 1_000_000) * 1_000) as i32,
    }
}

fn status_of(over_limit: bool, shown: Option<&Shown>) -> DescriptorStatus {
    let code = if over_limit {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let Some(shown) = shown else {
        return DescriptorStatus {
            code: code as i32,
            ..DescriptorStatus::default()
        };
    };
    let (unit, requests_per_unit) = per_unit(shown.quota, shown.window_us);
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: shown.name.clone(),
            requests_per_unit,
            unit: unit as i32,
        }),
        limit_remaining: u32::try_from(shown.decision.remaining()).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(shown.decision.reset_after_us())),
        quota: None,
    }
}

#[tonic::async_trait]
impl RateLimitService for Limiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let state = &self.state;
        // The extensions hold the call's place among its connection's
        // calls in flight until it is answered.
        let (metadata, _in_flight, call) = request.into_parts();
        let trace = state
            .tracing
            .as_deref()
            .map(|tracing| traced::begin(tracing, &metadata));
        let ask = ask_of(state, &call)?;
        let runtime = state.runtime.load_full();
        let deciding = decide::decide(
            &runtime,
            &state.store,
            &state.metrics.rls,
            &state.refusal_log,
            &ask,
        );
        let decided = match (&trace, state.tracing.as_deref()) {
            (Some(trace), Some(tracing)) if trace.sampled() => {
                let started = std::time::SystemTime::now();
                let (decided, watched) = Box::pin(watch::watched(deciding)).await;
                traced::decided(tracing, trace, &ask, &decided, started, &watched);
                decided
            }
            _ => deciding.await,
        };
        let answer = match decided {
            Ok(answer) => answer,
            Err(Failure::Unavailable(why)) => {
                state.metrics.rls.unavailable.inc();
                if let Some(trace) = trace {
                    traced::finish(trace, tonic::Code::Unavailable, Some(&why));
                }
                return Err(Status::unavailable(why));
            }
        };
        if let Some(trace) = trace {
            traced::finish(trace, tonic::Code::Ok, None);
        }
        let overall = if answer.over_limit {
            state.metrics.rls.over_limit.inc();
            Code::OverLimit
        } else {
            state.metrics.rls.ok.inc();
            Code::Ok
        };
        let response = RateLimitResponse {
            overall_code: overall as i32,
            statuses: answer
                .statuses
                .iter()
                .map(|s| status_of(s.over_limit, s.shown.as_ref()))
                .collect(),
            response_headers_to_add: answer
                .headers
                .iter()
                .map(|(name, value)| HeaderValue {
                    key: name.spelling().to_string(),
                    // floodgate's own values: ASCII.
                    value: value.to_str().unwrap_or_default().to_string(),
                    raw_value: Vec::new(),
                })
                .collect(),
            ..RateLimitResponse::default()
        };
        state
            .metrics
            .rls
            .duration
            .observe(started.elapsed().as_secs_f64());
        Ok(Response::new(response))
    }
}

/// The listener, bound when the server is built (an address in use stops
/// the start, as the gateway's listeners do), served once Pingora runs its
/// background services.
pub(crate) struct RlsService {
    listener: std::sync::Mutex<Option<std::net::TcpListener>>,
    door: Arc<Door>,
    tls: bool,
    state: Arc<AppState>,
    max_message_bytes: usize,
}

/// What every call passes on its headers, before its message is read:
/// the token, when `[rls].token_file` asks for one (a call without it is
/// refused and charges nothing), and its count among its connection's calls
/// in flight, so that a connection is idle only when it has none.
#[derive(Clone)]
struct Gate {
    state: Arc<AppState>,
}

/// Calls refused for want of the token: a line a minute at most, however
/// many come.
static UNAUTHENTICATED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(60));

impl tonic::service::Interceptor for Gate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        if let Some(tokens) = &self.state.runtime.load().rls_tokens {
            let shown = request.metadata().get_all("authorization");
            if !tokens.admit(shown.iter().map(|value| value.as_bytes())) {
                self.state.metrics.rls.unauthenticated.inc();
                if let Some(held_back) = UNAUTHENTICATED_LOG.due(SystemClock.now_us()) {
                    let from = connection
                        .as_ref()
                        .map_or_else(|| "?".to_string(), |c| c.remote.to_string());
                    log::warn!(
                        "rls: a call from {from} refused: it shows no token of [rls].token_file (authorization: Bearer <token>); {held_back} more since the last line"
                    );
                }
                return Err(Status::unauthenticated(
                    "this rate limit service answers callers that show its token: authorization: Bearer <token>",
                ));
            }
        }
        if let Some(connection) = connection {
            request
                .extensions_mut()
                .insert(Arc::new(connection.calls.begin()));
        }
        Ok(request)
    }
}

/// gRPC over TLS: h2 by ALPN, as Envoy's and grpcio's clients require,
/// with the certificates `[server.tls]` serves (a SIGHUP that replaces
/// them replaces them here too).
fn tls_acceptor(certificates: Arc<CertResolver>) -> std::io::Result<TlsAcceptor> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(certificates);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl RlsService {
    /// `certificates`: serve over TLS with them, else h2c. `process`: the
    /// caps whose total every listener's connections count in, and
    /// `connections` the gateway's settings, whose caps apply where
    /// `[rls]` sets none and whose deadlines apply.
    pub(crate) fn bind(
        settings: &RlsSettings,
        certificates: Option<Arc<CertResolver>>,
        state: Arc<AppState>,
        process: Arc<ConnectionCaps>,
        connections: &ConnectionSettings,
    ) -> std::io::Result<RlsService> {
        let tls = certificates.map(tls_acceptor).transpose()?;
        let listener = std::net::TcpListener::bind(settings.listen)?;
        listener.set_nonblocking(true)?;
        let own = ConnectionSettings {
            max_connections: settings
                .max_connections
                .unwrap_or(connections.max_connections),
            max_connections_per_ip: settings
                .max_connections_per_ip
                .unwrap_or(connections.max_connections_per_ip),
            ..*connections
        };
        log::info!(
            "rls: connections: at most {} open (within the process's {}), {} per client address; TLS handshake and HTTP/2 preface within {:?}, closed after {:?} without a call",
            own.max_connections,
            connections.max_connections,
            own.max_connections_per_ip,
            own.header_timeout,
            own.keepalive_timeout
        );
        let caps = ConnectionCaps::of_listener(
            "rate limit service ",
            &own,
            state.metrics.rls_connections.clone(),
        );
        let deadlines = Deadlines {
            header_timeout: own.header_timeout,
            idle_timeout: own.keepalive_timeout,
        };
        Ok(RlsService {
            listener: std::sync::Mutex::new(Some(listener)),
            tls: tls.is_some(),
            door: Door::new(caps, process, state.clone(), tls, deadlines),
            state,
            max_message_bytes: settings.max_message_bytes,
        })
    }
}

#[async_trait::async_trait]
impl BackgroundService for RlsService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let taken = self.listener.lock().ok().and_then(|mut l| l.take());
        let Some(listener) = taken else {
            return;
        };
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                log::error!("rls: cannot listen: {e}");
                return;
            }
        };
        let address = listener
            .local_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        log::info!(
            "rls: serving envoy.service.ratelimit.v3.RateLimitService on {address} ({})",
            if self.tls { "TLS" } else { "h2c" }
        );
        let service = RateLimitServiceServer::new(Limiter {
            state: self.state.clone(),
        })
        // Refused on the prefix that declares more: never buffered.
        .max_decoding_message_size(self.max_message_bytes);
        let service = InterceptedService::new(
            service,
            Gate {
                state: self.state.clone(),
            },
        );
        let router = tonic::transport::Server::builder()
            .timeout(CALL_TIMEOUT)
            .concurrency_limit_per_connection(STREAMS_PER_CONNECTION as usize)
            .max_concurrent_streams(STREAMS_PER_CONNECTION)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(service);
        let stopped = async move {
            let _ = shutdown.changed().await;
        };
        let served = router
            .serve_with_incoming_shutdown(self.door.clone().incoming(listener), stopped)
            .await;
        if let Err(e) = served {
            log::error!("rls: the service stopped: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_told_in_the_nearest_unit() {
        let minute = 60_000_000;
        assert_eq!(per_unit(100, minute), (Unit::Minute, 100));
        assert_eq!(per_unit(3, 3_600_000_000), (Unit::Hour, 3));
        assert_eq!(per_unit(10, 1_000_000), (Unit::Second, 10));
        // 10 per 10 s: nearer a minute than a second (on a log scale the
        // two meet at 7.7 s), so 60 a minute.
        assert_eq!(per_unit(10, 10_000_000), (Unit::Minute, 60));
        assert_eq!(per_unit(10, 5_000_000), (Unit::Second, 2));
        // 5 per 20 s is 15 a minute.
        assert_eq!(per_unit(5, 20_000_000), (Unit::Minute, 15));
        // Never 0 requests per unit: 1 per 2 days is 1 a day.
        assert_eq!(per_unit(1, 2 * 86_400_000_000), (Unit::Day, 1));
        assert_eq!(per_unit(1_000, 7 * 86_400_000_000).0, Unit::Day);
    }
}
