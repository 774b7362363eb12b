//! Verified JSON Web Tokens (`[clients.jwt]`): a bearer token's signature,
//! algorithm, issuer, audience and times are checked against the
//! configured public keys, and only then are its claims believed. A token
//! that fails is no token. Verified tokens are remembered (bounded, until
//! they expire), so a busy client's token is verified once; refused ones
//! for a while, so repeating one costs no check either. Both are kept as
//! keyed hashes of the token, never the token. An address whose tokens keep
//! failing gets no more signature checks than its budget allows.

use std::collections::HashMap;
use std::hash::Hasher;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use http::{HeaderMap, HeaderName};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use lru::LruCache;
use serde_json::Value;
use siphasher::sip128::{Hasher128, SipHasher13};

/// A claim's path: `sub`, or `org.id` for a member of an object claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPath(Vec<Box<str>>);

impl ClaimPath {
    /// `None` for an empty path or an empty segment.
    pub fn parse(text: &str) -> Option<ClaimPath> {
        let parts: Vec<Box<str>> = text.split('.').map(Box::from).collect();
        (!parts.iter().any(|p| p.is_empty())).then_some(ClaimPath(parts))
    }

    /// The path as the configuration spells it: `org.id`.
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

    /// `exp` in whole seconds: a float (`1767225600.5`) is as good as
    /// its floor, so that such a token is remembered like any other.
    fn expires_at(&self) -> Option<u64> {
        seconds(self.0.get("exp")?)
    }
}

/// Why a token was not believed (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Its `exp` (plus the leeway) has passed.
    Expired,
    /// Its `nbf` (less the leeway) is still to come.
    NotYetValid,
    /// The signature does not verify under the key it was matched with.
    BadSignature,
    /// No configured key verifies its `alg` (or the token names none).
    WrongAlgorithm,
    /// Its `iss` is not the configured issuer.
    WrongIssuer,
    /// Its `aud` does not name the configured audience.
    WrongAudience,
    /// Its `kid` names no configured key (or, without a `kid`, more than one
    /// key fits its algorithm).
    UnknownKey,
    /// It lacks a claim the configuration requires (`exp`, and `iss` when an
    /// issuer is set).
    MissingClaim,
    /// Not a token that can be read: bad base64 or JSON, a time that is not a
    /// number, an `iss` that is not a string, or the token's header sent twice.
    Malformed,
    /// `crit` names an extension this verifier does not implement, which
    /// RFC 7515 says must fail the token.
    UnknownCritical,
    /// The address's budget of failed signature checks is spent: refused
    /// without a check.
    Throttled,
}

impl Rejection {
    /// Every reason, in a fixed order: the metric's labels, each registered
    /// up front.
    pub const ALL: [Rejection; 11] = [
        Rejection::Expired,
        Rejection::NotYetValid,
        Rejection::BadSignature,
        Rejection::WrongAlgorithm,
        Rejection::WrongIssuer,
        Rejection::WrongAudience,
        Rejection::UnknownKey,
        Rejection::MissingClaim,
        Rejection::Malformed,
        Rejection::UnknownCritical,
        Rejection::Throttled,
    ];

    /// The reason as the metric's label and the logs spell it (`bad_signature`).
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
            Rejection::UnknownCritical => "unknown_critical",
            Rejection::Throttled => "throttled",
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
    /// The request carries no token: no such header, or an `Authorization`
    /// that is not `Bearer`.
    Absent,
    /// Verified before, and not yet expired.
    Remembered(Arc<Claims>),
    /// Verified now.
    Verified(Arc<Claims>),
    /// Not believed, for this reason: the request counts as carrying no token.
    Rejected(Rejection),
}

impl TokenCheck {
    /// The claims of a verified (or remembered) token; none when the token was
    /// absent or rejected.
    pub fn claims(&self) -> Option<&Arc<Claims>> {
        match self {
            TokenCheck::Remembered(c) | TokenCheck::Verified(c) => Some(c),
            _ => None,
        }
    }
}

/// One public key, with the configured algorithms of its family.
pub struct VerifyingKey {
    /// The key id (`kid`) a token names to be verified with this key; a token
    /// without one is matched by its algorithm.
    pub kid: Option<String>,
    /// The public key itself.
    pub key: DecodingKey,
    /// What a token verified with this key must meet: algorithms of the key's
    /// family, issuer, audience, required claims and leeway.
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
    /// Each value of the tier claim, with the name of the tier it places a
    /// client in; a value not listed places none.
    pub tiers: HashMap<String, String>,
    /// Under a key drawn at start: nobody can make a token that shares
    /// another's entry.
    token_key: [u8; 16],
    remembered: Mutex<LruCache<u128, Arc<Claims>>>,
    refused: Mutex<LruCache<u128, (Rejection, u64)>>,
    failures: SignatureBudget,
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
    /// RSA: RS256/384/512 and PS256/384/512.
    Rsa,
    /// Elliptic curve: ES256 and ES384.
    Ec,
    /// Ed25519: EdDSA.
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

