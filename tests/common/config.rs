//! The one way tests write a floodgate config: `[server]` and `[upstream]`
//! filled in with what every test needs, the rest added section by section.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::{local_addr, temp_dir, Proxy, TestClock};

/// A config file in the making, and the environment its proxy runs with.
///
/// Ports not fixed with `listen` or `admin_at` are chosen when the file is
/// written, so one builder can start several proxies.
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    listen: Option<SocketAddr>,
    admin: Admin,
    grace: String,
    server: Vec<String>,
    servers: Vec<String>,
    read_timeout: String,
    upstream: Vec<String>,
    redis: Vec<String>,
    rest: Vec<String>,
    env: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy)]
enum Admin {
    None,
    AnyPort,
    At(SocketAddr),
}

impl ConfigBuilder {
    /// `[server]` on a free port (2 threads, a grace period of 1 s) and
    /// `[upstream]` with `upstream` as its only server (connect_timeout
    /// 500 ms, read_timeout 5 s).
    ///
    /// The proxies it starts read a clock set to 30 s past the half hour
    /// (`FLOODGATE_CLOCK_OFFSET_MS`, the same offset for every proxy of this
    /// builder), so that no aligned window of a minute or an hour ends
    /// while a test runs; `clock` or an explicit offset replaces it.
    pub fn new(upstream: SocketAddr) -> ConfigBuilder {
        let now_ms = (super::now_us() / 1000) as i64;
        const HOUR_MS: i64 = 3_600_000;
        let target_ms = now_ms - now_ms.rem_euclid(HOUR_MS) + HOUR_MS / 2 + 30_000;
        let phase = (
            "FLOODGATE_CLOCK_OFFSET_MS".to_string(),
            (target_ms - now_ms).to_string(),
        );
        ConfigBuilder {
            listen: None,
            admin: Admin::None,
            grace: "1s".into(),
            server: Vec::new(),
            servers: vec![upstream.to_string()],
            read_timeout: "5s".into(),
            upstream: Vec::new(),
            redis: Vec::new(),
            rest: Vec::new(),
            env: vec![phase],
        }
    }

    /// Listens on `addr` rather than on a port chosen at start.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// An admin listener on a port chosen at start.
    pub fn admin(mut self) -> Self {
        self.admin = Admin::AnyPort;
        self
    }

    /// An admin listener on `addr`.
    pub fn admin_at(mut self, addr: SocketAddr) -> Self {
        self.admin = Admin::At(addr);
        self
    }

    pub fn grace(mut self, grace: &str) -> Self {
        self.grace = grace.into();
        self
    }

    /// More lines for `[server]`, e.g. `header_timeout = "1s"`.
    pub fn server(mut self, lines: &str) -> Self {
        self.server.push(lines.into());
        self
    }

    /// `upstream.servers`, in this order (anything that formats as an
    /// address, live or not).
    pub fn servers<S: ToString>(mut self, servers: &[S]) -> Self {
        self.servers = servers.iter().map(ToString::to_string).collect();
        self
    }

    pub fn read_timeout(mut self, timeout: &str) -> Self {
        self.read_timeout = timeout.into();
        self
    }

    /// More lines for `[upstream]`, e.g. `http2 = true`.
    pub fn upstream(mut self, lines: &str) -> Self {
        self.upstream.push(lines.into());
        self
    }

    /// `[redis]` with `url`.
    pub fn redis(mut self, url: &str) -> Self {
        self.redis.insert(0, format!("url = \"{url}\""));
        self
    }

    /// `[redis]` with `cluster` (seed URLs).
    pub fn redis_cluster(mut self, urls: &[String]) -> Self {
        let urls: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
        self.redis
            .insert(0, format!("cluster = [{}]", urls.join(", ")));
        self
    }

    /// More lines for `[redis]`, e.g. `clock = "local"`.
    pub fn redis_lines(mut self, lines: &str) -> Self {
        self.redis.push(lines.into());
        self
    }

    pub fn limit(mut self, limit: Limit) -> Self {
        self.rest.push(limit.to_string());
        self
    }

    /// Further TOML as it is: `[clients]`, `[exempt]`, `[[costs]]`, ...
    pub fn raw(mut self, toml: &str) -> Self {
        self.rest.push(toml.into());
        self
    }

    /// An environment variable for the proxy.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }

    /// The proxy's time follows `clock` (`FLOODGATE_CLOCK_FILE`), and only
    /// it: the builder's own offset goes.
    pub fn clock(mut self, clock: &TestClock) -> Self {
        self.env.retain(|(k, _)| k != "FLOODGATE_CLOCK_OFFSET_MS");
        let path = clock.path().display().to_string();
        self.env("FLOODGATE_CLOCK_FILE", &path)
    }

    /// This builder with every port fixed.
    fn resolved(&self) -> ConfigBuilder {
        let mut fixed = self.clone();
        fixed.listen = Some(self.listen.unwrap_or_else(local_addr));
        if let Admin::AnyPort = self.admin {
            fixed.admin = Admin::At(local_addr());
        }
        fixed
    }

    /// The file's text, ports chosen now where not fixed.
    pub fn text(&self) -> String {
        self.resolved().render()
    }

