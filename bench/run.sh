#!/usr/bin/env bash
# ferry benchmarks: checkpoint time, restore time and image size, images on
# tmpfs, median of N runs (default 10), for
#   (a) tiny     - an idle C program (bench/tiny.c)
#   (b) heap100  - a C program with 100 MiB of written heap (bench/heap100.c)
#   (c) redis    - redis-server (--io-threads 2) holding 100,000 keys
#
# Prints a markdown table and writes it to docs/benchmarks-latest.md.
#
# Environment:
#   BENCH_RUNS=10           runs per program (median reported)
#   BENCH_RESTORE_MODE=pidfile|detach
#       pidfile: `ferry restore --pidfile F` in the background; restore time =
#                from launch until F appears (polled every 0.2 ms).
#       detach:  `ferry restore --detach --pidfile F`; restore time = until the
#                command returns.
#   BENCH_ONLY="tiny heap100 redis"   subset to run
#   BENCH_OUT=FILE          where the table goes (default docs/benchmarks-latest.md)
#   BENCH_LOCAL_ONLY=1      only this table: not the tree, PID namespace, network
#                           lock, TCP, migration and replication benchmarks that follow it
#   BENCH_CHECKPOINT_ARGS=  more arguments of `ferry checkpoint` (e.g. --no-verify,
#                           to leave out the trial restore it makes by default)
#   FERRY_BIN=PATH          measure this ferry instead of target/release/ferry
#                           (then nothing is built but the C programs)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

RUNS="${BENCH_RUNS:-10}"
MODE="${BENCH_RESTORE_MODE:-pidfile}"
ONLY="${BENCH_ONLY:-tiny heap100 redis}"
FERRY="${FERRY_BIN:-$REPO/target/release/ferry}"
PY=/usr/bin/python3
OUT_MD="${BENCH_OUT:-$REPO/docs/benchmarks-latest.md}"

case "$MODE" in pidfile|detach) ;; *) echo "BENCH_RESTORE_MODE must be pidfile or detach" >&2; exit 2 ;; esac
if [ "$(id -u)" -ne 0 ]; then
  echo "bench/run.sh: ferry needs root; run as root" >&2
  exit 1
fi
[ -x "$PY" ] || { echo "bench/run.sh: $PY missing (scripts/install-deps.sh)" >&2; exit 1; }

log() { printf '[bench] %s\n' "$*" >&2; }
exec 4>&2

WORK="$(mktemp -d /tmp/ferry-bench.XXXXXX)"
MOUNTED=""
IMG_ROOT=""
PROG_PID=""     # program we started (our child)
PIDFILE=""      # pidfile of the current restore (restored program's PID)

cleanup() {
  local rc=$?
  set +e
  if [ -n "$PROG_PID" ] && kill -0 "$PROG_PID" 2>/dev/null; then
    kill -KILL "$PROG_PID" 2>/dev/null
    wait "$PROG_PID" 2>/dev/null
  fi
  if [ -n "$PIDFILE" ] && [ -s "$PIDFILE" ]; then
    p="$(tr -dc '0-9' <"$PIDFILE")"
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
  fi
  [ -n "$IMG_ROOT" ] && rm -rf "$IMG_ROOT"
  if [ -n "$MOUNTED" ]; then
    sleep 0.2
    umount "$MOUNTED" 2>/dev/null || umount -l "$MOUNTED" 2>/dev/null
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build -------------------------------------------------------------------
if [ -z "${FERRY_BIN:-}" ]; then
  log "building ferry (release) and the bench programs"
  cargo build --release --quiet
fi
[ -x "$FERRY" ] || { echo "bench/run.sh: $FERRY not built" >&2; exit 1; }
mkdir -p target/c
cc -O2 -Wall -o target/c/tiny bench/tiny.c
cc -O2 -Wall -o target/c/heap100 bench/heap100.c

# --- tmpfs for the images -----------------------------------------------------
if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] &&
   [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -ge $((1024 * 1024)) ]; then
  IMG_ROOT="$(mktemp -d /dev/shm/ferry-bench.XXXXXX)"
  TMPFS_DESC="/dev/shm (tmpfs)"
