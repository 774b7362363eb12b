//! `[admin].clients_file`: the run-time clients of the memory store, one
//! JSON document rewritten whole at every change (a temporary file renamed
//! over it, so that a crash leaves the old file or the new, never a part).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::entries::{hash_hex, parse_hash, EntryError, StoredEntry};
use super::overrides::{field_of, parse_field, StoredOverride};
use floodgate_policy::identity::KeyEntry;
use floodgate_policy::overrides::{Override, OverrideKey};

/// The file's layout; `format` changes when a field changes meaning (a
/// file without `overrides` is one from before them, and has none).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    format: u32,
    api_keys: BTreeMap<String, StoredEntry>,
    #[serde(default)]
    overrides: BTreeMap<String, StoredOverride>,
}

/// What the file keeps.
#[derive(Debug, Default)]
pub(super) struct Kept {
    pub api_keys: Vec<(u128, KeyEntry)>,
    pub overrides: Vec<(OverrideKey, StoredOverride)>,
}

const FORMAT: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a clients file: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: format {found}, this build reads {FORMAT}")]
    Format { path: String, found: u32 },
    #[error("{path}: {table}.{hash}: {source}")]
    Entry {
        path: String,
        table: &'static str,
        hash: String,
        source: EntryError,
    },
}

/// The entries in `path`; none when there is no file yet.
pub(super) fn load(path: &Path) -> Result<Kept, LoadError> {
    let shown = || path.display().to_string();
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Kept::default()),
        Err(source) => {
            return Err(LoadError::Read {
                path: shown(),
                source,
            })
        }
    };
    let document: Document = serde_json::from_slice(&bytes).map_err(|source| LoadError::Parse {
        path: shown(),
        source,
    })?;
    if document.format != FORMAT {
        return Err(LoadError::Format {
            path: shown(),
            found: document.format,
        });
    }
    let api_keys = document
        .api_keys
        .into_iter()
        .map(|(hash, stored)| {
            let entry = parse_hash(&hash).and_then(|h| Ok((h, stored.into_entry()?)));
            entry.map_err(|source| LoadError::Entry {
                path: shown(),
                table: "api_keys",
                hash,
                source,
            })
        })
        .collect::<Result<_, _>>()?;
    let overrides = document
        .overrides
        .into_iter()
        .map(|(field, stored)| {
            parse_field(&field)
                .map(|key| (key, stored))
                .map_err(|source| LoadError::Entry {
                    path: shown(),
                    table: "overrides",
                    hash: field,
                    source,
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(Kept {
        api_keys,
        overrides,
    })
}

/// Writes `entries` and `overrides` (a later one of a hash or a key beats
/// an earlier) to `path`: to a temporary file beside it, flushed to disk,
/// then renamed over it.
pub(super) fn save(
    path: &Path,
    entries: Vec<(u128, KeyEntry)>,
    overrides: Vec<(OverrideKey, Override)>,
) -> std::io::Result<()> {
    let unique: HashMap<u128, KeyEntry> = entries.into_iter().collect();
    let document = Document {
        format: FORMAT,
        api_keys: unique
            .iter()
            .map(|(hash, entry)| (hash_hex(*hash), StoredEntry::of(entry)))
            .collect(),
        overrides: overrides
            .iter()
            .map(|(key, entry)| (field_of(key), StoredOverride::of(entry)))
            .collect(),
    };
    let bytes = serde_json::to_vec(&document).map_err(std::io::Error::other)?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = std::path::PathBuf::from(temporary);
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)?;
        // The rename itself outlives a crash once the directory is synced.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}