    /// Rules over these keys, with the remembered and refused caches empty and
    /// their key drawn now; `leeway_s` is the slack, in seconds, allowed to
    /// `exp` and `nbf`.
    pub fn new(
        header: HeaderName,
        keys: Vec<VerifyingKey>,
        leeway_s: u64,
        tier_claim: Option<ClaimPath>,
        tiers: HashMap<String, String>,
    ) -> JwtRules {
        let mut token_key = [0u8; 16];
        if getrandom::fill(&mut token_key).is_err() {
            // No entropy source: the caches' keys are only as private as
            // the process's memory layout.
            let seed = std::collections::hash_map::RandomState::new();
            let h = std::hash::BuildHasher::hash_one(&seed, std::process::id());
            token_key[..8].copy_from_slice(&h.to_le_bytes());
        }
        JwtRules {
            header,
            keys,
            leeway_s,
            tier_claim,
            tiers,
            token_key,
            failures: SignatureBudget::default(),
            remembered: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(REMEMBERED).unwrap_or(std::num::NonZeroUsize::MIN),
            )),
            refused: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(REFUSED).unwrap_or(std::num::NonZeroUsize::MIN),
            )),
        }
    }

    /// The token a request carries: `Ok(None)` without one (or with
    /// another scheme, such as Basic), an error for two or an unreadable one.
    pub fn token_in<'h>(&self, headers: &'h HeaderMap) -> Result<Option<&'h str>, Rejection> {
        let mut values = headers.get_all(&self.header).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            // Which one would the application read?
            return Err(Rejection::Malformed);
        }
        let value = value.to_str().map_err(|_| Rejection::Malformed)?;
        if self.header != http::header::AUTHORIZATION {
            return Ok(Some(value.trim()));
        }
        Ok(match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => Some(token.trim()),
            _ => None,
        })
    }

    /// What a token is already known to be: remembered as verified (until
    /// it expires), or refused in the last `REFUSED_FOR_S`. No signature
    /// is checked.
    pub fn known(&self, token: &str, now_s: u64) -> Option<TokenCheck> {
        let id = self.token_id(token);
        if let Some(claims) = self.remembered(id, now_s) {
            return Some(TokenCheck::Remembered(claims));
        }
        let mut refused = self.refused.lock().ok()?;
        match refused.get(&id) {
            Some(&(why, until)) if now_s < until => Some(TokenCheck::Rejected(why)),
            Some(_) => {
                refused.pop(&id);
                None
            }
            None => None,
        }
    }

    /// Checks a token not `known` yet: its signature, unless the client's
    /// address (`group`, as connections are counted) has spent its budget
    /// of failed checks, when it is refused without one.
    pub fn verify_fresh(&self, token: &str, group: IpAddr, now_s: u64) -> TokenCheck {
        let now_us = now_s.saturating_mul(1_000_000);
        let id = self.token_id(token);
        // What needs no signature is refused without one, and costs the
        // address's budget nothing (a neighbour behind the same address
        // pays for no one's junk).
        let verified = match self.key_for(token) {
            Ok(_) if !self.failures.allows(group, now_us) => {
                return TokenCheck::Rejected(Rejection::Throttled);
            }
            Ok(key) => {
                let checked = self.check_signature(token, key);
                if checked.is_err() {
                    self.failures.spend(group, now_us);
                }
                checked
            }
            Err(why) => Err(why),
        };
        match verified {
            Ok(claims) => {
                let claims = Arc::new(claims);
                if let Ok(mut remembered) = self.remembered.lock() {
                    // Room first from what has expired.
                    while let Some((_, oldest)) = remembered.peek_lru() {
                        match oldest.expires_at() {
                            Some(exp) if exp.saturating_add(self.leeway_s) >= now_s => break,
                            _ => {
                                remembered.pop_lru();
                            }
                        }
                    }
                    remembered.put(id, claims.clone());
                }
                TokenCheck::Verified(claims)
            }
            Err(rejection) => {
                if let Ok(mut refused) = self.refused.lock() {
                    while refused
                        .peek_lru()
                        .is_some_and(|(_, &(_, until))| until <= now_s)
                    {
                        refused.pop_lru();
                    }
                    refused.put(id, (rejection, now_s + REFUSED_FOR_S));
                }
                TokenCheck::Rejected(rejection)
            }
        }
    }

    /// The request's token, known or checked now.
    pub fn check(&self, headers: &HeaderMap, group: IpAddr) -> TokenCheck {
        let token = match self.token_in(headers) {
            Ok(Some(token)) => token,
            Ok(None) => return TokenCheck::Absent,
            Err(why) => return TokenCheck::Rejected(why),
        };
        let now_s = unix_now_s();
        self.known(token, now_s)
            .unwrap_or_else(|| self.verify_fresh(token, group, now_s))
    }

    /// Tokens held by each cache: (remembered, refused).
    pub fn held(&self) -> (usize, usize) {
        (
            self.remembered.lock().map_or(0, |c| c.len()),
            self.refused.lock().map_or(0, |c| c.len()),
        )
    }

    fn token_id(&self, token: &str) -> u128 {
        let mut h = SipHasher13::new_with_key(&self.token_key);
        h.write(token.as_bytes());
        h.finish128().as_u128()
    }

    fn remembered(&self, id: u128, now_s: u64) -> Option<Arc<Claims>> {
        let mut remembered = self.remembered.lock().ok()?;
        let claims = remembered.get(&id)?.clone();
        match claims.expires_at() {
            Some(exp) if exp.saturating_add(self.leeway_s) >= now_s => Some(claims),
            // Expired since: verified again (and refused as expired).
            _ => {
                remembered.pop(&id);
                None
            }
        }
    }

    /// The key a token must be verified with: what is read of it before
    /// any signature is checked (its header, a critical extension, a key
    /// it names or its algorithm fits).
    fn key_for(&self, token: &str) -> Result<&VerifyingKey, Rejection> {
        if names_critical_extensions(token)? {
            return Err(Rejection::UnknownCritical);
        }
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
        match candidates.as_slice() {
            [one] => Ok(one),
            [] if header.kid.is_none() => Err(Rejection::WrongAlgorithm),
            _ => Err(Rejection::UnknownKey),
        }
    }

    /// The token's signature under `key`, then its claims.
    fn check_signature(&self, token: &str, key: &VerifyingKey) -> Result<Claims, Rejection> {
        let claims = jsonwebtoken::decode::<Value>(token, &key.key, &key.validation)
            .map(|data| data.claims)
            .map_err(|e| Rejection::of(e.kind()))?;
        // The library skips a time it cannot read as a number, and takes a
        // list of issuers: neither is a token's word to be believed.
        for time in ["exp", "nbf", "iat"] {
            if claims.get(time).is_some_and(|t| seconds(t).is_none()) {
                return Err(Rejection::Malformed);
            }
        }
        if claims.get("iss").is_some_and(|iss| !iss.is_string()) {
            return Err(Rejection::Malformed);
        }
        Ok(Claims(claims))
    }
}

