//! The compiled limits: which layers apply to a request, with which numbers
//! (tier overrides applied) and which cost.

use http::{HeaderMap, HeaderName, Method};

use crate::blocklist::Blocklist;
use crate::body::BodyFields;
use crate::identity::{normalize_host, Client, ClientRules, IdentityError, KeyInputs, Tier};
use crate::overrides::RunTimeOverrides;
use crate::path::PathRules;
use crate::request_id::lease_id;
use floodgate_algorithm::Algorithm;
use floodgate_limiter::{Check, LimitId, LimitName, OnFailure, Slot, StateKey};
use std::sync::Arc;

pub use crate::descriptors::{
    remote_address, DescriptorPattern, Entries, EntryPattern, MAX_DESCRIPTOR_TEXT, MAX_ENTRIES,
    REMOTE_ADDRESS,
};
pub use crate::glob::PathPattern;
pub use crate::identity::KeySource;

/// A host pattern: a name, or `*.` and a domain for its subdomains (not the
/// domain itself). Lower case, no port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern(String);

impl HostPattern {
    pub fn new(pattern: &str) -> HostPattern {
        HostPattern(normalize_host(pattern))
    }

    /// `host` as `normalize_host` gives it.
    pub fn matches(&self, host: &str) -> bool {
        match self.0.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => self.0 == host,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `match = { methods, paths, hosts, headers }`; an empty list matches all.
/// A limit on GET also limits HEAD, which routers answer with the GET handler;
/// methods match ignoring case. A header matches when any of its values
/// matches its glob (`*` for any run of characters).
/// `match = { domain, descriptors }` instead: a limit of the rate limit
/// service, which no HTTP request meets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    pub methods: Vec<Method>,
    pub paths: Vec<PathPattern>,
    pub hosts: Vec<HostPattern>,
    pub headers: Vec<(HeaderName, PathPattern)>,
    pub descriptors: Option<DescriptorPattern>,
    /// Top-level fields of the JSON body, each matching one of its
    /// patterns (`body = { model = ["gpt-4o*"] }`).
    pub body: Vec<(Box<str>, Vec<PathPattern>)>,
}

impl Matcher {
    /// Whether the request is one this matcher applies to.
    pub fn applies(&self, request: &RequestView<'_>) -> bool {
        self.applies_but_for_body(request)
            && self.body.iter().all(|(field, globs)| {
                request
                    .body
                    .and_then(|body| body.text(field))
                    .is_some_and(|value| globs.iter().any(|g| g.matches_exactly(value)))
            })
    }

    /// Whether the request is one this matcher applies to, as far as its
    /// head tells: whether its body is worth reading.
    pub fn applies_but_for_body(&self, request: &RequestView<'_>) -> bool {
        self.matches(request.method, request.path)
            // A request that names no host may be for any: host limits
            // apply to it (an HTTP/1.0 request without Host is no way
            // around them).
            && (self.hosts.is_empty()
                || request
                    .host
                    .is_none_or(|h| self.hosts.iter().any(|p| p.matches(h))))
            && self.headers.iter().all(|(name, glob)| {
                request
                    .headers
                    .get_all(name)
                    .iter()
                    .any(|v| v.to_str().is_ok_and(|v| glob.matches_exactly(v)))
            })
    }

    /// The path pattern a matching path matched ("" when any path does):
    /// what a `route` key names.
    pub fn route(&self, path: &str) -> &str {
        self.paths
            .iter()
            .find(|p| p.matches(path))
            .map_or("", |p| p.as_str())
    }

