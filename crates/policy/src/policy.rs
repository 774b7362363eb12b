//! The compiled limits: which layers apply to a request, with which numbers
//! (tier overrides applied) and which cost.

use http::{HeaderMap, Method};

use crate::blocklist::Blocklist;
use crate::body::BodyFields;
use crate::identity::{Client, ClientRules, IdentityError, KeyInputs, Tier};
use crate::overrides::RunTimeOverrides;
use crate::path::PathRules;
use crate::request_id::lease_id;
use crate::{Ban, ChargedByResponse, CostRule, Limit, OnMissing, Rule, Upgrades};
use floodgate_limiter::{Check, Enforcement, LimitId, OnFailure, Slot, Spending, StateKey};
use std::sync::Arc;

pub use crate::descriptors::{
    remote_address, DescriptorPattern, Entries, EntryPattern, MAX_DESCRIPTOR_TEXT, MAX_ENTRIES,
    REMOTE_ADDRESS,
};
pub use crate::glob::PathPattern;
pub use crate::identity::KeySource;

/// What the limits look at in a request.
#[derive(Clone, Copy)]
pub struct RequestView<'a> {
    /// The request's method, as sent.
    pub method: &'a Method,
    /// Normalised (`path`), and lower-cased when `paths.case_insensitive`.
    pub path: &'a str,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The raw query string.
    pub query: Option<&'a str>,
    /// The host asked for, normalised (`identity::normalize_host`).
    pub host: Option<&'a str>,
    /// Who is asking: address, API key, tier and token, as identified.
    pub client: &'a Client,
    /// The body's fields some limit reads, when it was read.
    pub body: Option<&'a BodyFields>,
}

/// What the limits make of one request (`Policy::plan`).
#[derive(Debug)]
pub enum Plan {
    /// Forward untouched: no limit, no headers.
    Exempt,
    /// Take these slots and decide these layers (possibly none) before
    /// forwarding.
    Check(Layers),
}

/// The layers that apply to one request.
#[derive(Debug, Default)]
pub struct Layers {
    /// The rate layers: checks the store decides, all or none, in one call
    /// with the bans.
    pub checks: Vec<Check>,
    /// Layers charged by the response, each with its reservation (the
    /// check's cost): reserved now, settled once the response is known.
    pub reservations: Vec<(Check, ChargedByResponse)>,
    /// The bans of every limit that bans, on this request's identities:
    /// peeked before anything else, on every route.
    pub bans: Vec<Check>,
    /// Concurrency layers: each with its limit, slot, upgrades and
    /// enforcement.
    pub slots: Vec<SlotLayer>,
    /// Where a refusal by a limit keyed with `route` that bans is struck:
    /// not its layer's identity (one per route) but the rest of its key,
    /// the one its ban is looked up on. Empty without such limits.
    pub struck_on: Vec<StruckOn>,
}

/// The identity a route-keyed limit's refusal strikes, and its ban then
/// holds on: the same on every route, so that `after` refusals ban
/// whichever of the limit's routes they were on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StruckOn {
    /// The limit that bans.
    pub limit: LimitId,
    /// The identity its layer counts on (the key on this route).
    pub counted: u128,
    /// The identity its strikes and ban are kept on (the key without it).
    pub banned: u128,
}

impl Layers {
    /// The identity a refusal of `limit`'s layer counted on `counted`
    /// strikes.
    pub fn struck_on(struck_on: &[StruckOn], limit: LimitId, counted: u128) -> u128 {
        struck_on
            .iter()
            .find(|s| s.limit == limit && s.counted == counted)
            .map_or(counted, |s| s.banned)
    }
}

impl Layers {
    /// Whether no layer applies: nothing to decide, no rate-limit headers.
    pub fn is_empty(&self) -> bool {
        self.checks.is_empty()
            && self.reservations.is_empty()
            && self.slots.is_empty()
            && self.bans.is_empty()
    }
}

/// A concurrency layer of one request.
#[derive(Debug, Clone)]
pub struct SlotLayer {
    /// The limit the slot belongs to (its place in `Policy::limits`).
    pub limit: LimitId,
    /// The slot to take: the limit's state key, its `max` and lease.
    pub slot: Slot,
    /// Whether an upgraded connection keeps the slot for its lifetime.
    pub upgrades: Upgrades,
    /// Enforced, or a shadow limit's slot: counted and reported, never
    /// refusing.
    pub enforcement: Enforcement,
}

