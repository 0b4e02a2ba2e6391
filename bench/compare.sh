#!/usr/bin/env bash
# Before/after in one run: the same benchmarks with two builds of ferry,
# one after the other, so that both see the same machine.
#
#   bench/compare.sh BEFORE_DIR AFTER_DIR [OUT]
#
# BEFORE_DIR and AFTER_DIR each hold a `ferry` and a `ferryd` (e.g. two
# target/release directories). Runs, for each build:
#   - bench/run.sh: tiny, 100 MiB heap and redis checkpoint + restore
#     (BENCH_RUNS, default 7);
#   - bench/migrate.py: the migration pause at 16 MiB and 1 GiB, idle,
#     pre-copy and post-copy (COMPARE_MIGRATE_RUNS, default 3);
#   - bench/tcp.py: the eBPF lock at 2,000 connections (3 runs).
# Prints every table under a heading naming the build and writes them all
# to OUT (default docs/benchmarks-compare-latest.md). Needs root.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BEFORE="${1:?usage: bench/compare.sh BEFORE_DIR AFTER_DIR [OUT]}"
AFTER="${2:?usage: bench/compare.sh BEFORE_DIR AFTER_DIR [OUT]}"
OUT="${3:-$REPO/docs/benchmarks-compare-latest.md}"
RUNS_MIGRATE="${COMPARE_MIGRATE_RUNS:-3}"
for d in "$BEFORE" "$AFTER"; do
  for b in ferry ferryd; do
    [ -x "$d/$b" ] || { echo "bench/compare.sh: $d/$b is missing" >&2; exit 2; }
  done
done
WORK="$(mktemp -d /tmp/ferry-compare.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

run_one() {  # label dir
  local label="$1" dir="$2"
  export FERRY_BIN="$dir/ferry" FERRYD_BIN="$dir/ferryd"
  echo "[compare] $label: checkpoint + restore" >&2
  BENCH_RUNS="${BENCH_RUNS:-7}" BENCH_LOCAL_ONLY=1 BENCH_OUT="$WORK/$label-local.md" \
    bash "$REPO/bench/run.sh" >&2
  echo "[compare] $label: migration pause" >&2
  python3 "$REPO/bench/migrate.py" --parts mem --sizes 16,1024 --workloads idle \
    --modes pre,post --runs "$RUNS_MIGRATE" --out "$WORK/$label-migrate.md" >&2
  echo "[compare] $label: TCP connections" >&2
  python3 "$REPO/bench/tcp.py" --n 2000 --methods ebpf --runs 3 --out "$WORK/$label-tcp.md" >&2
}

run_one before "$BEFORE"
run_one after "$AFTER"
{
  echo "# Before and after, one run ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "Command: \`bench/compare.sh $BEFORE $AFTER\`"
  for label in before after; do
    for part in local migrate tcp; do
      echo
      echo "## $label: $part"
      echo
      grep -v '^# ' "$WORK/$label-$part.md" || true
    done
  done
} >"$OUT"
cat "$OUT"
echo "[compare] written to $OUT" >&2
