//! Who is asking: the client's address (the TCP peer, or the forwarded client
//! address when the peer is a trusted proxy), its API key and tier, and the
//! keyed hashes that stand for them in limit state.

mod error;
mod forwarded;
mod hashing;
mod keys;
mod reading;
mod run_time;
mod tiers;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use smallvec::SmallVec;

use crate::descriptors::{remote_address, Entries};
use crate::jwt::{ClaimPath, JwtRules, TokenCheck};
pub use error::IdentityError;
pub use forwarded::{normalize, ForwardedHeader};
use hashing::Kind;
pub use hashing::{random_key, IdentityHasher, IdentityKeySource};
pub use keys::{form_decode, normalize_host, KeyInputs, KeySource, KnownPart};
use reading::{DescriptorParts, KeyParts, Known, OnePart, RequestParts};
pub use run_time::{KeyEntry, RunTimeKey, RunTimeKeys};
pub use tiers::{Tier, Tiers, ANONYMOUS, INTERNAL};

/// Validated `[clients]` settings.
#[derive(Debug, Clone)]
pub struct ClientRules {
    /// The header a client's API key is read from (`api_key_header`, `x-api-key`
    /// by default); two values of it are a 400.
    pub api_key_header: HeaderName,
    /// Peers whose forwarded header is believed (`trusted_proxies`): from them,
    /// the client is the first untrusted entry of the chain, read right to left.
    pub trusted_proxies: Vec<IpNet>,
    /// The one header trusted proxies write the client's address in.
    pub forwarded_header: ForwardedHeader,
    /// Prefix length (in bits) an IPv6 client is grouped by for limits and
    /// connection caps: /64 by default.
    pub ipv6_prefix: u8,
    /// Addresses whose requests are in the `internal` tier, whatever key or
    /// token they send.
    pub internal: Vec<IpNet>,
    /// `[clients.api_keys]`: each listed key, as sent, with its tier; an
    /// unlisted key counts as no key.
    pub api_keys: HashMap<Box<[u8]>, Tier>,
    /// Keys set at run time (the admin API), which beat `api_keys`; none
    /// when the admin API is off, and then no request probes it.
    pub run_time: Option<Arc<RunTimeKeys>>,
    /// Every tier the configuration names, anonymous and internal included.
    pub tiers: Tiers,
    /// The keyed hash that turns addresses, keys and values into the
    /// identities limit state is kept under.
    pub hasher: IdentityHasher,
    /// `[clients.jwt]`, when set.
    pub jwt: Option<Arc<JwtRules>>,
}

/// A known API key, never kept in the clear beyond the lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Identity of the key for limit state.
    pub hash: u128,
    /// The tier the key was listed (or set at run time) with.
    pub tier: Tier,
}

impl ApiKey {
    /// What logs show instead of the key: enough to tell keys apart.
    pub fn log_label(&self) -> String {
        ApiKey::label_of(self.hash)
    }

    /// The label of the key whose identity is `hash`.
    pub fn label_of(hash: u128) -> String {
        format!("key#{:08x}", (hash >> 96) as u32)
    }
}

/// The identified client of one request.
#[derive(Debug, Clone)]
pub struct Client {
    /// The client's own address, as resolved (not aggregated).
    pub address: IpAddr,
    /// Trusted proxies between the client and the peer, client side first:
    /// with the peer, the chain the upstream is told of.
    pub via: SmallVec<[IpAddr; 2]>,
    /// The client address, aggregated (IPv6 to its prefix).
    pub ip: IpAddr,
    /// The prefix length `ip` is grouped by: 32 for IPv4, `ipv6_prefix` for IPv6.
    pub ip_prefix: u8,
    /// Identity of the (aggregated) address for limit state.
    pub ip_hash: u128,
    /// The request's API key, when it is a known one; an unlisted key is none.
    pub api_key: Option<ApiKey>,
    /// The client's tier: internal by address, else its verified token's, its
    /// API key's, or anonymous; the tier whose overrides its limits take.
    pub tier: Tier,
    /// The keyed hash of a verified token's subject, when there is one.
    pub subject_hash: Option<u128>,
    /// What the request's token came to, when `[clients.jwt]` is set.
    pub token: Option<TokenCheck>,
}

impl Client {
    /// For the rejection log: address, key label and tier.
    pub fn log_label(&self) -> String {
        let ip = self.address_label();
        match &self.api_key {
            Some(k) => format!("ip={ip} {} tier={}", k.log_label(), self.tier),
            None => format!("ip={ip} tier={}", self.tier),
        }
    }
}

