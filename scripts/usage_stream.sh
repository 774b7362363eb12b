#!/usr/bin/env bash
# CPU per MiB of an OpenAI event stream through floodgate, in one run:
# forwarded by a limit that does not read the body, and by the same limit
# charged by the stream's usage (the body scanned as it passes), beside
# the bare proxy (no limits). nginx serves the stream (an 8 MiB chat
# completion of ~120-byte chunks, its usage in the last), the same bytes
# each time. Release build; bounded in requests; traffic on 127.0.0.1 only.
#
#   scripts/usage_stream.sh [requests]        (default 60)
#   FLOODGATE=<binary> MIB=<size of the stream>
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/processes.sh

REQUESTS="${1:-60}"
MIB="${MIB:-8}"
FLOODGATE="${FLOODGATE:-target/release/floodgate}"
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
UP=18711
PROXY_PORT=18712
[ -x "$FLOODGATE" ] || { echo "no $FLOODGATE: cargo build --release" >&2; exit 1; }

python3 - "$WORK/stream.sse" "$MIB" <<'PY'
import json, sys
path, mib = sys.argv[1], int(sys.argv[2])
chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
         "model": "gpt-4o", "choices": [{"index": 0, "delta": {"content": "word "}, "finish_reason": None}]}
line = ("data: " + json.dumps(chunk) + "\n\n").encode()
n = mib * 1024 * 1024 // len(line)
usage = {**chunk, "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": n, "total_tokens": 20 + n}}
with open(path, "wb") as f:
    f.write(line * n)
    f.write(("data: " + json.dumps(usage) + "\n\ndata: [DONE]\n\n").encode())
PY
BYTES=$(stat -c %s "$WORK/stream.sse")
# nginx's workers run as another user.
chmod 755 "$WORK"; chmod 644 "$WORK/stream.sse"

cat > "$WORK/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx.error.log error;
events { worker_connections 256; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$UP;
    location / { root $WORK; default_type text/event-stream; rewrite ^ /stream.sse break; }
  }
}
CONF
"$NGINX" -c "$WORK/nginx.conf" -p "$WORK" & PIDS+=($!)
wait_port $UP

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# case label limit-lines: CPU ms per MiB streamed through floodgate.
run_case() {
  cat > "$WORK/proxy.toml" <<CONF
[server]
listen = "127.0.0.1:$PROXY_PORT"
threads = 1
[upstream]
servers = ["127.0.0.1:$UP"]
$2
CONF
  "$FLOODGATE" --config "$WORK/proxy.toml" > "$WORK/floodgate.log" 2>&1 & local pid=$!
  PIDS+=("$pid")
  wait_port $PROXY_PORT
  local got before after
  got=$(curl -s -o /dev/null -w '%{size_download}' "http://127.0.0.1:$PROXY_PORT/v1/chat/completions")
  before=$(ticks "$pid")
  for _ in $(seq 1 "$REQUESTS"); do
    curl -s -o /dev/null "http://127.0.0.1:$PROXY_PORT/v1/chat/completions"
  done
  after=$(ticks "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c '
import sys
label, ticks, hz, n, size, got = sys.argv[1], *map(int, sys.argv[2:])
assert got == size, f"{label}: {got} bytes answered, not {size}"
mib = n * size / 1048576
print(f"| {label} | {ticks * 1000 / hz / mib:.2f} |")' "$1" $((after - before)) "$HZ" "$REQUESTS" "$BYTES" "$got"
}

LIMIT='[[limits]]
name = "tokens"
key = "ip"
algorithm = "fixed_window"
limit = 1000000000000
window = "1h"'
echo "$REQUESTS streams of $((BYTES / 1024)) KiB each, one worker thread, $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "| case | floodgate CPU ms per MiB streamed |"
echo "|---|---|"
run_case "no limits" ""
run_case "a limit that does not read the body" "$LIMIT"
run_case "the limit charged by the stream's usage" "$LIMIT
cost_from_response = { usage = \"openai\", max = 1000000000, default = 1 }"
