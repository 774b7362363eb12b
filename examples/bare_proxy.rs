//! The floor floodgate is measured against: a Pingora proxy that forwards
//! every request to one upstream and does nothing else. Same Pingora, same
//! allocator, same release profile; `scripts/loadtest.sh` runs it beside
//! floodgate so that what floodgate adds per request is its own cost, not the
//! stack's.
//!
//!   cargo run --release --example bare_proxy -- LISTEN UPSTREAM [THREADS] [refuse]
//!   e.g. bare_proxy 127.0.0.1:18009 127.0.0.1:18000 1
//!
//! With `refuse`, every request is answered 429 from `request_filter`, with
//! no body and no headers but those Pingora writes: the floor of a refusal.

use async_trait::async_trait;
use pingora::modules::http::HttpModules;
use pingora::prelude::*;
use pingora::server::configuration::{Opt, ServerConf};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Forward {
    upstream: String,
    refuse: bool,
}

#[async_trait]
impl ProxyHttp for Forward {
    type CTX = ();

    fn new_ctx(&self) {}

    // As floodgate: no downstream modules (Pingora's default adds a disabled
    // compression module to every request).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        if !self.refuse {
            return Ok(false);
        }
        let mut answer = pingora::http::ResponseHeader::build(429, Some(1))?;
        answer.insert_header("Content-Length", "0")?;
        session
            .write_response_header(Box::new(answer), true)
            .await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: bare_proxy LISTEN UPSTREAM [THREADS] [refuse]");
        std::process::exit(2);
    };
    let threads = args.next();
    let refuse = args.next().as_deref() == Some("refuse");
    let threads = match threads.map(|t| t.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("THREADS must be a positive integer");
            std::process::exit(2);
        }
    };
    // As floodgate's: a stop does not wait for a grace period.
    let conf = ServerConf {
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut proxy = http_proxy_service(&server.configuration, Forward { upstream, refuse });
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever();
}
