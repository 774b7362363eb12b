//! `proxy.toml`: the file format (`file`, serde types that mirror it, unknown
//! keys refused) and its validation, one module per section, into runtime
//! settings in which bad values cannot exist. Every error names the file, the
//! line and the key.

mod admin;
mod block;
mod charged_by_response;
mod clients;
mod costs;
mod descriptors;
mod duration;
mod exempt;
mod file;
mod inputs;
mod jwt;
mod limit_key;
mod limits;
mod log;
mod matcher;
pub mod overrides;
mod protection;
mod redis;
mod rls;
mod rule;
mod server;
mod source;
mod tracing;
mod upstream;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::admin::auth::AdminToken;
use crate::proxy::access_log::AccessLogTarget;
use crate::proxy::headers::HeaderStyle;
use crate::proxy::upstream::UpstreamSettings;
use crate::rls::{RlsSettings, RlsTokens};
use crate::server::settings::ServerSettings;
use crate::server::tls::TlsListeners;
use file::FileConfig;
use floodgate_limiter::{OnFailure, RedisSettings};
use floodgate_policy::identity::IdentityKeySource;
use floodgate_policy::Policy;
use source::Segment;

pub use inputs::Inputs;
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

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from (`floodgate check` and reloads name it).
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
    /// `[admin].token_file`'s token: without one the admin API is off.
    pub admin_token: Option<AdminToken>,
    /// How each limit reads a client's numbers set at run time.
    pub override_rules: overrides::OverrideRules,
    /// `[admin].clients_file`: where the memory store keeps run-time
    /// clients.
    pub clients_file: Option<PathBuf>,
    /// `[rls]`: Envoy's rate limit service, when served.
    pub rls: Option<RlsSettings>,
    /// `[rls].token_file`'s tokens: without them any caller is answered.
    pub rls_tokens: Option<RlsTokens>,
    /// `[upstream.protection]`: the adaptive limit on the upstream.
    pub protection: Option<crate::protection::ProtectionSettings>,
    /// `[tracing]`: OpenTelemetry spans of each request.
    pub tracing: Option<crate::tracing::TracingSettings>,
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
        if self.rls != newer.rls {
            changed.push("[rls]");
        }
        if self.tracing != newer.tracing {
            changed.push("[tracing]");
        }
        if self.clients_file != newer.clients_file {
            changed.push("[admin].clients_file");
        }
        let tls_listeners = |c: &Config| c.tls.as_ref().map(|t| (t.listen.clone(), t.http2));
        if tls_listeners(self) != tls_listeners(newer) {
            changed.push("[server.tls] listen/http2");
        }
        changed
    }

    /// Reads and validates `file`.
    pub fn load(file: &Path, inputs: &Inputs) -> Result<Config, ConfigError> {
        let text = inputs.read_to_string(file).map_err(|e| ConfigError {
            file: file.to_path_buf(),
            line: None,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(file, &text, inputs)
    }

    /// Validates `text` as if read from `file`, reading nothing but
    /// `inputs`: the same text and inputs give the same configuration.
    pub fn parse(file: &Path, text: &str, inputs: &Inputs) -> Result<Config, ConfigError> {
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
        validate(raw, file, inputs).map_err(|(path, message)| ConfigError {
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

/// `path` with `name` under it: where an error about that key points.
fn key_path(path: &[&dyn AsSegment], name: &str) -> Vec<Segment> {
    let mut p: Vec<Segment> = path.iter().map(|s| s.segment()).collect();
    p.push(Segment::Key(name.into()));
    p
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

const DEFAULT_MAX_KEYS: u64 = 1_000_000;

/// The sections in the order they were always checked, so that a file with
/// several mistakes is refused for the same one.
fn validate(raw: FileConfig, file: &Path, inputs: &Inputs) -> Result<Config, Invalid> {
    let server = server::validate_server(&raw.server, inputs.cores)?;
    let mut upstream = upstream::validate_upstream(&raw.upstream, inputs)?;
    let max_keys = raw.memory.max_keys.unwrap_or(DEFAULT_MAX_KEYS);
    if max_keys == 0 {
        return Err(at(&[&"memory", &"max_keys"], "must be at least 1"));
    }
    let redis = raw
        .redis
        .as_ref()
        .map(|r| redis::validate_redis(r, inputs))
        .transpose()?;
    let default_on_failure = redis.as_ref().map_or(OnFailure::Local, |r| r.on_failure);
    let (hasher, identity_key) = clients::identity_hasher(&raw.clients, inputs, redis.is_some())?;
    let mut clients = clients::validate_clients(&raw.clients, hasher, inputs)?;
    let paths = server::path_rules(&raw.server);
    let compile_pattern = matcher::pattern_compiler(&paths);
    upstream.grpc_paths = upstream::compile_grpc_paths(&raw.upstream, &compile_pattern)?;
    let (exempt_paths, exempt_tiers) =
        exempt::validate_exempt(&raw.exempt, &clients.tiers, &compile_pattern)?;
    let block = block::validate_block(&raw.block, &clients)?;
    let instances = redis.as_ref().map_or(1, |r| r.instances.assumed());
    let leases = redis.as_ref().is_some_and(|r| r.leases.is_some());
    let limits = limits::validate_limits(
        &raw.limits,
        default_on_failure,
        &clients.tiers,
        clients.jwt.is_some(),
        instances,
        leases,
        &compile_pattern,
    )?;
    let costs = costs::validate_costs(&raw.costs, &limits, &compile_pattern)?;
    let tls = raw
        .server
        .tls
        .as_ref()
        .map(|t| server::validate_tls(t, inputs))
        .transpose()?;
    let access_log = log::validate_log(&raw.log)?;
    let admin_token = admin::validate_admin(&raw.admin, server.admin_listen.is_some(), inputs)?;
    let clients_file = admin::validate_clients_file(
        &raw.admin,
        admin_token.is_some(),
        redis.is_some(),
        identity_key,
    )?;
    if admin_token.is_some() {
        clients.run_time = inputs.run_time_keys.clone();
    }
    let max_body = server::max_body(raw.server.max_body)?;
    let protection = raw
        .upstream
        .protection
        .as_ref()
        .map(|p| protection::validate_protection(p, &clients.tiers, &compile_pattern))
        .transpose()?;
    let override_rules = overrides::OverrideRules::new(limits::override_frames(&raw.limits));
    let rls = rls::validate_rls(raw.rls.as_ref(), &limits, tls.is_some())?;
    let rls_tokens = rls::validate_rls_tokens(raw.rls.as_ref(), inputs)?;
    let tracing = tracing::validate_tracing(raw.tracing.as_ref(), inputs)?;
    Ok(Config {
        file: file.to_path_buf(),
        identity_key,
        server,
        upstream,
        max_keys: usize::try_from(max_keys).unwrap_or(usize::MAX),
        redis,
        policy: Arc::new({
            let mut policy = Policy::new(
                clients,
                paths,
                (exempt_paths, exempt_tiers),
                block,
                limits,
                costs,
                default_on_failure,
            );
            if admin_token.is_some() {
                policy.overrides = inputs.run_time_overrides.clone();
            }
            policy.max_body = max_body;
            policy
        }),
        override_rules,
        headers: raw.response.headers.unwrap_or(HeaderStyle::Both),
        tls,
        access_log,
        admin_token,
        clients_file,
        rls,
        rls_tokens,
        protection,
        tracing,
    })
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

#[cfg(test)]
mod tests;
