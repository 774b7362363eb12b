//! The decision on one request, apart from the HTTP exchange: its planned
//! layers against the store, in a fixed order, all or nothing.
//!
//! 1. Where there are slots to take, the bans first, on their own: a banned
//!    key takes no slot.
//! 2. The slots: a request refused for want of one charges no rate.
//! 3. One store call: the bans of the limits that ban (a banned key is
//!    refused on every route, and a store that remembers refusals answers a
//!    ban before a rate), the rate layers decided, and the layers charged by
//!    the response checked (refused only when already spent). A refusing
//!    ban is the answer, whatever the layers said.
//! 4. Refused by any enforcing layer: the slots are given back and nothing
//!    stays reserved.
//!
//! `Gateway::decide` keeps the decision for the phases after, with the
//! headers it gives: the refusal, or the rates of an admitted request.

use std::sync::Arc;

use pingora::proxy::Session;
use tokio::time::Instant;

use super::answer::{grpc_refusal, is_grpc, Answer};
use super::ctx::{RequestCtx, Reservation};
use super::slots::HeldSlots;
use super::traced;
use super::verdict::{Outcome, OutcomeKind, Shown, Verdict};
use crate::proxy::headers;
use crate::server::state::AppState;
use floodgate_algorithm::Decision;
use floodgate_limiter::{Check, Enforcement, LimiterError, Store};
use floodgate_policy::{Layers, Policy};

/// What deciding one request came to.
pub(super) struct Decided {
    /// Every layer's answer, in the order the request's headers and log
    /// read them.
    pub(super) outcomes: Vec<Outcome>,
    /// The slots held, only when the request is admitted.
    pub(super) slots: Option<HeldSlots>,
    /// When its slots were taken (even if a rate then refused it): its body
    /// and the client's reading are due within the slot timeouts from then.
    pub(super) slots_taken_at: Option<Instant>,
    /// What the layers charged by the response reserved, to settle once it
    /// is known; empty when refused.
    pub(super) reservations: Vec<Reservation>,
}

impl Decided {
    pub(super) fn refused(&self) -> bool {
        refused(&self.outcomes)
    }
}

/// Whether an enforcing layer among `outcomes` refuses.
pub(super) fn refused(outcomes: &[Outcome]) -> bool {
    outcomes
        .iter()
        .any(|o| o.enforcement == Enforcement::Enforce && !o.decision.allowed())
}

/// Decides `layers` on `store`, after `outcomes` already known (a ban found
/// while verifying a token: then nothing more is asked).
pub(super) async fn decide(
    policy: &Policy,
    store: &Arc<dyn Store>,
    mut layers: Layers,
    mut outcomes: Vec<Outcome>,
) -> Result<Decided, LimiterError> {
    let mut decided = Decided {
        outcomes: Vec::new(),
        slots: None,
        slots_taken_at: None,
        reservations: Vec::new(),
    };
    if refused(&outcomes) {
        decided.outcomes = outcomes;
        return Ok(decided);
    }
    if !layers.slots.is_empty() && !layers.bans.is_empty() {
        let bans = std::mem::take(&mut layers.bans);
        let decisions = store.peek(&bans).await?;
        outcomes = ban_refusals(policy, bans.into_iter().zip(decisions));
    }
    if !refused(&outcomes) && !layers.slots.is_empty() {
        let (held, slot_outcomes) = HeldSlots::acquire(store.clone(), layers.slots).await?;
        decided.slots = Some(held);
        decided.slots_taken_at = Some(Instant::now());
        outcomes = slot_outcomes;
    }
    let (bans, reserving) = (layers.bans.len(), layers.reservations.len());
    if !refused(&outcomes) && bans + reserving + layers.checks.len() > 0 {
        let checks = if bans + reserving == 0 {
            layers.checks
        } else {
            let mut all = layers.bans;
            all.reserve(reserving + layers.checks.len());
            all.extend(layers.checks);
            all.extend(layers.reservations.iter().map(|(c, _)| c.clone()));
            all
        };
        let decisions = store.decide(&checks).await?;
        let mut answers = checks.into_iter().zip(decisions);
        let banned = ban_refusals(policy, answers.by_ref().take(bans));
        if banned.is_empty() {
            outcomes.extend(answers.map(|(check, d)| Outcome::of_check(check, d)));
            let first_reserved = outcomes.len() - reserving;
            decided.reservations = layers
                .reservations
                .into_iter()
                .zip(&outcomes[first_reserved..])
                .map(|((check, charged_by), o)| Reservation {
                    check,
                    charged_by,
                    decision: o.decision,
                })
                .collect();
        } else {
            outcomes = banned;
        }
    }
    // A route-keyed limit's refusal, by its rate or its slot, strikes the
    // identity its ban is looked up on.
    if !layers.struck_on.is_empty() {
        for o in &mut outcomes {
            o.identity = Layers::struck_on(&layers.struck_on, o.limit, o.identity);
        }
    }
    decided.outcomes = outcomes;
    if decided.refused() {
        decided.reservations.clear();
        if let Some(mut slots) = decided.slots.take() {
            slots.release().await;
        }
    }
    Ok(decided)
}

