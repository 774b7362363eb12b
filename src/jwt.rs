//! Verified JSON Web Tokens (`[clients.jwt]`): a bearer token's signature,
//! algorithm, issuer, audience and times are checked against the
//! configured public keys, and only then are its claims believed. A token
//! that fails is no token. Verified tokens are remembered (bounded, until
//! they expire), so a busy client's token is verified once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use lru::LruCache;
use serde_json::Value;

/// A claim's path: `sub`, or `org.id` for a member of an object claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPath(Vec<Box<str>>);

impl ClaimPath {
    /// `None` for an empty path or an empty segment.
    pub fn parse(text: &str) -> Option<ClaimPath> {
        let parts: Vec<Box<str>> = text.split('.').map(Box::from).collect();
        (!parts.iter().any(|p| p.is_empty())).then_some(ClaimPath(parts))
    }

    pub fn describe(&self) -> String {
        self.0.join(".")
    }
}

/// A verified token's claims.
#[derive(Debug)]
pub struct Claims(Value);

impl Claims {
    /// The claim at `path` as an identity's bytes: a string as it is, a
    /// number or a boolean as written; not an object, a list or null.
    pub fn get(&self, path: &ClaimPath) -> Option<Vec<u8>> {
        let mut value = &self.0;
        for part in &path.0 {
            value = value.get(&**part)?;
        }
        match value {
            Value::String(s) => Some(s.as_bytes().to_vec()),
            Value::Number(n) => Some(n.to_string().into_bytes()),
            Value::Bool(b) => Some(b.to_string().into_bytes()),
            _ => None,
        }
    }

    fn expires_at(&self) -> Option<u64> {
        self.0.get("exp").and_then(Value::as_u64)
    }
}

/// Why a token was not believed (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    Expired,
    NotYetValid,
    BadSignature,
    WrongAlgorithm,
    WrongIssuer,
    WrongAudience,
    UnknownKey,
    MissingClaim,
    Malformed,
}

impl Rejection {
    pub const ALL: [Rejection; 9] = [
        Rejection::Expired,
        Rejection::NotYetValid,
        Rejection::BadSignature,
        Rejection::WrongAlgorithm,
        Rejection::WrongIssuer,
        Rejection::WrongAudience,
        Rejection::UnknownKey,
        Rejection::MissingClaim,
        Rejection::Malformed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::BadSignature => "bad_signature",
            Rejection::WrongAlgorithm => "wrong_algorithm",
            Rejection::WrongIssuer => "wrong_issuer",
            Rejection::WrongAudience => "wrong_audience",
            Rejection::UnknownKey => "unknown_key",
            Rejection::MissingClaim => "missing_claim",
            Rejection::Malformed => "malformed",
        }
    }

    fn of(kind: &ErrorKind) -> Rejection {
        match kind {
            ErrorKind::ExpiredSignature => Rejection::Expired,
            ErrorKind::ImmatureSignature => Rejection::NotYetValid,
            ErrorKind::InvalidSignature => Rejection::BadSignature,
            ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Rejection::WrongAlgorithm,
            ErrorKind::InvalidIssuer => Rejection::WrongIssuer,
            ErrorKind::InvalidAudience => Rejection::WrongAudience,
            ErrorKind::MissingRequiredClaim(_) => Rejection::MissingClaim,
            _ => Rejection::Malformed,
        }
    }
}

/// What a request's token came to.
#[derive(Debug, Clone)]
pub enum TokenCheck {
    Absent,
    /// Verified before, and not yet expired.
    Remembered(Arc<Claims>),
    /// Verified now.
    Verified(Arc<Claims>),
    Rejected(Rejection),
}

impl TokenCheck {
    pub fn claims(&self) -> Option<&Arc<Claims>> {
        match self {
            TokenCheck::Remembered(c) | TokenCheck::Verified(c) => Some(c),
            _ => None,
        }
    }
}

/// One public key, with the configured algorithms of its family.
pub struct VerifyingKey {
    pub kid: Option<String>,
    pub key: DecodingKey,
    pub validation: Validation,
}

/// How many verified tokens are remembered.
const REMEMBERED: usize = 4096;

/// How many refused tokens are remembered, and for how long: a client
/// that repeats a bad token does not cost a signature check each time.
const REFUSED: usize = 1024;
const REFUSED_FOR_S: u64 = 10;

/// The validated `[clients.jwt]`.
pub struct JwtRules {
    /// Where the token comes from (`Authorization: Bearer <token>` unless
    /// another header is named; any other header holds the token alone).
    pub header: HeaderName,
    keys: Vec<VerifyingKey>,
    leeway_s: u64,
    /// The claim whose value names a tier, and the tier (its name) of each
    /// value.
    pub tier_claim: Option<ClaimPath>,
    pub tiers: HashMap<String, String>,
    remembered: Mutex<LruCache<Box<str>, Arc<Claims>>>,
    refused: Mutex<LruCache<Box<str>, (Rejection, u64)>>,
}

