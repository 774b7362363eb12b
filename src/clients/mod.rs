//! Clients as data: the API keys an operator sets at run time through the
//! admin API, by keyed hash only. The table requests read is in process
//! (`identity::RunTimeKeys`); this module keeps it durable and shared:
//! in `[admin].clients_file` for the memory store, in Redis (with every
//! instance following its changes) with `[redis]`.

mod entries;
mod error;
mod file;
mod redis;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use entries::{hash_hex, parse_hash, EntryError, StoredEntry};
pub use error::ClientsError;
pub use file::LoadError;
pub use redis::RedisClients;

use crate::identity::{KeyEntry, RunTimeKeys};
use crate::limiter::RedisSettings;

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
    keeping: Keeping,
    /// One change at a time: the file is written whole, and a change is
    /// in the table before the next starts.
    writing: tokio::sync::Mutex<()>,
}

impl RunTimeClients {
    /// Kept in memory, or in `file` (loaded now: a file that cannot be read
    /// stops the start, rather than bring revoked keys back).
    pub fn local(keys: Arc<RunTimeKeys>, file: Option<PathBuf>) -> Result<Self, LoadError> {
        let keeping = match file {
            Some(path) => {
                let entries = file::load(&path)?;
                log::info!(
                    "run-time clients: {} API key entries loaded from {}",
                    entries.len(),
                    path.display()
                );
                keys.replace_all(entries);
                Keeping::File(path)
            }
            None => Keeping::Memory,
        };
        Ok(RunTimeClients {
            keys,
            keeping,
            writing: tokio::sync::Mutex::new(()),
        })
    }

    /// Kept in Redis, loaded and followed by `RedisClients::follow`.
    pub fn shared(keys: Arc<RunTimeKeys>, settings: &RedisSettings) -> (Self, Arc<RedisClients>) {
        let redis = Arc::new(RedisClients::new(settings.clone(), keys.clone()));
        let clients = RunTimeClients {
            keys,
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
                file::save(path, all).map_err(|source| ClientsError::File {
                    path: path.display().to_string(),
                    source,
                })?;
                self.keys.set(changes);
                Ok(())
            }
            Keeping::Redis(redis) => redis.set(&changes).await,
        }
    }
}

#[cfg(test)]
mod tests;
