//! The message on `changes_channel`: which change an operator made (a
//! reset or a credit), and to which keys. Written by the Redis store that
//! makes the change, read by every instance's listener (`changes`).

use crate::check::StateKey;

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
