//! A client as the operator names it to the admin API (`/v1/clients`,
//! `/v1/overrides`): the one selector parameter read, the tier its numbers
//! are read for, and the limits keyed on it.

use std::net::IpAddr;

use http::HeaderName;
use serde_json::{json, Value};

use super::reply::ApiError;
use floodgate_limiter::LimitId;
use floodgate_policy::identity::{ApiKey, ClientRules, KeySource, KnownPart, Tier, SUBJECT};
use floodgate_policy::{OnMissing, Policy};

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
pub(super) struct Lookup {
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
pub(super) struct Applying {
    pub(super) limit: LimitId,
    pub(super) identity: u128,
    /// Keyed on the address because the client lacks the limit's key.
    pub(super) by_address: bool,
}

/// A selector read: the client, what answers call it, and the tier it
/// implies, if any.
type Named = (Selector, String, Option<Tier>);

fn split_pair<'a>(value: &'a str, what: &str) -> Result<(&'a str, &'a str), ApiError> {
    value
        .split_once(':')
        .filter(|(name, _)| !name.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("{what} takes name:value")))
}

/// Whether a key's tier is the client's: an internal address or a token's
/// tier claim comes before it, so where either exists a key does not
/// settle it.
fn key_settles_tier(clients: &ClientRules) -> bool {
    clients.internal.is_empty()
        && clients
            .jwt
            .as_ref()
            .is_none_or(|jwt| jwt.tier_claim.is_none())
}

/// `ip=`: an internal address implies its tier.
fn by_address(clients: &ClientRules, value: &str) -> Result<Named, ApiError> {
    // As the page and logs print a v6 client: with its prefix.
    let address = value.trim();
    let address = address.split_once('/').map_or(address, |(a, _)| a);
    let ip: IpAddr = address
        .parse()
        .map_err(|_| ApiError::bad_request(format!("ip: {value:?} is not an address")))?;
    let of_address = clients.tier_of_address(ip);
    let tier = (of_address == clients.tiers.internal()).then_some(of_address);
    Ok((Selector::Ip(ip), format!("ip={ip}"), tier))
}

/// `api_key=`: a key in force, set at run time or in the file.
fn by_api_key(clients: &ClientRules, value: &str) -> Result<Named, ApiError> {
    let known = clients.known_key(value.as_bytes()).ok_or_else(|| {
        ApiError::not_found(
            "unknown_client",
            "no such key (set at run time or in [clients.api_keys]), or it is revoked: requests with it are anonymous",
        )
    })?;
    let tier = key_settles_tier(clients).then(|| known.tier.clone());
    Ok((Selector::ApiKey(known.hash), known.log_label(), tier))
}

/// `key_hash=`: a key by the start of its hash, as logs print it
/// (`key#1a2b3c4d`), or more of the hash.
fn by_key_hash(clients: &ClientRules, value: &str) -> Result<Named, ApiError> {
    let wanted = value.trim().trim_start_matches("key#").to_ascii_lowercase();
    if wanted.len() < 8 || !wanted.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(
            "key_hash takes the label logs print (key#1a2b3c4d): at least 8 hex digits",
        ));
    }
    let matching = keys_by_hash_prefix(clients, &wanted);
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
    let tier = if key_settles_tier(clients) {
        known
    } else {
        None
    };
    Ok((Selector::ApiKey(hash), ApiKey::label_of(hash), tier))
}

/// The keys in force whose hash starts with `wanted`, with their tiers.
fn keys_by_hash_prefix(clients: &ClientRules, wanted: &str) -> Vec<(u128, Option<Tier>)> {
    // Run-time keys first: an entry there beats the file's.
    let run_time = clients.run_time.as_deref();
    let mut matching: Vec<(u128, Option<Tier>)> = run_time
        .map(|table| table.find_prefix(wanted, 2))
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
        if !overridden && format!("{hash:032x}").starts_with(wanted) {
            matching.push((hash, Some(known.clone())));
        }
    }
    matching
}

/// `header=`, `cookie=`, `query=` and `descriptor=`: a name and a value,
/// neither of which says anything of the tier.
fn by_pair(kind: &str, value: &str) -> Result<Named, ApiError> {
    let (name, v) = split_pair(value, kind)?;
    let (selector, label) = match kind {
        "header" => {
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                ApiError::bad_request(format!("header: {name:?} is not a header name"))
            })?;
            let label = format!("header {name}");
            // As a request's value is read: without surrounding spaces.
            (Selector::Header(name, v.trim().as_bytes().to_vec()), label)
        }
        "cookie" => (
            Selector::Cookie(name.into(), v.as_bytes().to_vec()),
            format!("cookie {name}"),
        ),
        "query" => (
            Selector::Query(name.into(), v.as_bytes().to_vec()),
            format!("query {name}"),
        ),
        _ => {
            // Addresses are shown as logs show them; other values (an
            // API key Envoy read from a header) as a short hash.
            let label = if name == "remote_address" {
                format!("descriptor {name}={v}")
            } else {
                format!("descriptor {name}")
            };
            (Selector::Entry(name.into(), v.as_bytes().to_vec()), label)
        }
    };
    Ok((selector, label, None))
}

/// `jwt_sub=`: a token's subject, shown by the start of its hash.
fn by_subject(clients: &ClientRules, value: &str) -> Named {
    (
        Selector::Subject(value.as_bytes().to_vec()),
        format!(
            "jwt_sub #{:08x}",
            (clients.subject_hash(value.as_bytes()) >> 96) as u32
        ),
        None,
    )
}

impl Lookup {
    /// The client named by `params` (exactly one selector, and an optional
    /// `tier` that overrides the one the selector implies).
    pub(super) fn from_params(
        policy: &Policy,
        params: &[(String, String)],
    ) -> Result<Lookup, ApiError> {
        let clients = &policy.clients;
        let mut named = params
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "limit" | "tier" | "units"));
        let (Some((kind, value)), None) = (named.next(), named.next()) else {
            return Err(ApiError::bad_request(format!(
                "name the client by exactly one of {SELECTORS}"
            )));
        };
        let (selector, label, mut tier) = match kind.as_str() {
            "ip" => by_address(clients, value)?,
            "api_key" => by_api_key(clients, value)?,
            "key_hash" => by_key_hash(clients, value)?,
            "header" | "cookie" | "query" | "descriptor" => by_pair(kind, value)?,
            "jwt_sub" => by_subject(clients, value),
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
    pub(super) fn chosen(
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
    pub(super) fn identity_under(
        &self,
        policy: &Policy,
        name: &str,
    ) -> Result<(LimitId, u128), ApiError> {
        let (chosen, _) = self.chosen(policy, Some(name))?;
        let a = chosen.first().ok_or_else(|| {
            ApiError::bad_request(format!("limit {name:?} is not keyed on {}", self.label))
        })?;
        Ok((a.limit, a.identity))
    }

    /// Numbers are read for a tier: one the client's requests may not be
    /// in is no answer (a credit would move a bucket by another tier's
    /// interval).
    pub(super) fn check_tier(&self, policy: &Policy, chosen: &[Applying]) -> Result<(), ApiError> {
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
