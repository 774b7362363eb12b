//! The globs limits match with: paths, header values, descriptor values.

/// A path glob: `*` stands for any run of characters, `/` included. It
/// matches its path with or without one trailing slash, as common routers
/// (Express, Rails) treat the two alike. Paths are normalised (`path`) before
/// they are matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    pattern: String,
}

impl PathPattern {
    /// A glob matched as it is written (a header value's).
    pub fn glob(pattern: &str) -> Self {
        PathPattern {
            pattern: pattern.to_string(),
        }
    }

    /// A path pattern: a trailing slash dropped (but `/` kept), since the
    /// pattern matches with or without one.
    pub fn new(pattern: &str) -> Self {
        let pattern = match pattern.strip_suffix('/') {
            Some(stem) if !stem.is_empty() => stem,
            _ => pattern,
        };
        PathPattern {
            pattern: pattern.to_string(),
        }
    }

    /// Whether the (normalised) path matches, with or without one trailing
    /// slash: `/login` matches `/login` and `/login/`.
    pub fn matches(&self, path: &str) -> bool {
        self.matches_exactly(path)
            || path
                .strip_suffix('/')
                .is_some_and(|stem| !stem.is_empty() && self.matches_exactly(stem))
    }

    /// The glob against `text` as it is (no trailing-slash leniency).
    pub fn matches_exactly(&self, path: &str) -> bool {
        let mut parts = self.pattern.split('*');
        let first = parts.next().unwrap_or("");
        let Some(mut rest) = path.strip_prefix(first) else {
            return false;
        };
        let parts: Vec<&str> = parts.collect();
        let Some((last, middle)) = parts.split_last() else {
            return rest.is_empty();
        };
        for part in middle {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last)
    }

    /// The glob as it is matched (a path pattern without its trailing slash).
    pub fn as_str(&self) -> &str {
        &self.pattern
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_globs() {
        let cases = [
            ("/login", "/login", true),
            ("/login", "/login/", true),
            ("/login/", "/login", true),
            ("/login", "/login//", false),
            ("/", "/", true),
            ("/", "/x", false),
            ("/otp/*", "/otp/123", true),
            ("/otp/*", "/otp/", true),
            ("/otp/*", "/otp", false),
            ("/search*", "/search", true),
            ("/search*", "/searches/x", true),
            ("/v*/items", "/v2/items", true),
            ("/v*/items", "/v2/items/1", false),
            ("*", "/anything", true),
            ("/a*b*c", "/abc", true),
            ("/a*b*c", "/ab", false),
            ("/a*a", "/a", false),
        ];
        for (pattern, path, expected) in cases {
            assert_eq!(
                PathPattern::new(pattern).matches(path),
                expected,
                "{pattern} vs {path}"
            );
        }
    }

    #[test]
    fn a_middle_part_is_passed_before_the_last_is_looked_for() {
        // The last "b" may not be the middle one.
        assert!(!PathPattern::glob("/x*b*b").matches_exactly("/xab"));
        assert!(PathPattern::glob("/x*b*b").matches_exactly("/xabb"));
        assert!(PathPattern::glob("/x*bc*d").matches_exactly("/xabcd"));
        assert!(!PathPattern::glob("/x*bc*c").matches_exactly("/xabc"));
    }

    #[test]
    fn a_pattern_is_kept_as_written_but_for_a_path_patterns_trailing_slash() {
        assert_eq!(PathPattern::new("/login/").as_str(), "/login");
        assert_eq!(PathPattern::new("/").as_str(), "/");
        assert_eq!(PathPattern::glob("/login/").as_str(), "/login/");
        assert!(!PathPattern::glob("/login/").matches_exactly("/login"));
    }
}
