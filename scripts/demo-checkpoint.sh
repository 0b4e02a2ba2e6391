#!/usr/bin/env bash
# ferry checkpoint/restore demo: checkpoint a live TCP server, kill it, restore it, and show that
# its in-memory state (counter, key/value table, heartbeat thread) survived.
#
# Usage: scripts/demo-checkpoint.sh   (normally via `make demo-checkpoint`; needs root)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

FERRY="${FERRY_BIN:-$REPO/target/release/ferry}"  # FERRY_BIN: override for testing the script
SERVER_BIN="$REPO/target/c/counter_server"

bold() { if [ -t 1 ]; then printf '\033[1m%s\033[0m\n' "$*"; else printf '%s\n' "$*"; fi; }
step() { echo; bold "==> $*"; }
say() { printf '    %s\n' "$*"; }
exec 4>&2 # the script's stderr, also inside blocks whose stderr is redirected
fail() { printf '\nDEMO FAILED: %s\n' "$*" >&4; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
  fail "ferry needs root (ptrace, same-PID restore); run as root"
fi

TMP="$(mktemp -d /tmp/ferry-demo.XXXXXX)"
IMAGES="$TMP/images"
LOG="$TMP/server.log"
PIDFILE="$TMP/pid"
SERVER_PID=""
RESTORED_PID=""
RESTORE_PID=""

cleanup() {
  local rc=$?
  set +e
  # Only ever signal the PIDs this script started (or restored).
  for p in "$RESTORED_PID" "$SERVER_PID"; do
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
      kill -KILL "$p" 2>/dev/null
    fi
  done
  if [ -n "$RESTORE_PID" ] && kill -0 "$RESTORE_PID" 2>/dev/null; then
    # ferry restore exits once its child is gone; give it a moment.
    for _ in $(seq 50); do kill -0 "$RESTORE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$RESTORE_PID" 2>/dev/null
  fi
  [ -n "$SERVER_PID" ] && wait "$SERVER_PID" 2>/dev/null
  [ -n "$RESTORE_PID" ] && wait "$RESTORE_PID" 2>/dev/null
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# send_cmd LINE: open a TCP connection, send one command, print the reply line.
send_cmd() {
  local fd reply=""
  exec {fd}<>"/dev/tcp/127.0.0.1/$PORT" || return 1
  printf '%s\n' "$1" >&"$fd"
  IFS= read -r -t 5 reply <&"$fd" || true
  exec {fd}>&-
  printf '%s' "${reply%$'\r'}"
}

# ---------------------------------------------------------------------------
step "Building ferry (cargo build --release)"
cargo build --release --quiet
[ -x "$FERRY" ] || fail "$FERRY was not built"
say "built $FERRY"

step "Compiling the example server (examples/counter_server.c)"
mkdir -p "$(dirname "$SERVER_BIN")" "$IMAGES"
cc -O2 -g -Wall -pthread -o "$SERVER_BIN" examples/counter_server.c
say "built $SERVER_BIN"

step "Starting the server (port 0 = any free port)"
# setsid: the server gets its own session and process group, so its image does
# not refer to this shell's. Without job control the background child is not a
# group leader, so setsid(1) runs it in place and \$! is the server's PID.
"$REPO/scripts/isolated.sh" "$SERVER_BIN" 0 >"$LOG" 2>&1 </dev/null &
SERVER_PID=$!
for _ in $(seq 100); do
  grep -q 'listening on' "$LOG" 2>/dev/null && break
  kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited early: $(cat "$LOG")"
  sleep 0.1
done
grep -q 'listening on' "$LOG" || fail "server did not start within 10 s"
PORT="$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG")"
LOGGED_PID="$(sed -n 's/.* pid \([0-9]*\).*/\1/p' "$LOG")"
[ "$LOGGED_PID" = "$SERVER_PID" ] || fail "server PID $LOGGED_PID is not the child PID $SERVER_PID"
say "counter_server runs as PID $SERVER_PID on 127.0.0.1:$PORT"
say "threads: $(ls /proc/"$SERVER_PID"/task | wc -l) (main epoll loop + heartbeat thread)"

step "Giving it some state over TCP"
for _ in 1 2 3 4 5 6 7; do
  say "INCR                      -> $(send_cmd INCR)"
done
say "SET greeting hello-ferry  -> $(send_cmd 'SET greeting hello-ferry')"
say "SET answer 42             -> $(send_cmd 'SET answer 42')"
BEFORE_COUNTER="$(send_cmd GET)"
BEFORE_GREETING="$(send_cmd 'GET greeting')"
BEFORE_ANSWER="$(send_cmd 'GET answer')"
BEFORE_HEARTBEAT="$(send_cmd HEARTBEAT)"
say "state before: counter=$BEFORE_COUNTER greeting=$BEFORE_GREETING answer=$BEFORE_ANSWER heartbeat=$BEFORE_HEARTBEAT"
[ "$BEFORE_COUNTER" = 7 ] || fail "unexpected counter value '$BEFORE_COUNTER' before checkpoint"

step "Opening a client connection that stays open across the checkpoint"
exec {KEEP}<>"/dev/tcp/127.0.0.1/$PORT" || fail "cannot connect to the server"
printf 'INCR\n' >&"$KEEP"
IFS= read -r -t 5 KEEP_BEFORE <&"$KEEP" || fail "no reply on the kept connection"
KEEP_BEFORE="${KEEP_BEFORE%$'\r'}"
say "INCR on the kept connection -> $KEEP_BEFORE (the connection is now established; ferry will freeze it)"
BEFORE_COUNTER="$(send_cmd GET)"

step "Checkpointing PID $SERVER_PID into $IMAGES (a network lock holds the open connection until restore rebuilds it)"
# The block's stderr goes to a file: bash reports the killed background job
# ("Killed ...") there instead of in the narrative; ferry's own errors and
# fail() still reach the terminal through fd 4.
{
T0=$(date +%s%N)
"$FERRY" checkpoint --pid "$SERVER_PID" --images "$IMAGES" 2>&4 || fail "ferry checkpoint failed"
T1=$(date +%s%N)
say "checkpoint took $(( (T1 - T0) / 1000000 )) ms; image size $(du -sh "$IMAGES" 2>/dev/null | cut -f1)"
# ferry checkpoint kills the process once the image is verified; it stays a
# zombie until we (its parent) reap it, and only then is its PID free again.
for _ in $(seq 100); do
  state="$(awk '{print $3}' /proc/"$SERVER_PID"/stat 2>/dev/null || echo gone)"
  [ "$state" = Z ] || [ "$state" = gone ] && break
  sleep 0.1
done
[ "$state" = Z ] || [ "$state" = gone ] || fail "ferry checkpoint returned but PID $SERVER_PID is still running (state $state)"
set +e
wait "$SERVER_PID"
STATUS=$?
set -e
SERVER_PID=""
} 2>>"$TMP/job-notices.log"
say "the original server is gone (reaped, wait status $STATUS); its PID is free again"
if send_cmd PING >/dev/null 2>&1; then
  fail "something still answers on port $PORT after the checkpoint killed the server"
fi
say "nothing listens on port $PORT any more"

step "Restoring from $IMAGES"
"$FERRY" restore --images "$IMAGES" --pidfile "$PIDFILE" &
RESTORE_PID=$!
for _ in $(seq 300); do
  [ -s "$PIDFILE" ] && break
  kill -0 "$RESTORE_PID" 2>/dev/null || { wait "$RESTORE_PID" || true; RESTORE_PID=""; fail "ferry restore exited before writing the pidfile"; }
  sleep 0.1
done
[ -s "$PIDFILE" ] || fail "no pidfile after 30 s"
RESTORED_PID="$(tr -dc '0-9' <"$PIDFILE")"
T2=$(date +%s%N)
say "restored process runs as PID $RESTORED_PID ($(cat /proc/"$RESTORED_PID"/comm 2>/dev/null || echo '?')), parent is ferry restore (PID $RESTORE_PID)"
say "restore took about $(( (T2 - T1) / 1000000 )) ms (until the pidfile appeared, including reaping)"
[ "$RESTORED_PID" = "$LOGGED_PID" ] || say "NOTE: restored PID differs from the original ($LOGGED_PID)"

step "Querying the restored server"
sleep 0.5 # let the heartbeat thread tick a few times
AFTER_COUNTER="$(send_cmd GET || true)"
AFTER_GREETING="$(send_cmd 'GET greeting' || true)"
AFTER_ANSWER="$(send_cmd 'GET answer' || true)"
AFTER_HEARTBEAT="$(send_cmd HEARTBEAT || true)"
AFTER_INCR="$(send_cmd INCR || true)"
# The connection opened before the checkpoint, never closed: same socket.
KEEP_AFTER=""
printf 'INCR\n' >&"$KEEP" 2>/dev/null && IFS= read -r -t 5 KEEP_AFTER <&"$KEEP"
KEEP_AFTER="${KEEP_AFTER%$'\r'}"
exec {KEEP}>&-
printf '\n    %-10s %-14s %-14s\n' "" "before" "after"
printf '    %-10s %-14s %-14s\n' counter "$BEFORE_COUNTER" "$AFTER_COUNTER"
printf '    %-10s %-14s %-14s\n' greeting "$BEFORE_GREETING" "$AFTER_GREETING"
printf '    %-10s %-14s %-14s\n' answer "$BEFORE_ANSWER" "$AFTER_ANSWER"
printf '    %-10s %-14s %-14s\n' heartbeat "$BEFORE_HEARTBEAT" "$AFTER_HEARTBEAT"
say "INCR after restore -> $AFTER_INCR"
say "INCR on the connection kept open across checkpoint and restore -> ${KEEP_AFTER:-(no reply)}"

OK=1
[ "$AFTER_COUNTER" = "$BEFORE_COUNTER" ] || { say "MISMATCH: counter"; OK=0; }
[ "$AFTER_GREETING" = "$BEFORE_GREETING" ] || { say "MISMATCH: greeting"; OK=0; }
[ "$AFTER_ANSWER" = "$BEFORE_ANSWER" ] || { say "MISMATCH: answer"; OK=0; }
[ "$AFTER_INCR" = "$((BEFORE_COUNTER + 1))" ] || { say "MISMATCH: INCR after restore"; OK=0; }
[ "$KEEP_AFTER" = "$((BEFORE_COUNTER + 2))" ] || { say "MISMATCH: the kept TCP connection did not survive"; OK=0; }
if [[ "$AFTER_HEARTBEAT" =~ ^[0-9]+$ ]] && [ "$AFTER_HEARTBEAT" -gt "$BEFORE_HEARTBEAT" ]; then
  say "the heartbeat thread kept ticking after restore"
else
  say "MISMATCH: heartbeat thread is not ticking"
  OK=0
fi

step "ferry inspect $IMAGES"
"$FERRY" inspect "$IMAGES" | sed 's/^/    /' || say "(ferry inspect failed)"

step "Stopping the restored server (kill $RESTORED_PID) and waiting for ferry restore"
kill -TERM "$RESTORED_PID" 2>/dev/null || true
set +e
wait "$RESTORE_PID" 2>/dev/null
STATUS=$?
set -e
RESTORE_PID=""
RESTORED_PID=""
say "ferry restore exited with $STATUS (143 = 128 + SIGTERM, the server's fate)"

echo
if [ "$OK" = 1 ]; then
  bold "DEMO OK: the server's in-memory state and its open client connection survived checkpoint, kill and restore."
else
  fail "the server's state did not survive (see the table above)"
fi
