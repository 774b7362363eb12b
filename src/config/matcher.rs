//! `match = { ... }`: which requests a limit, a `[[costs]]` table or a
//! protection class applies to (its methods, paths, hosts, headers and body
//! fields), and the path patterns they are compared with.

use http::{HeaderName, Method};

use super::descriptors::descriptor_match;
use super::file::{MatchSection, OneOrMany};
use super::source::Segment;
use super::{AsSegment, Invalid};
use floodgate_policy::path::{EscapedSlashes, PathRules};
use floodgate_policy::{HostPattern, LimitMatch, Matcher, PathPattern};

/// A pattern is matched against normalised paths, so it is normalised too
/// (`/%7euser/*` is `/~user/*`); one that cannot be is refused rather than
/// left to match nothing.
fn path_pattern(p: &str) -> Result<PathPattern, String> {
    if p.starts_with('*') {
        return Ok(PathPattern::new(p));
    }
    if !p.starts_with('/') {
        return Err(format!("\"{p}\" must start with '/' (or '*')"));
    }
    let canonical = floodgate_policy::path::normalize(p.as_bytes(), EscapedSlashes::Keep)
        .map_err(|e| format!("\"{p}\" is not a path a request can have: {e}"))?;
    Ok(PathPattern::new(&canonical))
}

/// Patterns are matched against paths as `[server]` says requests' paths are
/// read: case-insensitive matching compares lower-cased paths with
/// lower-cased patterns.
pub(super) fn pattern_compiler(paths: &PathRules) -> impl Fn(&str) -> Result<PathPattern, String> {
    let case_insensitive = paths.case_insensitive;
    move |p: &str| {
        if case_insensitive {
            path_pattern(&p.to_ascii_lowercase())
        } else {
            path_pattern(p)
        }
    }
}

/// The `match` table at `path`: on Envoy's descriptors when it names a
/// `domain` or `descriptors`, else on HTTP requests.
pub(super) fn validate_match(
    m: &MatchSection,
    path: &[&dyn AsSegment],
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<LimitMatch, Invalid> {
    if m.domain.is_some() || !m.descriptors.is_empty() {
        return Ok(LimitMatch::Descriptors(descriptor_match(m, path)?));
    }
    let methods = methods(m, path)?;
    let paths = m
        .paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            compile_pattern(p).map_err(|msg| (under(path, "paths", Segment::Index(i)), msg))
        })
        .collect::<Result<_, _>>()?;
    let hosts = hosts(m, path)?;
    let headers = headers(m, path)?;
    let body = body(m, path)?;
    Ok(LimitMatch::Http(Matcher {
        methods,
        paths,
        hosts,
        headers,
        body,
    }))
}

/// `path`, then `key`, then `entry`: where an error about one entry of a
/// list or table of the match points.
fn under(path: &[&dyn AsSegment], key: &str, entry: Segment) -> Vec<Segment> {
    let mut p: Vec<Segment> = path.iter().map(|s| s.segment()).collect();
    p.push(Segment::Key(key.into()));
    p.push(entry);
    p
}

fn methods(m: &MatchSection, path: &[&dyn AsSegment]) -> Result<Vec<Method>, Invalid> {
    m.methods
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let upper = name.to_ascii_uppercase();
            match Method::from_bytes(upper.as_bytes()) {
                Ok(method) if !name.is_empty() => Ok(method),
                _ => Err((
                    under(path, "methods", Segment::Index(i)),
                    format!("\"{name}\" is not an HTTP method"),
                )),
            }
        })
        .collect()
}

fn hosts(m: &MatchSection, path: &[&dyn AsSegment]) -> Result<Vec<HostPattern>, Invalid> {
    m.hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let name = h.strip_prefix("*.").unwrap_or(h);
            // No port: hosts are compared without one.
            let valid = !name.is_empty()
                && (name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
                    || (name.starts_with('[') && name.ends_with(']')));
            if valid {
                Ok(HostPattern::new(h))
            } else {
                Err((
                    under(path, "hosts", Segment::Index(i)),
                    format!("\"{h}\" is not a host name without port (or \"*.\" and a domain)"),
                ))
            }
        })
        .collect()
}

fn headers(
    m: &MatchSection,
    path: &[&dyn AsSegment],
) -> Result<Vec<(HeaderName, PathPattern)>, Invalid> {
    m.headers
        .iter()
        .map(|(name, glob)| {
            let at = under(path, "headers", Segment::Key(name.clone()));
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| (at, format!("\"{name}\" is not a valid header name")))?;
            Ok((name, PathPattern::glob(glob)))
        })
        .collect()
}

/// Each field `body` names, with its patterns, as `Matcher` holds them.
type BodyFields = Vec<(Box<str>, Vec<PathPattern>)>;

/// `body`: top-level fields of the JSON body, each with one pattern or more.
fn body(m: &MatchSection, path: &[&dyn AsSegment]) -> Result<BodyFields, Invalid> {
    m.body
        .iter()
        .map(|(field, patterns)| {
            let at = under(path, "body", Segment::Key(field.clone()));
            if field.is_empty() {
                return Err((
                    at,
                    "name a top-level field of the JSON body, like `model`".into(),
                ));
            }
            let globs: Vec<PathPattern> = match patterns {
                OneOrMany::One(glob) => vec![PathPattern::glob(glob)],
                OneOrMany::Many(globs) => globs.iter().map(|g| PathPattern::glob(g)).collect(),
            };
            if globs.is_empty() {
                return Err((at, "give at least one pattern".into()));
            }
            Ok((field.as_str().into(), globs))
        })
        .collect()
}
