//! One path for everyone: the request path in its canonical spelling, which
//! the limits match and the upstream receives, so that the limiter and the
//! application never disagree on which path a request is.
//!
//! Canonical means (RFC 3986, section 6.2.2, plus what routers do):
//! percent-encoded unreserved characters decoded (`%6C` is `l`), every other
//! escape in upper-case hex, characters that may not appear raw in a path
//! escaped, repeated slashes merged, `.` and `..` segments resolved (`..`
//! above the root is refused). A trailing slash is kept: the application may
//! tell `/a` from `/a/`, and the limits' patterns match both (see `policy`).
//!
//! A segment that is empty or a dot segment once its `;` parameters are
//! stripped (`..;`, `;x=1`) is refused: Tomcat and Spring strip parameters
//! before resolving dots, so `/public/..;/login` is `/login` to them.
//!
//! Encoded slashes and backslashes (`%2F`, `%5C`, and a raw `\`, which some
//! routers take as `/`) are ambiguous: one application splits segments on
//! them, another does not. `EscapedSlashes` chooses: refuse (the default),
//! keep them escaped, or decode them into `/`.

use std::borrow::Cow;

/// `[server].escaped_slashes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// 400: the request is never forwarded.
    #[default]
    Reject,
    /// Kept as `%2F` / `%5C`: a segment that contains one stays one segment.
    Keep,
    /// Decoded into `/` before segments and dots are resolved.
    Decode,
}

/// `[server]` path settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathRules {
    /// What `%2F`, `%5C` and a raw `\` do (`escaped_slashes`): refused,
    /// kept or decoded.
    pub escaped_slashes: EscapedSlashes,
    /// Limits match the path ignoring ASCII case (the upstream still gets it
    /// as sent, normalised).
    pub case_insensitive: bool,
}

/// Why a path cannot be normalised; the request gets a 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path does not start with `/`: the target is not a path.
    #[error("the path does not start with '/'")]
    NotAbsolute,
    /// A `%` not followed by two hex digits.
    #[error("a '%' is not followed by two hex digits")]
    BadPercentEncoding,
    /// `%2F`, `%5C` or a raw `\`, while `escaped_slashes` is `"reject"`
    /// (`escaped_slash`).
    #[error("an encoded slash or backslash (%2F, %5C) or a raw backslash is ambiguous")]
    EscapedSlash,
    /// A `..` segment above the root.
    #[error("'..' climbs above the root")]
    AboveRoot,
    /// A segment that is empty or a dot segment once its `;` parameters are
    /// stripped (`/x/..;/login`), which Tomcat and Spring would resolve.
    #[error("a segment is empty or a dot segment once its ';' parameters are stripped")]
    AmbiguousParameters,
    /// A query that is not a valid URI query (characters a URI may not hold).
    #[error("the query is not a valid URI query")]
    BadQuery,
}

impl PathError {
    /// The `error` of the 400's JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            PathError::EscapedSlash => "escaped_slash",
            _ => "bad_path",
        }
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// What may stand raw in a path segment besides unreserved characters
/// (RFC 3986 `sub-delims`, `:` and `@`).
fn is_raw_allowed(b: u8) -> bool {
    is_unreserved(b) || b"!$&'()*+,;=:@".contains(&b)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escaped(out: &mut Vec<u8>, b: u8) {
    out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
}

/// `..;x`, `.;x`, `;x`: a segment some servers read as a dot segment or an
/// empty one, once they strip its parameters.
fn is_ambiguous_with_parameters(segment: &[u8]) -> bool {
    match segment.iter().position(|&b| b == b';') {
        Some(at) => matches!(&segment[..at], b"" | b"." | b".."),
        None => false,
    }
}

/// Already canonical: the common case, answered without allocating.
fn is_canonical(path: &[u8]) -> bool {
    let Some(rest) = path.strip_prefix(b"/") else {
        return false;
    };
    // Each segment: non-empty (but for a final one: the trailing slash), not
    // a dot segment, and only bytes that may stand raw.
    let mut segments = rest.split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if (segment.is_empty() && !last)
            || segment == b"."
            || segment == b".."
            || is_ambiguous_with_parameters(segment)
            || !segment.iter().all(|&b| is_raw_allowed(b))
        {
            return false;
        }
    }
    true
}

