//! `[upstream.protection]`: the adaptive limit on requests in flight to the
//! upstream, and the order in which tiers are shed.

use std::time::Duration;

use super::file::{PriorityEntry, ProtectionSection, QueueSection};
use super::matcher::validate_match;
use super::source::Segment;
use super::{at, duration, key_path, AsSegment, Invalid};
use crate::protection::controller::ControllerSettings;
use crate::protection::{PriorityClass, ProtectionSettings, QueueSettings};
use floodgate_policy::identity::Tiers;
use floodgate_policy::{LimitMatch, Matcher, PathPattern};

pub(super) fn validate_protection(
    p: &ProtectionSection,
    tiers: &Tiers,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<ProtectionSettings, Invalid> {
    let controller = controller(p)?;
    let reserve = reserve(p)?;
    let priority = priority(p, tiers, compile_pattern)?;
    let queue = p.queue.as_ref().map(queue).transpose()?;
    Ok(ProtectionSettings {
        controller,
        priority,
        reserve,
        queue,
        retry_after: duration(
            &p.retry_after,
            Duration::from_secs(1),
            &[&"upstream", &"protection", &"retry_after"],
        )?,
    })
}

fn here(key: &str) -> Vec<Segment> {
    key_path(&[&"upstream", &"protection"], key)
}

fn fail(key: &str, message: &str) -> Invalid {
    (here(key), message.to_string())
}

/// The limit's bounds and where it starts, and how the controller moves it:
/// the latency it tolerates, its window and how often it probes upwards.
fn controller(p: &ProtectionSection) -> Result<ControllerSettings, Invalid> {
    let count = |value: Option<i64>, default: u32, key: &'static str| -> Result<u32, Invalid> {
        value.map_or(Ok(default), |n| {
            u32::try_from(n)
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .ok_or_else(|| fail(key, "must be a whole number from 1 to 1000000"))
        })
    };
    let min = count(p.min, 1, "min")?;
    let max = count(p.max, 1_000, "max")?;
    if min > max {
        return Err(fail("min", &format!("must be at most `max` ({max})")));
    }
    let initial = count(p.initial, 20.clamp(min, max), "initial")?;
    if !(min..=max).contains(&initial) {
        return Err(fail(
            "initial",
            &format!("must be from `min` ({min}) to `max` ({max})"),
        ));
    }
    let tolerance = p.latency_tolerance.unwrap_or(1.2);
    if !(1.0..=10.0).contains(&tolerance) {
        return Err(fail(
            "latency_tolerance",
            "must be from 1.0 (no latency above the minimum) to 10.0",
        ));
    }
    let window = duration(
        &p.window,
        Duration::from_millis(250),
        &[&"upstream", &"protection", &"window"],
    )?;
    let probe_interval = duration(
        &p.probe_interval,
        Duration::from_secs(30),
        &[&"upstream", &"protection", &"probe_interval"],
    )?;
    if window.is_zero() || probe_interval <= window {
        return Err(fail(
            "probe_interval",
            "the window must be longer than 0, and probes further apart than a window",
        ));
    }
    let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    Ok(ControllerSettings {
        min,
        max,
        initial,
        tolerance,
        window_us: micros(window),
        probe_interval_us: micros(probe_interval),
    })
}

fn reserve(p: &ProtectionSection) -> Result<f64, Invalid> {
    let reserve = p.reserve.unwrap_or(0.2);
    if !(0.0..1.0).contains(&reserve) {
        return Err(fail(
            "reserve",
            "must be from 0.0 (every class shares the whole limit) to below 1.0",
        ));
    }
    Ok(reserve)
}

/// `priority`: the classes, each listed once.
fn priority(
    p: &ProtectionSection,
    tiers: &Tiers,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<Vec<PriorityClass>, Invalid> {
    let mut priority: Vec<PriorityClass> = Vec::with_capacity(p.priority.len());
    for (i, entry) in p.priority.iter().enumerate() {
        let class = priority_class(i, entry, tiers, compile_pattern)?;
        if priority.iter().any(|c| c.name() == class.name()) {
            return Err(at(
                &[&"upstream", &"protection", &"priority", &i],
                format!("\"{}\" is listed twice", class.name()),
            ));
        }
        priority.push(class);
    }
    Ok(priority)
}

/// One class of `priority`: a known tier, or a named match on the
/// request's head.
fn priority_class(
    i: usize,
    entry: &PriorityEntry,
    tiers: &Tiers,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<PriorityClass, Invalid> {
    match entry {
        PriorityEntry::Tier(name) => {
            let Some(tier) = tiers.get(name) else {
                let known: Vec<&str> = tiers.names().collect();
                return Err(at(
                    &[&"upstream", &"protection", &"priority", &i],
                    format!("\"{name}\" is no tier (known: {})", known.join(", ")),
                ));
            };
            Ok(PriorityClass::Tier(tier))
        }
        PriorityEntry::Match { name, matcher } => {
            let path: [&dyn AsSegment; 5] = [&"upstream", &"protection", &"priority", &i, &"match"];
            let head_only = |matcher: &Matcher| matcher.body.is_empty();
            let matcher =
                match validate_match(matcher, &path, compile_pattern)? {
                    LimitMatch::Http(matcher) if head_only(&matcher) => matcher,
                    _ => return Err(at(
                        &path,
                        "a class is matched by the request's head: methods, paths, hosts, headers",
                    )),
                };
            if name.is_empty() || tiers.get(name).is_some() {
                return Err(at(
                    &[&"upstream", &"protection", &"priority", &i, &"name"],
                    "name the class, with a name that is no tier's",
                ));
            }
            Ok(PriorityClass::Match {
                name: name.as_str().into(),
                matcher,
            })
        }
    }
}

fn queue(q: &QueueSection) -> Result<QueueSettings, Invalid> {
    let at_queue = |key: &str| key_path(&[&"upstream", &"protection", &"queue"], key);
    let max = usize::try_from(q.max)
        .ok()
        .filter(|m| (1..=100_000).contains(m))
        .ok_or_else(|| {
            (
                at_queue("max"),
                "must be a whole number from 1 to 100000".to_string(),
            )
        })?;
    let timeout = duration(
        &q.timeout,
        Duration::from_millis(250),
        &[&"upstream", &"protection", &"queue", &"timeout"],
    )?;
    // A wait counts against the client's own deadline, which is
    // seconds for most clients: a queue holds a burst, not a backlog.
    if timeout.is_zero() || timeout > Duration::from_secs(10) {
        return Err((
            at_queue("timeout"),
            "must be longer than 0 and at most 10s: a wait counts against the client's own deadline".into(),
        ));
    }
    Ok(QueueSettings { max, timeout })
}
