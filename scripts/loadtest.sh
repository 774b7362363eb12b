#!/usr/bin/env bash
# Load test: floodgate against nginx, all in one run, on 127.0.0.1 only.
#
#   scripts/loadtest.sh [seconds per case, default 10] [connections, default 64]
#
# Installs oha (cargo install), nginx and redis-server when missing, builds
# floodgate in release mode, then measures each case with oha at a fixed
# concurrency and duration, and prints req/s, p50 and p99 latency, the
# ratio to the upstream alone, and the server's CPU time per request (read
# from /proc: user + system time of the server's processes, divided by the
# requests answered). Every server it starts is stopped by PID at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${1:-10}"
CONNECTIONS="${2:-64}"

FLOODGATE_NEEDS_REDIS=1 source scripts/setup.sh
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx-light >/dev/null
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
command -v oha >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/oha" ] || cargo install oha --locked
OHA="$(command -v oha || echo "$HOME/.cargo/bin/oha")"
command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to read oha's JSON" >&2; exit 1; }
cargo build --release --quiet --bin floodgate
FLOODGATE="$PWD/target/release/floodgate"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

UP=18000; NGX_PROXY=18001; NGX_LIMIT=18002; NGX_REFUSE=18003; REDIS=18379
FG_PLAIN=18010; FG_MEMORY=18011; FG_REDIS=18012; FG_REFUSE=18013; FG_REFUSE_REDIS=18014
FG_REDIS_OFF=18015; FG_REDIS_GLOBAL=18016; FG_REDIS_CLIENTS=18017
NGX_TLS=18020; FG_TLS=18021; FG_TLS_PLAIN=18022

# One certificate for both TLS terminators (ECDSA P-256, as most edges serve).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$WORK/tls.key" -out "$WORK/tls.crt" -days 2 -subj "/CN=localhost" \
  -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" >/dev/null 2>&1

nginx_conf() { # name port workers body
  cat > "$WORK/$1.conf" <<CONF
worker_processes $3;
daemon off;
pid $WORK/$1.pid;
error_log $WORK/$1.error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  upstream backend { server 127.0.0.1:$UP; keepalive 128; }
  $5
  server {
    listen 127.0.0.1:$2 reuseport;
    location / {
      $4
    }
  }
}
CONF
}
PROXY='proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";'
# Proxies get the same number of workers (nginx) and threads (floodgate):
# one by default, since oha needs the other core of a 2-core machine.
WORKERS="${PROXY_WORKERS:-1}"
nginx_conf upstream $UP 1 'return 200 "ok";' ''
nginx_conf proxy $NGX_PROXY "$WORKERS" "$PROXY" ''
nginx_conf limit $NGX_LIMIT "$WORKERS" "limit_req zone=ip burst=1000000 nodelay; limit_req_status 429; $PROXY" \
  'limit_req_zone $binary_remote_addr zone=ip:10m rate=1000000r/s;'
nginx_conf refuse $NGX_REFUSE "$WORKERS" "limit_req zone=ip; limit_req_status 429; $PROXY" \
  'limit_req_zone $binary_remote_addr zone=ip:10m rate=1r/m;'
# nginx terminating TLS (h2 and http/1.1 by ALPN) with the same certificate.
nginx_conf tls $NGX_TLS "$WORKERS" "$PROXY" ''
# (`listen ... http2`: the spelling Debian 12's nginx 1.22 understands.)
sed -i "s|listen 127.0.0.1:$NGX_TLS reuseport;|listen 127.0.0.1:$NGX_TLS ssl http2 reuseport; ssl_certificate $WORK/tls.crt; ssl_certificate_key $WORK/tls.key;|" "$WORK/tls.conf"

declare -A PID_OF
start() { # name command...: starts in the background, records the PID
  local name="$1"; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  PID_OF[$name]=$!
}
wait_port() {
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2; exit 1
}

