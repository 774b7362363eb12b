//! Leaky bucket as a meter that schedules: requests leave one every `interval`,
//! each admitted request is given the next free departure slot, and the proxy
//! holds it until then. Up to `capacity` requests may be waiting; one more
//! than that arriving at an empty bucket is sent at once. The state is the next
//! free slot (GCRA's theoretical arrival time).

use super::decision::{Evaluation, Ledger, Update};

/// A request of `cost` units at `now_us` against a bucket that holds up
/// to `capacity` units waiting and lets one leave every `interval_us`,
/// its next free departure slot at `next_us`: admitted, the request's
/// delay is the wait for its slot.
pub fn evaluate(
    capacity: u64,
    interval_us: u64,
    next_us: u64,
    now_us: u64,
    cost: u64,
) -> Evaluation {
    let queue_us = capacity * interval_us;
    let slot_us = next_us.max(now_us);
    let wait_us = slot_us - now_us;
    let slots_left = |backlog_us: u64| queue_us.saturating_sub(backlog_us) / interval_us;
    if cost > capacity {
        return Evaluation::oversized(capacity, slots_left(wait_us), wait_us, slot_us);
    }
    if wait_us <= queue_us {
        if cost == 0 {
            return Evaluation::admitted(
                capacity,
                slots_left(wait_us),
                wait_us,
                Update::Unchanged,
                slot_us,
            );
        }
        let after_us = slot_us + cost * interval_us;
        let backlog_us = after_us - now_us;
        Evaluation::scheduled(
            capacity,
            slots_left(backlog_us),
            backlog_us,
            wait_us,
            Update::Gcra {
                tat_us: after_us,
                tat_ps: 0,
                ledger: Ledger::default(),
            },
            after_us,
        )
    } else {
        Evaluation::refused(capacity, 0, wait_us, wait_us - queue_us, slot_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Decision;

    /// An admission waiting for its slot says what is left of the waiting
    /// room behind it and how long until the room is empty: the backlog
    /// from now to its own departure's end.
    #[test]
    fn a_scheduled_request_leaves_the_room_behind_its_slot() {
        let (sec, t0) = (1_000_000, 1_700_000_000_000_000);
        let mut next_us = 0;
        for (remaining, delay_us) in [(1, 0), (0, sec / 2), (0, sec)] {
            let e = evaluate(2, sec / 2, next_us, t0, 1);
            let backlog_us = delay_us + sec / 2;
            assert_eq!(
                e.decision,
                Decision::admitted_after(2, remaining, backlog_us, delay_us)
            );
            assert_eq!(e.idle_at_us, t0 + backlog_us);
            next_us = t0 + backlog_us;
        }
    }
}
