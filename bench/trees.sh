#!/usr/bin/env bash
# ferry process-tree benchmarks: checkpoint time, restore time, image size,
# and the tree's memory (sum of RSS and PSS over its processes, from
# /proc/PID/smaps_rollup) before the checkpoint and after the restore, for
#   (a) nginx        - Debian's nginx, master + 4 workers (workers as nobody)
#   (b) tree_shared  - bench/tree_shared.c: 200 MiB of written private
#                      anonymous memory, shared copy-on-write with 8 workers
#                      that only read it (9 processes)
# Each tree is started through scripts/isolated.sh, checkpointed with
# `ferry checkpoint --pid ROOT --images DIR` (which kills the whole tree) and
# restored with `ferry restore --images DIR --detach --pidfile F`; the restored
# tree must have the same PIDs. Images on tmpfs; median of N runs after one
# warm-up run. PSS after restore close to PSS before means the restore kept
# the pages shared between the processes.
#
# Prints a markdown table and writes it to docs/benchmarks-trees-latest.md.
# `make bench` runs it after bench/run.sh. Every wait is bounded; a failed
# checkpoint or restore stops the script with ferry's message.
#
# Environment:
#   BENCH_TREE_RUNS=3                  runs per tree (median reported)
#   BENCH_TREE_ONLY="nginx shared"     subset to run
#   BENCH_TREE_MIB=200 BENCH_TREE_WORKERS=8    tree_shared's size
#   BENCH_TREE_TIMEOUT=120             seconds allowed per ferry command
#   FERRY_BIN=target/release/ferry
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

RUNS="${BENCH_TREE_RUNS:-3}"
ONLY="${BENCH_TREE_ONLY:-nginx shared}"
MIB="${BENCH_TREE_MIB:-200}"
WORKERS="${BENCH_TREE_WORKERS:-8}"
NGINX_WORKERS=4
FERRY="${FERRY_BIN:-$REPO/target/release/ferry}"
PY=/usr/bin/python3
NGINX=/usr/sbin/nginx
OUT_MD="$REPO/docs/benchmarks-trees-latest.md"
FERRY_TIMEOUT="${BENCH_TREE_TIMEOUT:-120}"   # s, per ferry command
GONE_TIMEOUT=30     # s, for a killed tree to disappear (init reaps orphans)

if [ "$(id -u)" -ne 0 ]; then
  echo "bench/trees.sh: ferry needs root; run as root" >&2
  exit 1
fi
[ -x "$PY" ] || { echo "bench/trees.sh: $PY missing (scripts/install-deps.sh)" >&2; exit 1; }

log() { printf '[bench-trees] %s\n' "$*" >&2; }
exec 4>&2
fail() { printf 'bench/trees.sh: %s\n' "$*" >&2; exit 1; }

WORK="$(mktemp -d /tmp/ferry-bench-trees.XXXXXX)"
chmod 755 "$WORK"   # nginx workers (nobody) read files in it
MOUNTED=""
IMG_ROOT=""
PROG_PID=""         # the root we started (our child), until reaped
TRACKED=()          # "pid:starttime" of every process of our trees

