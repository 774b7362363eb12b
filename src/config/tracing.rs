//! `[tracing]`: where spans go, which are kept, whose trace context is
//! continued.

use std::collections::BTreeMap;
use std::time::Duration;

use super::file::{CollectorHeader, TracingSection};
use super::inputs::Inputs;
use super::{at, duration, Invalid};
use crate::tracing::{Protocol, TracingSettings, TrustParent};

/// At least one request's worth (`SPANS_PER_REQUEST`).
const SPANS_PER_SECOND: std::ops::RangeInclusive<i64> = 4..=1_000_000;
const QUEUE: std::ops::RangeInclusive<i64> = 16..=1_000_000;

pub(super) fn validate_tracing(
    section: Option<&TracingSection>,
    inputs: &Inputs,
) -> Result<Option<TracingSettings>, Invalid> {
    let Some(t) = section else {
        return Ok(None);
    };
    let protocol = match t.protocol.as_deref() {
        None | Some("grpc") => Protocol::Grpc,
        Some("http") => Protocol::Http,
        Some(other) => {
            return Err(at(
                &[&"tracing", &"protocol"],
                format!("\"{other}\" is no OTLP protocol: \"grpc\" (port 4317) or \"http\" (HTTP/protobuf, port 4318)"),
            ))
        }
    };
    let endpoint = endpoint(&t.endpoint, protocol)?;
    let sample_ratio = t.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err(at(
            &[&"tracing", &"sample_ratio"],
            format!("must be from 0.0 (no new trace kept) to 1.0 (every one), got {sample_ratio}"),
        ));
    }
    let number = |value: Option<i64>,
                  default: i64,
                  range: std::ops::RangeInclusive<i64>,
                  key: &'static str| {
        let n = value.unwrap_or(default);
        if range.contains(&n) {
            Ok(n)
        } else {
            Err(at(
                &[&"tracing", &key],
                format!(
                    "must be a whole number from {} to {}, got {n}",
                    range.start(),
                    range.end()
                ),
            ))
        }
    };
    let max_spans_per_second = number(
        t.max_spans_per_second,
        2_000,
        SPANS_PER_SECOND,
        "max_spans_per_second",
    )?;
    let queue = number(t.queue, 4_096, QUEUE, "queue")?;
    let batch = number(t.batch, 512, 1..=queue, "batch")?;
    let timeout = duration(
        &t.timeout,
        Duration::from_secs(5),
        &[&"tracing", &"timeout"],
    )?;
    if timeout.is_zero() || timeout > Duration::from_secs(60) {
        return Err(at(
            &[&"tracing", &"timeout"],
            "must be more than 0 and at most 60s: how long one export to the collector may take",
        ));
    }
    let trust_parent = match t.trust_parent.as_deref() {
        None | Some("trusted_proxies") => TrustParent::TrustedProxies,
        Some("none") => TrustParent::Nobody,
        Some("all") => TrustParent::Everyone,
        Some(other) => {
            return Err(at(
                &[&"tracing", &"trust_parent"],
                format!("\"{other}\" is not one of \"trusted_proxies\" (the peers in [clients].trusted_proxies), \"all\" or \"none\""),
            ))
        }
    };
    let service_name = t.service_name.clone().unwrap_or_else(|| "floodgate".into());
    if service_name.is_empty() {
        return Err(at(&[&"tracing", &"service_name"], "must not be empty"));
    }
    Ok(Some(TracingSettings {
        endpoint,
        protocol,
        service_name,
        resource: t
            .resource
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        headers: headers(&t.headers, inputs)?,
        sample_ratio,
        max_spans_per_second: max_spans_per_second as u32,
        queue: queue as usize,
        batch: batch as usize,
        timeout,
        trust_parent,
    }))
}

/// An `http://` address with a host; for HTTP, the traces' path added
/// where none was written.
fn endpoint(text: &str, protocol: Protocol) -> Result<String, Invalid> {
    let here: [&dyn super::AsSegment; 2] = [&"tracing", &"endpoint"];
    let uri: http::Uri = text.parse().map_err(|_| {
        at(
            &here,
            format!("\"{text}\" is not a URL like \"http://127.0.0.1:4317\""),
        )
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(at(
                &here,
                "https is not supported: send to a collector on this host or its private network over http (it forwards with TLS)",
            ))
        }
        _ => {
            return Err(at(
                &here,
                format!("\"{text}\" must start with http:// (e.g. \"http://127.0.0.1:4317\")"),
            ))
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(at(&here, format!("\"{text}\" names no host")));
    }
    let path = uri.path();
    Ok(match protocol {
        Protocol::Http if path.is_empty() || path == "/" => {
            format!("{}/v1/traces", text.trim_end_matches('/'))
        }
        _ => text.to_string(),
    })
}

/// The collector's headers, secrets read from their files (the file's
/// first line, trimmed).
fn headers(
    written: &BTreeMap<String, CollectorHeader>,
    inputs: &Inputs,
) -> Result<Vec<(String, String)>, Invalid> {
    let mut headers = Vec::with_capacity(written.len());
    for (name, value) in written {
        let here: [&dyn super::AsSegment; 3] = [&"tracing", &"headers", name];
        let lowercase = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(lowercase.as_bytes()).is_err() {
            return Err(at(&here, format!("\"{name}\" is not a header name")));
        }
        let value = match value {
            CollectorHeader::Text(text) => text.clone(),
            CollectorHeader::File { file } => {
                let bytes = inputs
                    .read(file)
                    .map_err(|e| at(&here, format!("cannot read {}: {e}", file.display())))?;
                let text = String::from_utf8_lossy(&bytes);
                let first = text.lines().next().unwrap_or_default().trim().to_string();
                if first.is_empty() {
                    return Err(at(&here, format!("{} is empty", file.display())));
                }
                first
            }
        };
        if http::HeaderValue::from_str(&value).is_err() {
            return Err(at(
                &here,
                "its value is not a header value (plain printable characters)",
            ));
        }
        headers.push((lowercase, value));
    }
    Ok(headers)
}
