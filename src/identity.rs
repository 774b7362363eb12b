//! Who is asking: the client's address (the TCP peer, or the forwarded client
//! address when the peer is a trusted proxy), its API key and tier, and the
//! keyed hashes that stand for them in limit state.

use std::collections::HashMap;
use std::hash::Hasher;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use http::{HeaderMap, HeaderName};

use crate::jwt::{ClaimPath, JwtRules, TokenCheck};
use ipnet::IpNet;
use siphasher::sip128::{Hasher128, SipHasher13};
use smallvec::SmallVec;

pub const ANONYMOUS: &str = "anonymous";
pub const INTERNAL: &str = "internal";

/// A tier ("anonymous", "internal", or one named in `[clients.api_keys]`),
/// interned when the config is built: requests compare its small id, logs
/// print its name. Ids mean something within one configuration only.
#[derive(Debug, Clone)]
pub struct Tier {
    id: u16,
    name: Arc<str>,
}

impl Tier {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl PartialEq for Tier {
    fn eq(&self, other: &Tier) -> bool {
        self.id == other.id
    }
}

impl Eq for Tier {}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&self.name)
    }
}

/// The tiers of one configuration, each under one id.
#[derive(Debug, Clone)]
pub struct Tiers {
    known: Vec<Tier>,
}

impl Default for Tiers {
    fn default() -> Self {
        let mut tiers = Tiers { known: Vec::new() };
        tiers.intern(ANONYMOUS);
        tiers.intern(INTERNAL);
        tiers
    }
}

impl Tiers {
    /// The tier of this name, added if new.
    pub fn intern(&mut self, name: &str) -> Tier {
        if let Some(tier) = self.get(name) {
            return tier;
        }
        let tier = Tier {
            id: u16::try_from(self.known.len()).unwrap_or(u16::MAX),
            name: Arc::from(name),
        };
        self.known.push(tier.clone());
        tier
    }

    pub fn get(&self, name: &str) -> Option<Tier> {
        self.known.iter().find(|t| t.name() == name).cloned()
    }

    pub fn anonymous(&self) -> Tier {
        self.known[0].clone()
    }

    pub fn internal(&self) -> Tier {
        self.known[1].clone()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.known.iter().map(Tier::name)
    }
}

/// Where one layer's state lives: the limit and a fixed-size hash of the
/// client's identity (never the raw value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey {
    pub limit: u64,
    pub identity: u128,
}

impl StateKey {
    /// Which of `shards` maps holds this key (the identity is already a keyed
    /// hash, so no client can aim at a shard).
    pub fn shard(&self, shards: usize) -> usize {
        (self.identity as usize ^ self.limit as usize) % shards
    }
}

/// What identifies the client for one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    Ip,
    ApiKey,
    Header(HeaderName),
    Global,
    /// A cookie's value (`cookie:<name>`).
    Cookie(Box<str>),
    /// A query parameter's value, percent-decoded (`query:<name>`).
    Query(Box<str>),
    /// The host asked for, without port, lower case.
    Host,
    /// The path pattern of the limit that matched (in a composite key):
    /// /users/1 and /users/2 are one route under `/users/*`.
    Route,
    /// A claim of the verified token (`jwt:sub`, `jwt:org.id`).
    Jwt(ClaimPath),
    /// Several of the above, all of which must be present.
    Composite(Vec<KeySource>),
}

impl KeySource {
    pub fn describe(&self) -> String {
        match self {
            KeySource::Ip => "ip".into(),
            KeySource::ApiKey => "api_key".into(),
            KeySource::Header(h) => format!("header:{h}"),
            KeySource::Global => "global".into(),
            KeySource::Cookie(name) => format!("cookie:{name}"),
            KeySource::Query(name) => format!("query:{name}"),
            KeySource::Host => "host".into(),
            KeySource::Route => "route".into(),
            KeySource::Jwt(path) => format!("jwt:{}", path.describe()),
            KeySource::Composite(parts) => {
                let parts: Vec<String> = parts.iter().map(KeySource::describe).collect();
                format!("[{}]", parts.join(", "))
            }
        }
    }

    /// Whether a client may leave this key out (a composite: any part).
    pub fn omittable(&self) -> bool {
        self.any_part(|part| {
            matches!(
                part,
                KeySource::Header(_)
                    | KeySource::Cookie(_)
                    | KeySource::Query(_)
                    | KeySource::ApiKey
                    | KeySource::Jwt(_)
            )
        })
    }

