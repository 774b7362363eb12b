#!/usr/bin/env bash
# Load test: floodgate against a bare Pingora proxy and nginx, all in one run,
# on 127.0.0.1 only.
#
#   scripts/loadtest.sh [seconds per case, default 10] [connections, default 64]
#
#   SECTIONS="main redis clients threads nokeepalive flood curves tracing" (the default: all)
#   FLOODGATE_BEFORE=path/to/an/older/floodgate   adds that build's rows beside
#                                                 this one's (a before/after run)
#   LOADTEST_BUILT=1                              measures target/release as it is
#
# Installs oha (cargo install), nginx and redis-server when missing, builds
# floodgate and examples/bare_proxy.rs in release mode, then measures each
# case with oha at a fixed concurrency and duration: req/s, p50 and p99, and
# the server's CPU time per request (user + system time of the server's
# processes from /proc, divided by the requests answered). Each proxy is
# started for its case and stopped after it; every process is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${1:-10}"
CONNECTIONS="${2:-64}"
SECTIONS="${SECTIONS:-main redis clients threads nokeepalive flood curves tracing}"
BEFORE="${FLOODGATE_BEFORE:-}"

FLOODGATE_NEEDS_REDIS=1 source scripts/setup.sh
source scripts/bench_tools.sh
command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to read oha's JSON" >&2; exit 1; }
# LOADTEST_BUILT=1 measures the binaries already in target/release (built
# from another tree state, or to measure again without building).
[ "${LOADTEST_BUILT:-0}" = 1 ] || cargo build --release --quiet --bin floodgate --example bare_proxy --example clients_file
FLOODGATE="$PWD/target/release/floodgate"
BARE="$PWD/target/release/examples/bare_proxy"

UP=18000; REDIS=18379; PROXY_PORT=18001; TLS_PORT=18002
for port in $UP $REDIS $PROXY_PORT $TLS_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is taken: stop what listens there first" >&2; exit 1
  fi
done

# One certificate for both TLS terminators (ECDSA P-256, as most edges serve).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$WORK/tls.key" -out "$WORK/tls.crt" -days 2 -subj "/CN=localhost" \
  -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" >/dev/null 2>&1

declare -A PID_OF
start() { # name command...: starts in the background, records the PID
  local name="$1"; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  PID_OF[$name]=$!
}
stop() { # name: stops it by PID and waits until it is gone
  local pid="${PID_OF[$1]}"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PROXY_PORT") 2>/dev/null || (exec 3<>"/dev/tcp/127.0.0.1/$TLS_PORT") 2>/dev/null || return 0
    sleep 0.05
  done
}

nginx_conf() { # name port workers location-body [http-body] [listen-extra]
  cat > "$WORK/$1.conf" <<CONF
worker_processes $3;
daemon off;
pid $WORK/$1.pid;
error_log $WORK/$1.error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  upstream backend { server 127.0.0.1:$UP; keepalive 128; }
  ${5:-}
  server {
    listen 127.0.0.1:$2 ${6:-} reuseport;
    ${7:-}
    location / {
      $4
    }
  }
}
CONF
}
PROXY='proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";'
ADMIT_ZONE='limit_req_zone $binary_remote_addr zone=ip:10m rate=1000000r/s;'
REFUSE_ZONE='limit_req_zone $binary_remote_addr zone=ip:10m rate=1r/m;'
ADMIT="limit_req zone=ip burst=1000000 nodelay; limit_req_status 429; $PROXY"
REFUSE="limit_req zone=ip; limit_req_status 429; $PROXY"

# The upstream: nginx answering a fixed 200, and Redis, up for the whole run.
nginx_conf upstream $UP 1 'return 200 "ok";'
start upstream "$NGINX" -c "$WORK/upstream.conf" -p "$WORK"
start redis redis-server --port $REDIS --bind 127.0.0.1 --save "" --appendonly no
wait_port $UP; wait_port $REDIS

