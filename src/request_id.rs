//! Request ids: kept when a trusted proxy sent one, generated otherwise; sent
//! upstream, returned to the client, written in the 429 body and the logs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The longest id accepted from a trusted proxy.
const MAX_LEN: usize = 128;

/// A new id: 32 hex digits, a per-process random half and a counter, so
/// ids never repeat within a process and rarely across processes.
pub fn generate() -> String {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut bytes = [0u8; 8];
        // Without entropy, the process id still tells processes apart.
        if getrandom::fill(&mut bytes).is_err() {
            return u64::from(std::process::id()) << 32;
        }
        u64::from_le_bytes(bytes)
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix:016x}{n:016x}")
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