else
  MOUNTED="$WORK/tmpfs"
  mkdir -p "$MOUNTED"
  mount -t tmpfs -o size=2g,mode=0700 ferry-bench "$MOUNTED"
  IMG_ROOT="$MOUNTED/images"
  mkdir -p "$IMG_ROOT"
  TMPFS_DESC="a private tmpfs mounted for the run"
fi
log "images on $TMPFS_DESC"

# --- helpers ------------------------------------------------------------------
# Restore timer: launches ferry restore, measures, sanity-checks, then kills
# the restored program (SIGKILL, by the PID in the pidfile) and reaps.
cat >"$WORK/restore_timer.py" <<'PYEOF'
import os, signal, subprocess, sys, time

ferry, images, pidfile, mode, errfile, check = sys.argv[1:7]

def read_pid():
    try:
        with open(pidfile) as f:
            s = f.read().strip()
        return int(s) if s else None
    except (OSError, ValueError):
        return None

def gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True

err = open(errfile, "w")
if mode == "detach":
    t0 = time.perf_counter_ns()
    r = subprocess.run([ferry, "restore", "--images", images, "--pidfile", pidfile, "--detach"],
                       stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=60)
    t1 = time.perf_counter_ns()
    if r.returncode != 0:
        sys.exit("ferry restore --detach failed with %d" % r.returncode)
    pid = read_pid()
    if pid is None:
        sys.exit("no pidfile after ferry restore --detach")
    proc = None
else:
    t0 = time.perf_counter_ns()
    proc = subprocess.Popen([ferry, "restore", "--images", images, "--pidfile", pidfile],
                            stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    deadline = time.monotonic() + 60
    while True:
        pid = read_pid()
        if pid is not None:
            break
        if proc.poll() is not None:
            sys.exit("ferry restore exited (%d) before writing the pidfile" % proc.returncode)
        if time.monotonic() > deadline:
            proc.kill(); proc.wait()
            sys.exit("no pidfile within 60 s")
        time.sleep(0.0002)
    t1 = time.perf_counter_ns()

ok = not gone(pid)
if ok and check:
    ok = subprocess.run(check, shell=True, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, timeout=30).returncode == 0
try:
    os.kill(pid, signal.SIGKILL)
except ProcessLookupError:
    pass
if proc is not None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill(); proc.wait()
else:
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
if not ok:
    sys.exit("restored process %d was not alive/healthy after restore" % pid)
print("%.3f" % ((t1 - t0) / 1e6))
PYEOF

free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_log() { # file needle timeout_s
  for _ in $(seq $(($3 * 20))); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$PROG_PID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

now_ns() { date +%s%N; }

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "n/a"; exit} if (NR%2) printf "%.1f\n", a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'; }

human() { # bytes -> human readable
  awk -v b="$1" 'BEGIN { split("B KiB MiB GiB", u); i=1; while (b>=1024 && i<4) {b/=1024; i++} printf (i==1 ? "%d %s" : "%.1f %s"), b, u[i] }'
}

# start_program NAME PORT: starts the subject as our child (new session),
# waits until it is ready and has its state. Sets PROG_PID, CHECK_CMD.
start_program() {
  local name=$1 port=$2 logf="$WORK/$1.log"
  CHECK_CMD=""
  case "$name" in
    tiny)
      scripts/isolated.sh target/c/tiny >"$logf" 2>&1 </dev/null &
      PROG_PID=$!
      wait_log "$logf" READY 10 ;;
    heap100)
      scripts/isolated.sh target/c/heap100 >"$logf" 2>&1 </dev/null &
      PROG_PID=$!
      wait_log "$logf" READY 30 ;;
    redis)
      scripts/isolated.sh /usr/bin/redis-server --port "$port" --bind 127.0.0.1 --io-threads 2 \
        --save '' --appendonly no --daemonize no --dir "$WORK" \
        --enable-debug-command local >"$logf" 2>&1 </dev/null &
      PROG_PID=$!
      for _ in $(seq 200); do
        [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && break
        kill -0 "$PROG_PID" 2>/dev/null || break
        sleep 0.05
      done
      [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] || return 1
      redis-cli -p "$port" DEBUG POPULATE 100000 key 32 >/dev/null
      [ "$(redis-cli -p "$port" DBSIZE)" = 100000 ] || return 1
      CHECK_CMD="[ \"\$(redis-cli -p $port DBSIZE)\" = 100000 ]" ;;
  esac
}

