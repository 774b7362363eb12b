//! The Grafana dashboard and the Prometheus alert rules in examples/ name
//! only series the binary exports, and the rules have the shape Prometheus
//! loads (checked with promtool where it is installed).

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use common::{ConfigBuilder, Limit, Upstream};

/// The metric names an expression reads.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("floodgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

fn exported_families() -> HashSet<String> {
    let upstream = Upstream::start();
    let proxy = ConfigBuilder::new(upstream.addr)
        .admin()
        .limit(
            Limit::fixed_window("per-ip", "ip", 1, "1h")
                .line("ban = { after = 3, within = \"10m\", duration = \"1h\" }"),
        )
        .start();
    for _ in 0..3 {
        proxy.get("/");
    }
    proxy
        .admin_get("/metrics")
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn assert_exported(families: &HashSet<String>, expr: &str, what: &str) {
    for name in metric_names(expr) {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| families.contains(*base))
            .unwrap_or(&name);
        assert!(families.contains(family), "{what}: {name} is not exported");
    }
}

#[test]
fn the_dashboard_and_the_alert_rules_read_only_exported_series() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let families = exported_families();
    assert!(
        families.contains("floodgate_decisions_total"),
        "{families:?}"
    );

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    let mut exprs = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expr");
            assert_exported(&families, expr, &format!("panel {}", panel["title"]));
            exprs += 1;
        }
    }
    assert!(exprs >= 15, "{exprs} queries");

    // The rules file as Prometheus reads it (YAML), through Python's parser.
    let rules = root.join("prometheus-alerts.yml");
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(&rules)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rules_list = parsed["groups"][0]["rules"].as_array().expect("rules");
    assert!(rules_list.len() >= 10);
    for rule in rules_list {
        let name = rule["alert"].as_str().expect("an alert name");
        assert!(rule["labels"]["severity"].is_string(), "{name}: a severity");
        assert!(
            rule["annotations"]["summary"].is_string(),
            "{name}: a summary"
        );
        assert_exported(&families, rule["expr"].as_str().expect("an expr"), name);
    }
    if Command::new("promtool").arg("--version").output().is_ok() {
        let checked = Command::new("promtool")
            .args(["check", "rules"])
            .arg(&rules)
            .output()
            .expect("promtool");
        assert!(checked.status.success(), "{checked:?}");
    }
}
