//! Tiers: "anonymous", "internal" and those `[clients.api_keys]` names,
//! interned once per configuration.

use std::sync::Arc;

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
