//! `/v1/api_keys`: API keys set, read and revoked at run time, and
//! imported by the thousand. A key is read once, to be hashed with the
//! identity secret: it is never kept, logged or answered.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::reply::ApiError;
use crate::clients::{hash_hex, parse_hash, ClientsError, RunTimeClients, MAX_IMPORT};
use floodgate_policy::identity::{ApiKey, KeyEntry, ANONYMOUS, INTERNAL};
use floodgate_policy::Policy;

/// The longest key taken: a header's value, not a document.
const MAX_KEY_BYTES: usize = 256;

/// The longest label (a customer id, an account name).
const MAX_LABEL_CHARS: usize = 128;

/// What one call changed, for its log line and counter.
pub(super) struct Changed {
    /// `api_key_set`, `api_key_revoked` or `api_keys_imported`.
    pub what: &'static str,
    /// The log line's detail (key labels, tiers: never a key).
    pub detail: String,
}

pub(super) fn field_error(field: &str, reason: impl std::fmt::Display) -> ApiError {
    ApiError {
        status: 400,
        code: "invalid_field",
        reason: format!("{field}: {reason}"),
    }
}

pub(super) fn unavailable(e: ClientsError) -> ApiError {
    match e {
        ClientsError::Unavailable(_) => ApiError::unavailable(e.to_string()),
        ClientsError::File { .. } => ApiError {
            status: 500,
            code: "not_kept",
            reason: e.to_string(),
        },
    }
}

/// A key as a client sends it: visible ASCII, no spaces (a header's value
/// as it arrives), at most `MAX_KEY_BYTES`. The reason never repeats it.
fn checked_key<'a>(field: &str, value: Option<&'a Value>) -> Result<&'a str, ApiError> {
    let Some(value) = value else {
        return Err(field_error(field, "is required"));
    };
    let Some(key) = value.as_str() else {
        return Err(field_error(field, "a string is expected"));
    };
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(field_error(
            field,
            format!("a key holds 1 to {MAX_KEY_BYTES} characters"),
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(field_error(
            field,
            "a key holds visible ASCII characters only (no spaces), as a header carries it",
        ));
    }
    Ok(key)
}

fn checked_tier(policy: &Policy, field: &str, value: Option<&Value>) -> Result<Arc<str>, ApiError> {
    let tiers = &policy.clients.tiers;
    let assignable = || {
        tiers
            .names()
            .filter(|t| *t != ANONYMOUS && *t != INTERNAL)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(name) = value.and_then(Value::as_str) else {
        return Err(field_error(
            field,
            format!("a tier is required, one of: {}", assignable()),
        ));
    };
    if name == ANONYMOUS || name == INTERNAL {
        return Err(field_error(
            field,
            format!("tier {name:?} is not given to keys (revoke the key instead)"),
        ));
    }
    match tiers.get(name) {
        Some(_) => Ok(Arc::from(name)),
        None => Err(field_error(
            field,
            format!(
                "no tier {name:?} in this configuration (one of: {}; declare more in [clients].tiers)",
                assignable()
            ),
        )),
    }
}

pub(super) fn checked_label(
    field: &str,
    value: Option<&Value>,
) -> Result<Option<Box<str>>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(label))
            if label.chars().count() <= MAX_LABEL_CHARS
                && !label.chars().any(char::is_control) =>
        {
            Ok(Some(label.as_str().into()))
        }
        Some(_) => Err(field_error(
            field,
            format!("a label is a string of at most {MAX_LABEL_CHARS} characters, without control characters"),
        )),
    }
}

/// One `{"key", "tier", "label"}` object, every field checked, none
/// unknown; `at` is where it is in the body (`""` or `keys[3].`).
fn entry_of(
    policy: &Policy,
    object: &Value,
    at: &str,
    now_s: u64,
) -> Result<(u128, KeyEntry), ApiError> {
    let Value::Object(fields) = object else {
        let whole = if at.is_empty() {
            "body"
        } else {
            at.trim_end_matches('.')
        };
        return Err(field_error(whole, "a JSON object is expected"));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "key" | "tier" | "label"))
    {
        return Err(field_error(
            &format!("{at}{unknown}"),
            "unknown field (key, tier and label are)",
        ));
    }
    let key = checked_key(&format!("{at}key"), fields.get("key"))?;
    let tier = checked_tier(policy, &format!("{at}tier"), fields.get("tier"))?;
    let label = checked_label(&format!("{at}label"), fields.get("label"))?;
    Ok((
        policy.clients.api_key_hash(key.as_bytes()),
        KeyEntry {
            tier: Some(tier),
            set_at: now_s,
            label,
        },
    ))
}

