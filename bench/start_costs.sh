#!/usr/bin/env bash
# start_costs.sh [FERRY]: what starting a program costs on this machine,
# next to `ferry --version`: one CPUID instruction (it traps to the
# hypervisor in a VM; glibc runs it at every start), the exec of an empty
# C program built dynamic and static, and ferry's own start. Needs gcc
# and perf. Prints one line per figure.
set -euo pipefail
FERRY=${1:-target/release/ferry}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/cpuid.c" <<'C'
#include <cpuid.h>
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec a, b;
    unsigned e1, e2, e3, e4, acc = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < 1000; i++) { __cpuid_count(4, i & 3, e1, e2, e3, e4); acc ^= e1; }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("cpuid                %.2f us per instruction (%u)\n",
           ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1000 / 1000.0, acc & 0);
    return 0;
}
C
echo 'int main(void) { return 0; }' > "$work/empty.c"
gcc -O2 -o "$work/cpuid" "$work/cpuid.c"
gcc -O2 -o "$work/dynamic" "$work/empty.c"
gcc -O2 -static -o "$work/static" "$work/empty.c"
"$work/cpuid"
elapsed() {  # the mean wall time of 200 runs, ms
    perf stat -r 200 "$@" 2>&1 >/dev/null | awk '/seconds time elapsed/ {printf "%.2f ms\n", $1 * 1000}'
}
echo "exec, dynamic C      $(elapsed "$work/dynamic")"
echo "exec, static C       $(elapsed "$work/static")"
echo "ferry --version      $(elapsed "$FERRY" --version)"
