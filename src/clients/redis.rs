//! Run-time clients in Redis: a hash of entries by key hash, and a version
//! counted up by every change. A change is one script run (entries set,
//! version counted, change announced), so it is all there or not at all.
//! Every instance loads the hash before it listens, then follows the
//! announcements on `{key_prefix}:clients`, fetching the entries each one
//! names; an announcement out of turn (one was missed: a reconnect, a
//! failover), or a version that stays ahead of what was heard, has it load
//! the whole hash again. While Redis is away, the entries last known keep
//! serving.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use log::{info, warn};
use redis::aio::MultiplexedConnection;
use tokio::sync::watch;

use super::entries::{hash_hex, parse_hash, StoredEntry};
use super::error::ClientsError;
use crate::identity::{KeyEntry, RunTimeKeys};
use crate::limiter::redis::changes::writable_node;
use crate::limiter::RedisSettings;

/// Sets the entries, counts the version up and announces both, at once.
/// KEYS[1]: the entries' hash; KEYS[2]: the version. ARGV[1]: the channel;
/// then key hash and entry JSON, in pairs. Returns the new version. A big
/// change is announced as `<version> *`: load everything.
const SET: &str = r"
local version = redis.call('INCR', KEYS[2])
local hashes = {}
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  hashes[#hashes + 1] = ARGV[i]
end
if #hashes > 100 then
  redis.call('PUBLISH', ARGV[1], version .. ' *')
else
  redis.call('PUBLISH', ARGV[1], version .. ' ' .. table.concat(hashes, ' '))
end
return version
";

/// How often the version is compared with Redis's.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long a lost connection waits before it is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// A whole load may move a million entries.
const LOAD_WITHIN: Duration = Duration::from_secs(60);

/// How long a writer waits to hear its own change back.
const HEARD_WITHIN: Duration = Duration::from_secs(1);

pub struct RedisClients {
    settings: RedisSettings,
    keys: Arc<RunTimeKeys>,
    /// The version the table holds everything up to; none before the
    /// first load.
    known: watch::Sender<Option<u64>>,
    writer: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    script: redis::Script,
}

#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the subscription ended")]
    Ended,
    #[error("a Redis Cluster keeps no run-time clients yet")]
    Cluster,
    #[error("entry {hash}: {reason}")]
    Entry { hash: String, reason: String },
}

async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, FollowError> {
    Ok(tokio::time::timeout(limit, call)
        .await
        .map_err(|_| FollowError::Timeout(limit))??)
}

impl RedisClients {
    pub fn new(settings: RedisSettings, keys: Arc<RunTimeKeys>) -> Self {
        RedisClients {
            settings,
            keys,
            known: watch::Sender::new(None),
            writer: tokio::sync::Mutex::new(None),
            script: redis::Script::new(SET),
        }
    }

    fn entries_key(&self) -> String {
        format!("{}:clients:api_keys", self.settings.key_prefix)
    }

    fn version_key(&self) -> String {
        format!("{}:clients:version", self.settings.key_prefix)
    }

    fn channel(&self) -> String {
        format!("{}:clients", self.settings.key_prefix)
    }

    /// A call's deadline: the config's, but never below what a write of
    /// thousands of entries takes.
    fn deadline(&self) -> Duration {
        self.settings.timeout.max(Duration::from_secs(2))
    }

    /// Waits (up to `limit`) for the first load.
    pub async fn loaded(&self, limit: Duration) -> Result<(), ClientsError> {
        let mut known = self.known.subscribe();
        let loaded = tokio::time::timeout(limit, known.wait_for(Option::is_some))
            .await
            .is_ok_and(|r| r.is_ok());
        if loaded {
            Ok(())
        } else {
            Err(ClientsError::Unavailable(format!(
                "not loaded within {limit:?}"
            )))
        }
    }

    async fn connect(&self) -> Result<redis::Client, FollowError> {
        match writable_node(&self.settings).await {
            None => Err(FollowError::Cluster),
            Some(client) => Ok(client?),
        }
    }

    /// Sets every entry or none, and waits (a second at most) until this
    /// instance has heard it back, so that its next request sees it.
    pub async fn set(&self, changes: &[(u128, KeyEntry)]) -> Result<(), ClientsError> {
        let unavailable = |e: FollowError| match e {
            FollowError::Cluster => ClientsError::Cluster,
            e => ClientsError::Unavailable(e.to_string()),
        };
        let mut writer = self.writer.lock().await;
        if writer.is_none() {
            let client = self.connect().await.map_err(unavailable)?;
            let connection = within(self.deadline(), client.get_multiplexed_async_connection())
                .await
                .map_err(unavailable)?;
            *writer = Some(connection);
        }
        let Some(connection) = writer.as_mut() else {
            return Err(ClientsError::Unavailable("no connection".into()));
        };
        let mut invocation = self.script.key(self.entries_key());
        invocation.key(self.version_key()).arg(self.channel());
        for (hash, entry) in changes {
            invocation
                .arg(hash_hex(*hash))
                .arg(StoredEntry::to_json(entry));
        }
        let version: u64 = match within(self.deadline(), invocation.invoke_async(connection)).await
        {
            Ok(version) => version,
            Err(e) => {
                // Made afresh next time: a connection that timed out may
                // answer this call's reply to the next one.
                *writer = None;
                return Err(unavailable(e));
            }
        };
        drop(writer);
        let mut known = self.known.subscribe();
        let heard = known.wait_for(|k| k.is_some_and(|k| k >= version));
        if tokio::time::timeout(HEARD_WITHIN, heard).await.is_err() {
            warn!("run-time clients: change {version} is in Redis but not heard back within {HEARD_WITHIN:?}; it applies here when the subscription is back");
        }
        Ok(())
    }

