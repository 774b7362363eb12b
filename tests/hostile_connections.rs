//! Hostile connections: what never becomes a proper request. Slow heads,
//! idle keep-alives, one address holding thousands of connections, pipelined
//! and early requests, ambiguous framing, dead upstreams, and what the log
//! must never say. The real binary, real sockets, all on 127.0.0.0/8.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// In front of `upstream` with an admin listener and `server_lines` added
/// to `[server]`.
fn proxy_with(upstream: &Upstream, server_lines: &str) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .server(server_lines)
}

/// `n` keep-alive connections from 127.0.0.1, each idle after one answered
/// request, once the proxy counts them all open.
fn hold_idle(proxy: &Proxy, n: usize) -> Vec<TcpStream> {
    let held: Vec<TcpStream> = (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(proxy.addr).expect("connect");
            s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                .expect("send");
            let mut reader = BufReader::new(s.try_clone().expect("clone"));
            assert_eq!(read_response(&mut reader).map(|r| r.0), Some(200));
            s
        })
        .collect();
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("floodgate_connections_open")
        == n as f64));
    held
}

/// `n` more connections from 127.0.0.1, each sending a request: every one
/// closed without an answer.
fn closed_unanswered(proxy: &Proxy, n: usize) {
    for _ in 0..n {
        let mut extra = TcpStream::connect(proxy.addr).expect("connect");
        let _ = extra.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n");
        let (got, closed) = until_closed(&mut extra, Duration::from_secs(2));
        assert!(
            closed.is_some() && got.is_empty(),
            "{}",
            String::from_utf8_lossy(&got)
        );
    }
}

/// A TCP connection to `to` from the local address `from` (any 127.x.y.z).
fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let local = SocketAddr::new(from.parse().map_err(std::io::Error::other)?, 0);
    let socket = Socket::new(Domain::for_address(local), Type::STREAM, None)?;
    socket.bind(&local.into())?;
    socket.connect(&to.into())?;
    Ok(socket.into())
}

