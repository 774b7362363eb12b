//! Limit state in Redis: every decision is one atomic Lua script run (by
//! SHA), so any number of proxies share one budget without a
//! read-check-write race.
//!
//! Standalone: all layers of a request go in one EVALSHA, all-or-nothing,
//! and requests that arrive while a run is in flight share the next one
//! (`batch`): Redis pays one script call for many decisions.
//! Cluster: keys carry the identity hash as their hash tag, so the layers
//! keyed by one identity share a slot. Layers are grouped by identity and
//! each group is one EVALSHA, the groups run concurrently. All-or-nothing
//! then holds within a group only: when layers keyed by different identities
//! (say per-ip and per-account) disagree, the admitting group has been
//! charged although the request is refused.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use pingora::prelude::fast_timeout::fast_timeout;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::Script;
use tokio::sync::OnceCell;

use super::batch::BatchQueue;
use super::{Limiter, LimiterError};
use crate::algorithm::{Algorithm, Decision};
use crate::clock::Clock;
use crate::config::{ClockSource, RedisSettings};
use crate::policy::Check;

/// The five algorithm scripts and the entry point, joined into one script.
pub const SCRIPT: &str = concat!(
    include_str!("../../lua/common.lua"),
    include_str!("../../lua/token_bucket.lua"),
    include_str!("../../lua/leaky_bucket.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/sliding_log.lua"),
    include_str!("../../lua/decide.lua"),
);

/// Integers per layer in the script's reply.
const REPLY_FIELDS: usize = 7;

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// One layer as the script takes it.
pub(super) struct ScriptLayer {
    key: String,
    algorithm: u8,
    a: u64,
    b: u64,
    cost: u64,
    shadow: bool,
}

/// What the script runs need: shared by the limiter and its batch queue.
pub(super) struct Store {
    settings: RedisSettings,
    clock: Arc<dyn Clock>,
    script: Script,
    /// Created on first use, so that it lives on the proxy's own runtime.
    connection: OnceCell<Connection>,
}

pub struct RedisLimiter {
    store: Arc<Store>,
    /// Standalone only: concurrent decisions share script runs (see
    /// `batch`). Started on first use, on the proxy's runtime.
    queue: OnceLock<BatchQueue>,
}

impl RedisLimiter {
    pub fn new(settings: RedisSettings, clock: Arc<dyn Clock>) -> Self {
        RedisLimiter {
            store: Arc::new(Store {
                settings,
                clock,
                script: Script::new(SCRIPT),
                connection: OnceCell::new(),
            }),
            queue: OnceLock::new(),
        }
    }

    /// `{prefix}:{limit}:{identity}`, the identity hash in braces: the hash tag.
    pub fn key(&self, check: &Check) -> String {
        self.store.key(check)
    }

    /// Decides several requests in one script run, in the order given, as if
    /// each had been decided alone one after the other (standalone Redis).
    /// On a cluster, each request is decided on its own.
    pub async fn decide_together(
        &self,
        requests: &[&[Check]],
    ) -> Result<Vec<Vec<Decision>>, LimiterError> {
        if !self.store.settings.cluster.is_empty() {
            let mut all = Vec::with_capacity(requests.len());
            for checks in requests {
                all.push(self.decide(checks).await?);
            }
            return Ok(all);
        }
        let layers: Vec<Vec<ScriptLayer>> = requests
            .iter()
            .map(|checks| self.store.script_layers(*checks))
            .collect();
        let borrowed: Vec<&[ScriptLayer]> = layers.iter().map(Vec::as_slice).collect();
        self.store.run_standalone(&borrowed).await
    }
}

impl Store {
    fn key(&self, check: &Check) -> String {
        // By hand: `format!` with `{:032x}` cost more than the rest of the
        // request's Redis client work.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let prefix = &self.settings.key_prefix;
        let mut key = String::with_capacity(prefix.len() + check.name.len() + 36);
        key.push_str(prefix);
        key.push(':');
        key.push_str(&check.name);
        key.push_str(":{");
        let identity = check.key.identity;
        for shift in (0..32).rev() {
            key.push(char::from(HEX[((identity >> (shift * 4)) & 0xf) as usize]));
        }
        key.push('}');
        key
    }

