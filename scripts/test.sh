#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs cmake and redis-server
# when missing, then formatting, lints, every test, and the benches' build.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOODGATE_NEEDS_REDIS=1 source scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
# The benches only have to keep compiling; they run with `cargo bench`.
cargo bench --no-run
cargo test --all-targets
