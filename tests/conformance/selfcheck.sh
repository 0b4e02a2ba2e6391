#!/usr/bin/env bash
# selfcheck.sh - validate the conformance programs WITHOUT ferry.
#
# Compiles every tests/conformance/*.c (or only the names given as arguments,
# with or without .c), then for each program: runs it in a fresh directory
# with stdin=/dev/null and stdout+stderr appended to a log, waits for READY,
# sends SIGUSR2 right away (no checkpoint), waits for it to exit and reports
# PASS/FAIL. Exit status is 0 only if every program passed.
#
#   tests/conformance/selfcheck.sh            # all programs
#   tests/conformance/selfcheck.sh -k         # keep the temp dir
#   tests/conformance/selfcheck.sh fd_epoll thread_accept
#
# SELFCHECK_HOOK="cmd args" runs `cmd args PID` between READY and SIGUSR2
# (e.g. a tool that freezes and thaws the process with ptrace), so the
# programs can be exercised against a stop without a full checkpoint.
set -u

here="$(cd "$(dirname "$0")" && pwd)"
keep=0
if [ "${1:-}" = "-k" ]; then keep=1; shift; fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ferry-selfcheck.XXXXXX")"
cleanup() { if [ "$keep" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi; }
trap cleanup EXIT

if [ $# -gt 0 ]; then
	progs=()
	for a in "$@"; do progs+=("$here/${a%.c}.c"); done
else
	progs=("$here"/*.c)
fi

pass=0
fail=0
failed=()

for src in "${progs[@]}"; do
	name="$(basename "$src" .c)"
	bin="$tmp/bin/$name"
	work="$tmp/run/$name"
	log="$tmp/run/$name.log"
	mkdir -p "$tmp/bin" "$work"
	if ! gcc -O1 -g -pthread -Wall -I"$here" -o "$bin" "$src" 2>"$tmp/run/$name.cc"; then
		echo "FAIL $name (compile)"
		sed 's/^/    /' "$tmp/run/$name.cc"
		fail=$((fail + 1)); failed+=("$name"); continue
	fi
	if [ -s "$tmp/run/$name.cc" ]; then
		echo "WARN $name: compiler warnings"
		sed 's/^/    /' "$tmp/run/$name.cc"
	fi
	start=$(date +%s%N)
	(cd "$work" && FERRY_TEST_DIR="$work" exec "$bin" </dev/null >>"$log" 2>&1) &
	pid=$!
	ready=0
	for _ in $(seq 1 1000); do
		if grep -q '^READY$' "$log" 2>/dev/null; then ready=1; break; fi
		if ! kill -0 "$pid" 2>/dev/null; then break; fi
		sleep 0.01
	done
	if [ "$ready" = 1 ] && [ -n "${SELFCHECK_HOOK:-}" ]; then
		# shellcheck disable=SC2086
		$SELFCHECK_HOOK "$pid" >>"$tmp/run/$name.hook" 2>&1 || echo "    hook failed: $(tail -1 "$tmp/run/$name.hook")"
	fi
	if [ "$ready" = 1 ]; then kill -USR2 "$pid"; fi
	rc=""
	for _ in $(seq 1 3000); do
		if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; rc=$?; break; fi
		sleep 0.01
	done
	if [ -z "$rc" ]; then
		kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rc="timeout"
	fi
	ms=$(( ($(date +%s%N) - start) / 1000000 ))
	secs="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
	if [ "$ready" = 1 ] && [ "$rc" = 0 ] && grep -q '^PASS$' "$log" && ! grep -q 'FAIL' "$log"; then
		printf 'PASS %-28s %5ss\n' "$name" "$secs"
		pass=$((pass + 1))
	else
		printf 'FAIL %-28s %5ss (ready=%s rc=%s)\n' "$name" "$secs" "$ready" "$rc"
		sed 's/^/    /' "$log"
		fail=$((fail + 1)); failed+=("$name")
	fi
done

echo "$pass passed, $fail failed"
if [ "$fail" -gt 0 ]; then
	echo "failed: ${failed[*]}"
	exit 1
fi
exit 0