floodgate_conf() { # threads body: the config of one case, on PROXY_PORT
  cat > "$WORK/fg.toml" <<CONF
[server]
listen = "127.0.0.1:$PROXY_PORT"
threads = $1
${SERVER_EXTRA:-}
[upstream]
servers = ["127.0.0.1:$UP"]
$2
CONF
}
per_ip_bucket() { # capacity refill_rate [name]
  printf '[[limits]]\nname = "%s"\nkey = "ip"\nalgorithm = "token_bucket"\ncapacity = %s\nrefill_rate = %s\n' "${3:-per-ip}" "$1" "$2"
}
# Never reached: a bucket per address refilling at 1,000,000/s.
NEVER="$(per_ip_bucket 1000000000 1000000)"
ABUSE="$(per_ip_bucket 1 0.001)"             # one client refused almost always
REDIS_TABLE="[redis]
url = \"redis://127.0.0.1:$REDIS/0\"
timeout = \"50ms\""
# One key for everyone, far from its limit: the hot key leases serve.
GLOBAL='[[limits]]
name = "global"
key = "global"
algorithm = "fixed_window"
limit = 10000000
window = "1m"'
# The whole API's bucket, shared by every instance: the hot key leases
# serve, at the rate a fleet sells.
GLOBAL_BUCKET='[[limits]]
name = "global"
key = "global"
algorithm = "token_bucket"
capacity = 1000000
refill_rate = 1000000'
# What an API sells each client: 100,000 a day, here for 1,000 clients (a
# build from before issue 49 refuses it; its largest daily limit is 26,062).
per_k_daily() { # limit
  printf '[[limits]]\nname = "per-client-daily"\nkey = "query:k"\nalgorithm = "sliding_window"\nlimit = %s\nwindow = "1d"\n' "$1"
}
# A key per query parameter k, far from its limit.
PER_K='[[limits]]
name = "per-client"
key = "query:k"
algorithm = "fixed_window"
limit = 10000000
window = "1m"'
TLS_TABLE="[server.tls]
listen = \"127.0.0.1:$TLS_PORT\"
cert_file = \"$WORK/tls.crt\"
key_file = \"$WORK/tls.key\""

# Refusals are logged at info, one line each; the load would mostly measure
# the terminal. FLOODGATE_LOG=info measures that too.
export RUST_LOG="${FLOODGATE_LOG:-warn}"

cpu_ticks() { # pid: user+system ticks of the process and its children (nginx workers)
  local total=0 p
  for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    if [ -r "/proc/$p/stat" ]; then
      total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    fi
  done
  echo "$total"
}
server_ticks() { # pid...: the sum over the server's processes
  local total=0 p
  for p in "$@"; do total=$((total + $(cpu_ticks "$p"))); done
  echo "$total"
}
script_calls() { # EVALSHA calls Redis has run since it started
  redis-cli -p $REDIS info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p' | tr -d '\r' | grep . || echo 0
}

RESULTS="$WORK/results.tsv"
: > "$RESULTS"
# measure section label url "oha flags" pid...: one row of the results.
measure() {
  local section="$1" label="$2" url="$3" flags="$4"; shift 4
  # shellcheck disable=SC2086
  "$OHA" -n 2000 -c "$CONNECTIONS" --no-tui $flags "$url" >/dev/null 2>&1 || true
  local before after calls_before calls_after
  calls_before=$(script_calls)
  before=$(server_ticks "$@")
  # shellcheck disable=SC2086
  "$OHA" -z "${DURATION}s" -c "$CONNECTIONS" --no-tui $flags --output-format json "$url" > "$WORK/oha.json"
  after=$(server_ticks "$@")
  calls_after=$(script_calls)
  python3 - "$section" "$label" "$WORK/oha.json" "$((after - before))" "$(getconf CLK_TCK)" "$((calls_after - calls_before))" >> "$RESULTS" <<'PY'
import json, sys
section, label, path, ticks, hz, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
data = json.load(open(path))
summary, pct = data["summary"], data["latencyPercentiles"]
codes = data.get("statusCodeDistribution", {})
# Connections closed without an answer (the flood rows) count as attempts.
failed = sum(int(v) for v in data.get("errorDistribution", {}).values())
total = sum(int(v) for v in codes.values()) + failed or 1
refused = int(codes.get("429", 0))
cpu_us = ticks / hz * 1e6 / total
rate = total / summary["total"] if summary.get("total") else summary["requestsPerSec"]
print(f"{section}\t{label}\t{rate:.0f}\t{pct['p50'] * 1e3:.3f}\t{pct['p99'] * 1e3:.3f}\t{cpu_us:.1f}\t{refused / total:.3f}\t{calls / total:.4f}")
PY
}

