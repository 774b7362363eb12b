//! `[[limits]]` (with their tiers and matches), `[[costs]]` and `[exempt]`:
//! the policy requests are held to. The numbers each algorithm takes come
//! from the algorithm table.

use std::collections::HashSet;
use std::time::Duration;

use http::{HeaderName, Method};

use super::duration;
use super::file::{
    AlgorithmName, BanSection, CostSection, CountSection, ExemptSection, LeasesMode, LimitSection,
    MatchSection, Numbers, OnMissingName, OneOrMany, ReserveSpec, ResponseCostSection, StatusName,
    UpgradesName, CONCURRENCY,
};
use super::source::Segment;
use super::{at, key_path, AsSegment, Invalid};
use floodgate_algorithm::{
    takes_lease, Algorithm, AlgorithmError, Calendar, Kind, Parameter, Period, MAX_EXACT,
    MAX_SLIDING_LOG,
};
use floodgate_limiter::MAX_LEASE_US;
use floodgate_limiter::{LimitName, OnFailure};
use floodgate_policy::identity::{Tier, Tiers};
use floodgate_policy::jwt::ClaimPath;
use floodgate_policy::path::{EscapedSlashes, PathRules};
use floodgate_policy::{
    AfterResponse, Ban, Concurrency, CostRule, CostSource, DescriptorPattern, EntryPattern,
    HostPattern, KeySource, Limit, LlmProvider, Matcher, OnMissing, PathPattern, ResponseCost,
    Rule, Statuses, Upgrades, MAX_DESCRIPTOR_TEXT, MAX_ENTRIES,
};

fn sorted(tiers: &Tiers) -> String {
    let mut v: Vec<&str> = tiers.names().collect();
    v.sort_unstable();
    v.join(", ")
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
    let canonical = floodgate_policy::path::normalize(p.as_bytes(), EscapedSlashes::Keep)
        .map_err(|e| format!("\"{p}\" is not a path a request can have: {e}"))?;
    Ok(PathPattern::new(&canonical))
}

/// `match = { domain, descriptors }`: a limit of the rate limit service,
/// matched by Envoy's descriptors rather than by HTTP requests.
fn descriptor_match(
    m: &MatchSection,
    path: &[&dyn AsSegment],
) -> Result<DescriptorPattern, Invalid> {
    let here = |key: &str| key_path(path, key);
    let http = [
        ("methods", !m.methods.is_empty()),
        ("paths", !m.paths.is_empty()),
        ("hosts", !m.hosts.is_empty()),
        ("headers", !m.headers.is_empty()),
        ("body", !m.body.is_empty()),
    ];
    if let Some((key, _)) = http.iter().find(|(_, given)| *given) {
        return Err((
            here(key),
            format!(
                "a limit on a domain's descriptors meets no HTTP request: `{key}` does not apply"
            ),
        ));
    }
    let domain = m.domain.as_deref().ok_or_else(|| {
        (
            here("descriptors"),
            "descriptors belong to a domain: set `domain` too, as Envoy's ratelimit filter names it".to_string(),
        )
    })?;
    if domain.is_empty() || domain.len() > MAX_DESCRIPTOR_TEXT {
        return Err((
            here("domain"),
            format!("must be 1 to {MAX_DESCRIPTOR_TEXT} characters"),
        ));
    }
    if m.descriptors.is_empty() || m.descriptors.len() > MAX_ENTRIES {
        return Err((
            here("descriptors"),
            format!("name the descriptor's entries in order, 1 to {MAX_ENTRIES} of them, e.g. [[\"remote_address\"], [\"path\", \"/login\"]]"),
        ));
    }
    let mut entries: Vec<EntryPattern> = Vec::with_capacity(m.descriptors.len());
    for (j, entry) in m.descriptors.iter().enumerate() {
        let at_entry = || {
            let mut p: Vec<Segment> = path.iter().map(|s| s.segment()).collect();
            p.push(Segment::Key("descriptors".into()));
            p.push(Segment::Index(j));
            p
        };
        let (key, value) = match entry.as_slice() {
            [key] => (key, None),
            [key, value] => (key, Some(value)),
            _ => {
                return Err((
                    at_entry(),
                    "an entry is [key] (any value) or [key, value] (that value; '*' for any run of characters)".into(),
                ))
            }
        };
        if key.is_empty() || key.len() > MAX_DESCRIPTOR_TEXT {
            return Err((
                at_entry(),
                format!("an entry's key must be 1 to {MAX_DESCRIPTOR_TEXT} characters"),
            ));
        }
        if entries.iter().any(|e| *e.key == **key) {
            return Err((
                at_entry(),
                format!("\"{key}\" is named twice: a `descriptor:{key}` key could not tell which"),
            ));
        }
        entries.push(EntryPattern {
            key: key.as_str().into(),
            value: value.map(|v| PathPattern::glob(v)),
        });
    }
    Ok(DescriptorPattern {
        domain: domain.into(),
        entries,
    })
}