# bench_one NAME: RUNS measured runs (plus one warm-up); appends a table row.
ROWS=()
bench_one() {
  local name=$1 run port t0 t1 rc size restore_ms
  local cps=() rss=() sizes=() cpe=() rse=()
  for run in $(seq 0 "$RUNS"); do   # run 0 is a warm-up, not counted
    port=$(free_port)
    if ! start_program "$name" "$port"; then
      echo "bench/run.sh: $name did not start; log:" >&2; cat "$WORK/$name.log" >&2
      exit 1
    fi
    local images="$IMG_ROOT/$name-$run"
    mkdir -p "$images"
    # The block's stderr goes to a file: bash reports the killed background
    # job ("Killed ...") there instead of cluttering the output. Real errors
    # go to fd 4, the script's stderr.
    {
    t0=$(now_ns)
    set +e
    # shellcheck disable=SC2086 # word splitting of the extra arguments is wanted
    timeout 60 "$FERRY" checkpoint --pid "$PROG_PID" --images "$images" ${BENCH_CHECKPOINT_ARGS:-} >"$WORK/ckpt.out" 2>"$WORK/ckpt.err"
    rc=$?
    set -e
    t1=$(now_ns)
    if [ "$rc" -ne 0 ]; then
      echo "bench/run.sh: ferry checkpoint of $name failed ($rc): $(cat "$WORK/ckpt.err")" >&4
      exit 1
    fi
    # Reap the checkpointed program (ferry killed it) so its PID is free again.
    local state=""
    for _ in $(seq 200); do
      state="$(awk '{print $3}' /proc/"$PROG_PID"/stat 2>/dev/null || echo gone)"
      { [ "$state" = Z ] || [ "$state" = gone ]; } && break
      sleep 0.05
    done
    if [ "$state" != Z ] && [ "$state" != gone ]; then
      echo "bench/run.sh: $name (PID $PROG_PID) still runs after ferry checkpoint" >&4
      exit 1
    fi
    set +e; wait "$PROG_PID"; set -e
    PROG_PID=""
    } 2>>"$WORK/job-notices.log"
    size=$(du -sb "$images" | cut -f1)

    PIDFILE="$WORK/restored.pid"
    rm -f "$PIDFILE"
    if ! restore_ms=$("$PY" "$WORK/restore_timer.py" "$FERRY" "$images" "$PIDFILE" "$MODE" \
                        "$WORK/restore.err" "$CHECK_CMD"); then
      echo "bench/run.sh: restore of $name failed: $(cat "$WORK/restore.err")" >&2
      exit 1
    fi
    PIDFILE=""
    rm -rf "$images"
    if [ "$run" -gt 0 ]; then
      cps+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", (b-a)/1e6}')")
      rss+=("$restore_ms")
      # ferry's own measure of its work, without process start-up.
      cpe+=("$(sed -n 's/.* in \([0-9.]*\) ms; .*/\1/p' "$WORK/ckpt.out")")
      rse+=("$(sed -n 's/^restored pid .* in \([0-9.]*\) ms$/\1/p' "$WORK/restore.err" | head -1)")
      sizes+=("$size")
      log "$name run $run/$RUNS: checkpoint $(( (t1 - t0) / 1000000 )) ms, restore $restore_ms ms, image $(human "$size")"
    fi
  done
  local cp_med rs_med sz_med cpe_med rse_med
  cpe_med=$(printf '%s\n' "${cpe[@]}" | median)
  rse_med=$(printf '%s\n' "${rse[@]}" | median)
  cp_med=$(printf '%s\n' "${cps[@]}" | median)
  rs_med=$(printf '%s\n' "${rss[@]}" | median)
  sz_med=$(printf '%s\n' "${sizes[@]}" | median)
  sz_med=${sz_med%.*}
  if [ "$sz_med" -ge 1024 ]; then
    ROWS+=("| $2 | $cp_med | $rs_med | $cpe_med | $rse_med | $(human "$sz_med") ($sz_med B) |")
  else
    ROWS+=("| $2 | $cp_med | $rs_med | $cpe_med | $rse_med | $sz_med B |")
  fi
}

