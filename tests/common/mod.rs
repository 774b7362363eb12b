//! Test parts: a real upstream that counts what reaches it, the real
//! floodgate binary on a free port, and a plain HTTP/1.1 client.
#![allow(dead_code)]

pub mod admin_token;
mod config;
pub mod distant;
pub mod keys;
pub mod load;
pub mod otlp;
pub mod redis_server;

// Not every test file builds a config.
#[allow(unused_imports)]
pub use config::{ConfigBuilder, Limit};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// The header names as they were spelled on the wire, in order.
    pub names_as_sent: Vec<String>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

/// An HTTP/1.1 server on 127.0.0.1 answering 200 "ok", recording every
/// request. A request for a path under `/hold` is recorded at once and
/// answered only after `release` (or when the upstream is dropped): a request
/// kept in flight for exactly as long as a test needs.
pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    gate: Arc<Gate>,
}

/// Opened once, for good. Counts the requests waiting at it, and (what
/// tests wait for before they cut a body off) the request heads read.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    waiting: AtomicUsize,
    most_waiting: AtomicUsize,
    heads: AtomicUsize,
}

impl Gate {
    fn open(&self) {
        if let Ok(mut open) = self.open.lock() {
            *open = true;
        }
        self.opened.notify_all();
    }

    fn wait(&self) {
        let now = self.waiting.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_waiting.fetch_max(now, Ordering::SeqCst);
        if let Ok(mut open) = self.open.lock() {
            while !*open {
                open = match self.opened.wait(open) {
                    Ok(open) => open,
                    Err(_) => break,
                };
            }
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(Gate::default());
        let (seen2, stop2, gate2) = (seen.clone(), stop.clone(), gate.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (seen, gate) = (seen2.clone(), gate2.clone());
                thread::spawn(move || serve_upstream(stream, seen, gate));
            }
        });
        Upstream {
            addr,
            seen,
            stop,
            gate,
        }
    }

    /// Answers the requests held under `/hold`, and from now on answers
    /// such requests at once.
    pub fn release(&self) {
        self.gate.open();
    }

    pub fn count(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Requests held under `/hold` right now.
    pub fn holding(&self) -> usize {
        self.gate.waiting.load(Ordering::SeqCst)
    }

    /// Request heads read so far, whether their bodies came or not.
    pub fn heads(&self) -> usize {
        self.gate.heads.load(Ordering::SeqCst)
    }

    /// The most requests ever held under `/hold` at once.
    pub fn most_held(&self) -> usize {
        self.gate.most_waiting.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn reset(&self) {
        if let Ok(mut s) = self.seen.lock() {
            s.clear();
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.gate.open();
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_upstream(stream: TcpStream, seen: Arc<Mutex<Vec<Seen>>>, gate: Arc<Gate>) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        let Some(line) = read_line_lossy(&mut reader) else {
            return;
        };
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        let mut names_as_sent = Vec::new();
        let mut content_length = 0usize;
        let mut chunked = false;
        let mut answer_status: Option<u16> = None;
        let mut answer_headers = String::new();
        let mut interim: Option<u16> = None;
        loop {
            let Some(h) = read_line_lossy(&mut reader) else {
                return;
            };
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                names_as_sent.push(k.trim().to_string());
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
                if k == "content-length" {
                    content_length = v.parse().unwrap_or(0);
                }
                if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                    chunked = true;
                }
                if k == "x-answer-status" {
                    answer_status = v.parse::<u16>().ok();
                }
                // `X-Answer-Header: Name: value` puts that header in the answer.
                // `X-Answer-Interim: 100` sends that 1xx before the answer.
                if k == "x-answer-interim" {
                    interim = v.parse::<u16>().ok();
                }
                if k == "x-answer-header" {
                    answer_headers.push_str(&v);
                    answer_headers.push_str("\r\n");
                }
                headers.push((k, v));
            }
        }
        gate.heads.fetch_add(1, Ordering::SeqCst);
        if let Some(code) = interim {
            let head = format!("HTTP/1.1 {code} Interim\r\n\r\n");
            if writer.write_all(head.as_bytes()).is_err() {
                return;
            }
        }
        let body = if chunked {
            match read_chunked(&mut reader) {
                Some(body) => body,
                None => return,
            }
        } else {
            let mut body = vec![0u8; content_length];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            body
        };
        if let Ok(mut s) = seen.lock() {
            s.push(Seen {
                at: Instant::now(),
                method,
                path: path.clone(),
                headers,
                names_as_sent,
                body,
            });
        }
        if path.starts_with("/hold") {
            gate.wait();
        }
        // A test chooses the answer's status with `X-Answer-Status`, and
        // its headers with `X-Answer-Header`.
        let status = answer_status.unwrap_or(200);
        let reply = format!(
            "HTTP/1.1 {status} Test\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n{answer_headers}\r\nok"
        );
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// A chunked body, its chunks joined (extensions and trailers skipped).
fn read_chunked(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line_lossy(reader)?;
        let size = line.split(';').next()?.trim();
        let size = usize::from_str_radix(size, 16).ok()?;
        if size == 0 {
            // Trailers, up to the blank line.
            while !read_line_lossy(reader)?.trim_end().is_empty() {}
            return Some(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).ok()?;
        read_line_lossy(reader)?;
    }
}

/// Header bytes need not be UTF-8; the upstream must still answer.
fn read_line_lossy(reader: &mut impl BufRead) -> Option<String> {
    let mut bytes = Vec::new();
    match reader.read_until(b'\n', &mut bytes) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// A port nobody listens on right now, and never handed out before in
/// this process: the kernel may give a port back to the next bind of port
/// 0 once it is closed, and two proxies told the same port would both bind
/// it (floodgate's listeners set SO_REUSEPORT) and share its connections,
/// each test then talking to the other's proxy now and then.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// An address on 127.0.0.1 nobody listens on right now.
pub fn local_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

static DIRS: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory for one test's files.
pub fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "floodgate-test-{}-{}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Runs `openssl` in `dir`; the test fails if it does.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "openssl {args:?}");
}

/// A fresh CA (`ca.crt`) and a server certificate it signed (`server.crt`,
/// `server.key`) for localhost and 127.0.0.1, made in `dir` by `openssl`.
pub fn make_certificates(dir: &std::path::Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=floodgate test CA",
        ],
    );
    make_named_certificate(dir, "server", "localhost", "IP:127.0.0.1,DNS:localhost");
}

