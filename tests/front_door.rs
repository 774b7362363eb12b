//! The front door: TLS and HTTP/2 for clients (curl and openssl as the
//! clients), gRPC (grpcio), WebSocket (websockets), and what the upstream is
//! told about the client. Certificates come from a private CA made per test.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// `/free/*` exempt, 10 requests an hour per address elsewhere.
fn ten_per_ip(config: ConfigBuilder) -> ConfigBuilder {
    config
        .raw("[exempt]\npaths = [\"/free/*\"]")
        .limit(Limit::fixed_window("per-ip", "ip", 10, "1h"))
}

/// One request an hour per address.
fn one_per_ip() -> Limit {
    Limit::fixed_window("one", "ip", 1, "1h")
}

struct Edge {
    proxy: Proxy,
    tls: SocketAddr,
    dir: PathBuf,
}

/// floodgate with an admin listener, a plain listener (h2c as given) and a
/// TLS listener serving `server.crt` by default and `api.crt` for
/// api.example.org; `config` gives the rest.
fn edge(config: ConfigBuilder, h2c: bool) -> Edge {
    let dir = temp_dir();
    make_certificates(&dir);
    make_named_certificate(&dir, "api", "api.example.org", "DNS:api.example.org");
    let tls = local_addr();
    let path = |f: &str| dir.join(f).display().to_string();
    let proxy = config
        .admin()
        .server(&format!("h2c = {h2c}"))
        .raw(&format!(
            "[server.tls]\nlisten = \"{tls}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n\n[[server.tls.certs]]\nserver_names = [\"api.example.org\"]\ncert_file = \"{}\"\nkey_file = \"{}\"",
            path("server.crt"),
            path("server.key"),
            path("api.crt"),
            path("api.key")
        ))
        .start();
    assert!(wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(tls).is_ok()
    }));
    Edge { proxy, tls, dir }
}

