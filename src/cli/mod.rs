//! The command line: clap's parse of the arguments and each command carried
//! out (the proxy run, `check`, `simulate`).

pub mod simulate;
pub mod summary;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::builder::TypedValueParser;
use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::config::{Config, Inputs};
use simulate::Span;

/// Where `--config` (and `check`'s FILE) is read from when not given.
const CONFIG_ENV: &str = "FLOODGATE_CONFIG";

/// `floodgate`'s arguments: a subcommand, or `--config FILE` to run the
/// proxy as `floodgate run` does.
#[derive(Debug, Parser)]
#[command(
    name = "floodgate",
    version,
    about,
    after_help = "Logging follows RUST_LOG (default: info).",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    args_override_self = true
)]
pub struct Cli {
    /// Run the proxy with FILE (e.g. proxy.toml)
    // Empty is allowed here, and taken for unset: this one reads
    // FLOODGATE_CONFIG whichever subcommand runs.
    #[arg(
        short,
        long,
        value_name = "FILE",
        env = CONFIG_ENV,
        required = true,
        value_parser = clap::builder::OsStringValueParser::new().map(PathBuf::from),
    )]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy (what `floodgate --config FILE` does)
    Run(RunArgs),
    /// Validate FILE and print the resolved limits
    Check(CheckArgs),
    /// Run a limit's algorithm over a pattern of arrivals and print what it admitted
    #[command(
        long_about = "Run limit NAME's algorithm (the real code) over PATTERN, on a clock that \
                      starts at a window boundary, and print what it admitted; --out draws it, \
                      --compare runs the same numbers through other algorithms."
    )]
    Simulate(SimulateArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The config file (e.g. proxy.toml)
    #[arg(short, long, value_name = "FILE", env = CONFIG_ENV)]
    config: PathBuf,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The config file to check (e.g. proxy.toml); FLOODGATE_CONFIG's when left out
    #[arg(value_name = "FILE", env = CONFIG_ENV)]
    file: PathBuf,
}

/// `floodgate simulate`'s arguments.
#[derive(Debug, Args)]
struct SimulateArgs {
    /// The config file that holds the limit
    #[arg(short, long, value_name = "FILE", env = CONFIG_ENV)]
    config: PathBuf,

    /// The limit to simulate, by its name
    #[arg(long, value_name = "NAME")]
    limit: String,

    /// The arrivals: burst:100@0s (100 at 0 s), steady:5/s@0s-60s (evenly
    /// spaced), boundary:100@60s (100 in the last second before 60 s and 100
    /// in the first from it), joined with commas; or a file of arrival times
    /// in seconds, one per line
    #[arg(long, value_name = "PATTERN")]
    pattern: String,

    /// Draw what was admitted and refused as an SVG chart in FILE (e.g. chart.svg)
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,

    /// What the chart's time axis spans: the arrivals, or from t = 0 (whole)
    #[arg(long, value_enum, value_name = "SPAN", default_value_t = Span::Arrivals)]
    span: Span,

    /// Run the same numbers (the same quota over the same window) through
    /// other algorithms too, e.g. token_bucket,sliding_window,sliding_log,leaky_bucket
    #[arg(long, value_name = "ALGORITHM,...", value_delimiter = ',')]
    compare: Vec<String>,
}

impl Cli {
    /// The command line's command carried out: the proxy run until it
    /// stops, or a subcommand. A failure is printed, and exits 1.
    pub fn run(self) -> ExitCode {
        let result = match self.command {
            Some(Command::Run(args)) => run(&args.config),
            Some(Command::Check(args)) => check(&args.file),
            Some(Command::Simulate(args)) => simulate_limit(&args),
            None => match self.config {
                Some(file) if !file.as_os_str().is_empty() => run(&file),
                // FLOODGATE_CONFIG set, but empty.
                _ => Cli::command()
                    .error(
                        clap::error::ErrorKind::MissingRequiredArgument,
                        "floodgate runs with --config FILE, or the file FLOODGATE_CONFIG names",
                    )
                    .exit(),
            },
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        }
    }
}

