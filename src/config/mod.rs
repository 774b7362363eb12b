//! `proxy.toml`: the file format (serde types that mirror it, unknown keys
//! refused) and `validate()`, which turns it into runtime settings in which
//! bad values cannot exist. Every error names the file, the line and the key.

mod duration;
mod source;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use ipnet::IpNet;
use serde::Deserialize;

use crate::access_log::AccessLogTarget;
use crate::algorithm::{Algorithm, Kind, Parameter, ALGORITHM_NAMES, MAX_EXACT};
use crate::headers::HeaderStyle;
use crate::identity::{
    ClientRules, ForwardedHeader, IdentityHasher, IdentityKeySource, Tiers, ANONYMOUS, INTERNAL,
};
use crate::limiter::redis::Topology;
use crate::limiter::{ClockSource, LimitName, OnFailure, RedisSettings};
use crate::path::{EscapedSlashes, PathRules};
use crate::policy::{CostRule, KeySource, Limit, Matcher, PathPattern, Policy};
use crate::server::ServerSettings;
use crate::tls::{CertSet, CertSource, TlsListeners};
use crate::upstream::UpstreamSettings;
use source::Segment;

pub use source::render_path;

/// A configuration that cannot be used, and where it goes wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    /// Dotted key path, e.g. `limits[2].refill_rate`; empty for the whole file.
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

