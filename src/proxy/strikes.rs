//! A refusal's strike toward its limit's ban, and the ban it completes.

use log::warn;

use super::ctx::RequestCtx;
use super::verdict::OutcomeKind;
use crate::proxy::headers;
use floodgate_limiter::{Deciding, Enforcement, Spending, Store};
use floodgate_policy::identity::Client;

/// After a refusal by limits that ban: one strike on each refused key,
/// and a ban for a key whose strikes are full. Each ban is taken once
/// (its one token), so it is counted and logged once, by the instance
/// that took it.
///
/// Not while the shared store is away: a strike or a ban kept by one
/// instance alone (on its share of the numbers) would ban for what the
/// others never saw. Nor for a request whose cost exceeds the limit: no
/// wait helps it, so its retries are a misconfigured client, not a
/// hammering one.
pub(super) async fn strike(store: &dyn Store, ctx: &RequestCtx) {
    let Some(verdict) = ctx.verdict.as_ref().filter(|v| v.refused()) else {
        return;
    };
    // Decided without the shared store, or answered without it now (an
    // open answer is no strike, and no ban was taken).
    let away = || store.deciding() == Deciding::Fallback;
    if verdict.deciding == Deciding::Fallback || away() {
        return;
    }
    let policy = &ctx.runtime.policy;
    for o in &verdict.outcomes {
        if o.enforcement == Enforcement::Shadow
            || o.kind == OutcomeKind::Ban
            || o.decision.allowed()
            || o.decision.cost_exceeds_limit()
        {
            continue;
        }
        let limit = &policy.limits[o.limit.index()];
        let Some(ban) = &limit.ban else {
            continue;
        };
        let strike = ban.strike_check(o.limit, o.identity);
        let struck = match store.decide(std::slice::from_ref(&strike)).await {
            Ok(d) => d[0],
            Err(e) => {
                warn!("could not count a refusal toward {}'s ban: {e}", limit.name);
                continue;
            }
        };
        // Full after this strike (or already full): `after` refusals
        // within `within`.
        if away() || (struck.allowed() && struck.remaining() > 0) {
            continue;
        }
        let penalty = ban.penalty_check(o.limit, o.identity, Spending::Charge);
        match store.decide(std::slice::from_ref(&penalty)).await {
            Ok(d) if d[0].allowed() && !away() => {
                ctx.runtime.counters(o.limit).bans.inc();
                warn!(
                    "banned: {} limit={} for {}s after {} refusals within {}s request_id={}",
                    ctx.client
                        .as_ref()
                        .map_or_else(String::new, Client::log_label),
                    limit.name,
                    headers::ceil_secs(ban.penalty.window_us()),
                    ban.strikes.quota(),
                    headers::ceil_secs(ban.strikes.window_us()),
                    ctx.request_id
                );
            }
            Ok(_) => {}
            Err(e) => warn!("could not ban a key of {}: {e}", limit.name),
        }
    }
}