/// Waits until the server closes `stream` (or `limit` passes); what it sent
/// before closing, and when it closed.
fn until_closed(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, Option<Instant>) {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while Instant::now() < deadline {
        let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
        match stream.read(&mut buf) {
            Ok(0) => return (got, Some(Instant::now())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return (got, Some(Instant::now())),
        }
    }
    (got, None)
}

#[test]
fn slow_heads_and_idle_connections_are_closed_in_time() {
    let upstream = Upstream::start();
    let proxy = proxy_with(
        &upstream,
        "header_timeout = \"1s\"\nkeepalive_timeout = \"2s\"",
    )
    .start();
    let addr = proxy.addr;
    // 50 clients trickling a head one header line every 200 ms.
    let slow: Vec<_> = (0..50)
        .map(|_| {
            thread::spawn(move || {
                let started = Instant::now();
                let mut s = TcpStream::connect(addr).expect("connect");
                let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n");
                let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                let mut got = Vec::new();
                let mut buf = [0u8; 256];
                while started.elapsed() < Duration::from_secs(6) {
                    if s.write_all(b"X-Slow: 1\r\n").is_err() {
                        break;
                    }
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                        Err(_) => {}
                    }
                }
                (
                    started.elapsed(),
                    String::from_utf8_lossy(&got).into_owned(),
                )
            })
        })
        .collect();
    // Meanwhile a legitimate client is served as usual.
    let mut legit = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        assert_eq!(proxy.get("/").status, 200);
        legit.push(t.elapsed());
    }
    let mut closed_after = Vec::new();
    for handle in slow {
        let (took, got) = handle.join().expect("slow client");
        assert!(got.starts_with("HTTP/1.1 408"), "{got}");
        assert!(took < Duration::from_secs(2), "closed after {took:?}");
        closed_after.push(took);
    }
    // A connection that sends nothing at all is as slow.
    let mut silent = TcpStream::connect(addr).expect("connect");
    let started = Instant::now();
    let (got, closed) = until_closed(&mut silent, Duration::from_secs(5));
    let silent_took = closed.map(|c| c - started).expect("closed");
    assert!(silent_took < Duration::from_secs(2), "{silent_took:?}");
    assert!(got.starts_with(b"HTTP/1.1 408"));

    // After a complete request: idle is closed after keepalive_timeout, with nothing sent.
    let mut idle = TcpStream::connect(addr).expect("connect");
    idle.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("send");
    let mut reader = BufReader::new(idle.try_clone().expect("clone"));
    assert_eq!(read_response(&mut reader).map(|r| r.0), Some(200));
    let idle_from = Instant::now();
    let (got, closed) = until_closed(&mut idle, Duration::from_secs(6));
    let idle_took = closed.map(|c| c - idle_from).expect("closed");
    assert!(got.is_empty());
    assert!(
        idle_took >= Duration::from_millis(1900) && idle_took < Duration::from_secs(3),
        "{idle_took:?}"
    );

    // Half of a second request, then silence: 408 within header_timeout.
    let mut half = TcpStream::connect(addr).expect("connect");
    half.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("send");
    let mut reader = BufReader::new(half.try_clone().expect("clone"));
    assert_eq!(read_response(&mut reader).map(|r| r.0), Some(200));
    half.write_all(b"GET / HTTP/1.1\r\nHo").expect("send half");
    let half_from = Instant::now();
    let (got, closed) = until_closed(&mut half, Duration::from_secs(5));
    let half_took = closed.map(|c| c - half_from).expect("closed");
    assert!(half_took < Duration::from_secs(2), "{half_took:?}");
    assert!(
        got.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&got)
    );

    assert!(proxy.metric("floodgate_header_timeouts_total") >= 52.0);
    assert!(proxy.metric("floodgate_idle_timeouts_total") >= 1.0);
    legit.sort();
    closed_after.sort();
    record(
        "slow_and_idle_connections",
        &format!(
            "header_timeout 1s, keepalive_timeout 2s\n50 slow-header clients closed with 408 after {:?} .. {:?}\nsilent connection closed after {silent_took:?}\nidle keep-alive closed after {idle_took:?}\nhalf a second request closed after {half_took:?}\nlegitimate requests meanwhile: median {:?}, max {:?}\n",
            closed_after[0],
            closed_after[closed_after.len() - 1],
            legit[legit.len() / 2],
            legit[legit.len() - 1]
        ),
    );
}

fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn one_address_cannot_hold_more_than_its_share() {
    let upstream = Upstream::start();
    let proxy = proxy_with(
        &upstream,
        "header_timeout = \"30s\"\nmax_connections_per_ip = 50",
    )
    .start();
    let rss_before = resident_kib(proxy.pid());
    // 50 idle connections from 127.0.0.1, each after one request.
    let held = hold_idle(&proxy, 50);
    let rss_held = resident_kib(proxy.pid());
    // The 51st from the same address is closed at once, without an answer;
    // so are the next 200 attempts.
    closed_unanswered(&proxy, 200);
    // Another address is served.
    let mut other = connect_from("127.0.0.2", proxy.addr).expect("connect from 127.0.0.2");
    other
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut reader = BufReader::new(other);
    assert_eq!(read_response(&mut reader).map(|r| r.0), Some(200));
    assert_eq!(
        proxy.metric("floodgate_connections_refused_total{cap=\"per_ip\"}"),
        200.0
    );
    let log = proxy.log();
    assert_eq!(
        log.matches("per_ip connection cap (50) reached").count(),
        1,
        "logged once a minute per address: {log}"
    );
    drop(held);
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("floodgate_connections_open")
        == 0.0));
    assert_eq!(proxy.get("/").status, 200, "the places came back");
    record(
        "connection_caps",
        &format!(
            "RSS {rss_before} KiB with no connection, {rss_held} KiB with 50 idle keep-alive connections: {} KiB each\n",
            rss_held.saturating_sub(rss_before) / 50
        ),
    );
}

