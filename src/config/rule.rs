//! A limit's rule, from its algorithm and its numbers: the limit's own, a
//! tier's over them, or a client's given at run time. The numbers each
//! algorithm takes come from the algorithm table.

use std::time::Duration;

use super::duration;
use super::file::{AlgorithmName, LimitSection, Numbers, UpgradesName, CONCURRENCY};
use super::{key_path, AsSegment, Invalid};
use floodgate_algorithm::{
    Algorithm, AlgorithmError, Calendar, Kind, Parameter, Period, MAX_EXACT,
};
use floodgate_limiter::MAX_LEASE_US;
use floodgate_policy::{Concurrency, Rule, Upgrades};

/// What a limit's numbers are read with, beside the numbers: its
/// algorithm and the settings that are the limit's whatever the tier (or
/// the client's override) says. Kept by `OverrideRules` to check numbers
/// given at run time as the file's are.
#[derive(Debug, Clone)]
pub(super) struct RuleFrame {
    pub(super) algorithm: AlgorithmName,
    pub(super) lease: Option<String>,
    pub(super) upgrades: Option<UpgradesName>,
    pub(super) timezone: Option<String>,
    pub(super) week_starts: Option<String>,
}

impl LimitSection {
    pub(super) fn frame(&self) -> RuleFrame {
        RuleFrame {
            algorithm: self.algorithm,
            lease: self.lease.clone(),
            upgrades: self.upgrades,
            timezone: self.timezone.clone(),
            week_starts: self.week_starts.clone(),
        }
    }
}

/// A limit's (or a tier's, or a client's) rule: its algorithm's numbers,
/// or a concurrency limit's.
pub(super) fn rule_of(
    s: &RuleFrame,
    own: &Numbers,
    base: Option<&Numbers>,
    path: &[&dyn AsSegment],
) -> Result<Rule, Invalid> {
    let field = |name: &str| key_path(path, name);
    match s.algorithm {
        AlgorithmName::Rate(kind) => {
            let concurrency_only = [
                ("max", own.max.is_some()),
                ("lease", s.lease.is_some()),
                ("upgrades", s.upgrades.is_some()),
            ];
            if let Some((name, _)) = concurrency_only.iter().find(|(_, given)| *given) {
                return Err((
                    field(name),
                    format!("`{name}` does not apply to {}", kind.name()),
                ));
            }
            if kind == Kind::Quota {
                return calendar_quota(s, own, base, path).map(Rule::Rate);
            }
            let quota_only = [
                ("timezone", s.timezone.is_some()),
                ("week_starts", s.week_starts.is_some()),
            ];
            if let Some((name, _)) = quota_only.iter().find(|(_, given)| *given) {
                return Err((
                    field(name),
                    format!("`{name}` does not apply to {}", kind.name()),
                ));
            }
            numbers(kind, own, base, path).map(Rule::Rate)
        }
        AlgorithmName::Concurrency => {
            let quota_only = [
                ("timezone", s.timezone.is_some()),
                ("week_starts", s.week_starts.is_some()),
            ];
            if let Some((name, _)) = quota_only.iter().find(|(_, given)| *given) {
                return Err((
                    field(name),
                    format!("`{name}` does not apply to {CONCURRENCY}"),
                ));
            }
            if let Some(&foreign) = Parameter::ALL.iter().find(|&&p| own.has(p)) {
                return Err((
                    field(foreign.name()),
                    format!("`{}` does not apply to {CONCURRENCY}", foreign.name()),
                ));
            }
            let max = own
                .max
                .or_else(|| base.and_then(|b| b.max))
                .ok_or_else(|| (field("max"), format!("{CONCURRENCY} needs `max`")))?;
            if max.fract() != 0.0 || max < 1.0 || max > MAX_EXACT as f64 {
                return Err((
                    field("max"),
                    format!("must be a whole number of at least 1 (got {max})"),
                ));
            }
            let lease = match &s.lease {
                None => DEFAULT_LEASE,
                Some(text) => duration::parse(text).map_err(|m| (field("lease"), m))?,
            };
            let lease_us = u64::try_from(lease.as_micros()).unwrap_or(u64::MAX);
            if lease < Duration::from_millis(100) || lease_us > MAX_LEASE_US {
                return Err((field("lease"), "must be from 100ms to 12 days".to_string()));
            }
            Ok(Rule::Concurrency(Concurrency {
                max: max as u64,
                lease_us,
                upgrades: match s.upgrades {
                    None | Some(UpgradesName::Include) => Upgrades::Include,
                    Some(UpgradesName::Exclude) => Upgrades::Exclude,
                },
            }))
        }
    }
}

