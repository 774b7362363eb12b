//! Decisions turned into what the client sees: rate-limit headers and the
//! 429. Pure functions; the proxy only copies the result onto the wire.

use serde::Deserialize;

use crate::algorithm::Decision;
use crate::header_name::SpelledName;

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
pub static CONTENT_TYPE: SpelledName = SpelledName::from_static("content-type", "Content-Type");
pub static CACHE_CONTROL: SpelledName = SpelledName::from_static("cache-control", "Cache-Control");

/// A header floodgate writes: its name, built once, and its value.
pub type Header = (&'static SpelledName, String);

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
pub struct Layer<'a> {
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
pub fn most_constrained<'a, 'b>(layers: &'b [Layer<'a>]) -> Option<&'b Layer<'a>> {
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
pub fn refusing<'a, 'b>(layers: &'b [Layer<'a>]) -> Option<&'b Layer<'a>> {
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
    layers: &[Layer<'_>],
    shown: &Layer<'_>,
) -> Vec<Header> {
    // Built by hand rather than with format!: this runs on every admitted
    // request, and the formatting machinery cost more than the limiter.
    let mut out = Vec::with_capacity(5);
    let d = &shown.decision;
    let mut n = itoa::Buffer::new();
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        out.push((&RATELIMIT_LIMIT, n.format(d.limit()).to_string()));
        out.push((&RATELIMIT_REMAINING, n.format(d.remaining()).to_string()));
        out.push((
            &RATELIMIT_RESET,
            n.format(ceil_secs(d.reset_after_us())).to_string(),
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
        out.push((&RATELIMIT_POLICY, policy));
        let mut current = String::with_capacity(32);
        current.push('"');
        current.push_str(shown.name);
        current.push_str("\";r=");
        current.push_str(n.format(d.remaining()));
        current.push_str(";t=");
        current.push_str(n.format(ceil_secs(d.reset_after_us())));
        out.push((&RATELIMIT, current));
    }
    out
}

/// The headers of every JSON answer floodgate writes itself (429, 502, 503,
/// 504): never cached.
pub fn json_headers() -> Vec<Header> {
    vec![
        (&CONTENT_TYPE, "application/json".to_string()),
        (&CACHE_CONTROL, "no-store".to_string()),
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
    layers: &[Layer<'_>],
    refused: &Layer<'_>,
    request_id: &str,
) -> Rejection {
    let mut headers = json_headers();
    let d = &refused.decision;
    if refused.banned {
        // A ban has no rate to advertise: only when it ends.
        headers.push((
            &RETRY_AFTER,
            ceil_secs(d.retry_after_us()).max(1).to_string(),
        ));
        let body = format!(
            "{{\"error\":\"banned\",\"limit\":\"{}\",\"retry_after_ms\":{},\"request_id\":\"{request_id}\"}}",
            refused.name,
            ceil_ms(d.retry_after_us())
        );
        return Rejection {
            status: 429,
            headers,
            body,
        };
    }
    let body = if d.cost_exceeds_limit() {
        // Retrying cannot help, so no Retry-After: the body says why.
        format!(
            "{{\"error\":\"cost_exceeds_limit\",\"limit\":\"{}\",\"cost_limit\":{},\"request_id\":\"{request_id}\"}}",
            refused.name, d.limit()
        )
    } else {
        headers.push((
            &RETRY_AFTER,
            ceil_secs(d.retry_after_us()).max(1).to_string(),
        ));
        format!(
            "{{\"error\":\"rate_limited\",\"limit\":\"{}\",\"retry_after_ms\":{},\"request_id\":\"{request_id}\"}}",
            refused.name,
            ceil_ms(d.retry_after_us())
        )
    };
    headers.extend(rate_limit_headers(style, layers, refused));
    Rejection {
        status: 429,
        headers,
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, capacity: u64, remaining: u64, reset_after_us: u64) -> Layer<'_> {
        Layer {
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
        crate::header_name::assert_lower_case_of_spelling(&[
            &RATELIMIT_LIMIT,
            &RATELIMIT_REMAINING,
            &RATELIMIT_RESET,
            &RATELIMIT_POLICY,
            &RATELIMIT,
            &RETRY_AFTER,
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
            (&RATELIMIT_LIMIT, "200".to_string()),
            (&RATELIMIT_REMAINING, "42".to_string()),
            (&RATELIMIT_RESET, "7".to_string()),
            (
                &RATELIMIT_POLICY,
                "\"per-ip\";q=200;w=4, \"per-account\";q=100;w=2".to_string(),
            ),
            (&RATELIMIT, "\"per-ip\";r=42;t=7".to_string()),
        ];
        assert_eq!(h, expected);
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
        assert!(r.headers.contains(&(&RETRY_AFTER, "2".to_string())));
        refused.decision = Decision::refused(5, 0, 3_000_000, 10);
        let r = rejection(HeaderStyle::None, &[refused], &refused, "r-2");
        assert!(r.headers.contains(&(&RETRY_AFTER, "1".to_string())));
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
        assert!(r.headers.contains(&(&RETRY_AFTER, "3600".to_string())));
        assert!(!r
            .headers
            .iter()
            .any(|(name, _)| name.spelling().starts_with("RateLimit")));
    }
}