#[test]
fn a_connection_over_its_cap_is_closed_in_the_accept_loop_and_never_becomes_a_request() {
    let upstream = Upstream::start();
    let proxy = proxy_with(
        &upstream,
        "header_timeout = \"30s\"\nmax_connections_per_ip = 3",
    )
    .limit(Limit::fixed_window("per-ip", "ip", 1000, "1h"))
    .start();
    let admitted = "floodgate_decisions_total{limit=\"per-ip\",outcome=\"admitted\"}";
    let held = hold_idle(&proxy, 3);
    closed_unanswered(&proxy, 50);
    // Every one of them closed by the accept loop's check: none was given a
    // task, so none was parsed, decided or forwarded.
    assert_eq!(
        proxy.metric("floodgate_connections_refused_at_accept_total"),
        50.0
    );
    assert_eq!(
        proxy.metric("floodgate_connections_refused_total{cap=\"per_ip\"}"),
        50.0
    );
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric(admitted)
        == 3.0));
    assert_eq!(upstream.count(), 3);
    // A peer under its cap is served, through the same accept loop.
    let mut other = connect_from("127.0.0.2", proxy.addr).expect("connect from 127.0.0.2");
    other
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .expect("send");
    assert_eq!(
        read_response(&mut BufReader::new(other)).map(|r| r.0),
        Some(200)
    );
    // (Counted once the response is out.)
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric(admitted)
        == 4.0));
    assert_eq!(
        proxy.metric("floodgate_connections_refused_at_accept_total"),
        50.0
    );
    drop(held);
    assert!(wait_until(Duration::from_secs(5), || proxy.get("/").status == 200));
}

#[test]
fn sixty_connections_at_once_from_one_address_get_no_more_than_its_cap() {
    let upstream = Upstream::start();
    let proxy = proxy_with(
        &upstream,
        "header_timeout = \"30s\"\nmax_connections_per_ip = 3",
    )
    .start();
    // All 60 connect before any is served: the accept loop's check sees the
    // places still free, so the exact count is the tasks' permits.
    let connected: Vec<TcpStream> = (0..60)
        .filter_map(|_| TcpStream::connect(proxy.addr).ok())
        .collect();
    let statuses: Vec<Option<u16>> = std::thread::scope(|s| {
        let clients: Vec<_> = connected
            .iter()
            .map(|stream| {
                s.spawn(move || {
                    let mut stream = stream.try_clone().ok()?;
                    stream
                        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                        .ok()?;
                    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                    read_response(&mut BufReader::new(stream)).map(|r| r.0)
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().expect("client"))
            .collect()
    });
    let served = statuses.iter().filter(|s| **s == Some(200)).count();
    assert!(
        served <= 3,
        "{served} of 60 served at once from one address"
    );
    assert!(served >= 1, "none served: {statuses:?}");
    assert_eq!(proxy.metric("floodgate_connections_open"), served as f64);
    // Every connection not served was refused and counted (the proxy's own
    // readiness probe may add one).
    assert!(
        proxy.metric("floodgate_connections_refused_total{cap=\"per_ip\"}")
            >= (connected.len() - served) as f64
    );
    drop(connected);
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("floodgate_connections_open")
        == 0.0));
}

#[test]
fn the_total_cap_keeps_the_proxy_within_a_low_fd_limit() {
    let upstream = Upstream::start();
    // 200 descriptors: the derived cap is (200 - 64) / 2 = 68 connections.
    let proxy = proxy_with(
        &upstream,
        "header_timeout = \"30s\"\nmax_connections_per_ip = 20",
    )
    .start_wrapped(&["prlimit", "--nofile=200:200"]);
    assert!(proxy.log().contains("at most 68 open"), "{}", proxy.log());
    let mut held = Vec::new();
    // Connections come in waves of 10, each wave handled before the next:
    // a burst of refused connections would hold descriptors until each is
    // refused (see the note on bursts in docs/book/edge.md).
    let handled = |proxy: &Proxy| {
        proxy.metric("floodgate_connections_open")
            + proxy.metric("floodgate_connections_refused_total{cap=\"total\"}")
            + proxy.metric("floodgate_connections_refused_total{cap=\"per_ip\"}")
    };
    let mut attempts = 0.0;
    let mut wave = |from: &str, held: &mut Vec<TcpStream>| {
        for _ in 0..10 {
            if let Ok(s) = connect_from(from, proxy.addr) {
                held.push(s);
                attempts += 1.0;
            }
        }
        assert!(wait_until(Duration::from_secs(5), || handled(&proxy) == attempts));
    };
    // Three addresses take 20 each; each of them tries 100.
    for from in ["127.0.0.3", "127.0.0.4", "127.0.0.5"] {
        for _ in 0..10 {
            wave(from, &mut held);
        }
    }
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("floodgate_connections_open")
        == 60.0));
    // A legitimate client still gets in.
    let mut legit = connect_from("127.0.0.2", proxy.addr).expect("connect");
    legit
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .expect("send");
    assert_eq!(
        read_response(&mut BufReader::new(legit)).map(|r| r.0),
        Some(200)
    );
    // A fourth address fills the total; beyond it, connections close at once.
    for _ in 0..10 {
        wave("127.0.0.6", &mut held);
    }
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("floodgate_connections_open")
        == 68.0));
    assert!(proxy.metric("floodgate_connections_refused_total{cap=\"total\"}") > 0.0);
    let log = proxy.log();
    assert!(!log.contains("Too many open files"), "{log}");
    drop(held);
    assert!(wait_until(Duration::from_secs(5), || proxy.get("/").status == 200));
}