/// Whether the token's header has `crit`. This verifier implements no
/// extension, so any name there (or an empty list, which RFC 7515 forbids)
/// fails the token; checked before any signature is.
fn names_critical_extensions(token: &str) -> Result<bool, Rejection> {
    let header = token.split('.').next().unwrap_or("");
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| Rejection::Malformed)?;
    let header: Value = serde_json::from_slice(&json).map_err(|_| Rejection::Malformed)?;
    Ok(header.get("crit").is_some())
}

/// A NumericDate: a number of seconds, at least 0, read as whole seconds.
fn seconds(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f as u64)
        }),
        _ => None,
    }
}

/// Seconds since the epoch: what tokens' times count in.
pub fn unix_now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Failed signature checks an address may cause: a burst of
/// `FAILED_CHECKS_BURST`, then one every `FAILED_CHECK_INTERVAL_US`. A
/// client with a good token fails none (it is then remembered); one that
/// sends garbage costs at most this much CPU per address.
const FAILED_CHECKS_BURST: u64 = 20;
const FAILED_CHECK_INTERVAL_US: u64 = 500_000;

/// Addresses whose failures are remembered; beyond that the least recent
/// are forgotten (their budget starts full again).
const BUDGETED_ADDRESSES: usize = 16_384;

/// Per address, when its budget of failed checks is whole again (GCRA).
struct SignatureBudget(Mutex<LruCache<IpAddr, u64>>);

impl Default for SignatureBudget {
    fn default() -> Self {
        SignatureBudget(Mutex::new(LruCache::new(
            std::num::NonZeroUsize::new(BUDGETED_ADDRESSES).unwrap_or(std::num::NonZeroUsize::MIN),
        )))
    }
}

impl SignatureBudget {
    fn allows(&self, group: IpAddr, now_us: u64) -> bool {
        let Ok(mut budget) = self.0.lock() else {
            return true;
        };
        budget.get(&group).is_none_or(|&full_at| {
            full_at.max(now_us) + FAILED_CHECK_INTERVAL_US - now_us
                <= FAILED_CHECKS_BURST * FAILED_CHECK_INTERVAL_US
        })
    }

    fn spend(&self, group: IpAddr, now_us: u64) {
        if let Ok(mut budget) = self.0.lock() {
            let full_at = budget.get(&group).copied().unwrap_or(0).max(now_us);
            budget.put(group, full_at + FAILED_CHECK_INTERVAL_US);
        }
    }
}

#[cfg(test)]
mod tests;
