//! Keyed hashing of identities: what stands for a client in limit state,
//! never the raw value.

use std::hash::Hasher;
use std::sync::OnceLock;

use siphasher::sip128::{Hasher128, SipHasher13};

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
pub(super) enum Kind {
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
    Entry = 11,
    Descriptor = 12,
    Body = 13,
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

    pub(super) fn hash(&self, kind: Kind, bytes: &[u8]) -> u128 {
        let mut h = SipHasher13::new_with_key(&self.key);
        h.write_u8(kind as u8);
        h.write(bytes);
        h.finish128().as_u128()
    }
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
