#!/usr/bin/env bash
# Runs floodgate on the shipped proxy.toml (memory store, no Redis) in front of
# a bundled demo upstream, and shows a burst turning 200s into 429s.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo run --quiet --example demo -- proxy.toml
