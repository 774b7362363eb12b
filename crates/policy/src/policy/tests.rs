//! `Policy::plan`: which layers a request meets, keyed on whom, with which
//! numbers and cost. Policies are built as `src/config` builds them (each
//! `[[limits]]` entry as `validate_limit` leaves it, then `Policy::new`);
//! clients as the proxy finds them (`ClientRules::identify`); bodies as it
//! reads them (the fields `Policy::body_fields` names).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Method};

use super::*;
use crate::identity::{ForwardedHeader, IdentityHasher, KnownPart, Tiers};
use crate::{
    Ban, Concurrency, CostRule, CostSource, HostPattern, Limit, LimitMatch, LlmProvider, Matcher,
    OnMissing, PathPattern, ResponseCost, Rule, Statuses, Upgrades, PROMPT_BYTES_PER_TOKEN,
};
use floodgate_algorithm::Algorithm;
use floodgate_limiter::{Enforcement, Leasing, LimitName, Spending};

const SEC: u64 = 1_000_000;

/// An address outside `internal`: an anonymous client unless it sends a key.
const PEER: &str = "203.0.113.7";

/// `[clients]`: keys "k-pro" and "k-free" of tiers "pro" and "free",
/// 192.168.0.0/16 internal, no proxy trusted. Each call interns the tiers
/// in one order, so that a tier from one call is that of another.
fn clients() -> ClientRules {
    let mut tiers = Tiers::default();
    let mut api_keys = HashMap::new();
    for (key, tier) in [("k-pro", "pro"), ("k-free", "free")] {
        api_keys.insert(
            key.as_bytes().to_vec().into_boxed_slice(),
            tiers.intern(tier),
        );
    }
    ClientRules {
        api_key_header: HeaderName::from_static("x-api-key"),
        trusted_proxies: Vec::new(),
        forwarded_header: ForwardedHeader::XForwardedFor,
        ipv6_prefix: 64,
        internal: vec!["192.168.0.0/16".parse().unwrap()],
        api_keys,
        run_time: None,
        tiers,
        hasher: IdentityHasher::from_secret(b"a test secret of 32 bytes, or so"),
        jwt: None,
    }
}

/// A limit's state id, derived from its name as the config derives it
/// (there with xxh3; any fixed hash tells names apart here).
fn id_of(name: &str) -> u64 {
    let mut h = DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

/// A `[[limits]]` entry as `validate_limit` gives it with only `name`,
/// `key` and its numbers set: no match (every request), no tiers,
/// enforcing, `on_missing = "skip"`, the store's `on_failure`.
fn limit(name: &str, key: KeySource, rule: Rule) -> Limit {
    Limit {
        name: LimitName::new(name),
        id: id_of(name),
        key,
        rule,
        tiers: Vec::new(),
        matcher: LimitMatch::default(),
        enforcement: Enforcement::Enforce,
        on_failure: OnFailure::Local,
        charged_by_response: None,
        ban: None,
        on_missing: OnMissing::Skip,
        case_insensitive_values: false,
        leases: false,
    }
}

/// `algorithm = "fixed_window"`, `window = "1m"`.
fn window(limit: u64) -> Rule {
    Rule::Rate(per_minute(limit))
}

fn per_minute(limit: u64) -> Algorithm {
    Algorithm::fixed_window(limit, 60 * SEC).unwrap()
}

/// `algorithm = "concurrency"` with the default lease of 1m.
fn concurrency(max: u64) -> Rule {
    Rule::Concurrency(Concurrency {
        max,
        lease_us: 60 * SEC,
        upgrades: Upgrades::Include,
    })
}

fn header_key(name: &'static str) -> KeySource {
    KeySource::Header(HeaderName::from_static(name))
}

/// `ban = { after, within = "1m", duration = "1h" }` as the config's `ban`
/// builds it for limit `limit`.
fn ban(limit: &str, after: u64) -> Ban {
    let named = |kind: &str| {
        let name = format!("{kind}:{limit}");
        (LimitName::new(&name), id_of(&name))
    };
    let (strikes_name, strikes_id) = named("strikes");
    let (penalty_name, penalty_id) = named("ban");
    Ban {
        strikes: Algorithm::sliding_log(after, 60 * SEC).unwrap(),
        strikes_name,
        strikes_id,
        penalty: Algorithm::token_bucket(1, 3_600 * SEC).unwrap(),
        penalty_name,
        penalty_id,
    }
}

/// A limit's HTTP match, to set a part of it.
fn http(limit: &mut Limit) -> &mut Matcher {
    match &mut limit.matcher {
        LimitMatch::Http(matcher) => matcher,
        LimitMatch::Descriptors(_) => panic!("{} is matched by descriptors", limit.name),
    }
}

/// `match = { methods, paths }` as `validate_match` reads them: methods
/// upper-cased, paths as patterns.
fn matching(methods: &[&str], paths: &[&str]) -> Matcher {
    Matcher {
        methods: methods
            .iter()
            .map(|m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()).unwrap())
            .collect(),
        paths: paths.iter().map(|p| PathPattern::new(p)).collect(),
        ..Matcher::default()
    }
}

/// A policy of `limits` alone: nothing exempt, nothing blocked, the
/// memory store's `on_failure`.
fn policy(limits: Vec<Limit>) -> Policy {
    policy_with(limits, Vec::new(), &[], &[])
}

/// `[exempt]` paths and tiers (by name), `[[costs]]` and `[[limits]]`.
fn policy_with(
    limits: Vec<Limit>,
    costs: Vec<CostRule>,
    exempt_paths: &[&str],
    exempt_tiers: &[&str],
) -> Policy {
    let clients = clients();
    let exempt_tiers = exempt_tiers
        .iter()
        .map(|t| clients.tiers.get(t).unwrap())
        .collect();
    let exempt_paths = exempt_paths.iter().map(|p| PathPattern::new(p)).collect();
    // An empty `[block]`, as `validate_block` gives it.
    let block = Blocklist {
        status: 403,
        ..Blocklist::default()
    };
    Policy::new(
        clients,
        PathRules::default(),
        (exempt_paths, exempt_tiers),
        block,
        limits,
        costs,
        OnFailure::Local,
    )
}

/// A request as the proxy hands it to the policy: its path normalised,
/// its host without port, its body's fields when read.
struct Request {
    method: Method,
    path: &'static str,
    headers: HeaderMap,
    host: Option<&'static str>,
    peer: IpAddr,
    body: Option<BodyFields>,
}

fn get(path: &'static str) -> Request {
    Request {
        method: Method::GET,
        path,
        headers: HeaderMap::new(),
        host: None,
        peer: PEER.parse().unwrap(),
        body: None,
    }
}

impl Request {
    /// The method as the client spells it.
    fn method(self, method: &str) -> Request {
        Request {
            method: Method::from_bytes(method.as_bytes()).unwrap(),
            ..self
        }
    }

    fn header(mut self, name: &'static str, value: &str) -> Request {
        self.headers.append(
            HeaderName::from_static(name),
            HeaderValue::from_str(value).unwrap(),
        );
        self
    }

    fn key(self, key: &str) -> Request {
        self.header("x-api-key", key)
    }

    fn host(self, host: &'static str) -> Request {
        Request {
            host: Some(host),
            ..self
        }
    }

    fn peer(self, peer: &str) -> Request {
        Request {
            peer: peer.parse().unwrap(),
            ..self
        }
    }