#[test]
fn pipelined_requests_are_answered_in_order_each_decided_on_its_own() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .limit(Limit::fixed_window("per-ip", "ip", 10, "1h"))
        .start();
    let mut s = TcpStream::connect(proxy.addr).expect("connect");
    let mut all = Vec::new();
    for i in 0..20 {
        all.extend_from_slice(format!("GET /item/{i} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
    }
    s.write_all(&all).expect("send all at once");
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(s.try_clone().expect("clone"));
    let statuses: Vec<u16> = (0..20)
        .map_while(|_| read_response(&mut reader).map(|r| r.0))
        .collect();
    let mut expected = vec![200; 10];
    expected.extend([429; 10]);
    assert_eq!(statuses, expected);
    let paths: Vec<String> = upstream.seen().into_iter().map(|s| s.path).collect();
    let in_order: Vec<String> = (0..10).map(|i| format!("/item/{i}")).collect();
    assert_eq!(paths, in_order);
}

#[test]
fn a_request_sent_early_behind_a_slow_post_waits_its_turn() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream);
    let mut s = TcpStream::connect(proxy.addr).expect("connect");
    s.write_all(b"POST /hold HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi")
        .expect("post");
    assert!(wait_until(Duration::from_secs(5), || upstream.count() == 1));
    // The client does not wait for the answer, which the upstream holds
    // until the early request has been sent.
    s.write_all(b"GET /next HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("early get");
    upstream.release();
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(s.try_clone().expect("clone"));
    let first = read_response(&mut reader).map(|r| r.0);
    let second = read_response(&mut reader).map(|r| r.0);
    assert_eq!((first, second), (Some(200), Some(200)));
    let seen: Vec<(String, String)> = upstream
        .seen()
        .into_iter()
        .map(|s| (s.method, s.path))
        .collect();
    assert_eq!(
        seen,
        [
            ("POST".to_string(), "/hold".to_string()),
            ("GET".to_string(), "/next".to_string())
        ],
        "the POST ran once"
    );
}

