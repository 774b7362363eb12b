#!/usr/bin/env bash
# Where a request's CPU time goes, in real time rather than instructions:
# each server in turn (one worker) under `oha -c CONNECTIONS` for SECONDS on
# 127.0.0.1, its CPU per request split into user and kernel time (/proc),
# the times it went to sleep per request (voluntary context switches: each
# one an epoll wait with nothing ready, the off-CPU side), and perf's
# cpu-clock samples (this VM has no hardware counters) sorted into the
# runtime, the HTTP stack, floodgate's own code, the allocator, memory
# copies, and the kernel's network stack, syscall entry and scheduler.
#
#   scripts/cpu_split.sh [seconds] [connections]
#
# Uses the profiling build (release with symbols), built when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_UNDER_LOAD="${1:-4}"
CONNECTIONS="${2:-64}"
source scripts/bench_tools.sh

command -v perf >/dev/null 2>&1 || install_package linux-perf
cargo build --profile profiling --quiet --bin floodgate --example bare_proxy
FLOODGATE="$PWD/target/profiling/floodgate"
BARE="$PWD/target/profiling/examples/bare_proxy"

UP=18400; PROXY_PORT=18401
nginx_server() { # name port body
  cat > "$WORK/$1.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/$1.pid;
error_log $WORK/$1.error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  upstream backend { server 127.0.0.1:$UP; keepalive 128; }
  limit_req_zone \$binary_remote_addr zone=ip:10m rate=1000000r/s;
  server { listen 127.0.0.1:$2 reuseport; location / { $3 } }
}
CONF
}
nginx_server upstream $UP 'return 200 "ok";'
"$NGINX" -c "$WORK/upstream.conf" -p "$WORK" >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
wait_port $UP

cat > "$WORK/fg.toml" <<CONF
[server]
listen = "127.0.0.1:$PROXY_PORT"
threads = 1
[upstream]
servers = ["127.0.0.1:$UP"]
[[limits]]
name = "per-ip"
key = "ip"
algorithm = "token_bucket"
capacity = 1000000000
refill_rate = 1000
CONF
export RUST_LOG=warn

