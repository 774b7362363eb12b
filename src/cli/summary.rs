//! What `floodgate check` prints: the configuration as floodgate understood it.

use std::fmt::Write;
use std::time::Duration;

use floodgate_algorithm::ALGORITHMS;
use floodgate_policy::{ChargedByResponse, KeySource, Limit, OnMissing, Policy, Rule};

use crate::config::Config;
use floodgate_limiter::redis::InstanceCount;
use floodgate_limiter::Enforcement;
use floodgate_policy::identity::IdentityKeySource;
use floodgate_policy::path::EscapedSlashes;

pub fn describe(config: &Config) -> String {
    let mut out = String::new();
    listeners(&mut out, config);
    tls(&mut out, config);
    let _ = writeln!(out, "upstream  {}", config.upstream.servers.join(", "));
    protection(&mut out, config);
    rls(&mut out, config);
    tracing(&mut out, config);
    store(&mut out, config);
    clients(&mut out, config);
    paths(&mut out, &config.policy);
    layers(&mut out, &config.policy);
    algorithms(&mut out, &config.policy);
    costs(&mut out, &config.policy);
    leases(&mut out, config);
    exempt(&mut out, &config.policy);
    out
}

fn listeners(out: &mut String, config: &Config) {
    let listen: Vec<String> = config.server.listen.iter().map(|a| a.to_string()).collect();
    let _ = writeln!(out, "{}: ok", config.file.display());
    let _ = writeln!(out, "listen    {}", listen.join(", "));
    if let Some(admin) = config.server.admin_listen {
        let _ = writeln!(out, "admin     {admin}");
    }
}

fn tls(out: &mut String, config: &Config) {
    let Some(tls) = &config.tls else {
        return;
    };
    let listen: Vec<String> = tls.listen.iter().map(|a| a.to_string()).collect();
    let _ = writeln!(
        out,
        "tls       {} ({})",
        listen.join(", "),
        if tls.http2 {
            "h2, http/1.1"
        } else {
            "http/1.1"
        }
    );
    for (source, summary) in tls.sources.iter().zip(&tls.certs.summaries) {
        let serves = if source.server_names.is_empty() {
            "default".to_string()
        } else {
            format!("for {}", source.server_names.join(", "))
        };
        let _ = writeln!(
            out,
            "  {} ({serves}) expires {}",
            summary.names.join(", "),
            summary.expires
        );
    }
}

fn protection(out: &mut String, config: &Config) {
    let Some(p) = &config.protection else {
        return;
    };
    let c = &p.controller;
    let mut order: Vec<String> = p.priority.iter().map(|t| t.name().to_string()).collect();
    order.push("others".into());
    let _ = writeln!(
        out,
        "protect   requests in flight to the upstream within {}..{} (from {}), following its latency (up to {} x its minimum, every {} ms, measured again every {} s); shed from the lowest of {} ({}% held from it), {}503 Retry-After {} s",
        c.min,
        c.max,
        c.initial,
        c.tolerance,
        c.window_us / 1_000,
        c.probe_interval_us / 1_000_000,
        order.join(" > "),
        (p.reserve * 100.0).round(),
        p.queue.map_or(String::new(), |q| format!(
            "after a wait of at most {} ms among at most {} waiting, ",
            q.timeout.as_millis(),
            q.max
        )),
        p.retry_after.as_secs().max(1)
    );
}

fn rls(out: &mut String, config: &Config) {
    let Some(rls) = &config.rls else {
        return;
    };
    let _ = writeln!(
        out,
        "rls       {} (Envoy's rate limit service, gRPC over {}; {})",
        rls.listen,
        if rls.tls { "TLS" } else { "h2c" },
        if config.rls_tokens.is_some() {
            "callers show a token of token_file"
        } else {
            "any caller that reaches it is answered: bind it where only Envoy does"
        }
    );
}

fn tracing(out: &mut String, config: &Config) {
    use crate::tracing::{Protocol, TrustParent};
    let Some(t) = &config.tracing else {
        return;
    };
    let _ = writeln!(
        out,
        "tracing   spans to {} (OTLP/{}), {}% of new traces, at most {} spans/s; a caller's trace continued {}",
        t.endpoint,
        match t.protocol {
            Protocol::Grpc => "gRPC",
            Protocol::Http => "HTTP",
        },
        t.sample_ratio * 100.0,
        t.max_spans_per_second,
        match t.trust_parent {
            TrustParent::Nobody => "never",
            TrustParent::TrustedProxies => "from [clients].trusted_proxies only",
            TrustParent::Everyone => "from anyone",
        }
    );
}