#[test]
fn ambiguous_framing_is_refused_and_never_forwarded() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream);
    for (raw, error) in [
        (
            &b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5, 5\r\n\r\nhello"[..],
            "bad_content_length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            "bad_content_length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            "conflicting_framing",
        ),
        (b"GET / HTTP/1.1\r\n\r\n", "missing_host"),
    ] {
        let r = raw_request(proxy.addr, raw);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(raw));
        assert!(
            r.body.starts_with(&format!("{{\"error\":\"{error}\"")),
            "{}",
            r.body
        );
    }
    assert_eq!(upstream.count(), 0);
    // HTTP/1.0 needs no Host; the upstream (spoken to in HTTP/1.1) gets one.
    let r = raw_request(proxy.addr, b"GET /old HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200);
    let seen = upstream.seen();
    let host = seen[0]
        .headers
        .iter()
        .find(|(k, _)| k == "host")
        .map(|(_, v)| v.clone());
    assert_eq!(host, Some(upstream.addr.to_string()));
}

#[test]
fn each_upstream_server_is_tried_at_most_once() {
    // Nothing listens on these: every connection is refused.
    let dead: Vec<SocketAddr> = (0..3).map(|_| local_addr()).collect();
    let proxy = ConfigBuilder::new(dead[0]).servers(&dead).start();
    let r = proxy.get("/?token=abc");
    assert_eq!(r.status, 502);
    assert!(wait_until(Duration::from_secs(2), || proxy
        .log()
        .contains("upstream failed")));
    let log = proxy.log();
    assert_eq!(log.matches("upstream failed").count(), 1, "{log}");
    assert!(log.contains("after 3 attempt(s)"), "{log}");
    assert!(!log.contains("token=abc"), "{log}");

    // Servers that accept nothing (a full backlog): the 504 comes after
    // each was given connect_timeout once.
    let holes: Vec<TcpListener> = (0..2).map(|_| blackhole()).collect();
    let servers: Vec<SocketAddr> = holes
        .iter()
        .map(|l| l.local_addr().expect("addr"))
        .collect();
    let proxy = ConfigBuilder::new(servers[0]).servers(&servers).start();
    let started = Instant::now();
    let r = proxy.get("/");
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{}", r.body);
    // 2 servers x 500 ms, plus slack; before: 16 attempts.
    assert!(took < Duration::from_millis(2500), "{took:?}");
    record(
        "upstream_retries",
        &format!("3 refusing servers: 502 after 3 attempts, one log line\n2 blackholed servers, connect_timeout 500ms: 504 after {took:?}\n"),
    );
}

/// A listening socket that never accepts, its backlog filled: further
/// connection attempts hang until the client gives up.
fn blackhole() -> TcpListener {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let local: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    socket.bind(&local.into()).expect("bind");
    socket.listen(0).expect("listen");
    let listener: TcpListener = socket.into();
    let addr = listener.local_addr().expect("addr");
    // The accept queue takes one or two before it drops SYNs.
    let fill: Vec<TcpStream> = (0..3)
        .filter_map(|_| {
            let s = socket2::Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
            s.set_nonblocking(true).ok()?;
            let _ = s.connect(&addr.into());
            Some(s.into())
        })
        .collect();
    std::mem::forget(fill);
    listener
}

