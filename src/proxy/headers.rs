//! Decisions turned into what the client sees: rate-limit headers and the
//! 429. Pure functions; the proxy only copies the result onto the wire.

use http::HeaderValue;
use serde::Deserialize;

use crate::proxy::header_name::SpelledName;
use floodgate_algorithm::Decision;

pub static RATELIMIT_LIMIT: SpelledName =
    SpelledName::from_static("ratelimit-limit", "RateLimit-Limit");
pub static RATELIMIT_REMAINING: SpelledName =
    SpelledName::from_static("ratelimit-remaining", "RateLimit-Remaining");
pub static RATELIMIT_RESET: SpelledName =
    SpelledName::from_static("ratelimit-reset", "RateLimit-Reset");
pub static RATELIMIT_POLICY: SpelledName =
    SpelledName::from_static("ratelimit-policy", "RateLimit-Policy");
pub static RATELIMIT: SpelledName = SpelledName::from_static("ratelimit", "RateLimit");
pub static RETRY_AFTER: SpelledName = SpelledName::from_static("retry-after", "Retry-After");
pub static RETRY_AFTER_MS: SpelledName =
    SpelledName::from_static("retry-after-ms", "retry-after-ms");
pub static CONTENT_TYPE: SpelledName = SpelledName::from_static("content-type", "Content-Type");
pub static CACHE_CONTROL: SpelledName = SpelledName::from_static("cache-control", "Cache-Control");

/// A header floodgate writes: its name, built once, and its value, made
/// where it is known (a constant costs no allocation, a number no check).
pub type Header = (&'static SpelledName, HeaderValue);

/// `[response].headers`: which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderStyle {
    Legacy,
    Draft,
    Both,
    None,
}

/// A layer's place among one request's outcomes (`Verdict::outcomes`): not
/// the limit's place in the policy, which is a `LimitId`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position(pub usize);

/// One enforcing layer's outcome, as the headers describe it.
#[derive(Debug, Clone, Copy)]
pub struct EnforcedOutcome<'a> {
    pub position: Position,
    pub name: &'a str,
    /// The limit's quota and its window in µs, for `RateLimit-Policy`
    /// (for a concurrency limit: its slots and its lease).
    pub quota: u64,
    pub window_us: u64,
    pub decision: Decision,
    /// A ban's refusal: the key is shut out, not over a rate.
    pub banned: bool,
}

/// Whole seconds, rounded up.
pub fn ceil_secs(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

pub fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(1_000)
}

/// The layer a client is closest to exhausting: least remaining, then the
/// longest wait until it resets.
pub fn most_constrained<'a, 'b>(
    layers: &'b [EnforcedOutcome<'a>],
) -> Option<&'b EnforcedOutcome<'a>> {
    layers.iter().min_by(|a, b| {
        a.decision.remaining().cmp(&b.decision.remaining()).then(
            b.decision
                .reset_after_us()
                .cmp(&a.decision.reset_after_us()),
        )
    })
}

/// Of the refusing layers, the one that keeps the client waiting longest:
/// the request passes only once every layer admits it.
pub fn refusing<'a, 'b>(layers: &'b [EnforcedOutcome<'a>]) -> Option<&'b EnforcedOutcome<'a>> {
    layers
        .iter()
        .filter(|l| !l.decision.allowed())
        .max_by_key(|l| (l.decision.cost_exceeds_limit(), l.decision.retry_after_us()))
}

