//! The status page in a real headless browser (Chromium, driven by
//! tests/status_page.py through Selenium): it logs in with the token,
//! renders its charts from live traffic, and its screenshot is written to
//! target/status-page.png (docs/book/images/status-page.png, shown in the book, is a copy).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::admin_token::{TokenFile, TOKEN};
use common::{request, wait_until, ConfigBuilder, Limit, Upstream};
use serde_json::Value;

/// The sum of one series of limit `name` in `/v1/status`.
fn plotted(status: &Value, name: &str, series: &str) -> f64 {
    status["limits"]
        .as_array()
        .and_then(|limits| limits.iter().find(|l| l["name"] == name))
        .and_then(|l| l["series"][series].as_array())
        .map_or(0.0, |points| points.iter().filter_map(Value::as_f64).sum())
}

#[test]
fn the_status_page_renders_live_traffic_in_a_real_browser() {
    let upstream = Upstream::start();
    let token = TokenFile::new();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(Limit::token_bucket("per-ip", "ip", 5, 2.0))
        .limit(Limit::sliding_window("search", "ip", 100, "1m").matching("paths = [\"/search\"]"))
        .limit(
            Limit::fixed_window("new-search", "ip", 10, "1m")
                .matching("paths = [\"/search\"]")
                .line("shadow = true"),
        )
        .raw(&token.section())
        .start();
    let admin = proxy.admin.expect("admin listener");
    proxy.signal("-HUP");
    assert!(wait_until(Duration::from_secs(10), || {
        proxy.metric("floodgate_config_reloads_total{result=\"ok\"}") == 1.0
    }));
    // Traffic until a sample of the page's charts holds both admitted and
    // refused requests (one sample per 5 s).
    let bearer = format!("Bearer {TOKEN}");
    let charted = wait_until(Duration::from_secs(30), || {
        for _ in 0..8 {
            proxy.get("/search");
        }
        let r = request(
            admin,
            "GET",
            "/v1/status",
            &[("Authorization", &bearer)],
            b"",
        );
        let status: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        plotted(&status, "per-ip", "admitted") > 0.0 && plotted(&status, "per-ip", "refused") > 0.0
    });
    assert!(charted, "no sample with traffic: {}", proxy.log());

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/status_page.py");
    let screenshot = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map_or_else(
            || PathBuf::from("status-page.png"),
            |t| t.join("status-page.png"),
        );
    // A browser that hangs must fail the test, not hold the suite.
    let out = Command::new("timeout")
        .args(["120", "python3"])
        .arg(script)
        .arg(format!("http://{admin}"))
        .arg(&token.0)
        .arg("per-ip")
        .arg(&screenshot)
        .output()
        .expect("run timeout python3");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&screenshot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
}
