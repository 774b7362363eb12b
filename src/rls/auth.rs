//! Who may call the rate limit service: anyone who reaches its port, or,
//! with `[rls].token_file`, a caller that shows one of the file's tokens as
//! `authorization: Bearer <token>` (Envoy's `initial_metadata`).

use std::fmt;
use std::sync::Arc;

use crate::admin::constant_time::same;

/// The tokens `[rls].token_file` holds, one a line, any of them accepted
/// (a new one is rolled out to the Envoys while the old one still holds);
/// never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct RlsTokens(Arc<[Box<str>]>);

impl fmt::Debug for RlsTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RlsTokens({} token(s))", self.0.len())
    }
}

impl RlsTokens {
    pub fn new(tokens: Vec<String>) -> RlsTokens {
        RlsTokens(tokens.into_iter().map(String::into_boxed_str).collect())
    }

    /// Whether one of the `authorization` values a call carries is a bearer
    /// token of the file. Every token is compared with every value, each in
    /// time that depends on the lengths only: how long a refusal takes
    /// tells a guess nothing of where it went wrong.
    pub fn admit<'a>(&self, authorization: impl Iterator<Item = &'a [u8]>) -> bool {
        let mut found = false;
        for value in authorization {
            // The scheme's name is case-insensitive (RFC 9110).
            let Some(candidate) = value
                .get(..7)
                .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
                .map(|_| value[7..].trim_ascii())
            else {
                continue;
            };
            for token in self.0.iter() {
                found |= same(token.as_bytes(), candidate);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_token_of_the_file_is_admitted() {
        let tokens = RlsTokens::new(vec![
            "0123456789abcdef".into(),
            "fedcba9876543210-new".into(),
        ]);
        let admit = |values: &[&str]| tokens.admit(values.iter().map(|v| v.as_bytes()));
        assert!(admit(&["Bearer 0123456789abcdef"]));
        assert!(admit(&["bearer fedcba9876543210-new"]));
        assert!(admit(&["Basic x", "BEARER  0123456789abcdef "]));
        for wrong in [
            "Bearer 0123456789abcde",
            "Bearer 0123456789abcdef0",
            "Bearer 0123456789abcdeF",
            "Basic 0123456789abcdef",
            "0123456789abcdef",
            "Bearer",
            "",
        ] {
            assert!(!admit(&[wrong]), "{wrong}");
        }
        assert!(!admit(&[]));
        assert_eq!(format!("{tokens:?}"), "RlsTokens(2 token(s))");
    }
}
