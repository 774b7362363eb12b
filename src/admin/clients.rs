//! `/v1/clients` and `/v1/limits`: one client's state under every limit
//! keyed on what the operator knows of it, read, reset or credited on the
//! store that holds it.

use std::net::IpAddr;

use http::HeaderName;
use serde_json::{json, Value};

use super::api_keys::rfc3339;
use super::reply::ApiError;
use crate::clients::StoredOverride;
use floodgate_algorithm::{Algorithm, Decision};
use floodgate_limiter::StateKey;
use floodgate_limiter::{Check, LimitId, LimitName, OnFailure, Store};
use floodgate_policy::identity::{ApiKey, KeySource, KnownPart, Tier, SUBJECT};
use floodgate_policy::overrides::OverrideKey;
use floodgate_policy::Limit;
use floodgate_policy::{OnMissing, Policy, Rule};

/// What the operator named the client by.
#[derive(Debug, Clone)]
enum Selector {
    Ip(IpAddr),
    /// By its keyed hash: the key itself need not be known.
    ApiKey(u128),
    Header(HeaderName, Vec<u8>),
    Cookie(String, Vec<u8>),
    Query(String, Vec<u8>),
    Subject(Vec<u8>),
    /// A rate limit service descriptor's entry (`descriptor:<key>` keys).
    Entry(String, Vec<u8>),
}

/// The parameters that name a client.
const SELECTORS: &str = "ip, api_key, key_hash, header (Name:value), cookie (name:value), query (name:value), jwt_sub or descriptor (key:value)";

/// A client as the operator named it, with the tier its limits' numbers
/// are read for.
pub struct Lookup {
    selector: Selector,
    pub tier: Tier,
    /// What logs and answers call the client (never a key in full).
    pub label: String,
    /// Whether the tier is the one the client's requests are in: named
    /// (`tier=`), or implied by a key or an internal address. A header, a
    /// cookie or a subject says nothing of it, nor does an outside
    /// address (its requests may carry a key).
    tier_known: bool,
}

/// One limit that applies to the client, with its state's key.
struct Applying {
    limit: LimitId,
    identity: u128,
    /// Keyed on the address because the client lacks the limit's key.
    by_address: bool,
}

fn split_pair<'a>(value: &'a str, what: &str) -> Result<(&'a str, &'a str), ApiError> {
    value
        .split_once(':')
        .filter(|(name, _)| !name.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("{what} takes name:value")))
}

