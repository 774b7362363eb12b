//! One `ShouldRateLimit` call, apart from gRPC: which limits its
//! descriptors meet (`plan`), one all-or-nothing decision on the store, and
//! the answer per descriptor (`answer`), counted and logged as the
//! gateway's requests are.

use std::sync::Arc;

use log::info;
use smallvec::SmallVec;

use crate::proxy::headers::{self, EnforcedOutcome, Header, Position, RETRY_AFTER};
use crate::proxy::refusal_log::RefusalLog;
use crate::server::metrics::RlsMetrics;
use crate::server::state::Runtime;
use floodgate_algorithm::{Decision, MAX_EXACT};
use floodgate_limiter::{Check, Deciding, Enforcement, LimitId, OnFailure, Store};
use floodgate_policy::identity::KeySource;
use floodgate_policy::{remote_address, Limit, Policy, Rule};

/// A call, as Envoy sent it (checked for size by the service).
pub(crate) struct Ask<'a> {
    pub domain: &'a str,
    pub descriptors: Vec<Descriptor<'a>>,
}

/// One descriptor: its entries in order, and what it costs.
pub(crate) struct Descriptor<'a> {
    pub entries: Vec<(&'a str, &'a str)>,
    pub cost: u64,
}

/// The cost of a descriptor: its own `hits_addend` when set (0 looks
/// without charging), else the call's, where 0 means "not set" and so 1.
pub(crate) fn cost_of(descriptor_hits: Option<u64>, call_hits: u32) -> u64 {
    descriptor_hits
        .unwrap_or(u64::from(call_hits.max(1)))
        // Beyond any quota: refused as a cost no limit can hold.
        .min(MAX_EXACT)
}

/// Why a descriptor met no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unmatched {
    /// No limit is on the call's domain.
    Domain,
    /// None is on this descriptor.
    Descriptor,
}

/// The checks a call makes, and which of them each descriptor met.
#[derive(Debug, Default)]
pub(crate) struct Planned {
    pub checks: Vec<Check>,
    /// Per descriptor, in order: the checks (indexes into `checks`) it met.
    pub met: Vec<SmallVec<[usize; 2]>>,
    pub unmatched: Vec<Option<Unmatched>>,
}

/// The limits each descriptor meets: of those whose pattern matches it,
/// the most specific (`DescriptorPattern::specificity`). Two descriptors
/// that meet one limit
/// with one identity are one check of their summed cost: two checks of
/// one state in one decision would each see it before the other's charge.
pub(crate) fn plan(policy: &Policy, ask: &Ask<'_>) -> Planned {
    let mut planned = Planned::default();
    let domain_known = policy.descriptor_limits().any(|(_, l)| {
        l.matcher
            .descriptors()
            .is_some_and(|d| *d.domain == *ask.domain)
    });
    for descriptor in &ask.descriptors {
        let mut met = SmallVec::new();
        if domain_known {
            let matching: SmallVec<[(LimitId, &Limit, u64); 4]> = policy
                .descriptor_limits()
                .filter_map(|(id, limit)| {
                    let pattern = limit.matcher.descriptors()?;
                    pattern
                        .matches(ask.domain, &descriptor.entries)
                        .then(|| (id, limit, pattern.specificity()))
                })
                .collect();
            let most_specific = matching.iter().map(|(_, _, s)| *s).max();
            for (id, limit, specificity) in &matching {
                if Some(*specificity) != most_specific {
                    continue;
                }
                let Some(identity) = policy
                    .clients
                    .descriptor_identity(&limit.key, &descriptor.entries)
                else {
                    continue;
                };
                // Validated with the config: limits on descriptors are rates
                // (and have no tiers: a descriptor carries no key).
                let Rule::Rate(algorithm) = policy.overridden(limit, identity, limit.rule) else {
                    continue;
                };
                let id = *id;
                let same = planned
                    .checks
                    .iter()
                    .position(|c: &Check| c.limit == id && c.key.identity == identity);
                let index = match same {
                    Some(index) => {
                        let check = &mut planned.checks[index];
                        check.cost = check.cost.saturating_add(descriptor.cost).min(MAX_EXACT);
                        index
                    }
                    None => {
                        planned
                            .checks
                            .push(limit.check(id, algorithm, identity, descriptor.cost));
                        planned.checks.len() - 1
                    }
                };
                if !met.contains(&index) {
                    met.push(index);
                }
            }
        }
        planned
            .unmatched
            .push(match (domain_known, met.is_empty()) {
                (false, _) => Some(Unmatched::Domain),
                (true, true) => Some(Unmatched::Descriptor),
                (true, false) => None,
            });
        planned.met.push(met);
    }
    planned
}

