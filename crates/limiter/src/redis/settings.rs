//! `[redis]` as the stores use it.

use std::time::Duration;

use crate::check::OnFailure;
use crate::leases::LeaseSettings;

/// Where the Redis stores read "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockSource {
    /// Redis `TIME`: one clock for every instance.
    Redis,
    /// The proxy's clock, sent with each call.
    Local,
}

/// How long connecting to one node may take, at least: the decision
/// deadline is for calls, not for handshakes (a TLS handshake and the
/// client's setup are three round trips; 500 ms allows for 160 ms ones).
const NODE_CONNECT_AT_LEAST: Duration = Duration::from_millis(500);

/// One node, the master sentinels name, or a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// A `redis://` or `rediss://` URL.
    Standalone(String),
    /// Whichever node the sentinels name master, followed through failovers.
    Sentinel(SentinelSettings),
    /// The seed nodes' URLs.
    Cluster(Vec<String>),
}

/// `[redis].sentinel`.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// The name the sentinels monitor the master by.
    pub master: String,
    /// Each sentinel's `host:port`.
    pub nodes: Vec<String>,
    /// The master's password (`password_file`); its replicas share it.
    pub password: Option<String>,
    /// The sentinels' own password (`sentinel_password_file`): their
    /// `requirepass`, which is not the master's.
    pub sentinel_password: Option<String>,
    /// The sentinels and the masters they name speak TLS only (`tls`),
    /// checked against `[redis].tls_ca_file` or the system's roots.
    pub tls: bool,
}

impl std::fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelSettings")
            .field("master", &self.master)
            .field("nodes", &self.nodes)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .field("tls", &self.tls)
            .finish()
    }
}

/// `[redis].instances`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceCount {
    /// As many as the operator says.
    Fixed(u64),
    /// As many as announce themselves in Redis (`roster`).
    Auto,
}

impl InstanceCount {
    /// What config-time checks assume: with "auto", this instance alone
    /// (the count is not known before the instances announce themselves).
    pub fn assumed(self) -> u64 {
        match self {
            InstanceCount::Fixed(n) => n,
            InstanceCount::Auto => 1,
        }
    }
}

impl std::fmt::Display for InstanceCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstanceCount::Fixed(n) => write!(f, "{n} instance(s)"),
            InstanceCount::Auto => f.write_str("instances counted live (auto)"),
        }
    }
}

/// `[redis]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisSettings {
    /// Where Redis is: one node (`url`), a master the sentinels name, or a
    /// cluster.
    pub topology: Topology,
    /// A call's deadline (`timeout`): slower counts as a failure, and the
    /// request is decided as `on_failure` says.
    pub timeout: Duration,
    /// Whose "now" the scripts decide at (`clock`).
    pub clock: ClockSource,
    /// What every key written begins with (`key_prefix`, `"floodgate"`).
    pub key_prefix: String,
    /// What decides a limit that names no `on_failure` of its own while
    /// Redis is away.
    pub on_failure: OnFailure,
    /// How many proxies share the budget: the fallback's share and the
    /// lease size follow it.
    pub instances: InstanceCount,
    /// PEM certificates to trust for rediss:// instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// Budget leased to this instance (`Leased`); none when `leases = "off"`.
    pub leases: Option<LeaseSettings>,
}

impl RedisSettings {
    /// Where the store is, for logs: the URL or the seed nodes.
    pub fn target(&self) -> String {
        match &self.topology {
            Topology::Standalone(url) => url.clone(),
            Topology::Sentinel(sentinel) => sentinel_target(sentinel),
            Topology::Cluster(nodes) => nodes.join(", "),
        }
    }

    /// `target` with any password hidden: what logs and pages may show.
    pub fn redacted_target(&self) -> String {
        let redact = |url: &str| match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}://***{}", &url[..scheme], &url[at..])
            }
            _ => url.to_string(),
        };
        match &self.topology {
            Topology::Standalone(url) => redact(url),
            // The password is in a file of its own, never in the target.
            Topology::Sentinel(sentinel) => sentinel_target(sentinel),
            Topology::Cluster(nodes) => nodes
                .iter()
                .map(|n| redact(n))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// A client of the node at `url`, over TLS with `tls_ca` when given.
    pub(super) fn client(
        &self,
        url: impl redis::IntoConnectionInfo,
    ) -> redis::RedisResult<redis::Client> {
        match self.tls_certificates() {
            Some(certificates) => redis::Client::build_with_tls(url, certificates),
            None => redis::Client::open(url),
        }
    }

    /// How a node's connection reconnects: in the background, a request
    /// never waiting on more than one quick attempt.
    pub(super) fn manager_config(&self) -> redis::aio::ConnectionManagerConfig {
        redis::aio::ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100))
            // Connecting is off the request path (`SharedConnection`): a
            // Redis a TLS handshake and AUTH farther than a decision's
            // deadline is still connected to.
            .set_connection_timeout(Some(self.node_connect_within()))
            // The deadline is ours (see `within_deadline`); a second timer
            // per call would only cost.
            .set_response_timeout(None)
    }

    /// How long connecting to one node may take.
    pub(super) fn node_connect_within(&self) -> Duration {
        self.timeout.max(NODE_CONNECT_AT_LEAST)
    }

    pub(super) fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        self.tls_ca.as_ref().map(|ca| redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.clone()),
        })
    }
}

fn sentinel_target(sentinel: &SentinelSettings) -> String {
    format!(
        "master \"{}\" of sentinels {}{}",
        sentinel.master,
        sentinel.nodes.join(", "),
        if sentinel.tls { " (TLS)" } else { "" }
    )
}