/// Everything `[clients]`, `[exempt]`, `[[limits]]` and `[[costs]]` say.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `[clients]`: how a request's client is told (address, API key, token)
    /// and its tier.
    pub clients: ClientRules,
    /// `[block]`: refused before anything else.
    pub block: Blocklist,
    /// How request paths are normalised and matched.
    pub paths: PathRules,
    /// `[exempt].paths`: requests to these are forwarded untouched, without
    /// rate-limit headers.
    pub exempt_paths: Vec<PathPattern>,
    /// `[exempt].tiers`: requests from clients of these tiers are forwarded
    /// untouched, without rate-limit headers.
    pub exempt_tiers: Vec<Tier>,
    /// The `[[limits]]` entries, in the file's order: a layer's `LimitId` is
    /// its place here.
    pub limits: Vec<Limit>,
    /// The `[[costs]]` entries, in the file's order: the first that fits prices
    /// a request.
    pub costs: Vec<CostRule>,
    /// `[redis].on_failure`, for limits that do not set their own.
    pub default_on_failure: OnFailure,
    /// Whether any limit or cost reads the host (most read none, and a
    /// request's host is then not worked out).
    pub reads_host: bool,
    /// The limits keyed on a token's claim.
    claim_limits: Vec<usize>,
    /// The limits of the rate limit service (matched by descriptors).
    descriptor_limits: Vec<usize>,
    /// The limits that read the request's body, and the top-level fields
    /// they read among them.
    body_limits: Vec<usize>,
    /// The top-level body fields some limit reads: all a read body is searched
    /// for.
    pub body_fields: Vec<Box<str>>,
    /// Whether a tier can change what happens to a request: some limit has
    /// numbers per tier, or some tier is exempt.
    tiers_matter: bool,
    /// Clients' own numbers set at run time (with the admin API on).
    pub overrides: Option<Arc<RunTimeOverrides>>,
    /// `[server].max_body`: the most of a body read before its decision.
    pub max_body: usize,
}