# The server's processes: the one started, and its children (nginx's worker).
family() { echo "$1" $(pgrep -P "$1" || true) | tr ' ' ','; }
# User and system clock ticks and voluntary switches, summed over every
# thread of the processes.
counters() {
  local user=0 sys=0 switches=0 pid task fields
  for pid in ${1//,/ }; do
    for task in /proc/$pid/task/*; do
      # Past "pid (comm) ": the state is field 0, utime 11, stime 12.
      read -r -a fields < <(sed 's/.*) //' "$task/stat")
      user=$((user + fields[11])); sys=$((sys + fields[12]))
      switches=$((switches + $(awk '/^voluntary_ctxt_switches/ {print $2}' "$task/status")))
    done
  done
  echo "$user $sys $switches"
}

measure() { # label command...
  local label="$1"; shift
  "$@" >"$WORK/case.log" 2>&1 &
  local pid=$!
  PIDS+=($pid)
  wait_port $PROXY_PORT
  "$OHA" -c 2 -n 200 --no-tui "http://127.0.0.1:$PROXY_PORT/" >/dev/null 2>&1 # warm
  local pids before after
  pids=$(family $pid)
  "$OHA" -c "$CONNECTIONS" -z "${SECONDS_UNDER_LOAD}s" --no-tui --output-format json \
    "http://127.0.0.1:$PROXY_PORT/" >"$WORK/oha.json" 2>/dev/null &
  local load=$!
  sleep 0.5 # let the load reach its pace before sampling
  before=$(counters "$pids")
  perf stat -e raw_syscalls:sys_enter -x, -p "$pids" -o "$WORK/syscalls.txt" -- \
    sleep $((SECONDS_UNDER_LOAD - 1)) >/dev/null 2>&1 &
  local counting=$!
  perf record -q -e cpu-clock -F 1999 -g -p "$pids" -o "$WORK/perf.data" -- \
    sleep $((SECONDS_UNDER_LOAD - 1)) >/dev/null 2>&1
  after=$(counters "$pids")
  wait $counting
  wait $load
  kill -INT $pid; wait $pid 2>/dev/null || true
  perf report -i "$WORK/perf.data" --no-children --sort sym --stdio -q -g none 2>/dev/null \
    >"$WORK/report.txt"
  # REPORTS=dir keeps each case's symbols, for what the groups leave out.
  [ -z "${REPORTS:-}" ] || cp "$WORK/report.txt" "$REPORTS/${label//[^a-zA-Z0-9]/_}.txt"
  python3 - "$label" "$WORK/oha.json" "$before" "$after" "$((SECONDS_UNDER_LOAD - 1))" \
    "$(getconf CLK_TCK)" "$WORK/report.txt" "$WORK/syscalls.txt" <<'PY'
import json, re, sys
label, oha, before, after, window, hz, report, syscalls = sys.argv[1:]
rps = json.load(open(oha))["summary"]["requestsPerSec"]
b = [int(x) for x in before.split()]; a = [int(x) for x in after.split()]
requests = rps * float(window)
user_us = (a[0] - b[0]) / int(hz) * 1e6 / requests
sys_us = (a[1] - b[1]) / int(hz) * 1e6 / requests
switches = (a[2] - b[2]) / requests
entered = next(int(l.split(",")[0]) for l in open(syscalls) if "sys_enter" in l)
groups = {k: 0.0 for k in ("runtime", "http", "floodgate", "alloc", "memcpy", "user other",
                           "net", "irqs off", "syscall", "sched", "kernel other")}
for line in open(report):
    m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*)", line)
    if not m:
        continue
    share, where, sym = float(m.group(1)), m.group(2), m.group(3)
    if where == "k":
        if re.search(r"_raw_spin_unlock_irq", sym):
            # A VM's cpu-clock sample taken while interrupts were off lands
            # where they come back on: mostly loopback's softirq work.
            groups["irqs off"] += share
        elif re.search(r"tcp|ip_|skb|sock|net|dev_|inet|bbr|datagram|_iter|loopback|__sys_(send|recv)|sendmsg|recvmsg", sym):
            groups["net"] += share
        elif re.search(r"syscall|entry_|do_sys|__x64_sys|ret_from|exit_to_user", sym):
            groups["syscall"] += share
        elif re.search(r"sched|switch|wake|enqueue|dequeue|pick_next|futex|hrtimer|update_curr", sym):
            groups["sched"] += share
        else:
            groups["kernel other"] += share
    elif re.search(r"memcpy|memmove|memset", sym):
        groups["memcpy"] += share
    elif re.search(r"\bmi_|_mi_|mimalloc|malloc|free", sym):
        groups["alloc"] += share
    elif re.search(r"floodgate", sym):
        groups["floodgate"] += share
    elif re.search(r"tokio|mio|epoll", sym):
        groups["runtime"] += share
    elif re.search(r"pingora|http::|httparse|h2::|bytes::|ngx_", sym):
        groups["http"] += share
    else:
        groups["user other"] += share
shares = " | ".join(f"{groups[k]:>5.1f}" for k in groups)
print(f"| {label:<28} | {rps:>7.0f} | {user_us + sys_us:>5.1f} | {user_us:>5.1f} | {sys_us:>5.1f} | {entered / requests:>5.1f} | {switches:>5.2f} | {shares} |")
PY
}

echo "oha -c $CONNECTIONS for ${SECONDS_UNDER_LOAD}s on 127.0.0.1, one worker; CPU from /proc, shares (% of samples) from perf cpu-clock over the middle $((SECONDS_UNDER_LOAD - 1))s"
echo
echo "| case                         |   req/s | CPU µs/req | user | kernel | syscalls/req | sleeps/req | runtime | HTTP | floodgate | alloc | memcpy | user other | k: net | k: irqs off | k: syscall | k: sched | k: other |"
echo "|------------------------------|---------|-------|-------|-------|-------|-------|-------|-------|-------|-------|-------|-------|-------|-------|-------|-------|-------|"
nginx_server limit $PROXY_PORT 'limit_req zone=ip burst=1000000 nodelay; proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";'
measure "nginx limit_req, admitting" "$NGINX" -c "$WORK/limit.conf" -p "$WORK"
measure "bare Pingora proxy" "$BARE" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$UP" 1
measure "bare Pingora gateway" "$BARE" "127.0.0.1:$PROXY_PORT" "127.0.0.1:$UP" 1 gateway
measure "floodgate memory, admitting" "$FLOODGATE" --config "$WORK/fg.toml"