    /// Method and path only.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if self.descriptors.is_some() {
            return false;
        }
        // Methods are case-sensitive in HTTP, but some frameworks (Werkzeug)
        // route `post` as POST.
        let listed = |m: &str| {
            self.methods
                .iter()
                .any(|l| l.as_str().eq_ignore_ascii_case(m))
        };
        let method_matches = self.methods.is_empty()
            || listed(method.as_str())
            || (method.as_str().eq_ignore_ascii_case("HEAD") && listed("GET"));
        method_matches && (self.paths.is_empty() || self.paths.iter().any(|p| p.matches(path)))
    }

    /// Whether some request could match both (approximate: a path pattern is
    /// tested against the other's text).
    pub fn may_overlap(&self, other: &Matcher) -> bool {
        match (&self.descriptors, &other.descriptors) {
            (None, None) => {}
            (Some(a), Some(b)) => return a.domain == b.domain,
            _ => return false,
        }
        let methods = self.methods.is_empty()
            || other.methods.is_empty()
            || self.methods.iter().any(|m| other.methods.contains(m));
        let paths = self.paths.is_empty()
            || other.paths.is_empty()
            || self.paths.iter().any(|a| {
                other
                    .paths
                    .iter()
                    .any(|b| a.matches(b.as_str()) || b.matches(a.as_str()))
            });
        methods && paths
    }

    pub fn describe(&self) -> String {
        if let Some(descriptors) = &self.descriptors {
            return descriptors.describe();
        }
        let mut parts = Vec::new();
        if !self.methods.is_empty() {
            let m: Vec<&str> = self.methods.iter().map(|m| m.as_str()).collect();
            parts.push(m.join("|"));
        }
        if !self.paths.is_empty() {
            let p: Vec<&str> = self.paths.iter().map(|p| p.as_str()).collect();
            parts.push(p.join(" "));
        }
        if !self.hosts.is_empty() {
            let h: Vec<&str> = self.hosts.iter().map(|h| h.as_str()).collect();
            parts.push(format!("host {}", h.join(" ")));
        }
        for (name, glob) in &self.headers {
            parts.push(format!("with {name}: {}", glob.as_str()));
        }
        for (field, globs) in &self.body {
            let g: Vec<&str> = globs.iter().map(|g| g.as_str()).collect();
            parts.push(format!("with body {field}: {}", g.join("|")));
        }
        if parts.is_empty() {
            "all requests".into()
        } else {
            parts.join(" ")
        }
    }
}

/// Whether an upgraded connection (a WebSocket) keeps its request's
/// concurrency slot for its lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrades {
    Include,
    Exclude,
}

/// A concurrency limit's numbers: at most `max` requests in flight per
/// key, each slot held under a lease of `lease_us`, renewed while the
/// request lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub max: u64,
    pub lease_us: u64,
    pub upgrades: Upgrades,
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Requests (or their cost) over time.
    Rate(Algorithm),
    /// Requests in flight.
    Concurrency(Concurrency),
}

impl Rule {
    /// Whether `other` counts the same way (an override's numbers apply
    /// only to the algorithm they were checked for).
    pub fn same_kind(&self, other: &Rule) -> bool {
        match (self, other) {
            (Rule::Rate(a), Rule::Rate(b)) => a.kind() == b.kind(),
            (Rule::Concurrency(_), Rule::Concurrency(_)) => true,
            _ => false,
        }
    }

    /// The number a client sees as its quota.
    pub fn quota(&self) -> u64 {
        match self {
            Rule::Rate(algorithm) => algorithm.quota(),
            Rule::Concurrency(c) => c.max,
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Rate(algorithm) => algorithm.fmt(f),
            Rule::Concurrency(c) => write!(
                f,
                "concurrency max={} lease={}s{}",
                c.max,
                c.lease_us as f64 / 1e6,
                if c.upgrades == Upgrades::Exclude {
                    " upgrades=exclude"
                } else {
                    ""
                }
            ),
        }
    }
}

/// The upstream statuses that charge a limit counted by response
/// (`count = { statuses = [401, "5xx"] }`): inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statuses(Vec<(u16, u16)>);

impl Statuses {
    pub fn new(ranges: Vec<(u16, u16)>) -> Statuses {
        Statuses(ranges)
    }

    pub fn contains(&self, status: u16) -> bool {
        self.0
            .iter()
            .any(|&(low, high)| (low..=high).contains(&status))
    }
}