/// Another certificate in `dir`, signed by the CA `make_certificates` made
/// there: `<stem>.crt` and `<stem>.key`, for `subject_alt_name` (e.g.
/// `"DNS:api.example.org"`) with common name `cn`.
pub fn make_named_certificate(dir: &std::path::Path, stem: &str, cn: &str, subject_alt_name: &str) {
    let (key, csr, crt, ext) = (
        format!("{stem}.key"),
        format!("{stem}.csr"),
        format!("{stem}.crt"),
        format!("{stem}.ext"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    std::fs::write(
        dir.join(&ext),
        format!("subjectAltName={subject_alt_name}\n"),
    )
    .expect("ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

/// An HTTPS upstream: `openssl s_server -www`, which answers every GET with
/// a 200 status page. Stopped on drop.
pub struct TlsUpstream {
    pub addr: SocketAddr,
    pub ca: PathBuf,
    child: Child,
}

impl TlsUpstream {
    pub fn start() -> TlsUpstream {
        let dir = temp_dir();
        make_certificates(&dir);
        let port = free_port();
        let child = Command::new("openssl")
            .args([
                "s_server",
                "-accept",
                &port.to_string(),
                "-cert",
                "server.crt",
                "-key",
                "server.key",
                "-www",
                "-quiet",
            ])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        assert!(wait_until(Duration::from_secs(10), || TcpStream::connect(
            addr
        )
        .is_ok()));
        TlsUpstream {
            addr,
            ca: dir.join("ca.crt"),
            child,
        }
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_floodgate")
}

/// The real binary serving a config, stopped (by its PID) on drop.
pub struct Proxy {
    pub addr: SocketAddr,
    /// The admin listener, when started with one.
    pub admin: Option<SocketAddr>,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    child: Child,
}

impl Proxy {
    /// Floodgate in front of `upstream` with no limits; anything more is
    /// `ConfigBuilder`'s.
    pub fn start(upstream: &Upstream) -> Proxy {
        ConfigBuilder::new(upstream.addr).start()
    }

    /// The binary serving a config file as written (an example's, its
    /// addresses swapped for the test's), which listens on `addr` and on
    /// `admin`.
    pub fn start_text(text: &str, addr: SocketAddr, admin: Option<SocketAddr>) -> Proxy {
        let path = temp_dir().join("proxy.toml");
        std::fs::write(&path, text).expect("write config");
        Proxy::launch(addr, admin, path, &[], &[])
    }

    /// The binary serving `config_path` (which listens on `addr`, and on
    /// `admin` if given), run by `wrapper` when one is given (e.g. `prlimit
    /// --nofile=...`); returns once it listens.
    fn launch(
        addr: SocketAddr,
        admin: Option<SocketAddr>,
        config_path: PathBuf,
        env: &[(String, String)],
        wrapper: &[&str],
    ) -> Proxy {
        let log_path = config_path.with_extension("log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        command
            .arg("--config")
            .arg(&config_path)
            // FLOODGATE_TEST_RUST_LOG, e.g. "info,redis=debug", to see more
            // of a failing test's proxies.
            .env(
                "RUST_LOG",
                std::env::var("FLOODGATE_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().expect("spawn floodgate");
        let mut proxy = Proxy {
            addr,
            admin,
            config_path,
            log_path,
            child,
        };
        proxy.wait_ready();
        proxy
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("floodgate exited with {status}: {}", self.log());
            }
            // Listening, and the signal handlers are in place.
            let admin_listens = self.admin.is_none_or(|a| TcpStream::connect(a).is_ok());
            if TcpStream::connect(self.addr).is_ok()
                && admin_listens
                && self.log().contains("signals: SIGHUP")
            {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "floodgate did not listen on {} in time: {}",
            self.addr,
            self.log()
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// GET on the admin listener.
    pub fn admin_get(&self, path: &str) -> Response {
        let admin = self.admin.expect("started with an admin listener");
        request(admin, "GET", path, &[], b"")
    }

    /// One sample of a Prometheus series, 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        self.admin_get("/metrics")
            .body
            .lines()
            .find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    }

    /// Waits (10 s at most) until the log says `line`; fails the test with
    /// `what` and the log otherwise.
    pub fn await_log(&self, line: &str, what: &str) {
        assert!(
            wait_until(Duration::from_secs(10), || self.log().contains(line)),
            "{what}: {}",
            self.log()
        );
    }

    pub fn signal(&self, sig: &str) {
        // Pingora installs the handlers once it runs, after the listeners
        // may already answer: a SIGHUP before them would end the process.
        self.await_log(
            "signals: SIGHUP reloads",
            "the signal handlers were never installed",
        );
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig}");
    }

    /// Waits for the process to exit; its status, or None on timeout.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            thread::sleep(Duration::from_millis(10));
        }
        None
    }

    pub fn get(&self, path: &str) -> Response {
        request(self.addr, "GET", path, &[], b"")
    }

    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        request(self.addr, method, path, headers, b"")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.config_path.parent() {
            remove_test_dir(dir);
        }
    }
}

/// Removes a directory `temp_dir` made, when the test passes: a failing
/// one keeps it (logs, configs) to be read. Thousands of runs of the suite
/// must not fill the disk.
pub fn remove_test_dir(dir: &Path) {
    let made_here = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("floodgate-test-"));
    if made_here && !thread::panicking() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl Drop for TestClock {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent() {
            remove_test_dir(dir);
        }
    }
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `retry_after_ms` of a 429's JSON body.
    pub fn retry_after_ms(&self) -> Option<u64> {
        let after = self.body.split("\"retry_after_ms\":").nth(1)?;
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    }

    pub fn has_rate_headers(&self) -> bool {
        self.header("ratelimit-limit").is_some() || self.header("ratelimit").is_some()
    }
}

/// One request on a fresh connection; status 0 when no response came.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    // A Host given by the test replaces the default one.
    let host = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        ""
    } else {
        "Host: test\r\n"
    };
    let mut raw = format!("{method} {path} HTTP/1.1\r\n{host}Connection: close\r\n").into_bytes();
    for (k, v) in headers {
        raw.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    if !body.is_empty() {
        raw.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    raw.extend_from_slice(body);
    raw_request(addr, &raw)
}

/// Reads one response (status and body) off a kept-alive connection.
pub fn read_response(reader: &mut impl BufRead) -> Option<(u16, String)> {
    let mut status_line = String::new();
    if reader.read_line(&mut status_line).ok()? == 0 {
        return None;
    }
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Sends bytes as they are and reads one response.
pub fn raw_request(addr: SocketAddr, raw: &[u8]) -> Response {
    let failed = Response {
        status: 0,
        headers: Vec::new(),
        body: String::new(),
    };
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return failed;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(15)));
    if stream.write_all(raw).is_err() {
        return failed;
    }
    let mut reader = BufReader::new(stream);
    // Interim answers (100, 103) come before the response, as clients expect.
    let (status, headers, content_length) = loop {
        let mut status_line = String::new();
        if reader.read_line(&mut status_line).unwrap_or(0) == 0 {
            return failed;
        }
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut headers = Vec::new();
        let mut content_length = None;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                break;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    content_length = v.trim().parse::<usize>().ok();
                }
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        if !(100..200).contains(&status) || status == 101 {
            break (status, headers, content_length);
        }
    };
    let mut body = Vec::new();
    match content_length {
        Some(n) => {
            body.resize(n, 0);
            let _ = reader.read_exact(&mut body);
        }
        None => {
            let _ = reader.read_to_end(&mut body);
        }
    }
    let _ = reader.get_ref().shutdown(Shutdown::Both);
    Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// `n` requests released together from `n` threads, spread round-robin
/// over `addrs` (several proxies sharing one store).
pub fn burst(
    addrs: &[SocketAddr],
    n: usize,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Vec<Response> {
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    burst_with(addrs, n, method, path, |_| headers.clone())
}

/// `burst`, request `i` with the headers `headers_of(i)`.
pub fn burst_with(
    addrs: &[SocketAddr],
    n: usize,
    method: &str,
    path: &str,
    headers_of: impl Fn(usize) -> Vec<(String, String)> + Sync,
) -> Vec<Response> {
    at_once(n, |i| {
        let headers = headers_of(i);
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        request(addrs[i % addrs.len()], method, path, &h, b"")
    })
}

/// `n` requests released together, request `i` made by `send(i)` on a
/// thread of its own (and a connection of its own); their answers, in order.
pub fn at_once(n: usize, send: impl Fn(usize) -> Response + Sync) -> Vec<Response> {
    let barrier = Barrier::new(n);
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, send) = (&barrier, &send);
                s.spawn(move || {
                    barrier.wait();
                    send(i)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    })
}

/// Anything that carries an HTTP status.
pub trait HasStatus {
    fn status(&self) -> u16;
}

impl HasStatus for u16 {
    fn status(&self) -> u16 {
        *self
    }
}

impl HasStatus for Response {
    fn status(&self) -> u16 {
        self.status
    }
}

impl<T: HasStatus + ?Sized> HasStatus for &T {
    fn status(&self) -> u16 {
        (**self).status()
    }
}

/// How many of `answers` (responses, statuses, or references to them) have
/// `status`.
pub fn count_status<T: HasStatus>(answers: impl IntoIterator<Item = T>, status: u16) -> usize {
    answers.into_iter().filter(|a| a.status() == status).count()
}

/// Polls `condition` until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    condition()
}

/// Writes what a test measured to target/measurements/<name>.txt, where
/// reports can quote it; tests print nothing on success.
pub fn record(name: &str, text: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/measurements");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{name}.txt")), text);
}

