//! `[upstream.protection]` end to end: the real binary in front of an
//! upstream that behaves like a fragile service (it serves `capacity`
//! requests at a time, `LATENCY` each, and queues the rest, so its latency
//! grows with load), driven by a closed loop of 8 x capacity clients, with
//! and without the protection in one run. 40 ms a request keeps the
//! proxy's own CPU out of what is measured on a loaded machine (debug
//! build, two cores).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const LATENCY: Duration = Duration::from_millis(40);

/// One test at a time: each drives hundreds of client threads against a
/// proxy whose CPU time its measurements depend on.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves `capacity` requests at a time, each for `LATENCY`; counts the
/// requests it holds (served or queued).
struct Fragile {
    addr: SocketAddr,
    capacity: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Fragile {
    fn start(capacity: usize) -> Fragile {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let fragile = Fragile {
            addr,
            capacity: Arc::new(AtomicUsize::new(capacity)),
            held: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let serving = Arc::new((Mutex::new(0usize), Condvar::new()));
        let (capacity, held, stop) = (
            fragile.capacity.clone(),
            fragile.held.clone(),
            fragile.stop.clone(),
        );
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (serving, capacity, held) = (serving.clone(), capacity.clone(), held.clone());
                thread::spawn(move || serve(stream, &serving, &capacity, &held));
            }
        });
        fragile
    }

    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

impl Drop for Fragile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(
    stream: TcpStream,
    serving: &(Mutex<usize>, Condvar),
    capacity: &AtomicUsize,
    held: &AtomicUsize,
) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        held.fetch_add(1, Ordering::SeqCst);
        {
            let (count, freed) = serving;
            let mut count = count.lock().unwrap_or_else(|e| e.into_inner());
            while *count >= capacity.load(Ordering::SeqCst) {
                count = freed.wait(count).unwrap_or_else(|e| e.into_inner());
            }
            *count += 1;
        }
        thread::sleep(LATENCY);
        {
            let (count, freed) = serving;
            *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            freed.notify_one();
        }
        held.fetch_sub(1, Ordering::SeqCst);
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

/// What a closed loop of clients saw.
#[derive(Default)]
struct Seen {
    latencies: Vec<Duration>,
    shed: usize,
    other: usize,
}

impl Seen {
    fn p99(&mut self) -> Duration {
        self.latencies.sort();
        let at = (self.latencies.len() * 99 / 100).min(self.latencies.len().saturating_sub(1));
        self.latencies.get(at).copied().unwrap_or_default()
    }

    fn success(&self) -> f64 {
        let all = self.latencies.len() + self.shed + self.other;
        self.latencies.len() as f64 / all.max(1) as f64
    }
}

/// `clients` keep-alive clients sending one request after another with
/// `key` for `run`; what each class saw, and the upstream's average held.
fn closed_loop(
    proxy: SocketAddr,
    fragile: &Fragile,
    classes: &[(&str, usize)],
    run: Duration,
) -> (Vec<Seen>, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<Vec<thread::JoinHandle<Seen>>> = classes
        .iter()
        .map(|&(key, clients)| {
            (0..clients)
                .map(|_| {
                    let (stop, key) = (stop.clone(), key.to_string());
                    thread::spawn(move || client(proxy, &key, &stop))
                })
                .collect()
        })
        .collect();
    let started = Instant::now();
    let (mut sum, mut samples) = (0usize, 0usize);
    while started.elapsed() < run {
        thread::sleep(Duration::from_millis(5));
        sum += fragile.held();
        samples += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let seen = handles
        .into_iter()
        .map(|class| {
            let mut all = Seen::default();
            for h in class {
                let one = h.join().expect("client");
                all.latencies.extend(one.latencies);
                all.shed += one.shed;
                all.other += one.other;
            }
            all
        })
        .collect();
    (seen, sum as f64 / samples.max(1) as f64)
}

fn client(proxy: SocketAddr, key: &str, stop: &AtomicBool) -> Seen {
    let mut seen = Seen::default();
    // The internal tier is the address 127.0.0.2's.
    let from: std::net::IpAddr = if key == "internal" {
        [127, 0, 0, 2].into()
    } else {
        [127, 0, 0, 1].into()
    };
    let connect = || {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
        socket.bind(&SocketAddr::new(from, 0).into()).ok()?;
        socket.connect(&proxy.into()).ok()?;
        let s: TcpStream = socket.into();
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        Some(s)
    };
    let Some(mut stream) = connect() else {
        return seen;
    };
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let request = format!("GET / HTTP/1.1\r\nHost: t\r\nX-API-Key: {key}\r\n\r\n");
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        let answer = stream
            .write_all(request.as_bytes())
            .ok()
            .and_then(|()| read_response(&mut reader))
            .map(|(status, _)| status);
        match answer {
            Some(200) => seen.latencies.push(sent.elapsed()),
            Some(503) => {
                seen.shed += 1;
                // A client backs off a little (Retry-After says a second;
                // this load wants to keep knocking, not to flood).
                thread::sleep(Duration::from_millis(25));
            }
            Some(_) => seen.other += 1,
            None => {
                seen.other += 1;
                let Some(s) = connect() else { break };
                stream = s;
                reader = BufReader::new(stream.try_clone().expect("clone"));
            }
        }
    }
    seen
}

