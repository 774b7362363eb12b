#!/usr/bin/env bash
# The rate limit service under load: ShouldRateLimit calls per second, p50
# and p99, and the service's CPU per decision, on the memory store and on a
# redis-server of its own, one floodgate thread (`threads = 1`), loopback
# only, bounded in time.
#
#   scripts/rls_bench.sh [seconds per case, default 10] [streams, default 64]
#
# Builds floodgate, examples/rls_load.rs and examples/rls_transport.rs in
# release mode. Each case starts its server and stops it by PID; CPU is the
# user + system time of the server process from /proc, divided by the
# calls answered. The last two rows are gRPC alone, with the decision taken
# out, on tonic (as the service runs) and on Pingora (framed by hand): what
# the choice of server costs.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${1:-10}"
STREAMS="${2:-64}"
FLOODGATE_NEEDS_REDIS=1 source scripts/setup.sh
cargo build --release --quiet --bin floodgate --example rls_load --example rls_transport
FLOODGATE="$PWD/target/release/floodgate"
LOAD="$PWD/target/release/examples/rls_load"
TRANSPORT="$PWD/target/release/examples/rls_transport"
source scripts/processes.sh
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$redis_port"

case_row() { # name keys store-lines
  local name="$1" keys="$2" store="$3"
  local listen rls
  listen=$(free_port); rls=$(free_port)
  cat > "$WORK/$name.toml" <<TOML
[server]
listen = "127.0.0.1:$listen"
threads = 1
[upstream]
servers = ["127.0.0.1:9"]
$store
[rls]
listen = "127.0.0.1:$rls"
[[limits]]
name = "per_address"
key = "descriptor:remote_address"
algorithm = "token_bucket"
capacity = 1000000
refill_rate = 1000000
match = { domain = "edge", descriptors = [["remote_address"]] }
TOML
  RUST_LOG=warn FLOODGATE_IDENTITY_SECRET=bench-secret-0123456789 \
    "$FLOODGATE" --config "$WORK/$name.toml" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  wait_port "$rls"
  # SIGINT: Pingora's fast shutdown, no grace period to wait out.
  measure "$name" "$pid" "$rls" "$keys" INT
}

measure() { # name pid port keys stop-signal
  local name="$1" pid="$2" port="$3" keys="$4" stop="$5"
  local before after line calls
  before=$(cpu_ticks "$pid")
  line=$("$LOAD" "127.0.0.1:$port" "$DURATION" "$STREAMS" "$keys")
  after=$(cpu_ticks "$pid")
  kill -"$stop" "$pid"; wait "$pid" 2>/dev/null || true
  calls=$(sed -n 's/.*calls=\([0-9]*\) .*/\1/p' <<<"$line")
  local hz; hz=$(getconf CLK_TCK)
  local us; us=$(python3 -c "print(f'{($after - $before) / $hz * 1e6 / max($calls, 1):.1f}')")
  printf '%-24s %s cpu_us_per_call=%s\n' "$name" "$line" "$us"
}

transport_row() { # tonic|pingora
  local port; port=$(free_port)
  "$TRANSPORT" "$1" "127.0.0.1:$port" >"$WORK/transport-$1.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  wait_port "$port"
  # A background job of a script starts with SIGINT ignored; Pingora
  # installs its own handler, tonic alone does not and needs SIGTERM.
  local stop=INT; [ "$1" = tonic ] && stop=TERM
  measure "gRPC alone, $1" "$pid" "$port" 1 "$stop"
}

echo "rate limit service: $DURATION s per case, $STREAMS streams on one connection, 1 floodgate thread"
case_row "memory, 1 key" 1 ""
case_row "memory, 100000 keys" 100000 ""
case_row "redis, 1 key" 1 "[redis]
url = \"redis://127.0.0.1:$redis_port\""
case_row "redis, 100000 keys" 100000 "[redis]
url = \"redis://127.0.0.1:$redis_port\""
transport_row tonic
transport_row pingora