/// `algorithm = "quota"`: a limit per calendar period of a zone.
fn calendar_quota(
    s: &RuleFrame,
    own: &Numbers,
    base: Option<&Numbers>,
    path: &[&dyn AsSegment],
) -> Result<Algorithm, Invalid> {
    let field = |name: &str| key_path(path, name);
    let name = Kind::Quota.name();
    if let Some(&foreign) = Parameter::ALL
        .iter()
        .find(|&&p| p != Parameter::Limit && p != Parameter::Period && own.has(p))
    {
        return Err((
            field(foreign.name()),
            format!("`{}` does not apply to {name}", foreign.name()),
        ));
    }
    let limit = own
        .limit
        .or_else(|| base.and_then(|b| b.limit))
        .ok_or_else(|| (field("limit"), format!("{name} needs `limit`")))?;
    let limit = whole(limit).map_err(|m| (field("limit"), m))?;
    let period_name = own
        .period
        .as_ref()
        .or_else(|| base.and_then(|b| b.period.as_ref()))
        .ok_or_else(|| (field("period"), format!("{name} needs `period`")))?;
    let period = Period::from_name(period_name).ok_or_else(|| {
        (
            field("period"),
            format!(
                "\"{period_name}\" is not a calendar period (expected one of: {})",
                Period::NAMES.join(", ")
            ),
        )
    })?;
    // Zone and week are the limit's, whichever tier is being read.
    let limit_path = |key: &str| key_path(&path[..path.len().min(2)], key);
    let timezone = match &s.timezone {
        None => chrono_tz::UTC,
        Some(zone) => zone.parse().map_err(|_| {
            (
                limit_path("timezone"),
                format!(
                    "\"{zone}\" is not an IANA time zone name like \"Europe/Paris\" or \"UTC\""
                ),
            )
        })?,
    };
    let week_starts = match s.week_starts.as_deref() {
        Some(_) if period != Period::Week => {
            return Err((
                limit_path("week_starts"),
                "applies to period = \"week\" only".into(),
            ))
        }
        None => chrono::Weekday::Mon,
        Some(day) => day
            .parse::<chrono::Weekday>()
            .ok()
            .filter(|_| day.len() > 3)
            .ok_or_else(|| {
                (
                    limit_path("week_starts"),
                    format!("\"{day}\" is not a day of the week like \"monday\""),
                )
            })?,
    };
    let calendar = Calendar {
        period,
        timezone,
        week_starts,
    };
    Algorithm::calendar_quota(limit, calendar).map_err(|e| (field("limit"), e.to_string()))
}

/// A count as a config gives it: a whole number of at least 1. One beyond
/// what a u64 holds is out of every algorithm's range, which says so.
fn whole(number: f64) -> Result<u64, String> {
    if number.fract() != 0.0 || number < 1.0 {
        return Err(format!(
            "must be a whole number of at least 1 (got {number})"
        ));
    }
    // Whole and at least 1: the cast saturates only beyond u64::MAX.
    Ok(number as u64)
}

/// How long a concurrency slot is held unless renewed: long enough that
/// renewing costs little, short enough that an instance that died gives
/// its slots back within a minute.
const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// A limit's numbers as its algorithm's row of the table names them: the
/// quota a whole number, the period a rate per second or a window.
fn numbers(
    kind: Kind,
    own: &Numbers,
    base: Option<&Numbers>,
    path: &[&dyn AsSegment],
) -> Result<Algorithm, Invalid> {
    let spec = kind.spec();
    let field = |parameter: Parameter| key_path(path, parameter.name());
    if let Some(&foreign) = Parameter::ALL
        .iter()
        .find(|&&p| p != spec.quota && p != spec.period && own.has(p))
    {
        return Err((
            field(foreign),
            format!("`{}` does not apply to {}", foreign.name(), spec.name),
        ));
    }
    let needed = |parameter: Parameter| {
        (
            field(parameter),
            format!("{} needs `{}`", spec.name, parameter.name()),
        )
    };
    let number = |parameter: Parameter| {
        own.number(parameter)
            .or_else(|| base.and_then(|b| b.number(parameter)))
            .ok_or_else(|| needed(parameter))
    };
    let quota = whole(number(spec.quota)?).map_err(|m| (field(spec.quota), m))?;
    // Each range is the algorithm's, and so is its message, in the terms
    // of the file (per window, per second); a rate's is given what it got.
    let (algorithm, per_second) = if spec.period == Parameter::Window {
        let text = own
            .window
            .as_ref()
            .or_else(|| base.and_then(|b| b.window.as_ref()))
            .ok_or_else(|| needed(Parameter::Window))?;
        let window = duration::parse(text).map_err(|m| (field(Parameter::Window), m))?;
        if window < Duration::from_millis(1) {
            return Err((field(Parameter::Window), "must be at least 1ms".into()));
        }
        let window_us = u64::try_from(window.as_micros()).unwrap_or(u64::MAX);
        (Algorithm::new(kind, quota, window_us), None)
    } else {
        let per_second = number(spec.period)?;
        let algorithm = match kind {
            Kind::LeakyBucket => Algorithm::leaky_bucket_per_second(quota, per_second),
            _ => Algorithm::token_bucket_per_second(quota, per_second),
        };
        (algorithm, Some(per_second))
    };
    algorithm.map_err(|e| {
        let message = match (e, per_second) {
            (AlgorithmError::RateOutOfRange { .. }, Some(got)) => format!("{e} (got {got})"),
            _ => e.to_string(),
        };
        (field(e.parameter(kind)), message)
    })
}
