//! Requests their clients give up on, and bodies that do not come: a client
//! that resets a stream or its connection once its request is in cannot
//! free its slot or its place under the per-address cap while the upstream
//! still works on it, nor put more work in flight at the upstream than the
//! cap; a slot holder's body has a deadline of its own; an HTTP/2 body is
//! held to its floor from the stream's head. Real clients: the h2 crate and
//! plain sockets.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{wait_until, ConfigBuilder, Limit, Upstream};

/// An HTTP/2 client (prior knowledge) whose connection a runtime drives.
struct H2 {
    runtime: tokio::runtime::Runtime,
    client: h2::client::SendRequest<Bytes>,
}

impl H2 {
    fn connect(addr: SocketAddr) -> H2 {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let client = runtime.block_on(async {
            let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
            tokio::spawn(async move {
                let _ = connection.await;
            });
            client
        });
        H2 { runtime, client }
    }

    /// Sends a request's head (and its end, with `whole`); its response
    /// and its body's stream.
    fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        whole: bool,
    ) -> Option<(h2::client::ResponseFuture, h2::SendStream<Bytes>)> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("http://test{path}"));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request.body(()).expect("request");
        let client = self.client.clone();
        self.runtime.block_on(async move {
            let mut client = client.ready().await.ok()?;
            client.send_request(request, whole).ok()
        })
    }

    /// Waits for a response's status (None: the stream or the connection
    /// ended without one).
    fn status(&self, response: h2::client::ResponseFuture) -> Option<u16> {
        self.runtime.block_on(async move {
            tokio::time::timeout(Duration::from_secs(15), response)
                .await
                .ok()?
                .ok()
                .map(|r| r.status().as_u16())
        })
    }
}

/// One request at a time per address, its slot leased for 30 s; HTTP/2
/// with prior knowledge on the plain listener.
fn one_at_a_time(upstream: &Upstream) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .server("h2c = true")
        .limit(Limit::concurrency("one-at-a-time", "ip", 1, "30s"))
}

/// While the upstream works on a request whose client is gone, the slot is
/// still taken (0.5 s of refusals); once it answers, the slot is free
/// within 100 ms, not when its 30 s lease would have ended.
fn slot_follows_the_upstream(proxy: &common::Proxy, upstream: &Upstream) {
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(500) {
        assert_eq!(
            proxy.get("/meanwhile").status,
            429,
            "the upstream still works on it"
        );
    }
    let answered = Instant::now();
    upstream.release();
    assert!(wait_until(Duration::from_secs(5), || proxy
        .get("/after")
        .status
        == 200));
    let freed_after = answered.elapsed();
    assert!(
        freed_after < Duration::from_millis(100),
        "freed {freed_after:?} after the upstream answered (the lease is 30 s)"
    );
}

/// HTTP/1: a client that resets its connection once its request is in.
#[test]
fn a_reset_connection_keeps_its_slot_until_the_upstream_answers_and_no_longer() {
    let upstream = Upstream::start();
    let proxy = one_at_a_time(&upstream).start();
    let mut client = TcpStream::connect(proxy.addr).expect("connect");
    client
        .write_all(b"GET /hold/work HTTP/1.1\r\nHost: test\r\n\r\n")
        .expect("send");
    assert!(wait_until(Duration::from_secs(10), || upstream.holding() == 1));
    // A reset, not a polite close: the connection is gone at once.
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(client);
    slot_follows_the_upstream(&proxy, &upstream);
}

#[test]
fn a_reset_stream_keeps_its_slot_until_the_upstream_answers_and_no_longer() {
    let upstream = Upstream::start();
    let proxy = one_at_a_time(&upstream).start();
    let mut h2 = H2::connect(proxy.addr);
    let (response, mut stream) = h2.send("GET", "/hold/work", &[], true).expect("sent");
    assert!(wait_until(Duration::from_secs(10), || upstream.holding() == 1));
    stream.send_reset(h2::Reason::CANCEL);
    drop(response);
    slot_follows_the_upstream(&proxy, &upstream);
}

#[test]
fn a_closed_http2_connection_keeps_its_slot_until_the_upstream_answers() {
    let upstream = Upstream::start();
    let proxy = one_at_a_time(&upstream).start();
    let mut h2 = H2::connect(proxy.addr);
    let sent = h2.send("GET", "/hold/work", &[], true).expect("sent");
    assert!(wait_until(Duration::from_secs(10), || upstream.holding() == 1));
    // The whole connection goes: its runtime, socket and all.
    drop(sent);
    drop(h2);
    slot_follows_the_upstream(&proxy, &upstream);
}

