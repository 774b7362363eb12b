//! Redis Sentinel: the master is whichever node the sentinels name, and a
//! failover moves it. The connection follows: a `+switch-master` event, a
//! READONLY reply (the node was demoted and kept its clients) or a lost
//! connection starts one search; the search asks the sentinels in turn,
//! checks that the node named calls itself master (a sentinel that missed
//! the failover still names the old one), and swaps the connection, which
//! drops the one to the old master. Requests never wait on a search: they
//! keep the connection they have, and while it fails they are decided as
//! any Redis failure is (the breaker and `on_failure`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use log::{info, warn};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture, Value,
};

use super::scripted::{connection_error, install_tls_provider};
use super::settings::{RedisSettings, SentinelSettings};
use crate::error::LimiterError;

/// How long asking one sentinel may take: a connect to it and one to the
/// node it names (over TLS, three round trips each), a query on each.
fn ask_within(settings: &RedisSettings) -> Duration {
    settings.node_connect_within() * 2
}

/// Between two rounds of a search that found no master (the failover is
/// still going on).
const SEARCH_AGAIN: Duration = Duration::from_millis(100);

/// Before the `+switch-master` subscription is made again.
const RESUBSCRIBE: Duration = Duration::from_secs(1);

/// The master found, and the connection to it.
struct Master {
    host: String,
    port: u16,
    connection: ConnectionManager,
}

struct Followed {
    settings: RedisSettings,
    sentinel: SentinelSettings,
    master: RwLock<Arc<Master>>,
    searching: AtomicBool,
}

/// A connection to the master the sentinels name, whichever node that is.
#[derive(Clone)]
pub(super) struct SentinelMaster(Arc<Followed>);

impl SentinelMaster {
    /// Finds the master now (a first request gets an answer or an error,
    /// not a promise), then follows it.
    pub(super) async fn connect(
        settings: &RedisSettings,
        sentinel: &SentinelSettings,
    ) -> Result<Self, LimiterError> {
        install_tls_provider();
        let (host, port) = find_master(settings, sentinel)
            .await
            .map_err(connection_error)?;
        let connection = manager(settings, sentinel, &host, port).await?;
        info!(
            "Redis Sentinel: master \"{}\" is {host}:{port}",
            sentinel.master
        );
        let followed = Arc::new(Followed {
            settings: settings.clone(),
            sentinel: sentinel.clone(),
            master: RwLock::new(Arc::new(Master {
                host,
                port,
                connection,
            })),
            searching: AtomicBool::new(false),
        });
        tokio::spawn(watch_switches(Arc::downgrade(&followed)));
        Ok(SentinelMaster(followed))
    }

    fn master(&self) -> Arc<Master> {
        self.0.current()
    }

    fn after(&self, result: &redis::RedisResult<impl Sized>) {
        if let Err(e) = result {
            if lost_master(e) {
                self.0.clone().search();
            }
        }
    }
}

/// Errors that say the node is no longer (or not reachably) the master.
fn lost_master(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
}

