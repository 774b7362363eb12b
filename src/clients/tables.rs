//! The in-process tables of run-time clients that requests read, shared by
//! what keeps them (a file, Redis).

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::overrides::{OverrideChecker, StoredOverride};
use floodgate_policy::identity::RunTimeKeys;
use floodgate_policy::overrides::{Override, OverrideKey, RunTimeOverrides};

/// The in-process tables requests read, and what reads kept overrides.
#[derive(Clone)]
pub struct Tables {
    pub keys: Arc<RunTimeKeys>,
    pub overrides: Arc<RunTimeOverrides>,
    /// The running configuration's reading of kept numbers (a reload
    /// swaps it, and every override is read again).
    pub checker: Arc<ArcSwap<OverrideChecker>>,
}

impl Tables {
    /// Kept overrides as the running configuration reads them.
    pub(super) fn read(
        &self,
        kept: Vec<(OverrideKey, StoredOverride)>,
    ) -> Vec<(OverrideKey, Override)> {
        let checker = self.checker.load();
        kept.into_iter()
            .map(|(key, stored)| (key, checker.entry(stored)))
            .collect()
    }
}
