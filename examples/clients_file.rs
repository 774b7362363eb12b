//! Writes a `[admin].clients_file` for load tests: `KEYS` run-time API keys
//! (`run-time-key-0000000` ...) of a tier, and `OVERRIDES` overrides under a
//! limit keyed on `query:<name>` (values `000000` ...), hashed as the
//! config at `CONFIG` hashes them (its identity secret, from
//! `FLOODGATE_IDENTITY_SECRET` or the file).
//!
//!   cargo run --release --example clients_file -- CONFIG OUT KEYS TIER OVERRIDES LIMIT

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use floodgate::clients::{OverrideChecker, RunTimeClients, Tables};
use floodgate::config::{Config, Inputs};
use floodgate_algorithm::Algorithm;
use floodgate_policy::identity::{KeyEntry, KeySource, KnownPart};
use floodgate_policy::overrides::{Override, OverrideKey};
use floodgate_policy::Rule;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, out, keys, tier, overrides, limit] = args.as_slice() else {
        bail!("usage: clients_file CONFIG OUT KEYS TIER OVERRIDES LIMIT");
    };
    let (keys, overrides): (u64, u64) = (keys.parse()?, overrides.parse()?);
    let inputs = Inputs::from_process();
    let config = Config::load(&PathBuf::from(config), &inputs).context("config")?;
    let rules = &config.policy.clients;
    let Some(limit) = config
        .policy
        .limits
        .iter()
        .find(|l| l.name.as_str() == limit)
    else {
        bail!("no limit {limit:?}");
    };
    let KeySource::Query(name) = &limit.key else {
        bail!(
            "limit {:?} is not keyed on query:<name>",
            limit.name.as_str()
        );
    };
    let tier: Arc<str> = Arc::from(tier.as_str());
    let key_entries: Vec<(u128, KeyEntry)> = (0..keys)
        .map(|i| {
            let key = format!("run-time-key-{i:07}");
            (
                rules.api_key_hash(key.as_bytes()),
                KeyEntry {
                    tier: Some(tier.clone()),
                    set_at: 1_700_000_000,
                    label: None,
                },
            )
        })
        .collect();
    // Twice the file's numbers, as a raise would be.
    let Rule::Rate(own) = limit.rule else {
        bail!("limit {:?} is no rate", limit.name.as_str());
    };
    let raised = Algorithm::fixed_window(own.quota() * 2, own.period_us())?;
    let numbers = format!(
        "{{\"limit\":{},\"window\":\"{}s\"}}",
        raised.quota(),
        raised.period_us() / 1_000_000
    );
    let override_entries: Vec<(OverrideKey, Option<Override>)> = (0..overrides)
        .map(|i| {
            let value = format!("{i:06}");
            let part = KnownPart::Query(name, value.as_bytes());
            let identity = rules
                .identity_for(&limit.key, &part, limit.case_insensitive_values)
                .context("an identity")?;
            Ok((
                OverrideKey {
                    limit: limit.id,
                    identity,
                },
                Some(Override {
                    limit_name: Arc::from(limit.name.as_str()),
                    rule: Ok(Rule::Rate(raised)),
                    numbers: numbers.clone().into(),
                    expires_at_s: None,
                    set_at_s: 1_700_000_000,
                    client: format!("query {name}").into(),
                    label: None,
                }),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let tables = Tables {
        keys: Arc::default(),
        overrides: Arc::default(),
        checker: Arc::new(arc_swap::ArcSwap::from_pointee(OverrideChecker::of(
            &config,
        ))),
    };
    let _ = std::fs::remove_file(out);
    let clients = RunTimeClients::local(tables, Some(PathBuf::from(out)))?;
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    runtime.block_on(async {
        clients.set(key_entries).await?;
        clients.set_overrides(override_entries).await
    })?;
    println!("{out}: {keys} keys, {overrides} overrides");
    Ok(())
}
