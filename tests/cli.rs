//! The command line: `check` on good and bad files, and a bad config never starts.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn check(file: &str) -> std::process::Output {
    Command::new(binary())
        .args(["check", file])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run floodgate check")
}

/// Every fixture under tests/fixtures/bad is refused with exactly the message
/// in its `.expected` file: the file, the line, the key and the reason.
#[test]
fn bad_configs_are_refused_with_their_exact_messages() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad");
    let mut fixtures: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= 15, "fixtures missing: {}", fixtures.len());
    for fixture in fixtures {
        let name = fixture.file_name().and_then(|n| n.to_str()).expect("name");
        let relative = format!("tests/fixtures/bad/{name}");
        let expected = std::fs::read_to_string(fixture.with_extension("expected"))
            .unwrap_or_else(|_| panic!("{name} has no .expected file"));
        let out = check(&relative);
        assert!(!out.status.success(), "{name} was accepted");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("error: {expected}"),
            "{name}"
        );
        assert!(
            expected.starts_with(&relative),
            "{name}: message names the file"
        );
    }
}

#[test]
fn shipped_configs_pass_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec!["proxy.toml".to_string()];
    for entry in std::fs::read_dir(root.join("examples"))
        .expect("examples")
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "toml") {
            files.push(format!("examples/{}", entry.file_name().to_string_lossy()));
        }
    }
    // Certificates named by a shipped config are made by a test CA, and the
    // file checked with their paths in place of the real ones.
    let certs = temp_dir();
    make_certificates(&certs);
    make_named_certificate(&certs, "api", "api.example.org", "DNS:api.example.org");
    let tls_paths = [
        ("/etc/floodgate/tls/fullchain.pem", "server.crt"),
        ("/etc/floodgate/tls/privkey.pem", "server.key"),
        ("/etc/floodgate/tls/api.pem", "api.crt"),
        ("/etc/floodgate/tls/api.key", "api.key"),
    ];
    for file in files {
        let text = std::fs::read_to_string(root.join(&file)).expect("read");
        let file = if text.contains("/etc/floodgate/tls/") {
            let mut local = text.clone();
            for (real, made) in tls_paths {
                local = local.replace(real, &certs.join(made).display().to_string());
            }
            let path = certs.join(Path::new(&file).file_name().expect("name"));
            std::fs::write(&path, local).expect("write");
            path.display().to_string()
        } else {
            file
        };
        let out = check(&file);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.starts_with(&format!("{file}: ok")), "{stdout}");
        assert!(stdout.contains("layers"), "{stdout}");
    }
}

#[test]
fn the_proxy_does_not_start_on_a_bad_config() {
    let out = Command::new(binary())
        .args(["--config", "tests/fixtures/bad/zero_rate.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run floodgate");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "tests/fixtures/bad/zero_rate.toml:12: limits[0].refill_rate: must be more than 0"
        ),
        "{stderr}"
    );
}

/// A clock file (`FLOODGATE_CLOCK_FILE`) that cannot be read, or holds no
/// whole number of milliseconds, stops the start with its reason.
#[test]
fn a_missing_or_malformed_clock_file_stops_the_start() {
    let upstream = Upstream::start();
    let config = ConfigBuilder::new(upstream.addr).write();
    let dir = temp_dir();
    let missing = dir.join("no-such-clock");
    let malformed = dir.join("clock");
    std::fs::write(&malformed, "soon").expect("write clock");
    for (clock, reason) in [
        (&missing, "cannot read it: "),
        (
            &malformed,
            "it must hold a whole number of milliseconds, got \"soon\"",
        ),
    ] {
        let mut child = Command::new(binary())
            .arg("--config")
            .arg(&config)
            .env("FLOODGATE_CLOCK_FILE", clock)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run floodgate");
        let exited = wait_until(Duration::from_secs(20), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
            panic!("started with the clock file {}", clock.display());
        }
        let out = child.wait_with_output().expect("output");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected = format!("FLOODGATE_CLOCK_FILE {}: {reason}", clock.display());
        assert!(stderr.contains(&expected), "{stderr}");
    }
}

/// `floodgate` with `args`, FLOODGATE_CONFIG as `config` says (unset when
/// None), in the repository's root.
fn floodgate(args: &[&str], config: Option<&Path>) -> std::process::Output {
    let mut command = Command::new(binary());
    command.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    match config {
        Some(path) => command.env("FLOODGATE_CONFIG", path),
        None => command.env_remove("FLOODGATE_CONFIG"),
    };
    command.output().expect("run floodgate")
}