/// 2,000 streams for a request the upstream holds, opened 32 at a time
/// on one connection and each reset once it has been decided (at the
/// upstream, or refused): never more at the upstream than the per-address
/// cap, since a reset request counts until its answer. (Each reset freed
/// its place at once before: 16 more reached the upstream per batch.)
#[test]
fn resets_put_no_more_in_flight_at_the_upstream_than_the_cap() {
    use std::sync::atomic::AtomicUsize;
    let upstream = Upstream::start();
    // The upstream's read timeout bounds how long a request whose exchange
    // was cut anyway (a connection the h2 server tears down for too many
    // refused streams) still counts: longer than this test.
    let proxy = ConfigBuilder::new(upstream.addr)
        .server("h2c = true\nmax_connections_per_ip = 16")
        .read_timeout("60s")
        .start();
    let mut h2 = H2::connect(proxy.addr);
    let (mut sent, mut connections) = (0, 1);
    let refused = Arc::new(AtomicUsize::new(0));
    while sent < 2000 {
        let before = (upstream.heads(), refused.load(Ordering::SeqCst));
        let mut batch = Vec::new();
        for _ in 0..32 {
            let Some((response, stream)) = h2.send("GET", &format!("/hold/{sent}"), &[], true)
            else {
                break;
            };
            // Refused: by floodgate (429) or by the h2 server (a reset).
            let refused = refused.clone();
            h2.runtime.spawn(async move {
                let _ = response.await;
                refused.fetch_add(1, Ordering::SeqCst);
            });
            batch.push(stream);
            sent += 1;
        }
        if batch.is_empty() {
            // Told to go away (too many streams refused): the attacker
            // comes back on a new connection.
            assert!(
                connections < 50,
                "{connections} connections for {sent} streams"
            );
            h2 = H2::connect(proxy.addr);
            connections += 1;
            continue;
        }
        // Every stream of the batch decided: at the upstream, or refused.
        wait_until(Duration::from_secs(5), || {
            upstream.heads() - before.0 + refused.load(Ordering::SeqCst) - before.1 >= batch.len()
        });
        for mut stream in batch {
            stream.send_reset(h2::Reason::CANCEL);
        }
    }
    let most = upstream.most_held();
    upstream.release();
    // A request whose exchange was cut on its way there keeps its place
    // unused until the read timeout, so fewer than 16 may be there. Never
    // more.
    assert!(
        (1..=16).contains(&most),
        "{most} requests at the upstream at once, over {connections} connection(s)"
    );
    // The proxy serves as before.
    assert!(wait_until(Duration::from_secs(5), || proxy.get("/").status == 200));
}

/// The same with HTTP/1: connections opened 40 at a time, each sending a
/// request the upstream holds, closed once decided (at the upstream, or
/// refused at the door).
#[test]
fn hang_ups_put_no_more_in_flight_at_the_upstream_than_the_cap() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .server("max_connections_per_ip = 16")
        .start();
    let refused_at_the_door = |c: &TcpStream| {
        let _ = c.set_nonblocking(true);
        let (mut reader, mut byte) = (c, [0u8; 1]);
        match std::io::Read::read(&mut reader, &mut byte) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    };
    for round in 0..12 {
        let heads = upstream.heads();
        let batch: Vec<TcpStream> = (0..40)
            .filter_map(|i| {
                let mut c = TcpStream::connect(proxy.addr).ok()?;
                write!(c, "GET /hold/{round}-{i} HTTP/1.1\r\nHost: test\r\n\r\n").ok()?;
                Some(c)
            })
            .collect();
        wait_until(Duration::from_secs(5), || {
            let refused = batch.iter().filter(|c| refused_at_the_door(c)).count();
            upstream.heads() - heads + refused >= batch.len()
        });
        drop(batch);
    }
    let most = upstream.most_held();
    upstream.release();
    assert_eq!(most, 16, "requests at the upstream at once");
    assert!(wait_until(Duration::from_secs(5), || proxy.get("/").status == 200));
}

