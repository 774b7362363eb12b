//! What the limits said of one request, kept for the logging phase.

use log::info;

use crate::algorithm::Decision;
use crate::headers::{self, Layer};
use crate::identity::Client;
use crate::limiter::{Check, Deciding};
use crate::state::Runtime;

/// What the limits said of one request: kept until the logging phase,
/// which counts it and logs refusals once the answer is out.
pub(super) struct Verdict {
    pub(super) checks: Vec<Check>,
    pub(super) decisions: Vec<Decision>,
    pub(super) deciding: Deciding,
    /// The check whose state the answer reported (the refusing one on a
    /// refusal), and whether the request was refused.
    pub(super) decisive: Option<usize>,
    pub(super) refused: bool,
}

impl Verdict {
    pub(super) fn new(checks: Vec<Check>, decisions: Vec<Decision>, deciding: Deciding) -> Verdict {
        Verdict {
            checks,
            decisions,
            deciding,
            decisive: None,
            refused: false,
        }
    }

    /// The enforcing layers (shadow ones never show) with their decisions.
    pub(super) fn enforced(&self) -> Vec<Layer<'_>> {
        self.checks
            .iter()
            .zip(&self.decisions)
            .enumerate()
            .filter(|(_, (c, _))| !c.shadow)
            .map(|(layer, (c, d))| Layer {
                layer,
                name: c.name.as_str(),
                algorithm: c.algorithm,
                decision: *d,
            })
            .collect()
    }

    /// The decisive limit's name and what it had left, for the access log.
    pub(super) fn decisive(&self) -> Option<(&str, u64)> {
        let i = self.decisive?;
        Some((self.checks[i].name.as_str(), self.decisions[i].remaining()))
    }

    /// Counts each layer's outcome; logs a refusal, and what a shadow limit
    /// would have refused, one line each.
    pub(super) fn account(&self, runtime: &Runtime, client: Option<&Client>, request_id: &str) {
        // Formatted only for a line that is written: most requests log nothing.
        let label = || client.map_or_else(String::new, Client::log_label);
        for (check, decision) in self.checks.iter().zip(&self.decisions) {
            let counters = &runtime.counters[check.layer];
            match (check.shadow, decision.allowed(), self.refused) {
                (true, false, _) => counters.shadow_refused.inc(),
                (false, false, _) => counters.refused.inc(),
                (_, true, false) => {
                    counters.admitted.inc();
                    if decision.remaining().saturating_mul(10) < decision.limit() {
                        counters.near_limit.inc();
                    }
                }
                // Admitted by this layer, refused by another: not charged.
                (_, true, true) => {}
            }
            if check.shadow && !decision.allowed() {
                info!(
                    "shadow limit would refuse: {} limit={} retry_after_ms={}",
                    label(),
                    check.name,
                    headers::ceil_ms(decision.retry_after_us())
                );
            }
        }
        if let Some(i) = self.decisive.filter(|_| self.refused) {
            let decision = &self.decisions[i];
            info!(
                "rate limited: {} limit={} retry_after_ms={}{} request_id={request_id}",
                label(),
                self.checks[i].name,
                headers::ceil_ms(decision.retry_after_us()),
                if decision.cost_exceeds_limit() {
                    " (cost exceeds the limit)"
                } else {
                    ""
                },
            );
        }
    }
}
