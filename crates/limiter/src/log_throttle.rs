//! Log lines a client, or a flapping dependency, can cause as often as it
//! likes: written at most once per interval, each with how many were held
//! back since the last. One type for every such line, so each place says
//! only what it logs and how often.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use lru::LruCache;

/// One line at most per interval.
pub struct LogThrottle {
    every_us: u64,
    /// When the last line went out (0: never).
    last_us: AtomicU64,
    held_back: AtomicU64,
}

impl LogThrottle {
    /// At most one line per `every`; the first is due at once.
    pub const fn new(every: Duration) -> LogThrottle {
        LogThrottle {
            every_us: every.as_micros() as u64,
            last_us: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// Whether a line may go out at `now_us`: if so, how many were held
    /// back since the last one; if not, this one is counted among them.
    pub fn due(&self, now_us: u64) -> Option<u64> {
        let last = self.last_us.load(Ordering::Relaxed);
        // A clock stepped back (NTP) makes the last line's time meaningless:
        // write rather than stay quiet until it passes again.
        let passed = last == 0 || now_us < last || now_us - last >= self.every_us;
        if passed
            && self
                .last_us
                .compare_exchange(last, now_us.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.held_back.swap(0, Ordering::Relaxed))
        } else {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// One line at most per interval for each key (a client, an address), and
/// at most one per `overall` interval over all keys. The keys remembered
/// are bounded: beyond `capacity` the least recently seen is forgotten,
/// and the overall interval still bounds what many keys can write.
pub struct KeyedLogThrottle<K: Hash + Eq> {
    every_us: u64,
    /// Each key's last line and the lines it has held back since.
    last_us: Mutex<LruCache<K, KeyLines>>,
    overall: LogThrottle,
}

#[derive(Clone, Copy)]
struct KeyLines {
    /// When its last line went out (`None`: not yet, held back overall).
    last_us: Option<u64>,
    held_back: u64,
}

impl<K: Hash + Eq> KeyedLogThrottle<K> {
    /// At most one line per `every` for each key and one per `overall` in
    /// all, remembering at most `capacity` keys (at least 1).
    pub fn new(capacity: usize, every: Duration, overall: Duration) -> KeyedLogThrottle<K> {
        let capacity = std::num::NonZeroUsize::new(capacity).unwrap_or(std::num::NonZeroUsize::MIN);
        KeyedLogThrottle {
            every_us: every.as_micros() as u64,
            last_us: Mutex::new(LruCache::new(capacity)),
            overall: LogThrottle::new(overall),
        }
    }

    /// As [`LogThrottle::due`], for `key`; the count held back is over all
    /// keys.
    pub fn due(&self, key: K, now_us: u64) -> Option<u64> {
        self.due_with_counts(key, now_us).map(|(_, all)| all)
    }

    /// As [`KeyedLogThrottle::due`], the count held back being this key's
    /// own (as long as it stayed among those remembered).
    pub fn due_for_key(&self, key: K, now_us: u64) -> Option<u64> {
        self.due_with_counts(key, now_us).map(|(own, _)| own)
    }

    fn due_with_counts(&self, key: K, now_us: u64) -> Option<(u64, u64)> {
        // A line is only ever skipped when poisoned: the map is whole.
        let mut keys = self
            .last_us
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let lines = keys.get_or_insert_mut(key, || KeyLines {
            last_us: None,
            held_back: 0,
        });
        let fresh = lines
            .last_us
            .is_none_or(|at| now_us < at || now_us - at >= self.every_us);
        let all = if fresh {
            self.overall.due(now_us)
        } else {
            None
        };
        let Some(all) = all else {
            if !fresh {
                self.overall.held_back.fetch_add(1, Ordering::Relaxed);
            }
            lines.held_back += 1;
            return None;
        };
        lines.last_us = Some(now_us);
        Some((std::mem::take(&mut lines.held_back), all))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let log = LogThrottle::new(Duration::from_secs(10));
        assert_eq!(log.due(100 * S), Some(0));
        assert_eq!(log.due(101 * S), None);
        assert_eq!(log.due(109 * S), None);
        assert_eq!(log.due(110 * S), Some(2));
        assert_eq!(log.due(111 * S), None);
        // The clock stepped back: a line at once.
        assert_eq!(log.due(50 * S), Some(1));
    }

    #[test]
    fn a_time_of_zero_is_a_time_like_any_other() {
        let log = LogThrottle::new(Duration::from_secs(1));
        assert_eq!(log.due(0), Some(0));
        assert_eq!(log.due(S / 2), None);
        assert_eq!(log.due(S + 1), Some(1));
    }

    #[test]
    fn each_key_once_per_interval_and_all_keys_once_per_overall_interval() {
        let log = KeyedLogThrottle::new(2, Duration::from_secs(60), Duration::from_secs(1));
        assert_eq!(log.due(1, 100 * S), Some(0));
        // Another key within the overall second: held back, and not marked.
        assert_eq!(log.due(2, 100 * S + 1), None);
        assert_eq!(log.due(2, 101 * S), Some(1));
        assert_eq!(log.due(1, 159 * S), None);
        assert_eq!(log.due(1, 160 * S), Some(1));
        // More keys than remembered: the least recently logged is forgotten
        // and logs again, still once a second at most.
        assert_eq!(log.due(3, 162 * S), Some(0));
        assert_eq!(log.due(2, 163 * S), Some(0));
        assert_eq!(log.due(3, 164 * S), None);
    }

    #[test]
    fn each_keys_line_counts_what_that_key_held_back() {
        let log = KeyedLogThrottle::new(10, Duration::from_secs(10), Duration::from_secs(1));
        assert_eq!(log.due_for_key("a", 100 * S), Some(0));
        for at in 0..5 {
            assert_eq!(log.due_for_key("a", 101 * S + at), None);
        }
        // Held back by the overall interval: counted as its own too.
        assert_eq!(log.due_for_key("b", 100 * S + 1), None);
        assert_eq!(log.due_for_key("b", 102 * S), Some(1));
        assert_eq!(log.due_for_key("b", 103 * S), None);
        assert_eq!(log.due_for_key("a", 110 * S), Some(5));
        assert_eq!(log.due_for_key("a", 111 * S), None);
        assert_eq!(log.due_for_key("b", 112 * S), Some(1));
    }

    #[test]
    fn without_an_overall_interval_every_key_logs_at_once() {
        let log = KeyedLogThrottle::new(10, Duration::from_secs(60), Duration::ZERO);
        for key in 0..5 {
            assert_eq!(log.due(key, 100 * S), Some(0));
        }
        assert_eq!(log.due(0, 100 * S), None);
    }
}
