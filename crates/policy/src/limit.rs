//! A `[[limits]]` entry as the config validates it: what it counts, on
//! which key, what it does with a request that lacks the key, and its ban.

use floodgate_algorithm::Algorithm;
use floodgate_limiter::{
    Check, Enforcement, Leasing, LimitId, LimitName, OnFailure, Spending, StateKey,
};

use crate::identity::{KeySource, Tier};
use crate::{ChargedByResponse, CostSource, LimitMatch, Matcher, ResponseCost};

/// Whether an upgraded connection (a WebSocket) keeps its request's
/// concurrency slot for its lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrades {
    /// An upgraded connection keeps its slot until it closes (the default).
    Include,
    /// The slot is given back once the upgrade (101) is answered.
    Exclude,
}

/// A concurrency limit's numbers: at most `max` requests in flight per
/// key, each slot held under a lease of `lease_us`, renewed while the
/// request lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    /// The most requests in flight per key.
    pub max: u64,
    /// How long a slot is held without renewal, in microseconds: the slot of
    /// a holder that died comes back after it.
    pub lease_us: u64,
    /// Whether an upgraded connection keeps its slot for its lifetime.
    pub upgrades: Upgrades,
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Requests (or their cost) over time.
    Rate(Algorithm),
    /// Requests in flight.
    Concurrency(Concurrency),
}

impl Rule {
    /// Whether `other` counts the same way (an override's numbers apply
    /// only to the algorithm they were checked for).
    pub fn same_kind(&self, other: &Rule) -> bool {
        match (self, other) {
            (Rule::Rate(a), Rule::Rate(b)) => a.kind() == b.kind(),
            (Rule::Concurrency(_), Rule::Concurrency(_)) => true,
            _ => false,
        }
    }

    /// The number a client sees as its quota.
    pub fn quota(&self) -> u64 {
        match self {
            Rule::Rate(algorithm) => algorithm.quota(),
            Rule::Concurrency(c) => c.max,
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Rate(algorithm) => algorithm.fmt(f),
            Rule::Concurrency(c) => write!(
                f,
                "concurrency max={} lease={}s{}",
                c.max,
                c.lease_us as f64 / 1e6,
                if c.upgrades == Upgrades::Exclude {
                    " upgrades=exclude"
                } else {
                    ""
                }
            ),
        }
    }
}

/// `ban`: after `after` refusals by the limit within `within`, the key is
/// refused on every route for `duration`. Both are kept as limits of
/// their own on the limit's identity, so they live in the same store
/// (shared on Redis) and expire as any state does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ban {
    /// Refusals seen: a sliding log of `after` within `within`; full means
    /// the key is banned.
    pub strikes: Algorithm,
    /// The strikes' name (`strikes:<limit>`): what logs, metrics and Redis keys
    /// call them.
    pub strikes_name: LimitName,
    /// The strikes' state id, a hash of their name: their state survives a
    /// reload that keeps the limit.
    pub strikes_id: u64,
    /// The ban itself: one token that comes back after `duration`. Taking
    /// it bans; a key whose token is gone is banned until it returns.
    pub penalty: Algorithm,
    /// The ban's name (`ban:<limit>`): what logs, metrics and Redis keys call it.
    pub penalty_name: LimitName,
    /// The ban's state id, a hash of its name: a ban survives a reload that
    /// keeps the limit.
    pub penalty_id: u64,
}

impl Ban {
    /// The ban of `identity` looked up (`Spending::Peek`) or taken
    /// (`Spending::Charge`), for limit `layer`.
    pub fn penalty_check(&self, limit: LimitId, identity: u128, spending: Spending) -> Check {
        self.check(
            limit,
            &self.penalty_name,
            self.penalty,
            self.penalty_id,
            identity,
            spending,
        )
    }

    /// One strike on `identity` toward limit `layer`'s ban.
    pub fn strike_check(&self, limit: LimitId, identity: u128) -> Check {
        self.check(
            limit,
            &self.strikes_name,
            self.strikes,
            self.strikes_id,
            identity,
            Spending::Charge,
        )
    }

    fn check(
        &self,
        limit: LimitId,
        name: &LimitName,
        algorithm: Algorithm,
        id: u64,
        identity: u128,
        spending: Spending,
    ) -> Check {
        Check {
            limit,
            name: name.clone(),
            algorithm,
            key: StateKey {
                limit: id,
                identity,
            },
            cost: 1,
            enforcement: Enforcement::Enforce,
            spending,
            // Without the store, no ban is known: a ban never fails closed
            // (every route would answer "banned").
            on_failure: OnFailure::Allow,
            leasing: Leasing::Never,
        }
    }
}

/// What a limit does with a request that lacks its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissing {
    /// The limit does not apply.
    #[default]
    Skip,
    /// 400 `missing_key`.
    Deny,
    /// Keyed on the client's address instead.
    Ip,
}