/// The canonical spelling of `path` (the part of the request target before
/// any `?`).
pub fn normalize(path: &[u8], escaped: EscapedSlashes) -> Result<Cow<'_, str>, PathError> {
    if is_canonical(path) {
        // Only ASCII passes the check above.
        return Ok(Cow::Borrowed(std::str::from_utf8(path).unwrap_or_default()));
    }
    if path.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    // Step 1: one spelling per character. A slash that came from an escape
    // is marked so that step 2 treats it as a separator only in Decode mode.
    let mut decoded: Vec<u8> = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        let (byte, was_escaped) = if b == b'%' {
            let hi = path.get(i + 1).copied().and_then(hex_value);
            let lo = path.get(i + 2).copied().and_then(hex_value);
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(PathError::BadPercentEncoding);
            };
            i += 3;
            ((hi << 4) | lo, true)
        } else {
            i += 1;
            (b, false)
        };
        let slash_like = (byte == b'/' && was_escaped) || byte == b'\\';
        if slash_like {
            match escaped {
                EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                EscapedSlashes::Keep => push_escaped(&mut decoded, byte),
                EscapedSlashes::Decode => decoded.push(b'/'),
            }
        } else if byte == b'/' || is_unreserved(byte) || (!was_escaped && is_raw_allowed(byte)) {
            decoded.push(byte);
        } else {
            push_escaped(&mut decoded, byte);
        }
    }
    // Step 2: segments. Empty ones (repeated slashes) and `.` go; `..` takes
    // the previous one with it. A path that ends in a separator, `.` or `..`
    // names a directory and keeps its trailing slash.
    let mut segments: Vec<&[u8]> = Vec::new();
    let mut trailing_slash = false;
    for segment in decoded[1..].split(|&b| b == b'/') {
        trailing_slash = true;
        match segment {
            b"" | b"." => {}
            b".." => {
                if segments.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
            }
            _ if is_ambiguous_with_parameters(segment) => {
                return Err(PathError::AmbiguousParameters);
            }
            _ => {
                segments.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &segments {
        out.push('/');
        // Every byte is ASCII by now: escapes replaced the rest.
        out.push_str(std::str::from_utf8(segment).unwrap_or_default());
    }
    if trailing_slash || segments.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(path: &str) -> Result<String, PathError> {
        normalize(path.as_bytes(), EscapedSlashes::Reject).map(Cow::into_owned)
    }

    #[test]
    fn spellings_of_one_path_become_one() {
        for spelling in [
            "/login",
            "//login",
            "/%6Cogin",
            "/%6c%6f%67%69%6e",
            "/./login",
            "/x/../login",
            "/x/y/../../login",
            "///./x//..//login",
            "/%2e/login",
        ] {
            assert_eq!(norm(spelling).as_deref(), Ok("/login"), "{spelling}");
        }
        assert_eq!(norm("/login/").as_deref(), Ok("/login/"));
        assert_eq!(norm("/login//").as_deref(), Ok("/login/"));
        assert_eq!(norm("/a/b/.").as_deref(), Ok("/a/b/"));
        assert_eq!(norm("/a/b/..").as_deref(), Ok("/a/"));
        assert_eq!(norm("/").as_deref(), Ok("/"));
        assert_eq!(norm("//").as_deref(), Ok("/"));
        assert_eq!(norm("/a/..").as_deref(), Ok("/"));
    }

    #[test]
    fn escapes_are_upper_case_and_only_where_needed() {
        assert_eq!(norm("/a%2fb"), Err(PathError::EscapedSlash));
        assert_eq!(norm("/a%20b").as_deref(), Ok("/a%20b"));
        assert_eq!(norm("/a%3ab").as_deref(), Ok("/a%3Ab"));
        assert_eq!(norm("/a b").as_deref(), Ok("/a%20b"));
        assert_eq!(norm("/a{b}").as_deref(), Ok("/a%7Bb%7D"));
        assert_eq!(norm("/caf\u{e9}").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(norm("/a;b=c@d").as_deref(), Ok("/a;b=c@d"));
        assert_eq!(norm("/%7e").as_deref(), Ok("/~"));
    }

    #[test]
    fn what_cannot_be_normalised_is_refused() {
        assert_eq!(norm("/a%"), Err(PathError::BadPercentEncoding));
        assert_eq!(norm("/a%4"), Err(PathError::BadPercentEncoding));
        assert_eq!(norm("/a%zz"), Err(PathError::BadPercentEncoding));
        assert_eq!(norm("/.."), Err(PathError::AboveRoot));
        assert_eq!(norm("/a/../.."), Err(PathError::AboveRoot));
        assert_eq!(norm("/%2e%2e/login"), Err(PathError::AboveRoot));
        assert_eq!(norm("login"), Err(PathError::NotAbsolute));
        assert_eq!(norm("/a\\..\\login"), Err(PathError::EscapedSlash));
        assert_eq!(norm("/a%5Clogin"), Err(PathError::EscapedSlash));
        for tomcat in [
            "/x/..;/login",
            "/;/login",
            "/;x=1/login",
            "/x/.;y/login",
            "/x/%2e%2e;/login",
        ] {
            assert_eq!(
                norm(tomcat),
                Err(PathError::AmbiguousParameters),
                "{tomcat}"
            );
        }
        assert_eq!(
            norm("/login;jsessionid=1").as_deref(),
            Ok("/login;jsessionid=1")
        );
    }

    #[test]
    fn escaped_slashes_can_be_kept_or_decoded() {
        let keep = |p: &str| normalize(p.as_bytes(), EscapedSlashes::Keep).map(Cow::into_owned);
        let decode = |p: &str| normalize(p.as_bytes(), EscapedSlashes::Decode).map(Cow::into_owned);
        assert_eq!(keep("/a%2fb/..%2F").as_deref(), Ok("/a%2Fb/..%2F"));
        assert_eq!(keep("/a\\b").as_deref(), Ok("/a%5Cb"));
        assert_eq!(decode("/public/..%2Flogin").as_deref(), Ok("/login"));
        assert_eq!(decode("/public\\..\\login").as_deref(), Ok("/login"));
        assert_eq!(decode("/a%2F%2Fb").as_deref(), Ok("/a/b"));
    }

    #[test]
    fn a_canonical_path_is_borrowed_and_any_other_is_rebuilt() {
        for canonical in ["/", "/login", "/login/", "/a/b", "/a/b/", "/a;b=c@d/~x"] {
            let got = normalize(canonical.as_bytes(), EscapedSlashes::Reject);
            assert!(
                matches!(got, Ok(Cow::Borrowed(p)) if p == canonical),
                "{canonical}: {got:?}"
            );
        }
        for other in ["//a", "/a//b", "/./a", "/a/../b", "/a%41", "/a b", "/;x/a"] {
            let got = normalize(other.as_bytes(), EscapedSlashes::Keep);
            assert!(!matches!(got, Ok(Cow::Borrowed(_))), "{other}: {got:?}");
        }
    }

    #[test]
    fn an_escaped_slash_has_its_own_error_code() {
        assert_eq!(PathError::EscapedSlash.code(), "escaped_slash");
        for other in [
            PathError::NotAbsolute,
            PathError::BadPercentEncoding,
            PathError::AboveRoot,
            PathError::AmbiguousParameters,
            PathError::BadQuery,
        ] {
            assert_eq!(other.code(), "bad_path", "{other:?}");
        }
    }

    /// A random canonical path: segments of unreserved and raw-allowed
    /// characters (no dot segments).
    fn canonical_path() -> impl Strategy<Value = String> {
        let segment = "[a-zA-Z0-9._~!$&'()*+,;=:@-]{1,8}".prop_filter("not a dot segment", |s| {
            s != "." && s != ".." && !is_ambiguous_with_parameters(s.as_bytes())
        });
        (prop::collection::vec(segment, 0..6), any::<bool>()).prop_map(|(segments, slash)| {
            let mut path = String::new();
            for s in &segments {
                path.push('/');
                path.push_str(s);
            }
            if slash || segments.is_empty() {
                path.push('/');
            }
            path
        })
    }

    /// Another spelling of `path`: characters escaped in either case, extra
    /// slashes, `.` segments and `x/..` detours, chosen by `noise`.
    fn respell(path: &str, noise: &[u8]) -> String {
        let mut out = String::new();
        let mut n = noise.iter().cycle();
        let mut next = || n.next().copied().unwrap_or(0);
        for c in path.chars() {
            let choice = next() % 8;
            if c == '/' {
                out.push('/');
                match choice {
                    0 => out.push('/'),
                    1 => out.push_str("./"),
                    2 => out.push_str("detour/../"),
                    3 => out.push_str("%2e/"),
                    _ => {}
                }
            } else if c.is_ascii_alphanumeric() || "-._~".contains(c) {
                match choice {
                    0 => out.push_str(&format!("%{:02x}", c as u8)),
                    1 => out.push_str(&format!("%{:02X}", c as u8)),
                    _ => out.push(c),
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    proptest! {
        #[test]
        fn every_spelling_normalises_to_the_canonical_path(
            path in canonical_path(),
            noise in prop::collection::vec(any::<u8>(), 1..64),
        ) {
            let canonical = norm(&path).expect("canonical path normalises");
            prop_assert_eq!(&canonical, &path);
            let spelling = respell(&path, &noise);
            let respelled = norm(&spelling);
            prop_assert_eq!(respelled.as_deref(), Ok(canonical.as_str()), "{}", spelling);
        }

        #[test]
        fn normalising_twice_changes_nothing(raw in "(/[a-zA-Z0-9%./\\\\{}~ -]{0,12}){1,5}") {
            for mode in [EscapedSlashes::Reject, EscapedSlashes::Keep, EscapedSlashes::Decode] {
                if let Ok(once) = normalize(raw.as_bytes(), mode) {
                    let twice = normalize(once.as_bytes(), mode).map(Cow::into_owned);
                    prop_assert_eq!(twice.as_deref(), Ok(&*once), "{:?}", mode);
                }
            }
        }
    }
}