starttime() { # pid -> field 22 of /proc/PID/stat, empty if gone
  local s
  s="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  s="${s##*) }"
  # shellcheck disable=SC2086
  set -- $s
  echo "${20}"
}

state() { # pid -> state letter, empty if gone
  local s
  s="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  s="${s##*) }"
  echo "${s%% *}"
}

same() { # "pid:start" -> true while that process exists (even as a zombie)
  [ "$(starttime "${1%%:*}")" = "${1##*:}" ]
}

track() { # pid...: remember pid + start time for the cleanup
  local p st
  for p in "$@"; do
    st="$(starttime "$p")"
    [ -n "$st" ] && TRACKED+=("$p:$st")
  done
  return 0
}

kill_tracked() {
  local e
  for e in ${TRACKED[@]+"${TRACKED[@]}"}; do
    if same "$e" && [ "$(state "${e%%:*}")" != Z ]; then
      kill -KILL "${e%%:*}" 2>/dev/null || true
    fi
  done
}

cleanup() {
  local rc=$?
  set +e
  kill_tracked
  if [ -n "$PROG_PID" ]; then
    kill -KILL "$PROG_PID" 2>/dev/null
    wait "$PROG_PID" 2>/dev/null
  fi
  # Give init a moment to reap the orphans before their files go away.
  for _ in $(seq 100); do
    local left=0 e
    for e in ${TRACKED[@]+"${TRACKED[@]}"}; do same "$e" && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.05
  done
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
log "building ferry (release) and bench/tree_shared.c"
cargo build --release --quiet
[ -x "$FERRY" ] || fail "$FERRY not built"
mkdir -p target/c
cc -O2 -Wall -o target/c/tree_shared bench/tree_shared.c

# --- tmpfs for the images -----------------------------------------------------
if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] &&
   [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -ge $((4 * 1024 * 1024)) ]; then
  IMG_ROOT="$(mktemp -d /dev/shm/ferry-bench-trees.XXXXXX)"
  TMPFS_DESC="/dev/shm (tmpfs)"
else
  MOUNTED="$WORK/tmpfs"
  mkdir -p "$MOUNTED"
  mount -t tmpfs -o size=4g,mode=0700 ferry-bench-trees "$MOUNTED"
  IMG_ROOT="$MOUNTED/images"
  mkdir -p "$IMG_ROOT"
  TMPFS_DESC="a private tmpfs mounted for the run"
fi
log "images on $TMPFS_DESC"

# --- helpers ------------------------------------------------------------------
free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

now_ns() { date +%s%N; }
ms_since() { awk -v a="$1" -v b="$(now_ns)" 'BEGIN {printf "%.1f", (b-a)/1e6}'; }

median() { grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "n/a"; exit} if (NR%2) printf "%.1f\n", a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}' || true; }

human() { # bytes -> human readable
  awk -v b="$1" 'BEGIN { split("B KiB MiB GiB", u); i=1; while (b>=1024 && i<4) {b/=1024; i++} printf (i==1 ? "%d %s" : "%.1f %s"), b, u[i] }'
}

tree_pids() { # root -> root and all descendants, one per line
  local p c
  [ -e "/proc/$1" ] || return 0
  echo "$1"
  # shellcheck disable=SC2013  # words, not lines: the file is space-separated
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    tree_pids "$c"
  done
}

tree_mem() { # pids... -> "RSS_KB PSS_KB" summed over them
  local p
  for p in "$@"; do cat "/proc/$p/smaps_rollup" 2>/dev/null || true; done |
    awk '$1 == "Rss:" {r += $2} $1 == "Pss:" {p += $2} END {printf "%d %d\n", r, p}'
}

wait_gone() { # pid:start... -> waits (bounded) until none exists any more
  local deadline=$(( $(date +%s) + GONE_TIMEOUT )) e left
  while :; do
    left=""
    for e in "$@"; do same "$e" && left="$left ${e%%:*}($(state "${e%%:*}"))"; done
    [ -z "$left" ] && return 0
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "still present after ${GONE_TIMEOUT} s:$left"
      return 1
    fi
    sleep 0.02
  done
}

http_ok() { # port -> true if GET / answers 200 with the index file
  "$PY" - "$1" <<'PYEOF'
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    s.settimeout(5)
    s.sendall(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    sys.exit(0 if data.startswith(b"HTTP/1.1 200") and data.endswith(b"ferry-bench-trees\n") else 1)
except OSError:
    sys.exit(1)
PYEOF
}

# Connections on the port that are neither listening nor TIME_WAIT/CLOSE.
open_conns() {
  local hex
  hex="$(printf '%04X' "$1")"
  awk -v p=":$hex" 'NR > 1 && ($2 ~ p"$" || $3 ~ p"$") && $4 != "0A" && $4 != "06" && $4 != "07"' /proc/net/tcp | wc -l
}

# start_tree NAME PORT: starts the tree as our child (new session), waits
# until it is complete. Sets PROG_PID and NPROCS.
start_tree() {
  local name=$1 port=$2 logf="$WORK/$1.log" want
  case "$name" in
    nginx)
      local d="$WORK/nginx"
      rm -rf "$d"; mkdir -p "$d/www"; chmod 755 "$d" "$d/www"
      echo ferry-bench-trees >"$d/www/index.html"
      cat >"$d/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes $NGINX_WORKERS;
user nobody nogroup;
pid $d/nginx.pid;
error_log $d/error.log notice;
events { worker_connections 64; }
http {
  access_log $d/access.log;
  client_body_temp_path $d/client_body;
  proxy_temp_path $d/proxy;
  fastcgi_temp_path $d/fastcgi;
  uwsgi_temp_path $d/uwsgi;
  scgi_temp_path $d/scgi;
  server { listen 127.0.0.1:$port; root $d/www; }
}
EOF
      scripts/isolated.sh "$NGINX" -p "$d/" -c "$d/nginx.conf" -e "$d/error.log" >"$logf" 2>&1 </dev/null &
      PROG_PID=$!
      track "$PROG_PID"
      want=$((NGINX_WORKERS + 1))
      for _ in $(seq 200); do
        kill -0 "$PROG_PID" 2>/dev/null || break
        if [ "$(tree_pids "$PROG_PID" | wc -l)" -eq "$want" ] && http_ok "$port"; then
          break
        fi
        sleep 0.05
      done
      http_ok "$port" || { cat "$d/error.log" "$logf" >&2 2>/dev/null; return 1; }
      # No connection may be left open for the checkpoint.
      for _ in $(seq 200); do
        [ "$(open_conns "$port")" -eq 0 ] && break
        sleep 0.02
      done ;;
    shared)
      scripts/isolated.sh target/c/tree_shared "$MIB" "$WORKERS" 600 >"$logf" 2>&1 </dev/null &
      PROG_PID=$!
      track "$PROG_PID"
      want=$((WORKERS + 1))
      for _ in $(seq 600); do
        grep -q READY "$logf" 2>/dev/null && break
        kill -0 "$PROG_PID" 2>/dev/null || break
        sleep 0.05
      done
      grep -q READY "$logf" 2>/dev/null || { cat "$logf" >&2; return 1; } ;;
  esac
  # shellcheck disable=SC2046
  track $(tree_pids "$PROG_PID")
  NPROCS="$(tree_pids "$PROG_PID" | wc -l)"
  [ "$NPROCS" -eq "$want" ] || { echo "bench/trees.sh: $name has $NPROCS processes, want $want" >&2; return 1; }
}

