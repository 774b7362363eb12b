//! Limits for Envoy's rate limit service: a request names a `domain` and
//! descriptors (ordered lists of key/value entries), and a limit applies to
//! a descriptor its pattern matches, entry for entry, as envoyproxy/ratelimit
//! walks its tree of nested descriptors.

use std::net::IpAddr;

use crate::glob::PathPattern;

/// The most entries a descriptor pattern names, and a descriptor of a
/// request may carry: Envoy's actions build a handful.
pub const MAX_ENTRIES: usize = 32;

/// The longest domain and entry key a pattern names.
pub const MAX_DESCRIPTOR_TEXT: usize = 256;

/// The entry Envoy's `remote_address` action writes: the client's address
/// as Envoy resolved it.
pub const REMOTE_ADDRESS: &str = "remote_address";

/// The address a `remote_address` entry's value spells, in any of its
/// spellings (case, omitted or padded zeros, `::ffff:a.b.c.d` for the IPv4
/// client it carries); none for another entry or a value that is no
/// address. A caller that could send its address as several texts would
/// otherwise get a budget for each.
pub fn remote_address(key: &str, value: &str) -> Option<IpAddr> {
    if key != REMOTE_ADDRESS {
        return None;
    }
    let ip: IpAddr = value.parse().ok()?;
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    })
}

/// One entry of a descriptor pattern: `["remote_address"]` (any value, each
/// value its own budget when the key reads it) or `["path", "/login"]` (that
/// value only; `*` stands for any run of characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPattern {
    /// The entry's key, which a descriptor's entry must name exactly.
    pub key: Box<str>,
    /// The value the entry must have (a glob); none for any value.
    pub value: Option<PathPattern>,
}

impl EntryPattern {
    fn matches(&self, key: &str, value: &str) -> bool {
        if *self.key != *key {
            return false;
        }
        let Some(glob) = &self.value else {
            return true;
        };
        if glob.matches_exactly(value) {
            return true;
        }
        // An address the pattern names is met in every spelling of it.
        match (
            remote_address(key, glob.as_str()),
            remote_address(key, value),
        ) {
            (Some(named), Some(sent)) => named == sent,
            _ => false,
        }
    }
}

/// `match = { domain = "edge", descriptors = [[...], ...] }`: the domain,
/// and one descriptor's entries in order. A descriptor matches when it has
/// exactly these entries, in this order: `[a]` and `[a, b]` are two
/// limits, as they are two leaves in envoyproxy/ratelimit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorPattern {
    /// The domain a request must name exactly.
    pub domain: Box<str>,
    /// The descriptor's entries, in the order it must carry them.
    pub entries: Vec<EntryPattern>,
}

/// One descriptor of a request, as Envoy sent it.
pub type Entries<'a> = [(&'a str, &'a str)];

impl DescriptorPattern {
    /// Whether a request naming `domain` with this descriptor meets the
    /// pattern: the same domain and, entry for entry, in order, the same keys
    /// with values the pattern allows.
    pub fn matches(&self, domain: &str, entries: &Entries<'_>) -> bool {
        *self.domain == *domain
            && self.entries.len() == entries.len()
            && self
                .entries
                .iter()
                .zip(entries)
                .all(|(pattern, (key, value))| pattern.matches(key, value))
    }

    /// How specific the pattern is, entry by entry, first entry first: a
    /// value named exactly before a glob before any value. Of the limits
    /// a descriptor matches, only the most specific apply, as
    /// envoyproxy/ratelimit tries a key and value before the key alone:
    /// `[["remote_address", "50.0.0.5"]]` overrides `[["remote_address"]]`
    /// for that address, tighter or looser.
    pub fn specificity(&self) -> u64 {
        // Two bits an entry, the first in the highest: MAX_ENTRIES (32)
        // entries fill the word, and comparing words compares entries in
        // order, without an allocation per call.
        self.entries
            .iter()
            .take(MAX_ENTRIES)
            .enumerate()
            .fold(0, |word, (i, e)| {
                let rank: u64 = match &e.value {
                    None => 0,
                    Some(glob) if glob.as_str().contains('*') => 1,
                    Some(_) => 2,
                };
                word | rank << (2 * (MAX_ENTRIES - 1 - i))
            })
    }

    /// Whether the pattern names entry `key` (which a `descriptor:<key>`
    /// key may then read).
    pub fn names(&self, key: &str) -> bool {
        self.entries.iter().any(|e| *e.key == *key)
    }

