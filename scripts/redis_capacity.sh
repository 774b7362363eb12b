#!/usr/bin/env bash
# What a decision costs Redis, by algorithm, layers and leases: starts a
# redis-server of its own on a free port (no persistence), runs
# examples/redis_capacity.rs against it and prints the table docs/book/redis.md's
# sizing rule comes from. Bounded: 20,000 decisions per row, loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOODGATE_NEEDS_REDIS=1 source scripts/setup.sh
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir="$(mktemp -d)"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
# A debug client: what Redis spends per script run does not depend on it.
cargo run --quiet --example redis_capacity -- "redis://127.0.0.1:$port"