# bench_tree NAME LABEL: RUNS measured runs plus one warm-up; appends a row.
ROWS=()
bench_tree() {
  local name=$1 label=$2 run port t0 rc images size root pids_before pids_after e
  local cps=() rss=() cpe=() rse=() sizes=() rb=() pb=() ra=() pa=()
  for run in $(seq 0 "$RUNS"); do   # run 0 is a warm-up, not counted
    port=$(free_port)
    start_tree "$name" "$port" || fail "$name did not start (log above)"
    root=$PROG_PID
    pids_before="$(tree_pids "$root" | sort -n | tr '\n' ' ')"
    # shellcheck disable=SC2086
    read -r rss_b pss_b < <(tree_mem $pids_before)
    local ids=()
    for e in $pids_before; do ids+=("$e:$(starttime "$e")"); done

    images="$IMG_ROOT/$name-$run"
    mkdir -p "$images"
    # The block's stderr goes to a file: bash reports the killed background
    # job there. Real errors go to fd 4, the script's stderr.
    {
    t0=$(now_ns)
    set +e
    timeout -k 5 "$FERRY_TIMEOUT" "$FERRY" checkpoint --pid "$root" --images "$images" >"$WORK/ckpt.out" 2>&1
    rc=$?
    set -e
    local cp_ms; cp_ms=$(ms_since "$t0")
    if [ "$rc" -ne 0 ]; then
      echo "bench/trees.sh: ferry checkpoint of the $name tree ($NPROCS processes, root $root) failed (exit $rc):" >&4
      sed 's/^/  /' "$WORK/ckpt.out" >&4
      [ "$rc" -eq 124 ] && echo "  (timed out after ${FERRY_TIMEOUT} s)" >&4
      exit 1
    fi
    # Reap the checkpointed root (ferry killed it), bounded.
    local st=""
    for _ in $(seq $((GONE_TIMEOUT * 20))); do
      st="$(state "$root")"
      { [ "$st" = Z ] || [ -z "$st" ]; } && break
      sleep 0.05
    done
    if [ "$st" != Z ] && [ -n "$st" ]; then
      echo "bench/trees.sh: ferry checkpoint succeeded but the $name root $root still runs" >&4
      exit 1
    fi
    set +e; wait "$root"; set -e
    PROG_PID=""
    } 2>>"$WORK/job-notices.log"
    if ! msg=$(wait_gone "${ids[@]}"); then
      fail "after ferry checkpoint of $name, processes of the tree are left: $msg"
    fi
    size=$(du -sb "$images" | cut -f1)

    rm -f "$WORK/restored.pid"
    t0=$(now_ns)
    set +e
    timeout -k 5 "$FERRY_TIMEOUT" "$FERRY" restore --images "$images" --detach --pidfile "$WORK/restored.pid" \
      >"$WORK/restore.out" 2>&1 </dev/null
    rc=$?
    set -e
    local rs_ms; rs_ms=$(ms_since "$t0")
    # Whatever came back is ours to clean up.
    # shellcheck disable=SC2046
    [ -e "/proc/$root" ] && track $(tree_pids "$root")
    if [ "$rc" -ne 0 ]; then
      echo "bench/trees.sh: ferry restore --detach of the $name tree failed (exit $rc):" >&2
      sed 's/^/  /' "$WORK/restore.out" >&2
      [ "$rc" -eq 124 ] && echo "  (timed out after ${FERRY_TIMEOUT} s)" >&2
      exit 1
    fi
    local rpid; rpid="$(tr -dc '0-9' <"$WORK/restored.pid" 2>/dev/null || true)"
    [ "$rpid" = "$root" ] || fail "restored root PID '$rpid' is not the original $root"
    pids_after="$(tree_pids "$root" | sort -n | tr '\n' ' ')"
    [ "$pids_after" = "$pids_before" ] ||
      fail "restored $name tree has PIDs [$pids_after], the original had [$pids_before]"
    # shellcheck disable=SC2086
    read -r rss_a pss_a < <(tree_mem $pids_after)
    if [ "$name" = nginx ]; then
      http_ok "$port" || fail "restored nginx does not serve on port $port"
    fi
    ids=()
    for e in $pids_after; do ids+=("$e:$(starttime "$e")"); TRACKED+=("$e:$(starttime "$e")"); done
    # Kill the restored tree, root first (so it forks nothing new).
    kill -KILL "$root" 2>/dev/null || true
    for e in "${ids[@]}"; do if same "$e"; then kill -KILL "${e%%:*}" 2>/dev/null || true; fi; done
    if ! msg=$(wait_gone "${ids[@]}"); then
      fail "the restored $name tree did not go away after SIGKILL: $msg"
    fi
    rm -rf "$images"

    if [ "$run" -gt 0 ]; then
      cps+=("$cp_ms"); rss+=("$rs_ms"); sizes+=("$size")
      cpe+=("$(sed -n 's/.* in \([0-9.]*\) ms.*/\1/p' "$WORK/ckpt.out" | tail -1)")
      rse+=("$(sed -n 's/.* in \([0-9.]*\) ms.*/\1/p' "$WORK/restore.out" | tail -1)")
      rb+=("$rss_b"); pb+=("$pss_b"); ra+=("$rss_a"); pa+=("$pss_a")
      log "$name run $run/$RUNS ($NPROCS processes): checkpoint $cp_ms ms, restore $rs_ms ms, image $(human "$size"), RSS $((rss_b / 1024)) -> $((rss_a / 1024)) MiB, PSS $((pss_b / 1024)) -> $((pss_a / 1024)) MiB"
    else
      log "$name warm-up run done (checkpoint $cp_ms ms, restore $rs_ms ms)"
    fi
  done
  mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k/1024}'; }
  local sz; sz=$(printf '%s\n' "${sizes[@]}" | median); sz=${sz%.*}
  ROWS+=("| $label | $NPROCS | $(printf '%s\n' "${cps[@]}" | median) | $(printf '%s\n' "${rss[@]}" | median) | $(printf '%s\n' "${cpe[@]}" | median) | $(printf '%s\n' "${rse[@]}" | median) | $(human "$sz") | $(mib "$(printf '%s\n' "${rb[@]}" | median)") / $(mib "$(printf '%s\n' "${pb[@]}" | median)") | $(mib "$(printf '%s\n' "${ra[@]}" | median)") / $(mib "$(printf '%s\n' "${pa[@]}" | median)") |")
}

