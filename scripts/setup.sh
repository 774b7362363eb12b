# Sourced by the other scripts: installs what building and testing floodgate
# needs when it is missing (cmake for Pingora's zlib-ng; redis-server for the
# Redis tests), from the system's packages.
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
if [ "${FLOODGATE_NEEDS_REDIS:-0}" = 1 ]; then
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo is missing: install Rust from https://rustup.rs" >&2; exit 1; }
