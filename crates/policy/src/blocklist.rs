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
