# Sourced by the other scripts: installs what building and testing floodgate
# needs when it is missing (cmake for Pingora's zlib-ng; redis-server and
# redis-sentinel for the Redis tests), from the system's packages; with
# FLOODGATE_NEEDS_DENY=1, cargo-deny from crates.io.
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
if [ "${FLOODGATE_NEEDS_REDIS:-0}" = 1 ]; then
  # The test suite's real servers and clients: Redis, openssl for test CAs,
  # curl and nghttp for HTTP/2, prlimit for the fd-limit test, ip for IPv6 peers, pip for the
  # Python gRPC, WebSocket and HTTP/2 (h2, for how headers are encoded) clients.
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  # The Sentinel tests' three sentinels.
  command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  command -v curl >/dev/null 2>&1 || need+=(curl)
  command -v nghttp >/dev/null 2>&1 || need+=(nghttp2-client)
  command -v prlimit >/dev/null 2>&1 || need+=(util-linux)
  # ip puts IPv6 test peers on the loopback interface.
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  command -v python3 >/dev/null 2>&1 || need+=(python3 python3-pip)
  # The alert rules' check reads YAML.
  python3 -c 'import yaml' >/dev/null 2>&1 || need+=(python3-yaml)
  # The status page's test drives a real headless browser.
  [ -x /usr/bin/chromium ] || need+=(chromium)
  [ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo is missing: install Rust from https://rustup.rs" >&2; exit 1; }
if [ "${FLOODGATE_NEEDS_DENY:-0}" = 1 ] && ! command -v cargo-deny >/dev/null 2>&1; then
  # The dependencies' licenses, bans and sources, checked against deny.toml.
  echo "installing: cargo-deny (crates.io)"
  cargo install --quiet --locked cargo-deny
fi
if [ "${FLOODGATE_NEEDS_REDIS:-0}" = 1 ] && ! python3 -c 'import grpc, grpc_tools, websockets, selenium, h2, openai, anthropic, opentelemetry.proto' >/dev/null 2>&1; then
  # grpcio-tools compiles the Envoy protos envoy-types ships, for the
  # rate limit service's Python client; openai and anthropic are the
  # providers' official SDKs, floodgate's clients in tests/llm_sdks.rs;
  # opentelemetry-proto's generated TraceService is the OTLP collector
  # floodgate's traces go to in the tests (tests/otlp_receiver.py).
  echo "installing: grpcio grpcio-tools websockets selenium h2 openai anthropic opentelemetry-proto (PyPI)"
  python3 -m pip install --quiet grpcio grpcio-tools websockets selenium h2 openai anthropic opentelemetry-proto 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages grpcio grpcio-tools websockets selenium h2 openai anthropic opentelemetry-proto
fi
