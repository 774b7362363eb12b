//! The command line: parse arguments, load the config, build, run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

// Pingora allocates many small objects on every request. mimalloc serves them
// from thread-local free lists: about 17,000 fewer instructions per proxied
// request than glibc's allocator (callgrind, scripts/loadtest.sh's memory case).
// Its v2 line: about 2,400 fewer instructions per refusal than v3, whose
// fresh-page path showed up on every request (jemalloc: 3,000 more than
// mimalloc per proxied request).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use floodgate::config::{Config, Inputs};
use floodgate_limiter::clock::{Clock, SystemClock};
use floodgate_limiter::log_throttle::LogThrottle;

const USAGE: &str = "\
floodgate: an edge rate-limiting reverse proxy

usage:
  floodgate --config FILE    run the proxy with FILE (e.g. proxy.toml)
  floodgate check FILE       validate FILE and print the resolved limits
  floodgate simulate --config FILE --limit NAME --pattern PATTERN
            [--out chart.svg] [--span arrivals|whole]
            [--compare token_bucket,sliding_window,...]
                             run limit NAME's algorithm over PATTERN (burst:100@0s,
                             steady:5/s@0s-60s, boundary:100@60s, joined with
                             commas; or a file of arrival times in seconds) and
                             print what it admitted; the chart's time axis
                             spans the arrivals, or from t = 0 with --span
                             whole; --compare runs the same numbers through
                             other algorithms
  floodgate --version

Logging follows RUST_LOG (default: info).";

enum Command {
    Run(PathBuf),
    Check(PathBuf),
    Simulate(Simulation),
    Help,
    Version,
}

/// `floodgate simulate`'s arguments.
struct Simulation {
    config: PathBuf,
    limit: String,
    pattern: String,
    out: Option<PathBuf>,
    span: floodgate::cli::simulate::Span,
    compare: Vec<String>,
}

fn parse_simulation(args: &[String]) -> Result<Command, String> {
    let mut config = None;
    let mut limit = None;
    let mut pattern = None;
    let mut out = None;
    let mut span = floodgate::cli::simulate::Span::default();
    let mut compare = Vec::new();
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .clone();
        match flag.as_str() {
            "--config" | "-c" => config = Some(PathBuf::from(value)),
            "--limit" => limit = Some(value),
            "--pattern" => pattern = Some(value),
            "--out" => out = Some(PathBuf::from(value)),
            "--span" => {
                span = floodgate::cli::simulate::Span::from_name(&value)
                    .ok_or_else(|| format!("--span is arrivals or whole, not {value}"))?
            }
            "--compare" => compare = value.split(',').map(str::to_string).collect(),
            other => return Err(format!("unexpected argument: {other}")),
        }
    }
    Ok(Command::Simulate(Simulation {
        config: config.ok_or("simulate needs --config FILE")?,
        limit: limit.ok_or("simulate needs --limit NAME")?,
        pattern: pattern.ok_or("simulate needs --pattern PATTERN")?,
        out,
        span,
        compare,
    }))
}

fn parse_args(args: &[String]) -> Result<Command, String> {
    match args {
        [cmd, rest @ ..] if cmd == "simulate" => parse_simulation(rest),
        [flag, file] if flag == "--config" || flag == "-c" => Ok(Command::Run(file.into())),
        [cmd, file] if cmd == "check" => Ok(Command::Check(file.into())),
        [flag] if flag == "--help" || flag == "-h" => Ok(Command::Help),
        [flag] if flag == "--version" || flag == "-V" => Ok(Command::Version),
        [] => Err("missing --config FILE".into()),
        _ => Err(format!("unexpected arguments: {}", args.join(" "))),
    }
}