pub(super) fn body_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| field_error("body", format!("not JSON: {e}")))
}

pub(super) fn rfc3339(unix_s: u64) -> Value {
    chrono::DateTime::from_timestamp(i64::try_from(unix_s).unwrap_or(i64::MAX), 0)
        .map_or(Value::Null, |t| {
            json!(t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        })
}

fn described(hash: u128, entry: &KeyEntry, kept_in: &str) -> Value {
    json!({
        "key_hash": hash_hex(hash),
        "key_label": ApiKey::label_of(hash),
        "source": "run_time",
        "tier": entry.tier.as_deref(),
        "revoked": entry.tier.is_none(),
        "set_at": rfc3339(entry.set_at),
        "label": entry.label.as_deref(),
        "kept_in": kept_in,
    })
}

/// `PUT /v1/api_keys`: one key's tier (and label), new or changed.
pub(super) async fn put(
    clients: &RunTimeClients,
    policy: &Policy,
    body: &[u8],
    now_s: u64,
) -> Result<(Value, Changed), ApiError> {
    let (hash, entry) = entry_of(policy, &body_json(body)?, "", now_s)?;
    let before = clients.keys.get(hash);
    clients
        .set(vec![(hash, entry.clone())])
        .await
        .map_err(unavailable)?;
    let was = match &before {
        Some(KeyEntry { tier: Some(t), .. }) => t.to_string(),
        Some(_) => "revoked".into(),
        None => "unset".into(),
    };
    let tier = entry.tier.as_deref().unwrap_or("");
    Ok((
        described(hash, &entry, clients.kept_in()),
        Changed {
            what: "api_key_set",
            detail: format!("{} tier {tier} (was {was})", ApiKey::label_of(hash)),
        },
    ))
}

/// The key a query names: `key=` (hashed here), or `key_hash=` (all 32
/// hex digits, or at least 8 of the start, as logs print a key, when one
/// known key has them).
fn named_hash(
    policy: &Policy,
    clients: &RunTimeClients,
    params: &[(String, String)],
) -> Result<u128, ApiError> {
    let mut named = params.iter().filter(|(k, _)| k == "key" || k == "key_hash");
    let (Some((kind, value)), None) = (named.next(), named.next()) else {
        return Err(field_error(
            "key_hash",
            "name the key by exactly one of key= or key_hash=",
        ));
    };
    if let Some((unknown, _)) = params.iter().find(|(k, _)| k != "key" && k != "key_hash") {
        return Err(field_error(
            unknown,
            "unknown parameter (key or key_hash are)",
        ));
    }
    if kind == "key" {
        let value = Value::String(value.clone());
        let key = checked_key("key", Some(&value))?;
        return Ok(policy.clients.api_key_hash(key.as_bytes()));
    }
    let wanted = value.trim().trim_start_matches("key#").to_ascii_lowercase();
    if wanted.len() == 32 {
        return parse_hash(&wanted).map_err(|e| field_error("key_hash", e));
    }
    if wanted.len() < 8 || wanted.len() > 32 || !wanted.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(field_error(
            "key_hash",
            "32 hex digits, or at least the 8 logs print (key#1a2b3c4d)",
        ));
    }
    let mut found = clients.keys.find_prefix(&wanted, 2);
    found.extend(
        policy
            .clients
            .api_keys
            .keys()
            .map(|key| policy.clients.api_key_hash(key))
            .filter(|hash| hash_hex(*hash).starts_with(&wanted)),
    );
    found.sort_unstable();
    found.dedup();
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(ApiError::not_found(
            "unknown_key",
            "no known key has this hash",
        )),
        _ => Err(field_error(
            "key_hash",
            "more than one key starts so: give more digits",
        )),
    }
}

