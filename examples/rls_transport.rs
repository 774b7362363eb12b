//! What serving gRPC costs on each of the two servers floodgate could put
//! the rate limit service on, with the decision taken out: `rls_transport
//! tonic|pingora ADDR` answers every ShouldRateLimit call on ADDR with OK,
//! one status per descriptor, on one thread, until it is killed.
//!
//! - `tonic`: tonic's server, as src/rls/service.rs runs it.
//! - `pingora`: a Pingora HTTP/2 (h2c) service that reads the call's body,
//!   strips gRPC's 5-byte frame, decodes and encodes the same envoy-types
//!   messages with prost, and ends with `grpc-status` in the trailers:
//!   the least that serving the API inside Pingora would have to do, with
//!   no deadlines, no compression and no message limits.
//!
//! scripts/rls_bench.sh runs examples/rls_load.rs against both, in the same
//! run as the service itself, and prints the CPU each spends per call.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http::{HeaderMap, HeaderValue};
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::server::{Server, ShutdownWatch};
use pingora::services::listening::Service;
use prost::Message;

/// The answer both servers give: OK for each descriptor.
fn answer(call: &RateLimitRequest) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: call
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            })
            .collect(),
        ..RateLimitResponse::default()
    }
}

struct Tonic;

#[tonic::async_trait]
impl RateLimitService for Tonic {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(answer(request.get_ref())))
    }
}

fn serve_tonic(addr: SocketAddr) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let served = runtime.block_on(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Tonic))
            .serve(addr),
    );
    if let Err(e) = served {
        eprintln!("tonic: {e}");
        std::process::exit(1);
    }
}

struct OnPingora {
    options: HttpServerOptions,
}

/// gRPC's length-prefixed message: a compression flag, then 4 bytes of
/// length, big-endian.
const FRAME_HEADER: usize = 5;

impl OnPingora {
    async fn respond(session: &mut ServerSession) -> Option<()> {
        let mut body = BytesMut::new();
        while let Some(chunk) = session.read_request_body().await.ok()? {
            body.extend_from_slice(&chunk);
        }
        let message = body.get(FRAME_HEADER..)?;
        let call = RateLimitRequest::decode(message).ok()?;
        let response = answer(&call);
        let length = u32::try_from(response.encoded_len()).ok()?;
        let mut framed = BytesMut::with_capacity(FRAME_HEADER + length as usize);
        framed.put_u8(0);
        framed.put_u32(length);
        response.encode(&mut framed).ok()?;
        let mut header = ResponseHeader::build(200, Some(1)).ok()?;
        header
            .insert_header("content-type", "application/grpc")
            .ok()?;
        session.write_response_header(Box::new(header)).await.ok()?;
        session
            .write_response_body(Bytes::from(framed), false)
            .await
            .ok()?;
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        session.write_response_trailers(trailers).await.ok()?;
        Some(())
    }
}

#[async_trait]
impl HttpServerApp for OnPingora {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        _shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if Self::respond(&mut session).await.is_some() {
            let _ = session.finish().await;
        }
        // Every call is an HTTP/2 stream: the connection lives on without
        // being handed back.
        None
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        Some(&self.options)
    }
}

fn serve_pingora(addr: SocketAddr) {
    let mut server = Server::new(None).expect("a Pingora server");
    server.bootstrap();
    let mut options = HttpServerOptions::default();
    options.h2c = true;
    let mut service = Service::new("rls on pingora".into(), OnPingora { options });
    service.add_tcp(&addr.to_string());
    service.threads = Some(1);
    server.add_service(service);
    server.run_forever();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = args.get(2).and_then(|a| a.parse::<SocketAddr>().ok());
    match (args.get(1).map(String::as_str), addr) {
        (Some("tonic"), Some(addr)) => serve_tonic(addr),
        (Some("pingora"), Some(addr)) => serve_pingora(addr),
        _ => {
            eprintln!("usage: rls_transport tonic|pingora ADDR");
            std::process::exit(2);
        }
    }
}