impl std::fmt::Display for Statuses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, &(low, high)) in self.0.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            if low == high {
                write!(f, "{sep}{low}")?;
            } else {
                write!(f, "{sep}{}xx", low / 100)?;
            }
        }
        Ok(())
    }
}

/// Whose usage an LLM answer reports, in its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmProvider {
    /// `usage.prompt_tokens` and `completion_tokens` (and every
    /// OpenAI-compatible server's); a stream's last chunk.
    OpenAi,
    /// `usage.input_tokens` and `output_tokens`; a stream's
    /// `message_start` and `message_delta`s.
    Anthropic,
}

impl LlmProvider {
    pub fn name(self) -> &'static str {
        match self {
            LlmProvider::OpenAi => "openai",
            LlmProvider::Anthropic => "anthropic",
        }
    }
}

/// Where a response says what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostSource {
    /// The largest whole number of a header.
    Header(HeaderName),
    /// An LLM provider's usage in the body, priced: prompt tokens times
    /// `prompt_weight` plus completion tokens times `completion_weight`.
    Usage {
        provider: LlmProvider,
        prompt_weight: u64,
        completion_weight: u64,
    },
}

impl std::fmt::Display for CostSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CostSource::Header(name) => name.fmt(f),
            CostSource::Usage {
                provider,
                prompt_weight,
                completion_weight,
            } => write!(
                f,
                "{} usage ({prompt_weight} per prompt token, {completion_weight} per completion token)",
                provider.name()
            ),
        }
    }
}

/// `cost_from_response`: the request reserves `reserve` units before it
/// goes upstream (refused when they are not there), and the response
/// settles it: charged what its `source` says, at most `max`; `default`
/// when that is missing or unreadable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseCost {
    pub source: CostSource,
    pub max: u64,
    pub default: u64,
    /// Taken before the request goes upstream; the response settles it.
    /// With `from_request`, what a request whose body tells nothing takes.
    pub reserve: u64,
    /// `reserve = "request"`: an LLM request's own worst case, read from
    /// its body (`reservation`).
    pub from_request: bool,
    /// `include_usage`: an OpenAI stream that did not ask for its usage is
    /// made to, and the extra chunk taken back out of what its client gets.
    pub include_usage: bool,
    /// Whether the client sees the header (a usage source has none).
    pub expose: bool,
}

/// A prompt's tokens are estimated as one per this many bytes of the
/// request's body: about four characters a token for English text (OpenAI's
/// rule of thumb), and a JSON body's quoting and field names only add bytes.
pub const PROMPT_BYTES_PER_TOKEN: u64 = 4;

impl ResponseCost {
    /// What a request reserves before it goes upstream. With
    /// `reserve = "request"`: its prompt's estimate and the most it asks to
    /// be answered (`max_completion_tokens` or `max_tokens`), priced by the
    /// weights, at most `max` (what the response can be charged at most);
    /// `max` for a request that does not say (no readable body, no
    /// `max_tokens`).
    pub fn reservation(&self, body: Option<&BodyFields>) -> u64 {
        if !self.from_request {
            return self.reserve;
        }
        let CostSource::Usage {
            provider,
            prompt_weight,
            completion_weight,
        } = self.source
        else {
            return self.reserve;
        };
        let Some(body) = body else {
            return self.max;
        };
        let most_answered = provider
            .answer_limits()
            .iter()
            .find_map(|field| body.count(field));
        let Some(most_answered) = most_answered else {
            return self.max;
        };
        let prompt = (body.len as u64).div_ceil(PROMPT_BYTES_PER_TOKEN);
        prompt
            .saturating_mul(prompt_weight)
            .saturating_add(most_answered.saturating_mul(completion_weight))
            .clamp(1, self.max)
    }
}

impl LlmProvider {
    /// The request's fields that bound its answer's tokens, the first
    /// given applying (OpenAI's newer name before its older one).
    pub fn answer_limits(self) -> &'static [&'static str] {
        match self {
            LlmProvider::OpenAi => &["max_completion_tokens", "max_tokens"],
            LlmProvider::Anthropic => &["max_tokens"],
        }
    }
}

