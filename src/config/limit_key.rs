//! A limit's `key`: what its requests are counted by, one source or a
//! composite of several.

use http::HeaderName;

use super::file::OneOrMany;
use super::{at, Invalid};
use floodgate_policy::jwt::ClaimPath;
use floodgate_policy::KeySource;

fn validate_key(key: &str) -> Result<KeySource, String> {
    let named = |prefix: &str| {
        key.strip_prefix(prefix)
            .filter(|name| !name.is_empty() && !name.contains(['=', ';', '&', ' ']))
    };
    match key {
        "ip" => Ok(KeySource::Ip),
        "api_key" => Ok(KeySource::ApiKey),
        "global" => Ok(KeySource::Global),
        "host" => Ok(KeySource::Host),
        "route" => Ok(KeySource::Route),
        "descriptor" => Ok(KeySource::Descriptor),
        other if other.starts_with("descriptor:") => named("descriptor:")
            .map(|key| KeySource::Entry(key.into()))
            .ok_or_else(|| format!("\"{other}\" needs an entry's key after \"descriptor:\", like \"descriptor:remote_address\"")),
        other if other.starts_with("body:") => other
            .strip_prefix("body:")
            .filter(|field| !field.is_empty())
            .map(|field| KeySource::Body(field.into()))
            .ok_or_else(|| format!("\"{other}\" needs a top-level field of the JSON body after \"body:\", like \"body:model\"")),
        other if other.starts_with("jwt:") => ClaimPath::parse(&other["jwt:".len()..])
            .map(KeySource::Jwt)
            .ok_or_else(|| format!("\"{other}\" needs a claim after \"jwt:\", like \"jwt:sub\" or \"jwt:org.id\"")),
        other if other.starts_with("header:") => {
            let name = &other["header:".len()..];
            HeaderName::from_bytes(name.as_bytes())
                .map(KeySource::Header)
                .map_err(|_| format!("\"{name}\" is not a valid header name"))
        }
        other if other.starts_with("cookie:") => named("cookie:")
            .map(|name| KeySource::Cookie(name.into()))
            .ok_or_else(|| format!("\"{other}\" needs a cookie name after \"cookie:\"")),
        // Names are compared as requests' are read: decoded.
        other if other.starts_with("query:") => named("query:")
            .map(|name| {
                KeySource::Query(String::from_utf8_lossy(&floodgate_policy::identity::form_decode(name)).into())
            })
            .ok_or_else(|| format!("\"{other}\" needs a parameter name after \"query:\"")),
        other => Err(format!(
            "unknown key \"{other}\" (expected \"ip\", \"api_key\", \"header:<Name>\", \"cookie:<name>\", \"query:<name>\", \"jwt:<claim>\", \"host\", \"route\", \"global\", \"descriptor:<key>\", \"descriptor\", \"body:<field>\", or a list of them)"
        )),
    }
}

/// `key = "..."` or a composite `key = ["...", "..."]`; a claim only
/// where tokens are verified.
pub(super) fn validate_keys(key: &OneOrMany, i: usize, jwt: bool) -> Result<KeySource, Invalid> {
    let key_source = validate_keys_unchecked(key, i)?;
    if key_source.any_part(|p| matches!(p, KeySource::Jwt(_))) && !jwt {
        return Err(at(
            &[&"limits", &i, &"key"],
            "a claim is read from a verified token: configure [clients.jwt]",
        ));
    }
    Ok(key_source)
}

fn validate_keys_unchecked(key: &OneOrMany, i: usize) -> Result<KeySource, Invalid> {
    match key {
        OneOrMany::One(key) => validate_key(key).map_err(|m| at(&[&"limits", &i, &"key"], m)),
        OneOrMany::Many(keys) => {
            if keys.len() < 2 {
                return Err(at(
                    &[&"limits", &i, &"key"],
                    "a composite key names two or more keys",
                ));
            }
            let parts = keys
                .iter()
                .enumerate()
                .map(|(j, k)| match validate_key(k) {
                    Ok(KeySource::Global) => Err(at(
                        &[&"limits", &i, &"key", &j],
                        "\"global\" adds nothing to a composite key",
                    )),
                    Ok(KeySource::Descriptor) => Err(at(
                        &[&"limits", &i, &"key", &j],
                        "\"descriptor\" reads every entry already: list `descriptor:<key>` parts instead",
                    )),
                    Ok(part) => Ok(part),
                    Err(m) => Err(at(&[&"limits", &i, &"key", &j], m)),
                })
                .collect::<Result<_, _>>()?;
            Ok(KeySource::Composite(parts))
        }
    }
}
