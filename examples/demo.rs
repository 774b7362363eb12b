//! The README's demo: floodgate on the shipped proxy.toml in front of a tiny
//! bundled upstream, and a burst from one client that turns 200s into 429s.
//!
//! Run with `scripts/demo.sh` (or `cargo run --example demo -- proxy.toml`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use floodgate::config::{Config, Inputs};

fn main() {
    if let Err(e) = run() {
        eprintln!("demo failed: {e}");
        std::process::exit(1);
    }
    // The proxy runs until the process ends.
    std::process::exit(0);
}

fn run() -> Result<(), String> {
    let file = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "proxy.toml".into());
    let inputs = Inputs::from_process();
    let config = Config::load(file.as_ref(), &inputs).map_err(|e| e.to_string())?;
    let upstream = config.upstream.servers[0].clone();
    let proxy = config.server.listen[0];
    let listener = TcpListener::bind(&upstream).map_err(|e| {
        format!(
            "cannot start the demo upstream on {upstream} ({e}); is something else running there?"
        )
    })?;
    std::thread::spawn(move || serve_demo_upstream(listener));
    let server = floodgate::server::build(&config, inputs).map_err(|e| e.to_string())?;
    std::thread::spawn(move || server.run());
    wait_for(proxy)?;

    println!("floodgate on {proxy} -> demo upstream on {upstream}, limits from {file}\n");
    println!("A burst of 14 requests from one client (per-ip: bursts of 10, then 2 a second):");
    let mut first_refusal = None;
    for i in 1..=14 {
        let response = get(proxy, "/hello")?;
        println!(
            "  #{i:<2} {:<26} RateLimit: {}",
            response.status_line,
            response.header("RateLimit").unwrap_or("-")
        );
        if first_refusal.is_none() && response.status_line.contains("429") {
            first_refusal = Some(response);
        }
    }
    let refusal =
        first_refusal.ok_or("nothing was refused: are the limits in proxy.toml raised?")?;
    println!("\nThe first refusal in full:\n{}\n", refusal.raw.trim_end());
    let wait: u64 = refusal
        .header("Retry-After")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    println!("Waiting {wait}s, as Retry-After says...");
    std::thread::sleep(Duration::from_secs(wait));
    let again = get(proxy, "/hello")?;
    println!(
        "  then: {} RateLimit-Remaining: {}",
        again.status_line,
        again.header("RateLimit-Remaining").unwrap_or("-")
    );
    Ok(())
}

struct Response {
    status_line: String,
    raw: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.raw
            .lines()
            .skip(1)
            .take_while(|l| !l.is_empty())
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim())
            })
    }
}

fn get(addr: SocketAddr, path: &str) -> Result<Response, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).map_err(|e| e.to_string())?;
    let raw = raw.replace("\r\n", "\n");
    let status_line = raw
        .lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("HTTP/1.1 ")
        .to_string();
    Ok(Response { status_line, raw })
}

fn wait_for(addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("floodgate did not start listening on {addr}"))
}

/// Answers every request with a short JSON greeting.
fn serve_demo_upstream(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let mut stream = stream;
            let mut buf = [0u8; 8192];
            let mut pending = Vec::new();
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    return;
                }
                pending.extend_from_slice(&buf[..n]);
                // The demo sends bodiless requests: each ends at a blank line.
                while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                    pending.drain(..end + 4);
                    let body = "{\"hello\":\"from the upstream\"}";
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            }
        });
    }
}
