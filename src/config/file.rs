//! The file as written: serde types that mirror `proxy.toml` key for key,
//! unknown keys refused. Validation (the sibling modules) turns them into
//! runtime settings; nothing outside `config` sees them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::proxy::headers::HeaderStyle;
use floodgate_algorithm::{Kind, Parameter, ALGORITHM_NAMES};
use floodgate_limiter::{ClockSource, OnFailure};
use floodgate_policy::path::EscapedSlashes;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) server: ServerSection,
    pub(super) upstream: UpstreamSection,
    #[serde(default)]
    pub(super) memory: MemorySection,
    pub(super) redis: Option<RedisSection>,
    #[serde(default)]
    pub(super) clients: ClientsSection,
    #[serde(default)]
    pub(super) exempt: ExemptSection,
    #[serde(default)]
    pub(super) block: BlockSection,
    #[serde(default)]
    pub(super) limits: Vec<LimitSection>,
    #[serde(default)]
    pub(super) costs: Vec<CostSection>,
    #[serde(default)]
    pub(super) response: ResponseSection,
    #[serde(default)]
    pub(super) log: LogSection,
    #[serde(default)]
    pub(super) admin: AdminSection,
    pub(super) rls: Option<RlsSection>,
    pub(super) tracing: Option<TracingSection>,
}

/// `[tracing]`: OpenTelemetry spans, exported over OTLP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TracingSection {
    pub(super) endpoint: String,
    pub(super) protocol: Option<String>,
    pub(super) service_name: Option<String>,
    #[serde(default)]
    pub(super) resource: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, CollectorHeader>,
    pub(super) sample_ratio: Option<f64>,
    pub(super) max_spans_per_second: Option<i64>,
    pub(super) queue: Option<i64>,
    pub(super) batch: Option<i64>,
    pub(super) timeout: Option<String>,
    pub(super) trust_parent: Option<String>,
}

/// A header sent to the collector: its value, or `{ file = "..." }` for a
/// secret kept out of the config.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum CollectorHeader {
    Text(String),
    File { file: PathBuf },
}

