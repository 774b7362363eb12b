//! Limits of the rate limit service: what `match = { domain, descriptors }`
//! matches, and what a limit on Envoy's descriptors may be.

use super::file::{AlgorithmName, LimitSection, MatchSection, CONCURRENCY};
use super::source::Segment;
use super::{at, key_path, AsSegment, Invalid};
use floodgate_algorithm::Kind;
use floodgate_policy::{
    DescriptorPattern, EntryPattern, KeySource, PathPattern, MAX_DESCRIPTOR_TEXT, MAX_ENTRIES,
};

/// `match = { domain, descriptors }`: a limit of the rate limit service,
/// matched by Envoy's descriptors rather than by HTTP requests.
pub(super) fn descriptor_match(
    m: &MatchSection,
    path: &[&dyn AsSegment],
) -> Result<DescriptorPattern, Invalid> {
    let here = |key: &str| key_path(path, key);
    let http = [
        ("methods", !m.methods.is_empty()),
        ("paths", !m.paths.is_empty()),
        ("hosts", !m.hosts.is_empty()),
        ("headers", !m.headers.is_empty()),
        ("body", !m.body.is_empty()),
    ];
    if let Some((key, _)) = http.iter().find(|(_, given)| *given) {
        return Err((
            here(key),
            format!(
                "a limit on a domain's descriptors meets no HTTP request: `{key}` does not apply"
            ),
        ));
    }
    let domain = m.domain.as_deref().ok_or_else(|| {
        (
            here("descriptors"),
            "descriptors belong to a domain: set `domain` too, as Envoy's ratelimit filter names it".to_string(),
        )
    })?;
    if domain.is_empty() || domain.len() > MAX_DESCRIPTOR_TEXT {
        return Err((
            here("domain"),
            format!("must be 1 to {MAX_DESCRIPTOR_TEXT} characters"),
        ));
    }
    if m.descriptors.is_empty() || m.descriptors.len() > MAX_ENTRIES {
        return Err((
            here("descriptors"),
            format!("name the descriptor's entries in order, 1 to {MAX_ENTRIES} of them, e.g. [[\"remote_address\"], [\"path\", \"/login\"]]"),
        ));
    }
    let mut entries: Vec<EntryPattern> = Vec::with_capacity(m.descriptors.len());
    for (j, entry) in m.descriptors.iter().enumerate() {
        let at_entry = || {
            let mut p: Vec<Segment> = path.iter().map(|s| s.segment()).collect();
            p.push(Segment::Key("descriptors".into()));
            p.push(Segment::Index(j));
            p
        };
        let (key, value) = match entry.as_slice() {
            [key] => (key, None),
            [key, value] => (key, Some(value)),
            _ => {
                return Err((
                    at_entry(),
                    "an entry is [key] (any value) or [key, value] (that value; '*' for any run of characters)".into(),
                ))
            }
        };
        if key.is_empty() || key.len() > MAX_DESCRIPTOR_TEXT {
            return Err((
                at_entry(),
                format!("an entry's key must be 1 to {MAX_DESCRIPTOR_TEXT} characters"),
            ));
        }
        if entries.iter().any(|e| *e.key == **key) {
            return Err((
                at_entry(),
                format!("\"{key}\" is named twice: a `descriptor:{key}` key could not tell which"),
            ));
        }
        entries.push(EntryPattern {
            key: key.as_str().into(),
            value: value.map(|v| PathPattern::glob(v)),
        });
    }
    Ok(DescriptorPattern {
        domain: domain.into(),
        entries,
    })
}

/// What a limit of the rate limit service may be: a rate over time, keyed
/// on its descriptor's entries (or on everyone), and none of what needs an
/// HTTP exchange (a response to count, a request to hold or to delay) or
/// a client floodgate knows (tiers, bans).
pub(super) fn descriptor_limit(
    i: usize,
    s: &LimitSection,
    key: &KeySource,
    pattern: &DescriptorPattern,
) -> Result<(), Invalid> {
    let limit: [&dyn AsSegment; 2] = [&"limits", &i];
    let refuse = |field: &str, why: &str| -> Result<(), Invalid> {
        Err((
            key_path(&limit, field),
            format!("`{field}` does not apply to a limit on descriptors: {why}"),
        ))
    };
    match s.algorithm {
        AlgorithmName::Concurrency => {
            return Err((
                key_path(&limit, "algorithm"),
                format!("{CONCURRENCY} does not apply to a limit on descriptors: Envoy asks once per request and never says when it ends"),
            ));
        }
        AlgorithmName::Rate(Kind::LeakyBucket) => {
            return Err((
                key_path(&limit, "algorithm"),
                "leaky_bucket does not apply to a limit on descriptors: Envoy cannot hold a request until its slot; use token_bucket".to_string(),
            ));
        }
        AlgorithmName::Rate(_) => {}
    }
    if s.count.is_some() {
        return refuse("count", "the rate limit service never sees the response");
    }
    if s.cost_from_response.is_some() {
        return refuse("cost_from_response", "the rate limit service never sees the response; the cost is the hits_addend Envoy sends");
    }
    if s.ban.is_some() {
        return refuse(
            "ban",
            "Envoy's descriptors say nothing floodgate can ban on every route",
        );
    }
    if !s.tiers.is_empty() {
        return refuse("tiers", "a descriptor carries no API key or token, so no tier; give each tier its own descriptor");
    }
    if s.on_missing.is_some() {
        return refuse(
            "on_missing",
            "a descriptor the limit matches carries every entry its key reads",
        );
    }
    if s.case_insensitive_values {
        return refuse(
            "case_insensitive_values",
            "entries are compared as Envoy sends them",
        );
    }
    let parts: &[KeySource] = match key {
        KeySource::Composite(parts) => parts,
        one => std::slice::from_ref(one),
    };
    for (j, part) in parts.iter().enumerate() {
        let key_at: Vec<&dyn AsSegment> = match key {
            KeySource::Composite(_) => vec![&"limits", &i, &"key", &j],
            _ => vec![&"limits", &i, &"key"],
        };
        match part {
            KeySource::Global | KeySource::Descriptor => {}
            KeySource::Entry(name) if pattern.names(name) => {}
            KeySource::Entry(name) => {
                let named: Vec<&str> = pattern.entries.iter().map(|e| &*e.key).collect();
                return Err(at(
                    &key_at,
                    format!(
                        "the descriptor has no entry \"{name}\" (its entries: {})",
                        named.join(", ")
                    ),
                ));
            }
            other => {
                return Err(at(
                    &key_at,
                    format!(
                        "{} reads an HTTP request, which a limit on descriptors never sees: key it on \"descriptor:<key>\", \"descriptor\" or \"global\"",
                        other.describe()
                    ),
                ))
            }
        }
    }
    Ok(())
}