/// Microseconds since the Unix epoch, as floodgate's clock counts.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The time of the proxies started with it (`ConfigBuilder::clock`, which
/// sets `FLOODGATE_CLOCK_FILE`): the system time plus an offset the test
/// moves, where a test would otherwise wait for time to pass. A proxy reads
/// the file at every reading of its clock, so a move is in force for every
/// request sent after it returns.
pub struct TestClock {
    path: PathBuf,
    offset_ms: Mutex<i64>,
}

impl TestClock {
    /// An offset of 0: the system time.
    pub fn new() -> TestClock {
        let clock = TestClock {
            path: temp_dir().join("clock"),
            offset_ms: Mutex::new(0),
        };
        clock.write(0);
        clock
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Moves the proxies' time `by` forward (whole milliseconds, rounded up).
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_micros().div_ceil(1000)).expect("a sane step");
        let mut offset = self.offset_ms.lock().expect("clock");
        *offset += ms;
        self.write(*offset);
    }

    /// Moves the proxies' time so that it reads `at_us` now (microseconds
    /// since the Unix epoch, rounded up to a whole millisecond).
    pub fn set_now_us(&self, at_us: u64) {
        let offset = (at_us as i64 - now_us() as i64).div_euclid(1000) + 1;
        let mut current = self.offset_ms.lock().expect("clock");
        *current = offset;
        self.write(offset);
    }

    /// The proxies' time now, in microseconds since the Unix epoch.
    pub fn now_us(&self) -> u64 {
        let offset = *self.offset_ms.lock().expect("clock");
        now_us().saturating_add_signed(offset * 1000)
    }

    /// A temporary file renamed over the clock file: a proxy reads either
    /// the old offset or the new one, never a part.
    fn write(&self, offset_ms: i64) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, offset_ms.to_string()).expect("write clock");
        std::fs::rename(&tmp, &self.path).expect("move clock");
    }
}