impl Lookup {
    /// The client named by `params` (exactly one selector, and an optional
    /// `tier` that overrides the one the selector implies).
    pub fn from_params(policy: &Policy, params: &[(String, String)]) -> Result<Lookup, ApiError> {
        let clients = &policy.clients;
        let mut named = params
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "limit" | "tier" | "units"));
        let (Some((kind, value)), None) = (named.next(), named.next()) else {
            return Err(ApiError::bad_request(format!(
                "name the client by exactly one of {SELECTORS}"
            )));
        };
        let mut tier = None;
        // An internal address or a token's tier claim comes before a key's
        // tier: where either exists, a key does not settle it.
        let key_settles_tier = clients.internal.is_empty()
            && clients
                .jwt
                .as_ref()
                .is_none_or(|jwt| jwt.tier_claim.is_none());
        let (selector, label) = match kind.as_str() {
            "ip" => {
                // As the page and logs print a v6 client: with its prefix.
                let address = value.trim();
                let address = address.split_once('/').map_or(address, |(a, _)| a);
                let ip: IpAddr = address.parse().map_err(|_| {
                    ApiError::bad_request(format!("ip: {value:?} is not an address"))
                })?;
                let of_address = clients.tier_of_address(ip);
                if of_address == clients.tiers.internal() {
                    tier = Some(of_address);
                }
                (Selector::Ip(ip), format!("ip={ip}"))
            }
            "api_key" => {
                let known = clients.known_key(value.as_bytes()).ok_or_else(|| {
                    ApiError::not_found(
                        "unknown_client",
                        "no such key (set at run time or in [clients.api_keys]), or it is revoked: requests with it are anonymous",
                    )
                })?;
                if key_settles_tier {
                    tier = Some(known.tier.clone());
                }
                (Selector::ApiKey(known.hash), known.log_label())
            }
            "key_hash" => {
                // As logs print it (`key#1a2b3c4d`), or more of the hash.
                let wanted = value.trim().trim_start_matches("key#").to_ascii_lowercase();
                if wanted.len() < 8 || !wanted.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(ApiError::bad_request(
                        "key_hash takes the label logs print (key#1a2b3c4d): at least 8 hex digits",
                    ));
                }
                // Run-time keys first: an entry there beats the file's.
                let run_time = clients.run_time.as_deref();
                let mut matching: Vec<(u128, Option<Tier>)> = run_time
                    .map(|table| table.find_prefix(&wanted, 2))
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|hash| {
                        let entry = run_time.and_then(|t| t.get(hash))?;
                        // A revoked key is no client.
                        let name = entry.tier?;
                        Some((
                            hash,
                            Some(
                                clients
                                    .tiers
                                    .get(&name)
                                    .unwrap_or_else(|| clients.tiers.anonymous()),
                            ),
                        ))
                    })
                    .collect();
                for (key, known) in &clients.api_keys {
                    let hash = clients.api_key_hash(key);
                    let overridden = run_time.is_some_and(|t| t.get(hash).is_some());
                    if !overridden && format!("{hash:032x}").starts_with(&wanted) {
                        matching.push((hash, Some(known.clone())));
                    }
                }
                let (hash, known) = match matching.as_slice() {
                    [found] => found.clone(),
                    [] => {
                        return Err(ApiError::not_found(
                            "unknown_client",
                            "no known key has this hash",
                        ))
                    }
                    _ => {
                        return Err(ApiError::bad_request(
                            "more than one key has this hash prefix: give more digits",
                        ))
                    }
                };
                if key_settles_tier {
                    tier = known;
                }
                (Selector::ApiKey(hash), ApiKey::label_of(hash))
            }
            "header" => {
                let (name, v) = split_pair(value, "header")?;
                let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                    ApiError::bad_request(format!("header: {name:?} is not a header name"))
                })?;
                let label = format!("header {name}");
                // As a request's value is read: without surrounding spaces.
                (Selector::Header(name, v.trim().as_bytes().to_vec()), label)
            }
            "cookie" => {
                let (name, v) = split_pair(value, "cookie")?;
                let label = format!("cookie {name}");
                (Selector::Cookie(name.into(), v.as_bytes().to_vec()), label)
            }
            "query" => {
                let (name, v) = split_pair(value, "query")?;
                let label = format!("query {name}");
                (Selector::Query(name.into(), v.as_bytes().to_vec()), label)
            }
            "descriptor" => {
                let (key, v) = split_pair(value, "descriptor")?;
                // Addresses are shown as logs show them; other values (an
                // API key Envoy read from a header) as a short hash.
                let label = if key == "remote_address" {
                    format!("descriptor {key}={v}")
                } else {
                    format!("descriptor {key}")
                };
                (Selector::Entry(key.into(), v.as_bytes().to_vec()), label)
            }
            "jwt_sub" => (
                Selector::Subject(value.as_bytes().to_vec()),
                format!(
                    "jwt_sub #{:08x}",
                    (clients.subject_hash(value.as_bytes()) >> 96) as u32
                ),
            ),
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown parameter {other:?}: name the client by one of {SELECTORS}"
                )))
            }
        };
        if let Some((_, name)) = params.iter().find(|(k, _)| k == "tier") {
            tier = Some(clients.tiers.get(name).ok_or_else(|| {
                ApiError::bad_request(format!("tier: no tier {name:?} in this configuration"))
            })?);
        }
        Ok(Lookup {
            selector,
            tier_known: tier.is_some(),
            tier: tier.unwrap_or_else(|| clients.tiers.anonymous()),
            label,
        })
    }

    fn part(&self) -> KnownPart<'_> {
        match &self.selector {
            Selector::Ip(ip) => KnownPart::Ip(*ip),
            Selector::ApiKey(hash) => KnownPart::ApiKeyHash(*hash),
            Selector::Header(name, value) => KnownPart::Header(name, value),
            Selector::Cookie(name, value) => KnownPart::Cookie(name, value),
            Selector::Query(name, value) => KnownPart::Query(name, value),
            Selector::Subject(value) => KnownPart::Claim(&SUBJECT, value),
            Selector::Entry(key, value) => KnownPart::Entry(key, value),
        }
    }

    /// The limits keyed on this client, and those that key on it with
    /// something else too (a composite key: one state per combination),
    /// which cannot be shown.
    fn applying(&self, policy: &Policy) -> (Vec<Applying>, Vec<Value>) {
        let mut applying = Vec::new();
        let mut hidden = Vec::new();
        let part = self.part();
        for (index, limit) in policy.limits.iter().enumerate() {
            let id = LimitId(index);
            if let Some(identity) =
                policy
                    .clients
                    .identity_for(&limit.key, &part, limit.case_insensitive_values)
            {
                applying.push(Applying {
                    limit: id,
                    identity,
                    by_address: false,
                });
            } else if let (Selector::Ip(ip), OnMissing::Ip) = (&self.selector, limit.on_missing) {
                applying.push(Applying {
                    limit: id,
                    identity: policy.clients.address_identity(*ip),
                    by_address: true,
                });
            } else if let KeySource::Composite(parts) = &limit.key {
                if parts.iter().any(|p| {
                    policy
                        .clients
                        .identity_for(p, &part, limit.case_insensitive_values)
                        .is_some()
                }) {
                    hidden.push(json!({
                        "limit": limit.name.as_str(),
                        "key": limit.key.describe(),
                        "why": "a composite key: one state per combination of its parts",
                    }));
                }
            }
        }
        (applying, hidden)
    }

    /// The limits to act on: all that apply, or the one named `limit`;
    /// and those that cannot be shown (`applying`).
    fn chosen(
        &self,
        policy: &Policy,
        limit: Option<&str>,
    ) -> Result<(Vec<Applying>, Vec<Value>), ApiError> {
        let (applying, hidden) = self.applying(policy);
        let Some(name) = limit else {
            if applying.is_empty() {
                return Err(ApiError::not_found(
                    "no_limit_applies",
                    format!("no limit is keyed on {}", self.label),
                ));
            }
            return Ok((applying, hidden));
        };
        let layer = policy
            .limits
            .iter()
            .position(|l| l.name.as_str() == name)
            .ok_or_else(|| {
                ApiError::not_found("unknown_limit", format!("no limit named {name:?}"))
            })?;
        let chosen: Vec<Applying> = applying
            .into_iter()
            .filter(|a| a.limit == LimitId(layer))
            .collect();
        if chosen.is_empty() {
            return Err(ApiError::bad_request(format!(
                "limit {name:?} is keyed on {}, not on {}",
                policy.limits[layer].key.describe(),
                self.label
            )));
        }
        Ok((chosen, hidden))
    }

    /// The limit named `name` and the client's identity under it (the
    /// state an override of its numbers applies to).
    pub fn identity_under(&self, policy: &Policy, name: &str) -> Result<(LimitId, u128), ApiError> {
        let (chosen, _) = self.chosen(policy, Some(name))?;
        let a = chosen.first().ok_or_else(|| {
            ApiError::bad_request(format!("limit {name:?} is not keyed on {}", self.label))
        })?;
        Ok((a.limit, a.identity))
    }

    /// Numbers are read for a tier: one the client's requests may not be
    /// in is no answer (a credit would move a bucket by another tier's
    /// interval).
    fn check_tier(&self, policy: &Policy, chosen: &[Applying]) -> Result<(), ApiError> {
        if self.tier_known {
            return Ok(());
        }
        match chosen
            .iter()
            .find(|a| !policy.limits[a.limit.index()].tiers.is_empty())
        {
            Some(a) => Err(ApiError::bad_request(format!(
                "limit {:?} has numbers per tier, and {} does not say which: add tier= (one of {})",
                policy.limits[a.limit.index()].name.as_str(),
                self.label,
                policy.clients.tiers.names().collect::<Vec<_>>().join(", ")
            ))),
            None => Ok(()),
        }
    }
}

