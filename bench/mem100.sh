#!/usr/bin/env bash
# Local checkpoint + restore of 100 MiB on tmpfs (bench/heap100.c, images
# in /dev/shm), next to the copy's own speed on this machine
# (bench/copy_speeds.c: the same 100 MiB moved by each step ferry uses).
#
# Runs bench/phases.py with `ferry checkpoint --no-verify` (the figure
# against the 50 ms goal) and with the default trial restore (--verify),
# then bench/copy_speeds.c; prints one markdown file and writes it to
# docs/benchmarks-mem100-latest.md. Medians (min-max) over the runs.
#
# Environment:
#   BENCH_RUNS=7      runs of each (median reported)
#   FERRY_BIN=PATH    measure this ferry instead of target/release/ferry
#   BENCH_OUT=FILE    where the tables go
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
RUNS="${BENCH_RUNS:-7}"
OUT="${BENCH_OUT:-$REPO/docs/benchmarks-mem100-latest.md}"
[ "$(id -u)" -eq 0 ] || { echo "bench/mem100.sh: ferry needs root" >&2; exit 1; }
WORK="$(mktemp -d /tmp/ferry-mem100.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p target/c
cc -O2 -Wall -o target/c/heap100 bench/heap100.c
cc -O2 -Wall -pthread -o "$WORK/copy_speeds" bench/copy_speeds.c

ROWS='checkpoint WALL|checkpoint TOTAL|checkpoint PAUSE|checkpoint: pages|checkpoint: kill|checkpoint: trial restore|checkpoint trial restore: (read|root: files)|restore WALL|restore TOTAL|restore: read\+verify|restore: root: files|checkpoint \+ restore'
table() { # $1: title, $2: phases.py output
    printf '| %s | ms, median (min-max) |\n| --- | ---: |\n' "$1"
    sed -n '/^median over/,$p' "$2" | grep -E "^  ($ROWS)" |
        sed -E 's/^  (.*[^ ]) +([0-9.]+) +\((.*)\)$/| \1 | \2 (\3) |/'
}
{
    echo "# 100 MiB local checkpoint + restore, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "\`bench/mem100.sh\` ($RUNS runs each; \`uptime\`: $(uptime | sed 's/.*load/load/'))."
    echo
    BENCH_CHECKPOINT_ARGS=--no-verify python3 bench/phases.py target/c/heap100 "$RUNS" >"$WORK/nv" 2>&1
    table "heap100, \`ferry checkpoint --no-verify\`" "$WORK/nv"
    echo
    python3 bench/phases.py target/c/heap100 "$RUNS" >"$WORK/v" 2>&1
    table "heap100, \`ferry checkpoint\` (default: trial restore)" "$WORK/v"
    echo
    "$WORK/copy_speeds" "$RUNS"
} | tee "$OUT"
echo "written to $OUT" >&2
