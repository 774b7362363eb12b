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
    hex32(next_unique())
}

/// 32 lower-case hex digits, written by hand: `format!` spent more on this
/// than the hash.
fn hex32(value: u128) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 32];
    for (i, digit) in digits.iter_mut().enumerate() {
        *digit = HEX[((value >> ((31 - i) * 4)) & 0xf) as usize];
    }
    // Hex digits are ASCII: the check cannot fail.
    std::str::from_utf8(&digits)
        .map(str::to_owned)
        .unwrap_or_default()
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
    fn ids_are_written_as_format_writes_them() {
        for value in [0, 1, 0xdead_beef, u128::MAX, u128::MAX / 3] {
            assert_eq!(hex32(value), format!("{value:032x}"));
        }
    }

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