/// `GET /v1/api_keys?key_hash=`: what a key is, and where that comes from.
pub(super) fn get(
    clients: &RunTimeClients,
    policy: &Policy,
    params: &[(String, String)],
) -> Result<Value, ApiError> {
    let hash = named_hash(policy, clients, params)?;
    if let Some(entry) = clients.keys.get(hash) {
        return Ok(described(hash, &entry, clients.kept_in()));
    }
    let in_file = policy
        .clients
        .api_keys
        .iter()
        .find(|(key, _)| policy.clients.api_key_hash(key) == hash);
    match in_file {
        Some((_, tier)) => Ok(json!({
            "key_hash": hash_hex(hash),
            "key_label": ApiKey::label_of(hash),
            "source": "file",
            "tier": tier.name(),
            "revoked": false,
        })),
        None => Err(ApiError::not_found(
            "unknown_key",
            "no such key, at run time or in [clients.api_keys]: requests with it are anonymous",
        )),
    }
}

/// `DELETE /v1/api_keys?key=|key_hash=`: the key counts as no key from now
/// on, on every instance, whatever the file says. Kept as a revocation (a
/// `PUT` gives it a tier again).
pub(super) async fn revoke(
    clients: &RunTimeClients,
    policy: &Policy,
    params: &[(String, String)],
    now_s: u64,
) -> Result<(Value, Changed), ApiError> {
    let hash = named_hash(policy, clients, params)?;
    let entry = KeyEntry {
        tier: None,
        set_at: now_s,
        label: clients.keys.get(hash).and_then(|e| e.label),
    };
    clients
        .set(vec![(hash, entry.clone())])
        .await
        .map_err(unavailable)?;
    Ok((
        described(hash, &entry, clients.kept_in()),
        Changed {
            what: "api_key_revoked",
            detail: ApiKey::label_of(hash),
        },
    ))
}

/// `POST /v1/api_keys/import`: `{"keys": [{"key", "tier", "label"}, ...]}`,
/// up to `MAX_IMPORT`, every one set or none (the first bad entry is named,
/// and nothing changes).
pub(super) async fn import(
    clients: &RunTimeClients,
    policy: &Policy,
    body: &[u8],
    now_s: u64,
) -> Result<(Value, Changed), ApiError> {
    let body = body_json(body)?;
    let Value::Object(mut fields) = body else {
        return Err(field_error(
            "body",
            "a JSON object {\"keys\": [...]} is expected",
        ));
    };
    if let Some(unknown) = fields.keys().find(|k| *k != "keys") {
        return Err(field_error(unknown, "unknown field (keys is)"));
    }
    let Some(Value::Array(list)) = fields.remove("keys") else {
        return Err(field_error(
            "keys",
            "a list of {\"key\", \"tier\", \"label\"} is required",
        ));
    };
    if list.is_empty() || list.len() > MAX_IMPORT {
        return Err(field_error(
            "keys",
            format!("1 to {MAX_IMPORT} keys per import, not {}", list.len()),
        ));
    }
    let mut changes = Vec::with_capacity(list.len());
    let mut seen = std::collections::HashMap::with_capacity(list.len());
    for (i, object) in list.iter().enumerate() {
        let (hash, entry) = entry_of(policy, object, &format!("keys[{i}]."), now_s)?;
        if let Some(first) = seen.insert(hash, i) {
            return Err(field_error(
                &format!("keys[{i}].key"),
                format!("the same key as keys[{first}]"),
            ));
        }
        changes.push((hash, entry));
    }
    let mut tiers: Map<String, Value> = Map::new();
    for (_, entry) in &changes {
        let tier = entry.tier.as_deref().unwrap_or("").to_string();
        let count = tiers.get(&tier).and_then(Value::as_u64).unwrap_or(0) + 1;
        tiers.insert(tier, json!(count));
    }
    let count = changes.len();
    clients.set(changes).await.map_err(unavailable)?;
    let summary = Value::Object(tiers);
    Ok((
        json!({"imported": count, "tiers": summary, "kept_in": clients.kept_in()}),
        Changed {
            what: "api_keys_imported",
            detail: format!("{count} keys, by tier {summary}"),
        },
    ))
}