/// The limit a descriptor's status reports.
#[derive(Debug, Clone)]
pub(crate) struct Shown {
    pub name: String,
    pub quota: u64,
    pub window_us: u64,
    pub decision: Decision,
}

/// One descriptor's answer.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    pub over_limit: bool,
    /// None when the descriptor met no limit.
    pub shown: Option<Shown>,
}

/// The whole answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub over_limit: bool,
    pub statuses: Vec<Status>,
    /// The rate-limit headers `[response].headers` asks for (and
    /// Retry-After when over the limit), offered for Envoy to add.
    pub headers: Vec<Header>,
}

/// Why a call got no answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The store could not decide, or a limit that fails closed could not
    /// be decided on it (`on_failure = "deny"` while Redis is away).
    Unavailable(String),
}

fn layer<'a>(check: &'a Check, decision: Decision, position: usize) -> EnforcedOutcome<'a> {
    EnforcedOutcome {
        position: Position(position),
        name: check.name.as_str(),
        quota: check.algorithm.quota(),
        window_us: check.algorithm.window_us(),
        decision,
        banned: false,
    }
}

fn shown(layer: &EnforcedOutcome<'_>) -> Shown {
    Shown {
        name: layer.name.to_string(),
        quota: layer.quota,
        window_us: layer.window_us,
        decision: layer.decision,
    }
}

/// The answer to a call whose checks were decided: a descriptor is over
/// the limit when an enforcing check it met refuses (shadow checks never
/// refuse), and reports the refusing layer, or else its most constrained.
pub(crate) fn answer(
    style: headers::HeaderStyle,
    planned: &Planned,
    decisions: &[Decision],
) -> Answer {
    let layers: Vec<EnforcedOutcome<'_>> = planned
        .checks
        .iter()
        .zip(decisions)
        .enumerate()
        .map(|(i, (check, &decision))| layer(check, decision, i))
        .collect();
    let enforcing = |i: &usize| planned.checks[*i].enforcement == Enforcement::Enforce;
    let statuses: Vec<Status> = planned
        .met
        .iter()
        .map(|met| {
            let own: Vec<EnforcedOutcome<'_>> = met
                .iter()
                .copied()
                .filter(enforcing)
                .map(|i| layers[i])
                .collect();
            let refusing = headers::refusing(&own);
            // A descriptor met only by shadow limits reports them: Envoy
            // shows what would happen.
            let reported = refusing
                .or_else(|| headers::most_constrained(&own))
                .copied()
                .or_else(|| {
                    let shadows: Vec<EnforcedOutcome<'_>> =
                        met.iter().map(|&i| layers[i]).collect();
                    headers::most_constrained(&shadows).copied()
                });
            Status {
                over_limit: refusing.is_some(),
                shown: reported.as_ref().map(shown),
            }
        })
        .collect();
    let over_limit = statuses.iter().any(|s| s.over_limit);
    let enforcing_layers: Vec<EnforcedOutcome<'_>> = (0..layers.len())
        .filter(enforcing)
        .map(|i| layers[i])
        .collect();
    let mut offered = Vec::new();
    let reported = if over_limit {
        headers::refusing(&enforcing_layers)
    } else {
        headers::most_constrained(&enforcing_layers)
    };
    if let Some(reported) = reported {
        if style != headers::HeaderStyle::None {
            offered = headers::rate_limit_headers(style, &enforcing_layers, reported);
        }
        // A cost above the limit passes at no time: no Retry-After (as the
        // gateway's 429), where 0 would say "now".
        if over_limit && !reported.decision.cost_exceeds_limit() {
            offered.push((
                &RETRY_AFTER,
                http::HeaderValue::from(headers::ceil_secs(reported.decision.retry_after_us())),
            ));
            offered.push(headers::retry_after_ms(reported.decision.retry_after_us()));
        }
    }
    Answer {
        over_limit,
        statuses,
        headers: offered,
    }
}

/// Plans, decides on `store` and answers one call; counts it and logs a
/// refusal as the gateway does.
pub(crate) async fn decide(
    runtime: &Runtime,
    store: &Arc<dyn Store>,
    metrics: &RlsMetrics,
    lines: &RefusalLog,
    ask: &Ask<'_>,
) -> Result<Answer, Failure> {
    let policy = &runtime.policy;
    let planned = plan(policy, ask);
    for reason in planned.unmatched.iter().flatten() {
        match reason {
            Unmatched::Domain => metrics.unknown_domain.inc(),
            Unmatched::Descriptor => metrics.unknown_descriptor.inc(),
        }
    }
    let decisions = if planned.checks.is_empty() {
        Vec::new()
    } else {
        store
            .decide(&planned.checks)
            .await
            .map_err(|e| Failure::Unavailable(format!("the limits could not be decided: {e}")))?
    };
    let answer = answer(runtime.headers, &planned, &decisions);
    if answer.over_limit && store.deciding() == Deciding::Fallback {
        // Refused because a limit fails closed while the shared store is
        // away: that is Redis's state, not the client's, and Envoy's own
        // `failure_mode_deny` is the choice of what then happens.
        let closed = planned.checks.iter().zip(&decisions).find(|(c, d)| {
            c.enforcement == Enforcement::Enforce && !d.allowed() && c.on_failure == OnFailure::Deny
        });
        if let Some((check, _)) = closed {
            return Err(Failure::Unavailable(format!(
                "the shared store is away and limit {} fails closed (on_failure = \"deny\")",
                check.name
            )));
        }
    }
    account(
        runtime,
        policy,
        lines,
        ask,
        &planned,
        &decisions,
        answer.over_limit,
    );
    Ok(answer)
}

