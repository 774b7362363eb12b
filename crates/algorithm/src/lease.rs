//! Leases: units of a limit's budget taken from the shared state beside a
//! request, in the same atomic step, so that an instance can admit the
//! identity's next requests itself. The units count as spent the moment
//! they are leased, so no instance ever admits what the shared state does
//! not allow.
//!
//! The size rule is the same here and in `crates/limiter/lua/decide.lua`: a lease is at
//! most `max` units and at most the units left after the request divided by
//! `divisor` (twice the number of instances). Far from the limit a lease is
//! large; as the budget left nears `divisor` units a lease shrinks to none,
//! and every request is decided by the shared state. The last units are
//! never leased, so one instance cannot starve the others.

use super::decision::Evaluation;
use super::kind::Kind;
use super::ledger;
use super::state::State;
use super::validated::Algorithm;

/// Whether units of this algorithm can be leased: a bucket's tokens, a
/// window's or a period's count. Not a sliding log (every admission is its
/// own stamp, placed when it happens) nor a leaky bucket (every admission is
/// its own departure slot).
pub fn takes_lease(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::TokenBucket | Kind::FixedWindow | Kind::SlidingWindow | Kind::Quota
    )
}

/// Units to lease when `remaining` are left after the request.
pub fn lease_units(remaining: u64, max: u64, divisor: u64) -> u64 {
    (remaining / divisor.max(1)).min(max)
}

impl Algorithm {
    /// Decides a request of `cost` like `evaluate` and, when it is admitted,
    /// also takes a lease of `lease_units` from what is left: the
    /// evaluation to write (of `cost` plus the lease) and the units leased.
    /// A token bucket's lease goes on its ledger (`crate::ledger`), counted
    /// in epochs of `life_us`, the longest the lease will be used; none
    /// when it is 0.
    pub fn evaluate_leasing(
        &self,
        state: &State,
        now_us: u64,
        cost: u64,
        (max, divisor, life_us): (u64, u64, u64),
    ) -> (Evaluation, u64) {
        if let (
            Kind::TokenBucket,
            &State::Gcra {
                tat_us,
                tat_ps,
                ledger,
            },
        ) = (self.kind(), state)
        {
            let (e, _, units) = ledger::evaluate_leasing(
                self.quota(),
                self.interval(),
                ((tat_us, tat_ps), ledger),
                now_us,
                cost,
                life_us,
                |left| lease_units(left, max, divisor),
            );
            return (e, units);
        }
        let alone = self.evaluate(state, now_us, cost);
        if !alone.decision.allowed() || !takes_lease(self.kind()) {
            return (alone, 0);
        }
        let units = lease_units(alone.decision.remaining(), max, divisor);
        if units == 0 {
            return (alone, 0);
        }
        let leasing = self.evaluate(state, now_us, cost + units);
        if leasing.decision.allowed() {
            (leasing, units)
        } else {
            // Unreachable by the arithmetic (the units fit what is left);
            // kept so that a mistake costs a lease, never an admission.
            (alone, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn algorithms() -> impl Strategy<Value = Algorithm> {
        (0usize..3, 1u64..500, 1u64..10_000_000).prop_map(|(kind, quota, period)| {
            match kind {
                0 => Algorithm::token_bucket(quota, period / quota.max(1) + 1),
                1 => Algorithm::fixed_window(quota, period),
                _ => Algorithm::sliding_window(quota, period),
            }
            .expect("valid numbers")
        })
    }

    proptest! {
        /// A lease never turns an admission into a refusal, never leases
        /// from a refused request, and leaves at least what the rule keeps.
        #[test]
        fn a_lease_fits_what_the_request_leaves(
            algorithm in algorithms(),
            charges in proptest::collection::vec((0u64..2_000_000, 1u64..20), 0..30),
            cost in 1u64..10,
            max in 1u64..200,
            divisor in 1u64..8,
        ) {
            let mut state = algorithm.fresh_state();
            let mut now = 0;
            for (step, c) in charges {
                now += step;
                let e = algorithm.evaluate(&state, now, c);
                if e.decision.allowed() {
                    state.apply(&e.update);
                }
            }
            let alone = algorithm.evaluate(&state, now, cost);
            let (leasing, units) = algorithm.evaluate_leasing(&state, now, cost, (max, divisor, 1_000_000));
            prop_assert_eq!(leasing.decision.allowed(), alone.decision.allowed());
            if !alone.decision.allowed() {
                prop_assert_eq!(units, 0);
            } else {
                let left = alone.decision.remaining();
                prop_assert_eq!(units, lease_units(left, max, divisor));
                prop_assert!(units == 0 || units * divisor <= left);
                prop_assert_eq!(leasing.decision.remaining(), left - units);
            }
        }
    }

    #[test]
    fn logs_and_leaky_buckets_are_never_leased() {
        for algorithm in [
            Algorithm::sliding_log(100, 1_000_000).expect("valid numbers"),
            Algorithm::leaky_bucket(100, 10_000).expect("valid numbers"),
        ] {
            let (e, units) = algorithm.evaluate_leasing(
                &algorithm.fresh_state(),
                1_000_000,
                1,
                (50, 2, 1_000_000),
            );
            assert!(e.decision.allowed());
            assert_eq!(units, 0);
        }
    }
}
