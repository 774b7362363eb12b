//! `[clients.jwt]`: the keys, algorithms and claims a token is held to.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use http::HeaderName;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::file::JwtSection;
use super::source::Segment;
use super::{duration, key_path, Inputs, Invalid};
use floodgate_policy::identity::{Tiers, ANONYMOUS, INTERNAL};
use floodgate_policy::jwt::{family_of, ClaimPath, DecodingKeyKind, JwtRules, VerifyingKey};

/// How a key of one family is checked: `None` when no configured algorithm
/// is of its family.
type ValidationFor<'a> = dyn Fn(DecodingKeyKind) -> Option<Validation> + 'a;

pub(super) fn validate_jwt(
    j: &JwtSection,
    inputs: &Inputs,
    tiers: &mut Tiers,
) -> Result<JwtRules, Invalid> {
    let header = header(j)?;
    let algorithms = algorithms(j)?;
    let leeway = leeway(j)?;
    let keys = verifying_keys(j, inputs, &|kind| validation(j, &algorithms, leeway, kind))?;
    let tier_claim = tier_claim(j)?;
    let claim_tiers = claim_tiers(j, tiers)?;
    Ok(JwtRules::new(
        header,
        keys,
        leeway.as_secs(),
        tier_claim,
        claim_tiers,
    ))
}

fn here(key: &str) -> Vec<Segment> {
    key_path(&[&"clients", &"jwt"], key)
}

fn header(j: &JwtSection) -> Result<HeaderName, Invalid> {
    let header_text = j.header.as_deref().unwrap_or("Authorization");
    HeaderName::from_bytes(header_text.as_bytes()).map_err(|_| {
        (
            here("header"),
            format!("\"{header_text}\" is not a valid header name"),
        )
    })
}

/// `algorithms`: named, and each one that proves who signed (no unsigned
/// tokens, no shared secrets).
fn algorithms(j: &JwtSection) -> Result<Vec<Algorithm>, Invalid> {
    if j.algorithms.is_empty() {
        return Err((
            here("algorithms"),
            "name the algorithms tokens are signed with, e.g. [\"RS256\", \"ES256\"]".into(),
        ));
    }
    let mut algorithms = Vec::new();
    for (i, name) in j.algorithms.iter().enumerate() {
        let mut path = here("algorithms");
        path.push(Segment::Index(i));
        let refuse = |why: &str| Err((path.clone(), format!("\"{name}\": {why}")));
        match name.as_str() {
            "none" | "None" | "NONE" => return refuse("an unsigned token proves nothing"),
            "HS256" | "HS384" | "HS512" => {
                return refuse(
                    "HMAC takes a shared secret, and these keys are public: anyone could sign",
                )
            }
            _ => {}
        }
        match name.parse::<Algorithm>() {
            Ok(alg) => algorithms.push(alg),
            Err(_) => return refuse(
                "not an algorithm (RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA)",
            ),
        }
    }
    Ok(algorithms)
}

fn leeway(j: &JwtSection) -> Result<Duration, Invalid> {
    let leeway = match &j.leeway {
        None => Duration::from_secs(60),
        Some(text) => duration::parse(text).map_err(|m| (here("leeway"), m))?,
    };
    if leeway > Duration::from_secs(3600) || leeway.subsec_nanos() != 0 {
        return Err((here("leeway"), "must be whole seconds, at most 1h".into()));
    }
    Ok(leeway)
}

/// What a token verified by a key of `kind` is held to: the configured
/// algorithms of that family, the clock's leeway, and the issuer and
/// audience when they are set (then required).
fn validation(
    j: &JwtSection,
    algorithms: &[Algorithm],
    leeway: Duration,
    kind: DecodingKeyKind,
) -> Option<Validation> {
    let allowed: Vec<Algorithm> = algorithms
        .iter()
        .copied()
        .filter(|a| family_of(&kind).contains(a))
        .collect();
    let first = *allowed.first()?;
    let mut v = Validation::new(first);
    v.algorithms = allowed;
    v.leeway = leeway.as_secs();
    v.validate_nbf = true;
    match &j.issuer {
        Some(iss) => {
            v.set_issuer(&[iss]);
            v.set_required_spec_claims(&["exp", "iss"]);
        }
        None => v.set_required_spec_claims(&["exp"]),
    }
    match &j.audience {
        Some(aud) => {
            v.set_audience(&[aud]);
            let mut required: Vec<&str> =
                v.required_spec_claims.iter().map(String::as_str).collect();
            required.push("aud");
            let required: Vec<String> = required.into_iter().map(String::from).collect();
            v.required_spec_claims = required.into_iter().collect();
        }
        None => v.validate_aud = false,
    }
    Some(v)
}

/// The keys tokens are verified with, from `jwks_file` or
/// `public_key_file`: at least one that some configured algorithm uses.
fn verifying_keys(
    j: &JwtSection,
    inputs: &Inputs,
    validation: &ValidationFor,
) -> Result<Vec<VerifyingKey>, Invalid> {
    let keys = match (&j.jwks_file, &j.public_key_file) {
        (Some(file), None) => jwks_keys(file, inputs, validation)?,
        (None, Some(file)) => vec![pem_key(file, inputs, validation)?],
        _ => {
            return Err((
                here("jwks_file"),
                "name the keys: `jwks_file` or `public_key_file`, one of them".into(),
            ))
        }
    };
    if keys.is_empty() {
        return Err((
            here("algorithms"),
            "no key in the JWKS fits these algorithms".into(),
        ));
    }
    Ok(keys)
}