fn store(out: &mut String, config: &Config) {
    match &config.redis {
        Some(r) => {
            let _ = writeln!(
                out,
                "store     redis {} (timeout {:?}, on_failure {}, {})",
                r.redacted_target(),
                r.timeout,
                r.on_failure.as_str(),
                r.instances
            );
        }
        None => {
            let _ = writeln!(out, "store     memory (at most {} keys)", config.max_keys);
        }
    }
}

/// How clients are told apart: the forwarded header, tokens, the block
/// list, and whether their identities can be computed from outside.
fn clients(out: &mut String, config: &Config) {
    let policy = &config.policy;
    let clients = &policy.clients;
    let identity_key = match config.identity_key {
        IdentityKeySource::Secret => "keyed by the shared secret",
        IdentityKeySource::PerProcess => "keyed by a secret drawn at start",
        IdentityKeySource::Public => "public key",
    };
    let _ = writeln!(
        out,
        "clients   forwarded header {} from {} trusted prefix(es); identities hashed, {identity_key}",
        clients.forwarded_header.name(),
        clients.trusted_proxies.len()
    );
    if let Some(jwt) = &clients.jwt {
        let _ = writeln!(out, "jwt       {}", jwt.describe());
    }
    let block = &policy.block;
    if !block.is_empty() {
        let _ = writeln!(
            out,
            "block     {} range(s), {} API key(s), {} subject(s), answered {}",
            block.cidrs.len(),
            block.api_keys.len(),
            block.jwt_subjects.len(),
            block.status
        );
    }
    if config.identity_key == IdentityKeySource::Public {
        let _ = writeln!(
            out,
            "  warning: a Redis store without an identity secret: clients can compute their keys and shards; set FLOODGATE_IDENTITY_SECRET or [clients].identity_secret_file on every instance"
        );
    }
}

fn paths(out: &mut String, policy: &Policy) {
    let _ = writeln!(
        out,
        "paths     escaped slashes: {}; matching {}",
        match policy.paths.escaped_slashes {
            EscapedSlashes::Reject => "reject",
            EscapedSlashes::Keep => "keep",
            EscapedSlashes::Decode => "decode",
        },
        if policy.paths.case_insensitive {
            "ignores case"
        } else {
            "is case-sensitive"
        }
    );
}

fn layers(out: &mut String, policy: &Policy) {
    let _ = writeln!(out, "layers    {}", policy.limits.len());
    for (layer, limit) in policy.limits.iter().enumerate() {
        let flags = flags(policy, limit);
        let _ = writeln!(
            out,
            "  {:<16} key={:<10} {} on {}{}",
            limit.name,
            limit.key.describe(),
            limit.rule,
            limit.matcher.describe(),
            if flags.is_empty() {
                String::new()
            } else {
                format!(" [{}]", flags.join(", "))
            }
        );
        for (tier, algorithm) in &limit.tiers {
            let _ = writeln!(out, "  {:<16}   tier {tier}: {algorithm}", "");
        }
        cost_warnings(out, policy, layer, limit);
        skip_warnings(out, policy, layer, limit);
    }
}

/// What sets a limit apart from a plain one, in brackets after it.
fn flags(policy: &Policy, limit: &Limit) -> Vec<String> {
    let mut flags = Vec::new();
    if limit.enforcement == Enforcement::Shadow {
        flags.push("shadow".to_string());
    }
    if limit.on_failure != policy.default_on_failure {
        flags.push(format!("on_failure={}", limit.on_failure.as_str()));
    }
    match &limit.charged_by_response {
        Some(ChargedByResponse::Status(statuses)) => flags.push(format!("counted on {statuses}")),
        Some(ChargedByResponse::Cost(priced)) => flags.push(format!(
            "cost from {} (at most {}, default {}; reserving {}{})",
            priced.source,
            priced.max,
            priced.default,
            if priced.from_request {
                "the request's own worst case".to_string()
            } else {
                priced.reserve.to_string()
            },
            if priced.include_usage {
                "; streams asked for their usage"
            } else {
                ""
            }
        )),
        None => {}
    }
    if let Some(ban) = &limit.ban {
        flags.push(format!(
            "ban for {}s after {} refusals within {}s",
            ban.penalty.window_us() / 1_000_000,
            ban.strikes.quota(),
            ban.strikes.window_us() / 1_000_000
        ));
    }
    flags
}