/// A usage error exits 2, its reason in stderr with the usage of the
/// command it was made on (a bad value, with where to read more), nothing
/// in stdout.
#[test]
fn unknown_arguments_print_usage() {
    for (args, reason, usage) in [
        (
            &["--bogus"][..],
            "--bogus",
            "Usage: floodgate --config <FILE>",
        ),
        (&[], "--config <FILE>", "Usage: floodgate --config <FILE>"),
        (&["check"], "<FILE>", "Usage: floodgate check"),
        (
            &["check", "proxy.toml", "--bogus"],
            "--bogus",
            "Usage: floodgate check",
        ),
        (
            &["simulate", "--bogus", "x"],
            "--bogus",
            "Usage: floodgate simulate",
        ),
        (
            &[
                "simulate",
                "-c",
                "proxy.toml",
                "--limit",
                "per-ip",
                "--pattern",
                "burst:1@0s",
                "--span",
                "all",
            ],
            "[possible values: arrivals, whole]",
            "For more information, try '--help'.",
        ),
        (&["run"], "--config <FILE>", "Usage: floodgate run"),
    ] {
        let out = floodgate(args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(stderr.contains(reason), "{args:?}: {stderr}");
        assert!(stderr.contains(usage), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// `--help` and `-h` on each subcommand print its usage and exit 0: no
/// file named `--help` is read, no flag asks for a value.
#[test]
fn subcommands_print_their_help_without_reading_files() {
    let empty = temp_dir();
    for (subcommand, says) in [
        (
            "check",
            &["Usage: floodgate check <FILE>", "FLOODGATE_CONFIG"][..],
        ),
        (
            "simulate",
            &[
                "Usage: floodgate simulate [OPTIONS] --config <FILE> --limit <NAME> --pattern <PATTERN>",
                "--config <FILE>",
                "FLOODGATE_CONFIG",
                "burst:100@0s",
                "steady:5/s@0s-60s",
                "boundary:100@60s",
                "a file of arrival times in seconds",
                "--out <FILE>",
                "--span <SPAN>",
                "arrivals",
                "whole",
                "--compare <ALGORITHM,...>",
            ],
        ),
        (
            "run",
            &["Usage: floodgate run --config <FILE>", "FLOODGATE_CONFIG"],
        ),
    ] {
        for help in ["--help", "-h"] {
            let out = Command::new(binary())
                .args([subcommand, help])
                .current_dir(&empty)
                .env_remove("FLOODGATE_CONFIG")
                .output()
                .expect("run floodgate");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{subcommand} {help}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            for said in says {
                assert!(
                    stdout.contains(said),
                    "{subcommand} {help}: {said}: {stdout}"
                );
            }
        }
    }
    remove_test_dir(&empty);
}

/// The top-level help names every way to run floodgate; the version line
/// is `floodgate <version>`, as it always was.
#[test]
fn the_help_names_the_subcommands_and_the_version_line_stays() {
    for help in ["--help", "-h"] {
        let out = floodgate(&[help], None);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{help}");
        for said in [
            "Usage: floodgate --config <FILE>",
            "floodgate <COMMAND>",
            "run ",
            "check ",
            "simulate ",
            "-c, --config <FILE>",
            "FLOODGATE_CONFIG",
            "RUST_LOG",
            "-V, --version",
        ] {
            assert!(stdout.contains(said), "{help}: {said}: {stdout}");
        }
    }
    for version in ["--version", "-V"] {
        let out = floodgate(&[version], None);
        assert!(out.status.success(), "{version}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("floodgate {}\n", env!("CARGO_PKG_VERSION")),
            "{version}"
        );
    }
}

/// FLOODGATE_CONFIG names the file `check` and `simulate` read when none
/// is given; one given on the command line wins; set but empty, it is
/// as good as unset.
#[test]
fn check_and_simulate_read_the_file_floodgate_config_names() {
    let file = ConfigBuilder::new("127.0.0.1:2".parse().expect("addr"))
        .listen("127.0.0.1:1".parse().expect("addr"))
        .limit(Limit::fixed_window("per-minute", "ip", 100, "1m"))
        .write();
    let bad = Path::new("tests/fixtures/bad/zero_rate.toml");
    let path = file.display().to_string();

    let out = floodgate(&["check"], Some(&file));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with(&format!("{path}: ok")), "{stdout}");
    assert!(stdout.contains("per-minute"), "{stdout}");

    for env in [bad, Path::new("")] {
        let out = floodgate(&["check", &path], Some(env));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.starts_with(&format!("{path}: ok")),
            "{env:?}: {stdout}"
        );
    }
    let out = floodgate(&["check"], Some(bad));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tests/fixtures/bad/zero_rate.toml:12:"),
        "{out:?}"
    );

    let simulate = [
        "simulate",
        "--limit",
        "per-minute",
        "--pattern",
        "burst:150@0s",
    ];
    let out = floodgate(&simulate, Some(&file));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().next(),
        Some("admitted: 100, refused: 50"),
        "{stdout}"
    );
    let mut given = simulate.to_vec();
    given.extend(["--config", &path]);
    let out = floodgate(&given, Some(bad));
    assert!(out.status.success(), "{out:?}");
}

