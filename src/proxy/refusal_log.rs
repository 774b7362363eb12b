//! The refusal lines: one per client and limit every `REFUSAL_LOG_EVERY`,
//! each saying how many refusals of that client by that limit went
//! unlogged since the one before. A client refused at full speed must not
//! fill the disk, nor cost a line's formatting and write per refusal; the
//! metrics count every refusal.

use std::sync::Arc;
use std::time::Duration;

use floodgate_limiter::clock::Clock;
use floodgate_limiter::log_throttle::KeyedLogThrottle;
use floodgate_limiter::LimitId;

/// How often one client and limit may write a refusal line.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Clients remembered: beyond them the least recently refused is
/// forgotten (and may log again at once).
const CLIENTS_REMEMBERED: usize = 10_000;

/// At most 100 lines a second over every client (many addresses refused at
/// once); what is held back is in each client's next count.
const ANY_LINE_EVERY: Duration = Duration::from_millis(10);

/// When each client was last logged as refused by each limit, on the
/// proxy's clock (kept across reloads).
pub struct RefusalLog {
    lines: KeyedLogThrottle<(LimitId, u128)>,
    clock: Arc<dyn Clock>,
}

impl RefusalLog {
    pub fn new(clock: Arc<dyn Clock>) -> RefusalLog {
        RefusalLog {
            lines: KeyedLogThrottle::new(CLIENTS_REMEMBERED, REFUSAL_LOG_EVERY, ANY_LINE_EVERY),
            clock,
        }
    }

    /// Whether the refusal of `identity` by `limit` gets a line now: if so,
    /// how many of its refusals went unlogged since its last one.
    pub fn due(&self, limit: LimitId, identity: u128) -> Option<u64> {
        self.lines
            .due_for_key((limit, identity), self.clock.now_us())
    }
}