fn seconds(us: u64) -> f64 {
    (us / 1_000) as f64 / 1_000.0
}

fn on_failure(policy: &Policy, limit: LimitId) -> OnFailure {
    policy.limits[limit.index()].on_failure
}

/// A lookup of one key's state: decided, never charged.
fn peek_check(
    policy: &Policy,
    limit: LimitId,
    name: &LimitName,
    algorithm: Algorithm,
    key: StateKey,
    cost: u64,
) -> Check {
    Check {
        limit,
        name: name.clone(),
        algorithm,
        key,
        cost,
        shadow: false,
        peek: true,
        on_failure: on_failure(policy, limit),
        lease: false,
    }
}

/// The state keys one limit keeps for a client: its own (a rate limit's),
/// and its ban's strikes and penalty.
fn state_checks(policy: &Policy, lookup: &Lookup, a: &Applying, cost: u64) -> Vec<Check> {
    let limit = &policy.limits[a.limit.index()];
    let mut checks = Vec::new();
    if let Rule::Rate(algorithm) = policy.rule_in_force(limit, &lookup.tier, a.identity) {
        let key = StateKey {
            limit: limit.id,
            identity: a.identity,
        };
        checks.push(peek_check(
            policy,
            a.limit,
            &limit.name,
            algorithm,
            key,
            cost,
        ));
    }
    if let Some(ban) = &limit.ban {
        // As requests look bans up: without the store, no ban is known.
        for check in [
            ban.strike_check(a.limit, a.identity),
            ban.penalty_check(a.limit, a.identity, true),
        ] {
            checks.push(Check {
                cost,
                peek: true,
                ..check
            });
        }
    }
    checks
}