/// `[rls]`: Envoy's rate limit service, served over gRPC.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RlsSection {
    pub(super) listen: String,
    #[serde(default)]
    pub(super) tls: bool,
    pub(super) max_message_bytes: Option<i64>,
    pub(super) max_connections: Option<i64>,
    pub(super) max_connections_per_ip: Option<i64>,
    pub(super) token_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdminSection {
    pub(super) token_file: Option<PathBuf>,
    pub(super) clients_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogSection {
    pub(super) access: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TlsSection {
    pub(super) listen: OneOrMany,
    pub(super) cert_file: PathBuf,
    pub(super) key_file: PathBuf,
    pub(super) http2: Option<bool>,
    #[serde(default)]
    pub(super) certs: Vec<CertSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CertSection {
    pub(super) server_names: Vec<String>,
    pub(super) cert_file: PathBuf,
    pub(super) key_file: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServerSection {
    pub(super) listen: OneOrMany,
    pub(super) admin_listen: Option<String>,
    pub(super) threads: Option<usize>,
    pub(super) grace_period: Option<String>,
    pub(super) escaped_slashes: Option<EscapedSlashesName>,
    #[serde(default)]
    pub(super) case_insensitive_paths: bool,
    pub(super) header_timeout: Option<String>,
    pub(super) keepalive_timeout: Option<String>,
    pub(super) max_connections: Option<i64>,
    pub(super) max_connections_per_ip: Option<i64>,
    #[serde(default)]
    pub(super) h2c: bool,
    pub(super) slot_body_timeout: Option<String>,
    /// The most of a request's body read before its decision, in bytes.
    pub(super) max_body: Option<i64>,
    pub(super) tls: Option<TlsSection>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum EscapedSlashesName {
    Reject,
    Keep,
    Decode,
}

impl From<EscapedSlashesName> for EscapedSlashes {
    fn from(name: EscapedSlashesName) -> Self {
        match name {
            EscapedSlashesName::Reject => EscapedSlashes::Reject,
            EscapedSlashesName::Keep => EscapedSlashes::Keep,
            EscapedSlashesName::Decode => EscapedSlashes::Decode,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum ForwardedHeaderName {
    XForwardedFor,
    Forwarded,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpstreamSection {
    pub(super) servers: Vec<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) read_timeout: Option<String>,
    #[serde(default)]
    pub(super) tls: bool,
    pub(super) sni: Option<String>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) forwarded_headers: Option<bool>,
    pub(super) request_id_header: Option<String>,
    #[serde(default)]
    pub(super) preserve_header_case: bool,
    pub(super) host: Option<String>,
    #[serde(default)]
    pub(super) http2: bool,
    pub(super) websocket_idle_timeout: Option<String>,
    #[serde(default)]
    pub(super) strip_headers: Vec<String>,
    #[serde(default)]
    pub(super) keep_headers: Vec<String>,
    #[serde(default)]
    pub(super) grpc_paths: Vec<String>,
    pub(super) protection: Option<ProtectionSection>,
}

/// `[upstream.protection]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProtectionSection {
    pub(super) min: Option<i64>,
    pub(super) max: Option<i64>,
    pub(super) initial: Option<i64>,
    pub(super) latency_tolerance: Option<f64>,
    pub(super) window: Option<String>,
    pub(super) probe_interval: Option<String>,
    #[serde(default)]
    pub(super) priority: Vec<PriorityEntry>,
    pub(super) reserve: Option<f64>,
    pub(super) retry_after: Option<String>,
    pub(super) queue: Option<QueueSection>,
}

/// A class of `[upstream.protection].priority`: a tier, or the requests a
/// match takes (`{ name = "checkout", match = { paths = ["/checkout/*"] } }`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum PriorityEntry {
    Tier(String),
    Match {
        name: String,
        #[serde(rename = "match")]
        matcher: MatchSection,
    },
}

/// `queue = { max = 64, timeout = "250ms" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct QueueSection {
    pub(super) max: i64,
    pub(super) timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MemorySection {
    pub(super) max_keys: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RedisSection {
    pub(super) url: Option<String>,
    pub(super) cluster: Option<Vec<String>>,
    pub(super) sentinel: Option<SentinelSection>,
    pub(super) timeout: Option<String>,
    pub(super) clock: Option<ClockSource>,
    pub(super) key_prefix: Option<String>,
    pub(super) on_failure: Option<FailureMode>,
    pub(super) instances: Option<InstancesName>,
    pub(super) tls_ca_file: Option<PathBuf>,
    pub(super) leases: Option<LeasesMode>,
    pub(super) lease_max: Option<u64>,
    pub(super) lease_ttl: Option<String>,
}

/// `[redis].sentinel`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SentinelSection {
    pub(super) master: String,
    pub(super) nodes: Vec<String>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) sentinel_password_file: Option<PathBuf>,
    pub(super) tls: Option<bool>,
}

/// `[redis].instances`: a number, or "auto".
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum InstancesName {
    Count(i64),
    Word(String),
}

/// `[redis].leases` and a limit's `leases`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum LeasesMode {
    Auto,
    Off,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum FailureMode {
    Local,
    Allow,
    Deny,
}

impl From<FailureMode> for OnFailure {
    fn from(m: FailureMode) -> Self {
        match m {
            FailureMode::Local => OnFailure::Local,
            FailureMode::Allow => OnFailure::Allow,
            FailureMode::Deny => OnFailure::Deny,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClientsSection {
    pub(super) api_key_header: Option<String>,
    #[serde(default)]
    pub(super) trusted_proxies: Vec<String>,
    pub(super) ipv6_prefix: Option<i64>,
    #[serde(default)]
    pub(super) internal: Vec<String>,
    #[serde(default)]
    pub(super) api_keys: BTreeMap<String, String>,
    pub(super) forwarded_header: Option<ForwardedHeaderName>,
    pub(super) identity_secret_file: Option<PathBuf>,
    /// Tiers no listed key names, for keys set at run time.
    #[serde(default)]
    pub(super) tiers: Vec<String>,
    pub(super) jwt: Option<JwtSection>,
}

/// `[clients.jwt]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JwtSection {
    pub(super) header: Option<String>,
    pub(super) jwks_file: Option<PathBuf>,
    pub(super) public_key_file: Option<PathBuf>,
    pub(super) algorithms: Vec<String>,
    pub(super) issuer: Option<String>,
    pub(super) audience: Option<String>,
    pub(super) leeway: Option<String>,
    pub(super) tier_claim: Option<String>,
    #[serde(default)]
    pub(super) tiers: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BlockSection {
    #[serde(default)]
    pub(super) cidrs: Vec<String>,
    #[serde(default)]
    pub(super) api_keys: Vec<String>,
    #[serde(default)]
    pub(super) jwt_subjects: Vec<String>,
    pub(super) status: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExemptSection {
    #[serde(default)]
    pub(super) paths: Vec<String>,
    #[serde(default)]
    pub(super) tiers: Vec<String>,
}

/// `algorithm = "..."`, looked up in the algorithm table.
#[derive(Debug, Clone, Copy)]
pub(super) enum AlgorithmName {
    /// A row of the algorithm table.
    Rate(Kind),
    /// Requests in flight.
    Concurrency,
}

/// Every `algorithm` a limit may name.
const LIMIT_ALGORITHMS: [&str; ALGORITHM_NAMES.len() + 1] = {
    let mut names = [CONCURRENCY; ALGORITHM_NAMES.len() + 1];
    let mut i = 0;
    while i < ALGORITHM_NAMES.len() {
        names[i] = ALGORITHM_NAMES[i];
        i += 1;
    }
    names
};

pub(super) const CONCURRENCY: &str = "concurrency";

impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        if name == CONCURRENCY {
            return Ok(AlgorithmName::Concurrency);
        }
        Kind::from_name(&name)
            .map(AlgorithmName::Rate)
            .ok_or_else(|| serde::de::Error::unknown_variant(&name, &LIMIT_ALGORITHMS))
    }
}

/// `on_missing` of a limit.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum OnMissingName {
    Skip,
    Deny,
    Ip,
}

/// `upgrades` of a concurrency limit.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum UpgradesName {
    Include,
    Exclude,
}

/// The numbers of a limit; shared by the limit and its tier overrides.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Numbers {
    pub(super) capacity: Option<f64>,
    pub(super) refill_rate: Option<f64>,
    pub(super) limit: Option<f64>,
    pub(super) window: Option<String>,
    pub(super) rate: Option<f64>,
    /// Calendar quota: "day", "week" or "month".
    pub(super) period: Option<String>,
    /// Concurrency: requests in flight per key.
    pub(super) max: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitSection {
    pub(super) name: String,
    pub(super) key: OneOrMany,
    pub(super) algorithm: AlgorithmName,
    pub(super) capacity: Option<f64>,
    pub(super) refill_rate: Option<f64>,
    pub(super) limit: Option<f64>,
    pub(super) window: Option<String>,
    pub(super) rate: Option<f64>,
    pub(super) period: Option<String>,
    pub(super) timezone: Option<String>,
    pub(super) week_starts: Option<String>,
    pub(super) max: Option<f64>,
    pub(super) lease: Option<String>,
    pub(super) upgrades: Option<UpgradesName>,
    pub(super) count: Option<CountSection>,
    pub(super) cost_from_response: Option<ResponseCostSection>,
    pub(super) ban: Option<BanSection>,
    #[serde(default)]
    pub(super) ban_on_client_keys: bool,
    #[serde(default)]
    pub(super) case_insensitive_values: bool,
    pub(super) on_missing: Option<OnMissingName>,
    pub(super) on_failure: Option<FailureMode>,
    pub(super) leases: Option<LeasesMode>,
    #[serde(default)]
    pub(super) shadow: bool,
    #[serde(rename = "match")]
    pub(super) matcher: Option<MatchSection>,
    #[serde(default)]
    pub(super) tiers: BTreeMap<String, Numbers>,
}

impl Numbers {
    pub(super) fn number(&self, parameter: Parameter) -> Option<f64> {
        match parameter {
            Parameter::Capacity => self.capacity,
            Parameter::Limit => self.limit,
            Parameter::RefillRate => self.refill_rate,
            Parameter::Rate => self.rate,
            Parameter::Window | Parameter::Period => None,
        }
    }

    pub(super) fn has(&self, parameter: Parameter) -> bool {
        match parameter {
            Parameter::Window => self.window.is_some(),
            Parameter::Period => self.period.is_some(),
            number => self.number(number).is_some(),
        }
    }
}

impl LimitSection {
    pub(super) fn numbers(&self) -> Numbers {
        Numbers {
            capacity: self.capacity,
            refill_rate: self.refill_rate,
            limit: self.limit,
            window: self.window.clone(),
            rate: self.rate,
            period: self.period.clone(),
            max: self.max,
        }
    }
}

/// `count = { statuses = [401, "5xx"] }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CountSection {
    pub(super) statuses: Vec<StatusName>,
}

/// `cost_from_response = { header = "X-Tokens-Used", max = 100000 }`, or
/// `{ usage = "openai", max = 100000 }` with `prompt_weight` and
/// `completion_weight`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResponseCostSection {
    pub(super) header: Option<String>,
    pub(super) usage: Option<String>,
    pub(super) prompt_weight: Option<i64>,
    pub(super) completion_weight: Option<i64>,
    pub(super) max: i64,
    pub(super) default: Option<i64>,
    pub(super) reserve: Option<ReserveSpec>,
    #[serde(default)]
    pub(super) include_usage: bool,
    #[serde(default)]
    pub(super) expose: bool,
}

/// `reserve = 500`, or `reserve = "request"`: the request's own worst case.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ReserveSpec {
    Units(i64),
    Named(String),
}

/// `ban = { after = 3, within = "10m", duration = "1h" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BanSection {
    pub(super) after: i64,
    pub(super) within: String,
    pub(super) duration: String,
}

/// A status code, or a class of them ("4xx").
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum StatusName {
    Code(i64),
    Class(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MatchSection {
    #[serde(default)]
    pub(super) methods: Vec<String>,
    #[serde(default)]
    pub(super) paths: Vec<String>,
    #[serde(default)]
    pub(super) hosts: Vec<String>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
    /// A limit of the rate limit service: the domain Envoy names.
    pub(super) domain: Option<String>,
    /// And the descriptor's entries: `[key]` or `[key, value]` each.
    #[serde(default)]
    pub(super) descriptors: Vec<Vec<String>>,
    /// Top-level fields of a JSON body: a pattern or a list of them each.
    #[serde(default)]
    pub(super) body: BTreeMap<String, OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CostSection {
    #[serde(rename = "match")]
    pub(super) matcher: MatchSection,
    pub(super) cost: i64,
    /// The limits this cost applies to; all when empty.
    #[serde(default)]
    pub(super) limits: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResponseSection {
    pub(super) headers: Option<HeaderStyle>,
}