URL="http://127.0.0.1:$PROXY_PORT/"
# nginx_case section label workers location-body http-body [oha flags] [tls]
nginx_case() {
  local section="$1" label="$2" workers="$3" body="$4" http="$5" flags="${6:-}"
  if [ "${7:-}" = tls ]; then
    nginx_conf case $TLS_PORT "$workers" "$body" "$http" "ssl http2" \
      "ssl_certificate $WORK/tls.crt; ssl_certificate_key $WORK/tls.key;"
    start case "$NGINX" -c "$WORK/case.conf" -p "$WORK"; wait_port $TLS_PORT
    measure "$section" "$label" "https://127.0.0.1:$TLS_PORT/" "--insecure $flags" "${PID_OF[case]}"
  else
    nginx_conf case $PROXY_PORT "$workers" "$body" "$http"
    start case "$NGINX" -c "$WORK/case.conf" -p "$WORK"; wait_port $PROXY_PORT
    measure "$section" "$label" "$URL" "$flags" "${PID_OF[case]}"
  fi
  stop case
}
bare_case() { # section label threads [oha flags] [refuse | gateway]
  start case "$BARE" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$UP" "$3" ${5:-}; wait_port $PROXY_PORT
  measure "$1" "$2" "$URL" "${4:-}" "${PID_OF[case]}"
  stop case
}
bare_tls_case() { # section label [oha flags] [gateway]
  start case "$BARE" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$UP" 1 ${4:-} tls "127.0.0.1:$TLS_PORT" "$WORK/tls.crt" "$WORK/tls.key"
  wait_port $TLS_PORT
  measure "$1" "$2" "https://127.0.0.1:$TLS_PORT/" "--insecure ${3:-}" "${PID_OF[case]}"
  stop case
}
# fg_case section label threads config-body [oha flags] [url] [binary] [redis]
# A previous build that does not read the case's config (a key added since)
# has no row for it.
fg_case() {
  local section="$1" label="$2" threads="$3" body="$4" flags="${5:-}" url="${6:-$URL}" binary="${7:-$FLOODGATE}"
  floodgate_conf "$threads" "$body"
  if [ "$binary" != "$FLOODGATE" ] && ! "$binary" check "$WORK/fg.toml" >/dev/null 2>&1; then
    echo "no row for \"$label\": that build does not read its config" >&2
    return 0
  fi
  start case "$binary" --config "$WORK/fg.toml"
  case "$url" in https*) wait_port $TLS_PORT ;; *) wait_port $PROXY_PORT ;; esac
  if [ "${8:-}" = redis ]; then
    measure "$section" "$label" "$url" "$flags" "${PID_OF[case]}" "${PID_OF[redis]}"
  else
    measure "$section" "$label" "$url" "$flags" "${PID_OF[case]}"
  fi
  stop case
}
# both_builds section what threads config-body [oha flags] [url] [redis]:
# the row "floodgate<what>", and with FLOODGATE_BEFORE "previous build<what>"
# right after it.
both_builds() {
  local section="$1" what="$2"; shift 2
  fg_case "$section" "floodgate$what" "$1" "$2" "${3:-}" "${4:-}" "$FLOODGATE" "${5:-}"
  if [ -n "$BEFORE" ]; then
    fg_case "$section" "previous build$what" "$1" "$2" "${3:-}" "${4:-}" "$BEFORE" "${5:-}"
  fi
}