/// The rate-limit headers for a response to which `layers` applied.
/// `shown` is the layer whose state is reported (the most constrained, or
/// the refusing one on a 429).
pub fn rate_limit_headers(
    style: HeaderStyle,
    layers: &[EnforcedOutcome<'_>],
    shown: &EnforcedOutcome<'_>,
) -> Vec<Header> {
    // Built by hand rather than with format!: this runs on every admitted
    // request, and the formatting machinery cost more than the limiter.
    let mut out = Vec::with_capacity(5);
    let d = &shown.decision;
    let mut n = itoa::Buffer::new();
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        out.push((&RATELIMIT_LIMIT, HeaderValue::from(d.limit())));
        out.push((&RATELIMIT_REMAINING, HeaderValue::from(d.remaining())));
        out.push((
            &RATELIMIT_RESET,
            HeaderValue::from(ceil_secs(d.reset_after_us())),
        ));
    }
    if matches!(style, HeaderStyle::Draft | HeaderStyle::Both) {
        let mut policy = String::with_capacity(32 * layers.len());
        for (i, l) in layers.iter().enumerate() {
            if i > 0 {
                policy.push_str(", ");
            }
            policy.push('"');
            policy.push_str(l.name);
            policy.push_str("\";q=");
            policy.push_str(n.format(l.quota));
            policy.push_str(";w=");
            policy.push_str(n.format(ceil_secs(l.window_us).max(1)));
        }
        let mut current = String::with_capacity(32);
        current.push('"');
        current.push_str(shown.name);
        current.push_str("\";r=");
        current.push_str(n.format(d.remaining()));
        current.push_str(";t=");
        current.push_str(n.format(ceil_secs(d.reset_after_us())));
        // Limit names are letters, digits, '_', '-' and '.' (the config
        // checks): these are always valid values.
        if let (Ok(policy), Ok(current)) = (
            HeaderValue::try_from(policy),
            HeaderValue::try_from(current),
        ) {
            out.push((&RATELIMIT_POLICY, policy));
            out.push((&RATELIMIT, current));
        }
    }
    out
}

/// `Retry-After`: whole seconds, at least one.
pub fn retry_after(us: u64) -> Header {
    (&RETRY_AFTER, HeaderValue::from(ceil_secs(us).max(1)))
}

/// `retry-after-ms`: the wait in milliseconds, rounded up, as the OpenAI
/// and Anthropic client libraries read it before `Retry-After` (whose whole
/// seconds make them wait up to a second longer than needed).
pub fn retry_after_ms(us: u64) -> Header {
    (&RETRY_AFTER_MS, HeaderValue::from(ceil_ms(us).max(1)))
}

