/* Test program for dirty-page tracking (tests/dirty.rs).
 *
 * Usage: dirty_target MIB [tree]
 * Maps region A (MIB MiB, every page filled with a pattern) and a 16-page
 * buffer C (0xAA), optionally forks a child that keeps its own copy of A,
 * prints "READY A=<hex> NA=<pages> C=<hex> NC=<pages> CHILD=<pid>" and then
 * obeys one command per line on stdin, answering one line:
 *   w K        write every K-th page of A (pages p % K == 0)    -> ok
 *   mmap N     map a new region B of N pages and write them all -> B=<hex>
 *   read OFF N read(/dev/zero) into pages OFF..OFF+N of C        -> ok
 *   remap      map C anew at the same address (MAP_FIXED), fill with 0xAA -> ok
 *   cpage I    write page I of C with 0xAA                       -> ok
 *   check      verify A, B and C against what was written        -> ok | bad ...
 *   cw K       the child writes pages p % K == 3 of its A       -> ok
 *   cc         the child verifies its A                          -> ok | bad
 *   exit
 * Page p of A holds the byte (p * 31 + gen[p] * 7 + 1) & 0xff everywhere,
 * gen[p] counting the writes to it. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096UL
#define NC 16

static unsigned char *A, *B, *C;
static size_t na, nb;
static unsigned char *gen;
static unsigned char cread[NC];

static unsigned char val(size_t p) { return (unsigned char)((p * 31 + gen[p] * 7 + 1) & 0xff); }

static void write_pages(size_t k, size_t off) {
    for (size_t p = off; p < na; p += k) {
        gen[p]++;
        memset(A + p * PG, val(p), PG);
    }
}

static int check_a(void) {
    for (size_t p = 0; p < na; p++) {
        unsigned char v = val(p);
        for (size_t i = 0; i < PG; i++)
            if (A[p * PG + i] != v) return -1 - (int)p;
    }
    return 0;
}

static void reply(const char *s) {
    fputs(s, stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

static int p2c[2], c2p[2];

static void child_loop(void) {
    for (;;) {
        unsigned char cmd[2];
        if (read(p2c[0], cmd, 2) != 2) _exit(0);
        unsigned char ack = 1;
        if (cmd[0] == 'w') write_pages(cmd[1], 3);
        else if (cmd[0] == 'c') ack = check_a() == 0;
        if (write(c2p[1], &ack, 1) != 1) _exit(1);
    }
}

static int child_cmd(unsigned char op, unsigned char k) {
    unsigned char cmd[2] = {op, k}, ack = 0;
    if (write(p2c[1], cmd, 2) != 2 || read(c2p[0], &ack, 1) != 1) return 0;
    return ack;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    int tree = argc > 2 && strcmp(argv[2], "tree") == 0;
    na = mib * 256;
    /* C directly after A, a mapping of its own (executable too), so both
     * are scanned in one call and a remap of C stops that call after A. */
    A = mmap(0, (na + NC) * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (A == MAP_FAILED) return 1;
    C = A + na * PG;
    if (mprotect(C, NC * PG, PROT_READ | PROT_WRITE | PROT_EXEC)) return 1;
    gen = calloc(na, 1);
    if (A == MAP_FAILED || C == MAP_FAILED || !gen) return 1;
    for (size_t p = 0; p < na; p++) memset(A + p * PG, val(p), PG);
    memset(C, 0xAA, NC * PG);
    pid_t child = 0;
    if (tree) {
        if (pipe(p2c) || pipe(c2p)) return 1;
        child = fork();
        if (child < 0) return 1;
        if (child == 0) child_loop();
    }
    printf("READY A=%lx NA=%zu C=%lx NC=%d CHILD=%d\n", (unsigned long)A, na, (unsigned long)C, NC, (int)child);
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        size_t x = 0, y = 0;
        char out[128];
        if (sscanf(line, "w %zu", &x) == 1) {
            write_pages(x, 0);
            reply("ok");
        } else if (sscanf(line, "mmap %zu", &x) == 1) {
            B = mmap(0, x * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (B == MAP_FAILED) { reply("bad mmap"); continue; }
            nb = x;
            memset(B, 0x5B, nb * PG);
            snprintf(out, sizeof out, "B=%lx", (unsigned long)B);
            reply(out);
        } else if (sscanf(line, "read %zu %zu", &x, &y) == 2) {
            int fd = open("/dev/zero", O_RDONLY);
            ssize_t n = read(fd, C + x * PG, y * PG);
            close(fd);
            for (size_t i = x; i < x + y; i++) cread[i] = 1;
            reply(n == (ssize_t)(y * PG) ? "ok" : "bad read");
        } else if (strncmp(line, "remap", 5) == 0) {
            if (mmap(C, NC * PG, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != C) { reply("bad remap"); continue; }
            memset(C, 0xAA, NC * PG);
            memset(cread, 0, sizeof cread);
            reply("ok");
        } else if (sscanf(line, "cpage %zu", &x) == 1 && x < NC) {
            memset(C + x * PG, 0xAA, PG);
            reply("ok");
        } else if (strncmp(line, "check", 5) == 0) {
            int r = check_a();
            if (r) { snprintf(out, sizeof out, "bad A page %d", -1 - r); reply(out); continue; }
            for (size_t i = 0; i < nb * PG; i++)
                if (B[i] != 0x5B) { reply("bad B"); goto next; }
            for (size_t i = 0; i < NC * PG; i++)
                if (C[i] != (cread[i / PG] ? 0 : 0xAA)) { reply("bad C"); goto next; }
            reply("ok");
        next:;
        } else if (sscanf(line, "cw %zu", &x) == 1) {
            reply(child_cmd('w', (unsigned char)x) ? "ok" : "bad child");
        } else if (strncmp(line, "cc", 2) == 0) {
            reply(child_cmd('c', 0) ? "ok" : "bad child");
        } else if (strncmp(line, "exit", 4) == 0) {
            break;
        } else {
            reply("bad command");
        }
    }
    if (child) { kill(child, SIGKILL); waitpid(child, 0, 0); }
    return 0;
}
