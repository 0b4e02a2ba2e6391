#!/usr/bin/env bash
# Restore time with and without --new-pid-ns, on a 3-process tree
# (`sh -c 'sleep & sleep & wait'`). The tree is checkpointed once with
# --leave-running; then N restores with --new-pid-ns while the original
# still holds its PIDs, and, once the original is gone, N restores into
# ferry's own PID namespace (each restored tree killed, and its PIDs
# waited free, before the next). Reports ferry's engine time ("in X ms")
# and the wall time of `ferry restore --detach` for each run, prints a
# markdown table and writes it to docs/benchmarks-pidns-latest.md.
#
# Environment: BENCH_PIDNS_RUNS=5, FERRY_BIN=target/release/ferry.
# Needs root. Every wait is bounded; everything started is killed by PID.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${BENCH_PIDNS_RUNS:-5}"
FERRY="${FERRY_BIN:-$REPO/target/release/ferry}"
OUT_MD="$REPO/docs/benchmarks-pidns-latest.md"
WORK="$(mktemp -d /tmp/ferry-bench-pidns.XXXXXX)"
STARTED=()
cleanup() {
  for p in "${STARTED[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] || { echo "bench/pidns.sh: needs root" >&2; exit 1; }
[ -x "$FERRY" ] || { echo "bench/pidns.sh: $FERRY not built (make build)" >&2; exit 1; }

# Waits (at most 10 s) until none of the given PIDs exists.
wait_free() {
  for _ in $(seq 1000); do
    local busy=0
    for p in "$@"; do [ -e "/proc/$p" ] && busy=1; done
    [ $busy = 0 ] && return 0
    sleep 0.01
  done
  echo "bench/pidns.sh: PIDs $* still taken after 10 s" >&2; exit 1
}

now_us() { echo $(( $(date +%s%N) / 1000 )); }
engine_ms() { sed -n 's/.* in \([0-9.]*\) ms.*/\1/p' "$1" | tail -1; }

bash "$REPO/scripts/isolated.sh" sh -c 'sleep 600 & sleep 601 & wait' </dev/null >/dev/null 2>&1 &
ROOT=$!
disown "$ROOT" 2>/dev/null || true
STARTED+=("$ROOT")
sleep 0.3
KIDS=$(cat /proc/$ROOT/task/*/children)
STARTED+=($KIDS)
"$FERRY" checkpoint --pid "$ROOT" --images "$WORK/img" --leave-running >/dev/null

ns_engine=(); ns_wall=()
for i in $(seq "$RUNS"); do
  t=$(now_us)
  "$FERRY" restore --images "$WORK/img" --new-pid-ns --detach --pidfile "$WORK/ns$i" 2>"$WORK/ns$i.err"
  ns_wall+=("$(( ($(now_us) - t) / 100 ))")
  ns_engine+=("$(engine_ms "$WORK/ns$i.err")")
  init=$(awk '{print $4}' "/proc/$(cat "$WORK/ns$i")/stat")
  kill -9 "$init"   # ends the whole namespace
done

kill -9 "$ROOT" $KIDS
wait_free "$ROOT" $KIDS
plain_engine=(); plain_wall=()
for i in $(seq "$RUNS"); do
  t=$(now_us)
  "$FERRY" restore --images "$WORK/img" --detach --pidfile "$WORK/plain$i" 2>"$WORK/plain$i.err"
  plain_wall+=("$(( ($(now_us) - t) / 100 ))")
  plain_engine+=("$(engine_ms "$WORK/plain$i.err")")
  kill -9 "$ROOT" $KIDS
  wait_free "$ROOT" $KIDS
done

fmt_wall() { local o=""; for v in "$@"; do o+="$(printf '%d.%d, ' $((v / 10)) $((v % 10)))"; done; echo "${o%, }"; }
join() { local IFS=","; echo "$*" | sed 's/,/, /g'; }
{
  echo "| restore of a 3-process tree | engine ms ($RUNS runs) | wall ms ($RUNS runs) |"
  echo "|---|---|---|"
  echo "| same PIDs in ferry's PID namespace | $(join "${plain_engine[@]}") | $(fmt_wall "${plain_wall[@]}") |"
  echo "| \`--new-pid-ns\` (original still running) | $(join "${ns_engine[@]}") | $(fmt_wall "${ns_wall[@]}") |"
  echo
  echo "Command: \`bash bench/pidns.sh\` ($(uname -r), $(nproc) CPUs, $(date -u +%Y-%m-%d))."
} | tee "$OUT_MD"
