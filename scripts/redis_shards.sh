#!/usr/bin/env bash
# What more Cluster masters buy on this machine: makes Redis Clusters of 1, 2
# and 3 masters on loopback (no replicas, no persistence; the slots split
# evenly with CLUSTER ADDSLOTSRANGE, as redis-cli --cluster create will not
# make fewer than 3), runs examples/redis_shards.rs against each and prints
# one table. SHARDS_BEFORE=path runs another build of the example on the same
# clusters too, its rows after each of this build's. Bounded: 60,000 decisions per row; every server stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
FLOODGATE_NEEDS_REDIS=1 source scripts/setup.sh
source scripts/processes.sh
cargo build --release --quiet --example redis_shards
SHARDS="$PWD/target/release/examples/redis_shards"

free_port() { # below 55536: a cluster node also listens 10,000 ports higher
  python3 -c '
import random, socket
while True:
    port = random.randint(20000, 45000)
    try:
        for p in (port, port + 10000):
            socket.socket().bind(("127.0.0.1", p))
        print(port)
        break
    except OSError:
        pass'
}

cluster_of() { # masters: starts them and assigns the slots; their ports in PORTS
  local n="$1" port
  PORTS=()
  for i in $(seq 1 "$n"); do
    port=$(free_port)
    mkdir -p "$WORK/$port"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$WORK/$port" --cluster-enabled yes --cluster-config-file nodes.conf \
      >"$WORK/$port.log" 2>&1 &
    PIDS+=($!)
    wait_port "$port"
    PORTS+=("$port")
  done
  local per=$((16384 / n))
  for i in "${!PORTS[@]}"; do
    local first=$((i * per)) last=$(((i + 1) * per - 1))
    if [ "$i" -eq $((n - 1)) ]; then last=16383; fi
    redis-cli -p "${PORTS[$i]}" CLUSTER ADDSLOTSRANGE "$first" "$last" >/dev/null
    if [ "$i" -gt 0 ]; then
      redis-cli -p "${PORTS[$i]}" CLUSTER MEET 127.0.0.1 "${PORTS[0]}" >/dev/null
    fi
  done
  for _ in $(seq 1 200); do
    local ready=1
    for port in "${PORTS[@]}"; do
      redis-cli -p "$port" CLUSTER INFO | grep -q "cluster_state:ok" || ready=0
      [ "$(redis-cli -p "$port" CLUSTER INFO | tr -d '\r' | awk -F: '/cluster_known_nodes/ {print $2}')" = "$n" ] || ready=0
    done
    if [ "$ready" = 1 ]; then return 0; fi
    sleep 0.1
  done
  echo "the cluster of $n did not form" >&2; exit 1
}

echo "| masters | layers | clients | decisions/s | Redis µs per decision, all masters | busiest master's share | client CPU µs per decision |"
echo "|---|---|---|---|---|---|---|"
for n in 1 2 3; do
  started=${#PIDS[@]}
  cluster_of "$n"
  urls=()
  for port in "${PORTS[@]}"; do urls+=("redis://127.0.0.1:$port"); done
  "$SHARDS" "${urls[@]}"
  if [ -n "${SHARDS_BEFORE:-}" ]; then
    "$SHARDS_BEFORE" "${urls[@]}" | sed 's/^| /| before: /'
  fi
  for pid in "${PIDS[@]:$started}"; do kill "$pid" 2>/dev/null || true; done
done
