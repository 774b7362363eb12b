//! The numbers every algorithm stays within.
//!
//! The Redis scripts compute in doubles, exact for integers up to 2^53. Every
//! algorithm is written so that what it forms stays below `MAX_SCALED`
//! (2^51), a few of which added to an instant stay exact: a window's counts
//! are only added (a sliding window weighs its previous count in at most
//! `MAX_SCALED / limit` steps, see `sliding_window`), and a bucket's whole
//! burst, in its own units of time, is at most `MAX_SCALED`. The ranges below
//! follow from that; `AlgorithmError` says them in the terms a config uses.

/// The largest integer below which every integer is exact in a double.
pub const MAX_EXACT: u64 = 1 << 53;

/// The most any count, scaled count or span of time an algorithm forms may
/// reach: a quarter of `MAX_EXACT`, so that such a value added to an instant
/// (below 2^52 µs until the year 2112) and to another like it stays exact.
pub const MAX_SCALED: u64 = MAX_EXACT / 4;

/// The most units a sliding log may hold: it keeps one stamp per request.
pub const MAX_SLIDING_LOG: u64 = 100_000;

/// The most a sliding window counts per window: its weight then falls in
/// at least 2^18 steps per window (`sliding_window::steps`).
pub const MAX_SLIDING_WINDOW: u64 = u32::MAX as u64;

/// The most a fixed window or a calendar quota counts: counts are only
/// added, never multiplied.
pub const MAX_COUNT: u64 = MAX_SCALED;

/// The longest window, in whole days: 71 years, the longest whole number
/// of days below 2^51 µs.
pub const MAX_WINDOW_DAYS: u64 = 26_062;

/// `MAX_WINDOW_DAYS` in µs.
pub const MAX_WINDOW_US: u64 = MAX_WINDOW_DAYS * 86_400 * 1_000_000;

// The longest whole number of days within `MAX_SCALED`.
const _: () = assert!(MAX_WINDOW_US <= MAX_SCALED && MAX_WINDOW_US + 86_400_000_000 > MAX_SCALED);

/// The fastest a token bucket refills, per second: its interval is then at
/// least 100,000 of its units (10^-6 µs), so rounding it up to a whole
/// unit slows it by less than 1 part in 100,000.
pub const MAX_REFILL_PER_SECOND: u64 = 10_000_000;

/// The fastest a leaky bucket lets requests leave, per second: it keeps
/// its schedule in whole µs.
pub const MAX_LEAK_PER_SECOND: u64 = 1_000_000;
