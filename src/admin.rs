//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process
//! serves), `/readyz` (config loaded; store usable, degraded or draining).

use std::sync::Arc;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::state::AppState;

pub struct Admin {
    state: Arc<AppState>,
}

impl Admin {
    pub fn new(state: Arc<AppState>) -> Self {
        Admin { state }
    }
}

fn reply(status: u16, content_type: &str, body: String) -> Response<Vec<u8>> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Response::builder()
        .status(status)
        .header("Content-Type", content_type)
        .header("Content-Length", body.len().to_string())
        .header("Cache-Control", "no-store")
        .body(body.into_bytes())
        .unwrap_or_else(|_| Response::new(Vec::new()))
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let text = "text/plain; charset=utf-8";
        match session.req_header().uri.path() {
            "/metrics" => {
                self.state.refresh_gauges();
                reply(
                    200,
                    "text/plain; version=0.0.4",
                    self.state.metrics.render(),
                )
            }
            "/healthz" => reply(200, text, "ok\n".into()),
            "/readyz" => {
                let (status, reason) = self.state.readiness();
                reply(status, text, reason.into())
            }
            _ => reply(
                404,
                text,
                "not found: try /metrics, /healthz or /readyz\n".into(),
            ),
        }
    }
}