T_START=$(date +%s)
for p in $ONLY; do
  case "$p" in
    tiny) bench_one tiny "tiny idle C program (bench/tiny.c)" ;;
    heap100) bench_one heap100 "C program, 100 MiB written heap (bench/heap100.c)" ;;
    redis)
      if [ -x /usr/bin/redis-server ] && command -v redis-cli >/dev/null; then
        bench_one redis "redis-server $(redis-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p'), --io-threads 2, 100,000 keys"
      else
        log "redis-server/redis-cli not installed: skipping (scripts/install-deps.sh)"
      fi ;;
    *) echo "unknown benchmark '$p'" >&2; exit 2 ;;
  esac
done
T_END=$(date +%s)

if [ "$MODE" = detach ]; then
  RESTORE_NOTE="restore = wall time of \`ferry restore --detach --pidfile F\` until it returns"
else
  RESTORE_NOTE="restore = from launching \`ferry restore --pidfile F\` until F appears (polled every 0.2 ms)"
fi
REV="$(git rev-parse --short HEAD 2>/dev/null || echo uncommitted)"
CPU="$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
{
  echo "# ferry benchmarks (latest run)"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); ferry $REV; kernel $(uname -r); $(nproc) CPUs ($CPU); $(free -g | awk '/^Mem:/ {print $2}') GiB RAM"
  echo "- images on $TMPFS_DESC; median of $RUNS runs after one warm-up run"
  echo "- checkpoint = wall time of \`ferry checkpoint --pid P --images DIR\` (write + verify + kill)"
  echo "- $RESTORE_NOTE"
  echo "- image size = \`du -sb DIR\`"
  echo
  echo "- engine = ferry's own timing of the operation (printed by the command), without process start-up"
  echo ""
  echo "| program | checkpoint (ms) | restore (ms) | checkpoint, engine (ms) | restore, engine (ms) | image size |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "Total benchmark time: $((T_END - T_START)) s."
} >"$WORK/table.md"
mkdir -p "$(dirname "$OUT_MD")"
cp "$WORK/table.md" "$OUT_MD"
cat "$WORK/table.md"
log "written to ${OUT_MD#"$REPO"/}"
[ -n "${BENCH_LOCAL_ONLY:-}" ] && exit 0
bash "$REPO/bench/trees.sh"   # process trees: docs/benchmarks-trees-latest.md
bash "$REPO/bench/pidns.sh"   # --new-pid-ns restore cost: docs/benchmarks-pidns-latest.md
bash "$REPO/bench/netlock.sh" # network lock freeze/thaw per method and N: docs/benchmarks-netlock-latest.md
/usr/bin/python3 "$REPO/bench/tcp.py"  # pause against established connections: docs/benchmarks-tcp-latest.md (+ .png)
/usr/bin/python3 "$REPO/bench/tiny_listener.py" "$FERRY"  # tiny listener against CRIU, client's longest wait: docs/benchmarks-tiny-latest.md
/usr/bin/python3 "$REPO/bench/migrate.py"  # live migration: pause vs memory, vs connections, nginx under ab: docs/benchmarks-migrate-latest.md (+ .png)
/usr/bin/python3 "$REPO/bench/replicate.py"  # hot standby: redis under load, failover, partition: docs/benchmarks-replicate-latest.md