T_START=$(date +%s)
for p in $ONLY; do
  case "$p" in
    nginx)
      if [ -x "$NGINX" ]; then
        bench_tree nginx "nginx $("$NGINX" -v 2>&1 | sed -n 's|.*nginx/||p'), master + $NGINX_WORKERS workers"
      else
        log "$NGINX not installed: skipping (scripts/install-deps.sh)"
      fi ;;
    shared) bench_tree shared "tree_shared: $MIB MiB written, shared by 1 + $WORKERS processes (bench/tree_shared.c)" ;;
    *) echo "unknown tree benchmark '$p'" >&2; exit 2 ;;
  esac
done
T_END=$(date +%s)

REV="$(git rev-parse --short HEAD 2>/dev/null || echo uncommitted)"
CPU="$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
{
  echo "# ferry process-tree benchmarks (latest run)"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); ferry $REV; kernel $(uname -r); $(nproc) CPUs ($CPU); $(free -g | awk '/^Mem:/ {print $2}') GiB RAM"
  echo "- images on $TMPFS_DESC; median of $RUNS runs after one warm-up run; \`bench/trees.sh\`"
  echo "- checkpoint = wall time of \`ferry checkpoint --pid ROOT --images DIR\` (whole tree: write + verify + kill)"
  echo "- restore = wall time of \`ferry restore --images DIR --detach --pidfile F\` until it returns (same PIDs checked after)"
  echo "- engine = ferry's own timing of the operation (printed by the command), without process start-up"
  echo "- image size = \`du -sb DIR\`"
  echo "- RSS / PSS = sums over the tree's processes of Rss and Pss in /proc/PID/smaps_rollup, in MiB, before the checkpoint and after the restore (PSS counts a page shared by n processes as 1/n in each)"
  echo
  echo "| tree | processes | checkpoint (ms) | restore (ms) | checkpoint, engine (ms) | restore, engine (ms) | image size | RSS / PSS before (MiB) | RSS / PSS after restore (MiB) |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  printf '%s\n' ${ROWS[@]+"${ROWS[@]}"}
  echo
  echo "Total benchmark time: $((T_END - T_START)) s."
} >"$WORK/table.md"
mkdir -p "$(dirname "$OUT_MD")"
cp "$WORK/table.md" "$OUT_MD"
cat "$WORK/table.md"
log "written to ${OUT_MD#"$REPO"/}"