pub(super) fn validate_match(
    m: &MatchSection,
    path: &[&dyn AsSegment],
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Matcher, Invalid> {
    if m.domain.is_some() || !m.descriptors.is_empty() {
        return Ok(Matcher {
            descriptors: Some(descriptor_match(m, path)?),
            ..Matcher::default()
        });
    }
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
    let hosts = m
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let name = h.strip_prefix("*.").unwrap_or(h);
            // No port: hosts are compared without one.
            let valid = !name.is_empty()
                && (name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
                    || (name.starts_with('[') && name.ends_with(']')));
            if valid {
                Ok(HostPattern::new(h))
            } else {
                Err((
                    sub("hosts", i),
                    format!("\"{h}\" is not a host name without port (or \"*.\" and a domain)"),
                ))
            }
        })
        .collect::<Result<_, _>>()?;
    let headers = m
        .headers
        .iter()
        .map(|(name, glob)| {
            let mut at: Vec<Segment> = path.iter().map(|s| s.segment()).collect();
            at.push(Segment::Key("headers".into()));
            at.push(Segment::Key(name.clone()));
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| (at, format!("\"{name}\" is not a valid header name")))?;
            Ok((name, PathPattern::glob(glob)))
        })
        .collect::<Result<_, Invalid>>()?;
    let body = m
        .body
        .iter()
        .map(|(field, patterns)| {
            let mut at: Vec<Segment> = path.iter().map(|s| s.segment()).collect();
            at.push(Segment::Key("body".into()));
            at.push(Segment::Key(field.clone()));
            if field.is_empty() {
                return Err((
                    at,
                    "name a top-level field of the JSON body, like `model`".into(),
                ));
            }
            let globs: Vec<PathPattern> = match patterns {
                OneOrMany::One(glob) => vec![PathPattern::glob(glob)],
                OneOrMany::Many(globs) => globs.iter().map(|g| PathPattern::glob(g)).collect(),
            };
            if globs.is_empty() {
                return Err((at, "give at least one pattern".into()));
            }
            Ok((field.as_str().into(), globs))
        })
        .collect::<Result<_, Invalid>>()?;
    Ok(Matcher {
        methods,
        paths,
        hosts,
        headers,
        descriptors: None,
        body,
    })
}

fn validate_key(key: &str) -> Result<KeySource, String> {
    let named = |prefix: &str| {
        key.strip_prefix(prefix)
            .filter(|name| !name.is_empty() && !name.contains(['=', ';', '&', ' ']))
    };
    match key {
        "ip" => Ok(KeySource::Ip),
        "api_key" => Ok(KeySource::ApiKey),
        "global" => Ok(KeySource::Global),
        "host" => Ok(KeySource::Host),
        "route" => Ok(KeySource::Route),
        "descriptor" => Ok(KeySource::Descriptor),
        other if other.starts_with("descriptor:") => named("descriptor:")
            .map(|key| KeySource::Entry(key.into()))
            .ok_or_else(|| format!("\"{other}\" needs an entry's key after \"descriptor:\", like \"descriptor:remote_address\"")),
        other if other.starts_with("body:") => other
            .strip_prefix("body:")
            .filter(|field| !field.is_empty())
            .map(|field| KeySource::Body(field.into()))
            .ok_or_else(|| format!("\"{other}\" needs a top-level field of the JSON body after \"body:\", like \"body:model\"")),
        other if other.starts_with("jwt:") => ClaimPath::parse(&other["jwt:".len()..])
            .map(KeySource::Jwt)
            .ok_or_else(|| format!("\"{other}\" needs a claim after \"jwt:\", like \"jwt:sub\" or \"jwt:org.id\"")),
        other if other.starts_with("header:") => {
            let name = &other["header:".len()..];
            HeaderName::from_bytes(name.as_bytes())
                .map(KeySource::Header)
                .map_err(|_| format!("\"{name}\" is not a valid header name"))
        }
        other if other.starts_with("cookie:") => named("cookie:")
            .map(|name| KeySource::Cookie(name.into()))
            .ok_or_else(|| format!("\"{other}\" needs a cookie name after \"cookie:\"")),
        // Names are compared as requests' are read: decoded.
        other if other.starts_with("query:") => named("query:")
            .map(|name| {
                KeySource::Query(String::from_utf8_lossy(&floodgate_policy::identity::form_decode(name)).into())
            })
            .ok_or_else(|| format!("\"{other}\" needs a parameter name after \"query:\"")),
        other => Err(format!(
            "unknown key \"{other}\" (expected \"ip\", \"api_key\", \"header:<Name>\", \"cookie:<name>\", \"query:<name>\", \"jwt:<claim>\", \"host\", \"route\", \"global\", \"descriptor:<key>\", \"descriptor\", \"body:<field>\", or a list of them)"
        )),
    }
}

/// `key = "..."` or a composite `key = ["...", "..."]`; a claim only
/// where tokens are verified.
fn validate_keys(key: &OneOrMany, i: usize, jwt: bool) -> Result<KeySource, Invalid> {
    let key_source = validate_keys_unchecked(key, i)?;
    if key_source.any_part(|p| matches!(p, KeySource::Jwt(_))) && !jwt {
        return Err(at(
            &[&"limits", &i, &"key"],
            "a claim is read from a verified token: configure [clients.jwt]",
        ));
    }
    Ok(key_source)
}

fn validate_keys_unchecked(key: &OneOrMany, i: usize) -> Result<KeySource, Invalid> {
    match key {
        OneOrMany::One(key) => validate_key(key).map_err(|m| at(&[&"limits", &i, &"key"], m)),
        OneOrMany::Many(keys) => {
            if keys.len() < 2 {
                return Err(at(
                    &[&"limits", &i, &"key"],
                    "a composite key names two or more keys",
                ));
            }
            let parts = keys
                .iter()
                .enumerate()
                .map(|(j, k)| match validate_key(k) {
                    Ok(KeySource::Global) => Err(at(
                        &[&"limits", &i, &"key", &j],
                        "\"global\" adds nothing to a composite key",
                    )),
                    Ok(KeySource::Descriptor) => Err(at(
                        &[&"limits", &i, &"key", &j],
                        "\"descriptor\" reads every entry already: list `descriptor:<key>` parts instead",
                    )),
                    Ok(part) => Ok(part),
                    Err(m) => Err(at(&[&"limits", &i, &"key", &j], m)),
                })
                .collect::<Result<_, _>>()?;
            Ok(KeySource::Composite(parts))
        }
    }
}

