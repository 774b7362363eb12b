//! Where a key's parts are read: from a request on its way (every part it
//! carries), or from one part an operator names (the admin API's lookups).
//! `ClientRules::identity_from` walks a `KeySource` once for either, so that
//! a request and a lookup cannot hash a part two ways and miss each other's
//! state.

use std::borrow::Cow;

use http::HeaderName;

use std::net::IpAddr;

use super::error::IdentityError;
use super::keys::{cookie, query_parameter, KeyInputs, KnownPart};
use crate::descriptors::Entries;
use crate::jwt::{ClaimPath, TokenCheck};

/// A client's address or API key: its identity, worked out when a request
/// was identified, or the value an operator named, still to be hashed.
pub(super) enum Known<T> {
    Identity(u128),
    Named(T),
}

/// The parts of a key one source can give. `None` is "not here": the
/// request lacks it, or the named part is another.
pub(super) trait KeyParts {
    /// Header, cookie and query values are read ignoring case.
    fn fold_case(&self) -> bool;
    fn ip(&self) -> Option<Known<IpAddr>>;
    fn api_key(&self) -> Option<Known<&[u8]>>;
    fn header(&self, name: &HeaderName) -> Result<Option<&[u8]>, IdentityError>;
    fn cookie(&self, name: &str) -> Result<Option<Cow<'_, [u8]>>, IdentityError>;
    fn query(&self, name: &str) -> Result<Option<Cow<'_, [u8]>>, IdentityError>;
    fn claim(&self, path: &ClaimPath) -> Option<Cow<'_, [u8]>>;
    /// What only a whole request has: a host, a route.
    fn whole(&self) -> Option<&KeyInputs<'_>>;
    /// Whether every part a key may read is here (a request, or a
    /// descriptor), not one part alone: what everyone's key and a
    /// composite key need.
    fn complete(&self) -> bool;
    /// A rate limit service descriptor's entry.
    fn entry(&self, key: &str) -> Option<&[u8]>;
    /// The whole descriptor.
    fn descriptor(&self) -> Option<&Entries<'_>>;
}

/// A request being identified: its client as `ClientRules::identify`
/// found it, and what the key may read beyond.
pub(super) struct RequestParts<'r> {
    pub ip_identity: u128,
    pub api_key_identity: Option<u128>,
    pub token: Option<&'r TokenCheck>,
    pub inputs: &'r KeyInputs<'r>,
}

impl KeyParts for RequestParts<'_> {
    fn fold_case(&self) -> bool {
        self.inputs.fold_case
    }

    fn ip(&self) -> Option<Known<IpAddr>> {
        Some(Known::Identity(self.ip_identity))
    }

    fn api_key(&self) -> Option<Known<&[u8]>> {
        self.api_key_identity.map(Known::Identity)
    }

    fn header(&self, name: &HeaderName) -> Result<Option<&[u8]>, IdentityError> {
        let mut values = self.inputs.headers.get_all(name).iter();
        let value = values.next();
        // Two values: the application may read either.
        if values.next().is_some() {
            return Err(IdentityError::AmbiguousKeyHeader(name.clone()));
        }
        Ok(value.map(|v| v.as_bytes()))
    }

    fn cookie(&self, name: &str) -> Result<Option<Cow<'_, [u8]>>, IdentityError> {
        Ok(cookie(self.inputs.headers, name)?.map(Cow::Owned))
    }

    fn query(&self, name: &str) -> Result<Option<Cow<'_, [u8]>>, IdentityError> {
        Ok(query_parameter(self.inputs.query, name)?.map(Cow::Owned))
    }

    fn claim(&self, path: &ClaimPath) -> Option<Cow<'_, [u8]>> {
        let claims = self.token.and_then(TokenCheck::claims)?;
        claims.get(path).map(Cow::Owned)
    }

    fn whole(&self) -> Option<&KeyInputs<'_>> {
        Some(self.inputs)
    }

    fn complete(&self) -> bool {
        true
    }

    fn entry(&self, _: &str) -> Option<&[u8]> {
        None
    }

    fn descriptor(&self) -> Option<&Entries<'_>> {
        None
    }
}

/// One part of a client an operator names.
pub(super) struct OnePart<'p> {
    pub part: &'p KnownPart<'p>,
    pub fold_case: bool,
}

impl KeyParts for OnePart<'_> {
    fn fold_case(&self) -> bool {
        self.fold_case
    }

    fn ip(&self) -> Option<Known<IpAddr>> {
        match self.part {
            KnownPart::Ip(ip) => Some(Known::Named(*ip)),
            _ => None,
        }
    }

    fn api_key(&self) -> Option<Known<&[u8]>> {
        match self.part {
            KnownPart::ApiKey(key) => Some(Known::Named(*key)),
            KnownPart::ApiKeyHash(hash) => Some(Known::Identity(*hash)),
            _ => None,
        }
    }

    fn header(&self, name: &HeaderName) -> Result<Option<&[u8]>, IdentityError> {
        Ok(match self.part {
            KnownPart::Header(asked, value) if *asked == name => Some(*value),
            _ => None,
        })
    }

    fn cookie(&self, name: &str) -> Result<Option<Cow<'_, [u8]>>, IdentityError> {
        Ok(match self.part {
            KnownPart::Cookie(asked, value) if *asked == name => Some(Cow::Borrowed(*value)),
            _ => None,
        })
    }

    fn query(&self, name: &str) -> Result<Option<Cow<'_, [u8]>>, IdentityError> {
        Ok(match self.part {
            KnownPart::Query(asked, value) if *asked == name => Some(Cow::Borrowed(*value)),
            _ => None,
        })
    }

    fn claim(&self, path: &ClaimPath) -> Option<Cow<'_, [u8]>> {
        match self.part {
            KnownPart::Claim(asked, value) if *asked == path => Some(Cow::Borrowed(*value)),
            _ => None,
        }
    }

    fn whole(&self) -> Option<&KeyInputs<'_>> {
        None
    }

    fn complete(&self) -> bool {
        false
    }

    fn entry(&self, key: &str) -> Option<&[u8]> {
        match self.part {
            KnownPart::Entry(asked, value) if *asked == key => Some(*value),
            _ => None,
        }
    }

    fn descriptor(&self) -> Option<&Entries<'_>> {
        None
    }
}

/// One descriptor of a rate limit service request: its entries, and
/// nothing of HTTP.
pub(super) struct DescriptorParts<'d> {
    pub entries: &'d Entries<'d>,
}

impl KeyParts for DescriptorParts<'_> {
    fn fold_case(&self) -> bool {
        false
    }

    fn ip(&self) -> Option<Known<IpAddr>> {
        None
    }

    fn api_key(&self) -> Option<Known<&[u8]>> {
        None
    }

    fn header(&self, _: &HeaderName) -> Result<Option<&[u8]>, IdentityError> {
        Ok(None)
    }

    fn cookie(&self, _: &str) -> Result<Option<Cow<'_, [u8]>>, IdentityError> {
        Ok(None)
    }

    fn query(&self, _: &str) -> Result<Option<Cow<'_, [u8]>>, IdentityError> {
        Ok(None)
    }

    fn claim(&self, _: &ClaimPath) -> Option<Cow<'_, [u8]>> {
        None
    }

    fn whole(&self) -> Option<&KeyInputs<'_>> {
        None
    }

    fn complete(&self) -> bool {
        true
    }

    fn entry(&self, key: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_bytes())
    }

    fn descriptor(&self) -> Option<&Entries<'_>> {
        Some(self.entries)
    }
}
