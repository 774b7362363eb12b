// The configuration reference against the parser.
mod reference;

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Method;

use super::*;
use floodgate_algorithm::Algorithm;
use floodgate_limiter::redis::{InstanceCount, SentinelSettings, Topology};
use floodgate_limiter::{ClockSource, Enforcement, OnFailure};
use floodgate_policy::identity::IdentityKeySource;
use floodgate_policy::Rule;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("t.toml"), text, &Inputs::default())
}

const MINIMAL: &str =
    "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"127.0.0.1:8000\"]\n";

#[test]
fn shipped_configs_validate() {
    for file in ["proxy.toml", "examples/full.toml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let config = Config::load(&path, &Inputs::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.policy.limits.len(), 7, "{file}");
    }
}

#[test]
fn full_example_resolves_every_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/full.toml");
    let c = Config::load(&path, &Inputs::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.listen, vec!["0.0.0.0:8080".parse().unwrap()]);
    assert_eq!(
        c.server.admin_listen,
        Some("127.0.0.1:9091".parse().unwrap())
    );
    assert_eq!(c.server.grace_period, Duration::from_secs(5));
    assert_eq!(c.upstream.read_timeout, Duration::from_secs(30));
    assert_eq!(c.max_keys, 1_000_000);
    let redis = c.redis.expect("redis table");
    assert_eq!(redis.timeout, Duration::from_millis(50));
    assert_eq!(redis.instances, InstanceCount::Fixed(3));
    assert_eq!(redis.on_failure, OnFailure::Local);
    assert_eq!(redis.clock, ClockSource::Redis);
    let per_account = &c.policy.limits[1];
    let tier = |name: &str| c.policy.clients.tiers.get(name).expect("a known tier");
    assert_eq!(
        per_account.rule_for(&tier("pro")),
        Rule::Rate(Algorithm::token_bucket(500, 20_000).expect("valid numbers"))
    );
    assert_eq!(
        per_account.rule_for(&tier("free")),
        Rule::Rate(Algorithm::token_bucket(100, 100_000).expect("valid numbers"))
    );
    let login = &c.policy.limits[2];
    assert_eq!(login.on_failure, OnFailure::Deny);
    assert_eq!(
        per_account.on_failure,
        OnFailure::Local,
        "[redis].on_failure, resolved when the config is loaded"
    );
    assert_eq!(
        login.matcher.http().expect("on HTTP").methods,
        vec![Method::POST]
    );
    assert_eq!(c.policy.limits[6].enforcement, Enforcement::Shadow);
    assert_eq!(c.policy.costs[0].cost, 10);
    assert_eq!(c.headers, HeaderStyle::Both);
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "a table of cases, one or two lines each"
)]
fn errors_name_line_and_key() {
    let cases: &[(&str, &str)] = &[
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\nthreds = 2\n[upstream]\nservers = [\"a:1\"]\n",
            "t.toml:3: server.threds: unknown field `threds`, expected one of `listen`, `admin_listen`, `threads`, `grace_period`, `escaped_slashes`, `case_insensitive_paths`, `header_timeout`, `keepalive_timeout`, `max_connections`, `max_connections_per_ip`, `h2c`, `slot_body_timeout`, `max_body`, `tls`",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = []\n",
            "t.toml:4: upstream.servers: needs at least one server",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill_rate = 0\n"),
            "t.toml:10: limits[0].refill_rate: must be more than 0 and at most 10,000,000 per second (got 0)",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 5\n"),
            "t.toml:5: limits[0].refill_rate: token_bucket needs `refill_rate`",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapcity = 5\n"),
            "t.toml:9: limits[0].capcity: unknown field `capcity`, expected one of `name`, `key`, `algorithm`, `capacity`, `refill_rate`, `limit`, `window`, `rate`, `period`, `timezone`, `week_starts`, `max`, `lease`, `upgrades`, `count`, `cost_from_response`, `ban`, `ban_on_client_keys`, `case_insensitive_values`, `on_missing`, `on_failure`, `leases`, `shadow`, `match`, `tiers`",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = -5\nrefill_rate = 1\n"),
            "t.toml:9: limits[0].capacity: must be a whole number of at least 1 (got -5)",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\ncount = {{ statuses = [401, \"6xx\"] }}\n"),
            "t.toml:11: limits[0].count.statuses[1]: must be a final status from 200 to 599, or a class like \"4xx\"",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"leaky_bucket\"\nrate = 1\ncapacity = 5\ncount = {{ statuses = [\"1xx\"] }}\n"),
            "t.toml:11: limits[0].count: `count` does not apply to leaky_bucket, which schedules requests as they arrive",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"concurrency\"\nmax = 2\ncount = {{ statuses = [401] }}\n"),
            "t.toml:10: limits[0].count: `count` does not apply to concurrency: a request in flight is counted while it lasts",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"concurrency\"\n"),
            "t.toml:5: limits[0].max: concurrency needs `max`",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"concurrency\"\nmax = 2\nlimit = 5\n"),
            "t.toml:10: limits[0].limit: `limit` does not apply to concurrency",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"concurrency\"\nmax = 2\nlease = \"10ms\"\n"),
            "t.toml:10: limits[0].lease: must be from 100ms to 12 days",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill_rate = 1\nmax = 3\n"),
            "t.toml:11: limits[0].max: `max` does not apply to token_bucket",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"token_buckt\"\ncapacity = 5\nrefill_rate = 1\n"),
            "t.toml:8: limits[0].algorithm: unknown variant `token_buckt`, expected one of `token_bucket`, `sliding_window`, `fixed_window`, `sliding_log`, `leaky_bucket`, `quota`, `concurrency`",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"year\"\n"),
            "t.toml:10: limits[0].period: \"year\" is not a calendar period (expected one of: day, week, month)",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"month\"\ntimezone = \"Europe/Pariss\"\n"),
            "t.toml:11: limits[0].timezone: \"Europe/Pariss\" is not an IANA time zone name like \"Europe/Paris\" or \"UTC\"",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"week\"\nweek_starts = \"mon\"\n"),
            "t.toml:11: limits[0].week_starts: \"mon\" is not a day of the week like \"monday\"",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nwindow = \"1m\"\n"),
            "t.toml:10: limits[0].window: `window` does not apply to quota",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\ntimezone = \"UTC\"\n"),
            "t.toml:11: limits[0].timezone: `timezone` does not apply to fixed_window",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"sliding_log\"\nlimit = 5\nwindow = \"1m\"\ncost_from_response = {{ header = \"X-Cost\", max = 10 }}\n"),
            "t.toml:11: limits[0].cost_from_response: `cost_from_response` does not apply to sliding_log; use token_bucket, fixed_window or quota",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncost_from_response = {{ header = \"X-Cost\", max = 0 }}\n"),
            "t.toml:11: limits[0].cost_from_response.max: must be at least 1",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncost_from_response = {{ usage = \"openai\", header = \"X-Cost\", max = 9 }}\n"),
            "t.toml:11: limits[0].cost_from_response.usage: give the cost's source: `header` (a response header's number) or `usage` (\"openai\" or \"anthropic\": the tokens the answer's body reports), one of them",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncost_from_response = {{ max = 9 }}\n"),
            "t.toml:11: limits[0].cost_from_response.usage: give the cost's source: `header` (a response header's number) or `usage` (\"openai\" or \"anthropic\": the tokens the answer's body reports), one of them",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncost_from_response = {{ usage = \"gemini\", max = 9 }}\n"),
            "t.toml:11: limits[0].cost_from_response.usage: \"gemini\" is no provider whose usage floodgate reads: \"openai\" (and every OpenAI-compatible server) or \"anthropic\"",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncost_from_response = {{ header = \"X-Cost\", prompt_weight = 2, max = 9 }}\n"),
            "t.toml:11: limits[0].cost_from_response.prompt_weight: weights price a `usage`; a header's number is the cost itself",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncost_from_response = {{ usage = \"openai\", completion_weight = -1, max = 9 }}\n"),
            "t.toml:11: limits[0].cost_from_response.completion_weight: must be a whole number from 0 to 1000000",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncost_from_response = {{ usage = \"anthropic\", prompt_weight = 0, completion_weight = 0, max = 9 }}\n"),
            "t.toml:11: limits[0].cost_from_response.completion_weight: with both weights 0 every answer costs nothing",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncost_from_response = {{ usage = \"openai\", expose = true, max = 9 }}\n"),
            "t.toml:11: limits[0].cost_from_response.expose: a usage is read from the body: there is no header to expose",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"day\"\ncount = {{ statuses = [401] }}\ncost_from_response = {{ header = \"X-Cost\", max = 9 }}\n"),
            "t.toml:12: limits[0].cost_from_response: a limit is charged by `count` or by `cost_from_response`, not both",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nban = {{ after = 0, within = \"1m\", duration = \"1h\" }}\n"),
            "t.toml:11: limits[0].ban.after: must be a whole number from 1 to 100000",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nban = {{ after = 3, within = \"1m\", duration = \"500ms\" }}\n"),
            "t.toml:11: limits[0].ban.duration: must be from 1s to 365d",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nshadow = true\nban = {{ after = 3, within = \"1m\", duration = \"1h\" }}\n"),
            "t.toml:12: limits[0].ban: a shadow limit refuses nobody, so it can ban nobody",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"global\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nban = {{ after = 3, within = \"1m\", duration = \"1h\" }}\n"),
            "t.toml:11: limits[0].ban: a limit keyed global has one key for everyone: its ban would shut everyone out",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 5\nperiod = \"month\"\nweek_starts = \"sunday\"\n"),
            "t.toml:11: limits[0].week_starts: applies to period = \"week\" only",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"concurrency\"\nmax = 2\ntimezone = \"UTC\"\n"),
            "t.toml:10: limits[0].timezone: `timezone` does not apply to concurrency",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\ncost_from_response = {{ header = \"X-Cost\", max = 10, default = 11 }}\n"),
            "t.toml:11: limits[0].cost_from_response.default: must be at most `max` (10)",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\ncost_from_response = {{ header = \"Content-Length\", max = 10 }}\n"),
            "t.toml:11: limits[0].cost_from_response.header: \"Content-Length\" frames the response; name a header of its own",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"sliding_window\"\nlimit = 5\nwindow = \"1m\"\ncost_from_response = {{ header = \"X-Cost\", max = 10 }}\n"),
            "t.toml:11: limits[0].cost_from_response: `cost_from_response` does not apply to sliding_window; use token_bucket, fixed_window or quota",
        ),
        (
            &format!("{MINIMAL}[clients.api_keys]\n\"k\" = \"free\"\n[[limits]]\nname = \"a\"\nkey = \"api_key\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill_rate = 1000\ncost_from_response = {{ header = \"X-Cost\", max = 3000000000 }}\n[limits.tiers.free]\nrefill_rate = 0.001\n"),
            "t.toml:13: limits[0].cost_from_response.max: must be a whole number from 0 to 2251799",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = [\"route\", \"host\"]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nban = {{ after = 3, within = \"1m\", duration = \"1h\" }}\n"),
            "t.toml:11: limits[0].ban: a limit keyed [route, host] has one key for everyone: its ban would shut everyone out",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"cookie:s\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nshadow = true\non_missing = \"deny\"\n"),
            "t.toml:12: limits[0].on_missing: a shadow limit refuses nobody: \"deny\" would refuse for it",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nmatch = {{ hosts = [\"api.example.com:8443\"] }}\n"),
            "t.toml:11: limits[0].match.hosts[0]: \"api.example.com:8443\" is not a host name without port (or \"*.\" and a domain)",
        ),
        (
            &format!("{MINIMAL}[clients.jwt]\njwks_file = \"/nowhere\"\nalgorithms = [\"RS256\"]\nleeway = \"2h\"\n"),
            "t.toml:8: clients.jwt.leeway: must be whole seconds, at most 1h",
        ),
        (
            &format!("{MINIMAL}[clients.jwt]\njwks_file = \"/nowhere\"\nalgorithms = [\"RS256\", \"none\"]\n"),
            "t.toml:7: clients.jwt.algorithms[1]: \"none\": an unsigned token proves nothing",
        ),
        (
            &format!("{MINIMAL}[clients.jwt]\njwks_file = \"/nowhere\"\nalgorithms = [\"HS256\"]\n"),
            "t.toml:7: clients.jwt.algorithms[0]: \"HS256\": HMAC takes a shared secret, and these keys are public: anyone could sign",
        ),
        (
            &format!("{MINIMAL}[clients.jwt]\nalgorithms = [\"RS256\"]\n"),
            "t.toml:5: clients.jwt.jwks_file: name the keys: `jwks_file` or `public_key_file`, one of them",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"jwt:sub\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n"),
            "t.toml:7: limits[0].key: a claim is read from a verified token: configure [clients.jwt]",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = [\"ip\", \"global\"]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n"),
            "t.toml:7: limits[0].key[1]: \"global\" adds nothing to a composite key",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n[[costs]]\nmatch = {{ paths = [\"/x\"] }}\ncost = 2\nlimits = [\"b\"]\n"),
            "t.toml:14: costs[0].limits[0]: no limit is named \"b\" (limits: a)",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"a:1\"]\nstrip_headers = [\"X-Debug\", \"Content-Length\"]\n",
            "t.toml:5: upstream.strip_headers[1]: \"Content-Length\" frames the request; the upstream cannot do without it",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"a:1\"]\nkeep_headers = [\"X-Debug\"]\n",
            "t.toml:5: upstream.keep_headers[0]: \"X-Debug\" is not a header floodgate removes, so there is nothing to keep (see the list in docs/book/edge.md)",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\ncost_from_response = {{ header = \"X-Cost\", max = 500, reserve = 200 }}\n"),
            "t.toml:11: limits[0].cost_from_response.reserve: a request reserves 200 before it goes upstream, more than the limit holds (100): none could pass; set a smaller `reserve`",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\ncost_from_response = {{ usage = \"openai\", max = 500, reserve = \"request\" }}\n"),
            "t.toml:11: limits[0].cost_from_response.max: a request reserves 500 before it goes upstream when it does not say its max_tokens, more than the limit holds (100): none could pass; set a smaller `max`",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\ncost_from_response = {{ usage = \"openai\", max = 50, reserve = \"requests\" }}\n"),
            "t.toml:11: limits[0].cost_from_response.reserve: \"requests\" is no reservation: a whole number, or \"request\" (the request's own max_tokens and prompt)",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\ncost_from_response = {{ header = \"X-Cost\", max = 50, reserve = \"request\" }}\n"),
            "t.toml:11: limits[0].cost_from_response.reserve: a request's own worst case is read for a `usage` (its max_tokens); with a `header`, reserve a number",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = [\"ip\", \"body:\"]\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\n"),
            "t.toml:7: limits[0].key[1]: \"body:\" needs a top-level field of the JSON body after \"body:\", like \"body:model\"",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\nmatch = {{ body = {{ model = [] }} }}\n"),
            "t.toml:11: limits[0].match.body.model: give at least one pattern",
        ),
        (
            &format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\ncost_from_response = {{ usage = \"anthropic\", max = 50, include_usage = true }}\n"),
            "t.toml:11: limits[0].cost_from_response.include_usage: only an OpenAI stream leaves its usage out unless asked: set it with `usage = \"openai\"`",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"a:1\"]\n[upstream.protection]\nmin = 5\nmax = 2\n",
            "t.toml:6: upstream.protection.min: must be at most `max` (2)",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"a:1\"]\n[upstream.protection]\npriority = [\"pro\"]\n",
            "t.toml:6: upstream.protection.priority[0]: \"pro\" is no tier (known: anonymous, internal)",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"a:1\"]\n[upstream.protection]\nqueue = { max = 10, timeout = \"1m\" }\n",
            "t.toml:6: upstream.protection.queue.timeout: must be longer than 0 and at most 10s: a wait counts against the client's own deadline",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"a:1\"]\n[upstream.protection]\npriority = [{ name = \"internal\", match = { paths = [\"/a\"] } }]\n",
            "t.toml:6: upstream.protection.priority[0].name: name the class, with a name that is no tier's",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"a:1\"]\n[upstream.protection]\nreserve = 1.0\n",
            "t.toml:6: upstream.protection.reserve: must be from 0.0 (every class shares the whole limit) to below 1.0",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"a:1\"]\n[upstream.protection]\nlatency_tolerance = 0.5\n",
            "t.toml:6: upstream.protection.latency_tolerance: must be from 1.0 (no latency above the minimum) to 10.0",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:8080\"\nmax_body = 0\n[upstream]\nservers = [\"a:1\"]\n",
            "t.toml:3: server.max_body: must be a whole number of bytes from 1 to 67108864",
        ),
    ];
    for (text, expected) in cases {
        let err = parse(text).expect_err("must fail");
        assert_eq!(err.to_string(), *expected);
    }
}

/// One limit of `algorithm` with `numbers` (TOML lines), in a file whose
/// limit table starts on line 5.
fn one_limit(algorithm: &str, numbers: &str) -> Result<Config, ConfigError> {
    parse(&format!(
        "{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"{algorithm}\"\n{numbers}\n"
    ))
}

/// The limits people sell per day, week and month are taken as written
/// (`floodgate check` refused them all when a window's arithmetic formed
/// limit × window in microseconds).
#[test]
fn a_window_takes_the_limits_people_sell() {
    let windows = [
        ("fixed_window", 100_000u64, "1d"),
        ("sliding_window", 100_000, "1d"),
        ("sliding_log", 100_000, "1d"),
        ("fixed_window", 50_000, "7d"),
        ("sliding_window", 50_000, "7d"),
        ("sliding_log", 50_000, "7d"),
        ("fixed_window", 10_000, "7d"),
        ("sliding_window", 1_000, "30d"),
        ("fixed_window", 700_000, "1h"),
        ("fixed_window", 4_000_000_000, "30d"),
        ("sliding_window", 4_000_000_000, "30d"),
        ("sliding_window", 4_294_967_295, "366d"),
        ("sliding_log", 100_000, "366d"),
    ];
    for (algorithm, limit, window) in windows {
        let numbers = format!("limit = {limit}\nwindow = \"{window}\"");
        let config = one_limit(algorithm, &numbers)
            .unwrap_or_else(|e| panic!("{algorithm} {limit} per {window}: {e}"));
        let Rule::Rate(rate) = config.policy.limits[0].rule else {
            panic!("a rate limit");
        };
        assert_eq!(rate.quota(), limit);
    }
    let buckets = [
        ("4294967295", "10000000"),
        ("4294967295", "2"),
        ("71", "0.0000000317"),
        ("100", "0.5"),
    ];
    for (capacity, rate) in buckets {
        one_limit(
            "token_bucket",
            &format!("capacity = {capacity}\nrefill_rate = {rate}"),
        )
        .unwrap_or_else(|e| panic!("{capacity} at {rate}/s: {e}"));
    }
}

/// Each range ends where its message says, one past it refused with the
/// file's line and key, in the file's terms (per window, per second, days;
/// never the microseconds the arithmetic counts in).
#[test]
fn every_range_ends_exactly_where_its_message_says() {
    let cases = [
        (
            "fixed_window",
            "limit = 2251799813685248\nwindow = \"366d\"",
            "limit = 2251799813685249\nwindow = \"366d\"",
            "t.toml:9: limits[0].limit: at most 2,251,799,813,685,248 per window (got 2,251,799,813,685,249)",
        ),
        (
            "sliding_window",
            "limit = 4294967295\nwindow = \"1s\"",
            "limit = 4294967296\nwindow = \"1s\"",
            "t.toml:9: limits[0].limit: at most 4,294,967,295 per window (got 4,294,967,296)",
        ),
        (
            "sliding_log",
            "limit = 100000\nwindow = \"366d\"",
            "limit = 100001\nwindow = \"366d\"",
            "t.toml:9: limits[0].limit: sliding_log keeps one stamp per request: at most 100,000 per window (got 100,001); use sliding_window for more",
        ),
        (
            "fixed_window",
            "limit = 1\nwindow = \"26062d\"",
            "limit = 1\nwindow = \"26063d\"",
            "t.toml:10: limits[0].window: must be at most 26062d (71 years)",
        ),
        (
            "sliding_window",
            "limit = 1\nwindow = \"625488h\"",
            "limit = 1\nwindow = \"625489h\"",
            "t.toml:10: limits[0].window: must be at most 26062d (71 years)",
        ),
        (
            "token_bucket",
            "capacity = 1\nrefill_rate = 10000000",
            "capacity = 1\nrefill_rate = 10000001",
            "t.toml:10: limits[0].refill_rate: must be more than 0 and at most 10,000,000 per second (got 10000001)",
        ),
        (
            "token_bucket",
            "capacity = 2251799813\nrefill_rate = 1",
            "capacity = 2251799814\nrefill_rate = 1",
            "t.toml:9: limits[0].capacity: at most 2,251,799,813 at this refill_rate (got 2,251,799,814): an empty bucket must refill within 71 years",
        ),
        (
            "leaky_bucket",
            "capacity = 1\nrate = 1000000",
            "capacity = 1\nrate = 1000001",
            "t.toml:10: limits[0].rate: must be more than 0 and at most 1,000,000 per second (got 1000001)",
        ),
        (
            "leaky_bucket",
            "capacity = 2251799813\nrate = 1",
            "capacity = 2251799814\nrate = 1",
            "t.toml:9: limits[0].capacity: at most 2,251,799,813 at this rate (got 2,251,799,814): a full waiting room must drain within 71 years",
        ),
        (
            "quota",
            "limit = 2251799813685248\nperiod = \"month\"",
            "limit = 2251799813685249\nperiod = \"month\"",
            "t.toml:9: limits[0].limit: at most 2,251,799,813,685,248 per period (got 2,251,799,813,685,249)",
        ),
    ];
    for (algorithm, last, beyond, message) in cases {
        one_limit(algorithm, last).unwrap_or_else(|e| panic!("{algorithm} {last}: {e}"));
        let error = one_limit(algorithm, beyond).expect_err(beyond).to_string();
        assert_eq!(error, message);
        assert!(!error.contains("µs") && !error.contains("micro"), "{error}");
    }
}

/// A bucket counting in fractions of a µs leases as any other: its leased
/// tokens are a count on its ledger, not a stretch of its schedule.
#[test]
fn a_bucket_refilling_in_fractions_of_a_microsecond_takes_leases() {
    let redis = "[redis]\nurl = \"redis://127.0.0.1:6379\"\n";
    let limit = |rate: &str, leases: &str| {
        parse(&format!(
            "{MINIMAL}{redis}[[limits]]\nname = \"a\"\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 100\nrefill_rate = {rate}\n{leases}\n"
        ))
    };
    for rate in ["1000", "3", "2000000", "3000"] {
        let config = limit(rate, "").unwrap_or_else(|e| panic!("{rate}: {e}"));
        assert!(config.policy.limits[0].leases, "{rate}/s");
        let config = limit(rate, "leases = \"auto\"").unwrap_or_else(|e| panic!("{rate}: {e}"));
        assert!(config.policy.limits[0].leases, "{rate}/s, leases on");
    }
}

#[test]
fn parse_depends_on_its_inputs_alone() {
    let text = format!(
        "{MINIMAL}[redis]\ntimeout = \"20ms\"\n[clients]\nidentity_secret_file = \"/run/secrets/floodgate\"\n"
    );
    let parse_with = |inputs: &Inputs| Config::parse(Path::new("t.toml"), &text, inputs);
    let secret_file = || {
        [(
            PathBuf::from("/run/secrets/floodgate"),
            b"0123456789abcdef0123\n".to_vec(),
        )]
    };

    let from_file = parse_with(
        &Inputs::default()
            .with_redis_url("redis://a.internal:6379")
            .with_cores(3)
            .with_files(secret_file()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let redis = from_file.redis.as_ref().expect("redis table");
    assert_eq!(
        redis.topology,
        Topology::Standalone("redis://a.internal:6379".into())
    );
    assert_eq!(from_file.identity_key, IdentityKeySource::Secret);
    assert_eq!(from_file.server.threads, 3);
    assert_eq!(from_file.file, Path::new("t.toml"));

    // The environment's secret beats the file, which is then never read.
    let from_env = parse_with(
        &Inputs::default()
            .with_redis_url("redis://b.internal:6379")
            .with_identity_secret("0123456789abcdef0123")
            .with_files([]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let redis = from_env.redis.as_ref().expect("redis table");
    assert_eq!(
        redis.topology,
        Topology::Standalone("redis://b.internal:6379".into())
    );
    assert_eq!(from_env.server.threads, 1);
    assert_eq!(
        from_env.policy.clients.hasher,
        from_file.policy.clients.hasher
    );

    let other_secret = parse_with(
        &Inputs::default()
            .with_redis_url("redis://b.internal:6379")
            .with_identity_secret("another secret of 16+ bytes"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(
        other_secret.policy.clients.hasher,
        from_file.policy.clients.hasher
    );

    // Without REDIS_URL among the inputs, [redis] has no server, whatever the
    // process's own environment holds.
    let err = parse_with(&Inputs::default().with_files(secret_file())).expect_err("no redis url");
    assert_eq!(
        err.to_string(),
        "t.toml:5: redis: needs `url` (or REDIS_URL), `sentinel` or `cluster`"
    );
    let err = parse_with(
        &Inputs::default()
            .with_redis_url("redis://a.internal:6379")
            .with_files([]),
    )
    .expect_err("no secret file");
    assert_eq!(err.key, "clients.identity_secret_file");
    assert!(
        err.message
            .starts_with("cannot read /run/secrets/floodgate: "),
        "{err}"
    );
}

#[test]
fn certificates_are_read_through_the_inputs() {
    let text = format!(
        "{MINIMAL}[server.tls]\nlisten = \"127.0.0.1:8443\"\ncert_file = \"/in-memory/cert.pem\"\nkey_file = \"/in-memory/key.pem\"\n"
    );
    let files = [
        (PathBuf::from("/in-memory/cert.pem"), b"not a PEM".to_vec()),
        (PathBuf::from("/in-memory/key.pem"), b"not a PEM".to_vec()),
    ];
    let err = Config::parse(
        Path::new("t.toml"),
        &text,
        &Inputs::default().with_files(files),
    )
    .expect_err("no certificate");
    assert_eq!(
        err.to_string(),
        "t.toml:7: server.tls.cert_file: /in-memory/cert.pem holds no certificate"
    );
}

#[test]
fn quotas_response_costs_bans_and_per_layer_costs_resolve() {
    let text = format!(
        "{MINIMAL}[[limits]]\nname = \"monthly\"\nkey = \"api_key\"\nalgorithm = \"quota\"\nlimit = 1000000\nperiod = \"month\"\ntimezone = \"Europe/Paris\"\ncost_from_response = {{ header = \"X-Tokens-Used\", max = 100000, default = 500 }}\n\
         [[limits]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\nban = {{ after = 3, within = \"10m\", duration = \"1h\" }}\n\
         [[limits]]\nname = \"weekly\"\nkey = \"ip\"\nalgorithm = \"quota\"\nlimit = 50\nperiod = \"week\"\nweek_starts = \"sunday\"\n\
         [[costs]]\nmatch = {{ paths = [\"/search\"] }}\ncost = 10\nlimits = [\"weekly\"]\n"
    );
    let c = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let limits = &c.policy.limits;
    let Rule::Rate(monthly) = limits[0].rule else {
        panic!("a rate")
    };
    let calendar = monthly.calendar().expect("a calendar");
    assert_eq!(calendar.period, floodgate_algorithm::Period::Month);
    assert_eq!(calendar.timezone, chrono_tz::Europe::Paris);
    assert_eq!(monthly.quota(), 1_000_000);
    let Some(floodgate_policy::ChargedByResponse::Cost(priced)) = &limits[0].charged_by_response
    else {
        panic!("a response cost")
    };
    assert_eq!(
        (
            priced.source.to_string(),
            priced.max,
            priced.default,
            priced.expose
        ),
        ("x-tokens-used".to_string(), 100_000, 500, false)
    );
    let ban = limits[1].ban.as_ref().expect("a ban");
    assert_eq!(ban.strikes.quota(), 3);
    assert_eq!(ban.strikes.window_us(), 600_000_000);
    assert_eq!(ban.penalty.window_us(), 3_600_000_000);
    assert_eq!(ban.penalty_name.as_str(), "ban:per-ip");
    let Rule::Rate(weekly) = limits[2].rule else {
        panic!("a rate")
    };
    assert_eq!(
        weekly.calendar().map(|c| c.week_starts),
        Some(chrono::Weekday::Sun)
    );
    // /search costs 10 from the weekly quota and 1 from the others.
    let post = Method::POST;
    let client = c
        .policy
        .clients
        .identify("192.0.2.1".parse().unwrap(), &http::HeaderMap::new())
        .unwrap();
    let headers = http::HeaderMap::new();
    let view = |path| floodgate_policy::RequestView {
        method: &post,
        path,
        headers: &headers,
        query: None,
        host: None,
        client: &client,
        body: None,
    };
    assert_eq!(
        c.policy
            .cost_of(floodgate_limiter::LimitId(2), &view("/search")),
        10
    );
    assert_eq!(
        c.policy
            .cost_of(floodgate_limiter::LimitId(1), &view("/search")),
        1
    );
    assert_eq!(
        c.policy
            .cost_of(floodgate_limiter::LimitId(2), &view("/other")),
        1
    );
}

#[test]
fn the_admin_token_is_read_checked_and_never_printed() {
    let with_admin = |server_extra: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\n{server_extra}\n[upstream]\nservers = [\"127.0.0.1:8000\"]\n\n[admin]\ntoken_file = \"/run/secrets/admin\"\n"
        )
    };
    let parse_token = |server_extra: &str, token: &[u8]| {
        Config::parse(
            Path::new("t.toml"),
            &with_admin(server_extra),
            &Inputs::default().with_files([(PathBuf::from("/run/secrets/admin"), token.to_vec())]),
        )
    };
    let admin = "admin_listen = \"127.0.0.1:9091\"";
    let config = parse_token(admin, b"0123456789abcdef-._~+/=\n").unwrap_or_else(|e| panic!("{e}"));
    let token = config.admin_token.as_ref().expect("token");
    assert!(token.matches(b"0123456789abcdef-._~+/="));
    assert!(!format!("{config:?}").contains("0123456789abcdef"));
    for (server_extra, token, expected) in [
        (
            admin,
            &b"short"[..],
            "t.toml:8: admin.token_file: the token must hold at least 16 characters (e.g. the output of `openssl rand -hex 32`)",
        ),
        (
            admin,
            b"0123456789abcdef;0123",
            "t.toml:8: admin.token_file: the token may hold letters, digits and - . _ ~ + / = only",
        ),
        (
            "",
            b"0123456789abcdef0123",
            "t.toml:8: admin.token_file: the admin API is served on server.admin_listen, which is not set",
        ),
    ] {
        let err = parse_token(server_extra, token).expect_err("must fail");
        assert_eq!(err.to_string(), expected);
    }
    let err = Config::parse(
        Path::new("t.toml"),
        &with_admin(admin),
        &Inputs::default().with_files([]),
    )
    .expect_err("no file");
    assert!(
        err.to_string()
            .starts_with("t.toml:8: admin.token_file: cannot read /run/secrets/admin: "),
        "{err}"
    );
}

#[test]
fn redis_sentinel_and_a_live_instance_count() {
    let with = |redis: &str| format!("{MINIMAL}[redis]\n{redis}\n");
    let inputs = Inputs::default().with_files([
        (
            PathBuf::from("/run/secrets/redis"),
            b"s3cret pass\n".to_vec(),
        ),
        (
            PathBuf::from("/run/secrets/sentinels"),
            b"watchw0rd\r\n".to_vec(),
        ),
        (PathBuf::from("/run/secrets/blank"), b"\n".to_vec()),
    ]);
    let c = Config::parse(
        Path::new("t.toml"),
        &with("sentinel = { master = \"main\", nodes = [\"10.0.0.1:26379\", \"s2:26379\"], password_file = \"/run/secrets/redis\", sentinel_password_file = \"/run/secrets/sentinels\" }\ninstances = \"auto\""),
        &inputs,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let redis = c.redis.as_ref().expect("redis table");
    assert_eq!(
        redis.topology,
        Topology::Sentinel(SentinelSettings {
            master: "main".into(),
            nodes: vec!["10.0.0.1:26379".into(), "s2:26379".into()],
            password: Some("s3cret pass".into()),
            sentinel_password: Some("watchw0rd".into()),
            tls: false,
        })
    );
    assert_eq!(redis.instances, InstanceCount::Auto);
    // Logs and pages name the sentinels, never a password.
    let shown = format!("{:?} {}", redis, redis.redacted_target());
    assert!(
        !shown.contains("s3cret") && !shown.contains("watchw0rd"),
        "{shown}"
    );
    let blank = Config::parse(
        Path::new("t.toml"),
        &with("sentinel = { master = \"m\", nodes = [\"a:1\"], sentinel_password_file = \"/run/secrets/blank\" }"),
        &inputs,
    )
    .expect_err("an empty password file");
    assert_eq!(
        blank.to_string(),
        "t.toml:6: redis.sentinel.sentinel_password_file: /run/secrets/blank is empty"
    );
    assert!(crate::cli::summary::describe(&c).contains("instances counted live (auto)"));

    let cases: &[(&str, &str)] = &[
        (
            "url = \"redis://a:1\"\ninstances = \"many\"",
            "t.toml:7: redis.instances: must be a number of instances or \"auto\", not \"many\"",
        ),
        ("instances = 0\nurl = \"redis://a:1\"", "t.toml:6: redis.instances: must be at least 1"),
        (
            "url = \"redis://a:1\"\nsentinel = { master = \"m\", nodes = [\"a:1\"] }",
            "t.toml:7: redis.sentinel: give one of `url`, `sentinel` and `cluster`",
        ),
        (
            "sentinel = { master = \"m\", nodes = [] }",
            "t.toml:6: redis.sentinel.nodes: needs at least one sentinel's \"host:port\"",
        ),
        (
            "sentinel = { master = \"m\", nodes = [\"a:1\", \"redis://b:26379\"] }",
            "t.toml:6: redis.sentinel.nodes[1]: \"redis://b:26379\" must be a sentinel's \"host:port\"",
        ),
        (
            "sentinel = { master = \"\", nodes = [\"a:1\"] }",
            "t.toml:6: redis.sentinel.master: must name the master the sentinels monitor",
        ),
        (
            "sentinel = { master = \"m\", nodes = [\"a:1\"], password_file = \"/nowhere\" }",
            "t.toml:6: redis.sentinel.password_file: cannot read /nowhere: entity not found",
        ),
        (
            "sentinel = { master = \"m\", nodes = [\"a:1\"], sentinel_password_file = \"/gone\" }",
            "t.toml:6: redis.sentinel.sentinel_password_file: cannot read /gone: entity not found",
        ),
    ];
    for (redis, expected) in cases {
        let err = Config::parse(
            Path::new("t.toml"),
            &with(redis),
            &Inputs::default().with_files([]),
        )
        .expect_err(redis);
        assert_eq!(&err.to_string(), expected, "{redis}");
    }
}

#[test]
fn redis_tls_ca_file_is_for_tls_connections_only() {
    let with = |redis: &str| format!("{MINIMAL}[redis]\n{redis}\n");
    let inputs = || Inputs::default().with_files([(PathBuf::from("/etc/ca.pem"), b"PEM".to_vec())]);
    let c = Config::parse(
        Path::new("t.toml"),
        &with("sentinel = { master = \"m\", nodes = [\"a:1\"], tls = true }\ntls_ca_file = \"/etc/ca.pem\""),
        &inputs(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let redis = c.redis.as_ref().expect("redis table");
    assert!(matches!(&redis.topology, Topology::Sentinel(s) if s.tls));
    assert_eq!(redis.tls_ca.as_deref(), Some(&b"PEM"[..]));
    assert!(redis.redacted_target().ends_with("(TLS)"));
    for plain in [
        "sentinel = { master = \"m\", nodes = [\"a:1\"] }",
        "url = \"redis://a:1\"",
        "cluster = [\"redis://a:1\", \"redis://b:1\"]",
    ] {
        let err = Config::parse(
            Path::new("t.toml"),
            &with(&format!("{plain}\ntls_ca_file = \"/etc/ca.pem\"")),
            &inputs(),
        )
        .expect_err(plain);
        assert_eq!(
            err.to_string(),
            "t.toml:7: redis.tls_ca_file: is for TLS connections, and none is made: use rediss:// URLs, or `tls = true` in `sentinel`",
            "{plain}"
        );
    }
}

#[test]
fn the_rls_tokens_are_read_checked_and_never_printed() {
    let text =
        format!("{MINIMAL}[rls]\nlisten = \"127.0.0.1:8081\"\ntoken_file = \"/run/secrets/rls\"\n");
    let parse_tokens = |file: &[u8]| {
        Config::parse(
            Path::new("t.toml"),
            &text,
            &Inputs::default().with_files([(PathBuf::from("/run/secrets/rls"), file.to_vec())]),
        )
    };
    let config = parse_tokens(b"0123456789abcdef-old\n\n  fedcba9876543210-new  \n")
        .unwrap_or_else(|e| panic!("{e}"));
    let tokens = config.rls_tokens.as_ref().expect("tokens");
    for shown in ["Bearer 0123456789abcdef-old", "Bearer fedcba9876543210-new"] {
        assert!(tokens.admit([shown.as_bytes()].into_iter()), "{shown}");
    }
    assert!(!format!("{config:?}").contains("0123456789abcdef"));
    assert!(
        parse(&format!("{MINIMAL}[rls]\nlisten = \"127.0.0.1:8081\"\n"))
            .unwrap_or_else(|e| panic!("{e}"))
            .rls_tokens
            .is_none()
    );
    for (file, expected) in [
        (
            &b"short"[..],
            "t.toml:7: rls.token_file: line 1: the token must hold at least 16 characters (e.g. the output of `openssl rand -hex 32`)",
        ),
        (
            b"0123456789abcdef\n0123456789abcdef;0123",
            "t.toml:7: rls.token_file: line 2: the token may hold letters, digits and - . _ ~ + / = only",
        ),
        (
            b"\n \n",
            "t.toml:7: rls.token_file: /run/secrets/rls holds no token: one a line (e.g. the output of `openssl rand -hex 32`)",
        ),
        (
            b"a123456789abcdef\nb123456789abcdef\nc123456789abcdef\nd123456789abcdef\ne123456789abcdef\nf123456789abcdef\ng123456789abcdef\nh123456789abcdef\ni123456789abcdef",
            "t.toml:7: rls.token_file: 9 tokens: at most 8, the one in use and those being rolled out",
        ),
    ] {
        let err = parse_tokens(file).expect_err(expected);
        assert_eq!(err.to_string(), expected);
    }
    let unreadable = parse(&text).expect_err("no such file");
    assert!(
        unreadable
            .to_string()
            .starts_with("t.toml:7: rls.token_file: cannot read /run/secrets/rls: "),
        "{unreadable}"
    );
}

/// A limit for the rate limit service, and `[rls]`, after MINIMAL.
fn descriptor_limit(lines: &str) -> String {
    format!(
        "{MINIMAL}[rls]\nlisten = \"127.0.0.1:8081\"\n[[limits]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n{lines}\n"
    )
}

#[test]
fn descriptor_limits_read_like_the_others_and_refuse_what_envoy_cannot_give() {
    let entries =
        r#"match = { domain = "edge", descriptors = [["remote_address"], ["path", "/login"]] }"#;
    let valid = parse(&descriptor_limit(&format!(
        "key = \"descriptor:remote_address\"\n{entries}"
    )))
    .unwrap_or_else(|e| panic!("{e}"));
    let limit = &valid.policy.limits[0];
    let pattern = limit.matcher.descriptors().expect("a descriptor limit");
    assert!(pattern.matches(
        "edge",
        &[("remote_address", "10.0.0.1"), ("path", "/login")]
    ));
    assert_eq!(
        limit.matcher.describe(),
        "domain edge descriptor [remote_address, path=/login]"
    );
    assert_eq!(
        valid.rls.as_ref().map(|r| (r.listen, r.max_message_bytes)),
        Some(("127.0.0.1:8081".parse().expect("address"), 65_536))
    );
    let cases: Vec<(String, &str)> = vec![
        (
            descriptor_limit(&format!("key = \"ip\"\n{entries}")),
            "t.toml:12: limits[0].key: ip reads an HTTP request, which a limit on descriptors never sees: key it on \"descriptor:<key>\", \"descriptor\" or \"global\"",
        ),
        (
            descriptor_limit(&format!("key = \"descriptor:user\"\n{entries}")),
            "t.toml:12: limits[0].key: the descriptor has no entry \"user\" (its entries: remote_address, path)",
        ),
        (
            descriptor_limit(&format!("key = [\"descriptor:remote_address\", \"header:X-A\"]\n{entries}")),
            "t.toml:12: limits[0].key[1]: header:x-a reads an HTTP request, which a limit on descriptors never sees: key it on \"descriptor:<key>\", \"descriptor\" or \"global\"",
        ),
        (
            descriptor_limit("key = \"descriptor\"\nmatch = { descriptors = [[\"remote_address\"]] }"),
            "t.toml:13: limits[0].match.descriptors: descriptors belong to a domain: set `domain` too, as Envoy's ratelimit filter names it",
        ),
        (
            descriptor_limit("key = \"descriptor\"\nmatch = { domain = \"edge\", paths = [\"/x\"], descriptors = [[\"a\"]] }"),
            "t.toml:13: limits[0].match.paths: a limit on a domain's descriptors meets no HTTP request: `paths` does not apply",
        ),
        (
            descriptor_limit("key = \"descriptor\"\nmatch = { domain = \"edge\", descriptors = [[\"a\", \"b\", \"c\"]] }"),
            "t.toml:13: limits[0].match.descriptors[0]: an entry is [key] (any value) or [key, value] (that value; '*' for any run of characters)",
        ),
        (
            descriptor_limit("key = \"descriptor\"\nmatch = { domain = \"edge\", descriptors = [[\"a\"], [\"a\", \"x\"]] }"),
            "t.toml:13: limits[0].match.descriptors[1]: \"a\" is named twice: a `descriptor:a` key could not tell which",
        ),
        (
            descriptor_limit("key = \"descriptor\"\nmatch = { domain = \"edge\", descriptors = [] }"),
            "t.toml:13: limits[0].match.descriptors: name the descriptor's entries in order, 1 to 32 of them, e.g. [[\"remote_address\"], [\"path\", \"/login\"]]",
        ),
        (
            descriptor_limit(&format!("key = \"descriptor\"\n{entries}\ncount = {{ statuses = [401] }}")),
            "t.toml:14: limits[0].count: `count` does not apply to a limit on descriptors: the rate limit service never sees the response",
        ),
        (
            descriptor_limit(&format!("key = \"descriptor\"\n{entries}\nban = {{ after = 3, within = \"1m\", duration = \"1h\" }}")),
            "t.toml:14: limits[0].ban: `ban` does not apply to a limit on descriptors: Envoy's descriptors say nothing floodgate can ban on every route",
        ),
        (
            format!("{MINIMAL}[rls]\nlisten = \"127.0.0.1:8081\"\n[[limits]]\nname = \"a\"\nkey = \"descriptor\"\nalgorithm = \"concurrency\"\nmax = 2\n{entries}\n"),
            "t.toml:10: limits[0].algorithm: concurrency does not apply to a limit on descriptors: Envoy asks once per request and never says when it ends",
        ),
        (
            format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"descriptor\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n{entries}\n"),
            "t.toml:11: limits[0].match.domain: limits on descriptors are served to Envoy by the rate limit service: set [rls].listen",
        ),
        (
            format!("{MINIMAL}[[limits]]\nname = \"a\"\nkey = \"descriptor:path\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n"),
            "t.toml:7: limits[0].key: descriptor:path reads a descriptor of the rate limit service: match the limit by `domain` and `descriptors`",
        ),
        (
            format!("{MINIMAL}[rls]\nlisten = \"localhost\"\n"),
            "t.toml:6: rls.listen: \"localhost\" is not an address and port like \"127.0.0.1:8081\" or \"[::]:8081\"",
        ),
        (
            format!("{MINIMAL}[rls]\nlisten = \"127.0.0.1:8081\"\nmax_message_bytes = 100\n"),
            "t.toml:7: rls.max_message_bytes: must be a number of bytes from 1024 to 4194304 (got 100); Envoy's calls are a few hundred bytes",
        ),
        (
            format!("{MINIMAL}[rls]\nlisten = \"127.0.0.1:8081\"\nmax_connections_per_ip = 0\n"),
            "t.toml:7: rls.max_connections_per_ip: must be a whole number of at least 1 (without it, [server]'s applies)",
        ),
        (
            format!("{MINIMAL}[rls]\nlisten = \"127.0.0.1:8081\"\ntls = true\n"),
            "t.toml:7: rls.tls: the rate limit service serves the certificates of [server.tls], and there is none: configure [server.tls] or set tls = false",
        ),
        (
            descriptor_limit(&format!("key = \"descriptor\"\n{entries}\n[[costs]]\nmatch = {{ domain = \"edge\", descriptors = [[\"a\"]] }}\ncost = 2")),
            "t.toml:15: costs[0].match.domain: [[costs]] price HTTP requests; a descriptor costs the hits_addend Envoy sends",
        ),
    ];
    for (text, expected) in cases {
        let error = parse(&text).expect_err(expected);
        assert_eq!(error.to_string(), expected, "{text}");
    }
}

#[test]
fn run_time_clients_need_the_admin_api_and_a_file_needs_a_secret_and_no_redis() {
    let text = |admin: &str, more: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:9091\"\n[upstream]\nservers = [\"127.0.0.1:8000\"]\n{more}\n[clients]\ntiers = [\"free\", \"pro\"]\n[[limits]]\nname = \"a\"\nkey = \"api_key\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n[limits.tiers.pro]\nlimit = 100\n[admin]\n{admin}\n"
        )
    };
    let table = std::sync::Arc::new(floodgate_policy::identity::RunTimeKeys::default());
    let inputs = Inputs::default()
        .with_files([(PathBuf::from("/t"), b"0123456789abcdef0123".to_vec())])
        .with_run_time_keys(table.clone());
    let parse_with = |text: &str, inputs: &Inputs| Config::parse(Path::new("t.toml"), text, inputs);
    let token = "token_file = \"/t\"";
    let file = "clients_file = \"/var/lib/floodgate/clients.json\"";

    // The admin API on: the table is read; off: none is, not even probed.
    let on = parse_with(&text(token, ""), &inputs).unwrap_or_else(|e| panic!("{e}"));
    let run_time = on.policy.clients.run_time.as_ref().expect("the table");
    assert!(std::sync::Arc::ptr_eq(run_time, &table));
    assert!(on.policy.clients.tiers.get("free").is_some());
    let off = parse_with(&text("", ""), &inputs).unwrap_or_else(|e| panic!("{e}"));
    assert!(off.policy.clients.run_time.is_none());

    let secret = inputs
        .clone()
        .with_identity_secret("a secret of sixteen bytes or more");
    let kept = parse_with(&text(&format!("{token}\n{file}"), ""), &secret)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        kept.clients_file,
        Some(PathBuf::from("/var/lib/floodgate/clients.json"))
    );

    for (admin, more, inputs, expected) in [
        (
            file.to_string(),
            "",
            &secret,
            "admin.clients_file: clients are set through the admin API, which is off",
        ),
        (
            format!("{token}\n{file}"),
            "",
            &inputs,
            "admin.clients_file: keys are kept by their keyed hash",
        ),
        (
            format!("{token}\n{file}"),
            "[redis]\nurl = \"redis://127.0.0.1:6379\"\n",
            &secret,
            "admin.clients_file: with [redis], run-time clients live in Redis",
        ),
    ] {
        let e = parse_with(&text(&admin, more), inputs)
            .expect_err(expected)
            .to_string();
        assert!(e.contains(expected), "{e}");
    }
    let reserved = parse_with(
        &text(token, "").replace("[\"free\", \"pro\"]", "[\"internal\"]"),
        &inputs,
    )
    .expect_err("reserved")
    .to_string();
    assert!(
        reserved.contains("clients.tiers[0]: tier \"internal\" is reserved"),
        "{reserved}"
    );
}

#[test]
fn tracing_takes_its_defaults_its_secrets_from_files_and_names_each_mistake() {
    use crate::tracing::{Protocol, TrustParent};
    let c = parse(&format!(
        "{MINIMAL}[tracing]\nendpoint = \"http://127.0.0.1:4317\"\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let t = c.tracing.expect("[tracing]");
    assert_eq!(t.protocol, Protocol::Grpc);
    assert_eq!(t.endpoint, "http://127.0.0.1:4317");
    assert_eq!(t.service_name, "floodgate");
    assert_eq!((t.sample_ratio, t.max_spans_per_second), (1.0, 2_000));
    assert_eq!(t.trust_parent, TrustParent::TrustedProxies);
    assert!(parse(MINIMAL)
        .unwrap_or_else(|e| panic!("{e}"))
        .tracing
        .is_none());

    let text = format!(
        "{MINIMAL}[tracing]\nendpoint = \"http://collector:4318\"\nprotocol = \"http\"\ntrust_parent = \"none\"\n\
         headers = {{ \"X-Api-Key\" = {{ file = \"/in-memory/otlp\" }}, \"x-team\" = \"edge\" }}\n"
    );
    let files = [(
        PathBuf::from("/in-memory/otlp"),
        b"s3cr3t\nignored\n".to_vec(),
    )];
    let t = Config::parse(
        Path::new("t.toml"),
        &text,
        &Inputs::default().with_files(files),
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .tracing
    .expect("[tracing]");
    assert_eq!(t.endpoint, "http://collector:4318/v1/traces");
    assert_eq!(t.trust_parent, TrustParent::Nobody);
    assert_eq!(
        t.headers,
        [
            ("x-api-key".into(), "s3cr3t".into()),
            ("x-team".into(), "edge".into())
        ]
    );
    assert!(
        !format!("{t:?}").contains("s3cr3t"),
        "the secret is not printed"
    );

    let cases = [
        ("endpoint = \"127.0.0.1:4317\"", "t.toml:6: tracing.endpoint: \"127.0.0.1:4317\" must start with http:// (e.g. \"http://127.0.0.1:4317\")"),
        ("endpoint = \"https://c:4317\"", "t.toml:6: tracing.endpoint: https is not supported: send to a collector on this host or its private network over http (it forwards with TLS)"),
        ("endpoint = \"http://c:4317\"\nprotocol = \"udp\"", "t.toml:7: tracing.protocol: \"udp\" is no OTLP protocol: \"grpc\" (port 4317) or \"http\" (HTTP/protobuf, port 4318)"),
        ("endpoint = \"http://c:4317\"\nsample_ratio = 1.5", "t.toml:7: tracing.sample_ratio: must be from 0.0 (no new trace kept) to 1.0 (every one), got 1.5"),
        ("endpoint = \"http://c:4317\"\nmax_spans_per_second = 0", "t.toml:7: tracing.max_spans_per_second: must be a whole number from 4 to 1000000, got 0"),
        ("endpoint = \"http://c:4317\"\ntrust_parent = \"everyone\"", "t.toml:7: tracing.trust_parent: \"everyone\" is not one of \"trusted_proxies\" (the peers in [clients].trusted_proxies), \"all\" or \"none\""),
        ("endpoint = \"http://c:4317\"\nheaders = { \"x-key\" = { file = \"/nowhere\" } }", "t.toml:7: tracing.headers.x-key: cannot read /nowhere: No such file or directory (os error 2)"),
    ];
    for (table, expected) in cases {
        let err = parse(&format!("{MINIMAL}[tracing]\n{table}\n")).expect_err(table);
        assert_eq!(err.to_string(), expected);
    }
}
