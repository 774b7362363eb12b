//! A limit charged by the response, as the config says it: `count` (the
//! statuses that count a request) or `cost_from_response` (what the
//! response says a request cost, and what it reserves before it goes
//! upstream).

use http::HeaderName;

use super::file::{
    CountSection, LimitSection, ReserveSpec, ResponseCostSection, StatusName, CONCURRENCY,
};
use super::source::Segment;
use super::{at, key_path, Invalid};
use floodgate_algorithm::{Kind, MAX_EXACT};
use floodgate_policy::identity::Tier;
use floodgate_policy::{ChargedByResponse, CostSource, LlmProvider, ResponseCost, Rule, Statuses};

/// Where an error about a key of `cost_from_response` points.
type Here<'a> = dyn Fn(&str) -> Vec<Segment> + 'a;

/// `count` or `cost_from_response`, not both; a cost is checked against
/// the limit's rule and each tier's.
pub(super) fn charged_by_response(
    i: usize,
    s: &LimitSection,
    rule: Rule,
    tiers: &[(Tier, Rule)],
    instances: u64,
) -> Result<Option<ChargedByResponse>, Invalid> {
    match (&s.count, &s.cost_from_response) {
        (Some(_), Some(_)) => Err(at(
            &[&"limits", &i, &"cost_from_response"],
            "a limit is charged by `count` or by `cost_from_response`, not both",
        )),
        (Some(count), None) => Ok(Some(ChargedByResponse::Status(statuses(count, &rule, i)?))),
        (None, Some(priced)) => {
            let mut rules = vec![rule];
            rules.extend(tiers.iter().map(|(_, r)| *r));
            Ok(Some(ChargedByResponse::Cost(response_cost(
                priced, &rules, instances, i,
            )?)))
        }
        (None, None) => Ok(None),
    }
}

/// `cost_from_response`: on the algorithms whose balance can be owed (not
/// a log of stamps, not a schedule of departures).
fn response_cost(
    section: &ResponseCostSection,
    rules: &[Rule],
    instances: u64,
    i: usize,
) -> Result<ResponseCost, Invalid> {
    let here = |key: &str| key_path(&[&"limits", &i, &"cost_from_response"], key);
    let most = most_owed(rules, instances, i)?;
    let source = cost_source(section, &here)?;
    let max = units(section.max, most, "max", &here)?;
    if max == 0 {
        return Err((here("max"), "must be at least 1".into()));
    }
    let default = units(section.default.unwrap_or(1), most, "default", &here)?;
    if default > max {
        return Err((here("default"), format!("must be at most `max` ({max})")));
    }
    let from_request = reserves_from_request(section, &source, &here)?;
    // A request that tells nothing reserves `max`: what it can be charged.
    let reserve = match section.reserve {
        Some(ReserveSpec::Units(r)) => units(r, most, "reserve", &here)?,
        Some(ReserveSpec::Named(_)) => max,
        None => default.max(1),
    };
    check_reservation_fits(section, reserve, from_request, rules, instances, &here)?;
    check_include_usage(section, &source, &here)?;
    Ok(ResponseCost {
        source,
        max,
        default,
        reserve,
        from_request,
        include_usage: section.include_usage,
        expose: section.expose,
    })
}

/// The most one response may cost. The limit and each tier: one
/// response's cost must fit under each's ceiling, so that it is always
/// owed in full, on an instance's share too (the local fallback divides a
/// bucket's rate among `instances`).
fn most_owed(rules: &[Rule], instances: u64, i: usize) -> Result<u64, Invalid> {
    let mut most = MAX_EXACT / 4;
    for rule in rules {
        match rule {
            Rule::Rate(algorithm) if algorithm.owes_costs() => {
                let owed = algorithm.without_ceiling();
                most = most.min(owed.quota()).min(owed.divided(instances).quota());
            }
            Rule::Rate(algorithm) => {
                return Err(at(
                    &[&"limits", &i, &"cost_from_response"],
                    format!(
                        "`cost_from_response` does not apply to {}; use token_bucket, fixed_window or quota",
                        algorithm.name()
                    ),
                ))
            }
            Rule::Concurrency(_) => {
                return Err(at(
                    &[&"limits", &i, &"cost_from_response"],
                    format!("`cost_from_response` does not apply to {CONCURRENCY}"),
                ))
            }
        }
    }
    Ok(most)
}