fn validate_limit(
    i: usize,
    s: &LimitSection,
    default_on_failure: OnFailure,
    known_tiers: &Tiers,
    jwt: bool,
    instances: u64,
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
    let key = validate_keys(&s.key, i, jwt)?;
    let own = s.numbers();
    let path: [&dyn AsSegment; 2] = [&"limits", &i];
    let frame = s.frame();
    let rule = rule_of(&frame, &own, None, &path)?;
    let mut tiers = Vec::new();
    for (tier, overrides) in &s.tiers {
        let path: [&dyn AsSegment; 4] = [&"limits", &i, &"tiers", tier];
        let Some(known) = known_tiers.get(tier) else {
            return Err(at(
                &path,
                format!("unknown tier \"{tier}\" (known: {})", sorted(known_tiers)),
            ));
        };
        tiers.push((known, rule_of(&frame, overrides, Some(&own), &path)?));
    }
    let matcher = match &s.matcher {
        Some(m) => validate_match(m, &[&"limits", &i, &"match"], compile_pattern)?,
        None => Matcher::default(),
    };
    if let Some(pattern) = &matcher.descriptors {
        descriptor_limit(i, s, &key, pattern)?;
    } else if key.reads_descriptor() {
        return Err(at(
            &[&"limits", &i, &"key"],
            format!(
                "{} reads a descriptor of the rate limit service: match the limit by `domain` and `descriptors`",
                key.describe()
            ),
        ));
    }
    let after_response = match (&s.count, &s.cost_from_response) {
        (Some(_), Some(_)) => {
            return Err(at(
                &[&"limits", &i, &"cost_from_response"],
                "a limit is charged by `count` or by `cost_from_response`, not both",
            ))
        }
        (Some(count), None) => Some(AfterResponse::Status(statuses(count, &rule, i)?)),
        (None, Some(priced)) => {
            let mut rules = vec![rule];
            rules.extend(tiers.iter().map(|(_, r)| *r));
            Some(AfterResponse::Cost(response_cost(
                priced, &rules, instances, i,
            )?))
        }
        (None, None) => None,
    };
    let ban = match &s.ban {
        None => None,
        Some(_) if s.shadow => {
            return Err(at(
                &[&"limits", &i, &"ban"],
                "a shadow limit refuses nobody, so it can ban nobody",
            ))
        }
        Some(_) if !key.per_client() => {
            return Err(at(
                &[&"limits", &i, &"ban"],
                format!(
                    "a limit keyed {} has one key for everyone: its ban would shut everyone out",
                    key.describe()
                ),
            ))
        }
        Some(_) if !key.unforgeable() && !s.ban_on_client_keys => {
            return Err(at(
                &[&"limits", &i, &"ban"],
                format!(
                    "a limit keyed {} bans whatever value a request carries, and anyone can send another client's: one client could ban another. Key it on something a client cannot choose (ip, api_key, jwt:<claim>, or a list with one of them), or set ban_on_client_keys = true if that is what you mean",
                    key.describe()
                ),
            ))
        }
        Some(section) => Some(ban(section, &s.name, i)?),
    };
    if s.ban_on_client_keys && s.ban.is_none() {
        return Err(at(
            &[&"limits", &i, &"ban_on_client_keys"],
            "applies only to a limit with a `ban`",
        ));
    }
    let chosen_by_client = |p: &KeySource| {
        matches!(
            p,
            KeySource::Header(_) | KeySource::Cookie(_) | KeySource::Query(_)
        )
    };
    if s.case_insensitive_values && !key.any_part(chosen_by_client) {
        return Err(at(
            &[&"limits", &i, &"case_insensitive_values"],
            format!(
                "applies to header:, cookie: and query: keys, and this limit is keyed {}",
                key.describe()
            ),
        ));
    }
    Ok(Limit {
        id: xxhash_rust::xxh3::xxh3_64(s.name.as_bytes()),
        name: LimitName::new(&s.name),
        key,
        rule,
        tiers,
        matcher,
        shadow: s.shadow,
        on_failure: s.on_failure.map_or(default_on_failure, Into::into),
        after_response,
        ban,
        on_missing: match (s.on_missing, s.shadow) {
            (Some(OnMissingName::Deny), true) => {
                return Err(at(
                    &[&"limits", &i, &"on_missing"],
                    "a shadow limit refuses nobody: \"deny\" would refuse for it",
                ))
            }
            (None | Some(OnMissingName::Skip), _) => OnMissing::Skip,
            (Some(OnMissingName::Deny), _) => OnMissing::Deny,
            (Some(OnMissingName::Ip), _) => OnMissing::Ip,
        },
        case_insensitive_values: s.case_insensitive_values,
        leases: false,
    })
}

