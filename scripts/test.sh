#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs cmake, redis-server and
# cargo-deny when missing, then formatting, lints, the dependencies' licenses,
# every test, and the benches' build.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOODGATE_NEEDS_REDIS=1 FLOODGATE_NEEDS_DENY=1 source scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The limiter without its Redis stores, as a service that limits in process
# would take it.
cargo clippy -p floodgate-limiter --no-default-features --all-targets -- -D warnings
# The gateway without the rate limit service (`--no-default-features`).
cargo clippy --no-default-features --lib --bins -- -D warnings
# Dependencies: licenses deny.toml allows, no banned crate, crates.io only (advisories would need the network).
cargo deny --offline check --hide-inclusion-graph licenses bans sources
# The API documentation builds without a broken link or a warning.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet
# The benches only have to keep compiling; they run with `cargo bench`.
cargo bench --workspace --no-run
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace --all-targets 2>&1 | tee "$log"
# --all-targets leaves out doc tests, where the limiter's usage example is.
cargo test --workspace --doc 2>&1 | tee -a "$log"
# The limiter as a service that limits in process takes it: no Redis.
cargo test -p floodgate-limiter --no-default-features 2>&1 | tee -a "$log"
# One closing line for the whole run: cargo prints one per test binary, and
# the last of them belongs to a binary without tests.
passed=$(grep -o 'test result: [a-zA-Z]*\. [0-9]* passed' "$log" | awk '{n += $4} END {print n + 0}')
failed=$(grep -o '[0-9]* failed;' "$log" | awk '{n += $1} END {print n + 0}')
echo "tests: $passed passed, $failed failed"