    /// The pattern as `floodgate check` and the logs show it:
    /// `domain edge descriptor [remote_address, path=/login]`.
    pub fn describe(&self) -> String {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|e| match &e.value {
                Some(value) => format!("{}={}", e.key, value.as_str()),
                None => e.key.to_string(),
            })
            .collect();
        format!("domain {} descriptor [{}]", self.domain, entries.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(domain: &str, entries: &[(&str, Option<&str>)]) -> DescriptorPattern {
        DescriptorPattern {
            domain: domain.into(),
            entries: entries
                .iter()
                .map(|&(key, value)| EntryPattern {
                    key: key.into(),
                    value: value.map(PathPattern::glob),
                })
                .collect(),
        }
    }

    #[test]
    fn a_descriptor_matches_entry_for_entry_in_order_and_length() {
        let login = pattern(
            "edge",
            &[("remote_address", None), ("path", Some("/login"))],
        );
        let cases: [(&str, &Entries<'_>, bool); 7] = [
            (
                "edge",
                &[("remote_address", "10.0.0.1"), ("path", "/login")],
                true,
            ),
            (
                "edge",
                &[("remote_address", "10.0.0.2"), ("path", "/login")],
                true,
            ),
            (
                "edge",
                &[("remote_address", "10.0.0.1"), ("path", "/logout")],
                false,
            ),
            // Order matters, as it does in envoyproxy/ratelimit's tree.
            (
                "edge",
                &[("path", "/login"), ("remote_address", "10.0.0.1")],
                false,
            ),
            // A prefix or an extension of the pattern is another descriptor.
            ("edge", &[("remote_address", "10.0.0.1")], false),
            (
                "edge",
                &[
                    ("remote_address", "10.0.0.1"),
                    ("path", "/login"),
                    ("x", "y"),
                ],
                false,
            ),
            (
                "other",
                &[("remote_address", "10.0.0.1"), ("path", "/login")],
                false,
            ),
        ];
        for (domain, entries, expected) in cases {
            assert_eq!(
                login.matches(domain, entries),
                expected,
                "{domain} {entries:?}"
            );
        }
    }

    #[test]
    fn a_named_value_is_more_specific_than_a_glob_than_any_value() {
        let any = pattern(
            "edge",
            &[("remote_address", None), ("path", Some("/login"))],
        );
        let glob = pattern("edge", &[("remote_address", Some("10.*")), ("path", None)]);
        let exact = pattern(
            "edge",
            &[("remote_address", Some("10.0.0.1")), ("path", None)],
        );
        assert!(exact.specificity() > glob.specificity());
        assert!(glob.specificity() > any.specificity());
    }

    #[test]
    fn a_remote_address_is_read_as_an_address_in_any_spelling() {
        let v6 = "2001:db8::1".parse::<IpAddr>().ok();
        for spelling in [
            "2001:DB8::1",
            "2001:db8:0::1",
            "2001:0db8:0000:0000:0000:0000:0000:0001",
        ] {
            assert_eq!(remote_address(REMOTE_ADDRESS, spelling), v6, "{spelling}");
        }
        let v4 = "192.0.2.7".parse::<IpAddr>().ok();
        for spelling in ["192.0.2.7", "::ffff:192.0.2.7", "::FFFF:C000:207"] {
            assert_eq!(remote_address(REMOTE_ADDRESS, spelling), v4, "{spelling}");
        }
        // No address: a zone, brackets, a port, octal-looking zeros, text.
        for text in [
            "fe80::1%eth0",
            "[2001:db8::1]",
            "192.0.2.7:80",
            "010.0.0.1",
            "pipe:/x",
            "",
        ] {
            assert_eq!(remote_address(REMOTE_ADDRESS, text), None, "{text}");
        }
        assert_eq!(remote_address("x_forwarded_for", "192.0.2.7"), None);
        // A pattern that names an address meets its other spellings, and
        // only those.
        let partner = pattern("edge", &[("remote_address", Some("203.0.113.7"))]);
        assert!(partner.matches("edge", &[("remote_address", "::ffff:203.0.113.7")]));
        assert!(!partner.matches("edge", &[("remote_address", "203.0.113.8")]));
        let glob = pattern("edge", &[("remote_address", Some("10.*"))]);
        assert!(glob.matches("edge", &[("remote_address", "10.1.2.3")]));
        assert!(!glob.matches("edge", &[("remote_address", "::ffff:10.1.2.3")]));
    }

    #[test]
    fn a_pattern_names_exactly_the_keys_of_its_entries() {
        let login = pattern(
            "edge",
            &[("remote_address", None), ("path", Some("/login"))],
        );
        assert!(login.names("remote_address"));
        assert!(login.names("path"));
        assert!(!login.names("Path"));
        assert!(!login.names("user"));
        assert!(!pattern("edge", &[]).names("path"));
    }

    #[test]
    fn a_value_glob_matches_whole_values_only() {
        let api = pattern("edge", &[("path", Some("/api/*"))]);
        assert!(api.matches("edge", &[("path", "/api/users")]));
        assert!(!api.matches("edge", &[("path", "/apix")]));
        assert!(!api.matches("edge", &[("path", "/x/api/users")]));
        // The key is compared as written: Envoy's keys are case-sensitive.
        assert!(!api.matches("edge", &[("Path", "/api/users")]));
    }
}