#[test]
fn logs_never_carry_keys_query_strings_or_header_blocks() {
    let upstream = Upstream::start();
    let dead = local_addr();
    // Plain trace, and the module directives that would lift a per-crate cap.
    let proxy = ConfigBuilder::new(upstream.addr)
        .servers(&[dead, upstream.addr])
        .raw("[clients.api_keys]\n\"secret-key-4417\" = \"pro\"")
        .limit(Limit::fixed_window("per-account", "api_key", 1, "1h"))
        .env(
            "RUST_LOG",
            "trace,pingora_proxy::proxy_h1=trace,pingora_core::protocols=trace",
        )
        .start();
    let key = ("X-API-Key", "secret-key-4417");
    for _ in 0..3 {
        proxy.send("GET", "/a?session=query-secret-9931", &[key]);
    }
    // A bad head, a refused framing, a header block Pingora rejects.
    raw_request(
        proxy.addr,
        b"GET /b?session=query-secret-9931 HTTP/1.1\r\nHost: t\r\nX-API-Key: secret-key-4417\r\nContent-Length: 1, 2\r\n\r\n",
    );
    raw_request(
        proxy.addr,
        b"GET /c?session=query-secret-9931 HTTP/1.1\r\nX-API-Key: secret-key-4417\r\nBad Header\r\n\r\n",
    );
    let log = proxy.log();
    assert!(
        log.contains("rate limited"),
        "the suite logged something: {log}"
    );
    for secret in ["secret-key-4417", "query-secret-9931"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

#[test]
fn a_body_must_keep_moving() {
    let upstream = Upstream::start();
    let proxy = proxy_with(&upstream, "header_timeout = \"1s\"").start();
    let mut s = TcpStream::connect(proxy.addr).expect("connect");
    s.write_all(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n")
        .expect("head");
    let started = Instant::now();
    // One byte every 300 ms: far below 1 KiB/s.
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut closed_after = None;
    let mut buf = [0u8; 256];
    while started.elapsed() < Duration::from_secs(10) {
        if s.write_all(b"x").is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        if let Ok(0) = s.read(&mut buf) {
            closed_after = Some(started.elapsed());
            break;
        }
    }
    let took = closed_after.expect("closed");
    // header_timeout of grace, plus what the bytes sent bought (a few ms).
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(
        upstream.count(),
        0,
        "the body never completed, so nothing was forwarded whole"
    );
}

#[test]
fn a_client_that_never_reads_its_answers_is_let_go() {
    let upstream = Upstream::start();
    let proxy = proxy_with(&upstream, "keepalive_timeout = \"2s\"")
        .limit(Limit::fixed_window("one", "ip", 1, "1h"))
        .start();
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    // A small receive buffer fills fast, as a client that never reads.
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    socket.connect(&proxy.addr.into()).expect("connect");
    let mut s: TcpStream = socket.into();
    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
    let request = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n".repeat(200);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) {
        if let Err(e) = s.write_all(&request) {
            if e.kind() != std::io::ErrorKind::WouldBlock
                && e.kind() != std::io::ErrorKind::TimedOut
            {
                break;
            }
        }
        if proxy.metric("floodgate_connections_open") == 0.0
            && started.elapsed() > Duration::from_secs(1)
        {
            break;
        }
    }
    assert!(
        wait_until(Duration::from_secs(15), || proxy
            .metric("floodgate_connections_open")
            == 0.0),
        "the connection was closed"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn an_oversized_head_is_refused_with_431() {
    let upstream = Upstream::start();
    let proxy = Proxy::start(&upstream);
    let mut raw = b"GET / HTTP/1.1\r\nHost: t\r\n".to_vec();
    // 20 lines of 4 KB: few headers, a large head.
    for i in 0..20 {
        raw.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "a".repeat(4000)).as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    let r = raw_request(proxy.addr, &raw);
    assert_eq!(r.status, 431, "{}", r.body);
    assert_eq!(upstream.count(), 0);
    // A head of ordinary size is fine.
    assert_eq!(proxy.get("/").status, 200);
}

/// One request on a connection made from the local address `from`.
fn get_from(from: &str, to: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = connect_from(from, to).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    read_response(&mut BufReader::new(stream))
}

#[test]
fn the_admin_listener_has_its_own_cap_and_lifetime() {
    let upstream = Upstream::start();
    let proxy = proxy_with(&upstream, "header_timeout = \"2s\"").start();
    let admin = proxy.admin.expect("admin");
    // Idle connections from one address, reopened as they close: beyond
    // its own cap of 8, each is closed at once.
    let mut held: Vec<TcpStream> = (0..40)
        .filter_map(|_| connect_from("127.0.0.1", admin).ok())
        .collect();
    let closed_now = |held: &mut Vec<TcpStream>| {
        held.iter_mut()
            .map(|s| {
                let _ = s.set_nonblocking(true);
                matches!(s.read(&mut [0u8; 16]), Ok(0))
            })
            .filter(|closed| *closed)
            .count()
    };
    assert!(wait_until(Duration::from_secs(1), || closed_now(&mut held) == 32));
    // Another address's health check is answered at once.
    let asked = Instant::now();
    let probe = get_from("127.0.0.2", admin, "/healthz");
    let took = asked.elapsed();
    assert_eq!(probe.map(|(status, _)| status), Some(200));
    assert!(took < Duration::from_millis(100), "healthz took {took:?}");
    assert_eq!(
        get_from("127.0.0.2", admin, "/readyz").map(|r| r.0),
        Some(200)
    );
    // The proxy is unaffected.
    assert_eq!(proxy.get("/").status, 200);
    // Idle admin connections end after their lifetime; the admin serves again.
    let started = Instant::now();
    assert!(wait_until(Duration::from_secs(6), || proxy
        .admin_get("/healthz")
        .status
        == 200));
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(held);
}

/// Puts `addresses` on the loopback interface (IPv6 offers only `::1`
/// there, and the tests need peers in distinct networks), as root or
/// through sudo as `scripts/setup.sh` installs packages.
fn on_loopback(addresses: &[&str]) {
    for address in addresses {
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0\n"))
            .unwrap_or(false);
        let mut command = std::process::Command::new(if root { "ip" } else { "sudo" });
        if !root {
            command.arg("ip");
        }
        let added = command
            .args(["-6", "addr", "add", &format!("{address}/128"), "dev", "lo"])
            .output()
            .expect("ip (iproute2) runs");
        let said = String::from_utf8_lossy(&added.stderr);
        let already = said.contains("File exists") || said.contains("already assigned");
        assert!(
            added.status.success() || already,
            "adding {address} to lo: {said}"
        );
    }
}

#[test]
fn the_admin_listener_groups_ipv6_peers_by_the_clients_prefix() {
    // Two /64s of one /48, and another /48.
    let (first, second, elsewhere) = ("fd00:48:0:1::1", "fd00:48:0:2::1", "fd00:49::1");
    on_loopback(&[first, second, elsewhere]);
    let port = TcpListener::bind("[::]:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let upstream = Upstream::start();
    let _proxy = ConfigBuilder::new(upstream.addr)
        .admin_at(SocketAddr::new("::".parse().expect("address"), port))
        .server("header_timeout = \"5s\"")
        .raw("[clients]\nipv6_prefix = 48")
        .start();
    let admin = SocketAddr::new(first.parse().expect("address"), port);
    let mut held: Vec<TcpStream> = [first, second]
        .iter()
        .flat_map(|from| (0..8).map(move |_| connect_from(from, admin)))
        .filter_map(Result::ok)
        .collect();
    assert_eq!(held.len(), 16);
    let open = |held: &mut Vec<TcpStream>| {
        held.iter_mut()
            .map(|s| {
                let _ = s.set_nonblocking(true);
                matches!(s.read(&mut [0u8; 16]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .filter(|open| *open)
            .count()
    };
    // One group's cap of 8 over both /64s (a fixed /64 kept all 16).
    assert!(
        wait_until(Duration::from_secs(2), || open(&mut held) == 8),
        "{} open",
        open(&mut held)
    );
    // Another /48 is another group.
    assert_eq!(
        get_from(elsewhere, admin, "/healthz").map(|r| r.0),
        Some(200)
    );
    assert_eq!(open(&mut held), 8);
}