impl Followed {
    /// The master in use. The lock guards one swap of an `Arc`: a
    /// poisoned one still holds a whole value.
    fn current(&self) -> Arc<Master> {
        match self.master.read() {
            Ok(master) => master.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// One search at a time, in the background, until a master answers.
    fn search(self: Arc<Self>) {
        if self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(async move {
            let mut logged = false;
            loop {
                match self.try_master().await {
                    Ok(()) => break,
                    Err(e) if !logged => {
                        warn!(
                            "Redis Sentinel: no master \"{}\" answers yet ({e}); asking the sentinels again until one does",
                            self.sentinel.master
                        );
                        logged = true;
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(SEARCH_AGAIN).await;
            }
            self.searching.store(false, Ordering::Release);
        });
    }

    /// Asks the sentinels, and moves to the node they name unless it is the
    /// one in use.
    async fn try_master(&self) -> Result<(), LimiterError> {
        let (host, port) = find_master(&self.settings, &self.sentinel)
            .await
            .map_err(connection_error)?;
        let old = self.current();
        if old.host == host && old.port == port {
            return Ok(());
        }
        let connection = manager(&self.settings, &self.sentinel, &host, port).await?;
        info!(
            "Redis Sentinel: master \"{}\" moved from {}:{} to {host}:{port}",
            self.sentinel.master, old.host, old.port
        );
        let new = Arc::new(Master {
            host,
            port,
            connection,
        });
        match self.master.write() {
            Ok(mut master) => *master = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
        Ok(())
    }
}

impl ConnectionLike for SentinelMaster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut connection = self.master().connection.clone();
            let result = connection.req_packed_command(cmd).await;
            self.after(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut connection = self.master().connection.clone();
            let result = connection
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.after(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The master's address as the first sentinel that knows it, and whose
/// master agrees, says.
pub(super) async fn find_master(
    settings: &RedisSettings,
    sentinel: &SentinelSettings,
) -> redis::RedisResult<(String, u16)> {
    let mut last = None;
    for node in &sentinel.nodes {
        match ask_sentinel(settings, sentinel, node).await {
            Ok(address) => return Ok(address),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no sentinels given"))
    }))
}

async fn ask_sentinel(
    settings: &RedisSettings,
    sentinel: &SentinelSettings,
    node: &str,
) -> redis::RedisResult<(String, u16)> {
    let timed_out = || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
    let ask = async {
        let client = sentinel_client(settings, sentinel, node)?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let named: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&sentinel.master)
            .query_async(&mut connection)
            .await?;
        let Some((host, port)) = named else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "this sentinel monitors no master by that name",
                format!("{node}, master \"{}\"", sentinel.master),
            )));
        };
        let mut master = master_client(settings, sentinel, &host, port)?
            .get_multiplexed_async_connection()
            .await?;
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut master).await?;
        match role.first() {
            Some(Value::BulkString(name)) if name == b"master" => Ok((host, port)),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "the node this sentinel names is not a master (yet)",
                format!("{host}:{port}"),
            ))),
        }
    };
    tokio::time::timeout(ask_within(settings), ask)
        .await
        .map_err(|_| timed_out())?
}

/// A client of the node at `host:port`, with the master's password.
pub(super) fn master_client(
    settings: &RedisSettings,
    sentinel: &SentinelSettings,
    host: &str,
    port: u16,
) -> redis::RedisResult<redis::Client> {
    let address = if sentinel.tls {
        ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.to_string(), port)
    };
    let info = address.into_connection_info()?;
    settings.client(with_password(info, sentinel.password.as_deref()))
}

/// A client of the sentinel at `node` ("host:port"), with the sentinels'
/// own password: a sentinel's `requirepass` is not the master's.
fn sentinel_client(
    settings: &RedisSettings,
    sentinel: &SentinelSettings,
    node: &str,
) -> redis::RedisResult<redis::Client> {
    let scheme = if sentinel.tls { "rediss" } else { "redis" };
    let info = format!("{scheme}://{node}").into_connection_info()?;
    settings.client(with_password(info, sentinel.sentinel_password.as_deref()))
}

fn with_password(info: ConnectionInfo, password: Option<&str>) -> ConnectionInfo {
    match password {
        Some(password) => {
            let redis = info.redis_settings().clone().set_password(password);
            info.set_redis_settings(redis)
        }
        None => info,
    }
}

async fn manager(
    settings: &RedisSettings,
    sentinel: &SentinelSettings,
    host: &str,
    port: u16,
) -> Result<ConnectionManager, LimiterError> {
    let client = master_client(settings, sentinel, host, port).map_err(connection_error)?;
    ConnectionManager::new_with_config(client, settings.manager_config())
        .await
        .map_err(connection_error)
}

/// Listens for `+switch-master` on the sentinels (one at a time, the next
/// when one is lost) while the connection it serves is in use.
async fn watch_switches(followed: Weak<Followed>) {
    for attempt in 0usize.. {
        let Some((client, within)) = followed.upgrade().and_then(|f| {
            let nodes = &f.sentinel.nodes;
            let node = nodes.get(attempt % nodes.len().max(1))?;
            let client = sentinel_client(&f.settings, &f.sentinel, node);
            Some((client, f.settings.node_connect_within()))
        }) else {
            return;
        };
        let subscribed = async {
            let client = client?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        if let Ok(Ok(mut pubsub)) = tokio::time::timeout(within, subscribed).await {
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                let Some(followed) = followed.upgrade() else {
                    return;
                };
                // "<master name> <old ip> <old port> <new ip> <new port>"
                let text = String::from_utf8_lossy(message.get_payload_bytes()).into_owned();
                if text.split(' ').next() == Some(followed.sentinel.master.as_str()) {
                    info!("Redis Sentinel: +switch-master {text}: moving to the new master");
                    followed.search();
                }
            }
        }
        tokio::time::sleep(RESUBSCRIBE).await;
    }
}
