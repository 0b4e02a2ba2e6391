#!/usr/bin/env bash
# Network lock cost: freeze and thaw time of each method (ebpf, nftables,
# iptables) at N = 0, 100, 500, 1000, 2000, 5000, 10000 synthetic 4-tuples
# (documentation ranges, in a scratch network namespace the bench binary
# creates and deletes). Median of BENCH_NETLOCK_REPS runs (default 5).
# Prints a markdown table and writes it to docs/benchmarks-netlock-latest.md.
#
# Environment: BENCH_NETLOCK_REPS=5, BENCH_NETLOCK_SIZES=0,100,...,10000,
# BENCH_NETLOCK_METHODS=ebpf,nftables,iptables. Needs root.
set -euo pipefail
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
  echo "# Network lock: freeze and thaw time (latest run)"
  echo
  echo "Written by \`bench/netlock.sh\` on $(date -u +%Y-%m-%d), kernel $(uname -r), $(nproc) CPUs."
  echo "Median of $REPS runs per cell, in a scratch network namespace with only \`lo\`"
  echo "(the eBPF method attaches 2 tcx links per interface: more interfaces add about"
  echo "the per-link cost to both columns). Freeze includes creating the record;"
  echo "thaw removes everything."
  echo
  echo "$TABLE"
} > "$OUT_MD"
echo "$TABLE"
echo "written to ${OUT_MD#"$REPO"/}"
