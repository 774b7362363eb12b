//! Time as the limiter sees it: whole microseconds since the Unix epoch.
//!
//! Microseconds keep every stamp below 2^53, so the same values survive a trip
//! through Lua's doubles unchanged, which the Redis scripts rely on.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of "now" for the algorithms; injected so tests control time.
pub trait Clock: Send + Sync {
    /// Now, in whole µs since the Unix epoch (or since the clock's own
    /// origin, for `MonotonicClock`).
    fn now_us(&self) -> u64;
}

/// Wall-clock time. Limit state is shared across processes (and Redis), so a
/// monotonic clock local to one process would not do; the algorithms tolerate
/// steps backwards instead.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// Microseconds since it was made, on a clock that never steps: what a
/// duration is measured by when the wall clock may be stepped (NTP, a VM
/// resumed).
#[derive(Debug)]
pub struct MonotonicClock {
    origin: std::time::Instant,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock {
            origin: std::time::Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_us: AtomicU64,
}

impl ManualClock {
    /// A clock that reads `start_us` until told otherwise.
    pub fn new(start_us: u64) -> Self {
        Self {
            now_us: AtomicU64::new(start_us),
        }
    }

    /// Moves it to `now_us`, backwards as well as forwards.
    pub fn set(&self, now_us: u64) {
        self.now_us.store(now_us, Ordering::SeqCst);
    }

    /// Moves it `by_us` forwards.
    pub fn advance(&self, by_us: u64) {
        self.now_us.fetch_add(by_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }
}

/// Adds a fixed offset to another clock; lets tests give two proxies clocks that
/// disagree.
#[derive(Debug)]
pub struct OffsetClock<C> {
    inner: C,
    offset_us: i64,
}

impl<C: Clock> OffsetClock<C> {
    /// `inner`'s time plus `offset_us` (negative: behind it).
    pub fn new(inner: C, offset_us: i64) -> Self {
        Self { inner, offset_us }
    }
}

impl<C: Clock> Clock for OffsetClock<C> {
    fn now_us(&self) -> u64 {
        self.inner.now_us().saturating_add_signed(self.offset_us)
    }
}

/// Why a clock file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClockFileError {
    /// The file cannot be read.
    #[error("cannot read it: {0}")]
    Read(#[from] std::io::Error),
    /// The file holds something other than a whole number of ms; the text
    /// it holds.
    #[error("it must hold a whole number of milliseconds, got {0:?}")]
    NotMilliseconds(String),
}

/// Another clock plus an offset in milliseconds read from a file at every
/// reading, so that a test can move a running proxy's time: it writes the
/// new offset to a temporary file and renames it over this one, and the next
/// reading follows. A file that cannot be read or parsed later on (a rename
/// is atomic, so only a test that breaks the file sees this) leaves the last
/// offset read in force.
///
/// One small file read per reading: meant for tests, not for production.
#[derive(Debug)]
pub struct FileOffsetClock<C> {
    inner: C,
    path: PathBuf,
    last_offset_us: AtomicI64,
}

impl<C: Clock> FileOffsetClock<C> {
    /// Reads `path` once; a missing, unreadable or malformed file is an error.
    pub fn open(inner: C, path: impl Into<PathBuf>) -> Result<Self, ClockFileError> {
        let path = path.into();
        let offset_us = read_offset_us(&path)?;
        Ok(Self {
            inner,
            path,
            last_offset_us: AtomicI64::new(offset_us),
        })
    }

    fn offset_us(&self) -> i64 {
        match read_offset_us(&self.path) {
            Ok(offset_us) => {
                self.last_offset_us.store(offset_us, Ordering::Relaxed);
                offset_us
            }
            Err(_) => self.last_offset_us.load(Ordering::Relaxed),
        }
    }
}

impl<C: Clock> Clock for FileOffsetClock<C> {
    fn now_us(&self) -> u64 {
        self.inner.now_us().saturating_add_signed(self.offset_us())
    }
}

/// The file's whole number of milliseconds (surrounding whitespace allowed,
/// negative allowed), in microseconds.
fn read_offset_us(path: &Path) -> Result<i64, ClockFileError> {
    let text = std::fs::read_to_string(path)?;
    let ms: i64 = text
        .trim()
        .parse()
        .map_err(|_| ClockFileError::NotMilliseconds(text.clone()))?;
    Ok(ms.saturating_mul(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_750_000_000_000_000;

    /// A path of its own under the system's temporary directory.
    fn temp_path(name: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        std::env::temp_dir().join(format!(
            "floodgate-clock-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ))
    }

    /// Writes `text` the way tests move the clock: a temporary file renamed
    /// over `path`.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write temporary clock file");
        std::fs::rename(&tmp, path).expect("rename clock file");
    }

    #[test]
    fn the_offset_is_read_at_every_reading() {
        let path = temp_path("moves");
        replace(&path, "0\n");
        let clock = FileOffsetClock::open(ManualClock::new(T0), &path).expect("open");
        assert_eq!(clock.now_us(), T0);
        replace(&path, "2500");
        assert_eq!(clock.now_us(), T0 + 2_500_000);
        // Rewritten at once with as many bytes: still seen.
        replace(&path, "3500");
        assert_eq!(clock.now_us(), T0 + 3_500_000);
        replace(&path, " -1000 \n");
        assert_eq!(clock.now_us(), T0 - 1_000_000);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_file_broken_later_leaves_the_last_offset() {
        let path = temp_path("broken");
        replace(&path, "60000");
        let clock = FileOffsetClock::open(ManualClock::new(T0), &path).expect("open");
        assert_eq!(clock.now_us(), T0 + 60_000_000);
        replace(&path, "soon");
        assert_eq!(clock.now_us(), T0 + 60_000_000);
        std::fs::remove_file(&path).expect("remove");
        assert_eq!(clock.now_us(), T0 + 60_000_000);
        replace(&path, "61000");
        assert_eq!(clock.now_us(), T0 + 61_000_000);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_missing_empty_or_malformed_file_is_refused_at_open() {
        let missing = temp_path("missing");
        assert!(matches!(
            FileOffsetClock::open(SystemClock, &missing),
            Err(ClockFileError::Read(_))
        ));
        for text in ["", "  \n", "1.5", "12ms", "0x10", "99999999999999999999"] {
            let path = temp_path("malformed");
            replace(&path, text);
            match FileOffsetClock::open(SystemClock, &path) {
                Err(ClockFileError::NotMilliseconds(got)) => assert_eq!(got, text),
                other => panic!("{text:?}: {other:?}"),
            }
            let _ = std::fs::remove_file(&path);
        }
        let err = FileOffsetClock::open(SystemClock, &missing).expect_err("missing");
        assert!(err.to_string().starts_with("cannot read it: "), "{err}");
        let path = temp_path("message");
        replace(&path, "abc");
        let err = FileOffsetClock::open(SystemClock, &path).expect_err("malformed");
        assert_eq!(
            err.to_string(),
            "it must hold a whole number of milliseconds, got \"abc\""
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn huge_offsets_saturate_instead_of_wrapping() {
        let path = temp_path("huge");
        replace(&path, &i64::MAX.to_string());
        let clock = FileOffsetClock::open(ManualClock::new(T0), &path).expect("open");
        assert_eq!(clock.now_us(), T0 + i64::MAX as u64);
        replace(&path, &i64::MIN.to_string());
        assert_eq!(clock.now_us(), 0);
        let _ = std::fs::remove_file(&path);
    }
}
