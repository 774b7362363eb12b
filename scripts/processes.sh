# Sourced by the benchmark scripts: a work directory, every process started
# into PIDS stopped on exit, and waiting for a port with a deadline.

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

wait_port() { # port: until something listens there, or the logs and out
  for _ in $(seq 1 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2; tail -n 20 "$WORK"/*.log >&2; exit 1
}