fn main() -> ExitCode {
    init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Help => {
            println!("{USAGE}");
            Ok(())
        }
        Command::Version => {
            println!("floodgate {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Check(file) => check(&file),
        Command::Simulate(simulation) => simulate(&simulation),
        Command::Run(file) => run(&file),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `RUST_LOG` (default info), with Pingora's lines capped whatever it says:
/// they carry what floodgate must never log (query strings in its request
/// summaries; at debug and trace, raw header blocks with API keys and
/// cookies), or come once per misbehaving connection. floodgate logs
/// requests, failures and refusals itself.
fn init_logging() {
    let inner =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(CappedLogger(inner))).is_ok() {
        log::set_max_level(max);
    }
}

/// Drops records of Pingora's crates above their cap, checked on the
/// record's target, so that no RUST_LOG directive (however specific) lifts
/// it; and lets through at most one of Pingora's lines a second (a client
/// can make it write one per failed handshake).
struct CappedLogger(env_logger::Logger);

static PINGORA_LINES: LogThrottle = LogThrottle::new(std::time::Duration::from_secs(1));

impl CappedLogger {
    fn allowed(metadata: &log::Metadata<'_>) -> bool {
        let target = metadata.target();
        if target.starts_with("pingora_proxy") {
            false
        } else if target.starts_with("pingora") {
            metadata.level() <= log::Level::Info
        } else {
            true
        }
    }
}

impl log::Log for CappedLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        Self::allowed(metadata) && self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if !Self::allowed(record.metadata()) || !self.0.enabled(record.metadata()) {
            return;
        }
        // Pingora's pool lost a race for an idle upstream connection (its
        // idle watch, on another thread, still held it): the request opens a
        // new connection and goes on. Nothing for an operator to do; the
        // new connections are counted in floodgate_upstream_connections_total.
        if record.target().starts_with("pingora_core::connectors")
            && record.args().as_str() == Some("failed to acquire reusable stream")
        {
            return;
        }
        if record.target().starts_with("pingora") && record.level() <= log::Level::Warn {
            let Some(dropped) = PINGORA_LINES.due(SystemClock.now_us()) else {
                return;
            };
            if dropped > 0 {
                self.0.log(
                    &log::Record::builder()
                        .level(log::Level::Warn)
                        .target("floodgate")
                        .args(format_args!(
                            "{dropped} more warnings and errors from Pingora in the last seconds were not logged"
                        ))
                        .build(),
                );
            }
        }
        self.0.log(record);
    }

    fn flush(&self) {
        self.0.flush()
    }
}

fn check(file: &std::path::Path) -> anyhow::Result<()> {
    let config = Config::load(file, &Inputs::from_process())?;
    print!("{}", floodgate::cli::summary::describe(&config));
    Ok(())
}

fn run(file: &std::path::Path) -> anyhow::Result<()> {
    // Kept by the running process: reloads read the same environment, and
    // the same table of run-time API keys.
    let inputs = Inputs::from_process()
        .with_run_time_keys(std::sync::Arc::default())
        .with_run_time_overrides(std::sync::Arc::default());
    let config = Config::load(file, &inputs)?;
    let server = floodgate::server::build(&config, inputs).context("cannot start")?;
    log::info!(
        "floodgate {} serving {} with {} limit(s) from {}",
        env!("CARGO_PKG_VERSION"),
        config
            .server
            .listen
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        config.policy.limits.len(),
        file.display()
    );
    server.run()
}

/// `floodgate simulate`: the limit's algorithm (and those compared) over
/// the pattern, the summary printed, the chart written.
fn simulate(s: &Simulation) -> anyhow::Result<()> {
    use floodgate::cli::simulate::{parse_arrivals, parse_pattern, simulate, svg, translate};
    use floodgate_algorithm::Kind;
    use floodgate_policy::Rule;

    let config = Config::load(&s.config, &Inputs::from_process())?;
    let limit = config
        .policy
        .limits
        .iter()
        .find(|l| l.name.as_str() == s.limit)
        .with_context(|| {
            let names: Vec<&str> = config
                .policy
                .limits
                .iter()
                .map(|l| l.name.as_str())
                .collect();
            format!(
                "no limit named {} in {} (limits: {})",
                s.limit,
                s.config.display(),
                names.join(", ")
            )
        })?;
    let Rule::Rate(algorithm) = limit.rule else {
        anyhow::bail!(
            "{} counts requests in flight, which depends on how long each lasts: simulate a rate limit",
            s.limit
        );
    };
    let arrivals = match parse_pattern(&s.pattern) {
        Ok(arrivals) => arrivals,
        Err(pattern_error) => match std::fs::read_to_string(&s.pattern) {
            Ok(text) => parse_arrivals(&text)
                .with_context(|| format!("reading arrival times from {}", s.pattern))?,
            Err(_) => return Err(pattern_error.into()),
        },
    };
    let mut runs = vec![simulate(algorithm, &arrivals)];
    for name in &s.compare {
        let kind = Kind::from_name(name)
            .with_context(|| format!("--compare: {name} is not an algorithm"))?;
        if kind == algorithm.kind() {
            continue;
        }
        let other = translate(&algorithm, kind)
            .with_context(|| format!("--compare: {name} cannot take {algorithm}'s numbers"))?;
        runs.push(simulate(other, &arrivals));
    }
    for (i, run) in runs.iter().enumerate() {
        if runs.len() > 1 {
            if i > 0 {
                println!();
            }
            println!("# {}", run.algorithm);
        }
        print!("{}", run.summary());
    }
    if let Some(out) = &s.out {
        std::fs::write(out, svg(&runs, s.span))
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
