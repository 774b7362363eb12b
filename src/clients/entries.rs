//! An entry as it is kept (the file's and Redis's JSON), and the hashes
//! that name it (32 hex digits).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use floodgate_policy::identity::KeyEntry;

/// A key's entry as JSON: `{"tier": "pro", "set_at": 1700000000, "label":
/// "customer-42"}`, or `{"revoked": true, "set_at": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
    pub set_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// A kept entry that does not read.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error("{0:?} is not a key hash (32 hex digits)")]
    Hash(String),
    #[error("not an entry: {0}")]
    Json(#[from] serde_json::Error),
    #[error("an entry holds a tier or is revoked, not both nor neither")]
    Shape,
}

impl StoredEntry {
    pub fn of(entry: &KeyEntry) -> StoredEntry {
        StoredEntry {
            tier: entry.tier.as_deref().map(str::to_string),
            revoked: entry.tier.is_none(),
            set_at: entry.set_at,
            label: entry.label.as_deref().map(str::to_string),
        }
    }

    pub fn into_entry(self) -> Result<KeyEntry, EntryError> {
        if self.revoked == self.tier.is_some() {
            return Err(EntryError::Shape);
        }
        Ok(KeyEntry {
            tier: self.tier.map(Arc::from),
            set_at: self.set_at,
            label: self.label.map(String::into_boxed_str),
        })
    }

    pub fn to_json(entry: &KeyEntry) -> String {
        serde_json::to_string(&StoredEntry::of(entry)).unwrap_or_default()
    }

    pub fn from_json(text: &[u8]) -> Result<KeyEntry, EntryError> {
        serde_json::from_slice::<StoredEntry>(text)?.into_entry()
    }
}

/// A hash as the API, the file and Redis write it.
pub fn hash_hex(hash: u128) -> String {
    format!("{hash:032x}")
}

/// A hash as written by `hash_hex`.
pub fn parse_hash(text: &str) -> Result<u128, EntryError> {
    if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(EntryError::Hash(text.chars().take(40).collect()));
    }
    u128::from_str_radix(text, 16).map_err(|_| EntryError::Hash(text.into()))
}
