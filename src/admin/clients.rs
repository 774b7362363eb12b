//! `/v1/clients` and `/v1/limits`: one client's state under every limit
//! keyed on what the operator knows of it, read, reset or credited on the
//! store that holds it.

use serde_json::{json, Value};

use super::api_keys::rfc3339;
use super::lookup::{Applying, Lookup};
use super::reply::ApiError;
use crate::clients::StoredOverride;
use floodgate_algorithm::{Algorithm, Decision};
use floodgate_limiter::{Check, Enforcement, Leasing, LimitId, Spending, Store};
use floodgate_policy::overrides::OverrideKey;
use floodgate_policy::Limit;
use floodgate_policy::{Policy, Rule};

fn seconds(us: u64) -> f64 {
    (us / 1_000) as f64 / 1_000.0
}

/// A lookup of one key's state under `limit`: decided, never charged, and
/// answered by the shared store itself (no lease, no shadow).
fn peek_check(
    limit: &Limit,
    id: LimitId,
    algorithm: Algorithm,
    identity: u128,
    cost: u64,
) -> Check {
    Check {
        enforcement: Enforcement::Enforce,
        spending: Spending::Peek,
        leasing: Leasing::Never,
        ..limit.check(id, algorithm, identity, cost)
    }
}

/// The state keys one limit keeps for a client: its own (a rate limit's),
/// and its ban's strikes and penalty.
fn state_checks(policy: &Policy, lookup: &Lookup, a: &Applying, cost: u64) -> Vec<Check> {
    let limit = &policy.limits[a.limit.index()];
    let mut checks = Vec::new();
    if let Rule::Rate(algorithm) = policy.rule_in_force(limit, &lookup.tier, a.identity) {
        checks.push(peek_check(limit, a.limit, algorithm, a.identity, cost));
    }
    if let Some(ban) = &limit.ban {
        // As requests look bans up: without the store, no ban is known.
        for check in [
            ban.strike_check(a.limit, a.identity),
            ban.penalty_check(a.limit, a.identity, Spending::Peek),
        ] {
            checks.push(Check {
                cost,
                spending: Spending::Peek,
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
pub(super) async fn show(
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
            "shadow": limit.enforcement == Enforcement::Shadow,
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
pub(super) async fn reset(
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
pub(super) async fn credit(
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
    let check = peek_check(limit, a.limit, algorithm, a.identity, units);
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
pub(super) fn limits(policy: &Policy) -> Value {
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
                "shadow": limit.enforcement == Enforcement::Shadow,
                "on_failure": policy.limits[layer].on_failure.as_str(),
                "on_missing": limit.on_missing.as_str(),
                "ban": limit.ban.as_ref().map(|b| json!({
                    "strikes": b.strikes.to_string(),
                    "penalty": b.penalty.to_string(),
                })),
                "charged_after_response": limit.charged_by_response.is_some(),
            })
        })
        .collect();
    json!({ "limits": limits, "tiers": policy.clients.tiers.names().collect::<Vec<_>>() })
}
