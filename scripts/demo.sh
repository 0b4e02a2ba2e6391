#!/usr/bin/env bash
# ferry demo: live migration on this machine. Builds ferry and ferryd, then
# runs `ferry demo` as root: two test hosts and a client host (network +
# PID + mount namespaces on one bridge), redis-server moved back and forth
# between the hosts while clients keep their connections open, a report,
# and everything removed at the end (also on failure and on Ctrl-C).
#
# Usage: scripts/demo.sh [ferry demo options]   (normally via `make demo`)
#   e.g. scripts/demo.sh --migrations 6 --clients 16
#   DEMO_ARGS="--no-precopy" make demo
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "DEMO FAILED: ferry demo needs root (namespaces, ptrace); run as root" >&2
    exit 1
  fi
else
  SUDO=()
fi

echo "==> building ferry and ferryd (cargo build --release)"
cargo build --release --quiet --bin ferry --bin ferryd
# shellcheck disable=SC2086 # DEMO_ARGS is a list of options
exec "${SUDO[@]}" "$REPO/target/release/ferry" demo ${DEMO_ARGS:-} "$@"