fn tiers(config: ConfigBuilder) -> ConfigBuilder {
    config.admin().raw(
        "[clients]\napi_key_header = \"X-API-Key\"\ninternal = [\"127.0.0.2/32\"]\n[clients.api_keys]\n\"pro-key\" = \"pro\"\n\"free-key\" = \"free\"\n",
    )
}

const PROTECTION: &str =
    "[upstream.protection]\nmin = 1\nmax = 200\ninitial = 8\nwindow = \"200ms\"\n";

#[test]
fn eight_times_its_capacity_keeps_the_upstream_near_it_and_busy() {
    let _alone = alone();
    let capacity = 8;
    let fragile = Fragile::start(capacity);
    let bare = tiers(ConfigBuilder::new(fragile.addr)).start();
    let protected = tiers(ConfigBuilder::new(fragile.addr))
        .raw(&format!(
            "{PROTECTION}priority = [\"internal\", \"pro\", \"free\"]\n"
        ))
        .start();
    let run = Duration::from_secs(4);
    let (mut without, held_without) = closed_loop(bare.addr, &fragile, &[("free-key", 64)], run);
    // The limit learns for a second, then the run that counts.
    closed_loop(
        protected.addr,
        &fragile,
        &[("free-key", 64)],
        Duration::from_secs(1),
    );
    let (mut with, held_with) = closed_loop(protected.addr, &fragile, &[("free-key", 64)], run);
    let (without, with) = (&mut without[0], &mut with[0]);
    // Capacity: 8 at 40 ms, 200 a second.
    let capacity_per_s = capacity as f64 / LATENCY.as_secs_f64();
    let rate = |seen: &Seen| seen.latencies.len() as f64 / run.as_secs_f64();
    assert!(
        held_without > 6.0 * capacity as f64,
        "without: {held_without} held"
    );
    assert!(
        without.p99() > 5 * LATENCY,
        "without: p99 {:?}",
        without.p99()
    );
    assert!(
        held_with <= 2.0 * capacity as f64,
        "with: {held_with} held at the upstream, capacity {capacity}"
    );
    assert!(with.p99() <= 4 * LATENCY, "with: p99 {:?}", with.p99());
    assert!(
        rate(with) >= 0.9 * capacity_per_s,
        "with: {} a second of {capacity_per_s}; limit {}, min {}, latency {}",
        rate(with),
        protected.metric("floodgate_protection_limit"),
        protected.metric("floodgate_protection_min_latency_seconds"),
        protected.metric("floodgate_protection_latency_seconds")
    );
    assert_eq!(with.other, 0);
    assert!(with.shed > 0);
    assert!(protected.metric("floodgate_protection_shed_total{priority=\"free\"}") > 0.0);
    let limit = protected.metric("floodgate_protection_limit");
    assert!(
        (1.0..=2.0 * capacity as f64).contains(&limit),
        "limit {limit}"
    );
}

