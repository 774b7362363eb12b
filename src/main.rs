//! The binary: its allocator and its log caps; the command line is
//! `floodgate::cli`'s.

use std::process::ExitCode;

// Pingora allocates many small objects on every request. mimalloc serves them
// from thread-local free lists: about 17,000 fewer instructions per proxied
// request than glibc's allocator (callgrind, scripts/loadtest.sh's memory case).
// Its v2 line: about 2,400 fewer instructions per refusal than v3, whose
// fresh-page path showed up on every request (jemalloc: 3,000 more than
// mimalloc per proxied request).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use clap::Parser;
use floodgate_limiter::clock::{Clock, SystemClock};
use floodgate_limiter::log_throttle::LogThrottle;

fn main() -> ExitCode {
    // Before the logger: `--help`, `--version` and usage errors print and
    // exit here.
    let cli = floodgate::cli::Cli::parse();
    init_logging();
    cli.run()
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
