//! A real OpenTelemetry trace collector for the tests: tests/otlp_receiver.py,
//! opentelemetry-proto's TraceService served by grpcio (and OTLP/HTTP),
//! writing each span it receives as a JSON line that `spans()` reads back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{first_line, free_port, remove_test_dir, temp_dir, wait_until};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp_receiver.py");

/// One span as the receiver wrote it.
#[derive(Debug, Clone, Deserialize)]
pub struct Span {
    /// Hex, as are the span ids.
    pub trace_id: String,
    pub span_id: String,
    /// "" for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// The proto's SpanKind: 1 internal, 2 server, 3 client, 4 producer,
    /// 5 consumer.
    pub kind: i32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Arrays are lists, maps objects, bytes hex strings.
    pub attributes: Map<String, Value>,
    /// 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    pub resource: Map<String, Value>,
    /// The instrumentation scope's name.
    pub scope: String,
    /// The receiver's wall clock when the export carrying the span arrived.
    pub received_ns: u64,
    /// "grpc" or "http".
    pub via: String,
    /// The export call's metadata or HTTP headers, names lowercased.
    pub headers: BTreeMap<String, String>,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }

    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attr(key).and_then(Value::as_str)
    }

    pub fn attr_i64(&self, key: &str) -> Option<i64> {
        self.attr(key).and_then(Value::as_i64)
    }
}

/// tests/otlp_receiver.py on free ports, killed when dropped.
pub struct OtlpReceiver {
    child: Child,
    pub grpc_port: u16,
    /// Set when it serves OTLP/HTTP too.
    pub http_port: Option<u16>,
    /// Where it writes the spans, one JSON object a line.
    pub out: PathBuf,
    dir: PathBuf,
}

impl OtlpReceiver {
    /// OTLP/gRPC only, answering at once.
    pub fn start() -> OtlpReceiver {
        OtlpReceiver::start_with(false, 0)
    }

    /// With `http`, OTLP/HTTP (protobuf, POST /v1/traces) too; each export
    /// is answered `delay_ms` after its spans were written, as a slow
    /// collector does. Its ports were free a moment ago and another test may
    /// take one meanwhile: a receiver that cannot bind exits, and is started
    /// again on others, up to three times in all.
    pub fn start_with(http: bool, delay_ms: u64) -> OtlpReceiver {
        let dir = temp_dir();
        let out = dir.join("spans.jsonl");
        let mut failures = Vec::new();
        for _ in 0..3 {
            let grpc_port = free_port();
            let http_port = http.then(free_port);
            let stderr_path = dir.join("receiver.err");
            let stderr = std::fs::File::create(&stderr_path).expect("receiver.err");
            let mut command = Command::new("python3");
            command
                .arg(SCRIPT)
                .args(["--grpc-port", &grpc_port.to_string()])
                .arg("--out")
                .arg(&out)
                .args(["--delay-ms", &delay_ms.to_string()]);
            if let Some(port) = http_port {
                command.args(["--http-port", &port.to_string()]);
            }
            // Its stderr goes to a file: a pipe nobody reads could fill and
            // stall it.
            let mut child = command
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(stderr)
                .spawn()
                .expect("python3");
            let stdout = child.stdout.take().expect("receiver stdout");
            if first_line(stdout, Duration::from_secs(15)).trim() == "ready" {
                return OtlpReceiver {
                    child,
                    grpc_port,
                    http_port,
                    out,
                    dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
            let why = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            let port_taken =
                why.contains("Failed to bind") || why.contains("Address already in use");
            failures.push(why);
            if !port_taken {
                break;
            }
        }
        panic!(
            "the OTLP receiver was not ready within 15 s (scripts/setup.sh installs grpcio \
             and opentelemetry-proto): {}",
            failures.join("\n---\n")
        );
    }

    /// Where an OTLP/gRPC exporter sends: "http://127.0.0.1:N".
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The OTLP/HTTP base, "http://127.0.0.1:M" (exporters add /v1/traces).
    pub fn http_endpoint(&self) -> String {
        let port = self
            .http_port
            .expect("the OTLP receiver serves HTTP only when started with it");
        format!("http://127.0.0.1:{port}")
    }

    /// The spans received so far, in the order they were written.
    pub fn spans(&self) -> Vec<Span> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        // A line being written has no newline yet: it is read next time.
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("the OTLP receiver wrote {line:?}: {e}"))
            })
            .collect()
    }

    /// At least `n` spans, once they came; the test fails if they do not
    /// within `timeout`.
    pub fn wait_for_spans(&self, n: usize, timeout: Duration) -> Vec<Span> {
        let mut spans = Vec::new();
        let came = wait_until(timeout, || {
            spans = self.spans();
            spans.len() >= n
        });
        assert!(
            came,
            "{n} spans expected within {timeout:?}, {} came: {:?}; receiver's stderr: {}",
            spans.len(),
            spans.iter().map(|s| &s.name).collect::<Vec<_>>(),
            self.stderr()
        );
        spans
    }

    /// Stops it (SIGKILL), as a collector that went away; what it wrote
    /// stays readable.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("receiver.err")).unwrap_or_default()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.kill();
        remove_test_dir(&self.dir);
    }
}
