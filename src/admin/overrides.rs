//! `/v1/overrides`: one client's own numbers under one limit, set, listed
//! and removed at run time, until removed or until they expire. The client
//! is named as `/v1/clients` names it; the numbers are checked as the
//! file's own for that limit are (`config::OverrideRules`).

use serde_json::{json, Map, Value};

use super::api_keys::{body_json, checked_label, field_error, rfc3339, unavailable, Changed};
use super::lookup::Lookup;
use super::reply::ApiError;
use crate::clients::{field_of, RunTimeClients, StoredOverride};
use crate::config::overrides::OverrideRules;
use floodgate_policy::overrides::{Override, OverrideKey};
use floodgate_policy::Policy;

/// The selectors a client is named by, as `/v1/clients` takes them.
const SELECTORS: [&str; 8] = [
    "ip",
    "api_key",
    "key_hash",
    "header",
    "cookie",
    "query",
    "jwt_sub",
    "descriptor",
];

/// The longest an override may be set for: a plan's raise, not a plan.
const MAX_EXPIRY_S: u64 = 10 * 366 * 86_400;

/// At most this many entries in one listing.
const MAX_LISTED: usize = 1_000;

fn described(key: &OverrideKey, entry: &Override, kept_in: &str, now_s: u64) -> Value {
    let stored = StoredOverride::of(entry);
    json!({
        "limit": entry.limit_name.as_ref(),
        "client": entry.client.as_ref(),
        "id": field_of(key),
        "numbers": stored.numbers,
        "rule": entry.rule.as_ref().map(ToString::to_string).ok(),
        "in_force": entry.rule.is_ok() && !entry.expired(now_s),
        "not_in_force_because": match &entry.rule {
            Err(why) => Some(why.to_string()),
            Ok(_) if entry.expired(now_s) => Some("expired".to_string()),
            Ok(_) => None,
        },
        "expires": entry.expires_at_s.map(rfc3339),
        "set_at": rfc3339(entry.set_at_s),
        "label": entry.label.as_deref(),
        "kept_in": kept_in,
    })
}

/// A query's `limit=`, and the rest: the client's selector.
fn limit_and_client(params: &[(String, String)]) -> (Option<&str>, Vec<(String, String)>) {
    let limit = params
        .iter()
        .find(|(k, _)| k == "limit")
        .map(|(_, v)| v.as_str());
    let client = params
        .iter()
        .filter(|(k, _)| k != "limit")
        .cloned()
        .collect();
    (limit, client)
}

/// The client and the limit a call names, and the state key they make.
fn named(
    policy: &Policy,
    limit: Option<&str>,
    selector: Vec<(String, String)>,
) -> Result<(OverrideKey, Lookup, usize), ApiError> {
    let Some(limit) = limit else {
        return Err(field_error("limit", "the limit's name is required"));
    };
    if selector.len() != 1 {
        return Err(field_error(
            "client",
            format!("name the client by exactly one of {}", SELECTORS.join(", ")),
        ));
    }
    let lookup = Lookup::from_params(policy, &selector)?;
    let (id, identity) = lookup.identity_under(policy, limit)?;
    let key = OverrideKey {
        limit: policy.limits[id.index()].id,
        identity,
    };
    Ok((key, lookup, id.index()))
}

/// `expires` as RFC 3339, in the future and within `MAX_EXPIRY_S`.
fn expiry(value: &Value, now_s: u64) -> Result<Option<u64>, ApiError> {
    let text = match value {
        Value::Null => return Ok(None),
        Value::String(text) => text,
        _ => {
            return Err(field_error(
                "expires",
                "an RFC 3339 time such as \"2027-01-31T00:00:00Z\" is expected",
            ))
        }
    };
    let at = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| {
        field_error(
            "expires",
            format!("not an RFC 3339 time such as \"2027-01-31T00:00:00Z\": {e}"),
        )
    })?;
    let at_s = u64::try_from(at.timestamp()).unwrap_or(0);
    if at_s <= now_s {
        return Err(field_error(
            "expires",
            "is past: an override expires in the future",
        ));
    }
    if at_s - now_s > MAX_EXPIRY_S {
        return Err(field_error(
            "expires",
            "is more than 10 years away: leave it out for an override that lasts until removed",
        ));
    }
    Ok(Some(at_s))
}

