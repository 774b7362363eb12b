//! `floodgate simulate`: the real algorithm code over synthetic arrivals,
//! through the real binary.

mod common;

use std::process::Command;

use common::{binary, temp_dir};

fn config(dir: &std::path::Path, algorithm_lines: &str) -> std::path::PathBuf {
    let path = dir.join("proxy.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"127.0.0.1:8000\"]\n\
             [[limits]]\nname = \"per-minute\"\nkey = \"ip\"\n{algorithm_lines}\n\
             [[limits]]\nname = \"in-flight\"\nkey = \"ip\"\nalgorithm = \"concurrency\"\nmax = 2\n"
        ),
    )
    .expect("config");
    path
}

fn simulate(config: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(binary())
        .arg("simulate")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("run simulate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_fixed_window_boundary_burst_and_what_other_algorithms_make_of_it() {
    let dir = temp_dir();
    let fixed = config(
        &dir,
        "algorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"",
    );
    let chart = dir.join("chart.svg");
    let (ok, out, err) = simulate(
        &fixed,
        &[
            "--limit",
            "per-minute",
            "--pattern",
            "boundary:100@60s",
            "--out",
            chart.to_str().expect("path"),
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().next(),
        Some("admitted: 200, refused: 0"),
        "{out}"
    );
    assert!(out.contains("most admitted in any 1m: 200"), "{out}");
    // The chart is XML (checked by Python's parser).
    let parsed = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom as m; m.parse(sys.argv[1])",
        ])
        .arg(&chart)
        .status()
        .expect("python3");
    assert!(parsed.success(), "the chart does not parse");

    let sliding = config(
        &dir,
        "algorithm = \"sliding_window\"\nlimit = 100\nwindow = \"1m\"",
    );
    let (ok, out, err) = simulate(
        &sliding,
        &["--limit", "per-minute", "--pattern", "boundary:100@60s"],
    );
    assert!(ok, "{err}");
    let admitted: usize = out
        .strip_prefix("admitted: ")
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary: {out}"));
    assert!(admitted < 200, "a sliding window admits fewer: {admitted}");

    let (ok, out, err) = simulate(
        &fixed,
        &[
            "--limit",
            "per-minute",
            "--pattern",
            "boundary:100@60s",
            "--compare",
            "sliding_log,leaky_bucket",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.matches("admitted: ").count(), 3, "{out}");
    assert!(
        out.contains("# sliding_log limit=100 window=1m\nadmitted: 100, refused: 100"),
        "{out}"
    );
}

#[test]
fn arrivals_from_a_file_and_clear_errors() {
    let dir = temp_dir();
    let bucket = config(
        &dir,
        "algorithm = \"token_bucket\"\ncapacity = 2\nrefill_rate = 1",
    );
    let times = dir.join("arrivals.txt");
    std::fs::write(&times, "# seconds\n0\n0\n0\n1.5\n").expect("arrivals");
    let (ok, out, _) = simulate(
        &bucket,
        &[
            "--limit",
            "per-minute",
            "--pattern",
            times.to_str().expect("path"),
        ],
    );
    assert!(ok);
    assert_eq!(out.lines().next(), Some("admitted: 3, refused: 1"), "{out}");
    let (ok, _, err) = simulate(&bucket, &["--limit", "nope", "--pattern", "burst:1@0s"]);
    assert!(!ok && err.contains("no limit named nope"), "{err}");
    let (ok, _, err) = simulate(
        &bucket,
        &["--limit", "in-flight", "--pattern", "burst:1@0s"],
    );
    assert!(!ok && err.contains("requests in flight"), "{err}");
    let (ok, _, err) = simulate(
        &bucket,
        &["--limit", "per-minute", "--pattern", "wave:1@0s"],
    );
    assert!(!ok && err.contains("is not a pattern part"), "{err}");
}