/// `floodgate check`: the file loaded as the proxy would, and what it
/// resolved to printed.
fn check(file: &Path) -> anyhow::Result<()> {
    let config = Config::load(file, &Inputs::from_process())?;
    print!("{}", summary::describe(&config));
    Ok(())
}

/// The proxy, serving `file` until it is stopped.
fn run(file: &Path) -> anyhow::Result<()> {
    // Kept by the running process: reloads read the same environment, and
    // the same table of run-time API keys.
    let inputs = Inputs::from_process()
        .with_run_time_keys(std::sync::Arc::default())
        .with_run_time_overrides(std::sync::Arc::default());
    let config = Config::load(file, &inputs)?;
    let server = crate::server::build(&config, inputs).context("cannot start")?;
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
fn simulate_limit(s: &SimulateArgs) -> anyhow::Result<()> {
    use floodgate_algorithm::Kind;
    use floodgate_policy::Rule;
    use simulate::{parse_arrivals, parse_pattern, simulate, svg, translate};

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("floodgate").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_invocations_of_before_clap_parse_as_they_did() {
        for flag in ["--config", "-c"] {
            let cli = parse(&[flag, "proxy.toml"]).expect("run");
            assert!(cli.command.is_none());
            assert_eq!(cli.config, Some(PathBuf::from("proxy.toml")));
        }
        let cli = parse(&["check", "proxy.toml"]).expect("check");
        assert!(
            matches!(cli.command, Some(Command::Check(c)) if c.file == Path::new("proxy.toml"))
        );
        let cli = parse(&[
            "simulate",
            "--config",
            "proxy.toml",
            "--limit",
            "per-minute",
            "--pattern",
            "burst:100@0s,steady:5/s@0s-60s",
            "--out",
            "chart.svg",
            "--span",
            "whole",
            "--compare",
            "token_bucket,sliding_log",
        ])
        .expect("simulate");
        let Some(Command::Simulate(s)) = cli.command else {
            panic!("not simulate");
        };
        assert_eq!(s.config, Path::new("proxy.toml"));
        assert_eq!(s.limit, "per-minute");
        assert_eq!(s.pattern, "burst:100@0s,steady:5/s@0s-60s");
        assert_eq!(s.out.as_deref(), Some(Path::new("chart.svg")));
        assert_eq!(s.span, Span::Whole);
        assert_eq!(s.compare, ["token_bucket", "sliding_log"]);
        // A flag given twice: the last one counts, as before.
        let cli = parse(&[
            "simulate",
            "-c",
            "a.toml",
            "--limit",
            "x",
            "--pattern",
            "burst:1@0s",
            "-c",
            "b.toml",
        ])
        .expect("simulate");
        let Some(Command::Simulate(s)) = cli.command else {
            panic!("not simulate");
        };
        assert_eq!(s.config, Path::new("b.toml"));
        assert_eq!(s.span, Span::Arrivals);
        assert!(s.compare.is_empty());
    }

    #[test]
    fn usage_errors_are_clap_errors() {
        use clap::error::ErrorKind;
        let kind = |args: &[&str]| parse(args).map(|_| ()).unwrap_err().kind();
        assert_eq!(kind(&["--bogus"]), ErrorKind::UnknownArgument);
        assert_eq!(kind(&["--config"]), ErrorKind::InvalidValue);
        assert_eq!(
            kind(&["--config", "a.toml", "check", "b.toml"]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            kind(&[
                "simulate",
                "-c",
                "a",
                "--limit",
                "x",
                "--pattern",
                "p",
                "--span",
                "all"
            ]),
            ErrorKind::InvalidValue
        );
        assert_eq!(kind(&["check", "--help"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["simulate", "-h"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["-V"]), ErrorKind::DisplayVersion);
    }
}