/// What charges a limit once the response is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterResponse {
    /// The request's cost, when the upstream's status is listed.
    Status(Statuses),
    /// The cost the response reports.
    Cost(ResponseCost),
}

/// `ban`: after `after` refusals by the limit within `within`, the key is
/// refused on every route for `duration`. Both are kept as limits of
/// their own on the limit's identity, so they live in the same store
/// (shared on Redis) and expire as any state does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ban {
    /// Refusals seen: a sliding log of `after` within `within`; full means
    /// the key is banned.
    pub strikes: Algorithm,
    pub strikes_name: LimitName,
    pub strikes_id: u64,
    /// The ban itself: one token that comes back after `duration`. Taking
    /// it bans; a key whose token is gone is banned until it returns.
    pub penalty: Algorithm,
    pub penalty_name: LimitName,
    pub penalty_id: u64,
}

impl Ban {
    /// The ban of `identity` looked up (`peek`) or taken, for limit `layer`.
    pub fn penalty_check(&self, limit: LimitId, identity: u128, peek: bool) -> Check {
        self.check(
            limit,
            &self.penalty_name,
            self.penalty,
            self.penalty_id,
            identity,
            peek,
        )
    }

    /// One strike on `identity` toward limit `layer`'s ban.
    pub fn strike_check(&self, limit: LimitId, identity: u128) -> Check {
        self.check(
            limit,
            &self.strikes_name,
            self.strikes,
            self.strikes_id,
            identity,
            false,
        )
    }

    fn check(
        &self,
        limit: LimitId,
        name: &LimitName,
        algorithm: Algorithm,
        id: u64,
        identity: u128,
        peek: bool,
    ) -> Check {
        Check {
            limit,
            name: name.clone(),
            algorithm,
            key: StateKey {
                limit: id,
                identity,
            },
            cost: 1,
            shadow: false,
            peek,
            // Without the store, no ban is known: a ban never fails closed
            // (every route would answer "banned").
            on_failure: OnFailure::Allow,
            lease: false,
        }
    }
}

/// What a limit does with a request that lacks its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissing {
    /// The limit does not apply.
    #[default]
    Skip,
    /// 400 `missing_key`.
    Deny,
    /// Keyed on the client's address instead.
    Ip,
}

impl OnMissing {
    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnMissing::Skip => "skip",
            OnMissing::Deny => "deny",
            OnMissing::Ip => "ip",
        }
    }
}

/// One `[[limits]]` entry, validated.
#[derive(Debug, Clone)]
pub struct Limit {
    pub name: LimitName,
    /// Identifies this limit's state; derived from the name so that state
    /// survives a reload that keeps the limit.
    pub id: u64,
    pub key: KeySource,
    pub rule: Rule,
    pub tiers: Vec<(Tier, Rule)>,
    pub matcher: Matcher,
    pub shadow: bool,
    /// What decides this limit while Redis is away: its own `on_failure`,
    /// else `[redis].on_failure`, resolved when the config is loaded.
    pub on_failure: OnFailure,
    /// Charged by what the response says: checked without charge when the
    /// request arrives, charged once the upstream answers.
    pub after_response: Option<AfterResponse>,
    pub ban: Option<Ban>,
    pub on_missing: OnMissing,
    /// Header, cookie and query values compared ignoring case, as the
    /// application compares them.
    pub case_insensitive_values: bool,
    /// Decided from leases of the shared budget where one is held.
    pub leases: bool,
}

impl Limit {
    /// Whether the limit reads the request's body: a key or a match on a
    /// field, or a reservation from the request.
    pub fn reads_body(&self) -> bool {
        !self.matcher.body.is_empty()
            || self.key.any_part(|p| matches!(p, KeySource::Body(_)))
            || matches!(&self.after_response, Some(AfterResponse::Cost(c)) if c.from_request || c.include_usage)
    }