has() { case " $SECTIONS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# REPEATS rounds of every case, one after the other (noise on a shared
# machine comes in bursts: each row is the median of its rounds).
REPEATS="${REPEATS:-1}"
for round in $(seq 1 "$REPEATS"); do

if has redis; then
  # The references this section's ratios are taken against.
  nginx_case redis "nginx limit_req, admitting" 1 "$ADMIT" "$ADMIT_ZONE"
  bare_case redis "bare Pingora proxy" 1
  both_builds redis " redis, global window 10,000,000/min" 1 "$REDIS_TABLE
$GLOBAL" "" "" redis
  both_builds redis " redis, global bucket at 1,000,000/s" 1 "$REDIS_TABLE
$GLOBAL_BUCKET" "" "" redis
  K_URL="http://127[.]0[.]0[.]1:$PROXY_PORT/[?]k=[0-9]{3}"
  both_builds redis " redis, 100,000/day, 1,000 clients" 1 "$REDIS_TABLE
$(per_k_daily 100000)" "--rand-regex-url" "$K_URL" redis
  if [ -n "$BEFORE" ]; then
    fg_case redis "previous build redis, 26,062/day, 1,000 clients" 1 "$REDIS_TABLE
$(per_k_daily 26062)" "--rand-regex-url" "$K_URL" "$BEFORE" redis
  fi
fi

if has clients; then
  # Clients as data at scale: 1,000,000 run-time keys and 100,000 overrides
  # loaded from the clients file, beside the same config with an empty one;
  # every request carries a run-time key and a client (k) of its own, a
  # tenth of them overridden.
  printf 'token-for-the-loadtest-0123456789' > "$WORK/admin.token"
  export FLOODGATE_IDENTITY_SECRET="the loadtest's identity secret"
  CLIENTS_LIMIT='[[limits]]
name = "per-k"
key = "query:k"
algorithm = "fixed_window"
limit = 10000000
window = "1m"'
  clients_table() { # file
    printf '[clients]\ntiers = ["pro"]\n[admin]\ntoken_file = "%s"\nclients_file = "%s"\n' "$WORK/admin.token" "$1"
  }
  SERVER_EXTRA="admin_listen = \"127.0.0.1:18009\""
  if [ ! -s "$WORK/clients-full.json" ]; then
    floodgate_conf 1 "$(clients_table "$WORK/clients-full.json")
$CLIENTS_LIMIT"
    "$PWD/target/release/examples/clients_file" "$WORK/fg.toml" "$WORK/clients-full.json" 1000000 pro 100000 per-k >&2
  fi
  K_KEY_URL="http://127[.]0[.]0[.]1:$PROXY_PORT/[?]k=[0-9]{6}"
  fg_case clients "floodgate memory, admin on, no run-time entries" 1 "$(clients_table "$WORK/clients-none.json")
$CLIENTS_LIMIT" "--rand-regex-url -H X-API-Key:run-time-key-0765432" "$K_KEY_URL"
  fg_case clients "floodgate memory, 1,000,000 keys + 100,000 overrides" 1 "$(clients_table "$WORK/clients-full.json")
$CLIENTS_LIMIT" "--rand-regex-url -H X-API-Key:run-time-key-0765432" "$K_KEY_URL"
  unset SERVER_EXTRA FLOODGATE_IDENTITY_SECRET
fi

if has main; then
  measure main "upstream alone (nginx, fixed 200)" "http://127.0.0.1:$UP/" "" "${PID_OF[upstream]}"
  nginx_case main "nginx reverse proxy" 1 "$PROXY" ""
  nginx_case main "nginx limit_req, admitting" 1 "$ADMIT" "$ADMIT_ZONE"
  bare_case main "bare Pingora proxy" 1
  bare_case main "bare Pingora gateway" 1 "" gateway
  both_builds main ", no limits" 1 ""
  both_builds main " memory, admitting" 1 "$NEVER"
  both_builds main " redis, admitting" 1 "$REDIS_TABLE
$NEVER" "" "" redis
  # A build from before leases decides every request on Redis (its admitting
  # row is what leases off measures) and has no row here.
  both_builds main " redis, leases off" 1 "$REDIS_TABLE
leases = \"off\"
$NEVER" "" "" redis
  fg_case main "floodgate redis, 1,000 clients" 1 "$REDIS_TABLE
$PER_K" "--rand-regex-url" "http://127[.]0[.]0[.]1:$PROXY_PORT/[?]k=[0-9]{3}" "" redis
  nginx_case main "nginx limit_req, refusing" 1 "$REFUSE" "$REFUSE_ZONE"
  bare_case main "bare Pingora proxy, refusing" 1 "" refuse
  bare_case main "bare Pingora gateway, refusing" 1 "" "refuse gateway"
  both_builds main " memory, refusing" 1 "$ABUSE"
  fg_case main "floodgate redis, refusing" 1 "$REDIS_TABLE
$ABUSE" "" "" "" redis
  # TLS at the edge: the same certificate, HTTP/1.1 and HTTP/2 (one
  # connection per oha worker either way), against nginx terminating TLS.
  nginx_case main "nginx TLS, http/1.1" 1 "$PROXY" "" "" tls
  bare_tls_case main "bare Pingora proxy TLS, http/1.1"
  bare_tls_case main "bare Pingora gateway TLS, http/1.1" "" gateway
  both_builds main " TLS memory, http/1.1" 1 "$TLS_TABLE
$NEVER" "--insecure" "https://127.0.0.1:$TLS_PORT/"
  nginx_case main "nginx TLS, h2" 1 "$PROXY" "" "--http2" tls
  bare_tls_case main "bare Pingora proxy TLS, h2" "--http2"
  bare_tls_case main "bare Pingora gateway TLS, h2" "--http2" gateway
  both_builds main " TLS memory, h2" 1 "$TLS_TABLE
$NEVER" "--insecure --http2" "https://127.0.0.1:$TLS_PORT/"
fi

if has threads; then
  for n in 1 2 4; do
    nginx_case threads "nginx limit_req, admitting, $n" "$n" "$ADMIT" "$ADMIT_ZONE"
    bare_case threads "bare Pingora proxy, $n" "$n"
    both_builds threads " memory, admitting, $n" "$n" "$NEVER"
    nginx_case threads "nginx limit_req, refusing, $n" "$n" "$REFUSE" "$REFUSE_ZONE"
    bare_case threads "bare Pingora proxy, refusing, $n" "$n" "" refuse
    both_builds threads " memory, refusing, $n" "$n" "$ABUSE"
  done
fi

if has nokeepalive; then
  # A scripted abuser's pattern: a new connection for every request.
  nginx_case nokeepalive "nginx limit_req, admitting" 1 "$ADMIT" "$ADMIT_ZONE" "--disable-keepalive"
  bare_case nokeepalive "bare Pingora proxy" 1 "--disable-keepalive"
  both_builds nokeepalive " memory, admitting" 1 "$NEVER" "--disable-keepalive"
  nginx_case nokeepalive "nginx limit_req, refusing" 1 "$REFUSE" "$REFUSE_ZONE" "--disable-keepalive"
  bare_case nokeepalive "bare Pingora proxy, refusing" 1 "--disable-keepalive" refuse
  bare_case nokeepalive "bare Pingora gateway, refusing" 1 "--disable-keepalive" "refuse gateway"
  both_builds nokeepalive " memory, refusing" 1 "$ABUSE" "--disable-keepalive"
fi

if has flood; then
  # One address opening connection after connection while its cap (1) is
  # held: each is closed at once. The rate is connection attempts per
  # second, the CPU per attempt.
  SERVER_EXTRA="max_connections_per_ip = 1"
  both_builds flood ", connections over the cap" 1 "" "--disable-keepalive"
  SERVER_EXTRA=""
fi

if has tracing; then
  # [tracing] exporting to a real OTLP collector (the tests' receiver,
  # opentelemetry-proto served by grpcio; what it receives is thrown away)
  # beside tracing off, and with FLOODGATE_BEFORE the previous build. The
  # span cap is lifted so that 1.0 records every request.
  OTLP=18317
  start otlp python3 tests/otlp_receiver.py --grpc-port $OTLP --out /dev/null
  wait_port $OTLP
  tracing_table() { # ratio
    printf '[tracing]\nendpoint = "http://127.0.0.1:%s"\nsample_ratio = %s\nmax_spans_per_second = 1000000\nqueue = 65536\n' "$OTLP" "$1"
  }
  both_builds tracing " memory, admitting" 1 "$NEVER"
  fg_case tracing "floodgate memory, admitting, tracing 0.01" 1 "$NEVER
$(tracing_table 0.01)"
  fg_case tracing "floodgate memory, admitting, tracing 1.0" 1 "$NEVER
$(tracing_table 1.0)"
  stop otlp
fi

if has curves; then
  # What one more layer, key, header or token costs. Every layer matches
  # every request and is never reached.
  for n in 1 3 10; do
    body=""
    for i in $(seq 1 "$n"); do body="$body
$(per_ip_bucket 1000000000 1000 "layer-$i")"; done
    fg_case curves "layers: $n" 1 "$body"
  done
  fg_case curves "keys: 1" 1 "$PER_K" "" "${URL}?k=0"
  for digits in 2 4 6; do
    fg_case curves "keys: 1e$digits" 1 "$PER_K" "--rand-regex-url" "http://127[.]0[.]0[.]1:$PROXY_PORT/[?]k=[0-9]{$digits}"
  done
  for mode in none draft both; do
    fg_case curves "headers: $mode" 1 "[response]
headers = \"$mode\"
$NEVER"
  done
  # A verified token (RS256, 2,048-bit key) as the key, against the address.
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$WORK/jwt.pem" >/dev/null 2>&1
  TOKEN="$(python3 - "$WORK" <<'PY'
import base64, json, subprocess, sys, time
work = sys.argv[1]
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
modulus = subprocess.run(["openssl", "rsa", "-in", f"{work}/jwt.pem", "-noout", "-modulus"], capture_output=True, text=True, check=True).stdout
n = bytes.fromhex(modulus.strip().split("=", 1)[1])
json.dump({"keys": [{"kty": "RSA", "kid": "load", "use": "sig", "n": b64(n), "e": "AQAB"}]}, open(f"{work}/jwks.json", "w"))
head = b64(json.dumps({"alg": "RS256", "kid": "load", "typ": "JWT"}).encode())
body = b64(json.dumps({"sub": "load-test", "iss": "load", "aud": "api", "exp": int(time.time()) + 3600}).encode())
signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", f"{work}/jwt.pem"], input=f"{head}.{body}".encode(), capture_output=True, check=True).stdout
print(f"{head}.{body}.{b64(signature)}")
PY
)"
  fg_case curves "key: ip" 1 "$NEVER"
  fg_case curves "key: verified jwt:sub" 1 "[clients.jwt]