/// A number of units `key` gives: from 0 to the most a response may cost.
fn units(value: i64, most: u64, key: &str, here: &Here) -> Result<u64, Invalid> {
    u64::try_from(value)
        .ok()
        .filter(|&v| v <= most)
        .ok_or_else(|| {
            (
                here(key),
                format!("must be a whole number from 0 to {most}"),
            )
        })
}

/// Whether `reserve = "request"`: the request's own max_tokens, which only
/// a `usage` reads.
fn reserves_from_request(
    section: &ResponseCostSection,
    source: &CostSource,
    here: &Here,
) -> Result<bool, Invalid> {
    match &section.reserve {
        Some(ReserveSpec::Named(name)) if name == "request" => {
            if !matches!(source, CostSource::Usage { .. }) {
                return Err((
                    here("reserve"),
                    "a request's own worst case is read for a `usage` (its max_tokens); with a `header`, reserve a number".into(),
                ));
            }
            Ok(true)
        }
        Some(ReserveSpec::Named(other)) => Err((
            here("reserve"),
            format!("\"{other}\" is no reservation: a whole number, or \"request\" (the request's own max_tokens and prompt)"),
        )),
        _ => Ok(false),
    }
}

/// What a request takes before it goes upstream: it must fit in the
/// limit (and in an instance's share of it, which decides while the
/// shared store is away), or no request could ever pass.
fn check_reservation_fits(
    section: &ResponseCostSection,
    reserve: u64,
    from_request: bool,
    rules: &[Rule],
    instances: u64,
    here: &Here,
) -> Result<(), Invalid> {
    let fits = rules
        .iter()
        .map(|rule| match rule {
            Rule::Rate(algorithm) => algorithm.divided(instances).quota(),
            Rule::Concurrency(c) => c.max,
        })
        .min()
        .unwrap_or(u64::MAX);
    let key = if from_request {
        "max"
    } else if section.reserve.is_some() {
        "reserve"
    } else {
        "default"
    };
    if reserve == 0 {
        return Err((here(key), "a reservation must be at least 1".into()));
    }
    if reserve > fits {
        return Err((
            here(key),
            format!(
                "a request reserves {reserve} before it goes upstream{}, more than the limit holds ({fits}{}): none could pass; set a smaller `{key}`",
                if from_request { " when it does not say its max_tokens" } else { "" },
                if instances > 1 { ", an instance's share" } else { "" }
            ),
        ));
    }
    Ok(())
}

fn check_include_usage(
    section: &ResponseCostSection,
    source: &CostSource,
    here: &Here,
) -> Result<(), Invalid> {
    let openai = matches!(
        source,
        CostSource::Usage {
            provider: LlmProvider::OpenAi,
            ..
        }
    );
    if section.include_usage && !openai {
        return Err((
            here("include_usage"),
            "only an OpenAI stream leaves its usage out unless asked: set it with `usage = \"openai\"`".into(),
        ));
    }
    Ok(())
}