impl Client {
    /// The (aggregated) address as logs print it: IPv6 with its prefix.
    pub fn address_label(&self) -> String {
        match self.ip {
            IpAddr::V6(_) => format!("{}/{}", self.ip, self.ip_prefix),
            IpAddr::V4(_) => self.ip.to_string(),
        }
    }
}

/// The claim `[block].jwt_subjects`, `jwt:sub` and the admin API's
/// `jwt_sub` read.
pub static SUBJECT: std::sync::LazyLock<ClaimPath> =
    std::sync::LazyLock::new(|| ClaimPath::parse("sub").unwrap_or_else(|| unreachable!()));

impl ClientRules {
    /// Who asks, by address and API key; its token is `apply_token`'s.
    pub fn identify(&self, peer: IpAddr, headers: &HeaderMap) -> Result<Client, IdentityError> {
        let (client_ip, via) = forwarded::client_address(
            normalize(peer),
            headers,
            self.forwarded_header,
            &self.trusted_proxies,
        )?;
        let (ip, ip_prefix) = self.address_group(client_ip);
        let mut key_values = headers.get_all(&self.api_key_header).iter();
        let key_value = key_values.next();
        if key_values.next().is_some() {
            // The upstream might read either one: no limit may be keyed on a guess.
            return Err(IdentityError::AmbiguousApiKey);
        }
        let api_key = key_value.and_then(|value| self.known_key(value.as_bytes()));
        let tier = if self.internal.iter().any(|n| n.contains(&client_ip)) {
            self.tiers.internal()
        } else {
            api_key
                .as_ref()
                .map_or_else(|| self.tiers.anonymous(), |k| k.tier.clone())
        };
        Ok(Client {
            address: client_ip,
            via,
            ip,
            ip_prefix,
            ip_hash: self.ip_hash(ip, ip_prefix),
            api_key,
            tier,
            subject_hash: None,
            token: None,
        })
    }

    /// The client as its token says, once the token is known or checked
    /// (`identify` leaves it out: a signature is checked only where a claim
    /// is needed, and after the cheaper refusals). A verified token's tier
    /// claim names the tier before an API key; an internal address stays
    /// internal.
    pub fn apply_token(&self, client: &mut Client, token: TokenCheck) {
        if let (Some(jwt), Some(claims)) = (&self.jwt, token.claims()) {
            let internal = self.internal.iter().any(|n| n.contains(&client.address));
            let token_tier = jwt
                .tier_claim
                .as_ref()
                .and_then(|path| claims.get(path))
                .and_then(|value| {
                    self.tiers
                        .get(jwt.tiers.get(std::str::from_utf8(&value).ok()?)?)
                });
            if let (false, Some(tier)) = (internal, token_tier) {
                client.tier = tier;
            }
            client.subject_hash = claims.get(&SUBJECT).map(|s| self.subject_hash(&s));
        }
        client.token = Some(token);
    }

    /// A key's identity and tier, when it is a known key: a run-time entry
    /// first (a revoked key is no key, whatever the file says), else
    /// `api_keys`. One probe of the run-time table, and only while it holds
    /// something.
    pub fn known_key(&self, key: &[u8]) -> Option<ApiKey> {
        if let Some(table) = self.run_time.as_ref().filter(|t| !t.is_empty()) {
            let hash = self.api_key_hash(key);
            let tier = match table.lookup(hash) {
                // A tier a reload dropped from the file is no tier: the
                // key stays known, with the limits of an anonymous client.
                Some(RunTimeKey::Tier(name)) => self
                    .tiers
                    .get(&name)
                    .unwrap_or_else(|| self.tiers.anonymous()),
                Some(RunTimeKey::Revoked) => return None,
                None => self.api_keys.get(key)?.clone(),
            };
            return Some(ApiKey { hash, tier });
        }
        let tier = self.api_keys.get(key)?;
        Some(ApiKey {
            hash: self.api_key_hash(key),
            tier: tier.clone(),
        })
    }

    /// The keyed hash of an API key as sent (known to `api_keys` or not).
    pub fn api_key_hash(&self, key: &[u8]) -> u128 {
        self.hasher.hash(Kind::ApiKey, key)
    }

    /// The keyed hash of a token's subject.
    pub fn subject_hash(&self, subject: &[u8]) -> u128 {
        self.hasher.hash(Kind::Subject, subject)
    }

    fn ip_hash(&self, ip: IpAddr, prefix: u8) -> u128 {
        let (bytes, len) = address_bytes(ip, prefix);
        self.hasher.hash(Kind::Ip, &bytes[..=len])
    }

