#!/usr/bin/env bash
# ferry failover demo: hot-standby replication on this machine. Builds
# ferry and ferryd, then runs one failover of bench/replicate.py as root:
# test hosts a and b (ferryd in each, with --etcd), a witness host with its
# own etcd, a client host; redis-server on a, protected by `ferry
# replicate` with b as the standby; 10 clients count INCRs and check every
# reply; host a is killed (link down, its PID 1 killed); b takes over. The
# report shows the clients' failed requests (0), the increments lost (0)
# and the longest wait a client saw across the failover. Everything it
# made is removed at the end, also on failure and on Ctrl-C.
#
# Usage: scripts/demo-failover.sh   (normally via `make demo-failover`)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "DEMO FAILED: the failover demo needs root (namespaces, ptrace); run as root" >&2
  exit 1
fi
echo "==> building ferry and ferryd (cargo build --release)"
cargo build --release --quiet --bin ferry --bin ferryd
out="$(mktemp /tmp/ferry-demo-failover-XXXXXX.md)"
trap 'rm -f "$out"' EXIT
echo "==> redis on host a, protected by host b; host a dies under 10 clients"
FERRY_BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/ferry" \
FERRYD_BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/ferryd" \
  /usr/bin/python3 bench/replicate.py --parts failover --runs 1 --out "$out" >/dev/null
sed -n '/^## Failover/,$p' "$out"
