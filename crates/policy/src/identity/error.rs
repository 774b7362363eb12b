//! Why a request's client cannot be told: each a 400 with its own code.

use http::HeaderName;

/// A request whose client cannot be told for sure: answered with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Two values of the API key header: the upstream might read either
    /// (`ambiguous_api_key`).
    #[error("more than one API key header")]
    AmbiguousApiKey,
    /// The entry of the forwarded header where the walk stopped is not an
    /// address (`bad_forwarded_header`).
    #[error("a forwarded client entry from a trusted proxy is not an address")]
    UnreadableForwardedEntry,
    /// Two values of this header, which a matching `header:` limit keys on
    /// (`ambiguous_key_header`).
    #[error("more than one value of the header {0}, which a limit is keyed on")]
    AmbiguousKeyHeader(HeaderName),
    /// Two cookies of this name, which a matching `cookie:` limit keys on
    /// (`ambiguous_key_cookie`).
    #[error("more than one cookie {0}, which a limit is keyed on")]
    AmbiguousKeyCookie(Box<str>),
    /// This query parameter named twice, while a matching `query:` limit keys on
    /// it (`ambiguous_key_query`).
    #[error("more than one query parameter {0}, which a limit is keyed on")]
    AmbiguousKeyQuery(Box<str>),
    /// The request lacks the key of this limit, whose `on_missing` is `"deny"`
    /// (`missing_key`).
    #[error("the request lacks what limit {0} is keyed on")]
    MissingKey(Box<str>),
}

impl IdentityError {
    /// The `error` of the 400's JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            IdentityError::AmbiguousApiKey => "ambiguous_api_key",
            IdentityError::UnreadableForwardedEntry => "bad_forwarded_header",
            IdentityError::AmbiguousKeyHeader(_) => "ambiguous_key_header",
            IdentityError::AmbiguousKeyCookie(_) => "ambiguous_key_cookie",
            IdentityError::AmbiguousKeyQuery(_) => "ambiguous_key_query",
            IdentityError::MissingKey(_) => "missing_key",
        }
    }
}