    /// The identity of a descriptor entry's value: a `remote_address` that
    /// is an address is a client's, keyed as the gateway keys its clients
    /// (any spelling one address, IPv6 grouped by `ipv6_prefix`); any other
    /// value, one that is no address included, by its text.
    fn entry_identity(&self, key: &str, value: &[u8]) -> u128 {
        let address = std::str::from_utf8(value)
            .ok()
            .and_then(|text| remote_address(key, text));
        match address {
            Some(ip) => self.address_identity(ip),
            None => self.hasher.hash(Kind::Entry, value),
        }
    }

    /// The identity hash a limit keys on; `None` when the request lacks it
    /// (an `api_key` limit on an anonymous request), and the limit is skipped.
    pub fn identity_of(
        &self,
        key: &KeySource,
        client: &Client,
        inputs: &KeyInputs<'_>,
    ) -> Result<Option<u128>, IdentityError> {
        let parts = RequestParts {
            ip_identity: client.ip_hash,
            api_key_identity: client.api_key.as_ref().map(|k| k.hash),
            token: client.token.as_ref(),
            inputs,
        };
        self.identity_from(key, &parts)
    }

    /// The identity a limit keyed on `key` gives a client known by `part`
    /// alone (the admin API's lookups): none when the key reads something
    /// else, or reads more than one thing (a composite key).
    pub fn identity_for(
        &self,
        key: &KeySource,
        part: &KnownPart<'_>,
        fold_case: bool,
    ) -> Option<u128> {
        // One part names no two values: nothing here is ambiguous.
        self.identity_from(key, &OnePart { part, fold_case })
            .ok()
            .flatten()
    }

    /// The identity a limit of the rate limit service keys on, for one
    /// descriptor it matched; `None` when the key reads what a descriptor
    /// does not carry.
    pub fn descriptor_identity(&self, key: &KeySource, entries: &Entries<'_>) -> Option<u128> {
        // A descriptor names no value twice: nothing here is ambiguous.
        self.identity_from(key, &DescriptorParts { entries })
            .ok()
            .flatten()
    }

    /// The one walk over a key, whatever its parts are read from.
    fn identity_from(
        &self,
        key: &KeySource,
        parts: &impl KeyParts,
    ) -> Result<Option<u128>, IdentityError> {
        let fold = parts.fold_case();
        Ok(match key {
            KeySource::Ip => parts.ip().map(|ip| match ip {
                Known::Identity(identity) => identity,
                Known::Named(ip) => self.address_identity(ip),
            }),
            KeySource::ApiKey => parts.api_key().map(|key| match key {
                Known::Identity(identity) => identity,
                Known::Named(key) => self.api_key_hash(key),
            }),
            KeySource::Header(name) => parts
                .header(name)?
                .map(|v| self.hash_value(Kind::Header, v, fold)),
            KeySource::Cookie(name) => parts
                .cookie(name)?
                .map(|v| self.hash_value(Kind::Cookie, &v, fold)),
            KeySource::Query(name) => parts
                .query(name)?
                .map(|v| self.hash_value(Kind::Query, &v, fold)),
            KeySource::Jwt(path) => parts
                .claim(path)
                .map(|v| self.hash_value(Kind::Claim, &v, fold)),
            KeySource::Global => parts.complete().then_some(0),
            KeySource::Entry(key) => parts.entry(key).map(|v| self.entry_identity(key, v)),
            KeySource::Descriptor => parts.descriptor().map(|entries| {
                // Length-prefixed, so that no two descriptors join to one
                // text ("a"+"bc" against "ab"+"c").
                let mut joined = Vec::with_capacity(64);
                for (key, value) in entries {
                    let grouped;
                    let value = match remote_address(key, value) {
                        Some(ip) => {
                            // 0xFF is in no UTF-8 text: no value Envoy can
                            // send as text reads as an address here.
                            let (group, prefix) = self.address_group(ip);
                            let (bytes, len) = address_bytes(group, prefix);
                            grouped = [&[0xFF][..], &bytes[..=len]].concat();
                            &grouped[..]
                        }
                        None => value.as_bytes(),
                    };
                    for bytes in [key.as_bytes(), value] {
                        joined.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                        joined.extend_from_slice(bytes);
                    }
                }
                self.hasher.hash(Kind::Descriptor, &joined)
            }),
            KeySource::Body(field) => parts
                .whole()
                .and_then(|inputs| inputs.body)
                .and_then(|body| body.text(field))
                .map(|v| self.hash_value(Kind::Body, v.as_bytes(), fold)),
            KeySource::Host => parts
                .whole()
                .and_then(|inputs| inputs.host)
                .map(|h| self.hasher.hash(Kind::Host, h.as_bytes())),
            KeySource::Route => parts
                .whole()
                .map(|inputs| self.hasher.hash(Kind::Route, inputs.route.as_bytes())),
            KeySource::Composite(keys) => {
                if !parts.complete() {
                    return Ok(None);
                }
                let mut joined = Vec::with_capacity(16 * keys.len());
                for key in keys {
                    match self.identity_from(key, parts)? {
                        Some(identity) => joined.extend_from_slice(&identity.to_le_bytes()),
                        None => return Ok(None),
                    }
                }
                Some(self.hasher.hash(Kind::Composite, &joined))
            }
        })
    }

