//! The access log and the request metrics: one JSON line per request with
//! every field, a full queue that drops and counts instead of waiting, and a
//! file reopened on SIGHUP after rotation.

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// In front of `upstream`, with an admin listener and the access log
/// written to `access`.
fn logging(upstream: &Upstream, access: &Path) -> ConfigBuilder {
    ConfigBuilder::new(upstream.addr)
        .admin()
        .raw(&format!("[log]\naccess = \"{}\"", access.display()))
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn every_request_is_one_json_line_with_every_field() {
    let upstream = Upstream::start();
    let access = temp_dir().join("access.log");
    let proxy = logging(&upstream, &access)
        .raw("[clients.api_keys]\n\"key-7731\" = \"pro\"\n\n[exempt]\npaths = [\"/healthz\"]")
        .limit(Limit::fixed_window("per-ip", "ip", 2, "1h"))
        .start();
    let key = ("X-API-Key", "key-7731");
    proxy.send("GET", "/a?secret=query-5521", &[key]);
    proxy.send("GET", "/b", &[key]);
    proxy.send("GET", "/c", &[key]);
    proxy.get("/healthz");
    proxy.get("/x/../../etc");
    assert!(wait_until(Duration::from_secs(5), || lines(&access).len() == 5));
    let text = std::fs::read_to_string(&access).expect("log");
    assert!(
        !text.contains("query-5521") && !text.contains("key-7731"),
        "{text}"
    );
    let all = lines(&access);
    let fields = [
        "time",
        "request_id",
        "client",
        "client_label",
        "tier",
        "method",
        "path",
        "status",
        "bytes",
        "duration_ms",
        "upstream_ms",
        "limit",
        "remaining",
        "store",
    ];
    for line in &all {
        for field in fields {
            assert!(line.get(field).is_some(), "{field} missing: {line}");
        }
    }
    // Each line is written once its request has ended, which for requests
    // one after the other may be in either order: found by path.
    let by_path = |path: &str| {
        all.iter()
            .find(|l| l["path"] == path)
            .unwrap_or_else(|| panic!("no line for {path}: {text}"))
    };
    let first = by_path("/a");
    assert_eq!(first["status"], 200);
    assert_eq!(first["tier"], "pro");
    assert_eq!(first["limit"], "per-ip");
    assert_eq!(first["remaining"], 1);
    assert_eq!(first["store"], "memory");
    assert_eq!(first["bytes"], 2);
    assert!(first["upstream_ms"].as_f64().is_some());
    assert!(first["client_label"]
        .as_str()
        .is_some_and(|l| l.starts_with("c#")));
    assert!(first["time"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z') && t.len() == 24));
    assert_eq!(by_path("/c")["status"], 429);
    assert!(by_path("/c")["upstream_ms"].is_null());
    assert_eq!(
        by_path("/healthz")["limit"],
        serde_json::Value::Null,
        "exempt"
    );
    assert_eq!(
        all.iter().filter(|l| l["status"] == 400).count(),
        1,
        "the path that climbs out of the root"
    );
    // The request metrics saw the same.
    assert_eq!(
        proxy.metric("floodgate_requests_total{status_class=\"2xx\"}"),
        3.0
    );
    assert_eq!(
        proxy.metric("floodgate_requests_total{status_class=\"4xx\"}"),
        2.0
    );
    assert_eq!(
        proxy.metric("floodgate_request_duration_seconds_count"),
        5.0
    );
    assert_eq!(
        proxy.metric("floodgate_upstream_duration_seconds_count"),
        3.0
    );
    assert_eq!(
        proxy.metric("floodgate_decisions_total{limit=\"per-ip\",outcome=\"near_limit\"}"),
        1.0,
        "the second admitted request left 0 of 2"
    );
    record(
        "access_log_line",
        &format!("{}\n", text.lines().next().unwrap_or_default()),
    );
}

#[test]
fn the_file_is_reopened_on_sighup_after_a_rotation() {
    let upstream = Upstream::start();
    let dir = temp_dir();
    let access = dir.join("access.log");
    let proxy = logging(&upstream, &access).start();
    proxy.get("/before");
    assert!(wait_until(Duration::from_secs(5), || lines(&access).len() == 1));
    let rotated = dir.join("access.log.1");
    std::fs::rename(&access, &rotated).expect("rotate");
    proxy.get("/between");
    // Written (by the log's own thread) to the file still open, before the
    // reload reopens it.
    assert!(wait_until(Duration::from_secs(5), || lines(&rotated).len() == 2));
    proxy.signal("-HUP");
    assert!(wait_until(Duration::from_secs(5), || proxy
        .log()
        .contains("reloaded")));
    proxy.get("/after");
    assert!(wait_until(Duration::from_secs(5), || lines(&access).len() == 1));
    assert_eq!(lines(&access)[0]["path"], "/after");
    let old: Vec<String> = lines(&rotated)
        .iter()
        .map(|l| l["path"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(old, ["/before", "/between"]);
}

#[test]
fn a_log_that_cannot_keep_up_drops_lines_and_never_holds_a_request() {
    let upstream = Upstream::start();
    let dir = temp_dir();
    let fifo = dir.join("access.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    // A reader that never reads: once the pipe's buffer is full, the
    // writer thread blocks on every line.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(0o4000) // O_NONBLOCK: do not wait for a writer
        .open(&fifo)
        .expect("fifo reader");
    let proxy = logging(&upstream, &fifo).start();
    let total = 24_000;
    let threads = 4;
    let addr = proxy.addr;
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || keepalive_gets(addr, "/fast", vec![Vec::new(); total / threads]))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    // Every request was answered although the log stopped moving.
    assert_eq!(statuses.len(), total);
    assert_eq!(count_status(&statuses, 200), total);
    let dropped = proxy.metric("floodgate_access_log_dropped_total");
    assert!(dropped > 0.0, "lines were dropped");
    assert!(dropped < total as f64);
    record(
        "access_log_full_queue",
        &format!("{total} requests with the log's reader stopped: all answered 200, {dropped} lines dropped\n"),
    );
}
