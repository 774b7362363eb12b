//! The admin listener's answers: JSON for the API (errors with a code and
//! a reason), HTML for the status page, text for the probes.

use http::{Response, StatusCode};
use serde_json::{json, Value};

/// A call that cannot be carried out: its status, a stable code and what
/// to do about it.
#[derive(Debug)]
pub(super) struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub reason: String,
}

impl ApiError {
    pub(super) fn bad_request(reason: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            code: "bad_request",
            reason: reason.into(),
        }
    }

    pub(super) fn not_found(code: &'static str, reason: impl Into<String>) -> ApiError {
        ApiError {
            status: 404,
            code,
            reason: reason.into(),
        }
    }

    pub(super) fn conflict(reason: impl Into<String>) -> ApiError {
        ApiError {
            status: 409,
            code: "not_creditable",
            reason: reason.into(),
        }
    }

    pub(super) fn unavailable(reason: impl Into<String>) -> ApiError {
        ApiError {
            status: 503,
            code: "store_unavailable",
            reason: reason.into(),
        }
    }

    pub(super) fn to_json(&self) -> Value {
        json!({"error": self.code, "reason": self.reason})
    }
}

pub(super) fn reply(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    reply_with(status, content_type, body, &[])
}

pub(super) fn reply_with(
    status: u16,
    content_type: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> Response<Vec<u8>> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = Response::builder()
        .status(status)
        .header("Content-Type", content_type)
        .header("Content-Length", body.len().to_string())
        .header("Cache-Control", "no-store")
        .header("X-Content-Type-Options", "nosniff");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(body)
        .unwrap_or_else(|_| Response::new(Vec::new()))
}

pub(super) fn text(status: u16, body: &str) -> Response<Vec<u8>> {
    reply(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes().to_vec(),
    )
}

pub(super) fn json_reply(status: u16, body: &Value) -> Response<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(body).unwrap_or_default();
    bytes.push(b'\n');
    reply(status, "application/json", bytes)
}

pub(super) fn error(e: &ApiError) -> Response<Vec<u8>> {
    let mut response = json_reply(e.status, &e.to_json());
    if e.status == 401 {
        response.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"floodgate admin\""),
        );
    }
    response
}

/// The page's own rules: nothing from elsewhere, no framing by another
/// site.
const PAGE_POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub(super) fn html(status: u16, body: &str, headers: &[(&str, &str)]) -> Response<Vec<u8>> {
    let mut all = vec![
        ("Content-Security-Policy", PAGE_POLICY),
        ("X-Frame-Options", "DENY"),
        ("Referrer-Policy", "no-referrer"),
    ];
    all.extend_from_slice(headers);
    reply_with(
        status,
        "text/html; charset=utf-8",
        body.as_bytes().to_vec(),
        &all,
    )
}
