//! The spans' way out: a bounded queue the request path only ever tries to
//! push to, and a thread of its own that sends them in batches through the
//! OTLP exporter. A collector that is slow or gone fills the queue; past
//! its bound spans are dropped and counted, and no request waits.

use std::sync::mpsc as blocking;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter as _, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus::{IntCounter, IntCounterVec};
use tokio::sync::mpsc;

use super::settings::{Protocol, TracingSettings};

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    #[error("the OTLP exporter for {endpoint} could not be built: {reason}")]
    Exporter { endpoint: String, reason: String },
    #[error("the span export thread could not start: {0}")]
    Thread(#[from] std::io::Error),
}

/// The spans' fates, one counter each (`floodgate_tracing_spans_total`).
#[derive(Clone)]
pub struct TracingMetrics {
    pub spans: IntCounterVec,
}

/// How long a batch waits to fill once its first span is in.
const GATHER_FOR: Duration = Duration::from_millis(200);

enum Message {
    Span(Box<SpanData>),
    /// Send everything queued before this, then answer.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The span processor: ended, sampled spans into the queue.
#[derive(Debug, Clone)]
pub(super) struct QueuedExport {
    queue: mpsc::Sender<Message>,
    queue_full: IntCounter,
}

impl QueuedExport {
    /// Builds the exporter on the export thread (tonic's channel wants the
    /// thread's runtime) and waits until it is built.
    pub(super) fn start(
        settings: &TracingSettings,
        resource: Resource,
        metrics: &TracingMetrics,
    ) -> Result<QueuedExport, TracingError> {
        let (queue, receiver) = mpsc::channel(settings.queue);
        let (built, built_answer) = blocking::sync_channel(1);
        let endpoint = settings.endpoint.clone();
        let settings = settings.clone();
        let exported = metrics.spans.with_label_values(&["exported"]);
        let failed = metrics.spans.with_label_values(&["export_failed"]);
        std::thread::Builder::new()
            .name("floodgate-otlp".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = built.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut exporter = match exporter(&settings) {
                        Ok(exporter) => exporter,
                        Err(reason) => {
                            let _ = built.send(Err(reason));
                            return;
                        }
                    };
                    exporter.set_resource(&resource);
                    let _ = built.send(Ok(()));
                    let sending = Sending {
                        exporter,
                        batch: settings.batch,
                        timeout: settings.timeout,
                        exported,
                        failed,
                    };
                    sending.run(receiver).await;
                });
            })?;
        match built_answer.recv() {
            Ok(Ok(())) => Ok(QueuedExport {
                queue,
                queue_full: metrics.spans.with_label_values(&["queue_full"]),
            }),
            Ok(Err(reason)) => Err(TracingError::Exporter { endpoint, reason }),
            Err(_) => Err(TracingError::Exporter {
                endpoint,
                reason: "the export thread ended".into(),
            }),
        }
    }
}

/// The OTLP exporter the settings name: no retries (a failed batch is
/// counted and dropped; the next one is due soon), each export within the
/// settings' timeout.
fn exporter(settings: &TracingSettings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let built = match settings.protocol {
        Protocol::Grpc => {
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (name, value) in &settings.headers {
                let name = tonic::metadata::MetadataKey::from_bytes(name.as_bytes())
                    .map_err(|e| format!("header {name}: {e}"))?;
                let value = value
                    .parse()
                    .map_err(|_| format!("header {name}: its value is not a header value"))?;
                metadata.insert(name, value);
            }
            builder
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout)
                .with_metadata(metadata)
                .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
                .build()
        }
        Protocol::Http => builder
            .with_http()
            .with_endpoint(settings.endpoint.clone())
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(settings.timeout)
            .with_headers(settings.headers.iter().cloned().collect())
            .with_retry_policy(opentelemetry_otlp::RetryPolicy::disabled())
            .build(),
    };
    built.map_err(|e| e.to_string())
}

struct Sending {
    exporter: opentelemetry_otlp::SpanExporter,
    batch: usize,
    timeout: Duration,
    exported: IntCounter,
    failed: IntCounter,
}

impl Sending {
    async fn run(self, mut receiver: mpsc::Receiver<Message>) {
        let mut messages = Vec::with_capacity(self.batch);
        let mut spans = Vec::with_capacity(self.batch);
        while receiver.recv_many(&mut messages, self.batch).await > 0 {
            // A few more, so that a trickle goes out in one export.
            let gather = tokio::time::sleep(GATHER_FOR);
            tokio::pin!(gather);
            while messages.len() < self.batch && !asks_flush(&messages) {
                let room = self.batch - messages.len();
                tokio::select! {
                    _ = &mut gather => break,
                    n = receiver.recv_many(&mut messages, room) => if n == 0 { break },
                }
            }
            let mut flushed = Vec::new();
            for message in messages.drain(..) {
                match message {
                    Message::Span(span) => spans.push(*span),
                    Message::Flush(done) => flushed.push(done),
                }
            }
            if !spans.is_empty() {
                self.send(std::mem::take(&mut spans)).await;
            }
            for done in flushed {
                let _ = done.send(());
            }
        }
    }

    async fn send(&self, spans: Vec<SpanData>) {
        let count = spans.len() as u64;
        let sent = tokio::time::timeout(self.timeout, self.exporter.export(spans)).await;
        match sent {
            Ok(Ok(())) => self.exported.inc_by(count),
            Ok(Err(e)) => {
                self.failed.inc_by(count);
                log_failure(&e.to_string());
            }
            Err(_) => {
                self.failed.inc_by(count);
                log_failure("timed out");
            }
        }
    }
}

/// At most one line a minute: a collector that is down must not fill the
/// log.
fn log_failure(reason: &str) {
    static LINES: floodgate_limiter::log_throttle::LogThrottle =
        floodgate_limiter::log_throttle::LogThrottle::new(Duration::from_secs(60));
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    if let Some(held_back) = LINES.due(now_us) {
        log::warn!("spans could not be sent to the collector: {reason} ({held_back} more failures since the last report)");
    }
}

/// Whether a flush is asked among `messages`: the batch goes out at once.
fn asks_flush(messages: &[Message]) -> bool {
    messages.iter().any(|m| matches!(m, Message::Flush(_)))
}

impl QueuedExport {
    /// Sends what is queued, waiting at most `within` (at a stop).
    pub(super) async fn flush(&self, within: Duration) -> bool {
        let (done, sent) = tokio::sync::oneshot::channel();
        let queued = matches!(
            tokio::time::timeout(within, self.queue.send(Message::Flush(done))).await,
            Ok(Ok(()))
        );
        queued
            && tokio::time::timeout(within, sent)
                .await
                .is_ok_and(|r| r.is_ok())
    }
}

impl SpanProcessor for QueuedExport {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queue.try_send(Message::Span(Box::new(span))).is_err() {
            self.queue_full.inc();
        }
    }

    /// Asks for what is queued to be sent, without waiting for it (no
    /// request ever waits on the collector): `QueuedExport::flush` waits.
    fn force_flush(&self) -> OTelSdkResult {
        let (done, _) = tokio::sync::oneshot::channel();
        self.queue
            .try_send(Message::Flush(done))
            .map_err(|_| OTelSdkError::InternalFailure("the span queue is full".into()))
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}
