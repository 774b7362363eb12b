//! A client's override as it is kept (the file's and Redis's JSON), the
//! field that names it (`<limit id>:<identity>`, hex), and the check that
//! turns kept numbers into the running configuration's rule.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::entries::EntryError;
use crate::config::overrides::OverrideRules;
use crate::config::Config;
use floodgate_policy::overrides::{Override, OverrideKey};

/// An override as JSON: `{"limit": "per-account", "numbers": {"capacity":
/// 5000, "refill_rate": 100}, "expires_at": 1767225600, "set_at":
/// 1765000000, "client": "key#1a2b3c4d", "label": "launch week"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredOverride {
    pub limit: String,
    pub numbers: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    pub set_at: u64,
    pub client: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl StoredOverride {
    pub fn of(entry: &Override) -> StoredOverride {
        StoredOverride {
            limit: entry.limit_name.to_string(),
            numbers: serde_json::from_str(&entry.numbers).unwrap_or_default(),
            expires_at: entry.expires_at_s,
            set_at: entry.set_at_s,
            client: entry.client.to_string(),
            label: entry.label.as_deref().map(str::to_string),
        }
    }

    pub fn to_json(entry: &Override) -> String {
        serde_json::to_string(&StoredOverride::of(entry)).unwrap_or_default()
    }

    pub fn from_json(text: &[u8]) -> Result<StoredOverride, EntryError> {
        Ok(serde_json::from_slice(text)?)
    }
}

/// How a kept override is named: the limit's state id and the client's
/// identity under it, in hex (`0123456789abcdef:` then 32 digits).
pub fn field_of(key: &OverrideKey) -> String {
    format!("{:016x}:{:032x}", key.limit, key.identity)
}

/// A field as `field_of` writes it.
pub(super) fn parse_field(text: &str) -> Result<OverrideKey, EntryError> {
    let bad = || EntryError::Hash(text.chars().take(60).collect());
    let (limit, identity) = text.split_once(':').ok_or_else(bad)?;
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(limit, 16) || !hex(identity, 32) {
        return Err(bad());
    }
    Ok(OverrideKey {
        limit: u64::from_str_radix(limit, 16).map_err(|_| bad())?,
        identity: u128::from_str_radix(identity, 16).map_err(|_| bad())?,
    })
}

/// What the running configuration makes of kept numbers: its limits by
/// name, and how each reads an override's numbers.
#[derive(Debug, Clone, Default)]
pub struct OverrideChecker {
    rules: OverrideRules,
    /// Place in `policy.limits` and state id, by name.
    limits: HashMap<Arc<str>, (usize, u64)>,
}

impl OverrideChecker {
    pub fn of(config: &Config) -> OverrideChecker {
        OverrideChecker {
            rules: config.override_rules.clone(),
            limits: config
                .policy
                .limits
                .iter()
                .enumerate()
                .map(|(i, l)| (Arc::from(l.name.as_str()), (i, l.id)))
                .collect(),
        }
    }

    /// The kept override as this configuration reads it; its rule an error
    /// where the configuration makes none of its numbers.
    pub fn entry(&self, stored: StoredOverride) -> Override {
        let rule = match self.limits.get(stored.limit.as_str()) {
            None => Err(format!("no limit {:?} in the running configuration", stored.limit).into()),
            Some(&(index, _)) => self
                .rules
                .rule(index, &stored.numbers)
                .map_err(|e| e.to_string().into_boxed_str()),
        };
        Override {
            limit_name: Arc::from(stored.limit.as_str()),
            rule,
            numbers: Value::Object(stored.numbers).to_string().into(),
            expires_at_s: stored.expires_at,
            set_at_s: stored.set_at,
            client: stored.client.into(),
            label: stored.label.map(String::into_boxed_str),
        }
    }

    /// An entry read again under this configuration (after a reload).
    pub fn recheck(&self, entry: &Override) -> Override {
        self.entry(StoredOverride::of(entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_reads_back_as_its_key_and_nothing_else_reads() {
        let key = OverrideKey {
            limit: 0x0123_4567_89ab_cdef,
            identity: u128::MAX - 5,
        };
        assert_eq!(parse_field(&field_of(&key)).unwrap(), key);
        for bad in [
            "",
            "0123456789abcdef",
            "0123456789abcdef:",
            "0123456789abcde:ffffffffffffffffffffffffffffffff",
            "0123456789abcdeg:ffffffffffffffffffffffffffffffff",
            "0123456789abcdef:fffffffffffffffffffffffffffffff",
            "+123456789abcdef:ffffffffffffffffffffffffffffffff",
        ] {
            assert!(parse_field(bad).is_err(), "{bad:?}");
        }
    }
}