/// The limits' counters, as the gateway counts its layers, and a
/// refusal's line (and a shadow refusal's) as the gateway spaces them: one
/// per descriptor and limit every `REFUSAL_LOG_EVERY`, with the count of
/// those unlogged since.
fn account(
    runtime: &Runtime,
    policy: &Policy,
    lines: &RefusalLog,
    ask: &Ask<'_>,
    planned: &Planned,
    decisions: &[Decision],
    refused: bool,
) {
    for (check, decision) in planned.checks.iter().zip(decisions) {
        runtime
            .counters(check.limit)
            .count(check.enforcement, decision, refused);
    }
    let logged = planned
        .checks
        .iter()
        .zip(decisions)
        .enumerate()
        .filter(|(_, (_, d))| !d.allowed());
    for (i, (check, decision)) in logged {
        let Some(unlogged) = lines.due(check.limit, check.key.identity) else {
            continue;
        };
        let descriptor = planned
            .met
            .iter()
            .position(|met| met.contains(&i))
            .map_or_else(String::new, |k| {
                entries_label(policy, check.limit, &ask.descriptors[k].entries)
            });
        info!(
            "{}: rls domain={} descriptor=[{descriptor}] limit={} retry_after_ms={}{} unlogged_since_last={unlogged}",
            if check.enforcement == Enforcement::Shadow {
                "shadow limit would refuse"
            } else {
                "rate limited"
            },
            ask.domain,
            check.name,
            headers::ceil_ms(decision.retry_after_us()),
            if decision.cost_exceeds_limit() {
                " (cost exceeds the limit)"
            } else {
                ""
            },
        );
    }
}

/// A descriptor as the log shows it: an address as the group its limit
/// counts (an IPv6 client's network), and a value the limit's pattern
/// names, in the clear; any other value (an API key, a user id, a
/// `remote_address` that is no address) as a short keyed hash, never in
/// full.
fn entries_label(policy: &Policy, limit: LimitId, entries: &[(&str, &str)]) -> String {
    let pattern = policy.limits[limit.index()].matcher.descriptors();
    let mut out = Vec::with_capacity(entries.len());
    for (k, &(key, value)) in entries.iter().enumerate() {
        let pinned = pattern
            .and_then(|p| p.entries.get(k))
            .and_then(|e| e.value.as_ref())
            .is_some_and(|glob| !glob.as_str().contains('*'));
        if let Some(ip) = remote_address(key, value) {
            out.push(format!("{key}={}", policy.clients.address_label(ip)));
        } else if pinned {
            out.push(format!("{key}={value}"));
        } else {
            let hash = policy
                .clients
                .descriptor_identity(&KeySource::Entry(key.into()), &[(key, value)])
                .unwrap_or_default();
            out.push(format!("{key}=#{:08x}", (hash >> 96) as u32));
        }
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Inputs};

    fn policy(limits: &str) -> Arc<Policy> {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"127.0.0.1:8000\"]\n[rls]\nlisten = \"127.0.0.1:8081\"\n{limits}"
        );
        Config::parse(std::path::Path::new("t.toml"), &text, &Inputs::default())
            .unwrap_or_else(|e| panic!("{e}"))
            .policy
    }

    const LIMITS: &str = r#"
[[limits]]
name = "per_address"
key = "descriptor:remote_address"
algorithm = "fixed_window"
limit = 10
window = "1m"
match = { domain = "edge", descriptors = [["remote_address"]] }