/// What `/v1/clients` shows of an override in force.
fn override_in_force(policy: &Policy, limit: &Limit, identity: u128) -> Value {
    let key = OverrideKey {
        limit: limit.id,
        identity,
    };
    match policy.overrides.as_ref().and_then(|t| t.get(&key)) {
        Some(entry) => json!({
            "numbers": StoredOverride::of(&entry).numbers,
            "expires": entry.expires_at_s.map(rfc3339),
            "set_at": rfc3339(entry.set_at_s),
            "label": entry.label.as_deref(),
        }),
        None => Value::Null,
    }
}

/// `GET /v1/clients`: per limit keyed on the client, what is left, when it
/// resets, how long a request waits, and the ban state; one store call.
pub async fn show(
    store: &dyn Store,
    policy: &Policy,
    lookup: &Lookup,
    limit: Option<&str>,
) -> Result<Value, ApiError> {
    let (chosen, hidden) = lookup.chosen(policy, limit)?;
    lookup.check_tier(policy, &chosen)?;
    // Each key twice: at cost 0 (what is left now) and at cost 1 (whether
    // a request would pass, and when).
    let mut checks = Vec::new();
    let mut spans = Vec::new();
    for a in &chosen {
        let now = state_checks(policy, lookup, a, 0);
        let next = state_checks(policy, lookup, a, 1);
        spans.push(now.len());
        checks.extend(now);
        checks.extend(next);
    }
    let decisions = store
        .peek(&checks)
        .await
        .map_err(|e| ApiError::unavailable(format!("the store cannot answer: {e}")))?;
    let deciding = store.deciding().as_str();
    let mut at = 0;
    let mut limits = Vec::new();
    for (a, span) in chosen.iter().zip(spans) {
        let now: &[Decision] = &decisions[at..at + span];
        let next: &[Decision] = &decisions[at + span..at + 2 * span];
        at += 2 * span;
        let limit = &policy.limits[a.limit.index()];
        let rule = policy.rule_in_force(limit, &lookup.tier, a.identity);
        let mut entry = json!({
            "limit": limit.name.as_str(),
            "key": if a.by_address { "ip (on_missing)".to_string() } else { limit.key.describe() },
            "rule": rule.to_string(),
            "shadow": limit.shadow,
            "store": deciding,
        });
        if rule != limit.rule_for(&lookup.tier) {
            entry["override"] = override_in_force(policy, limit, a.identity);
        }
        let mut rest = 0;
        match rule {
            Rule::Rate(_) => {
                let (now, next) = (now[0], next[0]);
                entry["quota"] = json!(now.limit());
                entry["remaining"] = json!(now.remaining());
                entry["reset_after_s"] = json!(seconds(now.reset_after_us()));
                entry["allowed"] = json!(next.allowed());
                entry["retry_after_s"] = json!(seconds(next.retry_after_us()));
                rest = 1;
            }
            Rule::Concurrency(c) => {
                entry["quota"] = json!(c.max);
                entry["note"] = json!("slots follow the requests in flight: not read here");
            }
        }
        if limit.ban.is_some() {
            let (strikes, penalty) = (now[rest], next[rest + 1]);
            entry["ban"] = json!({
                "banned": !penalty.allowed(),
                "retry_after_s": seconds(penalty.retry_after_us()),
                "strikes_left": strikes.remaining(),
            });
        }
        limits.push(entry);
    }
    Ok(json!({
        "client": lookup.label,
        "tier": lookup.tier.name(),
        "store": deciding,
        "limits": limits,
        "not_shown": hidden,
    }))
}