/// Costs that can never pass the limit at `layer`.
fn cost_warnings(out: &mut String, policy: &Policy, layer: usize, limit: &Limit) {
    // A concurrency limit counts requests, not their cost.
    let Rule::Rate(algorithm) = limit.rule else {
        return;
    };
    for cost in &policy.costs {
        if !cost.limits.is_empty() && !cost.limits.contains(&layer) {
            continue;
        }
        if cost.cost > algorithm.quota()
            && limit
                .matcher
                .http()
                .is_some_and(|m| cost.matcher.may_overlap(m))
        {
            let _ = writeln!(
                out,
                "  warning: cost {} on {} exceeds this limit's quota {}: such requests are always refused",
                cost.cost,
                cost.matcher.describe(),
                algorithm.quota()
            );
        }
    }
}

/// Ways a request can skip the limit at `layer`.
fn skip_warnings(out: &mut String, policy: &Policy, layer: usize, limit: &Limit) {
    // A key the client may leave out, skipped when it does, with no
    // other limit but by address on its routes: leaving it out is a
    // way around it.
    let can_dodge = |l: &Limit| {
        l.enforcement == Enforcement::Shadow
            || (l.key.omittable() && l.on_missing == OnMissing::Skip)
    };
    let dodged = limit.enforcement == Enforcement::Enforce
        && can_dodge(limit)
        && !policy.limits.iter().enumerate().any(|(other, l)| {
            other != layer
                && l.key != KeySource::Ip
                && !can_dodge(l)
                && l.matcher.may_overlap(&limit.matcher)
        });
    if dodged {
        let _ = writeln!(
            out,
            "  warning: a request without {} skips this limit, and no other limit but by address applies on {}: set on_missing = \"deny\" or \"ip\"",
            limit.key.describe(),
            limit.matcher.describe()
        );
    }
    if limit.enforcement == Enforcement::Enforce
        && !limit.matcher.body().is_empty()
        && limit.on_missing == OnMissing::Skip
    {
        let _ = writeln!(
            out,
            "  warning: a body that cannot be read (past max_body, chunked, not JSON) skips this limit: set on_missing = \"deny\" or \"ip\""
        );
    }
}

/// What each algorithm in use guarantees, from the algorithm table.
fn algorithms(out: &mut String, policy: &Policy) {
    for spec in ALGORITHMS.iter().filter(|spec| {
        policy
            .limits
            .iter()
            .any(|l| matches!(l.rule, Rule::Rate(a) if a.kind() == spec.kind))
    }) {
        let _ = writeln!(
            out,
            "algorithm {}: {}",
            spec.name,
            spec.summary.replace('`', "")
        );
    }
}

fn costs(out: &mut String, policy: &Policy) {
    for cost in &policy.costs {
        let priced: Vec<&str> = cost
            .limits
            .iter()
            .map(|&layer| policy.limits[layer].name.as_str())
            .collect();
        let _ = writeln!(
            out,
            "cost      {} on {}{}",
            cost.cost,
            cost.matcher.describe(),
            if priced.is_empty() {
                String::new()
            } else {
                format!(" to {}", priced.join(", "))
            }
        );
    }
}

fn leases(out: &mut String, config: &Config) {
    let Some((lease, instances)) = config
        .redis
        .as_ref()
        .and_then(|r| r.leases.map(|l| (l, r.instances)))
    else {
        return;
    };
    let leased: Vec<&str> = config
        .policy
        .limits
        .iter()
        .filter(|l| l.leases)
        .map(|l| l.name.as_str())
        .collect();
    let _ = writeln!(
        out,
        "leases    at most {} units or what is left / {}, for at most {:?}: {}",
        lease.max,
        match instances {
            InstanceCount::Fixed(n) => (2 * n).to_string(),
            InstanceCount::Auto => "(2 x the instances counted)".to_string(),
        },
        Duration::from_micros(lease.ttl_us),
        if leased.is_empty() {
            "no limit leases".to_string()
        } else {
            leased.join(", ")
        }
    );
}

fn exempt(out: &mut String, policy: &Policy) {
    if policy.exempt_paths.is_empty() && policy.exempt_tiers.is_empty() {
        return;
    }
    let paths: Vec<&str> = policy.exempt_paths.iter().map(|p| p.as_str()).collect();
    let tiers: Vec<&str> = policy.exempt_tiers.iter().map(|t| t.name()).collect();
    let _ = writeln!(
        out,
        "exempt    paths [{}] tiers [{}]",
        paths.join(", "),
        tiers.join(", ")
    );
}