    /// Adds the body's fields this limit reads to `fields`, once each.
    fn body_fields_read(&self, fields: &mut Vec<Box<str>>) {
        let mut add = |field: &str| {
            if !fields.iter().any(|f| &**f == field) {
                fields.push(field.into());
            }
        };
        for (field, _) in &self.matcher.body {
            add(field);
        }
        if let KeySource::Composite(parts) = &self.key {
            for part in parts {
                if let KeySource::Body(field) = part {
                    add(field);
                }
            }
        } else if let KeySource::Body(field) = &self.key {
            add(field);
        }
        if let Some(AfterResponse::Cost(ResponseCost {
            from_request: true,
            source: CostSource::Usage { provider, .. },
            ..
        })) = &self.after_response
        {
            for field in provider.answer_limits() {
                add(field);
            }
        }
    }

    pub fn rule_for(&self, tier: &Tier) -> Rule {
        self.tiers
            .iter()
            .find(|(t, _)| t == tier)
            .map_or(self.rule, |&(_, r)| r)
    }
}

/// One `[[costs]]` entry.
#[derive(Debug, Clone)]
pub struct CostRule {
    pub matcher: Matcher,
    pub cost: u64,
    /// The limits (their indexes) it prices; every limit when empty.
    pub limits: Vec<usize>,
}

/// What the limits look at in a request.
#[derive(Clone, Copy)]
pub struct RequestView<'a> {
    pub method: &'a Method,
    /// Normalised (`path`), and lower-cased when `paths.case_insensitive`.
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    /// The raw query string.
    pub query: Option<&'a str>,
    /// The host asked for, normalised (`identity::normalize_host`).
    pub host: Option<&'a str>,
    pub client: &'a Client,
    /// The body's fields some limit reads, when it was read.
    pub body: Option<&'a BodyFields>,
}

#[derive(Debug)]
pub enum Plan {
    /// Forward untouched: no limit, no headers.
    Exempt,
    /// Take these slots and decide these layers (possibly none) before
    /// forwarding.
    Check(Layers),
}

/// The layers that apply to one request.
#[derive(Debug, Default)]
pub struct Layers {
    pub checks: Vec<Check>,
    /// Layers charged by the response: reserved now, settled once it is
    /// known.
    pub counted: Vec<(Check, AfterResponse)>,
    /// The bans of every limit that bans, on this request's identities:
    /// peeked before anything else, on every route.
    pub bans: Vec<Check>,
    /// Concurrency layers: (layer index, its slot, upgrades, shadow).
    pub slots: Vec<SlotLayer>,
}

impl Layers {
    pub fn is_empty(&self) -> bool {
        self.checks.is_empty()
            && self.counted.is_empty()
            && self.slots.is_empty()
            && self.bans.is_empty()
    }
}

/// A concurrency layer of one request.
#[derive(Debug, Clone)]
pub struct SlotLayer {
    pub limit: LimitId,
    pub slot: Slot,
    pub upgrades: Upgrades,
    pub shadow: bool,
}

/// Everything `[clients]`, `[exempt]`, `[[limits]]` and `[[costs]]` say.
#[derive(Debug, Clone)]
pub struct Policy {
    pub clients: ClientRules,
    /// `[block]`: refused before anything else.
    pub block: Blocklist,
    /// How request paths are normalised and matched.
    pub paths: PathRules,
    pub exempt_paths: Vec<PathPattern>,
    pub exempt_tiers: Vec<Tier>,
    pub limits: Vec<Limit>,
    pub costs: Vec<CostRule>,
    /// `[redis].on_failure`, for limits that do not set their own.
    pub default_on_failure: OnFailure,
    /// Whether any limit or cost reads the host (most read none, and a
    /// request's host is then not worked out).
    pub reads_host: bool,
    /// The limits keyed on a token's claim.
    claim_limits: Vec<usize>,
    /// The limits of the rate limit service (matched by descriptors).
    descriptor_limits: Vec<usize>,
    /// The limits that read the request's body, and the top-level fields
    /// they read among them.
    body_limits: Vec<usize>,
    pub body_fields: Vec<Box<str>>,
    /// Whether a tier can change what happens to a request: some limit has
    /// numbers per tier, or some tier is exempt.
    tiers_matter: bool,
    /// Clients' own numbers set at run time (with the admin API on).
    pub overrides: Option<Arc<RunTimeOverrides>>,
    /// `[server].max_body`: the most of a body read before its decision.
    pub max_body: usize,
}

