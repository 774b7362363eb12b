//! `[exempt]`: the paths and the tiers no limit applies to.

use super::file::ExemptSection;
use super::limits::sorted;
use super::{at, Invalid};
use floodgate_policy::identity::{Tier, Tiers};
use floodgate_policy::PathPattern;

/// The tiers must be known; the paths are compiled as every path pattern is.
pub(super) fn validate_exempt(
    e: &ExemptSection,
    known_tiers: &Tiers,
    compile_pattern: &dyn Fn(&str) -> Result<PathPattern, String>,
) -> Result<(Vec<PathPattern>, Vec<Tier>), Invalid> {
    let mut tiers = Vec::new();
    for (i, tier) in e.tiers.iter().enumerate() {
        let Some(tier) = known_tiers.get(tier) else {
            return Err(at(
                &[&"exempt", &"tiers", &i],
                format!("unknown tier \"{tier}\" (known: {})", sorted(known_tiers)),
            ));
        };
        tiers.push(tier);
    }
    let paths = e
        .paths
        .iter()
        .enumerate()
        .map(|(i, p)| compile_pattern(p).map_err(|m| at(&[&"exempt", &"paths", &i], m)))
        .collect::<Result<_, _>>()?;
    Ok((paths, tiers))
}