    pub(super) fn script_layers<'a>(
        &self,
        checks: impl IntoIterator<Item = &'a Check>,
    ) -> Vec<ScriptLayer> {
        checks
            .into_iter()
            .map(|check| {
                let (algorithm, a, b) = script_params(&check.algorithm);
                ScriptLayer {
                    key: self.key(check),
                    algorithm,
                    a,
                    b,
                    cost: check.cost,
                    shadow: check.shadow,
                }
            })
            .collect()
    }

    async fn connect(&self) -> Result<Connection, LimiterError> {
        let unavailable = |e: redis::RedisError| LimiterError::Unavailable(e.to_string());
        // rediss:// needs a process-wide TLS provider; a second install
        // (another limiter, a reload) finds it there already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certificates = |ca: &Vec<u8>| redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.clone()),
        };
        if self.settings.cluster.is_empty() {
            let url = self.settings.url.as_deref().unwrap_or_default();
            let client = match &self.settings.tls_ca {
                Some(ca) => redis::Client::build_with_tls(url, certificates(ca)),
                None => redis::Client::open(url),
            }
            .map_err(unavailable)?;
            // Reconnection happens in the background; a request never waits
            // on more than one quick attempt.
            let config = ConnectionManagerConfig::new()
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(100))
                .set_connection_timeout(Some(self.settings.timeout))
                // The deadline is ours (see `decide`); a second timer per
                // call would only cost.
                .set_response_timeout(None);
            let manager = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(unavailable)?;
            Ok(Connection::Single(manager))
        } else {
            let mut builder = redis::cluster::ClusterClient::builder(self.settings.cluster.clone())
                .connection_timeout(self.settings.timeout);
            if let Some(ca) = &self.settings.tls_ca {
                builder = builder.certs(certificates(ca));
            }
            let client = builder.build().map_err(unavailable)?;
            let cluster = client.get_async_connection().await.map_err(unavailable)?;
            Ok(Connection::Cluster(cluster))
        }
    }

    fn now_arg(&self) -> i64 {
        match self.settings.clock {
            ClockSource::Redis => -1,
            ClockSource::Local => self.clock.now_us() as i64,
        }
    }

    /// One script run on the single node, within the deadline.
    pub(super) async fn run_standalone(
        &self,
        requests: &[&[ScriptLayer]],
    ) -> Result<Vec<Vec<Decision>>, LimiterError> {
        self.within_deadline(|connection| async move {
            match connection {
                Connection::Single(mut c) => self.run(&mut c, requests).await,
                Connection::Cluster(_) => Err(LimiterError::Store(
                    "a cluster connection where a single node was configured".into(),
                )),
            }
        })
        .await
    }

    /// One script run for all the requests' layers; the decisions come back
    /// per request.
    async fn run<C: ConnectionLike>(
        &self,
        connection: &mut C,
        requests: &[&[ScriptLayer]],
    ) -> Result<Vec<Vec<Decision>>, LimiterError> {
        let mut invocation = self.script.prepare_invoke();
        for layer in requests.iter().flat_map(|layers| layers.iter()) {
            invocation.key(&layer.key);
        }
        invocation.arg(self.now_arg()).arg(requests.len());
        for layers in requests {
            invocation.arg(layers.len());
            for layer in layers.iter() {
                invocation
                    .arg(layer.algorithm)
                    .arg(layer.a)
                    .arg(layer.b)
                    .arg(layer.cost)
                    .arg(u8::from(layer.shadow));
            }
        }
        let reply: Vec<u8> = invocation
            .invoke_async(connection)
            .await
            .map_err(classify)?;
        let total = requests.iter().map(|layers| layers.len()).sum();
        let mut decisions = parse_reply(&reply, total)?.into_iter();
        Ok(requests
            .iter()
            .map(|layers| decisions.by_ref().take(layers.len()).collect())
            .collect())
    }

    /// Layers keyed by one identity share a slot: one script run per group,
    /// the groups concurrently.
    async fn decide_on_cluster(
        &self,
        connection: ClusterConnection,
        checks: &[Check],
    ) -> Result<Vec<Decision>, LimiterError> {
        let mut groups: HashMap<u128, Vec<usize>> = HashMap::new();
        for (i, check) in checks.iter().enumerate() {
            groups.entry(check.key.identity).or_default().push(i);
        }
        let calls = groups.values().map(|indices| {
            let mut c = connection.clone();
            let layers = self.script_layers(indices.iter().map(|&i| &checks[i]));
            async move {
                let mut decided = self.run(&mut c, &[&layers]).await?;
                Ok::<_, LimiterError>(decided.pop().unwrap_or_default())
            }
        });
        let results = futures_util::future::join_all(calls).await;
        let mut decisions = vec![None; checks.len()];
        for (indices, result) in groups.values().zip(results) {
            for (&i, d) in indices.iter().zip(result?) {
                decisions[i] = Some(d);
            }
        }
        decisions
            .into_iter()
            .map(|d| d.ok_or_else(|| LimiterError::Store("missing decision".into())))
            .collect()
    }
}

