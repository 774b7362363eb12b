//! `[[limits]]`: each limit's name, key, rule and tiers, match, what it
//! reads of the response, ban and leases; names are unique. The parts a
//! limit shares with other tables (its match, its rule) are checked by
//! modules of their own.

use std::collections::HashSet;
use std::time::Duration;

use super::charged_by_response::charged_by_response;
use super::descriptors::descriptor_limit;
use super::duration;
use super::file::{BanSection, LeasesMode, LimitSection, Numbers, OnMissingName, CONCURRENCY};
use super::limit_key::validate_keys;
use super::matcher::validate_match;
use super::rule::{rule_of, RuleFrame};
use super::{at, key_path, AsSegment, Invalid};
use floodgate_algorithm::{takes_lease, Algorithm, Kind, MAX_SLIDING_LOG};
use floodgate_limiter::Enforcement;
use floodgate_limiter::{LimitName, OnFailure};
use floodgate_policy::identity::{Tier, Tiers};
use floodgate_policy::{Ban, KeySource, Limit, LimitMatch, OnMissing, PathPattern, Rule};

/// The known tiers' names, in order, for a message that lists them.
pub(super) fn sorted(tiers: &Tiers) -> String {
    let mut v: Vec<&str> = tiers.names().collect();
    v.sort_unstable();
    v.join(", ")
}

