//! `[block]`: clients refused before anything else, by address, API key or
//! (verified) JWT subject. Keys and subjects are kept as their keyed
//! hashes, never in the clear.

use std::collections::HashSet;

use http::HeaderMap;
use ipnet::IpNet;

use crate::identity::{Client, ClientRules};

/// Why a request is blocked (the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockReason {
    /// The client's address is in `[block].cidrs`.
    Address,
    /// The API key it sends is in `[block].api_keys`.
    ApiKey,
    /// Its verified token's subject is in `[block].jwt_subjects`.
    JwtSubject,
}

impl BlockReason {
    /// Every reason, in a fixed order: the metric's labels, each registered
    /// up front.
    pub const ALL: [BlockReason; 3] = [
        BlockReason::Address,
        BlockReason::ApiKey,
        BlockReason::JwtSubject,
    ];

    /// The reason as the metric's label and the logs spell it (`api_key`).
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::Address => "address",
            BlockReason::ApiKey => "api_key",
            BlockReason::JwtSubject => "jwt_subject",
        }
    }
}

/// The validated `[block]` section.
#[derive(Debug, Clone, Default)]
pub struct Blocklist {
    /// Addresses and networks refused (`[block].cidrs`), matched against the
    /// client's own address, not its IPv6 group.
    pub cidrs: Vec<IpNet>,
    /// Keyed hashes of the blocked API keys (`ClientRules::api_key_hash`).
    pub api_keys: HashSet<u128>,
    /// Keyed hashes of the blocked subjects (`ClientRules::subject_hash`).
    pub jwt_subjects: HashSet<u128>,
    /// The answer's status (default 403).
    pub status: u16,
}

impl Blocklist {
    /// Whether nothing is blocked: then no request is asked about.
    pub fn is_empty(&self) -> bool {
        self.cidrs.is_empty() && self.api_keys.is_empty() && self.jwt_subjects.is_empty()
    }

    /// Why this request is blocked, if it is: its client address, the API
    /// key it sends (known to `[clients.api_keys]` or not), or the subject
    /// of its verified token.
    pub fn blocks(
        &self,
        client: &Client,
        rules: &ClientRules,
        headers: &HeaderMap,
    ) -> Option<BlockReason> {
        if self.cidrs.iter().any(|net| net.contains(&client.address)) {
            return Some(BlockReason::Address);
        }
        if !self.api_keys.is_empty()
            && headers
                .get_all(&rules.api_key_header)
                .iter()
                .any(|key| self.api_keys.contains(&rules.api_key_hash(key.as_bytes())))
        {
            return Some(BlockReason::ApiKey);
        }
        self.blocks_subject(client)
    }

    /// Whether the subject of the client's verified token is blocked (once
    /// its token is known: `blocks` is answered before any signature is
    /// checked).
    pub fn blocks_subject(&self, client: &Client) -> Option<BlockReason> {
        client
            .subject_hash
            .is_some_and(|subject| self.jwt_subjects.contains(&subject))
            .then_some(BlockReason::JwtSubject)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use http::{HeaderName, HeaderValue};

    use super::*;
    use crate::identity::{ForwardedHeader, IdentityHasher, Tiers};

    fn rules() -> ClientRules {
        ClientRules {
            api_key_header: HeaderName::from_static("x-api-key"),
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::XForwardedFor,
            ipv6_prefix: 64,
            internal: Vec::new(),
            api_keys: HashMap::new(),
            run_time: None,
            tiers: Tiers::default(),
            hasher: IdentityHasher::from_secret(b"a blocklist test secret"),
            jwt: None,
        }
    }

    #[test]
    fn each_reason_has_its_label() {
        let labels: Vec<&str> = BlockReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, ["address", "api_key", "jwt_subject"]);
    }

    #[test]
    fn a_blocklist_is_empty_only_when_all_three_lists_are() {
        let mut cidrs = Blocklist::default();
        assert!(cidrs.is_empty());
        cidrs.cidrs.push("203.0.113.0/24".parse().unwrap());
        let keys = Blocklist {
            api_keys: [1].into(),
            ..Blocklist::default()
        };
        let subjects = Blocklist {
            jwt_subjects: [1].into(),
            ..Blocklist::default()
        };
        for one in [cidrs, keys, subjects] {
            assert!(!one.is_empty(), "{one:?}");
        }
    }

    #[test]
    fn a_client_is_blocked_by_its_address_any_key_it_sends_or_its_subject() {
        let rules = rules();
        let block = Blocklist {
            cidrs: vec!["203.0.113.0/24".parse().unwrap()],
            api_keys: [rules.api_key_hash(b"stolen")].into(),
            jwt_subjects: [rules.subject_hash(b"mallory")].into(),
            status: 403,
        };
        let client = |address: &str, subject: Option<&[u8]>| {
            let mut client = rules
                .identify(address.parse().unwrap(), &HeaderMap::new())
                .unwrap();
            client.subject_hash = subject.map(|s| rules.subject_hash(s));
            client
        };
        let keys = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append("x-api-key", HeaderValue::from_static(value));
            }
            headers
        };
        let blocks = |client: &Client, headers: &HeaderMap| block.blocks(client, &rules, headers);
        let (anyone, none) = (client("198.51.100.1", None), keys(&[]));
        assert_eq!(
            blocks(&client("203.0.113.9", None), &none),
            Some(BlockReason::Address)
        );
        assert_eq!(blocks(&anyone, &none), None);
        assert_eq!(
            blocks(&anyone, &keys(&["stolen"])),
            Some(BlockReason::ApiKey)
        );
        assert_eq!(
            blocks(&anyone, &keys(&["mine", "stolen"])),
            Some(BlockReason::ApiKey)
        );
        assert_eq!(blocks(&anyone, &keys(&["mine"])), None);
        let mallory = client("198.51.100.1", Some(b"mallory"));
        assert_eq!(blocks(&mallory, &none), Some(BlockReason::JwtSubject));
        assert_eq!(
            block.blocks_subject(&mallory),
            Some(BlockReason::JwtSubject)
        );
        let alice = client("198.51.100.1", Some(b"alice"));
        assert_eq!(block.blocks_subject(&alice), None);
        assert_eq!(blocks(&alice, &keys(&["mine"])), None);
    }
}