/// `PUT /v1/overrides`: `{"limit": "per-account", "api_key": "...", or
/// "ip", "header" ("Name:value") ..., the limit's numbers, "expires":
/// "<RFC 3339>", "label": "..."}`. The numbers come as `"numbers":
/// {"limit": 5000, "window": "1h"}`, or beside the other fields where none
/// is called `limit` (`"capacity": 5000, "refill_rate": 100`): at the top,
/// `limit` names the limit. Every field is checked before anything
/// changes.
pub(super) async fn put(
    clients: &RunTimeClients,
    policy: &Policy,
    rules: &OverrideRules,
    body: &[u8],
    now_s: u64,
) -> Result<(Value, Changed), ApiError> {
    let Value::Object(fields) = body_json(body)? else {
        return Err(field_error("body", "a JSON object is expected"));
    };
    let mut limit = None;
    let mut selector = Vec::new();
    let mut expires = Value::Null;
    let mut label = None;
    let mut numbers = Map::new();
    let mut nested = None;
    for (field, value) in fields {
        match field.as_str() {
            "numbers" => match value {
                Value::Object(given) => nested = Some(given),
                _ => {
                    return Err(field_error(
                        "numbers",
                        "an object of the limit's numbers, such as {\"limit\": 5000, \"window\": \"1h\"}",
                    ))
                }
            },
            "limit" => match value {
                Value::String(name) => limit = Some(name),
                _ => return Err(field_error("limit", "the limit's name, a string")),
            },
            f if SELECTORS.contains(&f) => match value {
                Value::String(v) => selector.push((field, v)),
                _ => {
                    return Err(field_error(
                        &field,
                        "a string is expected (header, cookie, query and descriptor take \"name:value\")",
                    ))
                }
            },
            "expires" => expires = value,
            "label" => label = Some(value),
            _ => {
                numbers.insert(field, value);
            }
        }
    }
    let (key, lookup, index) = named(policy, limit.as_deref(), selector)?;
    let numbers = match nested {
        Some(_) if !numbers.is_empty() => {
            let stray = numbers.keys().next().map_or("numbers", String::as_str);
            return Err(field_error(
                stray,
                "give the numbers in \"numbers\" or beside the other fields, not both",
            ));
        }
        Some(given) => given,
        None => numbers,
    };
    let rule = rules.rule(index, &numbers).map_err(|e| {
        let hint = if e.field == "limit" {
            " (at the top, \"limit\" names the limit: give its numbers as \"numbers\": {\"limit\": 5000, \"window\": \"1h\"})"
        } else {
            ""
        };
        let field = match e.field.as_str() {
            "body" => "numbers".to_string(),
            field => format!("numbers.{field}"),
        };
        field_error(&field, format!("{}{hint}", e.message))
    })?;
    let expires_at_s = expiry(&expires, now_s)?;
    let label = checked_label("label", label.as_ref())?;
    let limit_name = policy.limits[index].name.as_str();
    let entry = Override {
        limit_name: limit_name.into(),
        rule: Ok(rule),
        numbers: Value::Object(numbers).to_string().into(),
        expires_at_s,
        set_at_s: now_s,
        client: lookup.label.as_str().into(),
        label,
    };
    let before = clients.overrides.get(&key);
    clients
        .set_overrides(vec![(key, Some(entry.clone()))])
        .await
        .map_err(unavailable)?;
    let was = before
        .and_then(|b| b.rule.ok().map(|r| r.to_string()))
        .unwrap_or_else(|| "none".into());
    let until = expires_at_s
        .map(|s| format!(" until {}", rfc3339(s).as_str().unwrap_or("?")))
        .unwrap_or_default();
    Ok((
        described(&key, &entry, clients.kept_in(), now_s),
        Changed {
            what: "override_set",
            detail: format!(
                "{} under {limit_name}: {rule}{until} (was {was})",
                lookup.label
            ),
        },
    ))
}

/// `GET /v1/overrides[?limit=][&<client>=]`: the overrides (of one limit,
/// of one client), the newest first, at most `MAX_LISTED`.
pub(super) fn list(
    clients: &RunTimeClients,
    policy: &Policy,
    params: &[(String, String)],
    now_s: u64,
) -> Result<Value, ApiError> {
    if let Some((unknown, _)) = params
        .iter()
        .find(|(k, _)| k != "limit" && !SELECTORS.contains(&k.as_str()))
    {
        return Err(field_error(
            unknown,
            format!(
                "unknown parameter (limit, and one of {})",
                SELECTORS.join(", ")
            ),
        ));
    }
    let (limit, selector) = limit_and_client(params);
    let mut entries: Vec<(OverrideKey, Override)> = if selector.is_empty() {
        if let Some(name) = limit {
            if !policy.limits.iter().any(|l| l.name.as_str() == name) {
                return Err(ApiError::not_found(
                    "unknown_limit",
                    format!("no limit named {name:?}"),
                ));
            }
        }
        clients
            .overrides
            .entries()
            .into_iter()
            .filter(|(_, e)| limit.is_none_or(|name| &*e.limit_name == name))
            .collect()
    } else {
        let (key, _, _) = named(policy, limit, selector)?;
        clients
            .overrides
            .get(&key)
            .map(|e| vec![(key, e)])
            .unwrap_or_default()
    };
    entries.sort_by(|a, b| {
        b.1.set_at_s
            .cmp(&a.1.set_at_s)
            .then(a.0.identity.cmp(&b.0.identity))
    });
    let total = entries.len();
    let listed: Vec<Value> = entries
        .iter()
        .take(MAX_LISTED)
        .map(|(key, entry)| described(key, entry, clients.kept_in(), now_s))
        .collect();
    Ok(json!({
        "overrides": listed,
        "total": total,
        "truncated": total > MAX_LISTED,
    }))
}

/// `DELETE /v1/overrides?limit=&<client>=`: the client's numbers are its
/// tier's again, on every instance.
pub(super) async fn remove(
    clients: &RunTimeClients,
    policy: &Policy,
    params: &[(String, String)],
) -> Result<(Value, Changed), ApiError> {
    let (limit, selector) = limit_and_client(params);
    let (key, lookup, index) = named(policy, limit, selector)?;
    let Some(before) = clients.overrides.get(&key) else {
        return Err(ApiError::not_found(
            "no_override",
            format!(
                "{} has no override under {:?}",
                lookup.label,
                policy.limits[index].name.as_str()
            ),
        ));
    };
    clients
        .set_overrides(vec![(key, None)])
        .await
        .map_err(unavailable)?;
    Ok((
        json!({"removed": field_of(&key), "limit": before.limit_name.as_ref(), "client": lookup.label, "kept_in": clients.kept_in()}),
        Changed {
            what: "override_removed",
            detail: format!("{} under {}", lookup.label, before.limit_name),
        },
    ))
}