    /// A JSON body, read for the fields `policy`'s limits read.
    fn body(self, json: &str, policy: &Policy) -> Request {
        Request {
            body: Some(BodyFields::read(json.as_bytes(), &policy.body_fields).unwrap()),
            ..self
        }
    }

    fn client(&self, policy: &Policy) -> Client {
        policy.clients.identify(self.peer, &self.headers).unwrap()
    }

    fn plan(&self, policy: &Policy) -> Result<Plan, IdentityError> {
        let client = self.client(policy);
        policy.plan(&RequestView {
            method: &self.method,
            path: self.path,
            headers: &self.headers,
            query: None,
            host: self.host,
            client: &client,
            body: self.body.as_ref(),
        })
    }

    fn layers(&self, policy: &Policy) -> Layers {
        match self.plan(policy) {
            Ok(Plan::Check(layers)) => layers,
            other => panic!("{} {}: {other:?}", self.method, self.path),
        }
    }

    /// The limits whose checks the request meets, in order.
    fn checked(&self, policy: &Policy) -> Vec<String> {
        names(&self.layers(policy).checks)
    }
}

fn names(checks: &[Check]) -> Vec<String> {
    checks.iter().map(|c| c.name.to_string()).collect()
}

fn is_exempt(plan: Result<Plan, IdentityError>) -> bool {
    matches!(plan, Ok(Plan::Exempt))
}

/// The identity a header key gives `value`, as the admin API computes it.
fn header_identity(policy: &Policy, key: &KeySource, name: &'static str, value: &[u8]) -> u128 {
    let name = HeaderName::from_static(name);
    policy
        .clients
        .identity_for(key, &KnownPart::Header(&name, value), false)
        .unwrap()
}

#[test]
fn an_exempt_path_is_exempt_and_a_path_beside_it_is_not() {
    let policy = policy_with(
        vec![limit("per-ip", KeySource::Ip, window(10))],
        Vec::new(),
        &["/health", "/static/*"],
        &[],
    );
    assert!(is_exempt(get("/health").plan(&policy)));
    assert!(is_exempt(get("/health/").plan(&policy)));
    assert!(is_exempt(get("/static/app.js").plan(&policy)));
    for path in ["/healthz", "/static", "/api/health"] {
        assert_eq!(get(path).checked(&policy), ["per-ip"], "{path}");
    }
}

#[test]
fn an_exempt_tier_is_exempt_and_other_tiers_are_not() {
    let policy = policy_with(
        vec![limit("per-ip", KeySource::Ip, window(10))],
        Vec::new(),
        &[],
        &["pro", "internal"],
    );
    assert!(is_exempt(get("/").key("k-pro").plan(&policy)));
    assert!(is_exempt(get("/").peer("192.168.1.9").plan(&policy)));
    assert_eq!(get("/").key("k-free").checked(&policy), ["per-ip"]);
    assert_eq!(get("/").checked(&policy), ["per-ip"], "anonymous");
    // A key no one gave out is no tier's.
    assert_eq!(get("/").key("k-made-up").checked(&policy), ["per-ip"]);
}

#[test]
fn an_exempt_request_is_exempt_before_any_limit_asks_for_its_key() {
    let mut tenant = limit("per-tenant", header_key("x-tenant"), window(10));
    tenant.on_missing = OnMissing::Deny;
    let policy = policy_with(vec![tenant], Vec::new(), &["/health"], &["pro"]);
    assert!(is_exempt(get("/health").plan(&policy)));
    assert!(is_exempt(get("/").key("k-pro").plan(&policy)));
    assert_eq!(
        get("/").plan(&policy).unwrap_err(),
        IdentityError::MissingKey("per-tenant".into())
    );
}

#[test]
fn a_missing_key_with_on_missing_skip_leaves_the_limit_out() {
    let key = header_key("x-tenant");
    let policy = policy(vec![
        limit("per-tenant", key.clone(), window(10)),
        limit("per-ip", KeySource::Ip, window(100)),
    ]);
    assert_eq!(get("/").checked(&policy), ["per-ip"]);
    let layers = get("/").header("x-tenant", "acme").layers(&policy);
    assert_eq!(names(&layers.checks), ["per-tenant", "per-ip"]);
    assert_eq!(
        layers.checks[0].key,
        StateKey {
            limit: id_of("per-tenant"),
            identity: header_identity(&policy, &key, "x-tenant", b"acme"),
        }
    );
}

#[test]
fn a_missing_key_with_on_missing_deny_refuses_the_request_naming_the_limit() {
    let mut tenant = limit("per-tenant", header_key("x-tenant"), window(10));
    tenant.on_missing = OnMissing::Deny;
    let policy = policy(vec![limit("per-ip", KeySource::Ip, window(100)), tenant]);
    assert_eq!(
        get("/").plan(&policy).unwrap_err(),
        IdentityError::MissingKey("per-tenant".into())
    );
    assert_eq!(
        get("/").header("x-tenant", "acme").checked(&policy),
        ["per-ip", "per-tenant"]
    );
}

#[test]
fn a_missing_key_with_on_missing_ip_keys_the_limit_by_the_clients_address() {
    let key = header_key("x-tenant");
    let mut tenant = limit("per-tenant", key.clone(), window(10));
    tenant.on_missing = OnMissing::Ip;
    let policy = policy(vec![tenant]);
    let request = get("/");
    let client = request.client(&policy);
    let layers = request.layers(&policy);
    assert_eq!(names(&layers.checks), ["per-tenant"]);
    assert_eq!(layers.checks[0].key.identity, client.ip_hash);
    // With the key, keyed by it.
    let layers = get("/").header("x-tenant", "acme").layers(&policy);
    let acme = header_identity(&policy, &key, "x-tenant", b"acme");
    assert_eq!(layers.checks[0].key.identity, acme);
    assert_ne!(acme, client.ip_hash);
}

#[test]
fn a_shadow_limit_with_a_missing_key_never_refuses() {
    let mut trial = limit("trial", header_key("x-tenant"), window(10));
    trial.enforcement = Enforcement::Shadow;
    let policy = policy(vec![trial, limit("per-ip", KeySource::Ip, window(100))]);
    assert_eq!(get("/").checked(&policy), ["per-ip"]);
    // Nor a key it cannot tell: two values of its header.
    let twice = get("/")
        .header("x-tenant", "acme")
        .header("x-tenant", "globex");
    assert_eq!(twice.checked(&policy), ["per-ip"]);
}

#[test]
fn an_enforcing_limit_refuses_a_key_it_cannot_tell() {
    let policy = policy(vec![limit(
        "per-tenant",
        header_key("x-tenant"),
        window(10),
    )]);
    let twice = get("/")
        .header("x-tenant", "acme")
        .header("x-tenant", "globex");
    assert_eq!(
        twice.plan(&policy).unwrap_err(),
        IdentityError::AmbiguousKeyHeader(HeaderName::from_static("x-tenant"))
    );
}

#[test]
fn a_limit_asks_for_its_key_only_on_the_requests_it_matches() {
    let mut tenant = limit("per-tenant", header_key("x-tenant"), window(10));
    tenant.on_missing = OnMissing::Deny;
    tenant.matcher = LimitMatch::Http(matching(&[], &["/api/*"]));
    let policy = policy(vec![tenant]);
    assert!(get("/about").layers(&policy).is_empty());
    let twice = get("/about")
        .header("x-tenant", "acme")
        .header("x-tenant", "globex");
    assert!(twice.layers(&policy).is_empty());
    assert_eq!(
        get("/api/orders").plan(&policy).unwrap_err(),
        IdentityError::MissingKey("per-tenant".into())
    );
}