    /// A value a client sends (header, cookie, query parameter, or a
    /// claim), hashed as it is or ignoring case. Folding applies to the
    /// values a client types, never to an API key (`Kind::ApiKey` keeps
    /// its bytes: a key is a secret, and case is part of it).
    fn hash_value(&self, kind: Kind, value: &[u8], fold_case: bool) -> u128 {
        let folds = matches!(kind, Kind::Header | Kind::Cookie | Kind::Query);
        if !fold_case || !folds {
            return self.hasher.hash(kind, value);
        }
        let folded = match std::str::from_utf8(value) {
            Ok(text) => text.to_lowercase().into_bytes(),
            Err(_) => value.to_ascii_lowercase(),
        };
        self.hasher.hash(kind, &folded)
    }

    /// The identity of a client address as limits key it: IPv6 grouped by
    /// `ipv6_prefix`.
    pub fn address_identity(&self, ip: IpAddr) -> u128 {
        let (group, prefix) = self.address_group(normalize(ip));
        self.ip_hash(group, prefix)
    }

    /// The group an address is limited as, and its prefix length: an IPv4
    /// address alone, an IPv6 one with every address of its `ipv6_prefix`
    /// (a host is handed a /64 at least, and may pick any address in it).
    fn address_group(&self, ip: IpAddr) -> (IpAddr, u8) {
        match ip {
            IpAddr::V4(_) => (ip, 32),
            IpAddr::V6(_) => (
                IpNet::new(ip, self.ipv6_prefix).map_or(ip, |n| n.trunc().network()),
                self.ipv6_prefix,
            ),
        }
    }

    /// An address as logs print the group limits count it in: an IPv4
    /// address alone, an IPv6 one as its network (`2001:db8::/64`).
    pub fn address_label(&self, ip: IpAddr) -> String {
        match self.address_group(normalize(ip)) {
            (group @ IpAddr::V4(_), _) => group.to_string(),
            (group, prefix) => format!("{group}/{prefix}"),
        }
    }

    /// The tier a request from `ip` without key or token is in.
    pub fn tier_of_address(&self, ip: IpAddr) -> Tier {
        let ip = normalize(ip);
        if self.internal.iter().any(|n| n.contains(&ip)) {
            self.tiers.internal()
        } else {
            self.tiers.anonymous()
        }
    }

    /// The address a connection from `peer` counts against for the
    /// per-address connection cap: IPv6 grouped by `ipv6_prefix`, as limits
    /// group it; none for a trusted proxy, whose connections carry many
    /// clients.
    pub fn connection_group(&self, peer: IpAddr) -> Option<IpAddr> {
        let peer = normalize(peer);
        if self.is_trusted(&peer) {
            return None;
        }
        Some(self.address_group(peer).0)
    }

    /// The group `peer` is counted in, trusted or not (IPv6 by
    /// `ipv6_prefix`): what a listener that trusts no one caps.
    pub fn address_group_of(&self, peer: IpAddr) -> IpAddr {
        self.address_group(normalize(peer)).0
    }

    /// Whether `ip` is one of `trusted_proxies`, whose forwarded header is read.
    pub fn is_trusted(&self, ip: &IpAddr) -> bool {
        self.trusted_proxies.iter().any(|n| n.contains(ip))
    }
}

/// An address and its prefix length as the bytes its identity hashes, and
/// where the prefix length is in them.
fn address_bytes(ip: IpAddr, prefix: u8) -> ([u8; 17], usize) {
    let mut bytes = [0u8; 17];
    let len = match ip {
        IpAddr::V4(v4) => {
            bytes[..4].copy_from_slice(&v4.octets());
            4
        }
        IpAddr::V6(v6) => {
            bytes[..16].copy_from_slice(&v6.octets());
            16
        }
    };
    bytes[len] = prefix;
    (bytes, len)
}

#[cfg(test)]
mod tests;
