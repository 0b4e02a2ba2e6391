#!/bin/bash
# The test suite as `make test` runs it: `cargo test` over the workspace,
# then the network lock bases the tests installed are removed.
#
# A base is the lock's eBPF program of one network namespace, installed by
# the first lock there and kept (docs/network-lock.md). Tests that check-
# point TCP services in this machine's own namespace share its base; the
# suite removes it at the end unless it was there before the suite ran
# (then it is someone's, and stays). Bases of the tests' own namespaces go
# with those namespaces (ferry_testkit::NetNs).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CARGO="${CARGO:-cargo}"
FERRY="${CARGO_TARGET_DIR:-target}/release/ferry"
PINS=/sys/fs/bpf/ferry

bases() { ls "$PINS" 2>/dev/null | grep '^ns' || true; }

before="$(bases)"
"$CARGO" test --release --workspace -- --test-threads=2
status=$?
for base in $(bases); do
  if ! grep -qxF "$base" <<<"$before"; then
    "$FERRY" network-lock --release "$base" || echo "test-suite.sh: $base left in place (in use)" >&2
  fi
done
exit $status