impl OnMissing {
    /// As the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnMissing::Skip => "skip",
            OnMissing::Deny => "deny",
            OnMissing::Ip => "ip",
        }
    }
}

/// One `[[limits]]` entry, validated.
#[derive(Debug, Clone)]
pub struct Limit {
    /// The limit's name as the config spells it: what logs, headers, metrics
    /// and Redis keys call it.
    pub name: LimitName,
    /// Identifies this limit's state; derived from the name so that state
    /// survives a reload that keeps the limit.
    pub id: u64,
    /// Whose budget a request spends: what the limit's key reads from the
    /// request (`ip`, `api_key`, `header:<Name>`, a list of them...).
    pub key: KeySource,
    /// The limit's numbers, for a client whose tier has none of its own: a rate
    /// (its algorithm) or a concurrency limit.
    pub rule: Rule,
    /// `[limits.tiers.<tier>]`: the numbers of clients in these tiers, in place
    /// of `rule` (of the same kind).
    pub tiers: Vec<(Tier, Rule)>,
    /// The limit's `match`: which requests it meets.
    pub matcher: LimitMatch,
    /// Enforced, or a shadow limit: one that counts and reports what it
    /// would refuse, but never refuses.
    pub enforcement: Enforcement,
    /// What decides this limit while Redis is away: its own `on_failure`,
    /// else `[redis].on_failure`, resolved when the config is loaded.
    pub on_failure: OnFailure,
    /// Charged by the response (`count` or `cost_from_response`): a
    /// reservation taken when the request arrives, settled once the
    /// upstream answers.
    pub charged_by_response: Option<ChargedByResponse>,
    /// `ban`: the key refused on every route for a while after repeated
    /// refusals by this limit; none when the limit does not ban.
    pub ban: Option<Ban>,
    /// What a request without the limit's key meets: the limit skipped, a 400,
    /// or the limit applied by address.
    pub on_missing: OnMissing,
    /// Header, cookie and query values compared ignoring case, as the
    /// application compares them.
    pub case_insensitive_values: bool,
    /// Decided from leases of the shared budget where one is held.
    pub leases: bool,
}

impl Limit {
    /// The limit's rate layer on `identity`, at `algorithm`'s numbers (its
    /// own, its tier's or an override's) and `cost`: how a request's plan,
    /// the rate limit service and the admin API each make one.
    pub fn check(&self, id: LimitId, algorithm: Algorithm, identity: u128, cost: u64) -> Check {
        Check {
            limit: id,
            name: self.name.clone(),
            algorithm,
            key: StateKey {
                limit: self.id,
                identity,
            },
            cost,
            enforcement: self.enforcement,
            spending: Spending::Charge,
            on_failure: self.on_failure,
            leasing: if self.leases {
                Leasing::Allowed
            } else {
                Leasing::Never
            },
        }
    }

    /// Whether the limit reads the request's body: a key or a match on a
    /// field, or a reservation from the request.
    pub fn reads_body(&self) -> bool {
        !self.matcher.body().is_empty()
            || self.key.any_part(|p| matches!(p, KeySource::Body(_)))
            || matches!(&self.charged_by_response, Some(ChargedByResponse::Cost(c)) if c.from_request || c.include_usage)
    }

    /// Adds the body's fields this limit reads to `fields`, once each.
    pub(crate) fn body_fields_read(&self, fields: &mut Vec<Box<str>>) {
        let mut add = |field: &str| {
            if !fields.iter().any(|f| &**f == field) {
                fields.push(field.into());
            }
        };
        for (field, _) in self.matcher.body() {
            add(field);
        }
        if let KeySource::Composite(parts) = &self.key {
            for part in parts {
                if let KeySource::Body(field) = part {
                    add(field);
                }
            }
        } else if let KeySource::Body(field) = &self.key {
            add(field);
        }
        if let Some(ChargedByResponse::Cost(ResponseCost {
            from_request: true,
            source: CostSource::Usage { provider, .. },
            ..
        })) = &self.charged_by_response
        {
            for field in provider.answer_limits() {
                add(field);
            }
        }
    }

    /// The numbers a client of `tier` gets: its tier's, else the limit's own.
    pub fn rule_for(&self, tier: &Tier) -> Rule {
        self.tiers
            .iter()
            .find(|(t, _)| t == tier)
            .map_or(self.rule, |&(_, r)| r)
    }
}

/// One `[[costs]]` entry.
#[derive(Debug, Clone)]
pub struct CostRule {
    /// The entry's `match`: the requests it prices.
    pub matcher: Matcher,
    /// What such a request costs each limit it prices, in the limit's units
    /// (a request no entry prices costs 1).
    pub cost: u64,
    /// The limits (their indexes) it prices; every limit when empty.
    pub limits: Vec<usize>,
}