    fn render(&self) -> String {
        let mut server = vec![
            format!(
                "listen = \"{}\"",
                self.listen.map(|a| a.to_string()).unwrap_or_default()
            ),
            "threads = 2".into(),
            format!("grace_period = \"{}\"", self.grace),
        ];
        if let Admin::At(admin) = self.admin {
            server.push(format!("admin_listen = \"{admin}\""));
        }
        server.extend(self.server.iter().cloned());
        let servers: Vec<String> = self.servers.iter().map(|s| format!("\"{s}\"")).collect();
        let mut upstream = vec![
            format!("servers = [{}]", servers.join(", ")),
            "connect_timeout = \"500ms\"".into(),
            format!("read_timeout = \"{}\"", self.read_timeout),
        ];
        upstream.extend(self.upstream.iter().cloned());
        let mut text = format!(
            "[server]\n{}\n\n[upstream]\n{}\n",
            server.join("\n"),
            upstream.join("\n")
        );
        if !self.redis.is_empty() {
            text.push_str(&format!("\n[redis]\n{}\n", self.redis.join("\n")));
        }
        for part in &self.rest {
            text.push('\n');
            text.push_str(part);
            if !part.ends_with('\n') {
                text.push('\n');
            }
        }
        text
    }

    /// Writes the file to `path`, ports chosen now where not fixed.
    pub fn write_to(&self, path: &Path) {
        std::fs::write(path, self.text()).expect("write config");
    }

    /// Writes the file as `proxy.toml` in a fresh directory.
    pub fn write(&self) -> PathBuf {
        let path = temp_dir().join("proxy.toml");
        self.write_to(&path);
        path
    }

    /// The real binary serving this config, once it listens.
    pub fn start(&self) -> Proxy {
        self.start_wrapped(&[])
    }

    /// Like `start`, the binary run by `wrapper` (e.g. `prlimit --nofile=...`).
    pub fn start_wrapped(&self, wrapper: &[&str]) -> Proxy {
        let fixed = self.resolved();
        let path = temp_dir().join("proxy.toml");
        std::fs::write(&path, fixed.render()).expect("write config");
        let admin = match fixed.admin {
            Admin::At(addr) => Some(addr),
            _ => None,
        };
        let listen = fixed.listen.expect("resolved");
        let proxy = Proxy::launch(listen, admin, path, &fixed.env, wrapper);
        if fixed.env.iter().any(|(k, _)| k == "FLOODGATE_CLOCK_FILE") {
            // A binary that ignored the clock file would fail its test for
            // reasons far from the cause (e.g. another tree's build of it).
            assert!(
                proxy.log().contains("(FLOODGATE_CLOCK_FILE)"),
                "{} does not follow FLOODGATE_CLOCK_FILE: {}",
                super::binary(),
                proxy.log()
            );
        }
        proxy
    }
}

/// One `[[limits]]` table.
#[derive(Debug, Clone)]
pub struct Limit {
    lines: Vec<String>,
}

impl Limit {
    /// `key` as a string, or as it is when it is a TOML list (`[...]`).
    fn new(name: &str, key: &str, algorithm: &str) -> Limit {
        let key = if key.starts_with('[') {
            key.to_string()
        } else {
            format!("\"{key}\"")
        };
        Limit {
            lines: vec![
                format!("name = \"{name}\""),
                format!("key = {key}"),
                format!("algorithm = \"{algorithm}\""),
            ],
        }
    }

    fn counted(name: &str, key: &str, algorithm: &str, limit: u64, window: &str) -> Limit {
        Limit::new(name, key, algorithm)
            .line(&format!("limit = {limit}"))
            .line(&format!("window = \"{window}\""))
    }

    pub fn fixed_window(name: &str, key: &str, limit: u64, window: &str) -> Limit {
        Limit::counted(name, key, "fixed_window", limit, window)
    }

    pub fn sliding_window(name: &str, key: &str, limit: u64, window: &str) -> Limit {
        Limit::counted(name, key, "sliding_window", limit, window)
    }

    pub fn sliding_log(name: &str, key: &str, limit: u64, window: &str) -> Limit {
        Limit::counted(name, key, "sliding_log", limit, window)
    }

    pub fn token_bucket(name: &str, key: &str, capacity: u64, refill_rate: f64) -> Limit {
        Limit::new(name, key, "token_bucket")
            .line(&format!("capacity = {capacity}"))
            .line(&format!("refill_rate = {refill_rate}"))
    }

    pub fn leaky_bucket(name: &str, key: &str, rate: f64, capacity: u64) -> Limit {
        Limit::new(name, key, "leaky_bucket")
            .line(&format!("rate = {rate}"))
            .line(&format!("capacity = {capacity}"))
    }

    /// At most `limit` per calendar `period` ("day", "week", "month"), UTC
    /// unless a `timezone` line follows.
    pub fn quota(name: &str, key: &str, limit: u64, period: &str) -> Limit {
        Limit::new(name, key, "quota")
            .line(&format!("limit = {limit}"))
            .line(&format!("period = \"{period}\""))
    }

    /// At most `max` requests in flight per key, each slot leased for
    /// `lease`.
    pub fn concurrency(name: &str, key: &str, max: u64, lease: &str) -> Limit {
        Limit::new(name, key, "concurrency")
            .line(&format!("max = {max}"))
            .line(&format!("lease = \"{lease}\""))
    }

    /// `match = { <what> }`, e.g. `paths = ["/login"]`.
    pub fn matching(self, what: &str) -> Limit {
        self.line(&format!("match = {{ {what} }}"))
    }

    /// Any further line, e.g. `shadow = true`.
    pub fn line(mut self, line: &str) -> Limit {
        self.lines.push(line.into());
        self
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "[[limits]]")?;
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}