#[test]
fn free_absorbs_the_shedding_and_pro_and_internal_are_served() {
    let _alone = alone();
    let capacity = 8;
    let fragile = Fragile::start(capacity);
    let protected = tiers(ConfigBuilder::new(fragile.addr))
        .raw(&format!(
            "{PROTECTION}priority = [\"internal\", \"pro\", \"free\"]\nreserve = 0.6\n"
        ))
        .start();
    closed_loop(
        protected.addr,
        &fragile,
        &[("free-key", 64)],
        Duration::from_secs(1),
    );
    let (seen, held) = closed_loop(
        protected.addr,
        &fragile,
        &[("free-key", 64), ("pro-key", 2), ("internal", 1)],
        Duration::from_secs(4),
    );
    let (free, pro, internal) = (&seen[0], &seen[1], &seen[2]);
    assert!(
        pro.success() >= 0.95,
        "pro: {} of its requests served",
        pro.success()
    );
    assert_eq!(internal.shed, 0, "internal shed {} times", internal.shed);
    assert!(
        free.shed > 10 * pro.shed.max(1),
        "free shed {}, pro {}",
        free.shed,
        pro.shed
    );
    assert!(held <= 2.5 * capacity as f64, "{held} held");
}

#[test]
fn a_refusal_says_the_upstream_is_protected_and_when_to_come_back() {
    let _alone = alone();
    let fragile = Fragile::start(1);
    let token = common::admin_token::TokenFile::new();
    let protected = tiers(ConfigBuilder::new(fragile.addr))
        .raw("[upstream.protection]\nmin = 1\nmax = 1\ninitial = 1\nretry_after = \"2s\"\n")
        .raw(&token.section())
        .start();
    let answers = burst(
        &[protected.addr],
        20,
        "GET",
        "/",
        &[("X-API-Key", "free-key")],
    );
    let shed: Vec<&Response> = answers.iter().filter(|r| r.status == 503).collect();
    assert!(!shed.is_empty());
    for r in &shed {
        assert_eq!(r.header("retry-after"), Some("2"));
        assert!(
            r.body.contains("\"error\":\"upstream_protected\""),
            "{}",
            r.body
        );
    }
    assert_eq!(count_status(&answers, 200) + shed.len(), 20);
    // One log line for the burst's sheds, told apart from limits' refusals.
    assert!(wait_until(Duration::from_secs(2), || protected
        .log()
        .contains("upstream protected: 1 request(s) answered 503")));
    assert_eq!(
        protected.log().matches("upstream protected:").count(),
        1,
        "{}",
        protected.log()
    );
    // The status page's line.
    let bearer = format!("Bearer {}", common::admin_token::TOKEN);
    let status = request(
        protected.admin.expect("admin"),
        "GET",
        "/v1/status",
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(status.status, 200, "{}", status.body);
    let status: serde_json::Value = serde_json::from_str(&status.body).expect("JSON");
    assert_eq!(status["protection"]["limit"], 1, "{status}");
    assert_eq!(status["protection"]["shed"], shed.len(), "{status}");
    // Not a refusal by a limit: no 429 was counted.
    assert_eq!(
        protected.metric("floodgate_requests_total{class=\"4xx\"}"),
        0.0
    );
}

#[test]
fn the_limit_follows_a_capacity_that_doubles_then_halves_within_a_second() {
    let _alone = alone();
    let fragile = Fragile::start(4);
    let protected = tiers(ConfigBuilder::new(fragile.addr))
        .raw(PROTECTION)
        .start();
    let run = Duration::from_secs(3);
    closed_loop(
        protected.addr,
        &fragile,
        &[("free-key", 32)],
        Duration::from_secs(1),
    );
    for capacity in [8, 4] {
        fragile.capacity.store(capacity, Ordering::SeqCst);
        // A second to follow, then the run that counts.
        closed_loop(
            protected.addr,
            &fragile,
            &[("free-key", 8 * capacity)],
            Duration::from_secs(1),
        );
        let (seen, held) =
            closed_loop(protected.addr, &fragile, &[("free-key", 8 * capacity)], run);
        let rate = seen[0].latencies.len() as f64 / run.as_secs_f64();
        let capacity_per_s = capacity as f64 / LATENCY.as_secs_f64();
        assert!(
            held <= 2.0 * capacity as f64,
            "capacity {capacity}: {held} held"
        );
        assert!(
            rate >= 0.85 * capacity_per_s,
            "capacity {capacity}: {rate} a second of {capacity_per_s}"
        );
    }
}

/// One request at a time at the upstream, a queue of `max` waiting up to
/// `timeout`.
fn queued(fragile: &Fragile, max: usize, timeout: &str) -> Proxy {
    tiers(ConfigBuilder::new(fragile.addr))
        .raw(&format!(
            "[upstream.protection]\nmin = 1\nmax = 1\ninitial = 1\npriority = [\"pro\", \"free\"]\nreserve = 0.0\nqueue = {{ max = {max}, timeout = \"{timeout}\" }}\n"
        ))
        .start()
}

#[test]
fn a_short_queue_holds_a_burst_and_serves_its_highest_priority_first() {
    let _alone = alone();
    let fragile = Fragile::start(1);
    // 8 at once, one place: all wait their turn (8 x 40 ms, within 2 s).
    let proxy = queued(&fragile, 10, "2s");
    let answers = burst(&[proxy.addr], 8, "GET", "/", &[("X-API-Key", "free-key")]);
    assert_eq!(count_status(&answers, 200), 8);
    // Past the queue's length, refused at once.
    let answers = burst(&[proxy.addr], 30, "GET", "/", &[("X-API-Key", "free-key")]);
    let served = count_status(&answers, 200);
    assert_eq!(served + count_status(&answers, 503), 30);
    assert!((8..=16).contains(&served), "{served} served of 30");
    // A pro request that comes after ten free ones waiting goes first.
    let free: Vec<_> = (0..10)
        .map(|_| {
            let addr = proxy.addr;
            thread::spawn(move || {
                let asked = Instant::now();
                let r = request(addr, "GET", "/", &[("X-API-Key", "free-key")], b"");
                (r.status, asked.elapsed())
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || proxy
            .metric("floodgate_protection_queued")
            >= 9.0),
        "{} queued",
        proxy.metric("floodgate_protection_queued")
    );
    let asked = Instant::now();
    let pro = request(proxy.addr, "GET", "/", &[("X-API-Key", "pro-key")], b"");
    let pro_took = asked.elapsed();
    assert_eq!(pro.status, 200);
    let free: Vec<(u16, Duration)> = free.into_iter().map(|h| h.join().expect("free")).collect();
    assert!(free.iter().all(|(status, _)| *status == 200));
    let slowest_free = free.iter().map(|(_, took)| *took).max().unwrap_or_default();
    // The pro request waited for the one being served, not for the nine.
    assert!(pro_took < 4 * LATENCY, "pro took {pro_took:?}");
    assert!(
        slowest_free > 8 * LATENCY,
        "the last free took {slowest_free:?}"
    );
}

#[test]
fn a_wait_that_runs_out_is_refused_in_its_time() {
    let _alone = alone();
    let fragile = Fragile::start(1);
    let proxy = queued(&fragile, 100, "50ms");
    let asked = Instant::now();
    let answers = burst(&[proxy.addr], 20, "GET", "/", &[("X-API-Key", "free-key")]);
    let took = asked.elapsed();
    let shed: Vec<&Response> = answers.iter().filter(|r| r.status == 503).collect();
    // 40 ms each: one at once, one more within the 50 ms wait.
    assert!(
        count_status(&answers, 200) <= 3,
        "{}",
        count_status(&answers, 200)
    );
    assert_eq!(count_status(&answers, 200) + shed.len(), 20);
    assert!(shed.iter().all(|r| r.body.contains("upstream_protected")));
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(proxy.metric("floodgate_protection_queued"), 0.0);
}

#[test]
fn a_class_by_match_ranks_its_requests_whatever_their_tier() {
    let _alone = alone();
    let fragile = Fragile::start(1);
    let proxy = tiers(ConfigBuilder::new(fragile.addr))
        .raw(
            "[upstream.protection]\nmin = 1\nmax = 1\ninitial = 1\nreserve = 0.0\npriority = [{ name = \"checkout\", match = { paths = [\"/checkout/*\"] } }, \"pro\"]\nqueue = { max = 20, timeout = \"5s\" }\n",
        )
        .start();
    let waiting: Vec<_> = (0..10)
        .map(|_| {
            let addr = proxy.addr;
            thread::spawn(move || {
                request(addr, "GET", "/", &[("X-API-Key", "pro-key")], b"").status
            })
        })
        .collect();
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("floodgate_protection_queued")
        >= 9.0));
    // A free client's checkout goes before pro's other requests.
    let asked = Instant::now();
    let checkout = request(
        proxy.addr,
        "GET",
        "/checkout/42",
        &[("X-API-Key", "free-key")],
        b"",
    );
    assert_eq!(checkout.status, 200);
    assert!(
        asked.elapsed() < 4 * LATENCY,
        "checkout took {:?}",
        asked.elapsed()
    );
    assert!(waiting.into_iter().all(|h| h.join().expect("pro") == 200));
}