#[test]
fn an_unread_body_is_to_a_limit_matching_on_it_as_a_missing_key() {
    let on = |on_missing| {
        let mut gpt4 = limit("gpt-4", KeySource::ApiKey, window(10));
        http(&mut gpt4).body = vec![("model".into(), vec![PathPattern::glob("gpt-4*")])];
        gpt4.on_missing = on_missing;
        policy(vec![gpt4])
    };
    let skip = on(OnMissing::Skip);
    let request = || get("/v1/chat").key("k-pro");
    assert!(request().layers(&skip).is_empty());
    assert_eq!(
        request().plan(&on(OnMissing::Deny)).unwrap_err(),
        IdentityError::MissingKey("gpt-4".into())
    );
    let ip = on(OnMissing::Ip);
    let layers = request().layers(&ip);
    assert_eq!(names(&layers.checks), ["gpt-4"]);
    assert_eq!(
        layers.checks[0].key.identity,
        request().client(&ip).ip_hash,
        "the key is there, the body is not: keyed by the address"
    );
    // A body read: its model says, whatever on_missing is.
    let deny = on(OnMissing::Deny);
    let key = deny.clients.api_key_hash(b"k-pro");
    let read = request().body(r#"{"model":"gpt-4o"}"#, &deny);
    let layers = read.layers(&deny);
    assert_eq!(names(&layers.checks), ["gpt-4"]);
    assert_eq!(layers.checks[0].key.identity, key);
    let other = request().body(r#"{"model":"o3"}"#, &deny);
    assert!(other.layers(&deny).is_empty());
}

#[test]
fn a_tiers_numbers_replace_the_limits_for_clients_of_that_tier_only() {
    let tiers = clients().tiers;
    let mut per_ip = limit("per-ip", KeySource::Ip, window(10));
    per_ip.tiers = vec![(tiers.get("pro").unwrap(), window(1_000))];
    let policy = policy(vec![per_ip]);
    let numbers = |request: Request| request.layers(&policy).checks[0].algorithm;
    let (pro, own) = (per_minute(1_000), per_minute(10));
    assert_eq!(numbers(get("/").key("k-pro")), pro);
    assert_eq!(numbers(get("/").key("k-free")), own);
    assert_eq!(numbers(get("/")), own, "anonymous");
    assert_eq!(numbers(get("/").peer("192.168.1.9")), own, "internal");
}

#[test]
fn a_tiers_numbers_give_a_concurrency_limit_its_slots() {
    let tiers = clients().tiers;
    let mut in_flight = limit("in-flight", KeySource::Ip, concurrency(2));
    in_flight.tiers = vec![(tiers.get("free").unwrap(), concurrency(1))];
    let policy = policy(vec![in_flight]);
    let max = |request: Request| request.layers(&policy).slots[0].slot.max();
    assert_eq!(max(get("/").key("k-free")), 1);
    assert_eq!(max(get("/").key("k-pro")), 2);
    assert_eq!(max(get("/")), 2);
}

#[test]
fn a_shadow_limits_layers_are_marked_shadow_and_an_enforcing_ones_are_not() {
    let mut trial = limit("trial", KeySource::Ip, window(5));
    trial.enforcement = Enforcement::Shadow;
    let mut trial_slots = limit("trial-slots", KeySource::Ip, concurrency(1));
    trial_slots.enforcement = Enforcement::Shadow;
    let policy = policy(vec![
        trial,
        limit("per-ip", KeySource::Ip, window(10)),
        trial_slots,
        limit("in-flight", KeySource::Ip, concurrency(4)),
    ]);
    let layers = get("/").layers(&policy);
    let checks: Vec<(&str, bool)> = layers
        .checks
        .iter()
        .map(|c| (c.name.as_str(), c.enforcement == Enforcement::Shadow))
        .collect();
    assert_eq!(checks, [("trial", true), ("per-ip", false)]);
    let slots: Vec<(&str, bool)> = layers
        .slots
        .iter()
        .map(|s| (s.slot.name().as_str(), s.enforcement == Enforcement::Shadow))
        .collect();
    assert_eq!(slots, [("trial-slots", true), ("in-flight", false)]);
}

#[test]
fn a_rate_limit_gives_a_check_of_its_numbers_on_the_clients_identity() {
    let mut strict = limit("strict", KeySource::ApiKey, window(10));
    strict.on_failure = OnFailure::Deny;
    // `[redis].leases` on: a fixed window may be decided from leases.
    strict.leases = true;
    let per_second = Algorithm::token_bucket_per_second(20, 5.0).unwrap();
    let policy = policy(vec![
        limit("per-ip", KeySource::Ip, Rule::Rate(per_second)),
        strict,
    ]);
    let request = get("/").key("k-free");
    let client = request.client(&policy);
    let layers = request.layers(&policy);
    assert!(layers.reservations.is_empty() && layers.bans.is_empty() && layers.slots.is_empty());
    let [per_ip, strict] = &layers.checks[..] else {
        panic!("{:?}", layers.checks)
    };
    assert_eq!((per_ip.limit, per_ip.name.as_str()), (LimitId(0), "per-ip"));
    assert_eq!(per_ip.algorithm, per_second);
    assert_eq!(
        per_ip.key,
        StateKey {
            limit: id_of("per-ip"),
            identity: client.ip_hash,
        }
    );
    assert_eq!(
        (
            per_ip.cost,
            per_ip.enforcement,
            per_ip.spending,
            per_ip.leasing
        ),
        (1, Enforcement::Enforce, Spending::Charge, Leasing::Never)
    );
    assert_eq!(per_ip.on_failure, OnFailure::Local, "the store's");
    assert_eq!((strict.limit, strict.name.as_str()), (LimitId(1), "strict"));
    assert_eq!(
        strict.key,
        StateKey {
            limit: id_of("strict"),
            identity: policy.clients.api_key_hash(b"k-free"),
        }
    );
    assert_eq!(strict.on_failure, OnFailure::Deny, "its own");
    assert_eq!(strict.leasing, Leasing::Allowed);
}

#[test]
fn a_cost_rule_prices_the_limits_it_names_on_the_requests_it_matches() {
    let policy = policy_with(
        vec![
            limit("uploads", KeySource::Ip, window(100)),
            limit("per-ip", KeySource::Ip, window(100)),
        ],
        vec![CostRule {
            matcher: matching(&["POST"], &["/upload"]),
            cost: 5,
            limits: vec![0],
        }],
        &[],
        &[],
    );
    let costs = |request: Request| -> Vec<u64> {
        request
            .layers(&policy)
            .checks
            .iter()
            .map(|c| c.cost)
            .collect()
    };
    assert_eq!(costs(get("/upload").method("POST")), [5, 1]);
    assert_eq!(costs(get("/upload")), [1, 1]);
    assert_eq!(costs(get("/other").method("POST")), [1, 1]);
}

#[test]
fn a_limit_charged_by_the_response_is_reserved_at_its_reservation_not_checked() {
    let priced = ResponseCost {
        source: CostSource::Header(HeaderName::from_static("x-cost")),
        max: 500,
        default: 10,
        reserve: 50,
        from_request: false,
        include_usage: false,
        expose: true,
    };
    let mut credits = limit("credits", KeySource::ApiKey, window(1_000));
    credits.charged_by_response = Some(ChargedByResponse::Cost(priced.clone()));
    let policy = policy(vec![credits, limit("per-ip", KeySource::Ip, window(100))]);
    let layers = get("/").key("k-pro").layers(&policy);
    assert_eq!(names(&layers.checks), ["per-ip"]);
    assert_eq!(layers.reservations.len(), 1);
    let (check, charge) = &layers.reservations[0];
    assert_eq!(check.name.as_str(), "credits");
    assert_eq!(check.limit, LimitId(0));
    assert_eq!(check.cost, 50, "the reservation, not the request's cost");
    assert_eq!(
        check.spending,
        Spending::Charge,
        "taken now, settled once the response is known"
    );
    assert_eq!(check.key.identity, policy.clients.api_key_hash(b"k-pro"));
    assert_eq!(*charge, ChargedByResponse::Cost(priced));
}

#[test]
fn a_reservation_from_the_request_is_read_from_its_body() {
    let mut tokens = limit("tokens", KeySource::Ip, window(100_000));
    tokens.charged_by_response = Some(ChargedByResponse::Cost(ResponseCost {
        source: CostSource::Usage {
            provider: LlmProvider::OpenAi,
            prompt_weight: 1,
            completion_weight: 4,
        },
        max: 10_000,
        default: 10,
        reserve: 10_000,
        from_request: true,
        include_usage: false,
        expose: false,
    }));
    let policy = policy(vec![tokens]);
    let body = r#"{"model":"gpt-4o","max_tokens":100}"#;
    let prompt = (body.len() as u64).div_ceil(PROMPT_BYTES_PER_TOKEN);
    let read = get("/v1/chat").method("POST").body(body, &policy);
    assert_eq!(read.layers(&policy).reservations[0].0.cost, prompt + 400);
    // A body that could not be read says nothing: the most it can cost.
    let unread = get("/v1/chat").method("POST");
    assert_eq!(unread.layers(&policy).reservations[0].0.cost, 10_000);
}

#[test]
fn a_limit_counted_by_status_is_reserved_at_the_requests_cost() {
    let mut failures = limit("failures", KeySource::Ip, window(5));
    let statuses = ChargedByResponse::Status(Statuses::new(vec![(401, 401), (500, 599)]));
    failures.charged_by_response = Some(statuses.clone());
    let policy = policy_with(
        vec![failures],
        vec![CostRule {
            matcher: matching(&[], &["/login"]),
            cost: 2,
            limits: Vec::new(),
        }],
        &[],
        &[],
    );
    for (path, cost) in [("/login", 2), ("/", 1)] {
        let layers = get(path).layers(&policy);
        assert!(layers.checks.is_empty(), "{path}");
        let (check, charge) = &layers.reservations[0];
        assert_eq!(
            (check.name.as_str(), check.cost),
            ("failures", cost),
            "{path}"
        );
        assert_eq!(*charge, statuses);
    }
}

#[test]
fn a_concurrency_limit_gives_a_slot_layer_and_no_check() {
    let mut in_flight = limit(
        "in-flight",
        KeySource::ApiKey,
        Rule::Concurrency(Concurrency {
            max: 3,
            lease_us: 30 * SEC,
            upgrades: Upgrades::Exclude,
        }),
    );
    in_flight.on_failure = OnFailure::Allow;
    let policy = policy(vec![limit("per-ip", KeySource::Ip, window(10)), in_flight]);
    let layers = get("/").key("k-pro").layers(&policy);
    assert_eq!(names(&layers.checks), ["per-ip"]);
    assert!(layers.reservations.is_empty() && layers.bans.is_empty());
    assert_eq!(layers.slots.len(), 1);
    let layer = &layers.slots[0];
    assert_eq!(layer.limit, LimitId(1));
    assert_eq!(
        (layer.upgrades, layer.enforcement),
        (Upgrades::Exclude, Enforcement::Enforce)
    );
    let slot = &layer.slot;
    assert_eq!(slot.name().as_str(), "in-flight");
    assert_eq!(
        *slot.key(),
        StateKey {
            limit: id_of("in-flight"),
            identity: policy.clients.api_key_hash(b"k-pro"),
        }
    );
    assert_eq!((slot.max(), slot.lease_us()), (3, 30 * SEC));
    assert_eq!(slot.on_failure(), OnFailure::Allow);
    // Each request holds its slot under a lease of its own.
    let again = get("/").key("k-pro").layers(&policy);
    assert_ne!(again.slots[0].slot.lease_id(), slot.lease_id());
    // No key, no slot (on_missing = "skip").
    assert!(get("/").layers(&policy).slots.is_empty());
}

#[test]
fn a_limit_that_bans_looks_its_ban_up_on_the_requests_identity() {
    let mut per_key = limit("per-key", KeySource::ApiKey, window(10));
    per_key.ban = Some(ban("per-key", 3));
    let policy = policy(vec![limit("per-ip", KeySource::Ip, window(100)), per_key]);
    let layers = get("/").key("k-free").layers(&policy);
    assert_eq!(names(&layers.checks), ["per-ip", "per-key"]);
    assert_eq!(layers.bans.len(), 1);
    let banned = &layers.bans[0];
    let penalty = ban("per-key", 3);
    assert_eq!(banned.limit, LimitId(1));
    assert_eq!(banned.name.as_str(), "ban:per-key");
    assert_eq!(banned.algorithm, penalty.penalty);
    assert_eq!(
        banned.key,
        StateKey {
            limit: penalty.penalty_id,
            identity: policy.clients.api_key_hash(b"k-free"),
        }
    );
    assert_eq!(banned.key.identity, layers.checks[1].key.identity);
    assert_eq!(banned.spending, Spending::Peek, "looked up, not taken");
    assert_eq!((banned.cost, banned.enforcement), (1, Enforcement::Enforce));
    assert_eq!(banned.on_failure, OnFailure::Allow, "no store, no ban");
}

#[test]
fn a_ban_applies_on_every_route_not_only_the_limits() {
    let mut login = limit("login", KeySource::Ip, window(5));
    login.matcher = LimitMatch::Http(matching(&["POST"], &["/login"]));
    login.ban = Some(ban("login", 3));
    let policy = policy(vec![login]);
    let on_login = get("/login").method("POST").layers(&policy);
    assert_eq!(names(&on_login.checks), ["login"]);
    assert_eq!(names(&on_login.bans), ["ban:login"]);
    for request in [get("/account"), get("/login")] {
        let client = request.client(&policy);
        let layers = request.layers(&policy);
        assert!(layers.checks.is_empty(), "{}", request.path);
        assert_eq!(names(&layers.bans), ["ban:login"], "{}", request.path);
        assert_eq!(layers.bans[0].key.identity, client.ip_hash);
        assert_eq!(layers.bans[0].key.identity, on_login.bans[0].key.identity);
    }
}

#[test]
fn a_ban_is_not_looked_up_without_its_key_unless_on_missing_is_ip() {
    let on = |on_missing| {
        let mut per_key = limit("per-key", KeySource::ApiKey, window(5));
        per_key.matcher = LimitMatch::Http(matching(&[], &["/api/*"]));
        per_key.ban = Some(ban("per-key", 3));
        per_key.on_missing = on_missing;
        policy(vec![per_key])
    };
    let skip = on(OnMissing::Skip);
    assert!(get("/api/orders").layers(&skip).is_empty());
    assert!(get("/about").layers(&skip).is_empty());
    // Denied where it applies; nothing to look up elsewhere.
    let deny = on(OnMissing::Deny);
    assert_eq!(
        get("/api/orders").plan(&deny).unwrap_err(),
        IdentityError::MissingKey("per-key".into())
    );
    assert!(get("/about").layers(&deny).is_empty());
    // Keyed by the address where it applies, and banned by it everywhere.
    let ip = on(OnMissing::Ip);
    let address = get("/").client(&ip).ip_hash;
    let on_api = get("/api/orders").layers(&ip);
    assert_eq!(on_api.checks[0].key.identity, address);
    assert_eq!(on_api.bans[0].key.identity, address);
    let elsewhere = get("/about").layers(&ip);
    assert!(elsewhere.checks.is_empty());
    assert_eq!(names(&elsewhere.bans), ["ban:per-key"]);
    assert_eq!(elsewhere.bans[0].key.identity, address);
}

#[test]
fn only_limits_that_ban_are_looked_up_on_every_route() {
    let mut login = limit("login", KeySource::Ip, window(5));
    login.matcher = LimitMatch::Http(matching(&["POST"], &["/login"]));
    let policy = policy(vec![login]);
    assert!(get("/account").layers(&policy).is_empty());
    assert!(get("/login").method("POST").layers(&policy).bans.is_empty());
}

#[test]
fn a_limit_on_get_also_limits_head_and_methods_match_ignoring_case() {
    let mut reads = limit("reads", KeySource::Ip, window(10));
    reads.matcher = LimitMatch::Http(matching(&["get"], &[]));
    let mut writes = limit("writes", KeySource::Ip, window(10));
    writes.matcher = LimitMatch::Http(matching(&["POST", "PUT"], &[]));
    let policy = policy(vec![reads, writes]);
    for (method, limits) in [
        ("GET", &["reads"][..]),
        ("HEAD", &["reads"]),
        ("head", &["reads"]),
        ("get", &["reads"]),
        ("POST", &["writes"]),
        ("post", &["writes"]),
        ("PUT", &["writes"]),
        ("DELETE", &[]),
        ("OPTIONS", &[]),
    ] {
        assert_eq!(get("/").method(method).checked(&policy), limits, "{method}");
    }
}

#[test]
fn a_limit_on_post_does_not_limit_head() {
    let mut writes = limit("writes", KeySource::Ip, window(10));
    writes.matcher = LimitMatch::Http(matching(&["POST"], &[]));
    let policy = policy(vec![writes]);
    assert!(get("/").method("HEAD").layers(&policy).is_empty());
}

#[test]
fn a_limit_applies_to_the_paths_it_names_only() {
    let mut api = limit("api", KeySource::Ip, window(10));
    api.matcher = LimitMatch::Http(matching(&[], &["/api/*", "/login"]));
    let policy = policy(vec![api]);
    for path in ["/api/orders", "/api/orders/7", "/login", "/login/"] {
        assert_eq!(get(path).checked(&policy), ["api"], "{path}");
    }
    for path in ["/", "/api", "/apiary", "/login/x", "/v2/api/orders"] {
        assert!(get(path).layers(&policy).is_empty(), "{path}");
    }
}

#[test]
fn a_limit_on_hosts_applies_to_its_hosts_and_to_a_request_that_names_none() {
    let mut hosts = limit("hosts", KeySource::Ip, window(10));
    http(&mut hosts).hosts = vec![
        HostPattern::new("API.example.com"),
        HostPattern::new("*.example.org"),
    ];
    let policy = policy(vec![hosts]);
    assert!(policy.reads_host);
    for host in ["api.example.com", "eu.example.org", "a.b.example.org"] {
        assert_eq!(get("/").host(host).checked(&policy), ["hosts"], "{host}");
    }
    for host in ["example.org", "www.example.com", "example.org.evil.com"] {
        assert!(get("/").host(host).layers(&policy).is_empty(), "{host}");
    }
    assert_eq!(get("/").checked(&policy), ["hosts"], "no host named");
}

#[test]
fn a_limit_on_a_header_applies_when_one_of_its_values_matches() {
    let mut json = limit("json", KeySource::Ip, window(10));
    http(&mut json).headers = vec![(
        HeaderName::from_static("content-type"),
        PathPattern::glob("application/json*"),
    )];
    let policy = policy(vec![json]);
    let typed = |value: &str| get("/").header("content-type", value);
    assert_eq!(typed("application/json").checked(&policy), ["json"]);
    assert_eq!(
        typed("application/json; charset=utf-8").checked(&policy),
        ["json"]
    );
    assert!(typed("text/plain").layers(&policy).is_empty());
    assert!(get("/").layers(&policy).is_empty(), "no such header");
    let both = typed("text/plain").header("content-type", "application/json");
    assert_eq!(both.checked(&policy), ["json"]);
}

#[test]
fn every_part_of_a_match_must_hold() {
    let mut narrow = limit("narrow", KeySource::Ip, window(10));
    narrow.matcher = LimitMatch::Http(matching(&["POST"], &["/api/*"]));
    http(&mut narrow).hosts = vec![HostPattern::new("api.example.com")];
    let policy = policy(vec![narrow]);
    let request = || get("/api/orders").method("POST").host("api.example.com");
    assert_eq!(request().checked(&policy), ["narrow"]);
    assert!(request().method("PUT").layers(&policy).is_empty());
    assert!(get("/api/orders")
        .method("POST")
        .host("www.example.com")
        .layers(&policy)
        .is_empty());
    assert!(get("/orders")
        .method("POST")
        .host("api.example.com")
        .layers(&policy)
        .is_empty());
}

#[test]
fn a_limit_on_descriptors_meets_no_http_request() {
    let mut rls = limit("rls", KeySource::Entry("remote_address".into()), window(10));
    rls.matcher = LimitMatch::Descriptors(DescriptorPattern {
        domain: "edge".into(),
        entries: vec![EntryPattern {
            key: "remote_address".into(),
            value: None,
        }],
    });
    let policy = policy(vec![rls, limit("per-ip", KeySource::Ip, window(10))]);
    assert_eq!(get("/").checked(&policy), ["per-ip"]);
}

/// Alone or in a list: a key of the route alone once hid a `==` made `!=`.
#[test]
fn a_route_key_is_the_pattern_the_path_matched() {
    let beside_the_address = KeySource::Composite(vec![KeySource::Ip, KeySource::Route]);
    for key in [beside_the_address, KeySource::Route] {
        let mut per_route = limit("per-route", key, window(10));
        per_route.matcher = LimitMatch::Http(matching(&[], &["/users/*", "/orders/*"]));
        let policy = policy(vec![per_route]);
        let identity = |path| get(path).layers(&policy).checks[0].key.identity;
        assert_eq!(identity("/users/1"), identity("/users/2"));
        assert_ne!(identity("/users/1"), identity("/orders/1"));
    }
}

#[test]
fn a_shadow_limit_keys_a_request_without_its_key_as_the_enforcing_one_would() {
    let mut trial = limit("trial", header_key("x-tenant"), window(10));
    trial.enforcement = Enforcement::Shadow;
    trial.on_missing = OnMissing::Ip;
    let policy = policy(vec![trial]);
    let request = get("/");
    let layers = request.layers(&policy);
    assert_eq!(names(&layers.checks), ["trial"]);
    assert_eq!(layers.checks[0].enforcement, Enforcement::Shadow);
    assert_eq!(
        layers.checks[0].key.identity,
        request.client(&policy).ip_hash
    );
}

#[test]
fn a_key_banned_by_a_limit_on_the_body_is_found_when_its_body_goes_unread() {
    let on = |on_missing| {
        let mut gpt4 = limit("gpt-4", KeySource::ApiKey, window(10));
        http(&mut gpt4).body = vec![("model".into(), vec![PathPattern::glob("gpt-4*")])];
        gpt4.ban = Some(ban("gpt-4", 3));
        gpt4.on_missing = on_missing;
        policy(vec![gpt4])
    };
    for on_missing in [OnMissing::Skip, OnMissing::Ip] {
        let policy = on(on_missing);
        let key = policy.clients.api_key_hash(b"k-pro");
        // Struck on the key where the body was read...
        let read = get("/v1/chat")
            .key("k-pro")
            .body(r#"{"model":"gpt-4o"}"#, &policy)
            .layers(&policy);
        assert_eq!(read.checks[0].key.identity, key);
        // ...and looked up on it where it was not, beside the address the
        // limit then counts by.
        let request = get("/v1/chat").key("k-pro");
        let unread = request.layers(&policy);
        let banned: Vec<u128> = unread.bans.iter().map(|b| b.key.identity).collect();
        let address = request.client(&policy).ip_hash;
        assert_eq!(banned, [key, address], "{}", on_missing.as_str());
    }
}

#[test]
fn a_shadow_limit_skips_a_key_it_cannot_tell_with_its_body_read_or_not() {
    let mut trial = limit("trial", header_key("x-tenant"), window(10));
    http(&mut trial).body = vec![("model".into(), vec![PathPattern::glob("gpt-4*")])];
    trial.enforcement = Enforcement::Shadow;
    trial.on_missing = OnMissing::Ip;
    let policy = policy(vec![trial]);
    let twice = || {
        get("/v1/chat")
            .header("x-tenant", "acme")
            .header("x-tenant", "globex")
    };
    let read = twice().body(r#"{"model":"gpt-4o"}"#, &policy);
    assert!(read.layers(&policy).is_empty());
    assert!(twice().layers(&policy).is_empty(), "body unread");
    // Told once, the unread body keys it by the address.
    let once = get("/v1/chat").header("x-tenant", "acme");
    let layers = once.layers(&policy);
    assert_eq!(names(&layers.checks), ["trial"]);
    assert_eq!(layers.checks[0].key.identity, once.client(&policy).ip_hash);
}

#[test]
fn a_key_a_banning_limit_cannot_tell_is_refused_on_every_route() {
    let mut tenant = limit("per-tenant", header_key("x-tenant"), window(10));
    tenant.matcher = LimitMatch::Http(matching(&[], &["/api/*"]));
    tenant.ban = Some(ban("per-tenant", 3));
    let policy = policy(vec![tenant]);
    let twice = get("/about")
        .header("x-tenant", "acme")
        .header("x-tenant", "acme");
    assert_eq!(
        twice.plan(&policy).unwrap_err(),
        IdentityError::AmbiguousKeyHeader(HeaderName::from_static("x-tenant"))
    );
    // Told once, its ban is looked up there.
    let once = get("/about").header("x-tenant", "acme").layers(&policy);
    assert_eq!(once.bans.len(), 1);
}

#[test]
fn a_route_keyed_ban_holds_on_the_rest_of_the_key_on_every_route() {
    let key = KeySource::Composite(vec![KeySource::ApiKey, KeySource::Route]);
    let mut per_route = limit("per-route", key, window(10));
    per_route.matcher = LimitMatch::Http(matching(&[], &["/users/*", "/orders/*"]));
    per_route.ban = Some(ban("per-route", 3));
    let policy = policy(vec![per_route]);
    let on_users = get("/users/1").key("k-pro").layers(&policy);
    let on_orders = get("/orders/1").key("k-pro").layers(&policy);
    let counted_on_users = on_users.checks[0].key.identity;
    let counted_on_orders = on_orders.checks[0].key.identity;
    assert_ne!(counted_on_users, counted_on_orders, "one budget per route");
    // One ban, looked up once, on the same identity on every route...
    let banned = get("/about").key("k-pro").layers(&policy).bans;
    assert_eq!(banned.len(), 1);
    let banned = banned[0].key.identity;
    for request in [get("/users/1"), get("/orders/1")] {
        let layers = request.key("k-pro").layers(&policy);
        let looked_up: Vec<u128> = layers.bans.iter().map(|b| b.key.identity).collect();
        assert_eq!(looked_up, [banned]);
        // ...and struck there by a refusal on any route.
        let counted = layers.checks[0].key.identity;
        assert_ne!(counted, banned);
        assert_eq!(
            Layers::struck_on(&layers.struck_on, LimitId(0), counted),
            banned
        );
    }
    // Another key, another ban.
    let other = get("/about").key("k-free").layers(&policy).bans;
    assert_ne!(other[0].key.identity, banned);
    // Without its key, nothing to look up.
    assert!(get("/about").layers(&policy).is_empty());
}

#[test]
fn a_limit_not_keyed_by_route_strikes_the_identity_it_counts_on() {
    let mut per_key = limit("per-key", KeySource::ApiKey, window(10));
    per_key.ban = Some(ban("per-key", 3));
    let policy = policy(vec![per_key]);
    let layers = get("/users/1").key("k-pro").layers(&policy);
    assert!(layers.struck_on.is_empty());
    let counted = layers.checks[0].key.identity;
    assert_eq!(layers.bans[0].key.identity, counted);
    assert_eq!(
        Layers::struck_on(&layers.struck_on, LimitId(0), counted),
        counted
    );
}

// What the config check, the admin API and the logs read of a policy:
// pinned here so that a wrong line in them fails in this crate
// (scripts/mutants.sh).

#[test]
fn a_host_pattern_is_a_name_or_the_subdomains_of_a_domain() {
    let exact = HostPattern::new("API.Example.com.");
    assert_eq!(exact.as_str(), "api.example.com");
    assert!(exact.matches("api.example.com"));
    assert!(!exact.matches("www.api.example.com"));
    let subdomains = HostPattern::new("*.example.org");
    assert!(subdomains.matches("a.example.org"));
    assert!(subdomains.matches("a.b.example.org"));
    // Not the domain itself, nor a name that only ends like it.
    for host in [
        "example.org",
        ".example.org",
        "aexample.org",
        "example.org.evil",
    ] {
        assert!(!subdomains.matches(host), "{host}");
    }
}

fn descriptors(domain: &str) -> LimitMatch {
    LimitMatch::Descriptors(DescriptorPattern {
        domain: domain.into(),
        entries: vec![EntryPattern {
            key: "remote_address".into(),
            value: None,
        }],
    })
}

#[test]
fn a_matcher_describes_each_of_its_parts() {
    assert_eq!(Matcher::default().describe(), "all requests");
    let mut matcher = matching(&["get", "post"], &["/api/*", "/login"]);
    matcher.hosts = vec![
        HostPattern::new("a.example.com"),
        HostPattern::new("*.example.org"),
    ];
    matcher.headers = vec![(
        HeaderName::from_static("content-type"),
        PathPattern::new("text/*"),
    )];
    matcher.body = vec![(
        "model".into(),
        vec![PathPattern::new("gpt-4o*"), PathPattern::new("o1")],
    )];
    assert_eq!(
        matcher.describe(),
        "GET|POST /api/* /login host a.example.com *.example.org \
         with content-type: text/* with body model: gpt-4o*|o1"
    );
    assert_eq!(
        descriptors("edge").describe(),
        "domain edge descriptor [remote_address]"
    );
}

#[test]
fn matchers_overlap_when_some_request_could_meet_both() {
    let m = |methods: &[&str], paths: &[&str]| LimitMatch::Http(matching(methods, paths));
    let overlap = |a: &LimitMatch, b: &LimitMatch| (a.may_overlap(b), b.may_overlap(a));
    assert_eq!(overlap(&m(&[], &[]), &m(&["get"], &["/a"])), (true, true));
    assert_eq!(
        overlap(&m(&["get"], &[]), &m(&["get", "post"], &[])),
        (true, true)
    );
    assert_eq!(
        overlap(&m(&["get"], &[]), &m(&["post"], &[])),
        (false, false)
    );
    // A pattern against the other's text, either way round.
    assert_eq!(
        overlap(&m(&[], &["/api/*"]), &m(&[], &["/api/orders"])),
        (true, true)
    );
    assert_eq!(overlap(&m(&[], &["/a"]), &m(&[], &["/b"])), (false, false));
    // Both must overlap: the methods and the paths.
    assert_eq!(
        overlap(&m(&["get"], &["/a"]), &m(&["post"], &["/a"])),
        (false, false)
    );
    assert_eq!(
        overlap(&m(&["get"], &["/a"]), &m(&["get"], &["/b"])),
        (false, false)
    );
    // A limit of the rate limit service meets only those of its domain.
    assert_eq!(
        overlap(&descriptors("edge"), &descriptors("edge")),
        (true, true)
    );
    assert_eq!(
        overlap(&descriptors("edge"), &descriptors("other")),
        (false, false)
    );
    assert_eq!(overlap(&descriptors("edge"), &m(&[], &[])), (false, false));
}

#[test]
fn a_rule_is_shown_compared_and_quoted_by_its_quota() {
    let fixed = window(10);
    assert_eq!(fixed.to_string(), per_minute(10).to_string());
    assert_eq!(fixed.quota(), 10);
    assert_eq!(concurrency(3).quota(), 3);
    let slow = Rule::Concurrency(Concurrency {
        max: 3,
        lease_us: 1_500_000,
        upgrades: Upgrades::Exclude,
    });
    assert_eq!(
        slow.to_string(),
        "concurrency max=3 lease=1.5s upgrades=exclude"
    );
    assert_eq!(concurrency(2).to_string(), "concurrency max=2 lease=60s");
    // Same kind: the same algorithm whatever its numbers, or concurrency.
    assert!(fixed.same_kind(&window(99)));
    assert!(concurrency(1).same_kind(&slow));
    let bucket = Rule::Rate(Algorithm::token_bucket(10, SEC).unwrap());
    assert!(!fixed.same_kind(&bucket));
    assert!(!fixed.same_kind(&concurrency(10)));
    assert!(!concurrency(10).same_kind(&fixed));
}

#[test]
fn statuses_contain_their_ranges_bounds_included() {
    let statuses = Statuses::new(vec![(401, 401), (500, 599)]);
    for status in [401, 500, 503, 599] {
        assert!(statuses.contains(status), "{status}");
    }
    for status in [400, 402, 499, 600, 200] {
        assert!(!statuses.contains(status), "{status}");
    }
    assert_eq!(statuses.to_string(), "401, 5xx");
    assert_eq!(Statuses::new(vec![(429, 429)]).to_string(), "429");
}

#[test]
fn cost_sources_and_on_missing_are_named_as_the_config_names_them() {
    assert_eq!(LlmProvider::OpenAi.name(), "openai");
    assert_eq!(LlmProvider::Anthropic.name(), "anthropic");
    let header = CostSource::Header(HeaderName::from_static("x-cost"));
    assert_eq!(header.to_string(), "x-cost");
    let usage = CostSource::Usage {
        provider: LlmProvider::Anthropic,
        prompt_weight: 1,
        completion_weight: 4,
    };
    assert_eq!(
        usage.to_string(),
        "anthropic usage (1 per prompt token, 4 per completion token)"
    );
    let names = [OnMissing::Skip, OnMissing::Deny, OnMissing::Ip].map(OnMissing::as_str);
    assert_eq!(names, ["skip", "deny", "ip"]);
}

#[test]
fn layers_are_empty_only_with_nothing_of_any_kind() {
    assert!(Layers::default().is_empty());
    let check = ban("x", 3).penalty_check(LimitId(0), 1, Spending::Peek);
    let key = StateKey {
        limit: 1,
        identity: 1,
    };
    let slot = Slot::new(LimitName::new("x"), key, 1, SEC, 1, OnFailure::Allow).unwrap();
    let one_of_each = [
        Layers {
            checks: vec![check.clone()],
            ..Layers::default()
        },
        Layers {
            reservations: vec![(
                check.clone(),
                ChargedByResponse::Status(Statuses::new(vec![])),
            )],
            ..Layers::default()
        },
        Layers {
            bans: vec![check],
            ..Layers::default()
        },
        Layers {
            slots: vec![SlotLayer {
                limit: LimitId(0),
                slot,
                upgrades: Upgrades::Include,
                enforcement: Enforcement::Enforce,
            }],
            ..Layers::default()
        },
    ];
    for layers in one_of_each {
        assert!(!layers.is_empty(), "{layers:?}");
    }
}

/// `cost_from_response` priced by usage.
fn usage_cost(from_request: bool, include_usage: bool) -> ChargedByResponse {
    ChargedByResponse::Cost(ResponseCost {
        source: CostSource::Usage {
            provider: LlmProvider::OpenAi,
            prompt_weight: 1,
            completion_weight: 1,
        },
        max: 100,
        default: 1,
        reserve: 10,
        from_request,
        include_usage,
        expose: false,
    })
}

#[test]
fn the_body_is_read_for_the_fields_some_limit_reads_once_each() {
    let mut by_user = limit(
        "by-user",
        KeySource::Composite(vec![KeySource::Ip, KeySource::Body("user".into())]),
        window(10),
    );
    by_user.matcher = LimitMatch::Http(matching(&[], &["/v1/*"]));
    let mut by_model = limit("by-model", KeySource::Body("model".into()), window(10));
    http(&mut by_model).body = vec![("user".into(), vec![PathPattern::new("*")])];
    let mut reserved = limit("reserved", KeySource::Ip, window(10));
    reserved.charged_by_response = Some(usage_cost(true, false));
    let mut streamed = limit("streamed", KeySource::Ip, window(10));
    streamed.charged_by_response = Some(usage_cost(false, true));
    let mut fixed = limit("fixed", KeySource::Ip, window(10));
    fixed.charged_by_response = Some(usage_cost(false, false));
    for (l, reads) in [
        (&by_user, true),
        (&by_model, true),
        (&reserved, true),
        (&streamed, true),
        (&fixed, false),
    ] {
        assert_eq!(l.reads_body(), reads, "{}", l.name);
    }
    let policy = policy(vec![by_user, fixed.clone(), by_model, reserved]);
    let fields: Vec<&str> = policy.body_fields.iter().map(|f| &**f).collect();
    assert_eq!(
        fields,
        ["user", "model", "max_completion_tokens", "max_tokens"]
    );
    // Read for a request some reading limit's head matches, only.
    let view = |r: &Request, client: &Client| -> bool {
        policy.reads_body(&RequestView {
            method: &r.method,
            path: r.path,
            headers: &r.headers,
            query: None,
            host: r.host,
            client,
            body: None,
        })
    };
    let request = get("/v1/chat");
    assert!(view(&request, &request.client(&policy)));
    let only_fixed = super::tests::policy(vec![fixed]);
    let request = get("/v1/chat");
    assert!(!only_fixed.reads_body(&RequestView {
        method: &request.method,
        path: request.path,
        headers: &request.headers,
        query: None,
        host: None,
        client: &request.client(&only_fixed),
        body: None,
    }));
}

#[test]
fn the_host_is_worked_out_only_when_a_limit_or_cost_reads_it() {
    assert!(!policy(vec![limit("per-ip", KeySource::Ip, window(10))]).reads_host);
    assert!(policy(vec![limit("per-host", KeySource::Host, window(10))]).reads_host);
    let mut on_host = limit("on-host", KeySource::Ip, window(10));
    http(&mut on_host).hosts = vec![HostPattern::new("a.example.com")];
    assert!(policy(vec![on_host]).reads_host);
    let cost = CostRule {
        matcher: Matcher {
            hosts: vec![HostPattern::new("a.example.com")],
            ..Matcher::default()
        },
        cost: 2,
        limits: Vec::new(),
    };
    let priced = policy_with(
        vec![limit("per-ip", KeySource::Ip, window(10))],
        vec![cost],
        &[],
        &[],
    );
    assert!(priced.reads_host);
}

#[test]
fn the_limits_of_the_rate_limit_service_are_listed_with_their_places() {
    let mut rls = limit("rls", KeySource::Entry("remote_address".into()), window(10));
    rls.matcher = descriptors("edge");
    let policy = policy(vec![limit("per-ip", KeySource::Ip, window(10)), rls]);
    let listed: Vec<(LimitId, &str)> = policy
        .descriptor_limits()
        .map(|(id, l)| (id, l.name.as_str()))
        .collect();
    assert_eq!(listed, [(LimitId(1), "rls")]);
}

#[test]
fn the_bans_of_address_limits_are_looked_up_by_the_address() {
    let mut by_ip = limit("by-ip", KeySource::Ip, window(10));
    by_ip.ban = Some(ban("by-ip", 3));
    let mut by_key = limit("by-key", header_key("x-user"), window(10));
    by_key.ban = Some(ban("by-key", 3));
    let plain = limit("plain", KeySource::Ip, window(10));
    let policy = policy(vec![plain, by_key, by_ip]);
    let client = get("/").client(&policy);
    let bans = policy.address_bans(&client);
    assert_eq!(bans.len(), 1);
    let banned = &bans[0];
    assert_eq!(
        (banned.limit, banned.name.as_str(), banned.spending),
        (LimitId(2), "ban:by-ip", Spending::Peek)
    );
    assert_eq!(banned.key.identity, client.ip_hash);
}

/// `[clients.jwt]` with no key (none is verified here), its tier read
/// from claim `plan` when `tier_claim`.
fn with_jwt(mut policy: Policy, tier_claim: bool) -> Policy {
    let tier_claim = tier_claim.then(|| crate::jwt::ClaimPath::parse("plan").unwrap());
    policy.clients.jwt = Some(Arc::new(crate::jwt::JwtRules::new(
        HeaderName::from_static("authorization"),
        Vec::new(),
        0,
        tier_claim,
        HashMap::new(),
    )));
    policy
}

#[test]
fn a_token_is_needed_only_where_a_claim_can_change_the_outcome() {
    let needs = |policy: &Policy, r: Request| {
        let client = r.client(policy);
        policy.needs_token(&RequestView {
            method: &r.method,
            path: r.path,
            headers: &r.headers,
            query: None,
            host: None,
            client: &client,
            body: None,
        })
    };
    let per_ip = || limit("per-ip", KeySource::Ip, window(10));
    // No [clients.jwt]: never.
    assert!(!needs(&policy(vec![per_ip()]), get("/")));
    // A tier claim matters only where tiers do.
    assert!(!needs(&with_jwt(policy(vec![per_ip()]), true), get("/")));
    let mut tiered = per_ip();
    tiered.tiers = vec![(clients().tiers.get("pro").unwrap(), window(100))];
    assert!(needs(
        &with_jwt(policy(vec![tiered.clone()]), true),
        get("/")
    ));
    assert!(!needs(&with_jwt(policy(vec![tiered]), false), get("/")));
    let exempt_tier = policy_with(vec![per_ip()], Vec::new(), &[], &["pro"]);
    assert!(needs(&with_jwt(exempt_tier, true), get("/")));
    // A blocked subject is looked for on every request.
    let mut blocking = with_jwt(policy(vec![per_ip()]), false);
    blocking.block.jwt_subjects.insert(7);
    assert!(needs(&blocking, get("/")));
    // A limit keyed on a claim: where it applies, or everywhere if it bans.
    let claim = KeySource::Jwt(crate::jwt::ClaimPath::parse("sub").unwrap());
    let mut by_sub = limit("by-sub", claim, window(10));
    by_sub.matcher = LimitMatch::Http(matching(&[], &["/api/*"]));
    let keyed = with_jwt(policy(vec![per_ip(), by_sub.clone()]), false);
    assert!(needs(&keyed, get("/api/orders")));
    assert!(!needs(&keyed, get("/about")));
    by_sub.ban = Some(ban("by-sub", 3));
    let banning = with_jwt(policy(vec![by_sub]), false);
    assert!(needs(&banning, get("/about")));
}

/// A run-time override of `rule` for `identity` under `limit`.
fn overrides(limit: &Limit, identity: u128, rule: Rule) -> Arc<RunTimeOverrides> {
    let table = RunTimeOverrides::default();
    let entry = crate::overrides::Override {
        limit_name: limit.name.as_str().into(),
        rule: Ok(rule),
        numbers: "{}".into(),
        expires_at_s: None,
        set_at_s: 0,
        client: "ip=203.0.113.7".into(),
        label: None,
    };
    let key = crate::overrides::OverrideKey {
        limit: limit.id,
        identity,
    };
    table.set([(key, Some(entry))]);
    Arc::new(table)
}

#[test]
fn a_clients_own_numbers_replace_its_tiers_for_the_same_algorithm_only() {
    let per_ip = limit("per-ip", KeySource::Ip, window(10));
    let mut policy = policy(vec![per_ip.clone()]);
    let client = get("/").client(&policy);
    let anonymous = client.tier.clone();
    let in_force = |policy: &Policy, identity| policy.rule_in_force(&per_ip, &anonymous, identity);
    assert_eq!(in_force(&policy, client.ip_hash), window(10));
    // An empty table is no table.
    policy.overrides = Some(Arc::new(RunTimeOverrides::default()));
    assert_eq!(in_force(&policy, client.ip_hash), window(10));
    policy.overrides = Some(overrides(&per_ip, client.ip_hash, window(500)));
    assert_eq!(in_force(&policy, client.ip_hash), window(500));
    assert_eq!(in_force(&policy, client.ip_hash ^ 1), window(10));
    assert_eq!(names(&get("/").layers(&policy).checks), ["per-ip"]);
    assert_eq!(
        get("/").layers(&policy).checks[0].algorithm,
        per_minute(500)
    );
    // Numbers checked for another algorithm mean nothing to this one.
    policy.overrides = Some(overrides(&per_ip, client.ip_hash, concurrency(5)));
    assert_eq!(in_force(&policy, client.ip_hash), window(10));
}

#[test]
fn a_limit_on_no_host_applies_whatever_host_a_request_names() {
    let policy = policy(vec![limit("per-ip", KeySource::Ip, window(10))]);
    assert_eq!(
        get("/").host("api.example.com").checked(&policy),
        ["per-ip"]
    );
}
