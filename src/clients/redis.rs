//! Run-time clients in Redis: a hash of API key entries by key hash, one of
//! overrides by `<limit>:<identity>`, and a version counted up by every
//! change to either. A change is one script run (entries set,
//! version counted, change announced), so it is all there or not at all;
//! on a cluster the three keys share a hash tag, hence a slot, so that one
//! script may touch them all.
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
use tokio::sync::watch;

use super::entries::{hash_hex, parse_hash, StoredEntry};
use super::error::ClientsError;
use super::overrides::{field_of, parse_field, StoredOverride};
use super::tables::Tables;
use floodgate_limiter::redis::beside_limits::{
    grouped_key, subscription_node, topology_connection, TopologyConnection,
};
use floodgate_limiter::RedisSettings;
use floodgate_policy::identity::KeyEntry;
use floodgate_policy::overrides::{Override, OverrideKey};

/// Sets the entries of one table, counts the version up and announces
/// both, at once. KEYS[1]: the table's hash; KEYS[2]: the version.
/// ARGV[1]: the channel; ARGV[2]: the table's name; then field and entry
/// JSON, in pairs (an empty entry removes the field). Returns the new
/// version. The announcement is `<version> <table> <field> ...`; a big
/// change is announced as `<version> *`: load everything.
const SET: &str = r"
local version = redis.call('INCR', KEYS[2])
local fields = {}
for i = 3, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  fields[#fields + 1] = ARGV[i]
end
if #fields > 100 then
  redis.call('PUBLISH', ARGV[1], version .. ' *')
else
  redis.call('PUBLISH', ARGV[1], version .. ' ' .. ARGV[2] .. ' ' .. table.concat(fields, ' '))
end
return version
";

/// Removes the overrides named that expired by ARGV[1] (seconds since the
/// Unix epoch), as Redis holds them: one set again meanwhile stays. Not
/// announced: every instance drops an expired override by itself.
/// KEYS[1]: the overrides' hash; ARGV[2..]: fields. Returns how many went.
const DROP_EXPIRED: &str = r"
local now = tonumber(ARGV[1])
local removed = 0
for i = 2, #ARGV do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  if value then
    local ok, entry = pcall(cjson.decode, value)
    if ok and type(entry) == 'table' and type(entry.expires_at) == 'number'
        and entry.expires_at <= now then
      redis.call('HDEL', KEYS[1], ARGV[i])
      removed = removed + 1
    end
  end
end
return removed
";

/// The tables, by the names announcements give them.
const API_KEYS: &str = "api_keys";
const OVERRIDES: &str = "overrides";

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
    tables: Tables,
    /// The version the table holds everything up to; none before the
    /// first load.
    known: watch::Sender<Option<u64>>,
    writer: tokio::sync::Mutex<Option<TopologyConnection>>,
    script: redis::Script,
    drop_expired: redis::Script,
}