impl std::fmt::Debug for JwtRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtRules")
            .field("header", &self.header)
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// The configured algorithms of one key's family, for its validation.
pub fn family_of(key: &DecodingKeyKind) -> &'static [Algorithm] {
    match key {
        DecodingKeyKind::Rsa => &[
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        DecodingKeyKind::Ec => &[Algorithm::ES256, Algorithm::ES384],
        DecodingKeyKind::Ed => &[Algorithm::EdDSA],
    }
}

/// The kind of a public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodingKeyKind {
    Rsa,
    Ec,
    Ed,
}

impl JwtRules {
    /// For `floodgate check`: the keys and what they verify.
    pub fn describe(&self) -> String {
        // Algorithm's names are its variants' (RS256, ES256, EdDSA, ...).
        let mut algorithms: Vec<String> = Vec::new();
        for alg in self.keys.iter().flat_map(|k| &k.validation.algorithms) {
            let name = format!("{alg:?}");
            if !algorithms.contains(&name) {
                algorithms.push(name);
            }
        }
        format!(
            "{} key(s) verifying {} from {}; leeway {}s{}",
            self.keys.len(),
            algorithms.join(", "),
            self.header,
            self.leeway_s,
            self.tier_claim
                .as_ref()
                .map_or_else(String::new, |c| format!(
                    "; tier from claim {}",
                    c.describe()
                ))
        )
    }

    pub fn new(
        header: HeaderName,
        keys: Vec<VerifyingKey>,
        leeway_s: u64,
        tier_claim: Option<ClaimPath>,
        tiers: HashMap<String, String>,
    ) -> JwtRules {
        JwtRules {
            header,
            keys,
            leeway_s,
            tier_claim,
            tiers,
            remembered: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(REMEMBERED).unwrap_or(std::num::NonZeroUsize::MIN),
            )),
            refused: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(REFUSED).unwrap_or(std::num::NonZeroUsize::MIN),
            )),
        }
    }

    /// The request's token, verified (or remembered as verified).
    pub fn check(&self, headers: &HeaderMap) -> TokenCheck {
        let mut values = headers.get_all(&self.header).iter();
        let Some(value) = values.next() else {
            return TokenCheck::Absent;
        };
        if values.next().is_some() {
            // Which one would the application read?
            return TokenCheck::Rejected(Rejection::Malformed);
        }
        let Ok(value) = value.to_str() else {
            return TokenCheck::Rejected(Rejection::Malformed);
        };
        let token = if self.header == http::header::AUTHORIZATION {
            match value.split_once(' ') {
                Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
                // Another scheme (Basic): not a token of ours.
                _ => return TokenCheck::Absent,
            }
        } else {
            value.trim()
        };
        let now_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if let Some(claims) = self.remembered(token, now_s) {
            return TokenCheck::Remembered(claims);
        }
        if let Ok(mut refused) = self.refused.lock() {
            match refused.get(token) {
                Some(&(why, until)) if now_s < until => return TokenCheck::Rejected(why),
                Some(_) => {
                    refused.pop(token);
                }
                None => {}
            }
        }
        match self.verify(token) {
            Ok(claims) => {
                let claims = Arc::new(claims);
                if let Ok(mut remembered) = self.remembered.lock() {
                    remembered.put(token.into(), claims.clone());
                }
                TokenCheck::Verified(claims)
            }
            Err(rejection) => {
                if let Ok(mut refused) = self.refused.lock() {
                    refused.put(token.into(), (rejection, now_s + REFUSED_FOR_S));
                }
                TokenCheck::Rejected(rejection)
            }
        }
    }

    fn remembered(&self, token: &str, now_s: u64) -> Option<Arc<Claims>> {
        let mut remembered = self.remembered.lock().ok()?;
        let claims = remembered.get(token)?.clone();
        match claims.expires_at() {
            Some(exp) if exp.saturating_add(self.leeway_s) >= now_s => Some(claims),
            // Expired since: verified again (and refused as expired).
            _ => {
                remembered.pop(token);
                None
            }
        }
    }

    fn verify(&self, token: &str) -> Result<Claims, Rejection> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| Rejection::of(e.kind()))?;
        // The key named by the token, or the only key the algorithm fits.
        let candidates: Vec<&VerifyingKey> = match &header.kid {
            Some(kid) => self
                .keys
                .iter()
                .filter(|k| k.kid.as_deref() == Some(kid))
                .collect(),
            None => self
                .keys
                .iter()
                .filter(|k| k.validation.algorithms.contains(&header.alg))
                .collect(),
        };
        let key = match candidates.as_slice() {
            [one] => one,
            [] if header.kid.is_none() => return Err(Rejection::WrongAlgorithm),
            _ => return Err(Rejection::UnknownKey),
        };
        jsonwebtoken::decode::<Value>(token, &key.key, &key.validation)
            .map(|data| Claims(data.claims))
            .map_err(|e| Rejection::of(e.kind()))
    }
}