fn script_params(algorithm: &Algorithm) -> (u8, u64, u64) {
    match *algorithm {
        Algorithm::TokenBucket {
            capacity,
            interval_us,
        } => (1, capacity, interval_us),
        Algorithm::LeakyBucket {
            capacity,
            interval_us,
        } => (2, capacity, interval_us),
        Algorithm::FixedWindow { limit, window_us } => (3, limit, window_us),
        Algorithm::SlidingWindow { limit, window_us } => (4, limit, window_us),
        Algorithm::SlidingLog { limit, window_us } => (5, limit, window_us),
    }
}

/// The script's reply: `REPLY_FIELDS` space-separated integers per layer.
fn parse_reply(reply: &[u8], layers: usize) -> Result<Vec<Decision>, LimiterError> {
    if layers == 0 {
        return Ok(Vec::new());
    }
    let values: Vec<u64> = reply
        .split(|&b| b == b' ')
        .map(|field| {
            parse_u64(field).ok_or_else(|| {
                LimiterError::Store(format!(
                    "script replied {:?}",
                    String::from_utf8_lossy(reply)
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    if values.len() != layers * REPLY_FIELDS {
        return Err(LimiterError::Store(format!(
            "script replied {} values for {layers} layers",
            values.len()
        )));
    }
    Ok(values
        .chunks_exact(REPLY_FIELDS)
        .map(|r| Decision {
            allowed: r[0] == 1,
            cost_exceeds_limit: r[1] == 1,
            limit: r[2],
            remaining: r[3],
            reset_after_us: r[4],
            retry_after_us: r[5],
            delay_us: r[6],
        })
        .collect())
}

/// A decimal integer, digits only, that fits in a u64.
fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

fn classify(e: redis::RedisError) -> LimiterError {
    if e.is_timeout() {
        LimiterError::Timeout(Duration::ZERO)
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        LimiterError::Unavailable(e.to_string())
    } else {
        LimiterError::Store(e.to_string())
    }
}

impl Store {
    /// Runs `work` on the connection (made on first use), all within the
    /// deadline.
    async fn within_deadline<T, F, Fut>(&self, work: F) -> Result<T, LimiterError>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: std::future::Future<Output = Result<T, LimiterError>>,
    {
        let deadline = self.settings.timeout;
        let run = async {
            let connection = self
                .connection
                .get_or_try_init(|| self.connect())
                .await?
                .clone();
            work(connection).await
        };
        // Pingora's timer wheel: far cheaper per call than a tokio timer.
        fast_timeout(deadline, run)
            .await
            .map_err(|_| LimiterError::Timeout(deadline))?
    }
}

impl RedisLimiter {
    /// Whether Redis can decide: runs the script (loading it where it is
    /// missing, after a restart or SCRIPT FLUSH) on a probe key, with a
    /// write, within the deadline. A Redis that answers pings but refuses
    /// writes (out of memory under `noeviction`, a read-only replica) fails
    /// the probe as it fails decisions.
    pub async fn probe(&self) -> Result<(), LimiterError> {
        let store = &self.store;
        let (algorithm, a, b) = script_params(&PROBE);
        let probe = [ScriptLayer {
            key: format!("{}:probe:{{0}}", store.settings.key_prefix),
            algorithm,
            a,
            b,
            cost: 1,
            shadow: false,
        }];
        store
            .within_deadline(|connection| async move {
                match connection {
                    Connection::Single(mut c) => store.run(&mut c, &[&probe]).await,
                    Connection::Cluster(mut c) => store.run(&mut c, &[&probe]).await,
                }
                .map(drop)
            })
            .await
    }
}

/// The probe's layer: always admits (so it always writes), and its key lives
/// a second.
const PROBE: Algorithm = Algorithm::FixedWindow {
    limit: 1 << 40,
    window_us: 1_000_000,
};

#[async_trait]
impl Limiter for RedisLimiter {
    async fn decide(&self, checks: &[Check]) -> Result<Vec<Decision>, LimiterError> {
        let store = &self.store;
        if !store.settings.cluster.is_empty() {
            return store
                .within_deadline(|connection| async move {
                    match connection {
                        Connection::Cluster(c) => store.decide_on_cluster(c, checks).await,
                        Connection::Single(_) => Err(LimiterError::Store(
                            "cluster configured, single node found".into(),
                        )),
                    }
                })
                .await;
        }
        let queue = self
            .queue
            .get_or_init(|| BatchQueue::start(self.store.clone()));
        // The request's own deadline covers the wait for a place in a run
        // as well as the run.
        fast_timeout(
            store.settings.timeout,
            queue.decide(store.script_layers(checks)),
        )
        .await
        .map_err(|_| LimiterError::Timeout(store.settings.timeout))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::policy::{OnFailure, StateKey};

    #[test]
    fn keys_are_prefix_limit_and_the_identity_as_32_hex_digits() {
        let limiter = RedisLimiter::new(
            RedisSettings {
                url: None,
                cluster: Vec::new(),
                timeout: Duration::from_millis(50),
                clock: ClockSource::Redis,
                key_prefix: "fg".into(),
                on_failure: OnFailure::Deny,
                instances: 1,
                tls_ca: None,
            },
            Arc::new(SystemClock),
        );
        for identity in [
            0,
            1,
            0xabc,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            let check = Check {
                layer: 0,
                name: Arc::from("per-ip"),
                algorithm: Algorithm::FixedWindow {
                    limit: 1,
                    window_us: 1,
                },
                key: StateKey { limit: 0, identity },
                cost: 1,
                shadow: false,
                on_failure: OnFailure::Deny,
            };
            assert_eq!(
                limiter.key(&check),
                format!("fg:per-ip:{{{identity:032x}}}")
            );
        }
    }

    #[test]
    fn replies_hold_unsigned_decimal_integers_only() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"18446744073709551616",
            b"-1",
            b"1a",
            b" 1",
            b"1.5",
        ] {
            assert_eq!(parse_u64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let decisions = parse_reply(b"1 0 10 9 100 0 0 0 0 10 0 5 7 0", 2).expect("two layers");
        assert!(decisions[0].allowed && !decisions[1].allowed);
        assert_eq!(decisions[1].retry_after_us, 7);
        assert!(parse_reply(b"1 0 10 9 100 0", 1).is_err());
        assert!(parse_reply(b"1 0 10 x 100 0 0", 1).is_err());
    }
}
