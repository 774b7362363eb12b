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
use super::settings::RedisSettings;
use crate::check::StateKey;
use crate::deny_cache::Forgetter;
use crate::memory::MemoryStore;

/// The channel on which instances sharing a Redis (and a key prefix) hear
/// of state an operator reset or credited.
pub fn changes_channel(key_prefix: &str) -> String {
    format!("{key_prefix}:changes")
}

/// What an operator did to the keys announced on `changes_channel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Their state is gone: a lease of them is dropped, never given back.
    Reset,
    /// Units were given back to their state, which still counts what was
    /// leased of it: a lease of them goes back.
    Credit,
}

/// Before the keys, the word `credit` for a credit (nothing for a reset):
/// an instance from before it reads the word as a key that does not parse,
/// and forgets the keys as it always did.
const CREDIT_WORD: &str = "credit";

/// A `changes_channel` message.
pub fn encode_change(change: Change, keys: &[StateKey]) -> String {
    match change {
        Change::Reset => encode_state_keys(keys),
        Change::Credit => format!("{CREDIT_WORD} {}", encode_state_keys(keys)),
    }
}

/// What a `changes_channel` message says was done, and to which keys.
pub fn decode_change(message: &str) -> (Change, Vec<StateKey>) {
    match message.trim_start().strip_prefix(CREDIT_WORD) {
        Some(keys) if keys.starts_with(|c: char| c.is_ascii_whitespace()) => {
            (Change::Credit, decode_state_keys(keys))
        }
        _ => (Change::Reset, decode_state_keys(message)),
    }
}

/// `limit:identity` in hex, space-separated: what `changes_channel` carries.
pub fn encode_state_keys(keys: &[StateKey]) -> String {
    keys.iter()
        .map(|k| format!("{:x}:{:x}", k.limit, k.identity))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The keys of a `changes_channel` message; what does not parse is left out.
pub fn decode_state_keys(message: &str) -> Vec<StateKey> {
    message
        .split_ascii_whitespace()
        .filter_map(|pair| {
            let (limit, identity) = pair.split_once(':')?;
            Some(StateKey {
                limit: u64::from_str_radix(limit, 16).ok()?,
                identity: u128::from_str_radix(identity, 16).ok()?,
            })
        })
        .collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_keys_cross_the_channel_whole_and_garbage_is_left_out() {
        let keys = [
            StateKey {
                limit: u64::MAX,
                identity: u128::MAX,
            },
            StateKey {
                limit: 7,
                identity: 0,
            },
        ];
        let message = encode_state_keys(&keys);
        assert_eq!(decode_state_keys(&message), keys);
        assert_eq!(
            decode_state_keys(&format!("zz:1 7 {message} 1:2:3")),
            keys.to_vec()
        );
    }

    #[test]
    fn a_credit_is_told_from_a_reset_and_an_older_reader_still_finds_the_keys() {
        let keys = [StateKey {
            limit: 3,
            identity: 0xabc,
        }];
        for change in [Change::Reset, Change::Credit] {
            let message = encode_change(change, &keys);
            assert_eq!(decode_change(&message), (change, keys.to_vec()));
            // What an instance from before the word reads.
            assert_eq!(decode_state_keys(&message), keys);
        }
        assert_eq!(decode_change("creditz 3:abc").0, Change::Reset);
    }
}
