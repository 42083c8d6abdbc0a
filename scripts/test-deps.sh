#!/usr/bin/env bash
# Installs the real servers that the tests use (Debian packages), when run as
# root; otherwise prints the command to run. Tests that need a missing server
# fail when CI=true and skip elsewhere with this same command in the message.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${need[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "tests that need ${need[*]} will be skipped; install with:"
  echo "  sudo apt-get install -y ${need[*]}"
fi