    /// Whether the key tells one client from another (a composite: some
    /// part does); `global`, `host` and `route` are everyone's.
    pub fn per_client(&self) -> bool {
        self.any_part(|part| {
            !matches!(part, KeySource::Global | KeySource::Host | KeySource::Route)
        })
    }

    /// Whether some part of the key says who the client is in a way the
    /// client cannot choose for someone else: its address, a listed API
    /// key (a secret), a verified claim. Header, cookie and query values
    /// are anyone's to send.
    pub fn unforgeable(&self) -> bool {
        self.any_part(|part| matches!(part, KeySource::Ip | KeySource::ApiKey | KeySource::Jwt(_)))
    }

    /// Whether some part of the key (the key itself, or one of a
    /// composite's, which holds no composite) is such.
    pub fn any_part(&self, is: impl Fn(&KeySource) -> bool) -> bool {
        match self {
            KeySource::Composite(parts) => parts.iter().any(is),
            one => is(one),
        }
    }
}

/// What of a request a key may read, beyond the identified client.
#[derive(Debug, Clone, Copy)]
pub struct KeyInputs<'a> {
    pub headers: &'a HeaderMap,
    /// The raw query string, if any.
    pub query: Option<&'a str>,
    /// The host asked for, if any and not empty, normalised
    /// (`normalize_host`).
    pub host: Option<&'a str>,
    /// The matching path pattern of the limit being keyed ("" when it
    /// matches every path).
    pub route: &'a str,
    /// Header, cookie and query values read ignoring case
    /// (`case_insensitive_values`).
    pub fold_case: bool,
}

/// `[clients].forwarded_header`: the one header trusted proxies write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=...`.
    Forwarded,
}

impl ForwardedHeader {
    pub fn name(&self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }
}

/// Where identities' hashing key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityKeySource {
    /// `FLOODGATE_IDENTITY_SECRET` or `[clients].identity_secret_file`.
    Secret,
    /// Memory store, no secret: a key drawn at start.
    PerProcess,
    /// Redis store, no secret: a fixed public key, so that instances still
    /// share budgets, but clients can compute their keys.
    Public,
}

/// Keyed hashing of identities (SipHash-1-3, 128 bits). Without the key no
/// one can compute which state, shard or Redis key a client has, nor build
/// two values that share one.
#[derive(Clone, PartialEq, Eq)]
pub struct IdentityHasher {
    key: [u8; 16],
}

impl std::fmt::Debug for IdentityHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityHasher(..)")
    }
}

/// Keeps the hashes of different kinds of identity apart.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
enum Kind {
    Ip = 1,
    ApiKey = 2,
    Header = 3,
    Cookie = 4,
    Query = 5,
    Host = 6,
    Route = 7,
    Composite = 8,
    Subject = 9,
    Claim = 10,
}

impl IdentityHasher {
    /// The key derived from a shared secret (instances on one Redis must
    /// share it to share budgets).
    pub fn from_secret(secret: &[u8]) -> IdentityHasher {
        // A fixed-key hash only compresses the secret's entropy into a key.
        let mut h = SipHasher13::new_with_keys(0x666c_6f6f_6467_6174, 0x6964_656e_7469_7479);
        h.write(secret);
        IdentityHasher {
            key: h.finish128().as_u128().to_le_bytes(),
        }
    }

    /// A key drawn once per process: the memory store's default, where no
    /// other instance needs to agree. Reloads keep it, so state survives them.
    pub fn per_process() -> IdentityHasher {
        static KEY: OnceLock<[u8; 16]> = OnceLock::new();
        IdentityHasher {
            key: *KEY.get_or_init(random_key),
        }
    }

    /// A fixed, public key: only for a Redis store whose instances were given
    /// no secret (`floodgate check` warns about it).
    pub fn public() -> IdentityHasher {
        IdentityHasher::from_secret(b"floodgate public identity key")
    }

    fn hash(&self, kind: Kind, bytes: &[u8]) -> u128 {
        let mut h = SipHasher13::new_with_key(&self.key);
        h.write_u8(kind as u8);
        h.write(bytes);
        h.finish128().as_u128()
    }
}

/// One thing a client is known by, as an operator names it.
#[derive(Debug, Clone, Copy)]
pub enum KnownPart<'a> {
    Ip(IpAddr),
    ApiKey(&'a [u8]),
    Header(&'a HeaderName, &'a [u8]),
    Cookie(&'a str, &'a [u8]),
    Query(&'a str, &'a [u8]),
    Claim(&'a ClaimPath, &'a [u8]),
}

