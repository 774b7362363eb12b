# Sourced by loadtest.sh and instructions.sh: nginx and oha installed when
# missing, and scripts/processes.sh.

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

source scripts/processes.sh
