//! Request ids: kept when a trusted proxy sent one, generated otherwise; sent
//! upstream, returned to the client, written in the 429 body and the logs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The longest id accepted from a trusted proxy.
const MAX_LEN: usize = 128;

/// A keyed hash (SipHash, a key drawn at start) of a counter: never
/// repeated within a process, different in every process, and not
/// guessable from another value (nor does it tell how many came before).
fn next_unique() -> u128 {
    use siphasher::sip128::{Hasher128, SipHasher13};
    use std::hash::Hasher;
    static KEY: OnceLock<[u8; 16]> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let key = KEY.get_or_init(|| {
        let mut key = [0u8; 16];
        // Without entropy, values are still unique in this process, only
        // guessable.
        if getrandom::fill(&mut key).is_err() {
            key[..4].copy_from_slice(&std::process::id().to_le_bytes());
        }
        key
    });
    let mut h = SipHasher13::new_with_key(key);
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish128().as_u128()
}

/// A new request id: 32 hex digits.
pub fn generate() -> String {
    format!("{:032x}", next_unique())
}

/// A new lease id for a request's concurrency slot: distinct from every
/// other instance's sharing the store, since each draws its own key.
pub fn lease_id() -> u64 {
    next_unique() as u64
}

/// Whether a received id may be passed on: short, and only characters that
/// need no escaping in a header, a log line or a JSON string.
pub fn acceptable(value: &[u8]) -> bool {
    !value.is_empty()
        && value.len() <= MAX_LEN
        && value
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-_.:+/=".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_plain() {
        let a = generate();
        let b = generate();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(acceptable(a.as_bytes()));
        assert!(acceptable(b"0f5a-77:abc"));
        assert!(!acceptable(b"with \"quote\""));
        assert!(!acceptable(b""));
        assert!(!acceptable(&[b'a'; 200]));
    }
}