/// A key for a keyed hash, drawn from the system's entropy.
pub fn random_key() -> [u8; 16] {
    let mut key = [0u8; 16];
    if getrandom::fill(&mut key).is_err() {
        // No entropy source at all: fall back to what std seeds its own
        // hash maps with.
        let seed = std::collections::hash_map::RandomState::new();
        for (half, chunk) in key.chunks_mut(8).enumerate() {
            let mut h = std::hash::BuildHasher::build_hasher(&seed);
            h.write_u64(std::process::id().into());
            h.write_usize(half);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    key
}

/// Validated `[clients]` settings.
#[derive(Debug, Clone)]
pub struct ClientRules {
    pub api_key_header: HeaderName,
    pub trusted_proxies: Vec<IpNet>,
    pub forwarded_header: ForwardedHeader,
    pub ipv6_prefix: u8,
    pub internal: Vec<IpNet>,
    pub api_keys: HashMap<Box<[u8]>, Tier>,
    /// Every tier the configuration names, anonymous and internal included.
    pub tiers: Tiers,
    pub hasher: IdentityHasher,
    /// `[clients.jwt]`, when set.
    pub jwt: Option<Arc<JwtRules>>,
}

/// A request whose client cannot be told for sure: answered with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("more than one API key header")]
    AmbiguousApiKey,
    #[error("a forwarded client entry from a trusted proxy is not an address")]
    UnreadableForwardedEntry,
    #[error("more than one value of the header {0}, which a limit is keyed on")]
    AmbiguousKeyHeader(HeaderName),
    #[error("more than one cookie {0}, which a limit is keyed on")]
    AmbiguousKeyCookie(Box<str>),
    #[error("more than one query parameter {0}, which a limit is keyed on")]
    AmbiguousKeyQuery(Box<str>),
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

/// A known API key, never kept in the clear beyond the lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Identity of the key for limit state.
    pub hash: u128,
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
    pub ip_prefix: u8,
    /// Identity of the (aggregated) address for limit state.
    pub ip_hash: u128,
    pub api_key: Option<ApiKey>,
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

/// A host as limits compare it: lower case, without port or final dot.
pub fn normalize_host(host: &str) -> String {
    let host = match host.rsplit_once(':') {
        // Not an IPv6 literal's colon: a port.
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// The value of cookie `name` among the request's `Cookie` headers, as
/// frameworks read it: one pair of surrounding quotes dropped and
/// percent-escapes decoded (`"abc"`, `%61bc` and `abc` are one session).
/// Two cookies of that name (however spelled) are ambiguous: the
/// application may read either.
fn cookie(headers: &HeaderMap, name: &str) -> Result<Option<Vec<u8>>, IdentityError> {
    let mut found = None;
    for header in headers.get_all(http::header::COOKIE) {
        for pair in header.as_bytes().split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            let (key, value) = match pair.iter().position(|&b| b == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => continue,
            };
            if percent_decode(key.trim_ascii(), false) != name.as_bytes() {
                continue;
            }
            if found.is_some() {
                return Err(IdentityError::AmbiguousKeyCookie(name.into()));
            }
            let value = value.trim_ascii();
            let value = match value {
                [b'"', inner @ .., b'"'] => inner,
                _ => value,
            };
            found = Some(percent_decode(value, false));
        }
    }
    Ok(found)
}

/// The value of query parameter `name`, percent-decoded (and `+` read as
/// a space), as applications read it: `user=a%62` and `user=ab` are one
/// value, and a parameter spelled twice (`user`, `us%65r`) is ambiguous.
fn query_parameter(query: Option<&str>, name: &str) -> Result<Option<Vec<u8>>, IdentityError> {
    let mut found = None;
    for pair in query.unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if form_decode(key) != name.as_bytes() {
            continue;
        }
        if found.is_some() {
            return Err(IdentityError::AmbiguousKeyQuery(name.into()));
        }
        found = Some(form_decode(value));
    }
    Ok(found)
}

/// `application/x-www-form-urlencoded` decoding; an escape that is not one
/// stays as written.
pub fn form_decode(text: &str) -> Vec<u8> {
    percent_decode(text.as_bytes(), true)
}

/// Percent-escapes decoded (and `+` as a space when `plus_is_space`); an
/// escape that is not one stays as written.
fn percent_decode(bytes: &[u8], plus_is_space: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// An IPv4-mapped IPv6 address is the IPv4 client it carries.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl ClientRules {
    /// Who asks, by address and API key; its token is `apply_token`'s.
    pub fn identify(&self, peer: IpAddr, headers: &HeaderMap) -> Result<Client, IdentityError> {
        let (client_ip, via) = self.client_ip(normalize(peer), headers)?;
        let (ip, ip_prefix) = self.address_group(client_ip);
        let mut key_values = headers.get_all(&self.api_key_header).iter();
        let key_value = key_values.next();
        if key_values.next().is_some() {
            // The upstream might read either one: no limit may be keyed on a guess.
            return Err(IdentityError::AmbiguousApiKey);
        }
        let api_key = key_value.and_then(|value| {
            let tier = self.api_keys.get(value.as_bytes())?;
            Some(ApiKey {
                hash: self.hasher.hash(Kind::ApiKey, value.as_bytes()),
                tier: tier.clone(),
            })
        });
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

    /// The keyed hash of an API key as sent (known to `api_keys` or not).
    pub fn api_key_hash(&self, key: &[u8]) -> u128 {
        self.hasher.hash(Kind::ApiKey, key)
    }

    /// The keyed hash of a token's subject.
    pub fn subject_hash(&self, subject: &[u8]) -> u128 {
        self.hasher.hash(Kind::Subject, subject)
    }

    fn ip_hash(&self, ip: IpAddr, prefix: u8) -> u128 {
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
        self.hasher.hash(Kind::Ip, &bytes[..=len])
    }

    /// The identity hash a limit keys on; `None` when the request lacks it
    /// (an `api_key` limit on an anonymous request), and the limit is skipped.
    pub fn identity_of(
        &self,
        key: &KeySource,
        client: &Client,
        inputs: &KeyInputs<'_>,
    ) -> Result<Option<u128>, IdentityError> {
        Ok(match key {
            KeySource::Ip => Some(client.ip_hash),
            KeySource::ApiKey => client.api_key.as_ref().map(|k| k.hash),
            KeySource::Header(name) => {
                let mut values = inputs.headers.get_all(name).iter();
                let value = values.next();
                if values.next().is_some() {
                    return Err(IdentityError::AmbiguousKeyHeader(name.clone()));
                }
                value.map(|v| self.hash_value(Kind::Header, v.as_bytes(), inputs.fold_case))
            }
            KeySource::Global => Some(0),
            KeySource::Cookie(name) => cookie(inputs.headers, name)?
                .map(|v| self.hash_value(Kind::Cookie, &v, inputs.fold_case)),
            KeySource::Query(name) => query_parameter(inputs.query, name)?
                .map(|v| self.hash_value(Kind::Query, &v, inputs.fold_case)),
            KeySource::Host => inputs
                .host
                .map(|h| self.hasher.hash(Kind::Host, h.as_bytes())),
            KeySource::Route => Some(self.hasher.hash(Kind::Route, inputs.route.as_bytes())),
            KeySource::Jwt(path) => client
                .token
                .as_ref()
                .and_then(TokenCheck::claims)
                .and_then(|claims| claims.get(path))
                .map(|value| self.hasher.hash(Kind::Claim, &value)),
            KeySource::Composite(parts) => {
                let mut joined = Vec::with_capacity(16 * parts.len());
                for part in parts {
                    match self.identity_of(part, client, inputs)? {
                        Some(identity) => joined.extend_from_slice(&identity.to_le_bytes()),
                        None => return Ok(None),
                    }
                }
                Some(self.hasher.hash(Kind::Composite, &joined))
            }
        })
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
        let hash = |kind, value: &[u8]| Some(self.hash_value(kind, value, fold_case));
        match (key, part) {
            (KeySource::Ip, KnownPart::Ip(ip)) => Some(self.address_identity(*ip)),
            (KeySource::ApiKey, KnownPart::ApiKey(value)) => hash(Kind::ApiKey, value),
            (KeySource::Header(name), KnownPart::Header(asked, value)) if name == *asked => {
                hash(Kind::Header, value)
            }
            (KeySource::Cookie(name), KnownPart::Cookie(asked, value)) if **name == **asked => {
                hash(Kind::Cookie, value)
            }
            (KeySource::Query(name), KnownPart::Query(asked, value)) if **name == **asked => {
                hash(Kind::Query, value)
            }
            (KeySource::Jwt(path), KnownPart::Claim(asked, value)) if path == *asked => {
                hash(Kind::Claim, value)
            }
            _ => None,
        }
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

    pub fn is_trusted(&self, ip: &IpAddr) -> bool {
        self.trusted_proxies.iter().any(|n| n.contains(ip))
    }

    /// The peer itself, unless it is a trusted proxy: then the chain of the
    /// configured header (all its lines, in order) is read right to left and
    /// the first entry that is not a trusted proxy is the client. A trusted
    /// proxy never writes an entry that is not an address, so reaching one
    /// means the chain cannot be believed: the request is refused rather than
    /// pinned on the proxy. Entries left of the client are never read.
    fn client_ip(
        &self,
        peer: IpAddr,
        headers: &HeaderMap,
    ) -> Result<(IpAddr, SmallVec<[IpAddr; 2]>), IdentityError> {
        let mut via = SmallVec::new();
        if !self.is_trusted(&peer) {
            return Ok((peer, via));
        }
        let mut entries: SmallVec<[ChainEntry<'_>; 8]> = SmallVec::new();
        for line in headers.get_all(self.forwarded_header.name()) {
            match self.forwarded_header {
                ForwardedHeader::XForwardedFor => {
                    entries.extend(x_forwarded_for_entries(line.as_bytes()))
                }
                ForwardedHeader::Forwarded => entries.extend(forwarded_elements(line.as_bytes())),
            }
        }
        let mut client = peer;
        for (walked, entry) in entries.iter().rev().enumerate() {
            let address = entry.and_then(|entry| match self.forwarded_header {
                ForwardedHeader::XForwardedFor => parse_hop(entry),
                ForwardedHeader::Forwarded => forwarded_for(entry).and_then(parse_hop),
            });
            if walked > 0 {
                via.insert(0, client);
            }
            client = address.ok_or(IdentityError::UnreadableForwardedEntry)?;
            if !self.is_trusted(&client) {
                break;
            }
        }
        Ok((client, via))
    }
}

/// One entry of a forwarding chain: its bytes, or `None` where the header's
/// syntax around it cannot be trusted.
type ChainEntry<'a> = Option<&'a [u8]>;

/// The entries of one `X-Forwarded-For` line, as bytes: split at every comma
/// (the header has no quoting), white space trimmed, and empty elements
/// skipped (RFC 9110, section 5.6.1).
fn x_forwarded_for_entries(value: &[u8]) -> impl Iterator<Item = ChainEntry<'_>> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|e| !e.is_empty())
        .map(Some)
}

/// The elements of one `Forwarded` line (RFC 7239): a comma inside a quoted
/// string does not separate. A quote left open would swallow what a proxy
/// appended after it, so the last element of such a line is unreadable.
fn forwarded_elements(value: &[u8]) -> SmallVec<[ChainEntry<'_>; 4]> {
    let (pieces, balanced) = split_unquoted(value, b',');
    let last = pieces.len() - 1;
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, e)| (i < last || balanced).then(|| e.trim_ascii()))
        .filter(|e| e.is_none_or(|e| !e.is_empty()))
        .collect()
}

/// Splits at `separator` outside double-quoted strings (with `\` escapes);
/// also tells whether every quote was closed.
fn split_unquoted(value: &[u8], separator: u8) -> (SmallVec<[&[u8]; 4]>, bool) {
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    let mut pieces: SmallVec<[&[u8]; 4]> = SmallVec::new();
    for (i, &b) in value.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if b == separator && !quoted {
            pieces.push(&value[start..i]);
            start = i + 1;
        }
    }
    pieces.push(&value[start..]);
    (pieces, !quoted)
}

/// The `for=` value of one `Forwarded` element, unquoted; `None` unless the
/// element has exactly one.
fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    let mut found = None;
    for pair in split_unquoted(element, b';').0 {
        let Some(at) = pair.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (pair[..at].trim_ascii(), pair[at + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return None;
            }
            found = Some(
                value
                    .strip_prefix(b"\"")
                    .and_then(|v| v.strip_suffix(b"\""))
                    .unwrap_or(value),
            );
        }
    }
    found
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`.
fn parse_hop(hop: &[u8]) -> Option<IpAddr> {
    let hop = std::str::from_utf8(hop).ok()?;
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(normalize(ip));
    }
    if let Ok(sa) = hop.parse::<std::net::SocketAddr>() {
        return Some(normalize(sa.ip()));
    }
    let inner = hop.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<IpAddr>().ok().map(normalize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_with(forwarded_header: ForwardedHeader) -> ClientRules {
        let mut api_keys = HashMap::new();
        let mut tiers = Tiers::default();
        api_keys.insert(b"k-pro".to_vec().into_boxed_slice(), tiers.intern("pro"));
        ClientRules {
            api_key_header: HeaderName::from_static("x-api-key"),
            trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
            forwarded_header,
            ipv6_prefix: 64,
            internal: vec!["192.168.0.0/16".parse().unwrap()],
            api_keys,
            tiers,
            hasher: IdentityHasher::from_secret(b"test secret of sixteen bytes"),
            jwt: None,
        }
    }

    fn rules() -> ClientRules {
        rules_with(ForwardedHeader::XForwardedFor)
    }

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn client_of(
        r: &ClientRules,
        peer: &str,
        pairs: &[(&str, &[u8])],
    ) -> Result<IpAddr, IdentityError> {
        r.identify(ip(peer), &headers(pairs)).map(|c| c.ip)
    }

    #[test]
    fn forwarded_for_is_read_only_from_trusted_peers() {
        let r = rules();
        let chain: &[(&str, &[u8])] = &[("x-forwarded-for", b"6.6.6.6, 1.2.3.4, 10.0.0.7")];
        assert_eq!(client_of(&r, "8.8.8.8", chain), Ok(ip("8.8.8.8")));
        assert_eq!(client_of(&r, "10.1.1.1", chain), Ok(ip("1.2.3.4")));
        let c = r.identify(ip("10.1.1.1"), &headers(chain)).unwrap();
        assert_eq!(c.via.as_slice(), [ip("10.0.0.7")]);
        let all_trusted: &[(&str, &[u8])] = &[("x-forwarded-for", b"10.0.0.9, 10.0.0.7")];
        assert_eq!(client_of(&r, "10.1.1.1", all_trusted), Ok(ip("10.0.0.9")));
        let split: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"5.5.5.5"),
            ("x-forwarded-for", b"10.0.0.2"),
        ];
        assert_eq!(client_of(&r, "10.1.1.1", split), Ok(ip("5.5.5.5")));
        // No header from a trusted peer: the peer is the client.
        assert_eq!(client_of(&r, "10.1.1.1", &[]), Ok(ip("10.1.1.1")));
    }

    #[test]
    fn one_odd_entry_spoils_only_itself() {
        let r = rules();
        // Garbage left of the client is never read.
        for value in [
            &b"\x80x, 198.51.100.11"[..],
            b"bogus, 198.51.100.11, 10.0.0.7",
            b", ,198.51.100.11,,",
            b"\"quoted, 198.51.100.11",
        ] {
            assert_eq!(
                client_of(&r, "10.1.1.1", &[("x-forwarded-for", value)]),
                Ok(ip("198.51.100.11")),
                "{}",
                String::from_utf8_lossy(value)
            );
        }
        // Garbage reached by the walk is never pinned on the proxy.
        for value in [
            &b"1.2.3.4, bogus, 10.0.0.7"[..],
            b"1.2.3.4, \xff",
            b"unknown",
        ] {
            assert_eq!(
                client_of(&r, "10.1.1.1", &[("x-forwarded-for", value)]),
                Err(IdentityError::UnreadableForwardedEntry),
                "{}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn only_the_configured_header_is_read() {
        let xff = rules();
        let fwd = rules_with(ForwardedHeader::Forwarded);
        let both: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"7.7.7.7"),
            ("forwarded", b"for=9.9.9.9;proto=https"),
        ];
        assert_eq!(client_of(&xff, "10.1.1.1", both), Ok(ip("7.7.7.7")));
        assert_eq!(client_of(&fwd, "10.1.1.1", both), Ok(ip("9.9.9.9")));
        // A client's own X-Forwarded-For behind a Forwarded-writing proxy.
        let spoof: &[(&str, &[u8])] = &[("x-forwarded-for", b"1.1.1.1")];
        assert_eq!(client_of(&fwd, "10.1.1.1", spoof), Ok(ip("10.1.1.1")));
    }

    #[test]
    fn forwarded_header_is_understood() {
        let r = rules_with(ForwardedHeader::Forwarded);
        let h: &[(&str, &[u8])] = &[(
            "forwarded",
            b"for=9.9.9.9;proto=https, For=\"[2001:db8::5]:4711\";by=\"a,b\"",
        )];
        assert_eq!(client_of(&r, "10.1.1.1", h), Ok(ip("2001:db8::")));
        let v4_port: &[(&str, &[u8])] = &[("forwarded", b"for=\"192.0.2.43:47011\"")];
        assert_eq!(client_of(&r, "10.1.1.1", v4_port), Ok(ip("192.0.2.43")));
        // A quote the client left open cannot swallow the proxy's element.
        let swallow: &[(&str, &[u8])] = &[("forwarded", b"for=10.0.0.1;x=\", for=203.0.113.7")];
        assert_eq!(
            client_of(&r, "10.1.1.1", swallow),
            Err(IdentityError::UnreadableForwardedEntry)
        );
        let two_lines: &[(&str, &[u8])] = &[
            ("forwarded", b"for=10.0.0.1;x=\""),
            ("forwarded", b"for=203.0.113.7"),
        ];
        assert_eq!(client_of(&r, "10.1.1.1", two_lines), Ok(ip("203.0.113.7")));
        for bad in [
            &b"for=unknown"[..],
            b"proto=https",
            b"for=_hidden",
            b"for=1.2.3.4;for=5.6.7.8",
        ] {
            assert_eq!(
                client_of(&r, "10.1.1.1", &[("forwarded", bad)]),
                Err(IdentityError::UnreadableForwardedEntry)
            );
        }
    }

    #[test]
    fn ipv6_is_aggregated_and_mapped_v4_normalised() {
        let r = rules();
        let a = r
            .identify(ip("2001:db8:1:2:aaaa::1"), &HeaderMap::new())
            .unwrap();
        let b = r
            .identify(ip("2001:db8:1:2:bbbb::9"), &HeaderMap::new())
            .unwrap();
        assert_eq!(a.ip, b.ip);
        assert_eq!(a.ip_hash, b.ip_hash);
        assert_eq!(a.ip, ip("2001:db8:1:2::"));
        assert_eq!(client_of(&r, "::ffff:1.2.3.4", &[]), Ok(ip("1.2.3.4")));
    }

    #[test]
    fn tiers_come_from_listed_keys_and_internal_ranges() {
        let r = rules();
        let pro = r
            .identify(ip("1.1.1.1"), &headers(&[("x-api-key", b"k-pro")]))
            .unwrap();
        assert_eq!(pro.tier.name(), "pro");
        assert!(pro.api_key.is_some());
        let made_up = r
            .identify(ip("1.1.1.1"), &headers(&[("x-api-key", b"k-made-up")]))
            .unwrap();
        assert_eq!(made_up.tier.name(), ANONYMOUS);
        assert!(made_up.api_key.is_none());
        let internal = r
            .identify(ip("192.168.3.3"), &headers(&[("x-api-key", b"k-pro")]))
            .unwrap();
        assert_eq!(internal.tier.name(), INTERNAL);
        let label = pro.log_label();
        assert!(
            !label.contains("k-pro") && label.contains("key#"),
            "{label}"
        );
    }

    #[test]
    fn two_api_keys_are_refused() {
        let r = rules();
        let h = headers(&[("x-api-key", b"junk"), ("x-api-key", b"k-pro")]);
        assert_eq!(
            r.identify(ip("1.1.1.1"), &h).map(|c| c.tier),
            Err(IdentityError::AmbiguousApiKey)
        );
    }

    #[test]
    fn hashes_depend_on_the_secret_and_the_kind() {
        let a = rules();
        let mut b = rules();
        b.hasher = IdentityHasher::from_secret(b"another secret, sixteen bytes+");
        let peer = ip("203.0.113.9");
        let ca = a.identify(peer, &HeaderMap::new()).unwrap();
        let cb = b.identify(peer, &HeaderMap::new()).unwrap();
        assert_ne!(ca.ip_hash, cb.ip_hash);
        let name = HeaderName::from_static("x-tenant");
        let twice = headers(&[("x-tenant", b"a"), ("x-tenant", b"b")]);
        assert_eq!(
            a.identity_of(&KeySource::Header(name.clone()), &ca, &inputs(&twice, None)),
            Err(IdentityError::AmbiguousKeyHeader(name))
        );
        assert_ne!(IdentityHasher::per_process(), IdentityHasher::public());
        assert_eq!(IdentityHasher::per_process(), IdentityHasher::per_process());
    }

    fn inputs<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> KeyInputs<'a> {
        KeyInputs {
            headers,
            query,
            host: None,
            route: "/users/*",
            fold_case: false,
        }
    }

    #[test]
    fn values_compared_ignoring_case_share_one_identity() {
        let r = rules();
        let client = r.identify(ip("1.1.1.1"), &HeaderMap::new()).unwrap();
        let tenant = KeySource::Header(HeaderName::from_static("x-tenant"));
        let id = |value: &[u8], fold_case: bool| {
            let h = headers(&[("x-tenant", value)]);
            let inputs = KeyInputs {
                fold_case,
                ..inputs(&h, None)
            };
            r.identity_of(&tenant, &client, &inputs).unwrap()
        };
        assert_ne!(id(b"Acme", false), id(b"acme", false));
        assert_eq!(id(b"Acme", true), id(b"acme", true));
        assert_eq!(id(b"ACME", true), id(b"acme", true));
        assert_eq!(id("ÉCOLE".as_bytes(), true), id("école".as_bytes(), true));
        assert_ne!(id(b"acme", true), id(b"acme2", true));
        // The admin API's lookup folds as requests do.
        let part = KnownPart::Header(&HeaderName::from_static("x-tenant"), b"ACME");
        assert_eq!(r.identity_for(&tenant, &part, true), id(b"acme", true));
        // An API key is a secret: its case is kept.
        let key = KnownPart::ApiKey(b"K-Pro");
        assert_ne!(
            r.identity_for(&KeySource::ApiKey, &key, true),
            r.identity_for(&KeySource::ApiKey, &KnownPart::ApiKey(b"k-pro"), true)
        );
    }

    #[test]
    fn cookies_queries_and_composites_are_read_as_applications_read_them() {
        let r = rules();
        let client = r.identify(ip("203.0.113.9"), &HeaderMap::new()).unwrap();
        let none = HeaderMap::new();
        let id = |key: &KeySource, headers: &HeaderMap, query: Option<&str>| {
            r.identity_of(key, &client, &inputs(headers, query))
        };
        let session = KeySource::Cookie("session".into());
        let a = headers(&[("cookie", b"theme=dark; session=abc")]);
        let split = headers(&[("cookie", b"theme=dark"), ("cookie", b"session=abc")]);
        assert!(id(&session, &a, None).unwrap().is_some());
        assert_eq!(id(&session, &a, None), id(&session, &split, None));
        // Quoted or escaped, as frameworks read it: one session.
        for spelling in [
            &b"session=\"abc\""[..],
            b"session=%61bc",
            b"s%65ssion=a%62c",
        ] {
            let spelled = headers(&[("cookie", spelling)]);
            assert_eq!(id(&session, &spelled, None), id(&session, &a, None));
        }
        assert_eq!(id(&session, &none, None), Ok(None));
        let twice = headers(&[("cookie", b"session=abc; session=def")]);
        assert_eq!(
            id(&session, &twice, None),
            Err(IdentityError::AmbiguousKeyCookie("session".into()))
        );
        // One value however it is spelled; a name spelled twice is ambiguous.
        let user = KeySource::Query("user".into());
        let plain = id(&user, &none, Some("user=ann+lee&x=1")).unwrap();
        assert!(plain.is_some());
        assert_eq!(id(&user, &none, Some("x=1&user=ann%20lee")).unwrap(), plain);
        assert_eq!(id(&user, &none, Some("us%65r=ann+lee")).unwrap(), plain);
        assert_eq!(
            id(&user, &none, Some("user=a&us%65r=b")),
            Err(IdentityError::AmbiguousKeyQuery("user".into()))
        );
        assert_eq!(id(&user, &none, Some("username=x")), Ok(None));
        assert_eq!(id(&user, &none, None), Ok(None));
        // A cookie's value and a query parameter's are different identities.
        let same = headers(&[("cookie", b"user=ann")]);
        assert_ne!(
            id(&KeySource::Cookie("user".into()), &same, None),
            id(&user, &none, Some("user=ann"))
        );
        // Composite: all parts or nothing; the route is the pattern.
        let both = KeySource::Composite(vec![session.clone(), KeySource::Route]);
        assert!(id(&both, &a, None).unwrap().is_some());
        assert_ne!(id(&both, &a, None), id(&session, &a, None));
        assert_eq!(id(&both, &none, None), Ok(None));
        let other_route = KeyInputs {
            route: "/orders",
            ..inputs(&a, None)
        };
        assert_ne!(
            r.identity_of(&both, &client, &other_route),
            id(&both, &a, None)
        );
    }

    #[test]
    fn hosts_compare_without_port_case_or_final_dot() {
        for (host, expected) in [
            ("API.Example.com", "api.example.com"),
            ("api.example.com:8443", "api.example.com"),
            ("api.example.com.", "api.example.com"),
            ("[::1]:8080", "[::1]"),
            ("127.0.0.1:80", "127.0.0.1"),
        ] {
            assert_eq!(normalize_host(host), expected, "{host}");
        }
    }
}
