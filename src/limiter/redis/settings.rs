//! `[redis]` as the stores use it.

use std::time::Duration;

use crate::limiter::check::OnFailure;

/// Where the Redis stores read "now".
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockSource {
    /// Redis `TIME`: one clock for every instance.
    Redis,
    /// The proxy's clock, sent with each call.
    Local,
}

/// One node or a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// A `redis://` or `rediss://` URL.
    Standalone(String),
    /// The seed nodes' URLs.
    Cluster(Vec<String>),
}

/// `[redis]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisSettings {
    pub topology: Topology,
    pub timeout: Duration,
    pub clock: ClockSource,
    pub key_prefix: String,
    pub on_failure: OnFailure,
    pub instances: u64,
    /// PEM certificates to trust for rediss:// instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// Budget leased to this instance (`Leased`); none when `leases = "off"`.
    pub leases: Option<LeaseSettings>,
}

/// `[redis].leases`: how large a lease may be and how long it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Units at most in one lease (`lease_max`).
    pub max: u64,
    /// How long a lease lives at most (`lease_ttl`); never longer than a
    /// tenth of its limit's window.
    pub ttl_us: u64,
}

impl LeaseSettings {
    pub const DEFAULT_MAX: u64 = 100;
    pub const DEFAULT_TTL_US: u64 = 1_000_000;
}

impl RedisSettings {
    /// Where the store is, for logs: the URL or the seed nodes.
    pub fn target(&self) -> String {
        match &self.topology {
            Topology::Standalone(url) => url.clone(),
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
            Topology::Cluster(nodes) => nodes
                .iter()
                .map(|n| redact(n))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// A client of the node at `url`, over TLS with `tls_ca` when given.
    pub(super) fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        match self.tls_certificates() {
            Some(certificates) => redis::Client::build_with_tls(url, certificates),
            None => redis::Client::open(url),
        }
    }

    pub(super) fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        self.tls_ca.as_ref().map(|ca| redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.clone()),
        })
    }
}