impl Policy {
    /// The policy of these settings and limits, with what a request's plan
    /// needs worked out once: which limits read the host, claims, descriptors
    /// or the body. No overrides; `max_body` 1 MiB.
    pub fn new(
        clients: ClientRules,
        paths: PathRules,
        (exempt_paths, exempt_tiers): (Vec<PathPattern>, Vec<Tier>),
        block: Blocklist,
        limits: Vec<Limit>,
        costs: Vec<CostRule>,
        default_on_failure: OnFailure,
    ) -> Policy {
        let reads_host = limits
            .iter()
            .any(|l| l.matcher.names_hosts() || l.key.any_part(|p| *p == KeySource::Host))
            || costs.iter().any(|c| !c.matcher.hosts.is_empty());
        let claim_limits = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.key.any_part(|p| matches!(p, KeySource::Jwt(_))))
            .map(|(i, _)| i)
            .collect();
        let tiers_matter = !exempt_tiers.is_empty() || limits.iter().any(|l| !l.tiers.is_empty());
        let descriptor_limits = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.matcher.descriptors().is_some())
            .map(|(i, _)| i)
            .collect();
        let mut body_fields: Vec<Box<str>> = Vec::new();
        let body_limits = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                l.body_fields_read(&mut body_fields);
                l.reads_body()
            })
            .map(|(i, _)| i)
            .collect();
        Policy {
            clients,
            block,
            paths,
            exempt_paths,
            exempt_tiers,
            limits,
            costs,
            default_on_failure,
            reads_host,
            claim_limits,
            descriptor_limits,
            body_limits,
            body_fields,
            tiers_matter,
            overrides: None,
            max_body: 1 << 20,
        }
    }

    /// Whether the request's body is to be read before its decision: some
    /// limit its head matches reads it.
    pub fn reads_body(&self, request: &RequestView<'_>) -> bool {
        self.body_limits
            .iter()
            .filter_map(|&i| self.limits.get(i))
            .any(|l| l.matcher.applies_but_for_body(request))
    }

    /// The numbers `limit` applies to the client `identity` in `tier`: its
    /// own, set at run time, or else its tier's.
    pub fn rule_in_force(&self, limit: &Limit, tier: &Tier, identity: u128) -> Rule {
        self.overridden(limit, identity, limit.rule_for(tier))
    }

    /// `own`, or the numbers set at run time for the client `identity`
    /// under `limit`.
    pub fn overridden(&self, limit: &Limit, identity: u128, own: Rule) -> Rule {
        let Some(table) = self.overrides.as_deref().filter(|t| !t.is_empty()) else {
            return own;
        };
        match table.rule(limit.id, identity) {
            // Numbers checked for another algorithm (a reload changed the
            // limit's) mean nothing to this one.
            Some(rule) if rule.same_kind(&own) => rule,
            _ => own,
        }
    }

    /// The limits of the rate limit service, with their places.
    pub fn descriptor_limits(&self) -> impl Iterator<Item = (LimitId, &Limit)> + '_ {
        self.descriptor_limits
            .iter()
            .map(|&i| (LimitId(i), &self.limits[i]))
    }

    /// Whether this request needs its token's claims: a limit keyed on one
    /// applies (or bans, on every route), the tier it names can change the
    /// numbers, or a subject may be blocked. A token nothing needs is never
    /// verified, so a client cannot make floodgate check signatures for
    /// nothing.
    pub fn needs_token(&self, request: &RequestView<'_>) -> bool {
        let Some(jwt) = &self.clients.jwt else {
            return false;
        };
        !self.block.jwt_subjects.is_empty()
            || (jwt.tier_claim.is_some() && self.tiers_matter)
            || self.claim_limits.iter().any(|&i| {
                let limit = &self.limits[i];
                limit.ban.is_some() || limit.matcher.applies(request)
            })
    }

    /// The bans of the limits keyed on the client's address: looked up
    /// before a token's signature is checked, so that a banned address
    /// costs no signature.
    pub fn address_bans(&self, client: &Client) -> Vec<Check> {
        self.limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.key == KeySource::Ip)
            .filter_map(|(i, l)| {
                Some(
                    l.ban
                        .as_ref()?
                        .penalty_check(LimitId(i), client.ip_hash, Spending::Peek),
                )
            })
            .collect()
    }

    /// What a request costs limit `limit`: the first `[[costs]]` entry that
    /// matches it and prices that limit, else 1.
    pub fn cost_of(&self, limit: LimitId, request: &RequestView<'_>) -> u64 {
        self.costs
            .iter()
            .find(|c| {
                (c.limits.is_empty() || c.limits.contains(&limit.index()))
                    && c.matcher.applies(request)
            })
            .map_or(1, |c| c.cost)
    }

    /// The layers that apply to a request.
    pub fn plan(&self, request: &RequestView<'_>) -> Result<Plan, IdentityError> {
        if self.exempt_paths.iter().any(|p| p.matches(request.path))
            || self.exempt_tiers.contains(&request.client.tier)
        {
            return Ok(Plan::Exempt);
        }
        let mut layers = Layers::default();
        for (index, limit) in self.limits.iter().enumerate() {
            self.plan_limit(LimitId(index), limit, request, &mut layers)?;
        }
        Ok(Plan::Check(layers))
    }

    /// What one limit adds to a request's layers: the lookups of its ban
    /// (on every route), and its own layer where it applies.
    fn plan_limit(
        &self,
        id: LimitId,
        limit: &Limit,
        request: &RequestView<'_>,
        layers: &mut Layers,
    ) -> Result<(), IdentityError> {
        // A body that could not be read (past max_body, of unknown length,
        // no JSON object) leaves a body match undecided: the limit's
        // on_missing says, as for a missing key, so that padding or
        // chunking a body is no way around it.
        let unread = !limit.matcher.body().is_empty()
            && request.body.is_none()
            && limit.matcher.applies_but_for_body(request);
        if unread
            && limit.enforcement == Enforcement::Enforce
            && limit.on_missing == OnMissing::Deny
        {
            return Err(IdentityError::MissingKey(limit.name.as_str().into()));
        }
        let applies =
            limit.matcher.applies(request) || (unread && limit.on_missing == OnMissing::Ip);
        if !applies && limit.ban.is_none() {
            return Ok(());
        }
        let route = if limit.key.any_part(|p| *p == KeySource::Route) {
            limit.matcher.route(request.path)
        } else {
            ""
        };
        let own = self.key_identity(limit, request, route, applies)?;
        // A ban holds on the rest of a route-keyed limit's key, the same on
        // every route: one lookup, and strikes that add up across routes.
        let banned_on = match &limit.ban {
            Some(_) if !route.is_empty() && own.is_some() => {
                self.key_identity(limit, request, "", false)?
            }
            Some(_) => own,
            None => None,
        };
        if let Some(ban) = &limit.ban {
            look_up_bans(id, ban, (banned_on, unread), request, &mut layers.bans);
        }
        if !applies {
            return Ok(());
        }
        // Undecided by its body: counted by the address, whatever its key;
        // but a shadow limit that could not tell its key skips the request
        // as it does with the body read (enforcing, it would refuse it).
        let identity = own.map(|own| if unread { request.client.ip_hash } else { own });
        if let Some(identity) = identity {
            self.add_layer(id, limit, identity, request, layers);
            if let Some(banned) = banned_on.filter(|b| *b != identity && !unread) {
                layers.struck_on.push(StruckOn {
                    limit: id,
                    counted: identity,
                    banned,
                });
            }
        }
        Ok(())
    }

    /// The identity `limit` keys this request by on `route`, or `None` when
    /// the limit leaves it alone. `applies`: the limit meets the request,
    /// rather than only looking its ban up.
    fn key_identity(
        &self,
        limit: &Limit,
        request: &RequestView<'_>,
        route: &str,
        applies: bool,
    ) -> Result<Option<u128>, IdentityError> {
        let inputs = KeyInputs {
            headers: request.headers,
            query: request.query,
            host: request.host,
            route,
            fold_case: limit.case_insensitive_values,
            body: request.body,
        };
        match self
            .clients
            .identity_of(&limit.key, request.client, &inputs)
        {
            Ok(Some(identity)) => Ok(Some(identity)),
            // Keyed by the address instead, by a shadow limit as by an
            // enforcing one (it shows what enforcing would do), and banned
            // by it on every route.
            Ok(None) if limit.on_missing == OnMissing::Ip => Ok(Some(request.client.ip_hash)),
            // A key the limit cannot tell is refused wherever its ban is
            // looked up, on every route: else sending it twice would slip
            // the ban (the upstream reads one of them).
            Err(e) if !applies && limit.ban.is_some() => Err(e),
            // A key this route's limit never reads (only its ban looks it
            // up), or a shadow limit's, is no reason to refuse the request.
            Ok(None) | Err(_) if !applies || limit.enforcement == Enforcement::Shadow => Ok(None),
            Ok(None) if limit.on_missing == OnMissing::Deny => {
                Err(IdentityError::MissingKey(limit.name.as_str().into()))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The layer `limit` decides on the request's `identity`: a check, a
    /// reservation settled by the response, or a concurrency slot.
    fn add_layer(
        &self,
        id: LimitId,
        limit: &Limit,
        identity: u128,
        request: &RequestView<'_>,
        layers: &mut Layers,
    ) {
        let key = StateKey {
            limit: limit.id,
            identity,
        };
        match self.rule_in_force(limit, &request.client.tier, identity) {
            Rule::Rate(algorithm) => {
                let mut check = limit.check(id, algorithm, identity, self.cost_of(id, request));
                match &limit.charged_by_response {
                    Some(charge) => {
                        // Reserved now, with the other layers; settled once
                        // the response is known. A request never passes
                        // what is spent, however many run at once.
                        if let ChargedByResponse::Cost(priced) = charge {
                            check.cost = priced.reservation(request.body);
                        }
                        layers.reservations.push((check, charge.clone()));
                    }
                    None => layers.checks.push(check),
                }
            }
            Rule::Concurrency(c) => {
                // Validated with the config: these numbers make a slot.
                let Ok(slot) = Slot::new(
                    limit.name.clone(),
                    key,
                    c.max,
                    c.lease_us,
                    lease_id(),
                    limit.on_failure,
                ) else {
                    return;
                };
                layers.slots.push(SlotLayer {
                    limit: id,
                    slot,
                    upgrades: c.upgrades,
                    enforcement: limit.enforcement,
                });
            }
        }
    }
}

/// Adds the lookups of a limit's ban on every identity it may have been
/// struck on: the request's key (`banned_on`, without the route for a
/// route-keyed limit); and the address when the body went unread (the
/// limit then counted the request by it), beside the key.
fn look_up_bans(
    id: LimitId,
    ban: &Ban,
    (banned_on, unread): (Option<u128>, bool),
    request: &RequestView<'_>,
    bans: &mut Vec<Check>,
) {
    if let Some(identity) = banned_on {
        bans.push(ban.penalty_check(id, identity, Spending::Peek));
    }
    if unread && banned_on != Some(request.client.ip_hash) {
        bans.push(ban.penalty_check(id, request.client.ip_hash, Spending::Peek));
    }
}

#[cfg(test)]
mod tests;