impl Policy {
    pub fn new(
        clients: ClientRules,
        paths: PathRules,
        (exempt_paths, exempt_tiers): (Vec<PathPattern>, Vec<Tier>),
        block: Blocklist,
        limits: Vec<Limit>,
        costs: Vec<CostRule>,
        default_on_failure: OnFailure,
    ) -> Policy {
        let reads_host = limits
            .iter()
            .any(|l| !l.matcher.hosts.is_empty() || l.key.any_part(|p| *p == KeySource::Host))
            || costs.iter().any(|c| !c.matcher.hosts.is_empty());
        let claim_limits = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.key.any_part(|p| matches!(p, KeySource::Jwt(_))))
            .map(|(i, _)| i)
            .collect();
        let tiers_matter = !exempt_tiers.is_empty() || limits.iter().any(|l| !l.tiers.is_empty());
        let descriptor_limits = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.matcher.descriptors.is_some())
            .map(|(i, _)| i)
            .collect();
        let mut body_fields: Vec<Box<str>> = Vec::new();
        let body_limits = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                l.body_fields_read(&mut body_fields);
                l.reads_body()
            })
            .map(|(i, _)| i)
            .collect();
        Policy {
            clients,
            block,
            paths,
            exempt_paths,
            exempt_tiers,
            limits,
            costs,
            default_on_failure,
            reads_host,
            claim_limits,
            descriptor_limits,
            body_limits,
            body_fields,
            tiers_matter,
            overrides: None,
            max_body: 1 << 20,
        }
    }

    /// Whether the request's body is to be read before its decision: some
    /// limit its head matches reads it.
    pub fn reads_body(&self, request: &RequestView<'_>) -> bool {
        self.body_limits
            .iter()
            .filter_map(|&i| self.limits.get(i))
            .any(|l| l.matcher.applies_but_for_body(request))
    }

    /// The numbers `limit` applies to the client `identity` in `tier`: its
    /// own, set at run time, or else its tier's.
    pub fn rule_in_force(&self, limit: &Limit, tier: &Tier, identity: u128) -> Rule {
        self.overridden(limit, identity, limit.rule_for(tier))
    }

    /// `own`, or the numbers set at run time for the client `identity`
    /// under `limit`.
    pub fn overridden(&self, limit: &Limit, identity: u128, own: Rule) -> Rule {
        let Some(table) = self.overrides.as_deref().filter(|t| !t.is_empty()) else {
            return own;
        };
        match table.rule(limit.id, identity) {
            // Numbers checked for another algorithm (a reload changed the
            // limit's) mean nothing to this one.
            Some(rule) if rule.same_kind(&own) => rule,
            _ => own,
        }
    }

    /// The limits of the rate limit service, with their places.
    pub fn descriptor_limits(&self) -> impl Iterator<Item = (LimitId, &Limit)> + '_ {
        self.descriptor_limits
            .iter()
            .map(|&i| (LimitId(i), &self.limits[i]))
    }

    /// Whether this request needs its token's claims: a limit keyed on one
    /// applies (or bans, on every route), the tier it names can change the
    /// numbers, or a subject may be blocked. A token nothing needs is never
    /// verified, so a client cannot make floodgate check signatures for
    /// nothing.
    pub fn needs_token(&self, request: &RequestView<'_>) -> bool {
        let Some(jwt) = &self.clients.jwt else {
            return false;
        };
        !self.block.jwt_subjects.is_empty()
            || (jwt.tier_claim.is_some() && self.tiers_matter)
            || self.claim_limits.iter().any(|&i| {
                let limit = &self.limits[i];
                limit.ban.is_some() || limit.matcher.applies(request)
            })
    }

    /// The bans of the limits keyed on the client's address: looked up
    /// before a token's signature is checked, so that a banned address
    /// costs no signature.
    pub fn address_bans(&self, client: &Client) -> Vec<Check> {
        self.limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.key == KeySource::Ip)
            .filter_map(|(i, l)| {
                Some(
                    l.ban
                        .as_ref()?
                        .penalty_check(LimitId(i), client.ip_hash, true),
                )
            })
            .collect()
    }

    /// What a request costs limit `limit`: the first `[[costs]]` entry that
    /// matches it and prices that limit, else 1.
    pub fn cost_of(&self, limit: LimitId, request: &RequestView<'_>) -> u64 {
        self.costs
            .iter()
            .find(|c| {
                (c.limits.is_empty() || c.limits.contains(&limit.index()))
                    && c.matcher.applies(request)
            })
            .map_or(1, |c| c.cost)
    }

    /// The layers that apply to a request.
    pub fn plan(&self, request: &RequestView<'_>) -> Result<Plan, IdentityError> {
        let RequestView {
            path,
            headers,
            query,
            host,
            client,
            ..
        } = *request;
        if self.exempt_paths.iter().any(|p| p.matches(path))
            || self.exempt_tiers.contains(&client.tier)
        {
            return Ok(Plan::Exempt);
        }
        let mut layers = Layers::default();
        for (index, limit) in self.limits.iter().enumerate() {
            let id = LimitId(index);
            // A body that could not be read (past max_body, of unknown
            // length, no JSON object) leaves a body match undecided: the
            // limit's on_missing says, as for a missing key, so that
            // padding or chunking a body is no way around it.
            let unread = !limit.matcher.body.is_empty()
                && request.body.is_none()
                && limit.matcher.applies_but_for_body(request);
            if unread && !limit.shadow {
                match limit.on_missing {
                    OnMissing::Skip => {}
                    OnMissing::Deny => {
                        return Err(IdentityError::MissingKey(limit.name.as_str().into()))
                    }
                    OnMissing::Ip => {}
                }
            }
            let matches =
                limit.matcher.applies(request) || (unread && limit.on_missing == OnMissing::Ip);
            if !matches && limit.ban.is_none() {
                continue;
            }
            let inputs = KeyInputs {
                headers,
                query,
                host,
                route: if limit.key.any_part(|p| *p == KeySource::Route) {
                    limit.matcher.route(path)
                } else {
                    ""
                },
                fold_case: limit.case_insensitive_values,
                body: request.body,
            };
            let identity = match self.clients.identity_of(&limit.key, client, &inputs) {
                Ok(_) if unread => client.ip_hash,
                Ok(Some(identity)) => identity,
                // Banned by its address: looked up by it on every route.
                Ok(None) if !matches && limit.on_missing == OnMissing::Ip => client.ip_hash,
                // A key this route's limit never reads (only its ban looks
                // it up), or a shadow limit's, is no reason to refuse the
                // request.
                Ok(None) | Err(_) if !matches || limit.shadow => continue,
                Ok(None) => match limit.on_missing {
                    OnMissing::Skip => continue,
                    OnMissing::Deny => {
                        return Err(IdentityError::MissingKey(limit.name.as_str().into()))
                    }
                    OnMissing::Ip => client.ip_hash,
                },
                Err(e) => return Err(e),
            };
            let on_failure = limit.on_failure;
            if let Some(ban) = &limit.ban {
                layers.bans.push(ban.penalty_check(id, identity, true));
            }
            if !matches {
                continue;
            }
            let key = StateKey {
                limit: limit.id,
                identity,
            };
            match self.rule_in_force(limit, &client.tier, identity) {
                Rule::Rate(algorithm) => {
                    let mut check = Check {
                        limit: id,
                        name: limit.name.clone(),
                        algorithm,
                        key,
                        cost: self.cost_of(id, request),
                        shadow: limit.shadow,
                        peek: false,
                        on_failure,
                        lease: limit.leases,
                    };
                    match &limit.after_response {
                        Some(charge) => {
                            // Reserved now, with the other layers; settled
                            // once the response is known. A request never
                            // passes what is spent, however many run at
                            // once.
                            if let AfterResponse::Cost(priced) = charge {
                                check.cost = priced.reservation(request.body);
                            }
                            layers.counted.push((check, charge.clone()));
                        }
                        None => layers.checks.push(check),
                    }
                }
                Rule::Concurrency(c) => {
                    // Validated with the config: these numbers make a slot.
                    let Ok(slot) = Slot::new(
                        limit.name.clone(),
                        key,
                        c.max,
                        c.lease_us,
                        lease_id(),
                        on_failure,
                    ) else {
                        continue;
                    };
                    layers.slots.push(SlotLayer {
                        limit: id,
                        slot,
                        upgrades: c.upgrades,
                        shadow: limit.shadow,
                    });
                }
            }
        }
        Ok(Plan::Check(layers))
    }
}