#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the subscription ended")]
    Ended,
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
    pub fn new(settings: RedisSettings, tables: Tables) -> Self {
        RedisClients {
            settings,
            tables,
            known: watch::Sender::new(None),
            writer: tokio::sync::Mutex::new(None),
            script: redis::Script::new(SET),
            drop_expired: redis::Script::new(DROP_EXPIRED),
        }
    }

    fn entries_key(&self) -> String {
        grouped_key(&self.settings, "clients", API_KEYS)
    }

    fn overrides_key(&self) -> String {
        grouped_key(&self.settings, "clients", OVERRIDES)
    }

    fn version_key(&self) -> String {
        grouped_key(&self.settings, "clients", "version")
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

    async fn connect(&self) -> Result<TopologyConnection, FollowError> {
        within(self.deadline(), topology_connection(&self.settings)).await
    }

    /// Sets every key entry or none, and waits (a second at most) until
    /// this instance has heard it back, so that its next request sees it.
    pub async fn set(&self, changes: &[(u128, KeyEntry)]) -> Result<(), ClientsError> {
        let pairs = changes
            .iter()
            .map(|(hash, entry)| (hash_hex(*hash), StoredEntry::to_json(entry)));
        self.write(self.entries_key(), API_KEYS, pairs).await
    }

    /// Sets (or removes) every override or none, as `set`.
    pub async fn set_overrides(
        &self,
        changes: &[(OverrideKey, Option<Override>)],
    ) -> Result<(), ClientsError> {
        let pairs = changes.iter().map(|(key, entry)| {
            (
                field_of(key),
                entry
                    .as_ref()
                    .map(StoredOverride::to_json)
                    .unwrap_or_default(),
            )
        });
        self.write(self.overrides_key(), OVERRIDES, pairs).await
    }

    /// Removes from Redis the overrides this instance saw expire by
    /// `now_s` (best effort: one left behind is looked past, and removed
    /// at the next expiry or change of its client).
    pub async fn drop_expired(&self, keys: &[OverrideKey], now_s: u64) {
        if keys.is_empty() {
            return;
        }
        let Ok(mut connection) = self.writer().await else {
            return;
        };
        let mut invocation = self.drop_expired.key(self.overrides_key());
        invocation.arg(now_s);
        for key in keys {
            invocation.arg(field_of(key));
        }
        let removed: Result<u64, _> =
            within(self.deadline(), invocation.invoke_async(&mut connection)).await;
        if let Err(e) = removed {
            log::debug!("run-time clients: expired overrides not removed from Redis: {e}");
        }
    }

    /// A connection of its own for a write (the writer's may be busy).
    async fn writer(&self) -> Result<TopologyConnection, FollowError> {
        self.connect().await
    }

    async fn write(
        &self,
        hash: String,
        table: &str,
        pairs: impl Iterator<Item = (String, String)>,
    ) -> Result<(), ClientsError> {
        let unavailable = |e: FollowError| ClientsError::Unavailable(e.to_string());
        let mut writer = self.writer.lock().await;
        if writer.is_none() {
            *writer = Some(self.connect().await.map_err(unavailable)?);
        }
        let Some(connection) = writer.as_mut() else {
            return Err(ClientsError::Unavailable("no connection".into()));
        };
        let mut invocation = self.script.key(hash);
        invocation
            .key(self.version_key())
            .arg(self.channel())
            .arg(table);
        for (field, entry) in pairs {
            invocation.arg(field).arg(entry);
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
        for attempt in 0usize.. {
            let error = self.follow_once(attempt, &mut lost).await;
            if !lost {
                warn!(
                    "run-time clients: lost Redis ({error}); the {} entries last known keep serving, changes are refused until it is back",
                    self.tables.keys.len()
                );
                lost = true;
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn follow_once(&self, attempt: usize, lost: &mut bool) -> FollowError {
        match self.subscribed(attempt, lost).await {
            Ok(()) => FollowError::Ended,
            Err(e) => e,
        }
    }

    async fn subscribed(&self, attempt: usize, lost: &mut bool) -> Result<(), FollowError> {
        let deadline = self.deadline();
        let node = within(deadline, subscription_node(&self.settings, attempt)).await?;
        let mut pubsub = within(deadline, node.get_async_pubsub()).await?;
        within(deadline, pubsub.subscribe(self.channel())).await?;
        let mut connection = self.connect().await?;
        // Subscribed first: nothing announced after the load is missed.
        let version = self.load(&mut connection).await?;
        if std::mem::take(lost) {
            info!(
                "run-time clients: Redis is back; {} entries at version {version}",
                self.tables.keys.len()
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
                            info!("run-time clients: a change was missed; all {} entries loaded again at version {version}", self.tables.keys.len());
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
    async fn load(&self, connection: &mut TopologyConnection) -> Result<u64, FollowError> {
        type Fields = Vec<(String, Vec<u8>)>;
        let (version, all, overrides): (Option<u64>, Fields, Fields) = within(
            LOAD_WITHIN,
            // One MULTI: on a cluster it goes to the keys' one slot.
            redis::pipe()
                .atomic()
                .cmd("GET")
                .arg(self.version_key())
                .cmd("HGETALL")
                .arg(self.entries_key())
                .cmd("HGETALL")
                .arg(self.overrides_key())
                .query_async(connection),
        )
        .await?;
        let mut kept = Vec::with_capacity(overrides.len());
        for (field, json) in overrides {
            match decode_override(&field, &json) {
                Ok(entry) => kept.push(entry),
                Err(e) => warn!("run-time clients: skipped: {e}"),
            }
        }
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
        self.tables.keys.replace_all(entries);
        self.tables.overrides.replace_all(self.tables.read(kept));
        self.known.send_replace(Some(version));
        if first {
            info!(
                "run-time clients: {} API key entries and {} overrides loaded from Redis at version {version}",
                self.tables.keys.len(),
                self.tables.overrides.len()
            );
        }
        Ok(version)
    }

    /// One announcement: `<version> <table> <field> ...`, or `<version> *`.
    async fn heard(
        &self,
        connection: &mut TopologyConnection,
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
        let table = words.next();
        let hashes: Vec<&str> = words.collect();
        if version != known + 1 || table == Some("*") {
            self.load(connection).await?;
            return Ok(());
        }
        if table == Some(OVERRIDES) {
            self.heard_overrides(connection, &hashes).await?;
            self.known.send_replace(Some(version));
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
                    Ok(entry) => self.tables.keys.set([entry]),
                    Err(e) => warn!("run-time clients: skipped: {e}"),
                },
                None => {
                    if let Ok(hash) = parse_hash(hash) {
                        self.tables.keys.remove(hash);
                    }
                }
            }
        }
        self.known.send_replace(Some(version));
        Ok(())
    }
}

impl RedisClients {
    /// The overrides an announcement names, as they are now.
    async fn heard_overrides(
        &self,
        connection: &mut TopologyConnection,
        fields: &[&str],
    ) -> Result<(), FollowError> {
        let values: Vec<Option<Vec<u8>>> = within(
            self.deadline(),
            redis::cmd("HMGET")
                .arg(self.overrides_key())
                .arg(fields)
                .query_async(connection),
        )
        .await?;
        for (field, value) in fields.iter().zip(values) {
            let Ok(key) = parse_field(field) else {
                warn!("run-time clients: skipped: {field:?} names no override");
                continue;
            };
            match value {
                Some(json) => match decode_override(field, &json) {
                    Ok(entry) => {
                        let read = self.tables.read(vec![entry]);
                        self.tables
                            .overrides
                            .set(read.into_iter().map(|(k, o)| (k, Some(o))));
                    }
                    Err(e) => warn!("run-time clients: skipped: {e}"),
                },
                None => self.tables.overrides.set([(key, None)]),
            }
        }
        Ok(())
    }
}

fn decode_override(field: &str, json: &[u8]) -> Result<(OverrideKey, StoredOverride), FollowError> {
    let entry = |reason: String| FollowError::Entry {
        hash: field.chars().take(60).collect(),
        reason,
    };
    let key = parse_field(field).map_err(|e| entry(e.to_string()))?;
    let value = StoredOverride::from_json(json).map_err(|e| entry(e.to_string()))?;
    Ok((key, value))
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
