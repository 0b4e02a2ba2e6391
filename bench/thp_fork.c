/* bench/thp_fork.c: what a fork and an unmap of 1 GiB of private
 * anonymous memory cost in 4 KiB pages and in transparent huge pages made
 * with MADV_COLLAPSE (without MADV_HUGEPAGE on the mapping), and what
 * making them costs: the figures behind ferry replace's huge placed
 * memory (docs/replacement.md, docs/kernel-notes.md).
 *
 *   gcc -O2 -o /tmp/thp_fork bench/thp_fork.c
 *   /tmp/thp_fork small     # fill, fork, unmap in 4 KiB pages
 *   /tmp/thp_fork after     # fill, MADV_COLLAPSE the filled memory
 *   /tmp/thp_fork before    # one byte per 2 MiB, MADV_COLLAPSE, then fill
 *                           # (what ferry does before pre-copy round 0)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void collapse(char *p, size_t len, const char *what) {
    double t = now_ms();
    int r = madvise(p, len, MADV_COLLAPSE);
    printf("%s: MADV_COLLAPSE %s, %.1f ms\n", what, r == 0 ? "ok" : "failed", now_ms() - t);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "small";
    size_t len = 1UL << 30;
    char *p = mmap(NULL, len + (2UL << 20), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    p = (char *)(((unsigned long)p + (2UL << 20) - 1) & ~((2UL << 20) - 1));
    if (!strcmp(mode, "before")) {
        for (size_t o = 0; o < len; o += 2UL << 20)
            p[o] = 0;
        collapse(p, len, "before the fill");
    }
    double t = now_ms();
    memset(p, 1, len);
    printf("fill: %.1f ms\n", now_ms() - t);
    if (!strcmp(mode, "after"))
        collapse(p, len, "after the fill");
    char line[256];
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "AnonHugePages"))
            fputs(line, stdout);
    if (f)
        fclose(f);
    t = now_ms();
    pid_t k = fork();
    if (k == 0)
        _exit(0);
    double forked = now_ms() - t;
    waitpid(k, NULL, 0);
    printf("fork: %.2f ms (with the child's exit and reap: %.2f ms)\n", forked, now_ms() - t);
    t = now_ms();
    munmap(p, len);
    printf("unmap: %.1f ms\n", now_ms() - t);
    return 0;
}
