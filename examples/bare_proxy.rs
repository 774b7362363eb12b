//! The floor floodgate is measured against: a Pingora proxy that forwards
//! every request to one upstream and does nothing else. Same Pingora, same
//! allocator, same release profile; `scripts/loadtest.sh` runs it beside
//! floodgate so that what floodgate adds per request is its own cost, not the
//! stack's.
//!
//!   cargo run --release --example bare_proxy -- LISTEN UPSTREAM [THREADS] [refuse | gateway] [tls ADDR CERT KEY]
//!   e.g. bare_proxy 127.0.0.1:18009 127.0.0.1:18000 1
//!
//! With `gateway`, it also does the upstream work floodgate does by default,
//! written with Pingora's own API as its users would: the upstream's connect
//! (1 s) and read (30 s) timeouts, X-Forwarded-For, X-Real-IP,
//! X-Forwarded-Proto and X-Forwarded-Host to the upstream, and a request id
//! (32 hex digits) to the upstream and in the answer. The floor of a gateway
//! rather than of a forwarder.
//! With `refuse`, every request is answered 429 from `request_filter`, with
//! no body and no headers but those Pingora writes: the floor of a refusal.
//! With both, the 429 says what floodgate's does (a JSON body with the
//! limit, the wait and the request id; Content-Type, Cache-Control,
//! Retry-After, the five rate-limit headers and the request id), written
//! with Pingora's API: the floor of a refusal that explains itself.
//! With `tls`, it also terminates TLS on ADDR (h2 and http/1.1 by ALPN) with
//! Pingora's own rustls listener: the floor of a TLS edge.

use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::modules::http::HttpModules;
use pingora::prelude::*;
use pingora::server::configuration::{Opt, ServerConf};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Forward {
    upstream: String,
    refuse: bool,
    gateway: bool,
}

static REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[async_trait]
impl ProxyHttp for Forward {
    /// The request id (`gateway`).
    type CTX = String;

    fn new_ctx(&self) -> String {
        String::new()
    }

    // As floodgate: no downstream modules (Pingora's default adds a disabled
    // compression module to every request).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(&self, session: &mut Session, ctx: &mut String) -> Result<bool> {
        if self.gateway {
            let n = REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *ctx = format!("{:032x}", u128::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        if !self.refuse {
            return Ok(false);
        }
        if self.gateway {
            return refuse_saying_why(session, ctx).await;
        }
        let mut answer = pingora::http::ResponseHeader::build(429, Some(1))?;
        answer.insert_header("Content-Length", "0")?;
        session
            .write_response_header(Box::new(answer), true)
            .await?;
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut String,
    ) -> Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.upstream.as_str(), false, String::new());
        if self.gateway {
            peer.options.connection_timeout = Some(std::time::Duration::from_secs(1));
            peer.options.total_connection_timeout = Some(std::time::Duration::from_secs(1));
            peer.options.read_timeout = Some(std::time::Duration::from_secs(30));
        }
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut pingora::http::RequestHeader,
        ctx: &mut String,
    ) -> Result<()> {
        if !self.gateway {
            return Ok(());
        }
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        upstream_request.insert_header("X-Forwarded-For", &client)?;
        upstream_request.insert_header("X-Real-IP", &client)?;
        upstream_request.insert_header("X-Forwarded-Proto", "http")?;
        if let Some(host) = session.req_header().headers.get("host").cloned() {
            upstream_request.insert_header("X-Forwarded-Host", host)?;
        }
        upstream_request.insert_header("X-Request-Id", ctx.as_str())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut pingora::http::ResponseHeader,
        ctx: &mut String,
    ) -> Result<()> {
        if self.gateway {
            upstream_response.insert_header("X-Request-Id", ctx.as_str())?;
        }
        Ok(())
    }
}

/// A 429 as floodgate's says it (`refuse gateway`): a per-client limit of
/// one request an hour, refused with a wait counted down from the hour.
async fn refuse_saying_why(session: &mut Session, request_id: &str) -> Result<bool> {
    let retry_after_ms = 3_600_000 - (unix_ms() % 3_600_000);
    let retry_after = retry_after_ms.div_ceil(1000).to_string();
    let body = format!(
        "{{\"error\":\"rate_limited\",\"limit\":\"per-ip\",\"retry_after_ms\":{retry_after_ms},\"request_id\":\"{request_id}\"}}"
    );
    let mut answer = pingora::http::ResponseHeader::build(429, Some(12))?;
    answer.insert_header("Content-Type", "application/json")?;
    answer.insert_header("Cache-Control", "no-store")?;
    answer.insert_header("Retry-After", retry_after.as_str())?;
    answer.insert_header("RateLimit-Limit", "1")?;
    answer.insert_header("RateLimit-Remaining", "0")?;
    answer.insert_header("RateLimit-Reset", retry_after.as_str())?;
    answer.insert_header("RateLimit-Policy", "\"per-ip\";q=1;w=3600")?;
    answer.insert_header("RateLimit", format!("\"per-ip\";r=0;t={retry_after}"))?;
    answer.insert_header("Content-Length", body.len().to_string())?;
    answer.insert_header("X-Request-Id", request_id)?;
    session
        .write_response_header(Box::new(answer), false)
        .await?;
    session
        .write_response_body(Some(bytes::Bytes::from(body)), true)
        .await?;
    Ok(true)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn usage() -> ! {
    eprintln!("usage: bare_proxy LISTEN UPSTREAM [THREADS] [refuse | gateway] [tls ADDR CERT KEY]");
    std::process::exit(2);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        usage();
    };
    let mut threads = 1;
    let mut refuse = false;
    let mut gateway = false;
    let mut tls = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "refuse" => refuse = true,
            "gateway" => gateway = true,
            "tls" => match (args.next(), args.next(), args.next()) {
                (Some(addr), Some(cert), Some(key)) => tls = Some((addr, cert, key)),
                _ => usage(),
            },
            number => match number.parse::<usize>() {
                Ok(n) if n > 0 => threads = n,
                _ => usage(),
            },
        }
    }
    // As floodgate's: a stop does not wait for a grace period.
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut proxy = http_proxy_service(
        &server.configuration,
        Forward {
            upstream,
            refuse,
            gateway,
        },
    );
    proxy.add_tcp(&listen);
    if let Some((addr, cert, key)) = tls {
        let mut settings = match TlsSettings::intermediate(&cert, &key) {
            Ok(settings) => settings,
            Err(e) => {
                eprintln!("tls: {e}");
                std::process::exit(2);
            }
        };
        settings.enable_h2();
        proxy.add_tls_with_settings(&addr, None, settings);
    }
    server.add_service(proxy);
    server.run_forever();
}