jwks_file = \"$WORK/jwks.json\"
algorithms = [\"RS256\"]
issuer = \"load\"
audience = \"api\"
header = \"X-Token\"
[[limits]]
name = \"per-user\"
key = \"jwt:sub\"
algorithm = \"token_bucket\"
capacity = 1000000000
refill_rate = 1000" "-H X-Token:$TOKEN"
fi

done

python3 - "$RESULTS" "$DURATION" "$CONNECTIONS" "$(nproc)" "$REPEATS" <<'PY'
import statistics, sys
raw = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
rows, seen = [], {}
for r in raw:
    seen.setdefault((r[0], r[1]), []).append(r)
for (section, label), runs in seen.items():
    rows.append([section, label] + [f"{statistics.median(float(run[i]) for run in runs)}" for i in range(2, 8)])
print(f"oha -c {sys.argv[3]} -z {sys.argv[2]}s on 127.0.0.1, {sys.argv[4]} cores shared by servers and oha; 1 worker per proxy unless the case says; each row the median of {sys.argv[5]} round(s)")
print("CPU µs/req: the server's processes (nginx master and workers; floodgate; plus redis-server on the Redis rows)")
print("× bare, × nginx: req/s as a share of the bare Pingora proxy's and of nginx's (limit_req for admitting and refusing, plain for no limits, nginx TLS for TLS), same section and workers; CPU ÷ bare: CPU µs/req over the bare proxy's")
by = {(r[0], r[1]): r for r in rows}
def val(section, label, i):
    row = by.get((section, label))
    return float(row[i]) if row else None

def references(section, label):
    """The bare proxy and the nginx case a row is compared with."""
    suffix = ""
    if section == "threads":
        label, _, n = label.rpartition(", ")
        suffix = f", {n}"
    bare = f"bare Pingora proxy{suffix}"
    if "TLS" in label:
        proto = label.rsplit(', ', 1)[1]
        nginx = f"nginx TLS, {proto}"
        bare = f"bare Pingora proxy TLS, {proto}"
    elif "refusing" in label:
        nginx = f"nginx limit_req, refusing{suffix}"
        bare = f"bare Pingora proxy, refusing{suffix}"
    elif "no limits" in label:
        nginx = "nginx reverse proxy"
    else:
        nginx = f"nginx limit_req, admitting{suffix}"
    if section == "curves":
        nginx = None
    return bare, nginx

titles = {"clients": "Clients as data (memory store, one worker, keep-alive): 1,000,000 run-time keys and 100,000 overrides loaded, beside none", "redis": "Redis at the numbers users sell (one worker, keep-alive): a fleet-wide window and bucket, a daily limit per client", "flood": "A flood of connections from one address over its cap (1): attempts/s and CPU per attempt", "main": "One worker per proxy, keep-alive", "threads": "Threads: floodgate and the bare proxy with 1, 2, 4 threads, nginx with 1, 2, 4 workers",
          "nokeepalive": "Without keep-alive (oha --disable-keepalive): a new connection per request",
          "curves": "Cost curves: floodgate memory store, one worker; each step against the one before",
          "tracing": "Tracing (memory store admitting, one worker, keep-alive): [tracing] absent, at ratio 0.01 and 1.0 exporting to a local OTLP collector"}
for section in ("main", "redis", "clients", "threads", "nokeepalive", "flood", "curves", "tracing"):
    part = [r for r in rows if r[0] == section]
    if not part:
        continue
    print(f"\n{titles[section]}\n")
    print(f"| {'case':<36} | {'req/s':>7} | {'p50 ms':>6} | {'p99 ms':>6} | {'CPU µs/req':>10} | {'CPU ÷ bare':>10} | {'× bare':>6} | {'× nginx':>7} | {'429 share':>9} | {'Redis calls/req':>15} |")
    print(f"|{'-'*38}|{'-'*9}|{'-'*8}|{'-'*8}|{'-'*12}|{'-'*12}|{'-'*8}|{'-'*9}|{'-'*11}|{'-'*17}|")
    previous = None
    for sec, label, rps, p50, p99, cpu, refused, calls in part:
        bare, nginx = references(section, label)
        fg = "floodgate" in label or "previous build" in label or section == "curves"
        bare_rps, bare_cpu = (val(section, bare, 2), val(section, bare, 5)) if bare and fg else (None, None)
        nginx_rps = val(section, nginx, 2) if nginx and fg else None
        cpu_ratio = f"{float(cpu) / bare_cpu:.2f}" if bare_cpu else ""
        x_bare = f"{float(rps) / bare_rps:.2f}" if bare_rps else ""
        x_nginx = f"{float(rps) / nginx_rps:.2f}" if nginx_rps else ""
        if section == "curves":
            same_curve = previous and previous[1].split(":")[0] == label.split(":")[0]
            cpu_ratio = f"{float(cpu) / float(previous[5]):.2f} step" if same_curve else ""
            x_bare = ""
            previous = (sec, label, rps, p50, p99, cpu)
        print(f"| {label:<36} | {float(rps):>7.0f} | {float(p50):>6.3f} | {float(p99):>6.3f} | {float(cpu):>10.1f} | {cpu_ratio:>10} | {x_bare:>6} | {x_nginx:>7} | {float(refused):>9.3f} | {float(calls):>15.4f} |")

def cpu(section, label): return val(section, label, 5)
def rps(section, label): return val(section, label, 2)
print("\nTargets, in this run:")
if ("main", "floodgate, no limits") in by:
    print(f"  no limits, CPU/req over the bare proxy's      {cpu('main', 'floodgate, no limits') / cpu('main', 'bare Pingora proxy'):.2f} (<= 1.10)")
    print(f"  no limits, CPU/req over the bare gateway's    {cpu('main', 'floodgate, no limits') / cpu('main', 'bare Pingora gateway'):.2f} (the same upstream work: timeouts, forwarded headers, request id)")
    print(f"  memory admitting, CPU/req over no limits'     {cpu('main', 'floodgate memory, admitting') / cpu('main', 'floodgate, no limits'):.2f} (<= 1.05)")
    print(f"  memory admitting, × nginx limit_req (1 worker) {rps('main', 'floodgate memory, admitting') / rps('main', 'nginx limit_req, admitting'):.2f} (>= 0.75)")
    print(f"  refusing, × nginx refusing (keep-alive)       {rps('main', 'floodgate memory, refusing') / rps('main', 'nginx limit_req, refusing'):.2f} (>= 1.0)")
    print(f"  the floor: bare Pingora proxy × nginx limit_req admitting {rps('main', 'bare Pingora proxy') / rps('main', 'nginx limit_req, admitting'):.2f}, refusing {rps('main', 'bare Pingora proxy, refusing') / rps('main', 'nginx limit_req, refusing'):.2f}")
    if ("main", "bare Pingora gateway, refusing") in by:
        print(f"  refusing, CPU/req over the bare gateway's 429 {cpu('main', 'floodgate memory, refusing') / cpu('main', 'bare Pingora gateway, refusing'):.2f} (the same answer: body, headers, request id); that 429 × nginx refusing {rps('main', 'bare Pingora gateway, refusing') / rps('main', 'nginx limit_req, refusing'):.2f}")
    for proto in ("http/1.1", "h2"):
        gateway = rps('main', f'bare Pingora gateway TLS, {proto}')
        beside = f", the bare gateway's {gateway / rps('main', f'nginx TLS, {proto}'):.2f} (floodgate × it {rps('main', f'floodgate TLS memory, {proto}') / gateway:.2f})" if gateway else ""
        print(f"  TLS {proto:<8}, × nginx TLS                   {rps('main', f'floodgate TLS memory, {proto}') / rps('main', f'nginx TLS, {proto}'):.2f} (>= 0.75); the bare proxy's {rps('main', f'bare Pingora proxy TLS, {proto}') / rps('main', f'nginx TLS, {proto}'):.2f}{beside}")
if ("clients", "floodgate memory, 1,000,000 keys + 100,000 overrides") in by:
    print(f"  1,000,000 keys + 100,000 overrides, CPU/req over none {cpu('clients', 'floodgate memory, 1,000,000 keys + 100,000 overrides') / cpu('clients', 'floodgate memory, admin on, no run-time entries'):.2f} (<= 1.05)")
if ("threads", "floodgate memory, admitting, 2") in by:
    print(f"  memory admitting, × nginx limit_req (2)       {rps('threads', 'floodgate memory, admitting, 2') / rps('threads', 'nginx limit_req, admitting, 2'):.2f} (>= 0.75)")
if ("tracing", "floodgate memory, admitting, tracing 1.0") in by:
    off = cpu('tracing', 'floodgate memory, admitting')
    print(f"  tracing 0.01, CPU/req over tracing off        {cpu('tracing', 'floodgate memory, admitting, tracing 0.01') / off:.2f}")
    print(f"  tracing 1.0, CPU/req over tracing off         {cpu('tracing', 'floodgate memory, admitting, tracing 1.0') / off:.2f}")
    if ("tracing", "previous build memory, admitting") in by:
        print(f"  tracing absent, CPU/req over the previous build {off / cpu('tracing', 'previous build memory, admitting'):.2f}")
if ("nokeepalive", "floodgate memory, refusing") in by:
    print(f"  refusing, × nginx refusing (no keep-alive)    {rps('nokeepalive', 'floodgate memory, refusing') / rps('nokeepalive', 'nginx limit_req, refusing'):.2f} (>= 1.0)")
    if ("nokeepalive", "bare Pingora gateway, refusing") in by:
        print(f"  the same 429 from the bare gateway (no keep-alive) × nginx refusing {rps('nokeepalive', 'bare Pingora gateway, refusing') / rps('nokeepalive', 'nginx limit_req, refusing'):.2f}; floodgate × it {rps('nokeepalive', 'floodgate memory, refusing') / rps('nokeepalive', 'bare Pingora gateway, refusing'):.2f}")
PY