/// Where the response says its cost: a header of its own, or an LLM
/// provider's usage in the body, priced by the weights.
fn cost_source(section: &ResponseCostSection, here: &Here) -> Result<CostSource, Invalid> {
    let weights = [
        ("prompt_weight", section.prompt_weight),
        ("completion_weight", section.completion_weight),
    ];
    match (&section.header, &section.usage) {
        (Some(_), Some(_)) | (None, None) => Err((
            here("usage"),
            "give the cost's source: `header` (a response header's number) or `usage` (\"openai\" or \"anthropic\": the tokens the answer's body reports), one of them".into(),
        )),
        (Some(name), None) => {
            if let Some((key, _)) = weights.iter().find(|(_, w)| w.is_some()) {
                return Err((
                    here(key),
                    "weights price a `usage`; a header's number is the cost itself".into(),
                ));
            }
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                (
                    here("header"),
                    format!("\"{name}\" is not a valid header name"),
                )
            })?;
            // Removing one of these from a response would break its framing.
            const FRAMING: [&str; 8] = [
                "connection",
                "content-length",
                "keep-alive",
                "proxy-connection",
                "te",
                "trailer",
                "transfer-encoding",
                "upgrade",
            ];
            if FRAMING.contains(&header.as_str()) {
                return Err((
                    here("header"),
                    format!("\"{name}\" frames the response; name a header of its own"),
                ));
            }
            Ok(CostSource::Header(header))
        }
        (None, Some(provider)) => {
            let provider = match provider.as_str() {
                "openai" => LlmProvider::OpenAi,
                "anthropic" => LlmProvider::Anthropic,
                other => {
                    return Err((
                        here("usage"),
                        format!("\"{other}\" is no provider whose usage floodgate reads: \"openai\" (and every OpenAI-compatible server) or \"anthropic\""),
                    ))
                }
            };
            // A price per token: up to a million micro-units keeps any
            // count floodgate reads within the exact range once summed.
            let weight = |key: &'static str, value: Option<i64>| -> Result<u64, Invalid> {
                u64::try_from(value.unwrap_or(1))
                    .ok()
                    .filter(|&w| w <= 1_000_000)
                    .ok_or_else(|| (here(key), "must be a whole number from 0 to 1000000".into()))
            };
            let prompt_weight = weight("prompt_weight", section.prompt_weight)?;
            let completion_weight = weight("completion_weight", section.completion_weight)?;
            if prompt_weight == 0 && completion_weight == 0 {
                return Err((
                    here("completion_weight"),
                    "with both weights 0 every answer costs nothing".into(),
                ));
            }
            if section.expose {
                return Err((
                    here("expose"),
                    "a usage is read from the body: there is no header to expose".into(),
                ));
            }
            Ok(CostSource::Usage {
                provider,
                prompt_weight,
                completion_weight,
            })
        }
    }
}

/// `count = { statuses = [...] }`: final statuses (200 to 599; an
/// interim 1xx is never the answer) and classes like "4xx".
fn statuses(count: &CountSection, rule: &Rule, i: usize) -> Result<Statuses, Invalid> {
    match rule {
        Rule::Concurrency(_) => {
            return Err(at(
                &[&"limits", &i, &"count"],
                format!("`count` does not apply to {CONCURRENCY}: a request in flight is counted while it lasts"),
            ));
        }
        // A peek of a leaky bucket gives a departure slot it does not keep:
        // requests checked together would all leave at once.
        Rule::Rate(algorithm) if algorithm.kind() == Kind::LeakyBucket => {
            return Err(at(
                &[&"limits", &i, &"count"],
                "`count` does not apply to leaky_bucket, which schedules requests as they arrive",
            ));
        }
        Rule::Rate(_) => {}
    }
    if count.statuses.is_empty() {
        return Err(at(
            &[&"limits", &i, &"count", &"statuses"],
            "name at least one status, e.g. [401, 403] or [\"5xx\"]",
        ));
    }
    let ranges = count
        .statuses
        .iter()
        .enumerate()
        .map(|(j, status)| {
            let bad = || {
                at(
                    &[&"limits", &i, &"count", &"statuses", &j],
                    "must be a final status from 200 to 599, or a class like \"4xx\"",
                )
            };
            match status {
                StatusName::Code(code) => u16::try_from(*code)
                    .ok()
                    .filter(|c| (200..=599).contains(c))
                    .map(|c| (c, c))
                    .ok_or_else(bad),
                StatusName::Class(class) => match class.to_ascii_lowercase().as_bytes() {
                    [digit @ b'2'..=b'5', b'x', b'x'] => {
                        let low = u16::from(digit - b'0') * 100;
                        Ok((low, low + 99))
                    }
                    _ => Err(bad()),
                },
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Statuses::new(ranges))
}