    /// Follows Redis until the process ends: (re)subscribes, loads
    /// everything, then applies what is announced.
    pub async fn follow(self: Arc<Self>) {
        let mut lost = false;
        loop {
            let error = self.follow_once(&mut lost).await;
            if matches!(error, FollowError::Cluster) {
                warn!("run-time clients: {error}; the admin API refuses their changes");
                return;
            }
            if !lost {
                warn!(
                    "run-time clients: lost Redis ({error}); the {} entries last known keep serving, changes are refused until it is back",
                    self.keys.len()
                );
                lost = true;
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn follow_once(&self, lost: &mut bool) -> FollowError {
        match self.subscribed(lost).await {
            Ok(()) => FollowError::Ended,
            Err(e) => e,
        }
    }

    async fn subscribed(&self, lost: &mut bool) -> Result<(), FollowError> {
        let deadline = self.deadline();
        let client = self.connect().await?;
        let mut pubsub = within(deadline, client.get_async_pubsub()).await?;
        within(deadline, pubsub.subscribe(self.channel())).await?;
        let mut connection = within(deadline, client.get_multiplexed_async_connection()).await?;
        // Subscribed first: nothing announced after the load is missed.
        let version = self.load(&mut connection).await?;
        if std::mem::take(lost) {
            info!(
                "run-time clients: Redis is back; {} entries at version {version}",
                self.keys.len()
            );
        }
        let (mut sink, mut messages) = pubsub.split();
        let mut checks = tokio::time::interval(CHECK_EVERY);
        checks.tick().await;
        let mut behind = 0u32;
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else {
                        return Err(FollowError::Ended);
                    };
                    let text = String::from_utf8_lossy(message.get_payload_bytes()).into_owned();
                    self.heard(&mut connection, &text).await?;
                }
                _ = checks.tick() => {
                    // A message may be on its way: behind twice running
                    // (a second apart) is a missed one.
                    let version: Option<u64> =
                        within(deadline, redis::cmd("GET").arg(self.version_key()).query_async(&mut connection)).await?;
                    if version.unwrap_or(0) > self.known().unwrap_or(0) {
                        behind += 1;
                        if behind >= 2 {
                            let version = self.load(&mut connection).await?;
                            info!("run-time clients: a change was missed; all {} entries loaded again at version {version}", self.keys.len());
                            behind = 0;
                        }
                    } else {
                        behind = 0;
                    }
                    within(deadline, sink.ping::<redis::Value>()).await?;
                }
            }
        }
    }

    fn known(&self) -> Option<u64> {
        *self.known.borrow()
    }

    /// Everything, and the version it is at, read at one instant.
    async fn load(&self, connection: &mut MultiplexedConnection) -> Result<u64, FollowError> {
        let (version, all): (Option<u64>, Vec<(String, Vec<u8>)>) = within(
            LOAD_WITHIN,
            redis::pipe()
                .atomic()
                .cmd("GET")
                .arg(self.version_key())
                .cmd("HGETALL")
                .arg(self.entries_key())
                .query_async(connection),
        )
        .await?;
        let mut entries = Vec::with_capacity(all.len());
        for (hash, json) in all {
            // Only the script writes there; whatever else did is skipped.
            match decode(&hash, &json) {
                Ok(entry) => entries.push(entry),
                Err(e) => warn!("run-time clients: skipped: {e}"),
            }
        }
        let version = version.unwrap_or(0);
        let first = self.known().is_none();
        self.keys.replace_all(entries);
        self.known.send_replace(Some(version));
        if first {
            info!(
                "run-time clients: {} API key entries loaded from Redis at version {version}",
                self.keys.len()
            );
        }
        Ok(version)
    }

    /// One announcement: `<version> <hash> ...`, or `<version> *`.
    async fn heard(
        &self,
        connection: &mut MultiplexedConnection,
        text: &str,
    ) -> Result<(), FollowError> {
        let mut words = text.split_ascii_whitespace();
        let Some(version) = words.next().and_then(|v| v.parse::<u64>().ok()) else {
            return Ok(());
        };
        let known = self.known().unwrap_or(0);
        if version <= known {
            return Ok(());
        }
        let hashes: Vec<&str> = words.collect();
        if version != known + 1 || hashes.contains(&"*") {
            self.load(connection).await?;
            return Ok(());
        }
        // The entries as they are now (a later change may be in them
        // already: it is announced after, and fetched again then).
        let values: Vec<Option<Vec<u8>>> = within(
            self.deadline(),
            redis::cmd("HMGET")
                .arg(self.entries_key())
                .arg(&hashes)
                .query_async(connection),
        )
        .await?;
        for (hash, value) in hashes.iter().zip(values) {
            match value {
                Some(json) => match decode(hash, &json) {
                    Ok(entry) => self.keys.set([entry]),
                    Err(e) => warn!("run-time clients: skipped: {e}"),
                },
                None => {
                    if let Ok(hash) = parse_hash(hash) {
                        self.keys.remove(hash);
                    }
                }
            }
        }
        self.known.send_replace(Some(version));
        Ok(())
    }
}

fn decode(hash: &str, json: &[u8]) -> Result<(u128, KeyEntry), FollowError> {
    let entry = |reason: String| FollowError::Entry {
        hash: hash.chars().take(40).collect(),
        reason,
    };
    let parsed = parse_hash(hash).map_err(|e| entry(e.to_string()))?;
    let value = StoredEntry::from_json(json).map_err(|e| entry(e.to_string()))?;
    Ok((parsed, value))
}