/// The bans among looked-up bans that refuse, as the limits that ban name
/// them: one per limit, the one that lasts longest. A limit may look its
/// ban up on several identities (each of its routes, or the key and the
/// address), and a request it bans is one banned request.
pub(super) fn ban_refusals(
    policy: &Policy,
    bans: impl Iterator<Item = (Check, Decision)>,
) -> Vec<Outcome> {
    let mut refusing: Vec<Outcome> = Vec::new();
    for (check, decision) in bans.filter(|(_, decision)| !decision.allowed()) {
        match refusing.iter_mut().find(|o| o.limit == check.limit) {
            Some(o) if o.decision.retry_after_us() >= decision.retry_after_us() => {}
            Some(o) => {
                let name = o.name.clone();
                *o = Outcome::of_ban(name, check, decision);
            }
            None => {
                let name = policy.limits[check.limit.index()].name.clone();
                refusing.push(Outcome::of_ban(name, check, decision));
            }
        }
    }
    refusing
}

/// The decision on the planned layers (`decide`), kept in the context
/// for the phases after, and the headers it gives: the refusal, or the
/// wait (µs) before an admitted request goes on.
pub(super) async fn decide_request(
    state: &AppState,
    session: &mut Session,
    ctx: &mut RequestCtx,
    layers: Layers,
    earlier: Vec<Outcome>,
) -> Result<u64, Answer> {
    let runtime = ctx.runtime.clone();
    let decided = decide(&runtime.policy, &state.store, layers, earlier)
        .await
        .map_err(Answer::LimiterFailed)?;
    if let Some(taken_at) = decided.slots_taken_at {
        // A client that stops reading (an HTTP/2 window kept shut), or
        // sends its body by the drop, must not hold its slots for long.
        session
            .as_mut()
            .set_write_timeout(Some(state.header_timeout));
        let body_by = taken_at + state.slot_body_timeout;
        if let Some(clock) = &ctx.head_clock {
            clock.body_due_by(body_by);
        }
        if let Some(stream) = &ctx.h2_stream {
            stream.body_deadline(body_by);
        }
    }
    ctx.slots = decided.slots;
    ctx.reservations = decided.reservations;
    let verdict = ctx
        .verdict
        .insert(Verdict::new(decided.outcomes, state.store.deciding()));
    let enforced = verdict.enforced(false);
    if let Some(refused) = headers::refusing(&enforced) {
        let mut rejection =
            headers::rejection(runtime.headers, &enforced, refused, ctx.request_id.as_str());
        traced::into_refusal_body(ctx.trace.as_deref(), &mut rejection.body);
        let grpc_message = is_grpc(session).then(|| grpc_refusal(refused));
        verdict.shown = Shown::Refused(refused.position);
        return Err(Answer::Refused(rejection, grpc_message));
    }
    // An admitted request's headers advertise its rates only: a slot's
    // state (free now, a lease) is no budget to pace by. Most requests
    // hold no slot: their layers are the rates.
    let rates = if verdict.outcomes.iter().any(|o| o.kind == OutcomeKind::Slot) {
        verdict.enforced(true)
    } else {
        enforced
    };
    let shown = headers::most_constrained(&rates);
    if let Some(shown) = shown {
        ctx.rate_headers = headers::rate_limit_headers(runtime.headers, &rates, shown);
    }
    verdict.shown = shown.map_or(Shown::Nothing, |l| Shown::Admitted(l.position));
    Ok(verdict.delay_us())
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::path::Path;

    use http::{HeaderMap, Method};

    use super::*;
    use crate::config::{Config, Inputs};
    use floodgate_limiter::clock::ManualClock;
    use floodgate_limiter::MemoryStore;
    use floodgate_limiter::Spending;
    use floodgate_policy::{Plan, RequestView};

    const HEAD: &str =
        "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"127.0.0.1:8000\"]\n";

    struct Bench {
        policy: Arc<Policy>,
        store: Arc<dyn Store>,
    }

    impl Bench {
        fn new(limits: &str) -> Bench {
            let text = format!("{HEAD}{limits}");
            let config = Config::parse(Path::new("t.toml"), &text, &Inputs::default())
                .unwrap_or_else(|e| panic!("{e}"));
            let clock = Arc::new(ManualClock::new(1_000_000_000));
            Bench {
                policy: config.policy,
                store: Arc::new(MemoryStore::new(1000, clock)),
            }
        }

        /// The layers `path` plans for one client, its headers `headers`.
        fn layers(&self, path: &str, headers: &[(&'static str, &str)]) -> Layers {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, value.parse().expect("header value"));
            }
            let ip: IpAddr = "192.0.2.7".parse().expect("address");
            let client = self.policy.clients.identify(ip, &map).expect("client");
            let view = RequestView {
                method: &Method::GET,
                path,
                headers: &map,
                query: None,
                host: None,
                client: &client,
                body: None,
            };
            match self.policy.plan(&view).expect("plan") {
                Plan::Check(layers) => layers,
                Plan::Exempt => panic!("exempt"),
            }
        }

        fn decide(&self, path: &str) -> Decided {
            self.decide_with(path, &[])
        }

        fn decide_with(&self, path: &str, headers: &[(&'static str, &str)]) -> Decided {
            let layers = self.layers(path, headers);
            block_on(decide(&self.policy, &self.store, layers, Vec::new())).expect("decided")
        }

        /// What limit `name` would have left after one more request of
        /// cost 1, looked up without taking it.
        fn remaining(&self, path: &str, name: &str) -> u64 {
            let layers = self.layers(path, &[]);
            let check = layers
                .checks
                .iter()
                .chain(layers.reservations.iter().map(|(c, _)| c))
                .find(|c| c.name.as_str() == name)
                .expect("the limit's layer")
                .clone();
            block_on(self.store.peek(&[check])).expect("peek")[0].remaining()
        }
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(future)
    }

    fn limit(name: &str, rest: &str) -> String {
        format!("[[limits]]\nname = \"{name}\"\nkey = \"ip\"\n{rest}\n")
    }

    fn window(limit_: u64) -> String {
        format!("algorithm = \"fixed_window\"\nlimit = {limit_}\nwindow = \"1m\"")
    }

    #[test]
    fn a_refusing_layer_charges_no_other() {
        let bench = Bench::new(&(limit("narrow", &window(1)) + &limit("wide", &window(10))));
        assert!(!bench.decide("/").refused());
        let refused = bench.decide("/");
        assert!(refused.refused());
        assert_eq!(
            bench.remaining("/", "wide"),
            8,
            "the refused request took nothing"
        );
    }

    #[test]
    fn a_shadow_layer_that_would_refuse_refuses_nothing() {
        let shadow = window(1) + "\nshadow = true";
        let bench = Bench::new(&(limit("trial", &shadow) + &limit("wide", &window(10))));
        bench.decide("/");
        let second = bench.decide("/");
        assert!(!second.refused());
        let trial = second
            .outcomes
            .iter()
            .find(|o| o.name.as_str() == "trial")
            .expect("the shadow layer's outcome");
        assert!(
            !trial.decision.allowed(),
            "it is still reported as refusing"
        );
        assert_eq!(bench.remaining("/", "wide"), 7);
    }

    #[test]
    fn a_layer_charged_by_the_response_is_reserved_only_when_admitted() {
        let by_status = window(5) + "\ncount = { statuses = [401] }";
        let bench = Bench::new(&(limit("failures", &by_status) + &limit("narrow", &window(1))));
        let first = bench.decide("/");
        assert!(!first.refused());
        assert_eq!(first.reservations.len(), 1, "reserved, to settle later");
        let second = bench.decide("/");
        assert!(second.refused());
        assert!(
            second.reservations.is_empty(),
            "a refused request owes nothing"
        );
    }

    #[test]
    fn a_request_refused_by_a_rate_gives_its_slot_back() {
        let slots = "algorithm = \"concurrency\"\nmax = 1";
        let bench = Bench::new(&(limit("in-flight", slots) + &limit("narrow", &window(1))));
        let first = bench.decide("/");
        assert!(!first.refused());
        assert!(first.slots.is_some() && first.slots_taken_at.is_some());
        let mut held = first.slots;
        let second = bench.decide("/");
        assert!(second.refused(), "the one slot is taken");
        assert!(second.slots.is_none());
        if let Some(mut slots) = held.take() {
            block_on(slots.release());
        }
        let third = bench.decide("/");
        assert!(third.refused(), "the rate refuses now");
        assert!(third.slots_taken_at.is_some(), "the slot was taken first");
        assert!(third.slots.is_none(), "and given back");
        let fourth_slot = bench.layers("/", &[]).slots;
        let acquired = block_on(bench.store.acquire(&fourth_slot[0].slot)).expect("acquire");
        assert!(acquired.allowed(), "the slot is free again");
    }

    #[test]
    fn a_request_banned_on_its_key_and_its_address_is_one_banned_request() {
        // A body that goes unread is counted by the address: its bans are
        // looked up on the key and on the address.
        let banning = window(10)
            + "\nmatch = { paths = [\"/a\"], body = { model = [\"gpt-4*\"] } }"
            + "\non_missing = \"ip\""
            + "\nban_on_client_keys = true"
            + "\nban = { after = 1, within = \"1m\", duration = \"1h\" }";
        let bench = Bench::new(
            &limit("per-key", &banning).replace("key = \"ip\"", "key = \"header:x-key\""),
        );
        let layers = bench.layers("/a", &[("x-key", "k-1")]);
        assert_eq!(layers.bans.len(), 2, "looked up on the key and the address");
        let ban = bench.policy.limits[0].ban.as_ref().expect("the limit bans");
        for looked_up in &layers.bans {
            let penalty = ban.penalty_check(
                floodgate_limiter::LimitId(0),
                looked_up.key.identity,
                Spending::Charge,
            );
            assert!(block_on(bench.store.decide(&[penalty])).expect("ban")[0].allowed());
        }
        let layers = bench.layers("/a", &[("x-key", "k-1")]);
        let banned =
            block_on(decide(&bench.policy, &bench.store, layers, Vec::new())).expect("decided");
        assert!(banned.refused());
        assert_eq!(banned.outcomes.len(), 1, "one banned request, counted once");
        assert_eq!(banned.outcomes[0].kind, OutcomeKind::Ban);
    }

    #[test]
    fn a_route_keyed_limits_refusal_strikes_where_its_ban_is_looked_up() {
        for rule in [
            window(1),
            "algorithm = \"concurrency\"\nmax = 1".to_string(),
        ] {
            let banning = rule
                + "\nmatch = { paths = [\"/a\", \"/b\"] }"
                + "\nban = { after = 3, within = \"1m\", duration = \"1h\" }";
            let bench = Bench::new(
                &limit("per-route", &banning).replace("key = \"ip\"", "key = [\"ip\", \"route\"]"),
            );
            let looked_up = bench.layers("/b", &[]).bans[0].key.identity;
            let first = bench.decide("/a");
            assert!(!first.refused());
            let refused = bench.decide("/a");
            assert!(refused.refused(), "{banning}");
            let struck: Vec<u128> = refused.outcomes.iter().map(|o| o.identity).collect();
            assert_eq!(struck, [looked_up], "{banning}");
            drop(first.slots);
        }
    }

    #[test]
    fn a_banned_key_takes_no_slot_and_is_charged_nothing() {
        let banning = window(1) + "\nban = { after = 1, within = \"1m\", duration = \"1h\" }";
        let slots = "algorithm = \"concurrency\"\nmax = 5";
        let bench = Bench::new(
            &(limit("banning", &banning)
                + &limit("in-flight", slots)
                + &limit("wide", &window(10))),
        );
        let layers = bench.layers("/", &[]);
        let ban = bench.policy.limits[0].ban.as_ref().expect("the limit bans");
        let identity = layers.bans[0].key.identity;
        let penalty = ban.penalty_check(floodgate_limiter::LimitId(0), identity, Spending::Charge);
        assert!(block_on(bench.store.decide(&[penalty])).expect("ban")[0].allowed());

        let banned = bench.decide("/");
        assert!(banned.refused());
        assert!(
            banned.outcomes.iter().all(|o| o.kind == OutcomeKind::Ban),
            "the ban is the answer"
        );
        assert!(banned.slots_taken_at.is_none(), "no slot was taken");
        assert_eq!(bench.remaining("/", "wide"), 9, "nothing was charged");
    }

    #[test]
    fn a_ban_found_before_deciding_is_the_answer() {
        let bench = Bench::new(&limit("wide", &window(10)));
        let layers = bench.layers("/", &[]);
        let check = layers.checks[0].clone();
        let earlier = vec![Outcome::of_ban(
            check.name.clone(),
            check,
            Decision::refused(1, 0, 1_000_000, 1_000_000),
        )];
        let decided =
            block_on(decide(&bench.policy, &bench.store, layers, earlier)).expect("decided");
        assert!(decided.refused());
        assert_eq!(decided.outcomes.len(), 1);
        assert_eq!(bench.remaining("/", "wide"), 9, "nothing was charged");
    }

    #[test]
    fn a_cost_is_taken_from_every_layer_at_once() {
        let costs = "[[costs]]\nmatch = { paths = [\"/heavy\"] }\ncost = 4\n";
        let bench = Bench::new(&(limit("wide", &window(10)) + costs));
        assert!(!bench.decide("/heavy").refused());
        assert!(!bench.decide("/heavy").refused());
        assert_eq!(bench.remaining("/", "wide"), 1, "2 left");
        assert!(bench.decide("/heavy").refused(), "4 more than the 2 left");
        assert_eq!(
            bench.remaining("/", "wide"),
            1,
            "refused whole, not in part"
        );
        assert!(!bench.decide_with("/", &[]).refused());
    }
}
