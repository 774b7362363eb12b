//! `[clients]`: who a client is (address, forwarded chain, API key and tier)
//! and the key identities are hashed with.

use std::collections::HashMap;

use http::HeaderName;
use ipnet::IpNet;

use super::file::{ClientsSection, ForwardedHeaderName};
use super::{at, AsSegment, Inputs, Invalid};
use floodgate_policy::identity::{
    ClientRules, ForwardedHeader, IdentityHasher, IdentityKeySource, Tiers, ANONYMOUS, INTERNAL,
};

/// The smallest secret accepted: 128 bits of a random hex or base64 string.
const MIN_SECRET_BYTES: usize = 16;

/// The key identities are hashed with: from the shared secret (the
/// environment beats the file), else per process (memory store) or public
/// (Redis store, whose instances must agree).
pub(super) fn identity_hasher(
    c: &ClientsSection,
    inputs: &Inputs,
    shared_store: bool,
) -> Result<(IdentityHasher, IdentityKeySource), Invalid> {
    let path: [&dyn AsSegment; 2] = [&"clients", &"identity_secret_file"];
    let secret = match (&inputs.identity_secret, &c.identity_secret_file) {
        (Some(secret), _) => Some(secret.clone().into_bytes()),
        (None, Some(file)) => Some(
            inputs
                .read(file)
                .map_err(|e| at(&path, format!("cannot read {}: {e}", file.display())))?,
        ),
        (None, None) => None,
    };
    match secret {
        Some(secret) => {
            let secret = secret.trim_ascii();
            if secret.len() < MIN_SECRET_BYTES {
                return Err(at(
                    &path,
                    format!(
                        "the identity secret must hold at least {MIN_SECRET_BYTES} bytes (e.g. the output of `openssl rand -hex 32`)"
                    ),
                ));
            }
            Ok((
                IdentityHasher::from_secret(secret),
                IdentityKeySource::Secret,
            ))
        }
        None if shared_store => Ok((IdentityHasher::public(), IdentityKeySource::Public)),
        None => Ok((IdentityHasher::per_process(), IdentityKeySource::PerProcess)),
    }
}

pub(super) fn validate_clients(
    c: &ClientsSection,
    hasher: IdentityHasher,
    inputs: &Inputs,
) -> Result<ClientRules, Invalid> {
    let header = c.api_key_header.as_deref().unwrap_or("X-API-Key");
    let api_key_header = HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
        at(
            &[&"clients", &"api_key_header"],
            format!("\"{header}\" is not a valid header name"),
        )
    })?;
    let nets = |list: &[String], key: &str| -> Result<Vec<IpNet>, Invalid> {
        list.iter()
            .enumerate()
            .map(|(i, n)| {
                n.parse::<IpNet>()
                    .or_else(|_| n.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map(|n| n.trunc())
                    .map_err(|_| {
                        at(
                            &[&"clients", &key, &i],
                            format!(
                                "\"{n}\" is not a CIDR range like \"10.0.0.0/8\" or an address"
                            ),
                        )
                    })
            })
            .collect()
    };
    let ipv6_prefix = c.ipv6_prefix.unwrap_or(64);
    if !(1..=128).contains(&ipv6_prefix) {
        return Err(at(&[&"clients", &"ipv6_prefix"], "must be from 1 to 128"));
    }
    let mut tiers = Tiers::default();
    for (i, tier) in c.tiers.iter().enumerate() {
        if tier == ANONYMOUS || tier == INTERNAL || tier.is_empty() {
            return Err(at(
                &[&"clients", &"tiers", &i],
                format!("tier \"{tier}\" is reserved; name a tier e.g. \"free\" or \"pro\""),
            ));
        }
        tiers.intern(tier);
    }
    let mut api_keys = HashMap::new();
    for (key, tier) in &c.api_keys {
        if key.is_empty() {
            return Err(at(
                &[&"clients", &"api_keys"],
                "an API key may not be empty",
            ));
        }
        if tier == ANONYMOUS || tier == INTERNAL || tier.is_empty() {
            return Err(at(
                &[&"clients", &"api_keys", &key.clone()],
                format!(
                    "tier \"{tier}\" is reserved; name the tier of a key e.g. \"free\" or \"pro\""
                ),
            ));
        }
        api_keys.insert(
            key.as_bytes().to_vec().into_boxed_slice(),
            tiers.intern(tier),
        );
    }
    let jwt = c
        .jwt
        .as_ref()
        .map(|j| super::jwt::validate_jwt(j, inputs, &mut tiers))
        .transpose()?
        .map(std::sync::Arc::new);
    Ok(ClientRules {
        jwt,
        api_key_header,
        trusted_proxies: nets(&c.trusted_proxies, "trusted_proxies")?,
        forwarded_header: match c.forwarded_header {
            None | Some(ForwardedHeaderName::XForwardedFor) => ForwardedHeader::XForwardedFor,
            Some(ForwardedHeaderName::Forwarded) => ForwardedHeader::Forwarded,
        },
        hasher,
        ipv6_prefix: ipv6_prefix as u8,
        internal: nets(&c.internal, "internal")?,
        api_keys,
        // Set once the admin API is known to be on (`validate`).
        run_time: None,
        tiers,
    })
}
