#!/usr/bin/env bash
# Instructions per request, counted by callgrind: repeatable where wall time
# on a shared machine is not. Each case runs its proxy under callgrind in
# front of nginx (a fixed 200) on 127.0.0.1, switches counting on once the
# proxy listens, sends REQUESTS requests over 8 connections with oha, stops
# the proxy and prints the instructions counted over the requests answered.
#
#   scripts/instructions.sh [floodgate binary ...]
#
# With no binary, builds `--profile profiling` and counts it; give two to
# count a previous build beside this one (same run). The bare Pingora proxy
# (examples/bare_proxy.rs, same profile) is counted first: the floor; then
# the same proxy doing the upstream work floodgate does by default (timeouts,
# forwarded headers, a request id) with Pingora's API: a gateway's floor.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS="${REQUESTS:-2000}"
# PROFILE=release counts release builds (no second LTO build for profiling);
# H2=1 adds the same cases over h2c (prior knowledge), through the HTTP/2
# frame watch; PROTECT=1 adds the last build under a concurrency limit and
# under [upstream.protection]; TRACE=1 adds the last build admitting with
# [tracing] at sample ratios 0.01 and 1.0, exporting to the tests' OTLP
# receiver (its export thread counted: it is the proxy's work);
# FLOODGATE_LOG sets RUST_LOG (warn by default;
# info is the shipped default, where refusals are logged).
PROFILE="${PROFILE:-profiling}"
source scripts/bench_tools.sh

command -v valgrind >/dev/null 2>&1 || install_package valgrind
cargo build --profile "$PROFILE" --quiet --bin floodgate --example bare_proxy
BARE="$PWD/target/$PROFILE/examples/bare_proxy"
BINARIES=("$@")
[ ${#BINARIES[@]} -gt 0 ] || BINARIES=("$PWD/target/$PROFILE/floodgate")

UP=18100; PROXY_PORT=18101
cat > "$WORK/upstream.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/upstream.pid;
error_log $WORK/upstream.error.log error;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$UP; location / { return 200 "ok"; } } }
CONF
"$NGINX" -c "$WORK/upstream.conf" -p "$WORK" >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
wait_port $UP

count() { # label command...: instructions per answered request
  local label="$1"; shift
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$WORK/cg.%p" "$@" >"$WORK/case.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  wait_port $PROXY_PORT
  "$OHA" -c 2 -n 20 --no-tui $OHA_FLAGS "http://127.0.0.1:$PROXY_PORT/" >/dev/null 2>&1 # warm
  callgrind_control -i on $pid >/dev/null 2>&1
  "$OHA" -c 8 -n "$REQUESTS" --no-tui $OHA_FLAGS "http://127.0.0.1:$PROXY_PORT/" >/dev/null 2>&1
  callgrind_control -i off $pid >/dev/null 2>&1
  kill -INT $pid; wait $pid 2>/dev/null || true
  local total
  total=$(grep -h '^summary:\|^totals:' "$WORK"/cg.$pid* | awk '{s+=$2} END {print s}')
  rm -f "$WORK"/cg.$pid*
  printf '%-44s %9d\n' "$label" $((total / REQUESTS))
}
conf() { # body [server lines]
  printf '[server]\nlisten = "127.0.0.1:%s"\nthreads = 1\n%s\n[upstream]\nservers = ["127.0.0.1:%s"]\n%s\n' \
    "$PROXY_PORT" "${2:-}" "$UP" "$1" > "$WORK/fg.toml"
}
NEVER='[[limits]]
name = "per-ip"
key = "ip"
algorithm = "token_bucket"
capacity = 1000000000
refill_rate = 1000'
ABUSE='[[limits]]
name = "per-ip"
key = "ip"
algorithm = "token_bucket"
capacity = 1
refill_rate = 0.001'
export RUST_LOG="${FLOODGATE_LOG:-warn}"
OHA_FLAGS=""

echo "instructions per request, $REQUESTS requests over 8 connections, one worker"
count "bare Pingora proxy" "$BARE" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$UP" 1
count "bare Pingora gateway" "$BARE" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$UP" 1 gateway
count "bare Pingora proxy, refusing" "$BARE" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$UP" 1 refuse
count "bare Pingora gateway, refusing" "$BARE" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$UP" 1 refuse gateway
for binary in "${BINARIES[@]}"; do
  name="$(basename "$binary")"
  conf ""; count "$name, no limits" "$binary" --config "$WORK/fg.toml"
  conf "$NEVER"; count "$name memory, admitting" "$binary" --config "$WORK/fg.toml"
  conf "$ABUSE"; count "$name memory, refusing" "$binary" --config "$WORK/fg.toml"
done
# PROTECT=1: the last build admitting under a fixed concurrency limit, and
# under [upstream.protection] instead (neither reached), beside each other.
if [ "${PROTECT:-0}" = 1 ]; then
  binary="${BINARIES[${#BINARIES[@]}-1]}"
  name="$(basename "$binary")"
  conf "$NEVER
[[limits]]
name = \"in-flight\"
key = \"global\"
algorithm = \"concurrency\"
max = 1000000"
  count "$name memory, admitting, concurrency limit" "$binary" --config "$WORK/fg.toml"
  conf "[upstream.protection]
min = 1
max = 1000000
initial = 1000000
$NEVER"
  count "$name memory, admitting, upstream protected" "$binary" --config "$WORK/fg.toml"
fi
if [ "${TRACE:-0}" = 1 ]; then
  binary="${BINARIES[${#BINARIES[@]}-1]}"
  name="$(basename "$binary")"
  OTLP=18117
  python3 tests/otlp_receiver.py --grpc-port $OTLP --out /dev/null >"$WORK/otlp.log" 2>&1 &
  PIDS+=($!)
  wait_port $OTLP
  for ratio in 0.01 1.0; do
    conf "$NEVER
[tracing]
endpoint = \"http://127.0.0.1:$OTLP\"
sample_ratio = $ratio
max_spans_per_second = 1000000"
    count "$name memory, admitting, tracing $ratio" "$binary" --config "$WORK/fg.toml"
  done
fi
if [ "${H2:-0}" = 1 ]; then
  OHA_FLAGS="--http2"
  for binary in "${BINARIES[@]}"; do
    name="$(basename "$binary")"
    conf "" "h2c = true"; count "$name h2c, no limits" "$binary" --config "$WORK/fg.toml"
    conf "$NEVER" "h2c = true"; count "$name h2c memory, admitting" "$binary" --config "$WORK/fg.toml"
    conf "$ABUSE" "h2c = true"; count "$name h2c memory, refusing" "$binary" --config "$WORK/fg.toml"
  done
  OHA_FLAGS=""
fi
