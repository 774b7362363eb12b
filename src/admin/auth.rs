//! Who may use the admin API: the holder of `[admin].token_file`'s token,
//! as a bearer token, or as the status page's cookie (given by `/login`).

use std::fmt;
use std::hash::Hasher;
use std::sync::{Arc, OnceLock};

use http::header::{AUTHORIZATION, COOKIE};
use http::HeaderMap;

use crate::admin::constant_time::same;
use floodgate_policy::identity::random_key;
use siphasher::sip128::{Hasher128, SipHasher13};

/// The status page's session cookie: the token itself, HttpOnly and
/// SameSite=Strict, so that no script and no other site can use it.
pub(crate) const COOKIE_NAME: &str = "floodgate_admin";

/// How long a status page session lasts: 12 hours.
pub(crate) const SESSION_S: u64 = 12 * 3600;

/// The admin token; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(Arc<str>);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl AdminToken {
    pub fn new(token: &str) -> AdminToken {
        AdminToken(Arc::from(token))
    }

    pub fn matches(&self, candidate: &[u8]) -> bool {
        same(self.0.as_bytes(), candidate)
    }

    /// The status page's cookie, issued at `issued_s` (unix seconds): the
    /// time and a keyed hash of it and the token, under a key drawn once
    /// per process, rather than the token. A browser sends a host's
    /// cookies to all its ports (the proxy's listener, and so the upstream,
    /// among them): what it carries there opens this process's pages for
    /// reading only, for `SESSION_S` at most, and dies with a restart or a
    /// new token.
    pub fn session(&self, issued_s: u64) -> String {
        static KEY: OnceLock<[u8; 16]> = OnceLock::new();
        let mut h = SipHasher13::new_with_key(KEY.get_or_init(random_key));
        h.write(self.0.as_bytes());
        h.write_u64(issued_s);
        format!("{issued_s}.{:032x}", h.finish128().as_u128())
    }

    /// Whether `cookie` is a session this process issued for this token
    /// that has not expired at `now_s`.
    pub fn session_valid(&self, cookie: &[u8], now_s: u64) -> bool {
        let issued = std::str::from_utf8(cookie)
            .ok()
            .and_then(|c| c.split_once('.'))
            .and_then(|(issued, _)| issued.parse::<u64>().ok());
        match issued {
            Some(issued) if issued <= now_s && now_s - issued < SESSION_S => {
                same(self.session(issued).as_bytes(), cookie)
            }
            _ => false,
        }
    }
}

/// How a request proved itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Credential {
    /// `Authorization: Bearer <token>`: any call.
    Bearer,
    /// The status page's cookie: reads only. A call that changes state
    /// needs the header, which a page of another site cannot make a
    /// browser send.
    Cookie,
}

/// The credential the request carries, if its token is right.
pub(crate) fn authenticate(
    token: &AdminToken,
    headers: &HeaderMap,
    now_s: u64,
) -> Option<Credential> {
    // The scheme's name is case-insensitive (RFC 9110).
    let bearer = headers
        .get_all(AUTHORIZATION)
        .iter()
        .filter_map(|v| {
            let v = v.as_bytes();
            v.get(..7)
                .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
                .map(|_| &v[7..])
        })
        .any(|candidate| token.matches(candidate.trim_ascii()));
    if bearer {
        return Some(Credential::Bearer);
    }
    let cookie = headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .filter_map(|pair| {
            let pair = pair.trim_ascii();
            pair.strip_prefix(COOKIE_NAME.as_bytes())?
                .strip_prefix(b"=")
        })
        .any(|candidate| token.session_valid(candidate, now_s));
    cookie.then_some(Credential::Cookie)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(http::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name, value.parse().expect("header value"));
        }
        map
    }

    #[test]
    fn only_the_exact_token_authenticates_and_a_cookie_only_reads() {
        let token = AdminToken::new("0123456789abcdef");
        const NOW: u64 = 1_800_000_000;
        let check = |pairs: &[(http::HeaderName, &str)]| authenticate(&token, &headers(pairs), NOW);
        assert_eq!(
            check(&[(AUTHORIZATION, "Bearer 0123456789abcdef")]),
            Some(Credential::Bearer)
        );
        let session = format!("a=b; floodgate_admin={}", token.session(NOW - 10));
        assert_eq!(check(&[(COOKIE, &session)]), Some(Credential::Cookie));
        assert_eq!(
            check(&[(AUTHORIZATION, "bearer 0123456789abcdef")]),
            Some(Credential::Bearer)
        );
        // The token itself is no cookie: only the session derived from it.
        assert_eq!(check(&[(COOKIE, "floodgate_admin=0123456789abcdef")]), None);
        assert_ne!(
            token.session(NOW),
            AdminToken::new("0123456789abcdeF").session(NOW)
        );
        // A session expires, cannot be issued in the future, nor re-dated.
        let expired = format!("floodgate_admin={}", token.session(NOW - SESSION_S));
        assert_eq!(check(&[(COOKIE, &expired)]), None);
        let ahead = format!("floodgate_admin={}", token.session(NOW + 60));
        assert_eq!(check(&[(COOKIE, &ahead)]), None);
        let valid = token.session(NOW - 10);
        let (_, mac) = valid.split_once('.').expect("issued.mac");
        let redated = format!("floodgate_admin={}.{mac}", NOW - 5);
        assert_eq!(check(&[(COOKIE, &redated)]), None);
        for wrong in [
            "Bearer 0123456789abcde",
            "Bearer 0123456789abcdef0",
            "Bearer 0123456789abcdeF",
            "Basic 0123456789abcdef",
            "0123456789abcdef",
        ] {
            assert_eq!(check(&[(AUTHORIZATION, wrong)]), None, "{wrong}");
        }
        assert_eq!(
            check(&[(COOKIE, "xfloodgate_admin=0123456789abcdef")]),
            None
        );
        assert_eq!(check(&[]), None);
        assert_eq!(format!("{token:?}"), "AdminToken(..)");
    }
}
