//! Who may use the admin API: the holder of `[admin].token_file`'s token,
//! as a bearer token, or as the status page's cookie (given by `/login`).

use std::fmt;
use std::sync::Arc;

use http::header::{AUTHORIZATION, COOKIE};
use http::HeaderMap;

/// The status page's session cookie: the token itself, HttpOnly and
/// SameSite=Strict, so that no script and no other site can use it.
pub const COOKIE_NAME: &str = "floodgate_admin";

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

    /// Compared in time that depends on the length only, so that a guess
    /// learns nothing from how long it took to be refused.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        let token = self.0.as_bytes();
        token.len() == candidate.len()
            && token
                .iter()
                .zip(candidate)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How a request proved itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer <token>`: any call.
    Bearer,
    /// The status page's cookie: reads only. A call that changes state
    /// needs the header, which a page of another site cannot make a
    /// browser send.
    Cookie,
}

/// The credential the request carries, if its token is right.
pub fn authenticate(token: &AdminToken, headers: &HeaderMap) -> Option<Credential> {
    let bearer = headers
        .get_all(AUTHORIZATION)
        .iter()
        .filter_map(|v| v.as_bytes().strip_prefix(b"Bearer "))
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
        .any(|candidate| token.matches(candidate));
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
        let check = |pairs: &[(http::HeaderName, &str)]| authenticate(&token, &headers(pairs));
        assert_eq!(
            check(&[(AUTHORIZATION, "Bearer 0123456789abcdef")]),
            Some(Credential::Bearer)
        );
        assert_eq!(
            check(&[(COOKIE, "a=b; floodgate_admin=0123456789abcdef")]),
            Some(Credential::Cookie)
        );
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