/// What a limit of the rate limit service may be: a rate over time, keyed
/// on its descriptor's entries (or on everyone), and none of what needs an
/// HTTP exchange (a response to count, a request to hold or to delay) or
/// a client floodgate knows (tiers, bans).
fn descriptor_limit(
    i: usize,
    s: &LimitSection,
    key: &KeySource,
    pattern: &DescriptorPattern,
) -> Result<(), Invalid> {
    let limit: [&dyn AsSegment; 2] = [&"limits", &i];
    let refuse = |field: &str, why: &str| -> Result<(), Invalid> {
        Err((
            key_path(&limit, field),
            format!("`{field}` does not apply to a limit on descriptors: {why}"),
        ))
    };
    match s.algorithm {
        AlgorithmName::Concurrency => {
            return Err((
                key_path(&limit, "algorithm"),
                format!("{CONCURRENCY} does not apply to a limit on descriptors: Envoy asks once per request and never says when it ends"),
            ));
        }
        AlgorithmName::Rate(Kind::LeakyBucket) => {
            return Err((
                key_path(&limit, "algorithm"),
                "leaky_bucket does not apply to a limit on descriptors: Envoy cannot hold a request until its slot; use token_bucket".to_string(),
            ));
        }
        AlgorithmName::Rate(_) => {}
    }
    if s.count.is_some() {
        return refuse("count", "the rate limit service never sees the response");
    }
    if s.cost_from_response.is_some() {
        return refuse("cost_from_response", "the rate limit service never sees the response; the cost is the hits_addend Envoy sends");
    }
    if s.ban.is_some() {
        return refuse(
            "ban",
            "Envoy's descriptors say nothing floodgate can ban on every route",
        );
    }
    if !s.tiers.is_empty() {
        return refuse("tiers", "a descriptor carries no API key or token, so no tier; give each tier its own descriptor");
    }
    if s.on_missing.is_some() {
        return refuse(
            "on_missing",
            "a descriptor the limit matches carries every entry its key reads",
        );
    }
    if s.case_insensitive_values {
        return refuse(
            "case_insensitive_values",
            "entries are compared as Envoy sends them",
        );
    }
    let parts: &[KeySource] = match key {
        KeySource::Composite(parts) => parts,
        one => std::slice::from_ref(one),
    };
    for (j, part) in parts.iter().enumerate() {
        let key_at: Vec<&dyn AsSegment> = match key {
            KeySource::Composite(_) => vec![&"limits", &i, &"key", &j],
            _ => vec![&"limits", &i, &"key"],
        };
        match part {
            KeySource::Global | KeySource::Descriptor => {}
            KeySource::Entry(name) if pattern.names(name) => {}
            KeySource::Entry(name) => {
                let named: Vec<&str> = pattern.entries.iter().map(|e| &*e.key).collect();
                return Err(at(
                    &key_at,
                    format!(
                        "the descriptor has no entry \"{name}\" (its entries: {})",
                        named.join(", ")
                    ),
                ));
            }
            other => {
                return Err(at(
                    &key_at,
                    format!(
                        "{} reads an HTTP request, which a limit on descriptors never sees: key it on \"descriptor:<key>\", \"descriptor\" or \"global\"",
                        other.describe()
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Whether a limit's decisions may come from leases: `[redis].leases`
/// unless the limit says otherwise, and only for an algorithm whose units
/// can be leased.
fn leases_for(i: usize, s: &LimitSection, limit: &Limit, redis: bool) -> Result<bool, Invalid> {
    let kind = match limit.rule {
        Rule::Rate(algorithm) => Some(algorithm.kind()),
        Rule::Concurrency(_) => None,
    };
    // A bucket counting in fractions of a µs leases as any other: its
    // leased tokens are a count on its ledger (crates/algorithm/src/ledger.rs),
    // never a stretch of its schedule.
    let refusal = match kind {
        Some(kind) if !takes_lease(kind) => Some(format!(
            "{} decides every request on Redis (every admission is its own stamp or departure slot): it takes no leases",
            kind.name()
        )),
        None => Some(format!(
            "{CONCURRENCY} limits hold slots, which are leases already"
        )),
        // A bucket's refund moves its schedule back, which would free
        // tokens that another instance holds leased.
        Some(Kind::TokenBucket) if limit.after_response.is_some() => Some(
            "a token bucket charged by the response takes no leases: its refunds would free tokens another instance holds leased".to_string(),
        ),
        Some(_) => None,
    };
    match (s.leases, refusal) {
        (None, refusal) => Ok(redis && refusal.is_none()),
        (Some(LeasesMode::Off), _) => Ok(false),
        (Some(LeasesMode::Auto), Some(reason)) => Err(at(&[&"limits", &i, &"leases"], reason)),
        (Some(LeasesMode::Auto), None) => Ok(redis),
    }
}

/// `cost_from_response`: on the algorithms whose balance can be owed (not
/// a log of stamps, not a schedule of departures).
fn response_cost(
    section: &ResponseCostSection,
    rules: &[Rule],
    instances: u64,
    i: usize,
) -> Result<ResponseCost, Invalid> {
    let here = |key: &str| key_path(&[&"limits", &i, &"cost_from_response"], key);
    let mut most = MAX_EXACT / 4;
    // The limit and each tier: one response's cost must fit under each's
    // ceiling, so that it is always owed in full, on an instance's share
    // too (the local fallback divides a bucket's rate among `instances`).
    for rule in rules {
        match rule {
            Rule::Rate(algorithm) if algorithm.owes_costs() => {
                let owed = algorithm.without_ceiling();
                most = most.min(owed.quota()).min(owed.divided(instances).quota());
            }
            Rule::Rate(algorithm) => {
                return Err(at(
                    &[&"limits", &i, &"cost_from_response"],
                    format!(
                        "`cost_from_response` does not apply to {}; use token_bucket, fixed_window or quota",
                        algorithm.name()
                    ),
                ))
            }
            Rule::Concurrency(_) => {
                return Err(at(
                    &[&"limits", &i, &"cost_from_response"],
                    format!("`cost_from_response` does not apply to {CONCURRENCY}"),
                ))
            }
        }
    }
    let source = cost_source(section, &here)?;
    let whole = |key: &'static str, value: i64| -> Result<u64, Invalid> {
        u64::try_from(value)
            .ok()
            .filter(|&v| v <= most)
            .ok_or_else(|| {
                (
                    here(key),
                    format!("must be a whole number from 0 to {most}"),
                )
            })
    };
    let max = whole("max", section.max)?;
    if max == 0 {
        return Err((here("max"), "must be at least 1".into()));
    }
    let default = whole("default", section.default.unwrap_or(1))?;
    if default > max {
        return Err((here("default"), format!("must be at most `max` ({max})")));
    }
    // What a request takes before it goes upstream: it must fit in the
    // limit (and in an instance's share of it, which decides while the
    // shared store is away), or no request could ever pass.
    let from_request = match &section.reserve {
        Some(ReserveSpec::Named(name)) if name == "request" => {
            if !matches!(source, CostSource::Usage { .. }) {
                return Err((
                    here("reserve"),
                    "a request's own worst case is read for a `usage` (its max_tokens); with a `header`, reserve a number".into(),
                ));
            }
            true
        }
        Some(ReserveSpec::Named(other)) => {
            return Err((
                here("reserve"),
                format!("\"{other}\" is no reservation: a whole number, or \"request\" (the request's own max_tokens and prompt)"),
            ))
        }
        _ => false,
    };
    // A request that tells nothing reserves `max`: what it can be charged.
    let reserve = match section.reserve {
        Some(ReserveSpec::Units(r)) => whole("reserve", r)?,
        Some(ReserveSpec::Named(_)) => max,
        None => default.max(1),
    };
    let fits = rules
        .iter()
        .map(|rule| match rule {
            Rule::Rate(algorithm) => algorithm.divided(instances).quota(),
            Rule::Concurrency(c) => c.max,
        })
        .min()
        .unwrap_or(u64::MAX);
    let key = if from_request {
        "max"
    } else if section.reserve.is_some() {
        "reserve"
    } else {
        "default"
    };
    if reserve == 0 {
        return Err((here(key), "a reservation must be at least 1".into()));
    }
    if reserve > fits {
        return Err((
            here(key),
            format!(
                "a request reserves {reserve} before it goes upstream{}, more than the limit holds ({fits}{}): none could pass; set a smaller `{key}`",
                if from_request { " when it does not say its max_tokens" } else { "" },
                if instances > 1 { ", an instance's share" } else { "" }
            ),
        ));
    }
    let openai = matches!(
        source,
        CostSource::Usage {
            provider: LlmProvider::OpenAi,
            ..
        }
    );
    if section.include_usage && !openai {
        return Err((
            here("include_usage"),
            "only an OpenAI stream leaves its usage out unless asked: set it with `usage = \"openai\"`".into(),
        ));
    }
    Ok(ResponseCost {
        source,
        max,
        default,
        reserve,
        from_request,
        include_usage: section.include_usage,
        expose: section.expose,
    })
}

/// Where the response says its cost: a header of its own, or an LLM
/// provider's usage in the body, priced by the weights.
fn cost_source(
    section: &ResponseCostSection,
    here: &dyn Fn(&str) -> Vec<Segment>,
) -> Result<CostSource, Invalid> {
    let weights = [
        ("prompt_weight", section.prompt_weight),
        ("completion_weight", section.completion_weight),
    ];
    match (&section.header, &section.usage) {
        (Some(_), Some(_)) | (None, None) => Err((
            here("usage"),
            "give the cost's source: `header` (a response header's number) or `usage` (\"openai\" or \"anthropic\": the tokens the answer's body reports), one of them".into(),
        )),
        (Some(name), None) => {
            if let Some((key, _)) = weights.iter().find(|(_, w)| w.is_some()) {
                return Err((
                    here(key),
                    "weights price a `usage`; a header's number is the cost itself".into(),
                ));
            }
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                (
                    here("header"),
                    format!("\"{name}\" is not a valid header name"),
                )
            })?;
            // Removing one of these from a response would break its framing.
            const FRAMING: [&str; 8] = [
                "connection",
                "content-length",
                "keep-alive",
                "proxy-connection",
                "te",
                "trailer",
                "transfer-encoding",
                "upgrade",
            ];
            if FRAMING.contains(&header.as_str()) {
                return Err((
                    here("header"),
                    format!("\"{name}\" frames the response; name a header of its own"),
                ));
            }
            Ok(CostSource::Header(header))
        }
        (None, Some(provider)) => {
            let provider = match provider.as_str() {
                "openai" => LlmProvider::OpenAi,
                "anthropic" => LlmProvider::Anthropic,
                other => {
                    return Err((
                        here("usage"),
                        format!("\"{other}\" is no provider whose usage floodgate reads: \"openai\" (and every OpenAI-compatible server) or \"anthropic\""),
                    ))
                }
            };
            // A price per token: up to a million micro-units keeps any
            // count floodgate reads within the exact range once summed.
            let weight = |key: &'static str, value: Option<i64>| -> Result<u64, Invalid> {
                u64::try_from(value.unwrap_or(1))
                    .ok()
                    .filter(|&w| w <= 1_000_000)
                    .ok_or_else(|| (here(key), "must be a whole number from 0 to 1000000".into()))
            };
            let prompt_weight = weight("prompt_weight", section.prompt_weight)?;
            let completion_weight = weight("completion_weight", section.completion_weight)?;
            if prompt_weight == 0 && completion_weight == 0 {
                return Err((
                    here("completion_weight"),
                    "with both weights 0 every answer costs nothing".into(),
                ));
            }
            if section.expose {
                return Err((
                    here("expose"),
                    "a usage is read from the body: there is no header to expose".into(),
                ));
            }
            Ok(CostSource::Usage {
                provider,
                prompt_weight,
                completion_weight,
            })
        }
    }
}

/// `ban`: its strikes and its penalty as limits of their own, named
/// `strikes:<limit>` and `ban:<limit>` (a ':' no limit's name can hold), so
/// that their state never meets a limit's, nor a concurrency limit's
/// (`slots:<limit>`).
fn ban(section: &BanSection, limit: &str, i: usize) -> Result<Ban, Invalid> {
    let here = |key: &str| key_path(&[&"limits", &i, &"ban"], key);
    let after = u64::try_from(section.after)
        .ok()
        .filter(|a| (1..=MAX_SLIDING_LOG).contains(a))
        .ok_or_else(|| {
            (
                here("after"),
                format!("must be a whole number from 1 to {MAX_SLIDING_LOG}"),
            )
        })?;
    const YEAR: Duration = Duration::from_secs(365 * 86_400);
    let span = |key: &'static str, text: &str| -> Result<u64, Invalid> {
        let d = duration::parse(text).map_err(|m| (here(key), m))?;
        if d < Duration::from_secs(1) || d > YEAR {
            return Err((here(key), "must be from 1s to 365d".into()));
        }
        Ok(d.as_micros() as u64)
    };
    let within_us = span("within", &section.within)?;
    let duration_us = span("duration", &section.duration)?;
    // One stamp per strike, `after` of them over `within`: within the
    // sliding log's range by the bounds above.
    let strikes =
        Algorithm::sliding_log(after, within_us).map_err(|e| (here("within"), e.to_string()))?;
    let penalty =
        Algorithm::token_bucket(1, duration_us).map_err(|e| (here("duration"), e.to_string()))?;
    let named = |kind: &str| {
        let name = format!("{kind}:{limit}");
        (
            LimitName::new(&name),
            xxhash_rust::xxh3::xxh3_64(name.as_bytes()),
        )
    };
    let (strikes_name, strikes_id) = named("strikes");
    let (penalty_name, penalty_id) = named("ban");
    Ok(Ban {
        strikes,
        strikes_name,
        strikes_id,
        penalty,
        penalty_name,
        penalty_id,
    })
}

/// `count = { statuses = [...] }`: final statuses (200 to 599; an
/// interim 1xx is never the answer) and classes like "4xx".
fn statuses(count: &CountSection, rule: &Rule, i: usize) -> Result<Statuses, Invalid> {
    match rule {
        Rule::Concurrency(_) => {
            return Err(at(
                &[&"limits", &i, &"count"],
                format!("`count` does not apply to {CONCURRENCY}: a request in flight is counted while it lasts"),
            ));
        }
        // A peek of a leaky bucket gives a departure slot it does not keep:
        // requests checked together would all leave at once.
        Rule::Rate(algorithm) if algorithm.kind() == Kind::LeakyBucket => {
            return Err(at(
                &[&"limits", &i, &"count"],
                "`count` does not apply to leaky_bucket, which schedules requests as they arrive",
            ));
        }
        Rule::Rate(_) => {}
    }
    if count.statuses.is_empty() {
        return Err(at(
            &[&"limits", &i, &"count", &"statuses"],
            "name at least one status, e.g. [401, 403] or [\"5xx\"]",
        ));
    }
    let ranges = count
        .statuses
        .iter()
        .enumerate()
        .map(|(j, status)| {
            let bad = || {
                at(
                    &[&"limits", &i, &"count", &"statuses", &j],
                    "must be a final status from 200 to 599, or a class like \"4xx\"",
                )
            };
            match status {
                StatusName::Code(code) => u16::try_from(*code)
                    .ok()
                    .filter(|c| (200..=599).contains(c))
                    .map(|c| (c, c))
                    .ok_or_else(bad),
                StatusName::Class(class) => match class.to_ascii_lowercase().as_bytes() {
                    [digit @ b'2'..=b'5', b'x', b'x'] => {
                        let low = u16::from(digit - b'0') * 100;
                        Ok((low, low + 99))
                    }
                    _ => Err(bad()),
                },
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Statuses::new(ranges))
}

/// What a limit's numbers are read with, beside the numbers: its
/// algorithm and the settings that are the limit's whatever the tier (or
/// the client's override) says. Kept by `OverrideRules` to check numbers
/// given at run time as the file's are.
#[derive(Debug, Clone)]
pub(super) struct RuleFrame {
    pub(super) algorithm: AlgorithmName,
    pub(super) lease: Option<String>,
    pub(super) upgrades: Option<UpgradesName>,
    pub(super) timezone: Option<String>,
    pub(super) week_starts: Option<String>,
}

impl LimitSection {
    pub(super) fn frame(&self) -> RuleFrame {
        RuleFrame {
            algorithm: self.algorithm,
            lease: self.lease.clone(),
            upgrades: self.upgrades,
            timezone: self.timezone.clone(),
            week_starts: self.week_starts.clone(),
        }
    }
}

/// A limit's (or a tier's, or a client's) rule: its algorithm's numbers,
/// or a concurrency limit's.
pub(super) fn rule_of(
    s: &RuleFrame,
    own: &Numbers,
    base: Option<&Numbers>,
    path: &[&dyn AsSegment],
) -> Result<Rule, Invalid> {
    let field = |name: &str| key_path(path, name);
    match s.algorithm {
        AlgorithmName::Rate(kind) => {
            let concurrency_only = [
                ("max", own.max.is_some()),
                ("lease", s.lease.is_some()),
                ("upgrades", s.upgrades.is_some()),
            ];
            if let Some((name, _)) = concurrency_only.iter().find(|(_, given)| *given) {
                return Err((
                    field(name),
                    format!("`{name}` does not apply to {}", kind.name()),
                ));
            }
            if kind == Kind::Quota {
                return calendar_quota(s, own, base, path).map(Rule::Rate);
            }
            let quota_only = [
                ("timezone", s.timezone.is_some()),
                ("week_starts", s.week_starts.is_some()),
            ];
            if let Some((name, _)) = quota_only.iter().find(|(_, given)| *given) {
                return Err((
                    field(name),
                    format!("`{name}` does not apply to {}", kind.name()),
                ));
            }
            numbers(kind, own, base, path).map(Rule::Rate)
        }
        AlgorithmName::Concurrency => {
            let quota_only = [
                ("timezone", s.timezone.is_some()),
                ("week_starts", s.week_starts.is_some()),
            ];
            if let Some((name, _)) = quota_only.iter().find(|(_, given)| *given) {
                return Err((
                    field(name),
                    format!("`{name}` does not apply to {CONCURRENCY}"),
                ));
            }
            if let Some(&foreign) = Parameter::ALL.iter().find(|&&p| own.has(p)) {
                return Err((
                    field(foreign.name()),
                    format!("`{}` does not apply to {CONCURRENCY}", foreign.name()),
                ));
            }
            let max = own
                .max
                .or_else(|| base.and_then(|b| b.max))
                .ok_or_else(|| (field("max"), format!("{CONCURRENCY} needs `max`")))?;
            if max.fract() != 0.0 || max < 1.0 || max > MAX_EXACT as f64 {
                return Err((
                    field("max"),
                    format!("must be a whole number of at least 1 (got {max})"),
                ));
            }
            let lease = match &s.lease {
                None => DEFAULT_LEASE,
                Some(text) => duration::parse(text).map_err(|m| (field("lease"), m))?,
            };
            let lease_us = u64::try_from(lease.as_micros()).unwrap_or(u64::MAX);
            if lease < Duration::from_millis(100) || lease_us > MAX_LEASE_US {
                return Err((field("lease"), "must be from 100ms to 12 days".to_string()));
            }
            Ok(Rule::Concurrency(Concurrency {
                max: max as u64,
                lease_us,
                upgrades: match s.upgrades {
                    None | Some(UpgradesName::Include) => Upgrades::Include,
                    Some(UpgradesName::Exclude) => Upgrades::Exclude,
                },
            }))
        }
    }
}

/// `algorithm = "quota"`: a limit per calendar period of a zone.
fn calendar_quota(
    s: &RuleFrame,
    own: &Numbers,
    base: Option<&Numbers>,
    path: &[&dyn AsSegment],
) -> Result<Algorithm, Invalid> {
    let field = |name: &str| key_path(path, name);
    let name = Kind::Quota.name();
    if let Some(&foreign) = Parameter::ALL
        .iter()
        .find(|&&p| p != Parameter::Limit && p != Parameter::Period && own.has(p))
    {
        return Err((
            field(foreign.name()),
            format!("`{}` does not apply to {name}", foreign.name()),
        ));
    }
    let limit = own
        .limit
        .or_else(|| base.and_then(|b| b.limit))
        .ok_or_else(|| (field("limit"), format!("{name} needs `limit`")))?;
    let limit = whole(limit).map_err(|m| (field("limit"), m))?;
    let period_name = own
        .period
        .as_ref()
        .or_else(|| base.and_then(|b| b.period.as_ref()))
        .ok_or_else(|| (field("period"), format!("{name} needs `period`")))?;
    let period = Period::from_name(period_name).ok_or_else(|| {
        (
            field("period"),
            format!(
                "\"{period_name}\" is not a calendar period (expected one of: {})",
                Period::NAMES.join(", ")
            ),
        )
    })?;
    // Zone and week are the limit's, whichever tier is being read.
    let limit_path = |key: &str| key_path(&path[..path.len().min(2)], key);
    let timezone = match &s.timezone {
        None => chrono_tz::UTC,
        Some(zone) => zone.parse().map_err(|_| {
            (
                limit_path("timezone"),
                format!(
                    "\"{zone}\" is not an IANA time zone name like \"Europe/Paris\" or \"UTC\""
                ),
            )
        })?,
    };
    let week_starts = match s.week_starts.as_deref() {
        Some(_) if period != Period::Week => {
            return Err((
                limit_path("week_starts"),
                "applies to period = \"week\" only".into(),
            ))
        }
        None => chrono::Weekday::Mon,
        Some(day) => day
            .parse::<chrono::Weekday>()
            .ok()
            .filter(|_| day.len() > 3)
            .ok_or_else(|| {
                (
                    limit_path("week_starts"),
                    format!("\"{day}\" is not a day of the week like \"monday\""),
                )
            })?,
    };
    let calendar = Calendar {
        period,
        timezone,
        week_starts,
    };
    Algorithm::calendar_quota(limit, calendar).map_err(|e| (field("limit"), e.to_string()))
}

/// A count as a config gives it: a whole number of at least 1. One beyond
/// what a u64 holds is out of every algorithm's range, which says so.
fn whole(number: f64) -> Result<u64, String> {
    if number.fract() != 0.0 || number < 1.0 {
        return Err(format!(
            "must be a whole number of at least 1 (got {number})"
        ));
    }
    // Whole and at least 1: the cast saturates only beyond u64::MAX.
    Ok(number as u64)
}

/// How long a concurrency slot is held unless renewed: long enough that
/// renewing costs little, short enough that an instance that died gives
/// its slots back within a minute.
const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// A limit's numbers as its algorithm's row of the table names them: the
/// quota a whole number, the period a rate per second or a window.
fn numbers(
    kind: Kind,
    own: &Numbers,
    base: Option<&Numbers>,
    path: &[&dyn AsSegment],
) -> Result<Algorithm, Invalid> {
    let spec = kind.spec();
    let field = |parameter: Parameter| key_path(path, parameter.name());
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
    let quota = whole(number(spec.quota)?).map_err(|m| (field(spec.quota), m))?;
    // Each range is the algorithm's, and so is its message, in the terms
    // of the file (per window, per second); a rate's is given what it got.
    let (algorithm, per_second) = if spec.period == Parameter::Window {
        let text = own
            .window
            .as_ref()
            .or_else(|| base.and_then(|b| b.window.as_ref()))
            .ok_or_else(|| needed(Parameter::Window))?;
        let window = duration::parse(text).map_err(|m| (field(Parameter::Window), m))?;
        if window < Duration::from_millis(1) {
            return Err((field(Parameter::Window), "must be at least 1ms".into()));
        }
        let window_us = u64::try_from(window.as_micros()).unwrap_or(u64::MAX);
        (Algorithm::new(kind, quota, window_us), None)
    } else {
        let per_second = number(spec.period)?;
        let algorithm = match kind {
            Kind::LeakyBucket => Algorithm::leaky_bucket_per_second(quota, per_second),
            _ => Algorithm::token_bucket_per_second(quota, per_second),
        };
        (algorithm, Some(per_second))
    };
    algorithm.map_err(|e| {
        let message = match (e, per_second) {
            (AlgorithmError::RateOutOfRange { .. }, Some(got)) => format!("{e} (got {got})"),
            _ => e.to_string(),
        };
        (field(e.parameter(kind)), message)
    })
}

/// Patterns are matched against paths as `[server]` says requests' paths are
/// read: case-insensitive matching compares lower-cased paths with
/// lower-cased patterns.
pub(super) fn pattern_compiler(paths: &PathRules) -> impl Fn(&str) -> Result<PathPattern, String> {
    let case_insensitive = paths.case_insensitive;
    move |p: &str| {
        if case_insensitive {
            path_pattern(&p.to_ascii_lowercase())
        } else {
            path_pattern(p)
        }
    }
}

/// `[exempt]`: the paths and the tiers no limit applies to.
pub(super) fn validate_exempt(
    e: &ExemptSection,
    known_tiers: &Tiers,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<(Vec<PathPattern>, Vec<Tier>), Invalid> {
    let mut tiers = Vec::new();
    for (i, tier) in e.tiers.iter().enumerate() {
        let Some(tier) = known_tiers.get(tier) else {
            return Err(at(
                &[&"exempt", &"tiers", &i],
                format!("unknown tier \"{tier}\" (known: {})", sorted(known_tiers)),
            ));
        };
        tiers.push(tier);
    }
    let paths = e
        .paths
        .iter()
        .enumerate()
        .map(|(i, p)| compile_pattern(p).map_err(|m| at(&[&"exempt", &"paths", &i], m)))
        .collect::<Result<_, _>>()?;
    Ok((paths, tiers))
}

/// Every `[[limits]]` table, in order; names are unique.
pub(super) fn validate_limits(
    sections: &[LimitSection],
    default_on_failure: OnFailure,
    known_tiers: &Tiers,
    jwt: bool,
    instances: u64,
    leases: bool,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Vec<Limit>, Invalid> {
    let mut limits = Vec::new();
    let mut names = HashSet::new();
    for (i, section) in sections.iter().enumerate() {
        let mut limit = validate_limit(
            i,
            section,
            default_on_failure,
            known_tiers,
            jwt,
            instances,
            compile_pattern,
        )?;
        limit.leases = leases_for(i, section, &limit, leases)?;
        if !names.insert(limit.name.clone()) {
            return Err(at(
                &[&"limits", &i, &"name"],
                format!("duplicate limit name \"{}\"", limit.name),
            ));
        }
        limits.push(limit);
    }
    Ok(limits)
}

/// How each limit reads a client's numbers given at run time, in the
/// limits' order.
pub(super) fn override_frames(sections: &[LimitSection]) -> Vec<Result<RuleFrame, &'static str>> {
    sections
        .iter()
        .map(|s| match s.cost_from_response {
            // Its reservation is sized from the file's numbers.
            Some(_) => Err("a limit charged by `cost_from_response` takes no overrides"),
            None => Ok(s.frame()),
        })
        .collect()
}

/// Every `[[costs]]` table, in order (for each limit, the first that
/// matches and prices it applies).
pub(super) fn validate_costs(
    sections: &[CostSection],
    limits: &[Limit],
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Vec<CostRule>, Invalid> {
    let mut costs = Vec::new();
    for (i, c) in sections.iter().enumerate() {
        if c.cost < 0 || c.cost as u64 > MAX_EXACT {
            return Err(at(
                &[&"costs", &i, &"cost"],
                "must be a whole number from 0 (a free request) upwards",
            ));
        }
        let mut priced = Vec::new();
        for (j, name) in c.limits.iter().enumerate() {
            let here = [&"costs" as &dyn AsSegment, &i, &"limits", &j];
            let Some(layer) = limits.iter().position(|l| l.name.as_str() == name) else {
                let known: Vec<&str> = limits.iter().map(|l| l.name.as_str()).collect();
                return Err(at(
                    &here,
                    format!(
                        "no limit is named \"{name}\" (limits: {})",
                        known.join(", ")
                    ),
                ));
            };
            let limit = &limits[layer];
            let why_not = match (&limit.rule, &limit.after_response) {
                _ if limit.matcher.descriptors.is_some() => {
                    Some("is charged the hits_addend Envoy sends")
                }
                (Rule::Concurrency(_), _) => Some("counts requests in flight"),
                (_, Some(AfterResponse::Cost(_))) => Some("is charged what the response says"),
                _ => None,
            };
            if let Some(why) = why_not {
                return Err(at(
                    &here,
                    format!("\"{name}\" has no cost to set: it {why}"),
                ));
            }
            priced.push(layer);
        }
        let matcher = validate_match(&c.matcher, &[&"costs", &i, &"match"], compile_pattern)?;
        if let Some((field, _)) = matcher.body.first() {
            return Err(at(
                &[&"costs", &i, &"match", &"body", &field.as_ref()],
                "[[costs]] price by the request's head; a limit of its own (`match = { body = ... }`) prices by its body",
            ));
        }
        if matcher.descriptors.is_some() {
            return Err(at(
                &[&"costs", &i, &"match", &"domain"],
                "[[costs]] price HTTP requests; a descriptor costs the hits_addend Envoy sends",
            ));
        }
        costs.push(CostRule {
            matcher,
            cost: c.cost as u64,
            limits: priced,
        });
    }
    Ok(costs)
}