/// The proxy runs with the file FLOODGATE_CONFIG names: `floodgate` with no
/// argument, and `floodgate run`; `--config` (or `-c`) wins over it.
#[test]
fn the_proxy_runs_with_the_file_floodgate_config_names() {
    let bad = Path::new("tests/fixtures/bad/zero_rate.toml");
    let refused =
        "tests/fixtures/bad/zero_rate.toml:12: limits[0].refill_rate: must be more than 0";
    let missing = Path::new("no/such/proxy.toml");
    for (args, env) in [
        (&[][..], bad),
        (&["run"], bad),
        (&["--config", bad.to_str().expect("path")], missing),
        (&["-c", bad.to_str().expect("path")], missing),
        (&["run", "--config", bad.to_str().expect("path")], missing),
        (&["run", "-c", bad.to_str().expect("path")], missing),
    ] {
        let out = floodgate(args, Some(env));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(refused), "{args:?}: {stderr}");
    }

    // And a good one is served.
    let upstream = Upstream::start();
    let addr = local_addr();
    let config = ConfigBuilder::new(upstream.addr).listen(addr).write();
    let log_path = config.with_extension("log");
    let log = std::fs::File::create(&log_path).expect("log");
    let child = Command::new(binary())
        .env("FLOODGATE_CONFIG", &config)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("run floodgate");
    let mut proxy = Stopped(child);
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let serving = format!("from {}", config.display());
    let listens = wait_until(Duration::from_secs(20), || {
        matches!(proxy.0.try_wait(), Ok(Some(_)))
            || (read_log().contains(&serving) && std::net::TcpStream::connect(addr).is_ok())
    });
    assert!(
        listens && matches!(proxy.0.try_wait(), Ok(None)),
        "{}",
        read_log()
    );
    let answer = request(addr, "GET", "/", &[], b"");
    assert_eq!(answer.status, 200, "{}", read_log());
    assert_eq!(upstream.count(), 1);
    proxy.0.kill().expect("stop floodgate");
}