// ---------------------------------------------------------------------------
// The file as written.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    server: ServerSection,
    upstream: UpstreamSection,
    #[serde(default)]
    memory: MemorySection,
    redis: Option<RedisSection>,
    #[serde(default)]
    clients: ClientsSection,
    #[serde(default)]
    exempt: ExemptSection,
    #[serde(default)]
    limits: Vec<LimitSection>,
    #[serde(default)]
    costs: Vec<CostSection>,
    #[serde(default)]
    response: ResponseSection,
    #[serde(default)]
    log: LogSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogSection {
    access: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsSection {
    listen: OneOrMany,
    cert_file: PathBuf,
    key_file: PathBuf,
    http2: Option<bool>,
    #[serde(default)]
    certs: Vec<CertSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CertSection {
    server_names: Vec<String>,
    cert_file: PathBuf,
    key_file: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerSection {
    listen: OneOrMany,
    admin_listen: Option<String>,
    threads: Option<usize>,
    grace_period: Option<String>,
    escaped_slashes: Option<EscapedSlashesName>,
    #[serde(default)]
    case_insensitive_paths: bool,
    header_timeout: Option<String>,
    keepalive_timeout: Option<String>,
    max_connections: Option<i64>,
    max_connections_per_ip: Option<i64>,
    #[serde(default)]
    h2c: bool,
    tls: Option<TlsSection>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum EscapedSlashesName {
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
enum ForwardedHeaderName {
    XForwardedFor,
    Forwarded,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamSection {
    servers: Vec<String>,
    connect_timeout: Option<String>,
    read_timeout: Option<String>,
    #[serde(default)]
    tls: bool,
    sni: Option<String>,
    ca_file: Option<PathBuf>,
    forwarded_headers: Option<bool>,
    request_id_header: Option<String>,
    host: Option<String>,
    #[serde(default)]
    http2: bool,
    websocket_idle_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemorySection {
    max_keys: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedisSection {
    url: Option<String>,
    cluster: Option<Vec<String>>,
    timeout: Option<String>,
    clock: Option<ClockSource>,
    key_prefix: Option<String>,
    on_failure: Option<FailureMode>,
    instances: Option<u64>,
    tls_ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FailureMode {
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
struct ClientsSection {
    api_key_header: Option<String>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    ipv6_prefix: Option<i64>,
    #[serde(default)]
    internal: Vec<String>,
    #[serde(default)]
    api_keys: BTreeMap<String, String>,
    forwarded_header: Option<ForwardedHeaderName>,
    identity_secret_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExemptSection {
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    tiers: Vec<String>,
}

/// `algorithm = "..."`, looked up in the algorithm table.
#[derive(Debug, Clone, Copy)]
struct AlgorithmName(Kind);

impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Kind::from_name(&name)
            .map(AlgorithmName)
            .ok_or_else(|| serde::de::Error::unknown_variant(&name, &ALGORITHM_NAMES))
    }
}

/// The numbers of a limit; shared by the limit and its tier overrides.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Numbers {
    capacity: Option<f64>,
    refill_rate: Option<f64>,
    limit: Option<f64>,
    window: Option<String>,
    rate: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitSection {
    name: String,
    key: String,
    algorithm: AlgorithmName,
    capacity: Option<f64>,
    refill_rate: Option<f64>,
    limit: Option<f64>,
    window: Option<String>,
    rate: Option<f64>,
    on_failure: Option<FailureMode>,
    #[serde(default)]
    shadow: bool,
    #[serde(rename = "match")]
    matcher: Option<MatchSection>,
    #[serde(default)]
    tiers: BTreeMap<String, Numbers>,
}

impl Numbers {
    fn number(&self, parameter: Parameter) -> Option<f64> {
        match parameter {
            Parameter::Capacity => self.capacity,
            Parameter::Limit => self.limit,
            Parameter::RefillRate => self.refill_rate,
            Parameter::Rate => self.rate,
            Parameter::Window => None,
        }
    }

    fn has(&self, parameter: Parameter) -> bool {
        match parameter {
            Parameter::Window => self.window.is_some(),
            number => self.number(number).is_some(),
        }
    }
}

impl LimitSection {
    fn numbers(&self) -> Numbers {
        Numbers {
            capacity: self.capacity,
            refill_rate: self.refill_rate,
            limit: self.limit,
            window: self.window.clone(),
            rate: self.rate,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MatchSection {
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CostSection {
    #[serde(rename = "match")]
    matcher: MatchSection,
    cost: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseSection {
    headers: Option<HeaderStyle>,
}

// ---------------------------------------------------------------------------
// The validated configuration.

/// What the environment says (read once, at the edge, by `parse`).
struct Environment {
    redis_url: Option<String>,
    identity_secret: Option<String>,
}

/// The smallest secret accepted: 128 bits of a random hex or base64 string.
const MIN_SECRET_BYTES: usize = 16;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub file: PathBuf,
    /// Where the identity-hashing key came from (`floodgate check` warns
    /// about a Redis store without a shared secret).
    pub identity_key: IdentityKeySource,
    pub server: ServerSettings,
    pub upstream: UpstreamSettings,
    pub max_keys: usize,
    pub redis: Option<RedisSettings>,
    pub policy: Arc<Policy>,
    pub headers: HeaderStyle,
    pub tls: Option<TlsListeners>,
    pub access_log: AccessLogTarget,
}

impl Config {
    /// The sections a running process cannot swap (listeners, threads, the
    /// stores) that differ in `newer`.
    pub fn restart_only_changes(&self, newer: &Config) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.server != newer.server {
            changed.push("[server]");
        }
        if self.redis != newer.redis {
            changed.push("[redis]");
        }
        if self.max_keys != newer.max_keys {
            changed.push("[memory]");
        }
        if self.upstream.ca_file != newer.upstream.ca_file {
            changed.push("[upstream].ca_file");
        }
        if self.access_log != newer.access_log {
            changed.push("[log].access");
        }
        let tls_listeners = |c: &Config| c.tls.as_ref().map(|t| (t.listen.clone(), t.http2));
        if tls_listeners(self) != tls_listeners(newer) {
            changed.push("[server.tls] listen/http2");
        }
        changed
    }

    /// Reads and validates a file.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
            file: file.to_path_buf(),
            line: None,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(file, &text)
    }

    /// Validates `text` as if read from `file`.
    pub fn parse(file: &Path, text: &str) -> Result<Config, ConfigError> {
        let raw: FileConfig = toml::from_str(text).map_err(|e| {
            let mut path = e
                .span()
                .map(|span| source::path_at(text, span))
                .unwrap_or_default();
            let message = plain_types(e.message().trim());
            // A missing key has no line of its own: name it under its table.
            if let Some(missing) = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
            {
                let whole_file = e
                    .span()
                    .is_none_or(|s| s.start == 0 && (s.end == 0 || s.end >= text.trim_end().len()));
                if whole_file {
                    path.clear();
                }
                path.push(Segment::Key(missing.to_string()));
                let line = (!whole_file)
                    .then(|| e.span().map(|s| source::line_of(text, s.start)))
                    .flatten();
                return ConfigError {
                    file: file.to_path_buf(),
                    line,
                    key: render_path(&path),
                    message: "is required".into(),
                };
            }
            ConfigError {
                file: file.to_path_buf(),
                line: e.span().map(|s| source::line_of(text, s.start)),
                key: render_path(&path),
                message,
            }
        })?;
        let env = Environment {
            redis_url: std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()),
            identity_secret: std::env::var("FLOODGATE_IDENTITY_SECRET")
                .ok()
                .filter(|s| !s.is_empty()),
        };
        validate(raw, env).map_err(|(path, message)| ConfigError {
            file: file.to_path_buf(),
            line: source::line_of_path(text, &path),
            key: render_path(&path),
            message,
        })
    }
}

/// serde names Rust types; users wrote TOML.
fn plain_types(message: &str) -> String {
    message
        .replace("expected f64", "expected a number")
        .replace("expected u64", "expected a whole number")
        .replace("expected i64", "expected a whole number")
        .replace("expected usize", "expected a whole number")
        .replace("expected a boolean", "expected true or false")
}

// ---------------------------------------------------------------------------
// Validation. Errors carry the key path; `Config::parse` adds file and line.

type Invalid = (Vec<Segment>, String);

fn at(path: &[&dyn AsSegment], message: impl Into<String>) -> Invalid {
    (path.iter().map(|p| p.segment()).collect(), message.into())
}

trait AsSegment {
    fn segment(&self) -> Segment;
}

impl AsSegment for &str {
    fn segment(&self) -> Segment {
        Segment::Key(self.to_string())
    }
}

impl AsSegment for String {
    fn segment(&self) -> Segment {
        Segment::Key(self.clone())
    }
}

impl AsSegment for usize {
    fn segment(&self) -> Segment {
        Segment::Index(*self)
    }
}

const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// Long enough for a phone on a bad link to send a head, short enough that a
/// slow-header client holds a connection for seconds, not minutes.
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// What browsers and most load balancers keep idle connections for.
const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// A browser opens about 6 connections per host; a NAT of a few dozen users
/// fits; one address cannot take the fd table.
const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 256;
const DEFAULT_MAX_KEYS: u64 = 1_000_000;

fn validate(raw: FileConfig, env: Environment) -> Result<Config, Invalid> {
    let server = validate_server(&raw.server)?;
    let upstream = validate_upstream(&raw.upstream)?;
    let max_keys = raw.memory.max_keys.unwrap_or(DEFAULT_MAX_KEYS);
    if max_keys == 0 {
        return Err(at(&[&"memory", &"max_keys"], "must be at least 1"));
    }
    let redis = raw
        .redis
        .as_ref()
        .map(|r| validate_redis(r, env.redis_url))
        .transpose()?;
    let default_on_failure = redis.as_ref().map_or(OnFailure::Local, |r| r.on_failure);
    let (hasher, identity_key) =
        identity_hasher(&raw.clients, env.identity_secret, redis.is_some())?;
    let clients = validate_clients(&raw.clients, hasher)?;
    let paths = PathRules {
        escaped_slashes: raw
            .server
            .escaped_slashes
            .map_or_else(Default::default, Into::into),
        case_insensitive: raw.server.case_insensitive_paths,
    };
    // Case-insensitive matching compares lower-cased paths with lower-cased patterns.
    let compile_pattern = |p: &str| {
        if paths.case_insensitive {
            path_pattern(&p.to_ascii_lowercase())
        } else {
            path_pattern(p)
        }
    };
    let known_tiers = &clients.tiers;

    let mut exempt_tiers = Vec::new();
    for (i, tier) in raw.exempt.tiers.iter().enumerate() {
        let Some(tier) = known_tiers.get(tier) else {
            return Err(at(
                &[&"exempt", &"tiers", &i],
                format!("unknown tier \"{tier}\" (known: {})", sorted(known_tiers)),
            ));
        };
        exempt_tiers.push(tier);
    }
    let exempt_paths = raw
        .exempt
        .paths
        .iter()
        .enumerate()
        .map(|(i, p)| compile_pattern(p).map_err(|m| at(&[&"exempt", &"paths", &i], m)))
        .collect::<Result<_, _>>()?;

    let mut limits = Vec::new();
    let mut names = HashSet::new();
    for (i, section) in raw.limits.iter().enumerate() {
        let limit = validate_limit(i, section, known_tiers, &compile_pattern)?;
        if !names.insert(limit.name.clone()) {
            return Err(at(
                &[&"limits", &i, &"name"],
                format!("duplicate limit name \"{}\"", limit.name),
            ));
        }
        limits.push(limit);
    }

    let mut costs = Vec::new();
    for (i, c) in raw.costs.iter().enumerate() {
        if c.cost < 0 || c.cost as u64 > MAX_EXACT {
            return Err(at(
                &[&"costs", &i, &"cost"],
                "must be a whole number from 0 (a free request) upwards",
            ));
        }
        costs.push(CostRule {
            matcher: validate_match(&c.matcher, &[&"costs", &i, &"match"], &compile_pattern)?,
            cost: c.cost as u64,
        });
    }

    Ok(Config {
        file: PathBuf::new(),
        identity_key,
        server,
        upstream,
        max_keys: usize::try_from(max_keys).unwrap_or(usize::MAX),
        redis,
        policy: Arc::new(Policy {
            clients,
            paths,
            exempt_paths,
            exempt_tiers,
            limits,
            costs,
            default_on_failure,
        }),
        headers: raw.response.headers.unwrap_or(HeaderStyle::Both),
        tls: raw.server.tls.as_ref().map(validate_tls).transpose()?,
        access_log: match raw.log.access.as_deref() {
            None | Some("off") => AccessLogTarget::Off,
            Some("stdout") => AccessLogTarget::Stdout,
            Some("") => {
                return Err(at(
                    &[&"log", &"access"],
                    "\"off\", \"stdout\" or a file path",
                ))
            }
            Some(path) => AccessLogTarget::File(PathBuf::from(path)),
        },
    })
}

fn sorted(tiers: &Tiers) -> String {
    let mut v: Vec<&str> = tiers.names().collect();
    v.sort_unstable();
    v.join(", ")
}

fn duration(
    value: &Option<String>,
    default: Duration,
    path: &[&dyn AsSegment],
) -> Result<Duration, Invalid> {
    match value {
        None => Ok(default),
        Some(text) => duration::parse(text).map_err(|m| at(path, m)),
    }
}

fn socket_addr(text: &str, path: &[&dyn AsSegment]) -> Result<SocketAddr, Invalid> {
    text.parse().map_err(|_| {
        at(
            path,
            format!("\"{text}\" is not an address like \"0.0.0.0:8080\" or \"[::]:8080\""),
        )
    })
}

fn validate_server(s: &ServerSection) -> Result<ServerSettings, Invalid> {
    let listen = match &s.listen {
        OneOrMany::One(a) => vec![socket_addr(a, &[&"server", &"listen"])?],
        OneOrMany::Many(list) => {
            if list.is_empty() {
                return Err(at(&[&"server", &"listen"], "needs at least one address"));
            }
            list.iter()
                .enumerate()
                .map(|(i, a)| socket_addr(a, &[&"server", &"listen", &i]))
                .collect::<Result<_, _>>()?
        }
    };
    let admin_listen = s
        .admin_listen
        .as_deref()
        .map(|a| socket_addr(a, &[&"server", &"admin_listen"]))
        .transpose()?;
    // One worker thread per core unless told otherwise: the proxy is usually
    // the machine's main job.
    let threads = s
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 || threads > 1024 {
        return Err(at(&[&"server", &"threads"], "must be from 1 to 1024"));
    }
    let positive = |value: Option<String>, default: Duration, key: &'static str| {
        let d = duration(&value, default, &[&"server", &key])?;
        if d.is_zero() {
            return Err(at(&[&"server", &key], "must be longer than 0"));
        }
        Ok(d)
    };
    let count = |value: Option<i64>, key: &'static str| -> Result<Option<usize>, Invalid> {
        value
            .map(|n| {
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| at(&[&"server", &key], "must be a whole number of at least 1"))
            })
            .transpose()
    };
    Ok(ServerSettings {
        listen,
        admin_listen,
        threads,
        grace_period: duration(
            &s.grace_period,
            DEFAULT_GRACE,
            &[&"server", &"grace_period"],
        )?,
        header_timeout: positive(
            s.header_timeout.clone(),
            DEFAULT_HEADER_TIMEOUT,
            "header_timeout",
        )?,
        keepalive_timeout: positive(
            s.keepalive_timeout.clone(),
            DEFAULT_KEEPALIVE_TIMEOUT,
            "keepalive_timeout",
        )?,
        max_connections: count(s.max_connections, "max_connections")?,
        max_connections_per_ip: count(s.max_connections_per_ip, "max_connections_per_ip")?
            .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_IP),
        h2c: s.h2c,
    })
}

fn validate_tls(t: &TlsSection) -> Result<TlsListeners, Invalid> {
    let listen = match &t.listen {
        OneOrMany::One(a) => vec![socket_addr(a, &[&"server", &"tls", &"listen"])?],
        OneOrMany::Many(list) => list
            .iter()
            .enumerate()
            .map(|(i, a)| socket_addr(a, &[&"server", &"tls", &"listen", &i]))
            .collect::<Result<_, _>>()?,
    };
    let default = CertSource {
        server_names: Vec::new(),
        cert_file: t.cert_file.clone(),
        key_file: t.key_file.clone(),
    };
    let mut others = Vec::new();
    for (i, c) in t.certs.iter().enumerate() {
        if c.server_names.is_empty() {
            return Err(at(
                &[&"server", &"tls", &"certs", &i, &"server_names"],
                "needs at least one name, e.g. [\"api.example.org\", \"*.example.org\"]",
            ));
        }
        others.push(CertSource {
            server_names: c.server_names.clone(),
            cert_file: c.cert_file.clone(),
            key_file: c.key_file.clone(),
        });
    }
    // Which entry failed, for the error's key.
    CertSet::load(&default, &[])
        .map_err(|e| at(&[&"server", &"tls", &"cert_file"], e.to_string()))?;
    for (i, source) in others.iter().enumerate() {
        CertSet::load(source, &[]).map_err(|e| {
            at(
                &[&"server", &"tls", &"certs", &i, &"cert_file"],
                e.to_string(),
            )
        })?;
    }
    let certs = CertSet::load(&default, &others)
        .map_err(|e| at(&[&"server", &"tls", &"cert_file"], e.to_string()))?;
    let mut sources = vec![default];
    sources.extend(others);
    Ok(TlsListeners {
        listen,
        http2: t.http2.unwrap_or(true),
        sources,
        certs: Arc::new(certs),
    })
}

fn validate_upstream(u: &UpstreamSection) -> Result<UpstreamSettings, Invalid> {
    if u.servers.is_empty() {
        return Err(at(&[&"upstream", &"servers"], "needs at least one server"));
    }
    for (i, s) in u.servers.iter().enumerate() {
        let port_ok = s
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(at(
                &[&"upstream", &"servers", &i],
                format!("\"{s}\" is not host:port (e.g. \"127.0.0.1:8000\")"),
            ));
        }
    }
    let connect_timeout = duration(
        &u.connect_timeout,
        Duration::from_secs(1),
        &[&"upstream", &"connect_timeout"],
    )?;
    let read_timeout = duration(
        &u.read_timeout,
        Duration::from_secs(30),
        &[&"upstream", &"read_timeout"],
    )?;
    for (key, d) in [
        ("connect_timeout", connect_timeout),
        ("read_timeout", read_timeout),
    ] {
        if d.is_zero() {
            return Err(at(&[&"upstream", &key], "must be longer than 0"));
        }
    }
    let sni = match &u.sni {
        Some(s) => s.clone(),
        None => u.servers[0]
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
            .unwrap_or_default(),
    };
    if let Some(file) = &u.ca_file {
        if !u.tls {
            return Err(at(
                &[&"upstream", &"ca_file"],
                "applies only with tls = true",
            ));
        }
        if let Err(e) = std::fs::metadata(file) {
            return Err(at(
                &[&"upstream", &"ca_file"],
                format!("cannot read {}: {e}", file.display()),
            ));
        }
    }
    let header_name = |text: &str, key: &'static str| {
        HeaderName::from_bytes(text.as_bytes()).map_err(|_| {
            at(
                &[&"upstream", &key],
                format!("\"{text}\" is not a valid header name"),
            )
        })
    };
    let request_id_header_spelling = u
        .request_id_header
        .clone()
        .unwrap_or_else(|| "X-Request-Id".into());
    let request_id_header = header_name(&request_id_header_spelling, "request_id_header")?;
    // Headers that frame the request or say who the client is cannot carry an id.
    const RESERVED: [&str; 9] = [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "upgrade",
        "te",
        "x-forwarded-for",
        "x-real-ip",
        "forwarded",
    ];
    if RESERVED.contains(&request_id_header.as_str()) {
        return Err(at(
            &[&"upstream", &"request_id_header"],
            format!("\"{request_id_header_spelling}\" already means something else; name a header of its own, e.g. \"X-Request-Id\""),
        ));
    }
    let host = u
        .host
        .as_deref()
        .map(|h| {
            http::HeaderValue::from_str(h)
                .ok()
                .filter(|_| !h.is_empty() && !h.contains(char::is_whitespace))
                .ok_or_else(|| at(&[&"upstream", &"host"], format!("\"{h}\" is not a host")))
        })
        .transpose()?;
    let websocket_idle_timeout = duration(
        &u.websocket_idle_timeout,
        Duration::from_secs(3600),
        &[&"upstream", &"websocket_idle_timeout"],
    )?;
    Ok(UpstreamSettings {
        servers: u.servers.clone(),
        connect_timeout,
        read_timeout,
        tls: u.tls,
        sni,
        ca_file: u.ca_file.clone(),
        forwarded_headers: u.forwarded_headers.unwrap_or(true),
        request_id_header,
        request_id_header_spelling,
        host,
        http2: u.http2,
        websocket_idle_timeout,
    })
}

fn validate_redis(r: &RedisSection, env_url: Option<String>) -> Result<RedisSettings, Invalid> {
    let cluster = r.cluster.clone().unwrap_or_default();
    let url = env_url.or_else(|| r.url.clone());
    if url.is_none() && cluster.is_empty() {
        return Err(at(&[&"redis"], "needs `url` (or REDIS_URL) or `cluster`"));
    }
    if r.url.is_some() && !cluster.is_empty() {
        return Err(at(
            &[&"redis", &"cluster"],
            "give either `url` or `cluster`, not both",
        ));
    }
    for (i, u) in cluster.iter().enumerate() {
        check_redis_url(u, &[&"redis", &"cluster", &i])?;
    }
    if let Some(u) = &r.url {
        check_redis_url(u, &[&"redis", &"url"])?;
    }
    let timeout = duration(
        &r.timeout,
        Duration::from_millis(50),
        &[&"redis", &"timeout"],
    )?;
    if timeout.is_zero() {
        return Err(at(&[&"redis", &"timeout"], "must be longer than 0"));
    }
    let key_prefix = r.key_prefix.clone().unwrap_or_else(|| "floodgate".into());
    if key_prefix.is_empty()
        || !key_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
    {
        return Err(at(
            &[&"redis", &"key_prefix"],
            "must be non-empty letters, digits, '_', '-', '.' or ':'",
        ));
    }
    let instances = r.instances.unwrap_or(1);
    if instances == 0 {
        return Err(at(&[&"redis", &"instances"], "must be at least 1"));
    }
    let tls_ca = r
        .tls_ca_file
        .as_ref()
        .map(|file| {
            std::fs::read(file).map_err(|e| {
                at(
                    &[&"redis", &"tls_ca_file"],
                    format!("cannot read {}: {e}", file.display()),
                )
            })
        })
        .transpose()?;
    let topology = match url {
        Some(url) if cluster.is_empty() => Topology::Standalone(url),
        _ => Topology::Cluster(cluster),
    };
    Ok(RedisSettings {
        topology,
        timeout,
        clock: r.clock.unwrap_or(ClockSource::Redis),
        key_prefix,
        on_failure: r.on_failure.map_or(OnFailure::Local, Into::into),
        instances,
        tls_ca,
    })
}

fn check_redis_url(u: &str, path: &[&dyn AsSegment]) -> Result<(), Invalid> {
    if u.starts_with("redis://") || u.starts_with("rediss://") {
        Ok(())
    } else {
        Err(at(
            path,
            format!("\"{u}\" must start with redis:// or rediss://"),
        ))
    }
}

/// The key identities are hashed with: from the shared secret (the
/// environment beats the file), else per process (memory store) or public
/// (Redis store, whose instances must agree).
fn identity_hasher(
    c: &ClientsSection,
    env_secret: Option<String>,
    shared_store: bool,
) -> Result<(IdentityHasher, IdentityKeySource), Invalid> {
    let path: [&dyn AsSegment; 2] = [&"clients", &"identity_secret_file"];
    let secret = match (env_secret, &c.identity_secret_file) {
        (Some(secret), _) => Some(secret.into_bytes()),
        (None, Some(file)) => Some(
            std::fs::read(file)
                .map_err(|e| at(&path, format!("cannot read {}: {e}", file.display())))?,
        ),
        (None, None) => None,
    };
    match secret {
        Some(secret) => {
            let secret = secret.trim_ascii();
            if secret.len() < MIN_SECRET_BYTES {
                return Err(at(
                    &path,
                    format!(
                        "the identity secret must hold at least {MIN_SECRET_BYTES} bytes (e.g. the output of `openssl rand -hex 32`)"
                    ),
                ));
            }
            Ok((
                IdentityHasher::from_secret(secret),
                IdentityKeySource::Secret,
            ))
        }
        None if shared_store => Ok((IdentityHasher::public(), IdentityKeySource::Public)),
        None => Ok((IdentityHasher::per_process(), IdentityKeySource::PerProcess)),
    }
}

fn validate_clients(c: &ClientsSection, hasher: IdentityHasher) -> Result<ClientRules, Invalid> {
    let header = c.api_key_header.as_deref().unwrap_or("X-API-Key");
    let api_key_header = HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
        at(
            &[&"clients", &"api_key_header"],
            format!("\"{header}\" is not a valid header name"),
        )
    })?;
    let nets = |list: &[String], key: &str| -> Result<Vec<IpNet>, Invalid> {
        list.iter()
            .enumerate()
            .map(|(i, n)| {
                n.parse::<IpNet>()
                    .or_else(|_| n.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map(|n| n.trunc())
                    .map_err(|_| {
                        at(
                            &[&"clients", &key, &i],
                            format!(
                                "\"{n}\" is not a CIDR range like \"10.0.0.0/8\" or an address"
                            ),
                        )
                    })
            })
            .collect()
    };
    let ipv6_prefix = c.ipv6_prefix.unwrap_or(64);
    if !(1..=128).contains(&ipv6_prefix) {
        return Err(at(&[&"clients", &"ipv6_prefix"], "must be from 1 to 128"));
    }
    let mut tiers = Tiers::default();
    let mut api_keys = HashMap::new();
    for (key, tier) in &c.api_keys {
        if key.is_empty() {
            return Err(at(
                &[&"clients", &"api_keys"],
                "an API key may not be empty",
            ));
        }
        if tier == ANONYMOUS || tier == INTERNAL || tier.is_empty() {
            return Err(at(
                &[&"clients", &"api_keys", &key.clone()],
                format!(
                    "tier \"{tier}\" is reserved; name the tier of a key e.g. \"free\" or \"pro\""
                ),
            ));
        }
        api_keys.insert(
            key.as_bytes().to_vec().into_boxed_slice(),
            tiers.intern(tier),
        );
    }
    Ok(ClientRules {
        api_key_header,
        trusted_proxies: nets(&c.trusted_proxies, "trusted_proxies")?,
        forwarded_header: match c.forwarded_header {
            None | Some(ForwardedHeaderName::XForwardedFor) => ForwardedHeader::XForwardedFor,
            Some(ForwardedHeaderName::Forwarded) => ForwardedHeader::Forwarded,
        },
        hasher,
        ipv6_prefix: ipv6_prefix as u8,
        internal: nets(&c.internal, "internal")?,
        api_keys,
        tiers,
    })
}

/// A pattern is matched against normalised paths, so it is normalised too
/// (`/%7euser/*` is `/~user/*`); one that cannot be is refused rather than
/// left to match nothing.
fn path_pattern(p: &str) -> Result<PathPattern, String> {
    if p.starts_with('*') {
        return Ok(PathPattern::new(p));
    }
    if !p.starts_with('/') {
        return Err(format!("\"{p}\" must start with '/' (or '*')"));
    }
    let canonical = crate::path::normalize(p.as_bytes(), EscapedSlashes::Keep)
        .map_err(|e| format!("\"{p}\" is not a path a request can have: {e}"))?;
    Ok(PathPattern::new(&canonical))
}

fn validate_match(
    m: &MatchSection,
    path: &[&dyn AsSegment],
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Matcher, Invalid> {
    let sub = |key: &'static str, i: usize| -> Vec<Segment> {
        let mut p: Vec<Segment> = path.iter().map(|s| s.segment()).collect();
        p.push(Segment::Key(key.into()));
        p.push(Segment::Index(i));
        p
    };
    let methods = m
        .methods
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let upper = name.to_ascii_uppercase();
            match Method::from_bytes(upper.as_bytes()) {
                Ok(method) if !name.is_empty() => Ok(method),
                _ => Err((
                    sub("methods", i),
                    format!("\"{name}\" is not an HTTP method"),
                )),
            }
        })
        .collect::<Result<_, _>>()?;
    let paths = m
        .paths
        .iter()
        .enumerate()
        .map(|(i, p)| compile_pattern(p).map_err(|msg| (sub("paths", i), msg)))
        .collect::<Result<_, _>>()?;
    Ok(Matcher { methods, paths })
}

fn validate_key(key: &str) -> Result<KeySource, String> {
    match key {
        "ip" => Ok(KeySource::Ip),
        "api_key" => Ok(KeySource::ApiKey),
        "global" => Ok(KeySource::Global),
        other => match other.strip_prefix("header:") {
            Some(name) => HeaderName::from_bytes(name.as_bytes())
                .map(KeySource::Header)
                .map_err(|_| format!("\"{name}\" is not a valid header name")),
            None => Err(format!(
                "unknown key \"{other}\" (expected \"ip\", \"api_key\", \"header:<Name>\" or \"global\")"
            )),
        },
    }
}

fn validate_limit(
    i: usize,
    s: &LimitSection,
    known_tiers: &Tiers,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Limit, Invalid> {
    let name_ok = !s.name.is_empty()
        && s.name.len() <= 64
        && s.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    if !name_ok {
        return Err(at(
            &[&"limits", &i, &"name"],
            format!(
                "\"{}\" must be 1 to 64 letters, digits, '_', '-' or '.'",
                s.name
            ),
        ));
    }
    let key = validate_key(&s.key).map_err(|m| at(&[&"limits", &i, &"key"], m))?;
    let own = s.numbers();
    let algorithm = numbers(s.algorithm, &own, None, &[&"limits", &i])?;
    let mut tiers = Vec::new();
    for (tier, overrides) in &s.tiers {
        let path: [&dyn AsSegment; 4] = [&"limits", &i, &"tiers", tier];
        let Some(known) = known_tiers.get(tier) else {
            return Err(at(
                &path,
                format!("unknown tier \"{tier}\" (known: {})", sorted(known_tiers)),
            ));
        };
        tiers.push((known, numbers(s.algorithm, overrides, Some(&own), &path)?));
    }
    let matcher = match &s.matcher {
        Some(m) => validate_match(m, &[&"limits", &i, &"match"], compile_pattern)?,
        None => Matcher::default(),
    };
    Ok(Limit {
        id: xxhash_rust::xxh3::xxh3_64(s.name.as_bytes()),
        name: LimitName::new(&s.name),
        key,
        algorithm,
        tiers,
        matcher,
        shadow: s.shadow,
        on_failure: s.on_failure.map(Into::into),
    })
}

/// Turns a limit's numbers (with a tier's overrides on top) into an algorithm.
/// A limit's numbers as its algorithm's row of the table names them: the
/// quota a whole number, the period a rate per second or a window.
fn numbers(
    algorithm: AlgorithmName,
    own: &Numbers,
    base: Option<&Numbers>,
    path: &[&dyn AsSegment],
) -> Result<Algorithm, Invalid> {
    let spec = algorithm.0.spec();
    let field = |parameter: Parameter| -> Vec<Segment> {
        let mut p: Vec<Segment> = path.iter().map(|s| s.segment()).collect();
        p.push(Segment::Key(parameter.name().into()));
        p
    };
    if let Some(&foreign) = Parameter::ALL
        .iter()
        .find(|&&p| p != spec.quota && p != spec.period && own.has(p))
    {
        return Err((
            field(foreign),
            format!("`{}` does not apply to {}", foreign.name(), spec.name),
        ));
    }
    let needed = |parameter: Parameter| {
        (
            field(parameter),
            format!("{} needs `{}`", spec.name, parameter.name()),
        )
    };
    let number = |parameter: Parameter| {
        own.number(parameter)
            .or_else(|| base.and_then(|b| b.number(parameter)))
            .ok_or_else(|| needed(parameter))
    };
    let quota = number(spec.quota)?;
    if quota.fract() != 0.0 || quota < 1.0 || quota > MAX_EXACT as f64 {
        return Err((
            field(spec.quota),
            format!("must be a whole number of at least 1 (got {quota})"),
        ));
    }
    let period_us = if spec.period == Parameter::Window {
        let text = own
            .window
            .as_ref()
            .or_else(|| base.and_then(|b| b.window.as_ref()))
            .ok_or_else(|| needed(Parameter::Window))?;
        let window = duration::parse(text).map_err(|m| (field(Parameter::Window), m))?;
        if window < Duration::from_millis(1) {
            return Err((field(Parameter::Window), "must be at least 1ms".into()));
        }
        window.as_micros() as u64
    } else {
        let per_second = number(spec.period)?;
        if per_second.is_nan() || per_second <= 0.0 || per_second > 1_000_000.0 {
            return Err((
                field(spec.period),
                format!("must be more than 0 and at most 1000000 per second (got {per_second})"),
            ));
        }
        // Rounded up so the configured rate is never exceeded.
        (1_000_000.0 / per_second).ceil() as u64
    };
    Algorithm::new(algorithm.0, quota as u64, period_us)
        .map_err(|e| (field(spec.quota), e.to_string()))
}

#[cfg(test)]
mod tests;
