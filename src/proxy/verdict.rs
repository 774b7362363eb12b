//! What the limits said of one request, kept for the logging phase, where
//! `Gateway::count` puts it in the metrics, the refusal log and the status
//! page.

use log::info;

use crate::proxy::headers::{self, EnforcedOutcome, Position};
use crate::proxy::refusal_log::RefusalLog;
use crate::server::state::Runtime;
use floodgate_algorithm::Decision;
use floodgate_limiter::{Check, Deciding, Enforcement, LimitId, LimitName};
use floodgate_policy::identity::Client;

/// What a layer's outcome answers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OutcomeKind {
    /// A rate layer's decision.
    Rate,
    /// A concurrency layer's slot: it refuses like any layer, but its state
    /// (slots free, a lease) is no rate to advertise in the headers.
    Slot,
    /// A limit's ban looked up: refusing, the limit's key is shut out on
    /// every route.
    Ban,
}

/// One layer's answer: a rate layer's decision, a concurrency layer's slot
/// or a ban's lookup.
pub(super) struct Outcome {
    pub(super) limit: LimitId,
    pub(super) name: LimitName,
    pub(super) quota: u64,
    pub(super) window_us: u64,
    pub(super) enforcement: Enforcement,
    pub(super) kind: OutcomeKind,
    /// The client's identity under this limit's key: a refusal strikes it
    /// (for a limit keyed with `route`, the key without the route, where
    /// its ban holds), and its log lines are spaced by it.
    pub(super) identity: u128,
    pub(super) decision: Decision,
}

impl Outcome {
    pub(super) fn of_check(check: Check, decision: Decision) -> Outcome {
        Outcome {
            limit: check.limit,
            quota: check.algorithm.quota(),
            window_us: check.algorithm.window_us(),
            name: check.name,
            enforcement: check.enforcement,
            kind: OutcomeKind::Rate,
            identity: check.key.identity,
            decision,
        }
    }

    /// A ban on the key of limit `name`.
    pub(super) fn of_ban(name: LimitName, check: Check, decision: Decision) -> Outcome {
        Outcome {
            name,
            kind: OutcomeKind::Ban,
            ..Outcome::of_check(check, decision)
        }
    }
}

/// What the limits said of one request: kept until the logging phase,
/// which counts it and logs refusals once the answer is out.
pub(super) struct Verdict {
    pub(super) outcomes: Vec<Outcome>,
    pub(super) deciding: Deciding,
    pub(super) shown: Shown,
}

/// The outcome whose state the answer reported: the decisive layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shown {
    /// Nothing yet, or an admitted request with no rate to show.
    Nothing,
    /// Admitted: the most constrained rate, in its headers.
    Admitted(Position),
    /// Refused by this layer.
    Refused(Position),
}

impl Verdict {
    pub(super) fn new(outcomes: Vec<Outcome>, deciding: Deciding) -> Verdict {
        Verdict {
            outcomes,
            deciding,
            shown: Shown::Nothing,
        }
    }

    /// Whether the request was refused.
    pub(super) fn refused(&self) -> bool {
        matches!(self.shown, Shown::Refused(_))
    }

    /// The decisive layer's outcome: the refusing one on a refusal.
    pub(super) fn decisive_outcome(&self) -> Option<&Outcome> {
        match self.shown {
            Shown::Admitted(Position(i)) | Shown::Refused(Position(i)) => self.outcomes.get(i),
            Shown::Nothing => None,
        }
    }

    /// The enforcing layers (shadow ones never show) with their decisions;
    /// `rates_only` leaves the concurrency layers out.
    pub(super) fn enforced(&self, rates_only: bool) -> Vec<EnforcedOutcome<'_>> {
        self.outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                o.enforcement == Enforcement::Enforce
                    && !(rates_only && o.kind == OutcomeKind::Slot)
            })
            .map(|(position, o)| EnforcedOutcome {
                position: Position(position),
                name: o.name.as_str(),
                quota: o.quota,
                window_us: o.window_us,
                decision: o.decision,
                banned: o.kind == OutcomeKind::Ban,
            })
            .collect()
    }

    /// How long an admitted request waits for its leaky bucket's slot.
    pub(super) fn delay_us(&self) -> u64 {
        self.outcomes
            .iter()
            .map(|o| o.decision.delay_us())
            .max()
            .unwrap_or(0)
    }

    /// The decisive limit's name and what it had left, for the access log.
    pub(super) fn decisive(&self) -> Option<(&str, u64)> {
        let o = self.decisive_outcome()?;
        Some((o.name.as_str(), o.decision.remaining()))
    }

    /// Counts each layer's outcome; logs a refusal, and what a shadow limit
    /// would have refused, at most one line per client and limit every
    /// `REFUSAL_LOG_EVERY` (the counters count every one).
    pub(super) fn account(
        &self,
        runtime: &Runtime,
        lines: &RefusalLog,
        client: Option<&Client>,
        request_id: &str,
    ) {
        // Formatted only for a line that is written: most requests log nothing.
        let label = || client.map_or_else(String::new, Client::log_label);
        let due = |o: &Outcome| lines.due(o.limit, o.identity);
        for o in &self.outcomes {
            let decision = &o.decision;
            let counters = runtime.counters(o.limit);
            if o.kind == OutcomeKind::Ban {
                counters.banned.inc();
            } else {
                counters.count(o.enforcement, decision, self.refused());
            }
            if o.enforcement == Enforcement::Shadow && !decision.allowed() {
                if let Some(unlogged) = due(o) {
                    info!(
                        "shadow limit would refuse: {} limit={} retry_after_ms={} unlogged_since_last={unlogged}",
                        label(),
                        o.name,
                        headers::ceil_ms(decision.retry_after_us())
                    );
                }
            }
        }
        if let Shown::Refused(Position(i)) = self.shown {
            let o = &self.outcomes[i];
            if let Some(unlogged) = due(o) {
                info!(
                    "{}: {} limit={} retry_after_ms={}{} request_id={request_id} unlogged_since_last={unlogged}",
                    if o.kind == OutcomeKind::Ban {
                        "banned"
                    } else {
                        "rate limited"
                    },
                    label(),
                    o.name,
                    headers::ceil_ms(o.decision.retry_after_us()),
                    if o.decision.cost_exceeds_limit() {
                        " (cost exceeds the limit)"
                    } else {
                        ""
                    },
                );
            }
        }
    }
}
