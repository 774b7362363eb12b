//! `[[costs]]`: what a request costs the limits a table names, priced by
//! the request's head.

use super::file::CostSection;
use super::matcher::validate_match;
use super::{at, AsSegment, Invalid};
use floodgate_algorithm::MAX_EXACT;
use floodgate_policy::{ChargedByResponse, CostRule, Limit, LimitMatch, PathPattern, Rule};

/// Every `[[costs]]` table, in order (for each limit, the first that
/// matches and prices it applies).
pub(super) fn validate_costs(
    sections: &[CostSection],
    limits: &[Limit],
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Vec<CostRule>, Invalid> {
    let mut costs = Vec::new();
    for (i, c) in sections.iter().enumerate() {
        if c.cost < 0 || c.cost as u64 > MAX_EXACT {
            return Err(at(
                &[&"costs", &i, &"cost"],
                "must be a whole number from 0 (a free request) upwards",
            ));
        }
        let mut priced = Vec::new();
        for (j, name) in c.limits.iter().enumerate() {
            let here = [&"costs" as &dyn AsSegment, &i, &"limits", &j];
            let Some(layer) = limits.iter().position(|l| l.name.as_str() == name) else {
                let known: Vec<&str> = limits.iter().map(|l| l.name.as_str()).collect();
                return Err(at(
                    &here,
                    format!(
                        "no limit is named \"{name}\" (limits: {})",
                        known.join(", ")
                    ),
                ));
            };
            let limit = &limits[layer];
            let why_not = match (&limit.rule, &limit.charged_by_response) {
                _ if limit.matcher.descriptors().is_some() => {
                    Some("is charged the hits_addend Envoy sends")
                }
                (Rule::Concurrency(_), _) => Some("counts requests in flight"),
                (_, Some(ChargedByResponse::Cost(_))) => Some("is charged what the response says"),
                _ => None,
            };
            if let Some(why) = why_not {
                return Err(at(
                    &here,
                    format!("\"{name}\" has no cost to set: it {why}"),
                ));
            }
            priced.push(layer);
        }
        let matcher =
            match validate_match(&c.matcher, &[&"costs", &i, &"match"], compile_pattern)? {
                LimitMatch::Http(matcher) => matcher,
                LimitMatch::Descriptors(_) => return Err(at(
                    &[&"costs", &i, &"match", &"domain"],
                    "[[costs]] price HTTP requests; a descriptor costs the hits_addend Envoy sends",
                )),
            };
        if let Some((field, _)) = matcher.body.first() {
            return Err(at(
                &[&"costs", &i, &"match", &"body", &field.as_ref()],
                "[[costs]] price by the request's head; a limit of its own (`match = { body = ... }`) prices by its body",
            ));
        }
        costs.push(CostRule {
            matcher,
            cost: c.cost as u64,
            limits: priced,
        });
    }
    Ok(costs)
}