#[cfg(test)]
mod reservation_tests {
    use super::*;

    fn priced(provider: LlmProvider, from_request: bool) -> ResponseCost {
        ResponseCost {
            source: CostSource::Usage {
                provider,
                prompt_weight: 1,
                completion_weight: 4,
            },
            max: 10_000,
            default: 10,
            reserve: if from_request { 10_000 } else { 50 },
            from_request,
            include_usage: false,
            expose: false,
        }
    }

    fn fields(body: &str, provider: LlmProvider) -> BodyFields {
        let wanted: Vec<Box<str>> = provider
            .answer_limits()
            .iter()
            .map(|f| (*f).into())
            .collect();
        BodyFields::read(body.as_bytes(), &wanted).expect("JSON")
    }

    #[test]
    fn a_request_reserves_its_prompts_estimate_and_its_answers_most() {
        let openai = priced(LlmProvider::OpenAi, true);
        // 80 bytes: a prompt of 20, and 100 tokens answered at 4 each.
        let body = format!(
            r#"{{"model":"gpt-4o","max_tokens":100,"x":"{}"}}"#,
            "a".repeat(38)
        );
        assert_eq!(body.len(), 80);
        assert_eq!(
            openai.reservation(Some(&fields(&body, LlmProvider::OpenAi))),
            20 + 400
        );
        // The newer field first.
        let both = r#"{"max_completion_tokens":10,"max_tokens":100}"#;
        let prompt = (both.len() as u64).div_ceil(4);
        assert_eq!(
            openai.reservation(Some(&fields(both, LlmProvider::OpenAi))),
            prompt + 40
        );
        // Anthropic reads max_tokens only.
        let anthropic = priced(LlmProvider::Anthropic, true);
        let body = r#"{"max_completion_tokens":10,"max_tokens":100}"#;
        assert_eq!(
            anthropic.reservation(Some(&fields(body, LlmProvider::Anthropic))),
            prompt + 400
        );
    }

    #[test]
    fn a_request_that_does_not_say_reserves_the_most_it_can_be_charged() {
        let openai = priced(LlmProvider::OpenAi, true);
        assert_eq!(openai.reservation(None), 10_000);
        for body in [
            r#"{"model":"a"}"#,
            r#"{"max_tokens":-1}"#,
            r#"{"max_tokens":"lots"}"#,
            r#"{"max_tokens":1.5}"#,
        ] {
            assert_eq!(
                openai.reservation(Some(&fields(body, LlmProvider::OpenAi))),
                10_000,
                "{body}"
            );
        }
        // Never above max, whatever it asks.
        let huge = r#"{"max_tokens":18446744073709551615}"#;
        assert_eq!(
            openai.reservation(Some(&fields(huge, LlmProvider::OpenAi))),
            10_000
        );
        // A fixed reservation ignores the body.
        let fixed = priced(LlmProvider::OpenAi, false);
        assert_eq!(
            fixed.reservation(Some(&fields(huge, LlmProvider::OpenAi))),
            50
        );
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