/// `jwks_file`: the set's signing keys that a configured algorithm uses.
fn jwks_keys(
    file: &Path,
    inputs: &Inputs,
    validation: &ValidationFor,
) -> Result<Vec<VerifyingKey>, Invalid> {
    let text = inputs.read(file).map_err(|e| {
        (
            here("jwks_file"),
            format!("cannot read {}: {e}", file.display()),
        )
    })?;
    let set: JwkSet = serde_json::from_slice(&text).map_err(|e| {
        (
            here("jwks_file"),
            format!("{} is not a JWKS (JSON Web Key Set): {e}", file.display()),
        )
    })?;
    let mut keys = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        // A key published for encryption signs nothing.
        if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
            continue;
        }
        let kind = match jwk.algorithm {
            AlgorithmParameters::RSA(_) => DecodingKeyKind::Rsa,
            AlgorithmParameters::EllipticCurve(_) => DecodingKeyKind::Ec,
            AlgorithmParameters::OctetKeyPair(_) => DecodingKeyKind::Ed,
            AlgorithmParameters::OctetKey(_) => {
                return Err((
                    here("jwks_file"),
                    format!(
                        "key {i} of {} is a shared secret (\"oct\"): only public keys are accepted",
                        file.display()
                    ),
                ))
            }
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| {
            (
                here("jwks_file"),
                format!("key {i} of {} cannot be read: {e}", file.display()),
            )
        })?;
        // A key of a family no configured algorithm uses verifies
        // nothing; one that names its algorithm verifies that one.
        let validation = validation(kind).and_then(|mut v| {
            if let Some(own) = jwk.common.key_algorithm {
                v.algorithms.retain(|a| format!("{a:?}") == own.to_string());
            }
            (!v.algorithms.is_empty()).then_some(v)
        });
        if let Some(validation) = validation {
            keys.push(VerifyingKey {
                kid: jwk.common.key_id.clone(),
                key,
                validation,
            });
        }
    }
    Ok(keys)
}

/// `public_key_file`: one PEM key, of whichever family it is, which a
/// configured algorithm must use.
fn pem_key(
    file: &Path,
    inputs: &Inputs,
    validation: &ValidationFor,
) -> Result<VerifyingKey, Invalid> {
    let pem = inputs.read(file).map_err(|e| {
        (
            here("public_key_file"),
            format!("cannot read {}: {e}", file.display()),
        )
    })?;
    let kinds = [
        DecodingKeyKind::Rsa,
        DecodingKeyKind::Ec,
        DecodingKeyKind::Ed,
    ];
    let read = kinds.iter().find_map(|&kind| {
        let key = match kind {
            DecodingKeyKind::Rsa => DecodingKey::from_rsa_pem(&pem),
            DecodingKeyKind::Ec => DecodingKey::from_ec_pem(&pem),
            DecodingKeyKind::Ed => DecodingKey::from_ed_pem(&pem),
        };
        Some((kind, key.ok()?))
    });
    let Some((kind, key)) = read else {
        return Err((
            here("public_key_file"),
            format!(
                "{} holds no RSA, EC or Ed25519 public key in PEM",
                file.display()
            ),
        ));
    };
    let validation = validation(kind).ok_or_else(|| {
        (
            here("algorithms"),
            format!("none of them fits the key in {}", file.display()),
        )
    })?;
    Ok(VerifyingKey {
        kid: None,
        key,
        validation,
    })
}

/// `tier_claim`: a claim path, given with [clients.jwt.tiers] or not at all.
fn tier_claim(j: &JwtSection) -> Result<Option<ClaimPath>, Invalid> {
    let tier_claim = match &j.tier_claim {
        None => None,
        Some(text) => Some(ClaimPath::parse(text).ok_or_else(|| {
            (
                here("tier_claim"),
                format!("\"{text}\" is not a claim path like \"plan\" or \"org.plan\""),
            )
        })?),
    };
    if j.tier_claim.is_none() != j.tiers.is_empty() {
        return Err((
            here("tier_claim"),
            "`tier_claim` and [clients.jwt.tiers] go together: the claim, and the tier of each of its values".into(),
        ));
    }
    Ok(tier_claim)
}

/// `[clients.jwt.tiers]`: the tier of each value of the claim; a tier
/// named only here exists from now on.
fn claim_tiers(j: &JwtSection, tiers: &mut Tiers) -> Result<HashMap<String, String>, Invalid> {
    let mut claim_tiers = HashMap::new();
    for (value, tier) in &j.tiers {
        if tier == ANONYMOUS || tier == INTERNAL || tier.is_empty() {
            let mut path = here("tiers");
            path.push(Segment::Key(value.clone()));
            return Err((path, format!("tier \"{tier}\" is reserved")));
        }
        tiers.intern(tier);
        claim_tiers.insert(value.clone(), tier.clone());
    }
    Ok(claim_tiers)
}