/// curl with `args`, one line of `-w` output per transfer.
fn curl(args: &[&str]) -> Vec<String> {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null"])
        .args(args)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The common name of the certificate served for `server_name`.
fn served_cn(addr: SocketAddr, server_name: Option<&str>) -> String {
    let mut args = vec!["s_client".to_string(), "-connect".into(), addr.to_string()];
    if let Some(name) = server_name {
        args.extend(["-servername".into(), name.to_string()]);
    }
    let s_client = Command::new("openssl")
        .args(&args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("openssl s_client");
    let mut x509 = Command::new("openssl")
        .args(["x509", "-noout", "-subject"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl x509");
    if let Some(mut stdin) = x509.stdin.take() {
        use std::io::Write;
        let _ = stdin.write_all(&s_client.stdout);
    }
    let out = x509.wait_with_output().expect("subject");
    let subject = String::from_utf8_lossy(&out.stdout).into_owned();
    subject
        .split("CN")
        .nth(1)
        .map(|s| s.trim_start_matches([' ', '=']).trim().to_string())
        .unwrap_or_default()
}

/// (status, connections opened, HTTP version) per transfer of one curl run.
fn transfers(lines: &[String]) -> Vec<(u16, u32, String)> {
    lines
        .iter()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some((
                parts.next()?.parse().ok()?,
                parts.next()?.parse().ok()?,
                parts.next()?.to_string(),
            ))
        })
        .collect()
}

/// `n` requests through curl, at most 20 at once, multiplexed.
fn multiplexed(base: &str, extra: &[&str], n: usize) -> Vec<(u16, u32, String)> {
    let urls: Vec<String> = (0..n).map(|i| format!("{base}/item/{i}")).collect();
    let mut args: Vec<&str> = extra.to_vec();
    args.extend([
        "--parallel",
        "--parallel-max",
        "20",
        "-w",
        "%{http_code} %{num_connects} %{http_version}\n",
    ]);
    for url in &urls {
        args.extend(["-o", "/dev/null", url.as_str()]);
    }
    transfers(&curl(&args))
}

/// `n` requests over one HTTP/2 connection with prior knowledge, all at
/// once, through nghttp (curl 7.88 cannot reuse a prior-knowledge
/// connection); the status of each.
fn nghttp_statuses(base: &str, n: usize) -> Vec<u16> {
    let urls: Vec<String> = (0..n).map(|i| format!("{base}/item/{i}")).collect();
    let out = Command::new("nghttp")
        .args(["-n", "--stat"])
        .args(&urls)
        .output()
        .expect("nghttp");
    // The --stat table: id, responseEnd, requestStart, process, code, size, path.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("/item/"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

#[test]
fn tls_with_http2_multiplexes_and_refuses_one_stream_at_a_time() {
    let upstream = Upstream::start();
    let edge = edge(ten_per_ip(ConfigBuilder::new(upstream.addr)), false);
    let ca = edge.dir.join("ca.crt").display().to_string();
    let base = format!("https://127.0.0.1:{}", edge.tls.port());
    // 21 requests, at most 20 at once, over one connection.
    let got = multiplexed(&base, &["--cacert", &ca], 21);
    assert_eq!(got.len(), 21, "{got:?}");
    assert!(got.iter().all(|(_, _, v)| v == "2"), "{got:?}");
    assert_eq!(
        got.iter().map(|(_, c, _)| c).sum::<u32>(),
        1,
        "one connection: {got:?}"
    );
    assert_eq!(count_status(got.iter().map(|t| t.0), 200), 10);
    assert_eq!(count_status(got.iter().map(|t| t.0), 429), 11);
    assert_eq!(upstream.count(), 10);
    // HTTP/1.1 over TLS still works.
    let h1 = curl(&[
        "--cacert",
        &ca,
        "--http1.1",
        "-H",
        "Floodgate-H2-Stream: 1:1",
        "-w",
        "%{http_code} %{http_version}",
        &format!("{base}/free/x"),
    ]);
    assert_eq!(h1, ["200 1.1"]);
    // SNI picks the certificate.
    assert_eq!(
        served_cn(edge.tls, Some("api.example.org")),
        "api.example.org"
    );
    assert_eq!(served_cn(edge.tls, Some("other.example.org")), "localhost");
    assert_eq!(served_cn(edge.tls, None), "localhost");

    // A renewed certificate is served to new connections after SIGHUP.
    make_named_certificate(
        &edge.dir,
        "api",
        "renewed.example.org",
        "DNS:api.example.org",
    );
    edge.proxy.signal("-HUP");
    assert!(wait_until(Duration::from_secs(5), || edge
        .proxy
        .log()
        .contains("reloaded")));
    assert_eq!(
        served_cn(edge.tls, Some("api.example.org")),
        "renewed.example.org"
    );
    // A broken one is refused; the served one stays.
    std::fs::write(edge.dir.join("api.crt"), "not a certificate").expect("break");
    edge.proxy.signal("-HUP");
    assert!(wait_until(Duration::from_secs(5), || edge
        .proxy
        .log()
        .contains("reload refused")));
    assert!(
        edge.proxy.log().contains("holds no certificate"),
        "{}",
        edge.proxy.log()
    );
    assert_eq!(
        served_cn(edge.tls, Some("api.example.org")),
        "renewed.example.org"
    );
    let h2 = curl(&[
        "--cacert",
        &ca,
        // A client's own stream name goes before the watch's and is not
        // the one read; none reaches the upstream.
        "-H",
        "floodgate-h2-stream: 0:1",
        "-w",
        "%{http_code} %{http_version}",
        &format!("{base}/free/y"),
    ]);
    assert_eq!(h2, ["200 2"]);
    let seen = upstream.seen();
    assert!(seen.iter().any(|s| s.path == "/free/y"), "{seen:?}");
    assert!(
        seen.iter()
            .all(|s| header(s, "floodgate-h2-stream").is_none()),
        "{seen:?}"
    );
}

#[test]
fn h2c_with_prior_knowledge_on_the_plain_listener() {
    let upstream = Upstream::start();
    let edge = edge(ten_per_ip(ConfigBuilder::new(upstream.addr)), true);
    let base = format!("http://{}", edge.proxy.addr);
    // nghttp carries every stream on its one connection: the refusals
    // answer their streams and the connection goes on serving.
    let got = nghttp_statuses(&base, 21);
    assert_eq!(got.len(), 21, "{got:?}");
    assert_eq!(count_status(&got, 200), 10, "{got:?}");
    assert_eq!(count_status(&got, 429), 11, "{got:?}");
    // HTTP/1.1 on the same listener.
    assert_eq!(edge.proxy.get("/free/a").status, 200);
}

#[test]
fn request_ids_go_over_http2_never_indexed_and_what_repeats_stays_indexable() {
    // Each id is new: indexed, every response would store one in the
    // connection's HPACK table, evicting what repeats, and the next would
    // be compared with all of them.
    let upstream = Upstream::start();
    let proxy = ten_per_ip(ConfigBuilder::new(upstream.addr))
        .server("h2c = true")
        .start();
    let got = run_client("h2_headers.py", &[&proxy.addr.to_string(), "/api/x", "3"]);
    assert_eq!(got.len(), 3, "{got:?}");
    for line in &got {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields[0], "200", "{line}");
        assert!(fields.contains(&"x-request-id=never"), "{line}");
        assert!(fields.contains(&"ratelimit-policy=indexable"), "{line}");
    }
}

#[test]
fn check_shows_the_certificates_names_and_expiry() {
    let upstream = Upstream::start();
    let edge = edge(ConfigBuilder::new(upstream.addr), false);
    let out = Command::new(binary())
        .args(["check", &edge.proxy.config_path.display().to_string()])
        .output()
        .expect("check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("tls       "), "{stdout}");
    assert!(
        stdout.contains("127.0.0.1, localhost (default) expires"),
        "{stdout}"
    );
    assert!(
        stdout.contains("api.example.org (for api.example.org)"),
        "{stdout}"
    );
    assert!(stdout.contains("expires"), "{stdout}");
    // A key that belongs to another certificate is refused by name.
    let text = std::fs::read_to_string(&edge.proxy.config_path).expect("config");
    let wrong = text.replace("api.key", "server.key");
    let bad = edge.dir.join("bad.toml");
    std::fs::write(&bad, wrong).expect("write");
    let out = Command::new(binary())
        .args(["check", &bad.display().to_string()])
        .output()
        .expect("check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("server.tls.certs[0].cert_file"), "{stderr}");
    assert!(
        stderr.contains("does not belong to the certificate"),
        "{stderr}"
    );
}

fn header<'a>(seen: &'a Seen, name: &str) -> Option<&'a str> {
    seen.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_upstream_learns_who_asked_and_never_what_a_client_made_up() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream);
    let lies = [
        ("X-Forwarded-For", "6.6.6.6"),
        ("X-Real-IP", "6.6.6.7"),
        ("X-Forwarded-Proto", "https"),
        ("Forwarded", "for=6.6.6.8"),
        ("X-Request-Id", "chosen-by-client"),
    ];
    let r = proxy.send("GET", "/", &lies);
    assert_eq!(r.status, 200);
    let seen = upstream.seen().pop().expect("forwarded");
    assert_eq!(header(&seen, "x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(header(&seen, "x-real-ip"), Some("127.0.0.1"));
    assert_eq!(header(&seen, "x-forwarded-proto"), Some("http"));
    assert_eq!(header(&seen, "x-forwarded-host"), Some("test"));
    assert_eq!(header(&seen, "forwarded"), None);
    let id = header(&seen, "x-request-id").expect("request id");
    assert_ne!(id, "chosen-by-client");
    assert_eq!(id.len(), 32);
    assert_eq!(
        r.header("X-Request-Id"),
        Some(id),
        "the client gets the same id"
    );

    // Behind trusted proxies: the chain as resolved, the proxy's id kept,
    // and the Host rewritten.
    let trusted = ConfigBuilder::new(upstream.addr)
        .raw("[clients]\ntrusted_proxies = [\"127.0.0.0/8\", \"10.0.0.0/8\"]")
        .start();
    let text = std::fs::read_to_string(&trusted.config_path)
        .expect("config")
        .replace("[upstream]\n", "[upstream]\nhost = \"api.internal\"\n");
    std::fs::write(&trusted.config_path, text).expect("config");
    trusted.signal("-HUP");
    assert!(wait_until(Duration::from_secs(5), || trusted
        .log()
        .contains("reloaded")));
    let r = trusted.send(
        "GET",
        "/",
        &[
            (
                "X-Forwarded-For",
                "garbage-left-of-the-client, 198.51.100.7, 10.0.0.1",
            ),
            ("X-Request-Id", "lb-0042"),
            ("Forwarded", "for=10.0.0.1"),
        ],
    );
    assert_eq!(r.status, 200);
    let seen = upstream.seen().pop().expect("forwarded");
    assert_eq!(
        header(&seen, "x-forwarded-for"),
        Some("198.51.100.7, 10.0.0.1, 127.0.0.1")
    );
    assert_eq!(header(&seen, "x-real-ip"), Some("198.51.100.7"));
    assert_eq!(header(&seen, "x-request-id"), Some("lb-0042"));
    assert_eq!(header(&seen, "host"), Some("api.internal"));
    assert_eq!(header(&seen, "x-forwarded-host"), Some("test"));
    // Forwarded is floodgate's to write unless it is the configured header.
    assert_eq!(header(&seen, "forwarded"), None);
    assert_eq!(r.header("X-Request-Id"), Some("lb-0042"));
    // The id is in the 429 body and in the log line of the refusal.
    let limited = ConfigBuilder::new(upstream.addr)
        .limit(one_per_ip())
        .start();
    limited.get("/");
    let r = limited.get("/");
    let id = r.header("X-Request-Id").expect("id").to_string();
    assert!(
        r.body.contains(&format!("\"request_id\":\"{id}\"")),
        "{}",
        r.body
    );
    assert!(wait_until(Duration::from_secs(2), || limited
        .log()
        .contains(&format!("request_id={id}"))));
}

/// A helper process (python3) stopped on drop.
struct Helper(Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(name)
        .display()
        .to_string()
}

/// Starts `python3 <script> serve <port>` and waits for its "ready".
fn serve(name: &str) -> (Helper, SocketAddr) {
    let port = free_port();
    let mut child = Command::new("python3")
        .args([script(name), "serve".into(), port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let stdout = child.stdout.take().expect("stdout");
    let line = first_line(stdout, Duration::from_secs(30));
    assert_eq!(line.trim(), "ready", "{name} did not start");
    (
        Helper(child),
        format!("127.0.0.1:{port}").parse().expect("addr"),
    )
}

fn run_client(name: &str, args: &[&str]) -> Vec<String> {
    // A client stuck on a proxy that never answers must fail its test, not
    // hold the suite until CI's own limit.
    let out = Command::new("timeout")
        .args(["60", "python3"])
        .arg(script(name))
        .args(args)
        .output()
        .expect("timeout python3");
    match out.status.code() {
        Some(124) => panic!(
            "{name} {args:?} gave no answer within 60 s: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Some(126 | 127) => panic!(
            "python3 could not be run: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        _ => {}
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn grpc_calls_are_refused_the_way_grpc_clients_understand() {
    let (server, server_addr) = serve("grpc_echo.py");
    // h2c from clients, HTTP/2 to the service.
    let grpc = ConfigBuilder::new(server_addr)
        .server("h2c = true")
        .upstream("http2 = true");
    let proxy = grpc
        .clone()
        .limit(Limit::fixed_window("per-ip", "ip", 3, "1h"))
        .start();
    let calls = run_client("grpc_echo.py", &["call", &proxy.addr.to_string(), "5"]);
    assert_eq!(calls.len(), 5, "{calls:?}");
    for (i, call) in calls.iter().take(3).enumerate() {
        assert_eq!(call, &format!("OK hello {i}"));
    }
    for call in &calls[3..] {
        assert!(
            call.starts_with("RESOURCE_EXHAUSTED rate limited by per-ip; retry after"),
            "{call}"
        );
    }
    // The service behind is gone: UNAVAILABLE, not an HTTP error.
    drop(server);
    let bare = grpc.start();
    let gone = run_client("grpc_echo.py", &["call", &bare.addr.to_string(), "1"]);
    assert_eq!(gone.len(), 1);
    assert!(
        gone[0].starts_with("UNAVAILABLE the service behind the gateway is unavailable"),
        "{gone:?}"
    );
}

#[test]
fn a_websocket_lives_while_it_talks_and_ends_after_its_idle_timeout() {
    let (_server, server_addr) = serve("ws_echo.py");
    let proxy = ConfigBuilder::new(server_addr)
        .read_timeout("1s")
        .upstream("websocket_idle_timeout = \"3s\"")
        .start();
    let url = format!("ws://{}/chat", proxy.addr);
    // Silent for twice read_timeout: still open. Then silent until the
    // proxy closes it, which is after the idle timeout.
    let said = run_client("ws_echo.py", &["talk", &url, "0", "2", "close"]);
    assert_eq!(said[..2], ["echo", "echo"], "{said:?}");
    let closed_after: f64 = said
        .get(2)
        .and_then(|s| s.strip_prefix("closed after "))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not closed by the proxy: {said:?}"));
    assert!(
        closed_after >= 2.5,
        "closed after {closed_after} s of silence"
    );
}

/// A WebSocket holds its concurrency slot while it is open; with
/// `upgrades = "exclude"` the slot is given back at the 101.
#[test]
fn a_websocket_holds_its_slot_unless_upgrades_are_excluded() {
    let (_server, server_addr) = serve("ws_echo.py");
    for (upgrades, second) in [("include", "refused"), ("exclude", "echo")] {
        let proxy = ConfigBuilder::new(server_addr)
            .limit(
                Limit::concurrency("sockets", "ip", 1, "60s")
                    .line(&format!("upgrades = \"{upgrades}\"")),
            )
            .start();
        let url = format!("ws://{}/chat", proxy.addr);
        // The first socket talks at once, then stays open (30 s, far longer
        // than the second needs); it is stopped when the test is done.
        let mut first = Command::new("python3")
            .arg(script("ws_echo.py"))
            .args(["talk", &url, "0", "30"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        let said = first.stdout.take().expect("stdout");
        let first = Helper(first);
        let line = first_line(said, Duration::from_secs(30));
        assert_eq!(line.trim(), "echo", "{upgrades}: the first socket is open");
        let other = run_client("ws_echo.py", &["talk", &url, "0"]);
        assert_eq!(other, [second], "{upgrades}: a second socket meanwhile");
        drop(first);
    }
}

#[test]
fn tls_handshakes_count_against_the_caps_and_the_head_deadline() {
    let upstream = Upstream::start();
    let edge = edge(
        ConfigBuilder::new(upstream.addr)
            .server("header_timeout = \"2s\"\nmax_connections_per_ip = 8"),
        false,
    );
    let (proxy, tls) = (&edge.proxy, edge.tls);
    // 20 connections that never start their handshake: 8 are held, the
    // others are closed at once; the 8 go after header_timeout.
    use std::io::Read;
    let started = std::time::Instant::now();
    let mut silent: Vec<std::net::TcpStream> = (0..20)
        .filter_map(|_| std::net::TcpStream::connect(tls).ok())
        .collect();
    let closed = |all: &mut Vec<std::net::TcpStream>| {
        all.iter_mut()
            .map(|s| {
                let _ = s.set_nonblocking(true);
                match s.read(&mut [0u8; 8]) {
                    Ok(n) => n == 0,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                }
            })
            .filter(|c| *c)
            .count()
    };
    // At least 12 go at once (well inside the 2 s the others may wait; the
    // readiness probes' own connections may still hold a place or two), the
    // rest at header_timeout.
    assert!(wait_until(Duration::from_millis(1500), || closed(
        &mut silent
    ) >= 12));
    assert!(
        closed(&mut silent) < 20,
        "some were held until the deadline"
    );
    assert!(wait_until(Duration::from_secs(4), || closed(&mut silent) == 20));
    assert!(started.elapsed() < Duration::from_secs(4));
    assert!(
        proxy.log().matches("closed at once").count() <= 2,
        "{}",
        proxy.log()
    );
}

#[test]
fn http2_streams_count_against_the_address_cap() {
    let upstream = Upstream::start();
    let edge = edge(
        ConfigBuilder::new(upstream.addr).server("max_connections_per_ip = 5"),
        true,
    );
    let (proxy, addr) = (&edge.proxy, edge.proxy.addr);
    // 20 requests on one HTTP/2 connection that the upstream holds: 5 in
    // flight, the rest refused at once.
    let urls: Vec<String> = (0..20)
        .map(|i| format!("http://{addr}/hold?i={i}"))
        .collect();
    let mut nghttp = Command::new("nghttp")
        .args(["-n", "--stat"])
        .args(&urls)
        .stdout(Stdio::piped())
        .spawn()
        .expect("nghttp");
    let refused = "floodgate_requests_total{status_class=\"4xx\"}";
    let settled = wait_until(Duration::from_secs(10), || {
        upstream.count() == 5 && proxy.metric(refused) == 15.0
    });
    if !settled {
        let _ = nghttp.kill();
    }
    upstream.release();
    let out = nghttp.wait_with_output().expect("nghttp");
    assert!(
        settled,
        "{} held at the upstream, {} refused",
        upstream.count(),
        proxy.metric(refused)
    );
    let codes: Vec<u16> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("/hold"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect();
    assert_eq!(codes.len(), 20, "{codes:?}");
    assert_eq!(count_status(&codes, 200), 5, "{codes:?}");
    assert_eq!(count_status(&codes, 429), 15, "{codes:?}");
    assert_eq!(upstream.count(), 5);
}

#[test]
fn no_spelling_of_a_forwarding_header_reaches_the_upstream() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream);
    let r = proxy.send(
        "GET",
        "/",
        &[
            ("X_Forwarded_For", "8.8.8.8"),
            ("True-Client-IP", "8.8.8.9"),
            ("X-Client-IP", "8.8.8.10"),
            ("X-Forwarded-Port", "443"),
            ("X-Forwarded-Ssl", "on"),
        ],
    );
    assert_eq!(r.status, 200);
    let seen = upstream.seen().pop().expect("forwarded");
    for name in [
        "x_forwarded_for",
        "true-client-ip",
        "x-client-ip",
        "x-forwarded-port",
        "x-forwarded-ssl",
    ] {
        assert_eq!(header(&seen, name), None, "{name} reached the upstream");
    }
    assert_eq!(header(&seen, "x-forwarded-for"), Some("127.0.0.1"));
    // A trusted load balancer's word on scheme and host stands.
    let trusted = ConfigBuilder::new(upstream.addr)
        .raw("[clients]\ntrusted_proxies = [\"127.0.0.0/8\"]")
        .start();
    trusted.send(
        "GET",
        "/",
        &[
            ("X-Forwarded-Proto", "https"),
            ("X-Forwarded-Host", "api.example.org"),
        ],
    );
    let seen = upstream.seen().pop().expect("forwarded");
    assert_eq!(header(&seen, "x-forwarded-proto"), Some("https"));
    assert_eq!(header(&seen, "x-forwarded-host"), Some("api.example.org"));
    // gRPC over HTTP/1.1 (gRPC-Web proxies, curl) gets the ordinary 429.
    let limited = ConfigBuilder::new(upstream.addr)
        .limit(one_per_ip())
        .start();
    limited.get("/");
    let r = limited.send("POST", "/svc/Call", &[("Content-Type", "application/grpc")]);
    assert_eq!(r.status, 429);
    assert!(
        r.body.starts_with("{\"error\":\"rate_limited\""),
        "{}",
        r.body
    );
}

/// Every header an application might read as the client's address, the
/// scheme, the host, the URL or the method reaches the upstream only from a
/// trusted proxy; the operator adds names and keeps some.
#[test]
fn headers_the_upstream_trusts_come_only_from_a_trusted_peer() {
    use floodgate::proxy::client_headers::LISTED;
    // The ones an attacker got through once are on the list.
    for name in [
        "client-ip",
        "cf-connecting-ip",
        "fastly-client-ip",
        "x-original-forwarded-for",
        "forwarded-for",
        "x-forwarded",
        "x-remote-ip",
        "x-remote-addr",
        "x-originating-ip",
        "x-proxyuser-ip",
        "x-envoy-external-address",
        "x-azure-clientip",
        "x-appengine-user-ip",
        "x-url-scheme",
        "front-end-https",
        "x-host",
        "x-forwarded-prefix",
        "x-original-url",
        "x-rewrite-url",
        "x-http-method-override",
    ] {
        assert!(LISTED.contains(&name), "{name} is not on the list");
    }
    // Floodgate writes these itself, whoever asks.
    let written = [
        "x-forwarded-for",
        "x-real-ip",
        "x-forwarded-proto",
        "x-forwarded-host",
    ];
    let sent: Vec<(String, String)> = LISTED
        .iter()
        .map(|name| (name.to_string(), "203.0.113.9".to_string()))
        .chain([
            ("X_Original_URL".to_string(), "/admin".to_string()),
            ("X-Debug-User".to_string(), "root".to_string()),
            ("X-HTTP-Method-Override".to_string(), "DELETE".to_string()),
        ])
        .collect();
    let headers: Vec<(&str, &str)> = sent.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let upstream = Upstream::start();
    let untrusted = Proxy::start(&upstream);
    assert_eq!(untrusted.send("GET", "/", &headers).status, 200);
    let seen = upstream.seen().pop().expect("forwarded");
    for name in LISTED.iter().filter(|n| !written.contains(n)) {
        assert_eq!(header(&seen, name), None, "{name} reached the upstream");
    }
    assert_eq!(header(&seen, "x_original_url"), None);
    assert_eq!(header(&seen, "x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(header(&seen, "x-real-ip"), Some("127.0.0.1"));
    assert_eq!(header(&seen, "x-forwarded-proto"), Some("http"));
    assert_eq!(header(&seen, "x-debug-user"), Some("root"));
    // Also with floodgate's own headers off: the client still may not say.
    let quiet = ConfigBuilder::new(upstream.addr)
        .upstream("forwarded_headers = false")
        .start();
    assert_eq!(quiet.send("GET", "/", &headers).status, 200);
    let seen = upstream.seen().pop().expect("forwarded");
    for name in LISTED {
        assert_eq!(header(&seen, name), None, "{name} reached the upstream");
    }
    // The operator's own additions go; a kept name passes.
    let tuned = ConfigBuilder::new(upstream.addr)
        .upstream("strip_headers = [\"X-Debug-User\"]\nkeep_headers = [\"X-HTTP-Method-Override\"]")
        .start();
    assert_eq!(tuned.send("GET", "/", &headers).status, 200);
    let seen = upstream.seen().pop().expect("forwarded");
    assert_eq!(header(&seen, "x-debug-user"), None);
    assert!(header(&seen, "x-http-method-override").is_some());
    assert_eq!(header(&seen, "x-original-url"), None);
    // From a trusted proxy, every one of them stands (it saw the client).
    let trusted = ConfigBuilder::new(upstream.addr)
        .raw("[clients]\ntrusted_proxies = [\"127.0.0.0/8\"]")
        .start();
    assert_eq!(trusted.send("GET", "/", &headers).status, 200);
    let seen = upstream.seen().pop().expect("forwarded");
    for name in LISTED
        .iter()
        .filter(|n| !["x-forwarded-for", "x-real-ip"].contains(n))
    {
        assert_eq!(
            header(&seen, name),
            Some("203.0.113.9"),
            "{name} from a trusted peer"
        );
    }
}

#[test]
fn an_http2_body_must_keep_moving_too() {
    use std::io::Write;
    let upstream = Upstream::start();
    let edge = edge(
        ConfigBuilder::new(upstream.addr).server("header_timeout = \"1s\""),
        true,
    );
    let (proxy, addr) = (&edge.proxy, edge.proxy.addr);
    // curl uploads what its stdin gives it, as it comes: one byte every 300 ms.
    let mut curl = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "--http2-prior-knowledge",
            "-T",
            "-",
            &format!("http://{addr}/upload"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("curl");
    let mut stdin = curl.stdin.take().expect("stdin");
    let started = std::time::Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // The client's pace, the fault under test: a byte every 300 ms until
    // the stream is cut (the pipe breaks) or the test is done.
    let drip = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst)
                && stdin.write_all(b"x").and_then(|()| stdin.flush()).is_ok()
            {
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let cut = wait_until(Duration::from_secs(8), || {
        proxy.metric("floodgate_idle_timeouts_total") >= 1.0
    })
    .then(|| started.elapsed());
    stop.store(true, Ordering::SeqCst);
    let _ = curl.kill();
    let _ = curl.wait();
    let _ = drip.join();
    // header_timeout of grace, then the pace counts: cut within a few seconds.
    let cut = cut.expect("the stream was cut");
    assert!(cut < Duration::from_secs(4), "{cut:?}");
}

#[test]
fn a_client_that_chooses_h2_and_says_nothing_is_closed_in_time() {
    let upstream = Upstream::start();
    let edge = edge(
        ConfigBuilder::new(upstream.addr).server("header_timeout = \"1s\""),
        true,
    );
    let (proxy, tls) = (&edge.proxy, edge.tls);
    // Python's ssl module as the client: ALPN h2, then silence (or half a
    // preface); the seconds until the server closes.
    let silent = |send: &str| -> f64 {
        let script = format!(
            "import socket, ssl, time\n\
             ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n\
             ctx.set_alpn_protocols(['h2'])\n\
             s = ctx.wrap_socket(socket.create_connection(('127.0.0.1', {port})))\n\
             assert s.selected_alpn_protocol() == 'h2'\n\
             s.sendall({send})\n\
             t = time.time(); s.settimeout(10)\n\
             try:\n    s.recv(100)\nexcept Exception:\n    pass\n\
             print(time.time() - t)\n",
            port = tls.port()
        );
        // The handshake comes before the script's own socket timeout.
        let out = Command::new("timeout")
            .args(["30", "python3", "-c", &script])
            .output()
            .expect("timeout python3");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(99.0)
    };
    for send in ["b''", "b'PRI * HTTP/2.0\\\\r\\\\n'"] {
        let took = silent(send);
        assert!(took < 2.0, "{send}: closed after {took} s");
    }
    // An HTTP/1.0 request shorter than the h2 preface, on the h2c listener.
    let r = raw_request(proxy.addr, b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200);
}

#[test]
fn each_worker_keeps_its_upstream_connections_for_the_next_requests() {
    let upstream = Upstream::start();
    // (The test config runs two workers.)
    let proxy = ConfigBuilder::new(upstream.addr).admin().start();
    let addr = proxy.addr;
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..4)
            .map(|_| s.spawn(move || keepalive_gets(addr, "/", vec![Vec::new(); 250])))
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().expect("client"))
            .collect()
    });
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 1_000);
    let new = proxy.metric("floodgate_upstream_connections_total{reused=\"false\"}");
    let reused = proxy.metric("floodgate_upstream_connections_total{reused=\"true\"}");
    assert_eq!(new + reused, 1_000.0);
    // Four clients at a time, on two workers with a pool each: a handful of
    // connections, each kept for the requests after it.
    assert!(
        new <= 8.0,
        "{new} new upstream connections for 1,000 requests"
    );
}