floodgate_conf() { # name port body
  cat > "$WORK/$1.toml" <<CONF
[server]
listen = "127.0.0.1:$2"
threads = $WORKERS
[upstream]
servers = ["127.0.0.1:$UP"]
$3
CONF
}
per_ip_bucket() { # capacity refill_rate
  printf '[[limits]]\nname = "per-ip"\nkey = "ip"\nalgorithm = "token_bucket"\ncapacity = %s\nrefill_rate = %s\n' "$1" "$2"
}
# Never reached. (A refill of 1,000/s, not faster: a leased token is usable
# only until its place in the bucket's schedule has passed, so a lease of 100
# tokens lives 100 ms here, 100 µs at 1,000,000/s.)
NEVER="$(per_ip_bucket 1000000000 1000)"
ABUSE="$(per_ip_bucket 1 0.001)"             # one client refused almost always
REDIS_TABLE="[redis]
url = \"redis://127.0.0.1:$REDIS/0\"
timeout = \"50ms\""
floodgate_conf plain $FG_PLAIN ''
floodgate_conf memory $FG_MEMORY "$NEVER"
floodgate_conf redis $FG_REDIS "$REDIS_TABLE
$NEVER"
# Leases off: every request one decision on Redis (the previous release).
floodgate_conf redis-off $FG_REDIS_OFF "$REDIS_TABLE
leases = \"off\"
$NEVER"
# One key for everyone, far from its limit: the hot key leases serve.
floodgate_conf redis-global $FG_REDIS_GLOBAL "$REDIS_TABLE
[[limits]]
name = \"global\"
key = \"global\"
algorithm = \"fixed_window\"
limit = 10000000
window = \"1m\""
# A thousand clients (the query's k, drawn per request), each far from its
# limit: a lease per client.
floodgate_conf redis-clients $FG_REDIS_CLIENTS "$REDIS_TABLE
[[limits]]
name = \"per-client\"
key = \"query:k\"
algorithm = \"fixed_window\"
limit = 10000000
window = \"1m\""
floodgate_conf refuse $FG_REFUSE "$ABUSE"
floodgate_conf refuse-redis $FG_REFUSE_REDIS "$REDIS_TABLE
$ABUSE"
floodgate_conf tls $FG_TLS_PLAIN "$NEVER"
sed -i "s|^\[upstream\]|[server.tls]\nlisten = \"127.0.0.1:$FG_TLS\"\ncert_file = \"$WORK/tls.crt\"\nkey_file = \"$WORK/tls.key\"\n\n[upstream]|" "$WORK/tls.toml"

PORTS="$UP $NGX_PROXY $NGX_LIMIT $NGX_REFUSE $REDIS $FG_PLAIN $FG_MEMORY $FG_REDIS $FG_REFUSE $FG_REFUSE_REDIS $NGX_TLS $FG_TLS $FG_TLS_PLAIN $FG_REDIS_OFF $FG_REDIS_GLOBAL $FG_REDIS_CLIENTS"
for port in $PORTS; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is taken: stop what listens there first" >&2; exit 1
  fi
done
start upstream "$NGINX" -c "$WORK/upstream.conf" -p "$WORK"
start proxy "$NGINX" -c "$WORK/proxy.conf" -p "$WORK"
start limit "$NGINX" -c "$WORK/limit.conf" -p "$WORK"
start refuse "$NGINX" -c "$WORK/refuse.conf" -p "$WORK"
start tls "$NGINX" -c "$WORK/tls.conf" -p "$WORK"
start redis redis-server --port $REDIS --bind 127.0.0.1 --save "" --appendonly no
# Refusals are logged at info, one line each; the load would mostly measure
# the terminal. FLOODGATE_LOG=info measures that too.
export RUST_LOG="${FLOODGATE_LOG:-warn}"
for name in plain memory redis redis-off redis-global redis-clients refuse refuse-redis tls; do
  start "fg-$name" "$FLOODGATE" --config "$WORK/$name.toml"
done
for port in $PORTS; do
  wait_port "$port"
done

cpu_ticks() { # pid: user+system ticks of the process and its children (nginx workers)
  local total=0 p
  for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    if [ -r "/proc/$p/stat" ]; then
      total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    fi
  done
  echo "$total"
}

RESULTS="$WORK/results.tsv"
: > "$RESULTS"
server_ticks() { # pid...: the sum over the server's processes
  local total=0 p
  for p in "$@"; do total=$((total + $(cpu_ticks "$p"))); done
  echo "$total"
}
measure() { # label port server-pid [more server pids: redis-server]
  local label="$1" port="$2"; shift 2
  measure_url "$label" "http://127.0.0.1:$port/" "" "$@"
}
script_calls() { # EVALSHA calls Redis has run since it started
  redis-cli -p $REDIS info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p' | tr -d '\r' | grep . || echo 0
}
measure_url() { # label url "oha flags" server-pid...
  local label="$1" url="$2" flags="$3"; shift 3
  # shellcheck disable=SC2086
  "$OHA" -n 2000 -c "$CONNECTIONS" --no-tui $flags "$url" >/dev/null 2>&1 || true
  local before after calls_before calls_after
  calls_before=$(script_calls)
  before=$(server_ticks "$@")
  # shellcheck disable=SC2086
  "$OHA" -z "${DURATION}s" -c "$CONNECTIONS" --no-tui $flags --output-format json "$url" > "$WORK/oha.json"
  after=$(server_ticks "$@")
  calls_after=$(script_calls)
  python3 - "$label" "$WORK/oha.json" "$((after - before))" "$(getconf CLK_TCK)" "$((calls_after - calls_before))" >> "$RESULTS" <<'PY'
import json, sys
label, path, ticks, hz, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
data = json.load(open(path))
summary, pct = data["summary"], data["latencyPercentiles"]
codes = data.get("statusCodeDistribution", {})
total = sum(int(v) for v in codes.values()) or 1
refused = int(codes.get("429", 0))
cpu_us = ticks / hz * 1e6 / total
print(f"{label}\t{summary['requestsPerSec']:.0f}\t{pct['p50'] * 1e3:.3f}\t{pct['p99'] * 1e3:.3f}\t{cpu_us:.1f}\t{refused / total:.3f}\t{calls / total:.4f}")
PY
}

