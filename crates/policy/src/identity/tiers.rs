//! Tiers: "anonymous", "internal" and those `[clients.api_keys]` names,
//! interned once per configuration.

use std::sync::Arc;

/// The tier of a client with neither a listed key, nor a tiered token, nor
/// an internal address.
pub const ANONYMOUS: &str = "anonymous";
/// The tier of a client whose address is in `[clients].internal`, whatever
/// it sends.
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
    /// The tier's name, as the configuration and the logs spell it.
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

    /// The tier of this name; none when the configuration names no such tier.
    pub fn get(&self, name: &str) -> Option<Tier> {
        self.known.iter().find(|t| t.name() == name).cloned()
    }

    /// The `anonymous` tier, of clients no key, token or address places.
    pub fn anonymous(&self) -> Tier {
        self.known[0].clone()
    }

    /// The `internal` tier, of clients from `[clients].internal` addresses.
    pub fn internal(&self) -> Tier {
        self.known[1].clone()
    }

    /// Every tier's name, anonymous and internal first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.known.iter().map(Tier::name)
    }
}