/// A child process killed (by its PID) when dropped, should the test fail
/// while it runs.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn check_prints_the_resolved_layers() {
    let file = ConfigBuilder::new("127.0.0.1:2".parse().expect("addr"))
        .listen("127.0.0.1:1".parse().expect("addr"))
        .raw("[clients.api_keys]\n\"k\" = \"pro\"")
        .limit(
            Limit::token_bucket("per-account", "api_key", 100, 10.0)
                .line("[limits.tiers.pro]\ncapacity = 500"),
        )
        .write();
    let out = check(file.to_str().expect("path"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("per-account      key=api_key    token_bucket capacity=100 refill_rate=10.000/s on all requests"), "{stdout}");
    assert!(
        stdout.contains(
            "algorithm token_bucket: bursts up to capacity, then refill_rate per second on average"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("tier pro: token_bucket capacity=500 refill_rate=10.000/s"),
        "{stdout}"
    );
    assert!(
        stdout.contains("store     memory (at most 1000000 keys)"),
        "{stdout}"
    );
}

#[test]
fn check_says_where_spans_go_and_whose_trace_is_continued() {
    let file = ConfigBuilder::new("127.0.0.1:2".parse().expect("addr"))
        .listen("127.0.0.1:1".parse().expect("addr"))
        .raw("[tracing]\nendpoint = \"http://127.0.0.1:4318\"\nprotocol = \"http\"\nsample_ratio = 0.05")
        .write();
    let out = check(file.to_str().expect("path"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("tracing   spans to http://127.0.0.1:4318/v1/traces (OTLP/HTTP), 5% of new traces, at most 2000 spans/s; a caller's trace continued from [clients].trusted_proxies only"),
        "{stdout}"
    );
}

/// The limits an API sells per day, week and month: `check` refused every
/// one of them while a window's arithmetic formed limit × window in
/// microseconds (at most 26,062 a day, 3,723 a week, 868 in 30 days).
#[test]
fn check_accepts_the_limits_people_sell_per_day_week_and_month() {
    let windows = [
        ("fixed_window", 100_000u64, "1d"),
        ("sliding_window", 100_000, "1d"),
        ("sliding_log", 100_000, "1d"),
        ("fixed_window", 50_000, "7d"),
        ("sliding_window", 50_000, "7d"),
        ("sliding_log", 50_000, "7d"),
        ("fixed_window", 4_000_000_000, "30d"),
        ("sliding_window", 4_000_000_000, "30d"),
    ];
    let mut config = ConfigBuilder::new("127.0.0.1:2".parse().expect("addr"))
        .listen("127.0.0.1:1".parse().expect("addr"));
    for (algorithm, limit, window) in windows {
        let name = format!("{algorithm}-{limit}-per-{window}");
        config = config.limit(match algorithm {
            "fixed_window" => Limit::fixed_window(&name, "api_key", limit, window),
            "sliding_window" => Limit::sliding_window(&name, "api_key", limit, window),
            _ => Limit::sliding_log(&name, "api_key", limit, window),
        });
    }
    // And a token bucket at both ends of its range.
    let config = config
        .limit(Limit::token_bucket("bytes", "global", 4_294_967_295, 1e7))
        .limit(Limit::token_bucket(
            "yearly",
            "api_key",
            71,
            1.0 / 31_536_000.0,
        ));
    let file = config.write();
    let out = check(file.to_str().expect("path"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (algorithm, limit, _) in windows {
        assert!(
            stdout.contains(&format!("{algorithm} limit={limit} window=")),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("token_bucket capacity=4294967295 refill_rate=10000000.000/s"),
        "{stdout}"
    );
}

#[test]
fn check_warns_about_a_redis_store_without_an_identity_secret() {
    let warning = "warning: a Redis store without an identity secret";
    let out = check("examples/full.toml");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(warning), "{stdout}");
    let with_secret = Command::new(binary())
        .args(["check", "examples/full.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("FLOODGATE_IDENTITY_SECRET", "0123456789abcdef0123")
        .output()
        .expect("run check");
    let stdout = String::from_utf8_lossy(&with_secret.stdout);
    assert!(!stdout.contains(warning), "{stdout}");
    assert!(stdout.contains("keyed by the shared secret"), "{stdout}");
    // The memory store draws its own key and needs no warning.
    let out = check("proxy.toml");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("keyed by a secret drawn at start"),
        "{stdout}"
    );
}

#[test]
fn check_warns_about_a_key_a_client_can_leave_out() {
    let dir = common::temp_dir();
    let path = dir.join("proxy.toml");
    let limit = |on_missing: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\n[upstream]\nservers = [\"127.0.0.1:8000\"]\n\
             [[limits]]\nname = \"per-ip\"\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n\
             [[limits]]\nname = \"per-tenant\"\nkey = \"header:X-Tenant\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n{on_missing}"
        )
    };
    let warning = "warning: a request without header:x-tenant skips this limit";
    for (on_missing, warned) in [("", true), ("on_missing = \"ip\"\n", false)] {
        std::fs::write(&path, limit(on_missing)).expect("write config");
        let out = Command::new(binary())
            .arg("check")
            .arg(&path)
            .output()
            .expect("run check");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert_eq!(stdout.contains(warning), warned, "{stdout}");
    }
}

/// The image's configuration: the proxy on all interfaces, the admin
/// listener where the image's health check reaches it and the world does
/// not; and it passes `check`.
#[test]
fn the_image_binds_the_admin_listener_to_its_own_loopback() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    assert!(
        dockerfile.contains(r#"admin_listen = "127.0.0.1:9091""#),
        "the image's admin_listen"
    );
    assert!(
        dockerfile.contains("/dev/tcp/127.0.0.1/9091"),
        "the health check asks loopback"
    );
    assert!(
        !dockerfile
            .lines()
            .any(|l| l.starts_with("EXPOSE") && l.contains("9091")),
        "the admin port is not exposed"
    );
    // What the image's sed makes of proxy.toml.
    let shipped = std::fs::read_to_string(root.join("proxy.toml")).expect("proxy.toml");
    assert!(shipped.contains("\nlisten = \"127.0.0.1:8080\"\n"));
    let image = shipped.replace(
        "\nlisten = \"127.0.0.1:8080\"\n",
        "\nlisten = \"0.0.0.0:8080\"\nadmin_listen = \"127.0.0.1:9091\"\n",
    );
    let dir = temp_dir();
    let path = dir.join("proxy.toml");
    std::fs::write(&path, image).expect("write");
    let out = check(&path.display().to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    remove_test_dir(&dir);
}