/// The headers of every JSON answer floodgate writes itself (429, 502, 503,
/// 504): never cached.
pub fn json_headers() -> Vec<Header> {
    vec![
        (&CONTENT_TYPE, HeaderValue::from_static("application/json")),
        (&CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ]
}

/// Status, headers and body of the refusal.
pub struct Rejection {
    pub status: u16,
    pub headers: Vec<Header>,
    pub body: String,
}

/// The 429; `request_id` (plain characters only, see `request_id`) goes in
/// its body.
pub fn rejection(
    style: HeaderStyle,
    layers: &[EnforcedOutcome<'_>],
    refused: &EnforcedOutcome<'_>,
    request_id: &str,
) -> Rejection {
    let mut headers = json_headers();
    let d = &refused.decision;
    if refused.banned {
        // A ban has no rate to advertise: only when it ends.
        headers.push(retry_after(d.retry_after_us()));
        headers.push(retry_after_ms(d.retry_after_us()));
        let body = refusal_body(
            "banned",
            refused.name,
            ("retry_after_ms", ceil_ms(d.retry_after_us())),
            request_id,
        );
        return Rejection {
            status: 429,
            headers,
            body,
        };
    }
    let body = if d.cost_exceeds_limit() {
        // Retrying cannot help, so no Retry-After: the body says why.
        refusal_body(
            "cost_exceeds_limit",
            refused.name,
            ("cost_limit", d.limit()),
            request_id,
        )
    } else {
        headers.push(retry_after(d.retry_after_us()));
        headers.push(retry_after_ms(d.retry_after_us()));
        refusal_body(
            "rate_limited",
            refused.name,
            ("retry_after_ms", ceil_ms(d.retry_after_us())),
            request_id,
        )
    };
    headers.extend(rate_limit_headers(style, layers, refused));
    Rejection {
        status: 429,
        headers,
        body,
    }
}

/// `{"error":"<error>","limit":"<limit>","<field>":<n>,"request_id":"<id>"}`,
/// by hand for the reason `rate_limit_headers` is: every refusal writes
/// one. The limit name and the id are plain characters (the config and
/// `request_id` check them): nothing to escape.
fn refusal_body(error: &str, limit: &str, (field, n): (&str, u64), request_id: &str) -> String {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(n);
    let mut body = String::with_capacity(
        64 + error.len() + limit.len() + field.len() + digits.len() + request_id.len(),
    );
    for part in [
        "{\"error\":\"",
        error,
        "\",\"limit\":\"",
        limit,
        "\",\"",
        field,
        "\":",
        digits,
        ",\"request_id\":\"",
        request_id,
        "\"}",
    ] {
        body.push_str(part);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(headers: &[Header]) -> Vec<(&'static SpelledName, &str)> {
        headers
            .iter()
            .map(|(name, value)| (*name, value.to_str().expect("ASCII")))
            .collect()
    }

    fn layer(
        name: &str,
        capacity: u64,
        remaining: u64,
        reset_after_us: u64,
    ) -> EnforcedOutcome<'_> {
        EnforcedOutcome {
            position: Position(0),
            name,
            quota: capacity,
            window_us: capacity * 20_000,
            decision: Decision::admitted(capacity, remaining, reset_after_us),
            banned: false,
        }
    }

    #[test]
    fn every_name_is_its_spelling_in_lower_case() {
        crate::proxy::header_name::assert_lower_case_of_spelling(&[
            &RATELIMIT_LIMIT,
            &RATELIMIT_REMAINING,
            &RATELIMIT_RESET,
            &RATELIMIT_POLICY,
            &RATELIMIT,
            &RETRY_AFTER,
            &RETRY_AFTER_MS,
            &CONTENT_TYPE,
            &CACHE_CONTROL,
        ]);
    }

    #[test]
    fn both_styles_have_exact_syntax() {
        let layers = [
            layer("per-ip", 200, 42, 6_500_000),
            layer("per-account", 100, 90, 1_000_000),
        ];
        let shown = most_constrained(&layers).expect("a layer");
        let h = rate_limit_headers(HeaderStyle::Both, &layers, shown);
        let expected = vec![
            (&RATELIMIT_LIMIT, "200"),
            (&RATELIMIT_REMAINING, "42"),
            (&RATELIMIT_RESET, "7"),
            (
                &RATELIMIT_POLICY,
                "\"per-ip\";q=200;w=4, \"per-account\";q=100;w=2",
            ),
            (&RATELIMIT, "\"per-ip\";r=42;t=7"),
        ];
        assert_eq!(texts(&h), expected);
        assert_eq!(
            rate_limit_headers(HeaderStyle::Legacy, &layers, shown).len(),
            3
        );
        assert_eq!(
            rate_limit_headers(HeaderStyle::Draft, &layers, shown).len(),
            2
        );
        assert!(rate_limit_headers(HeaderStyle::None, &layers, shown).is_empty());
    }

    #[test]
    fn rejection_rounds_retry_after_up() {
        let mut refused = layer("login", 5, 0, 3_000_000);
        refused.decision = Decision::refused(5, 0, 3_000_000, 1_000_001);
        let r = rejection(HeaderStyle::None, &[refused], &refused, "r-1");
        assert_eq!(r.status, 429);
        assert_eq!(
            r.body,
            "{\"error\":\"rate_limited\",\"limit\":\"login\",\"retry_after_ms\":1001,\"request_id\":\"r-1\"}"
        );
        assert!(texts(&r.headers).contains(&(&RETRY_AFTER, "2")));
        assert!(texts(&r.headers).contains(&(&RETRY_AFTER_MS, "1001")));
        refused.decision = Decision::refused(5, 0, 3_000_000, 10);
        let r = rejection(HeaderStyle::None, &[refused], &refused, "r-2");
        assert!(texts(&r.headers).contains(&(&RETRY_AFTER, "1")));
        assert!(texts(&r.headers).contains(&(&RETRY_AFTER_MS, "1")));
        assert!(r
            .body
            .ends_with("\"retry_after_ms\":1,\"request_id\":\"r-2\"}"));
    }

    #[test]
    fn a_ban_says_so_and_when_it_ends_without_rate_headers() {
        let mut banned = layer("login", 1, 0, 3_600_000_000);
        banned.decision = Decision::refused(1, 0, 3_600_000_000, 3_599_000_001);
        banned.banned = true;
        let r = rejection(HeaderStyle::Both, &[banned], &banned, "r-3");
        assert_eq!(r.status, 429);
        assert_eq!(
            r.body,
            "{\"error\":\"banned\",\"limit\":\"login\",\"retry_after_ms\":3599001,\"request_id\":\"r-3\"}"
        );
        assert!(texts(&r.headers).contains(&(&RETRY_AFTER, "3600")));
        assert!(texts(&r.headers).contains(&(&RETRY_AFTER_MS, "3599001")));
        assert!(!r
            .headers
            .iter()
            .any(|(name, _)| name.spelling().starts_with("RateLimit")));
    }
}
