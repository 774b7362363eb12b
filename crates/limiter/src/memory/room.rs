//! Room for a new key in a full shard: only idle state is ever dropped to
//! make it, so that eviction never resets a live limit.

use smallvec::SmallVec;

use super::{Shard, StateKey};
use crate::check::Check;

/// How far from the least recently used end a full shard is searched for
/// idle state to drop: bounded, so one insertion stays cheap; the sweeper
/// clears the rest.
const IDLE_SCAN: usize = 16;

/// Whether `shard` can take `needed` more keys, dropping idle state (and
/// only idle state) near its least recently used end to make the room. Keys
/// of the request being decided stay: one of them may be idle now and
/// written in a moment.
pub(super) fn make_room(shard: &mut Shard, needed: usize, now_us: u64, request: &[Check]) -> bool {
    let cap = shard.cap().get();
    if shard.len() + needed <= cap {
        return true;
    }
    let idle: SmallVec<[StateKey; 4]> = shard
        .iter()
        .rev()
        .take(IDLE_SCAN)
        .filter(|(k, e)| e.idle_at_us <= now_us && !request.iter().any(|c| c.key == **k))
        .map(|(k, _)| *k)
        .take(shard.len() + needed - cap)
        .collect();
    for key in &idle {
        shard.pop(key);
    }
    shard.len() + needed <= cap
}

/// Whether `make_room` would find room for `needed` more keys, without
/// dropping anything: as many idle keys (not the request's) within reach of
/// its scan, which moves deeper by each key it drops.
pub(super) fn could_make_room(
    shard: &Shard,
    needed: usize,
    now_us: u64,
    request: &[Check],
) -> bool {
    let cap = shard.cap().get();
    if shard.len() + needed <= cap {
        return true;
    }
    let short = shard.len() + needed - cap;
    shard
        .iter()
        .rev()
        .take(IDLE_SCAN + short - 1)
        .filter(|(k, e)| e.idle_at_us <= now_us && !request.iter().any(|c| c.key == **k))
        .count()
        >= short
}
