/* Mappings with many VmFlags for tests/vma_flags.rs: dd, wf, lo, hg, nh,
 * dc, sr, a shared one, a PROT_NONE one and a plain one "P". Prints READY
 * and then, per line on stdin, changes P's flags on the whole mapping (so
 * it is not split) and answers "ok":
 *   dd      madvise(MADV_DONTDUMP)   a bit other mappings have too
 *   random  madvise(MADV_RANDOM)     a bit no other mapping has
 * With the argument "many" it first makes 3,000 more mappings.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define PG 4096
#define N 16

static char *anon(int prot, int flags) {
    char *p = mmap(0, N * PG, prot, flags | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); _exit(1); }
    if (prot & PROT_WRITE) memset(p, 1, N * PG);
    return p;
}

int main(int argc, char **argv) {
    /* "many": 3,000 more mappings (alternating protections keep them
     * apart), more than one read of the BPF iterator holds. */
    if (argc > 1 && strcmp(argv[1], "many") == 0)
        for (int i = 0; i < 3000; i++) {
            char *m = anon(PROT_READ | PROT_WRITE, MAP_PRIVATE);
            if (mprotect(m, PG, PROT_READ)) { perror("mprotect"); return 1; }
        }
    struct { int advice; } with[] = {{MADV_DONTDUMP}, {MADV_WIPEONFORK}, {MADV_HUGEPAGE}, {MADV_NOHUGEPAGE}, {MADV_DONTFORK}, {MADV_SEQUENTIAL}};
    for (unsigned i = 0; i < sizeof with / sizeof with[0]; i++) {
        char *m = anon(PROT_READ | PROT_WRITE, MAP_PRIVATE);
        if (madvise(m, N * PG, with[i].advice)) { perror("madvise"); return 1; }
    }
    char *locked = anon(PROT_READ | PROT_WRITE, MAP_PRIVATE);
    if (mlock(locked, N * PG)) { perror("mlock"); return 1; }
    anon(PROT_READ | PROT_WRITE, MAP_SHARED);
    anon(PROT_NONE, MAP_PRIVATE);
    char *p = anon(PROT_READ | PROT_WRITE, MAP_PRIVATE);
    printf("READY P=%lx\n", (unsigned long)p);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        int advice = strncmp(line, "dd", 2) == 0 ? MADV_DONTDUMP : strncmp(line, "random", 6) == 0 ? MADV_RANDOM : -1;
        if (advice < 0 || madvise(p, N * PG, advice)) { printf("bad\n"); fflush(stdout); continue; }
        printf("ok\n");
        fflush(stdout);
    }
    return 0;
}