/// `DELETE /v1/clients`: the client starts afresh under the chosen limits
/// (bans and strikes included), on the store that holds the state; with
/// Redis, every instance forgets the refusals it remembered.
pub async fn reset(
    store: &dyn Store,
    policy: &Policy,
    lookup: &Lookup,
    limit: Option<&str>,
) -> Result<Value, ApiError> {
    let (chosen, _) = lookup.chosen(policy, limit)?;
    let mut checks = Vec::new();
    let mut names = Vec::new();
    let mut skipped = Vec::new();
    for a in &chosen {
        let found = state_checks(policy, lookup, a, 0);
        let name = policy.limits[a.limit.index()].name.as_str();
        if found.is_empty() {
            skipped.push(json!({"limit": name, "why": "slots follow the requests in flight"}));
        } else {
            names.push(name);
            checks.extend(found);
        }
    }
    store.reset(&checks).await.map_err(|e| {
        ApiError::unavailable(format!("the store cannot answer, nothing was reset: {e}"))
    })?;
    Ok(json!({
        "client": lookup.label,
        "reset": names,
        "skipped": skipped,
        "store": store.deciding().as_str(),
    }))
}

/// `POST /v1/clients/credit`: `units` given back under one limit (a token
/// bucket, a fixed window or a quota), up to a full budget.
pub async fn credit(
    store: &dyn Store,
    policy: &Policy,
    lookup: &Lookup,
    limit: Option<&str>,
    units: Option<u64>,
) -> Result<Value, ApiError> {
    let Some(name) = limit else {
        return Err(ApiError::bad_request("credit needs the limit to credit"));
    };
    let (chosen, _) = lookup.chosen(policy, Some(name))?;
    lookup.check_tier(policy, &chosen)?;
    let a = &chosen[0];
    let limit = &policy.limits[a.limit.index()];
    let Rule::Rate(algorithm) = policy.rule_in_force(limit, &lookup.tier, a.identity) else {
        return Err(ApiError::conflict(format!(
            "limit {name:?} counts requests in flight: there is nothing to credit"
        )));
    };
    if !algorithm.takes_credit() {
        return Err(ApiError::conflict(format!(
            "limit {name:?} is a {}: credit applies to token_bucket, fixed_window and quota",
            algorithm.name()
        )));
    }
    let units = match units {
        Some(units) if (1..=algorithm.quota()).contains(&units) => units,
        _ => {
            return Err(ApiError::bad_request(format!(
                "units: a whole number from 1 to the limit's {}",
                algorithm.quota()
            )))
        }
    };
    let key = StateKey {
        limit: limit.id,
        identity: a.identity,
    };
    let check = peek_check(policy, a.limit, &limit.name, algorithm, key, units);
    let unavailable = |e| {
        ApiError::unavailable(format!(
            "the store cannot answer, nothing was credited: {e}"
        ))
    };
    let before = store
        .peek(&[Check {
            cost: 0,
            ..check.clone()
        }])
        .await
        .map_err(unavailable)?;
    let after = store.credit(&check).await.map_err(unavailable)?;
    let remaining_before = before.first().map_or(0, Decision::remaining);
    Ok(json!({
        "client": lookup.label,
        "limit": name,
        "units": units,
        "remaining_before": remaining_before,
        "remaining": after.remaining(),
        "store": store.deciding().as_str(),
    }))
}

/// `GET /v1/limits`: the running limits, with their numbers per tier.
pub fn limits(policy: &Policy) -> Value {
    let limits: Vec<Value> = policy
        .limits
        .iter()
        .enumerate()
        .map(|(layer, limit)| {
            let tiers: serde_json::Map<String, Value> = limit
                .tiers
                .iter()
                .map(|(tier, rule)| (tier.name().to_string(), json!(rule.to_string())))
                .collect();
            json!({
                "name": limit.name.as_str(),
                "key": limit.key.describe(),
                "match": limit.matcher.describe(),
                "rule": limit.rule.to_string(),
                "quota": limit.rule.quota(),
                "tiers": tiers,
                "shadow": limit.shadow,
                "on_failure": on_failure(policy, LimitId(layer)).as_str(),
                "on_missing": limit.on_missing.as_str(),
                "ban": limit.ban.as_ref().map(|b| json!({
                    "strikes": b.strikes.to_string(),
                    "penalty": b.penalty.to_string(),
                })),
                "charged_after_response": limit.after_response.is_some(),
            })
        })
        .collect();
    json!({ "limits": limits, "tiers": policy.clients.tiers.names().collect::<Vec<_>>() })
}