measure "upstream alone (nginx, fixed 200)" $UP "${PID_OF[upstream]}"
measure "nginx reverse proxy" $NGX_PROXY "${PID_OF[proxy]}"
measure "nginx limit_req, admitting" $NGX_LIMIT "${PID_OF[limit]}"
measure "floodgate, no limits" $FG_PLAIN "${PID_OF[fg-plain]}"
measure "floodgate memory, admitting" $FG_MEMORY "${PID_OF[fg-memory]}"
measure "floodgate redis, admitting" $FG_REDIS "${PID_OF[fg-redis]}" "${PID_OF[redis]}"
measure "floodgate redis, leases off" $FG_REDIS_OFF "${PID_OF[fg-redis-off]}" "${PID_OF[redis]}"
measure "floodgate redis, global key" $FG_REDIS_GLOBAL "${PID_OF[fg-redis-global]}" "${PID_OF[redis]}"
measure_url "floodgate redis, 1,000 clients" "http://127[.]0[.]0[.]1:$FG_REDIS_CLIENTS/[?]k=[0-9]{3}" "--rand-regex-url" "${PID_OF[fg-redis-clients]}" "${PID_OF[redis]}"
measure "nginx limit_req, refusing" $NGX_REFUSE "${PID_OF[refuse]}"
measure "floodgate memory, refusing" $FG_REFUSE "${PID_OF[fg-refuse]}"
measure "floodgate redis, refusing" $FG_REFUSE_REDIS "${PID_OF[fg-refuse-redis]}" "${PID_OF[redis]}"
# TLS at the edge: the same certificate, HTTP/1.1 and HTTP/2 (one connection
# per oha worker either way), against nginx terminating TLS.
measure_url "nginx TLS, http/1.1" "https://127.0.0.1:$NGX_TLS/" "--insecure" "${PID_OF[tls]}"
measure_url "floodgate TLS memory, http/1.1" "https://127.0.0.1:$FG_TLS/" "--insecure" "${PID_OF[fg-tls]}"
measure_url "nginx TLS, h2" "https://127.0.0.1:$NGX_TLS/" "--insecure --http2" "${PID_OF[tls]}"
measure_url "floodgate TLS memory, h2" "https://127.0.0.1:$FG_TLS/" "--insecure --http2" "${PID_OF[fg-tls]}"

python3 - "$RESULTS" "$DURATION" "$CONNECTIONS" "$(nproc)" "$WORKERS" <<'PY'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
base = float(rows[0][1])
print(f"oha -c {sys.argv[3]} -z {sys.argv[2]}s on 127.0.0.1, {sys.argv[4]} cores shared by servers and oha, {sys.argv[5]} worker(s) per proxy")
print("CPU µs/req: the server's processes (nginx master and workers; floodgate; plus redis-server on the Redis rows)")
print("Redis calls/req: EVALSHA calls per request answered\n")
print(f"| {'case':<34} | {'req/s':>8} | {'p50 ms':>7} | {'p99 ms':>7} | {'ratio':>5} | {'CPU µs/req':>10} | {'429 share':>9} | {'Redis calls/req':>15} |")
print(f"|{'-'*36}|{'-'*10}|{'-'*9}|{'-'*9}|{'-'*7}|{'-'*12}|{'-'*11}|{'-'*17}|")
for label, rps, p50, p99, cpu, refused, calls in rows:
    print(f"| {label:<34} | {float(rps):>8.0f} | {float(p50):>7.3f} | {float(p99):>7.3f} | {float(rps) / base:>5.2f} | {float(cpu):>10.1f} | {float(refused):>9.3f} | {float(calls):>15.4f} |")
by_label = {row[0]: row for row in rows}
def rps(label): return float(by_label[label][1])
def p99(label): return float(by_label[label][3])
limit_req = rps("nginx limit_req, admitting")
print("\nAgainst nginx limit_req in this run (targets in parentheses):")
print(f"  memory store admitting   {rps('floodgate memory, admitting') / limit_req:.2f}x (>= 1.0)")
print(f"  Redis store admitting    {rps('floodgate redis, admitting') / limit_req:.2f}x (>= 0.8)")
refusing = rps("nginx limit_req, refusing")
print(f"  refusing, memory / Redis {rps('floodgate memory, refusing') / refusing:.2f}x / {rps('floodgate redis, refusing') / refusing:.2f}x (>= 1.0)")
added = p99("floodgate redis, admitting") - p99("floodgate, no limits")
print(f"  p99 added by Redis over no limits {added:.2f} ms (<= 1)")
memory = rps("floodgate memory, admitting")
print("Redis admitting against memory admitting in this run (leases: within 15%):")
for label in ("floodgate redis, admitting", "floodgate redis, global key", "floodgate redis, 1,000 clients", "floodgate redis, leases off"):
    print(f"  {label[len('floodgate redis, '):]:<14} {rps(label) / memory:.2f}x, p99 {p99(label) - p99('floodgate, no limits'):+.2f} ms over no limits")
print("Against nginx terminating TLS with the same certificate:")
for proto in ("http/1.1", "h2"):
    print(f"  TLS {proto:<8} {rps(f'floodgate TLS memory, {proto}') / rps(f'nginx TLS, {proto}'):.2f}x")
PY