[[limits]]
name = "login"
key = "descriptor"
algorithm = "token_bucket"
capacity = 5
refill_rate = 1
match = { domain = "edge", descriptors = [["remote_address"], ["path", "/login*"]] }
"#;

    fn ask<'a>(domain: &'a str, descriptors: &[&[(&'a str, &'a str)]]) -> Ask<'a> {
        Ask {
            domain,
            descriptors: descriptors
                .iter()
                .map(|entries| Descriptor {
                    entries: entries.to_vec(),
                    cost: 2,
                })
                .collect(),
        }
    }

    #[test]
    fn each_descriptor_meets_the_limits_of_its_shape_and_repeats_add_up() {
        let policy = policy(LIMITS);
        let planned = plan(
            &policy,
            &ask(
                "edge",
                &[
                    &[("remote_address", "1.2.3.4")],
                    &[("remote_address", "1.2.3.4"), ("path", "/login/sso")],
                    &[("remote_address", "1.2.3.4")],
                    &[("path", "/login")],
                ],
            ),
        );
        let names: Vec<&str> = planned.checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["per_address", "login"]);
        // The address twice: one check, charged for both.
        assert_eq!(planned.checks[0].cost, 4);
        assert_eq!(planned.checks[1].cost, 2);
        let met: Vec<Vec<usize>> = planned.met.iter().map(|m| m.to_vec()).collect();
        assert_eq!(met, vec![vec![0], vec![1], vec![0], vec![]]);
        assert_eq!(
            planned.unmatched,
            vec![None, None, None, Some(Unmatched::Descriptor)]
        );
        let elsewhere = plan(&policy, &ask("other", &[&[("remote_address", "1.2.3.4")]]));
        assert!(elsewhere.checks.is_empty());
        assert_eq!(elsewhere.unmatched, vec![Some(Unmatched::Domain)]);
    }

    #[test]
    fn a_limit_on_one_value_overrides_the_limit_on_any_value_for_it() {
        let policy = policy(
            r#"
[[limits]]
name = "per_address"
key = "descriptor:remote_address"
algorithm = "fixed_window"
limit = 10
window = "1s"
match = { domain = "edge", descriptors = [["remote_address"]] }

[[limits]]
name = "per_address_hourly"
key = "descriptor:remote_address"
algorithm = "fixed_window"
limit = 1000
window = "1h"
match = { domain = "edge", descriptors = [["remote_address"]] }

[[limits]]
name = "partner"
key = "descriptor:remote_address"
algorithm = "fixed_window"
limit = 1000
window = "1s"
match = { domain = "edge", descriptors = [["remote_address", "50.0.0.5"]] }
"#,
        );
        let names = |address: &str| -> Vec<String> {
            plan(&policy, &ask("edge", &[&[("remote_address", address)]]))
                .checks
                .iter()
                .map(|c| c.name.as_str().to_string())
                .collect()
        };
        // Every limit of the most specific shape applies, layered.
        assert_eq!(names("50.0.0.1"), vec!["per_address", "per_address_hourly"]);
        assert_eq!(names("50.0.0.5"), vec!["partner"]);
    }

    #[test]
    fn the_cost_is_the_descriptors_hits_addend_else_the_calls_else_one() {
        assert_eq!(cost_of(None, 0), 1);
        assert_eq!(cost_of(None, 7), 7);
        assert_eq!(cost_of(Some(3), 7), 3);
        assert_eq!(cost_of(Some(0), 7), 0);
        assert_eq!(cost_of(Some(u64::MAX), 7), MAX_EXACT);
    }

    #[test]
    fn a_refused_descriptor_reports_its_refusal_and_the_others_their_state() {
        let policy = policy(LIMITS);
        let planned = plan(
            &policy,
            &ask(
                "edge",
                &[
                    &[("remote_address", "1.2.3.4")],
                    &[("remote_address", "1.2.3.4"), ("path", "/login")],
                ],
            ),
        );
        let decisions = [
            Decision::admitted(10, 6, 30_000_000),
            // Resets in 5 s, passes again in 2.
            Decision::refused(5, 0, 5_000_000, 2_000_000),
        ];
        let answer = answer(headers::HeaderStyle::Both, &planned, &decisions);
        assert!(answer.over_limit);
        let over: Vec<bool> = answer.statuses.iter().map(|s| s.over_limit).collect();
        assert_eq!(over, vec![false, true]);
        let shown = answer.statuses[1].shown.as_ref().expect("shown");
        assert_eq!((shown.name.as_str(), shown.quota), ("login", 5));
        let retry = answer
            .headers
            .iter()
            .find(|(name, _)| name.spelling() == "Retry-After")
            .and_then(|(_, v)| v.to_str().ok());
        assert_eq!(retry, Some("2"));

        // A hits_addend above the quota never passes: nothing says when.
        let decisions = [
            Decision::admitted(10, 6, 30_000_000),
            Decision::never_passable(5, 5, 0),
        ];
        let never = super::answer(headers::HeaderStyle::Both, &planned, &decisions);
        assert!(never.over_limit);
        assert!(!never
            .headers
            .iter()
            .any(|(name, _)| name.spelling() == "Retry-After"));
    }
}
