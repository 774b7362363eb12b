//! Clients as data: the API keys an operator sets at run time through the
//! admin API, by keyed hash only. The table requests read is in process
//! (`identity::RunTimeKeys`); this module keeps it durable and shared:
//! in `[admin].clients_file` for the memory store, in Redis (with every
//! instance following its changes) with `[redis]`.

mod entries;
mod error;
mod file;
mod overrides;
mod redis;
mod tables;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use entries::{hash_hex, parse_hash, EntryError, StoredEntry};
pub use error::ClientsError;
pub use file::LoadError;
pub use overrides::{field_of, OverrideChecker, StoredOverride};
pub use redis::RedisClients;
pub use tables::Tables;

use floodgate_limiter::RedisSettings;
use floodgate_policy::identity::{KeyEntry, RunTimeKeys};
use floodgate_policy::overrides::{Override, OverrideKey, RunTimeOverrides};

/// At most this many keys in one import.
pub const MAX_IMPORT: usize = 10_000;

/// Where the entries are kept beyond this process.
enum Keeping {
    /// In this process only (no `clients_file`): lost on restart.
    Memory,
    /// `[admin].clients_file`.
    File(PathBuf),
    Redis(Arc<RedisClients>),
}

/// The run-time clients of this process and where they are kept.
pub struct RunTimeClients {
    pub keys: Arc<RunTimeKeys>,
    pub overrides: Arc<RunTimeOverrides>,
    checker: Arc<arc_swap::ArcSwap<OverrideChecker>>,
    keeping: Keeping,
    /// One change at a time: the file is written whole, and a change is
    /// in the table before the next starts.
    writing: tokio::sync::Mutex<()>,
}

impl RunTimeClients {
    /// Kept in memory, or in `file` (loaded now: a file that cannot be read
    /// stops the start, rather than bring revoked keys back).
    pub fn local(tables: Tables, file: Option<PathBuf>) -> Result<Self, LoadError> {
        let keeping = match file {
            Some(path) => {
                let kept = file::load(&path)?;
                log::info!(
                    "run-time clients: {} API key entries and {} overrides loaded from {}",
                    kept.api_keys.len(),
                    kept.overrides.len(),
                    path.display()
                );
                tables.keys.replace_all(kept.api_keys);
                tables.overrides.replace_all(tables.read(kept.overrides));
                Keeping::File(path)
            }
            None => Keeping::Memory,
        };
        Ok(RunTimeClients {
            keys: tables.keys,
            overrides: tables.overrides,
            checker: tables.checker,
            keeping,
            writing: tokio::sync::Mutex::new(()),
        })
    }

    /// Kept in Redis, loaded and followed by `RedisClients::follow`.
    pub fn shared(tables: Tables, settings: &RedisSettings) -> (Self, Arc<RedisClients>) {
        let redis = Arc::new(RedisClients::new(settings.clone(), tables.clone()));
        let clients = RunTimeClients {
            keys: tables.keys,
            overrides: tables.overrides,
            checker: tables.checker,
            keeping: Keeping::Redis(redis.clone()),
            writing: tokio::sync::Mutex::new(()),
        };
        (clients, redis)
    }

    /// Where they are kept, for answers.
    pub fn kept_in(&self) -> &'static str {
        match &self.keeping {
            Keeping::Memory => "memory",
            Keeping::File(_) => "file",
            Keeping::Redis(_) => "redis",
        }
    }

    /// Before the proxy listens: the entries as Redis has them (waited for
    /// up to `within`; the memory store's were loaded when built).
    pub async fn warm(&self, within: Duration) -> Result<(), ClientsError> {
        match &self.keeping {
            Keeping::Redis(redis) => redis.loaded(within).await,
            _ => Ok(()),
        }
    }

    /// Sets every entry, or none; returns once this instance serves them
    /// (with Redis: once the change is heard back, or after a second).
    pub async fn set(&self, changes: Vec<(u128, KeyEntry)>) -> Result<(), ClientsError> {
        let _one_at_a_time = self.writing.lock().await;
        match &self.keeping {
            Keeping::Memory => {
                self.keys.set(changes);
                Ok(())
            }
            Keeping::File(path) => {
                let mut all = self.keys.entries();
                all.extend(changes.iter().cloned());
                self.save(path, all, self.overrides.entries())?;
                self.keys.set(changes);
                Ok(())
            }
            Keeping::Redis(redis) => redis.set(&changes).await,
        }
    }

    /// Sets (or with `None` removes) every override, or none; returns once
    /// this instance applies them, as `set`.
    pub async fn set_overrides(
        &self,
        changes: Vec<(OverrideKey, Option<Override>)>,
    ) -> Result<(), ClientsError> {
        let _one_at_a_time = self.writing.lock().await;
        match &self.keeping {
            Keeping::Memory => {
                self.overrides.set(changes);
                Ok(())
            }
            Keeping::File(path) => {
                let mut all: std::collections::HashMap<OverrideKey, Override> =
                    self.overrides.entries().into_iter().collect();
                for (key, change) in &changes {
                    match change {
                        Some(entry) => all.insert(*key, entry.clone()),
                        None => all.remove(key),
                    };
                }
                self.save(path, self.keys.entries(), all.into_iter().collect())?;
                self.overrides.set(changes);
                Ok(())
            }
            Keeping::Redis(redis) => redis.set_overrides(&changes).await,
        }
    }

    /// The overrides this process saw expire by `now_s`, gone from where
    /// they are shared too. A file keeps them until its next write (a
    /// load looks past them).
    pub async fn expired(&self, keys: &[OverrideKey], now_s: u64) {
        if let Keeping::Redis(redis) = &self.keeping {
            redis.drop_expired(keys, now_s).await;
        }
    }

    fn save(
        &self,
        path: &std::path::Path,
        keys: Vec<(u128, KeyEntry)>,
        overrides: Vec<(OverrideKey, Override)>,
    ) -> Result<(), ClientsError> {
        file::save(path, keys, overrides).map_err(|source| ClientsError::File {
            path: path.display().to_string(),
            source,
        })
    }

    /// A reload: every override read again by the new configuration (one
    /// whose limit went away or changed algorithm is kept, out of force).
    pub fn reconfigured(&self, checker: OverrideChecker) {
        let checker = Arc::new(checker);
        self.checker.store(checker.clone());
        if !self.overrides.is_empty() {
            self.overrides
                .recheck_all(|entry| checker.recheck(entry).rule);
        }
    }
}

#[cfg(test)]
mod tests;
