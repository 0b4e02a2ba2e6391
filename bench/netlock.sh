#!/usr/bin/env bash
# Network lock cost: time of each phase (prepare, engage, disengage, thaw)
# of each method (ebpf, nftables, iptables) at N = 0, 100, 500, 1000, 2000,
# 5000, 10000 synthetic 4-tuples
# (documentation ranges, in a scratch network namespace the bench binary
# creates and deletes). Median of BENCH_NETLOCK_REPS runs (default 5).
# Prints a markdown table and writes it to docs/benchmarks-netlock-latest.md.
#
# Environment: BENCH_NETLOCK_REPS=5, BENCH_NETLOCK_SIZES=0,100,...,10000,
# BENCH_NETLOCK_METHODS=ebpf,nftables,iptables. Needs root.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPS="${BENCH_NETLOCK_REPS:-5}"
SIZES="${BENCH_NETLOCK_SIZES:-0,100,500,1000,2000,5000,10000}"
METHODS="${BENCH_NETLOCK_METHODS:-ebpf,nftables,iptables}"
BIN="$REPO/target/release/ferry-netlock-bench"
OUT_MD="$REPO/docs/benchmarks-netlock-latest.md"
[ "$(id -u)" = 0 ] || { echo "bench/netlock.sh: needs root" >&2; exit 1; }
(cd "$REPO" && cargo build --release -q -p ferry-netlock --bin ferry-netlock-bench)
TABLE="$("$BIN" --reps "$REPS" --sizes "$SIZES" --methods "$METHODS")"
{
  echo "# Network lock: time of each phase (latest run)"
  echo
  echo "Written by \`bench/netlock.sh\` on $(date -u +%Y-%m-%d), kernel $(uname -r), $(nproc) CPUs,"
  echo "load average $(cut -d' ' -f1 /proc/loadavg) at the end of the run."
  echo "Median of $REPS runs per cell (each column on its own), in a scratch network namespace with only \`lo\`."
  echo
  echo "- prepare: before the pause (eBPF: load, create maps, attach 2 tcx links per"
  echo "  interface, pin; more interfaces add the per-link cost). nftables/iptables: the record only."
  echo "- engage: start of the pause (eBPF: tuples written into the mmapped table, one"
  echo "  pwrite of the phase file, one switch update; nftables/iptables: their one transaction)."
  echo "- disengage: end of the pause (eBPF: one switch update + one pwrite;"
  echo "  nftables/iptables: delete their objects)."
  echo "- thaw: after the pause (eBPF: detach and unpin; all: remove the record)."
  echo "- engage + disengage: what the service's pause pays."
  echo
  echo "$TABLE"
} > "$OUT_MD"
echo "$TABLE"
echo "written to ${OUT_MD#"$REPO"/}"