/// Many GETs on a few keep-alive connections (reconnecting when one is
/// closed); the status of each.
pub fn keepalive_gets(
    addr: SocketAddr,
    path: &str,
    requests: Vec<Vec<(String, String)>>,
) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(requests.len());
    let mut connection: Option<(TcpStream, BufReader<TcpStream>)> = None;
    for headers in requests {
        let mut raw = format!("GET {path} HTTP/1.1\r\nHost: test\r\n");
        for (k, v) in &headers {
            raw.push_str(&format!("{k}: {v}\r\n"));
        }
        raw.push_str("\r\n");
        let (writer, reader) = connection.get_or_insert_with(|| {
            let stream = TcpStream::connect(addr).expect("connect");
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let reader = BufReader::new(stream.try_clone().expect("clone"));
            (stream, reader)
        });
        if writer.write_all(raw.as_bytes()).is_err() {
            connection = None;
            statuses.push(0);
            continue;
        }
        let mut status_line = String::new();
        if reader.read_line(&mut status_line).unwrap_or(0) == 0 {
            connection = None;
            statuses.push(0);
            continue;
        }
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut length = 0usize;
        let mut close = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                close = true;
                break;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
                if k.eq_ignore_ascii_case("connection") && v.trim() == "close" {
                    close = true;
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            close = true;
        }
        statuses.push(status);
        if close {
            connection = None;
        }
    }
    statuses
}

/// splitmix64: a reproducible sequence without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The first line a helper process prints, or "" if none comes within
/// `within` (or its output closes first): a helper that hangs fails its
/// test instead of holding the suite.
pub fn first_line(out: std::process::ChildStdout, within: Duration) -> String {
    use std::io::{BufRead, BufReader};
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(within).unwrap_or_default()
}