fn validate_limit(
    i: usize,
    s: &LimitSection,
    default_on_failure: OnFailure,
    known_tiers: &Tiers,
    jwt: bool,
    instances: u64,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Limit, Invalid> {
    check_name(i, s)?;
    let key = validate_keys(&s.key, i, jwt)?;
    let frame = s.frame();
    let own = s.numbers();
    let rule = rule_of(&frame, &own, None, &[&"limits", &i])?;
    let tiers = tier_rules(i, s, &frame, &own, known_tiers)?;
    let matcher = limit_matcher(i, s, &key, compile_pattern)?;
    let charged_by_response = charged_by_response(i, s, rule, &tiers, instances)?;
    let ban = limit_ban(i, s, &key)?;
    check_case_insensitive_values(i, s, &key)?;
    let on_missing = on_missing(i, s)?;
    Ok(Limit {
        id: xxhash_rust::xxh3::xxh3_64(s.name.as_bytes()),
        name: LimitName::new(&s.name),
        key,
        rule,
        tiers,
        matcher,
        enforcement: if s.shadow {
            Enforcement::Shadow
        } else {
            Enforcement::Enforce
        },
        on_failure: s.on_failure.map_or(default_on_failure, Into::into),
        charged_by_response,
        ban,
        on_missing,
        case_insensitive_values: s.case_insensitive_values,
        leases: false,
    })
}

fn check_name(i: usize, s: &LimitSection) -> Result<(), Invalid> {
    let name_ok = !s.name.is_empty()
        && s.name.len() <= 64
        && s.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    if !name_ok {
        return Err(at(
            &[&"limits", &i, &"name"],
            format!(
                "\"{}\" must be 1 to 64 letters, digits, '_', '-' or '.'",
                s.name
            ),
        ));
    }
    Ok(())
}

/// `[limits.tiers]`: each a known tier, its numbers over the limit's own.
fn tier_rules(
    i: usize,
    s: &LimitSection,
    frame: &RuleFrame,
    own: &Numbers,
    known_tiers: &Tiers,
) -> Result<Vec<(Tier, Rule)>, Invalid> {
    let mut tiers = Vec::new();
    for (tier, overrides) in &s.tiers {
        let path: [&dyn AsSegment; 4] = [&"limits", &i, &"tiers", tier];
        let Some(known) = known_tiers.get(tier) else {
            return Err(at(
                &path,
                format!("unknown tier \"{tier}\" (known: {})", sorted(known_tiers)),
            ));
        };
        tiers.push((known, rule_of(frame, overrides, Some(own), &path)?));
    }
    Ok(tiers)
}

/// The limit's `match` (every request without one); a key that reads a
/// descriptor only on a limit matched by descriptors.
fn limit_matcher(
    i: usize,
    s: &LimitSection,
    key: &KeySource,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<LimitMatch, Invalid> {
    let matcher = match &s.matcher {
        Some(m) => validate_match(m, &[&"limits", &i, &"match"], compile_pattern)?,
        None => LimitMatch::default(),
    };
    if let Some(pattern) = matcher.descriptors() {
        descriptor_limit(i, s, key, pattern)?;
    } else if key.reads_descriptor() {
        return Err(at(
            &[&"limits", &i, &"key"],
            format!(
                "{} reads a descriptor of the rate limit service: match the limit by `domain` and `descriptors`",
                key.describe()
            ),
        ));
    }
    Ok(matcher)
}

/// `ban`, on a limit that refuses someone, keyed per client on what a
/// client cannot choose (unless `ban_on_client_keys` says so); that
/// setting only beside a `ban`.
fn limit_ban(i: usize, s: &LimitSection, key: &KeySource) -> Result<Option<Ban>, Invalid> {
    let ban = match &s.ban {
        None => None,
        Some(_) if s.shadow => {
            return Err(at(
                &[&"limits", &i, &"ban"],
                "a shadow limit refuses nobody, so it can ban nobody",
            ))
        }
        Some(_) if !key.per_client() => {
            return Err(at(
                &[&"limits", &i, &"ban"],
                format!(
                    "a limit keyed {} has one key for everyone: its ban would shut everyone out",
                    key.describe()
                ),
            ))
        }
        Some(_) if !key.unforgeable() && !s.ban_on_client_keys => {
            return Err(at(
                &[&"limits", &i, &"ban"],
                format!(
                    "a limit keyed {} bans whatever value a request carries, and anyone can send another client's: one client could ban another. Key it on something a client cannot choose (ip, api_key, jwt:<claim>, or a list with one of them), or set ban_on_client_keys = true if that is what you mean",
                    key.describe()
                ),
            ))
        }
        Some(section) => Some(ban(section, &s.name, i)?),
    };
    if s.ban_on_client_keys && s.ban.is_none() {
        return Err(at(
            &[&"limits", &i, &"ban_on_client_keys"],
            "applies only to a limit with a `ban`",
        ));
    }
    Ok(ban)
}

fn check_case_insensitive_values(
    i: usize,
    s: &LimitSection,
    key: &KeySource,
) -> Result<(), Invalid> {
    let chosen_by_client = |p: &KeySource| {
        matches!(
            p,
            KeySource::Header(_) | KeySource::Cookie(_) | KeySource::Query(_)
        )
    };
    if s.case_insensitive_values && !key.any_part(chosen_by_client) {
        return Err(at(
            &[&"limits", &i, &"case_insensitive_values"],
            format!(
                "applies to header:, cookie: and query: keys, and this limit is keyed {}",
                key.describe()
            ),
        ));
    }
    Ok(())
}

fn on_missing(i: usize, s: &LimitSection) -> Result<OnMissing, Invalid> {
    match (s.on_missing, s.shadow) {
        (Some(OnMissingName::Deny), true) => Err(at(
            &[&"limits", &i, &"on_missing"],
            "a shadow limit refuses nobody: \"deny\" would refuse for it",
        )),
        (None | Some(OnMissingName::Skip), _) => Ok(OnMissing::Skip),
        (Some(OnMissingName::Deny), _) => Ok(OnMissing::Deny),
        (Some(OnMissingName::Ip), _) => Ok(OnMissing::Ip),
    }
}

/// Whether a limit's decisions may come from leases: `[redis].leases`
/// unless the limit says otherwise, and only for an algorithm whose units
/// can be leased.
fn leases_for(i: usize, s: &LimitSection, limit: &Limit, redis: bool) -> Result<bool, Invalid> {
    let kind = match limit.rule {
        Rule::Rate(algorithm) => Some(algorithm.kind()),
        Rule::Concurrency(_) => None,
    };
    // A bucket counting in fractions of a µs leases as any other: its
    // leased tokens are a count on its ledger (crates/algorithm/src/ledger.rs),
    // never a stretch of its schedule.
    let refusal = match kind {
        Some(kind) if !takes_lease(kind) => Some(format!(
            "{} decides every request on Redis (every admission is its own stamp or departure slot): it takes no leases",
            kind.name()
        )),
        None => Some(format!(
            "{CONCURRENCY} limits hold slots, which are leases already"
        )),
        // A bucket's refund moves its schedule back, which would free
        // tokens that another instance holds leased.
        Some(Kind::TokenBucket) if limit.charged_by_response.is_some() => Some(
            "a token bucket charged by the response takes no leases: its refunds would free tokens another instance holds leased".to_string(),
        ),
        Some(_) => None,
    };
    match (s.leases, refusal) {
        (None, refusal) => Ok(redis && refusal.is_none()),
        (Some(LeasesMode::Off), _) => Ok(false),
        (Some(LeasesMode::Auto), Some(reason)) => Err(at(&[&"limits", &i, &"leases"], reason)),
        (Some(LeasesMode::Auto), None) => Ok(redis),
    }
}

/// `ban`: its strikes and its penalty as limits of their own, named
/// `strikes:<limit>` and `ban:<limit>` (a ':' no limit's name can hold), so
/// that their state never meets a limit's, nor a concurrency limit's
/// (`slots:<limit>`).
fn ban(section: &BanSection, limit: &str, i: usize) -> Result<Ban, Invalid> {
    let here = |key: &str| key_path(&[&"limits", &i, &"ban"], key);
    let after = u64::try_from(section.after)
        .ok()
        .filter(|a| (1..=MAX_SLIDING_LOG).contains(a))
        .ok_or_else(|| {
            (
                here("after"),
                format!("must be a whole number from 1 to {MAX_SLIDING_LOG}"),
            )
        })?;
    const YEAR: Duration = Duration::from_secs(365 * 86_400);
    let span = |key: &'static str, text: &str| -> Result<u64, Invalid> {
        let d = duration::parse(text).map_err(|m| (here(key), m))?;
        if d < Duration::from_secs(1) || d > YEAR {
            return Err((here(key), "must be from 1s to 365d".into()));
        }
        Ok(d.as_micros() as u64)
    };
    let within_us = span("within", &section.within)?;
    let duration_us = span("duration", &section.duration)?;
    // One stamp per strike, `after` of them over `within`: within the
    // sliding log's range by the bounds above.
    let strikes =
        Algorithm::sliding_log(after, within_us).map_err(|e| (here("within"), e.to_string()))?;
    let penalty =
        Algorithm::token_bucket(1, duration_us).map_err(|e| (here("duration"), e.to_string()))?;
    let named = |kind: &str| {
        let name = format!("{kind}:{limit}");
        (
            LimitName::new(&name),
            xxhash_rust::xxh3::xxh3_64(name.as_bytes()),
        )
    };
    let (strikes_name, strikes_id) = named("strikes");
    let (penalty_name, penalty_id) = named("ban");
    Ok(Ban {
        strikes,
        strikes_name,
        strikes_id,
        penalty,
        penalty_name,
        penalty_id,
    })
}

/// Every `[[limits]]` table, in order; names are unique.
pub(super) fn validate_limits(
    sections: &[LimitSection],
    default_on_failure: OnFailure,
    known_tiers: &Tiers,
    jwt: bool,
    instances: u64,
    leases: bool,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Vec<Limit>, Invalid> {
    let mut limits = Vec::new();
    let mut names = HashSet::new();
    for (i, section) in sections.iter().enumerate() {
        let mut limit = validate_limit(
            i,
            section,
            default_on_failure,
            known_tiers,
            jwt,
            instances,
            compile_pattern,
        )?;
        limit.leases = leases_for(i, section, &limit, leases)?;
        if !names.insert(limit.name.clone()) {
            return Err(at(
                &[&"limits", &i, &"name"],
                format!("duplicate limit name \"{}\"", limit.name),
            ));
        }
        limits.push(limit);
    }
    Ok(limits)
}

/// How each limit reads a client's numbers given at run time, in the
/// limits' order.
pub(super) fn override_frames(sections: &[LimitSection]) -> Vec<Result<RuleFrame, &'static str>> {
    sections
        .iter()
        .map(|s| match s.cost_from_response {
            // Its reservation is sized from the file's numbers.
            Some(_) => Err("a limit charged by `cost_from_response` takes no overrides"),
            None => Ok(s.frame()),
        })
        .collect()
}
