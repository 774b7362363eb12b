//! State an operator changed, across instances: an admin reset or credit
//! deletes or rewrites the keys in Redis and announces them on
//! `changes_channel` (the message says which change, and to which keys);
//! every instance listens, and forgets the refusals it remembers for them,
//! so that the client is admitted everywhere at once instead of when each
//! instance's remembered retry time runs out.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use log::{info, warn};

use super::beside_limits::subscription_node;
use super::change_message::{changes_channel, decode_change, Change};
use super::settings::RedisSettings;
use crate::deny_cache::Forgetter;
use crate::memory::MemoryStore;

/// How long a lost subscription waits before it is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// How often a subscription is asked whether it still answers.
const PING_EVERY: Duration = Duration::from_secs(10);

/// Listens until the process ends. Whenever the subscription is (re)made,
/// every remembered refusal is forgotten: what was announced while nobody
/// listened is unknown. While it is lost, nothing is leased.
pub async fn listen(settings: RedisSettings, forgetter: Forgetter, local: Arc<MemoryStore>) {
    let channel = changes_channel(&settings.key_prefix);
    let mut lost_logged = false;
    let mut heard_before = false;
    for attempt in 0usize.. {
        let subscribed = async {
            let client = subscription_node(&settings, attempt).await?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(settings.timeout.max(RETRY), subscribed).await {
            Ok(Ok(pubsub)) => {
                forgetter.forget_all();
                forgetter.listening();
                if lost_logged {
                    info!("listening again for operators' changes on {channel}");
                } else if !heard_before {
                    info!("listening for operators' changes on {channel}; leases from now on");
                }
                heard_before = true;
                let (mut sink, mut messages) = pubsub.split();
                // A connection that went silent (a partition, a failover
                // without a reset) ends no stream: a ping that goes
                // unanswered ends the subscription, which is then made
                // again, forgetting everything.
                let mut pings = tokio::time::interval(PING_EVERY);
                pings.tick().await;
                loop {
                    tokio::select! {
                        message = messages.next() => match message {
                            Some(message) => {
                                let text = String::from_utf8_lossy(message.get_payload_bytes());
                                let (change, keys) = decode_change(&text);
                                match change {
                                    Change::Reset => forgetter.forget(&keys),
                                    Change::Credit => forgetter.credited(&keys),
                                }
                                // What this instance decided alone while
                                // Redis was away is reset too.
                                for key in &keys {
                                    local.forget_key(key);
                                }
                            }
                            None => break,
                        },
                        _ = pings.tick() => {
                            let ping = tokio::time::timeout(settings.timeout.max(RETRY), sink.ping::<redis::Value>());
                            if !matches!(ping.await, Ok(Ok(_))) {
                                break;
                            }
                        }
                    }
                }
                // At once, not when it is back: a Redis that restarted empty
                // ends the subscription before any call fails, and the
                // leases from before must be neither spent nor given back.
                forgetter.not_listening();
                warn!("lost the subscription to operators' changes on {channel}: leases dropped and none taken until it is back, when remembered refusals are forgotten");
                lost_logged = true;
            }
            Ok(Err(e)) if !lost_logged => {
                warn!("cannot listen for operators' changes on {channel} ({e}): remembered refusals are forgotten when it can again");
                lost_logged = true;
            }
            Err(_) if !lost_logged => {
                warn!("cannot listen for operators' changes on {channel} (no answer): remembered refusals are forgotten when it can again");
                lost_logged = true;
            }
            _ => {}
        }
        tokio::time::sleep(RETRY).await;
    }
}