/// A body sent a little faster than the floor (1,200 B/s of 10 MB, 2.3
/// hours) holds a slot no longer than `slot_body_timeout`.
#[test]
fn a_slot_holders_body_has_a_deadline_of_its_own_on_http1() {
    let upstream = Upstream::start();
    let proxy = one_at_a_time(&upstream)
        .server("slot_body_timeout = \"1s\"")
        .start();
    let mut upload = TcpStream::connect(proxy.addr).expect("connect");
    upload
        .write_all(b"POST /upload HTTP/1.1\r\nHost: test\r\nContent-Length: 10000000\r\n\r\n")
        .expect("head");
    let stop = Arc::new(AtomicBool::new(false));
    // The client's pace, the fault under test: 120 bytes every 100 ms.
    let drip = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            while !stop.load(Ordering::SeqCst) && upload.write_all(&[b'x'; 120]).is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
            started.elapsed()
        })
    };
    assert!(wait_until(Duration::from_secs(5), || upstream.heads() == 1));
    let held = Instant::now();
    assert_eq!(proxy.get("/other").status, 429, "the upload holds the slot");
    assert!(wait_until(Duration::from_secs(10), || proxy
        .get("/other")
        .status
        == 200));
    let freed = held.elapsed();
    stop.store(true, Ordering::SeqCst);
    drip.join().expect("drip");
    assert!(
        freed < Duration::from_secs(3),
        "the upload held its slot {freed:?} (slot_body_timeout 1 s)"
    );
}

/// On HTTP/2 too, and a stream that sends no DATA at all is cut at its
/// floor from its head, not at the upstream's read timeout.
#[test]
fn http2_bodies_have_their_floor_from_the_head_and_a_slot_holders_deadline() {
    let upstream = Upstream::start();
    let proxy = one_at_a_time(&upstream)
        .server("slot_body_timeout = \"1s\"\nheader_timeout = \"1s\"")
        .read_timeout("30s")
        .start();
    let mut h2 = H2::connect(proxy.addr);
    // A slot holder trickling its body above the floor.
    let (response, mut body) = h2
        .send("POST", "/upload", &[("content-length", "10000000")], false)
        .expect("sent");
    let started = Instant::now();
    let feeding = h2.runtime.spawn(async move {
        for _ in 0..100 {
            body.reserve_capacity(200);
            if body.send_data(Bytes::from(vec![b'x'; 200]), false).is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert_eq!(h2.status(response), None, "the stream is cut");
    let cut_after = started.elapsed();
    assert!(
        cut_after < Duration::from_secs(3),
        "cut after {cut_after:?}"
    );
    feeding.abort();
    assert!(wait_until(Duration::from_secs(5), || proxy
        .get("/free")
        .status
        == 200));
    // A request that sends its head and nothing more: cut at the floor
    // (header_timeout of grace), not held until read_timeout (30 s).
    let unlimited = ConfigBuilder::new(upstream.addr)
        .server("h2c = true\nheader_timeout = \"1s\"")
        .read_timeout("30s")
        .start();
    let mut h2 = H2::connect(unlimited.addr);
    let (silent, _body) = h2
        .send(
            "POST",
            "/silent",
            &[
                ("content-type", "application/grpc"),
                ("content-length", "100"),
            ],
            false,
        )
        .expect("sent");
    let started = Instant::now();
    assert_eq!(h2.status(silent), None, "the stream is cut");
    let cut_after = started.elapsed();
    assert!(
        cut_after >= Duration::from_millis(900) && cut_after < Duration::from_secs(4),
        "cut after {cut_after:?}"
    );
}

/// The body floor is lifted only where the config says the route is gRPC,
/// whatever content-type a client claims.
#[test]
fn only_configured_grpc_routes_may_stream_slowly() {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .server("h2c = true\nheader_timeout = \"1s\"")
        .read_timeout("30s")
        .upstream("grpc_paths = [\"/chat.Chat/*\"]")
        .start();
    let mut h2 = H2::connect(proxy.addr);
    // The upstream waits for bodies of this length.
    let grpc = [
        ("content-type", "application/grpc"),
        ("content-length", "3"),
    ];
    let (claimed, _a) = h2
        .send("POST", "/other.Svc/Upload", &grpc, false)
        .expect("sent");
    let (streaming, mut b) = h2
        .send("POST", "/chat.Chat/Talk", &grpc, false)
        .expect("sent");
    assert_eq!(
        h2.status(claimed),
        None,
        "a claim alone does not lift the floor"
    );
    let cut = "floodgate_idle_timeouts_total";
    assert!(wait_until(Duration::from_secs(5), || proxy.metric(cut) == 1.0));
    // The configured route's call is still open: it ends when its client
    // ends it, and is answered.
    b.send_data(Bytes::from_static(b"bye"), true)
        .expect("end the call");
    assert_eq!(h2.status(streaming), Some(200));
    assert_eq!(proxy.metric(cut), 1.0);
}
