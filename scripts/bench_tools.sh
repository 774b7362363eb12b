# Sourced by loadtest.sh and instructions.sh: nginx and oha installed when
# missing, a work directory, and every process started there stopped on exit.

install_package() { # package: from the system's packages, with sudo when not root
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$1" >/dev/null
}
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  install_package nginx-light
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
command -v oha >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/oha" ] || cargo install oha --locked
OHA="$(command -v oha || echo "$HOME/.cargo/bin/oha")"

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
  echo "nothing listens on $1" >&2; cat "$WORK"/*.log >&2; exit 1
}
